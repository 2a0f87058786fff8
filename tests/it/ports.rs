//! expose_port and unexpose_port: a port on an isolated sandbox's own loopback reached from the
//! host through its keeper's relay, across server processes, until unexpose_port or
//! kill_sandbox; bad input; a sandbox without a network of its own; the E2B URL; and a hostile
//! sandbox that floods, never reads, or holds many connections.

use crate::support::*;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

/// Servers inside the sandbox: 8000 echoes, 9001 floods every connection, 9002 never reads,
/// 9003 reads and records how its last connection ended (`eof` or `reset`) in `watched`.
const SERVERS: &str = r#"import os, socket, threading
def serve(port, handler):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(('127.0.0.1', port))
    s.listen(256)
    while True:
        c, _ = s.accept()
        threading.Thread(target=handler, args=(c,), daemon=True).start()
def echo(c):
    while True:
        d = c.recv(65536)
        if not d:
            break
        c.sendall(d)
    c.close()
held = []
def never_read(c):
    held.append(c)
def flood(c):
    b = b'x' * 65536
    try:
        while True:
            c.sendall(b)
    except OSError:
        pass
def watch(c):
    end = 'eof'
    try:
        while c.recv(65536):
            open('watching', 'w').close()
    except OSError:
        end = 'reset'
    with open('watched.tmp', 'w') as f:
        f.write(end)
    os.rename('watched.tmp', 'watched')
for port, h in ((9001, flood), (9002, never_read), (9003, watch), (8000, echo)):
    threading.Thread(target=serve, args=(port, h), daemon=True).start()
open('ready', 'w').close()
threading.Event().wait()
"#;

fn isolated(name: &str) -> Option<Home> {
    if let Err(why) = sandbox_mcp::provider::local::isolation::probe() {
        eprintln!("exposed-port tests need namespaces, which this host refuses: {why}");
        return None;
    }
    Some(Home::new(name).with_isolation("namespaces"))
}

/// Starts [`SERVERS`] in sandbox `sb` as a task and waits until they listen.
fn start_servers(m: &mut Mcp, sb: &str) {
    m.ok("write_file", json!({"sandbox_id": sb, "path": "servers.py", "content": SERVERS}));
    m.ok("start_task", json!({"sandbox_id": sb, "command": "python3 servers.py"}));
    wait_for_file(m, sb, "ready", Duration::from_secs(20), "the sandbox's servers to listen");
}

/// Waits up to `timeout` until file `name` exists in sandbox `sb`'s home.
fn wait_for_file(m: &mut Mcp, sb: &str, name: &str, timeout: Duration, what: &str) {
    wait_for(timeout, what, || {
        let out = m.ok("run_command", json!({"sandbox_id": sb, "command": format!("test -e {name} && echo yes")}));
        (out["stdout"] == "yes\n").then_some(())
    });
}

/// `host:port` of an `http://host:port` URL.
fn address(url: &Value) -> String {
    url.as_str().and_then(|u| u.strip_prefix("http://")).unwrap_or_else(|| panic!("not an http URL: {url}")).to_string()
}

/// Sends `data` to an echo server at `addr` and reads it back.
fn echo(addr: &str, data: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(data)?;
    s.shutdown(Shutdown::Write)?;
    let mut back = Vec::new();
    s.read_to_end(&mut back)?;
    Ok(back)
}

/// Waits until nothing is served at `addr` any more: refused, or closed at once.
fn wait_closed(addr: &str, what: &str) {
    wait_for(Duration::from_secs(15), what, || echo(addr, b"ping").map_or(true, |b| b.is_empty()).then_some(()));
}

#[test]
fn an_exposed_port_outlives_its_server_until_unexpose_or_kill() {
    let Some(home) = isolated("ports-life") else { return };
    let mut a = home.stdio();
    let sb = a.create();
    // Nothing listens yet: an error that says so, not a URL whose connections fail.
    let err = a.err("expose_port", json!({"port": 8000}));
    assert!(err.contains("nothing listens on port 8000") && err.contains("expose_port again"), "{err}");
    start_servers(&mut a, &sb);
    let exposed = a.ok("expose_port", json!({"port": 8000}));
    assert_eq!(
        (exposed["sandbox_id"].as_str(), exposed["port"].as_i64(), exposed["exposed"].as_bool()),
        (Some(sb.as_str()), Some(8000), Some(true))
    );
    let addr = address(&exposed["url"]);
    assert!(addr.starts_with("127.0.0.1:"), "loopback by default: {addr}");
    assert_eq!(echo(&addr, b"hello").unwrap(), b"hello");
    // Exposing again answers the same URL.
    assert_eq!(a.ok("expose_port", json!({"port": 8000}))["url"], exposed["url"]);
    a.close();

    // The relay lives in the keeper: a new server process finds it working, and ends it.
    let mut b = home.stdio();
    let big: Vec<u8> = (0..4_000_000u32).map(|i| (i % 251) as u8).collect();
    assert!(echo(&addr, &big).unwrap() == big, "4 MB echoed intact after the server that exposed it left");
    let closed = b.ok("unexpose_port", json!({"sandbox_id": sb, "port": 8000}));
    assert_eq!((closed["closed"].as_bool(), &closed["url"]), (Some(true), &exposed["url"]));
    wait_closed(&addr, "the unexposed port to close");
    let err = b.err("unexpose_port", json!({"sandbox_id": sb, "port": 8000}));
    assert!(err.contains("port 8000 is not exposed"), "{err}");

    // kill_sandbox closes what is exposed.
    let again = address(&b.ok("expose_port", json!({"sandbox_id": sb, "port": 8000}))["url"]);
    assert_eq!(echo(&again, b"x").unwrap(), b"x");
    b.ok("kill_sandbox", json!({"sandbox_id": sb}));
    wait_closed(&again, "kill_sandbox to close the exposed port");
}

/// unexpose_port cuts the port's open connections: the host's client and the sandbox's server
/// both see a reset at once. Before, the client saw a clean end and the server an end of its
/// request, and a server that stayed silent held its relay for the idle budget.
#[test]
fn unexpose_resets_open_connections_on_both_sides() {
    let Some(home) = isolated("ports-cut") else { return };
    let mut m = home.stdio();
    let sb = m.create();
    start_servers(&mut m, &sb);
    let addr = address(&m.ok("expose_port", json!({"port": 9003}))["url"]);
    let mut conn = TcpStream::connect(&addr).unwrap();
    conn.write_all(b"hello").unwrap();
    wait_for_file(&mut m, &sb, "watching", Duration::from_secs(15), "the sandbox's server to read through the relay");
    m.ok("unexpose_port", json!({"sandbox_id": sb, "port": 9003}));
    conn.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut rest = Vec::new();
    let ended = conn.read_to_end(&mut rest);
    assert_eq!(ended.map_err(|e| e.kind()), Err(std::io::ErrorKind::ConnectionReset), "the client saw a clean end");
    let inside = wait_for(Duration::from_secs(10), "the sandbox's server to see its connection end", || {
        let out = m.ok("run_command", json!({"sandbox_id": sb, "command": "cat watched 2>/dev/null"}));
        out["stdout"].as_str().filter(|s| !s.is_empty()).map(str::to_string)
    });
    assert_eq!(inside, "reset", "the sandbox's server saw a clean end");
}

/// A keeper that dies takes its relays with it; the keeper a sweep starts in its place listens
/// again on the same host address, read from what the first one recorded.
#[test]
fn a_restarted_keeper_listens_again_where_the_last_one_did() {
    let Some(home) = isolated("ports-keeper") else { return };
    let mut m = home.stdio();
    let sb = m.create();
    start_servers(&mut m, &sb);
    let addr = address(&m.ok("expose_port", json!({"port": 8000}))["url"]);
    assert_eq!(echo(&addr, b"one").unwrap(), b"one");
    let pid_file = home.sandbox_dir(&sb).join("keeper.pid");
    let keeper: i32 = std::fs::read_to_string(&pid_file).unwrap().split_whitespace().next().unwrap().parse().unwrap();
    assert!(keeper > 1);
    // The keeper runs in this test's pid namespace (the harness's), started by its server.
    kill_one(keeper);
    wait_closed(&addr, "the relays to end with their keeper");
    // What the sweep runs for a sandbox whose keeper is gone.
    let mut restarted = std::process::Command::new(bin())
        .args(["keeper", home.path.to_str().unwrap(), &sb, home.shell.to_str().unwrap()])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for(Duration::from_secs(15), "the restarted keeper to serve the port again", || echo(&addr, b"two").ok().filter(|b| b == b"two"));
    m.ok("kill_sandbox", json!({"sandbox_id": sb}));
    wait_for(Duration::from_secs(15), "the restarted keeper to exit with its sandbox", || restarted.try_wait().unwrap().map(|_| ()));
}

/// SIGKILL to one process by its pid, through the shell builtin (never a negative pid).
fn kill_one(pid: i32) {
    assert!(pid > 1);
    let status = std::process::Command::new("sh").args(["-c", &format!("kill -9 {pid}")]).status().unwrap();
    assert!(status.success());
}

#[test]
fn bad_ports_are_refused_with_clear_errors() {
    let home = Home::new("ports-bad").with_isolation("none");
    let mut m = home.stdio();
    m.create();
    for bad in [json!(0), json!(65536), json!(-1), json!("80"), json!(1.5)] {
        let err = m.err("expose_port", json!({"port": bad}));
        assert!(err.contains("port"), "{bad}: {err}");
        assert!(!m.err("unexpose_port", json!({"port": bad})).is_empty());
    }
    assert!(m.err("expose_port", json!({})).contains("port"));
    // Without a network of its own, the port is on the host's loopback already: its URL, said so.
    let out = m.ok("expose_port", json!({"port": 8080}));
    assert_eq!(out["url"], "http://127.0.0.1:8080");
    assert!(out["note"].as_str().unwrap_or("").contains("host's network"), "{out}");
    let out = m.ok("unexpose_port", json!({"port": 8080}));
    assert_eq!(out["closed"], false, "{out}");
    assert!(out["note"].as_str().unwrap_or("").contains("stop that process"), "{out}");
}

/// On E2B the URL is the platform's host for the port (here path-style through the emulator's
/// edge, which forwards it to the sandbox's port), reachable while a process listens on it.
#[test]
fn on_e2b_the_url_is_the_platforms_host_for_the_port() {
    let e = E2bHome { emulator: Emulator::start_routed("path"), home: Home::new("ports-e2b") };
    let template = format!("{}/proxy/{{sandbox_id}}/{{port}}", e.emulator.url());
    let mut m = e.stdio_with(&[("E2B_SANDBOX_URL", template.as_str())]);
    let sb = m.create();
    // The emulator's sandboxes are unisolated: a free port of the host's loopback.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let out = m.ok("expose_port", json!({"port": port}));
    let url = format!("{}/proxy/{sb}/{port}", e.emulator.url());
    assert_eq!(out["url"], url.as_str());
    assert!(out["note"].as_str().unwrap_or("").contains("every port"), "{out}");
    let get = |path: &str| {
        let mut s = TcpStream::connect(e.emulator.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        write!(s, "GET /proxy/{sb}/{port}/{path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        answer
    };
    assert!(get("hello.txt").contains("port is not open"), "nothing listens yet");
    m.ok("write_file", json!({"path": "hello.txt", "content": "hello from the sandbox"}));
    m.ok("start_task", json!({"command": format!("python3 -m http.server {port} --bind 127.0.0.1")}));
    let answer = wait_for(Duration::from_secs(20), "the sandbox's web server to answer through the URL", || {
        let a = get("hello.txt");
        a.starts_with("HTTP/1.1 200").then_some(a)
    });
    assert!(answer.ends_with("hello from the sandbox"), "{answer}");
    let out = m.ok("unexpose_port", json!({"port": port}));
    assert_eq!(out["closed"], false, "E2B cannot close one port: {out}");
    assert!(out["note"].as_str().unwrap_or("").contains("kill the sandbox"), "{out}");
    m.ok("kill_sandbox", json!({"sandbox_id": sb}));
    // A fixed sandbox URL reaches envd only: no port URL can be built.
    let plain = E2bHome::new("ports-e2b-fixed");
    let mut fixed = plain.stdio();
    fixed.create();
    assert!(fixed.err("expose_port", json!({"port": 3000})).contains("{port}-{sandbox_id}"));
}

/// The resident memory of process `pid`, in KiB.
fn rss_kib(pid: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.split_whitespace().next()?.parse().ok()).unwrap_or(0)
}

/// A sandbox that floods, never reads, or takes many connections costs only those connections:
/// the relay buffers a bounded amount, caps connections per port, and serves the others.
#[test]
fn a_hostile_sandbox_costs_only_its_own_connections() {
    let Some(home) = isolated("ports-hostile") else { return };
    let mut m = home.stdio();
    let sb = m.create();
    start_servers(&mut m, &sb);
    let url = |m: &mut Mcp, port: u16| address(&m.ok("expose_port", json!({"port": port}))["url"]);
    let (good, flood, sink) = (url(&mut m, 8000), url(&mut m, 9001), url(&mut m, 9002));
    let keeper = std::fs::read_to_string(home.sandbox_dir(&sb).join("keeper.pid")).unwrap();
    let keeper = keeper.split_whitespace().next().unwrap().to_string();
    let before = rss_kib(&keeper);

    // A flood nobody reads: a few connections, never read from.
    let floods: Vec<TcpStream> = (0..4).map(|_| TcpStream::connect(&flood).unwrap()).collect();
    // A peer that never reads: the host side writes until the relay stops taking bytes.
    let mut stuck = TcpStream::connect(&sink).unwrap();
    stuck.set_write_timeout(Some(Duration::from_secs(3))).unwrap();
    let chunk = vec![0u8; 64 * 1024];
    let mut pushed = 0usize;
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(30) {
        match stuck.write(&chunk) {
            Ok(n) => pushed += n,
            Err(_) => break,
        }
    }
    assert!(pushed < 64 << 20, "the relay took {pushed} bytes toward a peer that never reads");
    // Meanwhile the well-behaved port answers at once.
    let t1 = Instant::now();
    assert_eq!(echo(&good, b"still here").unwrap(), b"still here");
    assert!(t1.elapsed() < Duration::from_secs(5), "an echo took {:?} during the attack", t1.elapsed());
    let grown = rss_kib(&keeper).saturating_sub(before);
    assert!(grown < 64 * 1024, "the keeper grew by {grown} KiB under the flood");

    // More connections than a port relays at once: the ones past the cap are closed at once.
    let mut held = Vec::new();
    let mut closed = 0;
    for _ in 0..(sandbox_mcp::limits::EXPOSED_PORT_MAX_CONNECTIONS + 8) {
        // (A connection past the cap may be reset before connect returns.)
        let Ok(mut s) = TcpStream::connect(&flood) else {
            closed += 1;
            continue;
        };
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut byte = [0u8; 1];
        match s.read(&mut byte) {
            Ok(1) => held.push(s),
            _ => closed += 1,
        }
    }
    eprintln!("pushed {pushed} bytes toward a peer that never reads; keeper grew {grown} KiB; {} relayed, {closed} closed", held.len());
    assert!(held.len() <= sandbox_mcp::limits::EXPOSED_PORT_MAX_CONNECTIONS, "{} connections relayed at once", held.len());
    assert!(closed >= 8, "only {closed} connections past the cap were closed");
    // Another port of the same sandbox is unaffected by this one's cap.
    assert_eq!(echo(&good, b"ok").unwrap(), b"ok");
    drop((floods, held, stuck));
    m.ok("kill_sandbox", json!({"sandbox_id": sb}));
}

/// The soft and hard limits of open files of process `pid`.
fn open_files_limits(pid: &str) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap().to_string();
    let fields: Vec<&str> = line["Max open files".len()..].split_whitespace().collect();
    (fields[0].to_string(), fields[1].to_string())
}

/// Clock ticks process `pid` has run, user and system.
fn cpu_ticks(pid: &str) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<u64> = stat.rsplit_once(')').unwrap().1.split_whitespace().filter_map(|f| f.parse().ok()).collect();
    // After the state field (not a number): utime and stime are fields 14 and 15 of the line.
    fields[10] + fields[11]
}

/// A keeper holds what its caps allow, whatever soft limit of open files its server started
/// with: it runs with its hard limit (16 ports × 32 connections of two sockets each need more
/// than the usual 1024). And a keeper out of descriptors waits for them rather than spin on the
/// request in its backlog, then answers again (found by a review: a keeper of a stdio server had
/// the usual 1024, and at its limit spun a core until descriptors freed).
#[test]
fn a_keeper_out_of_descriptors_waits_and_answers_again() {
    let Some(home) = isolated("ports-descriptors") else { return };
    let mut cmd = std::process::Command::new("/bin/sh");
    cmd.args(["-c", "ulimit -S -n 256 && exec \"$@\"", "sh"]).arg(bin()).arg("stdio").envs(home.env());
    let mut client = sandbox_mcp::client::StdioClient::start(cmd, sandbox_mcp::client::Reads::WithTimeouts).expect("spawn server");
    client.initialize().expect("initialize");
    let mut m = Mcp { client };
    let sb = m.create();
    start_servers(&mut m, &sb);
    let addr = address(&m.ok("expose_port", json!({"port": 8000}))["url"]);
    assert_eq!(echo(&addr, b"x").unwrap(), b"x");
    let keeper = std::fs::read_to_string(home.sandbox_dir(&sb).join("keeper.pid")).unwrap();
    let keeper = keeper.split_whitespace().next().unwrap().to_string();
    let (soft, hard) = open_files_limits(&keeper);
    assert_eq!(soft, hard, "the keeper's soft limit of open files is its hard one");

    // No descriptor number left below the soft limit: the lowest free one becomes the limit, once
    // the relayed connection's descriptors are closed (the set stays the same for half a second).
    let fds = || -> std::collections::BTreeSet<u64> {
        std::fs::read_dir(format!("/proc/{keeper}/fd")).unwrap().filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect()
    };
    let mut last = fds();
    let used = wait_for(Duration::from_secs(10), "the keeper's descriptors to settle", || {
        std::thread::sleep(Duration::from_millis(500));
        let now = fds();
        let settled = now == last;
        last = now;
        settled.then(|| last.clone())
    });
    let free = (0..).find(|n| !used.contains(n)).unwrap();
    let pin = std::process::Command::new("prlimit").args(["--pid", &keeper, &format!("--nofile={free}:")]).status().unwrap();
    assert!(pin.success());
    // An accept that was waiting holds the descriptor it will return: one more request gets
    // through, and the next accept finds none.
    let err = m.err("unexpose_port", json!({"sandbox_id": sb, "port": 8001}));
    assert!(err.contains("port 8001 is not exposed"), "{err}");
    let before = cpu_ticks(&keeper);
    std::thread::sleep(Duration::from_secs(1));
    let spent = cpu_ticks(&keeper) - before;
    // A spin runs a core: 100 ticks a second.
    assert!(spent < 25, "the keeper ran {spent} ticks in a second out of descriptors");

    let restore = std::process::Command::new("prlimit").args(["--pid", &keeper, &format!("--nofile={hard}:")]).status().unwrap();
    assert!(restore.success());
    let closed = m.ok("unexpose_port", json!({"sandbox_id": sb, "port": 8000}));
    assert_eq!(closed["closed"].as_bool(), Some(true), "{closed}");
    m.ok("kill_sandbox", json!({"sandbox_id": sb}));
}
