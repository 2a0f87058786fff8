//! The shell an isolated sandbox keeps waiting for its next command (namespaces and Landlock
//! tiers, as this test's user and, when it is root, as an unprivileged user): the next
//! `run_command` runs in it, as `bash -c` would run the command; no value of one call's `envs`
//! stays behind in it; and sandbox code that kills it costs only a cold start.

use crate::support::*;
use serde_json::{json, Value};
use std::time::Duration;

/// The homes to check: each isolated tier this host has, for this user and an unprivileged one.
fn homes(name: &str) -> Vec<Home> {
    let mut tiers = Vec::new();
    match sandbox_mcp::provider::local::isolation::probe() {
        Ok(()) => tiers.push("namespaces"),
        Err(why) => eprintln!("no namespaces on this host: {why}"),
    }
    match sandbox_mcp::provider::local::isolation::landlock::available() {
        Ok(_) => tiers.push("landlock"),
        Err(why) => eprintln!("no Landlock on this host: {why}"),
    }
    let mut all = Vec::new();
    for tier in tiers {
        all.push(Home::new(&format!("{name}-{tier}")).with_isolation(tier));
        if let Some(uid) = unprivileged_uid() {
            all.push(Home::new(&format!("{name}-{tier}-user")).with_isolation(tier).run_as(uid));
        }
        if let Some((uid, gid)) = subordinate_user() {
            all.push(Home::new(&format!("{name}-{tier}-sub")).with_isolation(tier).run_as_user(uid, gid));
        }
    }
    all
}

fn who(home: &Home) -> String {
    let user = match (home.run_as, home.run_gid) {
        (Some(u), Some(_)) => format!("as uid {u} with subordinate ids"),
        (Some(u), None) => format!("as uid {u}"),
        _ => "as the test's user".into(),
    };
    format!("{} {user}", home.isolation)
}

/// Runs `command` (with `extra` arguments): (exit code, stdout, stderr).
fn run(m: &mut Mcp, sandbox: &str, command: &str, extra: Value) -> (i64, String, String) {
    let mut args = json!({"sandbox_id": sandbox, "command": command});
    if let (Some(args), Some(extra)) = (args.as_object_mut(), extra.as_object()) {
        args.extend(extra.clone());
    }
    let out = m.ok("run_command", args);
    (out["exit_code"].as_i64().unwrap(), out["stdout"].as_str().unwrap().to_string(), out["stderr"].as_str().unwrap().to_string())
}

/// The processes of sandbox `id` (by its tag), as (pid inside the sandbox, command line,
/// environment).
fn processes(id: &str) -> Vec<(u32, String, String)> {
    processes_with_parents(id).into_iter().map(|(_, _, inside, cmdline, environ)| (inside, cmdline, environ)).collect()
}

/// [`processes`], each with its host pid and its parent's host pid first.
fn processes_with_parents(id: &str) -> Vec<(u32, u32, u32, String, String)> {
    let tag = format!("SANDBOX_MCP_SANDBOX={id}");
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let dir = entry.path();
        let (Ok(environ), Ok(cmdline), Ok(status)) =
            (std::fs::read(dir.join("environ")), std::fs::read(dir.join("cmdline")), std::fs::read_to_string(dir.join("status")))
        else {
            continue;
        };
        if !environ.split(|b| *b == 0).any(|v| v == tag.as_bytes()) {
            continue;
        }
        let field = |name: &str| status.lines().find_map(|l| l.strip_prefix(name)).map(str::split_whitespace);
        let inside = field("NSpid:").and_then(|mut pids| pids.next_back()?.parse().ok());
        let host = field("Pid:").and_then(|mut pids| pids.next()?.parse().ok());
        let parent = field("PPid:").and_then(|mut pids| pids.next()?.parse().ok());
        let text = |b: Vec<u8>| String::from_utf8_lossy(&b).replace('\0', " ");
        if let (Some(inside), Some(host), Some(parent)) = (inside, host, parent) {
            found.push((host, parent, inside, text(cmdline), text(environ)));
        }
    }
    found
}

/// The pid inside the sandbox of the shell waiting for its next command, once there is one
/// ([`is_waiting_shell`]).
fn waiting_shell(id: &str, who: &str) -> u32 {
    wait_for(Duration::from_secs(10), &format!("{who}: a shell waiting for the next command"), || {
        let waiting: Vec<u32> = processes_with_parents(id).into_iter().filter(|(host, ..)| is_waiting_shell(*host)).map(|p| p.2).collect();
        (waiting.len() == 1).then(|| waiting[0])
    })
}

#[test]
fn the_first_command_runs_in_a_shell_made_ready_at_create() {
    for home in homes("warm-first") {
        let who = who(&home);
        let mut m = home.stdio();
        let id = m.create();
        // Waiting before any command was asked for (before, only once a command had ended).
        let waiting = waiting_shell(&id, &who);
        let listing = "echo $$; env | grep -v -e '^SANDBOX_MCP_TASK=' -e '^_=' | sort";
        let (code, first, err) = run(&mut m, &id, listing, json!({}));
        assert_eq!(code, 0, "{who}: {err}");
        let (pid, env) = first.split_once('\n').unwrap_or_default();
        assert_eq!(pid, waiting.to_string(), "{who}: the first command did not run in the waiting shell");
        // With the environment a command started for its call gets.
        let (_, cold, _) = run(&mut m, &id, listing, json!({"cwd": "."}));
        assert_eq!(cold.split_once('\n').unwrap_or_default().1, env, "{who}");
    }
}

#[test]
fn the_next_command_runs_in_a_waiting_shell_as_bash_c_would_run_it() {
    for home in homes("warm") {
        let who = who(&home);
        let mut m = home.stdio();
        let id = m.create();
        assert_eq!(run(&mut m, &id, "true", json!({})).0, 0, "{who}");
        // The command runs in the shell that was waiting before it was asked for.
        let waiting = waiting_shell(&id, &who);
        let (code, out, err) = run(&mut m, &id, "echo $$", json!({}));
        assert_eq!((code, out.trim()), (0, waiting.to_string().as_str()), "{who}: {err}");
        // What bash sets for a script, stdin, the descriptors, the exit status: as a command
        // started for its call (a working directory of its own starts it so).
        let script = r#"echo "$0|$#|$_|$-|$SECONDS|$LINENO"; echo "${#BASH_EXECUTION_STRING} [${BASH_EXECUTION_STRING: -6}]"; cat; echo "stdin $?"
ls /proc/self/fd | sort -n | tr '\n' ' '; echo; env | grep -v -e '^SANDBOX_MCP_TASK=' -e '^_=' | sort; not-a-command; exit 3"#;
        let cold = run(&mut m, &id, script, json!({"cwd": "."}));
        waiting_shell(&id, &who);
        let warm = run(&mut m, &id, script, json!({}));
        assert_eq!(warm, cold, "{who}");
        assert_eq!(warm.0, 3, "{who}");
        // A value of one call's envs is never kept for the next command; such a call starts its
        // own shell and leaves the waiting one, and its task tag, to the next plain command
        // (before, it took the tag, and the next command started cold).
        let waiting = waiting_shell(&id, &who);
        let secret = "only-for-one-call-7f3a91";
        let (code, out, _) = run(&mut m, &id, "echo \"$ONE_CALL\"", json!({"envs": {"ONE_CALL": secret}}));
        assert_eq!((code, out.trim()), (0, secret), "{who}");
        assert_eq!(run(&mut m, &id, "echo $$", json!({})).1.trim(), waiting.to_string(), "{who}: the waiting shell was passed over");
        waiting_shell(&id, &who);
        for (pid, cmdline, environ) in processes(&id) {
            assert!(!environ.contains(secret), "{who}: process {pid} ({cmdline}) keeps a value of an earlier call");
        }
        // Sandbox code that kills the waiting shell costs the next command a cold start, no more.
        let killer = r#"import os, signal, sys, time
me = {os.getpid(), os.getppid()}
tag = ("SANDBOX_MCP_SANDBOX=" + os.environ["SANDBOX_MCP_SANDBOX"]).encode()
end = time.time() + 20
while time.time() < end:
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) in me:
            continue
        try:
            line = open(f"/proc/{p}/cmdline", "rb").read()
            ours = tag in open(f"/proc/{p}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if ours and b"read -r -N 4096 BASH_EXECUTION_STRING" in line and os.getppid() != int(p):
            os.kill(int(p), signal.SIGKILL)
            open("killed", "w").write(p)
            sys.exit(0)
    time.sleep(0.02)"#;
        let (code, _, err) = run(&mut m, &id, &format!("python3 -c '{killer}' >/dev/null 2>&1 &"), json!({}));
        assert_eq!(code, 0, "{who}: {err}");
        let killed = home.sandbox_dir(&id).join("home/killed");
        wait_for(Duration::from_secs(20), &format!("{who}: sandbox code to kill its waiting shell"), || killed.exists().then_some(()));
        wait_for(Duration::from_secs(10), &format!("{who}: the killed shell to be gone"), || {
            processes(&id).iter().all(|(_, cmdline, _)| !cmdline.contains("read -r -N 4096")).then_some(())
        });
        assert_eq!(run(&mut m, &id, "echo after", json!({})), (0, "after\n".into(), String::new()), "{who}");
        let again = waiting_shell(&id, &who);
        assert_eq!(run(&mut m, &id, "echo $$", json!({})).1.trim(), again.to_string(), "{who}");
        // A NUL in a command is refused, as `bash -c` refuses it (a waiting shell's `read` would
        // have dropped it and run another command).
        for _ in 0..2 {
            let r = m.call("run_command", json!({"sandbox_id": id, "command": "echo a\u{0}b"}));
            assert!(r["isError"] == json!(true) || r["structuredContent"]["stdout"] != json!("ab\n"), "{who}: {r}");
        }
        m.ok("kill_sandbox", json!({"sandbox_id": id}));
        // The waiting shell ends with its sandbox, as every process of it does.
        wait_for(Duration::from_secs(10), &format!("{who}: the killed sandbox's processes to be gone"), || {
            processes(&id).is_empty().then_some(())
        });
        // A sandbox whose environment acts on bash as it starts (here `set -e`, under which the
        // waiting shell's own `read` would have ended it) runs its commands as `bash -c` does.
        let id =
            m.ok("create_sandbox", json!({"timeout": 120, "envs": {"SHELLOPTS": "errexit"}}))["sandbox_id"].as_str().unwrap().to_string();
        for _ in 0..3 {
            assert_eq!(run(&mut m, &id, "echo hi", json!({})), (0, "hi\n".into(), String::new()), "{who}");
        }
        m.ok("kill_sandbox", json!({"sandbox_id": id}));
        m.close();
    }
}

/// Two commands at once: a command that ends after a newer one leaves the newer one's waiting
/// shell alone, whose tag the server gives the next command (before, it put a shell with its own,
/// already taken tag in its place, and the next command started cold).
#[test]
fn a_command_that_ends_after_a_newer_one_leaves_the_newer_shell_waiting() {
    for home in homes("warm-order") {
        let who = who(&home);
        let mut m = home.stdio();
        let id = m.create();
        run(&mut m, &id, "true", json!({}));
        waiting_shell(&id, &who);
        // The older command runs in the waiting shell and names the next shell's tag...
        let slow = json!({"jsonrpc": "2.0", "id": "slow", "method": "tools/call",
            "params": {"name": "run_command", "arguments": {"sandbox_id": id, "command": "sleep 0.5"}}});
        m.client.send_line(&slow.to_string()).unwrap();
        wait_for(Duration::from_secs(10), &format!("{who}: the older command to take the waiting shell"), || {
            processes(&id).iter().any(|(_, cmdline, _)| cmdline.starts_with("sleep 0.5")).then_some(())
        });
        // ...which a newer one takes (no shell has it yet: it starts cold) and ends first.
        assert_eq!(run(&mut m, &id, "true", json!({})).0, 0, "{who}");
        let newest = waiting_shell(&id, &who);
        let done = m.client.recv_response(&json!("slow"), Duration::from_secs(30)).unwrap();
        assert_eq!(done["result"]["structuredContent"]["exit_code"], json!(0), "{who}: {done}");
        assert_eq!(run(&mut m, &id, "echo $$", json!({})).1.trim(), newest.to_string(), "{who}: the newest shell was replaced");
        m.ok("kill_sandbox", json!({"sandbox_id": id}));
        m.close();
    }
}
