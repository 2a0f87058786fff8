//! MCP 2026-07-28 beside 2025-11-25 (docs/contract.md, "Protocol"): per-request `_meta`, no
//! handshake, `server/discover`, `resultType`, caching hints, removed methods, the HTTP headers,
//! `subscriptions/listen`, and sandbox lifetime without sessions, over stdio and HTTP.

use crate::support::*;
use sandbox_mcp::limits::{MAX_HTTP_SUBSCRIPTIONS, MAX_HTTP_SUBSCRIPTIONS_PER_CLIENT};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Instant;

const V: &str = "2026-07-28";

fn envelope() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": V,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "it", "version": "1"},
    })
}

/// A 2026-07-28 request body: `params` plus the envelope.
fn body(id: Value, method: &str, mut params: Value) -> String {
    params["_meta"] = envelope();
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string()
}

fn call_body(id: i64, tool: &str, args: Value) -> String {
    body(json!(id), "tools/call", json!({"name": tool, "arguments": args}))
}

/// The standard headers of a 2026-07-28 request.
fn headers<'a>(method: &'a str, name: Option<&'a str>) -> Vec<(&'a str, &'a str)> {
    let mut h = vec![("MCP-Protocol-Version", V), ("Mcp-Method", method)];
    if let Some(n) = name {
        h.push(("Mcp-Name", n));
    }
    h
}

fn error_code(v: &Value) -> i64 {
    v["error"]["code"].as_i64().unwrap_or_else(|| panic!("not an error: {v}"))
}

fn assert_complete(result: &Value) {
    assert_eq!(result["resultType"], "complete", "{result}");
    assert_eq!(result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "sandbox-mcp", "{result}");
}

#[test]
fn stdio_serves_both_eras_in_one_process() {
    let home = Home::new("modern-stdio");
    let mut c = home.spawn_stdio(&[]);
    let mut send = |line: String, id: Value| -> Value {
        c.send_line(&line).unwrap();
        c.recv_response(&id, TIMEOUT).unwrap()
    };
    // No initialize: a 2026-07-28 request is served as it comes.
    let d = send(body(json!("d"), "server/discover", json!({})), json!("d"));
    let r = &d["result"];
    assert_complete(r);
    assert_eq!(r["supportedVersions"], json!([V]));
    assert_eq!(r["capabilities"]["tools"], json!({"listChanged": false}));
    assert_eq!(r["capabilities"]["extensions"], json!({"io.modelcontextprotocol/tasks": {}}));
    assert!(r["ttlMs"].as_u64().is_some() && r["cacheScope"] == "public", "{r}");
    assert!(r["instructions"].as_str().is_some_and(|t| t.contains("Commands run with /bin/bash")), "{r}");
    let list = send(body(json!(1), "tools/list", json!({})), json!(1));
    assert_complete(&list["result"]);
    assert_eq!(list["result"]["cacheScope"], "public");
    let names: Vec<&str> = list["result"]["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names[0], "create_sandbox");
    assert_eq!(names.len(), sandbox_mcp::tools::all().len());
    let again = send(body(json!(2), "tools/list", json!({})), json!(2));
    assert_eq!(again["result"]["tools"], list["result"]["tools"], "a deterministic order");
    // Over stdio the process is the scope in both eras: the default sandbox works.
    let created = send(call_body(3, "create_sandbox", json!({"timeout": 120})), json!(3));
    assert_complete(&created["result"]);
    let sandbox = created["result"]["structuredContent"]["sandbox_id"].as_str().unwrap().to_string();
    let ran = send(call_body(4, "run_command", json!({"command": "echo modern"})), json!(4));
    assert_complete(&ran["result"]);
    assert_eq!(ran["result"]["structuredContent"]["stdout"], "modern\n");
    // Removed and unknown methods, malformed envelopes, unknown versions.
    for method in ["initialize", "ping", "logging/setLevel", "resources/subscribe", "resources/unsubscribe", "nope/nope"] {
        let v = send(body(json!(5), method, json!({})), json!(5));
        assert_eq!(error_code(&v), -32601, "{method}");
    }
    let bad_meta = [
        json!({"jsonrpc": "2.0", "id": 6, "method": "server/discover"}),
        json!({"jsonrpc": "2.0", "id": 6, "method": "server/discover", "params": {"_meta": {}}}),
        json!({"jsonrpc": "2.0", "id": 6, "method": "tools/list", "params": {"_meta": {"io.modelcontextprotocol/protocolVersion": V}}}),
        json!({"jsonrpc": "2.0", "id": 6, "method": "tools/list", "params": {"_meta": {"io.modelcontextprotocol/protocolVersion": V, "io.modelcontextprotocol/clientCapabilities": 7}}}),
        json!({"jsonrpc": "2.0", "id": 6, "method": "tools/list", "params": {"_meta": {"io.modelcontextprotocol/protocolVersion": 2026, "io.modelcontextprotocol/clientCapabilities": {}}}}),
    ];
    for msg in bad_meta {
        assert_eq!(error_code(&send(msg.to_string(), json!(6))), -32602, "{msg}");
    }
    let mut old = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": {"_meta": envelope()}});
    old["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = json!("1999-01-01");
    let v = send(old.to_string(), json!(7));
    assert_eq!(error_code(&v), -32022);
    assert_eq!(v["error"]["data"], json!({"supported": [V], "requested": "1999-01-01"}));
    // The 2025 era on the same process: ping needs nothing, tools/list needs initialize.
    let pong = send(r#"{"jsonrpc":"2.0","id":8,"method":"ping"}"#.into(), json!(8));
    assert_eq!(pong["result"], json!({}), "no resultType in a 2025 answer");
    let early = send(r#"{"jsonrpc":"2.0","id":9,"method":"tools/list"}"#.into(), json!(9));
    assert_eq!(error_code(&early), -32600);
    let init = send(INITIALIZE.replace("\"id\":1", "\"id\":10"), json!(10));
    assert_eq!(init["result"]["protocolVersion"], "2025-11-25");
    let legacy = send(r#"{"jsonrpc":"2.0","id":11,"method":"tools/list"}"#.into(), json!(11));
    assert!(legacy["result"].get("resultType").is_none() && legacy["result"].get("ttlMs").is_none(), "2025 results stay as they were");
    assert_eq!(legacy["result"]["tools"], list["result"]["tools"]);
    // subscriptions/listen: acknowledged at once, with only the kinds served, then quiet.
    c.send_line(&body(
        json!("sub"),
        "subscriptions/listen",
        json!({"notifications": {"toolsListChanged": true, "promptsListChanged": true}}),
    ))
    .unwrap();
    let ack: Value = serde_json::from_str(&c.recv_line(TIMEOUT).unwrap()).unwrap();
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
    assert_eq!(ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], "sub");
    assert_eq!(ack["params"]["notifications"], json!({"toolsListChanged": true}));
    c.send_line(&json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "sub"}}).to_string()).unwrap();
    // stdin EOF ends the process scope: the sandbox the 2026 request created is killed too.
    c.close(std::time::Duration::from_secs(5)).unwrap();
    assert!(!home.sandbox_dir(&sandbox).exists(), "stdio kills what it created, in both eras");
}

#[test]
fn stdio_closes_an_open_subscription_at_shutdown() {
    let home = Home::new("modern-stdio-sub");
    let mut c = home.spawn_stdio(&[]);
    c.send_line(&body(json!(41), "subscriptions/listen", json!({"notifications": {}}))).unwrap();
    let ack: Value = serde_json::from_str(&c.recv_line(TIMEOUT).unwrap()).unwrap();
    assert_eq!(ack["params"]["notifications"], json!({}));
    c.send_line(&body(json!(41), "subscriptions/listen", json!({"notifications": {}}))).unwrap();
    let dup = c.recv_response(&json!(41), TIMEOUT).unwrap();
    assert_eq!(error_code(&dup), -32600, "one open subscription per id");
    // SIGTERM through the child's own pid: the subscription ends with its closing result.
    let pid = c.pid();
    assert!(std::process::Command::new("/bin/sh").args(["-c", &format!("kill -s TERM {pid}")]).status().unwrap().success());
    let closing = c.recv_response(&json!(41), TIMEOUT).unwrap();
    assert_complete(&closing["result"]);
    assert_eq!(closing["result"]["_meta"]["io.modelcontextprotocol/subscriptionId"], 41);
}

#[test]
fn http_2026_requests_have_no_session_and_checked_headers() {
    let home = Home::new("modern-http");
    let h = Http::start(&home, &[], &[]);
    let post = |hs: &[(&str, &str)], b: &str| h.post(hs, b);
    let d = post(&headers("server/discover", None), &body(json!(1), "server/discover", json!({})));
    assert_eq!(d.status, 200, "{}", d.body);
    assert!(d.header("mcp-session-id").is_none(), "no session is minted");
    assert_complete(&d.json()["result"]);
    // clientInfo is optional.
    let mut no_info = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {"_meta": envelope()}});
    no_info["params"]["_meta"].as_object_mut().unwrap().remove("io.modelcontextprotocol/clientInfo");
    let r = post(&headers("tools/list", None), &no_info.to_string());
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["result"]["ttlMs"], 3_600_000);

    // Header checks: HeaderMismatch, 400, with the request id.
    let call = call_body(3, "run_command", json!({"command": "true"}));
    let b64 = format!("=?base64?{}?=", sandbox_mcp::base64::encode(b"run_command"));
    let cases: Vec<Vec<(&str, &str)>> = vec![
        vec![("MCP-Protocol-Version", V)],
        vec![("Mcp-Method", "tools/call"), ("Mcp-Name", "run_command")],
        vec![("MCP-Protocol-Version", "2025-11-25"), ("Mcp-Method", "tools/call"), ("Mcp-Name", "run_command")],
        headers("tools/list", Some("run_command")),
        headers("TOOLS/CALL", Some("run_command")),
        headers("tools/call", None),
        headers("tools/call", Some("kill_sandbox")),
    ];
    for hs in cases {
        let r = post(&hs, &call);
        assert_eq!((r.status, error_code(&r.json())), (400, -32020), "{hs:?}: {}", r.body);
        assert_eq!(r.json()["id"], 3);
    }
    // Whitespace around values, any case of names, and a Base64 name are accepted; the call
    // itself fails as a tool error naming create_sandbox: no session, no default sandbox.
    for hs in [
        vec![("mcp-protocol-version", " 2026-07-28 "), ("MCP-METHOD", "tools/call"), ("mcp-name", "  run_command  ")],
        headers("tools/call", Some(b64.as_str())),
    ] {
        let r = post(&hs, &call);
        assert_eq!(r.status, 200, "{hs:?}: {}", r.body);
        let result = &r.json()["result"];
        assert_complete(result);
        assert_eq!(result["isError"], true);
        assert!(result["content"][0]["text"].as_str().unwrap().contains("create_sandbox"), "{result}");
    }

    // Envelope errors: 400 with -32602 or -32022; unknown and removed methods: 404 with -32601.
    let r = post(&headers("server/discover", None), r#"{"jsonrpc":"2.0","id":4,"method":"server/discover","params":{}}"#);
    assert_eq!((r.status, error_code(&r.json())), (400, -32602));
    let mut v999 = json!({"jsonrpc": "2.0", "id": 5, "method": "server/discover", "params": {"_meta": envelope()}});
    v999["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = json!("v999.0.0");
    let r = post(&[("MCP-Protocol-Version", "v999.0.0"), ("Mcp-Method", "server/discover")], &v999.to_string());
    assert_eq!((r.status, error_code(&r.json())), (400, -32022));
    assert_eq!(r.json()["error"]["data"]["requested"], "v999.0.0");
    let r = post(&headers("server/discover", None), &v999.to_string());
    assert_eq!((r.status, error_code(&r.json())), (400, -32020), "a header that disagrees with the body is a mismatch first");
    for method in ["initialize", "ping", "logging/setLevel", "resources/subscribe", "unknown/method"] {
        let r = post(&headers(method, None), &body(json!(6), method, json!({})));
        assert_eq!((r.status, error_code(&r.json()), r.json()["id"].as_i64()), (404, -32601, Some(6)), "{method}");
    }
    let r = post(&headers("resources/read", Some("file:///x")), &body(json!(7), "resources/read", json!({"uri": "file:///x"})));
    assert_eq!((r.status, error_code(&r.json())), (200, -32602));
    assert_eq!(r.json()["error"]["data"]["uri"], "file:///x");
    // A batch, a notification, and a 2026 version header on a request without _meta.
    let r = post(&headers("tools/list", None), &format!("[{}]", body(json!(8), "tools/list", json!({}))));
    assert_eq!(r.status, 400);
    let r =
        post(&headers("notifications/cancelled", None), r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}"#);
    assert_eq!(r.status, 202);
    let r = post(&headers("tools/list", None), r#"{"jsonrpc":"2.0","id":9,"method":"tools/list"}"#);
    assert_eq!((r.status, error_code(&r.json())), (400, -32602));
    assert!(r.body.contains("_meta"), "{}", r.body);

    // Sandboxes of 2026 requests belong to nobody: they survive the server until kill_sandbox.
    let created = post(&headers("tools/call", Some("create_sandbox")), &call_body(10, "create_sandbox", json!({"timeout": 120})));
    let sandbox = created.json()["result"]["structuredContent"]["sandbox_id"].as_str().unwrap().to_string();
    let ran = post(
        &headers("tools/call", Some("run_command")),
        &call_body(11, "run_command", json!({"sandbox_id": sandbox, "command": "echo hi"})),
    );
    assert_eq!(ran.json()["result"]["structuredContent"]["stdout"], "hi\n");

    // A 2025 session beside it: its own default sandbox, untouched by the 2026 requests, and a
    // 2026 request carrying its session id is refused without touching the session.
    let sid = h.initialize();
    let mine =
        h.call(&sid, "create_sandbox", json!({"timeout": 120}))["result"]["structuredContent"]["sandbox_id"].as_str().unwrap().to_string();
    let mut with_session = headers("tools/call", Some("run_command"));
    with_session.push(("Mcp-Session-Id", sid.as_str()));
    let r = post(&with_session, &call_body(12, "run_command", json!({"command": "true"})));
    assert_eq!((r.status, error_code(&r.json()), r.json()["id"].as_i64()), (400, -32600, Some(12)));
    let in_session = h.call(&sid, "run_command", json!({"command": "echo 2025"}));
    assert_eq!(in_session["result"]["structuredContent"]["stdout"], "2025\n", "the session's default is its own sandbox");
    assert!(in_session["result"].get("resultType").is_none());
    let r = post(&[("Mcp-Session-Id", sid.as_str())], r#"{"jsonrpc":"2.0","id":13,"method":"ping"}"#);
    assert_eq!(r.status, 200, "the session goes on");
    assert_eq!(h.stop().code(), Some(0));
    assert!(!home.sandbox_dir(&mine).exists(), "the 2025 session's sandbox ends with the server");
    assert!(home.sandbox_dir(&sandbox).exists(), "the 2026 request's sandbox lives on until kill_sandbox or its timeout");
}

/// Reads one `data:` event of an SSE stream (skipping comments and blank lines).
fn next_event(reader: &mut BufReader<TcpStream>) -> Value {
    loop {
        let mut line = String::new();
        assert!(reader.read_line(&mut line).unwrap() > 0, "the stream ended");
        if let Some(data) = line.strip_prefix("data: ") {
            return serde_json::from_str(data.trim()).unwrap();
        }
    }
}

fn open_listen(h: &Http, id: i64) -> BufReader<TcpStream> {
    open_listen_as(h, id, "it")
}

/// A `subscriptions/listen` request of the client that declares clientInfo `client`.
fn listen_body(id: i64, client: &str) -> String {
    let mut b =
        json!({"jsonrpc": "2.0", "id": id, "method": "subscriptions/listen", "params": {"notifications": {"toolsListChanged": true}}});
    b["params"]["_meta"] = envelope();
    b["params"]["_meta"]["io.modelcontextprotocol/clientInfo"]["name"] = json!(client);
    b.to_string()
}

/// Opens a stream as the client that declares clientInfo `client`; its status line is not read.
fn open_listen_as(h: &Http, id: i64, client: &str) -> BufReader<TcpStream> {
    let b = listen_body(id, client);
    let mut s = TcpStream::connect(h.addr).unwrap();
    s.set_read_timeout(Some(TIMEOUT)).unwrap();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
MCP-Protocol-Version: {V}\r\nMcp-Method: subscriptions/listen\r\nContent-Length: {}\r\n\r\n{b}",
        b.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    BufReader::new(s)
}

#[test]
fn http_subscriptions_are_acknowledged_bounded_and_closed_at_shutdown() {
    let home = Home::new("modern-listen");
    let mut h = Http::start(&home, &[], &[]);
    let mut first = open_listen(&h, 1);
    let mut status = String::new();
    first.read_line(&mut status).unwrap();
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    let mut head = String::new();
    while {
        let mut l = String::new();
        first.read_line(&mut l).unwrap();
        head.push_str(&l);
        l != "\r\n"
    } {}
    assert!(head.to_ascii_lowercase().contains("content-type: text/event-stream"), "{head}");
    let ack = next_event(&mut first);
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
    assert_eq!(ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], 1);
    // Each stream holds a handler thread: beyond the limit, 503 (each client holds at most
    // its share, so the streams are opened by several).
    // (One after another: connections opened in a burst can wait behind tiny_http's pool race,
    // see ARCHITECTURE.md, and these never end on their own.)
    let mut held = Vec::new();
    for i in 2..=MAX_HTTP_SUBSCRIPTIONS as i64 {
        let client = format!("client-{}", i as usize / MAX_HTTP_SUBSCRIPTIONS_PER_CLIENT);
        let mut reader = open_listen_as(&h, i, &client);
        assert_eq!(next_event(&mut reader)["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], i);
        held.push(reader);
    }
    let over = h.post(&headers("subscriptions/listen", None), &listen_body(99, "newcomer"));
    assert_eq!((over.status, error_code(&over.json())), (503, -32000), "{}", over.body);
    let message = over.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(message.contains(&format!("all {MAX_HTTP_SUBSCRIPTIONS} subscriptions/listen streams")), "{message}");
    assert_eq!(over.header("retry-after"), Some("5"));
    // Other requests are still served.
    let r = h.post(&headers("tools/list", None), &body(json!(100), "tools/list", json!({})));
    assert_eq!(r.status, 200);
    drop(held);
    // A stream whose client left frees its slot (noticed at the next keep-alive write at the latest).
    // Shutdown ends the open one gracefully, with its closing result.
    let began = Instant::now();
    let pid = h.child.id();
    assert!(std::process::Command::new("/bin/sh").args(["-c", &format!("kill -s TERM {pid}")]).status().unwrap().success());
    let closing = next_event(&mut first);
    assert_eq!(closing["id"], 1);
    assert_complete(&closing["result"]);
    assert_eq!(closing["result"]["_meta"]["io.modelcontextprotocol/subscriptionId"], 1);
    assert!(began.elapsed() < std::time::Duration::from_secs(5));
    let exit = wait_for(TIMEOUT, "the server to exit", || h.child.try_wait().unwrap());
    assert_eq!(exit.code(), Some(0));
}

/// A stream outlives `--http-stall`: the connection's receive timeout ends tiny_http's wait for
/// a next request on it, never the stream, which only writes; shutdown still closes it with its
/// result.
#[test]
fn a_stream_outlives_the_stall_time() {
    let home = Home::new("modern-listen-stall");
    let mut h = Http::start(&home, &["--http-stall", "1"], &[]);
    let mut stream = open_listen(&h, 1);
    assert_eq!(next_event(&mut stream)["method"], "notifications/subscriptions/acknowledged");
    still_open_after_three_stall_times(&mut h, &mut stream, 1);
}

/// Lets three stall times of `h` (started with `--http-stall 1`) go by, each a quiet connection
/// closed after one; then stops the server, and checks that `stream` (of `subscriptions/listen`
/// request `id`) was still open: it gets its closing result, and the server exits cleanly.
fn still_open_after_three_stall_times(h: &mut Http, stream: &mut BufReader<TcpStream>, id: i64) {
    for _ in 0..3 {
        let mut quiet = TcpStream::connect(h.addr).unwrap();
        quiet.set_read_timeout(Some(TIMEOUT)).unwrap();
        assert_eq!(std::io::Read::read(&mut quiet, &mut [0u8; 16]).unwrap(), 0, "a quiet connection is closed");
    }
    let pid = h.child.id();
    assert!(std::process::Command::new("/bin/sh").args(["-c", &format!("kill -s TERM {pid}")]).status().unwrap().success());
    let closing = next_event(stream);
    assert_eq!(closing["id"], id, "the stream was not open after three stall times: {closing}");
    let exit = wait_for(TIMEOUT, "the server to exit", || h.child.try_wait().unwrap());
    assert_eq!(exit.code(), Some(0));
}

/// A request of `body` for `method` (and tool `name`), as raw bytes to pipeline.
fn raw_request(method: &str, name: Option<&str>, body: &str) -> String {
    let mut head = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
Content-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers(method, name) {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    format!("{head}\r\n{body}")
}

/// Reads one answer with a `Content-Length` from `reader`: its status and body.
fn read_answer(reader: &mut BufReader<TcpStream>) -> (u16, Value) {
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    let status = line.split_whitespace().nth(1).unwrap_or_else(|| panic!("no status line: {line:?}")).parse().unwrap();
    let mut len = 0;
    loop {
        let mut h = String::new();
        reader.read_line(&mut h).unwrap();
        if h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().unwrap();
            }
        }
    }
    let mut body = vec![0u8; len];
    std::io::Read::read_exact(reader, &mut body).unwrap();
    (status, serde_json::from_slice(&body).unwrap())
}

/// Requests pipelined on one connection are handled together, and each answer waits for the
/// one before it: neither that wait nor a stream that follows a call is a transfer that falls
/// behind. (A first version of the connection guard kept one deadline per connection: the
/// quick call's answer, waiting behind a 3 s call, ended the connection after 2.4 s with the
/// slow call's answer lost, and a stream pipelined behind a call was cut after 3.4 s.)
#[test]
fn pipelined_calls_and_a_stream_behind_a_call_outlive_the_stall_time() {
    let home = Home::new("modern-pipelined");
    let mut h = Http::start(&home, &["--http-stall", "1"], &[]);
    let created = h.post(&headers("tools/call", Some("create_sandbox")), &call_body(1, "create_sandbox", json!({"timeout": 120})));
    let sandbox = created.json()["result"]["structuredContent"]["sandbox_id"].as_str().unwrap().to_string();
    let run = |id: i64, command: &str| {
        raw_request("tools/call", Some("run_command"), &call_body(id, "run_command", json!({"sandbox_id": sandbox, "command": command})))
    };
    let mut s = TcpStream::connect(h.addr).unwrap();
    s.set_read_timeout(Some(TIMEOUT)).unwrap();
    s.write_all(format!("{}{}", run(2, "sleep 3; echo slow"), run(3, "echo quick")).as_bytes()).unwrap();
    let mut reader = BufReader::new(s);
    for (id, out) in [(2, "slow\n"), (3, "quick\n")] {
        let (status, answer) = read_answer(&mut reader);
        assert_eq!((status, answer["id"].as_i64()), (200, Some(id)), "{answer}");
        assert_eq!(answer["result"]["structuredContent"]["stdout"], out, "{answer}");
    }
    // A call of 2 s, and a stream behind it on the same connection.
    let mut s = TcpStream::connect(h.addr).unwrap();
    s.set_read_timeout(Some(TIMEOUT)).unwrap();
    s.write_all(format!("{}{}", run(4, "sleep 2; echo done"), raw_request("subscriptions/listen", None, &listen_body(5, "it"))).as_bytes())
        .unwrap();
    let mut stream = BufReader::new(s);
    let (status, answer) = read_answer(&mut stream);
    assert_eq!((status, answer["result"]["structuredContent"]["stdout"].as_str()), (200, Some("done\n")), "{answer}");
    assert_eq!(next_event(&mut stream)["method"], "notifications/subscriptions/acknowledged");
    still_open_after_three_stall_times(&mut h, &mut stream, 5);
}

/// Streams are shared between clients: one that holds its share is refused one more (saying
/// so), while another client, declaring another clientInfo from the same address, still opens
/// one and its tool calls are answered at once.
#[test]
fn http_subscriptions_are_shared_between_clients() {
    let home = Home::new("modern-listen-share");
    let h = Http::start(&home, &[], &[]);
    let created = h.post(&headers("tools/call", Some("create_sandbox")), &call_body(1, "create_sandbox", json!({"timeout": 120})));
    let sandbox = created.json()["result"]["structuredContent"]["sandbox_id"].as_str().unwrap().to_string();
    let mut greedy = Vec::new();
    for i in 0..MAX_HTTP_SUBSCRIPTIONS_PER_CLIENT as i64 {
        let mut reader = open_listen_as(&h, 10 + i, "greedy");
        assert_eq!(next_event(&mut reader)["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], 10 + i);
        greedy.push(reader);
    }
    let over = h.post(&headers("subscriptions/listen", None), &listen_body(20, "greedy"));
    assert_eq!((over.status, error_code(&over.json()), over.json()["id"].as_i64()), (503, -32000, Some(20)), "{}", over.body);
    let message = over.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(message.contains(&format!("already holds {MAX_HTTP_SUBSCRIPTIONS_PER_CLIENT} subscriptions/listen streams")), "{message}");
    assert!(message.contains("close one"), "{message}");
    assert_eq!(over.header("retry-after"), Some("5"));
    // Another client still opens a stream, and its calls are served at once.
    let mut other = open_listen_as(&h, 30, "other");
    assert_eq!(next_event(&mut other)["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], 30);
    let began = Instant::now();
    let ran = h.post(
        &headers("tools/call", Some("run_command")),
        &call_body(31, "run_command", json!({"sandbox_id": sandbox, "command": "true"})),
    );
    let took = began.elapsed();
    assert_eq!(ran.status, 200, "{}", ran.body);
    assert_eq!(ran.json()["result"]["structuredContent"]["exit_code"], 0, "{}", ran.body);
    assert!(took < std::time::Duration::from_secs(5), "run_command took {took:?} beside the held streams");
    drop((greedy, other));
    assert_eq!(h.stop().code(), Some(0));
}

/// A request that declares the tasks extension.
fn tasks_request(id: i64, method: &str, params: Value) -> Value {
    let mut b = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    b["params"]["_meta"] = envelope();
    b["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"] = json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    b
}

/// What a task writes for the notifications below: 1 MiB of control bytes per stream (a 26 MB
/// notification once escaped, charged about 52 MB of the answer budget), then a pause so that
/// it goes on as a task.
const CONTROL_BYTES: &str = "head -c 1048576 /dev/zero | tr '\\0' '\\1'; head -c 1048576 /dev/zero | tr '\\0' '\\2' >&2; sleep 2";

/// Starts `n` tasks running [`CONTROL_BYTES`] in a new sandbox as 2026 protocol tasks, and waits
/// for their end; their task ids.
fn control_byte_tasks(h: &Http, n: i64) -> Vec<String> {
    let created = h.post(&headers("tools/call", Some("create_sandbox")), &call_body(1, "create_sandbox", json!({}))).json();
    let sb = created["result"]["structuredContent"]["sandbox_id"].as_str().unwrap_or_else(|| panic!("{created}")).to_string();
    let ids: Vec<String> = (0..n)
        .map(|i| {
            let call = json!({"name": "run_command", "arguments": {"sandbox_id": sb, "command": CONTROL_BYTES}});
            let r = h.post(&headers("tools/call", Some("run_command")), &tasks_request(10 + i, "tools/call", call).to_string()).json();
            r["result"]["taskId"].as_str().unwrap_or_else(|| panic!("not a task: {r}")).to_string()
        })
        .collect();
    // Read with list_tasks: a completed task's tasks/get holds its whole result.
    wait_for(std::time::Duration::from_secs(60), "the tasks to end", || {
        let r = h.post(&headers("tools/call", Some("list_tasks")), &call_body(2, "list_tasks", json!({"sandbox_id": sb}))).json();
        let tasks = r["result"]["structuredContent"]["tasks"].as_array().cloned().unwrap_or_default();
        (tasks.len() == ids.len() && tasks.iter().all(|t| t["exit_code"] == 0)).then_some(())
    });
    ids
}

/// Opens subscription `id` of client `client` following `ids`; its answer is not read.
fn task_stream(h: &Http, id: i64, client: &str, ids: &[String]) -> TcpStream {
    let mut b = tasks_request(id, "subscriptions/listen", json!({"notifications": {"taskIds": ids}}));
    b["params"]["_meta"]["io.modelcontextprotocol/clientInfo"]["name"] = json!(client);
    let b = b.to_string();
    let mut s = TcpStream::connect(h.addr).unwrap();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
MCP-Protocol-Version: {V}\r\nMcp-Method: subscriptions/listen\r\nContent-Length: {}\r\n\r\n{b}",
        b.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s
}

/// Opens a [`task_stream`] per client name that is never read, and waits until each has more
/// than its acknowledgement waiting: a notification is on its way, holding its charge.
fn unread_task_streams(h: &Http, clients: &[String], ids: &[String]) -> Vec<TcpStream> {
    let streams: Vec<TcpStream> = clients
        .iter()
        .enumerate()
        .map(|(j, client)| {
            let s = task_stream(h, 1000 + j as i64, client, ids);
            s.set_nonblocking(true).unwrap();
            s
        })
        .collect();
    let mut buf = vec![0u8; 128 * 1024];
    wait_for(std::time::Duration::from_secs(60), "a notification on every stream", || {
        streams.iter().all(|s| s.peek(&mut buf).is_ok_and(|n| n >= 64 * 1024)).then_some(())
    });
    streams
}

/// A task's notification carries its result inline once it completed, and takes its share of
/// the answer budget until its stream has written it. Four streams that never read, each
/// following sixteen completed tasks whose logs are 1 MiB of control bytes per stream (a 26 MB
/// notification each), took the server to 1.8 GiB: no notification was charged, and each went
/// into its stream's queue at once. Each stream still gets its notifications, and the peak stays
/// near the budget.
#[test]
fn notifications_nobody_reads_stay_within_the_answer_budget() {
    let home = Home::new("modern-unread-notifications");
    let h = Http::start(&home, &[], &[("SANDBOX_MCP_TASK_AFTER", "1")]);
    let pid = h.child.id();
    let ids = control_byte_tasks(&h, 16);
    let before = peak_kib(pid) >> 10;
    let clients: Vec<String> = (0..4).map(|j| format!("unread-{j}")).collect();
    let streams = unread_task_streams(&h, &clients, &ids);
    let peak = peak_kib(pid) >> 10;
    eprintln!("peak RSS {before} MiB before the streams, {peak} MiB with four unread streams of sixteen 26 MB notifications each");
    assert!(peak <= 450, "the server peaked at {peak} MiB with four unread streams");
    // A notification that was sent is whole: the first one of the first stream.
    let mut first = BufReader::new(streams.into_iter().next().unwrap());
    first.get_ref().set_nonblocking(false).unwrap();
    first.get_ref().set_read_timeout(Some(TIMEOUT)).unwrap();
    let ack = next_event(&mut first);
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged", "{ack}");
    let note = next_event(&mut first);
    assert_eq!(
        note["params"]["result"]["structuredContent"]["stdout_bytes"],
        1_048_576,
        "{}",
        note.to_string().chars().take(400).collect::<String>()
    );
}

/// A task's end is pushed once, so a notification that finds no room in the answer budget is
/// not held back for good: once it has found none for as long as a call waits for room, it goes
/// with its output cut to what needs none. Twelve streams that never read follow one task whose
/// notification is 27 MB: eight took the budget's room, and the other four got their
/// acknowledgement and then nothing, for as long as the eight held theirs.
#[test]
fn a_task_end_without_room_is_pushed_with_its_output_cut() {
    let home = Home::new("modern-cut-notification");
    let h = Http::start(&home, &[], &[("SANDBOX_MCP_TASK_AFTER", "1")]);
    let ids = control_byte_tasks(&h, 1);
    let clients: Vec<String> = (0..12).map(|j| format!("unread-{j}")).collect();
    let started = Instant::now();
    let streams = unread_task_streams(&h, &clients, &ids);
    eprintln!("a notification was on its way on every stream after {:?}", started.elapsed());
    let mut cut = 0;
    for stream in streams {
        let mut stream = BufReader::new(stream);
        stream.get_ref().set_nonblocking(false).unwrap();
        stream.get_ref().set_read_timeout(Some(TIMEOUT)).unwrap();
        let ack = next_event(&mut stream);
        assert_eq!(ack["method"], "notifications/subscriptions/acknowledged", "{ack}");
        let note = next_event(&mut stream);
        let text = || note.to_string().chars().take(600).collect::<String>();
        assert_eq!(
            (note["method"].as_str(), note["params"]["status"].as_str()),
            (Some("notifications/tasks"), Some("completed")),
            "{}",
            text()
        );
        let sc = &note["params"]["result"]["structuredContent"];
        assert_eq!((sc["exit_code"].as_i64(), sc["stdout_bytes"].as_i64()), (Some(0), Some(1_048_576)), "{}", text());
        if sc["stdout_truncated"] == false {
            assert_eq!(sc["stdout"].as_str().map(str::len), Some(1_048_576), "a whole notification has the whole output");
            continue;
        }
        cut += 1;
        assert_eq!(sc["stderr_truncated"], true, "{}", text());
        let kept = sc["stdout"].as_str().unwrap_or_default().len();
        assert!((1..=17_000).contains(&kept), "{kept} bytes of stdout kept: {}", text());
        let warning = sc["warning"].as_str().unwrap_or_default();
        assert!(warning.contains("no room") && warning.contains(&format!("tasks/get with taskId {}", ids[0])), "{}", text());
    }
    eprintln!("{cut} of 12 notifications were cut");
    assert!(cut >= 1, "12 notifications of 27 MB cannot all have room in the answer budget");
}

/// A subscriber behind in reading its own stream only waits for its notifications: they are not
/// cut. One subscription following two tasks whose notifications are 27 MB each has room for
/// one at a time (its share of the answer budget); the second waits until the client has read
/// the first. It was cut when the client took longer than 5 s to read the first.
#[test]
fn a_subscriber_behind_on_its_own_stream_gets_its_results_whole() {
    let home = Home::new("modern-behind");
    let h = Http::start(&home, &[], &[("SANDBOX_MCP_TASK_AFTER", "1")]);
    let ids = control_byte_tasks(&h, 2);
    let stream = task_stream(&h, 3000, "behind", &ids);
    // The client under test: it reads nothing for longer than an answer waits for room.
    std::thread::sleep(sandbox_mcp::limits::ANSWER_WAIT + std::time::Duration::from_secs(3));
    let mut stream = BufReader::new(stream);
    stream.get_ref().set_read_timeout(Some(TIMEOUT)).unwrap();
    let ack = next_event(&mut stream);
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged", "{ack}");
    let mut seen = Vec::new();
    for _ in 0..2 {
        let note = next_event(&mut stream);
        let sc = &note["params"]["result"]["structuredContent"];
        assert_eq!(
            (sc["stdout_truncated"].as_bool(), sc["stdout"].as_str().map(str::len)),
            (Some(false), Some(1_048_576)),
            "a notification was cut: {}",
            note.to_string().chars().take(600).collect::<String>()
        );
        seen.push(note["params"]["taskId"].as_str().unwrap_or_default().to_string());
    }
    seen.sort();
    let mut want = ids.clone();
    want.sort();
    assert_eq!(seen, want);
}
