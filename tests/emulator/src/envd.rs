//! The emulated envd and the edge proxy in front of it: routing by `E2b-Sandbox-Id` (502 for a
//! paused or unknown sandbox), the access-token check, `/health`, `/files`, and the
//! `process.Process` and `filesystem.Filesystem` Connect services, including the `Start` and
//! `Connect` server streams.

use super::connect::{self, Code, ConnectError};
use super::control::{Found, Sandbox};
use super::files::{self, Tree};
use super::http::{ChunkedWriter, HttpReply, HttpRequest};
use super::process::{self, Event, Selector, Subscription};
use super::State;
use sandbox_mcp::base64;
use sandbox_mcp::provider::Touch;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The port envd listens on inside a sandbox.
pub const ENVD_PORT: u16 = 49983;

/// How long `Start` waits for `nsenter` to start the program inside an isolated sandbox.
const ENTER_BUDGET: Duration = Duration::from_secs(2);

/// Keepalive interval when the request gives none (envd's default).
const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(90);

/// What an envd request is answered with.
pub enum Outcome {
    /// A complete response.
    Reply(HttpReply),
    /// A Connect server stream.
    Stream(StreamPlan),
}

/// What a server stream will send.
pub enum StreamPlan {
    /// Only an end-stream error.
    Error(ConnectError),
    /// `start`, the kept `end`, then end-stream (a `Connect` to a process that already exited).
    Ended {
        /// The pid.
        pid: u32,
        /// The end object.
        end: Value,
    },
    /// `start`, then the process's events as they come, keepalives, and the end.
    Live {
        /// The pid.
        pid: u32,
        /// The attachment.
        sub: Subscription,
        /// Keepalive interval.
        keepalive: Duration,
        /// When the stream ends with `deadline_exceeded`.
        deadline: Option<Instant>,
    },
}

/// Whether a path belongs to envd.
pub fn is_envd_path(path: &str) -> bool {
    path == "/health"
        || path == "/files"
        || path == "/envs"
        || path == "/init"
        || path == "/metrics"
        || path.starts_with("/process.Process/")
        || path.starts_with("/filesystem.Filesystem/")
}

/// The sandbox a request is for: the `E2b-Sandbox-Id` header, else a `49983-<id>.<domain>` Host.
pub fn target(req: &HttpRequest) -> (Option<String>, Option<u16>) {
    if let Some(id) = req.header("E2b-Sandbox-Id") {
        let port = req.header("E2b-Sandbox-Port").and_then(|p| p.trim().parse().ok());
        return (Some(id.trim().to_string()), port);
    }
    let host = req.header("Host").unwrap_or("");
    let label = host.split('.').next().unwrap_or("");
    match label.split_once('-') {
        Some((port, id)) if host.contains('.') && !id.is_empty() => (Some(id.to_string()), port.parse().ok()),
        _ => (None, None),
    }
}

fn proxy_not_found(id: &str) -> HttpReply {
    HttpReply::json(502, &json!({ "sandboxId": id, "message": "The sandbox was not found", "code": 502 }))
}

fn unauthorized() -> HttpReply {
    files::error(401, "unauthorized access, please provide a valid access token or method signing if supported")
}

/// Answers one envd request.
pub fn handle(state: &Arc<State>, req: &HttpRequest) -> Outcome {
    let (id, port) = target(req);
    let id = id.unwrap_or_default();
    let sb = match state.lookup(&id) {
        Found::Running(sb, _) => sb,
        Found::Paused(..) | Found::Missing => return Outcome::Reply(proxy_not_found(&id)),
    };
    if let Some(port) = port.filter(|p| *p != ENVD_PORT) {
        return Outcome::Reply(HttpReply::json(
            502,
            &json!({ "sandboxId": id, "message": "The sandbox is running but port is not open", "port": port, "code": 502 }),
        ));
    }
    if req.path == "/health" {
        return Outcome::Reply(HttpReply::empty(204));
    }
    let token_ok = req.header("X-Access-Token") == Some(sb.token.as_str());
    // /files is outside envd's token middleware but still needs the token or a signature.
    let signed = req.path == "/files" && req.query("signature").is_some();
    if !token_ok && !signed {
        return Outcome::Reply(unauthorized());
    }
    // Where the sandbox's files are: only what touches them needs it (Start for its cwd).
    let needs_tree = req.path == "/files" || req.path.starts_with("/filesystem.") || req.path == "/process.Process/Start";
    let tree = match needs_tree.then(|| state.tree(&sb.local_id)).transpose() {
        Ok(t) => t.unwrap_or_else(|| Tree::new("/".into(), "/".into(), None)),
        Err(err) => {
            log::warn!("sandbox {id} ({}): its files are unreachable: {err}", sb.local_id);
            return Outcome::Reply(proxy_not_found(&id));
        }
    };
    match (req.method.as_str(), req.path.as_str()) {
        ("GET", "/files") => return Outcome::Reply(files::download(&tree, req)),
        ("POST", "/files") => return Outcome::Reply(files::upload(&tree, req)),
        (_, "/files") => return Outcome::Reply(files::error(405, "method not allowed")),
        _ => {}
    }
    let Some(method) = req.path.strip_prefix("/process.Process/").or_else(|| req.path.strip_prefix("/filesystem.Filesystem/")) else {
        return Outcome::Reply(HttpReply::bytes(404, "text/plain; charset=utf-8", b"404 page not found\n".to_vec()));
    };
    if req.method != "POST" {
        return Outcome::Reply(HttpReply::empty(405).with_header("Allow", "POST"));
    }
    let process = req.path.starts_with("/process.");
    let streaming = matches!((process, method), (true, "Start") | (true, "Connect") | (false, "WatchDir"));
    let media = req.media_type();
    let expected = if streaming { "application/connect+json" } else { "application/json" };
    if media != expected {
        return Outcome::Reply(HttpReply::empty(415).with_header("Accept-Post", expected));
    }
    if streaming {
        let msg = match connect::decode_request(&req.body).and_then(parse_message) {
            Ok(m) => m,
            Err(err) => return Outcome::Stream(StreamPlan::Error(err)),
        };
        let plan = match method {
            "Start" => start(state, &sb, &tree, req, &msg),
            "Connect" => attach(&sb, req, &msg),
            _ => Err(ConnectError::new(Code::Unimplemented, "filesystem.Filesystem/WatchDir is not implemented by the emulator")),
        };
        return Outcome::Stream(plan.unwrap_or_else(StreamPlan::Error));
    }
    let result = parse_message(&req.body).and_then(|msg| match (process, method) {
        (true, "List") => Ok(list(&sb)),
        (true, "SendSignal") => send_signal(state, &sb, &msg),
        (true, "SendInput") => send_input(&sb, &msg),
        (true, "CloseStdin") => selector(&msg).and_then(|s| sb.procs.find_running(&s).map_err(not_found)).map(|p| {
            p.close_stdin();
            json!({})
        }),
        (true, "Update") => selector(&msg)
            .and_then(|s| sb.procs.find_running(&s).map_err(not_found))
            .and_then(|_| Err(ConnectError::new(Code::Internal, "error resizing tty: tty not assigned to process"))),
        (false, "Stat") => as_sandbox(&tree, || stat(&tree, &msg)),
        (false, "ListDir") => as_sandbox(&tree, || list_dir(&tree, &msg)),
        (false, "MakeDir") => as_sandbox(&tree, || make_dir(&tree, &msg)),
        (false, "Remove") => as_sandbox(&tree, || remove(&tree, &msg)),
        (false, "Move") => as_sandbox(&tree, || rename(&tree, &msg)),
        (true, "StreamInput") | (false, "CreateWatcher") | (false, "GetWatcherEvents") | (false, "RemoveWatcher") => {
            Err(ConnectError::new(Code::Unimplemented, format!("{} is not implemented by the emulator", req.path)))
        }
        _ => Err(ConnectError::new(Code::Unimplemented, format!("{} is not implemented", req.path.trim_start_matches('/')))),
    });
    Outcome::Reply(match result {
        Ok(v) => HttpReply::json(200, &v),
        Err(err) => HttpReply::json(err.code.http_status(), &err.to_json()),
    })
}

fn not_found(message: String) -> ConnectError {
    ConnectError::new(Code::NotFound, message)
}

/// Parses a request message: a JSON object (unknown fields are ignored, like connect-go).
fn parse_message(body: &[u8]) -> Result<Map<String, Value>, ConnectError> {
    if body.is_empty() {
        return Err(ConnectError::new(Code::InvalidArgument, "unmarshal message: zero-length payload is not a valid JSON object"));
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ConnectError::new(Code::InvalidArgument, "unmarshal message: the payload is not a JSON object")),
        Err(e) => Err(ConnectError::new(Code::InvalidArgument, format!("unmarshal message: {e}"))),
    }
}

fn bad(msg: impl Into<String>) -> ConnectError {
    ConnectError::new(Code::InvalidArgument, msg)
}

fn get_str<'a>(m: &'a Map<String, Value>, name: &str) -> Result<Option<&'a str>, ConnectError> {
    match m.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(bad(format!("field {name} must be a string"))),
    }
}

/// A proto3 JSON integer: a number or a decimal string.
fn get_u64(m: &Map<String, Value>, name: &str) -> Result<Option<u64>, ConnectError> {
    match m.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n.as_u64().map(Some).ok_or_else(|| bad(format!("field {name} must be an unsigned integer"))),
        Some(Value::String(s)) => s.parse().map(Some).map_err(|_| bad(format!("field {name} must be an unsigned integer"))),
        Some(_) => Err(bad(format!("field {name} must be an unsigned integer"))),
    }
}

fn get_obj<'a>(m: &'a Map<String, Value>, name: &str) -> Result<Option<&'a Map<String, Value>>, ConnectError> {
    match m.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(o)) => Ok(Some(o)),
        Some(_) => Err(bad(format!("field {name} must be an object"))),
    }
}

fn selector(msg: &Map<String, Value>) -> Result<Selector, ConnectError> {
    let sel = get_obj(msg, "process")?.cloned().unwrap_or_default();
    if let Some(pid) = get_u64(&sel, "pid")? {
        return u32::try_from(pid).map(Selector::Pid).map_err(|_| bad("pid is out of range"));
    }
    if let Some(tag) = get_str(&sel, "tag")? {
        return Ok(Selector::Tag(tag.to_string()));
    }
    Err(ConnectError::new(Code::Unimplemented, "invalid input type <nil>"))
}

/// `Connect-Timeout-Ms` (absent or 0: none).
fn timeout_header(req: &HttpRequest) -> Result<Option<Duration>, ConnectError> {
    match req.header("Connect-Timeout-Ms").map(str::trim) {
        None | Some("") => Ok(None),
        Some(v) if v.len() <= 10 && v.bytes().all(|b| b.is_ascii_digit()) => {
            let ms: u64 = v.parse().map_err(|_| bad(format!("invalid timeout {v:?}")))?;
            Ok((ms > 0).then(|| Duration::from_millis(ms)))
        }
        Some(v) => Err(bad(format!("strconv.Atoi: parsing {v:?}: invalid syntax"))),
    }
}

/// `Keepalive-Ping-Interval` in seconds (envd's 90 s when absent or invalid).
fn keepalive_header(req: &HttpRequest) -> Duration {
    req.header("Keepalive-Ping-Interval")
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map_or(DEFAULT_KEEPALIVE, Duration::from_secs)
}

fn start(
    state: &Arc<State>,
    sb: &Arc<Sandbox>,
    tree: &Tree,
    req: &HttpRequest,
    msg: &Map<String, Value>,
) -> Result<StreamPlan, ConnectError> {
    let timeout = timeout_header(req)?;
    let keepalive = keepalive_header(req);
    if get_obj(msg, "pty")?.is_some() {
        return Err(ConnectError::new(Code::Unimplemented, "PTY processes are not supported by the emulator"));
    }
    let config = get_obj(msg, "process")?.cloned().unwrap_or_default();
    let cmd = get_str(&config, "cmd")?.unwrap_or("").to_string();
    let args: Vec<String> = match config.get("args") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => {
            a.iter().map(|v| v.as_str().map(str::to_string).ok_or_else(|| bad("args must be strings"))).collect::<Result<_, _>>()?
        }
        Some(_) => return Err(bad("args must be a list of strings")),
    };
    let envs: BTreeMap<String, String> = match get_obj(&config, "envs")? {
        None => BTreeMap::new(),
        Some(o) => o
            .iter()
            .map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())).ok_or_else(|| bad("envs must map to strings")))
            .collect::<Result<_, _>>()?,
    };
    let cwd_given = get_str(&config, "cwd")?;
    let tag = get_str(msg, "tag")?.map(str::to_string);
    let stdin = match msg.get("stdin") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("stdin must be a boolean")),
    };
    // A sandbox path: `LocalProvider::command` takes the cwd as the sandbox sees it (for an
    // isolated sandbox, inside its root; its HOME is the sandbox's own home).
    let cwd = tree.resolve(cwd_given.unwrap_or(""));
    let is_dir = match tree.act() {
        Ok(_as) => tree.reach(&cwd, true).is_ok_and(|host| host.is_dir()),
        Err(_) => false,
    };
    if !is_dir {
        return Err(bad(format!("cwd '{}' does not exist", cwd.display())));
    }
    // envd execs the command through `/bin/sh -c '… exec "$@"'`: the pid is the command's, and a
    // missing program is exit status 127 with the shell's message, not a start error.
    let mut argv = vec![state.shell.to_string_lossy().into_owned(), "-c".into(), r#"exec "$@""#.into(), "--".into(), cmd.clone()];
    argv.extend(args.iter().cloned());
    let start_error = |e: &dyn std::fmt::Display| {
        ConnectError::new(
            Code::InvalidArgument,
            format!("error starting process '{}': {e}", [cmd.clone()].iter().chain(&args).cloned().collect::<Vec<_>>().join(" ")),
        )
    };
    let mut command = state.provider.command(&sb.local_id, &argv, &envs, Some(&cwd), Touch::Observe).map_err(|e| start_error(&e))?;
    command.stdin(if stdin { Stdio::piped() } else { Stdio::null() }).stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = command
        .spawn()
        .map_err(|e| start_error(&format!("could not start {:?} in sandbox {}: {e}", state.shell.to_string_lossy(), sb.local_id)))?;
    let mut cfg = json!({ "cmd": cmd });
    if !args.is_empty() {
        cfg["args"] = json!(args);
    }
    if !envs.is_empty() {
        cfg["envs"] = json!(envs);
    }
    if let Some(c) = cwd_given {
        cfg["cwd"] = json!(c);
    }
    let deadline = timeout.map(|t| Instant::now() + t);
    let gone_state = state.clone();
    let id = sb.id.clone();
    let gone_message = sb.gone_message();
    let gone_check: process::GoneCheck = Box::new(move || match gone_state.lookup(&id) {
        Found::Missing => Some(gone_message.clone()),
        Found::Running(..) | Found::Paused(..) => None,
    });
    // In an isolated sandbox the child is nsenter: find the program it starts inside.
    let entered = if tree.isolated() { process::entered(child.id(), ENTER_BUDGET) } else { None };
    let (proc, sub) = process::launch(child, entered, cfg, tag, deadline, state.shell.clone(), gone_check)
        .map_err(|e| ConnectError::new(Code::Internal, format!("error starting process threads: {e}")))?;
    sb.procs.insert(proc.clone());
    Ok(StreamPlan::Live { pid: proc.pid, sub, keepalive, deadline })
}

fn attach(sb: &Sandbox, req: &HttpRequest, msg: &Map<String, Value>) -> Result<StreamPlan, ConnectError> {
    let timeout = timeout_header(req)?;
    let keepalive = keepalive_header(req);
    let sel = selector(msg)?;
    let proc = sb.procs.find_any(&sel).map_err(not_found)?;
    Ok(match proc.subscribe() {
        Ok(sub) => StreamPlan::Live { pid: proc.pid, sub, keepalive, deadline: timeout.map(|t| Instant::now() + t) },
        Err(end) => StreamPlan::Ended { pid: proc.pid, end },
    })
}

fn list(sb: &Sandbox) -> Value {
    let procs: Vec<Value> = sb
        .procs
        .running()
        .iter()
        .map(|p| {
            let mut v = json!({ "config": p.config, "pid": p.pid });
            if let Some(tag) = &p.tag {
                v["tag"] = json!(tag);
            }
            v
        })
        .collect();
    if procs.is_empty() {
        json!({})
    } else {
        json!({ "processes": procs })
    }
}

fn send_signal(state: &State, sb: &Sandbox, msg: &Map<String, Value>) -> Result<Value, ConnectError> {
    let proc = sb.procs.find_running(&selector(msg)?).map_err(not_found)?;
    let signal = match msg.get("signal") {
        Some(Value::String(s)) if s == "SIGNAL_SIGKILL" => "KILL",
        Some(Value::String(s)) if s == "SIGNAL_SIGTERM" => "TERM",
        Some(Value::Number(n)) if n.as_u64() == Some(9) => "KILL",
        Some(Value::Number(n)) if n.as_u64() == Some(15) => "TERM",
        other => {
            let name = match other {
                Some(Value::String(s)) => s.clone(),
                Some(v) => v.to_string(),
                None => "SIGNAL_UNSPECIFIED".into(),
            };
            return Err(ConnectError::new(Code::Unimplemented, format!("invalid signal: {name}")));
        }
    };
    proc.signal(&state.shell, signal).map_err(not_found)?;
    Ok(json!({}))
}

fn send_input(sb: &Sandbox, msg: &Map<String, Value>) -> Result<Value, ConnectError> {
    let proc = sb.procs.find_running(&selector(msg)?).map_err(not_found)?;
    let input = get_obj(msg, "input")?.cloned().unwrap_or_default();
    if let Some(data) = get_str(&input, "stdin")? {
        let bytes = base64::decode(data).ok_or_else(|| bad("stdin is not valid base64"))?;
        proc.write_stdin(&bytes).map_err(|e| ConnectError::new(Code::Internal, format!("error writing to stdin: {e}")))?;
        return Ok(json!({}));
    }
    if get_str(&input, "pty")?.is_some() {
        return Err(ConnectError::new(
            Code::Internal,
            "error writing to tty: tty not assigned to process — input should be written to the stdin, not the tty",
        ));
    }
    Err(ConnectError::new(Code::Unimplemented, "invalid input type <nil>"))
}

/// Runs a filesystem-service call with the sandbox root's identity (see `Tree::act`).
fn as_sandbox(tree: &Tree, call: impl FnOnce() -> Result<Value, ConnectError>) -> Result<Value, ConnectError> {
    let _as = tree.act().map_err(|e| ConnectError::new(Code::Internal, format!("error taking the sandbox's identity: {e}")))?;
    call()
}

/// A path argument: the sandbox path it names (reported back) and where the emulator reaches it
/// (`follow_final`: through a final symbolic link too).
fn path_arg(tree: &Tree, msg: &Map<String, Value>, name: &str, follow_final: bool) -> Result<(PathBuf, PathBuf), ConnectError> {
    let path = tree.resolve(get_str(msg, name)?.unwrap_or(""));
    let host = tree.reach(&path, follow_final).map_err(|e| fs_error(&path, &e, "path not found"))?;
    Ok((path, host))
}

/// The `EntryInfo` of sandbox path `path`, reached at `host`.
fn entry(tree: &Tree, path: &Path, host: &Path) -> Result<Value, ConnectError> {
    files::entry_info(tree, host, path).map_err(|e| fs_error(path, &e, "file not found"))
}

fn fs_error(path: &Path, err: &io::Error, what: &str) -> ConnectError {
    match err.kind() {
        io::ErrorKind::NotFound => ConnectError::new(Code::NotFound, format!("{what}: stat {}: no such file or directory", path.display())),
        io::ErrorKind::PermissionDenied => ConnectError::new(Code::PermissionDenied, format!("{}: {err}", path.display())),
        _ => ConnectError::new(Code::Internal, format!("error statting file: {}: {err}", path.display())),
    }
}

fn stat(tree: &Tree, msg: &Map<String, Value>) -> Result<Value, ConnectError> {
    let (path, host) = path_arg(tree, msg, "path", false)?;
    Ok(json!({ "entry": entry(tree, &path, &host)? }))
}

fn list_dir(tree: &Tree, msg: &Map<String, Value>) -> Result<Value, ConnectError> {
    let (path, host) = path_arg(tree, msg, "path", true)?;
    let depth = get_u64(msg, "depth")?.unwrap_or(0).clamp(1, u64::from(u32::MAX)) as u32;
    // Without isolation the kernel resolves links; with it, `reach` already did.
    let real = if tree.isolated() { host } else { fs::canonicalize(&host).map_err(|e| fs_error(&path, &e, "path not found"))? };
    let md = fs::metadata(&real).map_err(|e| fs_error(&path, &e, "path not found"))?;
    if !md.is_dir() {
        return Err(bad(format!("path is not a directory: {}", path.display())));
    }
    let mut entries = Vec::new();
    files::walk(tree, &real, &path, depth, &mut entries)
        .map_err(|e| ConnectError::new(Code::Internal, format!("error reading directory {}: {e}", path.display())))?;
    Ok(if entries.is_empty() { json!({}) } else { json!({ "entries": entries }) })
}

fn make_dir(tree: &Tree, msg: &Map<String, Value>) -> Result<Value, ConnectError> {
    let (path, host) = path_arg(tree, msg, "path", true)?;
    match fs::metadata(&host) {
        Ok(md) if md.is_dir() => {
            return Err(ConnectError::new(Code::AlreadyExists, format!("directory already exists: {}", path.display())))
        }
        Ok(_) => return Err(bad(format!("path already exists but it is not a directory: {}", path.display()))),
        Err(_) => {}
    }
    fs::create_dir_all(&host).map_err(|e| ConnectError::new(Code::Internal, format!("error creating directory: {e}")))?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    Ok(json!({ "entry": { "name": name, "type": "FILE_TYPE_DIRECTORY", "path": path.to_string_lossy() } }))
}

fn remove(tree: &Tree, msg: &Map<String, Value>) -> Result<Value, ConnectError> {
    let (_, host) = path_arg(tree, msg, "path", false)?;
    let res = match fs::symlink_metadata(&host) {
        Ok(md) if md.is_dir() => fs::remove_dir_all(&host),
        Ok(_) => fs::remove_file(&host),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    };
    res.map_err(|e| ConnectError::new(Code::Internal, format!("error removing file or directory: {e}")))?;
    Ok(json!({}))
}

fn rename(tree: &Tree, msg: &Map<String, Value>) -> Result<Value, ConnectError> {
    let (source, source_host) = path_arg(tree, msg, "source", false)?;
    let (destination, destination_host) = path_arg(tree, msg, "destination", false)?;
    if let Some(parent) = destination_host.parent() {
        fs::create_dir_all(parent).map_err(|e| ConnectError::new(Code::Internal, format!("error ensuring directories: {e}")))?;
    }
    fs::rename(&source_host, &destination_host).map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            ConnectError::new(Code::NotFound, format!("source file not found: rename {} {}: {e}", source.display(), destination.display()))
        } else {
            ConnectError::new(Code::Internal, format!("error renaming: {e}"))
        }
    })?;
    Ok(json!({ "entry": entry(tree, &destination, &destination_host)? }))
}

/// Sends a planned stream through `w`, one flushed chunk per envelope. Returns when the stream
/// ended or the client went away.
pub fn run_stream(mut w: ChunkedWriter<'_>, plan: StreamPlan) -> io::Result<()> {
    match plan {
        StreamPlan::Error(err) => {
            w.send(&connect::end_stream(Some(&err)))?;
            w.finish()
        }
        StreamPlan::Ended { pid, end } => {
            w.send(&connect::message(&process::start_event(pid)))?;
            w.send(&connect::message(&process::event_message(json!({ "end": end }))))?;
            w.send(&connect::end_stream(None))?;
            w.finish()
        }
        StreamPlan::Live { pid, sub, keepalive, deadline } => {
            w.send(&connect::message(&process::start_event(pid)))?;
            let mut next_keepalive = Instant::now() + keepalive;
            loop {
                let wake = deadline.map_or(next_keepalive, |d| d.min(next_keepalive));
                match sub.rx.recv_timeout(wake.saturating_duration_since(Instant::now())) {
                    Ok(Event::Data { stderr, bytes }) => {
                        sub.consumed(bytes.len());
                        w.send(&connect::message(&process::data_event(stderr, &bytes)))?;
                        next_keepalive = Instant::now() + keepalive;
                    }
                    // A process killed at the deadline ends the stream as envd does: its request
                    // deadline fires first, whichever of the two this thread sees first.
                    Ok(Event::End(_)) if deadline.is_some_and(|d| Instant::now() >= d) => {
                        return end_with(w, Code::DeadlineExceeded, "context deadline exceeded".into());
                    }
                    Ok(Event::End(end)) => {
                        w.send(&connect::message(&process::event_message(json!({ "end": end }))))?;
                        w.send(&connect::end_stream(None))?;
                        return w.finish();
                    }
                    Ok(Event::Gone(reason)) => return end_with(w, Code::Unavailable, reason),
                    Ok(Event::Overflow) => {
                        let why = format!(
                            "the stream fell more than {} bytes behind the process output and was cut off; reconnect with Connect",
                            process::SUBSCRIBER_BUDGET
                        );
                        return end_with(w, Code::ResourceExhausted, why);
                    }
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                        if deadline.is_some_and(|d| Instant::now() >= d) {
                            return end_with(w, Code::DeadlineExceeded, "context deadline exceeded".into());
                        }
                        if Instant::now() >= next_keepalive {
                            w.send(&connect::message(&process::keepalive_event()))?;
                            next_keepalive = Instant::now() + keepalive;
                        }
                    }
                    Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                        return end_with(w, Code::Unavailable, "the process stream ended unexpectedly".into());
                    }
                }
            }
        }
    }
}

fn end_with(mut w: ChunkedWriter<'_>, code: Code, message: String) -> io::Result<()> {
    w.send(&connect::end_stream(Some(&ConnectError::new(code, message))))?;
    w.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(headers: &[(&str, &str)]) -> HttpRequest {
        HttpRequest { headers: headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(), ..HttpRequest::default() }
    }

    #[test]
    fn targets() {
        assert_eq!(target(&req(&[("e2b-sandbox-id", "iabc"), ("E2b-Sandbox-Port", "49983")])), (Some("iabc".into()), Some(49983)));
        assert_eq!(target(&req(&[("Host", "49983-iabc.e2b.app")])), (Some("iabc".into()), Some(49983)));
        assert_eq!(target(&req(&[("Host", "127.0.0.1:8080")])), (None, None));
        assert_eq!(target(&req(&[])), (None, None));
    }

    #[test]
    fn headers_parse() {
        assert_eq!(timeout_header(&req(&[("Connect-Timeout-Ms", "60000")])).unwrap(), Some(Duration::from_secs(60)));
        assert_eq!(timeout_header(&req(&[])).unwrap(), None);
        assert_eq!(timeout_header(&req(&[("Connect-Timeout-Ms", "0")])).unwrap(), None);
        assert!(timeout_header(&req(&[("Connect-Timeout-Ms", "12345678901")])).is_err());
        assert!(timeout_header(&req(&[("Connect-Timeout-Ms", "-5")])).is_err());
        assert_eq!(keepalive_header(&req(&[("Keepalive-Ping-Interval", "50")])), Duration::from_secs(50));
        assert_eq!(keepalive_header(&req(&[("Keepalive-Ping-Interval", "x")])), DEFAULT_KEEPALIVE);
    }

    #[test]
    fn selectors_and_messages() {
        let m = parse_message(br#"{"process":{"pid":42}}"#).unwrap();
        assert_eq!(selector(&m).unwrap(), Selector::Pid(42));
        let m = parse_message(br#"{"process":{"pid":"42"}}"#).unwrap();
        assert_eq!(selector(&m).unwrap(), Selector::Pid(42));
        let m = parse_message(br#"{"process":{"tag":"t"}, "extra": 1}"#).unwrap();
        assert_eq!(selector(&m).unwrap(), Selector::Tag("t".into()));
        assert_eq!(selector(&parse_message(b"{}").unwrap()).unwrap_err().code, Code::Unimplemented);
        assert_eq!(parse_message(b"").unwrap_err().code, Code::InvalidArgument);
        assert_eq!(parse_message(b"[1]").unwrap_err().code, Code::InvalidArgument);
    }

    fn frames(out: &[u8]) -> Vec<Vec<u8>> {
        let text = String::from_utf8_lossy(out).into_owned();
        let mut rest = &out[text.find("\r\n\r\n").unwrap() + 4..];
        let mut frames = Vec::new();
        while let Some(i) = rest.windows(2).position(|w| w == b"\r\n") {
            let len = usize::from_str_radix(std::str::from_utf8(&rest[..i]).unwrap(), 16).unwrap();
            if len == 0 {
                break;
            }
            frames.push(rest[i + 2..i + 2 + len].to_vec());
            rest = &rest[i + 4 + len..];
        }
        frames
    }

    #[test]
    fn live_streams_send_keepalives_then_end_at_the_deadline() {
        let child = std::process::Command::new("/bin/sh")
            .args(["-c", "sleep 0.3; echo late; sleep 30"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Some(Instant::now() + Duration::from_millis(700));
        let (proc, sub) = process::launch(child, None, json!({}), None, deadline, "/bin/sh".into(), Box::new(|| None)).unwrap();
        let mut out = Vec::new();
        let w = ChunkedWriter::start(&mut out, 200, &[], false, None).unwrap();
        let plan = StreamPlan::Live { pid: proc.pid, sub, keepalive: Duration::from_millis(100), deadline };
        run_stream(w, plan).unwrap();
        let decoded: Vec<(u8, Value)> = frames(&out).iter().map(|f| (f[0], serde_json::from_slice(&f[5..]).unwrap())).collect();
        assert_eq!(decoded[0].1, json!({"event": {"start": {"pid": proc.pid}}}));
        let keepalives = decoded.iter().filter(|(_, v)| v["event"]["keepalive"].is_object()).count();
        assert!(keepalives >= 3, "{decoded:?}");
        assert!(decoded.iter().any(|(_, v)| v["event"]["data"]["stdout"] == "bGF0ZQo="), "{decoded:?}");
        let (flags, last) = decoded.last().unwrap();
        assert_eq!(*flags, connect::FLAG_END_STREAM);
        assert_eq!(last["error"]["code"], "deadline_exceeded");
        // The process itself was killed at the same deadline.
        let t = Instant::now();
        while proc.is_running() && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!proc.is_running());
    }

    #[test]
    fn streams_frame_errors_and_ended_processes() {
        let mut out = Vec::new();
        let w = ChunkedWriter::start(&mut out, 200, &[], false, None).unwrap();
        run_stream(w, StreamPlan::Ended { pid: 7, end: json!({"exited": true, "status": "exit status 0"}) }).unwrap();
        let frames = frames(&out);
        assert_eq!(frames.len(), 3);
        let decoded: Vec<Value> = frames.iter().map(|f| serde_json::from_slice(&f[5..]).unwrap()).collect();
        assert_eq!(decoded[0], json!({"event": {"start": {"pid": 7}}}));
        assert_eq!(decoded[1]["event"]["end"]["status"], "exit status 0");
        assert_eq!(frames[2][0], connect::FLAG_END_STREAM);
        assert_eq!(decoded[2], json!({}));
    }
}
