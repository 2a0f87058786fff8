//! `run_command`: one shell command to completion, with capped and masked output; or, when it
//! outlives `--task-after`, as a task ([`CommandOutcome`]: the one path for long commands).

use super::args::{Args, Kind, Param};
use super::tasks::{start_task, StartMode, TaskStart};
use super::{field, object, Ctx, Reply, TaskHandle, Tool, ToolError, SANDBOX_ID};
use crate::ids;
use crate::limits;
use crate::mask::Masker;
use crate::provider::{unix_now, Adoption, ExecEnd, ExecOutput, ExecRequest, LongCommands, Promotion, Touch, TASKS_DIR};
use crate::supervisor::{self, Launch, Snapshot, Target, TaskState, Window};
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Exit code reported when the timeout killed the command (as GNU `timeout` does).
pub const TIMED_OUT_EXIT_CODE: i32 = 124;

const COMMAND: Param = Param { name: "command", kind: Kind::Str { max_chars: limits::MAX_COMMAND_CHARS }, required: true, description: "" };

const CWD: Param = Param { name: "cwd", kind: Kind::Str { max_chars: 4096 }, required: false, description: "" };

const ENVS: Param = Param { name: "envs", kind: Kind::StrMap, required: false, description: "" };

const TIMEOUT: Param = Param {
    name: "timeout",
    kind: Kind::Int {
        min: limits::COMMAND_TIMEOUT_MIN_S,
        max: limits::COMMAND_TIMEOUT_MAX_S,
        default: Some(limits::COMMAND_TIMEOUT_DEFAULT_S),
    },
    required: false,
    description: "Seconds.",
};

const MAX_OUTPUT: Param = Param {
    name: "max_output",
    kind: Kind::Int { min: limits::MAX_OUTPUT_MIN, max: limits::MAX_LOG_BYTES as i64, default: Some(limits::MAX_OUTPUT_DEFAULT) },
    required: false,
    description: "Bytes per stream.",
};

pub const RUN: Tool = Tool {
    name: "run_command",
    description: "Run a command and wait; timeout kills its group (exit_code 124). Over max_output, head and tail are kept \
(*_truncated; get_task on task_id reads all). Running after 25 s: state \"running\", follow with get_task.",
    params: &[COMMAND, SANDBOX_ID, CWD, ENVS, TIMEOUT, MAX_OUTPUT],
    // The types of a completed result's fields and of what a program follows a running one by;
    // the rest (offsets, expires_at, warning, message, network_blocked) is the contract's to say.
    output_schema: Some(|| {
        object(&[
            ("state", json!({"type": "string", "enum": ["completed", "running"]})),
            ("exit_code", field("integer|null")),
            ("stdout", field("string")),
            ("stderr", field("string")),
            ("stdout_truncated", field("boolean")),
            ("stderr_truncated", field("boolean")),
            ("stdout_bytes", field("integer")),
            ("stderr_bytes", field("integer")),
            ("timed_out", field("boolean")),
            ("duration_ms", field("integer")),
            ("task_id", field("string")),
            ("sandbox_id", field("string")),
        ])
    }),
    read_only: false,
    destructive: true,
    run,
};

/// The arguments of `run_command`.
pub struct Request<'a> {
    /// The sandbox given, if any.
    pub sandbox_id: Option<&'a str>,
    /// The command line.
    pub command: &'a str,
    /// The working directory given, if any.
    pub cwd: Option<&'a str>,
    /// The call's own environment variables.
    pub envs: BTreeMap<String, String>,
    /// The command's timeout.
    pub timeout: Duration,
    /// Bytes per stream returned inline.
    pub max_output: usize,
}

impl<'a> Request<'a> {
    /// Reads validated arguments of run_command.
    pub fn read(args: &'a Args) -> Result<Request<'a>, ToolError> {
        Ok(Request {
            sandbox_id: args.text(&SANDBOX_ID)?,
            command: args.required_text(&COMMAND)?,
            cwd: args.text(&CWD)?,
            envs: args.map(&ENVS)?,
            timeout: Duration::from_secs(args.integer(&TIMEOUT)?.max(0) as u64),
            max_output: args.integer(&MAX_OUTPUT)?.max(limits::MAX_OUTPUT_MIN) as usize,
        })
    }
}

/// What a run_command came to: the MCP layer maps it to its answer (a plain client gets
/// [`CommandOutcome::answer`]; a 2026-07-28 client with the tasks extension a `CreateTaskResult`
/// for `Running`).
#[derive(Debug)]
pub enum CommandOutcome {
    /// The command ended (or timed out) while the call waited.
    Completed(CommandResult),
    /// The command goes on as a task.
    Running(Box<RunningCommand>),
}

impl CommandOutcome {
    /// run_command's structured result: `completed`, or `running` with the task's handle.
    pub fn answer(&self) -> Value {
        match self {
            CommandOutcome::Completed(done) => done.to_value(),
            CommandOutcome::Running(running) => running.answer(),
        }
    }
}

/// The output of a command, masked.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Output {
    /// Standard output, within the call's `max_output` (head and tail with a marker between).
    pub stdout: String,
    /// Standard error, as stdout.
    pub stderr: String,
    /// Whether stdout was cut inline or went over the 1 MiB cap.
    pub stdout_truncated: bool,
    /// Whether stderr was cut inline or went over the 1 MiB cap.
    pub stderr_truncated: bool,
    /// Bytes of stdout kept (at most 1 MiB).
    pub stdout_bytes: u64,
    /// Bytes of stderr kept (at most 1 MiB).
    pub stderr_bytes: u64,
}

impl Output {
    /// The output of whole (masked) logs returned within `max` bytes per stream; `over_cap` says
    /// which went over the 1 MiB cap. Returns whether a stream was cut inline.
    pub fn capped(stdout: &[u8], stderr: &[u8], over_cap: (bool, bool), max: usize) -> (Output, bool) {
        let (out, out_cut) = inline(stdout, max, "stdout");
        let (err, err_cut) = inline(stderr, max, "stderr");
        let output = Output {
            stdout: out,
            stderr: err,
            stdout_truncated: out_cut || over_cap.0,
            stderr_truncated: err_cut || over_cap.1,
            stdout_bytes: stdout.len() as u64,
            stderr_bytes: stderr.len() as u64,
        };
        (output, out_cut || err_cut)
    }
}

/// `bytes` as text of at most `max` bytes: whole, or its head and tail with a marker between
/// that says where get_task reads what was cut. Cuts fall on UTF-8 character boundaries.
fn inline(bytes: &[u8], max: usize, stream: &str) -> (String, bool) {
    if bytes.len() <= max {
        return (String::from_utf8_lossy(bytes).into_owned(), false);
    }
    let marker = |head: usize, cut: usize| format!("\n[... {cut} bytes cut here; get_task with {stream}_offset={head} reads them ...]\n");
    let room = max.saturating_sub(marker(bytes.len(), bytes.len()).len());
    let continuation = |i: usize| bytes.get(i).is_some_and(|b| b & 0xC0 == 0x80);
    let mut head = room / 2;
    while head > 0 && continuation(head) {
        head -= 1;
    }
    let mut tail = bytes.len() - (room - room / 2);
    while tail < bytes.len() && continuation(tail) {
        tail += 1;
    }
    let mut text = String::from_utf8_lossy(&bytes[..head]).into_owned();
    text.push_str(&marker(head, tail - head));
    text.push_str(&String::from_utf8_lossy(&bytes[tail..]));
    (text, true)
}

/// Makes a run_command result (`structured`, completed or running) whose answer found no room in
/// the server's answer memory (`why`, [`crate::answer_budget::Full::message`]) small enough to
/// need none: each stream's text cut to its head and tail, [`limits::MAX_OUTPUT_DEFAULT`] bytes in
/// all, with a marker where bytes were left out, and a `warning` that says why and where the
/// whole output is (`whole`). The command has run, so its exit code and what fits of its output
/// are worth more to the caller than an error that invites running it again. `false` (and
/// nothing changed) for any other result.
pub fn fit_for_answer(structured: &mut Value, why: &str, whole: &str) -> bool {
    let is_command = matches!(structured["state"].as_str(), Some("completed" | "running"))
        && structured["stdout"].is_string()
        && structured["stderr"].is_string();
    if !is_command {
        return false;
    }
    let max = limits::MAX_OUTPUT_DEFAULT as usize;
    for stream in ["stdout", "stderr"] {
        let Some(text) = structured[stream].as_str() else { continue };
        if text.len() <= max {
            continue;
        }
        let cut = head_and_tail(text, max);
        structured[stream] = Value::String(cut);
        structured[format!("{stream}_truncated")] = Value::Bool(true);
    }
    let note = format!(
        "the output was cut to {max} bytes per stream in this answer because the server had no room for the whole of it ({why}); \
the command ran once and is not to be repeated for its output: {whole}"
    );
    structured["warning"] = Value::String(match structured["warning"].as_str() {
        Some(earlier) => format!("{earlier}; {note}"),
        None => note,
    });
    true
}

/// `text`'s head and tail within about `max` bytes, cut on character boundaries, with a marker
/// between that says how many bytes were left out.
fn head_and_tail(text: &str, max: usize) -> String {
    let marker = |left_out: usize| format!("\n[... {left_out} bytes left out: no room for the whole answer ...]\n");
    let room = max.saturating_sub(marker(text.len()).len());
    let mut head = room / 2;
    while head > 0 && !text.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = text.len() - (room - room / 2);
    while tail < text.len() && !text.is_char_boundary(tail) {
        tail += 1;
    }
    format!("{}{}{}", &text[..head], marker(tail - head), &text[tail..])
}

/// The fields every completed run_command result has (its outputSchema gives types only).
pub const COMPLETED_FIELDS: &[&str] = &[
    "state",
    "exit_code",
    "stdout",
    "stderr",
    "stdout_truncated",
    "stderr_truncated",
    "stdout_bytes",
    "stderr_bytes",
    "timed_out",
    "duration_ms",
];

/// run_command's result for a command that ended: the one builder of that shape (a plain call,
/// the end observed inside the sandbox, and a protocol task's result).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CommandResult {
    /// Always `completed`.
    pub state: &'static str,
    /// The exit status; 124 when the timeout killed it.
    pub exit_code: i64,
    /// What it printed.
    #[serde(flatten)]
    pub output: Output,
    /// Whether the timeout killed it.
    pub timed_out: bool,
    /// Wall time, in milliseconds.
    pub duration_ms: u64,
    /// When the output was cut inline: the finished task that holds all of it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// The sandbox of `task_id`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox_id: Option<String>,
    /// Why output that was cut inline could not be kept for get_task.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
    /// Connections the sandbox's egress proxy refused while the command ran.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub network_blocked: Vec<crate::egress::blocks::Block>,
}

impl CommandResult {
    /// The result of an execution that ended, whose output masked is `stdout` and `stderr`,
    /// returned within `max` bytes per stream; and whether a stream was cut inline.
    pub fn of_exec(out: &ExecOutput, stdout: &[u8], stderr: &[u8], max: usize) -> (CommandResult, bool) {
        let (output, cut) = Output::capped(stdout, stderr, (out.stdout_truncated, out.stderr_truncated), max);
        let result = CommandResult {
            state: "completed",
            exit_code: i64::from(if out.timed_out { TIMED_OUT_EXIT_CODE } else { out.exit_code }),
            output,
            timed_out: out.timed_out,
            duration_ms: out.duration.as_millis() as u64,
            task_id: None,
            sandbox_id: None,
            warning: None,
            network_blocked: Vec::new(),
        };
        (result, cut)
    }

    /// The result of a task that ended (`s`), with its whole logs `stdout` and `stderr` (masked
    /// inside the sandbox); its duration from the task's own start and end.
    pub fn of_task(s: &Snapshot, stdout: &[u8], stderr: &[u8]) -> CommandResult {
        let timed_out = s.state == TaskState::TimedOut;
        let duration_ms = match (s.started_at, s.finished_at) {
            (Some(a), Some(b)) => (b - a).max(0) as u64 * 1000,
            _ => 0,
        };
        CommandResult {
            state: "completed",
            exit_code: if timed_out { i64::from(TIMED_OUT_EXIT_CODE) } else { s.exit_code.unwrap_or(-1) },
            output: Output {
                stdout: String::from_utf8_lossy(stdout).into_owned(),
                stderr: String::from_utf8_lossy(stderr).into_owned(),
                stdout_truncated: s.stdout_truncated,
                stderr_truncated: s.stderr_truncated,
                stdout_bytes: s.stdout_bytes.max(stdout.len() as u64),
                stderr_bytes: s.stderr_bytes.max(stderr.len() as u64),
            },
            timed_out,
            duration_ms,
            task_id: None,
            sandbox_id: None,
            warning: None,
            network_blocked: Vec::new(),
        }
    }

    /// As run_command's structured result.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or_else(|e| json!({"state": "completed", "error": format!("internal error: {e}")}))
    }
}

/// A run_command that goes on as a task.
#[derive(Debug, Clone)]
pub struct RunningCommand {
    /// Its task.
    pub task: TaskHandle,
    /// Its output so far, masked, within `max_output` (none for a task asked for at once).
    pub output: Output,
    /// Where get_task reads on: the bytes of each log so far.
    pub next_offsets: (u64, u64),
    /// How long it has run.
    pub duration: Duration,
    /// The task as last observed, without its logs (`output` holds them). Its state is
    /// `running`, except for a task asked for at once ([`start_as_task`]), which may already be
    /// over, or unknown when its start could not be confirmed.
    pub task_state: Snapshot,
}

/// run_command's result for a command that goes on as a task: the one builder of that shape.
#[derive(Debug, Serialize)]
struct RunningAnswer<'a> {
    state: &'static str,
    exit_code: Option<i64>,
    #[serde(flatten)]
    output: &'a Output,
    stdout_next_offset: u64,
    stderr_next_offset: u64,
    timed_out: bool,
    duration_ms: u64,
    task_id: &'a str,
    sandbox_id: &'a str,
    message: String,
}

impl RunningCommand {
    /// The plain `running` answer: the output so far, the task's handle and what to do next.
    pub fn answer(&self) -> Value {
        let TaskHandle { sandbox_id, task_id } = &self.task;
        let message = format!(
            "The command is still running, now as background task {task_id} in sandbox {sandbox_id}. Call get_task with this task_id \
and sandbox_id, the *_next_offset values as offsets, until \"exit\" and wait (up to 60 seconds per call) for its further output \
and its exit code, or cancel_task to stop it."
        );
        let answer = RunningAnswer {
            state: "running",
            exit_code: None,
            output: &self.output,
            stdout_next_offset: self.next_offsets.0,
            stderr_next_offset: self.next_offsets.1,
            timed_out: false,
            duration_ms: self.duration.as_millis() as u64,
            task_id,
            sandbox_id,
            message,
        };
        serde_json::to_value(answer).unwrap_or_else(|e| json!({"state": "running", "error": format!("internal error: {e}")}))
    }

    /// A command whose output so far (`stdout`, `stderr`, masked with `masker`) and state were
    /// observed in `s`; its output returned within `max` bytes per stream.
    fn observed(sandbox_id: &str, mut s: Snapshot, duration: Duration, masker: &Masker, max: usize) -> RunningCommand {
        let stdout = masker.mask_bytes(&s.stdout);
        let stderr = masker.mask_bytes(&s.stderr);
        let (output, _) = Output::capped(&stdout, &stderr, (s.stdout_truncated, s.stderr_truncated), max);
        let next_offsets = (stdout.len() as u64, stderr.len() as u64);
        s.stdout = Vec::new();
        s.stderr = Vec::new();
        RunningCommand {
            task: TaskHandle { sandbox_id: sandbox_id.to_string(), task_id: s.task_id.clone() },
            output,
            next_offsets,
            duration,
            task_state: s,
        }
    }
}

/// Keeps the whole (masked) output of a command that ended as a finished task in its sandbox,
/// so that get_task reads by offset what run_command cut inline: the task directory the
/// supervisor's snippets read (src/supervisor/mod.rs, "Task directory" and "The state file"),
/// written with the provider's file writes. The state file comes last: until then the
/// directory reads as no task.
fn keep_output(
    ctx: &Ctx<'_>,
    sandbox_id: &str,
    (command, timeout): (&str, Duration),
    out: &ExecOutput,
    result: &CommandResult,
    logs: (&[u8], &[u8]),
) -> Result<String, ToolError> {
    let provider = ctx.app.provider.as_ref();
    let deadline = Instant::now() + Duration::from_secs(30);
    // A kept output is a task directory like any other: it counts against the sandbox's limit.
    let held = match provider.list_dir(sandbox_id, TASKS_DIR, limits::MAX_TASKS + 1, deadline) {
        Ok((entries, _)) => entries.iter().filter(|e| ids::is_task_id(&e.name)).count(),
        Err(_) => 0,
    };
    if held >= limits::MAX_TASKS {
        return Err(ToolError::new(format!(
            "the sandbox already holds {} task directories, the limit: delete finished tasks with delete_task (list_tasks shows \
them), or pass a larger max_output",
            limits::MAX_TASKS
        )));
    }
    let task_id = ids::task_id();
    let dir = format!("{TASKS_DIR}/{task_id}");
    provider.write_file(sandbox_id, &format!("{dir}/stdout.log"), logs.0, deadline)?;
    provider.write_file(sandbox_id, &format!("{dir}/stderr.log"), logs.1, deadline)?;
    provider.write_file(sandbox_id, &format!("{dir}/cmd"), command.as_bytes(), deadline)?;
    let finished = unix_now();
    let started = finished - (result.duration_ms / 1000) as i64;
    let status = if result.timed_out { supervisor::status_values::TIMED_OUT } else { supervisor::status_values::EXITED };
    let flag = |b: bool| if b { 1 } else { 0 };
    let state = format!(
        "status={status}\ntimeout={}\nstarted_at={started}\nfinished_at={finished}\nexit_code={}\nerror=\nescaped=0\nout_bytes={}\nerr_bytes={}\nout_truncated={}\nerr_truncated={}\n.\n",
        timeout.as_secs().max(1),
        result.exit_code,
        logs.0.len(),
        logs.1.len(),
        flag(out.stdout_truncated),
        flag(out.stderr_truncated),
    );
    provider.write_file(sandbox_id, &format!("{dir}/state"), state.as_bytes(), deadline)?;
    Ok(task_id)
}

fn run(ctx: &Ctx<'_>, args: &Args) -> Result<Reply, ToolError> {
    let outcome = run_command(ctx, args)?;
    let mut answer = outcome.answer();
    let sandbox_id = match &outcome {
        CommandOutcome::Running(running) => Some(running.task.sandbox_id.clone()),
        CommandOutcome::Completed(_) => super::target_sandbox(ctx, args.text(&SANDBOX_ID)?).ok(),
    };
    let task_ends = match &outcome {
        CommandOutcome::Running(running) => {
            let left = Request::read(args)?.timeout.saturating_sub(running.duration);
            Some(unix_now() + left.as_secs() as i64)
        }
        CommandOutcome::Completed(_) => None,
    };
    if let Some(id) = sandbox_id {
        super::stamp_expiry(ctx.app.provider.as_ref(), &id, task_ends, &mut answer);
    }
    Ok(Reply::Now(answer))
}

/// Runs run_command: to its end, or, when it may outlive `--task-after`, as the provider keeps
/// long commands ([`Provider::long_commands`]; ARCHITECTURE.md, "Long run_command calls") until it
/// goes on as a task at that threshold.
pub fn run_command(ctx: &Ctx<'_>, args: &Args) -> Result<CommandOutcome, ToolError> {
    let Request { sandbox_id, command, cwd, envs, timeout, max_output } = Request::read(args)?;
    let id = super::target_sandbox(ctx, sandbox_id)?;
    let provider = &ctx.app.provider;
    let masker = provider.env_masker(&id, &envs)?;
    let started = Instant::now();
    let started_ms = crate::egress::blocks::now_ms();
    let after = ctx.app.config.task_after;
    let may_outlive = !after.is_zero() && timeout > after;
    let req = ExecRequest {
        argv: provider.shell(command),
        envs,
        cwd: cwd.map(str::to_string),
        output_cap: limits::MAX_LOG_BYTES,
        deadline: started + timeout,
        cancel: Some(ctx.cancel.clone()),
    };
    let out = match provider.long_commands() {
        // A command that must end before the threshold never becomes a task, and pays nothing.
        _ if !may_outlive => provider.exec(&id, &req, Touch::Renew)?,
        LongCommands::Adopt(adopter) => {
            let task_id = adopter.task_id(&id, &req, command);
            let adopt = |adoption: &Adoption<'_>| supervisor::Call::Adopt(*adoption).argv(provider.as_ref());
            let promotion = Promotion {
                at: started + after,
                task_id: &task_id,
                command,
                timeout,
                masker: &masker,
                adopter: &adopt,
                kill_grace: supervisor::snippet::TIMEOUT_KILL_GRACE,
            };
            match adopter.exec_or_promote(&id, &req, Touch::Renew, &promotion)? {
                ExecEnd::Done(out) => out,
                ExecEnd::Promoted(out) => {
                    // The task outlives the session, like start_task's.
                    ctx.session.retain(&id);
                    let so_far = Snapshot {
                        state: TaskState::Running,
                        error: None,
                        started_at: Some(unix_now() - out.duration.as_secs() as i64),
                        stdout: out.stdout,
                        stderr: out.stderr,
                        stdout_truncated: out.stdout_truncated,
                        stderr_truncated: out.stderr_truncated,
                        ..Snapshot::unconfirmed(&task_id, timeout.as_secs().max(1) as i64, String::new())
                    };
                    let running = RunningCommand::observed(&id, so_far, out.duration, &masker, max_output);
                    return Ok(CommandOutcome::Running(Box::new(running)));
                }
            }
        }
        LongCommands::SuperviseFromStart => {
            let task_id = ids::task_id();
            let launch = Launch {
                task_id: &task_id,
                timeout: timeout.as_secs() as i64,
                cwd,
                command,
                page_limit: limits::MAX_LOG_BYTES as u64,
                wait: after.as_secs(),
                input: None,
            };
            match supervised(ctx, &id, launch, &req.envs, started)? {
                Supervised::Ended(out) => out,
                Supervised::Running(snap) => {
                    let running = RunningCommand::observed(&id, snap, started.elapsed(), &masker, max_output);
                    return Ok(CommandOutcome::Running(Box::new(running)));
                }
                Supervised::Refused => provider.exec(&id, &req, Touch::Renew)?,
            }
        }
    };
    if ctx.cancel.load(Ordering::Relaxed) {
        if ctx.app.is_draining() {
            return Err(ToolError::new("the server is shutting down; the command was stopped before it finished"));
        }
        return Err(ToolError::new("the request was cancelled; the command was stopped"));
    }
    let (stdout, stderr) = (masker.mask_bytes(&out.stdout), masker.mask_bytes(&out.stderr));
    let (mut result, cut) = CommandResult::of_exec(&out, &stdout, &stderr, max_output);
    result.network_blocked = provider.network_blocked(&id, started_ms);
    if cut {
        // What was cut stays readable by offset; a sandbox that refuses the write loses only that.
        match keep_output(ctx, &id, (command, timeout), &out, &result, (&stdout, &stderr)) {
            Ok(task_id) => {
                result.task_id = Some(task_id);
                result.sandbox_id = Some(id);
            }
            Err(err) => result.warning = Some(format!("the output was cut inline and not kept for get_task: {}", err.message)),
        }
    }
    Ok(CommandOutcome::Completed(result))
}

/// Why a run_command asked for as a task at once did not start.
#[derive(Debug)]
pub enum TaskStartError {
    /// Nothing was started: the arguments, the sandbox or the start request were refused.
    Refused(ToolError),
    /// The provider failed before the task could start.
    Failed(ToolError),
}

/// Starts run_command's command as a task at once (a 2025-11-25 task-augmented call) with the
/// one task start, and returns it as it was when the start answered (it may already be over).
/// `envs` is refused: a task's logs would not mask the values of the call's own secret-named
/// variables.
pub fn start_as_task(ctx: &Ctx<'_>, args: &Args) -> Result<RunningCommand, TaskStartError> {
    let Request { sandbox_id, command, cwd, envs, timeout, .. } = Request::read(args).map_err(TaskStartError::Refused)?;
    if !envs.is_empty() {
        return Err(TaskStartError::Refused(ToolError::new(
            "envs is not supported when run_command runs as a task; export the variables in the command, or create the sandbox with them (its secrets are masked)",
        )));
    }
    let sandbox_id = super::target_sandbox(ctx, sandbox_id).map_err(TaskStartError::Refused)?;
    let task_id = ids::task_id();
    let timeout = timeout.as_secs().max(1) as i64;
    let launch = Launch { task_id: &task_id, timeout, cwd, command, page_limit: 1, wait: 0, input: None };
    let started = Instant::now();
    let none = BTreeMap::new();
    let snapshot = match start_task(ctx, &sandbox_id, launch, StartMode::AtOnce(&none)) {
        Ok(TaskStart::Observed(s)) => s,
        Ok(TaskStart::Refused(msg)) => return Err(TaskStartError::Refused(ToolError::new(msg))),
        Ok(TaskStart::Unconfirmed(err)) => {
            Snapshot::unconfirmed(&task_id, timeout, format!("the start could not be confirmed ({err}); tasks/get tells whether it runs"))
        }
        Err(err) => return Err(TaskStartError::Failed(err.into())),
    };
    let mut running = RunningCommand::observed(&sandbox_id, snapshot, started.elapsed(), &Masker::default(), limits::MAX_LOG_BYTES);
    // The start reads one byte of each log: nothing worth calling output.
    running.output = Output::default();
    running.next_offsets = (0, 0);
    Ok(running)
}

/// How a command started under the supervisor came back.
enum Supervised {
    /// It ended within `--task-after` (its task directory is gone): the output as run_command's.
    Ended(ExecOutput),
    /// It goes on as its task: the task with the output so far.
    Running(Snapshot),
    /// Nothing was started (the request would be too large, the sandbox refused the start):
    /// run it the plain way.
    Refused,
}

/// Runs `launch` under the supervisor, waiting for its end inside the sandbox for `launch.wait`
/// seconds (one request; `supervisor::run`), with the command's own variables `envs` in the
/// environment of the supervisor (whose masker then masks their secret-named values) and of the
/// command.
fn supervised(
    ctx: &Ctx<'_>,
    id: &str,
    launch: Launch<'_>,
    envs: &BTreeMap<String, String>,
    started: Instant,
) -> Result<Supervised, ToolError> {
    let provider = ctx.app.provider.as_ref();
    let task_id = launch.task_id;
    let snap = match start_task(ctx, id, launch, StartMode::WaitInside(envs))? {
        TaskStart::Observed(snap) => snap,
        TaskStart::Refused(_) => return Ok(Supervised::Refused),
        TaskStart::Unconfirmed(err) => {
            ctx.session.retain(id);
            return Err(ToolError::new(format!(
                "the command was started as background task {task_id} in sandbox {id}, but its answer was lost ({err}); \
get_task with this task_id and sandbox_id tells its state and output"
            )));
        }
    };
    let target = Target { provider, sandbox_id: id };
    let out = ExecOutput {
        exit_code: snap.exit_code.unwrap_or(-1).clamp(i32::MIN as i64, i32::MAX as i64) as i32,
        stdout: snap.stdout.clone(),
        stderr: snap.stderr.clone(),
        stdout_truncated: snap.stdout_truncated,
        stderr_truncated: snap.stderr_truncated,
        timed_out: snap.state == TaskState::TimedOut,
        duration: started.elapsed(),
    };
    match snap.state {
        TaskState::Running if ctx.cancel.load(Ordering::Relaxed) && !ctx.app.is_draining() => {
            // The caller gave up on it: stop it and leave nothing behind, as a plain command.
            let all = Window { stdout_offset: 0, stderr_offset: 0, limit: 0 };
            let _ = supervisor::cancel(&target, task_id, all);
            let _ = supervisor::delete(&target, task_id);
            Ok(Supervised::Ended(out))
        }
        TaskState::Running => {
            // The task outlives the session, like start_task's (also when the server is
            // shutting down: the caller then gets its handle).
            ctx.session.retain(id);
            Ok(Supervised::Running(snap))
        }
        TaskState::Succeeded | TaskState::TimedOut => Ok(Supervised::Ended(out)),
        TaskState::Failed if snap.exit_code.is_some() => Ok(Supervised::Ended(out)),
        TaskState::Failed => Err(ToolError::new(snap.error.unwrap_or_else(|| "the command could not be started".into()))),
        TaskState::Cancelled => Err(ToolError::new(format!("the command was stopped by cancel_task (task {task_id} in sandbox {id})"))),
        TaskState::Unknown => {
            ctx.session.retain(id);
            let why = snap.error.unwrap_or_else(|| "its supervisor did not report".into());
            Err(ToolError::new(format!(
                "the command's outcome cannot be observed: {why}. It ran as background task {task_id} in sandbox {id}; get_task with \
this task_id and sandbox_id reads its logs"
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::args::samples;

    /// A result without room keeps its exit code, each stream's head and tail within the default
    /// output size (cut on character boundaries), and says why; other results are left alone.
    #[test]
    fn a_command_result_is_made_to_fit_and_others_are_left_alone() {
        let big = format!("{}é{}", "a".repeat(40_000), "z".repeat(40_000));
        let mut result = json!({"state": "completed", "exit_code": 3, "stdout": big, "stderr": "short",
            "stdout_truncated": false, "stderr_truncated": false, "warning": "earlier"});
        assert!(fit_for_answer(&mut result, "no room now", "read it elsewhere"));
        let out = result["stdout"].as_str().unwrap();
        assert!(out.len() <= limits::MAX_OUTPUT_DEFAULT as usize, "{}", out.len());
        assert!(out.starts_with('a') && out.ends_with('z') && out.contains("bytes left out"), "{out}");
        assert_eq!((result["stdout_truncated"].clone(), result["stderr_truncated"].clone()), (json!(true), json!(false)));
        assert_eq!(result["stderr"], "short");
        assert_eq!(result["exit_code"], 3);
        let warning = result["warning"].as_str().unwrap();
        assert!(warning.starts_with("earlier; ") && warning.contains("no room now") && warning.ends_with("read it elsewhere"), "{warning}");
        // A multi-byte character at the cut stays whole.
        let wide = "é".repeat(20_000);
        assert!(head_and_tail(&wide, 1001).chars().all(|c| c == 'é' || c.is_ascii()));
        for other in [json!({"path": "f", "content": "x"}), json!({"state": "succeeded", "stdout": 1, "stderr": ""})] {
            let mut same = other.clone();
            assert!(!fit_for_answer(&mut same, "no room", "elsewhere"));
            assert_eq!(same, other);
        }
    }

    #[test]
    fn reads_only_declared_arguments() {
        for args in samples(RUN.name, RUN.params) {
            let req = Request::read(&args).unwrap();
            assert_eq!(req.command, "a");
        }
    }
}
