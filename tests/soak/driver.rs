//! Load and soak: HTTP clients and stdio sessions drive the real release binary with a
//! mix of create/run/start/get/cancel/kill for a while, checking every answer; then the driver
//! checks what must hold after any amount of load:
//!
//! - no panic in any server's log, every request answered (errors are counted and listed);
//! - every task's final state is what its command did (exit code, logs), cancelled tasks are
//!   `cancelled`, timed-out ones `timed_out`;
//! - RSS and open descriptors of every server at the end are within noise of the start;
//! - after the clients kill their sandboxes and the servers stop (SIGTERM, within 5 s), no
//!   sandbox directory and no process of the run is left.
//!
//! `make soak` runs 10 minutes with 64 HTTP clients and 4 stdio sessions; `make test` runs a
//! 20-second version. Settings: SOAK_SECONDS, SOAK_HTTP_CLIENTS, SOAK_STDIO, SOAK_SEED,
//! SANDBOX_MCP_BIN (default: the release binary beside this example). Exit status 0 means every
//! check held; the last stdout line is a JSON report.

use anyhow::{anyhow, bail, Context, Result};
use sandbox_mcp::client::StdioClient;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const PROTOCOL: &str = "2025-11-25";
/// Longest wait for one answer; a request unanswered this long counts as lost.
const ANSWER_WAIT: Duration = Duration::from_secs(60);
/// RSS growth from the warmed-up start to the end that counts as a leak.
const RSS_NOISE_KB: u64 = 16 * 1024;
/// Open-descriptor growth that counts as a leak (after the clients have disconnected).
const FD_NOISE: usize = 4;

struct Opts {
    seconds: u64,
    http_clients: usize,
    stdio_sessions: usize,
    seed: u64,
    bin: PathBuf,
}

fn opts() -> Result<Opts> {
    let num = |name: &str, default: u64| -> Result<u64> {
        match std::env::var(name) {
            Ok(v) => v.parse().with_context(|| format!("{name}={v:?} is not a number")),
            Err(_) => Ok(default),
        }
    };
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1);
    let bin = match std::env::var_os("SANDBOX_MCP_BIN") {
        Some(b) => PathBuf::from(b),
        // target/release/examples/soak -> target/release/sandbox-mcp
        None => std::env::current_exe()?.parent().and_then(Path::parent).context("locating the binary")?.join("sandbox-mcp"),
    };
    Ok(Opts {
        seconds: num("SOAK_SECONDS", 20)?,
        http_clients: num("SOAK_HTTP_CLIENTS", 64)? as usize,
        stdio_sessions: num("SOAK_STDIO", 4)? as usize,
        seed: num("SOAK_SEED", now)?,
        bin,
    })
}

/// xorshift64*: reproducible choices from SOAK_SEED.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

// ───────────────────────────── clients ─────────────────────────────

/// How a request ended, for the tally.
#[derive(Debug)]
enum Failure {
    /// No answer, or not one we can read: the server broke its contract.
    Transport(String),
    /// A JSON-RPC error or an HTTP error status.
    Rpc(String),
    /// 503 / -32000 with a full queue: back-pressure, counted but not a failure.
    Busy,
}

type Outcome = std::result::Result<Value, Failure>;

/// One MCP session, over HTTP or stdio.
trait Session: Send {
    /// A tools/call; `Ok` is the call's `result` (which may be a tool error).
    fn call(&mut self, tool: &str, args: Value) -> Outcome;
    /// Ends the session and starts a new one (HTTP DELETE + initialize; nothing for stdio,
    /// whose session is its process).
    fn restart(&mut self) -> Outcome;
    /// Disconnects: HTTP drops its connection, stdio closes stdin and checks the server exits
    /// cleanly within 5 s.
    fn close(self: Box<Self>) -> std::result::Result<(), String>;
}

/// A raw HTTP/1.1 client that keeps its connection until the server says `Connection: close`.
struct HttpSession {
    addr: SocketAddr,
    conn: Option<BufReader<TcpStream>>,
    session: Option<String>,
    next_id: u64,
}

struct HttpAnswer {
    status: u16,
    session: Option<String>,
    body: Vec<u8>,
}

impl HttpSession {
    fn open(addr: SocketAddr) -> Result<HttpSession> {
        let mut s = HttpSession { addr, conn: None, session: None, next_id: 1 };
        s.initialize().map_err(|f| anyhow!("initialize: {f:?}"))?;
        Ok(s)
    }

    fn exchange(&mut self, method: &str, body: &[u8]) -> std::io::Result<HttpAnswer> {
        if self.conn.is_none() {
            let s = TcpStream::connect(self.addr)?;
            s.set_read_timeout(Some(ANSWER_WAIT))?;
            s.set_nodelay(true)?;
            self.conn = Some(BufReader::new(s));
        }
        let Some(conn) = self.conn.as_mut() else { unreachable!("connected above") };
        let mut head = format!(
            "{method} /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\n",
            body.len()
        );
        if let Some(id) = &self.session {
            head.push_str(&format!("Mcp-Session-Id: {id}\r\nMcp-Protocol-Version: {PROTOCOL}\r\n"));
        }
        head.push_str("\r\n");
        let sent = conn.get_mut().write_all(head.as_bytes()).and_then(|()| conn.get_mut().write_all(body));
        let answer = sent.and_then(|()| read_answer(conn));
        match &answer {
            Ok((_, true)) | Err(_) => self.conn = None,
            Ok((_, false)) => {}
        }
        answer.map(|(a, _)| a)
    }

    fn rpc(&mut self, method: &str, params: Value) -> Outcome {
        let id = self.next_id;
        self.next_id += 1;
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string();
        let a = self.exchange("POST", body.as_bytes()).map_err(|e| Failure::Transport(format!("{method}: {e}")))?;
        if a.status == 503 {
            return Err(Failure::Busy);
        }
        let v: Value = serde_json::from_slice(&a.body)
            .map_err(|e| Failure::Transport(format!("{method}: HTTP {} with a non-JSON body ({e})", a.status)))?;
        if a.status != 200 {
            return Err(Failure::Rpc(format!("{method}: HTTP {}: {v}", a.status)));
        }
        if let Some(s) = a.session {
            self.session = Some(s);
        }
        answer_of(&v, id, method)
    }

    fn initialize(&mut self) -> Outcome {
        self.session = None;
        let params = json!({"protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "soak", "version": "0"}});
        let r = self.rpc("initialize", params)?;
        if self.session.is_none() {
            return Err(Failure::Rpc("initialize: no Mcp-Session-Id".into()));
        }
        Ok(r)
    }
}

fn read_answer(conn: &mut BufReader<TcpStream>) -> std::io::Result<(HttpAnswer, bool)> {
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    let mut line = String::new();
    if conn.read_line(&mut line)? == 0 {
        return Err(bad("the connection closed before an answer"));
    }
    let status: u16 = line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).ok_or_else(|| bad("bad status line"))?;
    let (mut len, mut close, mut session) = (0usize, false, None);
    loop {
        let mut h = String::new();
        conn.read_line(&mut h)?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':').ok_or_else(|| bad("bad header"))?;
        let v = v.trim();
        match k.to_ascii_lowercase().as_str() {
            "content-length" => len = v.parse().map_err(|_| bad("bad Content-Length"))?,
            "connection" => close = v.eq_ignore_ascii_case("close"),
            "mcp-session-id" => session = Some(v.to_string()),
            _ => {}
        }
    }
    let mut body = vec![0u8; len];
    conn.read_exact(&mut body)?;
    Ok((HttpAnswer { status, session, body }, close))
}

fn answer_of(v: &Value, id: u64, method: &str) -> Outcome {
    if v["id"].as_u64() != Some(id) {
        return Err(Failure::Transport(format!("{method}: answer for id {} instead of {id}", v["id"])));
    }
    outcome(v, method)
}

/// A JSON-RPC response as an outcome: its result, or its error classified.
fn outcome(v: &Value, method: &str) -> Outcome {
    if let Some(err) = v.get("error") {
        if err["code"] == -32000 {
            return Err(Failure::Busy);
        }
        return Err(Failure::Rpc(format!("{method}: {err}")));
    }
    Ok(v["result"].clone())
}

impl Session for HttpSession {
    fn call(&mut self, tool: &str, args: Value) -> Outcome {
        self.rpc("tools/call", json!({"name": tool, "arguments": args}))
    }

    fn restart(&mut self) -> Outcome {
        let a = self.exchange("DELETE", b"").map_err(|e| Failure::Transport(format!("DELETE: {e}")))?;
        if a.status != 200 && a.status != 204 {
            return Err(Failure::Rpc(format!("DELETE: HTTP {}", a.status)));
        }
        self.initialize()
    }

    fn close(self: Box<Self>) -> std::result::Result<(), String> {
        Ok(())
    }
}

/// A stdio server (its stderr appended to a log) and its one session.
struct StdioSession {
    client: StdioClient,
}

impl StdioSession {
    fn spawn(bin: &Path, env: &[(String, String)], log: &Path) -> Result<StdioSession> {
        let envs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let script = r#"exec "$0" stdio 2>>"$1""#;
        let args = [script, &bin.display().to_string(), &log.display().to_string()];
        let mut client = StdioClient::spawn(Path::new("/bin/sh"), &["-c", args[0], args[1], args[2]], &envs, false)?;
        client.initialize()?;
        Ok(StdioSession { client })
    }
}

impl Session for StdioSession {
    fn call(&mut self, tool: &str, args: Value) -> Outcome {
        let params = json!({"name": tool, "arguments": args});
        match self.client.request("tools/call", params, ANSWER_WAIT) {
            Ok(v) => outcome(&v, tool),
            Err(e) => Err(Failure::Transport(format!("{tool}: {e:#}"))),
        }
    }

    fn restart(&mut self) -> Outcome {
        Ok(Value::Null)
    }

    fn close(self: Box<Self>) -> std::result::Result<(), String> {
        match self.client.close(Duration::from_secs(5)) {
            Ok(status) if status.success() => Ok(()),
            Ok(status) => Err(format!("the stdio server exited with {status}")),
            Err(e) => Err(format!("{e:#}")),
        }
    }
}

// ───────────────────────────── the workload ─────────────────────────────

/// What a task must end as.
#[derive(Clone, Debug)]
enum Expect {
    Exit { code: i64, stdout: String, stderr: String },
    Cancelled,
    TimedOut,
}

impl Expect {
    fn state(&self) -> &'static str {
        match self {
            Expect::Exit { code: 0, .. } => "succeeded",
            Expect::Exit { .. } => "failed",
            Expect::Cancelled => "cancelled",
            Expect::TimedOut => "timed_out",
        }
    }
}

struct Pending {
    sandbox: String,
    task: String,
    expect: Expect,
}

struct Sandbox {
    id: String,
    has_task: bool,
}

/// Counters shared by every client.
#[derive(Default)]
struct Tally {
    requests: AtomicU64,
    busy: AtomicU64,
    errors: AtomicU64,
    tasks_checked: Mutex<BTreeMap<String, u64>>,
    wrong: AtomicU64,
    messages: Mutex<Vec<String>>,
}

impl Tally {
    fn problem(&self, counter: &AtomicU64, msg: String) {
        counter.fetch_add(1, Ordering::Relaxed);
        let mut m = self.messages.lock().unwrap_or_else(|p| p.into_inner());
        if m.len() < 30 {
            m.push(msg);
        }
    }
}

struct Client<'a> {
    name: String,
    session: Box<dyn Session>,
    rng: Rng,
    tally: &'a Tally,
    sandboxes: Vec<Sandbox>,
    pending: Vec<Pending>,
    /// Checked tasks, to delete (a sandbox holds at most 128 task directories).
    finished: Vec<(String, String)>,
    sandbox_timeout: u64,
    nonce: u64,
}

impl Client<'_> {
    /// One request; `None` when it failed (already counted).
    fn call(&mut self, tool: &str, args: Value) -> Option<Value> {
        self.tally.requests.fetch_add(1, Ordering::Relaxed);
        match self.session.call(tool, args.clone()) {
            Ok(r) if r["isError"] == true => {
                let text = r["content"][0]["text"].as_str().unwrap_or("").to_string();
                self.tally.problem(&self.tally.errors, format!("{}: {tool} {args} failed: {text}", self.name));
                None
            }
            Ok(r) => Some(r["structuredContent"].clone()),
            Err(Failure::Busy) => {
                self.tally.busy.fetch_add(1, Ordering::Relaxed);
                None
            }
            Err(Failure::Rpc(e) | Failure::Transport(e)) => {
                self.tally.problem(&self.tally.errors, format!("{}: {e}", self.name));
                None
            }
        }
    }

    fn nonce(&mut self) -> String {
        self.nonce += 1;
        format!("{}-{}", self.name, self.nonce)
    }

    fn sandbox(&mut self) -> Option<String> {
        if self.sandboxes.is_empty() || (self.sandboxes.len() < 2 && self.rng.below(20) == 0) {
            let r = self.call("create_sandbox", json!({"timeout": self.sandbox_timeout}))?;
            let id = r["sandbox_id"].as_str()?.to_string();
            self.sandboxes.push(Sandbox { id, has_task: false });
        }
        let i = self.rng.below(self.sandboxes.len() as u64) as usize;
        Some(self.sandboxes[i].id.clone())
    }

    fn step(&mut self) {
        let Some(sb) = self.sandbox() else { return };
        if self.finished.len() > 8 {
            self.delete_one();
        }
        match self.rng.below(100) {
            0..=39 => self.run_command(&sb),
            40..=54 => self.start(&sb, false),
            55..=59 => self.start(&sb, true),
            60..=79 => self.check_one(),
            80..=87 => self.files(&sb),
            88..=92 => {
                self.call("list_tasks", json!({"sandbox_id": sb}));
            }
            93..=97 => self.kill_idle_sandbox(),
            _ => self.restart(),
        }
    }

    fn run_command(&mut self, sb: &str) {
        let n = self.nonce();
        let code = self.rng.below(3) as i64;
        let cmd = format!("echo out-{n}; echo err-{n} >&2; exit {code}");
        if let Some(r) = self.call("run_command", json!({"sandbox_id": sb, "command": cmd})) {
            let want = (json!(code), json!(format!("out-{n}\n")), json!(format!("err-{n}\n")));
            if (r["exit_code"].clone(), r["stdout"].clone(), r["stderr"].clone()) != want {
                self.tally.problem(&self.tally.wrong, format!("{}: run_command {cmd:?} answered {r}", self.name));
            }
        }
    }

    fn start(&mut self, sb: &str, long: bool) {
        let n = self.nonce();
        let (args, expect) = if !long {
            let code = self.rng.below(3) as i64;
            let pause = if self.rng.below(2) == 0 { "" } else { "sleep 0.3; " };
            let cmd = format!("echo out-{n}; {pause}echo err-{n} >&2; exit {code}");
            (json!({"sandbox_id": sb, "command": cmd}), Expect::Exit { code, stdout: format!("out-{n}\n"), stderr: format!("err-{n}\n") })
        } else if self.rng.below(2) == 0 {
            (json!({"sandbox_id": sb, "command": "sleep 300"}), Expect::Cancelled)
        } else {
            (json!({"sandbox_id": sb, "command": "sleep 300", "timeout": 1}), Expect::TimedOut)
        };
        let Some(r) = self.call("start_task", args) else { return };
        let Some(task) = r["task_id"].as_str() else {
            self.tally.problem(&self.tally.wrong, format!("{}: start_task answered without a task_id: {r}", self.name));
            return;
        };
        if let Some(s) = self.sandboxes.iter_mut().find(|s| s.id == sb) {
            s.has_task = true;
        }
        let task = task.to_string();
        if matches!(expect, Expect::Cancelled) {
            if let Some(s) = self.call("cancel_task", json!({"sandbox_id": sb, "task_id": task})) {
                if self.judge(&Pending { sandbox: sb.into(), task: task.clone(), expect: expect.clone() }, &s) {
                    self.finished.push((sb.to_string(), task));
                    return;
                }
            }
        }
        self.pending.push(Pending { sandbox: sb.to_string(), task, expect });
    }

    /// Checks a final snapshot against what the task did; `false` while it is still running.
    fn judge(&self, p: &Pending, s: &Value) -> bool {
        let state = s["state"].as_str().unwrap_or("");
        if state == "running" {
            return false;
        }
        let ok = state == p.expect.state()
            && match &p.expect {
                Expect::Exit { code, stdout, stderr } => s["exit_code"] == *code && s["stdout"] == *stdout && s["stderr"] == *stderr,
                _ => true,
            };
        if ok {
            *self.tally.tasks_checked.lock().unwrap_or_else(|e| e.into_inner()).entry(state.to_string()).or_default() += 1;
        } else {
            self.tally.problem(&self.tally.wrong, format!("{}: task {} expected {:?}, got {s}", self.name, p.task, p.expect));
        }
        true
    }

    fn check_one(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let i = self.rng.below(self.pending.len() as u64) as usize;
        let p = self.pending.swap_remove(i);
        match self.call("get_task", json!({"sandbox_id": p.sandbox, "task_id": p.task})) {
            Some(s) if self.judge(&p, &s) => self.finished.push((p.sandbox, p.task)),
            // Still running, or the read failed (counted): look again later.
            _ => self.pending.push(p),
        }
    }

    /// Deletes a checked task; one whose processes are still ending is tried again later.
    fn delete_one(&mut self) {
        let Some((sb, task)) = self.finished.pop() else { return };
        self.tally.requests.fetch_add(1, Ordering::Relaxed);
        match self.session.call("delete_task", json!({"sandbox_id": sb, "task_id": task})) {
            Ok(r) if r["isError"] != true => {}
            Ok(r) if r["content"][0]["text"].as_str().unwrap_or("").contains("cancel_task first") => self.finished.insert(0, (sb, task)),
            Ok(r) => self.tally.problem(&self.tally.errors, format!("{}: delete_task {task}: {r}", self.name)),
            Err(Failure::Busy) => self.finished.push((sb, task)),
            Err(Failure::Rpc(e) | Failure::Transport(e)) => self.tally.problem(&self.tally.errors, format!("{}: {e}", self.name)),
        }
    }

    fn files(&mut self, sb: &str) {
        let n = self.nonce();
        let path = format!("f-{}.txt", self.rng.below(4));
        if self.call("write_file", json!({"sandbox_id": sb, "path": path, "content": n})).is_none() {
            return;
        }
        if let Some(r) = self.call("read_file", json!({"sandbox_id": sb, "path": path})) {
            if r["content"] != json!(n) {
                self.tally.problem(&self.tally.wrong, format!("{}: read_file gave {r}, wrote {n:?}", self.name));
            }
        }
    }

    /// Kills a sandbox with no task left to check, as agents do when they are done.
    fn kill_idle_sandbox(&mut self) {
        let Some(i) = self.sandboxes.iter().position(|s| !self.pending.iter().any(|p| p.sandbox == s.id)) else { return };
        let id = self.sandboxes[i].id.clone();
        if self.call("kill_sandbox", json!({"sandbox_id": id})).is_some() {
            self.sandboxes.remove(i);
            self.finished.retain(|(sb, _)| *sb != id);
        }
    }

    /// Ends the session and starts a new one: the sandboxes without tasks die with it.
    fn restart(&mut self) {
        self.tally.requests.fetch_add(1, Ordering::Relaxed);
        match self.session.restart() {
            Ok(Value::Null) => {}
            Ok(_) => self.sandboxes.retain(|s| s.has_task),
            Err(f) => self.tally.problem(&self.tally.errors, format!("{}: session restart: {f:?}", self.name)),
        }
    }

    /// After the load: every pending task reaches its final state, then every sandbox is killed.
    fn finish(&mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while !self.pending.is_empty() && Instant::now() < deadline {
            self.check_one();
            if self.pending.len() < 3 {
                thread::sleep(Duration::from_millis(100));
            }
        }
        for p in std::mem::take(&mut self.pending) {
            self.tally.problem(&self.tally.wrong, format!("{}: task {} never reached {:?}", self.name, p.task, p.expect));
        }
        for s in std::mem::take(&mut self.sandboxes) {
            self.call("kill_sandbox", json!({"sandbox_id": s.id}));
        }
    }
}

// ───────────────────────────── servers and measurements ─────────────────────────────

#[derive(Clone, Copy, Debug, Default)]
struct Usage {
    rss_kb: u64,
    fds: usize,
}

fn usage(pid: u32) -> Result<Usage> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let rss_kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .context("no VmRSS")?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))?.count();
    Ok(Usage { rss_kb, fds })
}

fn start_http(bin: &Path, env: &[(String, String)], log: &Path) -> Result<(Child, SocketAddr)> {
    let log_file = std::fs::File::create(log)?;
    let mut child = Command::new(bin)
        .args(["http", "--listen", "127.0.0.1:0"])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file)
        .spawn()
        .context("starting the HTTP server")?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(rest) = text.split("listening on http://").nth(1) {
            let addr = rest.split('/').next().unwrap_or("").parse().context("reading the listen address")?;
            return Ok((child, addr));
        }
        if Instant::now() > deadline || child.try_wait()?.is_some() {
            let _ = child.kill();
            bail!("the HTTP server did not start: {text}");
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// SIGTERM by the child's own pid (shell builtin), then the exit status and how long it took.
fn terminate(child: &mut Child) -> Result<(bool, Duration)> {
    let t0 = Instant::now();
    Command::new("/bin/sh").args(["-c", &format!("kill -s TERM {}", child.id())]).status()?;
    while t0.elapsed() < Duration::from_secs(10) {
        if let Some(s) = child.try_wait()? {
            return Ok((s.success(), t0.elapsed()));
        }
        thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    Ok((false, t0.elapsed()))
}

/// Processes that mention the run's state root in their command line or environment.
fn leftover_processes(home: &Path) -> Vec<String> {
    let needle = home.display().to_string();
    let me = std::process::id();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        if pid == me {
            continue;
        }
        let read =
            |f: &str| std::fs::read(entry.path().join(f)).map(|b| String::from_utf8_lossy(&b).replace('\0', " ")).unwrap_or_default();
        let (cmdline, environ) = (read("cmdline"), read("environ"));
        let zombie = read("stat").rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('Z'));
        if !zombie && (cmdline.contains(&needle) || environ.contains(&needle)) {
            found.push(format!("{pid}: {}", cmdline.chars().take(120).collect::<String>()));
        }
    }
    found
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(err) => {
            eprintln!("soak: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<bool> {
    let o = opts()?;
    let work = std::env::temp_dir().join(format!("smcp-soak-{}", sandbox_mcp::ids::random_hex(4)));
    let home = work.join("home");
    std::fs::create_dir_all(&home)?;
    println!(
        "soak: {} s, {} HTTP clients, {} stdio sessions, seed {}, work dir {}",
        o.seconds,
        o.http_clients,
        o.stdio_sessions,
        o.seed,
        work.display()
    );
    let env = vec![
        ("SANDBOX_MCP_HOME".to_string(), home.display().to_string()),
        ("SANDBOX_MCP_PROVIDER".into(), "local".into()),
        ("RUST_LOG".into(), "info".into()),
        // Every client keeps sandboxes of its own, so together they hold more live sandboxes
        // than the default cap (64) allows.
        ("SANDBOX_MCP_MAX_SANDBOXES".into(), "4096".into()),
    ];
    let (mut http, addr) = start_http(&o.bin, &env, &work.join("http.log"))?;
    let mut servers: Vec<(String, u32)> = vec![("http".into(), http.id())];
    let mut sessions: Vec<(String, Box<dyn Session>)> = Vec::new();
    for i in 0..o.stdio_sessions {
        let s = StdioSession::spawn(&o.bin, &env, &work.join(format!("stdio-{i}.log")))?;
        servers.push((format!("stdio-{i}"), s.client.pid()));
        sessions.push((format!("s{i}"), Box::new(s)));
    }
    for i in 0..o.http_clients {
        sessions.push((format!("h{i}"), Box::new(HttpSession::open(addr)?)));
    }

    // Load.
    let tally = Tally::default();
    let stop = AtomicBool::new(false);
    let load = Duration::from_secs(o.seconds);
    let warm = (load / 5).min(Duration::from_secs(30));
    let began = Instant::now();
    let (start_usage, mut kept) = thread::scope(|scope| -> Result<_> {
        let mut handles = Vec::new();
        for (i, (name, session)) in sessions.into_iter().enumerate() {
            let (tally, stop) = (&tally, &stop);
            let seed = o.seed ^ (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let sandbox_timeout = o.seconds + 600;
            handles.push(scope.spawn(move || {
                let mut c = Client {
                    name,
                    session,
                    rng: Rng::new(seed),
                    tally,
                    sandboxes: Vec::new(),
                    pending: Vec::new(),
                    finished: Vec::new(),
                    sandbox_timeout,
                    nonce: 0,
                };
                while !stop.load(Ordering::Relaxed) {
                    c.step();
                }
                c.finish(Duration::from_secs(60));
                c.session
            }));
        }
        while began.elapsed() < warm {
            thread::sleep(Duration::from_millis(100));
        }
        let start: Vec<Usage> = servers.iter().map(|(_, pid)| usage(*pid)).collect::<Result<_>>()?;
        while began.elapsed() < load {
            thread::sleep(Duration::from_millis(100));
        }
        stop.store(true, Ordering::Relaxed);
        let mut kept = Vec::new();
        for h in handles {
            kept.push(h.join().map_err(|_| anyhow!("a client thread panicked"))?);
        }
        Ok((start, kept))
    })?;
    let loaded_for = began.elapsed();

    // End usage, once the HTTP clients' connections have closed.
    let stdio_sessions: Vec<Box<dyn Session>> = kept.drain(..o.stdio_sessions.min(kept.len())).collect();
    let mut closing_errors: Vec<String> = kept.into_iter().filter_map(|s| s.close().err()).collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut end_usage: Vec<Usage>;
    loop {
        end_usage = servers.iter().map(|(_, pid)| usage(*pid)).collect::<Result<_>>()?;
        let settled = end_usage.iter().zip(&start_usage).all(|(e, s)| e.fds <= s.fds + FD_NOISE);
        if settled || Instant::now() > deadline {
            break;
        }
        thread::sleep(Duration::from_millis(100));
    }

    // Stop the servers: the HTTP one by SIGTERM, the stdio ones by closing their stdin.
    let (http_clean, http_stop) = terminate(&mut http)?;
    closing_errors.extend(stdio_sessions.into_iter().filter_map(|s| s.close().err()));
    let sandboxes_left: Vec<String> = std::fs::read_dir(home.join("sandboxes"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let procs_left = wait_none(|| leftover_processes(&home), Duration::from_secs(5));
    let panics: Vec<String> = std::fs::read_dir(&work)?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
        .filter(|e| std::fs::read_to_string(e.path()).unwrap_or_default().contains("panicked"))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();

    // Report.
    let requests = tally.requests.load(Ordering::Relaxed);
    let errors = tally.errors.load(Ordering::Relaxed);
    let wrong = tally.wrong.load(Ordering::Relaxed);
    let busy = tally.busy.load(Ordering::Relaxed);
    let mut checks = Vec::new();
    let mut growth = Vec::new();
    for ((name, _), (s, e)) in servers.iter().zip(start_usage.iter().zip(&end_usage)) {
        println!("soak: {name:8} RSS {} -> {} KiB, fds {} -> {}", s.rss_kb, e.rss_kb, s.fds, e.fds);
        growth.push(json!({"server": name, "rss_kb": [s.rss_kb, e.rss_kb], "fds": [s.fds, e.fds]}));
        checks.push((format!("{name}: RSS within {RSS_NOISE_KB} KiB of the start"), e.rss_kb <= s.rss_kb + RSS_NOISE_KB));
        checks.push((format!("{name}: open descriptors within {FD_NOISE} of the start"), e.fds <= s.fds + FD_NOISE));
    }
    let tasks = tally.tasks_checked.lock().unwrap_or_else(|e| e.into_inner()).clone();
    checks.extend([
        ("no request failed".to_string(), errors == 0),
        ("every task and command ended as it did".to_string(), wrong == 0),
        ("no panic in any server log".to_string(), panics.is_empty()),
        ("the HTTP server exited cleanly within 5 s of SIGTERM".to_string(), http_clean && http_stop < Duration::from_secs(5)),
        ("every stdio server exited cleanly within 5 s of stdin EOF".to_string(), closing_errors.is_empty()),
        ("no sandbox directory left".to_string(), sandboxes_left.is_empty()),
        ("no process of the run left".to_string(), procs_left.is_empty()),
    ]);
    let rate = requests as f64 / loaded_for.as_secs_f64();
    println!(
        "soak: {requests} requests in {:.1} s ({rate:.0}/s), {errors} errors ({:.4}%), {busy} busy answers, tasks checked {tasks:?}",
        loaded_for.as_secs_f64(),
        100.0 * errors as f64 / requests.max(1) as f64
    );
    for m in tally.messages.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        println!("soak: problem: {m}");
    }
    for e in &closing_errors {
        println!("soak: closing: {e}");
    }
    for s in &sandboxes_left {
        println!("soak: sandbox left: {s}");
    }
    for p in &procs_left {
        println!("soak: process left: {p}");
    }
    let mut all_ok = true;
    for (what, ok) in &checks {
        println!("soak: {} {what}", if *ok { "ok  " } else { "FAIL" });
        all_ok &= ok;
    }
    let report = json!({
        "seconds": loaded_for.as_secs_f64(), "http_clients": o.http_clients, "stdio_sessions": o.stdio_sessions,
        "seed": o.seed, "requests": requests, "errors": errors, "busy": busy, "wrong": wrong,
        "tasks_checked": tasks, "usage": growth, "http_stop_ms": http_stop.as_millis() as u64,
        "sandboxes_left": sandboxes_left.len(), "processes_left": procs_left.len(), "ok": all_ok,
    });
    println!("{report}");
    if all_ok {
        let _ = std::fs::remove_dir_all(&work);
    } else {
        println!("soak: logs kept in {}", work.display());
    }
    Ok(all_ok)
}

/// Polls `f` until it returns nothing or `limit` passes; returns the last answer.
fn wait_none(f: impl Fn() -> Vec<String>, limit: Duration) -> Vec<String> {
    let deadline = Instant::now() + limit;
    loop {
        let found = f();
        if found.is_empty() || Instant::now() > deadline {
            return found;
        }
        thread::sleep(Duration::from_millis(50));
    }
}
