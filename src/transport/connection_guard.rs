//! The guard of HTTP connections against sending without end and against taking forever.
//!
//! tiny_http 0.12 reads a request's line and headers without a bound: a client that sends one
//! endless line, or headers without end, makes it buffer all it sends (300 MiB sent in 3.5 s took
//! the server to 305 MiB of RSS; a few such clients take the host's memory), before any check of
//! ours can run. tiny_http offers no limit, and no access to a connection's socket, so the guard
//! looks from outside. Every tick of the acceptor's watchdog ([`ConnectionGuard::sweep`]) it finds
//! the connections accepted on the HTTP port among the process's descriptors (through a copy of
//! each taken with `pidfd_getfd`, so no descriptor of another part of the server is used by
//! number), asks the kernel how many bytes each has handed to the server (`TCP_INFO`'s bytes
//! received, less what is still queued unread), and ends a connection (shut down both ways:
//! tiny_http's read or write and ours fail, and what tiny_http buffered is freed, given back to
//! the system at the next sweep) that:
//! - handed over more than the requests the server has seen on it account for
//!   ([`ConnectionGuard::account`]: each head's own size plus its body's announced length, less
//!   what its handler did not read of it ([`Transfer::take_back_unmoved`]; nothing for a body
//!   refused unread), or for a chunked body [`CHUNKED_START`] and then [`CHUNKED_CREDIT`] per byte
//!   as it is read; nothing for a request without a body), plus
//!   [`HEAD_ALLOWANCE`] and tiny_http's read-ahead for the head it may be reading now;
//! - has been sending a next head, seen by two sweeps, for longer than the head time
//!   (`--http-stall`) since its last answer (or since a sweep first saw it) and since a request
//!   last may have waited for a handler thread, while none of its requests was being handled:
//!   each byte coming within the receive timeout, tiny_http would read such a head, holding a
//!   thread of its pool, for as long as the client went on. A whole request is taken by a
//!   waiting handler thread within moments, so a head that is not a request by then is still
//!   arriving;
//! - moves a body or an answer slower than [`crate::limits::HTTP_MIN_RATE`] on average after a
//!   first head time and [`RATE_MARGIN`] ([`ConnectionGuard::transfer`]: its handler counts the bytes it reads or
//!   that tiny_http takes to write, from the moment the connection is that answer's, since a
//!   connection's pipelined answers go out in order), which a client trickling bytes within the
//!   timeouts would otherwise make last for as long as it went on. A call being made and a
//!   subscription's stream move nothing and are not held to it.
//!
//! What a connection may send is kept by peer address (all tiny_http tells of a request's
//! connection) and tied to the connection (its socket's inode) the first time a sweep sees it: a
//! new connection from the same address and port starts from what was accounted since a sweep
//! last saw the one before (its own requests, if it came at once), and a connection once ended
//! is not ended again. Two connections open at once from one address and port (a client
//! binding it twice, to two addresses of a wildcard listener) cannot be told apart: each sweep
//! starts their record afresh, so their heads are bounded by the receive timeout alone.
//!
//! Between two ticks (half a second) a connection can still make tiny_http buffer what it sends
//! in that time, which costs more than its size when it is made of short header lines (each a
//! pair of strings: about 25 times). Where the kernel has no pidfds (before Linux 5.6) the guard
//! does nothing and says so once. Idle connections can use up the process's descriptors; the
//! guard keeps what a sweep needs then (`/proc/self/fd` open, and a spare descriptor to free for
//! each copy in turn), so its bounds hold unless another thread takes the freed one first (the
//! watchdog goes on sweeping while it waits to start the listener again).

use crate::tally::Tally;
use rustix::fd::{AsFd, OwnedFd};
use rustix::net::SocketType;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// What the head tiny_http may be reading now (not yet a request the server has seen) may take.
/// MCP clients send a few hundred bytes.
pub const HEAD_ALLOWANCE: u64 = 64 * 1024;

/// What tiny_http may have read of a connection beyond what it parsed (its buffered reader).
const READ_AHEAD: u64 = 8 * 1024;

/// What the guard adds to a stall time (`--http-stall`) before it ends a connection that a
/// receive or send timeout would end then: a body or an answer that stops outright meets its
/// timeout first (a body is answered 408), before the rate would end the connection unanswered,
/// and so does what tiny_http drains of a stalled body ([`Transfer::until`]).
pub const RATE_MARGIN: Duration = Duration::from_secs(1);

/// What a chunked body may send before any of it is read (its first chunk's size line, and some
/// of its data); the rest is credited as it is read ([`Transfer::credit`]). tiny_http's chunked
/// decoder buffers a size line whole, so crediting a chunked body its largest length up front
/// let one with an endless size line make the server buffer 64 MiB.
pub const CHUNKED_START: u64 = 64 * 1024;

/// What each byte read of a chunked body credits (its framing comes on top: a size line and two
/// line ends per chunk, twice the data only for chunks of a few bytes).
pub const CHUNKED_CREDIT: u64 = 2;

/// Connections ended so far for bytes ([`Overrun::Bytes`]).
static ENDED: Tally = Tally::new();

/// Connections ended so far for a slow head ([`Overrun::Head`]).
static SLOW: Tally = Tally::new();

/// Connections ended so far for a slow body or answer ([`Overrun::Late`]).
static LATE: Tally = Tally::new();

/// The guard of one HTTP listening socket.
pub struct ConnectionGuard {
    /// The bound address, once the socket is bound, and how long a head may take to arrive.
    listen: OnceLock<(SocketAddr, Duration)>,
    /// This process as a pidfd, to copy descriptors by number.
    me: Option<OwnedFd>,
    /// The descriptors a sweep needs when the process has run out of them, so that the bounds
    /// hold then too (idle connections can use them all up, and the guard would then let an
    /// endless head through): `/proc/self/fd`, kept open, and one to free for a copy.
    reserve: Mutex<Reserve>,
    /// What each connection (by peer address) may have handed over so far.
    accounted: Mutex<HashMap<SocketAddr, Allowance>>,
    /// Whether the last sweep ended a connection (the next one gives memory back).
    trim: AtomicBool,
}

/// What a sweep keeps for when the process is out of descriptors ([`ConnectionGuard::reserve`]).
#[derive(Default)]
struct Reserve {
    /// `/proc/self/fd`, read afresh by each sweep.
    fds: Option<rustix::fs::Dir>,
    /// Closed when a copy finds no free descriptor, which the copy then takes; made again at
    /// the end of the sweep, when the last copy has given its descriptor back.
    spare: Option<OwnedFd>,
}

impl Reserve {
    /// What is missing, made again where descriptors allow.
    fn refill(&mut self, me: &OwnedFd) {
        if self.fds.is_none() {
            use rustix::fs::{Dir, Mode, OFlags};
            let dir = rustix::fs::open("/proc/self/fd", OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty());
            self.fds = dir.and_then(Dir::new).ok();
        }
        if self.spare.is_none() {
            self.spare = rustix::io::fcntl_dupfd_cloexec(me, 0).ok();
        }
    }

    /// A copy of this process's descriptor `fd`, taken with the spare's place when no other is free.
    fn copy(&mut self, me: &OwnedFd, fd: i32) -> rustix::io::Result<OwnedFd> {
        let copy = || rustix::process::pidfd_getfd(me, fd, rustix::process::PidfdGetfdFlags::empty());
        match copy() {
            Err(rustix::io::Errno::MFILE) if self.spare.is_some() => {
                self.spare = None;
                copy()
            }
            other => other,
        }
    }
}

/// What one connection may have handed over, and for how long it has been sending a head.
#[derive(Debug)]
struct Allowance {
    /// Bytes of the requests the server has seen on it.
    bytes: u64,
    /// When `bytes` was last raised.
    raised: Instant,
    /// The socket inode of the connection, once a sweep has seen it.
    inode: Option<u64>,
    /// What `bytes` was when a sweep last saw that connection: what was accounted since may be
    /// the next connection's.
    sighted: u64,
    /// Whether it was ended (shut down) already.
    ended: bool,
    /// Its requests being handled now.
    handling: u32,
    /// Since when none has been (or since a sweep first saw the connection): from then on it
    /// waits for, or sends, its next head.
    idle_since: Instant,
    /// What it had handed over when a sweep first saw it idle: bytes beyond are its next head's.
    handed_idle: Option<u64>,
    /// Whether a sweep already saw bytes of a next head (a request is taken within moments of
    /// its head arriving, so a head seen by two sweeps is still arriving, or waits for a thread).
    head_seen: bool,
    /// The bodies and answers its handlers are moving now ([`ConnectionGuard::transfer`]).
    transfers: Vec<Arc<Moving>>,
}

/// One body or answer being moved, as its handler counts it.
#[derive(Debug, Default)]
struct Moving {
    /// When its first byte could move: the clock of its rate.
    began: OnceLock<Instant>,
    /// Bytes moved so far.
    moved: AtomicU64,
    /// When it must be over, whatever moved ([`Transfer::until`]).
    until: OnceLock<Instant>,
}

impl Moving {
    /// Whether it fell behind: past its `until`, or, `grace` after it began, fewer bytes moved
    /// than [`crate::limits::HTTP_MIN_RATE`] for the time since.
    fn late(&self, now: Instant, grace: Duration) -> bool {
        if self.until.get().is_some_and(|by| now >= *by) {
            return true;
        }
        let Some(began) = self.began.get() else { return false };
        let Some(rated) = now.saturating_duration_since(*began).checked_sub(grace) else { return false };
        let due = u64::try_from(rated.as_millis().saturating_mul(crate::limits::HTTP_MIN_RATE as u128) / 1000).unwrap_or(u64::MAX);
        self.moved.load(Ordering::Relaxed) < due
    }
}

/// A body or an answer a handler moves on its connection, registered with the guard while it
/// lives: a connection whose transfer falls behind is ended at the next sweep, which fails the
/// handler's blocked read or write, and tiny_http's.
pub struct Transfer<'a> {
    guard: &'a ConnectionGuard,
    peer: Option<SocketAddr>,
    moving: Arc<Moving>,
    /// What each byte moved adds to what its connection may send ([`Transfer::credit`]).
    credit: u64,
}

impl Transfer<'_> {
    /// The rate's clock starts now (once: later calls change nothing).
    pub fn start(&self) {
        let _ = self.moving.began.set(Instant::now());
    }

    /// `n` more bytes moved.
    pub fn moved(&self, n: usize) {
        self.moving.moved.fetch_add(n as u64, Ordering::Relaxed);
        if self.credit > 0 && n > 0 {
            self.guard.with(self.peer.as_ref(), |entry| entry.bytes = entry.bytes.saturating_add((n as u64).saturating_mul(self.credit)));
        }
    }

    /// Each byte it moves from now on lets its connection send `per_byte` more: a chunked body,
    /// whose length is known only as it is read (and whose framing comes on top), is credited
    /// [`CHUNKED_START`] when its request is accounted, and the rest as it is read.
    pub fn credit(&mut self, per_byte: u64) {
        self.credit = per_byte;
    }

    /// Takes back what of `credited`, credited to its connection up front for what it would
    /// move, it did not move.
    pub fn take_back_unmoved(&self, credited: u64) {
        let unmoved = credited.saturating_sub(self.moving.moved.load(Ordering::Relaxed));
        self.guard.with(self.peer.as_ref(), |entry| entry.bytes = entry.bytes.saturating_sub(unmoved));
    }

    /// It must be over by `by`, whatever moves meanwhile.
    pub fn until(&self, by: Instant) {
        let _ = self.moving.until.set(by);
    }
}

impl Drop for Transfer<'_> {
    fn drop(&mut self) {
        self.guard.with(self.peer.as_ref(), |entry| entry.transfers.retain(|t| !Arc::ptr_eq(t, &self.moving)));
    }
}

/// A reader that counts what it reads into a [`Transfer`], whose clock starts at the first read.
pub struct Counted<'a, R> {
    /// What is read.
    pub inner: R,
    /// Where what is read is counted.
    pub transfer: &'a Transfer<'a>,
}

impl<R: std::io::Read> std::io::Read for Counted<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.transfer.start();
        let n = self.inner.read(buf)?;
        self.transfer.moved(n);
        Ok(n)
    }
}

/// Why a connection is ended.
#[derive(Debug, PartialEq)]
enum Overrun {
    /// It handed over more bytes than this allowance.
    Bytes(u64),
    /// Its next head has been arriving for longer than this without being whole.
    Head(Duration),
    /// A body or an answer fell behind ([`Moving::late`]).
    Late,
}

impl Allowance {
    fn new() -> Allowance {
        let now = Instant::now();
        Allowance {
            bytes: 0,
            raised: now,
            inode: None,
            sighted: 0,
            ended: false,
            handling: 0,
            idle_since: now,
            handed_idle: None,
            head_seen: false,
            transfers: Vec::new(),
        }
    }

    /// Whether the connection of socket `inode`, which has handed over `handed` bytes, is to be
    /// ended now: `Some` of why, and it counts as ended from then on. It is when it handed over
    /// more than its requests account for; when a body or answer being moved fell behind (with
    /// `head_time` and [`RATE_MARGIN`] as its grace); or when, with none of its requests being handled, it handed
    /// over bytes of a next head, seen by an earlier sweep already, that did not become a
    /// request within `head_time` of its last answer or of the last time a request may have
    /// waited for a handler thread (`queue_waited`), whichever is later. Another inode than the
    /// one seen before is another connection from the same address and port, which starts
    /// afresh but for what may be its own: requests accounted since the last sweep saw the one
    /// before, requests still being handled, and their transfers.
    fn overrun(&mut self, inode: u64, handed: u64, head_time: Duration, queue_waited: Option<Instant>) -> Option<Overrun> {
        if self.inode.is_some_and(|seen| seen != inode) {
            let carried = self.bytes.saturating_sub(self.sighted);
            let (handling, transfers) = (self.handling, std::mem::take(&mut self.transfers));
            *self = Allowance::new();
            (self.bytes, self.handling, self.transfers) = (carried, handling, transfers);
        }
        self.inode = Some(inode);
        self.sighted = self.bytes;
        if self.ended {
            return None;
        }
        let allowed = self.bytes.saturating_add(HEAD_ALLOWANCE + READ_AHEAD);
        let now = Instant::now();
        let why = if handed > allowed {
            Overrun::Bytes(allowed)
        } else if self.transfers.iter().any(|t| t.late(now, head_time + RATE_MARGIN)) {
            Overrun::Late
        } else if self.handling > 0 {
            return None;
        } else {
            let since = queue_waited.map_or(self.idle_since, |at| at.max(self.idle_since));
            if handed <= *self.handed_idle.get_or_insert(handed) {
                return None;
            }
            let seen_before = std::mem::replace(&mut self.head_seen, true);
            if !seen_before || now.saturating_duration_since(since) < head_time {
                return None;
            }
            Overrun::Head(head_time)
        };
        self.ended = true;
        Some(why)
    }
}

impl Default for ConnectionGuard {
    fn default() -> Self {
        ConnectionGuard::new()
    }
}

impl ConnectionGuard {
    /// A guard of no socket yet ([`ConnectionGuard::guard`] names it).
    pub fn new() -> ConnectionGuard {
        let me = rustix::process::pidfd_open(rustix::process::getpid(), rustix::process::PidfdFlags::empty()).ok();
        let mut reserve = Reserve::default();
        if let Some(me) = &me {
            reserve.refill(me);
        }
        ConnectionGuard {
            listen: OnceLock::new(),
            me,
            reserve: Mutex::new(reserve),
            accounted: Mutex::new(HashMap::new()),
            trim: AtomicBool::new(false),
        }
    }

    /// Starts guarding the connections accepted on `listen` (the bound address), whose heads
    /// must each arrive within `head_time` of the connection's last answer (or of a sweep first
    /// seeing it).
    pub fn guard(&self, listen: SocketAddr, head_time: Duration) {
        if self.me.is_none() {
            log::warn!(
                "this kernel has no pidfds: HTTP request heads are not bounded (a client can make the server buffer an endless one), \
nor the time a head, body or answer takes"
            );
        }
        let _ = self.listen.set((listen, head_time));
    }

    /// Records a request from `peer` that may have made its connection send `bytes` (its head
    /// and its body).
    pub fn account(&self, peer: Option<&SocketAddr>, bytes: u64) {
        let Some(peer) = peer else { return };
        let mut accounted = self.accounted.lock().unwrap_or_else(|p| p.into_inner());
        let entry = accounted.entry(*peer).or_insert_with(Allowance::new);
        entry.bytes = entry.bytes.saturating_add(bytes);
        entry.raised = Instant::now();
        entry.handling += 1;
    }

    /// A body or an answer a handler of a request from `peer` ([`ConnectionGuard::account`]) is
    /// about to move: once [`Transfer::start`]ed, it must move
    /// [`crate::limits::HTTP_MIN_RATE`] on average after a first head time and [`RATE_MARGIN`],
    /// for as long as it lives. A call being made or a stream being held moves nothing and has no transfer.
    pub fn transfer(&self, peer: Option<&SocketAddr>) -> Transfer<'_> {
        let moving = Arc::new(Moving::default());
        self.with(peer, |entry| entry.transfers.push(moving.clone()));
        Transfer { guard: self, peer: peer.copied(), moving, credit: 0 }
    }

    /// Records that a request from `peer` ([`ConnectionGuard::account`]) was handled: once none of its
    /// connection's is, the connection's next head must arrive within the head time.
    pub fn done(&self, peer: Option<&SocketAddr>) {
        self.with(peer, |entry| {
            entry.handling = entry.handling.saturating_sub(1);
            if entry.handling == 0 {
                entry.idle_since = Instant::now();
                entry.handed_idle = None;
                entry.head_seen = false;
            }
        });
    }

    /// Applies `change` to what `peer`'s connection may send, where a request of it was
    /// accounted ([`ConnectionGuard::account`]).
    fn with(&self, peer: Option<&SocketAddr>, change: impl FnOnce(&mut Allowance)) {
        let Some(peer) = peer else { return };
        if let Some(entry) = self.accounted.lock().unwrap_or_else(|p| p.into_inner()).get_mut(peer) {
            change(entry);
        }
    }

    /// Ends every connection that handed over more than its requests account for, whose body
    /// or answer fell behind, or that has been sending its next head for longer than the head
    /// time since its last answer and since `queue_waited` said a request last may have waited
    /// for a handler thread; how many.
    pub fn sweep(&self, queue_waited: &dyn Fn() -> Option<Instant>) -> usize {
        let (Some(me), Some(&(listen, head_time))) = (&self.me, self.listen.get()) else { return 0 };
        let began = Instant::now();
        let mut reserve = self.reserve.lock().unwrap_or_else(|p| p.into_inner());
        reserve.refill(me);
        let Some(mut fds) = reserve.fds.take() else { return 0 };
        fds.rewind();
        let mut live = std::collections::HashSet::new();
        // Whether some connection may have been missed (no descriptor to copy it with): then no
        // record is forgotten.
        let mut blind = false;
        let mut ended = 0;
        while let Some(entry) = fds.read() {
            let Ok(entry) = entry else {
                blind = true;
                break;
            };
            let Some(fd) = entry.file_name().to_str().ok().and_then(|n| n.parse::<i32>().ok()) else { continue };
            let Ok(dir) = fds.fd() else { break };
            if !rustix::fs::readlinkat(dir, entry.file_name(), Vec::new()).is_ok_and(|link| is_socket(link.as_bytes())) {
                continue;
            }
            let copy = match reserve.copy(me, fd) {
                Ok(copy) => copy,
                Err(err) => {
                    blind |= matches!(err, rustix::io::Errno::MFILE | rustix::io::Errno::NFILE | rustix::io::Errno::NOMEM);
                    continue;
                }
            };
            if !accepted_on(&copy, listen) {
                continue;
            }
            // The copy's own inode: the number listed may name another socket by now.
            let Ok(inode) = rustix::fs::fstat(&copy).map(|st| st.st_ino) else { continue };
            let Some(peer) = rustix::net::getpeername(&copy).ok().flatten().and_then(|a| SocketAddr::try_from(a).ok()) else { continue };
            live.insert(peer);
            let Some(handed) = handed_over(&copy) else { continue };
            let overrun = self.accounted.lock().unwrap_or_else(|p| p.into_inner()).entry(peer).or_insert_with(Allowance::new).overrun(
                inode,
                handed,
                head_time,
                queue_waited(),
            );
            let Some(why) = overrun else { continue };
            let _ = rustix::net::shutdown(&copy, rustix::net::Shutdown::Both);
            ended += 1;
            match why {
                Overrun::Bytes(allowed) => {
                    if let Some(n) = ENDED.add() {
                        log::warn!(
                            "ended {n} HTTP connections so far that sent more than their requests account for (this one: \
{handed} bytes, {allowed} allowed): a request head without end, or a refused body that goes on"
                        );
                    }
                }
                Overrun::Head(limit) => {
                    if let Some(n) = SLOW.add() {
                        log::warn!(
                            "ended {n} HTTP connections so far whose request head took longer than {} s to arrive (--http-stall)",
                            limit.as_secs()
                        );
                    }
                }
                Overrun::Late => {
                    if let Some(n) = LATE.add() {
                        log::warn!(
                            "ended {n} HTTP connections so far whose body or answer moved slower than {} KiB/s after the first \
{} s (--http-stall), or that still held a refused or stalled body at its time",
                            crate::limits::HTTP_MIN_RATE / 1024,
                            head_time.as_secs()
                        );
                    }
                }
            }
        }
        reserve.fds = Some(fds);
        reserve.refill(me);
        drop(reserve);
        // Forget connections that are gone, unless raised since this sweep began (a connection
        // accepted after the descriptors were listed).
        if !blind {
            let mut accounted = self.accounted.lock().unwrap_or_else(|p| p.into_inner());
            accounted.retain(|peer, a| a.raised >= began || live.contains(peer));
        }
        // What tiny_http buffered for a connection ended by the last sweep is freed by now.
        if self.trim.swap(ended > 0, Ordering::SeqCst) {
            crate::memory::release_free();
        }
        ended
    }
}

/// Whether a `/proc/self/fd` link names a socket (`socket:[12345]`; the inode is taken from the
/// copy, which the number may no longer name).
fn is_socket(link: &[u8]) -> bool {
    link.starts_with(b"socket:[") && link.ends_with(b"]")
}

/// Whether `fd` is a TCP connection accepted on `listen` (not the listening socket itself, nor a
/// connection this process made to it).
fn accepted_on(fd: &OwnedFd, listen: SocketAddr) -> bool {
    use rustix::net::sockopt;
    if sockopt::socket_type(fd).ok() != Some(SocketType::STREAM) || sockopt::socket_acceptconn(fd).unwrap_or(true) {
        return false;
    }
    let Some(local) = rustix::net::getsockname(fd).ok().and_then(|a| SocketAddr::try_from(a).ok()) else { return false };
    local.port() == listen.port() && (listen.ip().is_unspecified() || local.ip() == listen.ip())
}

/// Bytes the connection `fd` has handed to the process: received in order, less what waits
/// unread in its queue; `None` when the kernel does not say.
fn handed_over(fd: &impl AsFd) -> Option<u64> {
    let received = bytes_received(fd)?;
    let queued = rustix::io::ioctl_fionread(fd).ok()?;
    Some(received.saturating_sub(queued))
}

/// `TCP_INFO`'s count of bytes received in order on `fd`.
#[allow(unsafe_code)]
fn bytes_received(fd: &impl AsFd) -> Option<u64> {
    use std::os::fd::AsRawFd;
    // SAFETY: `info` is a plain C struct of integers, valid when zeroed; `getsockopt` writes at
    // most `len` bytes into it (its size) and sets `len` to what it wrote. The descriptor is
    // `fd`'s, open while `fd` is borrowed. rustix has no wrapper for `TCP_INFO`.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    let done = unsafe {
        libc::getsockopt(fd.as_fd().as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_INFO, (&mut info as *mut libc::tcp_info).cast(), &mut len)
    };
    // Kernels before 4.1 write a shorter struct without the count.
    let wanted = std::mem::offset_of!(libc::tcp_info, tcpi_bytes_received) + std::mem::size_of::<u64>();
    (done == 0 && len as usize >= wanted).then_some(info.tcpi_bytes_received)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    /// A loopback listener and a guard of it; `None` where the kernel has no pidfds.
    fn guarded_listener() -> Option<(TcpListener, std::net::SocketAddr, ConnectionGuard)> {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let guard = ConnectionGuard::new();
        guard.me.as_ref()?;
        guard.guard(addr, Duration::from_secs(3600));
        Some((listener, addr, guard))
    }

    #[test]
    fn a_new_connection_from_the_same_address_and_port_starts_afresh() {
        let Some((listener, addr, guard)) = guarded_listener() else { return };
        let sent = (HEAD_ALLOWANCE + READ_AHEAD + 1000) as usize;
        // The first connection from a fixed port is allowed what it sent, and seen by a sweep.
        let first = connect_from(addr, None);
        let port = first.local_addr().unwrap().port();
        let (mut accepted, peer) = listener.accept().unwrap();
        guard.account(Some(&peer), sent as u64);
        assert_eq!(guard.sweep(&|| None), 0);
        // It ends (the server's side first, so that the port is free at once) and the same
        // address and port connect again: that connection's allowance starts from nothing.
        drop(accepted);
        drop(first);
        let Some(mut again) = (0..50).find_map(|_| {
            let s = connect_from(addr, Some(port));
            (s.local_addr().ok()?.port() == port).then_some(s)
        }) else {
            return;
        };
        let (a, _) = listener.accept().unwrap();
        accepted = a;
        again.write_all(&vec![b'A'; sent]).unwrap();
        accepted.read_exact(&mut vec![0u8; sent]).unwrap();
        assert_eq!(guard.sweep(&|| None), 1, "the allowance of the connection before was not carried over");
        // Ended once, it is not ended again.
        assert_eq!(guard.sweep(&|| None), 0);
    }

    #[test]
    fn requests_accounted_since_the_last_sweep_carry_over_to_the_next_connection() {
        let hour = Duration::from_secs(3600);
        let body = 2_000_000;
        for (accounted_after_sweep, ended) in [(true, false), (false, true)] {
            let mut a = Allowance::new();
            a.bytes = 1000;
            if !accounted_after_sweep {
                a.bytes += body;
            }
            assert!(a.overrun(1, 500, hour, None).is_none());
            if accounted_after_sweep {
                // A request of a client that reconnected at once from the same port, handled
                // before a sweep saw its new connection.
                a.bytes += body;
            }
            assert_eq!(a.overrun(2, body, hour, None).is_some(), ended, "accounted after the sweep: {accounted_after_sweep}");
        }
    }

    /// A connection to `addr`, from `port` when given (reusable at once).
    fn connect_from(addr: std::net::SocketAddr, port: Option<u16>) -> TcpStream {
        use rustix::net::{bind, connect, socket, sockopt, AddressFamily, SocketType};
        let Some(port) = port else { return TcpStream::connect(addr).unwrap() };
        let fd = socket(AddressFamily::INET, SocketType::STREAM, None).unwrap();
        sockopt::set_socket_reuseaddr(&fd, true).unwrap();
        let _ = bind(&fd, &std::net::SocketAddr::from(([127, 0, 0, 1], port)));
        connect(&fd, &addr).unwrap();
        TcpStream::from(fd)
    }

    /// An allowance whose connection went idle `ago`, first seen idle having handed over
    /// `handed_idle` bytes, and (`seen`) whose next head an earlier sweep saw already.
    fn idle(ago: Duration, handed_idle: u64, seen: bool) -> Allowance {
        let mut a = Allowance::new();
        a.inode = Some(1);
        a.bytes = 1000;
        a.idle_since = Instant::now().checked_sub(ago).unwrap();
        a.handed_idle = Some(handed_idle);
        a.head_seen = seen;
        a
    }

    #[test]
    fn a_head_still_arriving_after_the_head_time_is_an_overrun() {
        let head_time = Duration::from_secs(2);
        let long = Duration::from_secs(3);
        // Bytes of a next head, seen by an earlier sweep, for longer than the head time.
        assert_eq!(idle(long, 900, true).overrun(1, 950, head_time, None), Some(Overrun::Head(head_time)));
        // A head seen for the first time may be a request a handler is just taking.
        let mut first = idle(long, 900, false);
        assert_eq!(first.overrun(1, 950, head_time, None), None);
        assert_eq!(first.overrun(1, 951, head_time, None), Some(Overrun::Head(head_time)));
        // Not before the head time, nor without bytes since the connection went idle (a quiet
        // keep-alive connection is tiny_http's to close at its receive timeout).
        assert_eq!(idle(Duration::from_secs(1), 900, true).overrun(1, 950, head_time, None), None);
        assert_eq!(idle(long, 900, true).overrun(1, 900, head_time, None), None);
        // Not while one of its requests is being handled: what arrives may be its body.
        let mut busy = idle(long, 900, true);
        busy.handling = 1;
        assert_eq!(busy.overrun(1, 950, head_time, None), None);
        // A request may have waited for a handler thread a second ago: the head may be whole,
        // and it gets a head time from then. Long ago, or long before the connection went idle,
        // changes nothing.
        let ago = |secs| Instant::now().checked_sub(Duration::from_secs(secs));
        assert_eq!(idle(long, 900, true).overrun(1, 950, head_time, ago(1)), None);
        assert_eq!(idle(long, 900, true).overrun(1, 950, head_time, ago(10)), Some(Overrun::Head(head_time)));
        assert_eq!(idle(Duration::from_secs(3600), 900, true).overrun(1, 950, head_time, ago(3000)), Some(Overrun::Head(head_time)));
        // The bytes count first, and a connection is ended once.
        let mut a = idle(long, 900, true);
        assert_eq!(
            a.overrun(1, 1000 + HEAD_ALLOWANCE + READ_AHEAD + 1, head_time, None),
            Some(Overrun::Bytes(1000 + HEAD_ALLOWANCE + READ_AHEAD))
        );
        assert_eq!(a.overrun(1, 2000 + HEAD_ALLOWANCE + READ_AHEAD, head_time, None), None);
        // What a sweep first sees of an idle connection is where its next head starts.
        let mut fresh = idle(long, 0, false);
        fresh.handed_idle = None;
        assert_eq!(fresh.overrun(1, 950, head_time, None), None);
        assert_eq!(fresh.overrun(1, 951, head_time, None), None, "seen once");
        assert_eq!(fresh.overrun(1, 952, head_time, None), Some(Overrun::Head(head_time)));
    }

    /// A transfer `began` ago that moved `moved` bytes.
    fn moving(began: Duration, moved: u64) -> Arc<Moving> {
        let m = Moving::default();
        m.began.set(Instant::now().checked_sub(began).unwrap()).unwrap();
        m.moved.store(moved, Ordering::Relaxed);
        Arc::new(m)
    }

    #[test]
    fn a_transfer_behind_the_least_rate_is_an_overrun() {
        let grace = Duration::from_secs(2);
        let rate = crate::limits::HTTP_MIN_RATE as u64;
        let now = Instant::now();
        // Within the grace nothing need move; after it, the rate for the time since.
        assert!(!moving(Duration::from_secs(1), 0).late(now, grace));
        assert!(!moving(Duration::from_secs(4), 2 * rate + rate / 10).late(now, grace));
        assert!(moving(Duration::from_secs(4), 2 * rate - rate / 10).late(now, grace));
        // Not started (an answer waiting for its turn on the connection): never behind.
        assert!(!Moving::default().late(now, grace));
        // Past its end, whatever moved.
        let ends = Moving::default();
        ends.until.set(now.checked_sub(Duration::from_millis(1)).unwrap()).unwrap();
        assert!(ends.late(now, grace));
        // It ends its connection even while the request is handled, and only while it lives.
        let guard = ConnectionGuard::new();
        let peer: SocketAddr = "127.0.0.1:4001".parse().unwrap();
        guard.account(Some(&peer), 100);
        let behind = guard.transfer(Some(&peer));
        let _ = behind.moving.began.set(Instant::now().checked_sub(Duration::from_secs(10)).unwrap());
        let look = |g: &ConnectionGuard| {
            let mut accounted = g.accounted.lock().unwrap();
            let a = accounted.get_mut(&peer).unwrap();
            a.inode = Some(1);
            a.ended = false;
            a.overrun(1, 0, grace, None)
        };
        assert_eq!(look(&guard), Some(Overrun::Late));
        drop(behind);
        assert_eq!(look(&guard), None, "a finished transfer is forgotten");
        // A body that stopped outright is the receive timeout's to answer (408) at the head
        // time: the rate ends its connection only a margin later. (Without the margin, a sweep
        // just after the stall time cut the connection before the 408 was written.)
        let stopped = guard.transfer(Some(&peer));
        let _ = stopped.moving.began.set(Instant::now().checked_sub(grace + Duration::from_millis(500)).unwrap());
        stopped.moved(5);
        assert_eq!(look(&guard), None);
        drop(stopped);
        // A transfer counted through a reader starts at its first read.
        let counting = guard.transfer(Some(&peer));
        let mut counted = Counted { inner: &b"hello"[..], transfer: &counting };
        assert!(counting.moving.began.get().is_none());
        std::io::Read::read_to_end(&mut counted, &mut Vec::new()).unwrap();
        assert!(counting.moving.began.get().is_some());
        assert_eq!(counting.moving.moved.load(Ordering::Relaxed), 5);
        // A crediting transfer (a chunked body) lets its connection send more as it moves.
        let bytes = |g: &ConnectionGuard| g.accounted.lock().unwrap()[&peer].bytes;
        let before = bytes(&guard);
        let mut chunked = guard.transfer(Some(&peer));
        chunked.credit(CHUNKED_CREDIT);
        chunked.moved(1000);
        assert_eq!(bytes(&guard), before + 1000 * CHUNKED_CREDIT);
        counting.moved(1000);
        assert_eq!(bytes(&guard), before + 1000 * CHUNKED_CREDIT, "others credit nothing");
    }

    /// Requests on one connection are handled at once when pipelined: one's transfer never
    /// reaches another's, and the head clock starts when the last is done.
    #[test]
    fn a_request_handled_holds_the_head_clock_and_the_last_ones_end_restarts_it() {
        let guard = ConnectionGuard::new();
        let peer: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        guard.account(Some(&peer), 100);
        guard.account(Some(&peer), 100);
        let first = guard.transfer(Some(&peer));
        let second = guard.transfer(Some(&peer));
        assert_eq!(guard.accounted.lock().unwrap()[&peer].transfers.len(), 2);
        drop(first);
        guard.done(Some(&peer));
        let handling = |g: &ConnectionGuard| g.accounted.lock().unwrap()[&peer].handling;
        assert_eq!(handling(&guard), 1);
        assert!(Arc::ptr_eq(&guard.accounted.lock().unwrap()[&peer].transfers[0], &second.moving), "the other's transfer is kept");
        drop(second);
        {
            let mut accounted = guard.accounted.lock().unwrap();
            let a = accounted.get_mut(&peer).unwrap();
            (a.handed_idle, a.head_seen) = (Some(5), true);
        }
        guard.done(Some(&peer));
        let a = &guard.accounted.lock().unwrap()[&peer];
        assert_eq!((a.handling, a.handed_idle, a.head_seen), (0, None, false), "the next head is measured from this answer");
        assert!(a.transfers.is_empty());
        assert!(a.idle_since.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn what_a_connection_handed_over_is_what_was_read_of_it() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut accepted, _) = listener.accept().unwrap();
        client.write_all(&[7u8; 5000]).unwrap();
        let mut got = [0u8; 1000];
        accepted.read_exact(&mut got).unwrap();
        // The rest may still be on its way: the count never exceeds what was read and queued.
        let handed = handed_over(&accepted).unwrap();
        assert_eq!(handed, 1000, "read 1000 bytes; the others wait unread");
    }

    #[test]
    fn a_connection_that_sent_more_than_its_requests_account_for_is_ended() {
        let Some((listener, addr, guard)) = guarded_listener() else { return };
        let mut endless = TcpStream::connect(addr).unwrap();
        let (mut endless_accepted, _) = listener.accept().unwrap();
        let mut large = TcpStream::connect(addr).unwrap();
        let (mut large_accepted, _) = listener.accept().unwrap();
        // One sends a head without end; the other a request whose announced body the server saw.
        let sent = (HEAD_ALLOWANCE + READ_AHEAD + 1000) as usize;
        for (s, a, seen) in [(&mut endless, &mut endless_accepted, None), (&mut large, &mut large_accepted, Some(sent))] {
            s.write_all(&vec![b'A'; sent]).unwrap();
            let mut buf = vec![0u8; sent];
            a.read_exact(&mut buf).unwrap();
            if let Some(body) = seen {
                guard.account(a.peer_addr().ok().as_ref(), body as u64);
            }
        }
        assert_eq!(guard.sweep(&|| None), 1);
        assert_eq!(endless_accepted.read(&mut [0u8; 8]).unwrap(), 0, "the endless head's connection was shut down");
        large_accepted.set_nonblocking(true).unwrap();
        assert!(large_accepted.read(&mut [0u8; 8]).is_err(), "the accounted one is left open (nothing to read, no end)");
        // A connection ended is left alone until it closes; connections the sweep no longer
        // sees are forgotten.
        assert_eq!(guard.sweep(&|| None), 0);
        drop((large, large_accepted, endless, endless_accepted));
        guard.sweep(&|| None);
        assert!(guard.accounted.lock().unwrap().is_empty());
    }
}
