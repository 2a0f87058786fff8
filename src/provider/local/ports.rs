//! Exposed ports of an isolated sandbox: a TCP port a sandbox process listens on, on the
//! sandbox's own loopback interface, made reachable from the host through a relay that its
//! keeper runs (so it outlives the server that asked for it and stops with the sandbox).
//!
//! The keeper listens on a unix socket, [`SOCKET_FILE`] in the sandbox's directory (0600, out of
//! the sandbox's sight), one request line per connection: `expose <port> <address>` binds a
//! host listener on `<address>` (an ephemeral port) and answers `exposed <address:port>`;
//! `unexpose <port>` closes the listener, cuts the port's open connections (both sides see a
//! reset) and answers `unexposed`; failures answer `error <what failed>`. The keeper records what it exposes in
//! [`STATE_FILE`], which a keeper restarted by a sweep reads to listen again on the same host
//! addresses.
//!
//! Each connection accepted on a host listener is relayed to a socket that the sandbox's init
//! connects inside the sandbox's network namespace and hands over (`spawner::dial`). The sandbox
//! is hostile: the relay ([`crate::relay`]) bounds its buffers for the whole keeper, every read
//! and write has the idle budget, a port serves at most [`MAX_CONNECTIONS`] connections at once
//! (more are reset at once), and each connection has its own threads, so one that stalls or
//! floods costs only itself.

use super::isolation::spawner;
use crate::limits;
use crate::relay::Link;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The keeper's socket for expose and unexpose requests, in a sandbox's directory.
pub const SOCKET_FILE: &str = "ports.sock";

/// What the keeper exposes (`{"<port>": "<host address:port>"}`), in a sandbox's directory.
pub const STATE_FILE: &str = "ports.json";

/// Ports exposed per sandbox at once.
pub const MAX_PORTS: usize = limits::EXPOSED_PORTS_MAX;

/// Connections one exposed port relays at once.
pub const MAX_CONNECTIONS: usize = limits::EXPOSED_PORT_MAX_CONNECTIONS;

/// A relayed connection with no byte moving in either direction for this long ends.
const IDLE_BUDGET: Duration = limits::EXPOSED_PORT_IDLE_BUDGET;

/// The longest request line the keeper reads, and answer line the server reads.
const MAX_LINE: usize = 512;

/// How long one request to the keeper may take (the keeper's dial has its own, shorter budget).
pub const REQUEST_BUDGET: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// Server side

/// Sends one request line to the keeper of the sandbox in `dir`; its answer line, or why none,
/// within [`REQUEST_BUDGET`] and by `deadline` (the keeper answers one request at a time, and a
/// dial into a taken-over sandbox may take its whole budget: the connect is bounded too).
pub fn request(dir: &Path, line: &str, deadline: Instant) -> io::Result<String> {
    let budget = REQUEST_BUDGET.min(deadline.saturating_duration_since(Instant::now()));
    if budget.is_zero() {
        return Err(io::Error::new(io::ErrorKind::TimedOut, "the call's deadline passed before the request"));
    }
    let conn = super::isolation::spawner::connect_within(&dir.join(SOCKET_FILE), budget)?;
    conn.set_read_timeout(Some(budget))?;
    (&conn).write_all(format!("{line}\n").as_bytes())?;
    let mut answer = String::new();
    BufReader::new((&conn).take(MAX_LINE as u64)).read_line(&mut answer)?;
    Ok(answer.trim_end().to_string())
}

/// What the keeper of the sandbox in `dir` exposes now: sandbox port → host address.
pub fn exposed(dir: &Path) -> BTreeMap<u16, SocketAddr> {
    fs::read(dir.join(STATE_FILE)).ok().and_then(|text| serde_json::from_slice::<State>(&text).ok()).map(|s| s.ports).unwrap_or_default()
}

/// The URL of a host address.
pub fn url(addr: SocketAddr) -> String {
    let ip = match addr.ip() {
        IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::from([127, 0, 0, 1]),
        IpAddr::V6(v6) if v6.is_unspecified() => IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    format!("http://{}", SocketAddr::new(ip, addr.port()))
}

// ---------------------------------------------------------------------------------------------
// Keeper side

/// The file [`STATE_FILE`].
#[derive(Debug, Default, Serialize, Deserialize)]
struct State {
    ports: BTreeMap<u16, SocketAddr>,
}

/// One exposed port.
struct Exposure {
    host: SocketAddr,
    listener: Arc<TcpListener>,
    closed: Arc<AtomicBool>,
    /// Its open connections, to cut with it.
    conns: Conns,
}

/// An exposed port's relayed connections by number; a connection whose relay has not started
/// yet (its inside end is being dialled) has no link, and its relay looks at the port's
/// `closed` flag before it starts.
type Conns = Arc<Mutex<BTreeMap<u64, Option<Arc<Link>>>>>;

/// The keeper's exposed ports.
pub struct Relays {
    dir: PathBuf,
    /// The sandbox's spawner, which dials its ports.
    spawner: spawner::Endpoint,
    by_port: Mutex<BTreeMap<u16, Exposure>>,
    next_conn: AtomicU64,
}

impl Relays {
    /// Serves the expose and unexpose requests of the sandbox in `dir` from this keeper (a thread
    /// of its own) after listening again on what [`STATE_FILE`] records. Returns without serving
    /// when the socket cannot be bound (exposing then fails with a clear error).
    pub fn serve(dir: &Path) {
        let relays = Arc::new(Relays {
            dir: dir.to_path_buf(),
            spawner: spawner::Endpoint::in_dir(dir, true),
            by_port: Mutex::new(BTreeMap::new()),
            next_conn: AtomicU64::new(0),
        });
        let path = dir.join(SOCKET_FILE);
        let _ = fs::remove_file(&path);
        let listener =
            match UnixListener::bind(&path).and_then(|l| fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).map(|()| l)) {
                Ok(l) => l,
                Err(err) => {
                    log::warn!("keeper: could not bind {}: {err}; this sandbox's ports cannot be exposed", path.display());
                    return;
                }
            };
        for (port, host) in exposed(dir) {
            if let Err(why) = relays.expose(port, host) {
                log::warn!("keeper: could not expose port {port} again on {host}: {why}");
            }
        }
        relays.save();
        let spawned = std::thread::Builder::new().name("ports".into()).stack_size(128 * 1024).spawn(move || {
            loop {
                match listener.accept() {
                    Ok((conn, _)) => relays.answer(conn),
                    Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                    // Out of descriptors, say: the request waits in the backlog; wait rather
                    // than spin on it (found by a review: a full core until descriptors freed).
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        });
        if let Err(err) = spawned {
            log::warn!("keeper: could not start the ports thread: {err}");
        }
    }

    fn answer(&self, conn: UnixStream) {
        let _ = conn.set_read_timeout(Some(REQUEST_BUDGET));
        let _ = conn.set_write_timeout(Some(REQUEST_BUDGET));
        let mut line = String::new();
        if BufReader::new((&conn).take(MAX_LINE as u64)).read_line(&mut line).is_err() {
            return;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let reply = match words.as_slice() {
            ["expose", port, ip] => match (port.parse::<u16>(), ip.parse::<IpAddr>()) {
                (Ok(port), Ok(ip)) if port > 0 => self.expose_checked(port, ip).map(|host| format!("exposed {host}")),
                _ => Err("malformed expose request".to_string()),
            },
            ["unexpose", port] => match port.parse::<u16>() {
                Ok(port) => self.unexpose(port).map(|()| "unexposed".to_string()),
                Err(_) => Err("malformed unexpose request".to_string()),
            },
            _ => Err("unknown request".to_string()),
        };
        let line = match reply {
            Ok(text) => format!("{text}\n"),
            Err(why) => format!("error {}\n", why.replace('\n', " ")),
        };
        let _ = (&conn).write_all(line.as_bytes());
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u16, Exposure>> {
        self.by_port.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Exposes `port` on `ip` (an ephemeral port) once something listens on it inside; an
    /// already exposed port answers its address.
    fn expose_checked(self: &Relays, port: u16, ip: IpAddr) -> Result<SocketAddr, String> {
        if let Some(e) = self.lock().get(&port) {
            return Ok(e.host);
        }
        if self.lock().len() >= MAX_PORTS {
            return Err(format!("this sandbox already exposes {MAX_PORTS} ports; unexpose_port one first"));
        }
        // Nothing listening is an error now rather than a URL whose connections all fail.
        spawner::dial(&self.spawner, port).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => {
                format!("this sandbox's init serves no spawner ({e}), so nothing can reach its ports; recreate the sandbox to expose them")
            }
            _ => e.to_string(),
        })?;
        let host = self.expose(port, SocketAddr::new(ip, 0))?;
        self.save();
        Ok(host)
    }

    /// Listens on `host` and relays its connections to `port` inside.
    fn expose(&self, port: u16, host: SocketAddr) -> Result<SocketAddr, String> {
        let listener = TcpListener::bind(host).map_err(|e| format!("could not listen on {host}: {e}"))?;
        let bound = listener.local_addr().map_err(|e| e.to_string())?;
        let listener = Arc::new(listener);
        let closed = Arc::new(AtomicBool::new(false));
        let conns = Arc::new(Mutex::new(BTreeMap::new()));
        let to = self.spawner.clone();
        let (l, c, cs) = (listener.clone(), closed.clone(), conns.clone());
        let ids = Arc::new(AtomicU64::new(self.next_conn.fetch_add(1 << 32, Ordering::Relaxed)));
        std::thread::Builder::new()
            .name(format!("port-{port}"))
            .stack_size(128 * 1024)
            .spawn(move || accept(&l, &c, &cs, &ids, &to, port))
            .map_err(|e| format!("could not start the relay: {e}"))?;
        self.lock().insert(port, Exposure { host: bound, listener, closed, conns });
        Ok(bound)
    }

    fn unexpose(&self, port: u16) -> Result<(), String> {
        let Some(e) = self.lock().remove(&port) else {
            return Err(format!("port {port} is not exposed; expose_port exposes it"));
        };
        e.closed.store(true, Ordering::SeqCst);
        // Wakes the accept (Linux ends a blocked accept on a shut-down listener).
        let _ = rustix::net::shutdown(&*e.listener, rustix::net::Shutdown::Both);
        // Both sides of each open connection see it end at once, as a reset: the sandbox's
        // server too, which would otherwise hold its relay until the idle budget.
        for link in e.conns.lock().unwrap_or_else(PoisonError::into_inner).values().flatten() {
            link.cut();
        }
        self.save();
        Ok(())
    }

    fn save(&self) {
        let state = State { ports: self.lock().iter().map(|(p, e)| (*p, e.host)).collect() };
        let Ok(text) = serde_json::to_vec(&state) else { return };
        let tmp = self.dir.join(format!("{STATE_FILE}.tmp"));
        let _ = fs::remove_file(&tmp);
        let written = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| f.write_all(&text))
            .and_then(|()| fs::rename(&tmp, self.dir.join(STATE_FILE)));
        if written.is_err() {
            log::warn!("keeper: could not record the exposed ports in {}", self.dir.display());
        }
    }
}

/// Accepts the connections of one exposed port until it is closed.
fn accept(listener: &TcpListener, closed: &Arc<AtomicBool>, conns: &Conns, ids: &AtomicU64, to: &spawner::Endpoint, port: u16) {
    loop {
        let accepted = listener.accept();
        if closed.load(Ordering::SeqCst) {
            if let Ok((client, _)) = accepted {
                crate::relay::refuse(client);
            }
            return;
        }
        let client = match accepted {
            Ok((client, _)) => client,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => {
                // Out of descriptors, say: wait rather than spin.
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let id = ids.fetch_add(1, Ordering::Relaxed);
        {
            let mut open = conns.lock().unwrap_or_else(PoisonError::into_inner);
            if open.len() >= MAX_CONNECTIONS {
                // Full: this connection is reset at once; the ones open go on.
                crate::relay::refuse(client);
                continue;
            }
            open.insert(id, None);
        }
        let (open, to, closed) = (conns.clone(), to.clone(), closed.clone());
        let spawned = std::thread::Builder::new().name(format!("port-{port}-conn")).stack_size(128 * 1024).spawn(move || {
            match spawner::dial(&to, port) {
                Ok(inside) => {
                    let link = Link::new(client, inside, IDLE_BUDGET);
                    {
                        let mut open = open.lock().unwrap_or_else(PoisonError::into_inner);
                        // Unexposed while it was dialled: `unexpose` did not see this link.
                        if closed.load(Ordering::SeqCst) {
                            link.cut();
                        }
                        open.insert(id, Some(link.clone()));
                    }
                    link.relay(IDLE_BUDGET, "port-relay");
                }
                Err(err) => {
                    log::debug!("port {port}: could not reach it inside the sandbox: {err}");
                    crate::relay::refuse(client);
                }
            }
            open.lock().unwrap_or_else(PoisonError::into_inner).remove(&id);
        });
        if spawned.is_err() {
            conns.lock().unwrap_or_else(PoisonError::into_inner).remove(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The keeper's request socket: malformed requests, an unexposed port, and a sandbox with no
    /// init to dial are answered with errors; nothing is exposed or recorded.
    #[test]
    fn bad_requests_are_answered_with_errors() {
        let dir = std::env::temp_dir().join(format!("smcp-ports-{}", crate::ids::random_hex(4)));
        fs::create_dir_all(&dir).unwrap();
        Relays::serve(&dir);
        let long = format!("expose {}", "9".repeat(2000));
        for (line, answer) in [
            ("bogus", "error unknown request"),
            ("expose 0 127.0.0.1", "error malformed expose request"),
            ("expose 70000 127.0.0.1", "error malformed expose request"),
            ("expose 80 not-an-address", "error malformed expose request"),
            ("unexpose x", "error malformed unexpose request"),
            ("unexpose 80", "error port 80 is not exposed; expose_port exposes it"),
            (long.as_str(), "error unknown request"),
        ] {
            assert_eq!(request(&dir, line, Instant::now() + REQUEST_BUDGET).unwrap(), answer, "{line}");
        }
        assert!(request(&dir, "expose 80 127.0.0.1", Instant::now() + REQUEST_BUDGET).unwrap().starts_with("error "));
        assert!(exposed(&dir).is_empty());
        let _ = fs::remove_dir_all(&dir);
    }

    /// A keeper that accepts nothing (its backlog full: it answers one request at a time) holds
    /// a request no longer than the call's deadline; the connect used to wait without one (found
    /// by a review).
    #[test]
    fn a_keeper_that_accepts_nothing_costs_a_request_its_deadline() {
        let dir = std::env::temp_dir().join(format!("smcp-ports-{}", crate::ids::random_hex(4)));
        fs::create_dir_all(&dir).unwrap();
        let _listener = std::os::unix::net::UnixListener::bind(dir.join(SOCKET_FILE)).unwrap();
        let mut queued = Vec::new();
        while let Ok(c) = super::super::isolation::spawner::connect_within(&dir.join(SOCKET_FILE), Duration::from_millis(50)) {
            queued.push(c);
            assert!(queued.len() < 100_000, "the backlog never filled");
        }
        let started = Instant::now();
        assert!(request(&dir, "bogus", Instant::now() + Duration::from_millis(300)).is_err());
        assert!(started.elapsed() < Duration::from_secs(3), "it waited {:?}", started.elapsed());
        assert!(request(&dir, "bogus", Instant::now()).is_err(), "a deadline already passed");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn urls_name_a_reachable_address() {
        assert_eq!(url("127.0.0.1:4000".parse().unwrap()), "http://127.0.0.1:4000");
        assert_eq!(url("0.0.0.0:4000".parse().unwrap()), "http://127.0.0.1:4000");
        assert_eq!(url("[::]:4000".parse().unwrap()), "http://[::1]:4000");
        assert_eq!(url("192.0.2.7:80".parse().unwrap()), "http://192.0.2.7:80");
    }
}
