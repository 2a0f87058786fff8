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
//! requests the server has seen from it account for ([`HeadGuard::account`]: [`HEAD_ALLOWANCE`]
//! per head plus each body's announced length, or the most a body without one is drained), with
//! one more head allowance and tiny_http's read-ahead for what it may be reading now. The
//! connection is shut down both ways: tiny_http's read fails, and what it buffered is freed.
//!
//! Between two ticks a connection can still make tiny_http buffer what it sends in that time
//! (tiny_http parses heads a byte at a time, about 85 MB/s on one core here). Where the kernel
//! has no pidfds (before Linux 5.6) the guard does nothing and says so once.

use crate::tally::Tally;
use rustix::fd::{AsFd, OwnedFd};
use rustix::net::SocketType;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// What one request's line and headers may take. MCP clients send a few hundred bytes.
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
    /// Bytes each connection (by peer address) may have handed over so far for the requests the
    /// server has seen, and when that was last raised.
    accounted: Mutex<HashMap<SocketAddr, (u64, Instant)>>,
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
        HeadGuard { listen: OnceLock::new(), me, accounted: Mutex::new(HashMap::new()) }
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

    /// Records a request from `peer` that announced a body of `body` bytes (`None`: not
    /// announced, so up to `unannounced` may be read or drained).
    pub fn account(&self, peer: Option<&SocketAddr>, body: Option<usize>, unannounced: usize) {
        let Some(peer) = peer else { return };
        let more = HEAD_ALLOWANCE.saturating_add(body.unwrap_or(unannounced) as u64);
        let mut accounted = self.accounted.lock().unwrap_or_else(|p| p.into_inner());
        let entry = accounted.entry(*peer).or_insert((0, Instant::now()));
        *entry = (entry.0.saturating_add(more), Instant::now());
    }

    /// Ends every connection that handed over more than its requests account for; how many.
    pub fn sweep(&self) -> usize {
        let (Some(me), Some(listen)) = (&self.me, self.listen.get()) else { return 0 };
        let began = Instant::now();
        let Ok(entries) = std::fs::read_dir("/proc/self/fd") else { return 0 };
        let mut live = Vec::new();
        let mut ended = 0;
        for entry in entries.flatten() {
            let Some(fd) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
            let is_socket = std::fs::read_link(entry.path()).is_ok_and(|l| l.to_string_lossy().starts_with("socket:["));
            if !is_socket {
                continue;
            }
            let Ok(copy) = rustix::process::pidfd_getfd(me, fd, rustix::process::PidfdGetfdFlags::empty()) else { continue };
            if !accepted_on(&copy, *listen) {
                continue;
            }
            let Some(peer) = rustix::net::getpeername(&copy).ok().flatten().and_then(|a| SocketAddr::try_from(a).ok()) else { continue };
            live.push(peer);
            let Some(handed) = handed_over(&copy) else { continue };
            let allowed = self.allowed(&peer);
            if handed > allowed {
                let _ = rustix::net::shutdown(&copy, rustix::net::Shutdown::Both);
                // Until tiny_http sees the end and closes it, later sweeps leave it alone.
                self.account(Some(&peer), Some(usize::MAX), 0);
                ended += 1;
                if let Some(n) = ENDED.add() {
                    log::warn!(
                        "ended {n} HTTP connections so far that sent more than their requests account for (this one: {handed} bytes, \
{allowed} allowed): a request head without end"
                    );
                }
            }
        }
        // Forget connections that are gone, unless raised since this sweep began (a connection
        // accepted after the descriptors were listed).
        let mut accounted = self.accounted.lock().unwrap_or_else(|p| p.into_inner());
        accounted.retain(|peer, (_, raised)| *raised >= began || live.contains(peer));
        ended
    }

    /// What `peer` may have handed over: what its requests account for, one more head and
    /// tiny_http's read-ahead.
    fn allowed(&self, peer: &SocketAddr) -> u64 {
        let accounted = self.accounted.lock().unwrap_or_else(|p| p.into_inner());
        accounted.get(peer).map_or(0, |(n, _)| *n).saturating_add(HEAD_ALLOWANCE + READ_AHEAD)
    }
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
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let guard = HeadGuard::new();
        if guard.me.is_none() {
            return;
        }
        guard.guard(addr);
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
                guard.account(a.peer_addr().ok().as_ref(), Some(body), 0);
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
