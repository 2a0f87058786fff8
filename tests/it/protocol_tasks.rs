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
    extension_walkthrough(&|| home.stdio_with(&[("SANDBOX_MCP_TASK_AFTER", "1")]));
}

/// The same on E2B, where the run_command starts under the supervisor and waits inside the
/// sandbox; its `running` answer at --task-after becomes the CreateTaskResult.
#[test]
fn an_extension_task_on_e2b_survives_sigkill_of_the_server() {
    let e = E2bHome::new("ext-tasks-e2b");
    extension_walkthrough(&|| e.stdio_with(&[("SANDBOX_MCP_TASK_AFTER", "1")]));
}

fn extension_walkthrough(server: &dyn Fn() -> Mcp) {
    let mut a = server();
    let discover = a.client.request("server/discover", modern(json!({}), false), LONG).unwrap();
    assert_eq!(result(&discover)["capabilities"]["extensions"]["io.modelcontextprotocol/tasks"], json!({}));
    let sb = a.create();
    // Quick: answered inline, as run_command always was.
    let quick = run_2026(&mut a, &sb, "echo hi", true);
    assert_eq!((quick["resultType"].as_str(), quick["structuredContent"]["stdout"].as_str()), (Some("complete"), Some("hi\n")), "{quick}");
    // Long, without the extension: never a protocol task; an ordinary result saying that the
    // command goes on as a task of the supervisor (get_task reads it).
    let plain = run_2026(&mut a, &sb, "sleep 1.5; exit 4", false);
    assert_eq!(
        (plain["resultType"].as_str(), plain["structuredContent"]["state"].as_str()),
        (Some("complete"), Some("running")),
        "{plain}"
    );
    assert!(plain["structuredContent"]["task_id"].is_string(), "{plain}");
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
    let mut b = server();
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

/// The next message the server writes (a response or a notification).
fn next_message(c: &sandbox_mcp::client::StdioClient) -> Value {
    serde_json::from_str(&c.recv_line(LONG).unwrap()).unwrap()
}

/// Reads messages until `done` holds for one, returning the `notifications/tasks` seen (that
/// one included when it is one) and the response with id `response`, if any arrived.
fn read_until(
    c: &sandbox_mcp::client::StdioClient,
    response: &Value,
    mut done: impl FnMut(&[Value], &Option<Value>) -> bool,
) -> (Vec<Value>, Option<Value>) {
    let (mut pushed, mut answer) = (Vec::new(), None);
    while !done(&pushed, &answer) {
        let msg = next_message(c);
        if msg.get("id") == Some(response) {
            answer = Some(msg);
        } else if msg["method"] == "notifications/tasks" {
            pushed.push(msg);
        } else {
            panic!("unexpected message {msg}");
        }
    }
    (pushed, answer)
}

fn listen_line(id: &str, task_ids: &[&str], extension: bool) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": "subscriptions/listen", "params": modern(json!({"notifications": {"taskIds": task_ids}}), extension)})
        .to_string()
}

/// `notifications/tasks` on a 2026-07-28 subscription that named task ids: each task's status
/// when the subscription starts following it, and again when it ends (completed with the result
/// inline, or cancelled); a task already ended is pushed once.
#[test]
fn a_subscription_pushes_the_status_of_the_tasks_it_names() {
    let home = Home::new("ext-tasks-listen");
    let mut m = home.stdio_with(&[("SANDBOX_MCP_TASK_AFTER", "1")]);
    let sb = m.create();
    let task = run_2026(&mut m, &sb, "printf BEFORE; sleep 2; printf AFTER; exit 5", true);
    assert_eq!(task["resultType"], "task", "{task}");
    let a = task["taskId"].as_str().unwrap().to_string();
    m.client.send_line(&listen_line("sub", &[&a], true)).unwrap();
    let ack = next_message(&m.client);
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged", "{ack}");
    assert_eq!(ack["params"]["notifications"]["taskIds"], json!([a]));
    assert_eq!(ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], "sub");
    let (pushed, _) = read_until(&m.client, &Value::Null, |p, _| p.last().is_some_and(|n| n["params"]["status"] != "working"));
    let statuses: Vec<&str> = pushed.iter().map(|n| n["params"]["status"].as_str().unwrap()).collect();
    assert!(statuses == ["working", "completed"] || statuses == ["completed"], "one push per status: {statuses:?}");
    let done = &pushed.last().unwrap()["params"];
    assert_eq!(done["taskId"], a.as_str());
    assert_eq!(done["_meta"]["io.modelcontextprotocol/subscriptionId"], "sub");
    assert_eq!(
        (done["result"]["structuredContent"]["exit_code"].as_i64(), done["result"]["structuredContent"]["stdout"].as_str()),
        (Some(5), Some("BEFOREAFTER")),
        "{done}"
    );
    assert!(done.get("resultType").is_none() && done["createdAt"].as_str().unwrap().ends_with('Z'), "{done}");
    assert_eq!(
        *done,
        {
            let mut got = result(&get_2026(&mut m, &a)).clone();
            got.as_object_mut().unwrap().remove("resultType");
            got.as_object_mut().unwrap().remove("_meta");
            got["_meta"] = done["_meta"].clone();
            got
        },
        "a push is what tasks/get answers"
    );
    // A task still running and one already ended; then the running one is cancelled.
    let long = run_2026(&mut m, &sb, "sleep 60", true);
    let b = long["taskId"].as_str().unwrap().to_string();
    m.client.send_line(&listen_line("sub2", &[&b, &a], true)).unwrap();
    assert_eq!(next_message(&m.client)["params"]["notifications"]["taskIds"], json!([b, a]));
    let (pushed, _) = read_until(&m.client, &Value::Null, |p, _| p.len() == 2);
    let status_of = |pushed: &[Value], id: &str| -> Vec<String> {
        pushed.iter().filter(|n| n["params"]["taskId"] == id).map(|n| n["params"]["status"].as_str().unwrap().to_string()).collect()
    };
    assert_eq!(
        (status_of(&pushed, &b), status_of(&pushed, &a)),
        (vec!["working".to_string()], vec!["completed".to_string()]),
        "{pushed:?}"
    );
    let t0 = Instant::now();
    m.client
        .send_line(
            &json!({"jsonrpc": "2.0", "id": "c", "method": "tasks/cancel", "params": modern(json!({"taskId": b}), true)}).to_string(),
        )
        .unwrap();
    let (pushed, ack) = read_until(&m.client, &json!("c"), |p, a| a.is_some() && !p.is_empty());
    assert_eq!(result(ack.as_ref().unwrap())["resultType"], "complete");
    assert_eq!(status_of(&pushed, &b), ["cancelled"], "{pushed:?}");
    assert!(pushed[0]["params"].get("result").is_none(), "a cancelled task carries no result");
    assert!(t0.elapsed() < Duration::from_secs(4), "{:?}", t0.elapsed());
    // Task ids need the extension, and must be this server's handles.
    let v = m.client.request("subscriptions/listen", modern(json!({"notifications": {"taskIds": [a]}}), false), LONG).unwrap();
    assert_eq!(error_code(&v), -32021, "{v}");
    assert_eq!(v["error"]["data"]["requiredCapabilities"]["extensions"]["io.modelcontextprotocol/tasks"], json!({}));
    for bad in [json!(["nope"]), json!([7]), json!("x")] {
        let v = m.client.request("subscriptions/listen", modern(json!({"notifications": {"taskIds": bad}}), true), LONG).unwrap();
        assert_eq!(error_code(&v), -32602, "{bad}: {v}");
    }
    // A task that does not exist is never pushed (no made-up status); the stream stays quiet.
    let ghost = format!("{}.{sb}", "0".repeat(32));
    m.client.send_line(&listen_line("sub3", &[&ghost], true)).unwrap();
    assert_eq!(next_message(&m.client)["params"]["notifications"]["taskIds"], json!([ghost]));
    m.client
        .send_line(
            r#"{"jsonrpc":"2.0","id":"slow","method":"tools/call","params":{"name":"run_command","arguments":{"command":"sleep 0.3"}}}"#,
        )
        .unwrap();
    let next = next_message(&m.client);
    assert_eq!(next["id"], "slow", "nothing is pushed for a task that does not exist: {next}");
    m.close();
}

/// A 2026-07-28 request body declaring the tasks extension.
/// Subscriptions that follow the task of a sandbox whose reads stall cost only that sandbox:
/// another sandbox's waiting `get_task` is answered as soon as its task ends. Each such
/// subscription used to take a checker of the waiter for as long as its read stalled (the
/// snippet's whole budget), and a dozen of them held back every waiting call of the server.
#[test]
fn subscriptions_on_a_stalled_sandbox_do_not_hold_back_other_waits() {
    let home = Home::new("ext-tasks-stalled");
    if !home.isolated() {
        eprintln!("skipped: the stall needs an isolated sandbox (its own /dev)");
        return;
    }
    let mut m = home.stdio();
    let hostile = m.create();
    let task = m.ok("start_task", json!({"sandbox_id": hostile, "command": "sleep 120"}))["task_id"].as_str().unwrap().to_string();
    // Every read of the sandbox's tasks now waits on a FIFO (its snippets write errors there); a
    // directory holding it is bound over /dev at once (the task's supervisor writes there too).
    let poisoned = m.ok(
        "run_command",
        json!({"sandbox_id": hostile, "command": "mkdir /tmp/dev && mkfifo /tmp/dev/null && mount --bind /tmp/dev /dev && echo poisoned"}),
    );
    assert_eq!(poisoned["stdout"], "poisoned\n", "{poisoned}");
    let handle = format!("{task}.{hostile}");
    for i in 0..12 {
        m.client.send_line(&listen_line(&format!("s{i}"), &[&handle], true)).unwrap();
    }
    let other = m.create();
    let quick = m.ok("start_task", json!({"sandbox_id": other, "command": "sleep 2; echo news"}))["task_id"].as_str().unwrap().to_string();
    let t0 = Instant::now();
    let r = m.ok("get_task", json!({"sandbox_id": other, "task_id": quick, "wait": 30}));
    assert!(r["stdout"].as_str().unwrap_or_default().contains("news"), "{r}");
    assert!(t0.elapsed() < Duration::from_secs(8), "the other sandbox's wait took {:?}", t0.elapsed());
    m.ok("kill_sandbox", json!({"sandbox_id": hostile}));
}

fn http_body(id: Value, method: &str, params: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": modern(params, true)}).to_string()
}

fn http_headers<'a>(method: &'a str, name: Option<&'a str>) -> Vec<(&'a str, &'a str)> {
    let mut h = vec![("MCP-Protocol-Version", "2026-07-28"), ("Mcp-Method", method)];
    h.extend(name.map(|n| ("Mcp-Name", n)));
    h
}

/// Opens a `subscriptions/listen` stream over HTTP and returns it past the response head.
fn http_listen(h: &Http, body: &str) -> std::io::BufReader<std::net::TcpStream> {
    use std::io::{BufRead, Write};
    let mut s = std::net::TcpStream::connect(h.addr).unwrap();
    s.set_read_timeout(Some(LONG)).unwrap();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
MCP-Protocol-Version: 2026-07-28\r\nMcp-Method: subscriptions/listen\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    let mut reader = std::io::BufReader::new(s);
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert!(line.starts_with("HTTP/1.1 200"), "{line}");
    while line != "\r\n" {
        line.clear();
        assert!(reader.read_line(&mut line).unwrap() > 0, "the head ended early");
    }
    reader
}

/// The next `data:` event of an SSE stream (comments and blank lines skipped).
fn sse_event(reader: &mut std::io::BufReader<std::net::TcpStream>) -> Value {
    use std::io::BufRead;
    loop {
        let mut line = String::new();
        assert!(reader.read_line(&mut line).unwrap() > 0, "the stream ended");
        if let Some(data) = line.strip_prefix("data: ") {
            return serde_json::from_str(data.trim()).unwrap();
        }
    }
}

/// The tasks extension over HTTP: `tasks/get`, `tasks/cancel` and `tasks/update` carry
/// `Mcp-Name: <taskId>` (missing or different is HeaderMismatch, 400, and nothing is done), and a
/// `subscriptions/listen` stream naming the task pushes its statuses.
#[test]
fn http_task_methods_need_mcp_name_and_a_subscription_pushes_the_end() {
    let home = Home::new("ext-tasks-http");
    let h = Http::start(&home, &[], &[("SANDBOX_MCP_TASK_AFTER", "1")]);
    let post = |method: &str, name: Option<&str>, id: i64, params: Value| {
        h.post(&http_headers(method, name), &http_body(json!(id), method, params))
    };
    let call = |id: i64, tool: &str, args: Value| {
        let r = post("tools/call", Some(tool), id, json!({"name": tool, "arguments": args}));
        assert_eq!(r.status, 200, "{}", r.body);
        result(&r.json()).clone()
    };
    let sb = call(1, "create_sandbox", json!({"timeout": 300}))["structuredContent"]["sandbox_id"].as_str().unwrap().to_string();
    let task = call(2, "run_command", json!({"sandbox_id": sb, "command": "printf BEFORE; sleep 2; printf AFTER; exit 3", "timeout": 60}));
    assert_eq!(task["resultType"], "task", "{task}");
    let id = task["taskId"].as_str().unwrap().to_string();
    let mut stream = http_listen(&h, &http_body(json!(3), "subscriptions/listen", json!({"notifications": {"taskIds": [id]}})));
    let ack = sse_event(&mut stream);
    assert_eq!(
        (ack["method"].as_str(), &ack["params"]["notifications"]["taskIds"]),
        (Some("notifications/subscriptions/acknowledged"), &json!([id]))
    );
    // tasks/get: Mcp-Name must be the taskId (literal or Base64).
    let got = post("tasks/get", Some(&id), 4, json!({"taskId": id}));
    assert_eq!(got.status, 200, "{}", got.body);
    assert_eq!(result(&got.json())["taskId"], id.as_str());
    let b64 = format!("=?base64?{}?=", sandbox_mcp::base64::encode(id.as_bytes()));
    assert_eq!(post("tasks/get", Some(&b64), 5, json!({"taskId": id})).status, 200);
    let other = format!("{}.{sb}", "0".repeat(32));
    for (method, name) in [("tasks/get", None), ("tasks/get", Some(other.as_str())), ("tasks/get", Some("")), ("tasks/update", None)] {
        let r = post(method, name, 6, json!({"taskId": id, "inputResponses": {}}));
        assert_eq!((r.status, error_code(&r.json()), r.json()["id"].as_i64()), (400, -32020, Some(6)), "{method} {name:?}: {}", r.body);
    }
    let r = h.post(
        &http_headers("tasks/get", Some(&id)),
        &json!({"jsonrpc": "2.0", "id": 7, "method": "tasks/get", "params": modern(json!({"taskId": id}), false)}).to_string(),
    );
    assert_eq!((r.status, error_code(&r.json())), (400, -32021), "{}", r.body);
    let r = post("tasks/update", Some(&id), 8, json!({"taskId": id, "inputResponses": {}}));
    assert_eq!((r.status, result(&r.json())["resultType"].as_str()), (200, Some("complete")), "{}", r.body);
    // The subscription pushes the end, with the result inline.
    let done = loop {
        let n = sse_event(&mut stream);
        assert_eq!((n["method"].as_str(), n["params"]["taskId"].as_str()), (Some("notifications/tasks"), Some(id.as_str())), "{n}");
        assert_eq!(n["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], 3);
        if n["params"]["status"] != "working" {
            break n;
        }
    };
    assert_eq!(done["params"]["status"], "completed", "{done}");
    assert_eq!(done["params"]["result"]["structuredContent"]["exit_code"], 3, "{done}");
    assert_eq!(done["params"]["result"]["structuredContent"]["stdout"], "BEFOREAFTER");
    drop(stream);
    // tasks/cancel with a wrong Mcp-Name does nothing; with the right one the task ends.
    let long = call(9, "run_command", json!({"sandbox_id": sb, "command": "sleep 60", "timeout": 60}));
    let long_id = long["taskId"].as_str().unwrap().to_string();
    for name in [None, Some(id.as_str())] {
        let r = post("tasks/cancel", name, 10, json!({"taskId": long_id}));
        assert_eq!((r.status, error_code(&r.json())), (400, -32020), "{name:?}: {}", r.body);
    }
    assert_eq!(
        result(&post("tasks/get", Some(&long_id), 11, json!({"taskId": long_id})).json())["status"],
        "working",
        "a refused cancel did nothing"
    );
    let t0 = Instant::now();
    let r = post("tasks/cancel", Some(&long_id), 12, json!({"taskId": long_id}));
    assert_eq!((r.status, result(&r.json())["resultType"].as_str()), (200, Some("complete")), "{}", r.body);
    wait_for(Duration::from_secs(3), "the task to be cancelled", || {
        (result(&post("tasks/get", Some(&long_id), 13, json!({"taskId": long_id})).json())["status"] == "cancelled").then_some(())
    });
    assert!(t0.elapsed() < Duration::from_secs(3));
    // A malformed taskId is -32602 (the header matched it, so it reached the method).
    let r = post("tasks/get", Some("nope"), 14, json!({"taskId": "nope"}));
    assert_eq!((r.status, error_code(&r.json())), (200, -32602), "{}", r.body);
    let _ = post("tools/call", Some("kill_sandbox"), 15, json!({"name": "kill_sandbox", "arguments": {"sandbox_id": sb}}));
}
