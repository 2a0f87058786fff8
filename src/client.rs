//! A minimal MCP client over a child's stdio: used by `sandbox-mcp demo`, the benchmarks and
//! the integration tests, so that all three drive the real server the way MCP hosts do.

use anyhow::{anyhow, bail, Context, Result};
use crossbeam_channel::Receiver;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A server process spoken to over its stdin and stdout.
pub struct StdioClient {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    next_id: i64,
}

impl StdioClient {
    /// Starts `program args...` with `envs` added to (or, with `clear_env`, replacing) this
    /// process's environment. stderr is inherited.
    pub fn spawn(program: &Path, args: &[&str], envs: &[(&str, &str)], clear_env: bool) -> Result<StdioClient> {
        let mut cmd = Command::new(program);
        cmd.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        if clear_env {
            cmd.env_clear();
        }
        cmd.envs(envs.iter().copied());
        let mut child = cmd.spawn().with_context(|| format!("starting {}", program.display()))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().context("child has no stdout")?;
        let (tx, rx) = crossbeam_channel::unbounded();
        std::thread::Builder::new().name("mcp-client-stdout".into()).spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        })?;
        Ok(StdioClient { child, stdin, lines: rx, next_id: 1 })
    }

    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends one raw line.
    pub fn send_line(&mut self, line: &str) -> Result<()> {
        let stdin = self.stdin.as_mut().ok_or_else(|| anyhow!("stdin already closed"))?;
        stdin.write_all(line.as_bytes())?;
        stdin.write_all(b"\n")?;
        stdin.flush()?;
        Ok(())
    }

    /// Waits for the next line on stdout.
    pub fn recv_line(&self, timeout: Duration) -> Result<String> {
        self.lines.recv_timeout(timeout).map_err(|_| anyhow!("no message from the server within {timeout:?}"))
    }

    /// Waits for the response with id `id`, skipping notifications and other responses.
    pub fn recv_response(&self, id: &Value, timeout: Duration) -> Result<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self.recv_line(left)?;
            let msg: Value = serde_json::from_str(&line).with_context(|| format!("server wrote a non-JSON line: {line:?}"))?;
            if msg.get("id") == Some(id) {
                return Ok(msg);
            }
        }
    }

    /// Sends a request and returns the whole response message.
    pub fn request(&mut self, method: &str, params: Value, timeout: Duration) -> Result<Value> {
        let id = json!(self.next_id);
        self.next_id += 1;
        self.send_line(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string())?;
        self.recv_response(&id, timeout)
    }

    /// `initialize` + `notifications/initialized`.
    pub fn initialize(&mut self) -> Result<Value> {
        let params =
            json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "sandbox-mcp-client", "version": "0"}});
        let resp = self.request("initialize", params, Duration::from_secs(10))?;
        self.send_line(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string())?;
        resp.get("result").cloned().ok_or_else(|| anyhow!("initialize failed: {resp}"))
    }

    /// Calls a tool and returns its `CallToolResult` (errors only for protocol failures).
    pub fn call_tool(&mut self, name: &str, arguments: Value, timeout: Duration) -> Result<Value> {
        let resp = self.request("tools/call", json!({"name": name, "arguments": arguments}), timeout)?;
        match resp.get("result") {
            Some(r) => Ok(r.clone()),
            None => bail!("tools/call {name} failed: {resp}"),
        }
    }

    /// Closes stdin and waits for the process to exit (killing it after `timeout`).
    pub fn close(mut self, timeout: Duration) -> Result<ExitStatus> {
        drop(self.stdin.take());
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let status = self.child.wait()?;
                bail!("server did not exit within {timeout:?} of stdin EOF (killed: {status})");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Kills the process (SIGKILL) and reaps it.
    pub fn kill(mut self) -> Result<ExitStatus> {
        self.child.kill()?;
        Ok(self.child.wait()?)
    }
}

impl Drop for StdioClient {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
