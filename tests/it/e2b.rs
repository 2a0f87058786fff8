//! The e2b provider against the E2B emulator: the tools, tasks across server processes, cancel,
//! masking and paging, plus faults (a Start stream dropped mid-way, 502s, expiry, pausing) and the
//! number of HTTP round trips each tool makes. The tools, the walkthrough and pausing run twice:
//! on an emulator whose local sandboxes are unisolated, and on one that isolates them with
//! namespaces (skipped, saying why, where the host does not allow namespaces).

use crate::support::*;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::Command;
use std::time::{Duration, Instant};

fn finish(m: &mut Mcp, sb: &str, task: &str) -> Value {
    wait_for(Duration::from_secs(30), "the task to finish", || {
        let s = m.ok("get_task", json!({"sandbox_id": sb, "task_id": task}));
        (s["state"] != "running").then_some(s)
    })
}

fn route_count(counts: &Value, route: &str) -> i64 {
    counts["routes"][route].as_i64().unwrap_or(0)
}

/// The server against an emulator whose sandboxes are isolated with namespaces, or `None` (after
/// saying why) when this host cannot isolate sandboxes.
pub(crate) fn isolated_e2b(name: &str) -> Option<E2bHome> {
    if let Err(why) = sandbox_mcp::provider::local::isolation::probe() {
        eprintln!("skipped: the emulator cannot isolate sandboxes with namespaces on this host: {why}");
        return None;
    }
    Some(E2bHome { emulator: Emulator::start_with_isolation("namespaces"), home: Home::new(name) })
}

#[test]
fn tools_work_on_e2b() {
    tools(&E2bHome::new("e2b-tools"));
}

#[test]
fn tools_work_on_e2b_with_isolated_emulator_sandboxes() {
    if let Some(e) = isolated_e2b("e2b-tools-iso") {
        tools(&e);
        // Paths are the sandbox's own: its home is /home/user, and its root is not the host's.
        let mut m = e.stdio();
        m.create();
        let out = m.ok("run_command", json!({"command": "pwd; echo $HOME; id -u; test -e /etc/shadow || echo no-shadow"}));
        assert_eq!(out["stdout"], "/home/user\n/home/user\n0\nno-shadow\n", "{out}");
        assert_eq!(m.ok("write_file", json!({"path": "/tmp/t.txt", "content": "t"}))["bytes_written"], 1);
        assert_eq!(
            m.ok("run_command", json!({"command": "cat /tmp/t.txt; ls -ln /tmp/t.txt | cut -d' ' -f3", "cwd": "/tmp"}))["stdout"],
            "t0\n"
        );
        assert!(m.err("read_file", json!({"path": "/tmp/no-such-file"})).contains("does not exist"));
        // A link to an absolute path leads into the sandbox's root, never the host's.
        m.ok("run_command", json!({"command": "echo inside > /tmp/mark; ln -s /tmp/mark home-link; ln -s /etc etc-link"}));
        assert_eq!(m.ok("read_file", json!({"path": "home-link"}))["content"], "inside\n");
        assert!(m.ok("read_file", json!({"path": "etc-link/passwd"}))["content"]
            .as_str()
            .unwrap()
            .starts_with("root:x:0:0:root:/home/user:"));
        // A command stopped at its timeout is the program inside, not just the nsenter before it.
        assert_eq!(m.ok("run_command", json!({"command": "sleep 37", "timeout": 1}))["timed_out"], true);
        let listing = r"for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline; echo; done";
        wait_for(Duration::from_secs(10), "the timed-out command to end inside the sandbox", || {
            let out = m.ok("run_command", json!({ "command": listing }));
            (!out["stdout"].as_str().unwrap_or("").contains("sleep 37")).then_some(())
        });
    }
}

fn tools(e: &E2bHome) {
    let mut m = e.stdio();
    let created = m.ok("create_sandbox", json!({"timeout": 120, "envs": {"SERVICE_TOKEN": "tok-123456789", "PLAIN": "plain"}}));
    assert_eq!(created["provider"], "e2b");
    let sb = created["sandbox_id"].as_str().unwrap().to_string();
    assert!(!sb.starts_with("local-"));
    let out = m.ok("run_command", json!({"command": "echo $PLAIN $SERVICE_TOKEN $CALL; echo err >&2; exit 5", "envs": {"CALL": "c"}}));
    assert_eq!(
        (out["exit_code"].as_i64(), out["stdout"].as_str(), out["stderr"].as_str()),
        (Some(5), Some("plain *** c\n"), Some("err\n"))
    );
    let out = m.ok("run_command", json!({"command": "sleep 30", "timeout": 1}));
    assert_eq!(out["timed_out"], true);
    // Commands run with bash, as on the local provider: one meaning per command.
    assert!(created["shell"].as_str().is_some_and(|s| s.contains("bash")), "{created}");
    assert_eq!(m.ok("run_command", json!({"command": "[[ a == a ]] && echo {x,y}"}))["stdout"], "x y\n");
    assert_eq!(m.ok("write_file", json!({"path": "d/a.txt", "content": "héllo"}))["bytes_written"], 6);
    assert_eq!(m.ok("read_file", json!({"path": "d/a.txt"}))["content"], "héllo");
    assert_eq!(m.ok("write_file", json!({"path": "b.bin", "content": "AP8=", "encoding": "base64"}))["bytes_written"], 2);
    assert_eq!(m.ok("read_file", json!({"path": "b.bin"}))["content_base64"], "AP8=");
    let listed = m.ok("list_files", json!({"path": "d"}));
    assert_eq!(listed["entries"], json!([{"name": "a.txt", "type": "file", "size": 6}]));
    assert!(m.err("read_file", json!({"path": "missing"})).contains("does not exist"));
    assert!(m.err("run_command", json!({"command": "true", "cwd": "/no/such/dir"})).contains("does not exist"));
    assert!(m.err("run_command", json!({"command": "true", "sandbox_id": "local-0123456789abcdef01234567"})).contains("local-provider"));
    assert!(m.err("create_sandbox", json!({"template": "no-such-template"})).contains("no-such-template"));
    assert_eq!(m.ok("kill_sandbox", json!({"sandbox_id": sb}))["killed"], true);
    assert_eq!(m.ok("kill_sandbox", json!({"sandbox_id": sb}))["killed"], false);
    assert!(m.err("get_task", json!({"sandbox_id": sb, "task_id": "0123456789abcdef0123456789abcdef"})).contains("does not exist"));
}

#[test]
fn the_walkthrough_on_e2b() {
    walkthrough(&E2bHome::new("e2b-walk"));
}

#[test]
fn the_walkthrough_on_e2b_with_isolated_emulator_sandboxes() {
    if let Some(e) = isolated_e2b("e2b-walk-iso") {
        walkthrough(&e);
    }
}

fn walkthrough(e: &E2bHome) {
    let mut a = e.stdio();
    let sb = a.ok("create_sandbox", json!({"template": "base", "timeout": 600, "envs": {"API_KEY": "key-abcdefgh"}}))["sandbox_id"]
        .as_str()
        .unwrap()
        .to_string();
    let s = a.ok("start_task", json!({"command": "printf BEFORE; sleep 2; printf AFTER; echo $API_KEY >&2", "timeout": 120}));
    let task = s["task_id"].as_str().unwrap().to_string();
    a.client.kill().unwrap();
    let mut b = e.stdio();
    let done = finish(&mut b, &sb, &task);
    assert_eq!(
        (done["state"].as_str(), done["exit_code"].as_i64(), done["stdout"].as_str(), done["stderr"].as_str()),
        (Some("succeeded"), Some(0), Some("BEFOREAFTER"), Some("***\n"))
    );
    let p = b.ok("get_task", json!({"sandbox_id": sb, "task_id": task, "stdout_offset": 3, "limit": 4}));
    assert_eq!((p["stdout"].as_str(), p["stdout_next_offset"].as_i64()), (Some("OREA"), Some(7)));
    let long = b.ok("start_task", json!({"sandbox_id": sb, "command": "trap '' TERM; sleep 60"}));
    let t0 = Instant::now();
    assert_eq!(b.ok("cancel_task", json!({"sandbox_id": sb, "task_id": long["task_id"]}))["state"], "cancelled");
    assert!(t0.elapsed() < Duration::from_secs(3));
    assert_eq!(b.ok("list_tasks", json!({"sandbox_id": sb}))["count"], 2);
    b.close();
    let (status, _) = e.emulator.request("GET", &format!("/sandboxes/{sb}"), Value::Null);
    assert_eq!(status, 200, "a sandbox reached by handle survives the session");
    let mut c = e.stdio();
    assert_eq!(c.ok("kill_sandbox", json!({"sandbox_id": sb}))["killed"], true);
}

#[test]
fn a_start_stream_dropped_after_sending_reports_unknown_without_resubmitting() {
    let e = E2bHome::new("e2b-drop");
    let mut m = e.stdio();
    let sb = m.create();
    e.emulator.fault(json!({"path_prefix": "/process.Process/Start", "drop_after_bytes": 0, "count": 1}));
    let s = m.ok("start_task", json!({"command": "echo ran >> runs.txt"}));
    assert_eq!(s["state"], "unknown", "{s}");
    assert!(s["error"].as_str().unwrap().contains("could not be confirmed"));
    // The answer was lost at once, possibly before the task directory existed or the supervisor
    // said a word: until then get_task honestly says "no such task" or `unknown` (docs/contract.md, "Where task state lives").
    let task = s["task_id"].as_str().unwrap().to_string();
    wait_for(Duration::from_secs(20), "the task to succeed", || {
        let g = m.call("get_task", json!({"sandbox_id": sb, "task_id": task}));
        (g["structuredContent"]["state"] == "succeeded").then_some(())
    });
    assert_eq!(m.ok("read_file", json!({"path": "runs.txt"}))["content"], "ran\n", "the command ran exactly once");
}

/// A request that never left this host (a name that does not resolve, a TLS handshake that
/// failed) is reported as not sent, never as answered-but-lost: a start is then a plain error,
/// never `unknown`.
#[test]
fn requests_that_failed_before_sending_are_reported_as_not_sent() {
    // As a new user would try it, with a domain that cannot resolve (with or without DNS).
    let out = Command::new(bin())
        .args(["call", "create_sandbox", "{}"])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", std::env::temp_dir())
        .env("E2B_API_KEY", "e2b_fake")
        .env("E2B_DOMAIN", "sandbox-mcp-test.invalid")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("cannot reach E2B") && err.contains("could not be resolved") && err.contains("nothing was sent"), "{err}");
    assert!(!err.contains("was sent but"), "{err}");
    // envd behind a port that answers the TLS ClientHello with plain HTTP.
    let not_tls = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = not_tls.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut s in not_tls.incoming().flatten() {
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf);
            let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        }
    });
    let e = E2bHome::new("e2b-tls");
    let mut m = e.stdio_with_envd_at(&format!("https://127.0.0.1:{port}"));
    m.create();
    let r = m.call("start_task", json!({"command": "echo ran"}));
    assert_eq!(r["isError"], true, "a start that cannot have been sent is an error, not `unknown`: {r}");
    let text = r["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("cannot reach E2B") && text.contains("TLS handshake") && text.contains("nothing was sent"), "{text}");
}

#[test]
fn control_plane_502_and_expired_and_paused_sandboxes_are_reported_clearly() {
    faults_expiry_and_pausing(&E2bHome::new("e2b-faults"));
}

#[test]
fn control_plane_502_and_expired_and_paused_isolated_emulator_sandboxes_are_reported_clearly() {
    if let Some(e) = isolated_e2b("e2b-faults-iso") {
        faults_expiry_and_pausing(&e);
    }
}

fn faults_expiry_and_pausing(e: &E2bHome) {
    let mut m = e.stdio();
    e.emulator.fault(json!({"path_prefix": "/sandboxes", "status": 502, "count": 1}));
    let err = m.err("create_sandbox", json!({}));
    assert!(err.contains("502") && err.contains("retry"), "{err}");
    // Expiry.
    let short = m.ok("create_sandbox", json!({"timeout": 1}))["sandbox_id"].as_str().unwrap().to_string();
    let t = "0123456789abcdef0123456789abcdef";
    wait_for(Duration::from_secs(15), "the sandbox to expire", || {
        let r = m.call("get_task", json!({"sandbox_id": short, "task_id": t}));
        r["content"][0]["text"].as_str().unwrap_or("").contains("does not exist (it was killed or its timeout expired)").then_some(())
    });
    // Pausing: task tools report it and never resume; ordinary tools resume.
    let sb = m.ok("create_sandbox", json!({"timeout": 300}))["sandbox_id"].as_str().unwrap().to_string();
    let task = m.ok("start_task", json!({"sandbox_id": sb, "command": "echo before-pause"}))["task_id"].as_str().unwrap().to_string();
    let (status, body) = e.emulator.request("POST", &format!("/sandboxes/{sb}/pause"), json!({}));
    assert_eq!(status, 204, "{body}");
    let err = m.err("get_task", json!({"sandbox_id": sb, "task_id": task}));
    assert!(err.contains("paused"), "{err}");
    let (_, detail) = e.emulator.request("GET", &format!("/sandboxes/{sb}"), Value::Null);
    assert_eq!(detail["state"], "paused", "task tools never resume");
    assert_eq!(m.ok("run_command", json!({"sandbox_id": sb, "command": "echo resumed"}))["stdout"], "resumed\n");
    assert_eq!(finish(&mut m, &sb, &task)["stdout"], "before-pause\n");
}

#[test]
fn tools_make_no_more_round_trips_than_needed() {
    let e = E2bHome::new("e2b-trips");
    let mut m = e.stdio();
    let sb = m.create();
    let task = m.ok("start_task", json!({"command": "echo hi"}))["task_id"].as_str().unwrap().to_string();
    e.emulator.take_counts();
    m.ok("get_task", json!({"sandbox_id": sb, "task_id": task}));
    let c = e.emulator.take_counts();
    assert_eq!((c["total"].as_i64(), route_count(&c, "POST /process.Process/Start")), (Some(1), 1), "get_task: {c}");
    // The first run_command reads the sandbox's environment once (for masking), then runs.
    m.ok("run_command", json!({"command": "true"}));
    let c = e.emulator.take_counts();
    assert_eq!((c["total"].as_i64(), route_count(&c, "POST /process.Process/Start")), (Some(2), 2), "first run_command: {c}");
    m.ok("run_command", json!({"command": "true"}));
    let c = e.emulator.take_counts();
    assert_eq!(c["total"], 1, "run_command right after a renewal: {c}");
    m.ok("read_file", json!({"path": ".sandbox-mcp/tasks/".to_string() + &task + "/cmd"}));
    assert_eq!(e.emulator.take_counts()["total"], 1);
    // A second server process knows nothing yet: one info call, then the same single round trip.
    let mut other = e.stdio();
    other.ok("get_task", json!({"sandbox_id": sb, "task_id": task}));
    let c = e.emulator.take_counts();
    assert_eq!((c["total"].as_i64(), route_count(&c, "GET /sandboxes/{id}")), (Some(2), 1), "{c}");
    other.ok("get_task", json!({"sandbox_id": sb, "task_id": task}));
    assert_eq!(e.emulator.take_counts()["total"], 1);
}

/// Regression: the first ordinary tool from a server process that did not create the sandbox
/// deadlocked (a lock held across the lookup of the sandbox's TTL). Found by make bench.
#[test]
fn a_second_server_process_reaches_the_sandbox_with_every_tool() {
    let e = E2bHome::new("e2b-second");
    let mut a = e.stdio();
    let sb = a.ok("create_sandbox", json!({"timeout": 120, "envs": {"APP_TOKEN": "app-token-value"}}))["sandbox_id"]
        .as_str()
        .unwrap()
        .to_string();
    a.ok("start_task", json!({"command": "true"})); // retains the sandbox past this session
    a.close();
    let mut b = e.stdio();
    let t0 = Instant::now();
    let s = b.ok("start_task", json!({"sandbox_id": sb, "command": "sleep 30"}));
    assert!(t0.elapsed() < Duration::from_secs(3), "start_task of a long command took {:?}", t0.elapsed());
    assert_eq!(b.ok("write_file", json!({"sandbox_id": sb, "path": "x.txt", "content": "x"}))["bytes_written"], 1);
    assert_eq!(b.ok("read_file", json!({"sandbox_id": sb, "path": "x.txt"}))["content"], "x");
    assert_eq!(
        b.ok("run_command", json!({"sandbox_id": sb, "command": "echo $APP_TOKEN"}))["stdout"],
        "***\n",
        "masking learns the environment"
    );
    assert_eq!(b.ok("cancel_task", json!({"sandbox_id": sb, "task_id": s["task_id"]}))["state"], "cancelled");
    assert_eq!(b.ok("kill_sandbox", json!({"sandbox_id": sb}))["killed"], true);
}

/// The tools that reach envd, through a server configured by `extra` against `e`.
fn envd_round_trip(e: &E2bHome, extra: &[(&str, &str)]) {
    let mut m = e.stdio_with(extra);
    let sb = m.ok("create_sandbox", json!({"timeout": 120}))["sandbox_id"].as_str().unwrap().to_string();
    assert_eq!(m.ok("run_command", json!({"command": "echo routed"}))["stdout"], "routed\n");
    assert_eq!(m.ok("write_file", json!({"path": "r.txt", "content": "r"}))["bytes_written"], 1);
    assert_eq!(m.ok("read_file", json!({"path": "r.txt"}))["content"], "r");
    let task = m.ok("start_task", json!({"command": "echo task"}))["task_id"].as_str().unwrap().to_string();
    assert_eq!(finish(&mut m, &sb, &task)["state"], "succeeded");
    let c = e.emulator.take_counts();
    assert!(route_count(&c, "POST /process.Process/Start") >= 1 && route_count(&c, "GET /files") >= 1, "{c}");
    assert_eq!(m.ok("kill_sandbox", json!({"sandbox_id": sb}))["killed"], true);
}

/// Self-hosted, host-style: a custom domain, plain http, envd at `{port}-{sandbox_id}.{domain}`.
/// The emulator's edge routes by the Host alone (no wildcard DNS here: the server reaches it as
/// its HTTP proxy, which keeps the Host the server built).
#[test]
fn a_custom_domain_over_plain_http_routes_by_host() {
    let e = E2bHome { emulator: Emulator::start_routed("host"), home: Home::new("e2b-host-style") };
    let proxy = e.emulator.url();
    envd_round_trip(
        &e,
        &[
            ("E2B_DOMAIN", "sandboxes.test"),
            ("E2B_SANDBOX_URL", "http://{port}-{sandbox_id}.{domain}"),
            ("HTTP_PROXY", proxy.as_str()),
            ("NO_PROXY", "127.0.0.1"),
        ],
    );
    // The header-routed fixed URL no longer reaches envd on this edge: routing really is by Host.
    let mut m = e.stdio_with(&[("E2B_DOMAIN", "sandboxes.test")]);
    m.ok("create_sandbox", json!({"timeout": 60}));
    assert!(!m.err("run_command", json!({"command": "true"})).is_empty());
}

/// Path-style routing for deployments without wildcard DNS: envd at `/proxy/{sandbox_id}/{port}`.
#[test]
fn path_style_templates_route_by_path() {
    let e = E2bHome { emulator: Emulator::start_routed("path"), home: Home::new("e2b-path-style") };
    let template = format!("{}/proxy/{{sandbox_id}}/{{port}}", e.emulator.url());
    envd_round_trip(&e, &[("E2B_SANDBOX_URL", template.as_str())]);
}

/// A template that cannot be used stops the server at start (exit 2), naming the option and
/// showing valid forms.
#[test]
fn bad_sandbox_url_templates_stop_the_server_at_start() {
    let home = Home::new("e2b-bad-template");
    for bad in ["10.0.0.5:3000/{sandbox_id}/{port}", "http://h/{sandbox}/{port}", "http://h/{sandbox_id}", "http://h/{port"] {
        let out = std::process::Command::new(bin())
            .args(["call", "list_sandboxes", "{}"])
            .envs(home.env())
            .env("SANDBOX_MCP_PROVIDER", "e2b")
            .env("E2B_API_KEY", E2B_TEST_KEY)
            .env("E2B_SANDBOX_URL", bad)
            .output()
            .unwrap();
        let why = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {why}");
        assert!(why.contains("E2B_SANDBOX_URL") && why.contains("https://{port}-{sandbox_id}.example.com"), "{bad}: {why}");
    }
}
