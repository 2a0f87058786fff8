//! The driver's stdio MCP sessions: `sandbox_mcp::client::StdioClient` reading in the caller's
//! thread ([`Reads::Blocking`]: no thread hand-off inside a measured round trip), the server's
//! stderr appended to a log file, and the tool calls the measurements make.
//!
//! Reads block: a server that stops answering is caught by run.sh's timeout, or by a watchdog
//! that stops the server (the pending read then ends with an error).

use anyhow::{bail, Context, Result};
use sandbox_mcp::client::{Reads, StdioClient};
use serde_json::{json, Value};
use std::fs::OpenOptions;
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// The timeout argument of the client's calls; blocking reads do not apply it.
pub const WAIT: Duration = Duration::from_secs(3600);

/// Starts `cmd` as an MCP server over stdio, its stderr appended to `log`.
pub fn spawn(mut cmd: Command, log: &Path) -> Result<StdioClient> {
    let log = OpenOptions::new().create(true).append(true).open(log).with_context(|| format!("opening {}", log.display()))?;
    cmd.stderr(Stdio::from(log));
    StdioClient::start(cmd, Reads::Blocking)
}

/// `initialize` as "bench-driver".
pub fn initialize(client: &mut StdioClient) -> Result<Value> {
    client.initialize_as("bench-driver")
}

/// The tool calls of the measurements.
pub trait Tools {
    /// A tool call's whole result (tool errors included).
    fn tool_result(&mut self, name: &str, args: &Value) -> Result<Value>;

    /// A tool call's `structuredContent`; a tool error is an error.
    fn tool(&mut self, name: &str, args: &Value) -> Result<Value>;

    /// Closes stdin and waits (up to 5 s) for the exit, then kills.
    fn end(self) -> Result<()>;

    /// Times one call of a tool that must succeed and whose result `check` accepts (it says
    /// why not otherwise); returns the seconds taken.
    fn timed(&mut self, name: &str, args: &Value, check: impl Fn(&Value) -> bool) -> Result<f64>
    where
        Self: Sized,
    {
        let t = std::time::Instant::now();
        let r = self.tool(name, args)?;
        let e = t.elapsed().as_secs_f64();
        if !check(&r) {
            bail!("{name} {args} returned {r}");
        }
        Ok(e)
    }
}

impl Tools for StdioClient {
    fn tool_result(&mut self, name: &str, args: &Value) -> Result<Value> {
        self.result("tools/call", Some(&json!({"name": name, "arguments": args})), WAIT)
    }

    fn tool(&mut self, name: &str, args: &Value) -> Result<Value> {
        let mut r = self.tool_result(name, args)?;
        if r["isError"] == json!(true) {
            bail!("{name} {args} failed: {}", r["content"][0]["text"]);
        }
        Ok(r.get_mut("structuredContent").map(Value::take).unwrap_or(Value::Null))
    }

    fn end(self) -> Result<()> {
        self.close(Duration::from_secs(5)).map(drop)
    }
}

/// A task snapshot's state.
pub fn state(snapshot: &Value) -> &str {
    snapshot["state"].as_str().unwrap_or("")
}

/// Polls get_task until the task is no longer running.
pub fn wait_final(rpc: &mut StdioClient, sandbox: &str, task: &str, limit: Duration, poll: Duration) -> Result<Value> {
    let deadline = Instant::now() + limit;
    loop {
        let s = rpc.tool("get_task", &json!({"sandbox_id": sandbox, "task_id": task, "limit": 1}))?;
        if state(&s) != "running" {
            return Ok(s);
        }
        if Instant::now() >= deadline {
            bail!("task {task} still running after {limit:?}");
        }
        thread::sleep(poll);
    }
}
