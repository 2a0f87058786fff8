//! MCP 2026-07-28 next to 2025-11-25: the per-request `_meta` path against the session path,
//! on one stdio process and on one keep-alive HTTP connection. 2025 `ping` and `tools/list` are
//! interleaved with 2026 `server/discover` and `tools/list`, so that drift hits all four alike;
//! the 2026 `tools/list` has a target against the 2025 one.

use crate::bench::Bench;
use crate::http_client::Http;
use crate::http_server::HttpServer;
use crate::probes::{interleave, Probe};
use crate::session::{self, WAIT};
use crate::table::Row;
use crate::units::{dur, secs, times};
use anyhow::{bail, Result};
use serde_json::{json, Value};
use std::cell::RefCell;
use std::time::{Duration, Instant};

/// The session-less protocol revision, and the `_meta` envelope its requests carry.
pub const MODERN: &str = "2026-07-28";
pub const MODERN_META: &str = r#"{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{"name":"bench-driver","version":"0"}}"#;

/// The "protocol" rows: 2025 `ping` and `tools/list` in a session, interleaved with 2026
/// `server/discover` and `tools/list` carrying the `_meta` envelope, over stdio and over HTTP
/// (`--workers 8`).
pub fn modern_wire(b: &mut Bench) -> Result<()> {
    let n = b.n(4_000);
    let (warm, rounds) = (b.n(200), 20);
    let block = (n / rounds).max(1);
    let meta: Value = serde_json::from_str(MODERN_META)?;
    let mut rpc = session::spawn(b.ours(&["stdio"]), &b.log("modern-stdio"))?;
    session::initialize(&mut rpc)?;
    let rpc = RefCell::new(rpc);
    let timed = |method: &'static str, params: Option<Value>| -> Probe<'_> {
        let rpc = &rpc;
        Box::new(move || {
            let t = Instant::now();
            let r = rpc.borrow_mut().result(method, params.as_ref(), WAIT)?;
            let e = secs(t);
            if params.is_some() && r["resultType"] != "complete" {
                bail!("{method} at {MODERN} over stdio answered {r}");
            }
            Ok(e)
        })
    };
    let mut probes = vec![
        timed("ping", None),
        timed("tools/list", None),
        timed("server/discover", Some(json!({"_meta": meta}))),
        timed("tools/list", Some(json!({"_meta": meta}))),
    ];
    let stdio = interleave(warm, rounds, block, &mut probes)?;
    drop(probes);
    rpc.into_inner().close(Duration::from_secs(5))?;
    wire_rows(b, "stdio", &stdio)?;

    let server = HttpServer::start(b, 8)?;
    let c = RefCell::new(Http::new(&server.url)?);
    c.borrow_mut().initialize()?;
    let legacy = |method: &'static str| -> Probe<'_> {
        let c = &c;
        Box::new(move || {
            let mut c = c.borrow_mut();
            let body = c.body(method, None);
            let t = Instant::now();
            let (status, text) = c.post(&body)?;
            let e = secs(t);
            if status != 200 || !text.contains(r#""result":{"#) {
                bail!("{method} over HTTP answered {status}: {}", text.chars().take(300).collect::<String>());
            }
            Ok(e)
        })
    };
    let modern = |method: &'static str| -> Probe<'_> {
        let c = &c;
        Box::new(move || {
            let t = Instant::now();
            c.borrow_mut().call_modern(method)?;
            Ok(secs(t))
        })
    };
    let mut probes = vec![legacy("ping"), legacy("tools/list"), modern("server/discover"), modern("tools/list")];
    let http = interleave(warm, rounds, block, &mut probes)?;
    drop(probes);
    c.into_inner().end();
    drop(server);
    wire_rows(b, "HTTP", &http)
}

/// The rows of one transport: samples in the order ping, tools/list (2025), server/discover,
/// tools/list (2026).
fn wire_rows(b: &mut Bench, transport: &str, xs: &[Vec<f64>]) -> Result<()> {
    let key = transport.to_ascii_lowercase();
    let ping = b.keep(&format!("{key}.2025.ping"), &xs[0]);
    let list = b.keep(&format!("{key}.2025.tools_list"), &xs[1]);
    let discover = b.keep(&format!("{key}.2026.server_discover"), &xs[2]);
    let modern = b.keep(&format!("{key}.2026.tools_list"), &xs[3]);
    b.row(Row::new("protocol", format!("{transport} `ping`, 2025-11-25 session")).lat(&ping));
    b.row(Row::new("protocol", format!("{transport} `tools/list`, 2025-11-25 session")).lat(&list));
    b.row(
        Row::new("protocol", format!("{transport} `server/discover`, 2026-07-28 (`_meta` checked per request)"))
            .lat(&discover)
            .vs(format!("2025 ping {}", dur(ping.median)))
            .ratio(format!("{} 2025 ping", times(discover.median / ping.median))),
    );
    let r = modern.median / list.median;
    b.row(
        Row::new("protocol", format!("{transport} `tools/list`, 2026-07-28 (`_meta` checked per request)"))
            .lat(&modern)
            .vs(format!("2025 tools/list {}", dur(list.median)))
            .ratio(format!("{} 2025", times(r)))
            .target("≤ 1.2× the 2025 path", r <= 1.2),
    );
    Ok(())
}
