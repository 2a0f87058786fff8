//! What a sandbox's egress proxy costs: 100 MB through it (a CONNECT tunnel to a loopback origin)
//! against the same transfer direct and through a bare relay (the floor of any relay), a connection set up through it against a direct connect,
//! and an idle sandbox's keeper with its proxy against one without (RSS, and the proxy's CPU time
//! over an idle stretch). The transfer and setup rows run the proxy's own code in this process,
//! with host services allowed so that a loopback origin may stand in for the internet.

use crate::bench::{Bench, Transfer};
use crate::probes::interleave;
use crate::session::{self, Tools};
use crate::table::Row;
use crate::units::{dur, mib, times};
use anyhow::{anyhow, Context, Result};
use sandbox_mcp::egress::{self, blocks::BlockLog, proxy::Proxy, Network, Settings};
use serde_json::json;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BYTES: usize = 100 * 1000 * 1000;

/// A loopback origin: each connection reads one line (`size\n`), then gets that many bytes.
fn origin() -> Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut conn = conn;
                let mut line = Vec::new();
                let mut byte = [0u8; 1];
                while conn.read_exact(&mut byte).is_ok() && byte[0] != b'\n' {
                    line.push(byte[0]);
                }
                let mut left: usize = String::from_utf8_lossy(&line).parse().unwrap_or(0);
                let chunk = vec![7u8; 256 * 1024];
                while left > 0 {
                    let n = left.min(chunk.len());
                    if conn.write_all(&chunk[..n]).is_err() {
                        break;
                    }
                    left -= n;
                }
            });
        }
    });
    Ok(addr)
}

/// The proxy's own code on a loopback listener, allowing any destination.
fn proxy(dir: &std::path::Path) -> Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let settings = Settings { upstream: None, host_services: true };
    let p = Proxy::new(Box::new(|| Network::Any), BlockLog::new(dir), settings);
    egress::proxy::serve(listener, Arc::new(p))?;
    Ok(addr)
}

/// Opens a connection to `origin`, through `via` (a CONNECT tunnel) or direct, and asks for `size`
/// bytes; returns the stream once the request is sent.
fn open(origin: SocketAddr, via: Option<SocketAddr>, size: usize) -> Result<TcpStream> {
    let mut conn = TcpStream::connect(via.unwrap_or(origin))?;
    conn.set_nodelay(true)?;
    if via.is_some() {
        conn.write_all(format!("CONNECT {origin} HTTP/1.1\r\n\r\n").as_bytes())?;
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            conn.read_exact(&mut byte)?;
            head.push(byte[0]);
        }
        if !head.starts_with(b"HTTP/1.1 200") {
            return Err(anyhow!("the proxy answered {}", String::from_utf8_lossy(&head)));
        }
    }
    conn.write_all(format!("{size}\n").as_bytes())?;
    Ok(conn)
}

/// Seconds to receive `size` bytes.
fn transfer(origin: SocketAddr, via: Option<SocketAddr>, size: usize) -> Result<f64> {
    let t = Instant::now();
    let mut conn = open(origin, via, size)?;
    crate::bench::receive(&mut conn, size)?;
    Ok(t.elapsed().as_secs_f64())
}

/// The keeper of sandbox `id`: its pid, and kilobytes of its resident set (all, and anonymous).
fn keeper(home: &std::path::Path, id: &str) -> Result<(u32, u64, u64)> {
    let text = std::fs::read_to_string(home.join("sandboxes").join(id).join("keeper.pid")).context("reading keeper.pid")?;
    let pid: u32 = text.split_whitespace().next().and_then(|p| p.parse().ok()).ok_or_else(|| anyhow!("bad keeper.pid {text:?}"))?;
    Ok((pid, crate::process::rss_kb(pid)?, crate::process::status_kb(pid, "RssAnon")?))
}

fn egress_ticks(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0 };
    let mut ticks = 0;
    for task in tasks.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if !comm.starts_with("egress") {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        let fields: Vec<&str> = stat.rsplit_once(')').map(|(_, r)| r.split_whitespace().collect()).unwrap_or_default();
        ticks += fields.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
            + fields.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    }
    ticks
}

/// The rows.
pub fn egress_rows(b: &mut Bench) -> Result<()> {
    let dir = b.home.join("egress-bench");
    std::fs::create_dir_all(&dir)?;
    let origin = origin()?;
    let via = proxy(&dir)?;
    let (warm, rounds, block) = (b.n(2), b.n(5), b.n(2));
    let bare = crate::bare_relay::start(origin)?;
    let xs = interleave(
        warm,
        rounds,
        block,
        &mut [
            Box::new(|| transfer(origin, Some(via), BYTES)),
            Box::new(|| transfer(origin, None, BYTES)),
            Box::new(|| transfer(bare, None, BYTES)),
        ],
    )?;
    let row = Transfer {
        group: "egress",
        label: "100 MB from a loopback origin through the egress proxy (CONNECT tunnel)",
        vs: "direct ",
        key: "egress.transfer_100mb",
        via_name: "proxy",
        bytes: BYTES,
    };
    b.transfer_rows(row, &xs);
    let (warm, rounds, block) = (b.n(20), b.n(10), b.n(20));
    let xs = interleave(warm, rounds, block, &mut [Box::new(|| transfer(origin, Some(via), 1)), Box::new(|| transfer(origin, None, 1))])?;
    let proxied = b.keep("egress.setup.proxy", &xs[0]);
    let direct = b.keep("egress.setup.direct", &xs[1]);
    let extra = proxied.median - direct.median;
    b.row(
        Row::new("egress", "connection set up through the proxy (CONNECT, first byte)")
            .lat(&proxied)
            .vs(format!("direct connect {}", dur(direct.median)))
            .ratio(format!("+{} ({})", dur(extra), times(proxied.median / direct.median)))
            .target("≤ 2 ms over direct", extra <= 0.002),
    );
    if let Err(why) = sandbox_mcp::provider::local::isolation::probe() {
        b.row(Row::new("egress", "idle sandbox's proxy").not_measured(format!("this host refuses namespaces: {why}")));
        return Ok(());
    }
    let mut sizes = Vec::new();
    for mode in ["namespaces", "none"] {
        let mut cmd = b.ours(&["stdio"]);
        cmd.env("SANDBOX_MCP_ISOLATION", mode);
        let mut rpc = session::spawn(cmd, &b.log(&format!("egress-{mode}")))?;
        session::initialize(&mut rpc)?;
        let created = rpc.tool("create_sandbox", &json!({"timeout": 600}))?;
        let id = created["sandbox_id"].as_str().map(str::to_string).ok_or_else(|| anyhow!("create_sandbox returned {created}"))?;
        let (pid, rss, anon) = keeper(&b.home, &id)?;
        let before = egress_ticks(pid);
        std::thread::sleep(Duration::from_secs(2));
        let busy = egress_ticks(pid) - before;
        sizes.push((rss, anon, busy));
        rpc.tool("kill_sandbox", &json!({"sandbox_id": id}))?;
        rpc.end()?;
    }
    let ((with, with_anon, busy), (without, without_anon, _)) = (sizes[0], sizes[1]);
    b.keep_value(
        "egress.keeper_rss_kb",
        json!({"with_proxy": with, "without": without, "anon_with_proxy": with_anon, "anon_without": without_anon, "proxy_ticks_idle_2s": busy}),
    );
    // What a sandbox's proxy adds is its threads' stacks and heap: anonymous memory. The
    // resident set also counts pages of this binary's code, which the server and every keeper
    // share (the isolated keeper runs more of that code: the stage it forks).
    let extra = with_anon as i64 - without_anon as i64;
    b.row(
        Row::new("egress", "idle sandbox's keeper with its proxy (anonymous memory; proxy CPU over 2 s idle)")
            .value(format!("{} ({} resident)", mib(with_anon), mib(with)))
            .vs(format!("keeper without a proxy {} ({} resident)", mib(without_anon), mib(without)))
            .ratio(format!("{extra:+} KiB, {busy} ticks"))
            .target("≤ 1 MiB more, no busy thread", extra <= 1024 && busy == 0),
    );
    Ok(())
}
