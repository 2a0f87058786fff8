//! An E2B-compatible emulator for tests: the control plane, the edge proxy and envd on one
//! loopback HTTP/1.1 port, with sandboxes that are local-provider sandboxes (a directory, tagged
//! processes, a keeper that ends them at expiry), created without isolation by default or with
//! the local provider's namespace isolation ([`Options::isolation`], `--isolation namespaces`).
//! It adds no isolation of its own; it exists so that sandbox-mcp's e2b provider can be tested
//! offline (`tests/it/e2b.rs` and the fault tests start
//! the `e2b-emulator` binary), and it is itself checked against E2B's official Python SDK
//! (`tests/interop/test_e2b_sdk.py`). It is a crate of its own, outside the product: sandbox-mcp
//! contains no emulator code, and this crate uses only the product's public API.
//!
//! Modules: [`http`] (requests and raw responses over tiny_http), [`edge`] (routing modes),
//! [`ports`] (sandbox ports other than envd's), [`faults`] (injected faults
//! and request counts), [`control`] (the control plane and the sandbox registry), [`envd`] (the
//! edge proxy and envd), [`connect`] (the Connect envelope and errors), [`process`] (processes
//! started through envd and their streams), [`files`] (envd's file endpoints), and [`freezer`]
//! (pausing a sandbox's processes).
//!
//! Routing is by path: `/sandboxes…` and `/v2/sandboxes…` are the control plane (they need an
//! `X-API-KEY`); `/health`, `/files`, `/process.Process/…` and `/filesystem.Filesystem/…` are envd,
//! dispatched by the `E2b-Sandbox-Id` header (or a `49983-<id>.<domain>` Host) and, except
//! `/health`, guarded by the sandbox's `X-Access-Token`; `/_emulator/…` is the test API below.
//! Point the SDK at it with `E2B_API_URL=http://ADDR` and `E2B_SANDBOX_URL=http://ADDR`.
//! [`Options::routing`] (`--routing host|path`) makes the edge strict, as [`edge`] says: with
//! `host`, clients reach envd at `http://{port}-{sandbox_id}.<domain>` through this emulator as
//! their HTTP proxy (`HTTP_PROXY=http://ADDR`); with `path`, at
//! `http://ADDR/proxy/{sandbox_id}/{port}`. A port other than envd's 49983 is forwarded to that
//! port of the local sandbox underneath ([`ports`]). Requests in absolute form are accepted, and `CONNECT`
//! answers 200 so that the requests that follow on that connection go through as a tunnel's.
//!
//! # Test API
//!
//! * `POST /_emulator/faults` with one fault object or an array of them; answers the active list.
//!   Fields: `path_prefix` (required; matched against the request path without the query),
//!   `method` (optional), `count` (requests it applies to, default 1), and at least one of:
//!   * `"status": N` (with an optional JSON `body`, default `{"code":N,"message":…}`): answer at
//!     once with that status; the request is **not** carried out.
//!   * `"drop_after_bytes": N`: carry the request out, send the status line, the headers and the
//!     first N body bytes (for streams: of the envelope stream), then break the response. tiny_http
//!     cannot close a connection on demand, so the break is an invalid chunk header: the client
//!     fails at that point exactly as on a dropped connection and discards the connection. A
//!     `Start` cut this way leaves its process running.
//!   * `"delay_ms": M`: wait M ms before handling (combines with either of the above).
//!
//!   At random: `"chance": P` (0 < P <= 1) applies the rule to a matching request with
//!   probability P, drawn from the rule's own generator seeded with `"seed"` (default 0), so a
//!   run replays; a request the draw spares goes on to the next matching rule and does not use
//!   up `count`. Several rules with chances give a seeded mix (say 503s and dropped streams).
//!
//!   Examples: `{"path_prefix":"/process.Process/Start","drop_after_bytes":0,"count":1}`,
//!   `{"path_prefix":"/sandboxes","status":502,"count":1}`,
//!   `{"path_prefix":"/files","method":"GET","delay_ms":2000}`,
//!   `{"path_prefix":"/","status":503,"chance":0.1,"seed":42,"count":100000}`.
//! * `GET /_emulator/faults`: the remaining faults. `DELETE /_emulator/faults`: remove all.
//! * `GET /_emulator/requests`: `{"total":N,"routes":{"POST /process.Process/Start":3,
//!   "POST /sandboxes/{id}/timeout":1,…}}`, requests per route (sandbox ids folded to `{id}`) since
//!   start or the last `DELETE /_emulator/requests`. Test API requests are not counted.
//! * `GET /_emulator/sandboxes`: `[{"sandboxID","localID","state"}]`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod connect;
pub mod control;
pub mod edge;
pub mod envd;
pub mod faults;
pub mod files;
pub mod freezer;
pub mod http;
pub mod ports;
pub mod process;

use anyhow::{bail, Context};
use control::{Found, Registry};
use faults::{Faults, RequestCounts};
use files::Tree;
use http::{ChunkedWriter, HttpReply, HttpRequest, ReadOutcome};
use sandbox_mcp::provider::local::isolation::{self, Isolation};
use sandbox_mcp::provider::local::{self, LocalProvider};
use sandbox_mcp::provider::{Provider, ProviderError};
use serde_json::{json, Value};
use std::fs;
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// The file that marks a state root as the emulator's (it kills leftovers there at start).
pub const HOME_MARKER: &str = "e2b-emulator.home";

/// How the emulator runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// Loopback address to listen on (port 0 picks a free one).
    pub listen: SocketAddr,
    /// State root of the local provider underneath (created if missing).
    pub home: PathBuf,
    /// POSIX shell used for wrappers and signals.
    pub shell: PathBuf,
    /// The only accepted `X-API-KEY`; any non-empty key when `None`.
    pub api_key: Option<String>,
    /// Threads answering requests (streams get threads of their own).
    pub threads: usize,
    /// How the local sandboxes underneath are isolated (`Isolation::None` by default; with
    /// `Isolation::Namespaces` envd's file and process services act inside each sandbox's
    /// namespaces, and the host must allow them: see `isolation::probe`).
    pub isolation: Isolation,
    /// How envd requests find their sandbox.
    pub routing: edge::Routing,
}

/// Everything the handlers share.
pub struct State {
    /// The local provider whose sandboxes back the emulated ones.
    pub provider: LocalProvider,
    /// The local provider's state root.
    pub root: PathBuf,
    /// POSIX shell for wrappers and signals.
    pub shell: PathBuf,
    /// The emulated sandboxes.
    pub sandboxes: Registry,
    /// Injected faults.
    pub faults: Faults,
    /// Request counts.
    pub counts: RequestCounts,
    /// The accepted API key, if fixed.
    pub api_key: Option<String>,
    /// `USER`/`LOGNAME` of commands: the user they run as (the OS user the emulator runs as
    /// without isolation; `root` of the sandbox's user namespace with it).
    pub user: String,
    /// How envd requests find their sandbox.
    pub routing: edge::Routing,
}

impl State {
    /// Where the files of live local sandbox `local_id` are, from `LocalProvider::file_tree`:
    /// the host's `/` and the sandbox's host home without isolation; `/proc/<init>/root`, the
    /// sandbox's own `/home/user`, and the owner of what the emulator creates with it.
    pub fn tree(&self, local_id: &str) -> Result<Tree, ProviderError> {
        let (root, home) = self.provider.file_tree(local_id)?;
        if root == Path::new("/") {
            return Ok(Tree::new(root, home, None));
        }
        let owner = self.provider.load(local_id)?.owner.unwrap_or_else(isolation::sandbox_owner);
        Tree::held(root, home, owner)
            .map_err(|e| ProviderError::Unavailable(format!("cannot open the root of sandbox {local_id}: {e}; it may have ended")))
    }
}

/// A running emulator.
pub struct Emulator {
    state: Arc<State>,
    server: Arc<tiny_http::Server>,
    threads: Vec<JoinHandle<()>>,
    addr: SocketAddr,
}

impl Emulator {
    /// Prepares the state root (killing sandboxes left by an earlier run), binds and starts the
    /// request threads. The local provider starts each sandbox's keeper from the current
    /// executable, so the program embedding the emulator must first hand its arguments to
    /// `sandbox_mcp::provider::local::run_internal` (`e2b-emulator` and `sandbox-mcp` do).
    pub fn start(opts: Options) -> anyhow::Result<Emulator> {
        if !opts.listen.ip().is_loopback() {
            bail!("the emulator listens on loopback only; {} is not a loopback address", opts.listen);
        }
        if opts.isolation == Isolation::Namespaces {
            isolation::probe().map_err(|why| anyhow::anyhow!("--isolation namespaces: this host cannot isolate sandboxes: {why}"))?;
        }
        prepare_home(&opts.home)?;
        let provider = LocalProvider::new(&opts.home, &opts.shell)
            .and_then(|p| p.with_isolation(opts.isolation))
            // A parent proxy for the sandboxes' egress proxies, as the server takes it.
            .map(|p| p.with_egress(sandbox_mcp::egress::Settings::from_env()))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        kill_leftovers(&provider, &opts.home);
        let user = match opts.isolation {
            // Commands of an isolated sandbox run as root of its user namespace.
            Isolation::Namespaces => "root".to_string(),
            Isolation::Landlock | Isolation::None => fs::metadata(&opts.home)
                .map(|m| files::user_name(m.uid()))
                .ok()
                .filter(|u| u.parse::<u32>().is_err())
                .or_else(|| std::env::var("USER").ok())
                .unwrap_or_else(|| "user".into()),
        };
        let state = Arc::new(State {
            provider,
            root: opts.home.clone(),
            shell: opts.shell.clone(),
            sandboxes: Registry::default(),
            faults: Faults::default(),
            counts: RequestCounts::default(),
            api_key: opts.api_key.clone(),
            user,
            routing: opts.routing,
        });
        let socket = http::bind_nodelay(opts.listen).with_context(|| format!("binding {}", opts.listen))?;
        let server = tiny_http::Server::from_listener(socket, None).map_err(|e| anyhow::anyhow!("serving on {}: {e}", opts.listen))?;
        let server = Arc::new(server);
        let addr = server.server_addr().to_ip().unwrap_or(opts.listen);
        let mut threads = Vec::new();
        for i in 0..opts.threads.max(1) {
            let server = server.clone();
            let state = state.clone();
            let t = thread::Builder::new().name(format!("e2b-emulator-http-{i}")).stack_size(512 * 1024).spawn(move || {
                while let Ok(req) = server.recv() {
                    serve(&state, req);
                }
            })?;
            threads.push(t);
        }
        Ok(Emulator { state, server, threads, addr })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, joins the request threads and kills every sandbox.
    pub fn shutdown(self) {
        for _ in &self.threads {
            self.server.unblock();
        }
        for t in self.threads {
            let _ = t.join();
        }
        self.state.end_all();
    }
}

fn prepare_home(home: &Path) -> anyhow::Result<()> {
    fs::DirBuilder::new().recursive(true).mode(0o700).create(home).with_context(|| format!("creating {}", home.display()))?;
    let marker = home.join(HOME_MARKER);
    let empty = fs::read_dir(home).with_context(|| format!("reading {}", home.display()))?.next().is_none();
    if !empty && !marker.exists() {
        bail!("{} is not empty and was not created by the emulator (no {HOME_MARKER}); give an empty or new directory", home.display());
    }
    fs::write(&marker, "state root of e2b-emulator; sandboxes left here are killed when it starts\n")
        .with_context(|| format!("writing {}", marker.display()))?;
    Ok(())
}

/// Sandboxes of an earlier run are unreachable (the id map was in memory): kill them.
fn kill_leftovers(provider: &LocalProvider, home: &Path) {
    let Ok(dir) = fs::read_dir(home.join("sandboxes")) else { return };
    for entry in dir.flatten() {
        let id = entry.file_name().to_string_lossy().into_owned();
        if local::check_local_id(&id).is_ok() {
            let _ = provider.kill(&id, Instant::now() + Duration::from_secs(5));
        }
    }
}

fn serve(state: &Arc<State>, mut req: tiny_http::Request) {
    let mut incoming = match http::read_request(&mut req) {
        ReadOutcome::Ok(i) => i,
        ReadOutcome::TooLarge => {
            let mut w = req.into_writer();
            let _ = http::write_reply(&mut *w, &control::error(413, "request body too large for the emulator"), true, None);
            return;
        }
    };
    let close = incoming.wants_close();
    if incoming.method == "CONNECT" {
        // A client using the emulator as its HTTP proxy opens a tunnel: the requests that follow
        // on this connection are ordinary ones, routed by their Host.
        let _ = http::write_reply(&mut *req.into_writer(), &HttpReply::empty(200), false, None);
        return;
    }
    if let Err(reply) = edge::route(state.routing, &mut incoming) {
        let _ = http::write_reply(&mut *req.into_writer(), &reply, close, None);
        return;
    }
    if let Some(rest) = incoming.path.strip_prefix("/_emulator/") {
        let reply = test_api(state, rest, &incoming);
        let _ = http::write_reply(&mut *req.into_writer(), &reply, close, None);
        return;
    }
    state.counts.count(&incoming.method, &incoming.path);
    let fault = state.faults.take(&incoming.method, &incoming.path);
    if let Some(ms) = fault.as_ref().and_then(|f| f.delay_ms) {
        thread::sleep(Duration::from_millis(ms));
    }
    if let Some(f) = fault.as_ref().filter(|f| f.status.is_some()) {
        let status = f.status.unwrap_or(500);
        let body = f.body.clone().unwrap_or_else(|| json!({ "code": status, "message": "fault injected by the emulator" }));
        let _ = http::write_reply(&mut *req.into_writer(), &HttpReply::json(status, &body), close, None);
        return;
    }
    let cut = fault.and_then(|f| f.drop_after_bytes);
    match route(state, &incoming) {
        envd::Outcome::Reply(reply) => {
            if let Err(err) = http::write_reply(&mut *req.into_writer(), &reply, close, cut) {
                log::debug!("writing the answer to {} {}: {err}", incoming.method, incoming.path);
            }
        }
        envd::Outcome::Stream(plan) => {
            let body = move || {
                let mut raw = req.into_writer();
                let headers = [("Content-Type".to_string(), "application/connect+json".to_string())];
                let res = ChunkedWriter::start(&mut *raw, 200, &headers, close, cut).and_then(|w| envd::run_stream(w, plan));
                if let Err(err) = res {
                    log::debug!("stream ended early: {err}");
                }
            };
            if let Err(err) = thread::Builder::new().name("e2b-emulator-stream".into()).stack_size(256 * 1024).spawn(body) {
                log::error!("could not start a stream thread: {err}");
            }
        }
    }
}

fn route(state: &Arc<State>, req: &HttpRequest) -> envd::Outcome {
    if control::is_control_path(&req.path) {
        let key = req.header("X-API-KEY").unwrap_or("");
        let ok = match &state.api_key {
            Some(want) => key == want,
            None => !key.is_empty(),
        };
        if !ok {
            return envd::Outcome::Reply(control::error(401, "Invalid API key: send a valid X-API-KEY header"));
        }
        return envd::Outcome::Reply(control::handle(state, req));
    }
    // A sandbox port other than envd's: forwarded to the local sandbox's port.
    if let (Some(id), Some(port)) = envd::target(req) {
        if port != envd::ENVD_PORT {
            return envd::Outcome::Reply(match state.lookup(&id) {
                Found::Running(sb, _) => ports::forward(state, &id, &sb.local_id, port, req),
                _ => HttpReply::json(502, &json!({ "sandboxId": id, "message": "The sandbox was not found", "code": 502 })),
            });
        }
    }
    if envd::is_envd_path(&req.path) {
        return envd::handle(state, req);
    }
    envd::Outcome::Reply(control::error(404, format!("no route for {} {}", req.method, req.path)))
}

fn test_api(state: &State, rest: &str, req: &HttpRequest) -> HttpReply {
    match (req.method.as_str(), rest) {
        ("GET", "requests") => HttpReply::json(200, &state.counts.snapshot()),
        ("DELETE", "requests") => {
            state.counts.reset();
            HttpReply::empty(204)
        }
        ("GET", "faults") => HttpReply::json(200, &state.faults.list()),
        ("POST", "faults") => match faults::parse_faults(&req.body) {
            Ok(list) => {
                state.faults.add(list);
                HttpReply::json(200, &state.faults.list())
            }
            Err(e) => control::error(400, e),
        },
        ("DELETE", "faults") => {
            state.faults.clear();
            HttpReply::empty(204)
        }
        ("GET", "sandboxes") => {
            let rows: Vec<Value> = state
                .sandboxes
                .ids()
                .into_iter()
                .filter_map(|id| match state.lookup(&id) {
                    Found::Running(sb, _) => Some(json!({ "sandboxID": sb.id, "localID": sb.local_id, "state": "running" })),
                    Found::Paused(sb, _) => Some(json!({ "sandboxID": sb.id, "localID": sb.local_id, "state": "paused" })),
                    Found::Missing => None,
                })
                .collect();
            HttpReply::json(200, &Value::Array(rows))
        }
        _ => control::error(404, format!("no test API route {} /_emulator/{rest}", req.method)),
    }
}
