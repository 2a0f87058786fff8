//! The tool registry: names, descriptions, schemas, and the dispatch of one `tools/call`.
//!
//! One file per tool family: `sandbox` (create, kill, set_timeout; later list), `ports` (expose,
//! unexpose), `command` (run_command), `files` (read, write, list), `tasks` (start, get, cancel,
//! list, delete) and `input` (send_input, resize_task). Every handler gets validated
//! arguments, reads them through the `Param` constants of its own table (see [`args`]), and
//! returns the structured result or a [`ToolError`]; this module turns either into a
//! `CallToolResult`, masking the server's own secrets on the way out.

use crate::answer_budget::{self, Charge};
use crate::app::App;
use crate::mask::Masker;
use crate::provider::ProviderError;
use serde_json::{json, Map, Value};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub mod args;
mod command;
mod files;
mod input;
mod ports;
mod sandbox;
mod tasks;

use args::{Args, Param};
pub use command::{CommandOutcome, CommandResult, Output, RunningCommand, TaskStartError, COMPLETED_FIELDS, TIMED_OUT_EXIT_CODE};

/// A task's handle: which sandbox, which supervisor task (spelled `<task_id>.<sandbox_id>` as a
/// protocol task's `taskId`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskHandle {
    /// The sandbox.
    pub sandbox_id: String,
    /// The supervisor's task id (32 lowercase hex characters).
    pub task_id: String,
}

impl TaskHandle {
    /// The `taskId` of a protocol task.
    pub fn encode(&self) -> String {
        format!("{}.{}", self.task_id, self.sandbox_id)
    }
}

/// run_command with arguments not yet validated, for a caller that maps its outcome itself (the
/// MCP layer's protocol tasks): to its end, or until it goes on as a task at `--task-after`.
pub fn run_command(ctx: &Ctx<'_>, arguments: &Map<String, Value>) -> Result<CommandOutcome, ToolError> {
    let args = args::validate(command::RUN.name, command::RUN.params, arguments).map_err(|e| ToolError::new(e.0))?;
    command::run_command(ctx, &args)
}

/// run_command started as a task at once (a 2025-11-25 task-augmented call), arguments not yet
/// validated.
pub fn start_command_task(ctx: &Ctx<'_>, arguments: &Map<String, Value>) -> Result<RunningCommand, TaskStartError> {
    let args =
        args::validate(command::RUN.name, command::RUN.params, arguments).map_err(|e| TaskStartError::Refused(ToolError::new(e.0)))?;
    command::start_as_task(ctx, &args)
}

/// What a tool knows of the session that calls it: its default sandbox and the sandboxes that
/// end with it (the MCP layer's session implements it; the tools know nothing else of MCP).
pub trait SandboxScope {
    /// Whether the caller has no session (a 2026-07-28 request over HTTP): no default sandbox,
    /// and nothing ends with it.
    fn is_stateless(&self) -> bool;
    /// The default sandbox, if any.
    fn default_sandbox(&self) -> Option<String>;
    /// Records a sandbox the caller created: it becomes the default and ends with the session.
    /// Returns false when the session has already ended; the caller must then kill the sandbox.
    fn adopt(&self, sandbox_id: &str) -> bool;
    /// Keeps a sandbox past the session's end (a task runs in it).
    fn retain(&self, sandbox_id: &str);
    /// Keeps a sandbox past the session's end while a task start is in flight.
    fn hold(&self, sandbox_id: &str);
    /// The start [`SandboxScope::hold`] announced ended: `started` retains the sandbox, else it
    /// ends with the session again (unless another task runs in it).
    fn settle(&self, sandbox_id: &str, started: bool);
    /// Forgets a sandbox that was killed.
    fn forget(&self, sandbox_id: &str);
    /// The sandboxes list_sandboxes may show: `None` for every sandbox of the state root (stdio,
    /// `sandbox-mcp call`, HTTP with the bearer token), else these.
    fn visible(&self) -> Option<Vec<String>>;
}

/// What a tool handler can reach.
pub struct Ctx<'a> {
    /// Configuration and provider.
    pub app: &'a App,
    /// The calling session's sandboxes.
    pub session: &'a dyn SandboxScope,
    /// Set when the client cancels the request.
    pub cancel: &'a Arc<AtomicBool>,
    /// The client the call comes from, as the server shares its resources between clients
    /// (the answer budget's share).
    pub client: &'a str,
}

/// What a handler answers: its structured result now, or a read to repeat until it answers
/// (the caller answers later: a worker parks it with the waiter, `sandbox-mcp call` blocks on
/// it). [`call`] answers the same way, with the whole `CallToolResult` ([`Finished`]) in `Now`.
pub enum Reply<T = Value> {
    /// The answer.
    Now(T),
    /// The call waits; `Pending` gives its answer.
    Wait(Pending),
}

/// The result of a read.
pub type ReadResult = Result<Value, ToolError>;

/// A call that waits for something in a sandbox (a `get_task` with `wait`): how to read again and
/// until when. It never runs on a worker: the waiter thread reads it every `every`.
pub struct Pending {
    /// When the wait ends.
    pub until: Instant,
    /// Time between two reads.
    pub every: Duration,
    /// Reads once; `Some` when the call can be answered. With `true` (the wait is over) it
    /// must answer.
    pub read: Box<dyn FnMut(bool) -> Option<ReadResult> + Send>,
    /// What it reads (the sandbox's id): the waiter reads one key at a time, so a sandbox whose
    /// reads stall delays only its own calls.
    pub key: String,
}

impl Pending {
    /// Waits on the calling thread (for `sandbox-mcp call`, which has no waiter).
    pub fn block(mut self) -> ReadResult {
        loop {
            let last = Instant::now() >= self.until;
            if let Some(done) = (self.read)(last) {
                return done;
            }
            if last {
                return Err(ToolError::new("internal error: a waiting read gave no answer at its end; retry the call"));
            }
            std::thread::sleep(self.every.min(self.until.saturating_duration_since(Instant::now())));
        }
    }
}

/// A failed tool call: an `isError: true` result, never a protocol error.
#[derive(Debug)]
pub struct ToolError {
    /// What went wrong and what to do next.
    pub message: String,
    /// Optional JSON shown after the message (for example the last observed task snapshot).
    pub detail: Option<Value>,
}

impl ToolError {
    /// An error with a message only.
    pub fn new(message: impl Into<String>) -> ToolError {
        ToolError { message: message.into(), detail: None }
    }
}

impl From<ProviderError> for ToolError {
    fn from(err: ProviderError) -> ToolError {
        ToolError::new(err.to_string())
    }
}

/// One tool.
pub struct Tool {
    /// Wire name (`[a-z0-9_]`).
    pub name: &'static str,
    /// Description for the model.
    pub description: &'static str,
    /// Arguments.
    pub params: &'static [Param],
    /// The schema of `structuredContent`, on the two results programs branch on (run_command's
    /// and get_task's: exit codes, states, offsets). Every tool returns `structuredContent`;
    /// the others' fields are docs/contract.md's, kept out of the `tools/list` every
    /// conversation carries.
    pub output_schema: Option<fn() -> Value>,
    /// Whether the tool only reads (`readOnlyHint`).
    pub read_only: bool,
    /// Whether the tool may destroy or overwrite something (`destructiveHint`).
    pub destructive: bool,
    /// The handler.
    pub run: fn(&Ctx<'_>, &Args) -> Result<Reply, ToolError>,
}

/// The tools whose call waits for a process in a sandbox until it ends (up to the call's timeout
/// or `--task-after`): the thread that runs one leaves the worker pool meanwhile.
pub const WAITS_FOR_A_PROCESS: &[&str] = &["run_command"];

/// The tools that run commands, which reach the outside network when the sandbox has it
/// (`openWorldHint`).
pub const OPEN_WORLD: &[&str] = &["run_command", "start_task"];

/// The tools that may become protocol tasks (`execution.taskSupport: "optional"`: the
/// 2025-11-25 `params.task`, and the 2026-07-28 tasks extension).
pub const TASK_TOOLS: &[&str] = &["run_command"];

/// Every tool, in the order `tools/list` shows them.
pub fn all() -> &'static [Tool] {
    const TOOLS: &[Tool] = &[
        sandbox::CREATE,
        sandbox::KILL,
        sandbox::SET,
        sandbox::LIST,
        sandbox::SET_NETWORK,
        ports::EXPOSE,
        ports::UNEXPOSE,
        command::RUN,
        files::READ,
        files::WRITE,
        files::LIST,
        tasks::START,
        tasks::GET,
        tasks::CANCEL,
        tasks::LIST,
        tasks::DELETE,
        input::SEND,
        input::RESIZE,
    ];
    TOOLS
}

/// Looks a tool up by name.
pub fn find(name: &str) -> Option<&'static Tool> {
    all().iter().find(|t| t.name == name)
}

/// The `tools/list` result. Every conversation carries it, so it says each fact once: the
/// descriptions hold what a model must know, output schemas give types only, and annotations
/// only what differs from the protocol's defaults (`openWorldHint` always: its default is true).
pub fn list() -> Value {
    let tools: Vec<Value> = all()
        .iter()
        .map(|t| {
            let mut hints = Map::new();
            if t.read_only {
                hints.insert("readOnlyHint".into(), json!(true));
            } else if !t.destructive {
                hints.insert("destructiveHint".into(), json!(false));
            }
            // Commands reach the outside network when the sandbox has it.
            hints.insert("openWorldHint".into(), json!(OPEN_WORLD.contains(&t.name)));
            let mut tool = json!({
                "name": t.name,
                "description": t.description,
                "inputSchema": args::input_schema(t.params),
                "annotations": hints,
            });
            if let Some(schema) = t.output_schema {
                tool["outputSchema"] = schema();
            }
            // 2025-11-25 protocol tasks (mcp/tasks.rs); other versions ignore the field.
            if TASK_TOOLS.contains(&t.name) {
                tool["execution"] = json!({"taskSupport": "optional"});
            }
            tool
        })
        .collect();
    json!({ "tools": tools })
}

/// One field of an output schema: its JSON type, or types joined by `|` (`"integer|null"`).
pub(crate) fn field(ty: &str) -> Value {
    match ty.split_once('|') {
        None => json!({"type": ty}),
        Some(_) => json!({"type": ty.split('|').collect::<Vec<_>>()}),
    }
}

/// An output schema: an object of `fields` with their types (which fields a result always has is
/// docs/contract.md's to say: `required` lists would double the schemas).
pub(crate) fn object(fields: &[(&str, Value)]) -> Value {
    let properties: Map<String, Value> = fields.iter().map(|(name, schema)| (name.to_string(), schema.clone())).collect();
    json!({"type": "object", "properties": properties})
}

/// Runs one tool call: its `CallToolResult` now, or the read that will give it.
pub fn call(ctx: &Ctx<'_>, tool: &Tool, arguments: &Map<String, Value>) -> Reply<Finished> {
    let outcome = args::validate(tool.name, tool.params, arguments).map_err(|e| ToolError::new(e.0)).and_then(|a| (tool.run)(ctx, &a));
    match outcome {
        Ok(Reply::Wait(pending)) => Reply::Wait(pending),
        Ok(Reply::Now(structured)) if tool.name == command::RUN.name => {
            Reply::Now(finish_command(ctx.app, ctx.client, structured, crate::limits::ANSWER_WAIT, COMMAND_OUTPUT_ELSEWHERE))
        }
        Ok(Reply::Now(structured)) => Reply::Now(finish(ctx.app, ctx.client, Ok(structured), Some(crate::limits::ANSWER_WAIT))),
        Err(err) => Reply::Now(finish(ctx.app, ctx.client, Err(err), Some(crate::limits::ANSWER_WAIT))),
    }
}

/// A `CallToolResult`, with the share of the answer budget it takes until it is sent.
#[derive(Debug)]
pub struct Finished {
    /// The `CallToolResult`.
    pub result: Value,
    /// Its share of the answer budget (see `answer_budget`).
    pub charge: Charge,
}

/// Turns a handler's result into a `CallToolResult` for `client`, masking the server's own
/// secrets. With `wait`, a large result first takes its answer's share of the answer budget,
/// waiting at most that long for room (not at all on the waiter's thread, which answers every
/// parked call); one that finds none becomes a failure that says so. Without, nothing is taken:
/// for answers made one at a time (a subscription's notifications, `sandbox-mcp call`).
pub fn finish(app: &App, client: &str, outcome: ReadResult, wait: Option<Duration>) -> Finished {
    try_finish(app, client, outcome, wait).unwrap_or_else(|full| refused(app, &full))
}

/// [`finish`] for a run_command result, whose command has run whatever becomes of its answer:
/// one that finds no room in the answer budget within `wait` is sent with its output cut to what
/// needs none ([`command::fit_for_answer`], whose warning names `whole`: where the whole output
/// is), rather than lost.
pub fn finish_command(app: &App, client: &str, mut structured: Value, wait: Duration, whole: &str) -> Finished {
    let full = match answer_budget::charge(client, &structured, wait) {
        Ok(charge) => return Finished { result: masked(app, success(structured)), charge },
        Err(full) => full,
    };
    // The server's own secrets are masked before the cut, which could split one (and the text
    // block made from the masked result needs no second pass).
    structured = masked(app, structured);
    if !command::fit_for_answer(&mut structured, &full.message(), whole) {
        return refused(app, &full);
    }
    match answer_budget::charge(client, &structured, Duration::ZERO) {
        Ok(charge) => Finished { result: success(structured), charge },
        Err(full) => refused(app, &full),
    }
}

/// Where a run_command's whole output is when its answer was cut for room.
pub const COMMAND_OUTPUT_ELSEWHERE: &str =
    "read it again with get_task where a task_id is given, or redirect it to a file and read parts of it";

/// The failure that answers a call whose result found no room in the answer budget.
pub fn refused(app: &App, full: &answer_budget::Full) -> Finished {
    let message = format!(
        "the call was carried out, but its answer was not sent: {}; repeat the call in a few seconds if it only reads (a command \
would run again), or ask for less at once (max_output, a smaller file)",
        full.message()
    );
    Finished { result: masked(app, failure(&ToolError::new(message))), charge: Charge::none() }
}

/// [`finish`], but a result that finds no room in the answer budget is an error (for the
/// protocol's task methods, whose result is a task's, and stays to be read again).
pub fn try_finish(app: &App, client: &str, outcome: ReadResult, wait: Option<Duration>) -> Result<Finished, answer_budget::Full> {
    let (result, charge) = match outcome {
        Ok(structured) => {
            let charge = match wait {
                Some(wait) => answer_budget::charge(client, &structured, wait)?,
                None => Charge::none(),
            };
            (success(structured), charge)
        }
        Err(err) => (failure(&err), Charge::none()),
    };
    Ok(Finished { result: masked(app, result), charge })
}

/// `result` with the server's own secrets masked.
fn masked(app: &App, mut result: Value) -> Value {
    let dynamic = app.provider.secret_values();
    if dynamic.is_empty() {
        app.host_masker.mask_json(&mut result);
    } else {
        app.host_masker.merged(&Masker::from_values(dynamic.iter().map(String::as_str))).mask_json(&mut result);
    }
    result
}

/// A successful result: `structuredContent` plus the same JSON as text; and a read image
/// (`mime_type` beside `content_base64`, read_file) as an `image` block the model can see.
pub fn success(structured: Value) -> Value {
    let text = structured.to_string();
    let mut content = vec![json!({"type": "text", "text": text})];
    if let Some((mime, data)) = answer_budget::read_image(&structured) {
        content.push(json!({"type": "image", "data": data, "mimeType": mime}));
    }
    json!({"content": content, "structuredContent": structured, "isError": false})
}

/// A failed result: a text block, no `structuredContent`.
pub fn failure(err: &ToolError) -> Value {
    let text = match &err.detail {
        Some(detail) => format!("{}\n{}", err.message, detail),
        None => err.message.clone(),
    };
    json!({"content": [{"type": "text", "text": text}], "isError": true})
}

/// Adds `expires_at` (when the provider knows it without a request) to the result `value` about
/// sandbox `sandbox_id`, and, when `task_ends` (Unix seconds, the latest end of a task's
/// timeout) is past it, a `warning` naming set_timeout.
pub fn stamp_expiry(provider: &dyn crate::provider::Provider, sandbox_id: &str, task_ends: Option<i64>, value: &mut Value) {
    let Some(at) = provider.expires_at(sandbox_id) else { return };
    let Some(obj) = value.as_object_mut() else { return };
    obj.insert("expires_at".into(), json!(at));
    if let Some(ends) = task_ends.filter(|ends| *ends > at) {
        obj.insert(
            "warning".into(),
            json!(format!(
                "the task may run until {ends} (Unix seconds), but the sandbox expires at {at}, {}s earlier, and task tools do not renew it; \
call set_timeout with this sandbox_id and a timeout of at least {} seconds to keep it",
                ends - at,
                ends - crate::provider::unix_now() + 30
            )),
        );
    }
}

/// Adds `network_blocked` to the result `value` of a task that started at `started_at` (Unix
/// seconds): the connections the sandbox's egress proxy refused since then, when there are any.
pub fn stamp_blocked(provider: &dyn crate::provider::Provider, sandbox_id: &str, started_at: Option<i64>, value: &mut Value) {
    let Some(since) = started_at else { return };
    let blocked = provider.network_blocked(sandbox_id, (since.max(0) as u64) * 1000);
    if let (false, Some(obj)) = (blocked.is_empty(), value.as_object_mut()) {
        obj.insert("network_blocked".into(), json!(blocked));
    }
}

/// The sandbox a call targets: its `sandbox_id` argument (`given`), else the session's default
/// sandbox.
pub fn target_sandbox(ctx: &Ctx<'_>, given: Option<&str>) -> Result<String, ToolError> {
    resolve_sandbox(ctx.app, ctx.session, given)
}

/// [`target_sandbox`] outside a tool handler.
pub fn resolve_sandbox(app: &App, session: &dyn SandboxScope, given: Option<&str>) -> Result<String, ToolError> {
    let id = match given {
        Some(id) => id.to_string(),
        None if session.is_stateless() => {
            return Err(ToolError::new(
                "sandbox_id is required: a 2026-07-28 request over HTTP has no session and so no default sandbox; \
call create_sandbox and pass the sandbox_id it returns",
            ))
        }
        None => session.default_sandbox().ok_or_else(|| {
            ToolError::new("no sandbox_id was given and this session has no default sandbox; call create_sandbox first, or pass sandbox_id")
        })?,
    };
    app.provider.check_id(&id)?;
    Ok(id)
}

/// The `sandbox_id` parameter shared by most tools.
pub const SANDBOX_ID: Param = Param { name: "sandbox_id", kind: args::Kind::Str { max_chars: 128 }, required: false, description: "" };

/// The required `sandbox_id` parameter of tools reached by handle.
pub const SANDBOX_ID_REQUIRED: Param =
    Param { name: "sandbox_id", kind: args::Kind::Str { max_chars: 128 }, required: true, description: "" };

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_names_and_schemas_follow_the_rules() {
        let list = list();
        for tool in list["tools"].as_array().unwrap() {
            let name = tool["name"].as_str().unwrap();
            assert!(name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'), "{name}");
            assert!(!tool["description"].as_str().unwrap().is_empty());
            for schema in [&tool["inputSchema"], &tool["outputSchema"]].into_iter().filter(|s| !s.is_null()) {
                assert_eq!(schema["type"], "object", "{name}");
                assert!(schema["properties"].is_object(), "{name}");
                let text = schema.to_string();
                assert!(!text.contains("$schema") && !text.contains("$ref"), "{name}");
            }
            assert_eq!(tool["inputSchema"]["additionalProperties"], false, "{name}");
            let hints = &tool["annotations"];
            assert!(hints["openWorldHint"].is_boolean(), "{name}");
        }
        let typed: Vec<&str> = all().iter().filter(|t| t.output_schema.is_some()).map(|t| t.name).collect();
        assert_eq!(typed, ["run_command", "get_task"]);
        let destructive: Vec<&str> = all().iter().filter(|t| t.destructive).map(|t| t.name).collect();
        // (send_input types into a task: what it types can do anything the task can.)
        assert_eq!(
            destructive,
            ["kill_sandbox", "unexpose_port", "run_command", "write_file", "start_task", "cancel_task", "delete_task", "send_input"]
        );
    }
}
