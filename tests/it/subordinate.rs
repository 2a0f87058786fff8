//! An unprivileged server whose user has subordinate ids gives each isolated sandbox a host uid
//! of its own from them (`isolation::subordinate`): every server of a state root, started at any
//! time or together, works in one user namespace, and `--subordinate-ids off` or live sandboxes
//! made without them keep the shared uid.

use crate::support::*;
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// A home whose servers run as [`subordinate_user`] with namespace isolation; `None` where this
/// process is not root or namespaces are unavailable.
fn sub_home(name: &str) -> Option<(Home, u32)> {
    let (uid, gid) = subordinate_user()?;
    let home = Home::new(name).with_isolation("namespaces");
    if !home.isolated() {
        return None;
    }
    Some((home.run_as_user(uid, gid), uid))
}

/// The real uid of host process `pid`.
fn host_uid(pid: u32) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Starts a task sleeping a unique time in sandbox `sb`: its task id and host pid.
fn sleeper(m: &mut Mcp, sb: &str) -> (String, u32) {
    let nap = unique_sleep();
    let started = m.ok("start_task", json!({"sandbox_id": sb, "command": format!("exec sleep {nap}")}));
    (started["task_id"].as_str().unwrap().to_string(), pid_of_argv(&["sleep", &nap]))
}

fn sh(m: &mut Mcp, sb: &str, command: &str) -> (i64, String) {
    let out = m.ok("run_command", json!({"sandbox_id": sb, "command": command, "timeout": 60}));
    (out["exit_code"].as_i64().unwrap(), out["stdout"].as_str().unwrap().to_string())
}

/// Whether `uid` is one of the test user's subordinate ids.
fn subordinate(uid: u32) -> bool {
    (SUBORDINATE_FIRST..SUBORDINATE_FIRST + 65_536).contains(&uid)
}

#[test]
fn each_sandbox_of_an_unprivileged_server_gets_a_subordinate_uid_of_its_own() {
    let Some((home, user)) = sub_home("sub-own") else { return };
    let mut m = home.stdio();
    let mut made = Vec::new();
    for _ in 0..2 {
        let c = m.ok("create_sandbox", json!({}));
        let about = c["about"].as_str().unwrap();
        assert!(about.contains("host uid of its own"), "an unprivileged server with subordinate ids: {about}");
        made.push(c["sandbox_id"].as_str().unwrap().to_string());
    }
    let (a, b) = (made[0].clone(), made[1].clone());
    let (task_a, pid_a) = sleeper(&mut m, &a);
    let (_, pid_b) = sleeper(&mut m, &b);
    let (uid_a, uid_b) = (host_uid(pid_a), host_uid(pid_b));
    assert!(subordinate(uid_a) && subordinate(uid_b) && uid_a != uid_b, "host uids {uid_a} and {uid_b}: not two subordinate ids");
    assert_eq!(sh(&mut m, &a, "id -u").1.trim(), "0", "sandbox code is root of its own namespace");
    // Each host uid is claimed (under the state root here: the test sets no XDG_RUNTIME_DIR).
    for (sb, uid) in [(&a, uid_a), (&b, uid_b)] {
        let claim = std::fs::read_to_string(home.path.join("uids").join(uid.to_string())).unwrap_or_default();
        assert!(claim.ends_with(sb.as_str()), "the claim on host uid {uid} names {claim:?}, not {sb}");
    }
    // The file tools act inside: the file is the sandbox's, on the host as inside.
    m.ok("write_file", json!({"sandbox_id": a, "path": "/home/user/note.txt", "content": "kept"}));
    assert_eq!(m.ok("read_file", json!({"sandbox_id": a, "path": "/home/user/note.txt"}))["content"], json!("kept"));
    let on_host = std::fs::metadata(home.sandbox_dir(&a).join("home/note.txt")).unwrap();
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&on_host), uid_a, "the file's host owner");
    assert_eq!(sh(&mut m, &a, "stat -c %u /home/user/note.txt").1.trim(), "0");
    // A disk of its own needs the host's root.
    let refused = m.err("create_sandbox", json!({"limits": {"disk_mb": 64}}));
    assert!(refused.contains("not root of the host"), "{refused}");

    // A second server, started while the first runs, reaches both sandboxes.
    let mut second = home.stdio();
    let task = second.ok("get_task", json!({"sandbox_id": a, "task_id": task_a}));
    assert_eq!(task["state"], json!("running"), "{task}");
    assert_eq!(sh(&mut second, &a, "cat /home/user/note.txt").1, "kept");
    second.ok("kill_sandbox", json!({"sandbox_id": b}));
    wait_for(Duration::from_secs(10), "sandbox b's sleep to end", || (!pid_alive(pid_b)).then_some(()));
    second.close();
    m.close();
    // With no server left, one from the command line joins through the sandbox's keeper.
    let out = run_cli(&home, "run_command", &json!({"sandbox_id": a, "command": "cat /home/user/note.txt"}));
    assert_eq!(out["stdout"], json!("kept"), "{out}");
    run_cli(&home, "kill_sandbox", &json!({"sandbox_id": a}));
    wait_for(Duration::from_secs(10), "sandbox a's sleep to end", || (!pid_alive(pid_a)).then_some(()));
    assert_ne!(uid_a, user);
}

#[test]
fn servers_started_together_end_in_one_namespace() {
    let Some((home, _)) = sub_home("sub-together") else { return };
    // All three start before any initializes (and so before any made a sandbox).
    let clients: Vec<_> = (0..3).map(|_| home.spawn_stdio(&[])).collect();
    let mut servers: Vec<Mcp> = clients
        .into_iter()
        .map(|mut client| {
            client.initialize().expect("initialize");
            Mcp { client }
        })
        .collect();
    let ids: Vec<String> = servers.iter_mut().map(|m| m.create()).collect();
    // Every server runs a command in, writes and reads a file of, every sandbox; each kills
    // the next one's sandbox and its task.
    let naps: Vec<(String, u32)> = ids.iter().map(|sb| sleeper(&mut servers[0], sb)).collect();
    for (i, m) in servers.iter_mut().enumerate() {
        for sb in &ids {
            assert_eq!(sh(m, sb, "echo ok").1, "ok\n");
            let path = format!("/home/user/from-{i}");
            m.ok("write_file", json!({"sandbox_id": sb, "path": path, "content": "x"}));
            assert_eq!(m.ok("read_file", json!({"sandbox_id": sb, "path": path}))["content"], json!("x"));
        }
    }
    for (i, m) in servers.iter_mut().enumerate() {
        let next = (i + 1) % ids.len();
        m.ok("kill_sandbox", json!({"sandbox_id": ids[next]}));
        let pid = naps[next].1;
        wait_for(Duration::from_secs(10), "the killed sandbox's task to end", || (!pid_alive(pid)).then_some(()));
    }
    for m in servers {
        m.close();
    }
}

#[test]
fn sandboxes_share_the_uid_when_told_or_while_shared_ones_live() {
    let Some((home, user)) = sub_home("sub-shared") else { return };
    let off = [("SANDBOX_MCP_SUBORDINATE_IDS", "off")];
    let mut m = home.stdio_with(&off);
    let c = m.ok("create_sandbox", json!({}));
    assert!(c["about"].as_str().unwrap().contains("shares the server's host uid"), "{c}");
    let shared = c["sandbox_id"].as_str().unwrap().to_string();
    let (_, pid) = sleeper(&mut m, &shared);
    assert_eq!(host_uid(pid), user, "--subordinate-ids off: the sandbox runs as the server's uid");
    m.close();
    // While it lives, a server with subordinate ids on stays with the shared uid and reaches it.
    let mut m = home.stdio();
    let c = m.ok("create_sandbox", json!({}));
    assert!(c["about"].as_str().unwrap().contains("shares the server's host uid"), "{c}");
    assert_eq!(sh(&mut m, &shared, "echo reached").1, "reached\n");
    m.ok("kill_sandbox", json!({"sandbox_id": shared}));
    let other = c["sandbox_id"].as_str().unwrap().to_string();
    m.ok("kill_sandbox", json!({"sandbox_id": other}));
    m.close();
    // Once none lives, a new server gives uids of its own again.
    let mut m = home.stdio();
    let c = m.ok("create_sandbox", json!({}));
    assert!(c["about"].as_str().unwrap().contains("host uid of its own"), "{c}");
    m.close();
}

/// Runs `sandbox-mcp call TOOL ARGS` as `home`'s user: the result.
fn run_cli(home: &Home, tool: &str, args: &Value) -> Value {
    let out = home
        .command_as_its_user(&shared_bin())
        .args(["call", tool, &args.to_string()])
        .envs(home.env())
        .current_dir(Path::new("/"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{tool}: {} {}", text, String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(&text).unwrap()
}

#[test]
fn a_landlock_sandbox_of_an_unprivileged_server_runs_as_a_subordinate_uid() {
    let Some((uid, gid)) = subordinate_user() else { return };
    if sandbox_mcp::provider::local::isolation::landlock::abi() == 0 {
        return;
    }
    let home = Home::new("sub-landlock").with_isolation("landlock").run_as_user(uid, gid);
    let mut m = home.stdio();
    let c = m.ok("create_sandbox", json!({}));
    assert!(c["about"].as_str().unwrap().contains("host uid of its own"), "{c}");
    let sb = c["sandbox_id"].as_str().unwrap().to_string();
    let (_, pid) = sleeper(&mut m, &sb);
    assert!(subordinate(host_uid(pid)), "the landlock sandbox's task runs as host uid {}", host_uid(pid));
    // A process of the server's own uid is out of its reach.
    let nap = unique_sleep();
    let mut witness = Command::new("sleep");
    std::os::unix::process::CommandExt::uid(&mut witness, uid);
    let mut witness = witness.arg(&nap).spawn().unwrap();
    let (code, _) = sh(&mut m, &sb, &format!("kill -TERM {} 2>/dev/null", witness.id()));
    assert_ne!(code, 0, "the sandbox signalled a process of the server's uid");
    assert!(witness.try_wait().unwrap().is_none());
    let _ = witness.kill();
    let _ = witness.wait();
    m.ok("write_file", json!({"sandbox_id": sb, "path": "f.txt", "content": "y"}));
    assert_eq!(sh(&mut m, &sb, "cat f.txt").1, "y");
    m.ok("kill_sandbox", json!({"sandbox_id": sb}));
    m.close();
}

/// A sandbox whose keeper died while no server ran lives on in the namespace that made it: the
/// next server joins that namespace through the sandbox's init, so it still reaches the sandbox
/// and kills it (before, it made a new namespace, and kill_sandbox answered `killed` while the
/// sandbox's processes ran on, out of its reach).
#[test]
fn a_sandbox_whose_keeper_died_is_still_reached_and_killed() {
    let Some((home, _)) = sub_home("sub-orphan") else { return };
    let mut m = home.stdio();
    let sb = m.create();
    let (_, nap) = sleeper(&mut m, &sb);
    m.close();
    let keeper: u32 =
        std::fs::read_to_string(home.sandbox_dir(&sb).join("keeper.pid")).unwrap().split(' ').next().unwrap().parse().unwrap();
    std::process::Command::new("/bin/sh").args(["-c", &format!("kill -s KILL {keeper}")]).status().unwrap();
    wait_for(Duration::from_secs(10), "the keeper to end", || (!pid_alive(keeper)).then_some(()));
    assert!(pid_alive(nap), "the sandbox's task ended with its keeper");
    let mut m = home.stdio();
    assert_eq!(sh(&mut m, &sb, "echo reached").1, "reached\n");
    m.ok("write_file", json!({"sandbox_id": sb, "path": "/home/user/f", "content": "z"}));
    assert_eq!(m.ok("kill_sandbox", json!({"sandbox_id": sb}))["killed"], json!(true));
    wait_for(Duration::from_secs(10), "the sandbox's task to end", || (!pid_alive(nap)).then_some(()));
    m.close();
}

/// A server that stays in the host's namespace (here told to, while no sandbox lives) records
/// itself: a server started beside it stays there too, so both reach every sandbox either makes.
#[test]
fn a_server_in_the_hosts_namespace_keeps_the_next_one_there() {
    let Some((home, user)) = sub_home("sub-split") else { return };
    let mut off = home.stdio_with(&[("SANDBOX_MCP_SUBORDINATE_IDS", "off")]);
    let mut auto = home.stdio();
    let (a, b) = (off.create(), auto.create());
    for m in [&mut off, &mut auto] {
        for sb in [&a, &b] {
            m.ok("write_file", json!({"sandbox_id": sb, "path": "/home/user/f", "content": "z"}));
        }
    }
    let (_, pid) = sleeper(&mut auto, &b);
    assert_eq!(host_uid(pid), user, "the second server's sandbox shares the uid, as the first one's");
    off.ok("kill_sandbox", json!({"sandbox_id": b}));
    auto.ok("kill_sandbox", json!({"sandbox_id": a}));
    off.close();
    auto.close();
}

/// A set-uid helper that hangs, or that reports success without mapping, costs a starting server
/// at most its budget: the server then works in the host's namespace and says why. (The helpers
/// are replaced by scripts inside a mount namespace of the test's own.)
#[test]
fn helpers_that_hang_or_lie_leave_a_working_server() {
    let Some((home, _)) = sub_home("sub-helpers") else { return };
    let (uid, gid) = (home.run_as.unwrap().to_string(), home.run_gid.unwrap().to_string());
    for (name, script, said) in [("hang", "exec sleep 30", "did not finish within"), ("lie", "exit 0", "did not map")] {
        let fake = home.path.join(format!("fake-{name}"));
        std::fs::write(&fake, format!("#!/bin/sh\n{script}\n")).unwrap();
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let line = format!(
            "mount --bind {fake} /usr/bin/newuidmap && exec setpriv --reuid {uid} --regid {gid} --clear-groups -- {bin} call create_sandbox '{{}}'",
            fake = fake.display(),
            bin = shared_bin().display()
        );
        let started = std::time::Instant::now();
        let out = Command::new("unshare").args(["--mount", "sh", "-c", &line]).envs(home.env()).env("RUST_LOG", "warn").output().unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{name}: {stdout} {stderr}");
        assert!(started.elapsed() < Duration::from_secs(20), "{name}: the start took {:?}", started.elapsed());
        assert!(stderr.contains(said) && stderr.contains("share the server's host uid"), "{name}: {stderr}");
        assert!(stdout.contains("shares the server's host uid"), "{name}: {stdout}");
        let id: Value = serde_json::from_str(&stdout).unwrap();
        run_cli(&home, "kill_sandbox", &json!({"sandbox_id": id["sandbox_id"]}));
    }
}

/// Runs `sh -c line` as `home`'s user with `home`'s environment (`$BIN` is the binary): its exit
/// code, stdout and stderr.
fn as_user(home: &Home, line: &str) -> (i32, String, String) {
    let out = home
        .command_as_its_user(Path::new("sh"))
        .args(["-c", line])
        .envs(home.env())
        .env("BIN", shared_bin())
        .env("RUST_LOG", "info")
        .current_dir(Path::new("/"))
        .output()
        .unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

/// A root server in a user namespace mapped as rootless containers map theirs (root to the user,
/// then its subordinate ids) is a root server like any other: it checks `--uid-range` against
/// the user database (before, it took itself for a server in a namespace for subordinate ids and
/// accepted a range holding `daemon`).
#[test]
fn a_root_server_in_a_rootless_container_checks_its_uid_range() {
    let Some((home, _)) = sub_home("sub-container") else { return };
    if sandbox_mcp::provider::local::isolation::landlock::abi() == 0 {
        return;
    }
    let container = format!(
        "unshare --user --map-root-user --map-users={first},1,65536 --map-groups={first},1,65536 -- \"$BIN\" --isolation landlock --uid-range 1-100 call create_sandbox '{{}}'",
        first = SUBORDINATE_FIRST
    );
    let (code, out, err) = as_user(&home, &container);
    assert_ne!(code, 0, "a range holding users was accepted: {out}");
    assert!(err.contains("--uid-range") && err.contains("/etc/passwd"), "{err}");
}

/// A namespace of another shape that this user made (here by a server run under `unshare
/// --map-root-user`, whose Landlock sandbox's keeper lives in it) is never joined: the next
/// server makes its own (before, it entered that namespace and ran on as its root).
#[test]
fn a_namespace_of_another_shape_is_not_joined() {
    let Some((home, _)) = sub_home("sub-shape") else { return };
    if sandbox_mcp::provider::local::isolation::landlock::abi() == 0 {
        return;
    }
    let (code, out, err) = as_user(&home, "unshare --user --map-root-user -- \"$BIN\" --isolation landlock call create_sandbox '{}'");
    assert_eq!(code, 0, "{out} {err}");
    let (code, out, err) = as_user(&home, "\"$BIN\" call list_sandboxes '{}'");
    assert_eq!(code, 0, "{out} {err}");
    assert!(err.contains("made a user namespace") && !err.contains("entered the user namespace"), "{err}");
}

/// A keeper that ends its sandbox at its expiry, with no server running, gives its uid back
/// where the server claimed it (before, keepers did not know they ran in a namespace for
/// subordinate ids, and looked for the claim elsewhere).
#[test]
fn an_expired_sandbox_gives_its_uid_back() {
    let Some((home, _)) = sub_home("sub-expiry") else { return };
    let mut m = home.stdio();
    let sb = m.ok("create_sandbox", json!({"timeout": 2}))["sandbox_id"].as_str().unwrap().to_string();
    let (_, pid) = sleeper(&mut m, &sb);
    let uid = host_uid(pid);
    let claim = home.path.join("uids").join(uid.to_string());
    assert!(claim.exists(), "no claim on host uid {uid}");
    m.close();
    wait_for(Duration::from_secs(30), "the expired sandbox's directory to go", || (!home.sandbox_dir(&sb).exists()).then_some(()));
    wait_for(Duration::from_secs(5), "the claim to go", || (!claim.exists()).then_some(()));
}
