//! A raw HTTP/1.1 MCP client over one keep-alive TCP connection, for the HTTP and protocol rows
//! and the E2B emulator's test API.

use crate::protocol::{MODERN, MODERN_META};
use anyhow::{anyhow, bail, Context, Result};
use serde_json::json;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// The MCP protocol version the driver speaks.
const PROTOCOL: &str = "2025-11-25";

/// One keep-alive HTTP/1.1 client with its own MCP session: a raw client over one TCP
/// connection (TCP_NODELAY, each request written at once), opened at the first request.
/// General-purpose clients add artifacts of their own here (ureq 3 showed a 3–4 ms tail on ~6 %
/// of loopback pings that neither the server nor a raw socket client has).
pub struct Http {
    addr: SocketAddr,
    host: String,
    path: String,
    limit: Duration,
    conn: Option<(TcpStream, BufReader<TcpStream>)>,
    sid: Option<String>,
    /// Extra header lines (each ending in CRLF) for the next request only.
    extra: String,
    next: u64,
}

impl Http {
    /// A client of `url` (`http://IP:PORT/PATH`) whose reads and writes wait up to 30 s.
    pub fn new(url: &str) -> Result<Http> {
        Http::with_timeout(url, Duration::from_secs(30))
    }

    /// A client of `url` whose connects, reads and writes wait up to `limit`.
    pub fn with_timeout(url: &str, limit: Duration) -> Result<Http> {
        let rest = url.strip_prefix("http://").ok_or_else(|| anyhow!("not an http:// URL: {url}"))?;
        let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
        let addr = host.parse().with_context(|| format!("{host} is not IP:PORT"))?;
        Ok(Http { addr, host: host.to_string(), path: format!("/{path}"), limit, conn: None, sid: None, extra: String::new(), next: 1 })
    }

    /// One request and its response (status, body); reconnects when the server closed.
    pub fn send(&mut self, method: &str, body: &str) -> Result<(u16, String)> {
        let mut req = format!(
            "{method} {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\n",
            self.path,
            self.host,
            body.len()
        );
        if let Some(sid) = &self.sid {
            req.push_str(&format!("Mcp-Session-Id: {sid}\r\nMCP-Protocol-Version: {PROTOCOL}\r\n"));
        }
        req.push_str(&std::mem::take(&mut self.extra));
        req.push_str("\r\n");
        req.push_str(body);
        if self.conn.is_none() {
            let stream = TcpStream::connect_timeout(&self.addr, self.limit)?;
            stream.set_nodelay(true)?;
            stream.set_read_timeout(Some(self.limit))?;
            stream.set_write_timeout(Some(self.limit))?;
            let reader = BufReader::new(stream.try_clone()?);
            self.conn = Some((stream, reader));
        }
        let (stream, reader) = self.conn.as_mut().context("no connection")?;
        stream.write_all(req.as_bytes())?;
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let status: u16 = line.split_whitespace().nth(1).and_then(|c| c.parse().ok()).ok_or_else(|| anyhow!("bad status line {line:?}"))?;
        let (mut length, mut chunked, mut close) = (0usize, false, false);
        loop {
            line.clear();
            if reader.read_line(&mut line)? == 0 {
                bail!("the connection closed inside the response headers");
            }
            let Some((name, value)) = line.trim_end().split_once(':') else { break };
            let value = value.trim();
            match name.to_ascii_lowercase().as_str() {
                "content-length" => length = value.parse()?,
                "transfer-encoding" => chunked = value.eq_ignore_ascii_case("chunked"),
                "connection" => close = value.eq_ignore_ascii_case("close"),
                "mcp-session-id" if self.sid.is_none() => self.sid = Some(value.to_string()),
                _ => {}
            }
        }
        let mut data = Vec::new();
        if chunked {
            loop {
                line.clear();
                reader.read_line(&mut line)?;
                let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)?;
                if size == 0 {
                    while reader.read_line(&mut line)? > 0 && line != "\r\n" {
                        line.clear();
                    }
                    break;
                }
                let at = data.len();
                data.resize(at + size + 2, 0);
                reader.read_exact(&mut data[at..])?;
                data.truncate(at + size);
            }
        } else {
            data.resize(length, 0);
            reader.read_exact(&mut data)?;
        }
        if close {
            self.conn = None;
        }
        Ok((status, String::from_utf8_lossy(&data).into_owned()))
    }

    /// A POST of `body`.
    pub fn post(&mut self, body: &str) -> Result<(u16, String)> {
        self.send("POST", body)
    }

    /// The next request's body: `params` is already JSON text.
    pub fn body(&mut self, method: &str, params: Option<&str>) -> String {
        let id = self.next;
        self.next += 1;
        match params {
            Some(p) => format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{p}}}"#),
            None => format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}"}}"#),
        }
    }

    pub fn initialize(&mut self) -> Result<()> {
        let params =
            json!({"protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "bench-driver", "version": "0"}}).to_string();
        let body = self.body("initialize", Some(&params));
        let (status, text) = self.post(&body)?;
        if status != 200 || self.sid.is_none() {
            bail!("initialize answered {status} {text}");
        }
        let (status, _) = self.post(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)?;
        if status != 202 {
            bail!("notifications/initialized answered {status}");
        }
        Ok(())
    }

    /// One request: its status, and what went wrong unless it succeeded (HTTP 200 and neither a
    /// JSON-RPC error nor a tool error).
    pub fn call(&mut self, method: &str, params: Option<&str>) -> Result<(u16, Option<String>)> {
        let body = self.body(method, params);
        let (status, text) = self.post(&body)?;
        let ok = status == 200 && !text.contains("\"isError\":true") && !text.contains("\"error\":{");
        Ok((status, (!ok).then(|| format!("HTTP {status}: {}", text.chars().take(300).collect::<String>()))))
    }

    /// One MCP 2026-07-28 request on the same connection, outside the session: the `_meta`
    /// envelope in the body and the standard headers. Fails unless it succeeded.
    pub fn call_modern(&mut self, method: &str) -> Result<()> {
        let id = self.next;
        self.next += 1;
        let body = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{{"_meta":{MODERN_META}}}}}"#);
        self.extra = format!("MCP-Protocol-Version: {MODERN}\r\nMcp-Method: {method}\r\n");
        let sid = self.sid.take();
        let sent = self.post(&body);
        self.sid = sid;
        let (status, text) = sent?;
        if status != 200 || !text.contains(r#""resultType":"complete""#) {
            bail!("{method} at {MODERN} answered {status}: {}", text.chars().take(300).collect::<String>());
        }
        Ok(())
    }

    /// Ends the session (DELETE) and closes the connection.
    pub fn end(&mut self) {
        if self.sid.is_some() {
            let _ = self.send("DELETE", "");
            self.sid = None;
        }
        self.conn = None;
    }
}
