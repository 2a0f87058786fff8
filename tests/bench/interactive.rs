//! Tasks with input: a keystroke to a pty task until its echo is readable with get_task,
//! against the get_task round trip alone (what reading the echo costs at least).

use crate::bench::Bench;
use crate::control::Ctl;
use crate::session::Tools;
use crate::table::Row;
use crate::units::{dur, times};
use anyhow::{bail, Context, Result};
use sandbox_mcp::client::StdioClient;
use serde_json::json;
use std::time::{Duration, Instant};

/// `send_input` of one byte to a pty task running `cat`, then `get_task` until the terminal's
/// echo of it is in the log; each keystroke is followed by a plain `get_task` (the floor).
pub fn keystroke_echo(b: &mut Bench, ctl: &mut Ctl) -> Result<()> {
    let (warm, n) = (b.n(10), b.n(200));
    let sb = ctl.plain.clone();
    let snap = ctl.rpc.tool("start_task", &json!({"sandbox_id": sb, "command": "cat >/dev/null", "pty": {}, "timeout": 600}))?;
    let task = snap["task_id"].as_str().context("start_task gave no task_id")?.to_string();
    let read = |rpc: &mut StdioClient, offset: u64| -> Result<u64> {
        let s = rpc.tool("get_task", &json!({"sandbox_id": sb, "task_id": task, "stdout_offset": offset, "limit": 64}))?;
        s["stdout_bytes"].as_u64().context("get_task gave no stdout_bytes")
    };
    let mut seen = 0u64;
    let (mut keys, mut floor) = (Vec::new(), Vec::new());
    for i in 0..warm + n {
        // A newline now and then: the terminal's line holds at most 4,095 characters.
        let key = if i % 64 == 63 { "\n" } else { "x" };
        let t = Instant::now();
        ctl.rpc.tool("send_input", &json!({"sandbox_id": sb, "task_id": task, "data": key}))?;
        loop {
            let bytes = read(&mut ctl.rpc, seen)?;
            if bytes > seen {
                seen = bytes;
                break;
            }
            if t.elapsed() > Duration::from_secs(10) {
                bail!("the echo of keystroke {i} did not come within 10 s");
            }
        }
        let key_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        read(&mut ctl.rpc, seen)?;
        let floor_s = t.elapsed().as_secs_f64();
        if i >= warm {
            keys.push(key_s);
            floor.push(floor_s);
        }
    }
    let _ = ctl.rpc.tool("cancel_task", &json!({"sandbox_id": sb, "task_id": task}));
    let keys = b.keep("pty.keystroke_echo", &keys);
    let floor = b.keep("pty.get_task_floor", &floor);
    b.row(Row::floor("tasks", "`get_task` round trip of a running pty task", &floor));
    b.row(
        Row::new(
            "tasks",
            format!("keystroke to a pty task until its echo is read (`send_input` + `get_task`, isolation {})", ctl.isolation),
        )
        .lat(&keys)
        .vs(format!("`get_task` {}", dur(floor.median)))
        .ratio(format!("{} floor", times(keys.median / floor.median)))
        .target("≤ 5 ms", keys.median <= 0.005),
    );
    Ok(())
}
