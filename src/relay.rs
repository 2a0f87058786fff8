//! The byte relay between two TCP connections, used by a sandbox's egress proxy (its tunnels and
//! plain-HTTP answers) and by an exposed port (the host's connection and the sandbox's server).
//!
//! One thread per direction copies through a buffer of its own. A connection ends when both
//! directions reached their end (each end is passed on as a half close), when a read or write
//! fails, when no byte moved in either direction for the idle budget (a long download whose
//! other direction is silent is not idle), or when its owner cuts it ([`Link::cut`]). Only the
//! first is a clean end: every other one resets both peers' connections, so that a transfer cut
//! short never looks complete to the side that reads it.
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
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
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

/// One relayed connection: its two sockets, when a byte last moved either way, and whether it
/// was cut. Both directions share it, and so may whoever must be able to cut it (an exposed
/// port's `unexpose_port`).
pub struct Link {
    a: TcpStream,
    b: TcpStream,
    activity: Activity,
    cut: AtomicBool,
    /// Whether each direction ([`AB`], [`BA`]) is in a write, which a cut must wake.
    writing: [AtomicBool; 2],
}

/// The direction `a` → `b` of a [`Link`].
const AB: usize = 0;
/// The direction `b` → `a`.
const BA: usize = 1;

impl Link {
    /// A link between `a` and `b`, whose sockets get the relay's timeouts (`idle`), no delay and
    /// socket buffers.
    pub fn new(a: TcpStream, b: TcpStream, idle: Duration) -> Arc<Link> {
        for s in [&a, &b] {
            prepare(s, idle);
        }
        Arc::new(Link {
            a,
            b,
            activity: Activity::new(),
            cut: AtomicBool::new(false),
            writing: [AtomicBool::new(false), AtomicBool::new(false)],
        })
    }

    /// Ends the connection at once, both ways: each peer sees a reset, never a clean end of
    /// data, since a transfer cut short must not look complete. Blocked reads and writes of the
    /// relay wake; the sockets are reset when the link's last holder drops it.
    pub fn cut(&self) {
        if self.cut.swap(true, Ordering::SeqCst) {
            return;
        }
        for s in [&self.a, &self.b] {
            // Closed with a zero linger, a socket is reset rather than ended with a FIN.
            let _ = rustix::net::sockopt::set_socket_linger(s, Some(Duration::ZERO));
            // Wakes a blocked read (which then sees an end) without telling the peer anything.
            let _ = s.shutdown(Shutdown::Read);
        }
        for dir in [AB, BA] {
            if self.writing[dir].load(Ordering::SeqCst) {
                // A write blocked on a peer that does not read wakes only this way; the FIN
                // this queues waits behind the unread bytes, which the reset drops.
                let _ = self.ends(dir).1.shutdown(Shutdown::Write);
            }
        }
    }

    fn is_cut(&self) -> bool {
        self.cut.load(Ordering::SeqCst)
    }

    /// The socket direction `dir` reads from and the one it writes to.
    fn ends(&self, dir: usize) -> (&TcpStream, &TcpStream) {
        if dir == AB {
            (&self.a, &self.b)
        } else {
            (&self.b, &self.a)
        }
    }

    /// Relays both ways until both directions ended, one failed, nothing moved either way for
    /// `idle`, or the link was cut; the direction `b` → `a` runs on a thread named
    /// `thread_name`.
    pub fn relay(self: Arc<Link>, idle: Duration, thread_name: &str) {
        let theirs = self.clone();
        let back = std::thread::Builder::new().name(thread_name.into()).stack_size(128 * 1024).spawn(move || theirs.copy(BA, idle));
        let Ok(back) = back else {
            // The other direction cannot be relayed: end the connection rather than serve half of it.
            self.cut();
            return;
        };
        self.copy(AB, idle);
        let _ = back.join();
    }

    /// Copies direction `dir`. At its source's end, closes its destination for writing (a half
    /// close: the other direction goes on). A failed read or write, or a wait for a read longer
    /// than `idle` with no byte moved either way meanwhile, cuts the link.
    fn copy(&self, dir: usize, idle: Duration) {
        let (from, to) = self.ends(dir);
        let mut buf = Buffer::new();
        loop {
            match (&*from).read(&mut buf.bytes) {
                Ok(0) => {
                    if !self.is_cut() {
                        let _ = to.shutdown(Shutdown::Write);
                    }
                    return;
                }
                Ok(n) => {
                    self.activity.moved();
                    self.writing[dir].store(true, Ordering::SeqCst);
                    // A cut that came before the flag was set did not wake this write: look.
                    let written = !self.is_cut() && (&*to).write_all(&buf.bytes[..n]).is_ok();
                    self.writing[dir].store(false, Ordering::SeqCst);
                    if !written {
                        break;
                    }
                    self.activity.moved();
                    if n == buf.bytes.len() {
                        buf.filled();
                    }
                }
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(err) if matches!(err.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    // This direction was quiet for `idle`; the other one may not have been.
                    if self.activity.quiet_for() >= idle {
                        break;
                    }
                }
                Err(_) => break,
            }
        }
        self.cut();
    }
}

/// Relays both ways between `a` and `b` ([`Link::relay`]). Both connections are closed when it
/// returns.
pub fn relay(a: TcpStream, b: TcpStream, idle: Duration, thread_name: &str) {
    Link::new(a, b, idle).relay(idle, thread_name);
}

/// Relays `from` into `to` only (the other direction is not read), until `from` ends, a read or
/// write fails, or nothing moves for `idle`; a failure resets both, as [`Link::cut`] does.
pub fn pump(from: TcpStream, to: TcpStream, idle: Duration) {
    Link::new(from, to, idle).copy(AB, idle);
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

    /// Whether a read of `s` ends in a reset (after any bytes still buffered), not in a clean
    /// end of data; it must end within ten seconds.
    fn ends_in_a_reset(s: &mut TcpStream) -> bool {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut sink = Vec::new();
        match s.read_to_end(&mut sink) {
            Ok(_) => false,
            Err(err) => {
                assert_eq!(err.kind(), io::ErrorKind::ConnectionReset, "{err}");
                true
            }
        }
    }

    /// A connection with nothing moving either way ends at the idle budget, as a reset.
    #[test]
    fn a_connection_idle_both_ways_ends_at_the_budget() {
        let idle = Duration::from_millis(200);
        let (mut client, mut server, relay) = relayed(idle);
        let started = Instant::now();
        assert!(ends_in_a_reset(&mut client), "the idle end looked like a clean end to the client");
        let took = started.elapsed();
        assert!(took >= idle && took < Duration::from_secs(5), "it ended after {took:?}");
        assert!(ends_in_a_reset(&mut server), "the idle end looked like a clean end to the server");
        relay.join().unwrap();
    }

    /// A connection reset on one side mid-transfer is passed on as a reset: before, the other
    /// side saw a clean end, so a download cut short looked complete.
    #[test]
    fn a_reset_on_one_side_is_passed_on_as_a_reset() {
        let (mut client, mut server, relay) = relayed(Duration::from_secs(60));
        client.write_all(b"GET").unwrap();
        let mut asked = [0u8; 3];
        server.read_exact(&mut asked).unwrap();
        server.write_all(b"part of the answer").unwrap();
        let mut first = [0u8; 18];
        client.read_exact(&mut first).unwrap();
        rustix::net::sockopt::set_socket_linger(&server, Some(Duration::ZERO)).unwrap();
        drop(server);
        assert!(ends_in_a_reset(&mut client), "the client saw a clean end of a cut answer");
        relay.join().unwrap();
    }

    /// Cutting a link ends it at once, silent as it is, with a reset on both sides; a write
    /// blocked on a peer that reads nothing wakes too.
    #[test]
    fn a_cut_ends_the_link_at_once_with_resets() {
        let idle = Duration::from_secs(60);
        let (mut client, relay_a) = pair();
        let (relay_b, mut server) = pair();
        let link = Link::new(relay_a, relay_b, idle);
        let (done, ended) = std::sync::mpsc::channel();
        let running = link.clone();
        std::thread::spawn(move || {
            running.relay(idle, "test-relay");
            let _ = done.send(());
        });
        // The client sends more than the sockets on the way hold; the server reads nothing.
        let mut writer = client.try_clone().unwrap();
        let writer = std::thread::spawn(move || {
            let chunk = vec![b'x'; 1 << 20];
            loop {
                if let Err(err) = writer.write_all(&chunk) {
                    return err.kind();
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while !link.writing[AB].load(Ordering::SeqCst) {
            assert!(Instant::now() < deadline, "the relay never wrote");
            std::thread::yield_now();
        }
        link.cut();
        drop(link);
        ended.recv_timeout(Duration::from_secs(5)).expect("the relay went on after its cut");
        assert!(ends_in_a_reset(&mut server), "the server saw a clean end");
        // The kernel reports a reset once, to the client's write or to its read.
        let write_ended = writer.join().unwrap();
        assert!(write_ended == io::ErrorKind::ConnectionReset || ends_in_a_reset(&mut client), "the client saw a clean end");
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
