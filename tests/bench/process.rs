//! Child processes as the floors and the cleanup need them: a shell running a script, the wall
//! time of a run, stopping a child by its own pid, and reading a process's RSS and liveness.

use crate::units::secs;
use anyhow::{anyhow, bail, Context, Result};
use std::fs;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// `/bin/sh -c SCRIPT sh ARGS...` with every stream closed (the local provider's shell).
pub fn sh(script: &str, args: &[&str]) -> Command {
    let mut c = Command::new("/bin/sh");
    c.arg("-c").arg(script).arg("sh").args(args).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    c
}

/// Wall time of running `cmd` to completion.
pub fn spawn_time(cmd: &mut Command) -> Result<f64> {
    let t = Instant::now();
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    let e = secs(t);
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(e)
}

/// Sends TERM to one child by its own pid (through the shell builtin), waits up to `wait`,
/// then KILLs it.
pub fn stop_child(child: &mut Child, wait: Duration) {
    if let Ok(None) = child.try_wait() {
        let _ = sh("kill -s TERM \"$1\"", &[&child.id().to_string()]).status();
        let deadline = Instant::now() + wait;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// The resident set size of `pid`, in KiB.
pub fn rss_kb(pid: u32) -> Result<u64> {
    status_kb(pid, "VmRSS")
}

/// Kilobytes of one `/proc/<pid>/status` field (`VmRSS`, `RssAnon`, ...).
pub fn status_kb(pid: u32, field: &str) -> Result<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).with_context(|| format!("reading /proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.strip_prefix(field).is_some_and(|rest| rest.starts_with(':')))
        .ok_or_else(|| anyhow!("no {field} for pid {pid}"))?;
    line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).ok_or_else(|| anyhow!("unreadable {field} line {line:?}"))
}

/// Whether `pid` exists and is not a zombie.
pub fn running(pid: u32) -> bool {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z'))
}
