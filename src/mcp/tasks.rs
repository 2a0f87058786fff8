//! MCP protocol tasks on top of the task supervisor (docs/contract.md, "Protocol tasks"): the
//! 2025-11-25 ones (`params.task` on `tools/call`, `tasks/get`, `tasks/result`, `tasks/list`,
//! `tasks/cancel`) and the 2026-07-28 tasks extension (`CreateTaskResult` for a run_command still
//! running after `--task-after`, `tasks/get` with the result inline, `tasks/cancel`,
//! `tasks/update`).
//!
//! A protocol task is a supervisor task: its handle (the `taskId`) carries the sandbox and the
//! supervisor's task id, so any server process with the same provider configuration resolves it,
//! and the server keeps no task state beyond the list of handles each session created (for
//! `tasks/list`). Only `run_command` may run as a task. Tasks are started by the tools layer
//! (`tools::start_command_task`, `tools::run_command`); this module only maps them to the
//! protocol's shapes and reads them.

use crate::answer_budget::Charge;
use crate::app::App;
use crate::ids;
use crate::jsonrpc::{code, RpcError};
use crate::limits;
use crate::mcp::session::Session;
use crate::provider::ProviderError;
use crate::supervisor::{self, Snapshot, Target, TaskState, Window};
use crate::tools::{self, CommandResult, ToolError};
use serde_json::{json, Map, Value};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The `_meta` key that ties a `tasks/result` answer to its task.
pub const RELATED_TASK_KEY: &str = "io.modelcontextprotocol/related-task";

/// Suggested time between two `tasks/get`, in milliseconds.
pub const POLL_INTERVAL_MS: u64 = 1000;

/// Tasks per `tasks/list` page.
pub const LIST_PAGE: usize = 20;

/// The `capabilities.tasks` of a 2025-11-25 `initialize` answer.
pub fn capability() -> Value {
    json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}})
}

/// A task handle: which sandbox, which supervisor task. Spelled `<task_id>.<sandbox_id>`.
pub use crate::tools::TaskHandle as Handle;

/// Reads a `taskId`; -32602 with a sentence for anything that is not one of ours.
pub fn parse_handle(app: &App, text: &str) -> Result<Handle, RpcError> {
    let shown: String = text.chars().take(80).collect();
    let bad = |why: &str| RpcError::new(code::INVALID_PARAMS, format!("taskId {shown:?} is not a task of this server: {why}"));
    let (task_id, sandbox_id) = text.split_once('.').ok_or_else(|| bad("it has no sandbox part"))?;
    if !ids::is_task_id(task_id) {
        return Err(bad("it must start with 32 lowercase hex characters"));
    }
    app.provider.check_id(sandbox_id).map_err(|err| bad(&err.to_string()))?;
    Ok(Handle { sandbox_id: sandbox_id.to_string(), task_id: task_id.to_string() })
}

/// The `taskId` parameter of a `tasks/*` request.
pub fn task_id_param(params: Option<&Value>) -> Result<String, RpcError> {
    match params.and_then(|p| p.get("taskId")) {
        Some(Value::String(s)) => Ok(s.clone()),
        _ => {
            Err(RpcError::new(code::INVALID_PARAMS, "this method needs params {\"taskId\": \"...\"} (a string, as tools/call returned it)"))
        }
    }
}

/// The status of a task in 2025-11-25 terms, with a message when there is one. A command's exit
/// code is data (as with run_command), so every observed exit is `completed`; a task whose state
/// cannot be observed is `failed`, never `completed`.
pub fn status(s: &Snapshot) -> (&'static str, Option<String>) {
    match s.state {
        TaskState::Running => ("working", None),
        TaskState::Succeeded | TaskState::TimedOut => ("completed", None),
        TaskState::Failed if s.exit_code.is_some() => ("completed", None),
        TaskState::Failed => ("failed", Some(s.error.clone().unwrap_or_else(|| "the command could not be started".into()))),
        TaskState::Cancelled => ("cancelled", None),
        TaskState::Unknown => {
            ("failed", Some(format!("the task's outcome cannot be observed: {}", s.error.as_deref().unwrap_or("its supervisor is gone"))))
        }
    }
}

/// ISO 8601 (UTC, seconds) of Unix seconds.
pub fn iso8601(unix: i64) -> String {
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", secs / 3600, secs % 3600 / 60, secs % 60)
}

fn now_unix() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

/// The 2025-11-25 `Task` object.
pub fn task_json(handle: &Handle, s: &Snapshot) -> Value {
    let (status, message) = status(s);
    let created = s.started_at.unwrap_or_else(now_unix);
    let updated = s.finished_at.unwrap_or_else(now_unix).max(created);
    let mut task = json!({
        "taskId": handle.encode(),
        "status": status,
        "createdAt": iso8601(created),
        "lastUpdatedAt": iso8601(updated),
        "ttl": Value::Null,
        "pollInterval": POLL_INTERVAL_MS,
    });
    if let (Some(m), Some(obj)) = (message, task.as_object_mut()) {
        obj.insert("statusMessage".into(), Value::String(m));
    }
    task
}

fn provider_error(err: ProviderError) -> RpcError {
    RpcError::new(code::INTERNAL_ERROR, format!("the task could not be read: {err}; retry, the task itself is not affected"))
}

fn unknown_task(handle: &Handle) -> RpcError {
    RpcError::new(
        code::INVALID_PARAMS,
        format!(
            "there is no task {} (sandbox {} has no task {}: it was deleted, never existed, or the sandbox is gone)",
            handle.encode(),
            handle.sandbox_id,
            handle.task_id
        ),
    )
}

/// Reads a task's state (and `limit` bytes of each log from the offsets); -32602 when it does
/// not exist or its sandbox is gone.
pub fn read(app: &App, handle: &Handle, window: Window) -> Result<Snapshot, RpcError> {
    let target = Target { provider: app.provider.as_ref(), sandbox_id: &handle.sandbox_id };
    match supervisor::status(&target, &handle.task_id, window) {
        Ok(Some(s)) => Ok(s),
        Ok(None) => Err(unknown_task(handle)),
        Err(ProviderError::NotFound { .. }) => Err(unknown_task(handle)),
        Err(err) => Err(provider_error(err)),
    }
}

const STATE_ONLY: Window = Window { stdout_offset: 0, stderr_offset: 0, limit: 1 };

/// `tasks/get`.
pub fn get(app: &App, handle: &Handle) -> Result<Value, RpcError> {
    Ok(task_json(handle, &read(app, handle, STATE_ONLY)?))
}

/// `tasks/cancel`: -32602 for a task already ended; otherwise cancels through the supervisor
/// and returns the task as it then is.
pub fn cancel(app: &App, handle: &Handle) -> Result<Value, RpcError> {
    let s = read(app, handle, STATE_ONLY)?;
    if s.state.is_final() {
        let (status, _) = status(&s);
        return Err(RpcError::new(
            code::INVALID_PARAMS,
            format!("task {} already ended ({status}); there is nothing to cancel", handle.encode()),
        ));
    }
    let target = Target { provider: app.provider.as_ref(), sandbox_id: &handle.sandbox_id };
    match supervisor::cancel(&target, &handle.task_id, STATE_ONLY) {
        Ok(Some(s)) => Ok(task_json(handle, &s)),
        Ok(None) => Err(unknown_task(handle)),
        Err(err) => Err(provider_error(err)),
    }
}

/// `tasks/list`: the session's tasks from `cursor` (an opaque position), each read from its
/// sandbox (a task that can no longer be read is listed as `failed` with the reason).
pub fn list(app: &App, session: &Session, cursor: Option<&Value>) -> Result<Value, RpcError> {
    let from = match cursor {
        None | Some(Value::Null) => 0,
        Some(Value::String(c)) => c.parse::<usize>().map_err(|_| {
            RpcError::new(code::INVALID_PARAMS, format!("cursor {c:?} is not one this server gave; omit it to list from the start"))
        })?,
        Some(_) => return Err(RpcError::new(code::INVALID_PARAMS, "cursor must be a string, as nextCursor gave it")),
    };
    let (handles, more) = session.tasks_page(from, LIST_PAGE);
    let tasks: Vec<Value> = handles
        .iter()
        .filter_map(|text| {
            let handle = parse_handle(app, text).ok()?;
            Some(match read(app, &handle, STATE_ONLY) {
                Ok(s) => task_json(&handle, &s),
                Err(err) => {
                    let now = iso8601(now_unix());
                    json!({"taskId": text, "status": "failed", "statusMessage": err.message, "createdAt": now, "lastUpdatedAt": now, "ttl": Value::Null})
                }
            })
        })
        .collect();
    let mut result = json!({"tasks": tasks});
    if more {
        result["nextCursor"] = Value::String((from + LIST_PAGE).to_string());
    }
    Ok(result)
}

/// How a finished task's result finds its room in the answer budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Room {
    /// Waits at most this long for room; -32000 when it finds none (the result stays to be read
    /// again).
    Wait(Duration),
    /// Takes room if there is some now, else goes with its output cut to what needs none
    /// ([`tools::finish_command`]): for a final status that is pushed once, and would otherwise
    /// not be pushed at all.
    OrCut,
}

/// Why a finished task's result was not made.
#[derive(Debug)]
pub enum Unfinished {
    /// It could not be read (the task or its sandbox is gone, a read failed).
    Error(RpcError),
    /// It found no room in the answer budget.
    NoRoom(crate::answer_budget::Full),
}

impl From<RpcError> for Unfinished {
    fn from(err: RpcError) -> Unfinished {
        Unfinished::Error(err)
    }
}

impl From<Unfinished> for RpcError {
    /// No room is -32000: the task and its result stay, to be asked for again.
    fn from(why: Unfinished) -> RpcError {
        match why {
            Unfinished::Error(err) => err,
            Unfinished::NoRoom(full) => RpcError::new(
                code::SERVER_BUSY,
                format!("the task's result was not sent: {}; ask again in a few seconds (the task and its result stay)", full.message()),
            ),
        }
    }
}

/// The `CallToolResult` of a finished task, shaped as run_command's (the whole saved logs, read
/// page by page), with the related-task `_meta`, for `client` (whose share of the answer budget
/// it takes as `room` says, see [`tools::finish`]); `None` while it runs.
pub fn result(app: &App, client: &str, handle: &Handle, room: Room) -> Result<Option<tools::Finished>, RpcError> {
    finished(app, client, handle, room).map_err(RpcError::from)
}

/// [`result`], telling a result without room apart.
fn finished(app: &App, client: &str, handle: &Handle, room: Room) -> Result<Option<tools::Finished>, Unfinished> {
    let first = read(app, handle, Window { stdout_offset: 0, stderr_offset: 0, limit: limits::READ_LIMIT_MAX as u64 })?;
    if !first.state.is_final() && first.state != TaskState::Unknown {
        return Ok(None);
    }
    let mut out = first.stdout.clone();
    let mut err = first.stderr.clone();
    let mut s = first;
    let mut guard = 0;
    while (s.stdout_next_offset < s.stdout_bytes || s.stderr_next_offset < s.stderr_bytes) && guard < 64 {
        let window =
            Window { stdout_offset: s.stdout_next_offset, stderr_offset: s.stderr_next_offset, limit: limits::READ_LIMIT_MAX as u64 };
        let next = read(app, handle, window)?;
        out.extend_from_slice(&next.stdout);
        err.extend_from_slice(&next.stderr);
        let stuck = next.stdout_next_offset == s.stdout_next_offset && next.stderr_next_offset == s.stderr_next_offset;
        s = Snapshot { stdout_next_offset: next.stdout_next_offset, stderr_next_offset: next.stderr_next_offset, ..s };
        guard += 1;
        if stuck {
            break;
        }
    }
    let outcome = match status(&s) {
        (_, Some(message)) => Err(ToolError::new(format!("{message}; the command's output so far is in the task's logs"))),
        ("cancelled", _) => Err(ToolError::new("the task was cancelled (tasks/cancel); its command was stopped")),
        _ => Ok(CommandResult::of_task(&s, &out, &err).to_value()),
    };
    let mut finished = match (room, outcome) {
        (Room::OrCut, Ok(structured)) => {
            let whole = format!("tasks/get with taskId {} reads the whole result", handle.encode());
            tools::finish_command(app, client, structured, Duration::ZERO, &whole)
        }
        (Room::OrCut, outcome) => tools::try_finish(app, client, outcome, None).map_err(Unfinished::NoRoom)?,
        (Room::Wait(wait), outcome) => tools::try_finish(app, client, outcome, Some(wait)).map_err(Unfinished::NoRoom)?,
    };
    finished.result["_meta"] = json!({RELATED_TASK_KEY: {"taskId": handle.encode()}});
    Ok(Some(finished))
}

/// The 2026-07-28 task fields (flat), without `resultType`.
fn task_fields_2026(handle: &Handle, s: &Snapshot) -> Map<String, Value> {
    let (status, message) = status(s);
    let created = s.started_at.unwrap_or_else(now_unix);
    let updated = s.finished_at.unwrap_or_else(now_unix).max(created);
    let mut m = Map::new();
    m.insert("taskId".into(), Value::String(handle.encode()));
    m.insert("status".into(), Value::from(status));
    if let Some(message) = message {
        m.insert("statusMessage".into(), Value::String(message));
    }
    m.insert("createdAt".into(), Value::String(iso8601(created)));
    m.insert("lastUpdatedAt".into(), Value::String(iso8601(updated)));
    m.insert("ttlMs".into(), Value::Null);
    m.insert("pollIntervalMs".into(), Value::from(POLL_INTERVAL_MS));
    m
}

/// The 2026-07-28 `CreateTaskResult` (flat, `resultType: "task"`).
pub fn create_result_2026(handle: &Handle, s: &Snapshot) -> Value {
    let mut m = task_fields_2026(handle, s);
    m.insert("resultType".into(), Value::from("task"));
    Value::Object(m)
}

/// 2026-07-28 `tasks/get`: the task, with the `CallToolResult` inline once completed and a
/// JSON-RPC error inline when failed (an outcome that cannot be observed).
/// With the share of the answer budget the inline result takes for `client`.
pub fn get_2026(app: &App, client: &str, handle: &Handle) -> Result<(Value, Charge), RpcError> {
    detailed_2026(app, client, handle, &state(app, handle)?, Room::Wait(limits::ANSWER_WAIT)).map_err(RpcError::from)
}

/// A task's state without its logs; -32602 when it does not exist or its sandbox is gone.
pub fn state(app: &App, handle: &Handle) -> Result<Snapshot, RpcError> {
    read(app, handle, STATE_ONLY)
}

/// The 2026-07-28 task of `tasks/get` (and of `notifications/tasks`) for state `s` just read:
/// the task fields, with the `CallToolResult` inline once completed (read now) and a JSON-RPC
/// error inline when failed; with the share of the answer budget the result takes for `client`
/// (found as `room` says).
pub fn detailed_2026(app: &App, client: &str, handle: &Handle, s: &Snapshot, room: Room) -> Result<(Value, Charge), Unfinished> {
    let mut m = task_fields_2026(handle, s);
    let mut charge = Charge::none();
    match status(s) {
        ("completed", _) => {
            if let Some(finished) = finished(app, client, handle, room)? {
                let mut r = finished.result;
                if let Value::Object(o) = &mut r {
                    o.remove("_meta");
                }
                m.insert("result".into(), r);
                charge = finished.charge;
            }
        }
        ("failed", message) => {
            let message = message.unwrap_or_else(|| "the task failed".into());
            m.insert("error".into(), json!({"code": code::INTERNAL_ERROR, "message": message}));
        }
        _ => {}
    }
    Ok((Value::Object(m), charge))
}

/// 2026-07-28 `tasks/cancel`: an acknowledgement; a task already ended is left as it is, so a
/// second cancel is harmless. The supervisor sends TERM, then KILL.
pub fn cancel_2026(app: &App, handle: &Handle) -> Result<Value, RpcError> {
    let s = read(app, handle, STATE_ONLY)?;
    if !s.state.is_final() {
        let target = Target { provider: app.provider.as_ref(), sandbox_id: &handle.sandbox_id };
        match supervisor::cancel(&target, &handle.task_id, STATE_ONLY) {
            Ok(Some(_)) => {}
            Ok(None) => return Err(unknown_task(handle)),
            Err(err) => return Err(provider_error(err)),
        }
    }
    Ok(json!({}))
}

/// 2026-07-28 `tasks/update`: no tool here ever asks for input, so there is nothing to update;
/// an existing task is acknowledged (its input responses are ignored), an unknown one is -32602.
pub fn update_2026(app: &App, handle: &Handle) -> Result<Value, RpcError> {
    read(app, handle, STATE_ONLY)?;
    Ok(json!({}))
}

/// How long `tasks/result` may wait for the end: the longest task timeout plus its grace.
pub const RESULT_WAIT: Duration = Duration::from_secs(limits::TASK_TIMEOUT_MAX_S as u64 + 60);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso8601_of_known_instants() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00Z");
        assert_eq!(iso8601(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(iso8601(1_780_000_000), "2026-05-28T20:26:40Z");
    }

    fn snap(state: TaskState, exit_code: Option<i64>) -> Snapshot {
        Snapshot { state, exit_code, ..Snapshot::unconfirmed("0123456789abcdef0123456789abcdef", 5, "gone".into()) }
    }

    #[test]
    fn a_task_result_has_every_field_of_a_completed_run_command() {
        let schema = (tools::find("run_command").unwrap().output_schema.unwrap())();
        let result = CommandResult::of_task(&snap(TaskState::Succeeded, Some(0)), b"out", b"").to_value();
        for key in tools::COMPLETED_FIELDS {
            assert!(result.get(key).is_some(), "{key} is missing from {result}");
        }
        for key in result.as_object().unwrap().keys() {
            assert!(schema["properties"].get(key).is_some(), "{key} is not in run_command's outputSchema");
        }
        assert_eq!(result["state"], "completed");
    }

    #[test]
    fn states_map_honestly() {
        assert_eq!(status(&snap(TaskState::Running, None)).0, "working");
        assert_eq!(status(&snap(TaskState::Succeeded, Some(0))).0, "completed");
        assert_eq!(status(&snap(TaskState::Failed, Some(3))).0, "completed", "an exit code is data");
        assert_eq!(status(&snap(TaskState::Failed, None)).0, "failed");
        assert_eq!(status(&snap(TaskState::Cancelled, None)).0, "cancelled");
        let (s, m) = status(&snap(TaskState::Unknown, None));
        assert_eq!(s, "failed", "a lost supervisor is never completed");
        assert!(m.unwrap().contains("gone"));
    }
}
