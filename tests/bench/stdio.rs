//! MCP servers over stdio: sandbox-mcp's own cold start, ping and tools/list round trips and
//! RSS (against a pipe round trip through `cat`), and the same measurements of the peers (the
//! Python SDK's server and the reference Node server) compared with sandbox-mcp's.

use crate::bench::Bench;
use crate::process::rss_kb;
use crate::session::{self, Tools, WAIT};
use crate::stats::Stats;
use crate::table::Row;
use crate::units::{dur, mib, secs, thousands, times};
use anyhow::{anyhow, bail, Result};
use sandbox_mcp::client::StdioClient;
use serde_json::{json, Value};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

/// One server's stdio figures.
#[derive(Clone, Copy)]
pub struct PeerFigures {
    pub cold: Stats,
    pub ping: Stats,
    pub list: Stats,
    pub rss_kb: u64,
}

/// The servers measured over stdio.
#[derive(Clone, Copy, PartialEq)]
pub enum Peer {
    Ours,
    Python,
    Node,
}

impl Peer {
    /// The prefix of its raw results.
    fn key(self) -> &'static str {
        match self {
            Peer::Ours => "sandbox_mcp",
            Peer::Python => "python_mcpserver",
            Peer::Node => "node_server_everything",
        }
    }

    /// Its name in the table.
    fn label(self) -> &'static str {
        match self {
            Peer::Ours => "sandbox-mcp",
            Peer::Python => "Python SDK MCPServer",
            Peer::Node => "server-everything (Node)",
        }
    }

    /// How to start it, when it is installed.
    fn command(self, b: &Bench) -> Option<Command> {
        match self {
            Peer::Ours => Some(b.ours(&["stdio"])),
            Peer::Python => {
                let mut c = Command::new(b.o.python.as_ref()?);
                c.arg(b.o.peer_py.as_ref()?);
                Some(c)
            }
            Peer::Node => {
                let mut c = Command::new(b.o.node.as_ref()?);
                c.arg(b.o.everything.as_ref()?).arg("stdio");
                Some(c)
            }
        }
    }

    /// A cheap tool call to warm up the tool path before the idle RSS is read.
    fn warm_call(self) -> (&'static str, Value) {
        match self {
            // Rejected by validation on a worker: the tools/call path without a process spawn.
            Peer::Ours => ("get_task", json!({"sandbox_id": "local-0", "task_id": "not-a-task"})),
            Peer::Python | Peer::Node => ("echo", json!({"message": "hi"})),
        }
    }
}

/// Cold starts, then one session: warm-up, idle RSS, ping and tools/list round trips. Returns
/// the figures and the session, still open.
fn measure_server(b: &mut Bench, peer: Peer, cold_n: usize, ping_n: usize, list_n: usize) -> Result<(PeerFigures, StdioClient)> {
    let key = peer.key();
    let log = b.log(key);
    let make = |b: &Bench| peer.command(b).ok_or_else(|| anyhow!("{} is not installed", peer.label()));
    let mut cold = Vec::new();
    for i in 0..cold_n + 2 {
        let cmd = make(b)?;
        let t = Instant::now();
        let mut rpc = session::spawn(cmd, &log)?;
        session::initialize(&mut rpc)?;
        let e = secs(t);
        drop(rpc); // killed: nothing was created
        if i >= 2 {
            cold.push(e);
        }
    }
    let cold = b.keep(&format!("{key}.cold_start"), &cold);
    let mut rpc = session::spawn(make(b)?, &log)?;
    session::initialize(&mut rpc)?;
    let (tool, args) = peer.warm_call();
    for _ in 0..b.n(300) {
        rpc.result("ping", None, WAIT)?;
    }
    for _ in 0..b.n(100) {
        rpc.result("tools/list", None, WAIT)?;
        rpc.tool_result(tool, &args)?;
    }
    thread::sleep(Duration::from_millis(300));
    let rss = rss_kb(rpc.pid())?;
    let mut ping = Vec::with_capacity(ping_n);
    for _ in 0..ping_n {
        let t = Instant::now();
        rpc.result("ping", None, WAIT)?;
        ping.push(secs(t));
    }
    let ping = b.keep(&format!("{key}.ping"), &ping);
    let rss_after_pings = rss_kb(rpc.pid())?;
    let mut list = Vec::with_capacity(list_n);
    for _ in 0..list_n {
        let t = Instant::now();
        let r = rpc.result("tools/list", None, WAIT)?;
        if r["tools"].as_array().is_none_or(Vec::is_empty) {
            bail!("{} answered tools/list without tools", peer.label());
        }
        list.push(secs(t));
    }
    let list = b.keep(&format!("{key}.tools_list"), &list);
    b.keep_value(&format!("{key}.rss_kb"), json!({"idle": rss, "after_pings": rss_after_pings, "pings": ping_n}));
    Ok((PeerFigures { cold, ping, list, rss_kb: rss }, rpc))
}

/// sandbox-mcp over stdio: the server core rows, and the figures the peer rows compare with.
pub fn core_stdio(b: &mut Bench) -> Result<()> {
    let (cold_n, ping_n, list_n) = (b.n(40), b.n(10_000), b.n(2_000));
    let (f, mut rpc) = measure_server(b, Peer::Ours, cold_n, ping_n, list_n)?;
    let idle = f.rss_kb;
    let after_pings = rss_kb(rpc.pid())?;
    // 10,000 more requests of every cheap kind: ping, tools/list and tools/call (answered by a
    // worker, through the queue).
    let (tool, args) = Peer::Ours.warm_call();
    let mixed = b.n(10_000);
    for i in 0..mixed {
        match i % 4 {
            0 | 1 => {
                rpc.result("ping", None, WAIT)?;
            }
            2 => {
                rpc.result("tools/list", None, WAIT)?;
            }
            _ => {
                rpc.tool_result(tool, &args)?;
            }
        }
    }
    thread::sleep(Duration::from_millis(200));
    let after_all = rss_kb(rpc.pid())?;
    rpc.end()?;
    let total = ping_n + list_n + mixed;
    b.keep_value("sandbox_mcp.rss_growth_kb", json!({"idle": idle, "after_pings": after_pings, "after_all": after_all, "requests": total}));

    // The floor of a stdio round trip: the same client, and `cat` echoing the request line.
    let mut echo = session::spawn(Command::new("cat"), &b.log("cat"))?;
    for _ in 0..b.n(300) {
        echo.result("ping", None, WAIT)?;
    }
    let mut xs = Vec::with_capacity(ping_n);
    for _ in 0..ping_n {
        let t = Instant::now();
        echo.result("ping", None, WAIT)?;
        xs.push(secs(t));
    }
    drop(echo);
    let floor = b.keep("floor.stdio_echo_cat", &xs);
    b.stdio_floor = Some(floor.median);
    b.row(Row::floor("server core", "a JSON line echoed back by `cat` (pipe round trip, same client)", &floor));
    b.row(
        Row::new("server core", "stdio `ping` round trip")
            .lat(&f.ping)
            .vs(format!("`cat` echo {}", dur(floor.median)))
            .ratio(format!("{} floor", times(f.ping.median / floor.median))),
    );
    b.row(Row::new("server core", "stdio `tools/list` round trip").lat(&f.list));
    b.row(Row::new("server core", "cold start → `initialize` answered (stdio)").lat(&f.cold));
    b.row(Row::new("server core", "idle RSS (after warm-up)").value(mib(idle)));
    let limit_kb = 1024;
    for (label, kb, n) in [("pings", after_pings, ping_n), ("requests (ping, tools/list, tools/call)", after_all, total)] {
        let growth = kb as i64 - idle as i64;
        b.row(
            Row::new("server core", format!("RSS after {} {label}", thousands(n)))
                .value(mib(kb))
                .vs(format!("idle {}", mib(idle)))
                .ratio(format!("{growth:+} KiB"))
                .target("growth ≤ 1 MiB (noise)", growth <= limit_kb),
        );
    }
    b.ours = Some(f);
    Ok(())
}

/// One peer's rows against sandbox-mcp's figures.
pub fn peer(b: &mut Bench, peer: Peer) -> Result<()> {
    let Some(ours) = b.ours else { bail!("sandbox-mcp's own stdio figures are missing") };
    if peer.command(b).is_none() {
        b.row(Row::new("peers", peer.label()).not_measured(format!("{} is not installed (tests/bench/run.sh installs it)", peer.label())));
        return Ok(());
    }
    let (cold_n, ping_n, list_n) = (b.n(6), b.n(2_000), b.n(500));
    let (f, rpc) = measure_server(b, peer, cold_n, ping_n, list_n)?;
    drop(rpc);
    let name = peer.label();
    let ping_x = f.ping.median / ours.ping.median;
    let mut row = Row::new("peers", format!("{name}: stdio `ping`"))
        .lat(&f.ping)
        .vs(format!("sandbox-mcp {}", dur(ours.ping.median)))
        .ratio(format!("{} faster", times(ping_x)))
        .target("≥ 10× faster", ping_x >= 10.0);
    if let Some(floor) = b.stdio_floor {
        row = row.note(format!(
            "both round trips include the client and the pipes, {} (a line echoed by `cat`); without that floor sandbox-mcp is {} faster",
            dur(floor),
            times((f.ping.median - floor) / (ours.ping.median - floor))
        ));
    }
    b.row(row);
    let list_x = f.list.median / ours.list.median;
    b.row(
        Row::new("peers", format!("{name}: stdio `tools/list`"))
            .lat(&f.list)
            .vs(format!("sandbox-mcp {}", dur(ours.list.median)))
            .ratio(format!("{} faster", times(list_x))),
    );
    let cold_x = f.cold.median / ours.cold.median;
    b.row(
        Row::new("peers", format!("{name}: cold start → `initialize`"))
            .lat(&f.cold)
            .vs(format!("sandbox-mcp {}", dur(ours.cold.median)))
            .ratio(format!("{} faster", times(cold_x)))
            .target("≥ 20× faster", cold_x >= 20.0),
    );
    let rss_x = ours.rss_kb as f64 / f.rss_kb as f64;
    b.row(
        Row::new("peers", format!("{name}: idle RSS"))
            .value(mib(f.rss_kb))
            .vs(format!("sandbox-mcp {}", mib(ours.rss_kb)))
            .ratio(format!("1/{:.0}", 1.0 / rss_x))
            .target("sandbox-mcp ≤ 1/5", rss_x <= 0.2),
    );
    Ok(())
}
