//! The control session: one long-lived stdio session of sandbox-mcp on the local provider, with
//! the sandboxes and the finished task that the tool benchmarks use.

use crate::bench::Bench;
use crate::session::{self, state, wait_final, Tools};
use anyhow::{anyhow, bail, Context, Result};
use sandbox_mcp::client::StdioClient;
use serde_json::{json, Value};
use std::time::Duration;

/// One long-lived stdio session holding the sandboxes the tool benchmarks use.
pub struct Ctl {
    pub rpc: StdioClient,
    /// A sandbox without secrets.
    pub plain: String,
    /// A sandbox with five secret-named variables (masking in effect).
    pub secret: String,
    /// A finished task in `plain` whose stdout is "hello\n".
    pub done_task: String,
    /// How the control sandboxes are isolated (`namespaces` where the host allows it).
    pub isolation: String,
}

/// Five secret-named variables, for the sandbox with masking in effect.
fn secret_envs() -> Value {
    json!({
        "API_TOKEN": "tok-3f9a8c1d2e7b",
        "SECRET_KEY": "sk-live-8e7d6c5b4a39",
        "GITHUB_TOKEN": "ghp-0a1b2c3d4e5f6a7b",
        "DB_PASSWORD": "hunter2-correct-horse",
        "AWS_ACCESS_KEY_ID": "AKIA0123456789ABCDEF",
    })
}

impl Ctl {
    /// Starts the session and creates the sandboxes and the finished task.
    pub fn start(b: &Bench) -> Result<Ctl> {
        let mut rpc = session::spawn(b.ours(&["stdio"]), &b.log("control"))?;
        session::initialize(&mut rpc)?;
        let id = |v: Value| v["sandbox_id"].as_str().map(str::to_string).ok_or_else(|| anyhow!("create_sandbox returned {v}"));
        let created = rpc.tool("create_sandbox", &json!({"timeout": 3600}))?;
        let isolation = created["isolation"].as_str().unwrap_or("?").to_string();
        let plain = id(created)?;
        let secret = id(rpc.tool("create_sandbox", &json!({"timeout": 3600, "envs": secret_envs()}))?)?;
        let snap = rpc.tool("start_task", &json!({"sandbox_id": plain, "command": "echo hello"}))?;
        let done_task = snap["task_id"].as_str().context("start_task returned no task_id")?.to_string();
        let fin = wait_final(&mut rpc, &plain, &done_task, Duration::from_secs(10), Duration::from_millis(10))?;
        if state(&fin) != "succeeded" {
            bail!("`echo hello` ended {fin}");
        }
        Ok(Ctl { rpc, plain, secret, done_task, isolation })
    }

    /// Deletes a finished task.
    pub fn delete_task(&mut self, sandbox: &str, task: &str) -> Result<()> {
        self.rpc.tool("delete_task", &json!({"sandbox_id": sandbox, "task_id": task}))?;
        Ok(())
    }

    /// Kills the sandboxes and ends the session.
    pub fn finish(mut self) -> Result<()> {
        for id in [self.plain.clone(), self.secret.clone()] {
            self.rpc.tool("kill_sandbox", &json!({"sandbox_id": id}))?;
        }
        self.rpc.end()
    }
}
