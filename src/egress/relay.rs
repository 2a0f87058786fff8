//! The relay of a sandbox's proxied connection: both ways until both ends are done or nothing
//! moves for the idle budget, and the exact body of a plain-HTTP request.

use super::proxy::IDLE_BUDGET;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};

/// The relay buffer (large enough to keep up with a loopback transfer).
const RELAY_BUFFER: usize = 64 * 1024;

/// Forwards exactly `length` bytes of request body: what came with the head (`early`), then the
/// rest from `client`. `false` when the client or the destination failed.
pub fn forward_body(client: &TcpStream, upstream: &TcpStream, early: &[u8], length: u64) -> bool {
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

/// Copies both ways between the sandbox's connection and the destination until both ends are
/// done or nothing moves for [`IDLE_BUDGET`].
pub fn relay(client: TcpStream, upstream: TcpStream) {
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
pub fn pump(from: TcpStream, to: TcpStream) {
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
