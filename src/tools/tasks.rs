//! The background-task tools: `start_task`, `get_task`, `cancel_task`, `list_tasks` and
//! `delete_task` (docs/contract.md, "Background tasks"). Task state lives in the sandbox; these
//! tools never renew its TTL.

use super::args::{Args, IntField, Kind, Param};
use super::{field, object, Ctx, Pending, Reply, Tool, ToolError, SANDBOX_ID, SANDBOX_ID_REQUIRED};
use crate::provider::ProviderError;
use crate::supervisor::{self, Deleted, Launch, Snapshot, Started, Target, TaskInput, TaskState, Window};
use crate::{ids, limits};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

pub(super) const TASK_ID: Param = Param { name: "task_id", kind: Kind::Str { max_chars: 64 }, required: true, description: "" };

const STDOUT_OFFSET: Param = Param {
    name: "stdout_offset",
    kind: Kind::Int { min: 0, max: limits::MAX_READ_OFFSET, default: Some(0) },
    required: false,
    description: "Last stdout_next_offset.",
};

const STDERR_OFFSET: Param = Param {
    name: "stderr_offset",
    kind: Kind::Int { min: 0, max: limits::MAX_READ_OFFSET, default: Some(0) },
    required: false,
    description: "",
};

const LIMIT: Param = Param {
    name: "limit",
    kind: Kind::Int { min: limits::READ_LIMIT_MIN, max: limits::READ_LIMIT_MAX, default: Some(limits::READ_LIMIT_DEFAULT) },
    required: false,
    description: "",
};

const WAIT: Param = Param {
    name: "wait",
    kind: Kind::Int { min: 0, max: limits::MAX_WAIT_S, default: Some(0) },
    required: false,
    description: "Seconds; 0 reads now.",
};

const ENVS: Param = Param { name: "envs", kind: Kind::StrMap, required: false, description: "" };

const UNTIL: Param =
    Param { name: "until", kind: Kind::Enum(&["output", "exit"]), required: false, description: "Wait for new output, or the exit." };

const COMMAND: Param = Param { name: "command", kind: Kind::Str { max_chars: limits::MAX_COMMAND_CHARS }, required: true, description: "" };

const CWD: Param = Param { name: "cwd", kind: Kind::Str { max_chars: 4096 }, required: false, description: "" };

const TIMEOUT: Param = Param {
    name: "timeout",
    kind: Kind::Int { min: limits::TASK_TIMEOUT_MIN_S, max: limits::TASK_TIMEOUT_MAX_S, default: Some(limits::TASK_TIMEOUT_DEFAULT_S) },
    required: false,
    description: "Seconds.",
};

const STDIN: Param = Param { name: "stdin", kind: Kind::Bool, required: false, description: "For send_input." };

/// A terminal's size when `pty` leaves a field out.
const PTY_DEFAULT: (u16, u16) = (24, 80);

const PTY: Param = Param {
    name: "pty",
    kind: Kind::IntFields(&[
        IntField { name: "rows", min: limits::PTY_SIZE_MIN, max: limits::PTY_SIZE_MAX },
        IntField { name: "cols", min: limits::PTY_SIZE_MIN, max: limits::PTY_SIZE_MAX },
    ]),
    required: false,
    description: "Own terminal (default 24x80).",
};

/// The task snapshot of start_task, get_task and cancel_task.
/// get_task's outputSchema: the types of the fields programs branch on and page with (the result
/// has more: started_at, finished_at, timeout, the byte counts, error, expires_at, warning,
/// network_blocked; tools/list stays small).
fn snapshot_schema() -> Value {
    object(&[
        ("sandbox_id", field("string")),
        ("task_id", field("string")),
        ("state", json!({"type": "string", "enum": ["running", "succeeded", "failed", "cancelled", "timed_out", "unknown"]})),
        ("exit_code", field("integer|null")),
        ("stdout", field("string")),
        ("stderr", field("string")),
        ("stdout_next_offset", field("integer")),
        ("stderr_next_offset", field("integer")),
        ("stdout_truncated", field("boolean")),
        ("stderr_truncated", field("boolean")),
    ])
}

pub const START: Tool = Tool {
    name: "start_task",
    description: "Run in the background; the handle (sandbox_id, task_id) outlives session and server and keeps the \
sandbox. state \"unknown\": read it, never rerun.",
    params: &[COMMAND, SANDBOX_ID, CWD, TIMEOUT, ENVS, STDIN, PTY],
    output_schema: None,
    read_only: false,
    destructive: true,
    run: start,
};

pub const GET: Tool = Tool {
    name: "get_task",
    description: "State, exit code and a log page per stream (1 MiB kept) by offset. Wait, don't poll.",
    params: &[SANDBOX_ID_REQUIRED, TASK_ID, STDOUT_OFFSET, STDERR_OFFSET, LIMIT, WAIT, UNTIL],
    output_schema: Some(snapshot_schema),
    read_only: true,
    destructive: false,
    run: get,
};

pub const CANCEL: Tool = Tool {
    name: "cancel_task",
    description: "TERM then KILL the task's group; fails if not over in 3 s.",
    params: &[SANDBOX_ID_REQUIRED, TASK_ID],
    output_schema: None,
    read_only: false,
    destructive: true,
    run: cancel,
};

pub const LIST: Tool = Tool {
    name: "list_tasks",
    description: "A sandbox's tasks (128 kept at most; delete_task removes finished ones).",
    params: &[SANDBOX_ID],
    output_schema: None,
    read_only: true,
    destructive: false,
    run: list,
};

pub const DELETE: Tool = Tool {
    name: "delete_task",
    description: "Delete a finished task's state and logs.",
    params: &[SANDBOX_ID_REQUIRED, TASK_ID],
    output_schema: None,
    read_only: false,
    destructive: true,
    run: delete,
};

/// The handle of `get_task`, `cancel_task` and `delete_task`: the sandbox and the task id, as given.
fn handle(args: &Args) -> Result<(&str, &str), ToolError> {
    Ok((args.required_text(&SANDBOX_ID_REQUIRED)?, args.required_text(&TASK_ID)?))
}

pub(super) fn checked_task_id(id: &str) -> Result<String, ToolError> {
    if !ids::is_task_id(id) {
        let shown: String = id.chars().take(40).collect();
        return Err(ToolError::new(format!(
            "task_id {shown:?} is not a task id: it must be exactly 32 lowercase hex characters, as returned by start_task"
        )));
    }
    Ok(id.to_string())
}

fn window(args: &Args) -> Result<Window, ToolError> {
    Ok(Window {
        stdout_offset: args.integer(&STDOUT_OFFSET)?.max(0) as u64,
        stderr_offset: args.integer(&STDERR_OFFSET)?.max(0) as u64,
        limit: args.integer(&LIMIT)?.max(0) as u64,
    })
}

/// The arguments of `start_task`.
struct StartRequest<'a> {
    sandbox_id: Option<&'a str>,
    command: &'a str,
    cwd: Option<&'a str>,
    timeout: i64,
    envs: BTreeMap<String, String>,
    input: Option<TaskInput>,
}

impl<'a> StartRequest<'a> {
    fn read(args: &'a Args) -> Result<StartRequest<'a>, ToolError> {
        Ok(StartRequest {
            sandbox_id: args.text(&SANDBOX_ID)?,
            command: args.required_text(&COMMAND)?,
            cwd: args.text(&CWD)?,
            timeout: args.integer(&TIMEOUT)?,
            envs: args.map(&ENVS)?,
            input: input(args)?,
        })
    }
}

/// What the task reads: a terminal when `pty` is given (it implies stdin), else stdin with
/// `stdin: true`, else nothing.
fn input(args: &Args) -> Result<Option<TaskInput>, ToolError> {
    let stdin = args.flag(&STDIN)? == Some(true);
    // (Each field was validated within its bounds already.)
    let field =
        |pty: &BTreeMap<String, i64>, name: &str, default: u16| pty.get(name).map_or(default, |&n| u16::try_from(n).unwrap_or(default));
    Ok(match args.int_fields_given(&PTY)? {
        Some(pty) => Some(TaskInput::Pty { rows: field(&pty, "rows", PTY_DEFAULT.0), cols: field(&pty, "cols", PTY_DEFAULT.1) }),
        None if stdin => Some(TaskInput::Stdin),
        None => None,
    })
}

/// The snapshot as a tool result.
fn render(sandbox_id: &str, s: &Snapshot) -> Value {
    json!({
        "sandbox_id": sandbox_id,
        "task_id": s.task_id,
        "state": s.state.name(),
        "exit_code": s.exit_code,
        "started_at": s.started_at,
        "finished_at": s.finished_at,
        "timeout": s.timeout.unwrap_or(0),
        "stdout": String::from_utf8_lossy(&s.stdout),
        "stderr": String::from_utf8_lossy(&s.stderr),
        "stdout_next_offset": s.stdout_next_offset,
        "stderr_next_offset": s.stderr_next_offset,
        "stdout_bytes": s.stdout_bytes,
        "stderr_bytes": s.stderr_bytes,
        "stdout_truncated": s.stdout_truncated,
        "stderr_truncated": s.stderr_truncated,
        "error": s.error,
    })
}

pub(super) fn no_such_task(sandbox_id: &str, task_id: &str) -> ToolError {
    ToolError::new(format!(
        "there is no task {task_id} in sandbox {sandbox_id} (it was deleted, never existed, or the sandbox was replaced); list_tasks shows the tasks it holds"
    ))
}

fn start(ctx: &Ctx<'_>, args: &Args) -> Result<Reply, ToolError> {
    let StartRequest { sandbox_id, command, cwd, timeout, envs, input } = StartRequest::read(args)?;
    let sandbox_id = super::target_sandbox(ctx, sandbox_id)?;
    if matches!(input, Some(TaskInput::Pty { .. })) {
        if let Some(why) = ctx.app.provider.terminal_refusal(&sandbox_id) {
            return Err(ToolError::new(why));
        }
    }
    let task_id = ids::task_id();
    let launch = Launch { task_id: &task_id, timeout, cwd, command, page_limit: limits::READ_LIMIT_DEFAULT as u64, wait: 0, input };
    // Held before the start: if this session ends while the start is in flight, the sandbox
    // must survive. A start that fails puts it back into the destroy set, unless another start is
    // in flight or a task runs in it (StartMode::AtOnce).
    // A task already over by the answer cannot outlive the sandbox: no warning for it.
    let stamped = |mut value: Value, over: bool| {
        let task_ends = Some(crate::provider::unix_now() + timeout).filter(|_| !over);
        super::stamp_expiry(ctx.app.provider.as_ref(), &sandbox_id, task_ends, &mut value);
        value
    };
    match start_task(ctx, &sandbox_id, launch, StartMode::AtOnce(&envs))? {
        TaskStart::Observed(snapshot) => Ok(Reply::Now(stamped(render(&sandbox_id, &snapshot), snapshot.state.is_final()))),
        TaskStart::Refused(msg) => Err(ToolError::new(msg)),
        TaskStart::Unconfirmed(err) => {
            // Never resubmit: the command may be running. The handle is still the way to find out.
            let msg =
                format!("the start could not be confirmed ({err}); query this handle with get_task, or kill_sandbox to stop everything");
            Ok(Reply::Now(stamped(render(&sandbox_id, &Snapshot::unconfirmed(&task_id, timeout, msg)), false)))
        }
    }
}

/// How [`start_task`] starts a task.
#[derive(Debug, Clone, Copy)]
pub enum StartMode<'a> {
    /// It answers once the task runs (`supervisor::start`), with the command's own variables
    /// (masked like WaitInside's); the sandbox is held past the session once the request is
    /// known to fit, before it is sent, and retained once the task runs (start_task, a
    /// run_command asked as a task at once); a start that fails retains nothing.
    AtOnce(&'a BTreeMap<String, String>),
    /// It waits inside the sandbox for the task's end, at most `launch.wait` seconds
    /// (`supervisor::run`), and answers with the whole logs; the command's own variables are in
    /// the supervisor's environment (whose masker then masks their secret-named values). The
    /// caller retains the sandbox only once the task goes on (a run_command on a provider that
    /// supervises long commands from their start: its quick commands leave nothing behind).
    WaitInside(&'a BTreeMap<String, String>),
}

/// How a task start went.
#[derive(Debug)]
pub enum TaskStart {
    /// The supervisor answered (the task may already be over).
    Observed(Snapshot),
    /// Nothing was started (the request would be too large, or the sandbox refused it): why.
    Refused(String),
    /// The start was sent but its answer was lost: the task may be running. Never resubmit.
    Unconfirmed(ProviderError),
}

/// The one task start (start_task, a run_command asked as a task, a run_command that waits inside
/// the sandbox): `launch` in sandbox `sandbox_id` as `mode` says. `Err` when the request failed
/// before it could take effect.
pub fn start_task(ctx: &Ctx<'_>, sandbox_id: &str, launch: Launch<'_>, mode: StartMode<'_>) -> Result<TaskStart, ProviderError> {
    let provider = ctx.app.provider.as_ref();
    let task_id = launch.task_id;
    let wait = Duration::from_secs(launch.wait);
    let argv = match supervisor::start_argv(provider, launch) {
        Ok(argv) => argv,
        Err(encoded) => {
            return Ok(TaskStart::Refused(format!(
                "the start request would be {encoded} bytes once encoded, over the {} byte limit (multi-byte characters and quotes count more than once); \
shorten the command, or write a script with write_file and start that",
                limits::MAX_SANDBOX_REQUEST_BYTES
            )))
        }
    };
    let target = Target { provider, sandbox_id };
    let started = match mode {
        StartMode::AtOnce(envs) => {
            ctx.session.hold(sandbox_id);
            let started = supervisor::start(&target, task_id, argv, envs);
            let runs = match &started {
                Ok(Started::Observed(_)) => true,
                Ok(Started::Refused(_)) => false,
                Err(err) => err.maybe_applied(),
            };
            ctx.session.settle(sandbox_id, runs);
            started
        }
        StartMode::WaitInside(envs) => supervisor::run(&target, task_id, argv, envs, wait),
    };
    match started {
        Ok(Started::Observed(snapshot)) => Ok(TaskStart::Observed(*snapshot)),
        Ok(Started::Refused(msg)) => Ok(TaskStart::Refused(msg)),
        Err(err) if err.maybe_applied() => Ok(TaskStart::Unconfirmed(err)),
        Err(err) => Err(err),
    }
}

fn get(ctx: &Ctx<'_>, args: &Args) -> Result<Reply, ToolError> {
    let (given, task_id) = handle(args)?;
    let window = window(args)?;
    let wait = Duration::from_secs(args.integer(&WAIT)?.max(0) as u64);
    let until_exit = args.text(&UNTIL)? == Some("exit");
    let sandbox_id = super::target_sandbox(ctx, Some(given))?;
    let task_id = checked_task_id(task_id)?;
    let target = Target { provider: ctx.app.provider.as_ref(), sandbox_id: &sandbox_id };
    let Some(first) = supervisor::status(&target, &task_id, window)? else {
        return Err(no_such_task(&sandbox_id, &task_id));
    };
    if wait.is_zero() || has_news(&first, window, until_exit) {
        let mut value = render(&sandbox_id, &first);
        super::stamp_expiry(ctx.app.provider.as_ref(), &sandbox_id, None, &mut value);
        super::stamp_blocked(ctx.app.provider.as_ref(), &sandbox_id, first.started_at, &mut value);
        return Ok(Reply::Now(value));
    }
    // Wait off the worker: the waiter reads again every `every` until there is news or the
    // wait is over (docs/contract.md, "Waiting reads").
    let provider = ctx.app.provider.clone();
    let every = crate::provider::poll_interval(provider.as_ref());
    let key = sandbox_id.clone();
    let read = move |last: bool| {
        let target = Target { provider: provider.as_ref(), sandbox_id: &sandbox_id };
        match supervisor::status(&target, &task_id, window) {
            Ok(Some(s)) if last || has_news(&s, window, until_exit) => {
                let mut value = render(&sandbox_id, &s);
                super::stamp_expiry(provider.as_ref(), &sandbox_id, None, &mut value);
                super::stamp_blocked(provider.as_ref(), &sandbox_id, s.started_at, &mut value);
                Some(Ok(value))
            }
            Ok(Some(_)) => None,
            Ok(None) => Some(Err(no_such_task(&sandbox_id, &task_id))),
            Err(err) => Some(Err(err.into())),
        }
    };
    Ok(Reply::Wait(Pending { until: Instant::now() + wait, every, read: Box::new(read), key }))
}

/// Whether a waiting read can answer: output past the offsets asked for, or a state other than
/// running (final, or unknown: waiting would not tell more); with `until_exit`, only the latter.
fn has_news(s: &Snapshot, window: Window, until_exit: bool) -> bool {
    s.state != TaskState::Running || (!until_exit && (s.stdout_bytes > window.stdout_offset || s.stderr_bytes > window.stderr_offset))
}

fn cancel(ctx: &Ctx<'_>, args: &Args) -> Result<Reply, ToolError> {
    let (given, task_id) = handle(args)?;
    // The logs' first page; get_task pages on (one way to read logs).
    let window = Window { stdout_offset: 0, stderr_offset: 0, limit: limits::READ_LIMIT_DEFAULT.max(0) as u64 };
    let sandbox_id = super::target_sandbox(ctx, Some(given))?;
    let task_id = checked_task_id(task_id)?;
    let target = Target { provider: ctx.app.provider.as_ref(), sandbox_id: &sandbox_id };
    let Some(s) = supervisor::cancel(&target, &task_id, window)? else {
        return Err(no_such_task(&sandbox_id, &task_id));
    };
    if s.state.is_final() {
        let mut value = render(&sandbox_id, &s);
        super::stamp_expiry(ctx.app.provider.as_ref(), &sandbox_id, None, &mut value);
        return Ok(Reply::Now(value));
    }
    let why = if s.state == TaskState::Running { "the task is still running" } else { "the task's state cannot be observed" };
    Err(ToolError {
        message: format!(
            "cancellation was not confirmed within {} s: {why}. Call get_task to check again; kill_sandbox stops everything in the sandbox. Last snapshot:",
            limits::CANCEL_CONFIRM.as_secs()
        ),
        detail: Some(render(&sandbox_id, &s)),
    })
}

fn list(ctx: &Ctx<'_>, args: &Args) -> Result<Reply, ToolError> {
    let sandbox_id = super::target_sandbox(ctx, args.text(&SANDBOX_ID)?)?;
    let target = Target { provider: ctx.app.provider.as_ref(), sandbox_id: &sandbox_id };
    let tasks = supervisor::list(&target)?;
    let items: Vec<Value> = tasks
        .iter()
        .map(|s| {
            json!({"task_id": s.task_id, "state": s.state.name(), "exit_code": s.exit_code, "started_at": s.started_at,
                "finished_at": s.finished_at, "command": s.command})
        })
        .collect();
    Ok(Reply::Now(json!({"sandbox_id": sandbox_id, "tasks": items, "count": tasks.len(), "limit": limits::MAX_TASKS})))
}

fn delete(ctx: &Ctx<'_>, args: &Args) -> Result<Reply, ToolError> {
    let (given, task_id) = handle(args)?;
    let sandbox_id = super::target_sandbox(ctx, Some(given))?;
    let task_id = checked_task_id(task_id)?;
    let target = Target { provider: ctx.app.provider.as_ref(), sandbox_id: &sandbox_id };
    match supervisor::delete(&target, &task_id)? {
        Deleted::Yes => Ok(Reply::Now(json!({"task_id": task_id, "deleted": true}))),
        Deleted::Missing => Err(no_such_task(&sandbox_id, &task_id)),
        Deleted::Refused(s) => Err(ToolError::new(format!(
            "task {task_id} is {}; stop it with cancel_task first (or kill_sandbox), then delete it",
            if s.state == TaskState::Running { "still running" } else { "in an unknown state and its processes are still running" }
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::args::samples;

    #[test]
    fn reads_only_declared_arguments() {
        for args in samples(START.name, START.params) {
            let req = StartRequest::read(&args).unwrap();
            assert_eq!(req.command, "a");
        }
        let [all, required] = <[Args; 2]>::try_from(samples(GET.name, GET.params)).unwrap();
        assert_eq!(handle(&all).unwrap(), ("a", "a"));
        assert_eq!(window(&all).unwrap().limit, limits::READ_LIMIT_MIN as u64);
        assert_eq!(window(&required).unwrap().limit, limits::READ_LIMIT_DEFAULT as u64);
        for args in samples(CANCEL.name, CANCEL.params) {
            assert_eq!(handle(&args).unwrap(), ("a", "a"));
        }
        for args in samples(DELETE.name, DELETE.params) {
            assert_eq!(handle(&args).unwrap(), ("a", "a"));
        }
        assert!(checked_task_id("a").unwrap_err().message.contains("is not a task id"));
        for args in samples(LIST.name, LIST.params) {
            assert!(matches!(args.text(&SANDBOX_ID), Ok(Some("a") | None)));
        }
    }
}
