//! A plain run_command (no task parameters, no tasks extension) still running at `--task-after`
//! goes on under the task supervisor and is answered `running` with its task (ARCHITECTURE.md,
//! "Long run_command calls"), isolated and without isolation.

use crate::support::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const AFTER: [(&str, &str); 1] = [("SANDBOX_MCP_TASK_AFTER", "1")];

fn homes(name: &str) -> Vec<Home> {
    vec![Home::new(name), Home::unisolated(&format!("{name}-none"))]
}

/// get_task with `wait` until the task reaches a final state.
fn final_state(m: &mut Mcp, sb: &str, task: &str) -> Value {
    wait_for(Duration::from_secs(20), "the task to end", || {
        let v = m.ok("get_task", json!({"sandbox_id": sb, "task_id": task, "wait": 5}));
        (v["state"] != "running").then_some(v)
    })
}

/// `v` has every field of a completed run_command, each typed in its outputSchema, and every field
/// the schema types has a type it allows (the others, such as expires_at, are the contract's).
fn conforms(m: &mut Mcp, v: &Value) {
    let tools = m.request("tools/list", json!({}));
    let tool = tools["result"]["tools"].as_array().unwrap().iter().find(|t| t["name"] == "run_command").unwrap().clone();
    let schema = &tool["outputSchema"];
    for key in sandbox_mcp::tools::COMPLETED_FIELDS {
        assert!(v.get(key).is_some(), "{key} is missing from {v}");
        assert!(schema["properties"].get(key).is_some(), "{key} is not typed in run_command's outputSchema");
    }
    for (key, value) in v.as_object().unwrap().iter().filter(|(key, _)| schema["properties"].get(key.as_str()).is_some()) {
        let spec = &schema["properties"][key];
        let types: Vec<&str> = match &spec["type"] {
            Value::String(t) => vec![t.as_str()],
            Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
            other => panic!("{key} has no type in the schema: {other}"),
        };
        let actual = match value {
            Value::Null => "null",
            Value::Bool(_) => "boolean",
            Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
            Value::String(_) => "string",
            _ => "other",
        };
        assert!(types.contains(&actual), "{key} is {actual}, the schema says {types:?}");
        if let Some(allowed) = spec["enum"].as_array() {
            assert!(allowed.contains(value), "{key} {value} is not one of {allowed:?}");
        }
    }
}

/// A promoted `sleep 60` stopped by cancel_task: `cancelled` within 3 s.
fn cancels_within_3_s(m: &mut Mcp, sb: &str) {
    let out = m.ok("run_command", json!({"sandbox_id": sb, "command": "sleep 60"}));
    let (_, task) = running(&out);
    let t0 = Instant::now();
    let c = m.ok("cancel_task", json!({"sandbox_id": sb, "task_id": task}));
    let c = if c["state"] == "running" { final_state(m, sb, &task) } else { c };
    assert_eq!(c["state"], "cancelled", "{c}");
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
}

fn running(out: &Value) -> (String, String) {
    assert_eq!(out["state"], "running", "{out}");
    assert_eq!((out["exit_code"].clone(), out["timed_out"].clone()), (Value::Null, json!(false)), "{out}");
    assert!(out["message"].as_str().unwrap().contains("get_task"), "{out}");
    (out["sandbox_id"].as_str().unwrap().to_string(), out["task_id"].as_str().unwrap().to_string())
}

#[test]
fn a_long_run_command_becomes_a_task_and_ends_as_one() {
    for home in homes("promote") {
        let mut m = home.stdio_with(&AFTER);
        let sb = m.create();
        // Quick: as before, plus state.
        let quick = m.ok("run_command", json!({"sandbox_id": sb, "command": "echo hi; exit 3"}));
        assert_eq!(quick["state"], "completed");
        conforms(&mut m, &quick);
        assert_eq!((quick["exit_code"].as_i64(), quick["stdout"].as_str()), (Some(3), Some("hi\n")), "{quick}");
        assert!(quick.get("task_id").is_none(), "{quick}");
        // Long: answered at about --task-after with the output so far.
        let t0 = Instant::now();
        let out = m.ok("run_command", json!({"sandbox_id": sb, "command": "printf A; sleep 3; printf B"}));
        let took = t0.elapsed();
        let (sb2, task) = running(&out);
        conforms(&mut m, &out);
        assert_eq!(sb2, sb);
        assert!(took >= Duration::from_millis(950) && took < Duration::from_millis(1900), "answered after {took:?}");
        assert_eq!(out["stdout"], "A", "{out}");
        let done = final_state(&mut m, &sb, &task);
        assert_eq!((done["state"].as_str(), done["exit_code"].as_i64()), (Some("succeeded"), Some(0)), "{done}");
        assert_eq!(done["stdout"], "AB", "{done}");
        // An exit code other than 0, stderr on both sides, and a trailing newline kept.
        let out = m.ok("run_command", json!({"sandbox_id": sb, "command": "echo x >&2; sleep 1.5; echo y >&2; echo z; exit 7"}));
        let (_, task) = running(&out);
        let done = final_state(&mut m, &sb, &task);
        assert_eq!((done["state"].as_str(), done["exit_code"].as_i64()), (Some("failed"), Some(7)), "{done}");
        assert_eq!((done["stdout"].as_str(), done["stderr"].as_str()), (Some("z\n"), Some("x\ny\n")), "{done}");
        // A command whose own EXIT trap replaces the recording one: the server that reaps it
        // records the code.
        let out = m.ok("run_command", json!({"sandbox_id": sb, "command": "trap 'echo bye' EXIT; sleep 1.5; exit 5"}));
        let (_, task) = running(&out);
        let done = final_state(&mut m, &sb, &task);
        assert_eq!((done["exit_code"].as_i64(), done["stdout"].as_str()), (Some(5), Some("bye\n")), "{done}");
        // The 1 MiB cap counts both sides of the handover.
        let out = m.ok(
            "run_command",
            json!({"sandbox_id": sb, "command": "head -c 1500000 /dev/zero | tr '\\0' a; sleep 1.5; printf more; echo end >&2", "max_output": 1048576}),
        );
        let (_, task) = running(&out);
        assert_eq!((out["stdout"].as_str().map(str::len), out["stdout_truncated"].as_bool()), (Some(1 << 20), Some(true)));
        let done = final_state(&mut m, &sb, &task);
        assert_eq!(
            (done["state"].as_str(), done["stdout_bytes"].as_i64(), done["stdout_truncated"].as_bool(), done["stderr"].as_str()),
            (Some("succeeded"), Some(1 << 20), Some(true), Some("end\n")),
            "{}",
            done["stderr"]
        );
        // Killed by a signal (no trap runs): the server that reaps it records 128 + 9.
        let out = m.ok("run_command", json!({"sandbox_id": sb, "command": "sleep 1.5; kill -s KILL $$"}));
        let (_, task) = running(&out);
        let done = final_state(&mut m, &sb, &task);
        assert_eq!((done["state"].as_str(), done["exit_code"].as_i64()), (Some("failed"), Some(137)), "{done}");
        // A handover that fails (here the tasks directory cannot exist: a file has its name) is
        // no loss: the call waits for the command as before.
        let t0 = Instant::now();
        let out = m.ok(
            "run_command",
            json!({"sandbox_id": sb, "command": "mkdir -p .sandbox-mcp && rm -rf .sandbox-mcp/tasks && : >.sandbox-mcp/tasks; printf A; sleep 2; printf B"}),
        );
        assert_eq!(
            (out["state"].as_str(), out["exit_code"].as_i64(), out["stdout"].as_str()),
            (Some("completed"), Some(0), Some("AB")),
            "{out}"
        );
        assert!(t0.elapsed() >= Duration::from_secs(2), "{:?}", t0.elapsed());
        m.ok("run_command", json!({"sandbox_id": sb, "command": "rm -f .sandbox-mcp/tasks"}));
        m.close();
    }
}

#[test]
fn a_promoted_command_survives_sigkill_of_the_server() {
    for home in homes("promote-kill") {
        let mut a = home.stdio_with(&AFTER);
        let sb = a.create();
        let out = a.ok("run_command", json!({"sandbox_id": sb, "command": "printf A; sleep 3; printf B"}));
        let (_, task) = running(&out);
        a.client.kill().unwrap();
        let mut b = home.stdio_with(&AFTER);
        let done = final_state(&mut b, &sb, &task);
        assert_eq!((done["state"].as_str(), done["exit_code"].as_i64()), (Some("succeeded"), Some(0)), "{done}");
        assert_eq!(done["stdout"], "AB", "{done}");
        // With the recording trap replaced and the server gone, nobody observes the exit status:
        // unknown, never succeeded.
        let out = b.ok("run_command", json!({"sandbox_id": sb, "command": "trap 'echo bye' EXIT; sleep 2; exit 0"}));
        let (_, task) = running(&out);
        b.client.kill().unwrap();
        let mut c = home.stdio_with(&AFTER);
        let done = final_state(&mut c, &sb, &task);
        assert_eq!((done["state"].as_str(), done["exit_code"].clone()), (Some("unknown"), Value::Null), "{done}");
        assert!(done["error"].as_str().unwrap_or("").contains("exit code"), "{done}");
        assert_eq!(done["stdout"], "bye\n", "{done}");
        c.ok("kill_sandbox", json!({"sandbox_id": sb}));
        c.close();
    }
}

#[test]
fn a_promoted_command_is_cancelled_timed_out_and_masked() {
    for home in homes("promote-stop") {
        let mut m = home.stdio_with(&AFTER);
        let sb = m.create();
        cancels_within_3_s(&mut m, &sb);
        // Its remaining timeout is enforced.
        let t0 = Instant::now();
        let out = m.ok("run_command", json!({"sandbox_id": sb, "command": "sleep 60", "timeout": 3}));
        let (_, task) = running(&out);
        let done = final_state(&mut m, &sb, &task);
        assert_eq!(done["state"], "timed_out", "{done}");
        let took = t0.elapsed();
        assert!(took >= Duration::from_secs(3) && took < Duration::from_secs(8), "timed out after {took:?}");
        // A secret of the call's environment is masked before and after the handover.
        let secret = "s3cr3t-value-42";
        let out = m.ok(
            "run_command",
            json!({"sandbox_id": sb, "command": "echo \"$API_TOKEN\"; sleep 1.5; echo \"$API_TOKEN\" >&2; echo \"$API_TOKEN\"", "envs": {"API_TOKEN": secret}}),
        );
        let (_, task) = running(&out);
        assert_eq!(out["stdout"], "***\n", "{out}");
        let done = final_state(&mut m, &sb, &task);
        assert_eq!((done["stdout"].as_str(), done["stderr"].as_str()), (Some("***\n***\n"), Some("***\n")), "{done}");
        assert!(!done.to_string().contains(secret), "{done}");
        m.close();
    }
}

/// A promoted command under one shell: masking of a sandbox secret on both sides of the
/// handover, exit code, a last line without newline, a TERM-ignoring command at its timeout.
fn shell_scenario(home: &Home, extra_env: &[(&str, &str)]) {
    let mut env = AFTER.to_vec();
    env.extend_from_slice(extra_env);
    let mut m = home.stdio_with(&env);
    let sb = m.ok("create_sandbox", json!({"envs": {"SERVICE_TOKEN": "tok-123456789"}}))["sandbox_id"].as_str().unwrap().to_string();
    let out = m.ok(
        "run_command",
        json!({"sandbox_id": sb, "command": "echo a tok-123456789; sleep 1.5; echo tok-123456789 >&2; printf end; exit 3"}),
    );
    let (_, task) = running(&out);
    assert_eq!(out["stdout"], "a ***\n", "{out}");
    let done = final_state(&mut m, &sb, &task);
    assert_eq!((done["state"].as_str(), done["exit_code"].as_i64()), (Some("failed"), Some(3)), "{done}");
    assert_eq!((done["stdout"].as_str(), done["stderr"].as_str()), (Some("a ***\nend"), Some("***\n")), "{done}");
    let t0 = Instant::now();
    let out = m.ok("run_command", json!({"sandbox_id": sb, "command": "trap '' TERM; echo started; sleep 30", "timeout": 2}));
    let (_, task) = running(&out);
    let done = final_state(&mut m, &sb, &task);
    assert_eq!((done["state"].as_str(), done["stdout"].as_str()), (Some("timed_out"), Some("started\n")), "{done}");
    assert!(t0.elapsed() < Duration::from_secs(8), "{:?}", t0.elapsed());
    m.close();
}

#[test]
fn promotion_works_under_dash_bash_and_busybox() {
    shell_scenario(&Home::with_shell("promote-dash", std::path::Path::new("/bin/dash")), &[]);
    shell_scenario(&Home::with_shell("promote-bash", std::path::Path::new("/bin/bash")), &[]);
    let bin = crate::tasks::busybox_bin();
    // Unisolated: the busybox-only PATH is a host directory an isolated sandbox does not see.
    let home = Home::with_shell("promote-busybox", &bin.join("sh")).with_isolation("none");
    let path = bin.display().to_string();
    shell_scenario(&home, &[("PATH", &path)]);
    let _ = std::fs::remove_dir_all(&bin);
}

#[test]
fn a_plain_http_run_command_becomes_a_task() {
    let home = Home::new("promote-http");
    let h = Http::start(&home, &["--task-after", "1"], &[]);
    let session = h.initialize();
    let sb = h.call(&session, "create_sandbox", json!({}))["result"]["structuredContent"]["sandbox_id"].as_str().unwrap().to_string();
    let t0 = Instant::now();
    let r = h.call(&session, "run_command", json!({"sandbox_id": sb, "command": "echo one; sleep 2; echo two"}));
    let out = &r["result"]["structuredContent"];
    let (_, task) = running(out);
    assert!(t0.elapsed() < Duration::from_millis(1900), "{:?}", t0.elapsed());
    let done = wait_for(Duration::from_secs(20), "the task to end", || {
        let v = h.call(&session, "get_task", json!({"sandbox_id": sb, "task_id": task, "wait": 5}))["result"]["structuredContent"].clone();
        (v["state"] != "running").then_some(v)
    });
    assert_eq!((done["state"].as_str(), done["stdout"].as_str()), (Some("succeeded"), Some("one\ntwo\n")), "{done}");
    h.call(&session, "kill_sandbox", json!({"sandbox_id": sb}));
    assert!(h.stop().success());
}

/// On E2B (envd owns a command's pipes) a run_command that may outlive `--task-after` starts
/// under the supervisor and waits inside the sandbox: one request either way.
fn e2b_scenario(e: &E2bHome) {
    let mut m = e.stdio_with(&AFTER);
    let sb = m.ok("create_sandbox", json!({"envs": {"SERVICE_TOKEN": "tok-123456789"}}))["sandbox_id"].as_str().unwrap().to_string();
    // (The first command also reads the sandbox's environment, for masking.)
    m.ok("run_command", json!({"command": "true"}));
    // Quick: answered as before, in one request, and nothing is left behind.
    e.emulator.take_counts();
    let quick = m.ok("run_command", json!({"command": "echo hi $SERVICE_TOKEN; echo e >&2; exit 3"}));
    assert_eq!(e.emulator.take_counts()["total"], 1);
    conforms(&mut m, &quick);
    assert_eq!(
        (quick["state"].as_str(), quick["exit_code"].as_i64(), quick["stdout"].as_str(), quick["stderr"].as_str()),
        (Some("completed"), Some(3), Some("hi ***\n"), Some("e\n")),
        "{quick}"
    );
    assert!(quick.get("task_id").is_none(), "{quick}");
    wait_for(Duration::from_secs(10), "the finished command's task directory to go", || {
        (m.ok("list_tasks", json!({}))["count"] == 0).then_some(())
    });
    // A call's own variables reach the command and are masked; a relative cwd; the 1 MiB cap.
    m.ok("run_command", json!({"command": "mkdir -p sub"}));
    let out = m.ok(
        "run_command",
        json!({"command": "echo $CALL_SECRET $PLAIN; pwd | sed 's,.*/,,'; head -c 1500000 /dev/zero | tr '\\0' e >&2", "cwd": "sub", "envs": {"CALL_SECRET": "call-secret-1", "PLAIN": "p"}, "max_output": 1048576}),
    );
    assert_eq!((out["stdout"].as_str(), out["exit_code"].as_i64()), (Some("*** p\nsub\n"), Some(0)), "{}", out["stdout"]);
    assert_eq!((out["stderr"].as_str().map(str::len), out["stderr_truncated"].as_bool()), (Some(1 << 20), Some(true)));
    // A missing cwd starts nothing and says so.
    assert!(m.err("run_command", json!({"command": "true", "cwd": "/no/such/dir"})).contains("does not exist"));
    // Long: answered at about --task-after with the output so far, in one request.
    e.emulator.take_counts();
    let t0 = Instant::now();
    let out = m.ok("run_command", json!({"command": "echo A; echo x >&2; sleep 3; printf B; exit 7"}));
    let took = t0.elapsed();
    assert_eq!(e.emulator.take_counts()["total"], 1);
    let (sb2, task) = running(&out);
    conforms(&mut m, &out);
    assert_eq!(sb2, sb);
    assert!(took >= Duration::from_millis(950) && took < Duration::from_millis(1900), "answered after {took:?}");
    // (The sandbox has a secret: the supervisor's masker saves a line's newline with the next
    // line, so that a secret cut by a write is still masked.)
    assert_eq!((out["stdout"].as_str(), out["stderr"].as_str()), (Some("A"), Some("x")), "{out}");
    // The task survives its server.
    m.client.kill().unwrap();
    let mut m = e.stdio_with(&AFTER);
    let done = final_state(&mut m, &sb, &task);
    assert_eq!(
        (done["state"].as_str(), done["exit_code"].as_i64(), done["stdout"].as_str()),
        (Some("failed"), Some(7), Some("A\nB")),
        "{done}"
    );
    // cancel_task within 3 s; the remaining timeout; a call's secret masked on both sides.
    cancels_within_3_s(&mut m, &sb);
    let t0 = Instant::now();
    let out = m
        .ok("run_command", json!({"sandbox_id": sb, "command": "echo $TOKEN; sleep 60", "timeout": 3, "envs": {"TOKEN": "t0ken-value-1"}}));
    let (_, task) = running(&out);
    assert_eq!(out["stdout"], "***", "{out}");
    let done = final_state(&mut m, &sb, &task);
    assert_eq!((done["state"].as_str(), done["stdout"].as_str()), (Some("timed_out"), Some("***\n")), "{done}");
    assert!(!done.to_string().contains("t0ken-value-1"), "{done}");
    let took = t0.elapsed();
    assert!(took >= Duration::from_secs(3) && took < Duration::from_secs(8), "timed out after {took:?}");
    // A caller that gives up (notifications/cancelled) stops the command; nothing is left.
    let before = m.ok("list_tasks", json!({"sandbox_id": sb}))["count"].as_i64().unwrap();
    let call = json!({"jsonrpc": "2.0", "id": "long", "method": "tools/call",
        "params": {"name": "run_command", "arguments": {"sandbox_id": sb, "command": "sleep 3; touch too-long"}}});
    m.client.send_line(&call.to_string()).unwrap();
    m.client.send_line(r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"long"}}"#).unwrap();
    wait_for(Duration::from_secs(10), "the cancelled command's task to go", || {
        (m.ok("list_tasks", json!({"sandbox_id": sb}))["count"].as_i64() == Some(before)).then_some(())
    });
    let out = m.ok("run_command", json!({"sandbox_id": sb, "command": "sleep 3; test -e too-long && echo ran", "timeout": 10}));
    assert_eq!(out["stdout"], "", "the cancelled command must have been stopped: {out}");
    // A start the sandbox refuses (here the tasks directory cannot exist: a file has its name)
    // is no loss: the command runs the plain way and the call waits for it.
    m.ok("run_command", json!({"sandbox_id": sb, "command": "rm -rf .sandbox-mcp/tasks && : >.sandbox-mcp/tasks", "timeout": 1}));
    let t0 = Instant::now();
    let out = m.ok("run_command", json!({"sandbox_id": sb, "command": "printf A; sleep 2; printf B"}));
    assert_eq!(
        (out["state"].as_str(), out["exit_code"].as_i64(), out["stdout"].as_str()),
        (Some("completed"), Some(0), Some("AB")),
        "{out}"
    );
    assert!(t0.elapsed() >= Duration::from_secs(2), "{:?}", t0.elapsed());
    m.ok("kill_sandbox", json!({"sandbox_id": sb}));
    m.close();
}

#[test]
fn a_long_run_command_on_e2b_becomes_a_task() {
    e2b_scenario(&E2bHome::new("promote-e2b"));
}

#[test]
fn a_long_run_command_on_e2b_with_isolated_emulator_sandboxes_becomes_a_task() {
    if let Some(e) = crate::e2b::isolated_e2b("promote-e2b-iso") {
        e2b_scenario(&e);
    }
}
