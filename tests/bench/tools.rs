//! One-shot tool calls against process floors: `run_command "true"` through the control session
//! against spawning `sh -c true`.

use crate::bench::Bench;
use crate::control::Ctl;
use crate::probes::interleave;
use crate::process::{sh, spawn_time};
use crate::session::Tools;
use crate::table::Row;
use crate::units::{dur, times};
use anyhow::Result;
use serde_json::json;

/// `run_command "true"` against `sh -c true`, interleaved.
pub fn run_command_vs_floor(b: &mut Bench, ctl: &mut Ctl) -> Result<()> {
    let (warm, rounds, block) = (b.n(30), b.n(10), b.n(30));
    let args = json!({"sandbox_id": ctl.plain, "command": "true"});
    let rpc = &mut ctl.rpc;
    let xs = interleave(
        warm,
        rounds,
        block,
        &mut [Box::new(|| rpc.timed("run_command", &args, |r| r["exit_code"] == json!(0))), Box::new(|| spawn_time(&mut sh("true", &[])))],
    )?;
    let ours = b.keep("run_command_true", &xs[0]);
    let floor = b.keep("floor.sh_c_true", &xs[1]);
    b.row(Row::floor("server core", "`sh -c true` spawn", &floor));
    let r = ours.median / floor.median;
    b.row(
        Row::new("server core", format!("`run_command \"true\"` (stdio session, local provider, isolation {})", ctl.isolation))
            .lat(&ours)
            .vs(format!("`sh -c true` {}", dur(floor.median)))
            .ratio(format!("{} floor", times(r)))
            .target("≤ 2× floor", r <= 2.0),
    );
    Ok(())
}
