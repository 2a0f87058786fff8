//! The background task tools against process floors: get_task against reading a file,
//! start_task against `nohup … &`, cancel latency, and how soon a written line is visible through
//! get_task. The output pump's rows are in [`crate::pump`].

use crate::bench::{Bench, MAX_ITERATIONS};
use crate::control::Ctl;
use crate::probes::interleave;
use crate::process::{sh, spawn_time};
use crate::session::{state, wait_final, Tools};
use crate::stats::Stats;
use crate::table::Row;
use crate::units::{dur, secs, times};
use anyhow::{bail, Context, Result};
use serde_json::json;
use std::fs;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// get_task of a finished task against `cat /proc/self/stat` and `tail -c` of a log, interleaved.
pub fn get_task_vs_floors(b: &mut Bench, ctl: &mut Ctl) -> Result<()> {
    let (warm, rounds, block) = (b.n(30), b.n(10), b.n(30));
    let log = b.o.work.join("floor-task.log");
    fs::write(&log, "hello\n")?;
    let log = log.to_string_lossy().to_string();
    let args = json!({"sandbox_id": ctl.plain, "task_id": ctl.done_task});
    let ctl_isolation = ctl.isolation.clone();
    let rpc = &mut ctl.rpc;
    let xs = interleave(
        warm,
        rounds,
        block,
        &mut [
            Box::new(|| rpc.timed("get_task", &args, |r| r["stdout"] == json!("hello\n"))),
            Box::new(|| spawn_time(&mut sh("cat /proc/self/stat >/dev/null", &[]))),
            Box::new(|| spawn_time(&mut sh("tail -c 16384 \"$1\" >/dev/null", &[&log]))),
        ],
    )?;
    let ours = b.keep("get_task", &xs[0]);
    let stat = b.keep("floor.cat_proc_self_stat", &xs[1]);
    let tail = b.keep("floor.tail_c", &xs[2]);
    b.row(Row::floor("tasks", "`sh -c 'cat /proc/self/stat >/dev/null'`", &stat));
    b.row(Row::floor("tasks", "`sh -c 'tail -c 16384 log'` (reading a log)", &tail));
    let r = ours.median / stat.median;
    b.row(
        Row::new("tasks", format!("`get_task` round trip (finished task, stdio, isolation {})", ctl_isolation))
            .lat(&ours)
            .vs(format!("`cat /proc/self/stat` {}", dur(stat.median)))
            .ratio(format!("{} floor", times(r)))
            .target("≤ 3× floor", r <= 3.0),
    );
    let r = ours.median / tail.median;
    b.row(
        Row::new("tasks", "`get_task` vs reading the log with `tail -c`")
            .lat(&ours)
            .vs(format!("`tail -c` {}", dur(tail.median)))
            .ratio(format!("{} floor", times(r))),
    );
    Ok(())
}

/// start_task of `true` until its final snapshot against a `nohup` background start, interleaved.
pub fn start_task_vs_nohup(b: &mut Bench, ctl: &mut Ctl) -> Result<()> {
    let (warm, rounds, block) = (b.n(5), b.n(6), b.n(10));
    let out = b.o.work.join("nohup.log").to_string_lossy().to_string();
    let plain = ctl.plain.clone();
    let mut direct = 0usize;
    let mut total = 0usize;
    let xs = interleave(
        warm,
        rounds,
        block,
        &mut [
            Box::new(|| {
                let t = Instant::now();
                let snap = ctl.rpc.tool("start_task", &json!({"sandbox_id": plain, "command": "true"}))?;
                let task = snap["task_id"].as_str().context("no task_id")?.to_string();
                total += 1;
                let fin = if state(&snap) == "running" {
                    wait_final(&mut ctl.rpc, &plain, &task, Duration::from_secs(10), Duration::from_millis(2))?
                } else {
                    direct += 1;
                    snap
                };
                let e = secs(t);
                if state(&fin) != "succeeded" {
                    bail!("start_task true ended {fin}");
                }
                ctl.delete_task(&plain, &task)?;
                Ok(e)
            }),
            Box::new(|| spawn_time(&mut sh("nohup true >\"$1\" 2>&1 &", &[&out]))),
        ],
    )?;
    let ours = b.keep("start_task_true_until_final", &xs[0]);
    let floor = b.keep("floor.nohup_start", &xs[1]);
    b.row(Row::new("tasks", "floor: `sh -c 'nohup true > log 2>&1 &'` (background start)").spread(&floor));
    let r = ours.median / floor.median;
    b.row(
        Row::new("tasks", "`start_task` of `true` until its final snapshot")
            .spread(&ours)
            .vs(format!("`nohup … &` {}", dur(floor.median)))
            .ratio(format!("{} floor", times(r)))
            .target("≤ 3× floor", r <= 3.0)
            .note(format!("{direct} of {total} start_task calls (warm-up included) already returned the final snapshot")),
    );
    Ok(())
}

/// cancel_task of a TERM-respecting and of a TERM-ignoring task.
pub fn cancel_latency(b: &mut Bench, ctl: &mut Ctl) -> Result<()> {
    let plain = ctl.plain.clone();
    let mut starts = Vec::new();
    // Each start alternated with the spawn floor (`sh -c 'cat /proc/self/stat'`).
    let mut spawns = Vec::new();
    let mut run = |ctl: &mut Ctl, command: &str, n: usize| -> Result<Vec<f64>> {
        let mut xs = Vec::new();
        for _ in 0..n {
            spawns.push(spawn_time(&mut sh("cat /proc/self/stat >/dev/null", &[]))?);
            let t = Instant::now();
            let snap = ctl.rpc.tool("start_task", &json!({"sandbox_id": plain, "command": command, "timeout": 120}))?;
            starts.push(secs(t));
            let task = snap["task_id"].as_str().context("no task_id")?.to_string();
            if state(&snap) != "running" {
                bail!("{command:?} is not running: {snap}");
            }
            let t = Instant::now();
            let fin = ctl.rpc.tool("cancel_task", &json!({"sandbox_id": plain, "task_id": task}))?;
            xs.push(secs(t));
            if state(&fin) != "cancelled" {
                bail!("cancel_task of {command:?} ended {fin}");
            }
            ctl.delete_task(&plain, &task)?;
        }
        Ok(xs)
    };
    let term = run(ctl, "sleep 60", b.n(12))?;
    let ignoring = run(ctl, "trap '' TERM; sleep 60", b.n(3))?;
    let term = b.keep("cancel.term_respecting", &term);
    let ignoring = b.keep("cancel.term_ignoring", &ignoring);
    let starts = b.keep("start_task_running_command", &starts);
    let spawn = b.keep("floor.cat_proc_self_stat_with_starts", &spawns);
    let r = starts.median / spawn.median;
    let row = Row::new("tasks", "`start_task` of a still-running command (`sleep 60`), until its answer")
        .spread(&starts)
        .vs(format!("`sh -c 'cat /proc/self/stat'` {} ({}–{}), alternated", dur(spawn.median), dur(spawn.min), dur(spawn.max)))
        .ratio(format!("{} floor", times(r)))
        .target("≤ 8× the spawn floor", r <= 8.0);
    b.row(row.note(
        "start_task answers once the supervisor has confirmed the task's own process group (no watch, no sleep); pueue in the pueue group",
    ));
    b.row(Row::new("tasks", "`cancel_task`, TERM-respecting task (`sleep 60`)").lat(&term).target("< 300 ms", term.median < 0.3));
    b.row(
        Row::new("tasks", "`cancel_task`, TERM-ignoring task (`trap '' TERM; sleep 60`)")
            .lat(&ignoring)
            .target("< 3 s", ignoring.median < 3.0)
            .note("a TERM-ignoring task is KILLed after the 1.5 s cancel grace period, by design"),
    );
    Ok(())
}

/// A line written every 100 ms, seen through back-to-back get_task polls.
pub fn visibility(b: &mut Bench, ctl: &mut Ctl) -> Result<()> {
    let (s, polls) = line_latency(b, ctl, "line_visibility", 0)?;
    b.row(
        Row::new("tasks", "line written → visible through `get_task` (polling)")
            .lat(&s)
            .note(format!("one line every 100 ms, get_task polled back to back ({polls} polls); includes the get_task round trip")),
    );
    Ok(())
}

/// A line written every 100 ms, seen through `get_task` with `wait` (one waiting read per line).
pub fn visibility_waiting(b: &mut Bench, ctl: &mut Ctl) -> Result<()> {
    let (s, polls) = line_latency(b, ctl, "line_visibility_wait", 10)?;
    b.row(
        Row::new("tasks", "line written → visible through a waiting `get_task` (`wait: 10`)")
            .lat(&s)
            .note(format!("one line every 100 ms, each read waits for the next line ({polls} reads); includes the round trip"))
            .target("median ≤ 50 ms", s.median <= 0.050),
    );
    Ok(())
}

/// Latency from a line's write (its own timestamp) to its arrival in a get_task answer; reads
/// back to back, each waiting `wait` seconds for news (0: plain polls, 2 ms apart).
fn line_latency(b: &mut Bench, ctl: &mut Ctl, key: &str, wait: u64) -> Result<(Stats, u64)> {
    let lines = b.n(40).max(5);
    let cmd = format!("i=0; while [ $i -lt {lines} ]; do sleep 0.1; date +%s%N; i=$((i+1)); done");
    let plain = ctl.plain.clone();
    let snap = ctl.rpc.tool("start_task", &json!({"sandbox_id": plain, "command": cmd, "timeout": 120}))?;
    let task = snap["task_id"].as_str().context("no task_id")?.to_string();
    let now_ns = || SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let mut pending = String::new();
    let mut lat = Vec::new();
    let mut take = |text: &str, seen_ns: u128, lat: &mut Vec<f64>| {
        pending.push_str(text);
        while let Some(i) = pending.find('\n') {
            let line: String = pending.drain(..=i).collect();
            if let Ok(written) = line.trim().parse::<u128>() {
                lat.push(seen_ns.saturating_sub(written) as f64 / 1e9);
            }
        }
    };
    take(snap["stdout"].as_str().unwrap_or(""), now_ns(), &mut lat);
    let mut offset = snap["stdout_next_offset"].as_u64().unwrap_or(0);
    let mut fin = snap;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut polls = 0u64;
    while state(&fin) == "running" && Instant::now() < deadline && polls < MAX_ITERATIONS {
        if wait == 0 {
            thread::sleep(Duration::from_millis(2));
        }
        // stderr_offset past anything the task writes there, so only stdout counts as news.
        fin = ctl.rpc.tool(
            "get_task",
            &json!({"sandbox_id": plain, "task_id": task, "stdout_offset": offset, "stderr_offset": 1_048_576, "limit": 65536, "wait": wait}),
        )?;
        take(fin["stdout"].as_str().unwrap_or(""), now_ns(), &mut lat);
        offset = fin["stdout_next_offset"].as_u64().unwrap_or(offset);
        polls += 1;
    }
    ctl.delete_task(&plain, &task)?;
    if lat.len() < lines {
        bail!("saw {} of {lines} lines (final state {})", lat.len(), state(&fin));
    }
    Ok((b.keep(key, &lat), polls))
}
