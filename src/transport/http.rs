//! The HTTP transport: `POST /mcp` answering `application/json`, sessions by
//! `Mcp-Session-Id` for 2025 requests, session-less 2026-07-28 requests (their headers are
//! checked by `headers.rs`), `subscriptions/listen` streams, `DELETE /mcp`, and `GET /healthz`.
//!
//! tiny_http's rough edges are wrapped here and nowhere else: its headers, its unbounded body
//! reader (read through a cap), and its drain-on-drop of unread bodies (see [`read_body`]).
//! Every early answer reads or discards the body first so keep-alive connections stay in sync.

use super::body_budget::{self, Body, BodyBudget};
use super::connection_guard::{ConnectionGuard, Counted, Transfer, CHUNKED_CREDIT, CHUNKED_START, RATE_MARGIN};
use crate::answer_budget::Charge;
use crate::app::App;
use crate::ids;
use crate::jsonrpc::{self, code, Incoming, RpcError};
use crate::limits::MAX_BODY_BYTES;
use crate::mcp::envelope::{self, RequestMeta};
use crate::mcp::protocol::{self, Listen, Refusal, Route, Work, WorkQueue, SUPPORTED_VERSIONS};
use crate::mcp::session::{Session, Sessions};
use crate::mcp::subscription;
use crate::memory;
use crate::queue::{self, Outcome};
use crate::transport::accept::Acceptor;
use crate::transport::handlers::Handlers;
use crate::transport::headers;
use crate::transport::stream_shares::{self, Slot, StreamShares};
use crate::waiter::Waiter;
use crossbeam_channel::TrySendError;
use serde_json::Value;
use std::collections::HashMap;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};
use tiny_http::{Header, Method, Request, Response, StatusCode};

/// The longest a handler thread waits for a worker's reply (every provider call has its own,
/// shorter deadline; this only guards against a lost reply).
const REPLY_WAIT: Duration = Duration::from_secs(3600 + 300);

/// What goes before and after a JSON-RPC message sent as a server-sent event.
const EVENT_HEAD: &str = "event: message\ndata: ";
const EVENT_END: &str = "\n\n";

/// A body announced longer than this is not read at all: it is answered 413 at once, and its
/// connection ended about a second later (see `serve`).
const MAX_DRAIN_BYTES: usize = 64 * 1024 * 1024;

/// The answer to a body over [`MAX_BODY_BYTES`].
const TOO_LARGE: &str = "Payload Too Large: the body limit is 4 MiB; send smaller messages (write a large file in parts)";

/// After this long, a connection is asked to reconnect (`Connection: close`). tiny_http 0.12 gives
/// every connection a thread of its pool, and when several connections arrive at once the pool
/// can queue one behind busy threads (it counts a thread as idle while that thread is already
/// taking another task); such a connection is served only when another one ends. Bounding the
/// age of busy connections bounds that wait.
pub const MAX_CONNECTION_AGE: Duration = Duration::from_secs(5);

/// Binds a listening socket with options Linux copies to every connection accepted from it
/// (tiny_http sets none of them, and gives no access to a connection's socket):
/// - `TCP_NODELAY`: a reply written in pieces would otherwise wait for the client's delayed ACK;
/// - send and receive timeouts of `stall`: a write of an answer or a stream event, or a read of a
///   request or its body, that makes no progress for that long fails. Without them a client that
///   never reads its answer kept the answer's memory and a handler thread until the process ended
///   (a 4 MiB file of control bytes is a 54 MB answer), and a connection that sends nothing kept a
///   thread of tiny_http's pool and two descriptors. tiny_http ends a connection whose read fails
///   (without a 408: it answers one only for `TimedOut`, and a socket timeout is `WouldBlock`);
///   a request already read is still answered first. tiny_http reads a connection's next request
///   while its current one is being answered, so a connection whose call lasts longer than
///   `stall` ends after that answer, and its client reconnects.
///
/// The receive timeout also bounds how long an `accept` waits, and tiny_http's accept loop ends
/// for good at its first failed accept. The watchdog connects to the port every tick, at most a
/// quarter of the stall time (`Acceptor::nudge`), so an accept never waits that long while the
/// watchdog runs; if one does (the watchdog was kept from running for that long), the watchdog
/// starts a new server on the socket, as for any accept loop that ended.
///
/// std only offers these setters on streams; the descriptor is briefly viewed as one, which is
/// safe: each call is a plain `setsockopt` on the same socket.
pub fn bind(addr: SocketAddr, stall: Duration) -> std::io::Result<std::net::TcpListener> {
    use std::os::fd::OwnedFd;
    let listener = std::net::TcpListener::bind(addr)?;
    let as_stream = std::net::TcpStream::from(OwnedFd::from(listener));
    as_stream.set_nodelay(true)?;
    as_stream.set_write_timeout(Some(stall))?;
    as_stream.set_read_timeout(Some(stall))?;
    Ok(std::net::TcpListener::from(OwnedFd::from(as_stream)))
}

/// Everything a handler thread needs.
pub struct Listener {
    app: Arc<App>,
    sessions: Arc<Sessions>,
    /// Workers answer an HTTP job with its [`Outcome`]; a cancelled call is still answered.
    queue: WorkQueue<Outcome>,
    /// Whether the listen address is loopback (then `Host` is checked too).
    loopback: bool,
    /// First and last request time of each connection seen recently (by peer address).
    connections: Mutex<HashMap<SocketAddr, (Instant, Instant)>>,
    /// Requests being handled right now (shutdown waits for their answers to be written).
    busy: AtomicUsize,
    /// `subscriptions/listen` streams open right now (each holds a handler thread), in all and
    /// per client.
    streams: StreamShares,
    /// Follows the tasks a subscription names.
    waiter: Waiter,
    /// Memory for request bodies, shared by every connection.
    budget: Arc<BodyBudget>,
    /// Ends connections that send more than their requests account for (heads without end), or
    /// too slowly (heads, bodies and answers that trickle).
    guard: Arc<ConnectionGuard>,
}

/// How often an open `subscriptions/listen` stream looks for the start of shutdown.
const LISTEN_POLL: Duration = Duration::from_millis(200);

/// How often an open `subscriptions/listen` stream sends an SSE comment: it keeps
/// intermediaries from closing a quiet stream, and a failed write tells that the client left.
const LISTEN_KEEPALIVE: Duration = Duration::from_secs(15);

impl Listener {
    /// The listener of `app`'s HTTP transport.
    pub fn new(app: Arc<App>, sessions: Arc<Sessions>, queue: WorkQueue<Outcome>, waiter: Waiter, loopback: bool) -> Listener {
        let budget = BodyBudget::new(app.config.body_budget);
        Listener {
            app,
            sessions,
            queue,
            loopback,
            connections: Mutex::new(HashMap::new()),
            busy: AtomicUsize::new(0),
            streams: StreamShares::new(),
            waiter,
            budget,
            guard: Arc::new(ConnectionGuard::new()),
        }
    }

    /// Whether this connection should be asked to reconnect: it is older than
    /// [`MAX_CONNECTION_AGE`], or another connection was used within that time. Keep-alive is
    /// for a client alone: an idle kept-alive connection holds a tiny_http thread, and when a
    /// burst of connections is queued behind the pool's race (see [`MAX_CONNECTION_AGE`]) only
    /// threads that end their connection serve the queue. With at most one connection kept at a
    /// time, at least three of the pool's four resident threads keep turning over.
    fn should_close(&self, peer: Option<&SocketAddr>) -> bool {
        let Some(peer) = peer else { return false };
        let mut conns = self.connections.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if conns.len() > 64 {
            conns.retain(|_, (_, last)| now.duration_since(*last) < MAX_CONNECTION_AGE);
        }
        let first = conns.entry(*peer).or_insert((now, now)).0;
        let shared = conns.iter().any(|(p, (_, last))| p != peer && now.duration_since(*last) < MAX_CONNECTION_AGE);
        if now.duration_since(first) >= MAX_CONNECTION_AGE || shared {
            conns.remove(peer);
            return true;
        }
        if let Some(entry) = conns.get_mut(peer) {
            entry.1 = now;
        }
        false
    }
}

/// A running HTTP server.
pub struct HttpServer {
    /// The tiny_http servers on the listening socket ([`Acceptor`]).
    acceptor: Arc<Acceptor>,
    listener: Arc<Listener>,
    /// The bound address (the port is real even when 0 was asked for).
    pub addr: SocketAddr,
}

impl HttpServer {
    /// Binds `addr` and starts serving: each request is handled on a thread of its own while it
    /// lasts, at most `max_handlers` at once ([`Handlers`]).
    pub fn start(addr: SocketAddr, max_handlers: usize, listener: Listener) -> anyhow::Result<HttpServer> {
        let socket = bind(addr, listener.app.config.http_stall).map_err(|err| anyhow::anyhow!("binding {addr}: {err}"))?;
        let listener = Arc::new(listener);
        let handling = listener.clone();
        let handlers = Handlers::new("sandbox-mcp-http", max_handlers, move |req| handling.handle(req));
        let (acceptor, bound) = Acceptor::start(socket, handlers, listener.guard.clone(), listener.app.config.http_stall)?;
        Ok(HttpServer { acceptor, listener, addr: bound })
    }

    /// Waits (until `deadline`) for the requests being handled to be answered.
    pub fn wait_answered(&self, deadline: Instant) {
        while self.listener.busy.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Stops accepting requests. Handler threads still waiting for a long tool call are not
    /// joined: shutdown must not wait for them (the process exits after ending the sessions).
    pub fn stop(self) {
        self.acceptor.stop();
    }
}

fn header(name: &str, value: &str) -> Header {
    // Names and values here are ASCII constants or ids we generate, so this cannot fail; an
    // invalid one would be dropped by tiny_http rather than sent.
    Header::from_bytes(name.as_bytes(), value.as_bytes())
        .unwrap_or_else(|()| Header::from_bytes(&b"X-Invalid"[..], &b"1"[..]).expect("a constant header is valid"))
}

/// The peer's address without its port: each stream is a connection of its own.
fn peer_ip(req: &Request) -> Option<IpAddr> {
    req.remote_addr().map(SocketAddr::ip)
}

/// What `req` may have made its connection send (see `ConnectionGuard::account`): its head as
/// received (line and headers, with their separators), and its body: the announced length if it
/// is to be read (what its handler does not read of it is taken back, see `serve`), a chunked
/// one its start (the rest is credited as it is read), none without either.
fn sent_for(req: &Request) -> u64 {
    let headers: usize = req.headers().iter().map(|h| h.field.as_str().as_str().len() + h.value.as_str().len() + 4).sum();
    let head = req.method().as_str().len() + req.url().len() + "  HTTP/1.1\r\n\r\n".len() + headers;
    (head + body_credit(req)) as u64
}

/// What `req`'s body is credited before it is read (see `sent_for`).
fn body_credit(req: &Request) -> usize {
    match req.body_length() {
        Some(n) if n <= MAX_DRAIN_BYTES => n,
        None if chunked(req) => CHUNKED_START as usize,
        _ => 0,
    }
}

/// Writes `bytes` to `writer` in pieces, counting each into `transfer`, whose clock starts now.
fn write_counted(writer: &mut dyn Write, bytes: &[u8], transfer: &Transfer<'_>) -> std::io::Result<()> {
    transfer.start();
    for piece in bytes.chunks(64 * 1024) {
        writer.write_all(piece)?;
        transfer.moved(piece.len());
    }
    Ok(())
}

/// Whether `req`'s body is chunked (tiny_http decodes any `Transfer-Encoding` as chunked).
fn chunked(req: &Request) -> bool {
    req.body_length().is_none() && get(req, "Transfer-Encoding").is_some()
}

fn get<'a>(req: &'a Request, name: &str) -> Option<&'a str> {
    req.headers().iter().find(|h| h.field.as_str().as_str().eq_ignore_ascii_case(name)).map(|h| h.value.as_str())
}

struct Answer {
    status: u16,
    /// A serialized JSON body.
    body: Option<String>,
    /// The body's share of the answer budget, given back once it is written.
    charge: Charge,
    headers: Vec<(&'static str, String)>,
    /// Ask the client to close the connection after this answer.
    close: bool,
    /// Instead of a body: hold a `subscriptions/listen` stream open, in the place it took.
    listen: Option<(Listen, Slot)>,
}

impl Answer {
    fn json(status: u16, body: Value) -> Answer {
        Answer::text(status, body.to_string())
    }

    /// A worker's response, serialized, with its share of the answer budget.
    fn response(status: u16, response: queue::Response) -> Answer {
        let (body, charge) = response.serialize();
        Answer { charge, ..Answer::text(status, body) }
    }

    /// An already serialized JSON body.
    fn text(status: u16, body: String) -> Answer {
        Answer { status, body: Some(body), charge: Charge::none(), headers: Vec::new(), close: false, listen: None }
    }

    fn empty(status: u16) -> Answer {
        Answer { status, body: None, charge: Charge::none(), headers: Vec::new(), close: false, listen: None }
    }

    /// A JSON-RPC error body without an id (transport-level rejections).
    fn rejected(status: u16, rpc_code: i64, message: &str) -> Answer {
        Answer::json(status, serde_json::json!({"jsonrpc": "2.0", "id": null, "error": {"code": rpc_code, "message": message}}))
    }

    fn with(mut self, name: &'static str, value: &str) -> Answer {
        self.headers.push((name, value.to_string()));
        self
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        202 => "Accepted",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Payload Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Unknown",
    }
}

fn origin_allowed(origin: &str) -> bool {
    let rest = origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://"));
    let Some(rest) = rest else { return false };
    is_loopback_host(rest)
}

/// Whether `host[:port]` names this machine's loopback interface.
fn is_loopback_host(host_port: &str) -> bool {
    let host = if let Some(v6) = host_port.strip_prefix('[') {
        match v6.split_once(']') {
            Some((h, _)) => return h == "::1",
            None => return false,
        }
    } else {
        host_port.split(':').next().unwrap_or("")
    };
    host.eq_ignore_ascii_case("localhost") || host == "127.0.0.1"
}

/// Whether `given` equals `secret`, in a time that depends on `given`'s length only: every byte
/// of `given` is compared (with the secret repeated under it), the length difference is folded
/// into the same accumulator, and nothing exits early, so neither the secret's bytes nor its
/// length can be timed.
fn constant_time_eq(given: &[u8], secret: &[u8]) -> bool {
    let mut diff = given.len() ^ secret.len();
    for (g, s) in given.iter().zip(secret.iter().cycle()) {
        diff |= usize::from(g ^ s);
    }
    std::hint::black_box(diff) == 0
}

impl Listener {
    fn handle(&self, req: Request) {
        /// Counts the request out however `serve` ends (a panic included).
        struct Busy<'a>(&'a AtomicUsize, &'a ConnectionGuard, Option<SocketAddr>);
        impl Drop for Busy<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
                self.1.done(self.2.as_ref());
            }
        }
        self.busy.fetch_add(1, Ordering::SeqCst);
        let peer = req.remote_addr().copied();
        self.guard.account(peer.as_ref(), sent_for(&req));
        let _busy = Busy(&self.busy, &self.guard, peer);
        self.serve(req, peer);
    }

    /// Serves `req`, which came from `peer`.
    fn serve(&self, mut req: Request, peer: Option<SocketAddr>) {
        let announced = req.body_length();
        // A body too large to read at all: not a byte of it is read (asking for the reader would
        // tell a client that waits for `100 Continue` to send it).
        let far_too_large = announced.is_some_and(|n| n > MAX_DRAIN_BYTES);
        let body = (!far_too_large).then(|| {
            // The body, and the answer below, must move at the least rate after a first stall
            // time (a call being made, and a subscription's stream, move nothing and have none).
            let mut receiving = self.guard.transfer(peer.as_ref());
            if chunked(&req) {
                receiving.credit(CHUNKED_CREDIT);
            }
            let mut counted = Counted { inner: req.as_reader(), transfer: &receiving };
            let body = body_budget::read_body(&mut counted, announced, MAX_BODY_BYTES, &self.budget);
            // What was credited of a body with a length and not read (it stalled, or ended
            // early) must not pay for a next head on the connection.
            if announced.is_some() {
                receiving.take_back_unmoved(body_credit(&req) as u64);
            }
            body
        });
        // What is left of a stalled or unread body, tiny_http drains when the request goes,
        // credited nothing: a client that goes on sending is cut at the next sweep. A stalled
        // one's reads time out after a stall time (it is answered 408 after them), and a client
        // that sends again meanwhile gets no longer; an unread one is answered first, and its
        // client gets a second to read the answer.
        let _leftover = (far_too_large || matches!(body, Some(Body::Stalled))).then(|| {
            let leftover = self.guard.transfer(peer.as_ref());
            let grace = if far_too_large { RATE_MARGIN } else { self.app.config.http_stall + RATE_MARGIN };
            leftover.until(Instant::now() + grace);
            leftover
        });
        let too_large = matches!(body, Some(Body::TooLarge(_)));
        let mut answer = match body {
            Some(body) => self.answer(&req, body),
            // Whatever the request: nothing of it was read.
            None => Answer::rejected(413, code::INVALID_REQUEST, TOO_LARGE),
        };
        if let Some((listen, slot)) = answer.listen.take() {
            self.hold(req, listen);
            drop(slot);
            return;
        }
        // An answer written raw goes after tiny_http drained what is left of the body, which for
        // an unread one lasts until the connection is cut; through tiny_http it goes first.
        answer.close = !far_too_large && (answer.close || too_large || self.should_close(req.remote_addr()));
        let status = answer.status;
        let sse_only =
            get(&req, "Accept").is_some_and(|a| a.contains("text/event-stream") && !a.contains("application/json") && !a.contains("*/*"));
        let (content_type, bytes): (_, Vec<u8>) = match answer.body {
            Some(mut v) if sse_only && status == 200 => {
                // In place: a copy would hold a large answer twice.
                v.insert_str(0, EVENT_HEAD);
                v.push_str(EVENT_END);
                (Some("text/event-stream"), v.into_bytes())
            }
            Some(v) => (Some("application/json"), v.into_bytes()),
            None => (None, Vec::new()),
        };
        let large = bytes.len() >= memory::RELEASE_AFTER_BYTES;
        // Its clock starts once the connection is this answer's (tiny_http writes a connection's
        // answers in order) and its head is written.
        let sending = self.guard.transfer(peer.as_ref());
        let res = if answer.close {
            // tiny_http drops a `Connection` response header, so this answer is written raw.
            let mut head = format!("HTTP/1.1 {status} {}\r\nContent-Length: {}\r\nConnection: close\r\n", reason(status), bytes.len());
            if let Some(ct) = content_type {
                head.push_str(&format!("Content-Type: {ct}\r\n"));
            }
            for (name, value) in &answer.headers {
                head.push_str(&format!("{name}: {value}\r\n"));
            }
            head.push_str("\r\n");
            let mut writer = req.into_writer();
            writer.write_all(head.as_bytes()).and_then(|()| write_counted(&mut writer, &bytes, &sending)).and_then(|()| writer.flush())
        } else {
            let len = bytes.len();
            let counted = Counted { inner: std::io::Cursor::new(bytes), transfer: &sending };
            let mut resp = Response::new(StatusCode(status), Vec::new(), counted, Some(len), None);
            if let Some(ct) = content_type {
                resp.add_header(header("Content-Type", ct));
            }
            for (name, value) in &answer.headers {
                resp.add_header(header(name, value));
            }
            req.respond(resp)
        };
        drop(sending);
        if let Err(err) = res {
            log::debug!("could not send an HTTP {status} answer: {err}");
        }
        // Written, or given up at the stall time: its memory is free.
        drop(answer.charge);
        if large {
            // The answer and the values it was made from are freed by now.
            memory::release_free();
        }
    }

    fn answer(&self, req: &Request, body: Body) -> Answer {
        if let Some(origin) = get(req, "Origin") {
            if !origin_allowed(origin) {
                return Answer::rejected(403, code::FORBIDDEN, "Forbidden: Origin is not a loopback origin");
            }
        }
        if self.loopback {
            if let Some(host) = get(req, "Host") {
                if !is_loopback_host(host) {
                    return Answer::rejected(403, code::FORBIDDEN, "Forbidden: Host is not a loopback name");
                }
            }
        }
        if let Some(token) = &self.app.config.http_token {
            let given = get(req, "Authorization").and_then(|v| v.strip_prefix("Bearer ")).unwrap_or("");
            if !constant_time_eq(given.trim().as_bytes(), token.as_bytes()) {
                return Answer::rejected(401, code::UNAUTHORIZED, "Unauthorized: send Authorization: Bearer <SANDBOX_MCP_HTTP_TOKEN>")
                    .with("WWW-Authenticate", "Bearer");
            }
        }
        if self.app.is_draining() {
            let mut answer = Answer::rejected(503, code::SERVER_BUSY, protocol::SHUTTING_DOWN).with("Retry-After", "1");
            answer.close = true;
            return answer;
        }
        let path = req.url().split('?').next().unwrap_or("");
        let over_budget = || {
            Answer::rejected(
                503,
                code::SERVER_BUSY,
                "Service Unavailable: request bodies in progress fill the server's memory budget (--body-budget); retry shortly",
            )
            .with("Retry-After", "1")
        };
        match (req.method(), path) {
            (Method::Get, "/healthz") => Answer::json(200, serde_json::json!({"status": "ok"})),
            (Method::Post, "/mcp") => match body {
                Body::Ok(bytes, mut held) => {
                    // Its parsed cost too, before it is parsed (see body_budget).
                    let cost = body_budget::parsed_cost(&bytes);
                    if cost > self.budget.limit() {
                        Answer::rejected(
                            413,
                            code::INVALID_REQUEST,
                            "Payload Too Large: the message holds too many JSON values to parse within the server's memory budget \
(--body-budget); send fewer, larger values",
                        )
                    } else if held.grow(cost.saturating_sub(bytes.len())) {
                        let answer = self.post(req, &bytes);
                        if cost >= memory::RELEASE_AFTER_BYTES {
                            // Its parsed values are freed by now; give their memory back.
                            memory::release_free();
                        }
                        answer
                    } else {
                        over_budget()
                    }
                }
                Body::OverBudget => over_budget(),
                Body::Incomplete => {
                    Answer::rejected(400, code::INVALID_REQUEST, "Bad Request: the body ended before its announced Content-Length")
                }
                Body::Stalled => {
                    let message = format!(
                        "Request Timeout: no byte of the body came for {} s (--http-stall); send each body without pausing",
                        self.app.config.http_stall.as_secs()
                    );
                    let mut answer = Answer::rejected(408, code::INVALID_REQUEST, &message);
                    answer.close = true;
                    answer
                }
                Body::TooLarge(prefix) => {
                    // Its own id when its start names one, so that the client matches the answer.
                    let id = crate::jsonrpc::id_in_prefix(&prefix).unwrap_or(serde_json::Value::Null);
                    Answer::json(
                        413,
                        serde_json::json!({"jsonrpc": "2.0", "id": id, "error": {"code": code::INVALID_REQUEST, "message": TOO_LARGE}}),
                    )
                }
            },
            (Method::Delete, "/mcp") => self.delete(req),
            (_, "/mcp") => Answer::rejected(405, code::METHOD_NOT_ALLOWED, "Method Not Allowed: use POST (and DELETE to end a session)")
                .with("Allow", "POST, DELETE"),
            _ => Answer::rejected(404, code::METHOD_NOT_FOUND, "Not Found: the MCP endpoint is /mcp"),
        }
    }

    /// The request's session, or the status, JSON-RPC code and message to refuse it with.
    fn session(&self, req: &Request) -> Result<Arc<Session>, (u16, i64, &'static str)> {
        let Some(id) = get(req, "Mcp-Session-Id") else {
            return Err((400, code::SESSION_REQUIRED, "Bad Request: Mcp-Session-Id header is required; send initialize first"));
        };
        self.sessions.get(id.trim()).ok_or((
            404,
            code::SESSION_NOT_FOUND,
            "Session not found: it ended or expired; send initialize to start a new session",
        ))
    }

    fn post(&self, req: &Request, bytes: &[u8]) -> Answer {
        let msg = jsonrpc::parse(bytes);
        if let Incoming::Invalid { id, error } = &msg {
            return Answer::json(400, jsonrpc::error(id, error));
        }
        if let Incoming::Request { method, params, .. } = &msg {
            if envelope::is_modern(method, params.as_ref()) {
                return self.post_modern(req, msg);
            }
            if method == "initialize" {
                let session = Arc::new(Session::new(ids::random_hex(16), false).seeing_state_root(false));
                let route = protocol::route(&self.app, &session, msg);
                let Route::Reply(reply) = route else {
                    return Answer::rejected(500, code::INTERNAL_ERROR, "initialize produced no answer");
                };
                if !session.is_initialized() {
                    return Answer::text(200, reply);
                }
                self.sessions.insert(session.clone());
                return Answer::text(200, reply).with("Mcp-Session-Id", &session.id);
            }
        }
        let modern_header = get(req, "MCP-Protocol-Version").is_some_and(|v| envelope::MODERN_VERSIONS.contains(&v.trim()));
        if modern_header && get(req, "Mcp-Session-Id").is_none() {
            return match &msg {
                // A 2026-07-28 notification: accepted, and nothing needs it (cancellation over
                // HTTP is closing the connection).
                Incoming::Notification { .. } | Incoming::Response => Answer::empty(202),
                _ => {
                    let err = RpcError::new(
                        code::INVALID_PARAMS,
                        format!(
                            "Bad Request: a 2026-07-28 request needs params._meta with {} and {}; or send initialize to start a 2025 session",
                            envelope::PROTOCOL_VERSION_KEY,
                            envelope::CLIENT_CAPABILITIES_KEY
                        ),
                    );
                    let id = if let Incoming::Request { id, .. } = &msg { id.clone() } else { Value::Null };
                    Answer::json(400, jsonrpc::error(&id, &err))
                }
            };
        }
        let session = match self.session(req) {
            Ok(s) => s,
            // Keep the request id in the error so the client can match it.
            Err((status, rpc_code, message)) => {
                return match &msg {
                    Incoming::Request { id, .. } => Answer::json(status, jsonrpc::error(id, &RpcError::new(rpc_code, message))),
                    _ => Answer::rejected(status, rpc_code, message),
                };
            }
        };
        if let Some(v) = get(req, "MCP-Protocol-Version") {
            if !SUPPORTED_VERSIONS.contains(&v.trim()) {
                return Answer::rejected(
                    400,
                    code::UNSUPPORTED_VERSION_HEADER,
                    &format!(
                        "Bad Request: unsupported MCP-Protocol-Version {v:?} for a session; supported: {}",
                        SUPPORTED_VERSIONS.join(", ")
                    ),
                );
            }
        }
        self.routed(protocol::route(&self.app, &session, msg), peer_ip(req))
    }

    /// A 2026-07-28 request: no session (one carrying a 2025 session id is refused, so nothing
    /// crosses between the eras), its headers checked against its body.
    fn post_modern(&self, req: &Request, msg: Incoming) -> Answer {
        if get(req, "Mcp-Session-Id").is_some() {
            let Incoming::Request { id, .. } = &msg else { return Answer::empty(202) };
            let err = RpcError::new(
                code::INVALID_REQUEST,
                "Bad Request: a 2026-07-28 request (one with io.modelcontextprotocol/protocolVersion in _meta) has no session; \
drop the Mcp-Session-Id header, or send the request without that _meta inside the 2025 session",
            );
            return Answer::json(400, jsonrpc::error(id, &err));
        }
        // Named after its connection: workers and waiting places are shared fairly between
        // clients, and a stateless request's client is its connection. Ids are capabilities:
        // only a caller with the bearer token may list the state root's sandboxes.
        let peer = req.remote_addr().map_or_else(|| "unknown".to_string(), ToString::to_string);
        let session = Arc::new(Session::stateless(format!("http-2026 {peer}")).seeing_state_root(self.app.config.http_token.is_some()));
        let check = |method: &str, params: Option<&Value>, meta: &RequestMeta| headers::check(|name| get(req, name), method, params, meta);
        self.routed(protocol::route_checked(&self.app, &session, msg, &check), peer_ip(req))
    }

    /// The answer to a routed message (`peer`: the address a stream is counted under).
    fn routed(&self, route: Route, peer: Option<IpAddr>) -> Answer {
        match route {
            Route::Silent => Answer::empty(202),
            Route::Reply(reply) => Answer::text(200, reply),
            Route::Refused(reply, Refusal::Envelope) => Answer::text(400, reply),
            Route::Refused(reply, Refusal::UnknownMethod) => Answer::text(404, reply),
            Route::Call(work) => self.dispatch(work),
            Route::Listen(listen) => match self.streams.take(stream_shares::client_key(peer, listen.client_info.as_ref())) {
                Ok(slot) => {
                    let mut answer = Answer::empty(200);
                    answer.listen = Some((listen, slot));
                    answer
                }
                Err(refused) => {
                    log::debug!("refusing a subscriptions/listen stream: {}", refused.message());
                    let err = RpcError::new(code::SERVER_BUSY, refused.message());
                    Answer::json(503, jsonrpc::error(&listen.id, &err)).with("Retry-After", "5")
                }
            },
        }
    }

    /// Holds a `subscriptions/listen` stream: the acknowledgement first, then the task
    /// notifications the waiter sends for the tasks it names (see `subscription::TaskWatch`),
    /// and SSE comments after [`LISTEN_KEEPALIVE`] of quiet, until the client goes away, or the
    /// closing result when shutdown begins. The stream is the body of a `Connection: close`
    /// answer (written raw, as tiny_http has no streaming response of unknown length). The slot
    /// taken in [`Listener::routed`] is given back when this returns.
    fn hold(&self, req: Request, listen: Listen) {
        let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nX-Accel-Buffering: no\r\nConnection: close\r\n\r\n";
        let mut writer = req.into_writer();
        // One event, written in parts: a copy would hold a large notification twice.
        let event = |writer: &mut dyn Write, v: &str| {
            writer.write_all(EVENT_HEAD.as_bytes())?;
            writer.write_all(v.as_bytes())?;
            writer.write_all(EVENT_END.as_bytes())?;
            writer.flush()
        };
        let mut sent = writer.write_all(head.as_bytes()).and_then(|()| event(&mut writer, &listen.ack));
        // Notifications arrive on `rx`, each with its share of the answer budget, given back once
        // written; this end keeps a sender, so `rx` never disconnects.
        let (tx, rx) = crossbeam_channel::unbounded::<(String, Charge)>();
        let open = Arc::new(AtomicBool::new(true));
        if sent.is_ok() && !listen.tasks.is_empty() {
            let (out, still) = (tx.clone(), open.clone());
            let sink =
                subscription::Sink::new(move |line, charge| still.load(Ordering::SeqCst) && out.send((line, charge)).is_ok(), open.clone());
            if let Err(err) = subscription::follow(&self.app, &self.waiter, &listen.id, listen.tasks, sink) {
                // The subscription ends with that error as its response.
                let _ = event(&mut writer, &jsonrpc::error(&listen.id, &err).to_string());
                sent = Err(std::io::Error::other("its tasks could not be followed"));
            }
        }
        let mut quiet_since = Instant::now();
        while sent.is_ok() {
            if self.app.is_draining() {
                let closing = subscription::closing(&listen.id).to_string();
                sent = event(&mut writer, &closing);
                break;
            }
            if let Ok((line, charge)) = rx.recv_timeout(LISTEN_POLL) {
                sent = event(&mut writer, &line);
                drop((line, charge));
                quiet_since = Instant::now();
            } else if quiet_since.elapsed() >= LISTEN_KEEPALIVE {
                sent = writer.write_all(b":\n\n").and_then(|()| writer.flush());
                quiet_since = Instant::now();
            }
        }
        open.store(false, Ordering::SeqCst);
        drop(tx);
        if let Err(err) = sent {
            log::debug!("subscription {} ended: {err}", listen.id);
        }
    }

    /// Queues a tool call and waits for its answer; a full queue is answered 503 at once.
    fn dispatch(&self, work: Work) -> Answer {
        let (tx, rx) = crossbeam_channel::bounded::<Outcome>(1);
        let id = work.call.id.clone();
        match self.queue.try_send(work.into_job(tx)) {
            Ok(()) => {}
            // The refused job is dropped here, and with it the call's in-flight registration.
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                let err = RpcError::new(code::SERVER_BUSY, "server busy: the work queue is full; retry after a second");
                return Answer::json(503, jsonrpc::error(&id, &err)).with("Retry-After", "1");
            }
        }
        let started = Instant::now();
        match rx.recv_timeout(REPLY_WAIT) {
            Ok(Outcome::Busy(response)) => Answer::response(503, response).with("Retry-After", "1"),
            Ok(outcome) => Answer::response(200, outcome.into_response()),
            Err(_) => {
                log::error!("no reply for request {id} after {:?}", started.elapsed());
                let err = RpcError::new(code::INTERNAL_ERROR, "internal error: the tool call produced no reply in time");
                Answer::json(504, jsonrpc::error(&id, &err))
            }
        }
    }

    fn delete(&self, req: &Request) -> Answer {
        let session = match self.session(req) {
            Ok(s) => s,
            Err((status, rpc_code, message)) => return Answer::rejected(status, rpc_code, message),
        };
        self.sessions.remove(&session.id);
        session.end(&self.app.provider, Instant::now() + Duration::from_secs(30));
        Answer::empty(200)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names() {
        for ok in ["localhost", "localhost:8765", "127.0.0.1:1", "[::1]:80", "LOCALHOST"] {
            assert!(is_loopback_host(ok), "{ok}");
        }
        for bad in ["evil.com", "127.0.0.2", "[::2]:80", "localhost.evil.com", ""] {
            assert!(!is_loopback_host(bad), "{bad}");
        }
        assert!(origin_allowed("http://localhost:3000"));
        assert!(!origin_allowed("http://evil.example"));
        assert!(!origin_allowed("null"));
    }

    #[test]
    fn token_comparison() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
        // Length-independent: prefixes, extensions and repetitions of the token are refused.
        assert!(!constant_time_eq(b"ab", b"abc"));
        assert!(!constant_time_eq(b"abcabc", b"abc"));
        assert!(!constant_time_eq(b"", b"abc"));
        assert!(!constant_time_eq(b"abc", b""));
        assert!(constant_time_eq(b"", b""));
    }
}
