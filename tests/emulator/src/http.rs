//! The emulator's HTTP/1.1 plumbing over tiny_http: reading a request whole, and writing raw
//! responses (fixed-length replies and chunked streams flushed per frame) with an optional cut
//! that breaks the response after some body bytes.
//!
//! Every response is written through `Request::into_writer`, because tiny_http's own chunked
//! encoder buffers 8 KiB before sending anything, which would hold stream frames back. tiny_http
//! gives no way to close the connection early, so a cut sends the allowed bytes and then an
//! invalid chunk header: the client fails at that point exactly as on a dropped connection and
//! discards the connection.

use serde_json::Value;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::OwnedFd;

/// Largest request body read; larger requests get 413.
pub const EMULATOR_MAX_BODY: usize = 64 * 1024 * 1024;

/// What follows the allowed bytes of a cut response (never a valid chunk-size line).
const POISON: &[u8] = b"!connection dropped by an e2b-emulator fault\r\n\r\n";

/// One request, read whole.
#[derive(Debug, Clone, Default)]
pub struct HttpRequest {
    /// `GET`, `POST`, ...
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// Decoded query parameters in order.
    pub query: Vec<(String, String)>,
    /// Header names and values as received.
    pub headers: Vec<(String, String)>,
    /// The body (chunked bodies are decoded by tiny_http).
    pub body: Vec<u8>,
}

impl HttpRequest {
    /// The first header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// The first query parameter named `name`.
    pub fn query(&self, name: &str) -> Option<&str> {
        self.query.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// The media type of `Content-Type`, lowercased, without parameters.
    pub fn media_type(&self) -> String {
        self.header("Content-Type").unwrap_or("").split(';').next().unwrap_or("").trim().to_ascii_lowercase()
    }

    /// Whether the client asked to close the connection after this exchange.
    pub fn wants_close(&self) -> bool {
        self.header("Connection").is_some_and(|v| v.to_ascii_lowercase().contains("close"))
    }
}

/// Binds a listening socket with `TCP_NODELAY` set, which Linux copies to every accepted
/// connection (tiny_http does not set it, and a stream frame written alone would otherwise wait
/// for the client's delayed ACK). std only offers the setter on streams, so the descriptor is
/// briefly viewed as one: the call is a plain `setsockopt` on the same socket.
pub fn bind_nodelay(addr: SocketAddr) -> io::Result<TcpListener> {
    let listener = TcpListener::bind(addr)?;
    let as_stream = TcpStream::from(OwnedFd::from(listener));
    as_stream.set_nodelay(true)?;
    Ok(TcpListener::from(OwnedFd::from(as_stream)))
}

/// What reading a request gave.
pub enum ReadOutcome {
    /// The request, read whole.
    Ok(HttpRequest),
    /// The body is over [`EMULATOR_MAX_BODY`].
    TooLarge,
}

/// Reads a tiny_http request's line, headers and body.
pub fn read_request(req: &mut tiny_http::Request) -> ReadOutcome {
    let url = origin_form(req.url()).to_string();
    let (path, query) = match url.split_once('?') {
        Some((p, q)) => (p.to_string(), parse_query(q)),
        None => (url.clone(), Vec::new()),
    };
    let headers = req.headers().iter().map(|h| (h.field.as_str().as_str().to_string(), h.value.as_str().to_string())).collect();
    let method = req.method().as_str().to_ascii_uppercase();
    if req.body_length().is_some_and(|n| n > EMULATOR_MAX_BODY) {
        return ReadOutcome::TooLarge;
    }
    let mut body = Vec::new();
    let reader = req.as_reader();
    if reader.take(EMULATOR_MAX_BODY as u64 + 1).read_to_end(&mut body).is_err() {
        body.clear();
    }
    if body.len() > EMULATOR_MAX_BODY {
        return ReadOutcome::TooLarge;
    }
    ReadOutcome::Ok(HttpRequest { method, path, query, headers, body })
}

/// The path and query of a request target: an absolute-form target (`http://host/path`, what a
/// client sends to an HTTP proxy) loses its scheme and authority; the `Host` header names the
/// host.
pub fn origin_form(target: &str) -> &str {
    match target.strip_prefix("http://").or_else(|| target.strip_prefix("https://")) {
        Some(rest) => rest.find('/').map_or("/", |i| &rest[i..]),
        None => target,
    }
}

/// Decodes an `application/x-www-form-urlencoded` query string (`+` is a space).
pub fn parse_query(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

/// Percent-decodes `s` (and turns `+` into a space); invalid escapes are kept as they are and
/// invalid UTF-8 is replaced.
pub fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex_val(bytes[i + 1]), hex_val(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex_val(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// A complete (non-streamed) response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpReply {
    /// HTTP status.
    pub status: u16,
    /// Extra headers (`Content-Length` is added when writing).
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl HttpReply {
    /// A JSON body.
    pub fn json(status: u16, body: &Value) -> HttpReply {
        HttpReply { status, headers: vec![("Content-Type".into(), "application/json".into())], body: body.to_string().into_bytes() }
    }

    /// No body.
    pub fn empty(status: u16) -> HttpReply {
        HttpReply { status, headers: Vec::new(), body: Vec::new() }
    }

    /// A body of any type.
    pub fn bytes(status: u16, content_type: &str, body: Vec<u8>) -> HttpReply {
        HttpReply { status, headers: vec![("Content-Type".into(), content_type.into())], body }
    }

    /// Adds a header.
    pub fn with_header(mut self, name: &str, value: &str) -> HttpReply {
        self.headers.push((name.into(), value.into()));
        self
    }
}

/// The reason phrase of a status.
pub fn reason_phrase(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        413 => "Payload Too Large",
        415 => "Unsupported Media Type",
        429 => "Too Many Requests",
        499 => "Client Closed Request",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        507 => "Insufficient Storage",
        _ => "Unknown",
    }
}

fn head(status: u16, headers: &[(String, String)], framing: &str, close: bool) -> Vec<u8> {
    let mut out = format!("HTTP/1.1 {status} {}\r\n", reason_phrase(status));
    for (k, v) in headers {
        // Header values come from this program; CR and LF are dropped so none can split a line.
        let clean = |s: &str| s.chars().filter(|c| *c != '\r' && *c != '\n').collect::<String>();
        out.push_str(&format!("{}: {}\r\n", clean(k), clean(v)));
    }
    out.push_str(framing);
    if close {
        out.push_str("Connection: close\r\n");
    }
    out.push_str("\r\n");
    out.into_bytes()
}

/// Writes `reply` in full, or, with `cut`, its headers, the first `cut` body bytes and a broken
/// chunk.
pub fn write_reply(writer: &mut dyn Write, reply: &HttpReply, close: bool, cut: Option<usize>) -> io::Result<()> {
    let no_body = reply.status == 204 || reply.status == 304 || (100..200).contains(&reply.status);
    if let Some(cut) = cut {
        let mut stream = ChunkedWriter::start(writer, reply.status, &reply.headers, close, Some(cut))?;
        return match stream.send(&reply.body) {
            // The cut is at or past the end: the terminator is still withheld.
            Ok(()) => stream.break_off(),
            Err(err) if err.kind() == io::ErrorKind::BrokenPipe => Ok(()),
            Err(err) => Err(err),
        };
    }
    let framing = if no_body { String::new() } else { format!("Content-Length: {}\r\n", reply.body.len()) };
    let mut out = head(reply.status, &reply.headers, &framing, close);
    if !no_body {
        out.extend_from_slice(&reply.body);
    }
    writer.write_all(&out)?;
    writer.flush()
}

/// A chunked response written one flushed chunk per [`ChunkedWriter::send`].
pub struct ChunkedWriter<'a> {
    out: &'a mut dyn Write,
    /// Body bytes still allowed before the cut.
    allowed: Option<usize>,
}

impl<'a> ChunkedWriter<'a> {
    /// Writes the status line and headers.
    pub fn start(
        out: &'a mut dyn Write,
        status: u16,
        headers: &[(String, String)],
        close: bool,
        cut: Option<usize>,
    ) -> io::Result<ChunkedWriter<'a>> {
        out.write_all(&head(status, headers, "Transfer-Encoding: chunked\r\n", close))?;
        out.flush()?;
        Ok(ChunkedWriter { out, allowed: cut })
    }

    /// Sends `data` as one chunk and flushes. When a cut falls inside it, sends what is allowed,
    /// breaks the response and returns `BrokenPipe`.
    pub fn send(&mut self, data: &[u8]) -> io::Result<()> {
        let (part, cut_here) = match self.allowed {
            Some(left) if data.len() >= left => (&data[..left], true),
            _ => (data, false),
        };
        if !part.is_empty() {
            let mut chunk = format!("{:x}\r\n", part.len()).into_bytes();
            chunk.extend_from_slice(part);
            chunk.extend_from_slice(b"\r\n");
            self.out.write_all(&chunk)?;
        }
        if let Some(left) = self.allowed.as_mut() {
            *left -= part.len();
        }
        if cut_here && data.len() > part.len() {
            self.break_off()?;
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, "response cut by an injected fault"));
        }
        self.out.flush()
    }

    /// Ends the response properly (or breaks it, when a cut was asked for).
    pub fn finish(mut self) -> io::Result<()> {
        if self.allowed.is_some() {
            return self.break_off();
        }
        self.out.write_all(b"0\r\n\r\n")?;
        self.out.flush()
    }

    /// Sends the invalid chunk header that makes the client drop the response.
    fn break_off(&mut self) -> io::Result<()> {
        self.out.write_all(POISON)?;
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absolute_targets_become_paths() {
        assert_eq!(origin_form("http://49983-i1.sb.test/files?path=a"), "/files?path=a");
        assert_eq!(origin_form("http://h.test"), "/");
        assert_eq!(origin_form("/health"), "/health");
    }

    #[test]
    fn queries_decode() {
        let q = parse_query("path=%2Fhome%2Fuser%2Fa+b.txt&username=&x");
        assert_eq!(q, vec![("path".into(), "/home/user/a b.txt".into()), ("username".into(), "".into()), ("x".into(), "".into())]);
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz%41"), "%zzA");
        assert_eq!(percent_decode("%C3%A9"), "é");
        assert_eq!(percent_decode("a%2"), "a%2");
    }

    #[test]
    fn fixed_reply() {
        let mut out = Vec::new();
        write_reply(&mut out, &HttpReply::json(404, &serde_json::json!({"code": 404})), false, None).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("HTTP/1.1 404 Not Found\r\n"), "{text}");
        assert!(text.contains("Content-Length: 12\r\n"), "{text}");
        assert!(text.ends_with("\r\n\r\n{\"code\":404}"), "{text}");
        let mut out = Vec::new();
        write_reply(&mut out, &HttpReply::empty(204), true, None).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n");
    }

    #[test]
    fn chunks_and_cuts() {
        let mut out = Vec::new();
        let mut w =
            ChunkedWriter::start(&mut out, 200, &[("Content-Type".into(), "application/connect+json".into())], false, None).unwrap();
        w.send(b"hello").unwrap();
        w.send(&[b'x'; 20]).unwrap();
        w.finish().unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n14\r\nxxxxxxxxxxxxxxxxxxxx\r\n0\r\n\r\n"), "{text}");

        let mut out = Vec::new();
        let mut w = ChunkedWriter::start(&mut out, 200, &[], false, Some(7)).unwrap();
        w.send(b"hello").unwrap();
        assert_eq!(w.send(b"world").unwrap_err().kind(), io::ErrorKind::BrokenPipe);
        let text = String::from_utf8(out).unwrap();
        assert!(text.ends_with("5\r\nhello\r\n2\r\nwo\r\n!connection dropped by an e2b-emulator fault\r\n\r\n"), "{text}");

        let mut out = Vec::new();
        write_reply(&mut out, &HttpReply::json(201, &serde_json::json!({"a": 1})), false, Some(0)).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.starts_with("HTTP/1.1 201 Created\r\n") && text.ends_with("\r\n\r\n!connection dropped by an e2b-emulator fault\r\n\r\n"),
            "{text}"
        );
        assert!(!text.contains("Content-Length"), "{text}");
    }
}
