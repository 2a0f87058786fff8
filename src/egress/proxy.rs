//! The egress proxy of one sandbox: an HTTP forward proxy (absolute-form requests and CONNECT)
//! and a SOCKS5 endpoint on one listening socket (the first byte tells them apart), enforcing the
//! sandbox's current policy on every new connection. Bounded: [`MAX_CONNECTIONS`] at once, a
//! request head of at most [`MAX_HEAD`] bytes within [`HEAD_BUDGET`], and an idle relay ends after
//! [`IDLE_BUDGET`]. It logs `host:port` only, never a URL, its query or credentials.

use super::blocks::{Block, BlockLog};
use super::dial::{self, DialError, Dialed};
use super::policy::{self, Network, Refusal};
use super::{socks, Settings};
use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, TcpListener, TcpStream};
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

/// The relay buffer (large enough to keep up with a loopback transfer).
const RELAY_BUFFER: usize = 64 * 1024;

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
    if tunnel {
        if (&upstream).write_all(&rest).is_ok() {
            relay(conn, upstream);
        }
        return;
    }
    // One request per connection, and nothing of the client's but its body: a second request
    // written after it (to another host) never reaches the destination or the parent proxy.
    if (&upstream).write_all(&out_head).is_err() || !forward_body(&conn, &upstream, &rest, body) {
        return;
    }
    let _ = upstream.set_read_timeout(Some(IDLE_BUDGET));
    pump(upstream, conn);
}

/// Forwards exactly `length` bytes of request body: what came with the head (`early`), then the
/// rest from `client`. `false` when the client or the destination failed.
fn forward_body(client: &TcpStream, upstream: &TcpStream, early: &[u8], length: u64) -> bool {
    let first = early.len().min(usize::try_from(length).unwrap_or(usize::MAX));
    if (&*upstream).write_all(&early[..first]).is_err() {
        return false;
    }
    let mut left = length - first as u64;
    let _ = client.set_read_timeout(Some(IDLE_BUDGET));
    let mut buf = vec![0u8; RELAY_BUFFER];
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
    // Let the client read the answer before the close resets the connection.
    let mut sink = [0u8; 1024];
    let _ = conn.set_read_timeout(Some(Duration::from_millis(200)));
    while matches!((&*conn).read(&mut sink), Ok(n) if n > 0) {}
}

/// Reads a request head (to the blank line), at most [`MAX_HEAD`] bytes, by `deadline` however
/// slowly it comes; returns the head and what came after it.
fn read_head(conn: &TcpStream, mut buf: Vec<u8>, deadline: Instant) -> Result<(Vec<u8>, Vec<u8>), String> {
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            return Ok((buf, rest));
        }
        if buf.len() > MAX_HEAD {
            return Err(format!("the request head is longer than {MAX_HEAD} bytes"));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || conn.set_read_timeout(Some(left)).is_err() {
            return Err(format!("the request head did not arrive within {} s", HEAD_BUDGET.as_secs()));
        }
        match (&*conn).read(&mut chunk) {
            Ok(0) => return Err("the connection closed before the end of the request head".into()),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return Err(format!("the request head did not arrive within {} s", HEAD_BUDGET.as_secs())),
        }
    }
}

/// A parsed proxy request.
#[derive(Debug, PartialEq)]
struct Request {
    method: String,
    /// Lowercase name, or an IP literal (IPv6 without brackets).
    host: String,
    port: u16,
    /// The origin-form target (`/path?query`); empty for CONNECT.
    path: String,
    version: String,
    /// The header lines, as sent.
    headers: Vec<String>,
}

impl Request {
    /// The length of the request body: its `Content-Length`, 0 without one; a chunked body is
    /// refused (its end could hide a second request).
    fn body_length(&self) -> Result<u64, String> {
        let mut length = 0;
        for header in &self.headers {
            let (name, value) = header.split_once(':').unwrap_or((header, ""));
            match name.trim().to_ascii_lowercase().as_str() {
                "transfer-encoding" => {
                    return Err("request bodies must have a Content-Length through this proxy (no chunked encoding)".into())
                }
                "content-length" => length = value.trim().parse().map_err(|_| "a malformed Content-Length".to_string())?,
                _ => {}
            }
        }
        Ok(length)
    }

    fn parse(head: &[u8]) -> Result<Request, String> {
        let text = std::str::from_utf8(head).map_err(|_| "the request head is not text".to_string())?;
        let mut lines = text.split("\r\n");
        let line = lines.next().unwrap_or_default();
        let mut parts = line.split(' ');
        let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
            return Err("a malformed request line".into());
        };
        if !version.starts_with("HTTP/1.") || method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
            return Err("a malformed request line".into());
        }
        let (authority, path) = if method == "CONNECT" {
            (target, String::new())
        } else if let Some(rest) = target.strip_prefix("http://") {
            match rest.find('/') {
                Some(at) => (&rest[..at], rest[at..].to_string()),
                None => (rest, "/".to_string()),
            }
        } else {
            return Err("this is the sandbox's HTTP proxy: send absolute http:// URLs, or CONNECT host:port for anything else".into());
        };
        // Credentials in the URL are dropped, never forwarded or logged.
        let authority = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
        let default_port = if method == "CONNECT" { 0 } else { 80 };
        let (host, port) =
            split_host_port(authority, default_port).filter(|(_, p)| *p != 0).ok_or("the request names no valid host and port")?;
        let headers = lines.filter(|l| !l.is_empty()).map(str::to_string).collect();
        Ok(Request { method: method.to_string(), host, port, path, version: version.to_string(), headers })
    }

    /// The head sent on: origin-form to the destination, absolute-form to a parent proxy (with
    /// its credentials); hop-by-hop and proxy headers dropped, one request per connection.
    fn rewrite(&self, absolute: bool, auth: Option<&str>) -> Vec<u8> {
        let authority = match self.host.parse::<IpAddr>() {
            Ok(IpAddr::V6(v6)) => format!("[{v6}]:{}", self.port),
            _ => format!("{}:{}", self.host, self.port),
        };
        let target = if absolute { format!("http://{authority}{}", self.path) } else { self.path.clone() };
        let mut out = format!("{} {target} {}\r\n", self.method, self.version);
        // The Host header names the destination that was checked, whatever the client wrote.
        let host =
            if self.port == 80 { authority.rsplit_once(':').map_or(authority.as_str(), |(h, _)| h).to_string() } else { authority.clone() };
        out.push_str(&format!("Host: {host}\r\n"));
        for header in &self.headers {
            let name = header.split(':').next().unwrap_or_default().trim().to_ascii_lowercase();
            if !matches!(name.as_str(), "host" | "proxy-connection" | "proxy-authorization" | "connection" | "keep-alive") {
                out.push_str(header);
                out.push_str("\r\n");
            }
        }
        if let Some(auth) = auth {
            out.push_str(&format!("Proxy-Authorization: Basic {auth}\r\n"));
        }
        out.push_str("Connection: close\r\n\r\n");
        out.into_bytes()
    }
}

/// Splits `host:port` (`[v6]:port`; `default` when no port is given and `default` is not 0)
/// into a lowercase host that is a valid name or IP literal, and the port.
pub fn split_host_port(authority: &str, default: u16) -> Option<(String, u16)> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (v6, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None if after.is_empty() && default != 0 => default,
            None => return None,
        };
        (v6.parse::<std::net::Ipv6Addr>().ok()?.to_string(), port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), p.parse().ok()?),
            None if default != 0 => (authority.to_string(), default),
            None => return None,
        }
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    valid_host(&host).then_some((host, port))
}

/// Whether `host` is an IP literal or a valid domain name.
pub fn valid_host(host: &str) -> bool {
    host.parse::<IpAddr>().is_ok() || policy::check_name(host).is_ok()
}

/// Copies both ways between the sandbox's connection and the destination until both ends are
/// done or nothing moves for [`IDLE_BUDGET`].
pub(super) fn relay(client: TcpStream, upstream: TcpStream) {
    let _ = upstream.set_nodelay(true);
    for s in [&client, &upstream] {
        let _ = s.set_read_timeout(Some(IDLE_BUDGET));
        let _ = s.set_write_timeout(Some(IDLE_BUDGET));
    }
    let (Ok(client2), Ok(upstream2)) = (client.try_clone(), upstream.try_clone()) else { return };
    let back = std::thread::Builder::new().name("egress-relay".into()).stack_size(128 * 1024).spawn(move || pump(upstream2, client2));
    pump(client, upstream);
    if let Ok(back) = back {
        let _ = back.join();
    }
}

/// Copies `from` into `to` until the end, an error or the idle budget, then closes `to` for
/// writing.
pub(super) fn pump(from: TcpStream, to: TcpStream) {
    let mut buf = vec![0u8; RELAY_BUFFER];
    loop {
        match (&from).read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if (&to).write_all(&buf[..n]).is_err() {
                    let _ = from.shutdown(Shutdown::Read);
                    break;
                }
            }
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => {
                // Idle or failed: end both directions.
                let _ = from.shutdown(Shutdown::Both);
                break;
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_and_rewrite_without_proxy_headers() {
        let r = Request::parse(b"GET http://User:Pw@Pkgs.Test:8080/simple/x?token=s HTTP/1.1\r\nHost: pkgs.test\r\nProxy-Authorization: Basic eA==\r\nProxy-Connection: keep-alive\r\nAccept: */*\r\n\r\n").unwrap();
        assert_eq!((r.host.as_str(), r.port, r.path.as_str()), ("pkgs.test", 8080, "/simple/x?token=s"));
        let out = String::from_utf8(r.rewrite(false, None)).unwrap();
        assert_eq!(out, "GET /simple/x?token=s HTTP/1.1\r\nHost: pkgs.test:8080\r\nAccept: */*\r\nConnection: close\r\n\r\n");
        let lying = Request::parse(b"GET http://a.test/ HTTP/1.1\r\nHost: evil.test\r\nContent-Length: 5\r\n\r\n").unwrap();
        let out = String::from_utf8(lying.rewrite(false, None)).unwrap();
        assert!(out.contains("Host: a.test\r\n") && !out.contains("evil"), "{out}");
        assert_eq!(lying.body_length(), Ok(5));
        let chunked = Request::parse(b"POST http://a.test/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n").unwrap();
        assert!(chunked.body_length().is_err());
        let out = String::from_utf8(r.rewrite(true, Some("dTpw"))).unwrap();
        assert!(
            out.starts_with("GET http://pkgs.test:8080/simple/x?token=s HTTP/1.1\r\n") && out.contains("Proxy-Authorization: Basic dTpw"),
            "{out}"
        );
        let c = Request::parse(b"CONNECT [::1]:443 HTTP/1.1\r\n\r\n").unwrap();
        assert_eq!((c.host.as_str(), c.port), ("::1", 443));
        assert!(Request::parse(b"CONNECT host.test HTTP/1.1\r\n\r\n").is_err(), "CONNECT needs a port");
        assert!(Request::parse(b"GET / HTTP/1.1\r\n\r\n").unwrap_err().contains("absolute"));
        assert!(Request::parse(b"GET https://x.test/ HTTP/1.1\r\n\r\n").is_err());
        assert!(Request::parse(b"GET http://bad host/ HTTP/1.1\r\n\r\n").is_err());
        assert!(Request::parse(b"GET http://a_b.test\x01/ HTTP/1.1\r\n\r\n").is_err());
    }

    #[test]
    fn heads_are_bounded_in_size_and_time() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let flood = std::thread::spawn(move || {
            let mut c = TcpStream::connect(addr).unwrap();
            let _ = c.write_all(b"GET http://x.test/ HTTP/1.1\r\n");
            while c.write_all(b"X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n").is_ok() {}
        });
        let (conn, _) = listener.accept().unwrap();
        let err = read_head(&conn, Vec::new(), Instant::now() + Duration::from_secs(5)).unwrap_err();
        assert!(err.contains("longer than"), "{err}");
        drop(conn);
        flood.join().unwrap();
        let _slow = TcpStream::connect(addr).unwrap();
        let (conn, _) = listener.accept().unwrap();
        let t0 = Instant::now();
        let err = read_head(&conn, Vec::new(), Instant::now() + Duration::from_millis(200)).unwrap_err();
        assert!(err.contains("did not arrive") && t0.elapsed() < Duration::from_secs(2), "{err}");
    }
}
