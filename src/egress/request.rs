//! A proxy request from the sandbox: its head read within bounds, parsed, and rewritten for the
//! destination or the parent proxy.

use super::policy;
use super::proxy::{HEAD_BUDGET, MAX_HEAD};
use std::io::{self, Read};
use std::net::{IpAddr, TcpStream};
use std::time::Instant;

/// Reads a request head (to the blank line), at most [`MAX_HEAD`] bytes, by `deadline` however
/// slowly it comes; returns the head and what came after it.
pub fn read_head(conn: &TcpStream, mut buf: Vec<u8>, deadline: Instant) -> Result<(Vec<u8>, Vec<u8>), String> {
    let mut chunk = [0u8; 4096];
    // Where the search for the blank line goes on from: what was searched is not searched again
    // (a head trickled a byte at a time would cost quadratic time).
    let mut searched = 0;
    let too_long = || format!("the request head is longer than {MAX_HEAD} bytes");
    loop {
        if let Some(end) = buf[searched..].windows(4).position(|w| w == b"\r\n\r\n").map(|at| searched + at) {
            if end + 4 > MAX_HEAD {
                return Err(too_long());
            }
            let rest = buf.split_off(end + 4);
            return Ok((buf, rest));
        }
        searched = buf.len().saturating_sub(3);
        if buf.len() >= MAX_HEAD {
            return Err(too_long());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || conn.set_read_timeout(Some(left)).is_err() {
            return Err(format!("the request head did not arrive within {} s", HEAD_BUDGET.as_secs()));
        }
        match (&*conn).read(&mut chunk) {
            Ok(0) => return Err("the connection closed before the end of the request head".into()),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return Err(format!("the request head did not arrive within {} s", HEAD_BUDGET.as_secs())),
        }
    }
}

/// A parsed proxy request.
#[derive(Debug, PartialEq)]
pub struct Request {
    /// `CONNECT`, `GET`, ...
    pub method: String,
    /// Lowercase name, or an IP literal (IPv6 without brackets).
    pub host: String,
    /// The destination port.
    pub port: u16,
    /// The origin-form target (`/path?query`); empty for CONNECT.
    path: String,
    version: String,
    /// The header lines, as sent.
    headers: Vec<String>,
}

impl Request {
    /// The length of the request body: its `Content-Length`, 0 without one; a chunked body is
    /// refused (its end could hide a second request), and so are a second `Content-Length` and
    /// one that is not plain digits (a parent proxy reading either differently would take the
    /// rest of the body for a request of its own).
    pub fn body_length(&self) -> Result<u64, String> {
        let mut length = None;
        for header in &self.headers {
            let (name, value) = header.split_once(':').unwrap_or((header, ""));
            match name.to_ascii_lowercase().as_str() {
                "transfer-encoding" => {
                    return Err("request bodies must have a Content-Length through this proxy (no chunked encoding)".into())
                }
                "content-length" => {
                    let value = value.trim_matches([' ', '\t']);
                    let digits = !value.is_empty() && value.len() <= 19 && value.bytes().all(|b| b.is_ascii_digit());
                    let parsed = value.parse::<u64>().ok().filter(|_| digits).ok_or("a malformed Content-Length (digits only)")?;
                    if length.replace(parsed).is_some() {
                        return Err("a request with more than one Content-Length".into());
                    }
                }
                _ => {}
            }
        }
        Ok(length.unwrap_or(0))
    }

    /// Parses a request head (request line and headers, ending with the blank line).
    pub fn parse(head: &[u8]) -> Result<Request, String> {
        let text = std::str::from_utf8(head).map_err(|_| "the request head is not text".to_string())?;
        let mut lines = text.split("\r\n");
        let line = lines.next().unwrap_or_default();
        let mut parts = line.split(' ');
        let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
            return Err("a malformed request line".into());
        };
        // No control byte anywhere in the line (a parent proxy could split or read it otherwise).
        if !matches!(version, "HTTP/1.0" | "HTTP/1.1") || line.bytes().any(|b| b < 0x20 || b == 0x7f) {
            return Err("a malformed request line".into());
        }
        if !METHODS.contains(&method) {
            // TRACE above all: a parent proxy answering it would echo the operator's credentials.
            return Err(format!("this proxy forwards the methods {} only", METHODS.join(", ")));
        }
        let (authority, path) = if method == "CONNECT" {
            (target, String::new())
        } else if let Some(rest) = target.strip_prefix("http://") {
            match rest.find('/') {
                Some(at) => (&rest[..at], rest[at..].to_string()),
                None => (rest, "/".to_string()),
            }
        } else {
            return Err("this is the sandbox's HTTP proxy: send absolute http:// URLs, or CONNECT host:port for anything else".into());
        };
        // Credentials in the URL are dropped, never forwarded or logged.
        let authority = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
        let default_port = if method == "CONNECT" { 0 } else { 80 };
        let (host, port) =
            split_host_port(authority, default_port).filter(|(_, p)| *p != 0).ok_or("the request names no valid host and port")?;
        let headers: Vec<String> = lines.filter(|l| !l.is_empty()).map(str::to_string).collect();
        // Every header `name: value` on a line of its own, ended by CRLF: a bare CR or LF, a
        // folded line, a name that is not a token or space before the colon could be read as
        // another header, or another request, by a parent proxy less strict than this one.
        let token = |name: &str| !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        let clean = |value: &str| value.bytes().all(|b| b == b'\t' || (b >= 0x20 && b != 0x7f));
        if headers.iter().any(|h| h.split_once(':').is_none_or(|(name, value)| !token(name) || !clean(value))) {
            return Err("a malformed request head: each header must be `Name: value` on a line of its own ending in CRLF".into());
        }
        Ok(Request { method: method.to_string(), host, port, path, version: version.to_string(), headers })
    }

    /// The head sent on: origin-form to the destination, absolute-form to a parent proxy (with
    /// its credentials); hop-by-hop and proxy headers dropped, one request per connection.
    pub fn rewrite(&self, absolute: bool, auth: Option<&str>) -> Vec<u8> {
        let authority = match self.host.parse::<IpAddr>() {
            Ok(IpAddr::V6(v6)) => format!("[{v6}]:{}", self.port),
            _ => format!("{}:{}", self.host, self.port),
        };
        let target = if absolute { format!("http://{authority}{}", self.path) } else { self.path.clone() };
        let mut out = format!("{} {target} {}\r\n", self.method, self.version);
        // The Host header names the destination that was checked, whatever the client wrote.
        let host =
            if self.port == 80 { authority.rsplit_once(':').map_or(authority.as_str(), |(h, _)| h).to_string() } else { authority.clone() };
        out.push_str(&format!("Host: {host}\r\n"));
        for header in &self.headers {
            let name = header.split(':').next().unwrap_or_default().trim().to_ascii_lowercase();
            if !matches!(name.as_str(), "host" | "proxy-connection" | "proxy-authorization" | "connection" | "keep-alive" | "max-forwards")
            {
                out.push_str(header);
                out.push_str("\r\n");
            }
        }
        if let Some(auth) = auth {
            out.push_str(&format!("Proxy-Authorization: Basic {auth}\r\n"));
        }
        out.push_str("Connection: close\r\n\r\n");
        out.into_bytes()
    }
}

/// The methods forwarded (what package managers, git and browsers send).
const METHODS: [&str; 8] = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT"];

/// Splits `host:port` (`[v6]:port`; `default` when no port is given and `default` is not 0)
/// into a lowercase host that is a valid name or IP literal, and the port.
pub fn split_host_port(authority: &str, default: u16) -> Option<(String, u16)> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (v6, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None if after.is_empty() && default != 0 => default,
            None => return None,
        };
        (v6.parse::<std::net::Ipv6Addr>().ok()?.to_string(), port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), p.parse().ok()?),
            None if default != 0 => (authority.to_string(), default),
            None => return None,
        }
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    valid_host(&host).then_some((host, port))
}

/// Whether `host` is an IP literal or a valid domain name. A name whose last label is a number
/// is refused: resolvers, and a parent proxy given the name unresolved, read it as an IPv4
/// address in a shorthand notation (`127.1`), which would pass unchecked as a name.
pub fn valid_host(host: &str) -> bool {
    host.parse::<IpAddr>().is_ok() || (policy::check_name(host).is_ok() && !policy::ends_numeric(host))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::TcpListener;
    use std::time::Duration;

    #[test]
    fn requests_parse_and_rewrite_without_proxy_headers() {
        let r = Request::parse(b"GET http://User:Pw@Pkgs.Test:8080/simple/x?token=s HTTP/1.1\r\nHost: pkgs.test\r\nProxy-Authorization: Basic eA==\r\nProxy-Connection: keep-alive\r\nAccept: */*\r\n\r\n").unwrap();
        assert_eq!((r.host.as_str(), r.port, r.path.as_str()), ("pkgs.test", 8080, "/simple/x?token=s"));
        let out = String::from_utf8(r.rewrite(false, None)).unwrap();
        assert_eq!(out, "GET /simple/x?token=s HTTP/1.1\r\nHost: pkgs.test:8080\r\nAccept: */*\r\nConnection: close\r\n\r\n");
        let lying = Request::parse(b"GET http://a.test/ HTTP/1.1\r\nHost: evil.test\r\nContent-Length: 5\r\n\r\n").unwrap();
        let out = String::from_utf8(lying.rewrite(false, None)).unwrap();
        assert!(out.contains("Host: a.test\r\n") && !out.contains("evil"), "{out}");
        assert_eq!(lying.body_length(), Ok(5));
        let chunked = Request::parse(b"POST http://a.test/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n").unwrap();
        assert!(chunked.body_length().is_err());
        let out = String::from_utf8(r.rewrite(true, Some("dTpw"))).unwrap();
        assert!(
            out.starts_with("GET http://pkgs.test:8080/simple/x?token=s HTTP/1.1\r\n") && out.contains("Proxy-Authorization: Basic dTpw"),
            "{out}"
        );
        let c = Request::parse(b"CONNECT [::1]:443 HTTP/1.1\r\n\r\n").unwrap();
        assert_eq!((c.host.as_str(), c.port), ("::1", 443));
        assert!(Request::parse(b"CONNECT host.test HTTP/1.1\r\n\r\n").is_err(), "CONNECT needs a port");
        assert!(Request::parse(b"GET / HTTP/1.1\r\n\r\n").unwrap_err().contains("absolute"));
        assert!(Request::parse(b"GET https://x.test/ HTTP/1.1\r\n\r\n").is_err());
        assert!(Request::parse(b"GET http://bad host/ HTTP/1.1\r\n\r\n").is_err());
        assert!(Request::parse(b"GET http://a_b.test\x01/ HTTP/1.1\r\n\r\n").is_err());
    }

    /// Heads a parent proxy could read differently from this one are refused, so nothing can be
    /// smuggled past the policy inside an allowed request; TRACE, which a parent proxy may
    /// answer by echoing the credentials this proxy adds, is refused too (found by a review).
    #[test]
    fn heads_a_parent_proxy_could_read_otherwise_are_refused() {
        let smuggled = b"POST http://a.test/ HTTP/1.1\r\nX: a\nTransfer-Encoding: chunked\r\nContent-Length: 40\r\n\r\n";
        for head in [
            smuggled.as_slice(),
            b"GET http://a.test/ HTTP/1.1\r\nX: a\rY: b\r\n\r\n",
            b"GET http://a.test/ HTTP/1.1\r\nContent-Length : 5\r\n\r\n",
            b"GET http://a.test/ HTTP/1.1\r\nAccept: */*\r\n folded: x\r\n\r\n",
            b"GET http://a.test/ HTTP/1.1\r\nX-Null: a\x00b\r\n\r\n",
            b"TRACE http://a.test/ HTTP/1.1\r\nMax-Forwards: 0\r\n\r\n",
            // Control bytes in the request line, and versions other than 1.0 and 1.1 (found by
            // a review: only CR and LF were refused there).
            b"GET http://a.test/x\x00y HTTP/1.1\r\n\r\n",
            b"GET http://a.test/x\thttp://b.test/ HTTP/1.1\r\n\r\n",
            b"GET http://a.test/ HTTP/1.1\x0b\r\n\r\n",
            b"GET http://a.test/\x7f HTTP/1.1\r\n\r\n",
            b"GET http://a.test/ HTTP/1.1x\r\n\r\n",
            b"GET http://a.test/ HTTP/1.9\r\n\r\n",
        ] {
            assert!(Request::parse(head).is_err(), "{}", String::from_utf8_lossy(head));
        }
        for lengths in ["Content-Length: 5\r\nContent-Length: 40", "Content-Length: +5", "Content-Length: 5, 5", "Content-Length: "] {
            let r = Request::parse(format!("POST http://a.test/ HTTP/1.1\r\n{lengths}\r\n\r\n").as_bytes()).unwrap();
            assert!(r.body_length().is_err(), "{lengths}");
        }
        let ok = Request::parse(
            b"OPTIONS http://a.test/ HTTP/1.1\r\nContent-Length:\t7 \r\nMax-Forwards: 3\r\nUser-Agent: pip/24 (x; y)\r\n\r\n",
        )
        .unwrap();
        assert_eq!(ok.body_length(), Ok(7));
        let out = String::from_utf8(ok.rewrite(true, Some("dTpw"))).unwrap();
        assert!(!out.contains("Max-Forwards") && out.contains("User-Agent: pip/24 (x; y)\r\n"), "{out}");
    }

    /// The blank line is found where it straddles two reads (the search resumes three bytes
    /// back, not from the start).
    #[test]
    fn a_head_whose_end_straddles_two_reads_is_found() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (conn, _) = listener.accept().unwrap();
        c.write_all(b"\nbody").unwrap();
        let early = b"GET http://x.test/ HTTP/1.1\r\nA: b\r\n\r".to_vec();
        let (head, rest) = read_head(&conn, early, Instant::now() + Duration::from_secs(5)).unwrap();
        assert!(head.ends_with(b"A: b\r\n\r\n") && rest == b"body", "{:?}", String::from_utf8_lossy(&rest));
    }

    /// A name whose last label is a number is an IPv4 address in a shorthand notation to a
    /// resolver: with a parent proxy it would go there unchecked, and reach the host's loopback
    /// (found by a review). Names that merely hold digits are names.
    #[test]
    fn shorthand_ipv4_hosts_are_refused_in_requests_and_socks_names() {
        for odd in ["127.1", "2130706433", "0x7f.1", "0177.0.0.1", "0x7f000001", "0X7F.0.0.1", "10.1", "a.0x", "1.2.3.4.5"] {
            assert!(!valid_host(odd), "{odd}");
            let head = format!("CONNECT {odd}:443 HTTP/1.1\r\n\r\n");
            assert!(Request::parse(head.as_bytes()).is_err(), "{odd}");
            let head = format!("GET http://{odd}/ HTTP/1.1\r\n\r\n");
            assert!(Request::parse(head.as_bytes()).is_err(), "{odd}");
        }
        for name in ["127.0.0.1", "1e100.net", "a1.test", "0x.test", "123.example", "::1", "x-0.test"] {
            assert!(valid_host(name), "{name}");
        }
    }

    /// A head of exactly [`MAX_HEAD`] bytes is read; one byte more is refused, whatever the
    /// reads' sizes (found by a review: up to a read's size more got through).
    #[test]
    fn a_head_is_at_most_max_head_bytes() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        for (size, fits) in [(MAX_HEAD, true), (MAX_HEAD + 1, false), (MAX_HEAD + 4000, false)] {
            let start = b"GET http://x.test/ HTTP/1.1\r\nX-Filler: ";
            let mut head = start.to_vec();
            head.resize(size - 4, b'a');
            head.extend_from_slice(b"\r\n\r\n");
            let mut c = TcpStream::connect(addr).unwrap();
            c.write_all(&head).unwrap();
            let (conn, _) = listener.accept().unwrap();
            let got = read_head(&conn, Vec::new(), Instant::now() + Duration::from_secs(5));
            assert_eq!(got.is_ok(), fits, "{size}: {:?}", got.map(|(h, _)| h.len()));
        }
    }

    #[test]
    fn heads_are_bounded_in_size_and_time() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let flood = std::thread::spawn(move || {
            let mut c = TcpStream::connect(addr).unwrap();
            let _ = c.write_all(b"GET http://x.test/ HTTP/1.1\r\n");
            while c.write_all(b"X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n").is_ok() {}
        });
        let (conn, _) = listener.accept().unwrap();
        let err = read_head(&conn, Vec::new(), Instant::now() + Duration::from_secs(5)).unwrap_err();
        assert!(err.contains("longer than"), "{err}");
        drop(conn);
        flood.join().unwrap();
        let _slow = TcpStream::connect(addr).unwrap();
        let (conn, _) = listener.accept().unwrap();
        let t0 = Instant::now();
        let err = read_head(&conn, Vec::new(), Instant::now() + Duration::from_millis(200)).unwrap_err();
        assert!(err.contains("did not arrive") && t0.elapsed() < Duration::from_secs(2), "{err}");
    }
}
