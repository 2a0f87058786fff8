//! The edge's ports other than envd's: a request for port P of a running sandbox is forwarded,
//! whole, to that port of the local sandbox underneath (reached through the local provider's
//! `expose_port`: the port itself without isolation, its keeper's relay with namespaces), and its
//! answer relayed back, as E2B's edge serves `https://P-<id>.<domain>`. A port nothing listens on
//! answers 502 "The sandbox is running but port is not open", as E2B's does.

use crate::http::{HttpReply, HttpRequest};
use crate::State;
use sandbox_mcp::provider::Provider;
use serde_json::json;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// The largest answer relayed.
const MAX_ANSWER: u64 = 64 * 1024 * 1024;

/// How long a forwarded request may take.
const BUDGET: Duration = Duration::from_secs(30);

/// Headers not passed on (hop by hop, or set here).
const DROPPED: &[&str] =
    &["host", "connection", "content-length", "transfer-encoding", "keep-alive", "proxy-connection", "e2b-sandbox-id", "e2b-sandbox-port"];

fn not_open(id: &str, port: u16) -> HttpReply {
    HttpReply::json(502, &json!({ "sandboxId": id, "message": "The sandbox is running but port is not open", "port": port, "code": 502 }))
}

/// Forwards `req` to `port` of emulated sandbox `id` (local sandbox `local_id`).
pub fn forward(state: &State, id: &str, local_id: &str, port: u16, req: &HttpRequest) -> HttpReply {
    let addr: Option<SocketAddr> = state
        .provider
        .expose_port(local_id, port, Instant::now() + BUDGET)
        .ok()
        .and_then(|e| e.url.strip_prefix("http://").and_then(|a| a.parse().ok()));
    let Some(addr) = addr else { return not_open(id, port) };
    let Ok(mut conn) = TcpStream::connect_timeout(&addr, Duration::from_secs(5)) else { return not_open(id, port) };
    let _ = conn.set_read_timeout(Some(BUDGET));
    let _ = conn.set_write_timeout(Some(BUDGET));
    let mut target = req.path.clone();
    if !req.query.is_empty() {
        let pairs: Vec<String> = req.query.iter().map(|(k, v)| format!("{}={}", encode(k), encode(v))).collect();
        target = format!("{target}?{}", pairs.join("&"));
    }
    let mut head = format!(
        "{} {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nContent-Length: {}\r\n",
        req.method,
        req.body.len()
    );
    for (k, v) in &req.headers {
        if !DROPPED.contains(&k.to_ascii_lowercase().as_str()) {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
    }
    head.push_str("\r\n");
    if conn.write_all(head.as_bytes()).and_then(|()| conn.write_all(&req.body)).is_err() {
        return not_open(id, port);
    }
    let mut raw = Vec::new();
    if (&conn).take(MAX_ANSWER).read_to_end(&mut raw).is_err() && raw.is_empty() {
        return not_open(id, port);
    }
    parse(&raw)
        .unwrap_or_else(|| HttpReply::json(502, &json!({ "sandboxId": id, "message": "the port's answer is not HTTP/1.x", "code": 502 })))
}

/// An HTTP/1.x answer read to its end (the request asked for `Connection: close`): status,
/// headers and body; a chunked body is decoded.
fn parse(raw: &[u8]) -> Option<HttpReply> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let status: u16 = lines.next()?.strip_prefix("HTTP/1.")?.get(2..)?.split_whitespace().next()?.parse().ok()?;
    let mut headers = Vec::new();
    let mut chunked = false;
    for line in lines {
        let (k, v) = line.split_once(':')?;
        let (k, v) = (k.trim(), v.trim());
        if k.eq_ignore_ascii_case("transfer-encoding") {
            chunked = v.eq_ignore_ascii_case("chunked");
        } else if !DROPPED.contains(&k.to_ascii_lowercase().as_str()) {
            headers.push((k.to_string(), v.to_string()));
        }
    }
    let mut body = raw[end + 4..].to_vec();
    if chunked {
        body = dechunk(&body)?;
    }
    Some(HttpReply { status, headers, body })
}

fn dechunk(mut data: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = data.windows(2).position(|w| w == b"\r\n")?;
        let size = usize::from_str_radix(std::str::from_utf8(&data[..eol]).ok()?.split(';').next()?.trim(), 16).ok()?;
        data = &data[eol + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(data.get(..size)?);
        data = data.get(size + 2..)?;
    }
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_parse_with_either_framing() {
        let r = parse(b"HTTP/1.0 200 OK\r\nContent-Type: text/html\r\nContent-Length: 2\r\n\r\nhi").unwrap();
        assert_eq!((r.status, r.body.as_slice(), r.headers.len()), (200, &b"hi"[..], 1));
        let r = parse(b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nno\r\n3\r\npe!\r\n0\r\n\r\n").unwrap();
        assert_eq!((r.status, r.body.as_slice()), (404, &b"nope!"[..]));
        assert!(parse(b"SSH-2.0-x\r\n\r\n").is_none());
    }
}
