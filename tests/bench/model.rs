//! What the model pays: the characters of `tools/list` (carried in every conversation), the calls
//! it takes to follow a job to its end, and the cost of capping run_command's inline output.

use crate::bench::Bench;
use crate::control::Ctl;
use crate::probes::{interleave, Probe};
use crate::protocol::MODERN_META;
use crate::session::{state, Tools, WAIT};
use crate::table::Row;
use crate::units::{dur, thousands, times};
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::cell::RefCell;

/// The budget of `tools/list`, in characters of its compact JSON result.
const TOOLS_LIST_BUDGET: usize = 9_000;

/// The figure before the tool texts were rewritten (commit 10ba875), for comparison.
const TOOLS_LIST_BEFORE: usize = 23_247;

/// The model rows: `tools/list` size in both eras, calls to follow a job, the inline cap's cost.
pub fn model_rows(b: &mut Bench, ctl: &mut Ctl) -> Result<()> {
    tools_list_size(b, ctl)?;
    calls_to_follow(b, ctl)?;
    inline_cap_cost(b, ctl)
}

fn tools_list_size(b: &mut Bench, ctl: &mut Ctl) -> Result<()> {
    let meta: Value = serde_json::from_str(MODERN_META)?;
    let eras = [("2025-11-25 session", None), ("2026-07-28 request", Some(json!({"_meta": meta})))];
    for (era, params) in eras {
        let result = ctl.rpc.result("tools/list", params.as_ref(), WAIT)?;
        let chars = result.to_string().chars().count();
        b.keep_value(&format!("tools_list_chars.{}", &era[..10]), json!(chars));
        b.row(
            Row::new("model", format!("`tools/list` result, compact JSON, {era}"))
                .value(format!("{} characters", thousands(chars)))
                .vs(format!("before the rewrite {} characters", thousands(TOOLS_LIST_BEFORE)))
                .ratio(times(chars as f64 / TOOLS_LIST_BEFORE as f64))
                .target(format!("≤ {} characters", thousands(TOOLS_LIST_BUDGET)), chars <= TOOLS_LIST_BUDGET),
        );
    }
    Ok(())
}

/// Calls (start_task included) until a job of `lines` lines, one a second, is read to its end
/// with every line: with `until: "exit"`, and with `until: "output"` (a read per burst of output).
fn calls_to_follow(b: &mut Bench, ctl: &mut Ctl) -> Result<()> {
    let lines = if b.o.quick { 8 } else { 40 };
    let command = format!("for i in $(seq {lines}); do echo \"line $i\"; sleep 1; done");
    let mut counts = Vec::new();
    for until in ["exit", "output"] {
        let snap = ctl.rpc.tool("start_task", &json!({"sandbox_id": ctl.plain, "command": command, "timeout": 600}))?;
        let task = snap["task_id"].as_str().context("start_task returned no task_id")?.to_string();
        let (mut calls, mut seen, mut offset, mut last) = (1, count_lines(&snap), snap["stdout_next_offset"].as_u64().unwrap_or(0), snap);
        while state(&last) == "running" {
            if calls > 10 * lines {
                bail!("following the {lines}-line job with until {until:?} took over {calls} calls");
            }
            last = ctl.rpc.tool(
                "get_task",
                &json!({"sandbox_id": ctl.plain, "task_id": task, "stdout_offset": offset, "wait": 60, "until": until}),
            )?;
            calls += 1;
            seen += count_lines(&last);
            offset = last["stdout_next_offset"].as_u64().unwrap_or(offset);
        }
        if state(&last) != "succeeded" || seen != lines {
            bail!("the {lines}-line job ended {} with {seen} lines read", state(&last));
        }
        ctl.delete_task(&ctl.plain.clone(), &task)?;
        b.keep_value(&format!("calls_to_follow.{until}"), json!(calls));
        counts.push(calls);
    }
    b.row(
        Row::new(
            "model",
            format!("calls to follow a {lines}-line, {lines}-second task to its end: start_task, then get_task `until: \"exit\"`"),
        )
        .value(format!("{} calls", counts[0]))
        .vs(format!("`until: \"output\"` {} calls", counts[1]))
        .target("≤ 3 calls", counts[0] <= 3),
    );
    Ok(())
}

fn count_lines(snapshot: &Value) -> usize {
    snapshot["stdout"].as_str().map_or(0, |s| s.matches('\n').count())
}

/// run_command of a 1 MiB output with the default inline cap (head and tail, the whole output
/// kept in a task directory) against the whole output inline (`max_output` 1 MiB), interleaved.
fn inline_cap_cost(b: &mut Bench, ctl: &mut Ctl) -> Result<()> {
    let (warm, rounds, block) = (b.n(5), b.n(20), 1);
    let command = "head -c 1048576 /dev/zero | tr '\\0' a";
    let capped = json!({"sandbox_id": ctl.plain, "command": command});
    let inline = json!({"sandbox_id": ctl.plain, "command": command, "max_output": 1_048_576});
    let made = RefCell::new(Vec::new());
    let rpc = RefCell::new(&mut ctl.rpc);
    let mut probes: Vec<Probe<'_>> = vec![
        Box::new(|| {
            let t = std::time::Instant::now();
            let r = rpc.borrow_mut().tool("run_command", &capped)?;
            let e = t.elapsed().as_secs_f64();
            if r["stdout_truncated"] != json!(true) || r["stdout_bytes"] != json!(1_048_576) {
                bail!("the capped run_command returned {}", r["stdout_bytes"]);
            }
            made.borrow_mut().extend(r["task_id"].as_str().map(str::to_string));
            Ok(e)
        }),
        Box::new(|| rpc.borrow_mut().timed("run_command", &inline, |r| r["stdout_bytes"] == json!(1_048_576))),
    ];
    let xs = interleave(warm, rounds, block, &mut probes)?;
    drop(probes);
    // Each capped call kept its output in a finished task: remove them (the sandbox keeps 128).
    let plain = ctl.plain.clone();
    for task in made.into_inner() {
        ctl.delete_task(&plain, &task)?;
    }
    let capped = b.keep("model.run_command_1mib.capped", &xs[0]);
    let inline = b.keep("model.run_command_1mib.inline", &xs[1]);
    let r = capped.median / inline.median;
    b.row(
        Row::new("model", "`run_command` of a 1 MiB output, default `max_output` (16 KiB inline, the rest kept for get_task)")
            .lat(&capped)
            .vs(format!("all of it inline {}", dur(inline.median)))
            .ratio(format!("{} inline", times(r)))
            .target("≤ 1.05× inline", r <= 1.05),
    );
    Ok(())
}
