//! The byte relay between two TCP connections, used by a sandbox's egress proxy (its tunnels and
//! plain-HTTP answers) and by an exposed port (the host's connection and the sandbox's server).
//!
//! One thread per direction copies through a buffer of its own. A connection ends when both
//! directions reached their end (each end is passed on as a half close), when a read or write
//! fails, or when no byte moved in either direction for the idle budget: a long download whose
//! other direction is silent is not idle.
//!
//! Bulk transfers go through at close to loopback speed: a direction whose reads fill its buffer
//! doubles it, up to [`BUFFER_MAX`], while the process's relays together hold at most
//! [`GROWTH_BUDGET`] beyond their first [`BUFFER_START`] each; and where the host lets a socket
//! have large kernel buffers ([`SOCKET_BUFFER`]), each relayed socket asks for them. One side may
//! be a hostile sandbox: beyond the first buffer of each connection (whose number its owner
//! caps), it can make at most the budget grow, whatever it sends or refuses to read; a grown
//! buffer's memory goes back to the system when it is dropped.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Each direction's buffer at first.
pub const BUFFER_START: usize = crate::limits::RELAY_BUFFER_START;

/// The most one direction's buffer grows to.
pub const BUFFER_MAX: usize = crate::limits::RELAY_BUFFER_MAX;

/// Bytes all relays of this process may hold beyond their first buffers, together.
pub const GROWTH_BUDGET: usize = crate::limits::RELAY_GROWTH_BUDGET;

/// The kernel's send and receive buffer asked for on each relayed socket, only where
/// `net.core.rmem_max` / `wmem_max` allow that much: setting a buffer turns the kernel's own
/// sizing off, and a host's smaller cap would fix the window below what autotuning reaches (a
/// slow relay for a distant destination). A larger window than autotuning starts with lets a
/// relay move a bulk transfer in fewer, larger steps.
pub const SOCKET_BUFFER: usize = 4 * 1024 * 1024;

/// Whether the host's cap for one kind of socket buffer (`/proc/sys/net/core/rmem_max` or
/// `wmem_max`) allows [`SOCKET_BUFFER`]; read once.
fn host_allows(cap: &'static str, known: &'static std::sync::OnceLock<bool>) -> bool {
    *known.get_or_init(|| cap_allows(std::fs::read_to_string(cap).ok().as_deref()))
}

/// Whether a cap file's text names at least [`SOCKET_BUFFER`] bytes.
fn cap_allows(text: Option<&str>) -> bool {
    text.and_then(|t| t.trim().parse::<usize>().ok()).is_some_and(|max| max >= SOCKET_BUFFER)
}

/// Bytes of grown buffers held now, by every relay of this process.
static GROWN: AtomicUsize = AtomicUsize::new(0);

/// One direction's buffer: [`BUFFER_START`] bytes, doubled while reads fill it and the budget
/// allows; what it grew by goes back to the budget when it is dropped.
struct Buffer {
    bytes: Vec<u8>,
    grown: usize,
    /// What the process's buffers grew by ([`GROWN`]; a test's own counter in tests).
    pool: &'static AtomicUsize,
}

impl Buffer {
    fn new() -> Buffer {
        Buffer::in_pool(&GROWN)
    }

    fn in_pool(pool: &'static AtomicUsize) -> Buffer {
        Buffer { bytes: vec![0; BUFFER_START], grown: 0, pool }
    }

    /// Doubles the buffer when a read filled it and the process's budget has room.
    fn filled(&mut self) {
        let len = self.bytes.len();
        if len >= BUFFER_MAX {
            return;
        }
        let more = len.min(BUFFER_MAX - len);
        let taken = self
            .pool
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |held| held.checked_add(more).filter(|after| *after <= GROWTH_BUDGET));
        if taken.is_ok() {
            self.bytes.resize(len + more, 0);
            self.grown += more;
        }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if self.grown > 0 {
            self.pool.fetch_sub(self.grown, Ordering::SeqCst);
            // The allocator would keep a grown buffer's pages for this process otherwise.
            self.bytes = Vec::new();
            crate::memory::release_free();
        }
    }
}

/// When a byte last moved in either direction of one connection, shared by its two directions.
struct Activity {
    start: Instant,
    /// Milliseconds since `start`.
    last: AtomicU64,
}

impl Activity {
    fn new() -> Activity {
        Activity { start: Instant::now(), last: AtomicU64::new(0) }
    }

    fn moved(&self) {
        self.last.store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// Time since a byte last moved either way.
    fn quiet_for(&self) -> Duration {
        self.start.elapsed().saturating_sub(Duration::from_millis(self.last.load(Ordering::Relaxed)))
    }
}

/// Relays both ways between `a` and `b` until both directions ended, one failed, or nothing moved
/// either way for `idle`; the second direction runs on a thread named `thread_name`. Both
/// connections are closed when it returns.
pub fn relay(a: TcpStream, b: TcpStream, idle: Duration, thread_name: &str) {
    for s in [&a, &b] {
        prepare(s, idle);
    }
    let (Ok(a2), Ok(b2)) = (a.try_clone(), b.try_clone()) else { return };
    let activity = Arc::new(Activity::new());
    let theirs = activity.clone();
    let back = std::thread::Builder::new().name(thread_name.into()).stack_size(128 * 1024).spawn(move || copy(&b2, &a2, idle, &theirs));
    let Ok(back) = back else {
        // The other direction cannot be relayed: end the connection rather than serve half of it.
        let _ = a.shutdown(Shutdown::Both);
        let _ = b.shutdown(Shutdown::Both);
        return;
    };
    copy(&a, &b, idle, &activity);
    let _ = back.join();
}

/// Relays `from` into `to` only (the other direction is not read), until `from` ends, a read or
/// write fails, or nothing moves for `idle`.
pub fn pump(from: TcpStream, to: TcpStream, idle: Duration) {
    for s in [&from, &to] {
        prepare(s, idle);
    }
    copy(&from, &to, idle, &Activity::new());
}

/// Sets the relay's timeouts, no delay and socket buffers on one connection. A refused option
/// costs speed, never the relay.
fn prepare(s: &TcpStream, idle: Duration) {
    let _ = s.set_nodelay(true);
    let _ = s.set_read_timeout(Some(idle));
    let _ = s.set_write_timeout(Some(idle));
    static RECEIVE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    static SEND: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if host_allows("/proc/sys/net/core/rmem_max", &RECEIVE) {
        let _ = rustix::net::sockopt::set_socket_recv_buffer_size(s, SOCKET_BUFFER);
    }
    if host_allows("/proc/sys/net/core/wmem_max", &SEND) {
        let _ = rustix::net::sockopt::set_socket_send_buffer_size(s, SOCKET_BUFFER);
    }
}

/// Copies `from` into `to`. At `from`'s end, closes `to` for writing (a half close: the other
/// direction goes on). A failed read or write, or a wait for a read longer than `idle` with no
/// byte moved either way meanwhile, ends both directions of both connections.
fn copy(from: &TcpStream, to: &TcpStream, idle: Duration, activity: &Activity) {
    let mut buf = Buffer::new();
    loop {
        match (&*from).read(&mut buf.bytes) {
            Ok(0) => {
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
            Ok(n) => {
                activity.moved();
                if (&*to).write_all(&buf.bytes[..n]).is_err() {
                    break;
                }
                activity.moved();
                if n == buf.bytes.len() {
                    buf.filled();
                }
            }
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) if matches!(err.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                // This direction was quiet for `idle`; the other one may not have been.
                if activity.quiet_for() >= idle {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A connected pair of loopback sockets.
    fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let near = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (far, _) = listener.accept().unwrap();
        (near, far)
    }

    /// `client` ⇄ relay ⇄ `server`, with the relay on a thread of its own.
    fn relayed(idle: Duration) -> (TcpStream, TcpStream, std::thread::JoinHandle<()>) {
        let (client, relay_a) = pair();
        let (relay_b, server) = pair();
        let handle = std::thread::spawn(move || relay(relay_a, relay_b, idle, "test-relay"));
        (client, server, handle)
    }

    /// A transfer one way that lasts several idle budgets, with the other way silent, is not
    /// idle: every byte arrives. Each direction used to time out on its own, so a download
    /// longer than the budget was cut when the silent direction's read timed out.
    #[test]
    fn a_long_transfer_one_way_outlives_the_idle_budget() {
        let idle = Duration::from_millis(300);
        let (mut client, server, relay) = relayed(idle);
        let writer = std::thread::spawn(move || {
            let mut server = server;
            let until = Instant::now() + idle * 4;
            let mut sent = 0usize;
            while Instant::now() < until {
                server.write_all(&[b'x'; 1000]).unwrap();
                sent += 1000;
                std::thread::sleep(Duration::from_millis(40));
            }
            server.shutdown(Shutdown::Write).unwrap();
            sent
        });
        let mut got = Vec::new();
        client.read_to_end(&mut got).unwrap();
        let sent = writer.join().unwrap();
        assert_eq!(got.len(), sent, "the transfer was cut");
        drop(client);
        relay.join().unwrap();
    }

    /// A connection with nothing moving either way ends at the idle budget.
    #[test]
    fn a_connection_idle_both_ways_ends_at_the_budget() {
        let idle = Duration::from_millis(200);
        let (mut client, _server, relay) = relayed(idle);
        let started = Instant::now();
        client.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut byte = [0u8; 1];
        assert_eq!(client.read(&mut byte).unwrap_or(0), 0, "the relay sent a byte of its own");
        let took = started.elapsed();
        assert!(took >= idle && took < Duration::from_secs(5), "it ended after {took:?}");
        relay.join().unwrap();
    }

    /// One direction's end is passed on as a half close; the other direction goes on, and a
    /// large transfer arrives whole through grown buffers.
    #[test]
    fn a_half_close_leaves_the_other_direction_open() {
        let (mut client, mut server, relay) = relayed(Duration::from_secs(10));
        client.write_all(b"request").unwrap();
        client.shutdown(Shutdown::Write).unwrap();
        let mut asked = Vec::new();
        server.read_to_end(&mut asked).unwrap();
        assert_eq!(asked, b"request");
        let body: Vec<u8> = (0..8 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
        let expected = body.clone();
        let writer = std::thread::spawn(move || {
            server.write_all(&body).unwrap();
        });
        let mut got = Vec::new();
        client.read_to_end(&mut got).unwrap();
        writer.join().unwrap();
        assert!(got == expected, "{} bytes arrived of {}", got.len(), expected.len());
        relay.join().unwrap();
    }

    /// Socket buffers are asked for only where the host's cap allows the whole size: a stock
    /// cap (212992) would fix every relayed socket's window at 416 KiB, below what the kernel's
    /// own sizing reaches (found by a review: a loopback transfer fell from 4.6 to 1.4 GB/s).
    #[test]
    fn socket_buffers_only_where_the_host_allows_them() {
        assert!(!cap_allows(Some("212992\n")));
        assert!(cap_allows(Some("4194304\n")));
        assert!(cap_allows(Some("33554432")));
        assert!(!cap_allows(None));
        assert!(!cap_allows(Some("lots")));
    }

    /// Grown buffers stay within the process's budget, and give it back when dropped.
    #[test]
    fn buffers_grow_within_the_budget() {
        static POOL: AtomicUsize = AtomicUsize::new(0);
        let mut first = Buffer::in_pool(&POOL);
        for _ in 0..8 {
            first.filled();
        }
        assert_eq!(first.bytes.len(), BUFFER_MAX);
        let mut others: Vec<Buffer> = (0..64).map(|_| Buffer::in_pool(&POOL)).collect();
        for _ in 0..8 {
            for b in &mut others {
                b.filled();
            }
        }
        let grown = first.grown + others.iter().map(|b| b.grown).sum::<usize>();
        assert_eq!(grown, POOL.load(Ordering::SeqCst));
        assert!(grown <= GROWTH_BUDGET && grown > GROWTH_BUDGET - BUFFER_MAX, "{grown}");
        assert!(others.iter().all(|b| b.bytes.len() <= BUFFER_MAX));
        drop(others);
        drop(first);
        assert_eq!(POOL.load(Ordering::SeqCst), 0);
    }
}
