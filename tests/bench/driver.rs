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

#![forbid(unsafe_code)]

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Map, Value};
use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const PROTOCOL: &str = "2025-11-25";
const USAGE: &str = "usage: bench-driver --bin SANDBOX_MCP --work DIR --json FILE --md FILE \
[--python PYTHON --peer-py FILE] [--node NODE --everything FILE] [--pueue-dir DIR] [--e2b-emulator E2B_EMULATOR] [--quick] [--only core,peers,tasks,pueue,http,concurrency,e2b]";

/// Bytes the throughput task writes.
const PUMP_BYTES: u64 = 200_000_000;
/// A 99-character line (plus newline) for the throughput task, so masking works line by line.
const PUMP_LINE: &str = "0123456789abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789abcdefghijklmnopq";
/// Upper bound of any one request loop.
const MAX_ITERATIONS: u64 = 2_000_000;

// ───────────────────────────── options ─────────────────────────────

struct Opts {
    bin: PathBuf,
    work: PathBuf,
    json: PathBuf,
    md: PathBuf,
    python: Option<PathBuf>,
    peer_py: Option<PathBuf>,
    node: Option<PathBuf>,
    everything: Option<PathBuf>,
    pueue_dir: Option<PathBuf>,
    e2b_emulator: Option<PathBuf>,
    quick: bool,
    /// Run only the sections whose group contains one of these words (for development).
    only: Vec<String>,
}

fn parse_opts() -> Result<Opts> {
    let mut o = Opts {
        bin: PathBuf::new(),
        work: PathBuf::new(),
        json: PathBuf::new(),
        md: PathBuf::new(),
        python: None,
        peer_py: None,
        node: None,
        everything: None,
        pueue_dir: None,
        e2b_emulator: None,
        quick: false,
        only: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--quick" {
            o.quick = true;
            continue;
        }
        let value = args.next().map(PathBuf::from).ok_or_else(|| anyhow!("{flag} needs a value\n{USAGE}"))?;
        match flag.as_str() {
            "--bin" => o.bin = value,
            "--work" => o.work = value,
            "--json" => o.json = value,
            "--md" => o.md = value,
            "--python" => o.python = Some(value),
            "--peer-py" => o.peer_py = Some(value),
            "--node" => o.node = Some(value),
            "--everything" => o.everything = Some(value),
            "--pueue-dir" => o.pueue_dir = Some(value),
            "--e2b-emulator" => o.e2b_emulator = Some(value),
            "--only" => o.only = value.to_string_lossy().split(',').map(str::to_string).collect(),
            _ => bail!("unknown argument {flag:?}\n{USAGE}"),
        }
    }
    for (name, p) in [("--bin", &o.bin), ("--work", &o.work), ("--json", &o.json), ("--md", &o.md)] {
        if p.as_os_str().is_empty() {
            bail!("{name} is required\n{USAGE}");
        }
    }
    Ok(o)
}

// ───────────────────────────── statistics and formatting ─────────────────────────────

#[derive(Clone, Copy, Debug)]
struct Stats {
    n: usize,
    median: f64,
    p99: f64,
    min: f64,
    max: f64,
}

impl Stats {
    fn of(xs: &[f64]) -> Stats {
        let mut v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        if n == 0 {
            return Stats { n, median: f64::NAN, p99: f64::NAN, min: f64::NAN, max: f64::NAN };
        }
        let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        // Nearest rank: with fewer than 100 samples the p99 is the maximum.
        let rank = ((0.99 * n as f64).ceil() as usize).clamp(1, n);
        Stats { n, median, p99: v[rank - 1], min: v[0], max: v[n - 1] }
    }

    fn json(&self) -> Value {
        json!({"n": self.n, "median": self.median, "p99": self.p99, "min": self.min, "max": self.max})
    }
}

fn dur(s: f64) -> String {
    if !s.is_finite() {
        return "–".into();
    }
    let us = s * 1e6;
    if us < 100.0 {
        format!("{us:.1} µs")
    } else if us < 1000.0 {
        format!("{us:.0} µs")
    } else if s < 0.1 {
        format!("{:.2} ms", s * 1e3)
    } else if s < 1.0 {
        format!("{:.0} ms", s * 1e3)
    } else {
        format!("{s:.2} s")
    }
}

fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn mib(kb: u64) -> String {
    format!("{:.1} MiB", kb as f64 / 1024.0)
}

fn times(r: f64) -> String {
    if !r.is_finite() {
        "–".into()
    } else if r >= 10.0 {
        format!("{r:.0}×")
    } else {
        format!("{r:.2}×")
    }
}

fn per_s(r: f64, unit: &str) -> String {
    if r >= 100.0 {
        format!("{r:.0} {unit}/s")
    } else {
        format!("{r:.1} {unit}/s")
    }
}

fn secs(d: Instant) -> f64 {
    d.elapsed().as_secs_f64()
}

// ───────────────────────────── the table ─────────────────────────────

#[derive(Clone, Copy, PartialEq)]
enum Verdict {
    Met,
    Missed,
    Info,
    NotMeasured,
}

impl Verdict {
    fn text(self) -> &'static str {
        match self {
            Verdict::Met => "met",
            Verdict::Missed => "**MISSED**",
            Verdict::Info => "",
            Verdict::NotMeasured => "not measured",
        }
    }
}

struct Row {
    group: &'static str,
    what: String,
    n: String,
    median: String,
    p99: String,
    rate: String,
    vs: String,
    ratio: String,
    target: String,
    verdict: Verdict,
    note: Option<String>,
}

impl Row {
    fn new(group: &'static str, what: impl Into<String>) -> Row {
        Row {
            group,
            what: what.into(),
            n: String::new(),
            median: String::new(),
            p99: String::new(),
            rate: String::new(),
            vs: String::new(),
            ratio: String::new(),
            target: String::new(),
            verdict: Verdict::Info,
            note: None,
        }
    }

    fn lat(mut self, s: &Stats) -> Row {
        self.n = s.n.to_string();
        self.median = dur(s.median);
        self.p99 = dur(s.p99);
        self
    }

    fn value(mut self, v: impl Into<String>) -> Row {
        self.median = v.into();
        self
    }

    fn rate(mut self, r: impl Into<String>) -> Row {
        self.rate = r.into();
        self
    }

    fn vs(mut self, v: impl Into<String>) -> Row {
        self.vs = v.into();
        self
    }

    fn ratio(mut self, r: impl Into<String>) -> Row {
        self.ratio = r.into();
        self
    }

    fn target(mut self, t: impl Into<String>, met: bool) -> Row {
        self.target = t.into();
        self.verdict = if met { Verdict::Met } else { Verdict::Missed };
        self
    }

    fn note(mut self, n: impl Into<String>) -> Row {
        self.note = Some(n.into());
        self
    }

    fn not_measured(mut self, why: impl Into<String>) -> Row {
        self.verdict = Verdict::NotMeasured;
        self.note = Some(why.into());
        self
    }

    fn json(&self) -> Value {
        json!({"group": self.group, "measurement": self.what, "n": self.n, "median": self.median, "p99": self.p99, "rate": self.rate,
            "compared_with": self.vs, "ratio": self.ratio, "target": self.target, "result": self.verdict.text().trim_matches('*'),
            "note": self.note})
    }
}

fn markdown(rows: &[Row]) -> String {
    let cell = |s: &str| s.replace('|', "\\|");
    let mut out = String::from(
        "| group | measurement | n | median | p99 | rate | compared with (median) | ratio | target | result |\n\
|---|---|--:|--:|--:|--:|---|--:|---|---|\n",
    );
    let mut notes = Vec::new();
    for r in rows {
        let mut verdict = r.verdict.text().to_string();
        if let Some(n) = &r.note {
            let k = match notes.iter().position(|x| x == n) {
                Some(i) => i + 1,
                None => {
                    notes.push(n.clone());
                    notes.len()
                }
            };
            verdict = format!("{verdict} [{k}]").trim().to_string();
        }
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.group,
            cell(&r.what),
            r.n,
            r.median,
            r.p99,
            r.rate,
            cell(&r.vs),
            r.ratio,
            cell(&r.target),
            verdict
        ));
    }
    if !notes.is_empty() {
        out.push('\n');
        for (i, n) in notes.iter().enumerate() {
            out.push_str(&format!("[{}] {}\n", i + 1, n));
        }
    }
    out
}

// ───────────────────────────── the run ─────────────────────────────

struct Bench {
    o: Opts,
    home: PathBuf,
    rows: Vec<Row>,
    raw: Map<String, Value>,
    nproc: usize,
    failed: usize,
    /// sandbox-mcp's own stdio figures, for the peer rows.
    ours: Option<PeerFigures>,
    /// The median stdio round trip through `cat` (the client's and the pipes' share).
    stdio_floor: Option<f64>,
}

impl Bench {
    /// `full` repetitions, or a tenth of them with `--quick`.
    fn n(&self, full: usize) -> usize {
        if self.o.quick {
            (full / 10).max(2)
        } else {
            full
        }
    }

    fn window(&self, full_ms: u64) -> Duration {
        Duration::from_millis(if self.o.quick { (full_ms / 4).max(100) } else { full_ms })
    }

    /// Keeps the samples (seconds) under `key` and returns their statistics.
    fn keep(&mut self, key: &str, xs: &[f64]) -> Stats {
        let s = Stats::of(xs);
        self.raw.insert(key.into(), json!({"unit": "s", "stats": s.json(), "samples": xs}));
        s
    }

    fn keep_value(&mut self, key: &str, v: Value) {
        self.raw.insert(key.into(), v);
    }

    fn row(&mut self, r: Row) {
        self.rows.push(r);
    }

    /// The sandbox-mcp binary with an isolated state root and the local provider.
    fn ours(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.o.bin);
        c.args(args)
            .env("SANDBOX_MCP_HOME", &self.home)
            .env("SANDBOX_MCP_PROVIDER", "local")
            .env("RUST_LOG", "warn")
            .env_remove("E2B_API_KEY")
            .env_remove("SANDBOX_MCP_HTTP_TOKEN");
        c
    }

    fn log(&self, name: &str) -> PathBuf {
        self.o.work.join(format!("{name}.log"))
    }

    /// Lists a long-lived child in WORK/pids (`PID NAME`), for run.sh's cleanup.
    fn track(&self, pid: u32, name: &str) -> Result<()> {
        let mut f = OpenOptions::new().create(true).append(true).open(self.o.work.join("pids"))?;
        writeln!(f, "{pid} {name}")?;
        Ok(())
    }

    /// Runs one section; a failure becomes a "not measured" row and the run goes on.
    fn section(&mut self, group: &'static str, name: &str, f: impl FnOnce(&mut Bench) -> Result<()>) {
        if !self.o.only.is_empty() && !self.o.only.iter().any(|w| group.contains(w.as_str())) {
            return;
        }
        eprintln!("bench: {name} …");
        let t = Instant::now();
        if let Err(err) = f(self) {
            self.failed += 1;
            eprintln!("bench: {name} FAILED: {err:#}");
            self.rows.push(Row::new(group, name).not_measured(format!("{name} failed: {err:#}")));
        }
        eprintln!("bench: {name}: {:.1} s", secs(t));
    }
}

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
    let o = parse_opts()?;
    let home = o.work.join("home");
    fs::create_dir_all(&home).with_context(|| format!("creating {}", home.display()))?;
    let nproc = thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let mut b = Bench { o, home, rows: Vec::new(), raw: Map::new(), nproc, failed: 0, ours: None, stdio_floor: None };
    let started = Instant::now();
    let machine = machine(&b);
    b.keep_value("machine", machine.clone());

    b.section("server core", "sandbox-mcp over stdio", core_stdio);
    let mut ctl = Ctl::start(&b).context("starting the control session (sandboxes for the tool benchmarks)")?;
    b.section("server core", "run_command vs sh -c true", |b| run_command_vs_floor(b, &mut ctl));
    b.section("peers", "Python SDK MCPServer (FastMCP)", |b| peer(b, Peer::Python));
    b.section("peers", "Node server-everything", |b| peer(b, Peer::Node));
    b.section("tasks", "get_task vs floors", |b| get_task_vs_floors(b, &mut ctl));
    b.section("tasks", "start_task vs nohup", |b| start_task_vs_nohup(b, &mut ctl));
    b.section("tasks", "cancel latency", |b| cancel_latency(b, &mut ctl));
    b.section("tasks", "output pump throughput", |b| pump_throughput(b, &mut ctl));
    b.section("tasks", "line visibility", |b| visibility(b, &mut ctl));
    b.section("processes", "process creations per tool", process_counts);
    b.section("pueue", "pueue vs task tools", |b| pueue_vs_tasks(b, &mut ctl));
    b.section("http", "HTTP ping, scaling and starvation", |b| http_ping(b, &ctl));
    b.section("concurrency", "HTTP tool calls vs clients and workers", |b| http_tools(b, &ctl));
    b.section("e2b", "e2b provider against the E2B emulator", |b| e2b_rows(b, &mut ctl));
    if let Err(err) = ctl.finish() {
        eprintln!("bench: ending the control session: {err:#}");
    }

    let total = secs(started);
    let table = markdown(&b.rows);
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

fn capture(cmd: &mut Command) -> String {
    match cmd.stdin(Stdio::null()).stderr(Stdio::null()).output() {
        Ok(out) => String::from_utf8_lossy(&out.stdout).trim().to_string(),
        Err(_) => String::new(),
    }
}

fn machine(b: &Bench) -> Value {
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

// ───────────────────────────── processes ─────────────────────────────

/// `/bin/sh -c SCRIPT sh ARGS...` with every stream closed (the local provider's shell).
fn sh(script: &str, args: &[&str]) -> Command {
    let mut c = Command::new("/bin/sh");
    c.arg("-c").arg(script).arg("sh").args(args).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    c
}

/// Wall time of running `cmd` to completion.
fn spawn_time(cmd: &mut Command) -> Result<f64> {
    let t = Instant::now();
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    let e = secs(t);
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(e)
}

/// Sends TERM to one child by its own pid (through the shell builtin), waits up to `wait`,
/// then KILLs it.
fn stop_child(child: &mut Child, wait: Duration) {
    if let Ok(None) = child.try_wait() {
        let _ = sh("kill -s TERM \"$1\"", &[&child.id().to_string()]).status();
        let deadline = Instant::now() + wait;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

fn rss_kb(pid: u32) -> Result<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).with_context(|| format!("reading /proc/{pid}/status"))?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).ok_or_else(|| anyhow!("no VmRSS for pid {pid}"))?;
    line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).ok_or_else(|| anyhow!("unreadable VmRSS line {line:?}"))
}

/// One timed operation, in seconds.
type Probe<'a> = Box<dyn FnMut() -> Result<f64> + 'a>;

/// Measures the probes round-robin in blocks (after `warm` unrecorded calls each), so that a
/// drifting machine affects each alike.
fn interleave(warm: usize, rounds: usize, block: usize, probes: &mut [Probe<'_>]) -> Result<Vec<Vec<f64>>> {
    let mut out = vec![Vec::with_capacity(rounds * block); probes.len()];
    for p in probes.iter_mut() {
        for _ in 0..warm {
            p()?;
        }
    }
    for _ in 0..rounds {
        for (i, p) in probes.iter_mut().enumerate() {
            for _ in 0..block {
                out[i].push(p()?);
            }
        }
    }
    Ok(out)
}

// ───────────────────────────── a raw JSON-lines MCP client ─────────────────────────────

/// An MCP server spoken to over its stdin/stdout, one JSON message per line; stderr goes to a
/// log file. Blocking reads: a server that stops answering is caught by run.sh's timeout.
struct Rpc {
    child: Child,
    stdin: Option<ChildStdin>,
    out: BufReader<ChildStdout>,
    next: u64,
    line: String,
}

impl Rpc {
    fn spawn(mut cmd: Command, log: &Path) -> Result<Rpc> {
        let log = OpenOptions::new().create(true).append(true).open(log).with_context(|| format!("opening {}", log.display()))?;
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::from(log));
        let mut child = cmd.spawn().with_context(|| format!("starting {cmd:?}"))?;
        let stdin = child.stdin.take();
        let out = BufReader::new(child.stdout.take().context("the child has no stdout")?);
        Ok(Rpc { child, stdin, out, next: 1, line: String::new() })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn send(&mut self, msg: &Value) -> Result<()> {
        let stdin = self.stdin.as_mut().context("stdin is closed")?;
        let mut line = msg.to_string();
        line.push('\n');
        stdin.write_all(line.as_bytes())?;
        stdin.flush()?;
        Ok(())
    }

    /// Sends a request and returns its `result` (skipping notifications and other messages).
    fn request(&mut self, method: &str, params: Option<Value>) -> Result<Value> {
        let id = self.next;
        self.next += 1;
        let mut msg = json!({"jsonrpc": "2.0", "id": id, "method": method});
        if let Some(p) = params {
            msg["params"] = p;
        }
        self.send(&msg)?;
        loop {
            self.line.clear();
            if self.out.read_line(&mut self.line)? == 0 {
                bail!("the server closed stdout while {method} was pending");
            }
            let v: Value = serde_json::from_str(self.line.trim_end()).with_context(|| format!("non-JSON line {:?}", self.line))?;
            if v.get("id").and_then(Value::as_u64) == Some(id) {
                if let Some(err) = v.get("error") {
                    bail!("{method} failed: {err}");
                }
                return Ok(v.get("result").cloned().unwrap_or(Value::Null));
            }
        }
    }

    fn initialize(&mut self) -> Result<Value> {
        let params = json!({"protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "bench-driver", "version": "0"}});
        let result = self.request("initialize", Some(params))?;
        self.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))?;
        Ok(result)
    }

    /// A tool call's whole result (tool errors included).
    fn tool_result(&mut self, name: &str, args: &Value) -> Result<Value> {
        self.request("tools/call", Some(json!({"name": name, "arguments": args})))
    }

    /// A tool call's `structuredContent`; a tool error is an error.
    fn tool(&mut self, name: &str, args: &Value) -> Result<Value> {
        let r = self.tool_result(name, args)?;
        if r["isError"] == json!(true) {
            bail!("{name} {args} failed: {}", r["content"][0]["text"]);
        }
        Ok(r["structuredContent"].clone())
    }

    /// Closes stdin and waits (up to 5 s) for the exit, then kills.
    fn close(mut self) -> Result<()> {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if self.child.try_wait()?.is_some() {
                return Ok(());
            }
            thread::sleep(Duration::from_millis(5));
        }
        bail!("pid {} did not exit within 5 s of stdin EOF", self.child.id())
    }
}

impl Drop for Rpc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn state(snapshot: &Value) -> &str {
    snapshot["state"].as_str().unwrap_or("")
}

/// Polls get_task until the task is no longer running.
fn wait_final(rpc: &mut Rpc, sandbox: &str, task: &str, limit: Duration, poll: Duration) -> Result<Value> {
    let deadline = Instant::now() + limit;
    loop {
        let s = rpc.tool("get_task", &json!({"sandbox_id": sandbox, "task_id": task, "limit": 1}))?;
        if state(&s) != "running" {
            return Ok(s);
        }
        if Instant::now() >= deadline {
            bail!("task {task} still running after {limit:?}");
        }
        thread::sleep(poll);
    }
}

// ───────────────────────────── server core: stdio ─────────────────────────────

#[derive(Clone, Copy)]
struct PeerFigures {
    cold: Stats,
    ping: Stats,
    list: Stats,
    rss_kb: u64,
}

#[derive(Clone, Copy, PartialEq)]
enum Peer {
    Ours,
    Python,
    Node,
}

impl Peer {
    fn key(self) -> &'static str {
        match self {
            Peer::Ours => "sandbox_mcp",
            Peer::Python => "python_mcpserver",
            Peer::Node => "node_server_everything",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Peer::Ours => "sandbox-mcp",
            Peer::Python => "Python SDK MCPServer",
            Peer::Node => "server-everything (Node)",
        }
    }

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
fn measure_server(b: &mut Bench, peer: Peer, cold_n: usize, ping_n: usize, list_n: usize) -> Result<(PeerFigures, Rpc)> {
    let key = peer.key();
    let log = b.log(key);
    let make = |b: &Bench| peer.command(b).ok_or_else(|| anyhow!("{} is not installed", peer.label()));
    let mut cold = Vec::new();
    for i in 0..cold_n + 2 {
        let cmd = make(b)?;
        let t = Instant::now();
        let mut rpc = Rpc::spawn(cmd, &log)?;
        rpc.initialize()?;
        let e = secs(t);
        drop(rpc); // killed: nothing was created
        if i >= 2 {
            cold.push(e);
        }
    }
    let cold = b.keep(&format!("{key}.cold_start"), &cold);
    let mut rpc = Rpc::spawn(make(b)?, &log)?;
    rpc.initialize()?;
    let (tool, args) = peer.warm_call();
    for _ in 0..b.n(300) {
        rpc.request("ping", None)?;
    }
    for _ in 0..b.n(100) {
        rpc.request("tools/list", None)?;
        rpc.tool_result(tool, &args)?;
    }
    thread::sleep(Duration::from_millis(300));
    let rss = rss_kb(rpc.pid())?;
    let mut ping = Vec::with_capacity(ping_n);
    for _ in 0..ping_n {
        let t = Instant::now();
        rpc.request("ping", None)?;
        ping.push(secs(t));
    }
    let ping = b.keep(&format!("{key}.ping"), &ping);
    let rss_after_pings = rss_kb(rpc.pid())?;
    let mut list = Vec::with_capacity(list_n);
    for _ in 0..list_n {
        let t = Instant::now();
        let r = rpc.request("tools/list", None)?;
        if r["tools"].as_array().is_none_or(Vec::is_empty) {
            bail!("{} answered tools/list without tools", peer.label());
        }
        list.push(secs(t));
    }
    let list = b.keep(&format!("{key}.tools_list"), &list);
    b.keep_value(&format!("{key}.rss_kb"), json!({"idle": rss, "after_pings": rss_after_pings, "pings": ping_n}));
    Ok((PeerFigures { cold, ping, list, rss_kb: rss }, rpc))
}

fn core_stdio(b: &mut Bench) -> Result<()> {
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
                rpc.request("ping", None)?;
            }
            2 => {
                rpc.request("tools/list", None)?;
            }
            _ => {
                rpc.tool_result(tool, &args)?;
            }
        }
    }
    thread::sleep(Duration::from_millis(200));
    let after_all = rss_kb(rpc.pid())?;
    rpc.close()?;
    let total = ping_n + list_n + mixed;
    b.keep_value("sandbox_mcp.rss_growth_kb", json!({"idle": idle, "after_pings": after_pings, "after_all": after_all, "requests": total}));

    // The floor of a stdio round trip: the same client, and `cat` echoing the request line.
    let mut echo = Rpc::spawn(Command::new("cat"), &b.log("cat"))?;
    for _ in 0..b.n(300) {
        echo.request("ping", None)?;
    }
    let mut xs = Vec::with_capacity(ping_n);
    for _ in 0..ping_n {
        let t = Instant::now();
        echo.request("ping", None)?;
        xs.push(secs(t));
    }
    drop(echo);
    let floor = b.keep("floor.stdio_echo_cat", &xs);
    b.stdio_floor = Some(floor.median);
    floor_row(b, "server core", "a JSON line echoed back by `cat` (pipe round trip, same client)", &floor);
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

fn peer(b: &mut Bench, peer: Peer) -> Result<()> {
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

// ───────────────────────────── the control session ─────────────────────────────

/// One long-lived stdio session holding the sandboxes the tool benchmarks use.
struct Ctl {
    rpc: Rpc,
    /// A sandbox without secrets.
    plain: String,
    /// A sandbox with five secret-named variables (masking in effect).
    secret: String,
    /// A finished task in `plain` whose stdout is "hello\n".
    done_task: String,
}

fn secret_envs() -> Value {
    json!({
        "API_TOKEN": "tok-3f9a8c1d2e7b",
        "SECRET_KEY": "sk-live-8e7d6c5b4a39",
        "GITHUB_TOKEN": "ghp-0a1b2c3d4e5f6a7b",
        "DB_PASSWORD": "hunter2-correct-horse",
        "AWS_ACCESS_KEY_ID": "AKIA0123456789ABCDEF",
    })
}

impl Ctl {
    fn start(b: &Bench) -> Result<Ctl> {
        let mut rpc = Rpc::spawn(b.ours(&["stdio"]), &b.log("control"))?;
        rpc.initialize()?;
        let id = |v: Value| v["sandbox_id"].as_str().map(str::to_string).ok_or_else(|| anyhow!("create_sandbox returned {v}"));
        let plain = id(rpc.tool("create_sandbox", &json!({"timeout": 3600}))?)?;
        let secret = id(rpc.tool("create_sandbox", &json!({"timeout": 3600, "envs": secret_envs()}))?)?;
        let snap = rpc.tool("start_task", &json!({"sandbox_id": plain, "command": "echo hello"}))?;
        let done_task = snap["task_id"].as_str().context("start_task returned no task_id")?.to_string();
        let fin = wait_final(&mut rpc, &plain, &done_task, Duration::from_secs(10), Duration::from_millis(10))?;
        if state(&fin) != "succeeded" {
            bail!("`echo hello` ended {fin}");
        }
        Ok(Ctl { rpc, plain, secret, done_task })
    }

    fn delete_task(&mut self, sandbox: &str, task: &str) -> Result<()> {
        self.rpc.tool("delete_task", &json!({"sandbox_id": sandbox, "task_id": task}))?;
        Ok(())
    }

    fn finish(mut self) -> Result<()> {
        for id in [self.plain.clone(), self.secret.clone()] {
            self.rpc.tool("kill_sandbox", &json!({"sandbox_id": id}))?;
        }
        self.rpc.close()
    }
}

// ───────────────────────────── tools against floors ─────────────────────────────

/// The median of samples kept earlier in this run under `key`.
fn kept_median(b: &Bench, key: &str) -> Option<f64> {
    b.raw.get(key)?["stats"]["median"].as_f64()
}

fn floor_row(b: &mut Bench, group: &'static str, what: &str, s: &Stats) {
    b.row(Row::new(group, format!("floor: {what}")).lat(s));
}

fn run_command_vs_floor(b: &mut Bench, ctl: &mut Ctl) -> Result<()> {
    let (warm, rounds, block) = (b.n(30), b.n(10), b.n(30));
    let args = json!({"sandbox_id": ctl.plain, "command": "true"});
    let rpc = &mut ctl.rpc;
    let xs = interleave(
        warm,
        rounds,
        block,
        &mut [
            Box::new(|| {
                let t = Instant::now();
                let r = rpc.tool("run_command", &args)?;
                let e = secs(t);
                if r["exit_code"] != json!(0) {
                    bail!("run_command true returned {r}");
                }
                Ok(e)
            }),
            Box::new(|| spawn_time(&mut sh("true", &[]))),
        ],
    )?;
    let ours = b.keep("run_command_true", &xs[0]);
    let floor = b.keep("floor.sh_c_true", &xs[1]);
    floor_row(b, "server core", "`sh -c true` spawn", &floor);
    let r = ours.median / floor.median;
    b.row(
        Row::new("server core", "`run_command \"true\"` (stdio session, local provider)")
            .lat(&ours)
            .vs(format!("`sh -c true` {}", dur(floor.median)))
            .ratio(format!("{} floor", times(r)))
            .target("≤ 2× floor", r <= 2.0),
    );
    Ok(())
}

fn get_task_vs_floors(b: &mut Bench, ctl: &mut Ctl) -> Result<()> {
    let (warm, rounds, block) = (b.n(30), b.n(10), b.n(30));
    let log = b.o.work.join("floor-task.log");
    fs::write(&log, "hello\n")?;
    let log = log.to_string_lossy().to_string();
    let args = json!({"sandbox_id": ctl.plain, "task_id": ctl.done_task});
    let rpc = &mut ctl.rpc;
    let xs = interleave(
        warm,
        rounds,
        block,
        &mut [
            Box::new(|| {
                let t = Instant::now();
                let r = rpc.tool("get_task", &args)?;
                let e = secs(t);
                if r["stdout"] != json!("hello\n") {
                    bail!("get_task returned {r}");
                }
                Ok(e)
            }),
            Box::new(|| spawn_time(&mut sh("cat /proc/self/stat >/dev/null", &[]))),
            Box::new(|| spawn_time(&mut sh("tail -c 16384 \"$1\" >/dev/null", &[&log]))),
        ],
    )?;
    let ours = b.keep("get_task", &xs[0]);
    let stat = b.keep("floor.cat_proc_self_stat", &xs[1]);
    let tail = b.keep("floor.tail_c", &xs[2]);
    floor_row(b, "tasks", "`sh -c 'cat /proc/self/stat >/dev/null'`", &stat);
    floor_row(b, "tasks", "`sh -c 'tail -c 16384 log'` (reading a log)", &tail);
    let r = ours.median / stat.median;
    b.row(
        Row::new("tasks", "`get_task` round trip (finished task, stdio)")
            .lat(&ours)
            .vs(format!("`cat /proc/self/stat` {}", dur(stat.median)))
            .ratio(format!("{} floor", times(r)))
            .target("≤ 3× floor", r <= 3.0),
    );
    let r = ours.median / tail.median;
    b.row(
        Row::new("tasks", "`get_task` vs reading the log with `tail -c`")
            .lat(&ours)
            .vs(format!("`tail -c` {}", dur(tail.median)))
            .ratio(format!("{} floor", times(r))),
    );
    Ok(())
}

fn start_task_vs_nohup(b: &mut Bench, ctl: &mut Ctl) -> Result<()> {
    let (warm, rounds, block) = (b.n(5), b.n(6), b.n(10));
    let out = b.o.work.join("nohup.log").to_string_lossy().to_string();
    let plain = ctl.plain.clone();
    let mut direct = 0usize;
    let mut total = 0usize;
    let xs = interleave(
        warm,
        rounds,
        block,
        &mut [
            Box::new(|| {
                let t = Instant::now();
                let snap = ctl.rpc.tool("start_task", &json!({"sandbox_id": plain, "command": "true"}))?;
                let task = snap["task_id"].as_str().context("no task_id")?.to_string();
                total += 1;
                let fin = if state(&snap) == "running" {
                    wait_final(&mut ctl.rpc, &plain, &task, Duration::from_secs(10), Duration::from_millis(2))?
                } else {
                    direct += 1;
                    snap
                };
                let e = secs(t);
                if state(&fin) != "succeeded" {
                    bail!("start_task true ended {fin}");
                }
                ctl.delete_task(&plain, &task)?;
                Ok(e)
            }),
            Box::new(|| spawn_time(&mut sh("nohup true >\"$1\" 2>&1 &", &[&out]))),
        ],
    )?;
    let ours = b.keep("start_task_true_until_final", &xs[0]);
    let floor = b.keep("floor.nohup_start", &xs[1]);
    floor_row(b, "tasks", "`sh -c 'nohup true > log 2>&1 &'` (background start)", &floor);
    let r = ours.median / floor.median;
    b.row(
        Row::new("tasks", "`start_task` of `true` until its final snapshot")
            .lat(&ours)
            .vs(format!("`nohup … &` {}", dur(floor.median)))
            .ratio(format!("{} floor", times(r)))
            .target("≤ 3× floor", r <= 3.0)
            .note(format!("{direct} of {total} start_task calls (warm-up included) already returned the final snapshot")),
    );
    Ok(())
}

fn cancel_latency(b: &mut Bench, ctl: &mut Ctl) -> Result<()> {
    let plain = ctl.plain.clone();
    let mut starts = Vec::new();
    let mut run = |ctl: &mut Ctl, command: &str, n: usize| -> Result<Vec<f64>> {
        let mut xs = Vec::new();
        for _ in 0..n {
            let t = Instant::now();
            let snap = ctl.rpc.tool("start_task", &json!({"sandbox_id": plain, "command": command, "timeout": 120}))?;
            starts.push(secs(t));
            let task = snap["task_id"].as_str().context("no task_id")?.to_string();
            if state(&snap) != "running" {
                bail!("{command:?} is not running: {snap}");
            }
            let t = Instant::now();
            let fin = ctl.rpc.tool("cancel_task", &json!({"sandbox_id": plain, "task_id": task}))?;
            xs.push(secs(t));
            if state(&fin) != "cancelled" {
                bail!("cancel_task of {command:?} ended {fin}");
            }
            ctl.delete_task(&plain, &task)?;
        }
        Ok(xs)
    };
    let term = run(ctl, "sleep 60", b.n(12))?;
    let ignoring = run(ctl, "trap '' TERM; sleep 60", b.n(3))?;
    let term = b.keep("cancel.term_respecting", &term);
    let ignoring = b.keep("cancel.term_ignoring", &ignoring);
    let starts = b.keep("start_task_running_command", &starts);
    let spawn = kept_median(b, "floor.cat_proc_self_stat");
    let mut row = Row::new("tasks", "`start_task` of a still-running command (`sleep 60`), until its answer").lat(&starts);
    if let Some(f) = spawn {
        let r = starts.median / f;
        row = row
            .vs(format!("`sh -c 'cat /proc/self/stat'` {}", dur(f)))
            .ratio(format!("{} floor", times(r)))
            .target("≤ 8× the spawn floor", r <= 8.0);
    }
    b.row(row.note(
        "start_task answers once the supervisor has confirmed the task's own process group (no watch, no sleep); pueue in the pueue group",
    ));
    b.row(Row::new("tasks", "`cancel_task`, TERM-respecting task (`sleep 60`)").lat(&term).target("< 300 ms", term.median < 0.3));
    b.row(
        Row::new("tasks", "`cancel_task`, TERM-ignoring task (`trap '' TERM; sleep 60`)")
            .lat(&ignoring)
            .target("< 3 s", ignoring.median < 3.0)
            .note("a TERM-ignoring task is KILLed after the 1.5 s cancel grace period, by design"),
    );
    Ok(())
}

/// Runs `command` as a task in `sandbox` and returns the wall time from the start_task request
/// to the first final snapshot. get_task polls cost CPU that the task competes for, so they are
/// spaced by a twentieth of the time elapsed (5 to 50 ms): the error stays under about 5 %.
fn task_wall(ctl: &mut Ctl, sandbox: &str, command: &str, limit: Duration) -> Result<(f64, Value)> {
    let t = Instant::now();
    let mut fin = ctl.rpc.tool("start_task", &json!({"sandbox_id": sandbox, "command": command, "timeout": 900}))?;
    let task = fin["task_id"].as_str().context("no task_id")?.to_string();
    let deadline = t + limit;
    while state(&fin) == "running" {
        if Instant::now() > deadline {
            bail!("task {task} still running after {limit:?}");
        }
        thread::sleep((t.elapsed() / 20).clamp(Duration::from_millis(5), Duration::from_millis(50)));
        fin = ctl.rpc.tool("get_task", &json!({"sandbox_id": sandbox, "task_id": task, "limit": 1}))?;
    }
    let e = secs(t);
    ctl.delete_task(sandbox, &task)?;
    Ok((e, fin))
}

fn pump_throughput(b: &mut Bench, ctl: &mut Ctl) -> Result<()> {
    let bytes = if b.o.quick { PUMP_BYTES / 10 } else { PUMP_BYTES };
    let cmd = format!("yes {PUMP_LINE} | head -c {bytes}");
    let floor_script = format!("{cmd} > /dev/null");
    // The same command piped once: the least any pump can cost.
    let pipe_script = format!("{cmd} | cat > /dev/null");
    let mb = bytes as f64 / 1e6;
    let (plain, secret) = (ctl.plain.clone(), ctl.secret.clone());
    let mut floor = Vec::new();
    let mut pipe = Vec::new();
    let mut unmasked = Vec::new();
    let check = |fin: &Value, what: &str| -> Result<()> {
        if state(fin) != "succeeded" || fin["stdout_truncated"] != json!(true) {
            bail!("the {what} throughput task ended {fin}");
        }
        Ok(())
    };
    spawn_time(&mut sh(&floor_script, &[]))?; // warm-up
    for _ in 0..b.n(5).max(3) {
        floor.push(spawn_time(&mut sh(&floor_script, &[]))?);
        pipe.push(spawn_time(&mut sh(&pipe_script, &[]))?);
        let (e, fin) = task_wall(ctl, &plain, &cmd, Duration::from_secs(300))?;
        check(&fin, "unmasked")?;
        unmasked.push(e);
    }
    let mut masked = Vec::new();
    for _ in 0..b.n(5).max(3) {
        let (e, fin) = task_wall(ctl, &secret, &cmd, Duration::from_secs(600))?;
        check(&fin, "masked")?;
        masked.push(e);
    }
    let floor = b.keep("floor.pump_dev_null", &floor);
    let pipe = b.keep("floor.pump_one_pipe", &pipe);
    let unmasked = b.keep("pump.unmasked", &unmasked);
    let masked = b.keep("pump.masked", &masked);
    b.keep_value("pump.bytes", json!(bytes));
    b.row(
        Row::new("tasks", format!("floor: `sh -c 'yes … | head -c {bytes} > /dev/null'`")).lat(&floor).rate(per_s(mb / floor.median, "MB")),
    );
    b.row(Row::new("tasks", "floor: the same piped once, `sh -c '… | cat > /dev/null'`").lat(&pipe).rate(per_s(mb / pipe.median, "MB")));
    let r = unmasked.median / pipe.median;
    b.row(
        Row::new("tasks", format!("task writing {} MB (`yes … | head -c {bytes}`), no masking: start_task → final", mb as u64))
            .lat(&unmasked)
            .rate(per_s(mb / unmasked.median, "MB"))
            .vs(format!("`| cat > /dev/null` {}", dur(pipe.median)))
            .ratio(format!("{} one-pipe floor", times(r)))
            .target("≤ 1.5× the one-pipe floor", r <= 1.5)
            .note(format!("{} the `> /dev/null` floor ({})", times(unmasked.median / floor.median), dur(floor.median))),
    );
    let rate = mb / masked.median;
    b.row(
        Row::new("tasks", format!("task writing {} MB, masking 5 secrets: start_task → final", mb as u64))
            .lat(&masked)
            .rate(per_s(rate, "MB"))
            .vs(format!("`| cat > /dev/null` {}", dur(pipe.median)))
            .ratio(format!("{} one-pipe floor", times(masked.median / pipe.median)))
            .target("≥ 150 MB/s", rate >= 150.0),
    );
    Ok(())
}

fn visibility(b: &mut Bench, ctl: &mut Ctl) -> Result<()> {
    let lines = b.n(40).max(5);
    let cmd = format!("i=0; while [ $i -lt {lines} ]; do sleep 0.1; date +%s%N; i=$((i+1)); done");
    let plain = ctl.plain.clone();
    let snap = ctl.rpc.tool("start_task", &json!({"sandbox_id": plain, "command": cmd, "timeout": 120}))?;
    let task = snap["task_id"].as_str().context("no task_id")?.to_string();
    let now_ns = || SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let mut pending = String::new();
    let mut lat = Vec::new();
    let mut take = |text: &str, seen_ns: u128, lat: &mut Vec<f64>| {
        pending.push_str(text);
        while let Some(i) = pending.find('\n') {
            let line: String = pending.drain(..=i).collect();
            if let Ok(written) = line.trim().parse::<u128>() {
                lat.push(seen_ns.saturating_sub(written) as f64 / 1e9);
            }
        }
    };
    take(snap["stdout"].as_str().unwrap_or(""), now_ns(), &mut lat);
    let mut offset = snap["stdout_next_offset"].as_u64().unwrap_or(0);
    let mut fin = snap;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut polls = 0u64;
    while state(&fin) == "running" && Instant::now() < deadline && polls < MAX_ITERATIONS {
        thread::sleep(Duration::from_millis(2));
        fin = ctl.rpc.tool("get_task", &json!({"sandbox_id": plain, "task_id": task, "stdout_offset": offset, "limit": 65536}))?;
        take(fin["stdout"].as_str().unwrap_or(""), now_ns(), &mut lat);
        offset = fin["stdout_next_offset"].as_u64().unwrap_or(offset);
        polls += 1;
    }
    ctl.delete_task(&plain, &task)?;
    if lat.len() < lines {
        bail!("saw {} of {lines} lines (final state {})", lat.len(), state(&fin));
    }
    let s = b.keep("line_visibility", &lat);
    b.row(
        Row::new("tasks", "line written → visible through `get_task` (polling)")
            .lat(&s)
            .note(format!("one line every 100 ms, get_task polled back to back ({polls} polls); includes the get_task round trip")),
    );
    Ok(())
}

// ───────────────────────────── process creations ─────────────────────────────

/// Counts the processes each task tool creates in the sandbox (local provider), as
/// tests/it/processes.rs does: in a pid namespace of the server's own, the pid of a probe
/// (`echo $$` through run_command) numbers the clones since the previous probe, less the server's
/// pipe-reader threads per exec (two probes in a row measure them). Without a pid namespace, the
/// machine's `processes` counter (/proc/stat), the smallest of several rounds.
fn process_counts(b: &mut Bench) -> Result<()> {
    let ns = Command::new("unshare").args(["--fork", "--pid", "--mount-proc", "true"]).status().is_ok_and(|s| s.success());
    let cmd = if ns {
        // The same command and environment as `ours`, run under unshare.
        let ours = b.ours(&[]);
        let mut u = Command::new("unshare");
        u.args(["--fork", "--pid", "--mount-proc"]).arg(&b.o.bin).arg("stdio");
        for (k, v) in ours.get_envs() {
            match v {
                Some(v) => u.env(k, v),
                None => u.env_remove(k),
            };
        }
        u
    } else {
        b.ours(&["stdio"])
    };
    let mut rpc = Rpc::spawn(cmd, &b.log("processes"))?;
    rpc.initialize()?;
    let sb = rpc.tool("create_sandbox", &json!({"timeout": 600}))?["sandbox_id"].as_str().context("no sandbox_id")?.to_string();
    let machine = || -> Result<u64> {
        let stat = fs::read_to_string("/proc/stat")?;
        stat.lines()
            .find_map(|l| l.strip_prefix("processes "))
            .and_then(|v| v.trim().parse().ok())
            .context("no processes line in /proc/stat")
    };
    let probe = |rpc: &mut Rpc| -> Result<u64> {
        if ns {
            let r = rpc.tool("run_command", &json!({"sandbox_id": sb, "command": "echo $$"}))?;
            r["stdout"].as_str().unwrap_or("").trim().parse().context("probe pid")
        } else {
            machine()
        }
    };
    let finish = |rpc: &mut Rpc, task: &str| -> Result<()> {
        wait_final(rpc, &sb, task, Duration::from_secs(20), Duration::from_millis(5))?;
        Ok(())
    };
    // Warm: the first task of a user probes its tools once.
    let t = rpc.tool("start_task", &json!({"sandbox_id": sb, "command": "echo warm"}))?;
    finish(&mut rpc, t["task_id"].as_str().context("no task_id")?)?;
    // Clones between two probes around `f` (the probes' own excepted in the namespace).
    let count = |rpc: &mut Rpc, f: &mut dyn FnMut(&mut Rpc) -> Result<()>| -> Result<u64> {
        let a = probe(rpc)?;
        f(rpc)?;
        let z = probe(rpc)?;
        Ok(if ns { z.saturating_sub(a + 1) } else { z.saturating_sub(a) })
    };
    let rounds = if ns { 3 } else { 5 };
    let mut threads = u64::MAX;
    for _ in 0..5 {
        let c = if ns {
            count(&mut rpc, &mut |_| Ok(()))?
        } else {
            count(&mut rpc, &mut |rpc| rpc.tool("run_command", &json!({"sandbox_id": sb, "command": ":"})).map(drop))?.saturating_sub(1)
        };
        threads = threads.min(c);
    }
    // One exec per call, plus the first probe's in the namespace.
    let per_call = if ns { 2 * threads } else { threads };
    let measure = |rpc: &mut Rpc, f: &mut dyn FnMut(&mut Rpc) -> Result<()>| -> Result<u64> {
        let mut best = u64::MAX;
        for _ in 0..rounds {
            best = best.min(count(rpc, f)?.saturating_sub(per_call));
        }
        Ok(best)
    };
    let run = measure(&mut rpc, &mut |rpc| rpc.tool("run_command", &json!({"sandbox_id": sb, "command": "true"})).map(drop))?;
    let t = rpc.tool("start_task", &json!({"sandbox_id": sb, "command": "echo hello"}))?;
    let done = t["task_id"].as_str().context("no task_id")?.to_string();
    finish(&mut rpc, &done)?;
    let get = measure(&mut rpc, &mut |rpc| rpc.tool("get_task", &json!({"sandbox_id": sb, "task_id": done})).map(drop))?;
    let tag = format!("SANDBOX_MCP_SANDBOX={sb}");
    let timer_armed = || {
        fs::read_dir("/proc").into_iter().flatten().flatten().any(|e| {
            let cmd = fs::read(e.path().join("cmdline")).unwrap_or_default();
            cmd == b"sleep\x003599\x00"
                && fs::read(e.path().join("environ")).unwrap_or_default().windows(tag.len()).any(|w| w == tag.as_bytes())
        })
    };
    let (mut starts, mut cancels) = (u64::MAX, u64::MAX);
    for _ in 0..rounds {
        let mut task = String::new();
        starts = starts.min(
            count(&mut rpc, &mut |rpc| {
                let s = rpc.tool("start_task", &json!({"sandbox_id": sb, "command": "exec sleep 60", "timeout": 3599}))?;
                task = s["task_id"].as_str().context("no task_id")?.to_string();
                // The timer's sleep is the last process of a start, possibly just after the answer.
                let deadline = Instant::now() + Duration::from_secs(10);
                while !timer_armed() {
                    if Instant::now() > deadline {
                        bail!("the task's timer never showed");
                    }
                    thread::sleep(Duration::from_millis(1));
                }
                Ok(())
            })?
            .saturating_sub(per_call),
        );
        cancels = cancels.min(
            count(&mut rpc, &mut |rpc| {
                let s = rpc.tool("cancel_task", &json!({"sandbox_id": sb, "task_id": task}))?;
                if state(&s) != "cancelled" {
                    bail!("cancel_task ended {s}");
                }
                Ok(())
            })?
            .saturating_sub(per_call),
        );
    }
    rpc.tool("kill_sandbox", &json!({"sandbox_id": sb}))?;
    rpc.close()?;
    let how = if ns {
        format!("counted in a pid namespace of the server's own (probe pids; {threads} server threads per exec taken off)")
    } else {
        format!("counted with /proc/stat's machine-wide `processes` line, smallest of {rounds} rounds ({threads} server threads per exec taken off)")
    };
    b.keep_value("processes", json!({"run_command": run, "get_task": get, "start_task": starts, "cancel_task": cancels, "namespace": ns}));
    for (what, n) in [
        ("`run_command \"true\"`", run),
        ("`get_task` of a finished task (one log page)", get),
        ("`start_task` of `exec sleep 60` until its timer is armed", starts),
        ("`cancel_task` of that task until `cancelled`", cancels),
    ] {
        b.row(Row::new("processes", format!("processes created in the sandbox by {what}")).value(n.to_string()).note(how.clone()));
    }
    Ok(())
}

// ───────────────────────────── pueue ─────────────────────────────

struct Pueue {
    bin: PathBuf,
    cfg: PathBuf,
    daemon: Child,
}

impl Pueue {
    fn start(b: &Bench, dir: &Path) -> Result<Pueue> {
        let root = b.o.work.join("pueue");
        for d in ["data", "run"] {
            fs::create_dir_all(root.join(d))?;
        }
        let cfg = root.join("pueue.yml");
        fs::write(
            &cfg,
            format!(
                "shared:\n  pueue_directory: {0}/data\n  runtime_directory: {0}/run\n  use_unix_socket: true\n  unix_socket_path: {0}/run/pueue.sock\n",
                root.display()
            ),
        )?;
        let log = File::create(b.log("pueued"))?;
        let daemon = Command::new(dir.join("pueued"))
            .arg("-c")
            .arg(&cfg)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .context("starting pueued")?;
        b.track(daemon.id(), "pueued")?;
        let mut p = Pueue { bin: dir.join("pueue"), cfg, daemon };
        let deadline = Instant::now() + Duration::from_secs(10);
        while p.run(&["status"]).is_err() {
            if Instant::now() > deadline {
                bail!("pueued did not answer within 10 s (see {})", b.log("pueued").display());
            }
            if let Ok(Some(st)) = p.daemon.try_wait() {
                bail!("pueued exited: {st}");
            }
            thread::sleep(Duration::from_millis(20));
        }
        Ok(p)
    }

    /// One `pueue` command: its wall time and stdout.
    fn run(&self, args: &[&str]) -> Result<(f64, String)> {
        let t = Instant::now();
        let out = Command::new(&self.bin)
            .arg("-c")
            .arg(&self.cfg)
            .args(args)
            .env("NO_COLOR", "1")
            .env("RUST_BACKTRACE", "0")
            .stdin(Stdio::null())
            .output()
            .context("running pueue")?;
        let e = secs(t);
        if !out.status.success() {
            bail!("pueue {args:?} failed: {}", String::from_utf8_lossy(&out.stderr).lines().next().unwrap_or(""));
        }
        Ok((e, String::from_utf8_lossy(&out.stdout).into_owned()))
    }

    fn stop(mut self) {
        let _ = self.run(&["kill", "--all"]);
        stop_child(&mut self.daemon, Duration::from_secs(5));
    }
}

impl Drop for Pueue {
    fn drop(&mut self) {
        stop_child(&mut self.daemon, Duration::from_secs(2));
    }
}

/// Per cycle: (start, read until "hello" is visible, stop), in seconds.
type Cycles = Vec<[f64; 3]>;

const PUEUE_WORK: &str = "echo hello; sleep 60";

fn pueue_cycles(p: &Pueue, n: usize) -> Result<Cycles> {
    let mut out = Vec::new();
    for _ in 0..n {
        let (add, id) = p.run(&["add", "-i", "-p", "--", PUEUE_WORK])?;
        let id = id.trim().to_string();
        let mut log = 0.0;
        for attempt in 0.. {
            let (t, text) = p.run(&["log", &id, "--json"])?;
            log += t;
            if text.contains("hello") {
                break;
            }
            if attempt > 500 {
                bail!("pueue task {id} never showed its output");
            }
        }
        let (kill, _) = p.run(&["kill", &id])?;
        out.push([add, log, kill]);
    }
    Ok(out)
}

/// The same work through a long-lived stdio session (`call: false`) or one `sandbox-mcp call`
/// process per step.
fn task_cycles(b: &Bench, ctl: &mut Ctl, n: usize, call: bool) -> Result<Cycles> {
    let plain = ctl.plain.clone();
    let step = |ctl: &mut Ctl, tool: &str, args: Value| -> Result<(f64, Value)> {
        let t = Instant::now();
        let v = if call {
            let out = b.ours(&["call", tool, &args.to_string()]).stdin(Stdio::null()).output()?;
            if !out.status.success() {
                bail!("sandbox-mcp call {tool} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
            }
            serde_json::from_slice(&out.stdout)?
        } else {
            ctl.rpc.tool(tool, &args)?
        };
        Ok((secs(t), v))
    };
    let mut out = Vec::new();
    for _ in 0..n {
        let (start, snap) = step(ctl, "start_task", json!({"sandbox_id": plain, "command": PUEUE_WORK, "timeout": 120}))?;
        let task = snap["task_id"].as_str().context("no task_id")?.to_string();
        let mut read = 0.0;
        for attempt in 0.. {
            let (t, s) = step(ctl, "get_task", json!({"sandbox_id": plain, "task_id": task}))?;
            read += t;
            if s["stdout"].as_str().is_some_and(|o| o.contains("hello")) {
                break;
            }
            if attempt > 500 {
                bail!("task {task} never showed its output");
            }
        }
        let (cancel, fin) = step(ctl, "cancel_task", json!({"sandbox_id": plain, "task_id": task}))?;
        if state(&fin) != "cancelled" {
            bail!("cancel_task ended {fin}");
        }
        ctl.delete_task(&plain, &task)?;
        out.push([start, read, cancel]);
    }
    Ok(out)
}

fn pueue_vs_tasks(b: &mut Bench, ctl: &mut Ctl) -> Result<()> {
    let Some(dir) = b.o.pueue_dir.clone() else {
        b.row(Row::new("pueue", "pueue add / log / kill").not_measured("pueue is not installed (tests/bench/run.sh installs it)"));
        return Ok(());
    };
    let n = b.n(20);
    let p = Pueue::start(b, &dir)?;
    pueue_cycles(&p, 2)?;
    task_cycles(b, ctl, 2, false)?;
    task_cycles(b, ctl, 1, true)?;
    // Interleaved in blocks of five cycles.
    let (mut pq, mut session, mut call) = (Vec::new(), Vec::new(), Vec::new());
    let blocks = n.div_ceil(5);
    for _ in 0..blocks {
        pq.extend(pueue_cycles(&p, 5)?);
        session.extend(task_cycles(b, ctl, 5, false)?);
        call.extend(task_cycles(b, ctl, 5, true)?);
    }
    p.stop();
    let keep = |b: &mut Bench, key: &str, c: &Cycles| -> (Stats, Stats) {
        let start_read: Vec<f64> = c.iter().map(|x| x[0] + x[1]).collect();
        let stop: Vec<f64> = c.iter().map(|x| x[2]).collect();
        b.keep_value(&format!("{key}.cycles"), json!(c));
        (b.keep(&format!("{key}.start_and_read"), &start_read), b.keep(&format!("{key}.stop"), &stop))
    };
    let (p_sr, p_kill) = keep(b, "pueue", &pq);
    let (s_sr, s_cancel) = keep(b, "tasks_stdio_session", &session);
    let (c_sr, c_cancel) = keep(b, "tasks_sandbox_mcp_call", &call);
    b.row(Row::new("pueue", "`pueue add` + `pueue log` until the output shows").lat(&p_sr));
    if let Some(start) = kept_median(b, "start_task_running_command") {
        let r = start / p_sr.median;
        b.row(
            Row::new("pueue", "`start_task` of a still-running command, until its answer (from the tasks group)")
                .value(dur(start))
                .vs(format!("pueue add + log {}", dur(p_sr.median)))
                .ratio(format!("{} pueue", times(r)))
                .target("faster than pueue (< 1×)", r < 1.0),
        );
    }
    for (label, s) in [("stdio session", &s_sr), ("`sandbox-mcp call` per step", &c_sr)] {
        let r = s.median / p_sr.median;
        b.row(
            Row::new("pueue", format!("`start_task` + `get_task` until the output shows, {label}"))
                .lat(s)
                .vs(format!("pueue add + log {}", dur(p_sr.median)))
                .ratio(format!("{} pueue", times(r)))
                .target("faster than pueue (< 1×)", r < 1.0),
        );
    }
    b.row(Row::new("pueue", "`pueue kill`").lat(&p_kill));
    for (label, s) in [("stdio session", &s_cancel), ("`sandbox-mcp call`", &c_cancel)] {
        let r = s.median / p_kill.median;
        b.row(
            Row::new("pueue", format!("`cancel_task`, {label}"))
                .lat(s)
                .vs(format!("pueue kill {}", dur(p_kill.median)))
                .ratio(format!("{} pueue", times(r)))
                .note("cancel_task returns once the end is confirmed (state cancelled); pueue kill returns once the daemon has sent the signal"),
        );
    }
    Ok(())
}

// ───────────────────────────── HTTP ─────────────────────────────

struct HttpServer {
    child: Child,
    url: String,
}

impl HttpServer {
    fn start(b: &Bench, workers: usize) -> Result<HttpServer> {
        let log_path = b.log(&format!("http-workers-{workers}"));
        let log = File::create(&log_path)?;
        let w = workers.to_string();
        let child = b
            .ours(&["http", "--listen", "127.0.0.1:0", "--workers", &w])
            .env("RUST_LOG", "warn,sandbox_mcp::server=info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .context("starting sandbox-mcp http")?;
        b.track(child.id(), "sandbox-mcp")?;
        let mut server = HttpServer { child, url: String::new() };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let text = fs::read_to_string(&log_path).unwrap_or_default();
            if let Some(rest) = text.split("listening on http://").nth(1) {
                let addr = rest.split('/').next().unwrap_or_default();
                server.url = format!("http://{addr}/mcp");
                return Ok(server);
            }
            if let Ok(Some(st)) = server.child.try_wait() {
                bail!("the HTTP server exited ({st}): {text}");
            }
            if Instant::now() > deadline {
                bail!("the HTTP server did not report its address within 10 s");
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        stop_child(&mut self.child, Duration::from_secs(5));
    }
}

/// One keep-alive HTTP/1.1 client with its own MCP session: a raw client over one TCP
/// connection (TCP_NODELAY, each request written at once), opened at the first request.
/// General-purpose clients add artifacts of their own here (ureq 3 showed a 3–4 ms tail on ~6 %
/// of loopback pings that neither the server nor a raw socket client has).
struct Http {
    addr: std::net::SocketAddr,
    host: String,
    path: String,
    limit: Duration,
    conn: Option<(TcpStream, BufReader<TcpStream>)>,
    sid: Option<String>,
    next: u64,
}

impl Http {
    fn new(url: &str) -> Result<Http> {
        Http::with_timeout(url, Duration::from_secs(30))
    }

    fn with_timeout(url: &str, limit: Duration) -> Result<Http> {
        let rest = url.strip_prefix("http://").ok_or_else(|| anyhow!("not an http:// URL: {url}"))?;
        let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
        let addr = host.parse().with_context(|| format!("{host} is not IP:PORT"))?;
        Ok(Http { addr, host: host.to_string(), path: format!("/{path}"), limit, conn: None, sid: None, next: 1 })
    }

    /// One request and its response (status, body); reconnects when the server closed.
    fn send(&mut self, method: &str, body: &str) -> Result<(u16, String)> {
        let mut req = format!(
            "{method} {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\n",
            self.path,
            self.host,
            body.len()
        );
        if let Some(sid) = &self.sid {
            req.push_str(&format!("Mcp-Session-Id: {sid}\r\nMCP-Protocol-Version: {PROTOCOL}\r\n"));
        }
        req.push_str("\r\n");
        req.push_str(body);
        if self.conn.is_none() {
            let stream = TcpStream::connect_timeout(&self.addr, self.limit)?;
            stream.set_nodelay(true)?;
            stream.set_read_timeout(Some(self.limit))?;
            stream.set_write_timeout(Some(self.limit))?;
            let reader = BufReader::new(stream.try_clone()?);
            self.conn = Some((stream, reader));
        }
        let (stream, reader) = self.conn.as_mut().context("no connection")?;
        stream.write_all(req.as_bytes())?;
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let status: u16 = line.split_whitespace().nth(1).and_then(|c| c.parse().ok()).ok_or_else(|| anyhow!("bad status line {line:?}"))?;
        let (mut length, mut chunked, mut close) = (0usize, false, false);
        loop {
            line.clear();
            if reader.read_line(&mut line)? == 0 {
                bail!("the connection closed inside the response headers");
            }
            let Some((name, value)) = line.trim_end().split_once(':') else { break };
            let value = value.trim();
            match name.to_ascii_lowercase().as_str() {
                "content-length" => length = value.parse()?,
                "transfer-encoding" => chunked = value.eq_ignore_ascii_case("chunked"),
                "connection" => close = value.eq_ignore_ascii_case("close"),
                "mcp-session-id" if self.sid.is_none() => self.sid = Some(value.to_string()),
                _ => {}
            }
        }
        let mut data = Vec::new();
        if chunked {
            loop {
                line.clear();
                reader.read_line(&mut line)?;
                let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)?;
                if size == 0 {
                    while reader.read_line(&mut line)? > 0 && line != "\r\n" {
                        line.clear();
                    }
                    break;
                }
                let at = data.len();
                data.resize(at + size + 2, 0);
                reader.read_exact(&mut data[at..])?;
                data.truncate(at + size);
            }
        } else {
            data.resize(length, 0);
            reader.read_exact(&mut data)?;
        }
        if close {
            self.conn = None;
        }
        Ok((status, String::from_utf8_lossy(&data).into_owned()))
    }

    fn post(&mut self, body: &str) -> Result<(u16, String)> {
        self.send("POST", body)
    }

    /// The next request's body: `params` is already JSON text.
    fn body(&mut self, method: &str, params: Option<&str>) -> String {
        let id = self.next;
        self.next += 1;
        match params {
            Some(p) => format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{p}}}"#),
            None => format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}"}}"#),
        }
    }

    fn initialize(&mut self) -> Result<()> {
        let params =
            json!({"protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "bench-driver", "version": "0"}}).to_string();
        let body = self.body("initialize", Some(&params));
        let (status, text) = self.post(&body)?;
        if status != 200 || self.sid.is_none() {
            bail!("initialize answered {status} {text}");
        }
        let (status, _) = self.post(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)?;
        if status != 202 {
            bail!("notifications/initialized answered {status}");
        }
        Ok(())
    }

    /// One request: its status, and what went wrong unless it succeeded (HTTP 200 and neither a
    /// JSON-RPC error nor a tool error).
    fn call(&mut self, method: &str, params: Option<&str>) -> Result<(u16, Option<String>)> {
        let body = self.body(method, params);
        let (status, text) = self.post(&body)?;
        let ok = status == 200 && !text.contains("\"isError\":true") && !text.contains("\"error\":{");
        Ok((status, (!ok).then(|| format!("HTTP {status}: {}", text.chars().take(300).collect::<String>()))))
    }

    /// Ends the session (DELETE) and closes the connection.
    fn end(&mut self) {
        if self.sid.is_some() {
            let _ = self.send("DELETE", "");
            self.sid = None;
        }
        self.conn = None;
    }
}

#[derive(Default)]
struct Load {
    ok: usize,
    failed: usize,
    busy: usize,
    lat: Vec<f64>,
    secs: f64,
    /// The first failure, for the note.
    first_error: Option<String>,
}

impl Load {
    fn rate(&self) -> f64 {
        self.ok as f64 / self.secs
    }
}

/// `clients` threads, each with its own keep-alive connection and session, sending `method`
/// back to back. Only requests that end inside the measurement window (after `warm`) count.
///
/// The clients connect one after the other: tiny_http 0.12 can leave a connection that arrives
/// together with others unserved while the keep-alive connections ahead of it stay open (see
/// [`connect_storm`], which measures exactly that).
fn http_load(url: &str, clients: usize, warm: Duration, window: Duration, method: &'static str, params: Option<String>) -> Result<Load> {
    Http::new(url)?;
    let barrier = Arc::new(Barrier::new(clients));
    let turn = Arc::new(Mutex::new(()));
    let params = Arc::new(params);
    let mut handles = Vec::new();
    for _ in 0..clients {
        let (barrier, turn, params, url) = (barrier.clone(), turn.clone(), params.clone(), url.to_string());
        handles.push(thread::Builder::new().stack_size(1024 * 1024).spawn(move || -> Result<Load> {
            let mut c = Http::new(&url)?; // cannot fail: the caller parsed the same URL
            let init = {
                let _turn = turn.lock().map_err(|_| anyhow!("a load thread panicked"));
                c.initialize()
            };
            barrier.wait();
            init?;
            let t0 = Instant::now();
            let (from, until) = (t0 + warm, t0 + warm + window);
            let mut out = Load::default();
            let mut i = 0u64;
            while Instant::now() < until && i < MAX_ITERATIONS {
                let t = Instant::now();
                let r = c.call(method, params.as_deref());
                let end = Instant::now();
                if end >= from && end <= until {
                    match r {
                        Ok((_, None)) => {
                            out.ok += 1;
                            out.lat.push((end - t).as_secs_f64());
                        }
                        Ok((503, _)) => out.busy += 1,
                        Ok((_, Some(err))) => {
                            out.failed += 1;
                            out.first_error.get_or_insert(err);
                        }
                        Err(err) => {
                            out.failed += 1;
                            out.first_error.get_or_insert(format!("{err:#}"));
                        }
                    }
                }
                i += 1;
            }
            c.end();
            Ok(out)
        })?);
    }
    let mut total = Load { secs: window.as_secs_f64(), ..Load::default() };
    for h in handles {
        let part = h.join().map_err(|_| anyhow!("a load thread panicked"))??;
        total.ok += part.ok;
        total.failed += part.failed;
        total.first_error = total.first_error.or(part.first_error);
        total.busy += part.busy;
        total.lat.extend(part.lat);
    }
    Ok(total)
}

/// `clients` connections opened at the same instant, each sending `initialize` with a `limit`
/// and staying open (as keep-alive clients do) until every one is answered or has given up: the
/// latencies of those answered, and how many were not answered in time.
fn connect_storm(url: &str, clients: usize, limit: Duration) -> Result<(Vec<f64>, usize)> {
    Http::new(url)?;
    let start = Arc::new(Barrier::new(clients));
    let done = Arc::new(Barrier::new(clients));
    let mut handles = Vec::new();
    for _ in 0..clients {
        let (start, done, url) = (start.clone(), done.clone(), url.to_string());
        handles.push(thread::Builder::new().stack_size(1024 * 1024).spawn(move || -> Option<f64> {
            let mut c = Http::with_timeout(&url, limit).ok()?; // cannot fail: the caller parsed the same URL
            start.wait();
            let t = Instant::now();
            let r = c.initialize().ok().map(|()| secs(t));
            done.wait();
            c.end();
            r
        })?);
    }
    let mut answered = Vec::new();
    let mut stalled = 0;
    for h in handles {
        match h.join().map_err(|_| anyhow!("a connecting thread panicked"))? {
            Some(e) => answered.push(e),
            None => stalled += 1,
        }
    }
    Ok((answered, stalled))
}

fn load_note(l: &Load) -> Option<String> {
    (l.failed + l.busy > 0).then(|| {
        let first = l.first_error.as_deref().map(|e| format!("; the first failure: {e}")).unwrap_or_default();
        format!("{} requests failed and {} got 503 (queue full) in the window{first}", l.failed, l.busy)
    })
}

fn http_ping(b: &mut Bench, ctl: &Ctl) -> Result<()> {
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

fn http_tools(b: &mut Bench, ctl: &Ctl) -> Result<()> {
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

// ───────────────────────────── E2B provider ─────────────────────────────

/// An API key of E2B's form (the emulator accepts any non-empty key).
const E2B_KEY: &str = "e2b_0000000000000000000000000000000000000000";
/// The directory and the small file of the file tools, relative to the sandbox's home.
const E2B_DIR: &str = "bench";
const E2B_FILE: &str = "bench/small.txt";
const E2B_CONTENT: &str = "hello\n";
/// A command still running when start_task first answers.
const E2B_RUNNING: &str = "sleep 2";
/// How long a first call from a fresh server process may take before the server is stopped.
const E2B_FIRST_CALL_LIMIT: Duration = Duration::from_secs(5);
/// The note of the e2b setup row (it holds for every e2b row).
const E2B_NOTE: &str = "the e2b provider talks to the E2B emulator on loopback (control plane and envd on one port; its sandboxes are \
local-provider sandboxes). The ratio to the local provider therefore mostly measures the emulator's envd path (HTTP handling and \
process spawning in the emulator) and loopback HTTP, not E2B's cloud, where every request also crosses the network. Request counts \
are the emulator's own (`GET /_emulator/requests`), read after each call (outside the timed part)";

/// The E2B emulator (`e2b-emulator`) on a free loopback port with a new state root under the
/// work directory, and a keep-alive client for its test API.
struct Emulator {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    url: String,
    api: Option<Http>,
}

impl Emulator {
    fn start(b: &Bench, exe: &Path) -> Result<Emulator> {
        let log_path = b.log("e2b-emulator");
        let log = File::create(&log_path)?;
        let child = Command::new(exe)
            .args(["--listen", "127.0.0.1:0", "--home"])
            .arg(b.o.work.join("e2b-home"))
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        b.track(child.id(), "e2b-emulator")?;
        let mut emu = Emulator { child, url: String::new(), api: None };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let text = fs::read_to_string(&log_path).unwrap_or_default();
            if let Some(rest) = text.split("listening on http://").nth(1) {
                let addr = rest.split_whitespace().next().unwrap_or_default().trim_end_matches('/');
                emu.url = format!("http://{addr}");
                emu.api = Some(Http::new(&format!("{}/_emulator/requests", emu.url))?);
                return Ok(emu);
            }
            if let Ok(Some(st)) = emu.child.try_wait() {
                bail!("the E2B emulator exited ({st}): {text}");
            }
            if Instant::now() > deadline {
                bail!("the E2B emulator did not report its address within 10 s");
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// `GET /_emulator/requests`: `{"total": N, "routes": {"POST /process.Process/Start": n, …}}`.
    fn counts(&mut self) -> Result<Value> {
        let api = self.api.as_mut().context("the emulator is not running")?;
        let (status, text) = api.send("GET", "")?;
        if status != 200 {
            bail!("GET /_emulator/requests answered {status} {text}");
        }
        serde_json::from_str(&text).with_context(|| format!("GET /_emulator/requests answered {text:?}"))
    }

    /// `DELETE /_emulator/requests`: the counts start again from zero.
    fn reset(&mut self) -> Result<()> {
        let api = self.api.as_mut().context("the emulator is not running")?;
        let (status, text) = api.send("DELETE", "")?;
        if !matches!(status, 200 | 204) {
            bail!("DELETE /_emulator/requests answered {status} {text}");
        }
        Ok(())
    }

    /// sandbox-mcp over stdio with the e2b provider pointed at this emulator.
    fn server(&self, b: &Bench) -> Command {
        e2b_server(b, &self.url)
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        self.api = None; // closes the test API connection
        stop_child(&mut self.child, Duration::from_secs(10)); // SIGTERM: it kills its sandboxes and exits
    }
}

/// sandbox-mcp over stdio with the e2b provider pointed at `url` (control plane and envd).
fn e2b_server(b: &Bench, url: &str) -> Command {
    let mut c = b.ours(&["stdio"]);
    c.env("SANDBOX_MCP_PROVIDER", "e2b").env("E2B_API_KEY", E2B_KEY).env("E2B_API_URL", url).env("E2B_SANDBOX_URL", url);
    c
}

/// Creates a sandbox in an e2b session and runs `echo hello` there to its end: the sandbox and
/// the finished task.
fn e2b_setup(rpc: &mut Rpc) -> Result<(String, String)> {
    let created = rpc.tool("create_sandbox", &json!({"timeout": 3600}))?;
    let sandbox = created["sandbox_id"].as_str().map(str::to_string).ok_or_else(|| anyhow!("create_sandbox returned {created}"))?;
    if created["provider"] != json!("e2b") {
        bail!("the server did not use the e2b provider: {created}");
    }
    let snap = rpc.tool("start_task", &json!({"sandbox_id": sandbox, "command": "echo hello"}))?;
    let task = snap["task_id"].as_str().context("start_task returned no task_id")?.to_string();
    let fin = wait_final(rpc, &sandbox, &task, Duration::from_secs(10), Duration::from_millis(10))?;
    if state(&fin) != "succeeded" {
        bail!("`echo hello` on e2b ended {fin}");
    }
    Ok((sandbox, task))
}

/// A loopback TCP proxy in front of `target` that counts the connections it accepts, to see
/// whether a client reuses its connections. Each connection is copied by two threads until
/// either side closes.
struct Proxy {
    url: String,
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    fn start(target: SocketAddr) -> Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let accepted = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (count, stopping) = (accepted.clone(), stop.clone());
        thread::Builder::new().stack_size(256 * 1024).spawn(move || {
            for conn in listener.incoming() {
                if stopping.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = conn else { continue };
                count.fetch_add(1, Ordering::SeqCst);
                let Ok(server) = TcpStream::connect(target) else { continue };
                let _ = (client.set_nodelay(true), server.set_nodelay(true));
                let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else { continue };
                for (mut from, mut to) in [(client, s2), (server, c2)] {
                    let _ = thread::Builder::new().stack_size(128 * 1024).spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(Shutdown::Write);
                    });
                }
            }
        })?;
        Ok(Proxy { url: format!("http://{addr}"), addr, accepted, stop })
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1)); // wakes the accept loop
    }
}

/// A separate pass through a counting proxy (the timed runs go to the emulator directly): the
/// TCP connections each call opens in steady state, per tool: one warm-up call, then three calls
/// of the same tool in a row (a call that leaves its connection unusable shows on the next call).
/// The server creates a sandbox and a task of its own.
fn e2b_connections(b: &Bench, emu: &Emulator) -> Result<Map<String, Value>> {
    let target: SocketAddr = emu.url.trim_start_matches("http://").parse().with_context(|| format!("the emulator's URL {}", emu.url))?;
    let proxy = Proxy::start(target)?;
    let mut rpc = Rpc::spawn(e2b_server(b, &proxy.url), &b.log("e2b-proxied"))?;
    rpc.initialize()?;
    let (sandbox, task) = e2b_setup(&mut rpc)?;
    let mut per_tool: Map<String, Value> = Map::new();
    let mut side = Side::new(&mut rpc, &sandbox, &task);
    side.conns = Some(proxy.accepted.clone());
    let mut pass = || -> Result<()> {
        for op in E2B_OPS {
            side.op(op, None)?;
            for _ in 0..3 {
                for c in side.op(op, None)? {
                    if let Some(a) = per_tool.entry(c.tool.to_string()).or_insert_with(|| json!([])).as_array_mut() {
                        a.push(json!(c.conns));
                    }
                }
            }
        }
        Ok(())
    };
    let r = pass();
    let killed = rpc.tool("kill_sandbox", &json!({"sandbox_id": sandbox}));
    let closed = rpc.close();
    drop(proxy);
    r?;
    killed?;
    closed?;
    Ok(per_tool)
}

/// The most common value (the smaller on a tie).
fn mode(xs: &[u64]) -> Option<u64> {
    let mut freq: Vec<(u64, usize)> = Vec::new();
    for &x in xs {
        match freq.iter_mut().find(|(v, _)| *v == x) {
            Some(f) => f.1 += 1,
            None => freq.push((x, 1)),
        }
    }
    freq.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    freq.first().map(|f| f.0)
}

/// What the e2b section measures: one or two tool calls each (the pairs clean up after
/// themselves, so every repetition does the same work).
#[derive(Clone, Copy, PartialEq)]
enum Op {
    Write,
    Read,
    List,
    Run,
    Start,
    Get,
    Cancel,
    Tasks,
    Create,
}

/// In this order (the file is written before it is read).
const E2B_OPS: [Op; 9] = [Op::Write, Op::Read, Op::List, Op::Run, Op::Start, Op::Get, Op::Cancel, Op::Tasks, Op::Create];

/// The rows: tool, what the call does, HTTP requests one call needs in steady state.
const E2B_TOOLS: [(&str, &str, u64); 11] = [
    ("run_command", "`run_command \"true\"`", 1),
    ("write_file", "`write_file` (6 bytes)", 1),
    ("read_file", "`read_file` (6 bytes)", 1),
    ("list_files", "`list_files` (a directory with one file)", 1),
    ("start_task", "`start_task \"true\"` until its first answer", 1),
    ("get_task", "`get_task` (a finished task)", 1),
    ("cancel_task", "`cancel_task` (a finished task: returns the saved result)", 1),
    ("list_tasks", "`list_tasks`", 1),
    ("delete_task", "`delete_task` (a finished task)", 1),
    ("create_sandbox", "`create_sandbox`", 1),
    ("kill_sandbox", "`kill_sandbox` (right after `create_sandbox`)", 1),
];

/// One provider's session, sandbox and finished task.
struct Side<'a> {
    rpc: &'a mut Rpc,
    sandbox: String,
    /// A finished task in `sandbox` whose stdout is "hello\n".
    task: String,
    /// start_task calls, and how many of them already answered with the final state.
    starts: usize,
    direct: usize,
    /// create_sandbox calls, and the kill_sandbox calls right after them that failed (then
    /// retried).
    creates: usize,
    kill_failures: Vec<String>,
    /// Connections accepted by a counting proxy in front of the emulator, when there is one.
    conns: Option<Arc<AtomicUsize>>,
}

/// One timed tool call: wall time and, when the emulator was given, the requests it made; with
/// a counting proxy, the connections it opened.
struct Call {
    tool: &'static str,
    secs: f64,
    counts: Option<Value>,
    conns: Option<usize>,
}

impl<'a> Side<'a> {
    fn new(rpc: &'a mut Rpc, sandbox: &str, task: &str) -> Side<'a> {
        Side {
            rpc,
            sandbox: sandbox.to_string(),
            task: task.to_string(),
            starts: 0,
            direct: 0,
            creates: 0,
            kill_failures: Vec::new(),
            conns: None,
        }
    }

    /// Calls `tool` (timed), checks its result, and counts its requests to `emu` (reset before,
    /// read after; neither inside the timed part).
    fn call(
        &mut self,
        emu: &mut Option<&mut Emulator>,
        tool: &'static str,
        args: Value,
        ok: impl Fn(&Value) -> bool,
    ) -> Result<(Call, Value)> {
        if let Some(e) = emu.as_deref_mut() {
            e.reset()?;
        }
        let accepted = |conns: &Option<Arc<AtomicUsize>>| conns.as_ref().map(|c| c.load(Ordering::SeqCst));
        let before = accepted(&self.conns);
        let t = Instant::now();
        let v = self.rpc.tool(tool, &args)?;
        let secs = secs(t);
        let conns = accepted(&self.conns).zip(before).map(|(a, b)| a - b);
        let counts = match emu.as_deref_mut() {
            Some(e) => Some(e.counts()?),
            None => None,
        };
        if !ok(&v) {
            bail!("{tool} {args} returned {v}");
        }
        Ok((Call { tool, secs, counts, conns }, v))
    }

    fn op(&mut self, op: Op, mut emu: Option<&mut Emulator>) -> Result<Vec<Call>> {
        let emu = &mut emu;
        let sb = self.sandbox.clone();
        let task = self.task.clone();
        let hello = |v: &Value| v["stdout"] == json!("hello\n");
        Ok(match op {
            Op::Write => {
                let args = json!({"sandbox_id": sb, "path": E2B_FILE, "content": E2B_CONTENT});
                vec![self.call(emu, "write_file", args, |v| v["bytes_written"] == json!(E2B_CONTENT.len()))?.0]
            }
            Op::Read => {
                let args = json!({"sandbox_id": sb, "path": E2B_FILE});
                vec![self.call(emu, "read_file", args, |v| v["content"] == json!(E2B_CONTENT))?.0]
            }
            Op::List => {
                let args = json!({"sandbox_id": sb, "path": E2B_DIR});
                vec![self.call(emu, "list_files", args, |v| v["entries"].as_array().is_some_and(|a| a.len() == 1))?.0]
            }
            Op::Run => {
                let args = json!({"sandbox_id": sb, "command": "true"});
                vec![self.call(emu, "run_command", args, |v| v["exit_code"] == json!(0))?.0]
            }
            Op::Start => {
                let args = json!({"sandbox_id": sb, "command": "true"});
                let (start, snap) = self.call(emu, "start_task", args, |v| v["task_id"].is_string())?;
                let id = snap["task_id"].as_str().unwrap_or_default().to_string();
                self.starts += 1;
                let fin = if state(&snap) == "running" {
                    wait_final(self.rpc, &sb, &id, Duration::from_secs(10), Duration::from_millis(2))?
                } else {
                    self.direct += 1;
                    snap
                };
                if state(&fin) != "succeeded" {
                    bail!("start_task true ended {fin}");
                }
                let args = json!({"sandbox_id": sb, "task_id": id});
                let (delete, _) = self.call(emu, "delete_task", args, |v| v["deleted"] == json!(true))?;
                vec![start, delete]
            }
            Op::Get => {
                let args = json!({"sandbox_id": sb, "task_id": task});
                vec![self.call(emu, "get_task", args, |v| state(v) == "succeeded" && hello(v))?.0]
            }
            Op::Cancel => {
                let args = json!({"sandbox_id": sb, "task_id": task});
                vec![self.call(emu, "cancel_task", args, |v| state(v) == "succeeded" && hello(v))?.0]
            }
            Op::Tasks => {
                let args = json!({"sandbox_id": sb});
                vec![self.call(emu, "list_tasks", args, |v| v["count"].as_u64().is_some_and(|n| n >= 1))?.0]
            }
            Op::Create => {
                let (create, v) = self.call(emu, "create_sandbox", json!({"timeout": 300}), |v| v["sandbox_id"].is_string())?;
                self.creates += 1;
                let args = json!({"sandbox_id": v["sandbox_id"]});
                match self.call(emu, "kill_sandbox", args.clone(), |v| v["killed"] == json!(true)) {
                    Ok((kill, _)) => vec![create, kill],
                    Err(err) => {
                        // Reported in the kill_sandbox row; the retry cleans up (and is not timed).
                        self.kill_failures.push(format!("{err:#}"));
                        self.call(emu, "kill_sandbox", args, |v| v["sandbox_id"].is_string())?;
                        vec![create]
                    }
                }
            }
        })
    }

    /// start_task of `command` (still running at its first answer): the time to that answer and
    /// the state it gave; then cancel_task and delete_task.
    fn start_running(&mut self, command: &str) -> Result<(f64, String)> {
        let sb = self.sandbox.clone();
        let t = Instant::now();
        let snap = self.rpc.tool("start_task", &json!({"sandbox_id": sb, "command": command, "timeout": 60}))?;
        let e = secs(t);
        let id = snap["task_id"].as_str().context("start_task returned no task_id")?.to_string();
        let fin = self.rpc.tool("cancel_task", &json!({"sandbox_id": sb, "task_id": id}))?;
        if !matches!(state(&fin), "cancelled" | "succeeded") {
            bail!("cancel_task of {command:?} ended {fin}");
        }
        self.rpc.tool("delete_task", &json!({"sandbox_id": sb, "task_id": id}))?;
        Ok((e, state(&snap).to_string()))
    }
}

/// A tool call that must answer within `limit`; otherwise the server is stopped (TERM, then
/// KILL 3 s later, by its own pid) and the call fails.
fn tool_within(rpc: &mut Rpc, tool: &str, args: &Value, limit: Duration) -> Result<Value> {
    let pid = rpc.pid();
    let (done, wait) = std::sync::mpsc::channel::<()>();
    let dog = thread::spawn(move || {
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = wait.recv_timeout(limit) {
            // The child is not reaped before this thread is joined: the pid is still its own.
            let _ = sh("kill -s TERM \"$1\"", &[&pid.to_string()]).status();
            let deadline = Instant::now() + Duration::from_secs(3);
            while running(pid) && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(10));
            }
            if running(pid) {
                let _ = sh("kill -s KILL \"$1\"", &[&pid.to_string()]).status();
            }
            true
        } else {
            false
        }
    });
    let r = rpc.tool(tool, args);
    let _ = done.send(());
    if dog.join().unwrap_or(false) {
        bail!("no answer within {} s (the server was stopped)", limit.as_secs());
    }
    r
}

/// Whether `pid` exists and is not a zombie.
fn running(pid: u32) -> bool {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z'))
}

/// `routes` of a request-count answer, as (route, count).
fn routes(counts: &Value) -> Vec<(String, u64)> {
    counts["routes"].as_object().map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0))).collect()).unwrap_or_default()
}

fn total(counts: &Value) -> u64 {
    counts["total"].as_u64().unwrap_or(0)
}

/// "`POST /process.Process/Start`" or "2 × `GET /sandboxes/{id}`, `POST …`".
fn route_text(routes: &[(String, u64)]) -> String {
    let parts: Vec<String> =
        routes.iter().filter(|(_, n)| *n > 0).map(|(r, n)| if *n == 1 { format!("`{r}`") } else { format!("{n} × `{r}`") }).collect();
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(", ")
    }
}

fn plural(n: u64) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// The requests of every call of one tool: the steady state (the most common total, the smaller
/// on a tie), its routes, and what the other calls made on top of it.
struct Requests {
    calls: usize,
    steady: u64,
    steady_routes: Vec<(String, u64)>,
    /// Calls that made more than the steady state, and the routes they added.
    more: usize,
    extra: Vec<(String, u64)>,
    fewer: usize,
}

impl Requests {
    fn of(counts: &[Value]) -> Requests {
        let steady = mode(&counts.iter().map(total).collect::<Vec<u64>>()).unwrap_or(0);
        let steady_routes = counts.iter().find(|c| total(c) == steady).map(routes).unwrap_or_default();
        let mut extra: Vec<(String, u64)> = Vec::new();
        let (mut more, mut fewer) = (0, 0);
        for c in counts {
            if total(c) < steady {
                fewer += 1;
            }
            if total(c) <= steady {
                continue;
            }
            more += 1;
            for (route, n) in routes(c) {
                let base = steady_routes.iter().find(|(r, _)| *r == route).map(|x| x.1).unwrap_or(0);
                if n > base {
                    match extra.iter_mut().find(|(r, _)| *r == route) {
                        Some(e) => e.1 += n - base,
                        None => extra.push((route, n - base)),
                    }
                }
            }
        }
        Requests { calls: counts.len(), steady, steady_routes, more, extra, fewer }
    }

    fn json(&self) -> Value {
        json!({"calls": self.calls, "steady": self.steady, "steady_routes": self.steady_routes, "calls_with_more": self.more,
            "extra_routes": self.extra, "calls_with_fewer": self.fewer})
    }

    /// A sentence about the calls that did not make the steady-state requests.
    fn note(&self) -> Option<String> {
        let mut parts = Vec::new();
        if self.more > 0 {
            let renewals = self.extra.iter().all(|(r, _)| r == "POST /sandboxes/{id}/connect");
            parts.push(format!(
                "{} of {} calls made more than {} request{}: {} in all{}",
                self.more,
                self.calls,
                self.steady,
                plural(self.steady),
                route_text(&self.extra),
                if renewals { " (TTL renewals, coalesced to one per 30 s per sandbox)" } else { "" }
            ));
        }
        if self.fewer > 0 {
            parts.push(format!("{} of {} calls made fewer than {}", self.fewer, self.calls, self.steady));
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

/// The e2b provider against the E2B emulator on loopback, tool by tool, against the same tools
/// on the local provider (the control session), interleaved in blocks; the HTTP requests every
/// e2b call makes; and the first call from a fresh server process.
fn e2b_rows(b: &mut Bench, ctl: &mut Ctl) -> Result<()> {
    let Some(exe) = b.o.e2b_emulator.clone() else {
        b.row(
            Row::new("e2b", "e2b provider vs local, per tool (overhead ratio, HTTP requests per tool)")
                .not_measured("no --e2b-emulator given (tests/bench/run.sh builds target/release/e2b-emulator)"),
        );
        return Ok(());
    };
    let mut emu = Emulator::start(b, &exe)?;
    let mut rpc = Rpc::spawn(emu.server(b), &b.log("e2b-stdio"))?;
    rpc.initialize()?;
    let (sandbox, task) = e2b_setup(&mut rpc)?;
    let measured = e2b_measure(b, ctl, &mut emu, &mut rpc, &sandbox, &task);
    // The sandbox holds a task, so the session's end would keep it: kill it here (stopping the
    // emulator would kill it too).
    let killed = rpc.tool("kill_sandbox", &json!({"sandbox_id": sandbox}));
    let closed = rpc.close();
    drop(emu);
    measured?;
    killed?;
    closed
}

fn e2b_measure(b: &mut Bench, ctl: &mut Ctl, emu: &mut Emulator, rpc: &mut Rpc, sandbox: &str, task: &str) -> Result<()> {
    let mut local = Side::new(&mut ctl.rpc, &ctl.plain, &ctl.done_task);
    let mut e2b = Side::new(rpc, sandbox, task);

    // Warm-up, then rounds of one block per op and provider.
    // Warm-up, then rounds of one block per op and provider: up to 40 samples per tool (4 in
    // quick mode), fewer when the rounds run past a time budget (at least two rounds).
    let (warm, block) = if b.o.quick { (2, 2) } else { (3, 8) };
    let rounds = b.n(40).div_ceil(block);
    let budget = Duration::from_secs(if b.o.quick { 8 } else { 20 });
    for op in E2B_OPS {
        for _ in 0..warm {
            local.op(op, None)?;
            e2b.op(op, Some(&mut *emu))?;
        }
    }
    let mut local_xs: Map<String, Value> = Map::new();
    let mut e2b_xs: Map<String, Value> = Map::new();
    let mut counts: Map<String, Value> = Map::new();
    let push = |m: &mut Map<String, Value>, tool: &str, v: Value| {
        if let Some(a) = m.entry(tool.to_string()).or_insert_with(|| json!([])).as_array_mut() {
            a.push(v);
        }
    };
    let timed = Instant::now();
    let mut done = 0;
    while done < rounds && (done < 2 || timed.elapsed() < budget) {
        done += 1;
        for op in E2B_OPS {
            for _ in 0..block {
                for c in local.op(op, None)? {
                    push(&mut local_xs, c.tool, json!(c.secs));
                }
            }
            for _ in 0..block {
                for c in e2b.op(op, Some(&mut *emu))? {
                    push(&mut e2b_xs, c.tool, json!(c.secs));
                    push(&mut counts, c.tool, c.counts.unwrap_or(Value::Null));
                }
            }
        }
    }
    // start_task of a command still running at its first answer (then cancelled and deleted).
    let (mut running_local, mut running_e2b) = (Vec::new(), Vec::new());
    for _ in 0..if b.o.quick { 2 } else { 3 } {
        running_local.push(local.start_running(E2B_RUNNING)?);
        running_e2b.push(e2b.start_running(E2B_RUNNING)?);
    }
    let (local_starts, e2b_starts) = ((local.direct, local.starts), (e2b.direct, e2b.starts));
    let kill_failures =
        [("local", local.creates, std::mem::take(&mut local.kill_failures)), ("e2b", e2b.creates, std::mem::take(&mut e2b.kill_failures))];

    // The first call from fresh server processes: get_task (which must learn the access token)
    // and run_command (which must also renew and read the environment for masking).
    let n_fresh = b.n(20).max(3);
    let mut first: Map<String, Value> = Map::new();
    for (tool, args) in
        [("get_task", json!({"sandbox_id": sandbox, "task_id": task})), ("run_command", json!({"sandbox_id": sandbox, "command": "true"}))]
    {
        let (mut xs, mut per_call, mut at_start, mut failure) = (Vec::new(), Vec::new(), 0, None);
        for _ in 0..n_fresh {
            emu.reset()?;
            let mut fresh = Rpc::spawn(emu.server(b), &b.log("e2b-fresh"))?;
            fresh.initialize()?;
            at_start += total(&emu.counts()?);
            emu.reset()?;
            let t = Instant::now();
            let r = tool_within(&mut fresh, tool, &args, E2B_FIRST_CALL_LIMIT);
            let e = secs(t);
            let c = emu.counts()?;
            match r {
                Ok(_) => {
                    xs.push(e);
                    per_call.push(c);
                    fresh.close()?;
                }
                Err(err) => {
                    failure = Some(format!("{err:#}; requests seen: {}", route_text(&routes(&c))));
                    break; // dropped: killed by its own pid if it still runs
                }
            }
        }
        first.insert(tool.into(), json!({"secs": xs, "counts": per_call, "requests_at_start": at_start, "failure": failure}));
    }

    let conns = e2b_connections(b, emu)?;

    // Rows.
    b.row(
        Row::new(
            "e2b",
            "setup: sandbox-mcp over stdio with the e2b provider → e2b-emulator on 127.0.0.1, vs the local provider's control session, \
interleaved in blocks",
        )
        .note(if done < rounds {
            format!("{E2B_NOTE}. The timed rounds stopped after {done} of {rounds} (time budget {} s)", budget.as_secs())
        } else {
            E2B_NOTE.to_string()
        }),
    );
    let mut raw = Map::new();
    for (tool, what, need) in E2B_TOOLS {
        let xs = |m: &Map<String, Value>| -> Vec<f64> {
            m.get(tool).and_then(Value::as_array).map(|a| a.iter().filter_map(Value::as_f64).collect()).unwrap_or_default()
        };
        let (lx, ex) = (xs(&local_xs), xs(&e2b_xs));
        let l = b.keep(&format!("e2b.local.{tool}"), &lx);
        let e = b.keep(&format!("e2b.e2b.{tool}"), &ex);
        let per_call: Vec<Value> = counts.get(tool).and_then(Value::as_array).cloned().unwrap_or_default();
        let req = Requests::of(&per_call);
        raw.insert(tool.into(), req.json());
        let r = e.median / l.median;
        let mut row = Row::new("e2b", format!("{what}, e2b provider"))
            .lat(&e)
            .vs(format!("local {}", dur(l.median)))
            .ratio(format!("{} local", times(r)))
            .target(
                format!("≤ {need} HTTP request{} per call; steady state {}: {}", plural(need), req.steady, route_text(&req.steady_routes)),
                req.steady <= need,
            );
        let mut notes: Vec<String> = req.note().into_iter().collect();
        if tool == "start_task" {
            notes.push(format!(
                "{} of {} e2b and {} of {} local start_task calls (warm-up included) already answered with the final state",
                e2b_starts.0, e2b_starts.1, local_starts.0, local_starts.1
            ));
        }
        if tool == "kill_sandbox" {
            for (side, creates, failures) in &kill_failures {
                if let Some(first) = failures.first() {
                    notes.push(format!(
                        "{} of {creates} {side} kill_sandbox calls right after create_sandbox failed and were retried (not timed); the first: {first}",
                        failures.len()
                    ));
                }
            }
            let log = fs::read_to_string(b.log("e2b-emulator")).unwrap_or_default();
            let warned = log.lines().filter(|l| l.contains("killing local sandbox")).count();
            if warned > 0 {
                let first = log.lines().find(|l| l.contains("killing local sandbox")).unwrap_or("");
                let first = first.split_once("] ").map_or(first, |x| x.1); // without the log prefix
                notes.push(format!(
                    "the emulator logged {warned} failed kills of its local sandboxes (answering 204 all the same); the first: {first}"
                ));
            }
        }
        if !notes.is_empty() {
            row = row.note(notes.join("; "));
        }
        b.row(row);
    }
    b.keep_value("e2b.requests", Value::Object(raw));
    b.keep_value("e2b.rounds", json!({"done": done, "planned": rounds, "block": block, "warm": warm, "budget_s": budget.as_secs()}));
    b.keep_value(
        "e2b.kill_failures",
        json!(kill_failures.iter().map(|(side, creates, f)| json!({"side": side, "creates": creates, "failures": f})).collect::<Vec<_>>()),
    );

    let states = |xs: &[(f64, String)]| {
        let mut seen: Vec<(String, usize)> = Vec::new();
        for (_, st) in xs {
            match seen.iter_mut().find(|(s, _)| s == st) {
                Some(x) => x.1 += 1,
                None => seen.push((st.clone(), 1)),
            }
        }
        seen.iter().map(|(s, n)| format!("{s} ×{n}")).collect::<Vec<_>>().join(", ")
    };
    let secs_of = |xs: &[(f64, String)]| xs.iter().map(|x| x.0).collect::<Vec<f64>>();
    let l = b.keep("e2b.local.start_task_running", &secs_of(&running_local));
    let e = b.keep("e2b.e2b.start_task_running", &secs_of(&running_e2b));
    b.row(
        Row::new("e2b", format!("`start_task \"{E2B_RUNNING}\"` (still running): time to its first answer, e2b provider"))
            .lat(&e)
            .vs(format!("local {}", dur(l.median)))
            .ratio(format!("{} local", times(e.median / l.median)))
            .target("< 0.5 s (start_task answers once the supervisor confirms the task runs)", e.median < 0.5)
            .note(format!("states at the first answer: e2b {}; local {}", states(&running_e2b), states(&running_local))),
    );

    let mut opening = Vec::new();
    let mut per_call = Vec::new();
    for (tool, _, _) in E2B_TOOLS {
        let xs: Vec<u64> =
            conns.get(tool).and_then(Value::as_array).map(|a| a.iter().filter_map(Value::as_u64).collect()).unwrap_or_default();
        let m = mode(&xs).context(format!("no connection counts for {tool}"))?;
        if m > 0 {
            opening.push(tool);
        }
        per_call.push(format!("{tool} {m}"));
    }
    b.keep_value("e2b.connections_per_call", Value::Object(conns));
    b.row(
        Row::new("e2b", "new TCP connections per call in steady state (a separate pass through a counting TCP proxy)")
            .value(format!("{} of {} tools open a connection per call", opening.len(), E2B_TOOLS.len()))
            .target("0: every call reuses a kept-alive connection", opening.is_empty())
            .note(format!(
                "new connections per call (the most common of 3 calls of the same tool in a row, after one more): {}. A request on a new \
connection costs a TCP handshake more, and on E2B's cloud (HTTPS) a TLS handshake too",
                per_call.join(", ")
            )),
    );

    let steady_get = b.raw.get("e2b.e2b.get_task").and_then(|v| v["stats"]["median"].as_f64()).unwrap_or(f64::NAN);
    let steady_run = b.raw.get("e2b.e2b.run_command").and_then(|v| v["stats"]["median"].as_f64()).unwrap_or(f64::NAN);
    for (tool, what, need, why, steady) in [
        (
            "get_task",
            "`get_task`, first call from a fresh server process",
            2,
            "`GET /sandboxes/{id}` for the access token, then the status snippet (`Start`)",
            steady_get,
        ),
        (
            "run_command",
            "`run_command \"true\"`, first call from a fresh server process",
            4,
            "`GET /sandboxes/{id}` for the TTL, `connect` (renewal), the environment read for masking and the command (`Start`)",
            steady_run,
        ),
    ] {
        let f = first.get(tool).cloned().unwrap_or(Value::Null);
        let xs: Vec<f64> = f["secs"].as_array().map(|a| a.iter().filter_map(Value::as_f64).collect()).unwrap_or_default();
        let s = b.keep(&format!("e2b.first_call.{tool}"), &xs);
        let per_call: Vec<Value> = f["counts"].as_array().cloned().unwrap_or_default();
        let req = Requests::of(&per_call);
        let at_start = f["requests_at_start"].as_u64().unwrap_or(0);
        b.keep_value(
            &format!("e2b.first_call.{tool}.requests"),
            json!({"per_call": req.json(), "requests_at_start": at_start, "failure": f["failure"]}),
        );
        let mut row = Row::new("e2b", format!("{what}, e2b provider"));
        let mut notes: Vec<String> = Vec::new();
        if let Some(err) = f["failure"].as_str() {
            notes.push(format!("a first call from a fresh server failed: {err}"));
            row = row.target(format!("answers; ≤ {need} HTTP requests ({why})"), false);
        } else {
            row = row.target(
                format!("≤ {need} HTTP requests ({why}); measured {}: {}", req.steady, route_text(&req.steady_routes)),
                req.steady <= need,
            );
        }
        if !xs.is_empty() {
            row = row.lat(&s).vs(format!("later calls {}", dur(steady))).ratio(format!("{} later calls", times(s.median / steady)));
        }
        notes.extend(req.note());
        if at_start > 0 {
            notes.push(format!("the fresh servers made {at_start} requests before their first call"));
        }
        if !notes.is_empty() {
            row = row.note(notes.join("; "));
        }
        b.row(row);
    }
    Ok(())
}
