//! MCP methods (SPEC §3): initialize, ping, tools/list, tools/call, logging/setLevel and the
//! notifications. Everything except `tools/call` is answered at once, on the transport thread;
//! `tools/call` becomes a [`ToolCall`] for a worker. No method here blocks or touches a provider.

use crate::app::App;
use crate::jsonrpc::{self, code, Incoming, RpcError};
use crate::session::Session;
use crate::tools::{self, Ctx, Tool};
use serde_json::{json, Map, Value};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// Protocol versions this server speaks, newest first.
pub const SUPPORTED_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// Log levels accepted by `logging/setLevel`.
const LOG_LEVELS: &[&str] = &["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"];

/// A `tools/call` ready for a worker.
pub struct ToolCall {
    /// The request id.
    pub id: Value,
    /// The tool.
    pub tool: &'static Tool,
    /// Its arguments (not yet validated).
    pub arguments: Map<String, Value>,
    /// Set by `notifications/cancelled`.
    pub cancel: Arc<AtomicBool>,
}

/// What to do with one incoming message.
pub enum Route {
    /// Send this response (one serialized JSON-RPC message) now.
    Reply(String),
    /// Nothing to send (notifications, responses).
    Silent,
    /// Hand to a worker.
    Call(ToolCall),
}

/// Decides what `msg` needs.
pub fn route(app: &App, session: &Session, msg: Incoming) -> Route {
    match msg {
        Incoming::Invalid { id, error } => Route::Reply(jsonrpc::error(&id, &error).to_string()),
        Incoming::Response => Route::Silent,
        Incoming::Notification { method, params } => {
            notify(session, &method, params.as_ref());
            Route::Silent
        }
        Incoming::Request { id, method, params } => match request(session, &id, &method, params) {
            Ok(Handled::Done(result)) => Route::Reply(jsonrpc::result(&id, result).to_string()),
            // The tool list is serialized once; only the id changes.
            Ok(Handled::ToolList) => Route::Reply(format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{}}}"#, app.tools_list)),
            Ok(Handled::Call(call)) => Route::Call(call),
            Err(err) => Route::Reply(jsonrpc::error(&id, &err).to_string()),
        },
    }
}

enum Handled {
    Done(Value),
    ToolList,
    Call(ToolCall),
}

fn request(session: &Session, id: &Value, method: &str, params: Option<Value>) -> Result<Handled, RpcError> {
    let known = matches!(method, "initialize" | "ping" | "tools/list" | "tools/call" | "logging/setLevel");
    if !known {
        return Err(RpcError::new(
            code::METHOD_NOT_FOUND,
            format!("method {method:?} is not supported by this server (MCP {})", SUPPORTED_VERSIONS.join(", ")),
        ));
    }
    if method != "initialize" && method != "ping" && !session.is_initialized() {
        return Err(RpcError::new(code::INVALID_REQUEST, format!("{method} before initialize; send initialize first")));
    }
    match method {
        "initialize" => Ok(Handled::Done(initialize(session, params.as_ref()))),
        "ping" => Ok(Handled::Done(json!({}))),
        "tools/list" => Ok(Handled::ToolList),
        "logging/setLevel" => {
            let level = params.as_ref().and_then(|p| p.get("level")).and_then(Value::as_str);
            match level {
                Some(l) if LOG_LEVELS.contains(&l) => Ok(Handled::Done(json!({}))),
                _ => Err(RpcError::new(code::INVALID_PARAMS, format!("level must be one of {}", LOG_LEVELS.join(", ")))),
            }
        }
        _ => tool_call(session, id, params).map(Handled::Call),
    }
}

fn initialize(session: &Session, params: Option<&Value>) -> Value {
    let requested = params.and_then(|p| p.get("protocolVersion")).and_then(Value::as_str).unwrap_or("");
    let version = SUPPORTED_VERSIONS.iter().find(|v| **v == requested).copied().unwrap_or(SUPPORTED_VERSIONS[0]);
    session.initialize(version);
    json!({
        "protocolVersion": version,
        "capabilities": {"tools": {"listChanged": false}, "logging": {}},
        "serverInfo": {"name": "sandbox-mcp", "title": "Sandbox MCP", "version": env!("CARGO_PKG_VERSION")},
        "instructions": INSTRUCTIONS,
    })
}

/// Shown to the model by hosts that use `instructions`.
const INSTRUCTIONS: &str = "Linux sandboxes for running commands. Call create_sandbox first; later tools default to that sandbox. \
Use run_command for short commands and start_task for anything long-running: a task's handle (sandbox_id + task_id) stays valid \
after this session ends, and get_task reads its state and logs by offset. Sandboxes created in this session are killed when it \
ends, unless a task was started in them.";

fn tool_call(session: &Session, id: &Value, params: Option<Value>) -> Result<ToolCall, RpcError> {
    let Some(Value::Object(mut params)) = params else {
        return Err(RpcError::new(code::INVALID_PARAMS, "tools/call needs params {\"name\": ..., \"arguments\": {...}}"));
    };
    let name = match params.get("name") {
        Some(Value::String(n)) => n.clone(),
        _ => return Err(RpcError::new(code::INVALID_PARAMS, "tools/call needs a string \"name\"")),
    };
    let tool = tools::find(&name).ok_or_else(|| {
        let names: Vec<&str> = tools::all().iter().map(|t| t.name).collect();
        RpcError::new(
            code::INVALID_PARAMS,
            format!("unknown tool {:?}; tools are: {}", name.chars().take(80).collect::<String>(), names.join(", ")),
        )
    })?;
    let arguments = match params.remove("arguments") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m,
        Some(_) => return Err(RpcError::new(code::INVALID_PARAMS, "tools/call \"arguments\" must be an object")),
    };
    let cancel = session
        .begin(id)
        .ok_or_else(|| RpcError::new(code::INVALID_REQUEST, format!("request id {id} is already in flight; use a new id per request")))?;
    Ok(ToolCall { id: id.clone(), tool, arguments, cancel })
}

fn notify(session: &Session, method: &str, params: Option<&Value>) {
    if method == "notifications/cancelled" {
        if let Some(id) = params.and_then(|p| p.get("requestId")) {
            session.cancel(id);
        }
    }
    // notifications/initialized and unknown notifications need nothing.
}

/// Runs a tool call (on a worker) and returns the JSON-RPC response and whether it was cancelled
/// by the client (then stdio sends nothing). Once shutdown has begun, a call that has not started
/// is refused, and one stopped by the shutdown is answered, never dropped as cancelled.
pub fn execute(app: &App, session: &Session, call: &ToolCall) -> (Value, bool) {
    if app.is_draining() {
        session.finish(&call.id);
        let err = RpcError::new(code::SERVER_BUSY, SHUTTING_DOWN);
        return (jsonrpc::error(&call.id, &err), false);
    }
    if call.cancel.load(std::sync::atomic::Ordering::Relaxed) {
        // Cancelled while it waited in the queue: never start it.
        session.finish(&call.id);
        let err = RpcError::new(code::REQUEST_CANCELLED, "the request was cancelled before it started");
        return (jsonrpc::error(&call.id, &err), true);
    }
    let ctx = Ctx { app, session, cancel: &call.cancel };
    let result = tools::call(&ctx, call.tool, &call.arguments);
    session.finish(&call.id);
    let cancelled = call.cancel.load(std::sync::atomic::Ordering::Relaxed) && !app.is_draining();
    (jsonrpc::result(&call.id, result), cancelled)
}

/// The answer to a request that arrives or waits in the queue while the server shuts down.
pub const SHUTTING_DOWN: &str =
    "the server is shutting down and did not run this request; retry against the restarted server (task handles stay valid)";
