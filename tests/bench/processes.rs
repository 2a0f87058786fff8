//! Process creations per task tool in the sandbox (local provider): `run_command`, `get_task`,
//! `start_task` and `cancel_task`, counted as tests/it/processes.rs does.

use crate::bench::Bench;
use crate::session::{self, state, wait_final, Tools};
use crate::table::Row;
use anyhow::{bail, Context, Result};
use sandbox_mcp::client::StdioClient;
use serde_json::json;
use std::fs;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

/// Counts the processes each task tool creates in the sandbox (local provider), as
/// tests/it/processes.rs does: in a pid namespace of the server's own, the pid of a probe
/// (`echo $$` through run_command) numbers the clones since the previous probe, less the server's
/// pipe-reader threads per exec (two probes in a row measure them). Without a pid namespace, the
/// machine's `processes` counter (/proc/stat), the smallest of several rounds.
pub fn process_counts(b: &mut Bench) -> Result<()> {
    let ns = Command::new("unshare").args(["--fork", "--pid", "--mount-proc", "true"]).status().is_ok_and(|s| s.success());
    let cmd = if ns {
        // The same command and environment as `ours`, run under unshare.
        let ours = b.ours(&[]);
        let mut u = Command::new("unshare");
        u.args(["--fork", "--pid", "--mount-proc"]).arg(&b.o.bin).arg("stdio");
        for (k, v) in ours.get_envs() {
            match v {
                Some(v) => u.env(k, v),
                None => u.env_remove(k),
            };
        }
        u
    } else {
        b.ours(&["stdio"])
    };
    let mut rpc = session::spawn(cmd, &b.log("processes"))?;
    session::initialize(&mut rpc)?;
    let sb = rpc.tool("create_sandbox", &json!({"timeout": 600}))?["sandbox_id"].as_str().context("no sandbox_id")?.to_string();
    let machine = || -> Result<u64> {
        let stat = fs::read_to_string("/proc/stat")?;
        stat.lines()
            .find_map(|l| l.strip_prefix("processes "))
            .and_then(|v| v.trim().parse().ok())
            .context("no processes line in /proc/stat")
    };
    let probe = |rpc: &mut StdioClient| -> Result<u64> {
        if ns {
            let r = rpc.tool("run_command", &json!({"sandbox_id": sb, "command": "echo $$"}))?;
            r["stdout"].as_str().unwrap_or("").trim().parse().context("probe pid")
        } else {
            machine()
        }
    };
    let finish = |rpc: &mut StdioClient, task: &str| -> Result<()> {
        wait_final(rpc, &sb, task, Duration::from_secs(20), Duration::from_millis(5))?;
        Ok(())
    };
    // Warm: the first task of a user probes its tools once.
    let t = rpc.tool("start_task", &json!({"sandbox_id": sb, "command": "echo warm"}))?;
    finish(&mut rpc, t["task_id"].as_str().context("no task_id")?)?;
    // Clones between two probes around `f` (the probes' own excepted in the namespace).
    let count = |rpc: &mut StdioClient, f: &mut dyn FnMut(&mut StdioClient) -> Result<()>| -> Result<u64> {
        let a = probe(rpc)?;
        f(rpc)?;
        let z = probe(rpc)?;
        Ok(if ns { z.saturating_sub(a + 1) } else { z.saturating_sub(a) })
    };
    let rounds = if ns { 3 } else { 5 };
    let mut threads = u64::MAX;
    for _ in 0..5 {
        let c = if ns {
            count(&mut rpc, &mut |_| Ok(()))?
        } else {
            count(&mut rpc, &mut |rpc| rpc.tool("run_command", &json!({"sandbox_id": sb, "command": ":"})).map(drop))?.saturating_sub(1)
        };
        threads = threads.min(c);
    }
    // One exec per call, plus the first probe's in the namespace.
    let per_call = if ns { 2 * threads } else { threads };
    let measure = |rpc: &mut StdioClient, f: &mut dyn FnMut(&mut StdioClient) -> Result<()>| -> Result<u64> {
        let mut best = u64::MAX;
        for _ in 0..rounds {
            best = best.min(count(rpc, f)?.saturating_sub(per_call));
        }
        Ok(best)
    };
    let run = measure(&mut rpc, &mut |rpc| rpc.tool("run_command", &json!({"sandbox_id": sb, "command": "true"})).map(drop))?;
    let t = rpc.tool("start_task", &json!({"sandbox_id": sb, "command": "echo hello"}))?;
    let done = t["task_id"].as_str().context("no task_id")?.to_string();
    finish(&mut rpc, &done)?;
    let get = measure(&mut rpc, &mut |rpc| rpc.tool("get_task", &json!({"sandbox_id": sb, "task_id": done})).map(drop))?;
    let tag = format!("SANDBOX_MCP_SANDBOX={sb}");
    let timer_armed = || {
        fs::read_dir("/proc").into_iter().flatten().flatten().any(|e| {
            let cmd = fs::read(e.path().join("cmdline")).unwrap_or_default();
            cmd == b"sleep\x003599\x00"
                && fs::read(e.path().join("environ")).unwrap_or_default().windows(tag.len()).any(|w| w == tag.as_bytes())
        })
    };
    let (mut starts, mut cancels) = (u64::MAX, u64::MAX);
    for _ in 0..rounds {
        let mut task = String::new();
        starts = starts.min(
            count(&mut rpc, &mut |rpc| {
                let s = rpc.tool("start_task", &json!({"sandbox_id": sb, "command": "exec sleep 60", "timeout": 3599}))?;
                task = s["task_id"].as_str().context("no task_id")?.to_string();
                // The timer's sleep is the last process of a start, possibly just after the answer.
                let deadline = Instant::now() + Duration::from_secs(10);
                while !timer_armed() {
                    if Instant::now() > deadline {
                        bail!("the task's timer never showed");
                    }
                    thread::sleep(Duration::from_millis(1));
                }
                Ok(())
            })?
            .saturating_sub(per_call),
        );
        cancels = cancels.min(
            count(&mut rpc, &mut |rpc| {
                let s = rpc.tool("cancel_task", &json!({"sandbox_id": sb, "task_id": task}))?;
                if state(&s) != "cancelled" {
                    bail!("cancel_task ended {s}");
                }
                Ok(())
            })?
            .saturating_sub(per_call),
        );
    }
    rpc.tool("kill_sandbox", &json!({"sandbox_id": sb}))?;
    rpc.end()?;
    let how = if ns {
        format!("counted in a pid namespace of the server's own (probe pids; {threads} server threads per exec taken off)")
    } else {
        format!("counted with /proc/stat's machine-wide `processes` line, smallest of {rounds} rounds ({threads} server threads per exec taken off)")
    };
    b.keep_value("processes", json!({"run_command": run, "get_task": get, "start_task": starts, "cancel_task": cancels, "namespace": ns}));
    for (what, n) in [
        ("`run_command \"true\"`", run),
        ("`get_task` of a finished task (one log page)", get),
        ("`start_task` of `exec sleep 60` until its timer is armed", starts),
        ("`cancel_task` of that task until `cancelled`", cancels),
    ] {
        b.row(Row::new("processes", format!("processes created in the sandbox by {what}")).value(n.to_string()).note(how.clone()));
    }
    Ok(())
}
