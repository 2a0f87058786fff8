//! One provider's side of the e2b comparison: its session, sandbox and finished task, and the
//! timed tool calls (the operations) made on it, with the emulator's request counts and the
//! connections opened per call when those are watched.

use crate::emulator::Emulator;
use crate::session::{state, wait_final, Tools};
use crate::units::secs;
use anyhow::{bail, Context, Result};
use sandbox_mcp::client::StdioClient;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The directory and the small file of the file tools, relative to the sandbox's home.
const E2B_DIR: &str = "bench";
const E2B_FILE: &str = "bench/small.txt";
const E2B_CONTENT: &str = "hello\n";

/// What the e2b section measures: one or two tool calls each (the pairs clean up after
/// themselves, so every repetition does the same work).
#[derive(Clone, Copy, PartialEq)]
pub enum Op {
    Write,
    Read,
    List,
    Run,
    RunShort,
    Start,
    Get,
    Cancel,
    Tasks,
    Create,
}

/// In this order (the file is written before it is read).
pub const E2B_OPS: [Op; 10] = [Op::Write, Op::Read, Op::List, Op::Run, Op::RunShort, Op::Start, Op::Get, Op::Cancel, Op::Tasks, Op::Create];

/// The key of [`Op::RunShort`]'s calls (run_command with a timeout within `--task-after`).
pub const RUN_SHORT: &str = "run_command_short";

/// One provider's session, sandbox and finished task.
pub struct Side<'a> {
    rpc: &'a mut StdioClient,
    sandbox: String,
    /// A finished task in `sandbox` whose stdout is "hello\n".
    task: String,
    /// start_task calls, and how many of them already answered with the final state.
    pub starts: usize,
    pub direct: usize,
    /// create_sandbox calls, and the kill_sandbox calls right after them that failed (then
    /// retried).
    pub creates: usize,
    pub kill_failures: Vec<String>,
    /// Connections accepted by a counting proxy in front of the emulator, when there is one.
    pub conns: Option<Arc<AtomicUsize>>,
}

/// One timed tool call: wall time and, when the emulator was given, the requests it made; with
/// a counting proxy, the connections it opened.
pub struct Call {
    pub tool: &'static str,
    pub secs: f64,
    pub counts: Option<Value>,
    pub conns: Option<usize>,
}

impl<'a> Side<'a> {
    pub fn new(rpc: &'a mut StdioClient, sandbox: &str, task: &str) -> Side<'a> {
        Side {
            rpc,
            sandbox: sandbox.to_string(),
            task: task.to_string(),
            starts: 0,
            direct: 0,
            creates: 0,
            kill_failures: Vec::new(),
            conns: None,
        }
    }

    /// Calls `tool` (timed), checks its result, and counts its requests to `emu` (reset before,
    /// read after; neither inside the timed part).
    fn call(
        &mut self,
        emu: &mut Option<&mut Emulator>,
        tool: &'static str,
        args: Value,
        ok: impl Fn(&Value) -> bool,
    ) -> Result<(Call, Value)> {
        if let Some(e) = emu.as_deref_mut() {
            e.reset()?;
        }
        let accepted = |conns: &Option<Arc<AtomicUsize>>| conns.as_ref().map(|c| c.load(Ordering::SeqCst));
        let before = accepted(&self.conns);
        let t = Instant::now();
        let v = self.rpc.tool(tool, &args)?;
        let secs = secs(t);
        let conns = accepted(&self.conns).zip(before).map(|(a, b)| a - b);
        let counts = match emu.as_deref_mut() {
            Some(e) => Some(e.counts()?),
            None => None,
        };
        if !ok(&v) {
            bail!("{tool} {args} returned {v}");
        }
        Ok((Call { tool, secs, counts, conns }, v))
    }

    /// Runs `op` once: its timed calls, checked.
    pub fn op(&mut self, op: Op, mut emu: Option<&mut Emulator>) -> Result<Vec<Call>> {
        let emu = &mut emu;
        let sb = self.sandbox.clone();
        let task = self.task.clone();
        let hello = |v: &Value| v["stdout"] == json!("hello\n");
        Ok(match op {
            Op::Write => {
                let args = json!({"sandbox_id": sb, "path": E2B_FILE, "content": E2B_CONTENT});
                vec![self.call(emu, "write_file", args, |v| v["bytes_written"] == json!(E2B_CONTENT.len()))?.0]
            }
            Op::Read => {
                let args = json!({"sandbox_id": sb, "path": E2B_FILE});
                vec![self.call(emu, "read_file", args, |v| v["content"] == json!(E2B_CONTENT))?.0]
            }
            Op::List => {
                let args = json!({"sandbox_id": sb, "path": E2B_DIR});
                vec![self.call(emu, "list_files", args, |v| v["entries"].as_array().is_some_and(|a| a.len() == 1))?.0]
            }
            Op::Run => {
                let args = json!({"sandbox_id": sb, "command": "true"});
                vec![self.call(emu, "run_command", args, |v| v["exit_code"] == json!(0))?.0]
            }
            Op::RunShort => {
                // A timeout within --task-after (25 s by default): the command can never become a
                // task, so it runs the plain way.
                let args = json!({"sandbox_id": sb, "command": "true", "timeout": 20});
                let (mut call, _) = self.call(emu, "run_command", args, |v| v["exit_code"] == json!(0))?;
                call.tool = RUN_SHORT;
                vec![call]
            }
            Op::Start => {
                let args = json!({"sandbox_id": sb, "command": "true"});
                let (start, snap) = self.call(emu, "start_task", args, |v| v["task_id"].is_string())?;
                let id = snap["task_id"].as_str().unwrap_or_default().to_string();
                self.starts += 1;
                let fin = if state(&snap) == "running" {
                    wait_final(self.rpc, &sb, &id, Duration::from_secs(10), Duration::from_millis(2))?
                } else {
                    self.direct += 1;
                    snap
                };
                if state(&fin) != "succeeded" {
                    bail!("start_task true ended {fin}");
                }
                let args = json!({"sandbox_id": sb, "task_id": id});
                let (delete, _) = self.call(emu, "delete_task", args, |v| v["deleted"] == json!(true))?;
                vec![start, delete]
            }
            Op::Get => {
                let args = json!({"sandbox_id": sb, "task_id": task});
                vec![self.call(emu, "get_task", args, |v| state(v) == "succeeded" && hello(v))?.0]
            }
            Op::Cancel => {
                let args = json!({"sandbox_id": sb, "task_id": task});
                vec![self.call(emu, "cancel_task", args, |v| state(v) == "succeeded" && hello(v))?.0]
            }
            Op::Tasks => {
                let args = json!({"sandbox_id": sb});
                vec![self.call(emu, "list_tasks", args, |v| v["count"].as_u64().is_some_and(|n| n >= 1))?.0]
            }
            Op::Create => {
                let (create, v) = self.call(emu, "create_sandbox", json!({"timeout": 300}), |v| v["sandbox_id"].is_string())?;
                self.creates += 1;
                let args = json!({"sandbox_id": v["sandbox_id"]});
                match self.call(emu, "kill_sandbox", args.clone(), |v| v["killed"] == json!(true)) {
                    Ok((kill, _)) => vec![create, kill],
                    Err(err) => {
                        // Reported in the kill_sandbox row; the retry cleans up (and is not timed).
                        self.kill_failures.push(format!("{err:#}"));
                        self.call(emu, "kill_sandbox", args, |v| v["sandbox_id"].is_string())?;
                        vec![create]
                    }
                }
            }
        })
    }

    /// start_task of `command` (still running at its first answer): the time to that answer and
    /// the state it gave; then cancel_task and delete_task.
    pub fn start_running(&mut self, command: &str) -> Result<(f64, String)> {
        let sb = self.sandbox.clone();
        let t = Instant::now();
        let snap = self.rpc.tool("start_task", &json!({"sandbox_id": sb, "command": command, "timeout": 60}))?;
        let e = secs(t);
        let id = snap["task_id"].as_str().context("start_task returned no task_id")?.to_string();
        let fin = self.rpc.tool("cancel_task", &json!({"sandbox_id": sb, "task_id": id}))?;
        if !matches!(state(&fin), "cancelled" | "succeeded") {
            bail!("cancel_task of {command:?} ended {fin}");
        }
        self.rpc.tool("delete_task", &json!({"sandbox_id": sb, "task_id": id}))?;
        Ok((e, state(&snap).to_string()))
    }
}
