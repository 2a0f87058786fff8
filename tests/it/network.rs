//! Network by policy: every isolated sandbox has a private network namespace and reaches out only
//! through its own egress proxy, which enforces its policy and never the host. No test traffic
//! leaves the machine: the server's parent proxy (`--egress-proxy`) is a loopback stand-in that
//! answers for reserved `*.test` names itself, and it records every name it was asked for, so a
//! denied name is proven never to have left the sandbox's proxy.

use crate::support::*;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The loopback stand-in for a parent proxy: answers CONNECT (then serves one HTTP request in the
/// tunnel) and absolute-form GETs with `hello <host> <path>`; records the hosts asked for.
struct Upstream {
    port: u16,
    asked: Arc<Mutex<Vec<String>>>,
}

impl Upstream {
    fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let asked = Arc::new(Mutex::new(Vec::new()));
        let log = asked.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let log = log.clone();
                std::thread::spawn(move || serve_upstream(conn, &log));
            }
        });
        Upstream { port, asked }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn asked(&self) -> Vec<String> {
        self.asked.lock().unwrap().clone()
    }
}

fn read_head(reader: &mut BufReader<TcpStream>) -> Option<Vec<String>> {
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let line = line.trim_end().to_string();
        if line.is_empty() {
            return Some(lines);
        }
        lines.push(line);
    }
}

fn serve_upstream(conn: TcpStream, log: &Mutex<Vec<String>>) {
    conn.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut out = conn;
    let Some(head) = read_head(&mut reader) else { return };
    let mut parts = head[0].split(' ');
    let (method, target) = (parts.next().unwrap_or_default().to_string(), parts.next().unwrap_or_default().to_string());
    let (host, path) = if method == "CONNECT" {
        let host = target.rsplit_once(':').map(|(h, _)| h.to_string()).unwrap_or_default();
        out.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").unwrap();
        let Some(inner) = read_head(&mut reader) else { return };
        (host, inner[0].split(' ').nth(1).unwrap_or_default().to_string())
    } else {
        let rest = target.strip_prefix("http://").unwrap_or_default();
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        (authority.rsplit_once(':').map(|(h, _)| h).unwrap_or(authority).to_string(), path.to_string())
    };
    log.lock().unwrap().push(host.clone());
    let body = format!("hello {host} {path}\n");
    let _ = write!(out, "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
    let _ = out.shutdown(std::net::Shutdown::Write);
    // Whatever else comes on this connection (a smuggled second request) is recorded too.
    while let Some(more) = read_head(&mut reader) {
        if let Some(target) = more.first().and_then(|l| l.split(' ').nth(1)) {
            log.lock().unwrap().push(format!("smuggled {target}"));
        }
    }
}

fn isolated(name: &str) -> Option<Home> {
    if let Err(why) = sandbox_mcp::provider::local::isolation::probe() {
        eprintln!("network tests need namespaces, which this host refuses: {why}");
        return None;
    }
    Some(Home::new(name).with_isolation("namespaces"))
}

fn sh(m: &mut Mcp, id: &str, command: &str) -> Value {
    m.ok("run_command", json!({"sandbox_id": id, "command": command, "timeout": 60}))
}

fn out(v: &Value) -> (i64, String) {
    (v["exit_code"].as_i64().unwrap(), format!("{}{}", v["stdout"].as_str().unwrap(), v["stderr"].as_str().unwrap()))
}

const CURL: &str = "curl -sS --max-time 20";

/// The namespace tier, and the Landlock tier under a root server (its sandboxes get a network
/// namespace of their own there, egress through the same proxy).
#[test]
fn policies_allow_deny_and_never_reach_the_host() {
    for home in policy_homes("net-policy") {
        policies_hold(&home);
    }
}

/// The namespace tier's home, and the Landlock tier's where its sandboxes have a network (a
/// server that is root of its user namespace); as root, both again for a user with subordinate
/// ids.
fn policy_homes(name: &str) -> Vec<Home> {
    let mut homes: Vec<Home> = isolated(name).into_iter().collect();
    let landlock = sandbox_mcp::provider::local::isolation::landlock::available().is_ok();
    if rustix_is_root() && landlock {
        homes.push(Home::new(&format!("{name}-ll")).with_isolation("landlock"));
    }
    if let (Some((uid, gid)), false) = (subordinate_user(), homes.is_empty()) {
        homes.push(Home::new(&format!("{name}-sub")).with_isolation("namespaces").run_as_user(uid, gid));
        if landlock {
            homes.push(Home::new(&format!("{name}-ll-sub")).with_isolation("landlock").run_as_user(uid, gid));
        }
    }
    homes
}

fn policies_hold(home: &Home) {
    let up = Upstream::start();
    let mut m = home.stdio_with(&[("SANDBOX_MCP_EGRESS_PROXY", &up.url())]);
    let policy = json!({"allow": ["pkgs.test", "*.mirror.test"], "deny": ["bad.mirror.test"]});
    let c = m.ok("create_sandbox", json!({"network": policy}));
    assert_eq!(c["network"], policy, "the result echoes the policy in force");
    let id = c["sandbox_id"].as_str().unwrap().to_string();

    // Allowed: plain HTTP (absolute-form), a CONNECT tunnel, SOCKS5, python's urllib.
    let r = sh(&mut m, &id, &format!("{CURL} http://pkgs.test/simple/?token=secret"));
    assert_eq!(out(&r), (0, "hello pkgs.test /simple/?token=secret\n".into()), "{r}");
    assert!(r.get("network_blocked").is_none(), "{r}");
    let r = sh(&mut m, &id, &format!("{CURL} -p http://a.mirror.test/x"));
    assert_eq!(out(&r), (0, "hello a.mirror.test /x\n".into()), "{r}");
    let r = sh(&mut m, &id, &format!("{CURL} --socks5-hostname 127.0.0.1:3128 http://b.mirror.test/s"));
    assert_eq!(out(&r), (0, "hello b.mirror.test /s\n".into()), "{r}");
    let py =
        "python3 -c \"import urllib.request; print(urllib.request.urlopen('http://pkgs.test/py', timeout=20).read().decode(), end='')\"";
    let r = sh(&mut m, &id, py);
    assert_eq!(out(&r), (0, "hello pkgs.test /py\n".into()), "{r}");

    // Denied: a 403 that names the host, the rule and how to allow it; reported on the result.
    let r = sh(&mut m, &id, &format!("{CURL} -i http://evil.test/p"));
    let (_, text) = out(&r);
    assert!(text.contains("403") && text.contains("evil.test:80") && text.contains("allow list") && text.contains("set_network"), "{text}");
    assert_eq!(r["network_blocked"], json!([{"host": "evil.test", "port": 80, "reason": "no entry of the allow list matches it"}]), "{r}");
    let r = sh(&mut m, &id, &format!("{CURL} -p http://bad.mirror.test/"));
    assert_ne!(out(&r).0, 0, "{r}");
    assert!(r["network_blocked"][0]["reason"].as_str().unwrap().contains("\"bad.mirror.test\""), "{r}");
    let r = sh(&mut m, &id, &format!("{CURL} --socks5-hostname 127.0.0.1:3128 http://evil.test/"));
    assert_ne!(out(&r).0, 0, "{r}");
    assert_eq!(r["network_blocked"][0]["host"], "evil.test", "{r}");
    // A task that hits a block: get_task says so.
    let t = m.ok("start_task", json!({"sandbox_id": id, "command": format!("{CURL} http://blocked.test/task; exit 0")}));
    let done = wait_for(Duration::from_secs(30), "the task to end", || {
        let g = m.ok("get_task", json!({"sandbox_id": id, "task_id": t["task_id"]}));
        (g["state"] != "running").then_some(g)
    });
    assert!(done["network_blocked"].as_array().unwrap().iter().any(|b| b["host"] == "blocked.test" && b["port"] == 80), "{done}");
    // A second request pipelined after an allowed one never leaves the proxy. Both go in one
    // write (`cat` of a here-string): bash's printf writes line by line, and a proxy that had
    // answered the first and closed before the last line came would end bash with SIGPIPE.
    let smuggle = "exec 3<>/dev/tcp/127.0.0.1/3128; r=\\$(printf 'GET http://pkgs.test/one HTTP/1.1\\r\\nHost: pkgs.test\\r\\n\\r\\nGET http://evil.test/two HTTP/1.1\\r\\nHost: evil.test\\r\\n\\r\\n'); cat <<<\\\"\\$r\\\" >&3; timeout 10 cat <&3";
    let r = sh(&mut m, &id, &format!("bash -c \"{smuggle}\""));
    assert!(out(&r).1.contains("hello pkgs.test /one"), "{r}");
    wait_for(Duration::from_secs(5), "the smuggled connection to end", || up.asked().iter().any(|h| h == "pkgs.test").then_some(()));
    // Never the host, whatever the policy: loopback, metadata, private and mapped forms.
    m.ok("set_network", json!({"sandbox_id": id, "network": true}));
    for target in ["127.0.0.1", "169.254.169.254", "10.0.0.1", "[::1]", "[::ffff:127.0.0.1]", "localhost"] {
        // NO_PROXY names the sandbox's own loopback: ask the proxy explicitly.
        let r = sh(&mut m, &id, &format!("{CURL} -i -x http://127.0.0.1:3128 --noproxy '' http://{target}:{}/", up.port));
        let (_, text) = out(&r);
        assert!(text.contains("403") && text.contains("never reachable"), "{target}: {text}");
        assert!(text.contains("--egress-allow-host-services"), "{target}: {text}");
    }
    // A tool that ignores the proxy variables gets no connection at all (fail closed).
    let r = sh(&mut m, &id, &format!("{CURL} --noproxy '*' http://127.0.0.1:{}/ || echo refused", up.port));
    assert!(out(&r).1.contains("refused"), "{r}");
    let r = sh(&mut m, &id, "ip route 2>/dev/null; cat /proc/net/route | wc -l; ls /sys/class/net; cat /proc/net/dev");
    assert!(!out(&r).1.contains("eth"), "{r}");
    assert!(!up.asked().iter().any(|h| h.contains("evil.test") || h == "bad.mirror.test" || h == "127.0.0.1"), "{:?}", up.asked());

    // Changes at run time: the next connection follows the new policy.
    let c = m.ok("set_network", json!({"sandbox_id": id, "network": {"allow": ["evil.test"]}}));
    assert_eq!(c["network"], json!({"allow": ["evil.test"], "deny": []}));
    assert_eq!(out(&sh(&mut m, &id, &format!("{CURL} http://evil.test/now"))), (0, "hello evil.test /now\n".into()));
    let r = sh(&mut m, &id, &format!("{CURL} -i http://pkgs.test/"));
    assert!(out(&r).1.contains("403"), "{r}");
    m.ok("set_network", json!({"sandbox_id": id, "network": false}));
    let r = sh(&mut m, &id, &format!("{CURL} -i http://evil.test/"));
    assert!(out(&r).1.contains("network: false"), "{r}");
    // The proxy never logged the query string.
    let blocks = std::fs::read_to_string(home.sandbox_dir(&id).join("egress-blocks.jsonl")).unwrap();
    assert!(!blocks.contains("token") && !blocks.contains("/p"), "{blocks}");
}

#[test]
fn bad_policies_are_refused_naming_the_entry() {
    let Some(home) = isolated("net-bad") else { return };
    let mut m = home.stdio();
    let many: Vec<String> = (0..257).map(|i| format!("h{i}.test")).collect();
    for (network, want) in [
        (json!({"allow": ["ok.test", "10.0.0.1"]}), "\"10.0.0.1\" is an IP address"),
        (json!({"deny": ["bad name"]}), "deny entry \"bad name\""),
        (json!({"allow": many}), "257 entries"),
        (json!({"allow": vec![format!("{}.test", "a".repeat(60)); 70]}), "bytes of JSON"),
        (json!({"permit": []}), "unknown field"),
        (json!("yes"), "must be true, false, or an object"),
    ] {
        let err = m.err("create_sandbox", json!({"network": network}));
        assert!(err.contains(want), "{network}: {err}");
    }
    assert_eq!(std::fs::read_dir(home.path.join("sandboxes")).map(|d| d.count()).unwrap_or(0), 0);
    let id = m.create();
    let err = m.err("set_network", json!({"sandbox_id": id, "network": {"allow": ["[::1]"]}}));
    assert!(err.contains("IP address"), "{err}");
}

/// The proxy lives with the sandbox: the server is SIGKILLed and replaced, the policy still
/// holds; kill_sandbox ends the keeper that served it.
#[test]
fn the_proxy_outlives_the_server_and_ends_with_the_sandbox() {
    for home in policy_homes("net-durable") {
        proxy_outlives_its_server(&home);
    }
}

fn proxy_outlives_its_server(home: &Home) {
    let up = Upstream::start();
    let env = [("SANDBOX_MCP_EGRESS_PROXY", up.url())];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut first = home.stdio_with(&env);
    let c = first.ok("create_sandbox", json!({"network": {"allow": ["pkgs.test"]}, "timeout": 600}));
    let id = c["sandbox_id"].as_str().unwrap().to_string();
    // A background task keeps the sandbox beyond the session's end.
    first.ok("start_task", json!({"sandbox_id": id, "command": "sleep 300"}));
    first.client.kill().unwrap();
    let mut second = home.stdio();
    assert_eq!(out(&sh(&mut second, &id, &format!("{CURL} http://pkgs.test/after"))), (0, "hello pkgs.test /after\n".into()));
    let r = sh(&mut second, &id, &format!("{CURL} -i http://other.test/"));
    assert!(out(&r).1.contains("403"), "{r}");
    let keeper: u32 =
        std::fs::read_to_string(home.sandbox_dir(&id).join("keeper.pid")).unwrap().split(' ').next().unwrap().parse().unwrap();
    assert!(pid_alive(keeper));
    second.ok("kill_sandbox", json!({"sandbox_id": id}));
    wait_for(Duration::from_secs(10), "the keeper (and its proxy) to end", || (!pid_alive(keeper)).then_some(()));
}

/// A sandbox that opens many connections and sends endless headers costs only itself.
#[test]
fn a_flood_of_connections_and_headers_costs_only_its_sandbox() {
    for home in policy_homes("net-flood") {
        flood_costs_only_its_sandbox(&home);
    }
}

fn flood_costs_only_its_sandbox(home: &Home) {
    let up = Upstream::start();
    let mut m = home.stdio_with(&[("SANDBOX_MCP_EGRESS_PROXY", &up.url())]);
    let id = m.ok("create_sandbox", json!({"network": {"allow": ["pkgs.test"]}}))["sandbox_id"].as_str().unwrap().to_string();
    let flood = "python3 - <<'EOF'\nimport socket\nheld = []\nfor i in range(300):\n    try:\n        s = socket.create_connection(('127.0.0.1', 3128), timeout=2)\n        s.sendall(b'GET http://pkgs.test/ HTTP/1.1\\r\\n' + b'X: ' + b'a' * 20000)\n        held.append(s)\n    except OSError:\n        pass\nprint(len(held))\nfor s in held:\n    try:\n        s.settimeout(3)\n        s.recv(100)\n    except OSError:\n        pass\nEOF";
    let r = sh(&mut m, &id, flood);
    assert_eq!(out(&r).0, 0, "{r}");
    // After the flood, the proxy serves again.
    wait_for(Duration::from_secs(20), "the proxy to serve again", || {
        let r = sh(&mut m, &id, &format!("{CURL} http://pkgs.test/again"));
        (out(&r).1 == "hello pkgs.test /again\n").then_some(())
    });
}

/// On the e2b provider the same argument becomes E2B's egress rules (create and update), which the
/// emulator enforces with the local sandbox's proxy; a policy E2B cannot express is refused.
#[test]
fn e2b_maps_policies_to_its_egress_rules() {
    if isolated("net-e2b-probe").is_none() {
        return;
    }
    let up = Upstream::start();
    let e =
        E2bHome { emulator: Emulator::start_with("namespaces", &[("SANDBOX_MCP_EGRESS_PROXY", &up.url())]), home: Home::new("net-e2b") };
    let mut m = e.stdio();
    let policy = json!({"allow": ["pkgs.test"], "deny": []});
    let c = m.ok("create_sandbox", json!({"network": policy}));
    assert_eq!(c["network"], policy, "{c}");
    let id = c["sandbox_id"].as_str().unwrap().to_string();
    assert_eq!(out(&sh(&mut m, &id, &format!("{CURL} http://pkgs.test/e2b"))), (0, "hello pkgs.test /e2b\n".into()));
    let r = sh(&mut m, &id, &format!("{CURL} -i http://evil.test/"));
    assert!(out(&r).1.contains("403"), "{r}");
    m.ok("set_network", json!({"sandbox_id": id, "network": {"allow": ["evil.test"]}}));
    assert_eq!(out(&sh(&mut m, &id, &format!("{CURL} http://evil.test/e2b"))), (0, "hello evil.test /e2b\n".into()));
    m.ok("set_network", json!({"sandbox_id": id, "network": false}));
    assert!(out(&sh(&mut m, &id, &format!("{CURL} -i http://evil.test/"))).1.contains("network: false"));
    let err = m.err("create_sandbox", json!({"network": {"allow": ["a.test"], "deny": ["b.a.test"]}}));
    assert!(err.contains("E2B cannot express") && err.contains("b.a.test"), "{err}");
    let err = m.err("set_network", json!({"sandbox_id": id, "network": {"deny": ["b.test"]}}));
    assert!(err.contains("E2B cannot express"), "{err}");
}

/// Only the operator opens the host to sandboxes (`--egress-allow-host-services`); without the
/// option the same request is refused (see the test above).
#[test]
fn the_operator_can_open_host_services() {
    let Some(home) = isolated("net-host-services") else { return };
    let origin = Upstream::start();
    let mut m = home.stdio_with(&[("SANDBOX_MCP_EGRESS_ALLOW_HOST_SERVICES", "true")]);
    let id = m.ok("create_sandbox", json!({"network": true}))["sandbox_id"].as_str().unwrap().to_string();
    let r = sh(&mut m, &id, &format!("{CURL} -x http://127.0.0.1:3128 --noproxy '' http://127.0.0.1:{}/host", origin.port));
    assert_eq!(out(&r).0, 0, "{r}");
    assert!(out(&r).1.starts_with("hello "), "{r}");
    // Still no route of its own: only the proxy reaches the host.
    let r = sh(&mut m, &id, &format!("{CURL} --noproxy '*' http://127.0.0.1:{}/ || echo refused", origin.port));
    assert!(out(&r).1.contains("refused"), "{r}");
}
