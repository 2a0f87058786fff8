//! The output pump: a task writing PUMP_BYTES (a tenth with `--quick`), start_task to its final
//! state, unmasked and masking five secrets, each run alternated with the one-pipe floor (`… |
//! cat > /dev/null`, the least any pump can cost) so that both see the same machine; how soon the
//! end reaches a waiting get_task under that stream; and the processor time the supervisor's
//! processes spend per MB against `cat`'s.

use crate::bench::Bench;
use crate::control::Ctl;
use crate::process::{sh, spawn_time};
use crate::session::{state, Tools};
use crate::stats::Stats;
use crate::table::Row;
use crate::units::{dur, per_s, secs, times};
use anyhow::{bail, Context, Result};
use sandbox_mcp::limits::MAX_LOG_BYTES;
use serde_json::{json, Value};
use std::fs;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Bytes the throughput task writes.
const PUMP_BYTES: u64 = 200_000_000;
/// A 99-character line (plus newline) for the throughput task, so masking works line by line.
const PUMP_LINE: &str = "0123456789abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789abcdefghijklmnopq";

/// One timed run of the task: wall time from the start_task request to the final snapshot, and
/// from the task's last instruction (its own timestamp on stderr) to that snapshot.
struct Run {
    wall: f64,
    end: f64,
}

/// `pairs` runs of a task, each paired with a run of the one-pipe floor `pipe_script`, the
/// floor first in even pairs and second in odd ones (so both see the same machine); `before`
/// runs at the start of every pair.
struct Pairs {
    pipe: Vec<f64>,
    task: Vec<f64>,
    ends: Vec<f64>,
    ratios: Vec<f64>,
}

fn alternate(
    pairs: usize,
    pipe_script: &str,
    mut before: impl FnMut() -> Result<()>,
    mut task: impl FnMut() -> Result<Run>,
) -> Result<Pairs> {
    let mut out = Pairs { pipe: Vec::new(), task: Vec::new(), ends: Vec::new(), ratios: Vec::new() };
    for i in 0..pairs {
        before()?;
        let (p, r) = if i % 2 == 0 {
            let p = spawn_time(&mut sh(pipe_script, &[]))?;
            (p, task()?)
        } else {
            let r = task()?;
            (spawn_time(&mut sh(pipe_script, &[]))?, r)
        };
        out.ratios.push(r.wall / p);
        out.pipe.push(p);
        out.task.push(r.wall);
        out.ends.push(r.end);
    }
    Ok(out)
}

fn now_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
}

/// Runs `command` as a task in `sandbox` and reads its end with one waiting get_task whose
/// offsets lie past the log cap (so only the end is news; another read follows only if the
/// 60 s wait ran out). The command ends with `date +%s%N >&2`, read back afterwards.
fn task_run(ctl: &mut Ctl, sandbox: &str, command: &str, limit: Duration) -> Result<(Run, Value)> {
    let t = Instant::now();
    let mut fin = ctl.rpc.tool("start_task", &json!({"sandbox_id": sandbox, "command": command, "timeout": 900}))?;
    let task = fin["task_id"].as_str().context("no task_id")?.to_string();
    let deadline = t + limit;
    while state(&fin) == "running" {
        if Instant::now() > deadline {
            bail!("task {task} still running after {limit:?}");
        }
        fin = ctl.rpc.tool(
            "get_task",
            &json!({"sandbox_id": sandbox, "task_id": task, "stdout_offset": MAX_LOG_BYTES, "stderr_offset": MAX_LOG_BYTES, "limit": 1, "wait": 60}),
        )?;
    }
    let wall = secs(t);
    let answered = now_ns();
    let logs = ctl.rpc.tool("get_task", &json!({"sandbox_id": sandbox, "task_id": task, "limit": 64}))?;
    let ended: u128 = logs["stderr"].as_str().unwrap_or("").trim().parse().with_context(|| format!("no end timestamp: {logs}"))?;
    ctl.delete_task(sandbox, &task)?;
    Ok((Run { wall, end: answered.saturating_sub(ended) as f64 / 1e9 }, fin))
}

/// The processor time (user + system, seconds) of this process's reaped children so far.
fn children_cpu(tick: f64) -> Result<f64> {
    let stat = fs::read_to_string("/proc/self/stat")?;
    stat_cpu(&stat, tick).context("unreadable /proc/self/stat")
}

/// cutime + cstime (fields 16 and 17) of a /proc/PID/stat line, in seconds.
fn stat_cpu(stat: &str, tick: f64) -> Option<f64> {
    let rest: Vec<&str> = stat.rsplit_once(") ")?.1.split_whitespace().collect();
    let cu: f64 = rest.get(13)?.parse().ok()?;
    let cs: f64 = rest.get(14)?.parse().ok()?;
    Some((cu + cs) / tick)
}

/// The processor time of everything the sandbox's init (pid 1 of an isolated sandbox) has
/// reaped so far: every process of the sandbox that has ended, with its own reaped children.
fn sandbox_cpu(ctl: &mut Ctl, sandbox: &str, tick: f64) -> Result<f64> {
    let r = ctl.rpc.tool("run_command", &json!({"sandbox_id": sandbox, "command": "read -r l </proc/1/stat && printf '%s\\n' \"$l\""}))?;
    let line = r["stdout"].as_str().unwrap_or("");
    stat_cpu(line, tick).with_context(|| format!("unreadable /proc/1/stat in the sandbox: {r}"))
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 where that fails).
fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// "median× (min–max×)" of per-pair ratios.
fn ratio_spread(s: &Stats, what: &str) -> String {
    format!("{} {what} (pairs {:.2}–{:.2}×)", times(s.median), s.min, s.max)
}

/// The pump rows: interleaved throughput (unmasked and masked), the end under the stream, and the
/// processor time per MB.
pub fn pump_throughput(b: &mut Bench, ctl: &mut Ctl) -> Result<()> {
    let bytes = if b.o.quick { PUMP_BYTES / 10 } else { PUMP_BYTES };
    let stream = format!("yes {PUMP_LINE} | head -c {bytes}");
    let cmd = format!("{stream}; date +%s%N >&2");
    let floor_script = format!("{stream} > /dev/null");
    // The same command piped once: the least any pump can cost (the timestamp included).
    let pipe_script = format!("{{ {cmd}; }} | cat > /dev/null");
    let mb = bytes as f64 / 1e6;
    let (plain, secret) = (ctl.plain.clone(), ctl.secret.clone());
    let check = |fin: &Value, what: &str| -> Result<()> {
        if state(fin) != "succeeded" || fin["stdout_truncated"] != json!(true) {
            bail!("the {what} throughput task ended {fin}");
        }
        Ok(())
    };
    let pairs = b.n(10).max(5);
    spawn_time(&mut sh(&pipe_script, &[]))?; // warm-up
    check(&task_run(ctl, &plain, &cmd, Duration::from_secs(300))?.1, "unmasked")?;

    // Floor and task alternated, the order swapped every pair.
    let mut floor = Vec::new();
    let before = || -> Result<()> {
        floor.push(spawn_time(&mut sh(&floor_script, &[]))?);
        Ok(())
    };
    let unmasked = alternate(pairs, &pipe_script, before, || {
        let (r, fin) = task_run(ctl, &plain, &cmd, Duration::from_secs(300))?;
        check(&fin, "unmasked")?;
        Ok(r)
    })?;
    let masked = alternate(
        pairs,
        &pipe_script,
        || Ok(()),
        || {
            let (r, fin) = task_run(ctl, &secret, &cmd, Duration::from_secs(600))?;
            check(&fin, "masked")?;
            Ok(r)
        },
    )?;
    let Pairs { pipe, task: unmasked, ends, ratios } = unmasked;
    let Pairs { pipe: pipe_m, task: masked, ends: ends_m, ratios: ratios_m } = masked;
    let floor = b.keep("floor.pump_dev_null", &floor);
    let pipe = b.keep("floor.pump_one_pipe", &pipe);
    let unmasked = b.keep("pump.unmasked", &unmasked);
    let ratios = b.keep("pump.unmasked_over_one_pipe", &ratios);
    let ends = b.keep("pump.end_to_waiting_answer", &ends);
    b.keep("floor.pump_one_pipe_masked_pairs", &pipe_m);
    let masked = b.keep("pump.masked", &masked);
    let ratios_m = b.keep("pump.masked_over_one_pipe", &ratios_m);
    let ends_m = b.keep("pump.masked_end_to_waiting_answer", &ends_m);
    b.keep_value("pump.bytes", json!(bytes));
    let rate = |s: &Stats| format!("{} ({:.0}–{:.0})", per_s(mb / s.median, "MB"), mb / s.max, mb / s.min);
    b.row(Row::new("tasks", format!("floor: `sh -c 'yes … | head -c {bytes} > /dev/null'`")).spread(&floor).rate(rate(&floor)));
    b.row(
        Row::new("tasks", "floor: the same piped once, `sh -c '{ …; date >&2; } | cat > /dev/null'` (the one-pipe floor)")
            .spread(&pipe)
            .rate(rate(&pipe)),
    );
    let note = format!(
        "{pairs} pairs, each the one-pipe floor and the task alternated (order swapped every pair); the end read with one waiting \
`get_task` whose offsets lie past the 1 MiB cap; the ratio is the median of the pairs' ratios; cells read median (min–max)"
    );
    b.row(
        Row::new("tasks", format!("task writing {} MB (`yes … | head -c {bytes}`), no masking: start_task → final", mb as u64))
            .spread(&unmasked)
            .rate(rate(&unmasked))
            .vs(format!("one-pipe floor {}", dur(pipe.median)))
            .ratio(ratio_spread(&ratios, "one-pipe floor"))
            .target("≤ 1.3× the one-pipe floor", ratios.median <= 1.3)
            .note(note.clone()),
    );
    let rate_m = mb / masked.median;
    b.row(
        Row::new("tasks", format!("task writing {} MB, masking 5 secrets: start_task → final", mb as u64))
            .spread(&masked)
            .rate(rate(&masked))
            .vs("one-pipe floor, own pairs")
            .ratio(ratio_spread(&ratios_m, "one-pipe floor"))
            .target("≥ 300 MB/s", rate_m >= 300.0)
            .note(note),
    );
    b.row(
        Row::new("tasks", format!("task end → answer of a waiting `get_task`, under a {} MB stream (no masking)", mb as u64))
            .spread(&ends)
            .note("from the task's last instruction (`date +%s%N >&2` after the stream) to the waiting read's answer")
            .target("median ≤ 30 ms", ends.median <= 0.030),
    );
    b.row(
        Row::new("tasks", format!("task end → answer of a waiting `get_task`, under a {} MB stream (masking)", mb as u64))
            .spread(&ends_m)
            .note("from the task's last instruction (`date +%s%N >&2` after the stream) to the waiting read's answer"),
    );
    cpu_per_mb(b, ctl, &stream, &cmd, mb)
}

/// Processor time per MB: the supervisor's processes (the start, the supervisor, its pumps and
/// timer: everything the sandbox's init reaps during one unmasked run, less the task's own
/// `yes | head` measured alone) against `cat`'s (the one-pipe floor less the `> /dev/null`
/// floor), both alternated.
fn cpu_per_mb(b: &mut Bench, ctl: &mut Ctl, stream: &str, cmd: &str, mb: f64) -> Result<()> {
    if ctl.isolation != "namespaces" {
        b.row(
            Row::new("tasks", "processor time per MB: the supervisor's processes against `cat`")
                .not_measured("needs an isolated sandbox (its init's reaped-children times hold the supervisor's processes)"),
        );
        return Ok(());
    }
    let tick = clock_ticks();
    let plain = ctl.plain.clone();
    let floor_script = format!("{stream} > /dev/null");
    let pipe_script = format!("{{ {cmd}; }} | cat > /dev/null");
    let (mut ours, mut cat) = (Vec::new(), Vec::new());
    for _ in 0..b.n(5).max(3) {
        let c0 = children_cpu(tick)?;
        spawn_time(&mut sh(&floor_script, &[]))?;
        let c1 = children_cpu(tick)?;
        spawn_time(&mut sh(&pipe_script, &[]))?;
        let c2 = children_cpu(tick)?;
        let alone = c1 - c0;
        cat.push(((c2 - c1) - alone) / mb);
        // No reads while it runs: the wait is a sleep on this side, then plain reads until the
        // final state, then a moment for the init to reap the supervisor.
        let s0 = sandbox_cpu(ctl, &plain, tick)?;
        let snap = ctl.rpc.tool("start_task", &json!({"sandbox_id": plain, "command": cmd, "timeout": 900}))?;
        let task = snap["task_id"].as_str().context("no task_id")?.to_string();
        thread::sleep(Duration::from_millis(if b.o.quick { 100 } else { 500 }));
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            let s = ctl.rpc.tool("get_task", &json!({"sandbox_id": plain, "task_id": task, "limit": 1}))?;
            if state(&s) != "running" {
                break;
            }
            if Instant::now() > deadline {
                bail!("task {task} still running after 300 s");
            }
            thread::sleep(Duration::from_millis(100));
        }
        thread::sleep(Duration::from_millis(200));
        let s1 = sandbox_cpu(ctl, &plain, tick)?;
        ctl.delete_task(&plain, &task)?;
        ours.push(((s1 - s0) - alone) / mb);
    }
    let ours = b.keep("pump.cpu_per_mb", &ours);
    let cat = b.keep("floor.cat_cpu_per_mb", &cat);
    let us = |x: f64| format!("{:.0} µs/MB", x * 1e6);
    b.row(
        Row::new("tasks", "processor time (user + system) per MB: the supervisor's processes, unmasked")
            .value(format!("{} ({}–{})", us(ours.median), us(ours.min), us(ours.max)))
            .vs(format!("`cat` {} ({}–{})", us(cat.median), us(cat.min), us(cat.max)))
            .ratio(format!("{} `cat`", times(ours.median / cat.median)))
            .note(
                "everything the sandbox's init reaped during one run (the start snippet, the supervisor, its pumps and timer, one status \
read), less the task's own `yes | head` measured alone; `cat`: the one-pipe floor less the `> /dev/null` floor; clock-tick resolution",
            ),
    );
    Ok(())
}
