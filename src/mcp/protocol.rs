//! MCP methods of both eras. A 2025 request (2025-11-25, 2025-06-18, 2025-03-26, 2024-11-05)
//! needs the session's `initialize`: initialize, ping, tools/list, tools/call, logging/setLevel
//! and the notifications. A 2026-07-28 request carries its version and client capabilities in
//! `params._meta` and needs no handshake: server/discover, tools/list, tools/call and
//! subscriptions/listen (see `envelope.rs`). Everything except `tools/call` is answered at once,
//! on the transport thread; `tools/call` becomes [`Work`] for a worker, which runs it with
//! [`execute`]. No method here blocks or touches a provider except through `execute`.
//!
//! A request's lifecycle: [`route`] registers the call's id with its session (the [`InFlight`]
//! guard inside the [`ToolCall`]), the transport queues it as a [`Job`], a worker runs
//! [`execute`], which consumes the work and so drops the guard (unregistering the id) before the
//! worker sends the reply. A call refused by a full queue, or one whose job unwinds from a panic,
//! drops its guard the same way.

use crate::answer_budget::{Backoff, Charge};
use crate::app::App;
use crate::jsonrpc::{self, code, Incoming, RpcError};
use crate::limits;
use crate::mcp::envelope::{self, RequestMeta, LOG_LEVELS};
use crate::mcp::session::{InFlight, Session};
use crate::mcp::subscription;
use crate::mcp::tasks;
use crate::queue::{Job, Outcome, Response};
use crate::supervisor::Snapshot;
use crate::tools::{self, CommandOutcome, Ctx, Finished, Pending, Reply, TaskStartError, Tool, ToolError};
use crate::waiter::Watch;
use crossbeam_channel::Sender;
use serde_json::{json, Map, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Protocol versions this server speaks through `initialize`, newest first (2026-07-28 is
/// served per request: [`envelope::MODERN_VERSIONS`]).
pub const SUPPORTED_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// What a queued call does.
pub enum Op {
    /// `tools/call` of this tool.
    Tool {
        /// The tool.
        tool: &'static Tool,
        /// Whether and how the call may become a protocol task.
        task: TaskMode,
    },
    /// A 2025-11-25 `tasks/*` request (they read sandboxes, so they run on a worker too).
    Tasks(TaskMethod),
}

/// Whether a `tools/call` may become a protocol task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskMode {
    /// No: an ordinary call.
    No,
    /// A 2025-11-25 task-augmented call (`params.task`): answered with `CreateTaskResult` at once.
    Asked,
    /// A 2026-07-28 run_command whose request declared the tasks extension: it runs as any
    /// run_command does, and is answered with a `CreateTaskResult` if it goes on as a task at
    /// `--task-after`.
    Offered,
}

/// A `tasks/*` request.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskMethod {
    /// `tasks/get {taskId}`.
    Get(String),
    /// `tasks/result {taskId}`: waits (with the waiter) until the task ends.
    Result(String),
    /// `tasks/cancel {taskId}`.
    Cancel(String),
    /// `tasks/list {cursor?}`.
    List(Option<Value>),
    /// 2026-07-28 `tasks/get {taskId}` (the result inline).
    ModernGet(String),
    /// 2026-07-28 `tasks/cancel {taskId}` (an acknowledgement).
    ModernCancel(String),
    /// 2026-07-28 `tasks/update {taskId, inputResponses}` (an acknowledgement).
    ModernUpdate(String),
}

/// A `tools/call` (or a `tasks/*` request) ready for a worker.
pub struct ToolCall {
    /// The request id.
    pub id: Value,
    /// What it does.
    pub op: Op,
    /// Its arguments (not yet validated).
    pub arguments: Map<String, Value>,
    /// Keeps the id registered with its session until the call is answered; carries the flag
    /// set by `notifications/cancelled`.
    pub in_flight: InFlight,
    /// The request's `_meta` when it is a 2026-07-28 request (its result then carries
    /// `resultType`); `None` for a 2025 request. Extensions read the client's declared
    /// capabilities here.
    pub meta: Option<RequestMeta>,
}

/// What the work queue carries: a tool call and its session.
pub struct Work {
    /// The session the call belongs to.
    pub session: Arc<Session>,
    /// The call.
    pub call: ToolCall,
}

impl crate::queue::Client for Work {
    /// The session: workers are shared fairly between sessions (a stateless request's session
    /// names its connection). Calls that end things (`kill_sandbox`, `cancel_task`,
    /// `tasks/cancel`) have a lane of their own beside the session's: a client whose long
    /// calls fill its share can still stop them; and while every worker is busy they run on
    /// threads of their own ([`crate::queue::MAX_ENDERS`]).
    fn client(&self) -> String {
        if self.ends() {
            format!("{} (ending)", self.session.id)
        } else {
            self.session.id.clone()
        }
    }

    /// `kill_sandbox`, `cancel_task` and `tasks/cancel`: they also run outside a saturated pool.
    fn ends(&self) -> bool {
        match &self.call.op {
            Op::Tool { tool, .. } => matches!(tool.name, "kill_sandbox" | "cancel_task"),
            Op::Tasks(method) => matches!(method, TaskMethod::Cancel(_)),
        }
    }
}

impl ToolCall {
    /// The tool's name, or the `tasks/*` method's.
    pub fn name(&self) -> &'static str {
        match &self.op {
            Op::Tool { tool, .. } => tool.name,
            Op::Tasks(TaskMethod::Get(_)) => "tasks/get",
            Op::Tasks(TaskMethod::Result(_)) => "tasks/result",
            Op::Tasks(TaskMethod::Cancel(_)) => "tasks/cancel",
            Op::Tasks(TaskMethod::List(_)) => "tasks/list",
            Op::Tasks(TaskMethod::ModernGet(_)) => "tasks/get",
            Op::Tasks(TaskMethod::ModernCancel(_)) => "tasks/cancel",
            Op::Tasks(TaskMethod::ModernUpdate(_)) => "tasks/update",
        }
    }
}

impl Work {
    /// The job for this work, answered on `reply`.
    pub fn into_job<R>(self, reply: Sender<R>) -> Job<Work, R> {
        Job { id: self.call.id.clone(), work: self, reply }
    }
}

/// The work queue, whose workers answer with replies of type `R` (`Out` for stdio, an
/// [`Outcome`] for HTTP).
pub type WorkQueue<R> = Sender<Job<Work, R>>;

/// What to do with one incoming message.
pub enum Route {
    /// Send this response (one serialized JSON-RPC message) now.
    Reply(String),
    /// A 2026-07-28 request refused before any method ran: send this error response now (over
    /// HTTP with the status the [`Refusal`] calls for).
    Refused(String, Refusal),
    /// Nothing to send (notifications, responses).
    Silent,
    /// Hand to a worker.
    Call(Work),
    /// Open a `subscriptions/listen` stream.
    Listen(Listen),
}

/// Why a 2026-07-28 request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Its envelope (`_meta`, version, HTTP headers) is missing, malformed or unsupported
    /// (HTTP 400).
    Envelope,
    /// The method does not exist in 2026-07-28 (HTTP 404).
    UnknownMethod,
}

/// A `subscriptions/listen` request accepted: the stream starts with `ack`, then carries a
/// `notifications/tasks` for each status of the `tasks` it names (the transport parks a
/// `subscription::TaskWatch` for them with the waiter; the tool list never changes), and ends
/// with the closing result at shutdown.
pub struct Listen {
    /// The request id, which is also the subscription id.
    pub id: Value,
    /// The serialized `notifications/subscriptions/acknowledged` message.
    pub ack: String,
    /// The tasks named in `notifications.taskIds` (the tasks extension).
    pub tasks: Vec<tasks::Handle>,
    /// The `io.modelcontextprotocol/clientInfo` the request declares (HTTP shares streams by it).
    pub client_info: Option<Value>,
}

/// Checks a transport adds to a 2026-07-28 request once its `_meta` is read and before its
/// version is judged (HTTP: the request headers). Arguments: method, params, the `_meta`.
pub type EnvelopeCheck<'a> = &'a dyn Fn(&str, Option<&Value>, &RequestMeta) -> Result<(), RpcError>;

/// Decides what `msg` needs.
pub fn route(app: &App, session: &Arc<Session>, msg: Incoming) -> Route {
    route_checked(app, session, msg, &|_, _, _| Ok(()))
}

/// [`route`], with `check` applied to 2026-07-28 requests.
pub fn route_checked(app: &App, session: &Arc<Session>, msg: Incoming, check: EnvelopeCheck<'_>) -> Route {
    match msg {
        Incoming::Invalid { id, error } => Route::Reply(jsonrpc::error(&id, &error).to_string()),
        Incoming::Response => Route::Silent,
        Incoming::Notification { method, params } => {
            notify(session, &method, params.as_ref());
            Route::Silent
        }
        Incoming::Request { id, method, params } if envelope::is_modern(&method, params.as_ref()) => {
            modern(app, session, &id, &method, params, check)
        }
        Incoming::Request { id, method, params } => match request(app, session, &id, &method, params) {
            Ok(Handled::Done(result)) => Route::Reply(jsonrpc::result(&id, result).to_string()),
            // The tool list is serialized once; only the id changes.
            Ok(Handled::ToolList) => Route::Reply(format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{}}}"#, cached::tools_list())),
            Ok(Handled::Call(call)) => Route::Call(Work { session: session.clone(), call: *call }),
            Err(err) => Route::Reply(jsonrpc::error(&id, &err).to_string()),
        },
    }
}

/// A 2026-07-28 request: envelope first (shape, then the transport's check, then the version),
/// then the method. No `initialize` is needed and none is accepted.
fn modern(app: &App, session: &Arc<Session>, id: &Value, method: &str, params: Option<Value>, check: EnvelopeCheck<'_>) -> Route {
    let refuse = |err: RpcError, why| Route::Refused(jsonrpc::error(id, &err).to_string(), why);
    let meta = match RequestMeta::read(params.as_ref()).and_then(|m| check(method, params.as_ref(), &m).map(|()| m)) {
        Ok(meta) => meta,
        Err(err) => return refuse(err, Refusal::Envelope),
    };
    if let Err(err) = meta.check_version() {
        return refuse(err, Refusal::Envelope);
    }
    match method {
        // Its instructions end with the provider's overview.
        "server/discover" => Route::Reply(jsonrpc::result(id, envelope::discover(&instructions(app, DISCOVER_INSTRUCTIONS))).to_string()),
        // Serialized once; only the id changes.
        "tools/list" => Route::Reply(format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{}}}"#, cached::tools_list_modern())),
        "tools/call" => match tool_call(session, id, params, Some(meta)) {
            Ok(call) => Route::Call(Work { session: session.clone(), call }),
            Err(err) => Route::Reply(jsonrpc::error(id, &err).to_string()),
        },
        "tasks/get" | "tasks/cancel" | "tasks/update" if meta.extension(envelope::TASKS_EXTENSION).is_none() => {
            refuse(missing_tasks_extension(method), Refusal::Envelope)
        }
        "tasks/get" | "tasks/cancel" | "tasks/update" => {
            let method = tasks::task_id_param(params.as_ref()).map(|task| match method {
                "tasks/get" => TaskMethod::ModernGet(task),
                "tasks/cancel" => TaskMethod::ModernCancel(task),
                _ => TaskMethod::ModernUpdate(task),
            });
            match method.and_then(|m| begin(session, id).map(|in_flight| (m, in_flight))) {
                Ok((m, in_flight)) => Route::Call(Work {
                    session: session.clone(),
                    call: ToolCall { id: id.clone(), op: Op::Tasks(m), arguments: Map::new(), in_flight, meta: Some(meta) },
                }),
                Err(err) => Route::Reply(jsonrpc::error(id, &err).to_string()),
            }
        }
        "subscriptions/listen" => match listen(app, id, params.as_ref(), &meta) {
            Ok(listen) => Route::Listen(listen),
            Err(err) if err.code == code::MISSING_CLIENT_CAPABILITY => refuse(err, Refusal::Envelope),
            Err(err) => Route::Reply(jsonrpc::error(id, &err).to_string()),
        },
        // No resource exists here, so every URI is one that is not found (-32602 since
        // 2026-07-28, with the URI in `data`).
        "resources/read" => {
            let uri = params.as_ref().and_then(|p| p.get("uri")).cloned().unwrap_or(Value::Null);
            let err = RpcError::new(code::INVALID_PARAMS, "resource not found: this server has no resources (it offers tools only)")
                .with_data(json!({"uri": uri}));
            Route::Reply(jsonrpc::error(id, &err).to_string())
        }
        _ => refuse(RpcError::new(code::METHOD_NOT_FOUND, modern_unknown(method)), Refusal::UnknownMethod),
    }
}

/// MissingRequiredClientCapability (-32021) for `what`, which belongs to the tasks extension.
fn missing_tasks_extension(what: &str) -> RpcError {
    RpcError::new(
        code::MISSING_CLIENT_CAPABILITY,
        format!(
            "{what} belongs to the tasks extension: declare {} in _meta {}.extensions to use it",
            envelope::TASKS_EXTENSION,
            envelope::CLIENT_CAPABILITIES_KEY
        ),
    )
    .with_data(json!({"requiredCapabilities": {"extensions": {envelope::TASKS_EXTENSION: {}}}}))
}

/// A `subscriptions/listen` request: its filter read, and the task ids it names checked (they
/// need the tasks extension declared, and each must be a handle of this server: -32602
/// otherwise; whether the task exists is learnt when it is first read).
fn listen(app: &App, id: &Value, params: Option<&Value>, meta: &RequestMeta) -> Result<Listen, RpcError> {
    let filter = subscription::read(params)?;
    let named = filter.task_ids.as_deref().unwrap_or_default();
    if !named.is_empty() && meta.extension(envelope::TASKS_EXTENSION).is_none() {
        return Err(missing_tasks_extension("subscriptions/listen with notifications.taskIds"));
    }
    let tasks = named.iter().map(|text| tasks::parse_handle(app, text)).collect::<Result<Vec<_>, _>>()?;
    Ok(Listen { id: id.clone(), ack: filter.acknowledgement(id).to_string(), tasks, client_info: meta.client_info.clone() })
}

/// The message for a method a 2026-07-28 request cannot use.
fn modern_unknown(method: &str) -> String {
    let shown: String = method.chars().take(80).collect();
    let methods = "server/discover, tools/list, tools/call, subscriptions/listen, tasks/get, tasks/cancel, tasks/update";
    match method {
        "initialize" | "ping" | "logging/setLevel" | "resources/subscribe" | "resources/unsubscribe" => format!(
            "{shown} was removed in MCP 2026-07-28 (a request with {} in _meta needs no handshake); 2026-07-28 methods here: {methods}; \
to use {shown}, send it without _meta as a 2025-11-25 request",
            envelope::PROTOCOL_VERSION_KEY
        ),
        _ => format!("method {shown:?} is not supported by this server; 2026-07-28 methods here: {methods}"),
    }
}

enum Handled {
    Done(Value),
    ToolList,
    Call(Box<ToolCall>),
}

fn request(app: &App, session: &Session, id: &Value, method: &str, params: Option<Value>) -> Result<Handled, RpcError> {
    let tasks =
        matches!(method, "tasks/get" | "tasks/result" | "tasks/cancel" | "tasks/list") && session.protocol_version() == TASKS_VERSION;
    let known = tasks || matches!(method, "initialize" | "ping" | "tools/list" | "tools/call" | "logging/setLevel");
    if !known {
        return Err(RpcError::new(
            code::METHOD_NOT_FOUND,
            format!("method {method:?} is not supported by this server (MCP {})", SUPPORTED_VERSIONS.join(", ")),
        ));
    }
    if method != "initialize" && method != "ping" && !session.is_initialized() {
        return Err(RpcError::new(
            code::INVALID_REQUEST,
            format!(
                "{method} before initialize; send initialize first (or send a 2026-07-28 request with {} in params._meta)",
                envelope::PROTOCOL_VERSION_KEY
            ),
        ));
    }
    match method {
        "initialize" => Ok(Handled::Done(initialize(app, session, params.as_ref()))),
        "ping" => Ok(Handled::Done(json!({}))),
        "tools/list" => Ok(Handled::ToolList),
        "logging/setLevel" => {
            let level = params.as_ref().and_then(|p| p.get("level")).and_then(Value::as_str);
            match level {
                Some(l) if LOG_LEVELS.contains(&l) => Ok(Handled::Done(json!({}))),
                _ => Err(RpcError::new(code::INVALID_PARAMS, format!("level must be one of {}", LOG_LEVELS.join(", ")))),
            }
        }
        "tools/call" => tool_call(session, id, params, None).map(|call| Handled::Call(Box::new(call))),
        _ => {
            let method = match method {
                "tasks/list" => TaskMethod::List(params.as_ref().and_then(|p| p.get("cursor")).cloned()),
                "tasks/get" => TaskMethod::Get(tasks::task_id_param(params.as_ref())?),
                "tasks/result" => TaskMethod::Result(tasks::task_id_param(params.as_ref())?),
                _ => TaskMethod::Cancel(tasks::task_id_param(params.as_ref())?),
            };
            let in_flight = begin(session, id)?;
            Ok(Handled::Call(Box::new(ToolCall { id: id.clone(), op: Op::Tasks(method), arguments: Map::new(), in_flight, meta: None })))
        }
    }
}

/// The version whose sessions have protocol tasks (`capabilities.tasks`, `tasks/*`).
pub const TASKS_VERSION: &str = "2025-11-25";

fn begin(session: &Session, id: &Value) -> Result<InFlight, RpcError> {
    session
        .begin(id)
        .ok_or_else(|| RpcError::new(code::INVALID_REQUEST, format!("request id {id} is already in flight; use a new id per request")))
}

fn initialize(app: &App, session: &Session, params: Option<&Value>) -> Value {
    let requested = params.and_then(|p| p.get("protocolVersion")).and_then(Value::as_str).unwrap_or("");
    let version = SUPPORTED_VERSIONS.iter().find(|v| **v == requested).copied().unwrap_or(SUPPORTED_VERSIONS[0]);
    session.initialize(version);
    let mut capabilities = json!({"tools": {"listChanged": false}, "logging": {}});
    if version == TASKS_VERSION {
        capabilities["tasks"] = tasks::capability();
    }
    json!({
        "protocolVersion": version,
        "capabilities": capabilities,
        "serverInfo": envelope::server_info(),
        "instructions": instructions(app, INSTRUCTIONS),
    })
}

/// An era's instructions, then what every sandbox of this server's provider has (its shell,
/// where to write, the network, how to install packages).
fn instructions(app: &App, era: &str) -> String {
    let overview = app.provider.overview();
    if overview.is_empty() {
        era.to_string()
    } else {
        format!("{era}\n\n{overview}")
    }
}

/// Shown to the model by hosts that use `instructions` (2025 sessions).
const INSTRUCTIONS: &str = "Linux sandboxes for running commands. Call create_sandbox first; later tools default to that sandbox. \
Use run_command for short commands and start_task for anything long-running: a task's handle (sandbox_id + task_id) stays valid \
after this session ends, and get_task reads its state and logs by offset (until \"exit\" waits for the end in one call). \
Sandboxes created in this session are killed when it ends, unless a task was started in them. create_sandbox's result says what \
the sandbox has: the shell, the interpreters and compilers found (with versions), where to write, the network, how to install \
packages. Results that name a sandbox give its expires_at; task tools never renew it, so use set_timeout before a long task. \
list_sandboxes finds your sandboxes again.";

/// The answers that never change, serialized once on first use.
mod cached {
    use super::{envelope, tools};
    use std::sync::OnceLock;

    /// The `tools/list` result of a 2025 session.
    pub fn tools_list() -> &'static str {
        static ANSWER: OnceLock<String> = OnceLock::new();
        ANSWER.get_or_init(|| tools::list().to_string())
    }

    /// The `tools/list` result of a 2026-07-28 request (`resultType`, caching hints).
    pub fn tools_list_modern() -> &'static str {
        static ANSWER: OnceLock<String> = OnceLock::new();
        ANSWER.get_or_init(|| envelope::tools_list(tools::list()).to_string())
    }
}

/// `instructions` of `server/discover` (2026-07-28, where HTTP requests have no session).
pub const DISCOVER_INSTRUCTIONS: &str = "Linux sandboxes for running commands. Call create_sandbox first and pass its sandbox_id to \
every later tool (over stdio, tools also default to the last sandbox this process created). Use run_command for short commands and \
start_task for anything long-running: a task's handle (sandbox_id + task_id) stays valid after the client goes away, and get_task \
reads its state and logs by offset (until \"exit\" waits for the end in one call). A sandbox created by a 2026-07-28 request over \
HTTP lives until kill_sandbox or its own timeout (expires_at; set_timeout changes it, task tools never renew it). create_sandbox's \
result says what the sandbox has: the shell, the interpreters and compilers found, where to write, the network, how to install packages.";

fn tool_call(session: &Session, id: &Value, params: Option<Value>, meta: Option<RequestMeta>) -> Result<ToolCall, RpcError> {
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
    // A 2025-11-25 task-augmented call; other versions ignore `params.task` (2026-07-28 decides
    // on the server side, through its extension).
    let asked = meta.is_none() && session.protocol_version() == TASKS_VERSION && params.get("task").is_some_and(Value::is_object);
    if asked && !tools::TASK_TOOLS.contains(&tool.name) {
        return Err(RpcError::new(
            code::METHOD_NOT_FOUND,
            format!("{} cannot run as a task (its execution.taskSupport is forbidden); call it without params.task", tool.name),
        ));
    }
    let declared = meta.as_ref().is_some_and(|m| m.extension(envelope::TASKS_EXTENSION).is_some());
    let task = if asked {
        TaskMode::Asked
    } else if declared && tools::TASK_TOOLS.contains(&tool.name) {
        TaskMode::Offered
    } else {
        TaskMode::No
    };
    let in_flight = begin(session, id)?;
    Ok(ToolCall { id: id.clone(), op: Op::Tool { tool, task }, arguments, in_flight, meta })
}

fn notify(session: &Session, method: &str, params: Option<&Value>) {
    if method == "notifications/cancelled" {
        if let Some(id) = params.and_then(|p| p.get("requestId")) {
            session.cancel(id);
            session.subscriptions.cancel(id);
        }
    }
    // notifications/initialized and unknown notifications need nothing.
}

/// What [`execute`] made of a call.
pub enum Executed {
    /// The answer, now.
    Now(Outcome),
    /// The call waits (a `get_task` with `wait`): park it with the waiter, which answers it.
    Wait(Box<dyn Watch>),
    /// The call waits for a process in a sandbox (a `run_command`): the worker runs it outside
    /// the pool ([`crate::queue::Step::Blocking`]).
    Blocking(crate::queue::Call),
}

impl Executed {
    /// The answer now, waiting on this thread if needed (tests).
    pub fn now(self) -> Outcome {
        match self {
            Executed::Now(outcome) => outcome,
            Executed::Blocking(call) => call(),
            Executed::Wait(mut watch) => loop {
                if let Some(outcome) = watch.check() {
                    return outcome;
                }
                if Instant::now() >= watch.until() {
                    return watch.give_up();
                }
                std::thread::sleep(watch.every());
            },
        }
    }
}

/// Runs a tool call (on a worker). Once shutdown has begun, a call that has not started is
/// refused, and one stopped by the shutdown is answered, never dropped as cancelled. A call the
/// client cancelled while it waited in the queue never starts. The work is consumed: its guard
/// unregisters the request id when this returns, before the reply is sent, unless the call
/// waits: then the guard moves into the [`Watch`] and is dropped when the waiter answers, or
/// into the [`Executed::Blocking`] call, dropped when that call returns.
pub fn execute(app: &Arc<App>, work: Work) -> Executed {
    let Work { session, call } = work;
    if app.is_draining() {
        let err = RpcError::new(code::SERVER_BUSY, SHUTTING_DOWN);
        return Executed::Now(Outcome::Answer(jsonrpc::error(&call.id, &err).into()));
    }
    if call.in_flight.is_cancelled() {
        let err = RpcError::new(code::REQUEST_CANCELLED, "the request was cancelled before it started");
        return Executed::Now(Outcome::Cancelled(jsonrpc::error(&call.id, &err).into()));
    }
    let tool = match &call.op {
        Op::Tool { task: TaskMode::Asked, .. } => return Executed::Now(task_asked(app, &session, &call)),
        // run_command, answered as a protocol task once it outlives `--task-after`.
        Op::Tool { task: TaskMode::Offered, .. } => {
            let app = app.clone();
            return Executed::Blocking(Box::new(move || task_offered(&app, &session, &call)));
        }
        Op::Tool { tool, .. } => *tool,
        Op::Tasks(method) => {
            let method = method.clone();
            return tasks_method(app, &session, call, method);
        }
    };
    if tools::WAITS_FOR_A_PROCESS.contains(&tool.name) {
        let app = app.clone();
        return Executed::Blocking(Box::new(move || call_tool(&app, session, call, tool).now()));
    }
    call_tool(app, session, call, tool)
}

/// Runs one `tools/call` of `tool`.
fn call_tool(app: &Arc<App>, session: Arc<Session>, call: ToolCall, tool: &'static Tool) -> Executed {
    let client = call.in_flight.client();
    let ctx = Ctx { app, session: session.as_ref(), cancel: call.in_flight.flag(), client: &client };
    let result = match tools::call(&ctx, tool, &call.arguments) {
        Reply::Now(result) => result,
        Reply::Wait(pending) => return Executed::Wait(Box::new(CallWatch { app: app.clone(), call, pending, retry: Backoff::default() })),
    };
    Executed::Now(answer(app, &call, result))
}

/// A 2025-11-25 task-augmented run_command: started as a task at once, answered with
/// `CreateTaskResult` (`{"task": Task}`, the task recorded in the session); a refusal is -32602,
/// a provider failure -32603.
fn task_asked(app: &App, session: &Session, call: &ToolCall) -> Outcome {
    let client = call.in_flight.client();
    let ctx = Ctx { app, session, cancel: call.in_flight.flag(), client: &client };
    let created = match tools::start_command_task(&ctx, &call.arguments) {
        Ok(running) => {
            session.record_task(&running.task.encode());
            Ok(json!({"task": tasks::task_json(&running.task, &running.task_state)}))
        }
        Err(TaskStartError::Refused(err)) => Err(RpcError::new(code::INVALID_PARAMS, err.message)),
        Err(TaskStartError::Failed(err)) => {
            Err(RpcError::new(code::INTERNAL_ERROR, format!("the task could not be started: {}", err.message)))
        }
    };
    rpc_answer(app, call, created)
}

/// A 2026-07-28 run_command whose request declared the tasks extension: it runs as any
/// run_command does; one that goes on as a task is answered with a flat `CreateTaskResult`
/// instead of the `running` answer.
fn task_offered(app: &App, session: &Session, call: &ToolCall) -> Outcome {
    let client = call.in_flight.client();
    let ctx = Ctx { app, session, cancel: call.in_flight.flag(), client: &client };
    match tools::run_command(&ctx, &call.arguments) {
        Ok(CommandOutcome::Running(running)) => task_created(app, session, call, &running.task, &running.task_state),
        Ok(CommandOutcome::Completed(done)) => {
            answer(app, call, tools::finish_command(app, &client, done.to_value(), limits::ANSWER_WAIT, tools::COMMAND_OUTPUT_ELSEWHERE))
        }
        Err(err) => answer(app, call, tools::finish(app, &client, Err(err), Some(limits::ANSWER_WAIT))),
    }
}

/// A `tasks/*` request.
fn tasks_method(app: &Arc<App>, session: &Session, call: ToolCall, method: TaskMethod) -> Executed {
    let parsed = |text: &str| tasks::parse_handle(app, text);
    let answer = match &method {
        TaskMethod::Get(id) => parsed(id).and_then(|h| tasks::get(app, &h)),
        TaskMethod::Cancel(id) => parsed(id).and_then(|h| tasks::cancel(app, &h)),
        TaskMethod::List(cursor) => tasks::list(app, session, cursor.as_ref()),
        TaskMethod::ModernGet(id) => match parsed(id).and_then(|h| tasks::get_2026(app, &call.in_flight.client(), &h)) {
            Ok((task, charge)) => return Executed::Now(charged_answer(app, &call, Ok(task), charge)),
            Err(err) => Err(err),
        },
        TaskMethod::ModernCancel(id) => parsed(id).and_then(|h| tasks::cancel_2026(app, &h)),
        TaskMethod::ModernUpdate(id) => parsed(id).and_then(|h| tasks::update_2026(app, &h)),
        TaskMethod::Result(id) => {
            match parsed(id)
                .and_then(|h| tasks::result(app, &call.in_flight.client(), &h, tasks::Room::Wait(limits::ANSWER_WAIT)).map(|r| (h, r)))
            {
                Ok((_, Some(finished))) => return Executed::Now(answer(app, &call, finished)),
                Ok((handle, None)) => {
                    let every = crate::provider::poll_interval(app.provider.as_ref());
                    let until = Instant::now() + tasks::RESULT_WAIT;
                    return Executed::Wait(Box::new(ResultWatch {
                        app: app.clone(),
                        call,
                        handle,
                        until,
                        every,
                        retry: Backoff::default(),
                    }));
                }
                Err(err) => Err(err),
            }
        }
    };
    Executed::Now(rpc_answer(app, &call, answer))
}

/// The answer to a 2026-07-28 run_command that went on as task `handle`: the `CreateTaskResult`
/// (the task recorded in the session).
fn task_created(app: &App, session: &Session, call: &ToolCall, handle: &tasks::Handle, snapshot: &Snapshot) -> Outcome {
    session.record_task(&handle.encode());
    let mut result = tasks::create_result_2026(handle, snapshot);
    if let Value::Object(r) = &mut result {
        let meta = r.entry("_meta").or_insert_with(|| Value::Object(Map::new()));
        meta[envelope::SERVER_INFO_KEY] = envelope::server_info();
    }
    rpc_answer(app, call, Ok(result))
}

/// The response to `call` with a result or a JSON-RPC error; a 2026-07-28 result is marked
/// complete unless it already says what it is (a `CreateTaskResult`).
fn rpc_answer(app: &App, call: &ToolCall, answer: Result<Value, RpcError>) -> Outcome {
    charged_answer(app, call, answer, Charge::none())
}

/// [`rpc_answer`] with the share of the answer budget the result took.
fn charged_answer(app: &App, call: &ToolCall, answer: Result<Value, RpcError>, charge: Charge) -> Outcome {
    let response = match answer {
        Ok(mut result) => {
            if call.meta.is_some() && result.get("resultType").is_none() {
                envelope::complete(&mut result);
            }
            jsonrpc::result(&call.id, result)
        }
        Err(err) => jsonrpc::error(&call.id, &err),
    };
    let response = Response::charged(response, charge);
    if call.in_flight.is_cancelled() && !app.is_draining() {
        Outcome::Cancelled(response)
    } else {
        Outcome::Answer(response)
    }
}

/// A `tasks/result` waiting for its task's end.
struct ResultWatch {
    app: Arc<App>,
    call: ToolCall,
    handle: tasks::Handle,
    until: Instant,
    every: Duration,
    /// When it is read again after its result found no room in the answer budget.
    retry: Backoff,
}

impl Watch for ResultWatch {
    fn check(&mut self) -> Option<Outcome> {
        if self.app.is_draining() {
            let err = RpcError::new(
                code::SERVER_BUSY,
                "the server is shutting down; call tasks/result again on the restarted server (the task goes on)",
            );
            return Some(rpc_answer(&self.app, &self.call, Err(err)));
        }
        if self.call.in_flight.is_cancelled() {
            let err = RpcError::new(code::REQUEST_CANCELLED, "tasks/result was cancelled; the task goes on (tasks/cancel stops it)");
            return Some(rpc_answer(&self.app, &self.call, Err(err)));
        }
        if !self.retry.due() {
            return None;
        }
        // On the waiter's thread: no wait for room in the answer budget. Without room (-32000),
        // the call stays parked and reads again later (`Backoff`).
        match tasks::result(&self.app, &self.call.in_flight.client(), &self.handle, tasks::Room::Wait(Duration::ZERO)) {
            Ok(Some(finished)) => Some(answer(&self.app, &self.call, finished)),
            Ok(None) => None,
            Err(err) if err.code == code::SERVER_BUSY => {
                self.retry.refused();
                None
            }
            Err(err) => Some(rpc_answer(&self.app, &self.call, Err(err))),
        }
    }

    fn give_up(self: Box<Self>) -> Outcome {
        let err =
            RpcError::new(code::INTERNAL_ERROR, "the task did not end within the longest task timeout; call tasks/get to see its state");
        rpc_answer(&self.app, &self.call, Err(err))
    }

    fn until(&self) -> Instant {
        self.until
    }

    fn every(&self) -> Duration {
        self.every
    }

    fn keys(&self) -> Vec<String> {
        vec![self.handle.sandbox_id.clone()]
    }

    fn client(&self) -> Option<String> {
        Some(self.call.in_flight.client())
    }
}

/// The response to `call` with its `CallToolResult` (which never carries a `resultType`).
fn answer(app: &App, call: &ToolCall, finished: Finished) -> Outcome {
    charged_answer(app, call, Ok(finished.result), finished.charge)
}

/// A tool call parked with the waiter: it holds the call (and so its in-flight registration)
/// until it is answered. The wait ends early when the client cancels the call or the server
/// begins shutting down; either way the call is answered with a fresh read.
struct CallWatch {
    app: Arc<App>,
    call: ToolCall,
    pending: Pending,
    /// When it is read again (but for its last read) after its answer found no room in the
    /// answer budget.
    retry: Backoff,
}

impl Watch for CallWatch {
    fn check(&mut self) -> Option<Outcome> {
        let last = self.app.is_draining() || self.call.in_flight.is_cancelled() || Instant::now() >= self.pending.until;
        if !last && !self.retry.due() {
            return None;
        }
        let read = (self.pending.read)(last)
            .or_else(|| last.then(|| Err(ToolError::new("internal error: a waiting read gave no answer at its end; retry the call"))))?;
        // On the waiter's thread: no wait for room in the answer budget. Without room, the call
        // stays parked and reads again later (`Backoff`); at its last read it fails.
        match tools::try_finish(&self.app, &self.call.in_flight.client(), read, Some(Duration::ZERO)) {
            Ok(finished) => Some(answer(&self.app, &self.call, finished)),
            Err(_) if !last => {
                self.retry.refused();
                None
            }
            Err(full) => Some(answer(&self.app, &self.call, tools::refused(&self.app, &full))),
        }
    }

    fn give_up(mut self: Box<Self>) -> Outcome {
        self.pending.until = Instant::now();
        match self.check() {
            Some(outcome) => outcome,
            None => {
                let failed = tools::failure(&ToolError::new("internal error: the wait ended without an answer; retry"));
                rpc_answer(&self.app, &self.call, Ok(failed))
            }
        }
    }

    fn until(&self) -> Instant {
        self.pending.until
    }

    fn every(&self) -> Duration {
        self.pending.every
    }

    fn keys(&self) -> Vec<String> {
        vec![self.pending.key.clone()]
    }

    fn client(&self) -> Option<String> {
        Some(self.call.in_flight.client())
    }
}

/// The answer to a request that arrives or waits in the queue while the server shuts down.
pub const SHUTTING_DOWN: &str =
    "the server is shutting down and did not run this request; retry against the restarted server (task handles stay valid)";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::testing::{self, TestApp};

    /// Routing never reaches the provider; `execute` here only takes paths that do not either.
    fn test_app() -> TestApp {
        testing::test_app("protocol")
    }

    fn msg(line: &str) -> Incoming {
        jsonrpc::parse(line.as_bytes())
    }

    /// Routes a request that must be answered at once and returns the parsed answer.
    fn answer(app: &App, session: &Arc<Session>, line: &str) -> Value {
        match route(app, session, msg(line)) {
            Route::Reply(reply) | Route::Refused(reply, _) => serde_json::from_str(&reply).unwrap(),
            Route::Silent => panic!("no answer to {line}"),
            Route::Call(_) => panic!("{line} was queued"),
            Route::Listen(_) => panic!("{line} opened a subscription"),
        }
    }

    /// Every conversation carries tools/list: at most 9,000 characters, compact, in both eras, and
    /// no sentence said twice (docs/benchmarks.md has the figures).
    #[test]
    fn the_tool_list_fits_its_budget_and_says_each_thing_once() {
        for (era, text) in [("2025", cached::tools_list()), ("2026-07-28", cached::tools_list_modern())] {
            let chars = text.chars().count();
            assert!(chars <= 9_000, "{era}: tools/list is {chars} characters");
        }
        let list = tools::list();
        let mut texts = Vec::new();
        for tool in list["tools"].as_array().into_iter().flatten() {
            texts.extend(tool["description"].as_str());
            let params = tool["inputSchema"]["properties"].as_object().into_iter().flatten();
            texts.extend(params.filter_map(|(_, p)| p["description"].as_str()));
        }
        let mut seen = std::collections::BTreeSet::new();
        for sentence in texts.iter().flat_map(|t| t.split(". ")).map(|s| s.trim_end_matches('.')).filter(|s| s.len() > 12) {
            assert!(seen.insert(sentence), "said twice in tools/list: {sentence:?}");
        }
    }

    fn error_code(v: &Value) -> i64 {
        v["error"]["code"].as_i64().unwrap_or_else(|| panic!("not an error: {v}"))
    }

    fn initialized(app: &App) -> Arc<Session> {
        let session = Arc::new(Session::new("t", false));
        let init = answer(app, &session, r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18"}}"#);
        assert!(init["result"].is_object(), "{init}");
        session
    }

    fn call_line(id: &str, params: &str) -> String {
        format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{params}}}"#)
    }

    #[test]
    fn initialize_negotiates_the_version() {
        let t = test_app();
        for (asked, got) in [("2025-06-18", "2025-06-18"), ("2024-11-05", "2024-11-05"), ("1999-01-01", SUPPORTED_VERSIONS[0])] {
            let session = Arc::new(Session::new("t", false));
            let line = format!(r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":"{asked}"}}}}"#);
            let v = answer(&t.app, &session, &line);
            assert_eq!(v["id"], 1);
            assert_eq!(v["result"]["protocolVersion"], got, "{asked}");
            assert_eq!(v["result"]["serverInfo"]["name"], "sandbox-mcp");
            assert!(v["result"]["capabilities"]["tools"].is_object());
            assert!(session.is_initialized());
        }
        let session = Arc::new(Session::new("t", false));
        let v = answer(&t.app, &session, r#"{"jsonrpc":"2.0","id":"i","method":"initialize"}"#);
        assert_eq!(v["result"]["protocolVersion"], SUPPORTED_VERSIONS[0], "no version asked: the newest");
        assert_eq!(v["id"], "i");
    }

    #[test]
    fn only_ping_and_initialize_work_before_initialize() {
        let t = test_app();
        let session = Arc::new(Session::new("t", false));
        let pong = answer(&t.app, &session, r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#);
        assert_eq!(pong["result"], json!({}));
        for method in ["tools/list", "tools/call", "logging/setLevel"] {
            let v = answer(&t.app, &session, &format!(r#"{{"jsonrpc":"2.0","id":2,"method":"{method}","params":{{}}}}"#));
            assert_eq!(error_code(&v), code::INVALID_REQUEST, "{method}");
            assert!(v["error"]["message"].as_str().unwrap().contains("send initialize first"), "{v}");
            assert_eq!(v["id"], 2);
        }
        assert!(!session.is_initialized());
        assert_eq!(session.inflight_count(), 0, "a refused call is not registered");
    }

    #[test]
    fn unknown_methods_and_invalid_messages() {
        let t = test_app();
        let session = Arc::new(Session::new("t", false));
        let v = answer(&t.app, &session, r#"{"jsonrpc":"2.0","id":1,"method":"resources/list"}"#);
        assert_eq!(error_code(&v), code::METHOD_NOT_FOUND, "unknown methods are -32601 even before initialize");
        let session = initialized(&t.app);
        let v = answer(&t.app, &session, r#"{"jsonrpc":"2.0","id":1,"method":"tools/frobnicate"}"#);
        assert_eq!(error_code(&v), code::METHOD_NOT_FOUND);
        let v = answer(&t.app, &session, "{not json");
        assert_eq!(error_code(&v), code::PARSE_ERROR);
        assert!(matches!(route(&t.app, &session, msg(r#"{"jsonrpc":"2.0","id":9,"result":{}}"#)), Route::Silent));
        assert!(matches!(route(&t.app, &session, msg(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)), Route::Silent));
        assert!(matches!(route(&t.app, &session, msg(r#"{"jsonrpc":"2.0","method":"notifications/whatever"}"#)), Route::Silent));
    }

    #[test]
    fn tools_list_is_the_cached_list_with_the_request_id() {
        let t = test_app();
        let session = initialized(&t.app);
        for id in ["7", r#""seven""#] {
            let v = answer(&t.app, &session, &format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/list"}}"#));
            assert_eq!(v["id"], serde_json::from_str::<Value>(id).unwrap());
            assert_eq!(v["result"], tools::list());
            assert_eq!(v["jsonrpc"], "2.0");
        }
    }

    #[test]
    fn logging_set_level_accepts_only_known_levels() {
        let t = test_app();
        let session = initialized(&t.app);
        for level in LOG_LEVELS {
            let v = answer(
                &t.app,
                &session,
                &format!(r#"{{"jsonrpc":"2.0","id":1,"method":"logging/setLevel","params":{{"level":"{level}"}}}}"#),
            );
            assert_eq!(v["result"], json!({}), "{level}");
        }
        for params in [r#"{"level":"verbose"}"#, r#"{"level":3}"#, "{}"] {
            let v = answer(&t.app, &session, &format!(r#"{{"jsonrpc":"2.0","id":1,"method":"logging/setLevel","params":{params}}}"#));
            assert_eq!(error_code(&v), code::INVALID_PARAMS, "{params}");
        }
        let v = answer(&t.app, &session, r#"{"jsonrpc":"2.0","id":1,"method":"logging/setLevel"}"#);
        assert_eq!(error_code(&v), code::INVALID_PARAMS);
    }

    #[test]
    fn tools_call_parameter_errors_and_unknown_tools() {
        let t = test_app();
        let session = initialized(&t.app);
        let cases = [
            ("[]", "needs params"),
            (r#"{"arguments":{}}"#, "string \"name\""),
            (r#"{"name":5}"#, "string \"name\""),
            (r#"{"name":"run_command","arguments":[1]}"#, "must be an object"),
            (r#"{"name":"run_command","arguments":"x"}"#, "must be an object"),
            (r#"{"name":"no_such_tool"}"#, "unknown tool \"no_such_tool\"; tools are: "),
        ];
        for (params, says) in cases {
            let v = answer(&t.app, &session, &call_line("3", params));
            assert_eq!(error_code(&v), code::INVALID_PARAMS, "{params}");
            assert!(v["error"]["message"].as_str().unwrap().contains(says), "{params}: {v}");
            assert_eq!(v["id"], 3);
        }
        let v = answer(&t.app, &session, &call_line("3", r#"{"name":"no_such_tool"}"#));
        assert!(v["error"]["message"].as_str().unwrap().contains("run_command"), "the message lists the tools: {v}");
        assert_eq!(session.inflight_count(), 0, "no refused call stays registered");
    }

    #[test]
    fn tools_call_becomes_work_and_a_duplicate_id_waits_for_the_guard() {
        let t = test_app();
        let session = initialized(&t.app);
        let line = call_line(r#""a""#, r#"{"name":"run_command","arguments":{"command":"true"}}"#);
        let Route::Call(work) = route(&t.app, &session, msg(&line)) else { panic!("a valid call is queued") };
        assert_eq!(work.call.id, "a");
        assert_eq!(work.call.name(), "run_command");
        assert_eq!(work.call.arguments["command"], "true");
        assert!(Arc::ptr_eq(&work.session, &session));
        assert_eq!(session.inflight_count(), 1);
        let v = answer(&t.app, &session, &line);
        assert_eq!(error_code(&v), code::INVALID_REQUEST);
        assert!(v["error"]["message"].as_str().unwrap().contains("already in flight"), "{v}");
        // Missing or null arguments are an empty object.
        let Route::Call(other) = route(&t.app, &session, msg(&call_line("1", r#"{"name":"create_sandbox","arguments":null}"#))) else {
            panic!("a call without arguments is queued")
        };
        assert!(other.call.arguments.is_empty());
        let Route::Call(bare) = route(&t.app, &session, msg(&call_line("2", r#"{"name":"create_sandbox"}"#))) else {
            panic!("a call without arguments is queued")
        };
        assert!(bare.call.arguments.is_empty());
        assert_eq!(session.inflight_count(), 3);
        drop((other, bare));
        assert_eq!(session.inflight_count(), 1);
        drop(work);
        assert_eq!(session.inflight_count(), 0);
        let Route::Call(again) = route(&t.app, &session, msg(&line)) else { panic!("the id is free once its guard dropped") };
        assert_eq!(session.inflight_count(), 1);
        drop(again);
        assert_eq!(session.inflight_count(), 0);
    }

    #[test]
    fn notifications_cancelled_flags_the_call() {
        let t = test_app();
        let session = initialized(&t.app);
        let Route::Call(work) = route(&t.app, &session, msg(&call_line("5", r#"{"name":"run_command","arguments":{"command":"true"}}"#)))
        else {
            panic!("queued")
        };
        assert!(!work.call.in_flight.is_cancelled());
        let other_id = r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"5"}}"#;
        assert!(matches!(route(&t.app, &session, msg(other_id)), Route::Silent));
        assert!(!work.call.in_flight.is_cancelled(), "the string \"5\" is not the request 5");
        let cancel = r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":5,"reason":"user"}}"#;
        assert!(matches!(route(&t.app, &session, msg(cancel)), Route::Silent));
        assert!(work.call.in_flight.is_cancelled());
    }

    fn modern_line(id: &str, method: &str, params: &str) -> String {
        let meta = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}"#;
        let sep = if params.is_empty() { "" } else { "," };
        format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{{{params}{sep}{meta}}}}}"#)
    }

    #[test]
    fn modern_requests_need_no_initialize_and_are_refused_by_kind() {
        let t = test_app();
        let session = Arc::new(Session::new("t", false));
        let d = answer(&t.app, &session, &modern_line("1", "server/discover", ""));
        assert_eq!(d["result"]["resultType"], "complete");
        assert_eq!(d["result"]["supportedVersions"], json!(envelope::MODERN_VERSIONS));
        let list = answer(&t.app, &session, &modern_line(r#""l""#, "tools/list", ""));
        assert_eq!(list["id"], "l");
        assert_eq!(list["result"]["tools"], tools::list()["tools"], "the same tools in the same order as 2025");
        assert!(!session.is_initialized(), "a 2026 request starts no session");
        for (line, why) in [
            (modern_line("2", "ping", ""), Refusal::UnknownMethod),
            (modern_line("2", "initialize", ""), Refusal::UnknownMethod),
            (r#"{"jsonrpc":"2.0","id":2,"method":"server/discover"}"#.to_string(), Refusal::Envelope),
            (modern_line("2", "tools/list", "").replace("2026-07-28", "2025-11-25"), Refusal::Envelope),
        ] {
            match route(&t.app, &session, msg(&line)) {
                Route::Refused(_, got) => assert_eq!(got, why, "{line}"),
                _ => panic!("{line} was not refused"),
            }
        }
        // A transport check runs after `_meta` is read and before the version is judged.
        let refuse_all = |_: &str, _: Option<&Value>, _: &RequestMeta| Err(RpcError::new(code::HEADER_MISMATCH, "no"));
        let line = modern_line("3", "tools/list", "").replace("2026-07-28", "v9");
        match route_checked(&t.app, &session, msg(&line), &refuse_all) {
            Route::Refused(reply, Refusal::Envelope) => assert!(reply.contains("-32020"), "{reply}"),
            _ => panic!("the check did not run"),
        }
        // A 2026 tool call carries its _meta to the worker; a 2025 one does not.
        let call = modern_line("4", "tools/call", r#""name":"create_sandbox","arguments":{}"#);
        let Route::Call(work) = route(&t.app, &session, msg(&call)) else { panic!("queued") };
        assert_eq!(work.call.meta.as_ref().map(|m| m.version.as_str()), Some("2026-07-28"));
        let sub = modern_line("5", "subscriptions/listen", r#""notifications":{"toolsListChanged":true}"#);
        let Route::Listen(listen) = route(&t.app, &session, msg(&sub)) else { panic!("a subscription") };
        assert_eq!(listen.id, 5);
        assert!(listen.ack.contains("notifications/subscriptions/acknowledged"));
    }

    #[test]
    fn a_subscription_naming_tasks_needs_the_extension_and_handles_of_this_server() {
        let t = test_app();
        let session = Arc::new(Session::new("t", false));
        let id = format!("{}.local-{}", "a".repeat(32), "0".repeat(24));
        let with_extension = |line: String| {
            line.replace(r#"clientCapabilities":{}"#, r#"clientCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}}"#)
        };
        let asks = |ids: &str| modern_line("6", "subscriptions/listen", &format!(r#""notifications":{{"taskIds":{ids}}}"#));
        match route(&t.app, &session, msg(&asks(&format!(r#"["{id}"]"#)))) {
            Route::Refused(reply, Refusal::Envelope) => assert!(reply.contains("-32021"), "{reply}"),
            _ => panic!("task ids without the extension are refused"),
        }
        // An empty list asks for nothing, so it needs nothing.
        let Route::Listen(empty) = route(&t.app, &session, msg(&asks("[]"))) else { panic!("a subscription") };
        assert!(empty.tasks.is_empty());
        let Route::Listen(listen) = route(&t.app, &session, msg(&with_extension(asks(&format!(r#"["{id}","{id}"]"#))))) else {
            panic!("a subscription")
        };
        assert_eq!(listen.tasks.iter().map(tasks::Handle::encode).collect::<Vec<_>>(), vec![id.clone()]);
        let ack: Value = serde_json::from_str(&listen.ack).unwrap();
        assert_eq!(ack["params"]["notifications"]["taskIds"], json!([id]));
        for bad in [r#"["nope"]"#.to_string(), format!(r#"["{}"]"#, id.to_uppercase()), "[7]".to_string()] {
            let v = answer(&t.app, &session, &with_extension(asks(&bad)));
            assert_eq!(error_code(&v), code::INVALID_PARAMS, "{bad}: {v}");
        }
    }

    #[test]
    fn execute_never_starts_a_cancelled_or_drained_call_and_unregisters_it() {
        let t = test_app();
        let session = initialized(&t.app);
        let call = |id: &str| match route(&t.app, &session, msg(&call_line(id, r#"{"name":"run_command","arguments":{"command":"true"}}"#)))
        {
            Route::Call(work) => work,
            _ => panic!("queued"),
        };
        let work = call("1");
        session.cancel(&json!(1));
        match execute(&t.app, work).now() {
            Outcome::Cancelled(v) => assert_eq!(error_code(&v), code::REQUEST_CANCELLED),
            other => panic!("{other:?}"),
        }
        assert_eq!(session.inflight_count(), 0);
        let work = call("2");
        session.cancel(&json!(2));
        t.app.begin_draining();
        match execute(&t.app, work).now() {
            Outcome::Answer(v) => {
                assert_eq!(error_code(&v), code::SERVER_BUSY, "shutdown answers, never drops as cancelled");
                assert_eq!(v["error"]["message"], SHUTTING_DOWN);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(session.inflight_count(), 0);
    }
}
