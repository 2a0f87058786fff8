//! A description of the machine and of the measured programs' versions, for the report's
//! header and the raw results.

use crate::bench::Bench;
use serde_json::{json, Value};
use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

/// The trimmed stdout of `cmd`, or nothing when it cannot run.
fn capture(cmd: &mut Command) -> String {
    match cmd.stdin(Stdio::null()).stderr(Stdio::null()).output() {
        Ok(out) => String::from_utf8_lossy(&out.stdout).trim().to_string(),
        Err(_) => String::new(),
    }
}

/// CPU, kernel, OS, sandbox-mcp's version and the peers' versions.
pub fn machine(b: &Bench) -> Value {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo.lines().find_map(|l| l.strip_prefix("model name").map(|r| r.trim_start_matches([' ', '\t', ':']).to_string()));
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string();
    let os = fs::read_to_string("/etc/os-release")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME=").map(|v| v.trim_matches('"').to_string()))
        .unwrap_or_else(|| "Linux".into());
    let mut peers = Vec::new();
    if let Some(py) = &b.o.python {
        let v = capture(Command::new(py).args(["-c", "import importlib.metadata as m; print(m.version('mcp'))"]));
        peers.push(format!("Python mcp {v}"));
    }
    if let (Some(node), Some(js)) = (&b.o.node, &b.o.everything) {
        let nv = capture(Command::new(node).arg("--version"));
        let pkg = js.parent().and_then(Path::parent).map(|d| d.join("package.json"));
        let sv = pkg
            .and_then(|p| fs::read_to_string(p).ok())
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .and_then(|v| v["version"].as_str().map(str::to_string))
            .unwrap_or_default();
        peers.push(format!("server-everything {sv} on Node {nv}"));
    }
    if let Some(dir) = &b.o.pueue_dir {
        peers.push(capture(Command::new(dir.join("pueue")).arg("--version")));
    }
    let ours = capture(Command::new(&b.o.bin).arg("--version"));
    json!({"nproc": b.nproc, "cpu": cpu.unwrap_or_else(|| "unknown CPU".into()), "kernel": kernel, "os": os,
        "sandbox_mcp": ours.trim_start_matches("sandbox-mcp ").to_string(), "peers": peers.join(", "), "quick": b.o.quick,
        "started_unix": SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)})
}
