//! The egress proxy of one sandbox: an HTTP forward proxy (absolute-form requests and CONNECT)
//! and a SOCKS5 endpoint on one listening socket (the first byte tells them apart), enforcing the
//! sandbox's current policy on every new connection. Bounded: [`MAX_CONNECTIONS`] at once, a
//! request head of at most [`MAX_HEAD`] bytes within [`HEAD_BUDGET`], and an idle relay ends after
//! [`IDLE_BUDGET`]. It logs `host:port` only, never a URL, its query or credentials.

use super::blocks::{Block, BlockLog};
use super::dial::{self, DialError, Dialed};
use super::policy::{Network, Refusal};
use super::request::{read_head, Request};
use super::{socks, Settings};
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Connections one sandbox's proxy serves at once; more are closed at once.
pub const MAX_CONNECTIONS: usize = crate::limits::EGRESS_MAX_CONNECTIONS;

/// The largest request head (request line and headers) taken.
pub const MAX_HEAD: usize = crate::limits::EGRESS_MAX_HEAD_BYTES;

/// How long a client has to send its whole request head (or SOCKS5 greeting and request).
pub const HEAD_BUDGET: Duration = crate::limits::EGRESS_HEAD_BUDGET;

/// A relay with no byte in either direction for this long ends.
pub const IDLE_BUDGET: Duration = crate::limits::EGRESS_IDLE_BUDGET;

/// One sandbox's proxy: where its policy comes from, where blocks go, the operator's settings.
pub struct Proxy {
    policy: Box<dyn Fn() -> Network + Send + Sync>,
    blocks: BlockLog,
    settings: Settings,
    active: AtomicUsize,
}

impl Proxy {
    /// A proxy that reads the policy with `policy` at each new connection (so a change holds for
    /// the next connection at once).
    pub fn new(policy: Box<dyn Fn() -> Network + Send + Sync>, blocks: BlockLog, settings: Settings) -> Proxy {
        Proxy { policy, blocks, settings, active: AtomicUsize::new(0) }
    }

    /// Records a refusal and returns the text that explains it to the sandbox.
    pub(super) fn refuse(&self, host: &str, port: u16, refusal: &Refusal) -> String {
        self.blocks.record(&Block { host: host.to_string(), port, reason: refusal.reason.clone() });
        log::info!("egress: blocked {host}:{port}: {}", refusal.reason);
        let how = if refusal.by_policy {
            format!(
                "To allow it, call set_network for this sandbox with network true or a policy whose allow list matches it, for example {{\"allow\": [\"{host}\"]}} (keep the names already allowed)."
            )
        } else {
            "The host, loopback, private, link-local (cloud metadata) and CGNAT addresses are never reachable from a sandbox, whatever its policy; only the server's operator can allow them (--egress-allow-host-services).".to_string()
        };
        format!("sandbox-mcp egress proxy: blocked {host}:{port}: {}.\n{how}\n", refusal.reason)
    }

    /// Decides and opens a connection to `host:port` for the sandbox; `Err` carries what to
    /// answer: `Ok(text)` a block explained, `Err(text)` a failure.
    pub(super) fn reach(&self, host: &str, port: u16, tunnel: bool) -> Result<Dialed, Result<String, String>> {
        let policy = (self.policy)();
        if let Err(refusal) = policy.decide(host) {
            return Err(Ok(self.refuse(host, port, &refusal)));
        }
        match dial::open(host, port, &self.settings, tunnel) {
            Ok(dialed) => Ok(dialed),
            Err(DialError::Refused(reason)) => Err(Ok(self.refuse(host, port, &Refusal { reason, by_policy: false }))),
            Err(DialError::Failed(why)) => {
                log::info!("egress: {host}:{port} unreachable");
                Err(Err(why))
            }
        }
    }

    /// The operator's settings.
    pub(super) fn settings(&self) -> &Settings {
        &self.settings
    }
}

/// Serves `listener` on a thread of its own until the process ends.
pub fn serve(listener: TcpListener, proxy: Arc<Proxy>) -> io::Result<()> {
    std::thread::Builder::new().name("egress-accept".into()).stack_size(128 * 1024).spawn(move || loop {
        let conn = match listener.accept() {
            Ok((conn, _)) => conn,
            Err(_) => {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        if proxy.active.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            proxy.active.fetch_sub(1, Ordering::SeqCst);
            log::info!("egress: {MAX_CONNECTIONS} connections already open; closing a new one");
            continue;
        }
        let mine = proxy.clone();
        let spawned = std::thread::Builder::new().name("egress-conn".into()).stack_size(256 * 1024).spawn(move || {
            handle(conn, &mine);
            mine.active.fetch_sub(1, Ordering::SeqCst);
        });
        if spawned.is_err() {
            proxy.active.fetch_sub(1, Ordering::SeqCst);
        }
    })?;
    Ok(())
}

/// Serves one connection from the sandbox.
pub fn handle(conn: TcpStream, proxy: &Proxy) {
    let _ = conn.set_nodelay(true);
    let deadline = Instant::now() + HEAD_BUDGET;
    if conn.set_read_timeout(Some(HEAD_BUDGET)).is_err() || conn.set_write_timeout(Some(IDLE_BUDGET)).is_err() {
        return;
    }
    let mut first = [0u8; 1];
    if (&conn).read_exact(&mut first).is_err() {
        return;
    }
    if first[0] == socks::VERSION {
        socks::handle(conn, proxy, deadline);
    } else {
        http(conn, first[0], proxy, deadline);
    }
}

/// One HTTP proxy request.
fn http(conn: TcpStream, first: u8, proxy: &Proxy, deadline: Instant) {
    let (head, rest) = match read_head(&conn, vec![first], deadline) {
        Ok(read) => read,
        Err(why) => return answer(&conn, 400, "Bad Request", &format!("sandbox-mcp egress proxy: {why}\n")),
    };
    let request = match Request::parse(&head) {
        Ok(r) => r,
        Err(why) => return answer(&conn, 400, "Bad Request", &format!("sandbox-mcp egress proxy: {why}\n")),
    };
    let tunnel = request.method == "CONNECT";
    let body = if tunnel {
        0
    } else {
        match request.body_length() {
            Ok(n) => n,
            Err(why) => return answer(&conn, 411, "Length Required", &format!("sandbox-mcp egress proxy: {why}\n")),
        }
    };
    let dialed = match proxy.reach(&request.host, request.port, tunnel) {
        Ok(d) => d,
        Err(Ok(blocked)) => return answer(&conn, 403, "Forbidden", &blocked),
        Err(Err(failed)) => return answer(&conn, 502, "Bad Gateway", &format!("sandbox-mcp egress proxy: {failed}\n")),
    };
    let (upstream, out_head) = match dialed {
        Dialed::Direct(up) if tunnel => {
            if (&conn).write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").is_err() {
                return;
            }
            (up, Vec::new())
        }
        Dialed::Direct(up) => (up, request.rewrite(false, None)),
        Dialed::Upstream(up) => (up, request.rewrite(true, proxy.settings().upstream.as_ref().and_then(|u| u.auth.as_deref()))),
    };
    // No write waits longer than the idle budget, whichever side stops reading (the destination
    // may be the sandbox's own accomplice).
    for side in [&upstream, &conn] {
        let _ = side.set_write_timeout(Some(IDLE_BUDGET));
    }
    if tunnel {
        if (&upstream).write_all(&rest).is_ok() {
            crate::relay::relay(conn, upstream, IDLE_BUDGET, "egress-relay");
        }
        return;
    }
    // One request per connection, and nothing of the client's but its body: a second request
    // written after it (to another host) never reaches the destination or the parent proxy.
    if (&upstream).write_all(&out_head).is_err() || !forward_body(&conn, &upstream, &rest, body) {
        return;
    }
    crate::relay::pump(upstream, conn, IDLE_BUDGET);
}

/// The buffer of a plain-HTTP request's body on its way to the destination.
const BODY_BUFFER: usize = 64 * 1024;

/// Forwards exactly `length` bytes of request body: what came with the head (`early`), then the
/// rest from `client`. `false` when the client or the destination failed.
fn forward_body(client: &TcpStream, upstream: &TcpStream, early: &[u8], length: u64) -> bool {
    let first = early.len().min(usize::try_from(length).unwrap_or(usize::MAX));
    if (&*upstream).write_all(&early[..first]).is_err() {
        return false;
    }
    let mut left = length - first as u64;
    let _ = client.set_read_timeout(Some(IDLE_BUDGET));
    let mut buf = vec![0u8; BODY_BUFFER];
    while left > 0 {
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        match (&*client).read(&mut buf[..want]) {
            Ok(0) => return false,
            Ok(n) => {
                if (&*upstream).write_all(&buf[..n]).is_err() {
                    return false;
                }
                left -= n as u64;
            }
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    true
}

/// Answers with `status` and a plain-text body, then closes.
fn answer(conn: &TcpStream, status: u16, reason: &str, body: &str) {
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = (&*conn).write_all(head.as_bytes()).and_then(|()| (&*conn).write_all(body.as_bytes()));
    let _ = conn.shutdown(Shutdown::Write);
    // Let the client read the answer before the close resets the connection: what it still
    // sends is drained for a moment, not for as long as it keeps sending.
    let mut sink = [0u8; 1024];
    let until = Instant::now() + Duration::from_millis(500);
    let _ = conn.set_read_timeout(Some(Duration::from_millis(200)));
    while Instant::now() < until && matches!((&*conn).read(&mut sink), Ok(n) if n > 0) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::Upstream;
    use std::io::Write;
    use std::net::TcpListener;
    use std::sync::{Arc, Mutex};

    /// A stand-in for a parent proxy on loopback: it records the first line of what reaches it
    /// and closes.
    fn parent(seen: Arc<Mutex<Vec<String>>>) -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
                let mut head = [0u8; 256];
                let n = (&conn).read(&mut head).unwrap_or(0);
                let line = String::from_utf8_lossy(&head[..n]).lines().next().unwrap_or_default().to_string();
                seen.lock().unwrap().push(line);
            }
        });
        port
    }

    /// Sends `request` to the proxy through a connection of its own; what the proxy answered.
    fn ask(proxy: &Arc<Proxy>, request: &[u8]) -> Vec<u8> {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (s, _) = listener.accept().unwrap();
        let p = proxy.clone();
        let served = std::thread::spawn(move || handle(s, &p));
        c.write_all(request).unwrap();
        let _ = c.shutdown(std::net::Shutdown::Write);
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut answer = Vec::new();
        let _ = c.read_to_end(&mut answer);
        served.join().unwrap();
        answer
    }

    /// An IPv4 address in a shorthand notation (`127.1`) is refused before anything reaches the
    /// parent proxy, which would resolve it to the host's loopback, by CONNECT, by an absolute
    /// URL and by a SOCKS5 name (found by a review: it went to the parent as a name).
    #[test]
    fn shorthand_ipv4_never_reaches_the_parent_proxy() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let port = parent(seen.clone());
        let dir = std::env::temp_dir().join(format!("egress-shorthand-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let settings = Settings { upstream: Some(Upstream::parse(&format!("http://127.0.0.1:{port}")).unwrap()), host_services: false };
        let proxy = Arc::new(Proxy::new(Box::new(|| Network::Any), BlockLog::new(&dir), settings));
        for odd in ["127.1", "2130706433", "0x7f.1", "0177.0.0.1"] {
            let answer = ask(&proxy, format!("CONNECT {odd}:22 HTTP/1.1\r\n\r\n").as_bytes());
            assert!(answer.starts_with(b"HTTP/1.1 400"), "{odd}: {}", String::from_utf8_lossy(&answer));
            let answer = ask(&proxy, format!("GET http://{odd}:22/ HTTP/1.1\r\n\r\n").as_bytes());
            assert!(answer.starts_with(b"HTTP/1.1 400"), "{odd}: {}", String::from_utf8_lossy(&answer));
            let mut socks = vec![5, 1, 0, 5, 1, 0, 3, odd.len() as u8];
            socks.extend_from_slice(odd.as_bytes());
            socks.extend_from_slice(&22u16.to_be_bytes());
            let answer = ask(&proxy, &socks);
            assert_eq!(answer.get(..2), Some(&[5, 0][..]), "{odd}: {answer:?}");
            assert_ne!(answer.get(3), Some(&0), "{odd}: the SOCKS request succeeded: {answer:?}");
        }
        // The stand-in is reachable: a name goes there.
        let answer = ask(&proxy, b"CONNECT pkgs.test:443 HTTP/1.1\r\n\r\n");
        assert!(!answer.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&answer));
        let _ = std::fs::remove_dir_all(&dir);
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen, vec!["CONNECT pkgs.test:443 HTTP/1.1".to_string()], "only the name reached the parent");
    }
}
