//! Waiting reads (docs/contract.md, "Waiting reads"): `get_task` with `wait` answers on new
//! output or at the end, and waiting calls never hold a worker.

use crate::support::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn start(m: &mut Mcp, sb: &str, command: &str) -> String {
    m.ok("start_task", json!({"sandbox_id": sb, "command": command}))["task_id"].as_str().unwrap().to_string()
}

#[test]
fn a_waiting_get_task_answers_on_new_output_at_the_end_and_when_the_wait_is_over() {
    let home = Home::new("wait-stdio");
    let mut m = home.stdio();
    let sb = m.create();
    let task = start(&mut m, &sb, "sleep 1; echo one; sleep 1; echo two >&2");
    // New stdout.
    let t0 = Instant::now();
    let s = m.ok("get_task", json!({"sandbox_id": sb, "task_id": task, "wait": 30}));
    assert_eq!(s["stdout"], "one\n", "{s}");
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
    // New stderr past the offsets given, or the end.
    let s = m.ok(
        "get_task",
        json!({"sandbox_id": sb, "task_id": task, "wait": 30, "stdout_offset": s["stdout_next_offset"], "stderr_offset": 0}),
    );
    assert_eq!(s["stderr"], "two\n", "{s}");
    // A finished task answers at once, even with nothing new.
    let s = wait_for(Duration::from_secs(20), "the end", || {
        let s = m.ok("get_task", json!({"sandbox_id": sb, "task_id": task, "wait": 30, "stdout_offset": 4, "stderr_offset": 4}));
        (s["state"] != "running").then_some(s)
    });
    assert_eq!((s["state"].as_str(), s["exit_code"].as_i64()), (Some("succeeded"), Some(0)), "{s}");
    let t0 = Instant::now();
    m.ok("get_task", json!({"sandbox_id": sb, "task_id": task, "wait": 60, "stdout_offset": 4, "stderr_offset": 4}));
    assert!(t0.elapsed() < Duration::from_secs(5), "a finished task does not wait: {:?}", t0.elapsed());
    // Nothing happens: the answer comes when the wait is over, still running.
    let quiet = start(&mut m, &sb, "sleep 60");
    let t0 = Instant::now();
    let s = m.ok("get_task", json!({"sandbox_id": sb, "task_id": quiet, "wait": 1}));
    assert_eq!(s["state"], "running");
    assert!(t0.elapsed() >= Duration::from_millis(900), "answered before the wait was over: {:?}", t0.elapsed());
    // The end of a task ends the wait.
    let ends = start(&mut m, &sb, "sleep 1");
    let s = m.ok("get_task", json!({"sandbox_id": sb, "task_id": ends, "wait": 30}));
    assert_eq!(s["state"], "succeeded", "{s}");
    // Out of range, and a missing task: tool errors.
    for wait in [json!(61), json!(-1), json!("5")] {
        let e = m.err("get_task", json!({"sandbox_id": sb, "task_id": quiet, "wait": wait}));
        assert!(e.contains("wait"), "{e}");
    }
    let e = m.err("get_task", json!({"sandbox_id": sb, "task_id": "0123456789abcdef0123456789abcdef", "wait": 5}));
    assert!(e.contains("there is no task"), "{e}");
    m.ok("cancel_task", json!({"sandbox_id": sb, "task_id": quiet}));
    m.close();
}

/// 64 waiting reads at once over HTTP (eight times the default workers) leave the workers free:
/// `run_command true` is answered while every one of them still waits. Held by workers, the waits
/// would delay it by their 20 s. (Each wait's first read runs on a worker, so they pass through the
/// queue once, like any call: with the default queue of 64 none is refused.) The connections open
/// one after another, each once the previous wait is parked (the server's debug log says so):
/// tiny_http can leave one of a burst of connections unserved until another ends (ARCHITECTURE.md,
/// "Known limitation").
#[test]
fn waiting_reads_do_not_hold_workers() {
    let home = Home::new("wait-http");
    let h = Http::start(&home, &[], &[("RUST_LOG", "info,sandbox_mcp::waiter=debug")]);
    let sid = h.initialize();
    let call = |h: &Http, tool: &str, args: Value| -> Value {
        let r = h.call(&sid, tool, args);
        assert_eq!(r["result"]["isError"], false, "{r}");
        r["result"]["structuredContent"].clone()
    };
    let sb = call(&h, "create_sandbox", json!({}))["sandbox_id"].as_str().unwrap().to_string();
    let task = call(&h, "start_task", json!({"sandbox_id": sb, "command": "sleep 60"}))["task_id"].as_str().unwrap().to_string();
    // Four clients of 16 waits each: one client holds at most 16 of the 64 waiting places.
    let clients: Vec<String> = (0..4).map(|_| h.initialize()).collect();
    let mut waits: Vec<Conn> = (0..64)
        .map(|i| {
            let mut c = Conn::open(h.addr);
            let body = json!({"jsonrpc": "2.0", "id": 1000 + i, "method": "tools/call",
                "params": {"name": "get_task", "arguments": {"sandbox_id": sb, "task_id": task, "wait": 20}}});
            c.send("POST", "/mcp", &[("Mcp-Session-Id", &clients[i / 16])], body.to_string().as_bytes());
            let parked = format!("call {} waits", i + 1);
            wait_for(Duration::from_secs(10), &parked, || h.stderr.lock().unwrap().contains(&parked).then_some(()));
            c
        })
        .collect();
    let sent = Instant::now(); // (after the last one is parked)
                               // A 17th wait of one client is answered at once, with what its first read found.
    let t0 = Instant::now();
    let extra = h.call(&clients[0], "get_task", json!({"sandbox_id": sb, "task_id": task, "wait": 20}));
    assert_eq!(extra["result"]["structuredContent"]["state"], "running", "{extra}");
    assert!(t0.elapsed() < Duration::from_secs(5), "a client over its waiting places waited {:?}", t0.elapsed());
    let mut slowest = Duration::ZERO;
    for _ in 0..5 {
        let t0 = Instant::now();
        assert_eq!(call(&h, "run_command", json!({"sandbox_id": sb, "command": "true"}))["exit_code"], 0);
        slowest = slowest.max(t0.elapsed());
    }
    let commands_done = sent.elapsed();
    assert!(commands_done < Duration::from_secs(5), "run_command waited behind the waits: {commands_done:?}");
    eprintln!("run_command true with 64 calls waiting: slowest of 5 {slowest:?}");
    assert!(slowest < Duration::from_secs(2), "slowest run_command true: {slowest:?}");
    for (i, c) in waits.iter_mut().enumerate() {
        let r = c.read();
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        assert_eq!(v["id"], 1000 + i, "{v}");
        assert_eq!(v["result"]["structuredContent"]["state"], "running", "{v}");
    }
    let waited = sent.elapsed();
    assert!(waited >= Duration::from_secs(5), "the waits ended early ({waited:?}), so they proved nothing");
    call(&h, "cancel_task", json!({"sandbox_id": sb, "task_id": task}));
}

/// A sandbox that puts a FIFO in place of its task's state file while calls wait on it stalls
/// its own waiting reads only: another sandbox's `get_task` with `wait` still answers as soon as
/// its task writes (the waiter used to check every parked call on one thread).
#[test]
fn a_fifo_in_place_of_a_state_file_stalls_only_its_own_sandbox() {
    let home = Home::new("wait-fifo");
    let mut m = home.stdio();
    let hostile = m.create();
    let hostile_task = start(&mut m, &hostile, "sleep 60");
    // Park waits on the hostile sandbox's task (their first read finds the state file as it is).
    for id in 0..3 {
        let call = json!({"jsonrpc": "2.0", "id": 100 + id, "method": "tools/call",
            "params": {"name": "get_task", "arguments": {"sandbox_id": hostile, "task_id": hostile_task, "wait": 25}}});
        m.client.send_line(&call.to_string()).unwrap();
    }
    // Their first reads run while the other sandbox is made.
    let other = m.create();
    let swap = format!("cd .sandbox-mcp/tasks/{hostile_task} && rm -f state && mkfifo state && echo swapped");
    let swapped = m.ok("run_command", json!({"sandbox_id": hostile, "command": swap}));
    assert_eq!(swapped["stdout"], "swapped\n", "{swapped}");
    let other_task = start(&mut m, &other, "sleep 2; echo news");
    let t0 = Instant::now();
    let r = m.ok("get_task", json!({"sandbox_id": other, "task_id": other_task, "wait": 20}));
    assert!(r["stdout"].as_str().unwrap_or_default().contains("news"), "{r}");
    assert!(t0.elapsed() < Duration::from_secs(6), "the other sandbox's wait took {:?}", t0.elapsed());
    // The hostile sandbox's own read no longer opens the FIFO (only regular files are read): its
    // answer comes at once, honest about what it could not read, where it took the snippet's
    // whole budget before.
    let t0 = Instant::now();
    let r = m.call("get_task", json!({"sandbox_id": hostile, "task_id": hostile_task}));
    assert!(t0.elapsed() < Duration::from_secs(5), "the hostile sandbox's own read took {:?}: {r}", t0.elapsed());
}

/// The figure: following a 40-line, 40-second job takes at most 3 calls (here 2: the
/// start and one get_task with `until: "exit"`), and the answer holds every line.
#[test]
fn following_a_40_line_40_second_job_takes_at_most_3_calls() {
    let home = Home::new("wait-exit");
    let mut m = home.stdio();
    let sb = m.create();
    let mut calls = 0;
    let task = start(&mut m, &sb, "i=1; while [ $i -le 40 ]; do echo line $i; sleep 1; i=$((i+1)); done");
    calls += 1;
    let t0 = Instant::now();
    let mut s = Value::Null;
    let mut offset = 0;
    let mut stdout = String::new();
    while calls < 3 {
        let args = json!({"sandbox_id": sb, "task_id": task, "wait": 60, "until": "exit", "stdout_offset": offset});
        let r = m.client.call_tool("get_task", args, Duration::from_secs(75)).unwrap();
        assert_eq!(r["isError"], false, "{r}");
        s = r["structuredContent"].clone();
        calls += 1;
        stdout.push_str(s["stdout"].as_str().unwrap());
        offset = s["stdout_next_offset"].as_u64().unwrap();
        if s["state"] != "running" {
            break;
        }
    }
    assert_eq!((s["state"].as_str(), s["exit_code"].as_i64()), (Some("succeeded"), Some(0)), "{s}");
    let expected: String = (1..=40).map(|i| format!("line {i}\n")).collect();
    assert_eq!(stdout, expected);
    assert!(calls <= 3 && t0.elapsed() >= Duration::from_secs(35), "{calls} calls, {:?}", t0.elapsed());
}
