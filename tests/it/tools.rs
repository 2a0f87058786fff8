//! The sandbox, command and file tools on the local provider (docs/contract.md, "Sessions and sandbox lifetime", "Providers", "Tools").

use crate::support::*;
use serde_json::json;
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

#[test]
fn run_command_reports_exit_codes_as_data_and_clears_the_environment() {
    let home = Home::new("runcmd");
    let mut m = home.stdio_with(&[("SERVER_ONLY_SECRET", "must-not-leak")]);
    let created = m.ok("create_sandbox", json!({"envs": {"GREETING": "hello"}, "metadata": {"owner": "test"}}));
    assert_eq!(created["provider"], "local");
    assert_eq!(created["template"], "base");
    // What the sandbox has: its shell, the tools found with their versions, where to write.
    // Commands run with bash (this host has it), as on E2B: `[[ ]]` and `{a,b}` mean the same
    // on both providers, for run_command and for start_task.
    assert_eq!(created["shell"], "/bin/bash");
    assert!(created["found"]["bash"].as_str().is_some_and(|v| v.contains("bash")), "{created}");
    assert!(created["about"].as_str().is_some_and(|a| a.contains("home")), "{created}");
    let sb = created["sandbox_id"].as_str().unwrap().to_string();
    let bashism = "[[ a == a ]] && echo {x,y}";
    assert_eq!(m.ok("run_command", json!({"command": bashism}))["stdout"], "x y\n");
    let task = m.ok("start_task", json!({"sandbox_id": sb, "command": bashism}))["task_id"].as_str().unwrap().to_string();
    let done = m.ok("get_task", json!({"sandbox_id": sb, "task_id": task, "wait": 10, "until": "exit"}));
    assert_eq!((done["state"].as_str(), done["stdout"].as_str()), (Some("succeeded"), Some("x y\n")), "{done}");
    let meta = std::fs::metadata(home.sandbox_dir(&sb).join("meta.json")).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let out = m.ok("run_command", json!({"command": "echo $GREETING $CALL_VAR; echo oops >&2; exit 7", "envs": {"CALL_VAR": "there"}}));
    assert_eq!(out["exit_code"], 7);
    assert_eq!(out["stdout"], "hello there\n");
    assert_eq!(out["stderr"], "oops\n");
    assert_eq!(out["timed_out"], false);
    let env = m.ok("run_command", json!({"command": "env"}))["stdout"].as_str().unwrap().to_string();
    assert!(!env.contains("must-not-leak"), "server environment leaked: {env}");
    let names: Vec<&str> = env.lines().filter_map(|l| l.split_once('=').map(|(k, _)| k)).collect();
    for name in &names {
        assert!(
            // (SANDBOX_MCP_TASK: the task a run_command longer than --task-after may become.)
            ["PATH", "LANG", "TERM", "TZ", "HOME", "GREETING", "SANDBOX_MCP_SANDBOX", "SANDBOX_MCP_TASK", "PWD", "SHLVL", "_", "OLDPWD"]
                .contains(name)
                // An isolated sandbox's way out: its egress proxy.
                || sandbox_mcp::egress::proxy_env().iter().any(|(k, _)| k == name),
            "unexpected variable {name}"
        );
    }
    let pwd = m.ok("run_command", json!({"command": "pwd; echo $HOME"}))["stdout"].as_str().unwrap().to_string();
    let home_dir = home.inside_home(&sb);
    assert_eq!(pwd, format!("{home_dir}\n{home_dir}\n"));
    let err = m.err("run_command", json!({"command": "true", "cwd": "no/such/dir"}));
    assert!(err.contains("cwd"), "{err}");
}

#[test]
fn run_command_timeout_kills_the_whole_group() {
    let home = Home::new("timeout");
    let mut m = home.stdio();
    m.create();
    let nap = unique_sleep();
    let t0 = Instant::now();
    let out = m.ok("run_command", json!({"command": format!("sleep {nap} & sleep 60"), "timeout": 1}));
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert_eq!(out["timed_out"], true);
    assert_eq!(out["exit_code"], 124);
    wait_for(Duration::from_secs(3), "the background child to die with its group", || {
        pids_of_argv(&["sleep", &nap]).is_empty().then_some(())
    });
}

#[test]
fn run_command_output_is_capped_at_1_mib_per_stream() {
    let home = Home::new("cap");
    let mut m = home.stdio();
    m.create();
    let command = "head -c 3000000 /dev/zero | tr '\\0' a; head -c 10 /dev/zero | tr '\\0' b >&2";
    let out = m.ok("run_command", json!({"command": command, "max_output": 1048576}));
    assert_eq!(out["stdout"].as_str().unwrap().len(), 1024 * 1024);
    assert_eq!((out["stdout_truncated"].as_bool(), out["stdout_bytes"].as_i64()), (Some(true), Some(1 << 20)));
    assert_eq!(out["stderr"], "bbbbbbbbbb");
    assert_eq!(out["stderr_truncated"], false);
    assert_eq!(out["exit_code"], 0);
    assert!(out.get("task_id").is_none(), "nothing was cut inline: {}", out["stderr"]);
}

#[test]
fn run_command_returns_head_and_tail_inline_and_the_rest_by_offset() {
    let home = Home::new("inline");
    let mut m = home.stdio();
    let sb = m.create();
    // 3000 numbered lines (about 40 kB) and multi-byte characters on stderr.
    let out = m.ok(
        "run_command",
        json!({"command": "seq 1 3000 | sed 's/^/line /'; i=0; while [ $i -lt 9000 ]; do printf 'é'; i=$((i+1)); done >&2; exit 3"}),
    );
    assert_eq!(out["exit_code"], 3);
    let stdout = out["stdout"].as_str().unwrap();
    assert!(stdout.len() <= 16384, "{}", stdout.len());
    assert!(stdout.starts_with("line 1\nline 2\n") && stdout.ends_with("line 3000\n"), "{stdout}");
    assert!(stdout.contains("bytes cut here; get_task with stdout_offset="), "{stdout}");
    let stderr = out["stderr"].as_str().unwrap();
    assert!(stderr.len() <= 16384 && stderr.starts_with("éé") && stderr.ends_with("éé"), "{}", stderr.len());
    let whole: String = (1..=3000).map(|i| format!("line {i}\n")).collect();
    assert_eq!(
        (out["stdout_truncated"].as_bool(), out["stderr_truncated"].as_bool(), out["stdout_bytes"].as_u64(), out["stderr_bytes"].as_u64()),
        (Some(true), Some(true), Some(whole.len() as u64), Some(18000))
    );
    assert_eq!(out["sandbox_id"], sb.as_str());
    let task = out["task_id"].as_str().expect("a task holds the whole output").to_string();
    // The complete output, by offset, from the finished task.
    let mut read = String::new();
    let mut offset = 0;
    loop {
        let page = m.ok("get_task", json!({"sandbox_id": sb, "task_id": task, "stdout_offset": offset, "limit": 65536}));
        assert_eq!((page["state"].as_str(), page["exit_code"].as_i64()), (Some("failed"), Some(3)), "{page}");
        read.push_str(page["stdout"].as_str().unwrap());
        if page["stdout_next_offset"] == offset {
            break;
        }
        offset = page["stdout_next_offset"].as_u64().unwrap();
    }
    assert_eq!(read, whole);
    let listed = m.ok("list_tasks", json!({}));
    assert_eq!(listed["count"], 1, "{listed}");
    assert_eq!(m.ok("delete_task", json!({"sandbox_id": sb, "task_id": task}))["deleted"], true);
    // Small output: nothing cut, no task.
    let out = m.ok("run_command", json!({"command": "echo hi", "max_output": 1024}));
    assert_eq!((out["stdout"].as_str(), out["stdout_bytes"].as_i64(), out.get("task_id")), (Some("hi\n"), Some(3), None));
    // Kept outputs count against the sandbox's 128 task directories: at the limit, cut output is
    // not kept, and the answer says why and what to do.
    m.ok("run_command", json!({"command": "cd .sandbox-mcp/tasks && for i in $(seq 128); do mkdir $(printf '%032x' $i); done"}));
    let out = m.ok("run_command", json!({"command": "seq 1 3000", "max_output": 1024}));
    assert_eq!((out["stdout_truncated"].as_bool(), out.get("task_id")), (Some(true), None), "{out}");
    assert!(out["warning"].as_str().is_some_and(|w| w.contains("delete_task")), "{out}");
}

#[test]
fn secret_named_variables_are_masked_in_command_output() {
    let home = Home::new("maskcmd");
    let mut m = home.stdio();
    m.ok(
        "create_sandbox",
        json!({"envs": {"API_KEY": "abcdef123456", "db_password": "hunter2hunter2", "SHORT_TOKEN": "abc", "PLAIN": "visible-value"}}),
    );
    let out = m.ok(
        "run_command",
        json!({"command": "echo $API_KEY $db_password $SHORT_TOKEN $PLAIN $CALL_SECRET", "envs": {"CALL_SECRET": "call-secret-value"}}),
    );
    assert_eq!(out["stdout"], "*** *** abc visible-value ***\n");
}

#[test]
fn files_round_trip_and_stay_inside_the_sandbox() {
    let home = Home::new("files");
    let mut m = home.stdio();
    let sb = m.create();
    assert_eq!(m.ok("write_file", json!({"path": "dir/sub/a.txt", "content": "héllo\n"}))["bytes_written"], 7);
    let r = m.ok("read_file", json!({"path": "dir/sub/a.txt"}));
    assert_eq!((r["content"].as_str(), r["size"].as_i64()), (Some("héllo\n"), Some(7)));
    assert_eq!(m.ok("write_file", json!({"path": "bin.dat", "content": "AP8A/w==", "encoding": "base64"}))["bytes_written"], 4);
    let r = m.ok("read_file", json!({"path": "bin.dat"}));
    assert_eq!(r["content_base64"], "AP8A/w==");
    assert!(r.get("content").is_none());
    let abs = format!("{}/dir/sub/a.txt", home.inside_home(&sb));
    assert_eq!(m.ok("read_file", json!({"path": abs}))["size"], 7);
    let list = m.ok("list_files", json!({"path": "."}));
    let names: Vec<(&str, &str)> =
        list["entries"].as_array().unwrap().iter().map(|e| (e["name"].as_str().unwrap(), e["type"].as_str().unwrap())).collect();
    assert_eq!(names, vec![("bin.dat", "file"), ("dir", "dir")]);
    m.ok("run_command", json!({"command": "ln -s /etc escape"}));
    if home.isolated() {
        // Paths are the sandbox's own: `..` stops at its root, /etc is its read-only /etc.
        assert!(m.err("read_file", json!({"path": "../../../../x"})).contains("does not exist"));
        assert_eq!(m.ok("read_file", json!({"path": "escape/hostname"}))["content"], "sandbox\n");
        assert!(m.err("write_file", json!({"path": "escape/x", "content": "no"})).contains("read-only"));
        assert!(m.err("write_file", json!({"path": "/usr/x", "content": "no"})).contains("read-only"));
        assert!(m.err("read_file", json!({"path": ""})).contains("non-empty"));
    } else {
        for bad in ["../x", "/etc/passwd", "dir/../../x", ""] {
            let err = m.err("read_file", json!({"path": bad}));
            assert!(err.contains("outside the sandbox") || err.contains("non-empty"), "{bad}: {err}");
        }
        assert!(m.err("read_file", json!({"path": "escape/hostname"})).contains("outside the sandbox"));
        assert!(m.err("write_file", json!({"path": "escape/x", "content": "no"})).contains("outside the sandbox"));
        assert!(m.err("list_files", json!({"path": "escape"})).contains("outside the sandbox"));
    }
    assert!(m.err("read_file", json!({"path": "missing.txt"})).contains("does not exist"));
    assert!(m.err("write_file", json!({"path": "x", "content": "!!", "encoding": "base64"})).contains("base64"));
}

#[test]
fn bad_arguments_are_tool_errors_with_useful_messages() {
    let home = Home::new("badargs");
    let mut m = home.stdio();
    assert!(m.err("run_command", json!({"command": "true"})).contains("call create_sandbox first"));
    m.create();
    let cases = [
        ("run_command", json!({"command": "true", "bogus": 1}), "unknown argument \"bogus\""),
        ("run_command", json!({"command": 5}), "must be a string"),
        ("run_command", json!({}), "missing required argument \"command\""),
        ("run_command", json!({"command": "true", "timeout": 0}), "from 1 to 3600"),
        ("run_command", json!({"command": "true", "timeout": "10"}), "must be an integer"),
        ("run_command", json!({"command": "true", "envs": {"A": 1}}), "must map names to strings"),
        ("run_command", json!({"command": "x".repeat(65_537)}), "limit is 65536"),
        ("create_sandbox", json!({"timeout": 86_401}), "from 1 to 86400"),
        ("create_sandbox", json!({"template": "ubuntu"}), "knows: base"),
        ("run_command", json!({"command": "true", "sandbox_id": "../x"}), "invalid sandbox_id"),
        ("run_command", json!({"command": "true", "sandbox_id": "i3xkq8n2m1p0zj7w5v4ty"}), "another provider"),
        ("run_command", json!({"command": "true", "sandbox_id": "local-0123456789abcdef01234567"}), "does not exist"),
        ("kill_sandbox", json!({}), "missing required argument \"sandbox_id\""),
        ("write_file", json!({"path": "a", "content": "b", "encoding": "hex"}), "one of utf8, base64"),
        ("get_task", json!({"sandbox_id": "local-0123456789abcdef01234567", "task_id": "nope"}), "32 lowercase hex"),
    ];
    for (tool, args, want) in cases {
        let err = m.err(tool, args.clone());
        assert!(err.contains(want), "{tool} {args}: {err}");
    }
}

#[test]
fn kill_sandbox_ends_tagged_processes_even_after_setsid() {
    let home = Home::new("kill");
    let mut m = home.stdio();
    let sb = m.create();
    let nap = unique_sleep();
    m.ok("run_command", json!({"command": format!("setsid sh -c 'sleep {nap}' >/dev/null 2>&1 &")}));
    let pid = pid_of_argv(&["sleep", &nap]);
    assert_eq!(m.ok("kill_sandbox", json!({"sandbox_id": sb})), json!({"sandbox_id": sb, "killed": true}));
    assert!(!pid_alive(pid), "the setsid process must be gone");
    assert!(!home.sandbox_dir(&sb).exists());
    assert_eq!(m.ok("kill_sandbox", json!({"sandbox_id": sb}))["killed"], false);
    assert!(m.err("run_command", json!({"command": "true"})).contains("create_sandbox"), "the default sandbox is forgotten");
}

#[test]
fn the_keeper_ends_an_expired_sandbox_with_no_server_running() {
    let home = Home::new("keeper");
    // Long enough for the next call to start a process in it even on a loaded machine.
    let (code, created, stderr) = home.call_cli("create_sandbox", json!({"timeout": 5}));
    assert_eq!(code, 0, "{stderr}");
    let sb = created["sandbox_id"].as_str().unwrap().to_string();
    let nap = unique_sleep();
    let (code, _, stderr) =
        home.call_cli("run_command", json!({"sandbox_id": sb, "command": format!("setsid sleep {nap} >/dev/null 2>&1 &")}));
    assert_eq!(code, 0, "{stderr}");
    let pid = pid_of_argv(&["sleep", &nap]);
    wait_for(Duration::from_secs(20), "the keeper to end the sandbox", || (!home.sandbox_dir(&sb).exists()).then_some(()));
    // The directory goes first and the processes a moment later (the kernel ends a pid
    // namespace's processes after its init): this failed now and then under load.
    wait_for(Duration::from_secs(5), "the sandbox's sleep to end", || (!pid_alive(pid)).then_some(()));
}

#[test]
fn ordinary_tools_renew_the_ttl_and_the_start_sweep_ends_expired_sandboxes() {
    let home = Home::new("ttl");
    let mut m = home.stdio();
    let created = m.ok("create_sandbox", json!({"timeout": 100}));
    let sb = created["sandbox_id"].as_str().unwrap().to_string();
    let p = home.provider();
    // Pretend time passed: expiry in 50 s.
    let mut meta = p.load(&sb).unwrap();
    meta.expires_at = sandbox_mcp::provider::unix_now() + 50;
    std::fs::write(home.sandbox_dir(&sb).join("meta.json"), serde_json::to_vec(&meta).unwrap()).unwrap();
    m.ok("list_tasks", json!({}));
    assert_eq!(p.load(&sb).unwrap().expires_at, meta.expires_at, "task tools never renew");
    m.ok("run_command", json!({"command": "true"}));
    assert!(p.load(&sb).unwrap().expires_at >= sandbox_mcp::provider::unix_now() + 90, "ordinary tools renew");
    // An expired sandbox whose keeper is gone is removed by the next server's sweep.
    let (code, created, _) = home.call_cli("create_sandbox", json!({}));
    assert_eq!(code, 0);
    let old = created["sandbox_id"].as_str().unwrap().to_string();
    let mut meta = p.load(&old).unwrap();
    meta.expires_at -= 1000;
    std::fs::remove_file(home.sandbox_dir(&old).join("keeper.pid")).ok();
    std::fs::write(home.sandbox_dir(&old).join("meta.json"), serde_json::to_vec(&meta).unwrap()).unwrap();
    let _second = home.stdio();
    wait_for(Duration::from_secs(10), "the sweep to end the expired sandbox", || (!home.sandbox_dir(&old).exists()).then_some(()));
}

#[test]
fn call_prints_structured_results_and_keeps_sandboxes() {
    let home = Home::new("cli");
    let (code, created, _) = home.call_cli("create_sandbox", json!({}));
    assert_eq!(code, 0);
    let sb = created["sandbox_id"].as_str().unwrap();
    let (code, out, _) = home.call_cli("run_command", json!({"sandbox_id": sb, "command": "echo cli"}));
    assert_eq!((code, out["stdout"].as_str()), (0, Some("cli\n")));
    let (code, _, stderr) = home.call_cli("run_command", json!({"command": "true"}));
    assert_eq!(code, 1);
    assert!(stderr.contains("create_sandbox"), "{stderr}");
    // The command's own exit code; arguments from stdin with `-`.
    assert_eq!(home.call_cli("run_command", json!({"sandbox_id": sb, "command": "exit 3"})).0, 3);
    let mut child = std::process::Command::new(bin())
        .args(["call", "run_command", "-"])
        .envs(home.env())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let input = json!({"sandbox_id": sb, "command": "echo from-stdin; exit 5"}).to_string();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(5));
    assert!(String::from_utf8_lossy(&out.stdout).contains("from-stdin"));
    // Help: global (-h), one tool's arguments, the list of tools.
    let text = |args: &[&str]| {
        let out = std::process::Command::new(bin()).args(args).envs(home.env()).output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stdout).to_string())
    };
    let (code, help) = text(&["-h"]);
    assert!(code == Some(0) && help.contains("USAGE") && help.contains("call TOOL --help"), "{help}");
    let (code, help) = text(&["call", "run_command", "--help"]);
    assert!(code == Some(0) && help.contains("max_output") && help.contains("command*") && !help.contains("USAGE"), "{help}");
    let (code, list) = text(&["tools"]);
    assert!(code == Some(0) && list.lines().filter(|l| l.starts_with("  ")).count() == sandbox_mcp::tools::all().len(), "{list}");
}

/// Regression: a sweep (run by every server at start) took a sandbox directory that `create`
/// had made but not yet given its metadata for the remains of a kill, and removed it.
#[test]
fn creates_racing_with_the_start_sweep_of_other_servers_survive() {
    let home = Home::new("createrace");
    let env = home.env();
    let children: Vec<_> = (0..24)
        .map(|_| {
            std::process::Command::new(bin())
                .args(["call", "create_sandbox", "{}"])
                .envs(env.iter().cloned())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let sb = v["sandbox_id"].as_str().unwrap();
        assert!(home.sandbox_dir(sb).join("meta.json").exists(), "sandbox {sb} vanished");
    }
}

/// Regression (review): read_file/write_file on a FIFO blocked a worker forever, and write_file
/// followed a dangling symlink out of the sandbox.
#[test]
fn file_tools_refuse_fifos_and_write_through_symlinks() {
    let home = Home::new("fifo");
    let mut m = home.stdio();
    m.create();
    m.ok("run_command", json!({"command": "mkfifo p; ln -s /tmp/smcp-must-not-exist-$$ link; echo $$ > pid"}));
    let t0 = Instant::now();
    assert!(m.err("read_file", json!({"path": "p"})).contains("not a regular file"));
    assert!(m.err("write_file", json!({"path": "p", "content": "x"})).contains("not a regular file"));
    assert!(m.err("write_file", json!({"path": "link", "content": "x"})).contains("symbolic link"));
    assert!(t0.elapsed() < Duration::from_secs(5));
}

/// Regression (review): with the queue full, the stdio reader blocked, so a cancellation (which
/// frees a worker) and pings were not even read.
#[test]
fn a_full_queue_still_reads_pings_and_cancellations() {
    let home = Home::new("fullq");
    let mut m = home.stdio_with(&[("SANDBOX_MCP_WORKERS", "1"), ("SANDBOX_MCP_QUEUE", "1")]);
    let sb = m.create();
    // The client's places outside the worker pool taken first (2 with one worker), so that a
    // holds the worker, b fills the queue and c waits behind it.
    let places = sandbox_mcp::queue::Sharing::for_workers(1, 1).runners_per_client;
    for i in 0..places {
        let (inside, mark) = home.marker(&sb, &format!("filler-{i}"));
        let call = json!({"jsonrpc": "2.0", "id": format!("filler-{i}"), "method": "tools/call", "params": {"name": "run_command", "arguments": {"sandbox_id": sb, "command": format!("touch {inside}; sleep 8")}}});
        m.client.send_line(&call.to_string()).unwrap();
        wait_for(TIMEOUT, "a filler to start", || mark.exists().then_some(()));
    }
    for id in ["a", "b", "c"] {
        let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "run_command", "arguments": {"sandbox_id": sb, "command": "sleep 8"}}});
        m.client.send_line(&call.to_string()).unwrap();
    }
    m.client.send_line(r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"a"}}"#).unwrap();
    m.client.send_line(r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"c"}}"#).unwrap();
    let t0 = Instant::now();
    m.client.send_line(r#"{"jsonrpc":"2.0","id":"p","method":"ping"}"#).unwrap();
    let r: serde_json::Value = serde_json::from_str(&m.client.recv_line(TIMEOUT).unwrap()).unwrap();
    assert_eq!(r["id"], "p");
    assert!(t0.elapsed() < Duration::from_secs(2), "ping waited {:?}", t0.elapsed());
    // a and c were cancelled (a stopped, c never started): only b and the fillers answer, after
    // about 8 s.
    let mut ids = Vec::new();
    for _ in 0..places + 1 {
        let r: serde_json::Value = serde_json::from_str(&m.client.recv_line(Duration::from_secs(30)).unwrap()).unwrap();
        ids.push(r["id"].as_str().unwrap_or_default().to_string());
    }
    ids.sort();
    let mut expected: Vec<String> = (0..places).map(|i| format!("filler-{i}")).chain(["b".to_string()]).collect();
    expected.sort();
    assert_eq!(ids, expected);
    assert!(m.client.recv_line(Duration::from_millis(500)).is_err());
}

#[test]
fn results_say_when_the_sandbox_expires_and_set_timeout_changes_it() {
    let home = Home::new("expiry");
    let mut m = home.stdio();
    let created = m.ok("create_sandbox", json!({"timeout": 120}));
    let sb = created["sandbox_id"].as_str().unwrap().to_string();
    let at = created["expires_at"].as_i64().unwrap();
    let out = m.ok("run_command", json!({"command": "true"}));
    assert!(out["expires_at"].as_i64().unwrap() >= at, "{out}");
    // A task whose timeout outlives the sandbox is warned about, naming set_timeout.
    let task = m.ok("start_task", json!({"command": "sleep 30", "timeout": 600}));
    assert!(task["warning"].as_str().is_some_and(|w| w.contains("set_timeout")), "{task}");
    assert!(task["expires_at"].as_i64().is_some(), "{task}");
    let set = m.ok("set_timeout", json!({"sandbox_id": sb, "timeout": 900}));
    assert_eq!(set["timeout"], 900);
    let later = set["expires_at"].as_i64().unwrap();
    assert!(later >= at + 700, "{set}");
    let got = m.ok("get_task", json!({"sandbox_id": sb, "task_id": task["task_id"]}));
    assert_eq!(got["expires_at"], later, "{got}");
    // Within the sandbox's time: no warning.
    let quiet = m.ok("start_task", json!({"command": "true", "timeout": 60}));
    assert!(quiet.get("warning").is_none(), "{quiet}");
    // Shortened.
    let set = m.ok("set_timeout", json!({"sandbox_id": sb, "timeout": 60}));
    assert!(set["expires_at"].as_i64().unwrap() < later);
    assert!(m.err("set_timeout", json!({"sandbox_id": sb, "timeout": 0})).contains("timeout"));
}

#[test]
fn list_sandboxes_shows_what_the_caller_can_use() {
    let home = Home::new("listsb");
    let mut m = home.stdio();
    let sb = m.ok("create_sandbox", json!({"metadata": {"owner": "agent-7"}}))["sandbox_id"].as_str().unwrap().to_string();
    m.ok("start_task", json!({"command": "sleep 30"}));
    // Over stdio: every sandbox of the state root, another server's included.
    let other = home.create_detached(json!({}));
    let listed = m.ok("list_sandboxes", json!({}));
    assert_eq!(listed["count"], 2, "{listed}");
    let mine = listed["sandboxes"].as_array().unwrap().iter().find(|s| s["sandbox_id"] == sb.as_str()).unwrap().clone();
    assert_eq!(mine["metadata"], json!({"owner": "agent-7"}));
    assert_eq!(mine["tasks"], json!({"running": 1, "total": 1}));
    assert!(mine["expires_at"].as_i64().is_some() && mine["created_at"].as_i64().is_some(), "{mine}");
    // Over HTTP: only the session's own.
    let h = Http::start(&home, &[], &[]);
    let sid = h.initialize();
    let created = h.call(&sid, "create_sandbox", json!({}));
    let listed = h.call(&sid, "list_sandboxes", json!({}));
    let ids: Vec<&str> =
        listed["result"]["structuredContent"]["sandboxes"].as_array().unwrap().iter().map(|s| s["sandbox_id"].as_str().unwrap()).collect();
    assert_eq!(ids, [created["result"]["structuredContent"]["sandbox_id"].as_str().unwrap()], "{listed}");
    assert!(!ids.contains(&other.as_str()));
    h.stop();
}

/// A FIFO where a task's `cmd` should be holds neither list_tasks nor list_sandboxes: the listing
/// reads regular files only, and list_sandboxes gives each sandbox's task counts a short budget
/// (found by a review: 30 s for list_tasks, and 30 s per such sandbox for list_sandboxes).
#[test]
fn a_fifo_in_a_task_directory_holds_no_listing() {
    let home = Home::new("list-fifo");
    let mut m = home.stdio();
    let mut planted = Vec::new();
    for _ in 0..2 {
        let sb = m.create();
        let task = "0123456789abcdef0123456789abcdef";
        let plant = format!(
            "mkdir -p .sandbox-mcp/tasks/{task} && cd .sandbox-mcp/tasks/{task} && printf 'status=exited\\nexit_code=0\\n.\\n' >state && mkfifo cmd && echo planted"
        );
        assert_eq!(m.ok("run_command", json!({"sandbox_id": sb, "command": plant}))["stdout"], "planted\n");
        planted.push(sb);
    }
    let t0 = Instant::now();
    let listed = m.ok("list_tasks", json!({"sandbox_id": planted[0]}));
    assert!(t0.elapsed() < Duration::from_secs(10), "list_tasks took {:?}: {listed}", t0.elapsed());
    // Where sandbox code can put its own program in place of one the listing runs (root of its
    // mount namespace), a listing that hangs costs that sandbox's own counts, not the call.
    if home.isolated() {
        for sb in &planted {
            let hang = "cd .sandbox-mcp/tasks/0123456789abcdef0123456789abcdef && rm cmd && echo x >cmd && printf '#!/bin/sh\\nexec sleep 60\\n' >/tmp/hang && chmod +x /tmp/hang && mount --bind /tmp/hang \"$(command -v od)\" && echo hung";
            assert_eq!(m.ok("run_command", json!({"sandbox_id": sb, "command": hang}))["stdout"], "hung\n");
        }
    }
    let t0 = Instant::now();
    let all = m.ok("list_sandboxes", json!({}));
    assert!(t0.elapsed() < Duration::from_secs(10), "list_sandboxes took {:?}: {all}", t0.elapsed());
    if home.isolated() {
        let hung = all["sandboxes"].as_array().unwrap().iter().filter(|s| planted.iter().any(|p| s["sandbox_id"] == p.as_str()));
        assert!(hung.clone().count() == 2 && hung.clone().all(|s| s["tasks"].is_null()), "{all}");
    }
    for sb in &planted {
        m.ok("kill_sandbox", json!({"sandbox_id": sb}));
    }
}

#[test]
fn read_file_of_an_image_also_returns_an_image_block() {
    let home = Home::new("image");
    let mut m = home.stdio();
    m.create();
    // A 1x1 PNG.
    let png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";
    m.ok("write_file", json!({"path": "dot.png", "content": png, "encoding": "base64"}));
    let r = m.call("read_file", json!({"path": "dot.png"}));
    assert_eq!(r["structuredContent"]["mime_type"], "image/png", "{r}");
    assert_eq!(r["content"][1], json!({"type": "image", "data": png, "mimeType": "image/png"}));
    // Not an image: no block.
    m.ok("write_file", json!({"path": "bin.dat", "content": "AP8A/w==", "encoding": "base64"}));
    let r = m.call("read_file", json!({"path": "bin.dat"}));
    assert_eq!(r["content"].as_array().unwrap().len(), 1, "{r}");
    assert!(r["structuredContent"].get("mime_type").is_none());
}
