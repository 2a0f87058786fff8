//! The benchmark driver of `make bench` (`tests/bench/run.sh` installs the peers, builds this
//! with `cargo build --release --example bench-driver` and runs it).
//!
//! Absolute times on a shared 2-core machine are noise, so every figure that has a target is a
//! ratio against a floor (a bare process doing the same OS work) or a peer (the official Python
//! SDK's server, the reference Node server, pueue) measured in the same run, interleaved where
//! that is possible. Everything runs with warm-up and repetitions; targets are checked on medians
//! unless they name the p99. The output is one Markdown table on stdout (also written to `--md`)
//! and every raw sample in `--json`.
//!
//! Every process this driver starts is stopped by its own pid; long-lived ones (HTTP servers,
//! pueued, the E2B emulator) are also listed in `WORK/pids` so that run.sh can stop them if the
//! driver dies.
//! Request loops are bounded in count and in time, and talk to 127.0.0.1 only.
//!
//! This file runs the sections in order and writes the report; each subject has its module:
//! the run's state ([`bench`]), statistics, figures and the table ([`stats`], [`units`],
//! [`table`]), processes and probes ([`process`], [`probes`]), the stdio sessions ([`session`],
//! [`control`]), and one module per group of rows.

#![forbid(unsafe_code)]

mod bare_relay;
mod bench;
mod concurrency;
mod control;
mod e2b;
mod egress;
mod emulator;
mod http;
mod http_client;
mod http_server;
mod interactive;
mod isolation;
mod load;
mod machine;
mod model;
mod options;
mod ports;
mod probes;
mod process;
mod processes;
mod protocol;
mod protocol_tasks;
mod proxy;
mod pueue;
mod pump;
mod requests;
mod session;
mod side;
mod stats;
mod stdio;
mod table;
mod tasks;
mod tools;
mod units;

use anyhow::{Context, Result};
use bench::Bench;
use control::Ctl;
use serde_json::{json, Map, Value};
use std::fs;
use std::process::ExitCode;
use std::thread;
use std::time::Instant;
use stdio::Peer;
use table::{Row, Verdict};
use units::secs;

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(err) => {
            eprintln!("bench-driver: {err:#}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<ExitCode> {
    let o = options::parse_opts()?;
    let home = o.work.join("home");
    fs::create_dir_all(&home).with_context(|| format!("creating {}", home.display()))?;
    let nproc = thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let mut b = Bench { o, home, rows: Vec::new(), raw: Map::new(), nproc, failed: 0, ours: None, stdio_floor: None };
    let started = Instant::now();
    let machine = machine::machine(&b);
    b.keep_value("machine", machine.clone());

    b.section("server core", "sandbox-mcp over stdio", stdio::core_stdio);
    let mut ctl = Ctl::start(&b).context("starting the control session (sandboxes for the tool benchmarks)")?;
    b.section("server core", "run_command vs sh -c true", |b| tools::run_command_vs_floor(b, &mut ctl));
    b.section("isolation", "isolated vs unisolated sandboxes", |b| isolation::isolation_rows(b, &mut ctl));
    b.section("egress", "the egress proxy", egress::egress_rows);
    b.section("ports", "an exposed port", ports::port_rows);
    b.section("peers", "Python SDK MCPServer (FastMCP)", |b| stdio::peer(b, Peer::Python));
    b.section("peers", "Node server-everything", |b| stdio::peer(b, Peer::Node));
    b.section("tasks", "get_task vs floors", |b| tasks::get_task_vs_floors(b, &mut ctl));
    b.section("tasks", "start_task vs nohup", |b| tasks::start_task_vs_nohup(b, &mut ctl));
    b.section("tasks", "cancel latency", |b| tasks::cancel_latency(b, &mut ctl));
    b.section("tasks", "output pump throughput", |b| pump::pump_throughput(b, &mut ctl));
    b.section("tasks", "line visibility", |b| tasks::visibility(b, &mut ctl));
    b.section("tasks", "line visibility, waiting read", |b| tasks::visibility_waiting(b, &mut ctl));
    b.section("tasks", "keystroke to a pty task", |b| interactive::keystroke_echo(b, &mut ctl));
    b.section("tasks", "tasks/get vs get_task", |b| protocol_tasks::tasks_get_vs_get_task(b, &mut ctl));
    b.section("tasks", "run_command promoted to a task", |b| protocol_tasks::promotion_latency(b, &mut ctl));
    b.section("tasks", "plain run_command promoted", |b| protocol_tasks::plain_promotion_latency(b, &mut ctl));
    b.section("tasks", "task end, waiting read", |b| protocol_tasks::end_to_waiting_answer(b, &mut ctl));
    b.section("model", "what the model pays: tool list, calls to follow, inline cap", |b| model::model_rows(b, &mut ctl));
    b.section("processes", "process creations per tool", processes::process_counts);
    b.section("pueue", "pueue vs task tools", |b| pueue::pueue_vs_tasks(b, &mut ctl));
    b.section("http", "HTTP ping, scaling and starvation", |b| http::http_ping(b, &ctl));
    b.section("protocol", "MCP 2026-07-28 next to 2025-11-25", protocol::modern_wire);
    b.section("concurrency", "HTTP tool calls vs clients and workers", |b| concurrency::http_tools(b, &ctl));
    b.section("e2b", "e2b provider against the E2B emulator", |b| e2b::e2b_rows(b, &mut ctl));
    if let Err(err) = ctl.finish() {
        eprintln!("bench: ending the control session: {err:#}");
    }

    let total = secs(started);
    let table = table::markdown(&b.rows);
    let rows: Vec<Value> = b.rows.iter().map(Row::json).collect();
    b.keep_value("rows", Value::Array(rows));
    b.keep_value("driver_seconds", json!(total));
    let met = b.rows.iter().filter(|r| r.verdict == Verdict::Met).count();
    let missed = b.rows.iter().filter(|r| r.verdict == Verdict::Missed).count();
    let unmeasured = b.rows.iter().filter(|r| r.verdict == Verdict::NotMeasured).count();
    let mut doc = String::new();
    doc.push_str(&format!(
        "## Benchmarks\n\nMachine: {} CPUs ({}), {} kernel {}; sandbox-mcp {}; peers: {}.\n\n",
        b.nproc,
        machine["cpu"].as_str().unwrap_or("?"),
        machine["os"].as_str().unwrap_or("Linux"),
        machine["kernel"].as_str().unwrap_or("?"),
        machine["sandbox_mcp"].as_str().unwrap_or("?"),
        machine["peers"].as_str().unwrap_or("?"),
    ));
    doc.push_str(&table);
    doc.push_str(&format!(
        "\nTargets: {met} met, {missed} missed, {unmeasured} not measured. Targets are checked on medians unless they name the p99 \
(nearest rank: the maximum below 100 samples); \
\"× floor\" is sandbox-mcp's time divided by the floor's, \"× faster\" the peer's time divided by sandbox-mcp's. \
Floors and peers were measured in the same run (interleaved in blocks where possible); absolute times on a shared machine are noise. \
Measurements took {total:.0} s{}.\n\nReproduce: `make bench` (installs the peers under `.tools/`, writes raw samples to `bench-results/`).\n",
        if b.o.quick { " (quick mode: a tenth of the repetitions)" } else { "" }
    ));
    println!("{doc}");
    fs::write(&b.o.md, &doc).with_context(|| format!("writing {}", b.o.md.display()))?;
    let raw = serde_json::to_string(&Value::Object(std::mem::take(&mut b.raw)))?;
    fs::write(&b.o.json, raw).with_context(|| format!("writing {}", b.o.json.display()))?;
    Ok(if b.failed > 0 { ExitCode::from(1) } else { ExitCode::SUCCESS })
}
