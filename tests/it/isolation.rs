//! The local provider's namespace isolation: the escape suite, limits, the init's duties, and
//! durability across server processes. Each escape attempt is a command a hostile agent could
//! run; each one succeeds without isolation (see `security.rs` for that mode's documented
//! limits) and must fail with it.
//!
//! Hostile commands (`kill -9 -1`, a fork bomb, a memory hog) run only after
//! [`assert_own_pid_namespace`] has shown that the sandbox has a pid namespace of its own; the
//! Makefile also runs the whole suite in a private pid namespace.
//!
//! Every check runs with the server as this test's own user and, when the test runs as root, once
//! more as an unprivileged user ([`unprivileged_uid`]).

use crate::support::*;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Skips (with a line saying why) where this host offers no namespaces: then `auto` means none,
/// and `landlock.rs` covers the Landlock tier `auto` picks there.
fn isolated_home(name: &str) -> Option<Home> {
    if let Err(why) = sandbox_mcp::provider::local::isolation::probe() {
        eprintln!("isolation tests need namespaces, which this host refuses: {why}");
        return None;
    }
    Some(Home::new(name).with_isolation("namespaces"))
}

/// The homes to run a check with: this user's, and when we are root an unprivileged user's
/// (whose sandboxes share its uid) and one with subordinate ids (a uid of their own each).
fn homes(name: &str) -> Vec<Home> {
    let Some(mine) = isolated_home(name) else { return Vec::new() };
    let mut all = vec![mine];
    if let Some(uid) = unprivileged_uid() {
        all.push(Home::new(&format!("{name}-user")).with_isolation("namespaces").run_as(uid));
    }
    if let Some((uid, gid)) = subordinate_user() {
        all.push(Home::new(&format!("{name}-sub")).with_isolation("namespaces").run_as_user(uid, gid));
    }
    all
}

/// Runs `command` in the default sandbox: (exit code, stdout, stderr).
fn sh(m: &mut Mcp, command: &str) -> (i64, String, String) {
    let out = m.ok("run_command", json!({"command": command, "timeout": 60}));
    (out["exit_code"].as_i64().unwrap(), out["stdout"].as_str().unwrap().to_string(), out["stderr"].as_str().unwrap().to_string())
}

fn who(home: &Home) -> String {
    match (home.run_as, home.run_gid) {
        (Some(u), Some(_)) => format!("as uid {u} with subordinate ids"),
        (Some(u), None) => format!("as uid {u}"),
        _ => "as the test's user".into(),
    }
}

/// The sandbox's pid namespace is not ours and its pid 1 is its init; fails the test otherwise.
fn assert_own_pid_namespace(m: &mut Mcp) {
    let (_, inside, _) = sh(m, "readlink /proc/self/ns/pid; tr '\\0' ' ' </proc/1/cmdline");
    let host = std::fs::read_link("/proc/self/ns/pid").unwrap().display().to_string();
    let mut lines = inside.lines();
    let ns = lines.next().unwrap_or_default();
    assert!(ns.starts_with("pid:[") && ns != host, "the sandbox shares the test's pid namespace ({ns}); refusing to go on");
    assert!(lines.next().unwrap_or_default().contains("sandbox-init"), "pid 1 of the sandbox is not its init: {inside}");
}

#[test]
fn create_reports_isolation_network_and_limits() {
    for home in homes("iso-create") {
        let mut m = home.stdio();
        let c = m.ok("create_sandbox", json!({}));
        assert_eq!((c["isolation"].as_str(), c["network"].as_bool()), (Some("namespaces"), Some(false)), "{c}");
        // The default limits where this user can write a cgroup (root here), none elsewhere.
        let defaults = if home.run_as.is_none() && is_root() {
            json!({"memory_mb": 2048, "processes": 1024, "disk_mb": null})
        } else {
            c["limits"].clone()
        };
        assert_eq!(c["limits"], defaults, "{c}");
        assert!(
            c["limits"] == json!({"memory_mb": null, "processes": null, "disk_mb": null})
                || c["limits"] == json!({"memory_mb": 2048, "processes": 1024, "disk_mb": null}),
            "{c}"
        );
        let c = m.ok("create_sandbox", json!({"network": true}));
        assert_eq!(c["network"], true);
        let (_, id, _) = sh(&mut m, "id -u; id -g");
        assert_eq!(id, "0\n0\n", "{}: sandbox code is root of its user namespace", who(&home));
    }
    let home = Home::unisolated("iso-none");
    let mut m = home.stdio();
    let c = m.ok("create_sandbox", json!({}));
    assert_eq!((c["isolation"].as_str(), c["network"].as_bool()), (Some("none"), Some(true)), "{c}");
    assert!(m.err("create_sandbox", json!({"network": false})).contains("needs namespace isolation"));
}

#[test]
fn host_files_other_sandboxes_and_the_state_root_are_out_of_sight() {
    for home in homes("iso-files") {
        let who = who(&home);
        let outside = std::env::temp_dir().join(format!("smcp-outside-{}", sandbox_mcp::ids::random_hex(6)));
        std::fs::write(&outside, "host secret").unwrap();
        let mut m = home.stdio();
        let other = m.create();
        m.ok("write_file", json!({"sandbox_id": other, "path": "needle-in-other.txt", "content": "other sandbox"}));
        let made = m.ok("create_sandbox", json!({}));
        let layers = made["layers"].as_array().cloned().unwrap_or_default();
        assert!(layers.contains(&json!("no_host_paths")), "{who}: the home's overlay is not reported: {made}");
        let (code, _, err) = sh(&mut m, &format!("cat {}", outside.display()));
        assert_ne!(code, 0, "{who}: a host file outside the sandbox was readable");
        assert!(err.contains("No such file"), "{who}: {err}");
        let (_, found, _) =
            sh(&mut m, "find / -xdev -name 'needle-in-other*' 2>/dev/null; find /home /tmp -name 'needle-in-other*' 2>/dev/null");
        assert_eq!(found, "", "{who}: another sandbox's file is visible");
        let (_, listing, _) = sh(&mut m, "ls /; ls /home; ls /tmp");
        assert_eq!(listing.lines().filter(|l| *l == "root").count(), 0, "{who}: /root is visible: {listing}");
        assert!(!listing.contains("sandboxes"), "{who}: the state root is visible: {listing}");
        let state_root = home.path.display().to_string();
        let (code, _, _) = sh(&mut m, &format!("ls {state_root}"));
        assert_ne!(code, 0, "{who}: the state root is reachable at its host path");
        // Nor is its path in the init's command line (the home reaches a non-root init in its
        // environment, which sandbox code cannot read).
        let (_, cmdline, _) = sh(&mut m, "tr '\\0' ' ' </proc/1/cmdline; echo; cat /proc/1/environ >/dev/null 2>&1 || echo unreadable");
        assert!(cmdline.contains("sandbox-init") && !cmdline.contains(&state_root), "{who}: /proc/1/cmdline shows {cmdline}");
        assert!(cmdline.contains("unreadable"), "{who}: the init's environment is readable: {cmdline}");
        // Nor in the mounts: the home's mount used to be a bind, whose line names the bound
        // directory's host path.
        let (_, mounts, _) = sh(&mut m, "cat /proc/self/mountinfo");
        assert!(!mounts.contains(&state_root), "{who}: mountinfo inside names the state root {state_root}:\n{mounts}");
        assert!(mounts.lines().any(|l| l.contains(" /home/user ")), "{who}: no mount of the home:\n{mounts}");
        // The home's overlay keeps what a rename needs: a crippled one (mounted where its own
        // attributes cannot be kept) refused renaming a directory at its top with EXDEV.
        let (code, _, err) = sh(&mut m, "python3 -c 'import os; os.mkdir(\"c\"); os.rename(\"c\", \"d\"); os.rmdir(\"d\")'");
        assert_eq!(code, 0, "{who}: a directory at the top of the home cannot be renamed: {err}");
        let (code, _, err) = sh(&mut m, "echo x > /usr/planted; echo x > /etc/planted; echo x > /bin/planted");
        assert_ne!(code, 0, "{who}");
        assert!(err.contains("Read-only file system"), "{who}: {err}");
        let mark = format!("planted-{}", sandbox_mcp::ids::random_hex(6));
        let (code, _, _) = sh(&mut m, &format!("echo x > /tmp/{mark} && echo x > /dev/shm/{mark}"));
        assert_eq!(code, 0, "{who}: the sandbox's /tmp must be writable");
        assert!(!std::path::Path::new("/tmp").join(&mark).exists(), "{who}: the sandbox wrote into the host's /tmp");
        assert!(!std::path::Path::new("/dev/shm").join(&mark).exists(), "{who}: the sandbox wrote into the host's /dev/shm");
        let (_, devs, _) = sh(&mut m, "ls /dev");
        for must in ["null", "zero", "full", "random", "urandom", "tty", "shm"] {
            assert!(devs.lines().any(|l| l == must), "{who}: /dev/{must} is missing: {devs}");
        }
        assert!(
            !devs.lines().any(|l| l.starts_with("sd") || l.starts_with("vd") || l == "mem" || l == "kmsg"),
            "{who}: host devices: {devs}"
        );
        let _ = std::fs::remove_file(&outside);
        let _ = other;
    }
}

#[test]
fn host_processes_and_the_servers_environment_are_out_of_sight() {
    for home in homes("iso-procs") {
        let who = who(&home);
        let token = format!("tok-{}", sandbox_mcp::ids::random_hex(12));
        let mut m = home.stdio_with(&[("SANDBOX_MCP_HTTP_TOKEN", &token)]);
        m.create();
        assert_own_pid_namespace(&mut m);
        let (_, count, _) = sh(&mut m, "ls /proc | grep -c '^[0-9]'");
        let count: u32 = count.trim().parse().unwrap();
        assert!(count <= 6, "{who}: {count} processes visible in a fresh sandbox");
        let server = m.client.pid();
        let (code, _, _) = sh(&mut m, &format!("cat /proc/{server}/environ"));
        assert_ne!(code, 0, "{who}: the server's /proc entry is reachable");
        let (_, found, _) = sh(&mut m, "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c SANDBOX_MCP_HTTP_TOKEN");
        assert_eq!(found.trim(), "0", "{who}: the server's token is readable from the sandbox");
    }
}

#[test]
fn kill_minus_one_inside_ends_only_the_sandboxs_processes() {
    for home in homes("iso-kill1") {
        let who = who(&home);
        let mut m = home.stdio();
        let sb = m.create();
        // A host process of the uid the sandbox's processes run as, outside the sandbox: the
        // server's own, or the sandbox's own uid when the server is root.
        let uid = match home.run_as {
            Some(u) => Some(u),
            None if is_root() => Some(sandbox_host_uid(&home, &sb)),
            None => None,
        }
        .map(|u| u.to_string());
        let nap = unique_sleep();
        let mut witness = match &uid {
            Some(u) => std::process::Command::new("setpriv").args(["--reuid", u, "--regid", u, "--clear-groups", "sleep", &nap]).spawn(),
            None => std::process::Command::new("sleep").arg(&nap).spawn(),
        }
        .unwrap();
        assert_own_pid_namespace(&mut m);
        let (inside, started) = home.marker(&sb, "bg-started");
        sh(&mut m, &format!("setsid sleep 300 >/dev/null 2>&1 & touch {inside}"));
        wait_for(TIMEOUT, "the background sleep", || started.exists().then_some(()));
        m.call("run_command", json!({"command": "kill -9 -1; sleep 1; echo survived"}));
        assert!(witness.try_wait().unwrap().is_none(), "{who}: kill -9 -1 in the sandbox ended a host process");
        assert!(pid_alive(m.client.pid()), "{who}: kill -9 -1 in the sandbox ended the server");
        let (_, ps, _) = sh(&mut m, "ls /proc | grep -c '^[0-9]'");
        assert!(ps.trim().parse::<u32>().unwrap() <= 4, "{who}: the sandbox's background process survived kill -9 -1: {ps}");
        assert_eq!(sh(&mut m, "echo still-usable").1, "still-usable\n", "{who}: the sandbox must survive its own kill -9 -1");
        let _ = witness.kill();
        let _ = witness.wait();
    }
}

/// The host uid a sandbox's root maps to, as its metadata records it.
fn sandbox_host_uid(home: &Home, sb: &str) -> u32 {
    let meta: Value = serde_json::from_str(&std::fs::read_to_string(home.sandbox_dir(sb).join("meta.json")).unwrap()).unwrap();
    meta["owner"][0].as_u64().unwrap_or_else(|| panic!("no owner in {meta}")) as u32
}

/// As root, every isolated sandbox gets a host uid of its own from `--uid-range`, checked against
/// the subordinate ids and the user database: per-user kernel quotas and signals are per sandbox,
/// and no host user owns its files.
#[test]
fn a_root_server_gives_every_sandbox_a_uid_of_its_own() {
    let Some(home) = isolated_home("iso-uids") else { return };
    if !is_root() {
        return; // Sandboxes of an ordinary user have its uid (SECURITY.md names what they share).
    }
    let mut m = home.stdio();
    let (a, b) = (m.create(), m.create());
    let (ua, ub) = (sandbox_host_uid(&home, &a), sandbox_host_uid(&home, &b));
    assert_ne!(ua, ub, "two sandboxes share host uid {ua}");
    for (sb, uid) in [(&a, ua), (&b, ub)] {
        assert!((2_000_000_000..=2_000_065_535).contains(&uid), "{sb}: uid {uid} is outside the default --uid-range");
        let home_dir = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(home.sandbox_dir(sb).join("home")).unwrap());
        assert_eq!(home_dir, uid, "{sb}: its home belongs to {home_dir}");
        // Inside it is root; the user namespace maps that root to its own host uid.
        let (_, map, _) = sh_in(&mut m, sb, "id -u; cat /proc/self/uid_map");
        assert_eq!(map.split_whitespace().collect::<Vec<_>>(), ["0", "0", &uid.to_string(), "1"], "{sb}: {map}");
    }
    // A range that holds a user of the host (root, uid 0) or overlaps subordinate ids is refused
    // at start, naming the conflict and the option.
    let out = std::process::Command::new(bin())
        .args(["call", "list_sandboxes", "{}"])
        .envs(home.env())
        .env("SANDBOX_MCP_UID_RANGE", "1-70000")
        .output()
        .unwrap();
    let bad = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{bad}");
    assert!(bad.contains("--uid-range") && (bad.contains("/etc/passwd") || bad.contains("/etc/sub")), "{bad}");
}

/// Runs `command` in sandbox `sb`: (exit code, stdout, stderr).
fn sh_in(m: &mut Mcp, sb: &str, command: &str) -> (i64, String, String) {
    let out = m.ok("run_command", json!({"sandbox_id": sb, "command": command, "timeout": 60}));
    (out["exit_code"].as_i64().unwrap(), out["stdout"].as_str().unwrap().to_string(), out["stderr"].as_str().unwrap().to_string())
}

/// A TCP listener on `addr`, accepting one connection in the background; true once accepted.
fn listener(addr: &str) -> (u16, std::sync::mpsc::Receiver<()>) {
    let l = TcpListener::bind(addr).unwrap();
    let port = l.local_addr().unwrap().port();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        if let Ok((mut c, _)) = l.accept() {
            let _ = c.write_all(b"hello\n");
            let mut b = [0u8; 1];
            let _ = c.read(&mut b);
            let _ = tx.send(());
        }
    });
    (port, rx)
}

/// The host's first non-loopback IPv4 address, if it has one.
fn host_address() -> Option<String> {
    let out = std::process::Command::new("hostname").arg("-I").output().ok()?;
    String::from_utf8_lossy(&out.stdout).split_whitespace().find(|a| a.contains('.') && !a.starts_with("127.")).map(str::to_string)
}

fn connect_cmd(host: &str, port: u16) -> String {
    format!("timeout 5 bash -c 'exec 3<>/dev/tcp/{host}/{port}; head -c 6 <&3'")
}

#[test]
fn no_network_by_default_and_never_the_host_with_network_true() {
    for home in homes("iso-net") {
        let who = who(&home);
        let mut m = home.stdio();
        m.create();
        let (_, links, _) = sh(&mut m, "ls /sys/class/net 2>/dev/null || cat /proc/net/dev");
        assert!(!links.contains("eth") && !links.contains("ens"), "{who}: host interfaces are visible: {links}");
        let (port, rx) = listener("127.0.0.1:0");
        let (code, _, _) = sh(&mut m, &connect_cmd("127.0.0.1", port));
        assert_ne!(code, 0, "{who}: the sandbox reached a host loopback listener");
        assert!(rx.try_recv().is_err(), "{who}");
        let host = host_address();
        if let Some(host) = &host {
            let (port, _rx) = listener(&format!("{host}:0"));
            let (code, _, _) = sh(&mut m, &connect_cmd(host, port));
            assert_ne!(code, 0, "{who}: the sandbox reached the host's address {host}");
        }
        // Its own loopback works.
        let (code, out, err) = sh(&mut m, "cat /proc/net/if_inet6 2>/dev/null | grep -c lo; grep -c lo /proc/net/dev");
        assert_eq!(code, 0, "{who}: {out} {err}");
        // With network: true, still a private network namespace: the host stays out of reach
        // (directly, and through the sandbox's proxy, which refuses loopback and the host).
        m.ok("create_sandbox", json!({"network": true}));
        let (port, rx) = listener("127.0.0.1:0");
        let (code, _, _) = sh(&mut m, &connect_cmd("127.0.0.1", port));
        assert_ne!(code, 0, "{who}: network true reached a host loopback listener");
        let (_, out, _) = sh(&mut m, &format!("curl -sS -i --max-time 10 -x http://127.0.0.1:3128 --noproxy '' http://127.0.0.1:{port}/"));
        assert!(out.contains("403") && out.contains("never reachable"), "{who}: {out}");
        assert!(rx.try_recv().is_err(), "{who}");
        if let Some(host) = &host {
            let (port, _rx) = listener(&format!("{host}:0"));
            let (code, _, _) = sh(&mut m, &connect_cmd(host, port));
            assert_ne!(code, 0, "{who}: network true reached the host's address {host}");
            let (_, out, _) = sh(&mut m, &format!("curl -sS -i --max-time 10 -x http://127.0.0.1:3128 --noproxy '' http://{host}:{port}/"));
            assert!(out.contains("403") && out.contains("never reachable"), "{who}: {out}");
        }
    }
}

#[test]
fn limits_are_enforced_or_refused_with_the_reason() {
    for home in homes("iso-limits") {
        let who = who(&home);
        let mut m = home.stdio();
        let r = m.call("create_sandbox", json!({"limits": {"memory_mb": 256, "processes": 64}}));
        if r["isError"] == true {
            // Only where no cgroup can be written: the message says which limit and why.
            let text = r["content"][0]["text"].as_str().unwrap().to_string();
            assert!(home.run_as.is_some() || !is_root(), "{who}: root must be able to enforce limits: {text}");
            assert!(text.contains("memory_mb: 256") && text.contains("cgroup"), "{who}: {text}");
            let dirs = std::fs::read_dir(home.path.join("sandboxes")).map(|d| d.count()).unwrap_or(0);
            assert_eq!(dirs, 0, "{who}: a refused create left a sandbox behind");
            continue;
        }
        let c = &r["structuredContent"];
        assert_eq!(c["limits"], json!({"memory_mb": 256, "processes": 64, "disk_mb": null}), "{c}");
        assert_own_pid_namespace(&mut m);
        // 300 processes under a limit of 64: most forks fail. They are counted on the host (a full
        // cgroup leaves no room for a command that counts), and end by themselves.
        let nap = format!("4.{}", u32::from_str_radix(&sandbox_mcp::ids::random_hex(3), 16).unwrap());
        // Under sh: bash retries a failed fork for half a minute, so its loop would outlive the call.
        m.call(
            "run_command",
            json!({"command": format!("exec sh -c 'i=0; while [ $i -lt 300 ]; do sleep {nap} & i=$((i+1)); done; wait'")}),
        );
        let running = pids_of_argv(&["sleep", &nap]).len();
        assert!(running <= 64, "{who}: {running} processes under a limit of 64");
        assert!(running >= 8, "{who}: only {running} processes started; the check proves nothing");
        wait_for(Duration::from_secs(20), "the sleeps to end", || pids_of_argv(&["sleep", &nap]).is_empty().then_some(()));
        // 600 MiB under a limit of 256 MiB: the allocation is killed.
        let (code, _, _) = sh(&mut m, "x=$(head -c 629145600 /dev/zero | tr '\\0' a); echo ${#x}");
        assert_ne!(code, 0, "{who}: 600 MiB were allocated under a 256 MiB limit");
        assert_eq!(sh(&mut m, "echo alive").1, "alive\n", "{who}: the sandbox must outlive its OOM kill");
    }
}

fn is_root() -> bool {
    unprivileged_uid().is_some()
}

#[test]
fn bad_network_and_limits_arguments_create_nothing() {
    let Some(home) = isolated_home("iso-badargs") else { return };
    let mut m = home.stdio();
    for (args, want) in [
        (json!({"network": "yes"}), "must be true, false, or an object"),
        (json!({"network": 1}), "must be true, false, or an object"),
        (json!({"limits": {"memory_mb": 8}}), "from 16 to 1048576"),
        (json!({"limits": {"processes": 100000}}), "from 8 to 65536"),
        (json!({"limits": {"disk_mb": 1}}), "from 16 to 1048576"),
        (json!({"limits": {"memory_mb": "256"}}), "must be an integer"),
        (json!({"limits": {"cpus": 2}}), "unknown field \"cpus\""),
        (json!({"limits": 256}), "must be an object"),
    ] {
        let err = m.err("create_sandbox", args.clone());
        assert!(err.contains(want), "{args}: {err}");
    }
    let dirs = std::fs::read_dir(home.path.join("sandboxes")).map(|d| d.count()).unwrap_or(0);
    assert_eq!(dirs, 0, "bad arguments created a sandbox");
}

#[test]
fn the_init_reaps_a_thousand_orphans_within_a_second() {
    let Some(home) = isolated_home("iso-reap") else { return };
    let mut m = home.stdio();
    m.create();
    assert_own_pid_namespace(&mut m);
    let script = "i=0; while [ $i -lt 1000 ]; do (true &) ; i=$((i+1)); done; sleep 1; \
                  n=0; for s in /proc/[0-9]*/stat; do read -r l < $s 2>/dev/null || continue; case ${l##*) } in Z*) n=$((n+1));; esac; done; echo $n";
    let (code, out, err) = sh(&mut m, script);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), "0", "zombies left after 1 s");
}

/// The parent pid of the shell a command runs in, as the sandbox sees it.
const PARENT_OF_THE_SHELL: &str = "read -r l </proc/$$/stat; set -- ${l##*) }; echo $2";

/// Commands are started by the sandbox's init (its spawner): born inside, children of pid 1,
/// killed as a group on timeout, in the directory asked for. A sandbox without the spawner's
/// socket (one made by an older server) still runs commands: they enter with nsenter.
#[test]
fn commands_are_started_by_the_init_or_entered_without_its_spawner() {
    for home in homes("iso-spawn") {
        let who = who(&home);
        let mut m = home.stdio();
        let sb = m.create();
        assert_own_pid_namespace(&mut m);
        assert!(home.sandbox_dir(&sb).join("spawn.sock").exists(), "{who}: no spawner socket");
        let (_, parent, _) = sh(&mut m, PARENT_OF_THE_SHELL);
        assert_eq!(parent.trim(), "1", "{who}: the command was not started by the init");
        let nap = unique_sleep();
        let t = m.ok("run_command", json!({"command": format!("sleep {nap} & sleep {nap}; echo never"), "timeout": 1}));
        assert_eq!(
            (t["exit_code"].as_i64(), t["timed_out"].as_bool(), t["stdout"].as_str()),
            (Some(124), Some(true), Some("")),
            "{who}: {t}"
        );
        wait_for(Duration::from_secs(5), &format!("{who}: both sleeps to end with their group"), || {
            pids_of_argv(&["sleep", &nap]).is_empty().then_some(())
        });
        assert_eq!(sh(&mut m, "mkdir -p sub/dir").0, 0);
        let d = m.ok("run_command", json!({"command": "pwd", "cwd": "sub/dir"}));
        assert_eq!(d["stdout"], "/home/user/sub/dir\n", "{who}: {d}");
        let d = m.ok("run_command", json!({"command": "pwd", "cwd": "/tmp"}));
        assert_eq!(d["stdout"], "/tmp\n", "{who}: {d}");
        let e = m.ok("run_command", json!({"command": "exit 7"}));
        assert_eq!(e["exit_code"], 7, "{who}: {e}");
        let e = m.ok("run_command", json!({"command": "kill -s TERM $$"}));
        assert_eq!(e["exit_code"], 143, "{who}: {e}");
        std::fs::remove_file(home.sandbox_dir(&sb).join("spawn.sock")).unwrap();
        let (code, parent, err) = sh(&mut m, PARENT_OF_THE_SHELL);
        assert_eq!(code, 0, "{who}: {err}");
        assert_ne!(parent.trim(), "1", "{who}: without the socket the command enters with nsenter (its parent is outside)");
        assert_eq!(m.ok("kill_sandbox", json!({"sandbox_id": sb}))["killed"], true);
    }
}

/// Sandbox root may put a FIFO at its own `/dev/null`: the init still starts commands (it opened
/// the stdin it gives them before any command ran). It opened the path at each start, and a
/// blocking open of the FIFO hung every later command's start (and one init thread each).
#[test]
fn a_fifo_at_dev_null_does_not_stop_the_init_starting_commands() {
    let Some(home) = isolated_home("iso-null-fifo") else { return };
    let mut m = home.stdio();
    let sb = m.create();
    let (code, out, err) = sh(&mut m, "mount -t tmpfs none /dev && mkfifo /dev/null && echo poisoned");
    assert_eq!((code, out.as_str()), (0, "poisoned\n"), "{err}");
    // A working directory of its own: started afresh by the init, not by a waiting shell.
    let t0 = Instant::now();
    let d = m.ok("run_command", json!({"command": "echo started", "cwd": "/tmp", "timeout": 20}));
    assert_eq!((d["exit_code"].as_i64(), d["stdout"].as_str()), (Some(0), Some("started\n")), "{d}");
    assert!(t0.elapsed() < Duration::from_secs(5), "the start took {:?}", t0.elapsed());
    assert_eq!(m.ok("kill_sandbox", json!({"sandbox_id": sb}))["killed"], true);
}

/// A command that runs when its sandbox's init is killed ends its call at once, as killed by
/// SIGKILL (137), rather than holding it until its timeout.
#[test]
fn a_command_running_when_its_init_dies_ends_as_killed() {
    let Some(home) = isolated_home("iso-spawn-dies") else { return };
    let mut m = home.stdio();
    let sb = m.create();
    let nap = unique_sleep();
    let caller = {
        let mut other = home.stdio();
        let (sb, nap) = (sb.clone(), nap.clone());
        std::thread::spawn(move || other.ok("run_command", json!({"sandbox_id": sb, "command": format!("sleep {nap}"), "timeout": 120})))
    };
    pid_of_argv(&["sleep", &nap]);
    let t0 = Instant::now();
    kill_init(&home, &sb);
    let out = caller.join().unwrap();
    assert!(t0.elapsed() < Duration::from_secs(10), "the call waited {:?}", t0.elapsed());
    assert_eq!((out["exit_code"].as_i64(), out["timed_out"].as_bool()), (Some(137), Some(false)), "{out}");
    m.ok("kill_sandbox", json!({"sandbox_id": sb}));
}

#[test]
fn kill_sandbox_ends_setsid_double_fork_and_nohup_escapees() {
    for home in homes("iso-killall") {
        let who = who(&home);
        let mut m = home.stdio();
        let sb = m.create();
        let naps: Vec<String> = (0..3).map(|_| unique_sleep()).collect();
        sh(
            &mut m,
            &format!(
                "setsid sleep {} >/dev/null 2>&1 & (sh -c 'sleep {} >/dev/null 2>&1 &') ; nohup sleep {} >/dev/null 2>&1 &",
                naps[0], naps[1], naps[2]
            ),
        );
        let pids: Vec<u32> = naps.iter().map(|n| pid_of_argv(&["sleep", n])).collect();
        let t0 = Instant::now();
        assert_eq!(m.ok("kill_sandbox", json!({"sandbox_id": sb}))["killed"], true);
        for (pid, nap) in pids.iter().zip(&naps) {
            wait_for(Duration::from_secs(3), &format!("{who}: sleep {nap} to end"), || (!pid_alive(*pid)).then_some(()));
        }
        assert!(!home.sandbox_dir(&sb).exists(), "{who}");
        eprintln!("{who}: kill_sandbox and every process gone in {:?}", t0.elapsed());
    }
}

/// Sends SIGKILL to the init of sandbox `sb` (through the shell builtin, by its own pid, after
/// checking that the recorded start time is that process's); returns its pid.
fn kill_init(home: &Home, sb: &str) -> u32 {
    let init = std::fs::read_to_string(home.sandbox_dir(sb).join("init.pid")).unwrap();
    let mut it = init.split_whitespace();
    let (pid, start): (u32, u64) = (it.next().unwrap().parse().unwrap(), it.next().unwrap().parse().unwrap());
    // Verified before the signal: the recorded start time is that process's.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(") ").unwrap().1.split(' ').collect();
    assert_eq!(fields[19].parse::<u64>().unwrap(), start);
    assert!(pid > 1);
    std::process::Command::new("/bin/sh").args(["-c", &format!("kill -s KILL {pid}")]).status().unwrap();
    pid
}

/// The live keeper zygotes of the state root `home` (the process that forks keepers).
fn zygotes(home: &Home) -> Vec<u32> {
    let root = home.path.display().to_string();
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            (args.get(1) == Some(&&b"keeper-zygote"[..]) && args.get(2) == Some(&root.as_bytes()) && pid_alive(pid)).then_some(pid)
        })
        .collect()
}

/// The descriptors a process holds, as `/proc/PID/fd` links read.
fn descriptors(pid: u32) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return Vec::new() };
    dir.flatten().filter_map(|e| std::fs::read_link(e.path()).ok()).map(|l| l.display().to_string()).collect()
}

/// Fields of `/proc/PID/stat` after the command name: (process group, session, terminal).
fn group_session_tty(pid: u32) -> (u32, u32, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(") ").unwrap().1.split(' ').collect();
    (fields[2].parse().unwrap(), fields[3].parse().unwrap(), fields[4].parse().unwrap())
}

/// Keepers are forked by a zygote of one thread that the server starts once, in both isolated
/// tiers: the zygote leads a session of its own without a terminal and holds only its stdio and
/// request socket however many keepers it forked; each keeper names its sandbox in its command
/// line and holds nothing of the zygote's socket (nor does the sandbox's init); a zygote that
/// died is started again at the next create, which works; the zygote ends with its server.
#[test]
fn keepers_come_from_a_zygote_that_is_restarted_when_it_dies() {
    let Some(namespaces) = isolated_home("iso-zygote") else { return };
    for home in [namespaces, Home::new("iso-zygote-ll").with_isolation("landlock")] {
        let who = home.isolation;
        let mut m = home.stdio();
        let sandboxes: Vec<String> = (0..3).map(|_| m.create()).collect();
        let zygote = wait_for(Duration::from_secs(5), "the keeper zygote", || zygotes(&home).first().copied());
        let (group, session, tty) = group_session_tty(zygote);
        assert_eq!((group, session, tty), (zygote, zygote, 0), "{who}: the zygote leads a session of its own, without a terminal");
        let mut held = descriptors(zygote);
        held.sort();
        assert_eq!(held.len(), 4, "{who}: the zygote holds its stdio and its socket only, after three keepers: {held:?}");
        let socket = std::fs::read_link(format!("/proc/{zygote}/fd/0")).unwrap().display().to_string();
        assert!(socket.starts_with("socket:"), "{who}: the zygote's stdin is its request socket: {socket}");
        let first = &sandboxes[0];
        let pid_in = |file: &str| -> Option<u32> {
            let text = std::fs::read_to_string(home.sandbox_dir(first).join(file)).ok()?;
            text.split_whitespace().next()?.parse().ok()
        };
        let keeper = pid_in("keeper.pid").expect("keeper.pid");
        let title = std::fs::read(format!("/proc/{keeper}/cmdline")).unwrap();
        assert!(
            title.split(|b| *b == 0).any(|arg| arg == first.as_bytes()),
            "{who}: the keeper's command line names its sandbox: {:?}",
            String::from_utf8_lossy(&title)
        );
        for pid in [Some(keeper), pid_in("init.pid")].into_iter().flatten() {
            let held = descriptors(pid);
            assert!(!held.is_empty(), "{who}: the descriptors of process {pid} could not be read");
            assert!(!held.contains(&socket), "{who}: process {pid} holds the zygote's socket: {held:?}");
        }
        // The zygote's child that forks the keeper away is gone: the keeper is not the zygote's.
        let parent = sandbox_mcp::provider::process::proc_stat(keeper).map(|st| st.ppid);
        assert_ne!(parent, Some(zygote), "{who}: the keeper is still the zygote's child");
        assert!(zygote > 1);
        std::process::Command::new("/bin/sh").args(["-c", &format!("kill -s KILL {zygote}")]).status().unwrap();
        wait_for(Duration::from_secs(5), "the zygote to die", || (!pid_alive(zygote)).then_some(()));
        let again = m.create();
        assert_eq!(sh_in(&mut m, &again, "echo hi").1, "hi\n", "{who}");
        let now = zygotes(&home);
        assert!(now.len() == 1 && now[0] != zygote, "{who}: a new zygote: {now:?}");
        // The zygote ends with its server.
        m.close();
        wait_for(Duration::from_secs(5), "the zygote to end with its server", || zygotes(&home).is_empty().then_some(()));
    }
}

/// A server whose program file is replaced on disk (an upgrade renames a new file over it)
/// starts the keepers of new sandboxes from the new file: they start the sandbox's init (an
/// unprivileged server's) or spawner (Landlock) from their own program file, which a zygote
/// still running the old one no longer has (found by a review: "could not open this program
/// (... (deleted))").
#[test]
fn a_program_replaced_on_disk_starts_new_sandboxes() {
    if sandbox_mcp::provider::local::isolation::probe().is_err() {
        return;
    }
    let mut cases = vec![("landlock", None)];
    if let Some(uid) = unprivileged_uid() {
        cases.push(("namespaces", Some(uid)));
    }
    for (tier, uid) in cases {
        let dir = std::env::temp_dir().join(format!("smcp-upgrade-{}", sandbox_mcp::ids::random_hex(4)));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let program = dir.join("sandbox-mcp");
        std::fs::copy(bin(), &program).unwrap();
        let mut home = Home::new(&format!("upgrade-{tier}")).with_isolation(tier);
        if let Some(uid) = uid {
            home = home.run_as(uid);
        }
        let cmd = home.stdio_command(&program, &[]);
        let mut client = sandbox_mcp::client::StdioClient::start(cmd, sandbox_mcp::client::Reads::WithTimeouts).unwrap();
        client.initialize().unwrap();
        let mut m = Mcp { client };
        let before = m.create();
        assert_eq!(sh_in(&mut m, &before, "echo old").1, "old\n", "{tier}");
        let new = dir.join("sandbox-mcp.new");
        std::fs::copy(bin(), &new).unwrap();
        std::fs::rename(&new, &program).unwrap();
        let after = m.create();
        assert_eq!(sh_in(&mut m, &after, "echo new").1, "new\n", "{tier}: a sandbox made after the upgrade");
        assert_eq!(sh_in(&mut m, &before, "echo still").1, "still\n", "{tier}: a sandbox made before it");
        m.close();
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn a_dead_init_reports_the_sandbox_gone_and_kill_sandbox_cleans_up() {
    let Some(home) = isolated_home("iso-deadinit") else { return };
    let mut m = home.stdio();
    let sb = m.create();
    let pid = kill_init(&home, &sb);
    wait_for(Duration::from_secs(5), "the init to die", || (!pid_alive(pid)).then_some(()));
    let t0 = Instant::now();
    for (tool, args) in [
        ("run_command", json!({"command": "true"})),
        ("read_file", json!({"path": "x"})),
        ("start_task", json!({"command": "true"})),
        ("list_tasks", json!({"sandbox_id": sb})),
    ] {
        let err = m.err(tool, args);
        assert!(err.contains("gone") && err.contains("kill_sandbox") && err.contains("create_sandbox"), "{tool}: {err}");
    }
    assert!(t0.elapsed() < Duration::from_secs(5), "reporting a dead sandbox must not hang");
    m.ok("kill_sandbox", json!({"sandbox_id": sb}));
    assert!(!home.sandbox_dir(&sb).exists());
}

#[test]
fn the_walkthrough_survives_a_sigkilled_server_with_isolation() {
    for home in homes("iso-walk") {
        let who = who(&home);
        let mut a = home.stdio();
        let sb = a.create();
        let s = a.ok("start_task", json!({"command": "printf BEFORE; sleep 2; printf AFTER", "timeout": 60}));
        let task = s["task_id"].as_str().unwrap().to_string();
        a.client.kill().unwrap();
        let mut b = home.stdio();
        let done = wait_for(Duration::from_secs(30), "the task to finish", || {
            let g = b.ok("get_task", json!({"sandbox_id": sb, "task_id": task}));
            (g["state"] != "running").then_some(g)
        });
        assert_eq!((done["state"].as_str(), done["stdout"].as_str()), (Some("succeeded"), Some("BEFOREAFTER")), "{who}: {done}");
        let long = b.ok("start_task", json!({"sandbox_id": sb, "command": "sleep 60"}));
        let t0 = Instant::now();
        let c = b.ok("cancel_task", json!({"sandbox_id": sb, "task_id": long["task_id"]}));
        assert_eq!(c["state"], "cancelled", "{who}: {c}");
        assert!(t0.elapsed() < Duration::from_secs(3));
        assert_eq!(b.ok("kill_sandbox", json!({"sandbox_id": sb}))["killed"], true);
    }
}

#[test]
fn file_tools_use_the_sandboxs_paths_and_never_leave_its_root() {
    for home in homes("iso-ftools") {
        let who = who(&home);
        let mut m = home.stdio();
        let sb = m.create();
        m.ok("write_file", json!({"path": "/tmp/t.txt", "content": "in tmp"}));
        assert_eq!(sh(&mut m, "cat /tmp/t.txt").1, "in tmp", "{who}");
        m.ok("write_file", json!({"path": "rel/a.txt", "content": "in home"}));
        assert_eq!(m.ok("read_file", json!({"path": "/home/user/rel/a.txt"}))["content"], "in home");
        assert_eq!(sh(&mut m, "stat -c %u rel/a.txt rel").1, "0\n0\n", "{who}: files the server writes belong to the sandbox's root");
        let host = home.sandbox_dir(&sb).display().to_string();
        sh(&mut m, &format!("ln -s / rootlink; ln -s {host}/meta.json meta; ln -s /proc/1/environ env1; ln -s ../../.. up"));
        for (path, want) in [
            ("meta", "does not exist"),
            ("up/meta.json", "does not exist"),
            ("/proc/1/environ", "/proc or /sys"),
            ("env1", "/proc or /sys"),
            ("/proc/self/root/etc/hostname", "does not exist"),
        ] {
            let err = m.err("read_file", json!({"path": path}));
            assert!(err.contains(want), "{who}: read_file {path}: {err}");
        }
        assert_eq!(m.ok("read_file", json!({"path": "rootlink/etc/hostname"}))["content"], "sandbox\n", "{who}");
        for (path, want) in [
            ("/usr/x", "read-only"),
            ("/etc/passwd", "read-only"),
            ("rootlink/usr/y", "read-only"),
            ("/proc/sys/kernel/hostname", "/proc or /sys"),
        ] {
            let err = m.err("write_file", json!({"path": path, "content": "x"}));
            assert!(err.contains(want), "{who}: write_file {path}: {err}");
        }
        let list = m.ok("list_files", json!({"path": "/"}));
        let names: Vec<&str> = list["entries"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
        assert!(names.contains(&"usr") && names.contains(&"home") && !names.contains(&"root"), "{who}: {names:?}");
    }
}

#[test]
fn isolation_settings_are_checked_at_startup() {
    let home = Home::new("iso-flag");
    let out =
        std::process::Command::new(bin()).args(["--isolation", "jail", "call", "list_tasks", "{}"]).envs(home.env()).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("auto, namespaces, landlock or none"), "{err}");
    let out = std::process::Command::new(bin())
        .args(["call", "list_tasks", "{}"])
        .envs(home.env())
        .env("SANDBOX_MCP_ISOLATION", "sometimes")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
}

/// On a host that refuses user namespaces (simulated: this test's own user namespace with
/// `user.max_user_namespaces` at 0), `namespaces` refuses to start, naming the setting.
#[test]
fn namespaces_refuses_where_user_namespaces_are_blocked() {
    if sandbox_mcp::provider::local::isolation::probe().is_err() {
        return;
    }
    let home = Home::new("iso-blocked");
    let run = |mode: &str| call_where_user_namespaces_are_blocked(&home, mode, "create_sandbox '{\"timeout\": 30}'");
    let out = run("namespaces");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("user.max_user_namespaces"), "{err}");
    // `auto` never falls back to none: `landlock.rs::auto_picks_landlock_where_user_namespaces_are_blocked`.
}

/// Single-quotes `s` for a POSIX shell.
fn quoted(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Runs `sandbox-mcp call TOOL ARGS` for `home` on a pseudo-terminal the test makes (util-linux
/// `script` starts it as the terminal's session, the way an operator's shell would): the result.
fn call_on_a_terminal(home: &Home, tool: &str, args: &Value) -> Value {
    let out = home.path.join(format!("answer-{}", sandbox_mcp::ids::random_hex(4)));
    let mut line = String::from("env");
    for (k, v) in home.env() {
        line += &format!(" {k}={}", quoted(&v));
    }
    match home.run_as {
        Some(uid) => {
            let gid = home.run_gid.unwrap_or(uid);
            line += &format!(" setpriv --reuid {uid} --regid {gid} --clear-groups -- {}", quoted(&shared_bin().display().to_string()))
        }
        None => line += &format!(" {}", quoted(&bin().display().to_string())),
    }
    line += &format!(" call {tool} {} >{}", quoted(&args.to_string()), quoted(&out.display().to_string()));
    let status =
        std::process::Command::new("script").args(["-qec", &line, "/dev/null"]).stdin(std::process::Stdio::null()).output().unwrap();
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    assert!(status.status.success(), "{tool} on a terminal: {status:?} {text}");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{tool} on a terminal answered {text:?}: {e}"))
}

/// What a command inside learns about terminals: its own and the init's controlling terminal
/// (field 7 of `stat`, 0 for none), whether `/dev/tty` opens, and what its stdio are.
const TERMINAL_PROBE: &str = r#"read -r _ _ _ _ _ _ t _ </proc/self/stat; echo "self=$t"
read -r _ _ _ _ _ _ t _ </proc/1/stat; echo "init=$t"
if (exec 3<>/dev/tty) 2>/dev/null; then echo devtty=opened; else echo devtty=refused; fi
for f in 0 1 2; do case $(readlink /proc/self/fd/$f) in /dev/pts/*|/dev/tty*) echo "fd$f=terminal" ;; esac; done"#;

/// The operator's terminal is out of reach (the escape found by the adversarial review): a server
/// started on a terminal (here one the test makes) hands it to no sandbox process, whether the
/// command comes through the init's spawner or enters with nsenter; the keeper and the init lead
/// sessions of their own, without a controlling terminal.
#[test]
fn the_operators_terminal_is_out_of_reach() {
    // The stand-in terminal works: a process started on it has it as controlling terminal.
    let probe = std::process::Command::new("script").args(["-qec", "cut -d' ' -f7 /proc/self/stat", "/dev/null"]).output().unwrap();
    let tty: i64 = String::from_utf8_lossy(&probe.stdout).trim().parse().unwrap_or(0);
    assert_ne!(tty, 0, "script(1) gave its command no controlling terminal: {probe:?}");
    for home in homes("tty") {
        let who = who(&home);
        let sb = call_on_a_terminal(&home, "create_sandbox", &json!({}))["sandbox_id"].as_str().unwrap().to_string();
        let keeper = std::fs::read_to_string(home.sandbox_dir(&sb).join("keeper.pid")).unwrap();
        let keeper: u32 = keeper.split_whitespace().next().unwrap().parse().unwrap();
        let stat = std::fs::read_to_string(format!("/proc/{keeper}/stat")).unwrap();
        let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
        assert_eq!((fields[3], fields[4]), (keeper.to_string().as_str(), "0"), "{who}: the keeper's session and terminal: {stat}");
        let want = "self=0\ninit=0\ndevtty=refused\n";
        let spawned = call_on_a_terminal(&home, "run_command", &json!({"sandbox_id": sb, "command": TERMINAL_PROBE}));
        assert_eq!(spawned["stdout"], want, "{who}, through the spawner: {spawned}");
        let task = call_on_a_terminal(
            &home,
            "start_task",
            &json!({"sandbox_id": sb, "command": TERMINAL_PROBE.replace("/proc/self/stat", "/proc/$$/stat")}),
        );
        let task_id = task["task_id"].as_str().unwrap().to_string();
        let done = call_on_a_terminal(&home, "get_task", &json!({"sandbox_id": sb, "task_id": task_id, "wait": 10}));
        assert_eq!(done["stdout"], want, "{who}, a task: {done}");
        std::fs::remove_file(home.sandbox_dir(&sb).join("spawn.sock")).unwrap();
        let entered = call_on_a_terminal(&home, "run_command", &json!({"sandbox_id": sb, "command": TERMINAL_PROBE}));
        assert_eq!(entered["stdout"], want, "{who}, entered with nsenter: {entered}");
        assert_eq!(call_on_a_terminal(&home, "kill_sandbox", &json!({"sandbox_id": sb}))["killed"], true);
    }
}

/// A clean clone run as root: the binary lies in a directory the sandbox's uid cannot traverse
/// (a `mktemp -d` folder, mode 0700), and isolated sandboxes still start (the init is executed
/// through a descriptor the keeper opened). As any other user the directory is theirs anyway.
#[test]
fn isolated_sandboxes_start_from_a_binary_in_a_private_directory() {
    let Some(home) = isolated_home("private-bin") else { return };
    use std::os::unix::fs::PermissionsExt;
    let dir = home.path.join("private-bin");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::set_permissions(&home.path, std::fs::Permissions::from_mode(0o700)).unwrap();
    let exe = dir.join("sandbox-mcp");
    std::fs::copy(bin(), &exe).unwrap();
    let call = |tool: &str, args: Value| {
        // The copy may still be open for writing in a child another test thread is forking
        // (ETXTBSY until that child execs): try again until it is not.
        let out = wait_for(Duration::from_secs(10), "the copied binary to be executable", || {
            match std::process::Command::new(&exe).args(["call", tool, &args.to_string()]).envs(home.env()).output() {
                Err(err) if err.kind() == std::io::ErrorKind::ExecutableFileBusy => None,
                result => Some(result.unwrap()),
            }
        });
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(out.status.success(), "{tool}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_str::<Value>(&text).unwrap()
    };
    let created = call("create_sandbox", json!({}));
    assert_eq!(created["isolation"], "namespaces", "{created}");
    let sb = created["sandbox_id"].as_str().unwrap();
    let ran = call("run_command", json!({"sandbox_id": sb, "command": "echo inside"}));
    assert_eq!(ran["stdout"], "inside\n", "{ran}");
    assert_eq!(call("kill_sandbox", json!({"sandbox_id": sb}))["killed"], true);
}

/// A `run_command` command starts with SIGINT and SIGQUIT at their default: Ctrl-C-like signals
/// reach it.
/// (Keepers used to start through a shell's `cmd &`, which left SIGINT and SIGQUIT ignored in the
/// keeper, the init and every command.) Both isolated tiers, as root and as the unprivileged user.
#[test]
fn commands_start_with_no_signal_ignored() {
    let mut all = homes("sigign");
    if sandbox_mcp::provider::local::isolation::landlock::available().is_ok() {
        all.push(Home::new("sigign-landlock").with_isolation("landlock"));
        if let Some(uid) = unprivileged_uid() {
            all.push(Home::new("sigign-landlock-user").with_isolation("landlock").run_as(uid));
        }
    }
    // SIGINT is bit 1 of the mask, SIGQUIT bit 2.
    let interrupt_ignored = |status: &Value| {
        let line = status["stdout"].as_str().unwrap_or_default().trim().to_string();
        let mask = line.strip_prefix("SigIgn:").map(str::trim).and_then(|hex| u64::from_str_radix(hex, 16).ok());
        mask.map(|mask| mask & 0b110 != 0).unwrap_or_else(|| panic!("no SigIgn line: {status}"))
    };
    for home in all {
        let who = format!("{} {:?}", home.isolation, home.run_as);
        let mut m = home.stdio();
        let sb = m.create();
        // The first command (in the shell made ready at create) and a command that starts its own
        // shell. (A task starts in the background of the supervisor's shell, which POSIX starts
        // with SIGINT and SIGQUIT ignored, as before.)
        for cwd in [None, Some(".")] {
            let mut call = json!({"sandbox_id": sb, "command": "grep SigIgn /proc/self/status", "timeout": 60});
            if let Some(cwd) = cwd {
                call["cwd"] = json!(cwd);
            }
            let out = m.ok("run_command", call);
            assert!(!interrupt_ignored(&out), "{who}, cwd {cwd:?}: {out}");
        }
    }
}

/// As root the keeper forks the stage, which hands the home over and makes the namespaces: a
/// stage that fails answers what failed, at once, on the keeper's answer, and nothing of the
/// sandbox is left. (Here the state of a second sandbox is made by hand, without its home or its
/// cgroups, and its keeper started as the server starts it.)
#[test]
fn a_failed_stage_says_what_failed() {
    let Some(home) = isolated_home("stage-fails") else { return };
    if !rustix_is_root() {
        return;
    }
    let sb = home.create_detached(json!({}));
    let other = format!("local-{}", sandbox_mcp::ids::random_hex(12));
    let dir = home.sandbox_dir(&other);
    std::fs::create_dir(&dir).unwrap();
    let meta = std::fs::read_to_string(home.sandbox_dir(&sb).join("meta.json")).unwrap().replace(&sb, &other);
    std::fs::write(dir.join("meta.json"), meta).unwrap();
    let begun = Instant::now();
    let mut keeper = std::process::Command::new(bin())
        .args(["keeper", home.path.to_str().unwrap(), &other, "/bin/sh", "--start-init"])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut out = keeper.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = out.read_to_string(&mut text);
        let _ = tx.send(text);
    });
    let answer = rx.recv_timeout(Duration::from_secs(15)).expect("the keeper's answer, and the end of its output");
    keeper.wait().unwrap();
    assert!(
        answer.starts_with("error cannot join the sandbox's cgroup") || answer.starts_with("error cannot hand over the sandbox home"),
        "{answer}"
    );
    assert!(begun.elapsed() < Duration::from_secs(5), "it took {:?}", begun.elapsed());
    assert!(!dir.join("init.pid").exists(), "an init was recorded");
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(home.call_cli("kill_sandbox", json!({"sandbox_id": sb})).0, 0);
}

/// A sandbox whose state directory disappears (an operator cleans the state root, a test removes
/// its temporary home) ends within seconds: its keeper ends it, instead of leaving it running out
/// of every tool's reach. With and without isolation.
#[test]
fn a_sandbox_whose_state_is_removed_ends() {
    let mut homes = vec![Home::unisolated("state-gone-none")];
    homes.extend(isolated_home("state-gone"));
    for home in homes {
        let sb = home.create_detached(json!({}));
        let nap = unique_sleep();
        let (code, out, err) =
            home.call_cli("run_command", json!({"sandbox_id": sb, "command": format!("nohup sleep {nap} >/dev/null 2>&1 &")}));
        assert_eq!(code, 0, "{out} {err}");
        let pid = pid_of_argv(&["sleep", &nap]);
        std::fs::remove_dir_all(home.sandbox_dir(&sb)).unwrap();
        wait_for(Duration::from_secs(10), &format!("{}: the sandbox's sleep to end with it", home.isolation), || {
            (!pid_alive(pid)).then_some(())
        });
    }
}

/// A Python probe of the seccomp wall: each denied call is tried and its errno printed, then the
/// process's own seccomp mode and no_new_privs.
const SECCOMP_PROBE: &str = r#"
import ctypes, errno, fcntl, os, platform, termios
libc = ctypes.CDLL(None, use_errno=True)
nr = {"x86_64": dict(keyctl=250, add_key=248, bpf=321, perf_event_open=298, userfaultfd=323, open_by_handle_at=304, init_module=175, kexec_load=246),
      "aarch64": dict(keyctl=219, add_key=217, bpf=280, perf_event_open=241, userfaultfd=282, open_by_handle_at=265, init_module=105, kexec_load=104)}[platform.machine()]
nr["io_uring_setup"] = 425
for name, n in sorted(nr.items()):
    r = libc.syscall(n, 0, 0, 0, 0, 0)
    print(name, errno.errorcode.get(ctypes.get_errno(), "ok") if r == -1 else "ok")
for name, family in [("vsock", 40), ("smc", 43), ("alg", 38)]:
    r = libc.socket(family, 1, 0)
    print(name, errno.errorcode.get(ctypes.get_errno(), "ok") if r == -1 else "ok")
pair = (ctypes.c_int * 2)()
for name, family in [("unix-pair", 1), ("tipc-pair", 30), ("vsock-pair", 40)]:
    r = libc.socketpair(family, 5, 0, pair)
    print(name, errno.errorcode.get(ctypes.get_errno(), "ok") if r == -1 else "ok")
os.sys.stdout.flush()
pid = os.fork()
if pid == 0:
    os.setsid()
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
    try:
        fcntl.ioctl(slave, termios.TIOCSTI, b"x")
        print("TIOCSTI ok", flush=True)
    except OSError as e:
        print("TIOCSTI", errno.errorcode[e.errno], flush=True)
    os._exit(0)
os.waitpid(pid, 0)
status = dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\t" in l)
print("seccomp", status["Seccomp"].strip(), "no_new_privs", status["NoNewPrivs"].strip())
"#;

/// seccomp and no_new_privs hold for every sandbox process: the documented deny list answers
/// EPERM (keyrings, bpf, perf, userfaultfd, modules, kexec, file handles, io_uring, terminal
/// injection, sockets of families such as vsock that a network namespace does not hold in),
/// and what agents run keeps working (a venv with pip, gcc, make, git, namespaces of their own,
/// strace of their own processes, node, where the host has them).
#[test]
fn seccomp_denies_the_list_and_agent_tools_keep_working() {
    for home in homes("seccomp") {
        let who = who(&home);
        let mut m = home.stdio();
        m.create();
        assert_own_pid_namespace(&mut m);
        let put = m.ok("write_file", json!({"path": "probe.py", "content": SECCOMP_PROBE}));
        assert!(put["bytes_written"].as_u64().is_some_and(|n| n > 0), "{put}");
        let (code, out, err) = sh(&mut m, "python3 probe.py");
        assert_eq!(code, 0, "{who}: {err}");
        let denied = [
            "add_key",
            "bpf",
            "init_module",
            "kexec_load",
            "keyctl",
            "open_by_handle_at",
            "perf_event_open",
            "userfaultfd",
            "io_uring_setup",
        ];
        for name in denied.into_iter().chain(["vsock", "smc", "alg", "tipc-pair", "vsock-pair"]) {
            assert!(out.contains(&format!("{name} EPERM\n")), "{who}: {name} is not refused: {out}");
        }
        assert!(out.contains("unix-pair ok\n"), "{who}: {out}");
        assert!(out.contains("TIOCSTI EPERM") || out.contains("TIOCSTI EIO"), "{who}: {out}");
        assert!(out.contains("seccomp 2 no_new_privs 1"), "{who}: {out}");
        let tools = r#"set -e
python3 -m venv v && v/bin/pip --version >/dev/null && echo venv
printf 'int main(void){return 0;}\n' >a.c && gcc a.c -o a && ./a && echo gcc
printf 'all:\n\t@echo make\n' >Makefile && make
git init -q r && echo git
unshare -Ur true && echo userns
if command -v strace >/dev/null; then strace -f -o /dev/null true && echo strace; else echo strace; fi
if command -v node >/dev/null; then node -e 'console.log("node")'; else echo node; fi"#;
        let (code, out, err) = sh(&mut m, tools);
        assert_eq!((code, out.as_str()), (0, "venv\ngcc\nmake\ngit\nuserns\nstrace\nnode\n"), "{who}: {err}");
    }
}

/// The sandbox joins its limits cgroup before its cgroup namespace exists: a cgroup hierarchy
/// mounted inside shows only the sandbox's own leaf (no other sandbox's id, nothing of the host),
/// and sandbox root cannot raise its limits: whatever it writes on what it sees, 600 MiB under
/// `memory_mb: 256` is still killed and 300 processes under `processes: 64` still fail.
#[test]
fn cgroups_show_nothing_of_other_sandboxes_and_limits_hold() {
    for home in homes("iso-cgroupns") {
        let who = who(&home);
        let mut m = home.stdio();
        let limits = json!({"limits": {"memory_mb": 256, "processes": 64}});
        let other = m.call("create_sandbox", limits.clone());
        if other["isError"] == true {
            // Where no cgroup can be written, limits are refused (limits_are_enforced_or_refused_with_the_reason).
            assert!(home.run_as.is_some() || !is_root(), "{who}: {other}");
            continue;
        }
        let other = other["structuredContent"]["sandbox_id"].as_str().unwrap().to_string();
        let sb = m.ok("create_sandbox", limits)["sandbox_id"].as_str().unwrap().to_string();
        m.ok("run_command", json!({"sandbox_id": sb, "command": "true"}));
        let run = |m: &mut Mcp, command: &str| {
            let out = m.ok("run_command", json!({"sandbox_id": sb, "command": command, "timeout": 60}));
            (out["exit_code"].as_i64().unwrap(), out["stdout"].as_str().unwrap().to_string())
        };
        let mount = r#"for h in memory pids; do mkdir -p /tmp/$h
  mount -t cgroup -o $h none /tmp/$h 2>/dev/null || mount -t cgroup2 none /tmp/$h 2>/dev/null || echo "no $h mount"
done
find /tmp/memory /tmp/pids -type d
for f in /tmp/memory/memory.limit_in_bytes /tmp/memory/memory.memsw.limit_in_bytes /tmp/memory/memory.max; do [ -f $f ] && { echo -1 >$f || echo max >$f; } 2>/dev/null; done
[ -f /tmp/pids/pids.max ] && echo max >/tmp/pids/pids.max 2>/dev/null
true"#;
        let (_, seen) = run(&mut m, mount);
        assert!(!seen.contains(&other) && !seen.contains("sandbox-mcp"), "{who}: the mounted hierarchy shows other cgroups: {seen}");
        assert!(seen.lines().any(|l| l == "/tmp/memory") || seen.contains("no memory mount"), "{who}: {seen}");
        let (code, _) = run(&mut m, "x=$(head -c 629145600 /dev/zero | tr '\\0' a); echo ${#x}");
        assert_ne!(code, 0, "{who}: 600 MiB were allocated under a 256 MiB limit after sandbox root wrote its cgroup files");
        let nap = format!("4.{}", u32::from_str_radix(&sandbox_mcp::ids::random_hex(3), 16).unwrap());
        m.call(
            "run_command",
            json!({"sandbox_id": sb, "command": format!("exec sh -c 'i=0; while [ $i -lt 300 ]; do sleep {nap} & i=$((i+1)); done; wait'")}),
        );
        let running = pids_of_argv(&["sleep", &nap]).len();
        assert!((8..=64).contains(&running), "{who}: {running} processes under a limit of 64");
        wait_for(Duration::from_secs(20), "the sleeps to end", || pids_of_argv(&["sleep", &nap]).is_empty().then_some(()));
    }
}

/// Defaults that protect the host: a sandbox whose request sets no limits gets the server's
/// default limits where the host can enforce them (reported in its result), and a fork bomb and a
/// memory hog in it leave another sandbox answering within a second.
#[test]
fn default_limits_bound_a_fork_bomb_and_a_memory_hog() {
    for home in homes("iso-defaults") {
        let who = who(&home);
        let mut m = home.stdio_with(&[("SANDBOX_MCP_DEFAULT_LIMITS", "memory_mb=256,processes=64")]);
        let sb = m.ok("create_sandbox", json!({}));
        let limited = sb["limits"] == json!({"memory_mb": 256, "processes": 64, "disk_mb": null});
        if !limited {
            // Only where no cgroup can be written: then nothing is claimed.
            assert!(home.run_as.is_some() || !is_root(), "{who}: root must get the default limits: {sb}");
            assert_eq!(sb["limits"], json!({"memory_mb": null, "processes": null, "disk_mb": null}), "{who}: {sb}");
            continue;
        }
        let sb = sb["sandbox_id"].as_str().unwrap().to_string();
        let other = m.ok("create_sandbox", json!({}))["sandbox_id"].as_str().unwrap().to_string();
        m.ok("run_command", json!({"sandbox_id": sb, "command": "true"}));
        // assert_own_pid_namespace checks the default sandbox; check this one the same way.
        let ns = m.ok("run_command", json!({"sandbox_id": sb, "command": "readlink /proc/self/ns/pid"}));
        let host = std::fs::read_link("/proc/self/ns/pid").unwrap().display().to_string();
        assert!(ns["stdout"].as_str().unwrap().starts_with("pid:[") && ns["stdout"] != format!("{host}\n"), "{who}: refusing: {ns}");
        let hog = m.ok(
            "start_task",
            json!({"sandbox_id": sb, "command": "x=$(head -c 629145600 /dev/zero | tr '\\0' a); echo ${#x}", "timeout": 20}),
        );
        let bomb = m.ok("start_task", json!({"sandbox_id": sb, "command": "b() { b | b & }; b", "timeout": 20}));
        for _ in 0..5 {
            let t0 = Instant::now();
            let r = m.ok("run_command", json!({"sandbox_id": other, "command": "echo ok"}));
            assert_eq!(r["stdout"], "ok\n", "{who}: {r}");
            assert!(t0.elapsed() < Duration::from_secs(1), "{who}: another sandbox took {:?} beside a fork bomb", t0.elapsed());
        }
        assert!(bomb["task_id"].is_string() && hog["task_id"].is_string(), "{who}: {bomb} {hog}");
        assert_eq!(m.ok("kill_sandbox", json!({"sandbox_id": sb}))["killed"], true);
        let t0 = Instant::now();
        assert_eq!(m.ok("run_command", json!({"sandbox_id": other, "command": "echo ok"}))["stdout"], "ok\n");
        assert!(t0.elapsed() < Duration::from_secs(1), "{who}: {:?}", t0.elapsed());
    }
}

/// Nested namespaces are bounded per sandbox: its user namespace allows 64 of each kind, so 100
/// user namespaces held open inside get at most 64, and other clients' sandboxes still start.
#[test]
fn nested_namespaces_are_bounded_per_sandbox() {
    for home in homes("iso-nested") {
        let who = who(&home);
        let mut m = home.stdio();
        m.create();
        assert_own_pid_namespace(&mut m);
        assert_eq!(sh(&mut m, "cat /proc/sys/user/max_user_namespaces").1, "64\n", "{who}");
        let nap = unique_sleep();
        let hold = format!("i=0; while [ $i -lt 100 ]; do unshare -U sleep {nap} 2>/dev/null & i=$((i+1)); done; true");
        m.ok("run_command", json!({"command": hold, "timeout": 30}));
        let held = wait_for(Duration::from_secs(10), "the nested namespaces to settle", || {
            let n = pids_of_argv(&["sleep", &nap]).len();
            std::thread::sleep(Duration::from_millis(300));
            (n == pids_of_argv(&["sleep", &nap]).len()).then_some(n)
        });
        assert!((8..=64).contains(&held), "{who}: {held} nested user namespaces held under a limit of 64");
        let mut other = home.stdio();
        other.create();
        assert_eq!(other.ok("run_command", json!({"command": "unshare -U true && echo ok"}))["stdout"], "ok\n", "{who}");
    }
}

/// The init, which serves the spawner's connections, is out of reach of sandbox code that runs as
/// root of the same user namespace: its descriptors (`/proc/1/fd/N`, `pidfd_getfd`), memory and
/// environment cannot be opened and it cannot be traced; CAP_SYS_PTRACE is gone from every
/// sandbox process's bounding set, while tracing the sandbox's own processes keeps working.
#[test]
fn the_init_and_its_channels_are_out_of_reach() {
    for home in homes("iso-init-reach") {
        let who = who(&home);
        let mut m = home.stdio();
        let sb = m.create();
        assert_own_pid_namespace(&mut m);
        // Commands the init started, then commands entered with nsenter (a sandbox made before
        // the spawner existed, simulated without its socket: those ran without the filter and
        // with CAP_SYS_PTRACE, so they could read the init's environment).
        for path in ["spawner", "nsenter"] {
            if path == "nsenter" {
                std::fs::remove_file(home.sandbox_dir(&sb).join("spawn.sock")).unwrap();
            }
            let probe = r#"for f in /proc/1/fd/* /proc/1/mem /proc/1/environ; do if (exec 3<"$f") 2>/dev/null; then echo "opened $f"; fi; done
if command -v strace >/dev/null; then timeout 5 strace -p 1 -o /dev/null 2>/dev/null && echo traced; fi
python3 -c 'import ctypes; l = ctypes.CDLL(None, use_errno=True); p = l.syscall(434, 1, 0); print("getfd", l.syscall(438, p, 0, 0), ctypes.get_errno())'
awk '/^CapBnd/ { print "bnd", $2 } /^Seccomp:/ { print "seccomp", $2 } /^NoNewPrivs/ { print "nnp", $2 }' /proc/self/status"#;
            let (code, out, err) = sh(&mut m, probe);
            assert_eq!(code, 0, "{who}, {path}: {err}");
            assert!(!out.contains("opened") && !out.contains("traced"), "{who}, {path}: the init is in reach: {out}");
            assert!(out.contains("getfd -1 1\n"), "{who}, {path}: pidfd_getfd on the init must fail with EPERM: {out}");
            let bnd = out.lines().find_map(|l| l.strip_prefix("bnd ")).and_then(|h| u64::from_str_radix(h, 16).ok()).unwrap();
            assert_eq!(bnd & (1 << 19), 0, "{who}, {path}: CAP_SYS_PTRACE is still in the bounding set: {out}");
            assert!(out.contains("seccomp 2\n") && out.contains("nnp 1\n"), "{who}, {path}: no seccomp filter: {out}");
            let (code, _, err) = sh(&mut m, "command -v strace >/dev/null || exit 0; strace -f -o /dev/null sh -c true");
            assert_eq!(code, 0, "{who}, {path}: tracing the sandbox's own processes must work: {err}");
        }
    }
}

/// Sandboxes with limits share a contended processor equally: where the host has the cpu
/// controller (a v1 `cpu` hierarchy or v2's `cpu`), each gets a cpu cgroup of its own, which its
/// init joins before anything runs.
#[test]
fn limited_sandboxes_get_a_cpu_cgroup_of_their_own() {
    if !is_root() {
        return; // No writable cgroup: limits are refused (limits_are_enforced_or_refused_with_the_reason).
    }
    let home = Home::new("iso-cpu");
    let mut m = home.stdio();
    let sb = m.ok("create_sandbox", json!({"limits": {"processes": 64}}))["sandbox_id"].as_str().unwrap().to_string();
    let v2 = std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let (root, has_cpu) = if v2 {
        let controllers = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers").unwrap();
        ("/sys/fs/cgroup", controllers.split_whitespace().any(|c| c == "cpu"))
    } else {
        ("/sys/fs/cgroup/cpu", std::path::Path::new("/sys/fs/cgroup/cpu").is_dir())
    };
    if !has_cpu {
        return;
    }
    let found =
        std::process::Command::new("find").args([root, "-type", "d", "-path", &format!("*/sandbox-mcp/{sb}/sandbox")]).output().unwrap();
    let leaf = String::from_utf8_lossy(&found.stdout).lines().next().map(str::to_string);
    let leaf = leaf.unwrap_or_else(|| panic!("no cgroup of {sb} under {root}"));
    let procs = std::fs::read_to_string(format!("{leaf}/cgroup.procs")).unwrap();
    assert!(!procs.trim().is_empty(), "the sandbox's processes are not in its cpu cgroup {leaf}");
    if v2 {
        let parent = std::path::Path::new(&leaf).parent().unwrap().join("cgroup.controllers");
        assert!(std::fs::read_to_string(parent).unwrap().split_whitespace().any(|c| c == "cpu"), "cpu is not enabled for {sb}");
    }
    m.ok("kill_sandbox", json!({"sandbox_id": sb}));
    assert!(!std::path::Path::new(&leaf).exists(), "the cpu cgroup {leaf} outlived its sandbox");
}

/// Whether a root server here can give sandboxes disks of their own; says why not when it cannot.
fn disks_work() -> bool {
    use sandbox_mcp::provider::local::isolation::{disk, Isolation};
    match disk::check(Isolation::Namespaces) {
        Ok(()) => true,
        Err(why) => {
            eprintln!("disk tests need a root server with loop devices: {why}");
            false
        }
    }
}

/// The loop devices whose backing file lies in sandbox `sb`'s directory.
fn loop_devices_of(sb: &str) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/sys/block") else { return Vec::new() };
    dir.flatten()
        .filter(|e| std::fs::read_to_string(e.path().join("loop/backing_file")).is_ok_and(|f| f.contains(sb)))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// Sandbox code may take every right away from a directory of its home: kill_sandbox still
/// removes all of the sandbox's files. A server that is not root could not list such a
/// directory, so the kill failed ("could not remove ...: Permission denied") and the files
/// outlived the sandbox.
#[test]
fn a_directory_without_rights_does_not_outlive_its_sandbox() {
    for home in homes("iso-no-rights") {
        let who = who(&home);
        let mut m = home.stdio();
        let sb = m.create();
        let (code, _, err) = sh(&mut m, "mkdir -p q/r && touch q/r/f && chmod 000 q/r q");
        assert_eq!(code, 0, "{who}: {err}");
        let killed = m.call("kill_sandbox", json!({"sandbox_id": sb}));
        assert_eq!(killed["isError"], false, "{who}: {killed}");
        assert!(!home.sandbox_dir(&sb).exists(), "{who}: the sandbox's directory outlived it");
    }
}

/// A file system of this test's own, mounted over a directory until dropped (then detached, and
/// its image removed).
#[derive(Default)]
struct Mounted {
    at: Option<(PathBuf, PathBuf)>,
}

impl Mounted {
    /// A new ext4 image of `mib` MiB, `reserved_percent` of it kept for root, mounted at `dir`.
    fn ext4(&mut self, dir: &Path, mib: u64, reserved_percent: u32) {
        let image = dir.with_extension("img");
        std::fs::File::create(&image).unwrap().set_len(mib << 20).unwrap();
        let made =
            std::process::Command::new("mkfs.ext4").args(["-q", "-F", "-m", &reserved_percent.to_string()]).arg(&image).status().unwrap();
        assert!(made.success(), "mkfs.ext4 failed");
        let mounted = std::process::Command::new("mount").args(["-o", "loop"]).arg(&image).arg(dir).status().unwrap();
        assert!(mounted.success(), "mount -o loop failed");
        self.at = Some((dir.to_path_buf(), image));
    }

    /// An overlay mounted at `dir`, its layers in a directory beside it.
    fn overlay(&mut self, dir: &Path) {
        let layers = dir.with_extension("layers");
        for layer in ["lower", "upper", "work"] {
            std::fs::create_dir_all(layers.join(layer)).unwrap();
        }
        let options = format!(
            "lowerdir={},upperdir={},workdir={}",
            layers.join("lower").display(),
            layers.join("upper").display(),
            layers.join("work").display()
        );
        let mounted = std::process::Command::new("mount").args(["-t", "overlay", "overlay", "-o", &options]).arg(dir).status().unwrap();
        assert!(mounted.success(), "mount -t overlay failed");
        self.at = Some((dir.to_path_buf(), layers));
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some((dir, backing)) = self.at.take() {
            let _ = rustix::mount::unmount(&dir, rustix::mount::UnmountFlags::DETACH);
            let _ = std::fs::remove_file(&backing).or_else(|_| std::fs::remove_dir_all(&backing));
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// Where the kernel refuses the home's overlay (here: a state root on another overlay, which
/// cannot be an overlay's upper layer), the home is bound and its host path shows in the
/// sandbox's mountinfo; create_sandbox then says so by leaving `no_host_paths` out of its layers.
/// It claimed nothing either way before.
#[test]
fn the_layers_say_when_the_homes_mount_shows_a_host_path() {
    // Declared first, dropped last: after the home has ended its sandboxes.
    let mut fs = Mounted::default();
    let Some(home) = isolated_home("iso-bound-home") else { return };
    if !is_root() {
        return;
    }
    std::fs::create_dir_all(&home.path).unwrap();
    fs.overlay(&home.path);
    let mut m = home.stdio();
    let made = m.ok("create_sandbox", json!({}));
    let id = made["sandbox_id"].as_str().unwrap().to_string();
    let (_, mounts, _) = sh(&mut m, "cat /proc/self/mountinfo");
    // The home's line: its root field is the home's path on the state root's file system (the
    // host path itself, where the state root is not a mount point of its own).
    let home_line = mounts.lines().find(|l| l.split(' ').nth(4) == Some("/home/user")).unwrap_or_default();
    let bound = format!("/sandboxes/{id}/home");
    assert_eq!(
        home_line.split(' ').nth(3),
        Some(bound.as_str()),
        "the home's overlay held on an overlay; this test needs a case where it does not:\n{mounts}"
    );
    let layers = made["layers"].as_array().cloned().unwrap_or_default();
    assert!(!layers.contains(&json!("no_host_paths")), "the layers claim no host path while mountinfo names {bound}: {made}");
    assert!(layers.contains(&json!("mount")), "{made}");
    assert_eq!(sh(&mut m, "echo x > f && cat f").1, "x\n", "the bound home works");
}

/// A root server's sandbox writes its home with no more right to the disk than an unprivileged
/// user: on a file system that keeps blocks for root (ext4's reserve), its writes stop where
/// that user's would. The home's overlay was mounted with all of the host root's capabilities,
/// and the sandbox's writes took the reserve too: the whole disk, root's services included.
#[test]
fn a_sandbox_cannot_take_the_disk_space_kept_for_root() {
    // Declared first, dropped last: after the home has ended its sandboxes.
    let mut disk = Mounted::default();
    let Some(home) = isolated_home("iso-reserve") else { return };
    if !is_root() || !disks_work() {
        return;
    }
    std::fs::create_dir_all(&home.path).unwrap();
    // 64 MiB, half of it kept for root.
    disk.ext4(&home.path, 64, 50);
    let mut m = home.stdio();
    m.create();
    let (code, _, err) = sh(&mut m, "head -c 104857600 /dev/zero > big");
    assert_ne!(code, 0, "100 MB fit in 64 MiB");
    assert!(err.contains("No space left on device"), "{err}");
    let fs = rustix::fs::statvfs(&home.path).unwrap();
    let free = fs.f_bfree * fs.f_frsize;
    assert!(free >= 16 << 20, "the sandbox took the space kept for root: {} KiB left", free >> 10);
}

/// `limits.disk_mb` bounds what a sandbox writes into its home, `/tmp` and `/dev/shm` (ENOSPC,
/// never the host's disk); its home is a file system of its own, so mountinfo inside names no
/// host path; other sandboxes go on; kill_sandbox leaves no mount, loop device or image.
#[test]
fn a_disk_of_its_own_bounds_home_and_tmp_and_goes_with_the_sandbox() {
    let Some(home) = isolated_home("iso-disk") else { return };
    if !is_root() || !disks_work() {
        return;
    }
    let mut m = home.stdio();
    let c = m.ok("create_sandbox", json!({"limits": {"disk_mb": 64}}));
    let a = c["sandbox_id"].as_str().unwrap().to_string();
    assert_eq!(c["limits"]["disk_mb"], 64, "{c}");
    assert!(c["about"].as_str().unwrap().contains("64 MiB"), "{c}");
    assert!(c["layers"].as_array().is_some_and(|l| l.contains(&json!("no_host_paths"))), "{c}");
    let b = m.create();
    let uid = sandbox_host_uid(&home, &a);
    let home_dir = home.sandbox_dir(&a).join("home");
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&home_dir).unwrap()), uid, "the disk's root is the sandbox's");
    let image = home.sandbox_dir(&a).join("disk.img");
    let host_mounts = || std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(host_mounts().contains(&format!("{} ", home_dir.display())), "the disk is not mounted at the home on the host");

    // 200 MB into a disk of 64 MiB, in each place the sandbox can write.
    for dir in ["$HOME", "/tmp", "/dev/shm"] {
        let (code, _, err) = sh_in(&mut m, &a, &format!("head -c 209715200 /dev/zero > {dir}/big"));
        assert_ne!(code, 0, "{dir}: 200 MB fit in a disk of 64 MiB");
        assert!(err.contains("No space left on device"), "{dir}: {err}");
        let used = std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(&image).unwrap()) * 512;
        assert!(used <= 64 << 20, "{dir}: the image takes {used} bytes of the host's disk");
        assert_eq!(sh_in(&mut m, &a, &format!("rm {dir}/big && echo freed")).1, "freed\n", "{dir}");
    }
    let (code, _, _) = sh_in(&mut m, &a, "echo x > /dev/x");
    assert_ne!(code, 0, "/dev is writable: it would be space outside the disk");
    // The other sandbox, without a disk, goes on.
    assert_eq!(sh_in(&mut m, &b, "head -c 1048576 /dev/zero > ~/f && head -c 1048576 /dev/zero > /tmp/f && echo ok").1, "ok\n");

    // Inside, the home is the root of its own file system: no host path of the state root.
    let (_, mounts, _) = sh_in(&mut m, &a, "cat /proc/self/mountinfo");
    let state_root = home.path.display().to_string();
    assert!(!mounts.contains(&state_root), "mountinfo inside names the state root {state_root}:\n{mounts}");
    let root_of = |point: &str| {
        mounts.lines().find_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.get(4) == Some(&point)).then(|| f[3].to_string())
        })
    };
    assert_eq!(root_of("/home/user").as_deref(), Some("/"), "{mounts}");
    assert_eq!(root_of("/tmp").as_deref(), Some("/.sandbox-mcp/tmp"), "{mounts}");

    m.ok("kill_sandbox", json!({"sandbox_id": a}));
    assert!(!host_mounts().contains(&a), "a mount of {a} outlived kill_sandbox:\n{}", host_mounts());
    assert!(!image.exists() && !home.sandbox_dir(&a).exists(), "the image of {a} outlived kill_sandbox");
    wait_for(Duration::from_secs(10), "the loop device to be released", || loop_devices_of(&a).is_empty().then_some(()));
    assert_eq!(sh_in(&mut m, &b, "echo alive").1, "alive\n");
}

/// Where a disk cannot be made, `disk_mb` is refused with the reason and creates nothing: an
/// unprivileged server cannot mount, and a sandbox without isolation could write anywhere.
#[test]
fn disk_mb_is_refused_with_the_reason_where_it_cannot_be_enforced() {
    let mut homes: Vec<(Home, &str)> = vec![(Home::unisolated("iso-disk-none"), "without isolation")];
    if let (Some(uid), Some(home)) = (unprivileged_uid(), isolated_home("iso-disk-user")) {
        homes.push((home.run_as(uid), "not root"));
    }
    for (home, why) in homes {
        let mut m = home.stdio();
        let err = m.err("create_sandbox", json!({"limits": {"disk_mb": 64}}));
        assert!(err.contains("disk_mb") && err.contains(why) && err.contains("leave disk_mb out"), "{err}");
        let dirs = std::fs::read_dir(home.path.join("sandboxes")).map(|d| d.count()).unwrap_or(0);
        assert_eq!(dirs, 0, "a refused create left a sandbox behind");
    }
}

/// A sandbox with a disk that expires, or whose kill was interrupted (its metadata gone, its
/// directory left), is ended by its keeper with no server running: no mount, loop device or
/// image stays.
#[test]
fn expiry_and_an_interrupted_kill_release_the_disk() {
    let Some(home) = isolated_home("iso-disk-expiry") else { return };
    if !is_root() || !disks_work() {
        return;
    }
    let expiring = home.create_detached(json!({"timeout": 2, "limits": {"disk_mb": 16}}));
    let interrupted = home.create_detached(json!({"limits": {"disk_mb": 16}}));
    std::fs::remove_file(home.sandbox_dir(&interrupted).join("meta.json")).unwrap();
    // A default disk (--default-limits may carry disk_mb) goes with the default cgroup limits,
    // and stays when a request sets only cgroup limits.
    let mut m = home.stdio_with(&[("SANDBOX_MCP_DEFAULT_LIMITS", "memory_mb=512,disk_mb=16")]);
    let c = m.ok("create_sandbox", json!({}));
    assert_eq!(c["limits"], json!({"memory_mb": 512, "processes": null, "disk_mb": 16}), "{c}");
    let c = m.ok("create_sandbox", json!({"limits": {"processes": 64}}));
    assert_eq!(c["limits"], json!({"memory_mb": null, "processes": 64, "disk_mb": 16}), "{c}");
    m.close();
    for sb in [&expiring, &interrupted] {
        wait_for(Duration::from_secs(20), "the keeper to end the sandbox and release its disk", || {
            let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
            (!mounts.contains(sb.as_str()) && !home.sandbox_dir(sb).exists() && loop_devices_of(sb).is_empty()).then_some(())
        });
    }
}

/// A sandbox's text in a server's log line is written with its control and invisible characters
/// as escapes: here the error line of a handover whose `chmod` the sandbox replaced (root of its
/// mount namespace may mount over it), carrying an escape sequence, a carriage return and a
/// right-to-left override. Found by a review: a warning carried such a line raw to the operator's
/// terminal (window title set, screen cleared, a forged log line).
#[test]
fn sandbox_text_in_the_servers_log_is_escaped() {
    let Some(home) = isolated_home("log-escapes") else { return };
    let log_path = home.path.join("server.log");
    let mut cmd = home.stdio_command(&bin(), &[("SANDBOX_MCP_TASK_AFTER", "1")]);
    cmd.stderr(std::fs::File::create(&log_path).unwrap());
    let mut client = sandbox_mcp::client::StdioClient::start(cmd, sandbox_mcp::client::Reads::WithTimeouts).unwrap();
    client.initialize().unwrap();
    let mut m = Mcp { client };
    let _ = m.create();
    let plant = r#"printf '#!/bin/sh\nprintf "@error \\033]0;TITLE\\007 \\r\\342\\200\\256FORGED\\n"\nkill -9 $PPID\n' >/tmp/fake && chmod 755 /tmp/fake && mount --bind /tmp/fake "$(command -v chmod)" && echo planted"#;
    assert_eq!(sh(&mut m, plant).1, "planted\n");
    // Longer than SANDBOX_MCP_TASK_AFTER: the command is handed over to a supervisor.
    let _ = m.call("run_command", json!({"command": "sleep 2; echo done", "timeout": 30}));
    m.close();
    let log = std::fs::read(&log_path).unwrap();
    let text = String::from_utf8_lossy(&log);
    assert!(text.contains("FORGED"), "the handover's error was logged: {text}");
    for raw in ["\u{1b}", "\r", "\u{202e}", "\u{7}"] {
        assert!(!text.contains(raw), "{raw:?} reached the log raw: {text:?}");
    }
    assert!(text.contains("\\u{d}\\u{202e}FORGED"), "{text:?}");
}
