//! The HTTP transport: clients connecting at once, one client's ping round trip, ping
//! throughput from 1 to 64 clients, the server's RSS, and cheap requests next to slow ones.

use crate::bench::Bench;
use crate::control::Ctl;
use crate::http_client::Http;
use crate::http_server::HttpServer;
use crate::load::{connect_storm, http_load, load_note, Load};
use crate::process::rss_kb;
use crate::stats::Stats;
use crate::table::Row;
use crate::units::{dur, mib, per_s, secs, thousands, times};
use anyhow::{anyhow, bail, Result};
use serde_json::{json, Map, Value};
use std::thread;
use std::time::{Duration, Instant};

/// The "http" rows (`--workers 8`).
pub fn http_ping(b: &mut Bench, ctl: &Ctl) -> Result<()> {
    let server = HttpServer::start(b, 8)?;
    // Clients connecting at once: 4, 16 and 64 at a time, three times over.
    let limit = Duration::from_secs(1);
    let (mut answered, mut stalled, mut tried) = (Vec::new(), 0, 0);
    for _ in 0..3 {
        for clients in [4, 16, 64] {
            let (a, s) = connect_storm(&server.url, clients, limit)?;
            answered.extend(a);
            stalled += s;
            tried += clients;
        }
    }
    let s = b.keep("http.connect_storm", &answered);
    b.keep_value("http.connect_storm_stalled", json!({"stalled": stalled, "tried": tried}));
    let mut row = Row::new("http", "clients connecting at once (3 × 4, 16, 64) → `initialize` answered")
        .lat(&s)
        .target(format!("all {tried} answered within {} s", limit.as_secs()), stalled == 0);
    if stalled > 0 {
        row = row.note(format!(
            "{stalled} of {tried} connections got no answer within {} s: tiny_http 0.12's connection pool can queue a new \
connection's task behind open keep-alive connections (when several connections are accepted at once it reads its idle-thread \
count before the woken threads take their tasks), and that connection is served only when another one closes. The other HTTP \
rows connect their clients one at a time to stay clear of it.",
            limit.as_secs()
        ));
    }
    b.row(row);
    let mut c = Http::new(&server.url)?;
    c.initialize()?;
    for _ in 0..b.n(500) {
        c.call("ping", None)?;
    }
    let idle_rss = rss_kb(server.pid())?;
    let n = b.n(5_000);
    let mut xs = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let (_, err) = c.call("ping", None)?;
        xs.push(secs(t));
        if let Some(err) = err {
            bail!("HTTP ping failed: {err}");
        }
    }
    c.end();
    drop(c); // closes its connection
    let single = b.keep("http.ping", &xs);
    let stdio = b.ours.map(|f| f.ping.median).unwrap_or(f64::NAN);
    b.row(
        Row::new("http", format!("HTTP `ping` round trip, one keep-alive client ({} in a row)", thousands(n)))
            .lat(&single)
            .vs(format!("stdio ping {}", dur(stdio)))
            .ratio(format!("{} stdio", times(single.median / stdio))),
    );

    // Throughput with 1 … 64 clients.
    let (warm, window) = (b.window(200), b.window(1_500));
    let mut counts = vec![1, b.nproc, 4, 16, 64];
    counts.sort_unstable();
    counts.dedup();
    let mut one = f64::NAN;
    let mut loads = Map::new();
    for &clients in &counts {
        let l = http_load(&server.url, clients, warm, window, "ping", None)?;
        let s = Stats::of(&l.lat);
        loads.insert(clients.to_string(), json!({"ok": l.ok, "failed": l.failed, "busy": l.busy, "rate": l.rate(), "stats": s.json()}));
        if clients == 1 {
            one = l.rate();
        }
        let speedup = l.rate() / one;
        let mut row = Row::new("http", format!("HTTP `ping`, {clients} client{}", if clients == 1 { "" } else { "s" }))
            .lat(&s)
            .rate(per_s(l.rate(), "req"))
            .vs(format!("1 client {}", per_s(one, "req")))
            .ratio(format!("{} throughput", times(speedup)));
        if clients == b.nproc && clients > 1 {
            let want = 0.7 * b.nproc as f64;
            row = row.target(format!("scales: ≥ {want:.1}× at {} clients (0.7 × cores)", b.nproc), speedup >= want);
        } else if clients == 64 {
            let r = s.p99 / s.median;
            row = row.ratio(format!("{} throughput; p99 = {} p50", times(speedup), times(r))).target("p99 ≤ 10× p50", r <= 10.0);
        }
        if let Some(n) = load_note(&l) {
            row = row.note(n);
        }
        b.row(row);
    }
    b.keep_value("http.ping_scaling", Value::Object(loads));
    let after_rss = rss_kb(server.pid())?;
    b.keep_value("http.rss_kb", json!({"idle": idle_rss, "after_ping_runs": after_rss}));
    b.row(
        Row::new("http", "HTTP server RSS after the ping runs (sessions created and deleted)")
            .value(mib(after_rss))
            .vs(format!("idle {}", mib(idle_rss)))
            .ratio(format!("{:+} KiB", after_rss as i64 - idle_rss as i64)),
    );

    // Cheap requests next to slow ones: ping while 64 clients run `sleep 0.2`.
    let slow = json!({"name": "run_command", "arguments": {"sandbox_id": ctl.plain, "command": "sleep 0.2"}}).to_string();
    let busy_window = b.window(3_000);
    let url = server.url.clone();
    let (load, pings) = thread::scope(|scope| -> Result<(Load, Vec<f64>)> {
        let bg = scope.spawn(|| http_load(&url, 64, warm, busy_window, "tools/call", Some(slow.clone())));
        let mut c = Http::new(&url)?;
        c.initialize()?;
        thread::sleep(warm + Duration::from_millis(300));
        let until = Instant::now() + busy_window - Duration::from_millis(600);
        let mut xs = Vec::new();
        while Instant::now() < until && xs.len() < 100_000 {
            let t = Instant::now();
            let (_, err) = c.call("ping", None)?;
            xs.push(secs(t));
            if let Some(err) = err {
                bail!("HTTP ping under load failed: {err}");
            }
            thread::sleep(Duration::from_millis(2));
        }
        c.end();
        let load = bg.join().map_err(|_| anyhow!("the load thread panicked"))??;
        Ok((load, xs))
    })?;
    let s = b.keep("http.ping_under_slow_load", &pings);
    let slow_stats = Stats::of(&load.lat);
    b.keep_value(
        "http.slow_load",
        json!({"ok": load.ok, "failed": load.failed, "busy": load.busy, "rate": load.rate(), "stats": slow_stats.json()}),
    );
    let mut row = Row::new("http", "HTTP `ping` while 64 clients run `run_command 'sleep 0.2'` (--workers 8)")
        .lat(&s)
        .rate(format!("slow calls {}", per_s(load.rate(), "req")))
        .vs(format!("idle HTTP ping p99 {}", dur(single.p99)))
        .ratio(format!("{} idle p99", times(s.p99 / single.p99)))
        .target("not starved: p99 ≤ 20 ms (1/10 of the slow call)", s.p99 <= 0.02);
    if let Some(n) = load_note(&load) {
        row = row.note(n);
    }
    b.row(row);
    drop(server);
    Ok(())
}
