//! The tools that talk to a running task: `send_input` (its stdin or its terminal) and
//! `resize_task` (its terminal's size) (docs/contract.md, "Input and terminals"). Like the task
//! tools, they never renew the sandbox's TTL.

use super::args::{Args, Kind, Param};
use super::tasks::{checked_task_id, no_such_task, TASK_ID};
use super::{Ctx, Reply, Tool, ToolError, SANDBOX_ID_REQUIRED};
use crate::limits;
use crate::provider::{Input, InputError};
use crate::supervisor::{self, Resized, Target, Window};
use serde_json::json;
use std::time::Instant;

const DATA: Param = Param { name: "data", kind: Kind::Str { max_chars: limits::MAX_INPUT_BYTES }, required: true, description: "" };

const EOF: Param = Param { name: "eof", kind: Kind::Bool, required: false, description: "" };

const ROWS: Param = Param {
    name: "rows",
    kind: Kind::Int { min: limits::PTY_SIZE_MIN, max: limits::PTY_SIZE_MAX, default: None },
    required: true,
    description: "",
};

const COLS: Param = Param {
    name: "cols",
    kind: Kind::Int { min: limits::PTY_SIZE_MIN, max: limits::PTY_SIZE_MAX, default: None },
    required: true,
    description: "",
};

pub const SEND: Tool = Tool {
    name: "send_input",
    description: "Type into a stdin or pty task; eof closes. Fails, never hangs, if it does not read.",
    params: &[SANDBOX_ID_REQUIRED, TASK_ID, DATA, EOF],
    output_schema: None,
    read_only: false,
    destructive: true,
    run: send,
};

pub const RESIZE: Tool = Tool {
    name: "resize_task",
    description: "Resize a pty task's terminal.",
    params: &[SANDBOX_ID_REQUIRED, TASK_ID, ROWS, COLS],
    output_schema: None,
    read_only: false,
    destructive: false,
    run: resize,
};

/// The task directory, relative to the sandbox user's home (the `supervisor` module doc, "Task
/// directory").
fn task_dir(task_id: &str) -> String {
    format!(".sandbox-mcp/tasks/{task_id}")
}

fn send(ctx: &Ctx<'_>, args: &Args) -> Result<Reply, ToolError> {
    let given = args.required_text(&SANDBOX_ID_REQUIRED)?;
    let task_id = checked_task_id(args.required_text(&TASK_ID)?)?;
    let data = args.required_text(&DATA)?;
    let eof = args.flag(&EOF)?.unwrap_or(false);
    if data.len() > limits::MAX_INPUT_BYTES {
        return Err(ToolError::new(format!(
            "data is {} bytes once encoded as UTF-8, over send_input's limit of {} per call; send it in several calls",
            data.len(),
            limits::MAX_INPUT_BYTES
        )));
    }
    let sandbox_id = super::target_sandbox(ctx, Some(given))?;
    let provider = ctx.app.provider.as_ref();
    let dir = task_dir(&task_id);
    let input = Input { task_dir: &dir, data: data.as_bytes(), eof };
    let written = if provider.task_input() {
        provider.send_input(&sandbox_id, &input, Instant::now() + limits::INPUT_WRITE_WAIT)
    } else {
        // The supervisor's snippet writes it inside the sandbox (E2B).
        supervisor::send_input(&Target { provider, sandbox_id: &sandbox_id }, &task_id, data.as_bytes(), eof)
    };
    match written {
        Ok(()) => Ok(Reply::Now(json!({"sandbox_id": sandbox_id, "task_id": task_id, "bytes": data.len(), "eof": eof}))),
        Err(InputError::Refused(msg)) => Err(ToolError::new(msg)),
        Err(InputError::Provider(err)) => Err(err.into()),
        Err(err) => Err(explain(ctx, &sandbox_id, &task_id, err, data.len())),
    }
}

/// A failed write in words, after one look at the task: a task that has ended says so whatever
/// the channel showed.
fn explain(ctx: &Ctx<'_>, sandbox_id: &str, task_id: &str, err: InputError, len: usize) -> ToolError {
    let target = Target { provider: ctx.app.provider.as_ref(), sandbox_id };
    let state = match supervisor::status(&target, task_id, Window { stdout_offset: 0, stderr_offset: 0, limit: 1 }) {
        Ok(None) => return no_such_task(sandbox_id, task_id),
        Ok(Some(s)) => Some(s.state),
        Err(_) => None,
    };
    if let Some(state) = state.filter(|s| s.is_final()) {
        return ToolError::new(format!(
            "task {task_id} has ended ({}); input can only go to a running task. Read its output with get_task",
            state.name()
        ));
    }
    let mut message = match err {
        InputError::Missing => format!(
            "task {task_id} was started without stdin or pty, so it reads nothing; start the program again with start_task and stdin: true (or pty)"
        ),
        InputError::Closed => format!("task {task_id}'s input was closed (eof: true); nothing more can be sent to it"),
        InputError::NoReader => format!(
            "task {task_id} no longer reads its input (it closed its stdin, or something in the sandbox replaced the channel); nothing was written"
        ),
        InputError::Full { written } => format!(
            "task {task_id} is not reading its input: its buffer stayed full for {} s, and {} of the {len} bytes went in. \
Send the rest later, check the task with get_task, or cancel_task it",
            limits::INPUT_WRITE_WAIT.as_secs(),
            written.map_or_else(|| "some".to_string(), |n| n.to_string())
        ),
        InputError::Tampered(what) => {
            format!("{what}: something in the sandbox replaced it, so input cannot reach task {task_id}; nothing was written")
        }
        InputError::EndNotSent(why) => format!(
            "all {len} bytes went in to task {task_id}, but its input could not be closed ({why}); do not send them again"
        ),
        InputError::Refused(msg) => msg,
        InputError::Provider(e) => e.to_string(),
    };
    if state.is_none() {
        message.push_str(" (the task's state could not be read)");
    }
    ToolError::new(message)
}

fn resize(ctx: &Ctx<'_>, args: &Args) -> Result<Reply, ToolError> {
    let given = args.required_text(&SANDBOX_ID_REQUIRED)?;
    let task_id = checked_task_id(args.required_text(&TASK_ID)?)?;
    let rows = size(args.integer(&ROWS)?);
    let cols = size(args.integer(&COLS)?);
    let sandbox_id = super::target_sandbox(ctx, Some(given))?;
    let provider = ctx.app.provider.as_ref();
    let target = Target { provider, sandbox_id: &sandbox_id };
    match supervisor::resize(&target, &task_id, rows, cols)? {
        Resized::Yes => Ok(Reply::Now(json!({"sandbox_id": sandbox_id, "task_id": task_id, "rows": rows, "cols": cols}))),
        Resized::Missing => Err(no_such_task(&sandbox_id, &task_id)),
        Resized::Over(status) => Err(ToolError::new(format!("task {task_id} has ended ({status}); its terminal is gone"))),
        Resized::NoTerminal => Err(ToolError::new(format!(
            "task {task_id} was started without pty, so it has no terminal to resize; start it with pty: {{\"rows\": {rows}, \"cols\": {cols}}}"
        ))),
        Resized::NotYet => Err(ToolError::new(format!("task {task_id}'s terminal is still being set up; retry in a moment"))),
        Resized::Refused(why) => Err(ToolError::new(format!("the terminal of task {task_id} was not resized: {why}"))),
    }
}

/// A validated `rows` or `cols` (1..=1000) as the terminal takes it.
fn size(n: i64) -> u16 {
    u16::try_from(n.clamp(limits::PTY_SIZE_MIN, limits::PTY_SIZE_MAX)).unwrap_or(u16::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::args::samples;

    #[test]
    fn reads_only_declared_arguments() {
        for args in samples(SEND.name, SEND.params) {
            assert_eq!(args.required_text(&DATA).unwrap(), "a");
            assert!(matches!(args.flag(&EOF), Ok(Some(true) | None)));
        }
        for args in samples(RESIZE.name, RESIZE.params) {
            assert_eq!(size(args.integer(&ROWS).unwrap()), 1);
            assert_eq!(size(args.integer(&COLS).unwrap()), 1);
        }
        assert_eq!(task_dir("ab"), ".sandbox-mcp/tasks/ab");
    }
}
