//! The stdio transport and the MCP protocol rules (docs/contract.md, "Protocol"), including bad input.

use crate::support::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn raw(home: &Home) -> sandbox_mcp::client::StdioClient {
    home.spawn_stdio(&[])
}

fn next(c: &sandbox_mcp::client::StdioClient) -> Value {
    serde_json::from_str(&c.recv_line(TIMEOUT).unwrap()).unwrap()
}

fn init_line(version: &str) -> String {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}).to_string()
}

#[test]
fn version_negotiation_echoes_supported_versions() {
    let home = Home::new("versions");
    for (asked, answered) in [
        ("2025-11-25", "2025-11-25"),
        ("2025-06-18", "2025-06-18"),
        ("2025-03-26", "2025-03-26"),
        ("2024-11-05", "2024-11-05"),
        ("2026-07-28", "2025-11-25"),
        ("1999-01-01", "2025-11-25"),
    ] {
        let mut c = raw(&home);
        c.send_line(&init_line(asked)).unwrap();
        let r = next(&c);
        assert_eq!(r["result"]["protocolVersion"], answered, "{asked}");
        assert_eq!(r["result"]["serverInfo"]["name"], "sandbox-mcp");
        assert!(r["result"]["capabilities"]["tools"].is_object());
        // The instructions say what every sandbox has: the shell, where to write, the network
        // and how to install packages.
        let text = r["result"]["instructions"].as_str().unwrap_or_default();
        for fact in ["create_sandbox", "Commands run with /bin/bash", "/tmp", "no outside network", "venv"] {
            assert!(text.contains(fact), "{asked}: the instructions lack {fact:?}: {text}");
        }
    }
}

#[test]
fn requests_before_initialize_get_prompt_errors() {
    let home = Home::new("preinit");
    let mut c = raw(&home);
    let t0 = Instant::now();
    // server/discover without its _meta envelope: a 2026-07-28 error (-32602), promptly.
    c.send_line(r#"{"jsonrpc":"2.0","id":"d","method":"server/discover","params":{}}"#).unwrap();
    let r = next(&c);
    assert_eq!(r["id"], "d");
    assert_eq!(r["error"]["code"], -32602);
    assert!(t0.elapsed() < Duration::from_secs(2));
    c.send_line(r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#).unwrap();
    assert_eq!(next(&c)["error"]["code"], -32600);
    c.send_line(r#"{"jsonrpc":"2.0","id":3,"method":"ping"}"#).unwrap();
    assert_eq!(next(&c)["result"], json!({}));
    c.send_line(&init_line("2025-11-25")).unwrap();
    assert_eq!(next(&c)["result"]["protocolVersion"], "2025-11-25");
    c.send_line(r#"{"jsonrpc":"2.0","id":4,"method":"tools/list"}"#).unwrap();
    assert_eq!(next(&c)["result"]["tools"].as_array().unwrap().len(), sandbox_mcp::tools::all().len());
}

#[test]
fn malformed_input_is_answered_and_the_server_goes_on() {
    let home = Home::new("malformed");
    let mut m = home.stdio();
    let cases: Vec<(Vec<u8>, i64)> = vec![
        (b"{not json".to_vec(), -32700),
        (b"\xff\xfe\x00garbage".to_vec(), -32700),
        (b"[1,2,3]".to_vec(), -32600),
        (b"[]".to_vec(), -32600),
        (b"42".to_vec(), -32600),
        (b"\"a string\"".to_vec(), -32600),
        (b"null".to_vec(), -32600),
        (br#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#.to_vec(), -32600),
        (br#"{"jsonrpc":"1.0","id":5,"method":"ping"}"#.to_vec(), -32600),
        (br#"{"jsonrpc":"2.0","id":6,"method":"no/such/method"}"#.to_vec(), -32601),
        (br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"no_such_tool","arguments":{}}}"#.to_vec(), -32602),
        (br#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"run_command","arguments":[1]}}"#.to_vec(), -32602),
        (br#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":[]}"#.to_vec(), -32602),
        (br#"{"jsonrpc":"2.0","id":10,"method":"logging/setLevel","params":{"level":"loud"}}"#.to_vec(), -32602),
    ];
    for (line, code) in cases {
        // send_line takes text: the invalid bytes arrive as U+FFFD, still invalid JSON. The
        // byte-exact invalid UTF-8 case has its own test below.
        m.client.send_line(&String::from_utf8_lossy(&line)).unwrap();
        let r = next(&m.client);
        assert_eq!(r["error"]["code"], code, "{:?} -> {r}", String::from_utf8_lossy(&line));
    }
    assert_eq!(m.request("ping", json!({}))["result"], json!({}));
}

#[test]
fn invalid_utf8_bytes_get_a_parse_error() {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let home = Home::new("utf8");
    let mut child = Command::new(bin())
        .arg("stdio")
        .envs(home.env())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"x\":\"\xc3\x28\"}\n").unwrap();
    stdin.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\"}\n").unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let lines: Vec<Value> = String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines[0]["error"]["code"], -32700);
    assert_eq!(lines[0]["id"], Value::Null);
    assert_eq!(lines[1]["result"], json!({}));
}

#[test]
fn a_10_mib_line_is_refused_without_killing_the_server() {
    let home = Home::new("bigline");
    let mut m = home.stdio();
    let big = format!(r#"{{"jsonrpc":"2.0","id":99,"method":"ping","params":{{"pad":"{}"}}}}"#, "x".repeat(10 * 1024 * 1024));
    m.client.send_line(&big).unwrap();
    let r = next(&m.client);
    assert_eq!(r["error"]["code"], -32700);
    // Its own id, read from the start of the line: the client can match the answer.
    assert_eq!(r["id"], 99);
    assert_eq!(m.request("ping", json!({}))["result"], json!({}));
}

#[test]
fn ids_keep_their_type_and_notifications_get_no_answer() {
    let home = Home::new("ids");
    let mut m = home.stdio();
    m.client.send_line(r#"{"jsonrpc":"2.0","method":"ping"}"#).unwrap();
    m.client.send_line(r#"{"jsonrpc":"2.0","method":"notifications/whatever","params":{}}"#).unwrap();
    m.client.send_line(r#"{"jsonrpc":"2.0","id":"1","method":"ping"}"#).unwrap();
    let r = next(&m.client);
    assert_eq!(r["id"], json!("1"), "the notification-shaped ping must not be answered, and the id stays a string");
    m.client.send_line(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#).unwrap();
    assert_eq!(next(&m.client)["id"], json!(1));
    m.client.send_line(r#"{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}"#).unwrap();
    assert_eq!(next(&m.client)["error"]["code"], -32600);
}

#[test]
fn duplicate_in_flight_ids_are_refused() {
    let home = Home::new("dupids");
    let mut m = home.stdio();
    let sb = m.create();
    let call = json!({"jsonrpc": "2.0", "id": "dup", "method": "tools/call", "params": {"name": "run_command", "arguments": {"sandbox_id": sb, "command": "sleep 1"}}}).to_string();
    m.client.send_line(&call).unwrap();
    m.client.send_line(&call).unwrap();
    let first = next(&m.client);
    assert_eq!(first["error"]["code"], -32600, "the duplicate is refused at once: {first}");
    let second = next(&m.client);
    assert_eq!(second["result"]["structuredContent"]["exit_code"], 0);
}

#[test]
fn a_slow_call_does_not_delay_ping() {
    let home = Home::new("slow");
    let mut m = home.stdio();
    let sb = m.create();
    m.client.send_line(&json!({"jsonrpc": "2.0", "id": "slow", "method": "tools/call", "params": {"name": "run_command", "arguments": {"sandbox_id": sb, "command": "sleep 5"}}}).to_string()).unwrap();
    m.client.send_line(r#"{"jsonrpc":"2.0","id":"fast","method":"ping"}"#).unwrap();
    m.client.send_line(&json!({"jsonrpc": "2.0", "id": "fast2", "method": "tools/call", "params": {"name": "run_command", "arguments": {"sandbox_id": sb, "command": "echo quick"}}}).to_string()).unwrap();
    let order: Vec<String> = (0..3).map(|_| next(&m.client)["id"].as_str().unwrap().to_string()).collect();
    assert_eq!(order, vec!["fast", "fast2", "slow"]);
}

#[test]
fn stdout_carries_only_protocol_lines_even_with_trace_logging() {
    let home = Home::new("stdoutonly");
    let mut c = home.spawn_stdio(&[("RUST_LOG", "trace")]);
    c.initialize().unwrap();
    let r = c.call_tool("create_sandbox", json!({}), TIMEOUT).unwrap();
    let sb = r["structuredContent"]["sandbox_id"].as_str().unwrap().to_string();
    c.call_tool("run_command", json!({"sandbox_id": sb, "command": "echo hi; echo err >&2"}), TIMEOUT).unwrap();
    c.send_line("garbage").unwrap();
    c.send_line(r#"{"jsonrpc":"2.0","id":"last","method":"ping"}"#).unwrap();
    loop {
        let line = c.recv_line(TIMEOUT).unwrap();
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|_| panic!("non-JSON on stdout: {line:?}"));
        assert_eq!(v["jsonrpc"], "2.0");
        if v["id"] == "last" {
            break;
        }
    }
}

#[test]
fn stdin_eof_ends_the_session_and_kills_its_sandboxes_within_2_s() {
    let home = Home::new("eof");
    let mut m = home.stdio();
    let sb = m.create();
    let nap = unique_sleep();
    m.ok("run_command", json!({"command": format!("setsid sleep {nap} >/dev/null 2>&1 &")}));
    let pid = pid_of_argv(&["sleep", &nap]);
    let t0 = Instant::now();
    let status = m.client.close(Duration::from_secs(5)).unwrap();
    let took = t0.elapsed();
    assert!(status.success(), "{status}");
    assert!(took < Duration::from_secs(2), "took {took:?}");
    assert!(!home.sandbox_dir(&sb).exists(), "the session's sandbox must be gone");
    wait_for(Duration::from_secs(3), "the sandbox's setsid process to die", || (!pid_alive(pid)).then_some(()));
}

#[test]
fn sigterm_ends_the_session_too() {
    let home = Home::new("sigterm");
    let mut m = home.stdio();
    let sb = m.create();
    let pid = m.client.pid();
    std::process::Command::new("/bin/sh").args(["-c", &format!("kill -s TERM {pid}")]).status().unwrap();
    wait_for(Duration::from_secs(10), "the server to exit", || (!pid_alive(pid)).then_some(()));
    assert!(!home.sandbox_dir(&sb).exists());
}

#[test]
fn notifications_cancelled_stops_the_command_and_suppresses_the_reply() {
    let home = Home::new("cancelreq");
    let mut m = home.stdio();
    let sb = m.create();
    let marker = home.path.join("ran-too-long");
    let cmd = format!("sleep 3 && touch {}", marker.display());
    m.client.send_line(&json!({"jsonrpc": "2.0", "id": "long", "method": "tools/call", "params": {"name": "run_command", "arguments": {"sandbox_id": sb, "command": cmd}}}).to_string()).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    m.client.send_line(r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"long","reason":"test"}}"#).unwrap();
    m.client.send_line(r#"{"jsonrpc":"2.0","id":"after","method":"ping"}"#).unwrap();
    assert_eq!(next(&m.client)["id"], "after");
    // No answer for the cancelled request, and its command was killed.
    assert!(m.client.recv_line(Duration::from_secs(4)).is_err(), "a cancelled request must not be answered");
    assert!(!marker.exists(), "the cancelled command must have been killed");
}
