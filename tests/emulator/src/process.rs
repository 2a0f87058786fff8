//! The processes of one emulated sandbox, kept the way envd keeps them: output fanned out to the
//! streams attached at the moment it is read (no replay; discarded when nobody listens), the end
//! event kept for 30 s after exit, signals to the one pid, and a kill at the start deadline.
//!
//! Each child has two pipe-reader threads (32 KiB reads, like envd) and a monitor thread that
//! polls for its exit. A slow stream never blocks the child: every subscriber has an unbounded
//! queue with a byte budget, and a subscriber that falls more than [`SUBSCRIBER_BUDGET`] bytes
//! behind is cut off (its stream ends with `resource_exhausted`) while the child and the other
//! subscribers go on. (envd instead blocks the child on a stalled attached reader.)
//!
//! In an isolated sandbox the emulator's child is `nsenter`, which forks the program into the
//! sandbox's pid namespace and then waits for it, passing on its exit status. There the process
//! is known by the program's pid inside the sandbox (what envd reports), and signals go to the
//! program itself ([`Entered`]): `nsenter` does not forward them.

use crossbeam_channel::{Receiver, Sender};
use sandbox_mcp::base64;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ExitStatus};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// Bytes read from a pipe at a time (envd's `stdChunkSize`).
pub const CHUNK: usize = 32 * 1024;

/// Output bytes a subscriber may have queued before it is cut off.
pub const SUBSCRIBER_BUDGET: usize = 16 * 1024 * 1024;

/// How long the end event of an exited process stays available to `Connect`.
pub const END_RETENTION: Duration = Duration::from_secs(30);

/// How long output still in the pipes is read after the process exited (a background
/// grandchild holding the pipes open must not hold the end event back).
const DRAIN_GRACE: Duration = Duration::from_millis(200);

/// What a stream attached to a process receives.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Output read from a pipe.
    Data {
        /// Whether it came from stderr.
        stderr: bool,
        /// The bytes.
        bytes: Vec<u8>,
    },
    /// The process ended; the value is the `end` object of the process event.
    End(Value),
    /// The sandbox went away (killed, paused, expired); the stream ends with `unavailable`.
    Gone(String),
    /// This subscriber fell too far behind and was cut off.
    Overflow,
}

struct Sub {
    id: u64,
    tx: Sender<Event>,
    pending: Arc<AtomicUsize>,
}

#[derive(Default)]
struct Output {
    subs: Vec<Sub>,
    /// Output is no longer forwarded (killed with KILL/TERM, deadline, or ended).
    stopped: bool,
    end: Option<Value>,
    ended_at: Option<Instant>,
}

/// The program of a process started in an isolated sandbox, as the host sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entered {
    /// Its pid on the host.
    pub host_pid: u32,
    /// Its start time in clock ticks since boot (guards against pid reuse).
    pub start: u64,
    /// Its pid inside the sandbox.
    pub pid: u32,
}

/// The pids of process `pid` in each pid namespace from the host's down to its own (`NSpid` of
/// `/proc/<pid>/status`); one entry for a process of the host's namespace, none when it is gone.
pub fn ns_pids(pid: u32) -> Vec<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:")).unwrap_or("");
    line.split_whitespace().filter_map(|p| p.parse().ok()).collect()
}

/// How many pid namespaces deep the emulator itself is (1 in the host's, as `/proc` shows it).
pub fn own_ns_depth() -> usize {
    ns_pids(std::process::id()).len().max(1)
}

/// Waits (at most `budget`) for `nsenter`, the emulator's child `wrapper`, to fork the program
/// into the sandbox's pid namespace, and returns that program. `None` when `wrapper` ended
/// without forking (it could not enter the sandbox) or the budget ran out.
pub fn entered(wrapper: u32, budget: Duration) -> Option<Entered> {
    let deadline = Instant::now() + budget;
    let depth = own_ns_depth();
    let mut step = Duration::from_micros(200);
    loop {
        let children = std::fs::read_to_string(format!("/proc/{wrapper}/task/{wrapper}/children")).unwrap_or_default();
        if let Some(host_pid) = children.split_whitespace().next().and_then(|p| p.parse::<u32>().ok()) {
            let start = sandbox_mcp::provider::process::proc_stat(host_pid).map(|st| st.start);
            let ids = ns_pids(host_pid);
            if let (Some(start), Some(pid), true) = (start, ids.last(), ids.len() > depth) {
                return Some(Entered { host_pid, start, pid: *pid });
            }
        }
        let running = sandbox_mcp::provider::process::proc_stat(wrapper).is_some_and(|st| st.state != 'Z');
        if !running || Instant::now() >= deadline {
            return None;
        }
        thread::sleep(step);
        step = (step * 2).min(Duration::from_millis(10));
    }
}

/// One process started through `Start`.
pub struct Proc {
    /// Its pid as reported to clients: the pid of the program after the wrapper shell's `exec`
    /// (in an isolated sandbox, its pid inside the sandbox).
    pub pid: u32,
    /// The pid of the emulator's child on the host (the program, or `nsenter` in an isolated
    /// sandbox), which leads the process group.
    leader: u32,
    /// The program inside an isolated sandbox, where signals go.
    entered: Option<Entered>,
    /// The `ProcessConfig` it was started with, zero values omitted (for `List`).
    pub config: Value,
    /// Its tag, if the request gave one.
    pub tag: Option<String>,
    /// The child until it is reaped; holding this lock guarantees the pid is still ours.
    child: Mutex<Option<Child>>,
    stdin: Mutex<Option<ChildStdin>>,
    out: Mutex<Output>,
    next_sub: AtomicU64,
}

/// A stream's attachment to a process; detaches on drop.
pub struct Subscription {
    /// Where the events arrive.
    pub rx: Receiver<Event>,
    pending: Arc<AtomicUsize>,
    proc: Arc<Proc>,
    id: u64,
}

impl Subscription {
    /// Tells the budget that `n` bytes of data were taken off the queue.
    pub fn consumed(&self, n: usize) {
        let _ = self.pending.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| Some(p.saturating_sub(n)));
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if let Ok(mut out) = self.proc.out.lock() {
            out.subs.retain(|s| s.id != self.id);
        }
    }
}

impl Proc {
    /// Attaches a new subscriber, or returns the end event when the process already ended.
    pub fn subscribe(self: &Arc<Self>) -> Result<Subscription, Value> {
        let mut out = match self.out.lock() {
            Ok(o) => o,
            Err(_) => return Err(end_unknown("the process table is corrupt")),
        };
        if let Some(end) = &out.end {
            return Err(end.clone());
        }
        let (tx, rx) = crossbeam_channel::unbounded();
        let id = self.next_sub.fetch_add(1, Ordering::Relaxed);
        let pending = Arc::new(AtomicUsize::new(0));
        out.subs.push(Sub { id, tx, pending: pending.clone() });
        Ok(Subscription { rx, pending, proc: self.clone(), id })
    }

    /// Whether it has not ended yet.
    pub fn is_running(&self) -> bool {
        self.out.lock().map(|o| o.end.is_none()).unwrap_or(false)
    }

    fn publish(&self, stderr: bool, bytes: &[u8]) {
        let Ok(mut out) = self.out.lock() else { return };
        if out.stopped || out.subs.is_empty() {
            return;
        }
        let n = bytes.len();
        out.subs.retain(|s| {
            if s.pending.load(Ordering::Relaxed).saturating_add(n) > SUBSCRIBER_BUDGET {
                let _ = s.tx.send(Event::Overflow);
                return false;
            }
            s.pending.fetch_add(n, Ordering::Relaxed);
            s.tx.send(Event::Data { stderr, bytes: bytes.to_vec() }).is_ok()
        });
    }

    /// Ends every attached stream with `Gone(reason)` (the process itself is not touched).
    pub fn disconnect_all(&self, reason: &str) {
        if let Ok(mut out) = self.out.lock() {
            for s in out.subs.drain(..) {
                let _ = s.tx.send(Event::Gone(reason.to_string()));
            }
        }
    }

    /// Sends `signal` (`KILL`, `TERM`) to this pid only, through the shell builtin. KILL and TERM
    /// also stop forwarding output, like envd. `Err` when the process was already reaped.
    pub fn signal(&self, shell: &Path, signal: &str) -> Result<(), String> {
        let guard = self.child.lock().map_err(|_| "the process table is corrupt".to_string())?;
        if guard.is_none() {
            return Err(format!("process with pid {} not found", self.pid));
        }
        if signal == "KILL" || signal == "TERM" {
            if let Ok(mut out) = self.out.lock() {
                out.stopped = true;
            }
        }
        self.send(shell, signal)
    }

    /// Sends `signal` to the program; the caller holds the `child` lock with the child unreaped,
    /// so the leader's pid cannot have been reused. The program inside an isolated sandbox is
    /// checked by its start time; once it has ended (its `nsenter` exits right after) there is
    /// nothing left to signal.
    fn send(&self, shell: &Path, signal: &str) -> Result<(), String> {
        match self.entered {
            None => signal_pid(shell, self.leader, signal),
            Some(e) => match sandbox_mcp::provider::process::proc_stat(e.host_pid) {
                Some(st) if st.start == e.start && st.state != 'Z' => signal_pid(shell, e.host_pid, signal),
                _ => Ok(()),
            },
        }
    }

    /// Writes to the child's stdin.
    pub fn write_stdin(&self, data: &[u8]) -> Result<(), String> {
        let mut guard = self.stdin.lock().map_err(|_| "the process table is corrupt".to_string())?;
        let Some(stdin) = guard.as_mut() else {
            return Err("stdin not enabled or closed".into());
        };
        stdin.write_all(data).and_then(|()| stdin.flush()).map_err(|e| format!("error writing to stdin of process '{}': {e}", self.pid))
    }

    /// Closes the child's stdin (no-op when it has none).
    pub fn close_stdin(&self) {
        if let Ok(mut guard) = self.stdin.lock() {
            guard.take();
        }
    }
}

/// The processes of one sandbox by pid: running ones plus ended ones for [`END_RETENTION`].
#[derive(Default)]
pub struct ProcessTable {
    procs: Mutex<HashMap<u32, Arc<Proc>>>,
}

impl ProcessTable {
    /// Registers a started process.
    pub fn insert(&self, proc: Arc<Proc>) {
        if let Ok(mut procs) = self.procs.lock() {
            procs.insert(proc.pid, proc);
        }
    }

    fn purged(&self) -> Vec<Arc<Proc>> {
        let Ok(mut procs) = self.procs.lock() else { return Vec::new() };
        procs.retain(|_, p| p.out.lock().map(|o| o.ended_at.is_none_or(|t| t.elapsed() < END_RETENTION)).unwrap_or(false));
        let mut all: Vec<Arc<Proc>> = procs.values().cloned().collect();
        all.sort_by_key(|p| p.pid);
        all
    }

    /// Running processes, by pid.
    pub fn running(&self) -> Vec<Arc<Proc>> {
        self.purged().into_iter().filter(|p| p.is_running()).collect()
    }

    /// A running process by pid or tag (`Err` is envd's not-found message).
    pub fn find_running(&self, selector: &Selector) -> Result<Arc<Proc>, String> {
        self.find(selector, false)
    }

    /// A running process, or an ended one whose end event is still kept.
    pub fn find_any(&self, selector: &Selector) -> Result<Arc<Proc>, String> {
        self.find(selector, true)
    }

    fn find(&self, selector: &Selector, ended_too: bool) -> Result<Arc<Proc>, String> {
        let all = self.purged();
        let found = all.into_iter().filter(|p| ended_too || p.is_running()).find(|p| match selector {
            Selector::Pid(pid) => p.pid == *pid,
            Selector::Tag(tag) => p.tag.as_deref() == Some(tag.as_str()),
        });
        found.ok_or_else(|| match selector {
            Selector::Pid(pid) => format!("process with pid {pid} not found"),
            Selector::Tag(tag) => format!("process with tag {tag} not found"),
        })
    }

    /// Ends every stream attached to any process with `Gone(reason)`.
    pub fn disconnect_all(&self, reason: &str) {
        for p in self.purged() {
            p.disconnect_all(reason);
        }
    }
}

/// How a request names a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    /// By pid.
    Pid(u32),
    /// By the tag given at start.
    Tag(String),
}

/// Says whether the sandbox is still there when a process ends: `None` when it is, else the
/// reason streams are given instead of the end event.
pub type GoneCheck = Box<dyn Fn() -> Option<String> + Send>;

/// Takes ownership of a freshly spawned child: starts its pipe readers and its monitor, and
/// returns the process with a first subscription attached before any output is read. `entered`
/// is the program when the child is the `nsenter` of an isolated sandbox.
pub fn launch(
    mut child: Child,
    entered: Option<Entered>,
    config: Value,
    tag: Option<String>,
    deadline: Option<Instant>,
    shell: PathBuf,
    gone_check: GoneCheck,
) -> io::Result<(Arc<Proc>, Subscription)> {
    let leader = child.id();
    let pid = entered.map_or(leader, |e| e.pid);
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let stdin = child.stdin.take();
    let proc = Arc::new(Proc {
        pid,
        leader,
        entered,
        config,
        tag,
        child: Mutex::new(Some(child)),
        stdin: Mutex::new(stdin),
        out: Mutex::new(Output::default()),
        next_sub: AtomicU64::new(0),
    });
    let first = proc.subscribe().map_err(|_| io::Error::other("the process ended before it was registered"))?;
    let (done_tx, done_rx) = crossbeam_channel::bounded::<()>(2);
    let mut readers = 0;
    for (pipe, is_err) in [(stdout.map(|p| Box::new(p) as Box<dyn Read + Send>), false), (stderr.map(|p| Box::new(p) as _), true)] {
        let Some(pipe) = pipe else { continue };
        let me = proc.clone();
        let done = done_tx.clone();
        spawn_named("e2b-emulator-pipe", move || read_pipe(pipe, &me, is_err, &done))?;
        readers += 1;
    }
    drop(done_tx);
    let me = proc.clone();
    spawn_named("e2b-emulator-wait", move || monitor(&me, deadline, &shell, readers, &done_rx, &gone_check))?;
    Ok((proc, first))
}

fn spawn_named(name: &str, body: impl FnOnce() + Send + 'static) -> io::Result<()> {
    thread::Builder::new().name(name.into()).stack_size(128 * 1024).spawn(body).map(|_| ())
}

fn read_pipe(mut pipe: Box<dyn Read + Send>, proc: &Proc, stderr: bool, done: &Sender<()>) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        match pipe.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => proc.publish(stderr, &buf[..n]),
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    let _ = done.send(());
}

fn monitor(proc: &Proc, deadline: Option<Instant>, shell: &Path, readers: usize, done: &Receiver<()>, gone_check: &GoneCheck) {
    let mut step = Duration::from_micros(500);
    let mut killed = false;
    let status = loop {
        {
            let Ok(mut guard) = proc.child.lock() else { return };
            let Some(child) = guard.as_mut() else { return };
            match child.try_wait() {
                Ok(Some(status)) => {
                    *guard = None;
                    break Some(status);
                }
                Ok(None) => {}
                Err(_) => {
                    *guard = None;
                    break None;
                }
            }
            if !killed && deadline.is_some_and(|d| Instant::now() >= d) {
                killed = true;
                if let Ok(mut out) = proc.out.lock() {
                    out.stopped = true;
                }
                // Still unreaped under the lock: the pid is ours.
                if let Err(err) = proc.send(shell, "KILL") {
                    log::warn!("could not kill pid {} at its deadline: {err}", proc.pid);
                }
            }
        }
        thread::sleep(step);
        step = (step * 2).min(Duration::from_millis(10));
    };
    // Let the readers pass on what is still in the pipes, unless output was already stopped.
    let stopped = proc.out.lock().map(|o| o.stopped).unwrap_or(true);
    if !stopped {
        // Late readers on a busy machine are waited for while nothing else can hold the pipes
        // (the child led its own group and the group is empty), as the provider does.
        sandbox_mcp::provider::process::drain_readers(done, readers, proc.leader, DRAIN_GRACE, DRAIN_GRACE);
    }
    let end = match status {
        Some(status) => end_event(&status),
        None => end_unknown("the emulator lost track of the process"),
    };
    let gone = gone_check();
    proc.close_stdin();
    if let Ok(mut out) = proc.out.lock() {
        out.stopped = true;
        out.end = Some(end.clone());
        out.ended_at = Some(Instant::now());
        for s in out.subs.drain(..) {
            let event = match &gone {
                None => Event::End(end.clone()),
                Some(reason) => Event::Gone(reason.clone()),
            };
            let _ = s.tx.send(event);
        }
    }
}

/// Sends `signal` to `pid` with the shell's builtin `kill` (never pid 0 or 1, never a group).
pub fn signal_pid(shell: &Path, pid: u32, signal: &str) -> Result<(), String> {
    if pid <= 1 || pid == std::process::id() || signal.is_empty() || !signal.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(format!("refusing to send {signal:?} to pid {pid}"));
    }
    match sandbox_mcp::provider::process::signal_pids(shell, signal, &[pid]) {
        Ok(true) => Ok(()),
        Ok(false) => Err(format!("kill -s {signal} {pid} failed")),
        Err(e) => Err(format!("could not run {}: {e}", shell.display())),
    }
}

/// The `end` object envd reports for an exit status (Go's `ProcessState`, zero values omitted):
/// exit 0 → `{"exited":true,"status":"exit status 0"}`; exit 3 adds `"exitCode":3` and
/// `"error":"exit status 3"`; a signal gives `"exitCode":-1` and `"status":"signal: killed"`.
pub fn end_event(status: &ExitStatus) -> Value {
    if let Some(code) = status.code() {
        let text = format!("exit status {code}");
        let mut end = json!({ "exited": true, "status": text });
        if code != 0 {
            end["exitCode"] = json!(code);
            end["error"] = json!(text);
        }
        return end;
    }
    let sig = status.signal().unwrap_or(0);
    let mut text = format!("signal: {}", go_signal_name(sig));
    if status.core_dumped() {
        text.push_str(" (core dumped)");
    }
    json!({ "exitCode": -1, "status": text, "error": text })
}

fn end_unknown(why: &str) -> Value {
    json!({ "exitCode": -1, "status": "unknown", "error": why })
}

/// Go's name of a Linux signal (`syscall.Signal.String`), used in end-event statuses.
pub fn go_signal_name(sig: i32) -> String {
    const NAMES: [&str; 31] = [
        "hangup",
        "interrupt",
        "quit",
        "illegal instruction",
        "trace/breakpoint trap",
        "aborted",
        "bus error",
        "floating point exception",
        "killed",
        "user defined signal 1",
        "segmentation fault",
        "user defined signal 2",
        "broken pipe",
        "alarm clock",
        "terminated",
        "stack fault",
        "child exited",
        "continued",
        "stopped (signal)",
        "stopped",
        "stopped (tty input)",
        "stopped (tty output)",
        "urgent I/O condition",
        "CPU time limit exceeded",
        "file size limit exceeded",
        "virtual timer expired",
        "profiling timer expired",
        "window changed",
        "I/O possible",
        "power failure",
        "bad system call",
    ];
    usize::try_from(sig)
        .ok()
        .and_then(|s| s.checked_sub(1))
        .and_then(|i| NAMES.get(i))
        .map_or_else(|| format!("signal {sig}"), |n| n.to_string())
}

/// One process event as a stream message: `{"event":{...}}`.
pub fn event_message(event: Value) -> Value {
    json!({ "event": event })
}

/// The `start` event.
pub fn start_event(pid: u32) -> Value {
    event_message(json!({ "start": { "pid": pid } }))
}

/// A `data` event.
pub fn data_event(stderr: bool, bytes: &[u8]) -> Value {
    let key = if stderr { "stderr" } else { "stdout" };
    event_message(json!({ "data": { key: base64::encode(bytes) } }))
}

/// The `keepalive` event.
pub fn keepalive_event() -> Value {
    event_message(json!({ "keepalive": {} }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    #[test]
    fn end_events_match_envd() {
        assert_eq!(end_event(&ExitStatus::from_raw(0)), json!({"exited": true, "status": "exit status 0"}));
        assert_eq!(
            end_event(&ExitStatus::from_raw(3 << 8)),
            json!({"exitCode": 3, "exited": true, "status": "exit status 3", "error": "exit status 3"})
        );
        assert_eq!(end_event(&ExitStatus::from_raw(9)), json!({"exitCode": -1, "status": "signal: killed", "error": "signal: killed"}));
        assert_eq!(end_event(&ExitStatus::from_raw(15))["status"], "signal: terminated");
        assert_eq!(end_event(&ExitStatus::from_raw(11 | 0x80))["status"], "signal: segmentation fault (core dumped)");
    }

    #[test]
    fn signal_names() {
        assert_eq!(go_signal_name(9), "killed");
        assert_eq!(go_signal_name(2), "interrupt");
        assert_eq!(go_signal_name(31), "bad system call");
        assert_eq!(go_signal_name(40), "signal 40");
        assert_eq!(go_signal_name(0), "signal 0");
    }

    #[test]
    fn events() {
        assert_eq!(start_event(42), json!({"event": {"start": {"pid": 42}}}));
        assert_eq!(data_event(true, b"hi"), json!({"event": {"data": {"stderr": "aGk="}}}));
        assert_eq!(keepalive_event(), json!({"event": {"keepalive": {}}}));
    }

    #[test]
    fn refuses_bad_signals() {
        let sh = Path::new("/bin/sh");
        assert!(signal_pid(sh, 0, "KILL").is_err());
        assert!(signal_pid(sh, 1, "KILL").is_err());
        assert!(signal_pid(sh, std::process::id(), "KILL").is_err());
        assert!(signal_pid(sh, 12345, "kill; rm").is_err());
    }

    fn spawn(script: &str) -> Child {
        Command::new("/bin/sh").args(["-c", script]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap()
    }

    fn collect(sub: &Subscription) -> (Vec<u8>, Vec<u8>, Value) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        loop {
            let event = sub.rx.recv_timeout(Duration::from_secs(10)).unwrap();
            if let Event::Data { bytes, .. } = &event {
                sub.consumed(bytes.len());
            }
            match event {
                Event::Data { stderr: false, bytes } => out.extend(bytes),
                Event::Data { stderr: true, bytes } => err.extend(bytes),
                Event::End(end) => return (out, err, end),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn runs_streams_and_retains_the_end() {
        let child = spawn("printf out; printf err >&2; exit 3");
        let (proc, sub) = launch(child, None, json!({"cmd": "/bin/sh"}), None, None, "/bin/sh".into(), Box::new(|| None)).unwrap();
        let table = ProcessTable::default();
        table.insert(proc.clone());
        let (out, err, end) = collect(&sub);
        assert_eq!((out.as_slice(), err.as_slice()), (&b"out"[..], &b"err"[..]));
        assert_eq!(end["exitCode"], 3);
        assert!(table.running().is_empty());
        let again = table.find_any(&Selector::Pid(proc.pid)).unwrap();
        let Err(end) = again.subscribe() else { panic!("an ended process accepted a subscriber") };
        assert_eq!(end["exitCode"], 3);
        assert!(table.find_running(&Selector::Pid(proc.pid)).is_err());
    }

    #[test]
    fn stdin_signal_and_deadline() {
        let child = spawn("read line; echo got $line; sleep 30");
        let (proc, sub) = launch(child, None, json!({}), Some("t1".into()), None, "/bin/sh".into(), Box::new(|| None)).unwrap();
        let table = ProcessTable::default();
        table.insert(proc.clone());
        assert_eq!(table.find_running(&Selector::Tag("t1".into())).unwrap().pid, proc.pid);
        proc.write_stdin(b"hello\n").unwrap();
        match sub.rx.recv_timeout(Duration::from_secs(10)).unwrap() {
            Event::Data { bytes, .. } => assert_eq!(bytes, b"got hello\n"),
            other => panic!("{other:?}"),
        }
        proc.signal(Path::new("/bin/sh"), "KILL").unwrap();
        let (_, _, end) = collect(&sub);
        assert_eq!(end["status"], "signal: killed");
        assert!(proc.signal(Path::new("/bin/sh"), "KILL").is_err());

        let child = spawn("sleep 30");
        let deadline = Some(Instant::now() + Duration::from_millis(100));
        let (_proc, sub) = launch(child, None, json!({}), None, deadline, "/bin/sh".into(), Box::new(|| Some("gone".into()))).unwrap();
        assert_eq!(sub.rx.recv_timeout(Duration::from_secs(10)).unwrap(), Event::Gone("gone".into()));
    }

    #[test]
    fn slow_subscribers_are_cut_off_not_the_child() {
        let child = spawn("read go; head -c 20000000 /dev/zero; echo done >&2");
        let (proc, slow) = launch(child, None, json!({}), None, None, "/bin/sh".into(), Box::new(|| None)).unwrap();
        let fast = proc.subscribe().unwrap();
        proc.write_stdin(b"go\n").unwrap();
        let (out, err, end) = collect(&fast);
        assert_eq!(out.len(), 20_000_000);
        assert_eq!(err, b"done\n");
        assert_eq!(end["exited"], true);
        let mut saw_overflow = false;
        while let Ok(ev) = slow.rx.try_recv() {
            saw_overflow |= ev == Event::Overflow;
        }
        assert!(saw_overflow);
    }
}
