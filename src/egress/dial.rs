//! Reaching a destination the policy allowed: the proxy resolves the name itself and connects to
//! an address it checked (the answer is pinned: no second lookup can rebind it), or hands the name
//! unresolved to the operator's parent proxy.

use super::{address, Settings};
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long a name may take to resolve.
const RESOLVE_BUDGET: Duration = Duration::from_secs(5);

/// How long a connection may take to open (to the destination or the parent proxy's answer).
pub const CONNECT_BUDGET: Duration = Duration::from_secs(10);

/// The longest answer head taken from the parent proxy.
const MAX_UPSTREAM_HEAD: usize = 16 * 1024;

/// Why a destination was not reached.
#[derive(Debug)]
pub enum DialError {
    /// Refused by the never-the-host rule (recorded and reported as a block).
    Refused(String),
    /// Could not be reached (a name that does not resolve, a refused connection).
    Failed(String),
}

/// How the connection was made.
pub enum Dialed {
    /// To the destination itself.
    Direct(TcpStream),
    /// To the parent proxy, which forwards absolute-form HTTP requests (plain HTTP only).
    Upstream(TcpStream),
}

/// Opens a connection to `host:port` (a lowercase name or an IP literal). With a parent proxy, a
/// tunnel (`tunnel`, CONNECT) or a connection to the parent for a plain HTTP request.
pub fn open(host: &str, port: u16, settings: &Settings, tunnel: bool) -> Result<Dialed, DialError> {
    let literal = host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>().ok();
    if !settings.host_services {
        if let Some(ip) = literal {
            if let Some(why) = address::refused(ip, false) {
                return Err(DialError::Refused(why));
            }
        } else if host == "localhost" || host.ends_with(".localhost") {
            return Err(DialError::Refused(format!("{host} names the host, never reachable from a sandbox")));
        }
    }
    if let Some(up) = &settings.upstream {
        let conn = connect_name(&up.host, up.port)
            .map_err(|e| DialError::Failed(format!("the parent proxy {}:{} is unreachable: {e}", up.host, up.port)))?;
        if !tunnel {
            return Ok(Dialed::Upstream(conn));
        }
        let authority = match literal {
            Some(IpAddr::V6(v6)) => format!("[{v6}]:{port}"),
            _ => format!("{host}:{port}"),
        };
        let auth = up.auth.as_ref().map(|a| format!("Proxy-Authorization: Basic {a}\r\n")).unwrap_or_default();
        let head = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n{auth}\r\n");
        (&conn).write_all(head.as_bytes()).map_err(|e| DialError::Failed(format!("the parent proxy failed: {e}")))?;
        let status = read_status(&conn).map_err(|e| DialError::Failed(format!("the parent proxy failed: {e}")))?;
        if status != 200 {
            return Err(DialError::Failed(format!("the parent proxy answered {status} to CONNECT {authority}")));
        }
        return Ok(Dialed::Direct(conn));
    }
    let addrs: Vec<SocketAddr> = match literal {
        Some(ip) => vec![SocketAddr::new(ip, port)],
        None => resolve(host, port).map_err(DialError::Failed)?,
    };
    let mut refusal = None;
    let mut last_err = None;
    for addr in addrs.iter().take(8) {
        if let Some(why) = address::refused(addr.ip(), settings.host_services) {
            refusal.get_or_insert(why);
            continue;
        }
        match TcpStream::connect_timeout(addr, CONNECT_BUDGET) {
            Ok(conn) => return Ok(Dialed::Direct(conn)),
            Err(err) => last_err = Some(format!("{addr}: {err}")),
        }
    }
    match (last_err, refusal) {
        (Some(err), _) => Err(DialError::Failed(format!("could not connect to {host}:{port} ({err})"))),
        (None, Some(why)) if literal.is_some() => Err(DialError::Refused(why)),
        (None, Some(why)) => Err(DialError::Refused(format!("{host} resolves to {why}"))),
        (None, None) => Err(DialError::Failed(format!("{host} has no address"))),
    }
}

/// Lookups running at once in this process: a lookup that outlives its budget keeps its thread
/// until the resolver gives up, and a sandbox asking for names that never answer must not pile
/// such threads up.
static LOOKUPS: AtomicUsize = AtomicUsize::new(0);

/// At most this many lookups at once.
const MAX_LOOKUPS: usize = 64;

/// The addresses of `host`, within [`RESOLVE_BUDGET`].
fn resolve(host: &str, port: u16) -> Result<Vec<SocketAddr>, String> {
    if LOOKUPS.fetch_add(1, Ordering::SeqCst) >= MAX_LOOKUPS {
        LOOKUPS.fetch_sub(1, Ordering::SeqCst);
        return Err(format!("could not resolve {host}: {MAX_LOOKUPS} lookups are already running; try again"));
    }
    let (tx, rx) = crossbeam_channel::bounded(1);
    let name = host.to_string();
    let spawned = std::thread::Builder::new().name("egress-resolve".into()).spawn(move || {
        let _ = tx.send((name.as_str(), port).to_socket_addrs().map(|a| a.collect::<Vec<_>>()));
        LOOKUPS.fetch_sub(1, Ordering::SeqCst);
    });
    if let Err(e) = spawned {
        LOOKUPS.fetch_sub(1, Ordering::SeqCst);
        return Err(format!("could not resolve {host}: {e}"));
    }
    match rx.recv_timeout(RESOLVE_BUDGET) {
        Ok(Ok(addrs)) => Ok(addrs),
        Ok(Err(err)) => Err(format!("could not resolve {host}: {err}")),
        Err(_) => Err(format!("could not resolve {host} within {} s", RESOLVE_BUDGET.as_secs())),
    }
}

/// Connects to the operator's parent proxy (its name is the operator's, resolved as given).
fn connect_name(host: &str, port: u16) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
    for addr in (host, port).to_socket_addrs()? {
        match TcpStream::connect_timeout(&addr, CONNECT_BUDGET) {
            Ok(conn) => return Ok(conn),
            Err(err) => last = err,
        }
    }
    Err(last)
}

/// Reads the parent proxy's answer head byte by byte (nothing of the tunnel after it), bounded in
/// size and time; returns its status code.
fn read_status(conn: &TcpStream) -> io::Result<u16> {
    let deadline = Instant::now() + CONNECT_BUDGET;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || head.len() > MAX_UPSTREAM_HEAD {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "no complete answer"));
        }
        conn.set_read_timeout(Some(left))?;
        match (&*conn).read(&mut byte) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "it closed the connection")),
            Ok(_) => head.push(byte[0]),
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
    conn.set_read_timeout(None)?;
    let line = String::from_utf8_lossy(&head);
    line.split(' ').nth(1).and_then(|s| s.parse().ok()).ok_or_else(|| io::Error::other("a malformed answer"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(host: &str) -> String {
        match open(host, 80, &Settings::default(), true) {
            Err(DialError::Refused(why)) => why,
            Err(DialError::Failed(why)) => panic!("{host}: failed instead of refused: {why}"),
            Ok(_) => panic!("{host}: connected"),
        }
    }

    /// The check applies to the address connected to: literals, `localhost`, and a name whose
    /// answer is the host (this machine's own name resolves to one of its addresses).
    #[test]
    fn the_host_is_refused_by_literal_name_and_resolution() {
        assert!(refused("127.0.0.1").contains("loopback"));
        assert!(refused("::ffff:10.0.0.1").contains("private"));
        assert!(refused("localhost").contains("names the host"));
        let name = rustix::system::uname().nodename().to_string_lossy().into_owned();
        if resolve(&name, 80).is_ok_and(|a| !a.is_empty()) {
            let why = refused(&name);
            assert!(why.contains(&format!("{name} resolves to")), "{why}");
        } else {
            eprintln!("this machine's name {name:?} does not resolve; the resolution case is not exercised here");
        }
    }
}
