//! The guard against request heads without end.
//!
//! tiny_http 0.12 reads a request's line and headers without a bound: a client that sends one
//! endless line, or headers without end, makes it buffer all it sends (300 MiB sent in 3.5 s took
//! the server to 305 MiB of RSS; a few such clients take the host's memory), before any check of
//! ours can run. tiny_http offers no limit, and no access to a connection's socket, so the guard
//! looks from outside. Every tick of the acceptor's watchdog ([`HeadGuard::sweep`]) it finds the
//! connections accepted on the HTTP port among the process's descriptors (through a copy of each
//! taken with `pidfd_getfd`, so no descriptor of another part of the server is used by number),
//! asks the kernel how many bytes each has handed to the server (`TCP_INFO`'s bytes received,
//! less what is still queued unread), and ends a connection that handed over more than the
//! requests the server has seen on it account for ([`HeadGuard::account`]: each head's own size
//! plus its body's announced length, or the most a chunked body is read or drained; nothing for
//! a request without a body), plus [`HEAD_ALLOWANCE`] and tiny_http's read-ahead for the head it
//! may be reading now. The connection is shut down both ways: tiny_http's read fails, and what it
//! buffered is freed (and given back to the system at the next sweep).
//!
//! What a connection may send is kept by peer address and tied to the connection (its socket's
//! inode) the first time a sweep sees it: a new connection from the same address and port starts
//! from nothing, and a connection once ended is not ended again.
//!
//! Between two ticks (half a second) a connection can still make tiny_http buffer what it sends
//! in that time, which costs more than its size when it is made of short header lines (each a
//! pair of strings: about 25 times). Where the kernel has no pidfds (before Linux 5.6) the guard
//! does nothing and says so once.

use crate::tally::Tally;
use rustix::fd::{AsFd, OwnedFd};
use rustix::net::SocketType;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// What the head tiny_http may be reading now (not yet a request the server has seen) may take.
/// MCP clients send a few hundred bytes.
pub const HEAD_ALLOWANCE: u64 = 64 * 1024;

/// What tiny_http may have read of a connection beyond what it parsed (its buffered reader).
const READ_AHEAD: u64 = 8 * 1024;

/// Connections ended so far.
static ENDED: Tally = Tally::new();

/// The guard of one HTTP listening socket.
pub struct HeadGuard {
    /// The bound address, once the socket is bound.
    listen: OnceLock<SocketAddr>,
    /// This process as a pidfd, to copy descriptors by number.
    me: Option<OwnedFd>,
    /// What each connection (by peer address) may have handed over so far.
    accounted: Mutex<HashMap<SocketAddr, Allowance>>,
    /// Whether the last sweep ended a connection (the next one gives memory back).
    trim: AtomicBool,
}

/// What one connection may have handed over.
#[derive(Debug)]
struct Allowance {
    /// Bytes of the requests the server has seen on it.
    bytes: u64,
    /// When `bytes` was last raised.
    raised: Instant,
    /// The socket inode of the connection, once a sweep has seen it.
    inode: Option<u64>,
    /// Whether it was ended (shut down) already.
    ended: bool,
}

impl Allowance {
    fn new() -> Allowance {
        Allowance { bytes: 0, raised: Instant::now(), inode: None, ended: false }
    }

    /// Whether the connection of socket `inode`, which has handed over `handed` bytes, is to be
    /// ended now: `Some` of what it was allowed, and it counts as ended from then on. Another
    /// inode than the one seen before is another connection from the same address and port,
    /// which starts afresh.
    fn exceeded(&mut self, inode: u64, handed: u64) -> Option<u64> {
        if self.inode.is_some_and(|seen| seen != inode) {
            *self = Allowance::new();
        }
        self.inode = Some(inode);
        let allowed = self.bytes.saturating_add(HEAD_ALLOWANCE + READ_AHEAD);
        if self.ended || handed <= allowed {
            return None;
        }
        self.ended = true;
        Some(allowed)
    }
}

impl Default for HeadGuard {
    fn default() -> Self {
        HeadGuard::new()
    }
}

impl HeadGuard {
    /// A guard of no socket yet ([`HeadGuard::guard`] names it).
    pub fn new() -> HeadGuard {
        let me = rustix::process::pidfd_open(rustix::process::getpid(), rustix::process::PidfdFlags::empty()).ok();
        HeadGuard { listen: OnceLock::new(), me, accounted: Mutex::new(HashMap::new()), trim: AtomicBool::new(false) }
    }

    /// Starts guarding the connections accepted on `listen` (the bound address).
    pub fn guard(&self, listen: SocketAddr) {
        if self.me.is_none() {
            log::warn!(
                "this kernel has no pidfds: HTTP request heads are not bounded (a client can make the server buffer an endless one)"
            );
        }
        let _ = self.listen.set(listen);
    }

    /// Records a request from `peer` that may have made its connection send `bytes` (its head
    /// and its body).
    pub fn account(&self, peer: Option<&SocketAddr>, bytes: u64) {
        let Some(peer) = peer else { return };
        let mut accounted = self.accounted.lock().unwrap_or_else(|p| p.into_inner());
        let entry = accounted.entry(*peer).or_insert_with(Allowance::new);
        entry.bytes = entry.bytes.saturating_add(bytes);
        entry.raised = Instant::now();
    }

    /// Ends every connection that handed over more than its requests account for; how many.
    pub fn sweep(&self) -> usize {
        let (Some(me), Some(listen)) = (&self.me, self.listen.get()) else { return 0 };
        let began = Instant::now();
        let Ok(entries) = std::fs::read_dir("/proc/self/fd") else { return 0 };
        let mut live = std::collections::HashSet::new();
        let mut ended = 0;
        for entry in entries.flatten() {
            let Some(fd) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
            let Some(inode) = std::fs::read_link(entry.path()).ok().as_deref().and_then(socket_inode) else { continue };
            let Ok(copy) = rustix::process::pidfd_getfd(me, fd, rustix::process::PidfdGetfdFlags::empty()) else { continue };
            if !accepted_on(&copy, *listen) {
                continue;
            }
            let Some(peer) = rustix::net::getpeername(&copy).ok().flatten().and_then(|a| SocketAddr::try_from(a).ok()) else { continue };
            live.insert(peer);
            let Some(handed) = handed_over(&copy) else { continue };
            let exceeded =
                self.accounted.lock().unwrap_or_else(|p| p.into_inner()).entry(peer).or_insert_with(Allowance::new).exceeded(inode, handed);
            let Some(allowed) = exceeded else { continue };
            let _ = rustix::net::shutdown(&copy, rustix::net::Shutdown::Both);
            ended += 1;
            if let Some(n) = ENDED.add() {
                log::warn!(
                    "ended {n} HTTP connections so far that sent more than their requests account for (this one: {handed} bytes, \
{allowed} allowed): a request head without end"
                );
            }
        }
        // Forget connections that are gone, unless raised since this sweep began (a connection
        // accepted after the descriptors were listed).
        let mut accounted = self.accounted.lock().unwrap_or_else(|p| p.into_inner());
        accounted.retain(|peer, a| a.raised >= began || live.contains(peer));
        drop(accounted);
        // What tiny_http buffered for a connection ended by the last sweep is freed by now.
        if self.trim.swap(ended > 0, Ordering::SeqCst) {
            crate::memory::release_free();
        }
        ended
    }
}

/// The inode of a `/proc/self/fd` link naming a socket (`socket:[12345]`).
fn socket_inode(link: &std::path::Path) -> Option<u64> {
    link.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
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
    fn guarded_listener() -> Option<(TcpListener, std::net::SocketAddr, HeadGuard)> {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let guard = HeadGuard::new();
        guard.me.as_ref()?;
        guard.guard(addr);
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
        assert_eq!(guard.sweep(), 0);
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
        assert_eq!(guard.sweep(), 1, "the allowance of the connection before was not carried over");
        // Ended once, it is not ended again.
        assert_eq!(guard.sweep(), 0);
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
        assert_eq!(guard.sweep(), 1);
        assert_eq!(endless_accepted.read(&mut [0u8; 8]).unwrap(), 0, "the endless head's connection was shut down");
        large_accepted.set_nonblocking(true).unwrap();
        assert!(large_accepted.read(&mut [0u8; 8]).is_err(), "the accounted one is left open (nothing to read, no end)");
        // A connection ended is left alone until it closes; connections the sweep no longer
        // sees are forgotten.
        assert_eq!(guard.sweep(), 0);
        drop((large, large_accepted, endless, endless_accepted));
        guard.sweep();
        assert!(guard.accounted.lock().unwrap().is_empty());
    }
}
