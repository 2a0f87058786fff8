//! What an exposed port costs: 100 MB from a server inside an isolated sandbox through
//! expose_port's relay (the sandbox's keeper, and a socket its init dialed inside the sandbox's
//! network namespace) against the same server program on the host's loopback, read direct and
//! through a bare relay on the host (the floor of any relay).

use crate::bench::{Bench, Transfer};
use crate::probes::interleave;
use crate::session::{self, Tools};
use crate::table::Row;
use anyhow::{anyhow, Context, Result};
use serde_json::json;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BYTES: usize = 100 * 1000 * 1000;

/// An origin: each connection reads one line (`size\n`), then gets that many bytes. Prints its
/// port once it listens.
const ORIGIN: &str = r#"import socket, sys, threading
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('127.0.0.1', int(sys.argv[1])))
s.listen(64)
print(s.getsockname()[1], flush=True)
chunk = b'\x07' * (256 * 1024)
def serve(c):
    f = c.makefile('rb')
    left = int(f.readline())
    view = memoryview(chunk)
    while left > 0:
        n = min(left, len(chunk))
        c.sendall(view[:n])
        left -= n
    c.close()
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

/// Seconds to receive `size` bytes from the origin at `addr`.
fn transfer(addr: &str, size: usize) -> Result<f64> {
    let t = Instant::now();
    let mut conn = TcpStream::connect(addr)?;
    conn.set_nodelay(true)?;
    conn.write_all(format!("{size}\n").as_bytes())?;
    crate::bench::receive(&mut conn, size)?;
    Ok(t.elapsed().as_secs_f64())
}

/// The row.
pub fn port_rows(b: &mut Bench) -> Result<()> {
    if let Err(why) = sandbox_mcp::provider::local::isolation::probe() {
        b.row(Row::new("ports", "100 MB through an exposed port").not_measured(format!("this host refuses namespaces: {why}")));
        return Ok(());
    }
    // The same origin program on the host's loopback: the floor.
    let script = b.o.work.join("origin.py");
    std::fs::write(&script, ORIGIN)?;
    let mut host =
        Command::new("python3").arg(&script).arg("0").stdout(Stdio::piped()).stderr(Stdio::null()).spawn().context("starting python3")?;
    b.track(host.id(), "origin.py")?;
    let mut line = String::new();
    BufReader::new(host.stdout.take().ok_or_else(|| anyhow!("no stdout"))?).read_line(&mut line)?;
    let direct_addr = format!("127.0.0.1:{}", line.trim());

    let mut cmd = b.ours(&["stdio"]);
    cmd.env("SANDBOX_MCP_ISOLATION", "namespaces");
    let mut rpc = session::spawn(cmd, &b.log("ports"))?;
    session::initialize(&mut rpc)?;
    let created = rpc.tool("create_sandbox", &json!({"timeout": 600}))?;
    let id = created["sandbox_id"].as_str().map(str::to_string).ok_or_else(|| anyhow!("create_sandbox returned {created}"))?;
    rpc.tool("write_file", &json!({"sandbox_id": id, "path": "origin.py", "content": ORIGIN}))?;
    rpc.tool("start_task", &json!({"sandbox_id": id, "command": "python3 origin.py 8000"}))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let url = loop {
        match rpc.tool("expose_port", &json!({"sandbox_id": id, "port": 8000})) {
            Ok(v) if v["url"].is_string() => break v["url"].as_str().unwrap_or_default().to_string(),
            _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
            other => return Err(anyhow!("expose_port did not answer a URL: {other:?}")),
        }
    };
    let exposed_addr = url.trim_start_matches("http://").to_string();
    let (warm, rounds, block) = (b.n(2), b.n(5), b.n(2));
    let bare_addr = crate::bare_relay::start(direct_addr.parse()?)?.to_string();
    let xs = interleave(
        warm,
        rounds,
        block,
        &mut [
            Box::new(|| transfer(&exposed_addr, BYTES)),
            Box::new(|| transfer(&direct_addr, BYTES)),
            Box::new(|| transfer(&bare_addr, BYTES)),
        ],
    );
    let _ = rpc.tool("kill_sandbox", &json!({"sandbox_id": id}));
    let _ = rpc.end();
    let _ = host.kill();
    let _ = host.wait();
    let xs = xs?;
    let row = Transfer {
        group: "ports",
        label: "100 MB from a sandbox's server through expose_port's relay (keeper, init-dialed socket)",
        vs: "same server on host loopback, direct ",
        key: "ports.transfer_100mb",
        via_name: "exposed",
        bytes: BYTES,
    };
    b.transfer_rows(row, &xs);
    Ok(())
}
