//! Graceful shutdown under load: SIGTERM answers every request already
//! accepted (a result, or an error saying the server is shutting down), kills the sandboxes
//! sessions own, keeps the ones holding tasks, and exits within 5 s; a second SIGTERM exits at
//! once. Signals go to the server's own pid through the shell builtin, never to a group.

use crate::support::*;
use serde_json::{json, Value};
use std::process::Command;
use std::time::{Duration, Instant};

fn term(pid: u32) {
    Command::new("/bin/sh").args(["-c", &format!("kill -s TERM {pid}")]).status().unwrap();
}

fn call_body(id: u64, tool: &str, args: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": tool, "arguments": args}}).to_string()
}

/// A keep-alive connection that has been served once (a ping) and stays open: tiny_http 0.12 can
/// leave a new connection unserved while its threads are busy (ARCHITECTURE.md), so requests that
/// must be answered while the server is loaded go on connections made beforehand.
fn ready_conn(http: &Http, session: &str) -> Conn {
    wait_for(TIMEOUT, "a keep-alive connection", || {
        let mut conn = Conn::open(http.addr);
        conn.send("POST", "/mcp", &[("Mcp-Session-Id", session)], br#"{"jsonrpc":"2.0","id":0,"method":"ping"}"#);
        let r = conn.try_read()?;
        (r.status == 200 && r.header("connection") != Some("close")).then_some(conn)
    })
}

/// Waits for a file a command creates when it has really started.
fn wait_started(marker: &std::path::Path) {
    wait_for(TIMEOUT, "a command to start", || marker.exists().then_some(()));
}

fn wait_exit(child: &mut std::process::Child) -> std::process::ExitStatus {
    wait_for(TIMEOUT, "the server to exit", || child.try_wait().unwrap())
}

#[test]
fn sigterm_under_http_load_answers_every_accepted_request_and_exits_within_5_s() {
    let home = Home::new("termhttp");
    let mut http = Http::start(&home, &["--workers", "2"], &[]);
    let addr = http.addr;

    // Session A owns a sandbox; session B keeps its sandbox alive with a task.
    let a = http.initialize();
    let b = http.initialize();
    let sb_a = http.call(&a, "create_sandbox", json!({}))["result"]["structuredContent"]["sandbox_id"].as_str().unwrap().to_string();
    let sb_b = http.call(&b, "create_sandbox", json!({}))["result"]["structuredContent"]["sandbox_id"].as_str().unwrap().to_string();
    let task = http.call(&b, "start_task", json!({"command": "sleep 60"}));
    assert_eq!(task["result"]["isError"], false, "{task}");
    let (mut probe, mut late_conn) = (ready_conn(&http, &a), ready_conn(&http, &a));

    // Each session's places outside the worker pool taken by long commands, then one long
    // command per session on a worker, then calls that wait in the queue.
    let mut pending = Vec::new();
    let places = sandbox_mcp::queue::Sharing::for_workers(2, 64).runners_per_client;
    for (s, (session, sb)) in [(&a, &sb_a), (&b, &sb_b)].into_iter().enumerate() {
        for i in 0..places {
            let name = format!("slow-fill-{s}-{i}");
            let (inside, mark) = home.marker(sb, &name);
            let body = call_body(
                300 + (s * places + i) as u64,
                "run_command",
                json!({"sandbox_id": sb, "command": format!("touch {inside}; sleep 30")}),
            );
            let mut conn = Conn::open(addr);
            conn.send("POST", "/mcp", &[("Mcp-Session-Id", session)], body.as_bytes());
            pending.push((name, conn));
            wait_started(&mark);
        }
    }
    for (i, (session, sb)) in [(&a, &sb_a), (&b, &sb_b)].into_iter().enumerate() {
        let (inside, mark) = home.marker(sb, &format!("slow-{i}"));
        let body = call_body(100 + i as u64, "run_command", json!({"sandbox_id": sb, "command": format!("touch {inside}; sleep 30")}));
        let mut conn = Conn::open(addr);
        conn.send("POST", "/mcp", &[("Mcp-Session-Id", session)], body.as_bytes());
        pending.push((format!("slow-{i}"), conn));
        wait_started(&mark);
    }
    for i in 0..6u64 {
        let (session, sb) = if i % 2 == 0 { (&a, &sb_a) } else { (&b, &sb_b) };
        let mut conn = Conn::open(addr);
        conn.send(
            "POST",
            "/mcp",
            &[("Mcp-Session-Id", session)],
            call_body(200 + i, "run_command", json!({"sandbox_id": sb, "command": "echo queued"})).as_bytes(),
        );
        pending.push((format!("queued-{i}"), conn));
    }
    // A ping answered before the signal: the queued requests have most likely been read.
    probe.send("POST", "/mcp", &[("Mcp-Session-Id", &a)], br#"{"jsonrpc":"2.0","id":9,"method":"ping"}"#);
    assert_eq!(probe.try_read().expect("a ping answer").status, 200);

    let t0 = Instant::now();
    term(http.child.id());
    // Requests arriving during shutdown are refused with an answer, not dropped.
    let late = wait_for(Duration::from_secs(3), "a 503 while draining", || {
        late_conn.send("POST", "/mcp", &[("Mcp-Session-Id", &a)], br#"{"jsonrpc":"2.0","id":10,"method":"ping"}"#);
        let r = late_conn.try_read().expect("an answer on a served connection");
        assert!(r.status == 503 || r.header("connection") != Some("close"), "closed before draining: {}", r.body);
        (r.status == 503).then_some(r)
    });
    assert!(late.body.contains("shutting down"), "{}", late.body);

    // Every request accepted before the signal gets an answer.
    let answers: Vec<(String, Value)> = pending
        .into_iter()
        .map(|(name, mut conn)| {
            let r = conn.try_read().unwrap_or_else(|| panic!("{name}: connection closed without an answer"));
            // 503 "shutting down" when the signal came before the request was read.
            assert!(r.status == 200 || (r.status == 503 && r.body.contains("shutting down")), "{name}: {} {}", r.status, r.body);
            (name, r.json())
        })
        .collect();
    for (name, v) in &answers {
        if name.starts_with("slow") {
            let text = v["result"]["content"][0]["text"].as_str().unwrap_or_default();
            assert_eq!(v["result"]["isError"], true, "{name}: {v}");
            assert!(text.contains("shutting down"), "{name}: {v}");
        } else {
            // Queued behind the slow calls: refused with the shutdown error, or run if a worker
            // freed up first; never silently dropped.
            let refused = v["error"]["code"] == -32000 && v["error"]["message"].as_str().unwrap_or("").contains("shutting down");
            let ran = v["result"]["structuredContent"]["stdout"] == "queued\n";
            assert!(refused || ran, "{name}: {v}");
        }
    }
    let status = wait_exit(&mut http.child);
    let took = t0.elapsed();
    assert!(status.success(), "{status}");
    assert!(took < Duration::from_secs(5), "exit took {took:?}");
    // Session A's sandbox is gone; B's sandbox and its task survive the server.
    assert!(!home.sandbox_dir(&sb_a).exists(), "the owned sandbox must be killed");
    assert!(home.sandbox_dir(&sb_b).exists(), "a sandbox holding a task must survive");
    let mut m = home.stdio();
    let id = task["result"]["structuredContent"]["task_id"].as_str().unwrap();
    let s = m.ok("get_task", json!({"sandbox_id": sb_b, "task_id": id}));
    assert_eq!(s["state"], "running", "{s}");
}

/// SIGTERM while calls run and one waits for a worker: every call is answered before the server
/// exits. With one worker, a call waits once the client's runner places are taken (each long
/// run_command has a thread of its own) and the worker runs the next long one.
#[test]
fn sigterm_in_stdio_answers_the_running_and_the_queued_call() {
    let home = Home::new("termstdio");
    let mut m = home.stdio_with(&[("SANDBOX_MCP_WORKERS", "1")]);
    let sb = m.create();
    let slow = sandbox_mcp::queue::Sharing::for_workers(1, 64).runners_per_client as u64 + 1;
    for id in 1..=slow {
        let (inside, mark) = home.marker(&sb, &format!("slow-started-{id}"));
        let call = call_body(id, "run_command", json!({"sandbox_id": sb, "command": format!("touch {inside}; sleep 30")}));
        m.client.send_line(&call).unwrap();
        wait_started(&mark);
    }
    let queued = slow + 1;
    m.client.send_line(&call_body(queued, "run_command", json!({"sandbox_id": sb, "command": "echo queued"}))).unwrap();
    m.client.send_line(r#"{"jsonrpc":"2.0","id":999,"method":"ping"}"#).unwrap();
    let pong: Value = serde_json::from_str(&m.client.recv_line(TIMEOUT).unwrap()).unwrap();
    assert_eq!(pong["id"], 999, "the queued call was answered before the signal: {pong}");

    let t0 = Instant::now();
    let pid = m.client.pid();
    term(pid);
    let mut got = Vec::new();
    while got.len() < queued as usize {
        let line = m.client.recv_line(Duration::from_secs(5)).expect("every call gets an answer before exit");
        got.push(serde_json::from_str::<Value>(&line).unwrap());
    }
    got.sort_by_key(|v| v["id"].as_u64());
    for running in &got[..slow as usize] {
        assert_eq!(running["result"]["isError"], true, "{running}");
        assert!(running["result"]["content"][0]["text"].as_str().unwrap().contains("shutting down"), "{running}");
    }
    assert_eq!(got[slow as usize]["id"], queued);
    assert_eq!(got[slow as usize]["error"]["code"], -32000, "{}", got[slow as usize]);
    wait_for(Duration::from_secs(5), "the server to exit", || (!pid_alive(pid)).then_some(()));
    assert!(t0.elapsed() < Duration::from_secs(5), "exit took {:?}", t0.elapsed());
    assert!(!home.sandbox_dir(&sb).exists());
}

#[test]
fn a_second_sigterm_exits_at_once() {
    let home = Home::new("term2");
    let mut http = Http::start(&home, &[], &[]);
    let s = http.initialize();
    let created = http.call(&s, "create_sandbox", json!({}));
    let sb = created["result"]["structuredContent"]["sandbox_id"].as_str().unwrap().to_string();
    let (inside, mark) = home.marker(&sb, "slow-started");
    let mut conn = Conn::open(http.addr);
    conn.send(
        "POST",
        "/mcp",
        &[("Mcp-Session-Id", &s)],
        call_body(1, "run_command", json!({"command": format!("touch {inside}; sleep 30")})).as_bytes(),
    );
    wait_started(&mark);
    let pid = http.child.id();
    term(pid);
    // The graceful path waits for the running call; the second signal must not.
    wait_for(TIMEOUT, "the first signal to be taken", || http.stderr.lock().unwrap().contains("shutting down").then_some(()));
    term(pid);
    let status = wait_exit(&mut http.child);
    assert_eq!(status.code(), Some(128 + 15), "a second SIGTERM exits with 143 at once: {status}");
}
