//! `run_command`: one shell command to completion, with capped and masked output.

use super::args::{Args, Kind, Param};
use super::{Ctx, Reply, Tool, ToolError, SANDBOX_ID};
use crate::ids;
use crate::limits;
use crate::provider::local::TASK_TAG_VAR;
use crate::provider::{Adoption, ExecEnd, ExecOutput, ExecRequest, Promotion, Touch};
use crate::supervisor::{self, Launch, Started, Target, TaskState, Window};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Exit code reported when the timeout killed the command (as GNU `timeout` does).
pub const TIMED_OUT_EXIT_CODE: i32 = 124;

const COMMAND: Param =
    Param { name: "command", kind: Kind::Str { max_chars: limits::MAX_COMMAND_CHARS }, required: true, description: "Shell command line." };

const CWD: Param = Param {
    name: "cwd",
    kind: Kind::Str { max_chars: 4096 },
    required: false,
    description: "Working directory; default the sandbox user's home.",
};

const ENVS: Param =
    Param { name: "envs", kind: Kind::StrMap, required: false, description: "Extra environment variables for this command." };

const TIMEOUT: Param = Param {
    name: "timeout",
    kind: Kind::Int {
        min: limits::COMMAND_TIMEOUT_MIN_S,
        max: limits::COMMAND_TIMEOUT_MAX_S,
        default: Some(limits::COMMAND_TIMEOUT_DEFAULT_S),
    },
    required: false,
    description: "Seconds before the command is killed.",
};

pub const RUN: Tool = Tool {
    name: "run_command",
    description:
        "Run a shell command in a sandbox and wait for it (at most timeout seconds; on timeout its whole process group is killed). \
A non-zero exit_code is a normal result, not an error. stdout and stderr keep the first 1 MiB each (then *_truncated is true). \
Values of secret-named environment variables are masked as ***. A command still running after the server's --task-after seconds \
(25 by default) may go on as a background task: the answer then has state \"running\", a task_id, exit_code null and the output so far; \
continue with get_task (with wait) or stop it with cancel_task. For anything long-running you may also use start_task directly.",
    params: &[COMMAND, SANDBOX_ID, CWD, ENVS, TIMEOUT],
    output_schema: || {
        json!({"type": "object", "properties": {
            "state": {"type": "string", "enum": ["completed", "running"], "description": "completed: the command ended (or timed out); running: it goes on as task task_id"},
            "exit_code": {"type": ["integer", "null"], "description": "exit status; 128+N when killed by signal N; 124 on timeout; null while running"},
            "stdout": {"type": "string", "description": "output so far when running"},
            "stderr": {"type": "string"},
            "stdout_truncated": {"type": "boolean"},
            "stderr_truncated": {"type": "boolean"},
            "timed_out": {"type": "boolean"},
            "duration_ms": {"type": "integer"},
            "task_id": {"type": "string", "description": "when running: the task to read with get_task"},
            "sandbox_id": {"type": "string", "description": "when running: the task's sandbox"},
            "message": {"type": "string", "description": "when running: what to do next"}
        }, "required": ["state", "exit_code", "stdout", "stderr", "stdout_truncated", "stderr_truncated", "timed_out", "duration_ms"]})
    },
    read_only: false,
    destructive: false,
    run,
};

/// The arguments of `run_command` (also read by a task-augmented call, `mcp::tasks::create`).
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
        })
    }
}

fn run(ctx: &Ctx<'_>, args: &Args) -> Result<Reply, ToolError> {
    let Request { sandbox_id, command, cwd, envs, timeout } = Request::read(args)?;
    let id = super::target_sandbox(ctx, sandbox_id)?;
    let provider = &ctx.app.provider;
    let masker = provider.env_masker(&id, &envs)?;
    let started = Instant::now();
    let after = ctx.app.config.task_after;
    let text = |bytes: &[u8]| String::from_utf8_lossy(&masker.mask_bytes(bytes)).into_owned();
    // A command that may outlive --task-after is made adoptable from its start (the task tag, and
    // an EXIT trap that records its exit code once its task directory exists) or, where the
    // provider cannot hand a running command over, started under the supervisor; see
    // ARCHITECTURE.md, "Long run_command calls".
    let may_outlive = !after.is_zero() && timeout > after;
    let task_id = ids::task_id();
    let dir = if may_outlive { provider.promotion_dir(&id, &task_id) } else { None };
    let mut req = ExecRequest {
        argv: provider.shell(command),
        envs,
        cwd: cwd.map(str::to_string),
        output_cap: limits::MAX_LOG_BYTES,
        deadline: started + timeout,
        cancel: Some(ctx.cancel.clone()),
    };
    let out = match dir {
        Some(dir) => {
            req.argv = provider.shell(&adoptable(command, &dir));
            req.envs.insert(TASK_TAG_VAR.to_string(), task_id.clone());
            let adopter = |adoption: &Adoption<'_>| supervisor::Call::Adopt(*adoption).argv(provider.as_ref());
            let promotion = Promotion {
                at: started + after,
                task_id: &task_id,
                command,
                timeout,
                masker: &masker,
                adopter: &adopter,
                kill_grace: supervisor::snippet::TIMEOUT_KILL_GRACE,
            };
            match provider.exec_or_promote(&id, &req, Touch::Renew, &promotion)? {
                ExecEnd::Done(out) => out,
                ExecEnd::Promoted(out) => {
                    // The task outlives the session, like start_task's.
                    ctx.session.retain(&id);
                    return Ok(Reply::Now(running(&task_id, &id, &out, text)));
                }
            }
        }
        None if may_outlive && provider.supervises_long_commands() => {
            let launch = Launch {
                task_id: &task_id,
                timeout: timeout.as_secs() as i64,
                cwd,
                command,
                page_limit: limits::MAX_LOG_BYTES as u64,
                wait: after.as_secs(),
            };
            match supervised(ctx, &id, launch, &req.envs, started)? {
                Supervised::Ended(out) => out,
                Supervised::Running(out) => return Ok(Reply::Now(running(&task_id, &id, &out, text))),
                Supervised::Refused => provider.exec(&id, &req, Touch::Renew)?,
            }
        }
        None => provider.exec(&id, &req, Touch::Renew)?,
    };
    if ctx.cancel.load(Ordering::Relaxed) {
        if ctx.app.is_draining() {
            return Err(ToolError::new("the server is shutting down; the command was stopped before it finished"));
        }
        return Err(ToolError::new("the request was cancelled; the command was stopped"));
    }
    Ok(Reply::Now(json!({
        "state": "completed",
        "exit_code": if out.timed_out { TIMED_OUT_EXIT_CODE } else { out.exit_code },
        "stdout": text(&out.stdout),
        "stderr": text(&out.stderr),
        "stdout_truncated": out.stdout_truncated,
        "stderr_truncated": out.stderr_truncated,
        "timed_out": out.timed_out,
        "duration_ms": out.duration.as_millis() as u64,
    })))
}

/// The answer of a run_command that goes on as task `task_id`, with the output so far.
fn running(task_id: &str, sandbox_id: &str, out: &ExecOutput, text: impl Fn(&[u8]) -> String) -> Value {
    let message = format!(
        "The command is still running, now as background task {task_id} in sandbox {sandbox_id}. Call get_task with this task_id \
and sandbox_id (wait: up to 60 seconds per call) for its further output and its exit code, or cancel_task to stop it."
    );
    json!({
        "state": "running",
        "exit_code": Value::Null,
        "stdout": text(&out.stdout),
        "stderr": text(&out.stderr),
        "stdout_truncated": out.stdout_truncated,
        "stderr_truncated": out.stderr_truncated,
        "timed_out": false,
        "duration_ms": out.duration.as_millis() as u64,
        "task_id": task_id,
        "sandbox_id": sandbox_id,
        "message": message,
    })
}

/// How a command started under the supervisor came back.
enum Supervised {
    /// It ended within `--task-after` (its task directory is gone): the output as run_command's.
    Ended(ExecOutput),
    /// It goes on as its task: the output so far.
    Running(ExecOutput),
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
    let Ok(argv) = supervisor::start_argv(provider, launch) else {
        // Too large for one start request: run it the plain way.
        return Ok(Supervised::Refused);
    };
    let target = Target { provider, sandbox_id: id };
    let snap = match supervisor::run(&target, task_id, argv, envs, Duration::from_secs(launch.wait)) {
        Ok(Started::Observed(snap)) => snap,
        Ok(Started::Refused(_)) => return Ok(Supervised::Refused),
        Err(err) if err.maybe_applied() => {
            ctx.session.retain(id);
            return Err(ToolError::new(format!(
                "the command was started as background task {task_id} in sandbox {id}, but its answer was lost ({err}); \
get_task with this task_id and sandbox_id tells its state and output"
            )));
        }
        Err(err) => return Err(err.into()),
    };
    let out = ExecOutput {
        exit_code: snap.exit_code.unwrap_or(-1).clamp(i32::MIN as i64, i32::MAX as i64) as i32,
        stdout: snap.stdout,
        stderr: snap.stderr,
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
            Ok(Supervised::Running(out))
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

/// `command` preceded by an `EXIT` trap that writes its exit status into `dir/exit_code` once
/// `dir` exists (it does once the command became a task), with builtins only: a quick command pays
/// nothing for it. A command that sets its own `EXIT` trap replaces this one.
fn adoptable(command: &str, dir: &str) -> String {
    let dir = sh_quote(dir);
    let trap = format!("_rc=$?; [ -d {dir} ] && echo \"$_rc\" >{dir}/exit_code; exit \"$_rc\"");
    format!("trap {} EXIT; {command}", sh_quote(&trap))
}

/// `s` as one single-quoted shell word.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::args::samples;

    #[test]
    fn reads_only_declared_arguments() {
        for args in samples(RUN.name, RUN.params) {
            let req = Request::read(&args).unwrap();
            assert_eq!(req.command, "a");
        }
    }

    #[test]
    fn the_exit_trap_records_the_status_only_once_the_directory_exists() {
        let tmp = std::env::temp_dir().join(format!("sandbox-mcp-trap-{}", std::process::id()));
        let dir = tmp.join("it's here");
        let run = |cmd: &str| {
            let script = adoptable(cmd, dir.to_str().unwrap());
            std::process::Command::new("/bin/sh").args(["-c", &script]).status().unwrap().code()
        };
        assert_eq!(run("exit 7"), Some(7));
        assert!(!dir.exists());
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(run("false"), Some(1));
        assert_eq!(std::fs::read_to_string(dir.join("exit_code")).unwrap(), "1\n");
        assert_eq!(run("(exit 7)"), Some(7));
        assert_eq!(std::fs::read_to_string(dir.join("exit_code")).unwrap(), "7\n");
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
