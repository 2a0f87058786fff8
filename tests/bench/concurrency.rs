//! Tool calls over HTTP against the number of clients and of workers: get_task and
//! `run_command "true"` with 1 to 64 clients, on 2, 8 and 32 workers.

use crate::bench::Bench;
use crate::control::Ctl;
use crate::http_server::HttpServer;
use crate::load::{http_load, load_note};
use crate::stats::Stats;
use crate::table::Row;
use crate::units::{per_s, times};
use anyhow::Result;
use serde_json::{json, Map, Value};

/// The "concurrency" rows.
pub fn http_tools(b: &mut Bench, ctl: &Ctl) -> Result<()> {
    let (warm, window) = (b.window(200), b.window(1_000));
    let get = json!({"name": "get_task", "arguments": {"sandbox_id": ctl.plain, "task_id": ctl.done_task}}).to_string();
    let run = json!({"name": "run_command", "arguments": {"sandbox_id": ctl.plain, "command": "true"}}).to_string();
    let mut raw = Map::new();
    let mut base: Map<String, Value> = Map::new();
    for workers in [2usize, 8, 32] {
        let server = HttpServer::start(b, workers)?;
        for (tool, params) in [("get_task", &get), ("run_command true", &run)] {
            for clients in [1usize, 4, 16, 64] {
                let l = http_load(&server.url, clients, warm, window, "tools/call", Some(params.clone()))?;
                let s = Stats::of(&l.lat);
                let key = format!("{tool}/{clients}");
                raw.insert(
                    format!("{tool}/workers={workers}/clients={clients}"),
                    json!({"ok": l.ok, "failed": l.failed, "busy": l.busy, "rate": l.rate(), "stats": s.json()}),
                );
                let mut row = Row::new(
                    "concurrency",
                    format!("HTTP `{tool}`, {clients} client{}, --workers {workers}", if clients == 1 { "" } else { "s" }),
                )
                .lat(&s)
                .rate(per_s(l.rate(), "req"));
                if workers == 2 {
                    base.insert(key, json!(l.rate()));
                } else if let Some(r2) = base.get(&key).and_then(Value::as_f64) {
                    row = row.vs(format!("--workers 2: {}", per_s(r2, "req"))).ratio(format!("{} throughput", times(l.rate() / r2)));
                }
                if let Some(n) = load_note(&l) {
                    row = row.note(n);
                }
                b.row(row);
            }
        }
        drop(server);
    }
    b.keep_value("http.tools", Value::Object(raw));
    Ok(())
}
