//! `run_command`: one shell command to completion, with capped and masked output.

use super::args::{Args, Kind, Param};
use super::{Ctx, Tool, ToolError, SANDBOX_ID};
use crate::limits;
use crate::provider::{ExecRequest, Touch};
use serde_json::{json, Value};
use std::collections::BTreeMap;
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
Values of secret-named environment variables are masked as ***. For anything long-running use start_task instead.",
    params: &[COMMAND, SANDBOX_ID, CWD, ENVS, TIMEOUT],
    output_schema: || {
        json!({"type": "object", "properties": {
            "exit_code": {"type": "integer", "description": "exit status; 128+N when killed by signal N; 124 on timeout"},
            "stdout": {"type": "string"},
            "stderr": {"type": "string"},
            "stdout_truncated": {"type": "boolean"},
            "stderr_truncated": {"type": "boolean"},
            "timed_out": {"type": "boolean"},
            "duration_ms": {"type": "integer"}
        }, "required": ["exit_code", "stdout", "stderr", "stdout_truncated", "stderr_truncated", "timed_out", "duration_ms"]})
    },
    read_only: false,
    destructive: false,
    run,
};

/// The arguments of `run_command` (also read by a task-augmented call, `mcp_tasks::create`).
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

fn run(ctx: &Ctx<'_>, args: &Args) -> Result<Value, ToolError> {
    let Request { sandbox_id, command, cwd, envs, timeout } = Request::read(args)?;
    let id = super::target_sandbox(ctx, sandbox_id)?;
    let provider = &ctx.app.provider;
    let masker = provider.env_masker(&id, &envs)?;
    let req = ExecRequest {
        argv: provider.shell(command),
        envs,
        cwd: cwd.map(str::to_string),
        output_cap: limits::MAX_LOG_BYTES,
        deadline: Instant::now() + timeout,
        cancel: Some(ctx.cancel.clone()),
    };
    let out = provider.exec(&id, &req, Touch::Renew)?;
    if ctx.cancel.load(std::sync::atomic::Ordering::Relaxed) {
        if ctx.app.is_draining() {
            return Err(ToolError::new("the server is shutting down; the command was stopped before it finished"));
        }
        return Err(ToolError::new("the request was cancelled; the command was stopped"));
    }
    let text = |bytes: &[u8]| String::from_utf8_lossy(&masker.mask_bytes(bytes)).into_owned();
    Ok(json!({
        "exit_code": if out.timed_out { TIMED_OUT_EXIT_CODE } else { out.exit_code },
        "stdout": text(&out.stdout),
        "stderr": text(&out.stderr),
        "stdout_truncated": out.stdout_truncated,
        "stderr_truncated": out.stderr_truncated,
        "timed_out": out.timed_out,
        "duration_ms": out.duration.as_millis() as u64,
    }))
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
}
