//! 2025-11-25 protocol tasks (docs/contract.md, "Protocol tasks"): a task-augmented run_command,
//! tasks/get, tasks/result, tasks/list, tasks/cancel, bad handles, and a task read from a new
//! server process after the first was SIGKILLed.

use crate::support::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const LONG: Duration = Duration::from_secs(60);

fn result(resp: &Value) -> &Value {
    assert!(resp.get("error").is_none(), "{resp}");
    &resp["result"]
}

fn error_code(resp: &Value) -> i64 {
    resp["error"]["code"].as_i64().unwrap_or_else(|| panic!("not an error: {resp}"))
}

fn as_task(m: &mut Mcp, sb: &str, command: &str) -> Value {
    let resp = m.client.request(
        "tools/call",
        json!({"name": "run_command", "arguments": {"sandbox_id": sb, "command": command}, "task": {"ttl": 60000}}),
        LONG,
    );
    result(&resp.unwrap())["task"].clone()
}

fn request(m: &mut Mcp, method: &str, params: Value) -> Value {
    m.client.request(method, params, LONG).unwrap()
}

#[test]
fn a_task_augmented_run_command_is_read_to_its_end_and_cancelled() {
    let home = Home::new("ptasks");
    let mut m = home.stdio();
    let tools = request(&mut m, "tools/list", json!({}));
    for tool in result(&tools)["tools"].as_array().unwrap() {
        let support = if tool["name"] == "run_command" { json!({"taskSupport": "optional"}) } else { Value::Null };
        assert_eq!(tool["execution"], support, "{tool}");
    }
    let sb = m.create();
    let task = as_task(&mut m, &sb, "echo start; sleep 1; echo end; echo err >&2; exit 3");
    let id = task["taskId"].as_str().unwrap().to_string();
    assert_eq!(task["status"], "working", "{task}");
    assert!(id.ends_with(&format!(".{sb}")), "the handle carries the sandbox: {id}");
    for key in ["createdAt", "lastUpdatedAt"] {
        let t = task[key].as_str().unwrap();
        assert!(t.len() == 20 && t.ends_with('Z') && &t[10..11] == "T", "{key} {t}");
    }
    let got = request(&mut m, "tasks/get", json!({"taskId": id}));
    assert_eq!(result(&got)["taskId"], id.as_str());
    // tasks/result waits for the end.
    let t0 = Instant::now();
    let done = request(&mut m, "tasks/result", json!({"taskId": id}));
    let r = result(&done);
    assert!(t0.elapsed() < Duration::from_secs(30));
    assert_eq!(r["isError"], false, "{r}");
    assert_eq!(r["structuredContent"]["exit_code"], 3, "{r}");
    assert_eq!(r["structuredContent"]["stdout"], "start\nend\n");
    assert_eq!(r["structuredContent"]["stderr"], "err\n");
    assert_eq!(r["_meta"]["io.modelcontextprotocol/related-task"]["taskId"], id.as_str());
    assert_eq!(result(&request(&mut m, "tasks/get", json!({"taskId": id})))["status"], "completed");
    let again = request(&mut m, "tasks/cancel", json!({"taskId": id}));
    assert_eq!(error_code(&again), -32602, "a finished task cannot be cancelled: {again}");
    // Cancel: acknowledged with the task, then final; a second cancel is a harmless -32602.
    let long = as_task(&mut m, &sb, "sleep 60");
    let long_id = long["taskId"].as_str().unwrap().to_string();
    let t0 = Instant::now();
    let c = request(&mut m, "tasks/cancel", json!({"taskId": long_id}));
    assert_eq!(result(&c)["status"], "cancelled", "{c}");
    assert!(t0.elapsed() < Duration::from_secs(4), "{:?}", t0.elapsed());
    assert_eq!(error_code(&request(&mut m, "tasks/cancel", json!({"taskId": long_id}))), -32602);
    let r = request(&mut m, "tasks/result", json!({"taskId": long_id}));
    assert_eq!(result(&r)["isError"], true, "a cancelled task's result says so: {r}");
    // tasks/list: this session's tasks, oldest first.
    let list = request(&mut m, "tasks/list", json!({}));
    let ids: Vec<&str> = result(&list)["tasks"].as_array().unwrap().iter().map(|t| t["taskId"].as_str().unwrap()).collect();
    assert_eq!(ids, [id.as_str(), long_id.as_str()]);
    assert!(result(&list).get("nextCursor").is_none());
    assert_eq!(error_code(&request(&mut m, "tasks/list", json!({"cursor": "x"}))), -32602);
    // Bad handles: -32602 with a sentence, never a made-up status.
    let task_part = &id[..32];
    for bad in [
        "nope".to_string(),
        format!("{}.{sb}", "0".repeat(32)),
        format!("{task_part}.local-000000000000000000000000"),
        task_part.to_string(),
        format!("{}.{sb}", task_part.to_uppercase()),
    ] {
        for method in ["tasks/get", "tasks/result", "tasks/cancel"] {
            let v = request(&mut m, method, json!({"taskId": bad}));
            assert_eq!(error_code(&v), -32602, "{method} {bad}: {v}");
            assert!(v["error"]["message"].as_str().unwrap().len() > 20, "{v}");
        }
    }
    assert_eq!(error_code(&request(&mut m, "tasks/get", json!({}))), -32602);
    // Only run_command runs as a task.
    let v = request(&mut m, "tools/call", json!({"name": "list_files", "arguments": {"path": "."}, "task": {}}));
    assert_eq!(error_code(&v), -32601, "{v}");
    // Task arguments are checked before anything starts.
    let v = request(&mut m, "tools/call", json!({"name": "run_command", "arguments": {"command": "true", "envs": {"A": "b"}}, "task": {}}));
    assert_eq!(error_code(&v), -32602, "{v}");
    m.close();
}

#[test]
fn a_task_is_read_from_a_new_server_process_after_sigkill() {
    let home = Home::new("ptasks-kill");
    let mut a = home.stdio();
    let sb = a.create();
    let task = as_task(&mut a, &sb, "printf BEFORE; sleep 2; printf AFTER; exit 7");
    let id = task["taskId"].as_str().unwrap().to_string();
    a.client.kill().unwrap();
    let mut b = home.stdio();
    let got = request(&mut b, "tasks/get", json!({"taskId": id}));
    assert!(matches!(result(&got)["status"].as_str(), Some("working" | "completed")), "{got}");
    let done = request(&mut b, "tasks/result", json!({"taskId": id}));
    let r = &result(&done)["structuredContent"];
    assert_eq!((r["exit_code"].as_i64(), r["stdout"].as_str()), (Some(7), Some("BEFOREAFTER")), "{done}");
    assert_eq!(result(&request(&mut b, "tasks/get", json!({"taskId": id})))["status"], "completed");
    b.ok("kill_sandbox", json!({"sandbox_id": sb}));
    let gone = request(&mut b, "tasks/get", json!({"taskId": id}));
    assert_eq!(error_code(&gone), -32602, "a killed sandbox's task is unknown: {gone}");
    b.close();
}

/// A 2026-07-28 request line's params with `_meta`, declaring the tasks extension or not.
fn modern(params: Value, extension: bool) -> Value {
    let extensions = if extension { json!({"io.modelcontextprotocol/tasks": {}}) } else { json!({}) };
    let mut p = params;
    p["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"extensions": extensions},
    });
    p
}

fn run_2026(m: &mut Mcp, sb: &str, command: &str, extension: bool) -> Value {
    let params = modern(json!({"name": "run_command", "arguments": {"sandbox_id": sb, "command": command, "timeout": 60}}), extension);
    result(&m.client.request("tools/call", params, LONG).unwrap()).clone()
}

fn get_2026(m: &mut Mcp, id: &str) -> Value {
    m.client.request("tasks/get", modern(json!({"taskId": id}), true), LONG).unwrap()
}

/// The walkthrough: a run_command still running after `--task-after` becomes a task; the server
/// is SIGKILLed; `tasks/get` from a new server process returns the complete result.
#[test]
fn an_extension_task_survives_sigkill_of_the_server() {
    let home = Home::new("ext-tasks");
    let env = [("SANDBOX_MCP_TASK_AFTER", "1")];
    let mut a = home.stdio_with(&env);
    let discover = a.client.request("server/discover", modern(json!({}), false), LONG).unwrap();
    assert_eq!(result(&discover)["capabilities"]["extensions"]["io.modelcontextprotocol/tasks"], json!({}));
    let sb = a.create();
    // Quick: answered inline, as run_command always was.
    let quick = run_2026(&mut a, &sb, "echo hi", true);
    assert_eq!((quick["resultType"].as_str(), quick["structuredContent"]["stdout"].as_str()), (Some("complete"), Some("hi\n")), "{quick}");
    // Long, without the extension: never a task.
    let plain = run_2026(&mut a, &sb, "sleep 1.5; exit 4", false);
    assert_eq!((plain["resultType"].as_str(), plain["structuredContent"]["exit_code"].as_i64()), (Some("complete"), Some(4)), "{plain}");
    // Long, with the extension: a task after about --task-after.
    let t0 = Instant::now();
    let task = run_2026(&mut a, &sb, "printf BEFORE; sleep 3; printf AFTER; exit 4", true);
    let promoted = t0.elapsed();
    assert_eq!(task["resultType"], "task", "{task}");
    assert_eq!(task["status"], "working");
    assert_eq!(task["pollIntervalMs"], 1000);
    assert!(task.get("ttlMs").is_some() && task["createdAt"].as_str().unwrap().ends_with('Z'), "{task}");
    assert!(promoted >= Duration::from_millis(900) && promoted < Duration::from_secs(3), "{promoted:?}");
    let id = task["taskId"].as_str().unwrap().to_string();
    assert_eq!(result(&get_2026(&mut a, &id))["status"], "working", "durably created before the answer");
    a.client.kill().unwrap();
    let mut b = home.stdio_with(&env);
    let done = wait_for(Duration::from_secs(20), "the task to complete", || {
        let v = get_2026(&mut b, &id);
        (result(&v)["status"] != "working").then_some(v)
    });
    let r = result(&done);
    assert_eq!((r["resultType"].as_str(), r["status"].as_str()), (Some("complete"), Some("completed")), "{done}");
    assert_eq!(r["result"]["structuredContent"]["exit_code"], 4, "{done}");
    assert_eq!(r["result"]["structuredContent"]["stdout"], "BEFOREAFTER");
    // Cancel: acknowledged, cancelled within 3 s, harmless twice; update is acknowledged.
    let long = run_2026(&mut b, &sb, "sleep 60", true);
    let long_id = long["taskId"].as_str().unwrap().to_string();
    let t0 = Instant::now();
    let ack = b.client.request("tasks/cancel", modern(json!({"taskId": long_id}), true), LONG).unwrap();
    assert_eq!(result(&ack)["resultType"], "complete", "{ack}");
    let c = wait_for(Duration::from_secs(3), "cancelled", || {
        let v = get_2026(&mut b, &long_id);
        (result(&v)["status"] == "cancelled").then_some(v)
    });
    assert!(t0.elapsed() < Duration::from_secs(3), "{c}");
    let again = b.client.request("tasks/cancel", modern(json!({"taskId": long_id}), true), LONG).unwrap();
    assert!(again.get("error").is_none(), "{again}");
    let update = b.client.request("tasks/update", modern(json!({"taskId": long_id, "inputResponses": {}}), true), LONG).unwrap();
    assert!(update.get("error").is_none(), "{update}");
    for method in ["tasks/get", "tasks/cancel", "tasks/update"] {
        let v = b.client.request(method, modern(json!({"taskId": "nope"}), true), LONG).unwrap();
        assert_eq!(error_code(&v), -32602, "{method}: {v}");
    }
    for method in ["tasks/get", "tasks/cancel", "tasks/update"] {
        let v = b.client.request(method, modern(json!({"taskId": id}), false), LONG).unwrap();
        assert_eq!(error_code(&v), -32021, "{method} without the extension declared: {v}");
    }
    for method in ["tasks/result", "tasks/list"] {
        let v = b.client.request(method, modern(json!({"taskId": id}), true), LONG).unwrap();
        assert_eq!(error_code(&v), -32601, "{method} is not a 2026-07-28 method: {v}");
    }
    b.close();
}
