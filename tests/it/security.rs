//! The guarantees listed in SECURITY.md, one test (or more) each. Tests that already exist
//! elsewhere are referenced there rather than repeated here: the bearer token and its masking
//! (`http::the_bearer_token_is_required_when_configured`), 404 after DELETE and Origin/Host 403s
//! (`http::sessions_status_codes_and_keep_alive`, `http::bodies_over_4_mib_get_413_and_bad_hosts_403`),
//! basic path confinement (`tools::files_round_trip_and_stay_inside_the_sandbox`,
//! `tools::file_tools_refuse_fifos_and_write_through_symlinks`), task id validation
//! (`tasks::bad_task_arguments_are_refused_before_contacting_the_sandbox`) and masking
//! (`tools::secret_named_variables_are_masked_in_command_output`, `tasks::shell_scenarios`).

use crate::support::*;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

const PING: &str = r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#;

/// A distinct secret-looking value (long enough to be masked).
fn secret(label: &str) -> String {
    format!("{label}-{}", sandbox_mcp::ids::random_hex(8))
}

/// initialize with these extra headers; the new session id.
fn init(h: &Http, headers: &[(&str, &str)]) -> String {
    let r = h.post(headers, INITIALIZE);
    assert_eq!(r.status, 200, "{}", r.body);
    r.header("mcp-session-id").expect("a session id").to_string()
}

/// A tools/call in a session, with extra headers; the `CallToolResult`.
fn call(h: &Http, headers: &[(&str, &str)], sid: &str, tool: &str, args: Value) -> Value {
    let mut all = headers.to_vec();
    all.push(("Mcp-Session-Id", sid));
    let body = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": tool, "arguments": args}});
    let r = h.post(&all, &body.to_string());
    assert_eq!(r.status, 200, "{tool}: {}", r.body);
    r.json()["result"].clone()
}

fn ok(h: &Http, headers: &[(&str, &str)], sid: &str, tool: &str, args: Value) -> Value {
    let r = call(h, headers, sid, tool, args.clone());
    assert_eq!(r["isError"], false, "{tool} {args}: {r}");
    r["structuredContent"].clone()
}

fn err(h: &Http, headers: &[(&str, &str)], sid: &str, tool: &str, args: Value) -> String {
    let r = call(h, headers, sid, tool, args.clone());
    assert_eq!(r["isError"], true, "{tool} {args} should fail: {r}");
    r["content"][0]["text"].as_str().unwrap().to_string()
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).permissions().mode() & 0o777
}

// ---------------------------------------------------------------------------------------------
// HTTP: bearer token, Origin and Host
// ---------------------------------------------------------------------------------------------

/// The token guards every route and method, is compared whole (no prefix, extension or
/// repetition of it passes), is only accepted in the Authorization header, and is never echoed.
#[test]
fn the_bearer_token_is_compared_whole_on_every_route() {
    let home = Home::new("sec-token");
    let token = secret("http-token");
    let h = Http::start(&home, &[], &[("SANDBOX_MCP_HTTP_TOKEN", &token)]);
    let good = format!("Bearer {token}");
    let sid = init(&h, &[("Authorization", &good)]);
    let wrong = [
        String::new(),
        "Bearer ".to_string(),
        format!("Bearer {}", &token[..token.len() - 1]),
        format!("Bearer {token}x"),
        format!("Bearer {token}{token}"),
        format!("Basic {token}"),
        token.clone(),
        format!("Bearer {}", token.to_uppercase()),
    ];
    for auth in &wrong {
        let mut headers = vec![("Mcp-Session-Id", sid.as_str())];
        if !auth.is_empty() {
            headers.push(("Authorization", auth.as_str()));
        }
        for (method, path, body) in
            [("POST", "/mcp", INITIALIZE), ("POST", "/mcp", PING), ("DELETE", "/mcp", ""), ("GET", "/mcp", ""), ("GET", "/healthz", "")]
        {
            let mut conn = Conn::open(h.addr);
            conn.send(method, path, &headers, body.as_bytes());
            let r = conn.read();
            assert_eq!(r.status, 401, "{method} {path} with {auth:?}: {}", r.body);
            assert!(r.header("mcp-session-id").is_none(), "no session for an unauthenticated initialize");
            assert!(!r.body.contains(&token), "a 401 never echoes the token: {}", r.body);
        }
    }
    // Not in the query string either.
    let mut conn = Conn::open(h.addr);
    conn.send("POST", &format!("/mcp?token={token}&access_token={token}"), &[("Mcp-Session-Id", &sid)], PING.as_bytes());
    assert_eq!(conn.read().status, 401);
    // The rejected DELETEs did not end the session.
    assert_eq!(h.post(&[("Authorization", &good), ("Mcp-Session-Id", &sid)], PING).status, 200);
}

/// Browsers (and DNS rebinding) are stopped by Origin, and by Host on a loopback listener,
/// before the token and before any session exists; a forged DELETE cannot end a session.
#[test]
fn origin_and_host_checks_stop_browsers_and_dns_rebinding() {
    let home = Home::new("sec-origin");
    let token = secret("http-token");
    let h = Http::start(&home, &[], &[("SANDBOX_MCP_HTTP_TOKEN", &token)]);
    let auth = format!("Bearer {token}");
    let sid = init(&h, &[("Authorization", &auth)]);
    let port = h.addr.port().to_string();
    for origin in [
        "http://evil.example",
        "https://localhost.evil.example",
        "http://127.0.0.1.nip.io",
        "http://127.0.0.2:3000",
        "http://[::2]:80",
        "null",
        "file://",
        "localhost",
    ] {
        // With a valid token too: the Origin check comes first.
        let r = h.post(&[("Authorization", &auth), ("Origin", origin)], INITIALIZE);
        assert_eq!(r.status, 403, "{origin}");
        assert!(r.header("mcp-session-id").is_none(), "{origin}: no session minted");
        let mut conn = Conn::open(h.addr);
        conn.send("DELETE", "/mcp", &[("Authorization", &auth), ("Origin", origin), ("Mcp-Session-Id", &sid)], b"");
        assert_eq!(conn.read().status, 403, "{origin}");
    }
    for host in ["evil.example", &format!("evil.example:{port}"), &format!("localhost.evil.example:{port}"), "127.0.0.1.nip.io", "10.0.0.1"]
    {
        let r = h.post(&[("Authorization", &auth), ("Host", host), ("Mcp-Session-Id", &sid)], PING);
        assert_eq!(r.status, 403, "Host {host}");
    }
    assert_eq!(h.post(&[("Authorization", &auth), ("Mcp-Session-Id", &sid)], PING).status, 200, "forged DELETEs changed nothing");
    for origin in ["http://localhost:6274", "http://127.0.0.1:3000", "https://[::1]:8080", "http://LOCALHOST"] {
        let r = h.post(&[("Authorization", &auth), ("Origin", origin), ("Mcp-Session-Id", &sid)], PING);
        assert_eq!(r.status, 200, "{origin}");
    }
    for host in [format!("localhost:{port}"), format!("127.0.0.1:{port}"), format!("[::1]:{port}")] {
        let r = h.post(&[("Authorization", &auth), ("Host", &host), ("Mcp-Session-Id", &sid)], PING);
        assert_eq!(r.status, 200, "Host {host}");
    }
}

// ---------------------------------------------------------------------------------------------
// HTTP sessions
// ---------------------------------------------------------------------------------------------

/// Session ids are 128 random bits (32 lowercase hex), minted only by the server, never the
/// client's choice, and dead for good after DELETE (an initialize that presents a dead id gets a
/// new one).
#[test]
fn session_ids_are_random_server_minted_and_dead_after_delete() {
    let home = Home::new("sec-sessions");
    let h = Http::start(&home, &[], &[]);
    let mut seen = HashSet::new();
    let mut digits = HashSet::new();
    for _ in 0..64 {
        let sid = init(&h, &[]);
        assert_eq!(sid.len(), 32, "{sid}");
        assert!(sid.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)), "{sid}");
        digits.extend(sid.bytes());
        assert!(seen.insert(sid), "a session id was issued twice");
    }
    assert_eq!(digits.len(), 16, "ids use every hex digit");
    let dead = init(&h, &[]);
    assert!(seen.insert(dead.clone()));
    let mut conn = Conn::open(h.addr);
    conn.send("DELETE", "/mcp", &[("Mcp-Session-Id", &dead)], b"");
    assert_eq!(conn.read().status, 200);
    conn.send("DELETE", "/mcp", &[("Mcp-Session-Id", &dead)], b"");
    assert_eq!(conn.read().status, 404, "a second DELETE finds nothing");
    conn.send("POST", "/mcp", &[("Mcp-Session-Id", &dead)], PING.as_bytes());
    assert_eq!(conn.read().status, 404);
    let body = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "create_sandbox", "arguments": {}}});
    conn.send("POST", "/mcp", &[("Mcp-Session-Id", &dead)], body.to_string().as_bytes());
    assert_eq!(conn.read().status, 404, "a dead session cannot call tools");
    // Presenting the dead id (or one of the client's choosing) with initialize mints a new one.
    for presented in [dead.as_str(), "0123456789abcdef0123456789abcdef"] {
        let r = h.post(&[("Mcp-Session-Id", presented)], INITIALIZE);
        let fresh = r.header("mcp-session-id").unwrap().to_string();
        assert_ne!(fresh, presented);
        assert!(!seen.contains(&fresh));
        assert_eq!(h.post(&[("Mcp-Session-Id", presented)], PING).status, 404, "{presented} stays unknown");
    }
}

/// Session B never falls back to session A's default sandbox, and ending B never kills A's
/// sandboxes. Naming A's sandbox_id explicitly works (docs/contract.md, "Sessions and sandbox lifetime"): the id is the capability.
#[test]
fn a_session_cannot_use_another_sessions_default_sandbox() {
    let home = Home::new("sec-default");
    let h = Http::start(&home, &[], &[]);
    let a = init(&h, &[]);
    let b = init(&h, &[]);
    let sb_a = ok(&h, &[], &a, "create_sandbox", json!({}))["sandbox_id"].as_str().unwrap().to_string();
    for (tool, args) in [
        ("run_command", json!({"command": "echo $SANDBOX_MCP_SANDBOX"})),
        ("read_file", json!({"path": "x"})),
        ("write_file", json!({"path": "x", "content": "y"})),
        ("list_files", json!({"path": "."})),
        ("start_task", json!({"command": "true"})),
        ("list_tasks", json!({})),
    ] {
        let e = err(&h, &[], &b, tool, args);
        assert!(e.contains("no default sandbox"), "{tool}: {e}");
    }
    let sb_b = ok(&h, &[], &b, "create_sandbox", json!({}))["sandbox_id"].as_str().unwrap().to_string();
    assert_ne!(sb_a, sb_b);
    let tag = |sid: &str| ok(&h, &[], sid, "run_command", json!({"command": "echo $SANDBOX_MCP_SANDBOX"}))["stdout"].clone();
    assert_eq!(tag(&b), format!("{sb_b}\n"));
    assert_eq!(tag(&a), format!("{sb_a}\n"), "B's create did not change A's default");
    // The documented capability: any session may use a sandbox id it knows.
    let out = ok(&h, &[], &b, "run_command", json!({"sandbox_id": sb_a, "command": "echo reached"}));
    assert_eq!(out["stdout"], "reached\n");
    let mut conn = Conn::open(h.addr);
    conn.send("DELETE", "/mcp", &[("Mcp-Session-Id", &b)], b"");
    assert_eq!(conn.read().status, 200);
    assert!(!home.sandbox_dir(&sb_b).exists(), "B's own sandbox ended with B");
    assert!(home.sandbox_dir(&sb_a).exists(), "a sandbox B only used by id is not B's to kill");
    assert_eq!(tag(&a), format!("{sb_a}\n"));
}

// ---------------------------------------------------------------------------------------------
// Local sandboxes: file tools, ids
// ---------------------------------------------------------------------------------------------

/// No `..`, absolute path or symlink takes a file tool out of the sandbox home: not to the
/// sandbox's own metadata (which holds its envs), not into another sandbox, not to the host.
#[test]
fn file_tools_cannot_escape_an_unisolated_local_sandbox() {
    // With isolation, file tools resolve paths inside the sandbox's own root: tests/it/isolation.rs.
    let home = Home::unisolated("sec-paths");
    let mut m = home.stdio();
    let other = m.create();
    m.ok("write_file", json!({"sandbox_id": other, "path": "private.txt", "content": "other sandbox"}));
    let sb = m.create();
    let my_home = home.sandbox_dir(&sb).join("home");
    let other_home = home.sandbox_dir(&other).join("home");
    let outside = std::env::temp_dir().join(format!("smcp-escape-{}", sandbox_mcp::ids::random_hex(6)));
    let setup = format!(
        "ln -s .. up && ln -s /etc/passwd host && ln -s {o} other && ln -s {x} dangling && mkdir -p inner && ln -s ../inner inner/self",
        o = other_home.display(),
        x = outside.display()
    );
    assert_eq!(m.ok("run_command", json!({"command": setup}))["exit_code"], 0);
    let refused = |text: &str| text.contains("outside the sandbox") || text.contains("non-empty");
    for path in [
        "../meta.json".to_string(),
        format!("{}/../meta.json", my_home.display()),
        format!("{}/meta.json", home.sandbox_dir(&sb).display()),
        "up/meta.json".to_string(),
        "inner/../../meta.json".to_string(),
        "host".to_string(),
        "/etc/passwd".to_string(),
        "other/private.txt".to_string(),
        format!("{}/private.txt", other_home.display()),
        format!("../../{other}/home/private.txt"),
        "/proc/self/root/etc/passwd".to_string(),
        "nul\0byte".to_string(),
    ] {
        let e = m.err("read_file", json!({"path": path}));
        assert!(refused(&e), "read_file {path:?}: {e}");
    }
    for path in ["up", "other", "..", "/", "/etc"] {
        let e = m.err("list_files", json!({"path": path}));
        assert!(refused(&e), "list_files {path:?}: {e}");
    }
    for path in ["up/planted", "other/planted", "../planted", "/tmp/planted-by-sandbox-mcp-test"] {
        let e = m.err("write_file", json!({"path": path, "content": "x"}));
        assert!(refused(&e), "write_file {path:?}: {e}");
    }
    // A dangling symlink, as the file or as a parent to create: refused, and nothing appears.
    assert!(m.err("write_file", json!({"path": "dangling", "content": "x"})).contains("symbolic link"));
    m.err("write_file", json!({"path": "dangling/sub/file", "content": "x"}));
    assert!(!outside.exists(), "write_file created {} outside the sandbox", outside.display());
    assert!(!home.sandbox_dir(&sb).join("planted").exists() && !other_home.join("planted").exists());
    // Links that stay inside keep working.
    assert_eq!(m.ok("write_file", json!({"path": "inner/self/f", "content": "in"}))["bytes_written"], 2);
    assert_eq!(m.ok("read_file", json!({"path": "inner/f"}))["content"], "in");
    let names: Vec<String> = m.ok("list_files", json!({"path": "."}))["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap().into())
        .collect();
    assert!(!names.iter().any(|n| n == "meta.json" || n == "keeper.pid"), "{names:?}");
}

/// Malformed sandbox ids are refused before any path is built from them: a look-alike sandbox
/// planted outside `sandboxes/` is never read, written or removed.
#[test]
fn malformed_sandbox_ids_never_become_paths() {
    let home = Home::new("sec-ids");
    let mut m = home.stdio();
    m.create();
    let decoy = home.path.join("decoy");
    std::fs::create_dir_all(decoy.join("home")).unwrap();
    std::fs::write(
        decoy.join("meta.json"),
        r#"{"sandbox_id":"decoy","template":"base","created_at":0,"timeout":600,"expires_at":99999999999}"#,
    )
    .unwrap();
    std::fs::write(decoy.join("home/secret.txt"), "decoy").unwrap();
    let task = "0123456789abcdef0123456789abcdef";
    for id in [
        "../decoy",
        "../../decoy",
        "local-../../decoy",
        "local-0123456789abcdef0123456/..",
        "local-0123456789abcdef01234567/../../decoy",
        "LOCAL-0123456789ABCDEF01234567",
        "",
        "/tmp",
        "local-0123456789abcdef01234567\0",
    ] {
        for (tool, args) in [
            ("read_file", json!({"sandbox_id": id, "path": "secret.txt"})),
            ("write_file", json!({"sandbox_id": id, "path": "planted", "content": "x"})),
            ("list_files", json!({"sandbox_id": id, "path": "."})),
            ("run_command", json!({"sandbox_id": id, "command": "touch planted"})),
            ("start_task", json!({"sandbox_id": id, "command": "touch planted"})),
            ("get_task", json!({"sandbox_id": id, "task_id": task})),
            ("delete_task", json!({"sandbox_id": id, "task_id": task})),
            ("list_tasks", json!({"sandbox_id": id})),
            ("kill_sandbox", json!({"sandbox_id": id})),
        ] {
            let e = m.err(tool, args);
            assert!(e.contains("invalid sandbox_id"), "{tool} {id:?}: {e}");
        }
    }
    assert!(decoy.join("meta.json").exists() && decoy.join("home/secret.txt").exists(), "the decoy was touched");
    assert!(!decoy.join("home/planted").exists());
}

/// On E2B, malformed sandbox ids and task ids are refused before any request leaves the server:
/// the platform (here the emulator) sees nothing, so no id ever reaches a URL or a shell.
#[test]
fn malformed_ids_never_reach_the_e2b_platform() {
    let e = E2bHome::new("sec-e2b-ids");
    let mut m = e.stdio();
    let sb = m.create();
    e.emulator.take_counts();
    let good_task = "0123456789abcdef0123456789abcdef";
    for id in ["../sandboxes", "a/b", "x?y=1", "a b", "a.b", "", "local-0123456789abcdef01234567"] {
        for (tool, args) in [
            ("run_command", json!({"sandbox_id": id, "command": "true"})),
            ("get_task", json!({"sandbox_id": id, "task_id": good_task})),
            ("kill_sandbox", json!({"sandbox_id": id})),
            ("read_file", json!({"sandbox_id": id, "path": "x"})),
        ] {
            let err = m.err(tool, args);
            assert!(err.contains("invalid sandbox_id"), "{tool} {id:?}: {err}");
        }
    }
    for task in
        ["$(touch /tmp/pwned)", "../../../../../../etc/passwd00", "0123456789ABCDEF0123456789ABCDEF", "0123456789abcdef0123456789abcde;"]
    {
        for tool in ["get_task", "cancel_task", "delete_task"] {
            let err = m.err(tool, json!({"sandbox_id": sb, "task_id": task}));
            assert!(err.contains("32 lowercase hex"), "{tool} {task:?}: {err}");
        }
    }
    let counts = e.emulator.take_counts();
    assert_eq!(counts["total"], 0, "requests reached the platform: {counts}");
}

// ---------------------------------------------------------------------------------------------
// Secrets
// ---------------------------------------------------------------------------------------------

/// Whether `secret` shows in `log`, also inside hex dumps of wire traffic: an HTTP client at trace
/// level prints 16 bytes per line (hex, then the bytes as text with `.` for the rest), which
/// cuts a value across lines.
fn leaks(log: &str, secret: &str) -> bool {
    if log.contains(secret) {
        return true;
    }
    let (mut text, mut hex) = (String::new(), String::new());
    for line in log.lines() {
        let msg = line.split_once("] ").map_or(line, |(_, m)| m);
        if msg.len() != 57 || !msg.is_ascii() {
            continue;
        }
        let (head, tail) = msg.split_at(41);
        let digits: String = head.chars().filter(|c| *c != ' ').collect();
        if digits.len() == 32 && digits.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            hex.push_str(&digits.replace('-', ""));
            text.push_str(tail);
        }
    }
    text.contains(secret) || hex.contains(&sandbox_mcp::ids::hex(secret.as_bytes()))
}

/// Runs commands, tasks and failing calls that carry secrets over HTTP, and checks every answer;
/// returns the secrets the caller must never find in the server's stderr.
fn exercise_secrets(h: &Http, token: &str, host_secrets: &[&str]) -> Vec<String> {
    let auth = format!("Bearer {token}");
    let hd = [("Authorization", auth.as_str())];
    let sid = init(h, &hd);
    let env_secret = secret("sandbox-env-secret");
    let call_secret = secret("call-env-secret");
    let sb = ok(h, &hd, &sid, "create_sandbox", json!({"envs": {"SERVICE_TOKEN": env_secret}}))["sandbox_id"].as_str().unwrap().to_string();
    let mut answers = Vec::new();
    // Command output: masked on both streams, also inside error messages the command prints.
    let out = ok(
        h,
        &hd,
        &sid,
        "run_command",
        json!({"command": "echo $SERVICE_TOKEN $CALL_SECRET; echo $CALL_SECRET >&2; cat /no/such/$SERVICE_TOKEN", "envs": {"CALL_SECRET": call_secret}}),
    );
    assert_eq!(out["stdout"], "*** ***\n", "{out}");
    assert!(out["stderr"].as_str().unwrap().starts_with("***\n"), "{out}");
    answers.push(out.to_string());
    // Task pages: masked on both streams.
    let s = ok(h, &hd, &sid, "start_task", json!({"command": "echo $SERVICE_TOKEN; echo $SERVICE_TOKEN >&2; exit 3"}));
    let task = s["task_id"].as_str().unwrap().to_string();
    let done = wait_for(TIMEOUT, "the task to finish", || {
        let s = ok(h, &hd, &sid, "get_task", json!({"sandbox_id": sb, "task_id": task}));
        (s["state"] != "running").then_some(s)
    });
    assert_eq!((done["state"].as_str(), done["stdout"].as_str(), done["stderr"].as_str()), (Some("failed"), Some("***\n"), Some("***\n")));
    answers.push(done.to_string());
    // Failing calls whose paths carry secrets: the server logs none of them, and host secrets are
    // masked in the error texts (a sandbox's own values are echoed back to the caller who sent
    // them, see SECURITY.md).
    for value in [env_secret.as_str(), call_secret.as_str()] {
        err(h, &hd, &sid, "read_file", json!({"path": format!("/no/such/{value}")}));
        err(h, &hd, &sid, "list_files", json!({"path": format!("/no/such/{value}")}));
        err(h, &hd, &sid, "run_command", json!({"command": "true", "cwd": format!("/no/such/{value}")}));
    }
    for value in host_secrets.iter().copied().chain([token]) {
        for (tool, args) in [
            ("read_file", json!({"path": format!("/no/such/{value}")})),
            ("write_file", json!({"path": format!("/proc/{value}/x"), "content": "x"})),
            ("list_files", json!({"path": format!("/no/such/{value}")})),
            ("run_command", json!({"command": "true", "cwd": format!("/no/such/{value}")})),
            ("start_task", json!({"command": "true", "cwd": format!("/no/such/{value}")})),
            ("get_task", json!({"sandbox_id": sb, "task_id": value})),
            ("run_command", json!({"sandbox_id": value, "command": "true"})),
        ] {
            let text = err(h, &hd, &sid, tool, args);
            assert!(!text.contains(value), "{tool}: a host secret in an error text: {text}");
            answers.push(text);
        }
    }
    for a in &answers {
        for s in host_secrets.iter().copied().chain([token, env_secret.as_str(), call_secret.as_str()]) {
            assert!(!a.contains(s), "a secret in an answer: {a}");
        }
    }
    vec![env_secret, call_secret, token.to_string()]
}

/// Regression: at RUST_LOG=trace the HTTP client hex-dumped every request to E2B (X-API-KEY,
/// X-Access-Token, tokens in bodies) and printed whole URLs (file paths a caller chose) to the
/// server's stderr. Now no secret reaches the logs at any level, on either provider.
#[test]
fn secrets_stay_out_of_trace_logs_pages_and_error_texts() {
    // Local provider.
    let home = Home::new("sec-trace-local");
    let token = secret("http-token");
    let h = Http::start(&home, &[], &[("RUST_LOG", "trace"), ("SANDBOX_MCP_HTTP_TOKEN", &token)]);
    let secrets = exercise_secrets(&h, &token, &[]);
    let log = h.stderr.lock().unwrap().clone();
    assert!(log.contains("TRACE") || log.contains("DEBUG"), "the server was not logging verbosely: {log}");
    for s in &secrets {
        assert!(!leaks(&log, s), "{s} is in the server's stderr");
    }
    drop(h);
    // E2B provider (through the emulator), where the HTTP client carries the API key and tokens.
    let e = E2bHome::new("sec-trace-e2b");
    let url = e.emulator.url();
    let token = secret("http-token");
    let h = Http::start(
        &e.home,
        &[],
        &[
            ("RUST_LOG", "trace"),
            ("SANDBOX_MCP_HTTP_TOKEN", &token),
            ("SANDBOX_MCP_PROVIDER", "e2b"),
            ("E2B_API_KEY", E2B_TEST_KEY),
            ("E2B_API_URL", &url),
            ("E2B_SANDBOX_URL", &url),
        ],
    );
    let mut secrets = exercise_secrets(&h, &token, &[E2B_TEST_KEY]);
    let (_, listed) = e.emulator.request("GET", "/_emulator/sandboxes", Value::Null);
    for sb in listed.as_array().unwrap() {
        let (_, detail) = e.emulator.request("GET", &format!("/sandboxes/{}", sb["sandboxID"].as_str().unwrap()), Value::Null);
        secrets.extend(detail["envdAccessToken"].as_str().map(str::to_string));
    }
    assert!(secrets.len() > 3, "no envd access token to look for");
    secrets.push(E2B_TEST_KEY.to_string());
    let log = h.stderr.lock().unwrap().clone();
    assert!(log.contains("ureq"), "the HTTP client was not logging: {log}");
    for s in &secrets {
        assert!(!leaks(&log, s), "{s} is in the server's stderr");
    }
}

/// The documented limit of the local provider without isolation (SECURITY.md): sandbox code runs
/// as the server's user and can read the server's own environment; masking hides the verbatim
/// value, nothing more. This test fails, and SECURITY.md must change, if that ever stops being
/// true. With isolation the server's processes are out of sight: tests/it/isolation.rs.
#[test]
fn unisolated_sandbox_code_can_read_the_servers_environment() {
    let home = Home::unisolated("sec-proc");
    let token = secret("host-token");
    let mut m = home.stdio_with(&[("SANDBOX_MCP_HTTP_TOKEN", &token)]);
    m.create();
    let server = m.client.pid();
    let env = format!("tr '\\0' '\\n' < /proc/{server}/environ | grep '^SANDBOX_MCP_HTTP_TOKEN='");
    let plain = m.ok("run_command", json!({"command": env}));
    assert_eq!(plain["stdout"], "SANDBOX_MCP_HTTP_TOKEN=***\n", "{plain}");
    let spaced = m.ok("run_command", json!({"command": format!("{env} | sed 's/./& /g'")}));
    let want: String = token.chars().map(|c| format!("{c} ")).collect();
    assert!(spaced["stdout"].as_str().unwrap().contains(&want), "{spaced}");
}

// ---------------------------------------------------------------------------------------------
// File modes
// ---------------------------------------------------------------------------------------------

/// Walks `dir` (not following symlinks, skipping what `skip` says) and returns every directory
/// that is not 0700 and every other entry with group or other bits set.
fn loose(dir: &Path, skip: &dyn Fn(&Path) -> bool) -> Vec<String> {
    let mut bad = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        if skip(&p) {
            continue;
        }
        let meta = std::fs::symlink_metadata(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        let ft = meta.file_type();
        if ft.is_symlink() {
            continue;
        }
        let m = meta.permissions().mode() & 0o777;
        if (ft.is_dir() && m != 0o700) || (!ft.is_dir() && m & 0o077 != 0) {
            bad.push(format!("{} {m:o}", p.display()));
        }
        if ft.is_dir() {
            for e in std::fs::read_dir(&p).unwrap().flatten() {
                stack.push(e.path());
            }
        }
    }
    bad
}

/// Regression: the keeper's pid file and the cancel marker were created with the umask's mode
/// (0644), and a state root that already existed kept its mode. Every file the server keeps
/// (metadata, keeper pid, task state, logs, FIFOs, markers) is now 0600 and every directory 0700.
#[test]
fn state_files_are_0600_and_directories_0700() {
    let home = Home::new("sec-modes");
    let sandboxes = home.path.join("sandboxes");
    std::fs::create_dir_all(&sandboxes).unwrap();
    std::fs::set_permissions(&sandboxes, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut m = home.stdio();
    assert_eq!(mode(&sandboxes), 0o700, "the state root is made private at start");
    let sb = m.ok("create_sandbox", json!({"envs": {"API_KEY": "in-the-metadata"}}))["sandbox_id"].as_str().unwrap().to_string();
    let dir = home.sandbox_dir(&sb);
    wait_for(TIMEOUT, "the keeper's pid file", || dir.join("keeper.pid").exists().then_some(()));
    m.ok("run_command", json!({"command": "true"})); // a renewal rewrites the metadata
    let quick = m.ok("start_task", json!({"command": "echo out; echo err >&2"}))["task_id"].as_str().unwrap().to_string();
    let long = m.ok("start_task", json!({"command": "sleep 30"}))["task_id"].as_str().unwrap().to_string();
    assert_eq!(m.ok("cancel_task", json!({"sandbox_id": sb, "task_id": long}))["state"], "cancelled");
    wait_for(TIMEOUT, "the quick task to finish", || {
        (m.ok("get_task", json!({"sandbox_id": sb, "task_id": quick}))["state"] == "succeeded").then_some(())
    });
    let tasks = dir.join("home/.sandbox-mcp/tasks");
    assert!(tasks.join(&long).join("cancel").exists(), "the cancel marker is there to check");
    let home_dir = dir.join("home");
    // The overlay's kernel code makes its own directory in the work layer, of mode 0.
    let kernels = dir.join("work/work");
    let bad = loose(&home.path.join("sandboxes"), &|p: &Path| {
        (p.starts_with(&home_dir) && p != home_dir && !p.starts_with(home_dir.join(".sandbox-mcp")))
            || (p == kernels && mode(p) == 0)
            || p == dir
    });
    assert!(bad.is_empty(), "not private: {bad:#?}");
    for (p, want) in [(home_dir.clone(), 0o700), (dir.join("meta.json"), 0o600), (dir.join("keeper.pid"), 0o600)] {
        assert_eq!(mode(&p), want, "{}", p.display());
    }
    // The sandbox's directory: 0700, or under a root server 0710 for the sandbox's own gid alone,
    // whose init passes it to mount its home.
    let meta = std::fs::metadata(&dir).unwrap();
    let shared = std::os::unix::fs::MetadataExt::gid(&meta) == std::os::unix::fs::MetadataExt::gid(&std::fs::metadata(&home_dir).unwrap());
    match mode(&dir) {
        0o700 => {}
        0o710 if shared && std::os::unix::fs::MetadataExt::gid(&meta) != 0 => {}
        other => panic!("{}: mode {other:o}, group {}", dir.display(), std::os::unix::fs::MetadataExt::gid(&meta)),
    }
    m.close();
}

/// The cap on live sandboxes: beyond `--max-sandboxes` a create is refused with a message naming
/// the cap and kill_sandbox, and nothing is left behind; ending one makes room again.
#[test]
fn live_sandboxes_are_capped() {
    let home = Home::new("sec-cap");
    let mut m = home.stdio_with(&[("SANDBOX_MCP_MAX_SANDBOXES", "2")]);
    let a = m.create();
    m.create();
    let refused = m.err("create_sandbox", json!({}));
    assert!(refused.contains("at most 2 live sandboxes") && refused.contains("kill_sandbox"), "{refused}");
    let dirs = std::fs::read_dir(home.path.join("sandboxes"))
        .unwrap()
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .count();
    assert_eq!(dirs, 2, "a refused create left something behind");
    assert_eq!(m.ok("kill_sandbox", json!({"sandbox_id": a}))["killed"], true);
    m.create();
}
