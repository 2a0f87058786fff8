//! Protocol tasks: `tasks/get` against `get_task` of the same finished task, the promotion
//! latency of a 2026-07-28 run_command (from `--task-after` to the `CreateTaskResult`), and how
//! soon a waiting `get_task` answers once its task ends.

use crate::bench::Bench;
use crate::control::Ctl;
use crate::probes::interleave;
use crate::session::{self, state, Tools};
use crate::table::Row;
use crate::units::{dur, times};
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::cell::RefCell;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const WAIT: Duration = Duration::from_secs(60);

/// 2025-11-25 `tasks/get` and `get_task` of the same finished task, interleaved.
pub fn tasks_get_vs_get_task(b: &mut Bench, ctl: &mut Ctl) -> Result<()> {
    let (warm, rounds, block) = (b.n(30), b.n(10), b.n(30));
    let handle = format!("{}.{}", ctl.done_task, ctl.plain);
    let args = json!({"sandbox_id": ctl.plain, "task_id": ctl.done_task});
    // Both probes use the one control session, one call at a time.
    let rpc = RefCell::new(&mut ctl.rpc);
    let xs = interleave(
        warm,
        rounds,
        block,
        &mut [
            Box::new(|| rpc.borrow_mut().timed("get_task", &args, |r| r["state"] == "succeeded")),
            Box::new(|| {
                let t = Instant::now();
                let r = rpc.borrow_mut().request("tasks/get", json!({"taskId": handle}), WAIT)?;
                let e = t.elapsed().as_secs_f64();
                if r["result"]["status"] != "completed" {
                    bail!("tasks/get {handle} returned {r}");
                }
                Ok(e)
            }),
        ],
    )?;
    let ours = b.keep("get_task.same_task", &xs[0]);
    let tasks_get = b.keep("tasks_get", &xs[1]);
    let r = tasks_get.median / ours.median;
    b.row(
        Row::new("tasks", "2025-11-25 `tasks/get` (finished task, stdio)")
            .lat(&tasks_get)
            .vs(format!("`get_task` {}", dur(ours.median)))
            .ratio(format!("{} get_task", times(r)))
            .target("≤ 1.2× get_task", r <= 1.2),
    );
    Ok(())
}

/// A 2026-07-28 run_command (tasks extension declared) of `sleep 30` against a server with
/// `--task-after 1`: the time from the threshold to the `CreateTaskResult`.
pub fn promotion_latency(b: &mut Bench, ctl: &mut Ctl) -> Result<()> {
    let n = b.n(10).max(3);
    let mut rpc = session::spawn(b.ours(&["--task-after", "1", "stdio"]), &b.log("promotion"))?;
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
    });
    let mut late = Vec::with_capacity(n);
    for _ in 0..n {
        let args = json!({"sandbox_id": ctl.plain, "command": "sleep 30", "timeout": 60});
        let t = Instant::now();
        let r = rpc.request("tools/call", json!({"name": "run_command", "arguments": args, "_meta": meta}), WAIT)?;
        let e = t.elapsed().as_secs_f64();
        let result: &Value = &r["result"];
        if result["resultType"] != "task" {
            bail!("run_command was not answered with a task: {r}");
        }
        late.push((e - 1.0).max(0.0));
        let id = result["taskId"].as_str().context("no taskId")?;
        rpc.request("tasks/cancel", json!({"taskId": id, "_meta": meta}), WAIT)?;
    }
    rpc.end()?;
    let s = b.keep("promotion_latency", &late);
    b.row(
        Row::new("tasks", "2026-07-28 run_command → task: `--task-after` to `CreateTaskResult` (stdio)")
            .lat(&s)
            .note("measured from the call's start minus --task-after 1 s; includes the supervisor's start")
            .target("< 100 ms", s.median < 0.100),
    );
    Ok(())
}

/// A plain run_command (no task parameters, no extension) of `sleep 30` against a server with
/// `--task-after 1`: the time from the threshold to the `running` answer (the command adopted by
/// the supervisor, with its output so far).
pub fn plain_promotion_latency(b: &mut Bench, ctl: &mut Ctl) -> Result<()> {
    let n = b.n(10).max(3);
    let plain = ctl.plain.clone();
    let mut rpc = session::spawn(b.ours(&["--task-after", "1", "stdio"]), &b.log("plain-promotion"))?;
    session::initialize(&mut rpc)?;
    let mut late = Vec::with_capacity(n);
    for _ in 0..n {
        let args = json!({"sandbox_id": plain, "command": "echo started; sleep 30", "timeout": 60});
        let t = Instant::now();
        let r = rpc.tool("run_command", &args)?;
        let e = t.elapsed().as_secs_f64();
        if r["state"] != "running" || r["stdout"] != "started\n" {
            bail!("run_command was not answered as running with its output so far: {r}");
        }
        late.push((e - 1.0).max(0.0));
        let task = r["task_id"].as_str().context("no task_id")?.to_string();
        rpc.tool("cancel_task", &json!({"sandbox_id": plain, "task_id": task}))?;
        ctl.delete_task(&plain, &task)?;
    }
    rpc.end()?;
    let s = b.keep("plain_promotion_latency", &late);
    b.row(
        Row::new("tasks", "plain run_command → `running` answer at `--task-after` (stdio)")
            .lat(&s)
            .note("measured from the call's start minus --task-after 1 s; includes stopping the readers and the adopter's start")
            .target("< 100 ms", s.median < 0.100),
    );
    Ok(())
}

/// A task that ends while a `get_task` with `wait` is pending: the time from the task's last
/// instruction (its own nanosecond timestamp, written to stderr, which the waiting read skips)
/// to the waiting read's answer.
pub fn end_to_waiting_answer(b: &mut Bench, ctl: &mut Ctl) -> Result<()> {
    let n = b.n(30).max(3);
    let plain = ctl.plain.clone();
    let now_ns = || SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let mut late = Vec::with_capacity(n);
    for _ in 0..n {
        let snap = ctl.rpc.tool("start_task", &json!({"sandbox_id": plain, "command": "sleep 0.2; date +%s%N >&2", "timeout": 60}))?;
        let task = snap["task_id"].as_str().context("no task_id")?.to_string();
        // Offsets past anything the task writes: only the end is news.
        let waited = ctl.rpc.tool(
            "get_task",
            &json!({"sandbox_id": plain, "task_id": task, "stdout_offset": 1_048_576, "stderr_offset": 1_048_576, "limit": 1, "wait": 10}),
        )?;
        let answered = now_ns();
        if state(&waited) == "running" {
            bail!("the waiting get_task of {task} answered before the task ended: {waited}");
        }
        let logs = ctl.rpc.tool("get_task", &json!({"sandbox_id": plain, "task_id": task, "limit": 64}))?;
        let ended: u128 = logs["stderr"].as_str().unwrap_or("").trim().parse().with_context(|| format!("no end timestamp: {logs}"))?;
        late.push(answered.saturating_sub(ended) as f64 / 1e9);
        ctl.delete_task(&plain, &task)?;
    }
    let s = b.keep("end_to_waiting_answer", &late);
    b.row(
        Row::new("tasks", "task end → answer of a waiting `get_task` (`wait: 10`, stdio)")
            .lat(&s)
            .note("from the task's last `date +%s%N` to the answer; includes the exit, the supervisor's state write and the round trip")
            .target("median ≤ 50 ms", s.median <= 0.050),
    );
    Ok(())
}
