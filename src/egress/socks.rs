//! The SOCKS5 side of a sandbox's proxy (RFC 1928: no authentication, CONNECT only; names are
//! resolved by the proxy, as `socks5h://` asks). A refusal answers "not allowed by ruleset" and
//! is recorded like an HTTP one.

use super::dial::Dialed;
use super::proxy::Proxy;
use super::request::valid_host;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, TcpStream};
use std::time::Instant;

/// The first byte of a SOCKS5 greeting.
pub const VERSION: u8 = 5;

/// Reply codes.
const SUCCEEDED: u8 = 0;
const NOT_ALLOWED: u8 = 2;
const HOST_UNREACHABLE: u8 = 4;
const COMMAND_NOT_SUPPORTED: u8 = 7;
const ADDRESS_NOT_SUPPORTED: u8 = 8;

/// Serves one SOCKS5 connection whose version byte was read; the greeting and request must
/// arrive by `deadline`.
pub fn handle(conn: TcpStream, proxy: &Proxy, deadline: Instant) {
    let Some((host, port)) = request(&conn, deadline) else { return };
    match proxy.reach(&host, port, true) {
        Ok(Dialed::Direct(up)) | Ok(Dialed::Upstream(up)) => {
            if reply(&conn, SUCCEEDED) {
                crate::relay::relay(conn, up, super::proxy::IDLE_BUDGET, "egress-relay");
            }
        }
        Err(Ok(_blocked)) => {
            reply(&conn, NOT_ALLOWED);
        }
        Err(Err(_failed)) => {
            reply(&conn, HOST_UNREACHABLE);
        }
    }
}

/// Reads the greeting (answering it) and the CONNECT request; `None` (after answering) when
/// they are malformed, late, or ask for something else.
fn request(conn: &TcpStream, deadline: Instant) -> Option<(String, u16)> {
    let read = |buf: &mut [u8]| -> Option<()> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        conn.set_read_timeout(Some(left)).ok()?;
        (&*conn).read_exact(buf).ok()
    };
    let mut n = [0u8; 1];
    read(&mut n)?;
    let mut methods = vec![0u8; n[0] as usize];
    read(&mut methods)?;
    if !methods.contains(&0) {
        let _ = (&*conn).write_all(&[VERSION, 0xff]);
        return None;
    }
    (&*conn).write_all(&[VERSION, 0]).ok()?;
    let mut head = [0u8; 4];
    read(&mut head)?;
    if head[0] != VERSION {
        return None;
    }
    let host = match head[3] {
        1 => {
            let mut a = [0u8; 4];
            read(&mut a)?;
            Ipv4Addr::from(a).to_string()
        }
        3 => {
            let mut len = [0u8; 1];
            read(&mut len)?;
            let mut name = vec![0u8; len[0] as usize];
            read(&mut name)?;
            String::from_utf8_lossy(&name).trim_end_matches('.').to_ascii_lowercase()
        }
        4 => {
            let mut a = [0u8; 16];
            read(&mut a)?;
            Ipv6Addr::from(a).to_string()
        }
        _ => {
            reply(conn, ADDRESS_NOT_SUPPORTED);
            return None;
        }
    };
    let mut port = [0u8; 2];
    read(&mut port)?;
    if head[1] != 1 {
        reply(conn, COMMAND_NOT_SUPPORTED);
        return None;
    }
    if !valid_host(&host) {
        reply(conn, ADDRESS_NOT_SUPPORTED);
        return None;
    }
    Some((host, u16::from_be_bytes(port)))
}

/// Sends a reply with an unspecified bound address; `false` when it could not be sent.
fn reply(conn: &TcpStream, code: u8) -> bool {
    (&*conn).write_all(&[VERSION, code, 0, 1, 0, 0, 0, 0, 0, 0]).is_ok()
}
