//! pueue, a task queue daemon, against the task tools: add a job and read its log until the
//! output shows, then kill it; the same work through a stdio session and through one
//! `sandbox-mcp call` process per step.

use crate::bench::Bench;
use crate::control::Ctl;
use crate::process::stop_child;
use crate::session::{state, Tools};
use crate::stats::Stats;
use crate::table::Row;
use crate::units::{dur, secs, times};
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// A pueued daemon with its own configuration and directories under the work directory.
struct Pueue {
    bin: PathBuf,
    cfg: PathBuf,
    daemon: Child,
}

impl Pueue {
    /// Starts pueued from `dir` and waits until it answers.
    fn start(b: &Bench, dir: &Path) -> Result<Pueue> {
        let root = b.o.work.join("pueue");
        for d in ["data", "run"] {
            fs::create_dir_all(root.join(d))?;
        }
        let cfg = root.join("pueue.yml");
        fs::write(
            &cfg,
            format!(
                "shared:\n  pueue_directory: {0}/data\n  runtime_directory: {0}/run\n  use_unix_socket: true\n  unix_socket_path: {0}/run/pueue.sock\n",
                root.display()
            ),
        )?;
        let log = File::create(b.log("pueued"))?;
        let daemon = Command::new(dir.join("pueued"))
            .arg("-c")
            .arg(&cfg)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .context("starting pueued")?;
        b.track(daemon.id(), "pueued")?;
        let mut p = Pueue { bin: dir.join("pueue"), cfg, daemon };
        let deadline = Instant::now() + Duration::from_secs(10);
        while p.run(&["status"]).is_err() {
            if Instant::now() > deadline {
                bail!("pueued did not answer within 10 s (see {})", b.log("pueued").display());
            }
            if let Ok(Some(st)) = p.daemon.try_wait() {
                bail!("pueued exited: {st}");
            }
            thread::sleep(Duration::from_millis(20));
        }
        Ok(p)
    }

    /// One `pueue` command: its wall time and stdout.
    fn run(&self, args: &[&str]) -> Result<(f64, String)> {
        let t = Instant::now();
        let out = Command::new(&self.bin)
            .arg("-c")
            .arg(&self.cfg)
            .args(args)
            .env("NO_COLOR", "1")
            .env("RUST_BACKTRACE", "0")
            .stdin(Stdio::null())
            .output()
            .context("running pueue")?;
        let e = secs(t);
        if !out.status.success() {
            bail!("pueue {args:?} failed: {}", String::from_utf8_lossy(&out.stderr).lines().next().unwrap_or(""));
        }
        Ok((e, String::from_utf8_lossy(&out.stdout).into_owned()))
    }

    /// Kills its jobs and stops the daemon.
    fn stop(mut self) {
        let _ = self.run(&["kill", "--all"]);
        stop_child(&mut self.daemon, Duration::from_secs(5));
    }
}

impl Drop for Pueue {
    fn drop(&mut self) {
        stop_child(&mut self.daemon, Duration::from_secs(2));
    }
}

/// Per cycle: (start, read until "hello" is visible, stop), in seconds.
type Cycles = Vec<[f64; 3]>;

/// The job of every cycle: output at once, then a long sleep until it is killed.
const PUEUE_WORK: &str = "echo hello; sleep 60";

/// `n` cycles of `pueue add`, `pueue log` until "hello" shows, `pueue kill`.
fn pueue_cycles(p: &Pueue, n: usize) -> Result<Cycles> {
    let mut out = Vec::new();
    for _ in 0..n {
        let (add, id) = p.run(&["add", "-i", "-p", "--", PUEUE_WORK])?;
        let id = id.trim().to_string();
        let mut log = 0.0;
        for attempt in 0.. {
            let (t, text) = p.run(&["log", &id, "--json"])?;
            log += t;
            if text.contains("hello") {
                break;
            }
            if attempt > 500 {
                bail!("pueue task {id} never showed its output");
            }
        }
        let (kill, _) = p.run(&["kill", &id])?;
        out.push([add, log, kill]);
    }
    Ok(out)
}

/// The same work through a long-lived stdio session (`call: false`) or one `sandbox-mcp call`
/// process per step.
fn task_cycles(b: &Bench, ctl: &mut Ctl, n: usize, call: bool) -> Result<Cycles> {
    let plain = ctl.plain.clone();
    let step = |ctl: &mut Ctl, tool: &str, args: Value| -> Result<(f64, Value)> {
        let t = Instant::now();
        let v = if call {
            let out = b.ours(&["call", tool, &args.to_string()]).stdin(Stdio::null()).output()?;
            if !out.status.success() {
                bail!("sandbox-mcp call {tool} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
            }
            serde_json::from_slice(&out.stdout)?
        } else {
            ctl.rpc.tool(tool, &args)?
        };
        Ok((secs(t), v))
    };
    let mut out = Vec::new();
    for _ in 0..n {
        let (start, snap) = step(ctl, "start_task", json!({"sandbox_id": plain, "command": PUEUE_WORK, "timeout": 120}))?;
        let task = snap["task_id"].as_str().context("no task_id")?.to_string();
        let mut read = 0.0;
        for attempt in 0.. {
            let (t, s) = step(ctl, "get_task", json!({"sandbox_id": plain, "task_id": task}))?;
            read += t;
            if s["stdout"].as_str().is_some_and(|o| o.contains("hello")) {
                break;
            }
            if attempt > 500 {
                bail!("task {task} never showed its output");
            }
        }
        let (cancel, fin) = step(ctl, "cancel_task", json!({"sandbox_id": plain, "task_id": task}))?;
        if state(&fin) != "cancelled" {
            bail!("cancel_task ended {fin}");
        }
        ctl.delete_task(&plain, &task)?;
        out.push([start, read, cancel]);
    }
    Ok(out)
}

/// pueue against the task tools, interleaved in blocks of five cycles.
pub fn pueue_vs_tasks(b: &mut Bench, ctl: &mut Ctl) -> Result<()> {
    let Some(dir) = b.o.pueue_dir.clone() else {
        b.row(Row::new("pueue", "pueue add / log / kill").not_measured("pueue is not installed (tests/bench/run.sh installs it)"));
        return Ok(());
    };
    let n = b.n(20);
    let p = Pueue::start(b, &dir)?;
    pueue_cycles(&p, 2)?;
    task_cycles(b, ctl, 2, false)?;
    task_cycles(b, ctl, 1, true)?;
    // Interleaved in blocks of five cycles.
    let (mut pq, mut session, mut call) = (Vec::new(), Vec::new(), Vec::new());
    let blocks = n.div_ceil(5);
    for _ in 0..blocks {
        pq.extend(pueue_cycles(&p, 5)?);
        session.extend(task_cycles(b, ctl, 5, false)?);
        call.extend(task_cycles(b, ctl, 5, true)?);
    }
    p.stop();
    let keep = |b: &mut Bench, key: &str, c: &Cycles| -> (Stats, Stats) {
        let start_read: Vec<f64> = c.iter().map(|x| x[0] + x[1]).collect();
        let stop: Vec<f64> = c.iter().map(|x| x[2]).collect();
        b.keep_value(&format!("{key}.cycles"), json!(c));
        (b.keep(&format!("{key}.start_and_read"), &start_read), b.keep(&format!("{key}.stop"), &stop))
    };
    let (p_sr, p_kill) = keep(b, "pueue", &pq);
    let (s_sr, s_cancel) = keep(b, "tasks_stdio_session", &session);
    let (c_sr, c_cancel) = keep(b, "tasks_sandbox_mcp_call", &call);
    b.row(Row::new("pueue", "`pueue add` + `pueue log` until the output shows").lat(&p_sr));
    if let Some(start) = b.kept_median("start_task_running_command") {
        let r = start / p_sr.median;
        b.row(
            Row::new("pueue", "`start_task` of a still-running command, until its answer (from the tasks group)")
                .value(dur(start))
                .vs(format!("pueue add + log {}", dur(p_sr.median)))
                .ratio(format!("{} pueue", times(r)))
                .target("faster than pueue (< 1×)", r < 1.0),
        );
    }
    for (label, s) in [("stdio session", &s_sr), ("`sandbox-mcp call` per step", &c_sr)] {
        let r = s.median / p_sr.median;
        b.row(
            Row::new("pueue", format!("`start_task` + `get_task` until the output shows, {label}"))
                .lat(s)
                .vs(format!("pueue add + log {}", dur(p_sr.median)))
                .ratio(format!("{} pueue", times(r)))
                .target("faster than pueue (< 1×)", r < 1.0),
        );
    }
    b.row(Row::new("pueue", "`pueue kill`").lat(&p_kill));
    for (label, s) in [("stdio session", &s_cancel), ("`sandbox-mcp call`", &c_cancel)] {
        let r = s.median / p_kill.median;
        b.row(
            Row::new("pueue", format!("`cancel_task`, {label}"))
                .lat(s)
                .vs(format!("pueue kill {}", dur(p_kill.median)))
                .ratio(format!("{} pueue", times(r)))
                .note("cancel_task returns once the end is confirmed (state cancelled); pueue kill returns once the daemon has sent the signal"),
        );
    }
    Ok(())
}
