//! The floor of the relay rows: the barest relay a program can be, measured in the same run as
//! the product's. Each connection to its listener is joined to a fresh connection to one target
//! by two threads, each a plain read/write loop over a fixed 2 MiB buffer, with the same 4 MiB
//! socket buffers the product's relay asks for. No timeouts, no limits, no idle or drain
//! bookkeeping: whatever it reaches is what a user-space copy between two loopback connections
//! reaches on this machine, and the product's relay is read against it as well as against a
//! direct transfer.

use anyhow::Result;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};

const BUFFER: usize = 2 * 1024 * 1024;
const SOCKET_BUFFER: usize = 4 * 1024 * 1024;

/// Starts a bare relay toward `target` on a loopback port; its address. Its threads live as
/// long as the benchmark process.
pub fn start(target: SocketAddr) -> Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let Ok(out) = TcpStream::connect(target) else { continue };
            for s in [&conn, &out] {
                let _ = s.set_nodelay(true);
                let _ = rustix::net::sockopt::set_socket_recv_buffer_size(s, SOCKET_BUFFER);
                let _ = rustix::net::sockopt::set_socket_send_buffer_size(s, SOCKET_BUFFER);
            }
            let (Ok(conn_back), Ok(out_back)) = (conn.try_clone(), out.try_clone()) else { continue };
            std::thread::spawn(move || copy(conn, out));
            std::thread::spawn(move || copy(out_back, conn_back));
        }
    });
    Ok(addr)
}

/// Copies `from` into `to` until `from` ends or either fails; then closes `to` for writing.
fn copy(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = vec![0u8; BUFFER];
    while let Ok(n @ 1..) = from.read(&mut buf) {
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}
