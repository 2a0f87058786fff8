//! The task supervisor: POSIX-shell snippets embedded in the binary (`*.sh`, `mask.awk`) that run
//! inside the sandbox through the provider's `exec`, and the Rust side that builds their argv
//! ([`snippet`]) and parses what they print (this file).
//!
//! # Arguments
//!
//! Each snippet runs as `SH -c PROGRAM sh ARG...`; [`Call::argv`] is the one place that orders
//! the arguments. `start` and `supervise` share theirs in the same order (task, timeout, task
//! shell, cwd, command).
//!
//! | Snippet     | `$1`, `$2`, ...                                                          |
//! |-------------|---------------------------------------------------------------------------|
//! | `start`     | ID TIMEOUT TASK_SHELL CWD COMMAND SUPERVISE_PROGRAM SH PAGE_LIMIT WAIT INPUT |
//! | `start` (adopt) | `adopt` ID TIMEOUT LEFT PGID OUT_PRE ERR_PRE OUT_TRUNC ERR_TRUNC STARTED_AT COMMAND SUPERVISE_PROGRAM SH |
//! | `supervise` | `supervise` DIR TIMEOUT TASK_SHELL CWD COMMAND WAIT INPUT SH (passed on by `start.sh`) |
//! | `supervise` (adopt) | `adopt` DIR TIMEOUT LEFT PGID OUT_PRE ERR_PRE STARTED_AT (passed on by `start.sh`) |
//! | `status`    | ID OUT_OFFSET ERR_OFFSET LIMIT                                             |
//! | `cancel`    | ID OUT_OFFSET ERR_OFFSET LIMIT                                             |
//! | `list`      | (none)                                                                     |
//! | `delete`    | ID                                                                         |
//! | `resize`    | ID ROWS COLS                                                               |
//! | `input`     | ID EOF DATA (EOF `1` closes the input; DATA in printf `%b` form)          |
//!
//! CWD is empty for the sandbox user's home. INPUT is empty (stdin is `/dev/null`), `stdin`, or
//! `pty ROWS COLS` (see "Input" below). Constants shared with the Rust side arrive as a
//! generated preamble of `NAME=value` lines ([`Snippet::constants`]): `MAX_TASKS` (start),
//! `LOG_CAP` and `TERM_GRACE_CS` (supervise), `CANCEL_KILL_CS` and `CANCEL_WAIT_CS` (cancel),
//! `CLAIM_FRESH_CS` (delete), `INPUT_WAIT_S` (input); the masker gets `min_len` from a generated `BEGIN`.
//!
//! # Task directory
//!
//! `$HOME/.sandbox-mcp/tasks/ID/` holds `state`, `cmd`, `stdout.log`, `stderr.log`,
//! `supervisor.err`, `escaped.list` (the escapee scan's finds), `exit_code` (an adopted command's
//! exit status, written by its shell's `EXIT` trap or by the server that reaped it), and markers: `cancel`
//! (cancel_task asked), `timed_out`, `done` (the task exited), `out.*`/`err.*` (the output pumps:
//! `.meta` ("written dropped", written `-` when only the log's size says), `.dd` (a copier's
//! report), `.full` (the size of a log filled to the cap, written before `.trunc`, so that readers
//! need no `wc` for it), `.trunc`, `.wfail`, and `.fifo` only where the shell keeps here-documents in files, see
//! Starting). The tasks directory itself holds the tools each user's first task chose for the pumps
//! (`.pump-gnu`, `.pump-bytes` or `.pump-slow`; `.awk-mawk` or `.awk-plain`).
//!
//! # Input
//!
//! A task started with INPUT has, in its directory, `input` (the INPUT word and size), the FIFO
//! `stdin` (the task's stdin; for a pty, script(1)'s, which types it into the terminal) and the
//! FIFO `stdin.eof`. A holder subshell of the supervisor keeps `stdin` open read-write, so that
//! the task sees no end of input between two writers, until a writer opens and closes
//! `stdin.eof` (send_input's `eof`, or the supervisor once the task has ended); it then writes
//! `stdin.closed`. The server writes both FIFOs from outside, never through a symbolic link and
//! never blocking (`provider::InputChannel`). A pty task's wrapper (`PTY_WRAP`) writes `pty`:
//! its pid (the leader of the terminal's session) and its terminal, which `resize.sh` checks
//! against `/proc` before it uses them.
//!
//! # Starting
//!
//! `start.sh` checks what it can with builtins (setsid exists, the cwd), then runs two things at
//! once, as a pipeline inside a command substitution: the claim (count, `mkdir` the directory,
//! write the claim, count again) and the supervisor, started with `setsid` and reading the claim's
//! one line (`go`, or an `@error` it passes on as the answer and starts nothing). Until that line,
//! the supervisor only does what needs no directory: it reads its own identity and makes the
//! task's two output pipes (a here-document reopened read-write through `/proc/self/fd`: no
//! process; a shell that keeps here-documents in files gets FIFOs from `mkfifo` instead). Then it
//! starts the task under `setsid`, confirms that the task leads its own process group (signal 0 to
//! the group, one system call per look, no sleep), saves `running` and prints the snapshot on the
//! substitution's pipe, which it then closes: reading that pipe to its end is start.sh's whole wait
//! (no polling, no watch), and start.sh prints what it read. A task that has already ended by then
//! is finished first and start.sh reads its end, so a quick command comes back with it. The pumps
//! and the timer start after that answer, once start.sh has exited (the supervisor reads, blocked,
//! a pipe that only start.sh holds open for writing), so that they do not compete with passing
//! the answer on.
//!
//! With a `WAIT` other than 0 (`start.sh`'s `run`: a run_command on a provider that cannot hand a
//! running command over, [`run`]) the supervisor answers later and in one line, on a pipe of
//! which start.sh holds only the read end: `@over` once the final state is saved, or `@wait`
//! from its timer after `WAIT` seconds (or nothing, if it dies: the pipe closes). start.sh then
//! prints the snapshot with the whole logs and removes the directory of a task that has ended.
//!
//! `start.sh adopt` (a run_command promoted at `--task-after`) claims the directory with the same
//! `claim`, before its supervisor starts rather than beside it (no start_task waits on it), then
//! moves in the output the server captured before (staged as `tasks/.adopt-ID.stdout.log` and `.stderr.log`),
//! and starts the supervisor's `adopt` mode with the command's pipes on fds 7 and 8: the same
//! pumps (capped at what is left of `LOG_CAP`), timer (what is left of the timeout), `finish` and
//! `save`; the end is the command's leader leaving, polled, and the exit code is read from
//! `exit_code` (none: `exited` without a code, which reads as unknown). Both adopt modes live in
//! their own files (`start-adopt.sh`, `supervise-adopt.sh`), sent at the `# @adopt` line of
//! `start.sh` and `supervise.sh` only in an adoption's programs ([`Snippet::adopt_source`]).
//!
//! # The state file
//!
//! `state` holds blocks of `key=value` lines, one value per line, each block ending with a `.`
//! line. `start.sh` writes the claim; after that only the supervisor writes it, appending whole
//! blocks (no rename, no process). `read_state` in `inspect.sh` loads each key of the last complete
//! block into `S_<key>` (a block still being appended is ignored; a file without `.` lines, from
//! an older version, is one block).
//!
//! | Key             | Meaning                                                              |
//! |-----------------|-----------------------------------------------------------------------|
//! | `status`        | `claimed`, `running`, or final: `exited`, `failed_to_start`, `timed_out`, `cancelled` |
//! | `claimed_cs`    | uptime in 1/100 s when start.sh claimed the directory (claim only)    |
//! | `boot_id`       | the kernel's boot id when the supervisor started                      |
//! | `sup_pid`, `sup_start` | the supervisor's pid and its start time (field 22 of `/proc/PID/stat`) |
//! | `pgid`, `task_start`   | the task's process group (its leader's pid) and the leader's start time |
//! | `timeout`       | seconds                                                               |
//! | `started_at`, `finished_at` | Unix seconds                                              |
//! | `exit_code`     | the task's exit status once it ended                                  |
//! | `error`         | why the outcome is incomplete (one line)                              |
//! | `escaped`       | processes outside the task's group killed by the tag scan             |
//! | `out_bytes`, `err_bytes` | bytes saved per log (final states only)                      |
//! | `out_truncated`, `err_truncated` | `1` when a log went over the cap (final states only) |
//!
//! # Answers
//!
//! `start`, `status`, `cancel`, `list` and `delete` print one block per task: `@task ID`, then
//! the keys of [`key`], then `@end`. `start`, `status` and `cancel` then print the stdout page on
//! stdout and the stderr page on stderr. Other words: `@none` (no such task), `@error KIND
//! MESSAGE` (start refused), `@refused` and `@deleted` (delete), `@done` (end of the list).
//!
//! | Key in `@task` | From                                                                  |
//! |----------------|------------------------------------------------------------------------|
//! | `status`, `exit_code`, `started_at`, `finished_at`, `timeout`, `error`, `escaped` | the state file |
//! | `live`         | `1`: the supervisor is alive; `0`: it is gone; `-`: not asked (final) |
//! | `group`        | when `live` is `0`: `1` if the task's processes still run             |
//! | `out_size`, `err_size` | bytes saved per log (not in `list` and `delete`)               |
//! | `out_truncated`, `err_truncated` | as in the state file (not in `list` and `delete`)    |
//! | `cmd_hex`      | the first 800 bytes of `cmd`, in hex (`list` only)                    |

use crate::limits;
use crate::provider::{ExecOutput, ExecRequest, InputError, Provider, ProviderError, Touch};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

pub mod snippet;

pub use snippet::{mask_awk, Call, Launch, Snippet, TaskInput};

/// The keys of an `@task` block that [`parse_answer`] and [`parse_list`] read (the table in the
/// module doc says what each means).
pub mod key {
    /// The recorded status (see [`super::status_values`]).
    pub const STATUS: &str = "status";
    /// Exit status.
    pub const EXIT_CODE: &str = "exit_code";
    /// Unix seconds.
    pub const STARTED_AT: &str = "started_at";
    /// Unix seconds.
    pub const FINISHED_AT: &str = "finished_at";
    /// Seconds.
    pub const TIMEOUT: &str = "timeout";
    /// Why the outcome is incomplete.
    pub const ERROR: &str = "error";
    /// Processes killed by the tag scan.
    pub const ESCAPED: &str = "escaped";
    /// Whether the supervisor is alive.
    pub const LIVE: &str = "live";
    /// Whether the task's processes still run without it.
    pub const GROUP: &str = "group";
    /// Bytes of stdout saved.
    pub const OUT_SIZE: &str = "out_size";
    /// Bytes of stderr saved.
    pub const ERR_SIZE: &str = "err_size";
    /// Whether stdout went over the cap.
    pub const OUT_TRUNCATED: &str = "out_truncated";
    /// Whether stderr went over the cap.
    pub const ERR_TRUNCATED: &str = "err_truncated";
    /// The start of the task's command, hex-encoded (`list` only).
    pub const CMD_HEX: &str = "cmd_hex";
}

/// The values of the `status` key.
pub mod status_values {
    /// start.sh claimed the directory; the supervisor has not reported yet.
    pub const CLAIMED: &str = "claimed";
    /// Read like `running`; the current snippets never write it.
    pub const STARTING: &str = "starting";
    /// The task runs.
    pub const RUNNING: &str = "running";
    /// The task exited (with `exit_code`).
    pub const EXITED: &str = "exited";
    /// The command could not be started.
    pub const FAILED_TO_START: &str = "failed_to_start";
    /// Stopped by its timeout.
    pub const TIMED_OUT: &str = "timed_out";
    /// Stopped by cancel_task.
    pub const CANCELLED: &str = "cancelled";
}

/// How long one snippet may run (start and cancel wait inside the sandbox for a few seconds).
const SNIPPET_BUDGET: Duration = Duration::from_secs(30);

/// The state of a task as tools report it (docs/contract.md, "States").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskState {
    /// Still running, supervisor alive.
    Running,
    /// Exited 0.
    Succeeded,
    /// Non-zero exit, or the command could not be started.
    Failed,
    /// Stopped by cancel_task.
    Cancelled,
    /// Stopped by its timeout.
    TimedOut,
    /// The truth cannot be observed.
    Unknown,
}

impl TaskState {
    /// Wire name.
    pub fn name(self) -> &'static str {
        match self {
            TaskState::Running => "running",
            TaskState::Succeeded => "succeeded",
            TaskState::Failed => "failed",
            TaskState::Cancelled => "cancelled",
            TaskState::TimedOut => "timed_out",
            TaskState::Unknown => "unknown",
        }
    }

    /// Whether the state can no longer change.
    pub fn is_final(self) -> bool {
        !matches!(self, TaskState::Running | TaskState::Unknown)
    }
}

/// One task as reported to tools, without the sandbox id (docs/contract.md, "The task snapshot").
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// The task id.
    pub task_id: String,
    /// Derived state.
    pub state: TaskState,
    /// Exit code, when observed.
    pub exit_code: Option<i64>,
    /// Unix seconds.
    pub started_at: Option<i64>,
    /// Unix seconds.
    pub finished_at: Option<i64>,
    /// Task timeout in seconds.
    pub timeout: Option<i64>,
    /// The stdout page.
    pub stdout: Vec<u8>,
    /// The stderr page.
    pub stderr: Vec<u8>,
    /// Offset after the stdout page.
    pub stdout_next_offset: u64,
    /// Offset after the stderr page.
    pub stderr_next_offset: u64,
    /// Bytes saved so far.
    pub stdout_bytes: u64,
    /// Bytes saved so far.
    pub stderr_bytes: u64,
    /// Whether stdout went over the cap.
    pub stdout_truncated: bool,
    /// Whether stderr went over the cap.
    pub stderr_truncated: bool,
    /// Why the state is unknown or failed without an exit code.
    pub error: Option<String>,
    /// Processes outside the task's group that were killed by the tag scan.
    pub escaped: u64,
    /// The start of the task's command (`list` only).
    pub command: Option<String>,
}

impl Snapshot {
    /// The snapshot of a task whose start could not be confirmed.
    pub fn unconfirmed(task_id: &str, timeout: i64, error: String) -> Snapshot {
        Snapshot {
            task_id: task_id.to_string(),
            state: TaskState::Unknown,
            exit_code: None,
            started_at: None,
            finished_at: None,
            timeout: Some(timeout),
            stdout: Vec::new(),
            stderr: Vec::new(),
            stdout_next_offset: 0,
            stderr_next_offset: 0,
            stdout_bytes: 0,
            stderr_bytes: 0,
            stdout_truncated: false,
            stderr_truncated: false,
            error: Some(error),
            escaped: 0,
            command: None,
        }
    }
}

/// Which part of the logs to return.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    /// Start of the stdout page.
    pub stdout_offset: u64,
    /// Start of the stderr page.
    pub stderr_offset: u64,
    /// Bytes per stream.
    pub limit: u64,
}

/// Everything a snippet needs to reach one sandbox.
pub struct Target<'a> {
    /// The provider.
    pub provider: &'a dyn Provider,
    /// The sandbox.
    pub sandbox_id: &'a str,
}

impl Target<'_> {
    fn call(&self, call: Call<'_>) -> Result<ExecOutput, ProviderError> {
        self.run(call.argv(self.provider))
    }

    fn run(&self, argv: Vec<String>) -> Result<ExecOutput, ProviderError> {
        self.run_with(argv, &BTreeMap::new())
    }

    /// [`Target::run`] with the variables `envs` in the snippet's environment.
    fn run_with(&self, argv: Vec<String>, envs: &BTreeMap<String, String>) -> Result<ExecOutput, ProviderError> {
        self.run_until(argv, envs, Instant::now() + SNIPPET_BUDGET)
    }

    /// [`Target::run_with`] that ends by `deadline` (at most [`SNIPPET_BUDGET`] from now).
    fn run_until(&self, argv: Vec<String>, envs: &BTreeMap<String, String>, deadline: Instant) -> Result<ExecOutput, ProviderError> {
        let now = Instant::now();
        let deadline = deadline.min(now + SNIPPET_BUDGET);
        let req = ExecRequest { argv, envs: envs.clone(), cwd: None, output_cap: limits::MAX_LOG_BYTES, deadline, cancel: None };
        let out = self.provider.exec(self.sandbox_id, &req, Touch::Observe)?;
        if out.timed_out {
            return Err(ProviderError::Timeout { what: "the supervisor snippet".into(), after: deadline.saturating_duration_since(now) });
        }
        Ok(out)
    }
}

/// What `start` observed.
pub enum Started {
    /// The supervisor answered (the task may already be finished).
    Observed(Box<Snapshot>),
    /// The sandbox refused before anything ran (limit, missing cwd, ...).
    Refused(String),
}

/// The argv of a start request, checked before any connection: `Err` with its size once
/// encoded when that is over [`limits::MAX_SANDBOX_REQUEST_BYTES`].
pub fn start_argv(provider: &dyn Provider, launch: Launch<'_>) -> Result<Vec<String>, usize> {
    let argv = Call::Start(launch).argv(provider);
    let encoded = serde_json::to_string(&argv).map(|s| s.len()).unwrap_or(usize::MAX);
    if encoded > limits::MAX_SANDBOX_REQUEST_BYTES {
        return Err(encoded);
    }
    Ok(argv)
}

/// Starts a task. `Err` when the request failed; [`ProviderError::maybe_applied`] tells whether
/// the task may nevertheless be running.
pub fn start(target: &Target<'_>, task_id: &str, argv: Vec<String>, envs: &BTreeMap<String, String>) -> Result<Started, ProviderError> {
    let out = target.run_with(argv, envs)?;
    started(&out, task_id, Window { stdout_offset: 0, stderr_offset: 0, limit: limits::READ_LIMIT_DEFAULT as u64 }, "start_task")
}

/// Starts a task in start's wait mode (`argv` from a [`Launch`] with `wait` seconds, `envs` the
/// command's own variables) and returns what the sandbox saw when the task ended or the wait
/// did: a final snapshot with the whole logs (the task directory is then gone), or a running one
/// with the output so far. Errors as [`start`]'s.
pub fn run(
    target: &Target<'_>,
    task_id: &str,
    argv: Vec<String>,
    envs: &BTreeMap<String, String>,
    wait: Duration,
) -> Result<Started, ProviderError> {
    let req = ExecRequest {
        argv,
        envs: envs.clone(),
        cwd: None,
        // The whole logs and the answer's header.
        output_cap: limits::MAX_LOG_BYTES + 64 * 1024,
        deadline: Instant::now() + wait + SNIPPET_BUDGET,
        cancel: None,
    };
    let out = target.provider.exec(target.sandbox_id, &req, Touch::Renew)?;
    if out.timed_out {
        return Err(ProviderError::Timeout { what: "the command's start".into(), after: wait + SNIPPET_BUDGET });
    }
    started(&out, task_id, Window { stdout_offset: 0, stderr_offset: 0, limit: limits::MAX_LOG_BYTES as u64 }, "run_command")
}

/// Reads the answer of a start (`@error` or the snapshot).
fn started(out: &ExecOutput, task_id: &str, window: Window, what: &str) -> Result<Started, ProviderError> {
    let text = String::from_utf8_lossy(&out.stdout);
    if let Some(rest) = text.strip_prefix("@error ") {
        let line = rest.lines().next().unwrap_or("");
        let (kind, detail) = line.split_once(' ').unwrap_or((line, ""));
        let msg = match kind {
            "limit" => format!(
                "this sandbox already holds {} task directories, the limit per OS user; remove finished tasks with delete_task (list_tasks shows them)",
                limits::MAX_TASKS
            ),
            "nocwd" => format!("{detail}; nothing was started"),
            _ => format!("the task could not be started: {detail}"),
        };
        return Ok(Started::Refused(msg));
    }
    if text.starts_with("@none") {
        // A finished task whose logs were gone when the start read it (see inspect.sh's emit).
        return Err(ProviderError::Unconfirmed {
            what: what.into(),
            detail: "the task's directory was removed (by delete_task, or by the task itself) before its answer was read".into(),
        });
    }
    match parse_one(out, task_id, window) {
        Some(snap) => Ok(Started::Observed(Box::new(snap))),
        None => Err(ProviderError::Unconfirmed {
            what: what.into(),
            detail: format!("the supervisor's answer was unreadable: {}", excerpt(out)),
        }),
    }
}

/// Reads one task; `Ok(None)` when it does not exist.
pub fn status(target: &Target<'_>, task_id: &str, window: Window) -> Result<Option<Snapshot>, ProviderError> {
    let out = target.call(Call::Status { task_id, window })?;
    page_result(&out, task_id, window)
}

/// Cancels one task and reads it; `Ok(None)` when it does not exist.
pub fn cancel(target: &Target<'_>, task_id: &str, window: Window) -> Result<Option<Snapshot>, ProviderError> {
    let out = target.call(Call::Cancel { task_id, window })?;
    page_result(&out, task_id, window)
}

fn page_result(out: &ExecOutput, task_id: &str, window: Window) -> Result<Option<Snapshot>, ProviderError> {
    if out.stdout.starts_with(b"@none") {
        return Ok(None);
    }
    parse_one(out, task_id, window)
        .map(Some)
        .ok_or_else(|| ProviderError::Unavailable(format!("the supervisor's answer was unreadable: {}", excerpt(out))))
}

/// Lists the tasks of the sandbox's user.
pub fn list(target: &Target<'_>) -> Result<Vec<Snapshot>, ProviderError> {
    list_by(target, Instant::now() + SNIPPET_BUDGET)
}

/// [`list`] that ends by `deadline`.
pub fn list_by(target: &Target<'_>, deadline: Instant) -> Result<Vec<Snapshot>, ProviderError> {
    let out = target.run_until(Call::List.argv(target.provider), &BTreeMap::new(), deadline)?;
    parse_list(&out.stdout).ok_or_else(|| ProviderError::Unavailable(format!("the task list was unreadable: {}", excerpt(&out))))
}

/// Parses the stdout of the `list` snippet into snapshots without pages, sorted by start time
/// then id; `None` when it lacks the final `@done`. Public for the fuzz targets (`tests/fuzz/`).
pub fn parse_list(stdout: &[u8]) -> Option<Vec<Snapshot>> {
    let text = String::from_utf8_lossy(stdout);
    if !text.contains("@done") {
        return None;
    }
    let mut tasks = Vec::new();
    for block in text.split("@task ").skip(1) {
        let (id, body) = block.split_once('\n').unwrap_or((block, ""));
        let fields = fields(body);
        tasks.push(derive(id.trim(), &fields, Vec::new(), Vec::new(), Window { stdout_offset: 0, stderr_offset: 0, limit: 0 }));
    }
    tasks.sort_by(|a, b| (a.started_at, &a.task_id).cmp(&(b.started_at, &b.task_id)));
    Some(tasks)
}

/// Outcome of `delete`.
pub enum Deleted {
    /// Removed.
    Yes,
    /// No such task.
    Missing,
    /// Still running (or its processes still are).
    Refused(Box<Snapshot>),
}

/// Deletes a finished task.
pub fn delete(target: &Target<'_>, task_id: &str) -> Result<Deleted, ProviderError> {
    let out = target.call(Call::Delete { task_id })?;
    let text = String::from_utf8_lossy(&out.stdout);
    if text.starts_with("@none") {
        return Ok(Deleted::Missing);
    }
    if text.contains("\n@deleted") {
        return Ok(Deleted::Yes);
    }
    if text.contains("\n@refused") {
        let body = text.split_once('\n').map(|(_, b)| b).unwrap_or("");
        let snap = derive(task_id, &fields(body), Vec::new(), Vec::new(), Window { stdout_offset: 0, stderr_offset: 0, limit: 0 });
        return Ok(Deleted::Refused(Box::new(snap)));
    }
    Err(ProviderError::Unavailable(format!("delete_task got an unreadable answer: {}", excerpt(&out))))
}

/// `send_input` through a snippet in the sandbox (a provider that cannot write the task's input
/// itself, [`Provider::task_input`]): the same channel, written by `input.sh` under `timeout`.
pub fn send_input(target: &Target<'_>, task_id: &str, data: &[u8], eof: bool) -> Result<(), InputError> {
    let escaped = printf_b(data);
    let call = Call::Input { task_id, data: &escaped, eof };
    let argv = call.argv(target.provider);
    let encoded = serde_json::to_string(&argv).map(|s| s.len()).unwrap_or(usize::MAX);
    if encoded > limits::MAX_SANDBOX_REQUEST_BYTES {
        return Err(InputError::Refused(format!(
            "this input would be {encoded} bytes once encoded for the sandbox, over the {} byte limit (backslashes and NUL bytes count more than once); send it in smaller calls",
            limits::MAX_SANDBOX_REQUEST_BYTES
        )));
    }
    let out = target.run(argv)?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().next().unwrap_or("");
    let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
    match word {
        "@written" => Ok(()),
        "@none" | "@missing" => Err(InputError::Missing),
        "@closed" => Err(InputError::Closed),
        "@full" => Err(InputError::Full { written: None }),
        "@tampered" | "@tampered-eof" => Err(InputError::Tampered(format!(
            "the task's input channel {:?} is {}, not the FIFO the supervisor made",
            if word == "@tampered" { "stdin" } else { "stdin.eof" },
            rest.chars().take(80).collect::<String>()
        ))),
        "@written-open" => Err(InputError::EndNotSent("the input was closed meanwhile".into())),
        _ => Err(InputError::Provider(ProviderError::Unavailable(format!("send_input got an unreadable answer: {}", excerpt(&out))))),
    }
}

/// `data` as printf's `%b` reads it back: backslashes doubled, NUL as `\0000` (a NUL cannot
/// travel in an argument); everything else as it is.
fn printf_b(data: &[u8]) -> String {
    let mut out = Vec::with_capacity(data.len());
    for &b in data {
        match b {
            b'\\' => out.extend_from_slice(b"\\\\"),
            0 => out.extend_from_slice(b"\\0000"),
            b => out.push(b),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What `resize` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resized {
    /// The terminal has the new size.
    Yes,
    /// There is no such task.
    Missing,
    /// The task has ended (its recorded status).
    Over(String),
    /// The task was started without a terminal.
    NoTerminal,
    /// The task's terminal is not recorded yet (it is starting).
    NotYet,
    /// The sandbox refused (why, in its words).
    Refused(String),
}

/// Sets the size of a pty task's terminal.
pub fn resize(target: &Target<'_>, task_id: &str, rows: u16, cols: u16) -> Result<Resized, ProviderError> {
    let out = target.call(Call::Resize { task_id, rows, cols })?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().next().unwrap_or("");
    let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
    match word {
        "@resized" => Ok(Resized::Yes),
        "@none" => Ok(Resized::Missing),
        "@over" => Ok(Resized::Over(rest.chars().take(40).collect())),
        "@nopty" => Ok(Resized::NoTerminal),
        "@notyet" => Ok(Resized::NotYet),
        "@error" => Ok(Resized::Refused(rest.chars().take(300).collect())),
        _ => Err(ProviderError::Unavailable(format!("resize_task got an unreadable answer: {}", excerpt(&out)))),
    }
}

fn excerpt(out: &ExecOutput) -> String {
    let mut s = String::from_utf8_lossy(&out.stdout[..out.stdout.len().min(200)]).into_owned();
    if !out.stderr.is_empty() {
        s.push_str(" / stderr: ");
        s.push_str(&String::from_utf8_lossy(&out.stderr[..out.stderr.len().min(200)]));
    }
    if s.trim().is_empty() {
        format!("no output (exit code {})", out.exit_code)
    } else {
        s
    }
}

fn fields(body: &str) -> BTreeMap<&str, &str> {
    body.lines().take_while(|l| *l != "@end").filter_map(|l| l.split_once('=')).collect()
}

/// Parses the answer of the `start`, `status` or `cancel` snippet for `task_id` (as [`status`]
/// does after ruling out `@none`); `None` when it is unreadable. Public for the fuzz targets
/// (`tests/fuzz/`).
pub fn parse_answer(stdout: &[u8], stderr: &[u8], task_id: &str, window: Window) -> Option<Snapshot> {
    let out = ExecOutput { stdout: stdout.to_vec(), stderr: stderr.to_vec(), ..ExecOutput::default() };
    parse_one(&out, task_id, window)
}

/// Parses a single-task answer: the header block on stdout, then the pages.
fn parse_one(out: &ExecOutput, task_id: &str, window: Window) -> Option<Snapshot> {
    let marker = b"\n@end\n";
    let head_end = out.stdout.windows(marker.len()).position(|w| w == marker)?;
    let head = std::str::from_utf8(&out.stdout[..head_end + 1]).ok()?;
    let head = head.strip_prefix("@task ")?;
    let (id, body) = head.split_once('\n')?;
    if id.trim() != task_id {
        return None;
    }
    let fields = fields(body);
    let stdout_page = out.stdout[head_end + marker.len()..].to_vec();
    Some(derive(task_id, &fields, stdout_page, out.stderr.clone(), window))
}

fn num(fields: &BTreeMap<&str, &str>, key: &str) -> Option<i64> {
    fields.get(key).and_then(|v| v.trim().parse().ok())
}

/// Turns supervisor fields into a snapshot. Never reports a success it did not observe.
fn derive(task_id: &str, f: &BTreeMap<&str, &str>, out_page: Vec<u8>, err_page: Vec<u8>, window: Window) -> Snapshot {
    let recorded = f.get(key::STATUS).copied().unwrap_or("unreadable");
    let exit_code = num(f, key::EXIT_CODE);
    let mut error = f.get(key::ERROR).map(|s| s.to_string()).filter(|s| !s.is_empty());
    let state = match recorded {
        status_values::EXITED => match exit_code {
            Some(0) => TaskState::Succeeded,
            Some(_) => TaskState::Failed,
            None => {
                error.get_or_insert_with(|| "the supervisor recorded no exit code".into());
                TaskState::Unknown
            }
        },
        status_values::FAILED_TO_START => TaskState::Failed,
        status_values::TIMED_OUT => TaskState::TimedOut,
        status_values::CANCELLED => TaskState::Cancelled,
        status_values::RUNNING | status_values::STARTING => match f.get(key::LIVE).copied() {
            Some("1") => TaskState::Running,
            _ => {
                let still = if f.get(key::GROUP).copied() == Some("1") {
                    "its processes are still running; kill_sandbox stops them"
                } else {
                    "no process of the task is left"
                };
                error = Some(format!(
                    "the task's supervisor is gone (killed, or the sandbox restarted), so its outcome cannot be observed; {still}"
                ));
                TaskState::Unknown
            }
        },
        status_values::CLAIMED => {
            error = Some("the supervisor never reported (the start was interrupted); kill_sandbox cleans up".into());
            TaskState::Unknown
        }
        _ => {
            error = Some(format!("the task's state file is unreadable (status {recorded:?})"));
            TaskState::Unknown
        }
    };
    let out_size = num(f, key::OUT_SIZE).unwrap_or(0).max(0) as u64;
    let err_size = num(f, key::ERR_SIZE).unwrap_or(0).max(0) as u64;
    let (stdout, stdout_next) = cut(out_page, out_size, window.stdout_offset, window.limit);
    let (stderr, stderr_next) = cut(err_page, err_size, window.stderr_offset, window.limit);
    Snapshot {
        task_id: task_id.to_string(),
        state,
        exit_code: if matches!(state, TaskState::Running) { None } else { exit_code },
        started_at: num(f, key::STARTED_AT),
        finished_at: if state.is_final() { num(f, key::FINISHED_AT) } else { None },
        timeout: num(f, key::TIMEOUT),
        stdout,
        stderr,
        stdout_next_offset: stdout_next,
        stderr_next_offset: stderr_next,
        stdout_bytes: out_size,
        stderr_bytes: err_size,
        stdout_truncated: f.get(key::OUT_TRUNCATED).copied() == Some("1"),
        stderr_truncated: f.get(key::ERR_TRUNCATED).copied() == Some("1"),
        error,
        escaped: num(f, key::ESCAPED).unwrap_or(0).max(0) as u64,
        command: f.get(key::CMD_HEX).and_then(|hex| from_hex(hex)).map(|bytes| String::from_utf8_lossy(&bytes).chars().take(200).collect()),
    }
}

/// Bytes from lowercase or uppercase hex digits; `None` when `hex` is not that.
fn from_hex(hex: &str) -> Option<Vec<u8>> {
    let hex = hex.trim();
    if hex.len() % 2 != 0 {
        return None;
    }
    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok()).collect()
}

/// The page actually returned: what arrived, bounded by the saved size seen by the snippet (the
/// file may have grown since) and the limit; and the offset after it.
fn cut(mut page: Vec<u8>, size: u64, offset: u64, limit: u64) -> (Vec<u8>, u64) {
    let want = size.saturating_sub(offset).min(limit) as usize;
    page.truncate(want);
    let next = offset + page.len() as u64;
    (page, next)
}

#[cfg(test)]
mod tests {
    #[test]
    fn input_travels_in_printf_b_form() {
        assert_eq!(super::printf_b(b"a\\b\0c%s\n"), "a\\\\b\\0000c%s\n");
        // What printf %b makes of it is the input again.
        let out =
            std::process::Command::new("sh").args(["-c", "printf '%b' \"$1\"", "sh", &super::printf_b(b"x\\c\x001\n")]).output().unwrap();
        assert_eq!(out.stdout, b"x\\c\x001\n");
    }

    use super::*;

    fn output(stdout: &str, stderr: &str) -> ExecOutput {
        ExecOutput { stdout: stdout.as_bytes().to_vec(), stderr: stderr.as_bytes().to_vec(), ..ExecOutput::default() }
    }

    const ID: &str = "0123456789abcdef0123456789abcdef";
    const W: Window = Window { stdout_offset: 0, stderr_offset: 0, limit: 16384 };

    /// A start whose task was removed before its answer was read says so, not "unreadable".
    #[test]
    fn a_start_whose_task_is_gone_says_so() {
        let gone = started(&output("@none\n", ""), ID, W, "run_command");
        assert!(matches!(&gone, Err(ProviderError::Unconfirmed { detail, .. }) if detail.contains("removed")), "{:?}", gone.as_ref().err());
    }

    #[test]
    fn derives_states_honestly() {
        let done = output(
            &format!("@task {ID}\nstatus=exited\nexit_code=0\nstarted_at=5\nfinished_at=6\nout_size=5\nerr_size=0\n@end\nhello"),
            "",
        );
        let s = parse_one(&done, ID, W).unwrap();
        assert_eq!((s.state, s.exit_code, s.stdout.as_slice(), s.stdout_next_offset), (TaskState::Succeeded, Some(0), &b"hello"[..], 5));
        let failed = output(&format!("@task {ID}\nstatus=exited\nexit_code=3\nout_size=0\nerr_size=0\n@end\n"), "");
        assert_eq!(parse_one(&failed, ID, W).unwrap().state, TaskState::Failed);
        let lost = output(&format!("@task {ID}\nstatus=running\nlive=0\ngroup=1\nout_size=0\nerr_size=0\n@end\n"), "");
        let s = parse_one(&lost, ID, W).unwrap();
        assert_eq!(s.state, TaskState::Unknown);
        assert!(s.error.unwrap().contains("still running"));
        let running = output(&format!("@task {ID}\nstatus=running\nlive=1\nexit_code=\nout_size=3\nerr_size=2\n@end\nabcdef"), "xyz");
        let s = parse_one(&running, ID, W).unwrap();
        assert_eq!((s.state, s.stdout.as_slice(), s.stderr.as_slice()), (TaskState::Running, &b"abc"[..], &b"xy"[..]));
        assert!(parse_one(&output("garbage", ""), ID, W).is_none());
        assert!(parse_one(&output(&format!("@task {ID}\nstatus=exited\n"), ""), ID, W).is_none());
    }

    #[test]
    fn pages_respect_offsets_and_limits() {
        assert_eq!(cut(b"abcdef".to_vec(), 10, 4, 3), (b"abc".to_vec(), 7));
        assert_eq!(cut(Vec::new(), 10, 20, 3), (Vec::new(), 20));
        assert_eq!(cut(b"ab".to_vec(), 2, 0, 16), (b"ab".to_vec(), 2));
    }
}
