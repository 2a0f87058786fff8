//! Running a child process with a deadline: its own process group, capped concurrent
//! stdout/stderr capture, and a group kill on timeout or cancel. The child is either the server's
//! own ([`run`]) or one that the init of an isolated sandbox started on request ([`run_remote`],
//! see `isolation::spawner`); both are waited for by one loop.
//!
//! Group signals go through the shell's builtin `kill` (never an external `kill` binary, whose
//! procps version turns `kill -SIG -PGID` into "signal everything"), only to a group whose leader
//! is our own unreaped child, and never to group 0 or 1.

use crate::provider::local::isolation::spawner::{self, Remote};
use crate::provider::ExecOutput;
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// How long, after the child exits with its group empty, the readers may take to reach the end of
/// the pipes (longer only when a process outside the group holds them).
const LATE_READER_WAIT: Duration = Duration::from_secs(5);

/// Fields of `/proc/<pid>/stat` this crate uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// State letter (`R`, `S`, `Z`, ...).
    pub state: char,
    /// Parent process.
    pub ppid: u32,
    /// Process group.
    pub pgrp: u32,
    /// Start time in clock ticks since boot.
    pub start: u64,
    /// A kernel thread (`PF_KTHREAD`): it has no memory, environment or command line of its own.
    pub kernel_thread: bool,
}

/// `PF_KTHREAD` in the flags field of `/proc/<pid>/stat`.
const PF_KTHREAD: u64 = 0x0020_0000;

/// Reads `/proc/<pid>/stat`; `None` when the process is gone.
pub fn proc_stat(pid: u32) -> Option<ProcStat> {
    stat_at(Path::new(&format!("/proc/{pid}/stat")))
}

/// Reads a stat file of that format (a process's, or one thread's under `/proc/<pid>/task/`);
/// `None` when it is gone.
pub fn stat_at(file: &Path) -> Option<ProcStat> {
    let bytes = std::fs::read(file).ok()?;
    parse_stat(&bytes)
}

/// The fields of one stat file's text. The command name is the process's to choose: it may hold
/// spaces, parentheses and bytes that are not UTF-8, so fields start after the last `)` and only
/// what follows it (numbers and a state letter) is read as text.
fn parse_stat(bytes: &[u8]) -> Option<ProcStat> {
    let after_name = bytes.iter().rposition(|b| *b == b')')? + 2;
    let rest = std::str::from_utf8(bytes.get(after_name..)?).ok()?;
    let fields: Vec<&str> = rest.split(' ').collect();
    Some(ProcStat {
        state: fields.first()?.chars().next()?,
        ppid: fields.get(1)?.parse().ok()?,
        pgrp: fields.get(2)?.parse().ok()?,
        start: fields.get(19)?.parse().ok()?,
        kernel_thread: fields.get(6)?.parse::<u64>().ok()? & PF_KTHREAD != 0,
    })
}

/// Whether a live (non-zombie) process is in group `pgid`.
pub fn group_has_live_members(pgid: u32) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else { return false };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()))
        .filter_map(proc_stat)
        .any(|st| st.pgrp == pgid && st.state != 'Z')
}

/// How one child runs: what is kept of its output, and when it is stopped.
#[derive(Clone, Copy)]
pub struct Spawn<'a> {
    /// Bytes kept per stream.
    pub output_cap: usize,
    /// When the group is killed.
    pub deadline: Instant,
    /// Kill early when this becomes true.
    pub cancel: Option<&'a AtomicBool>,
    /// When a command still running is handed over instead of waited for (`None`: never).
    pub promote_at: Option<Instant>,
}

/// Process groups of children that are running now, so that shutdown can stop them.
#[derive(Default)]
pub struct Running {
    groups: Mutex<HashSet<u32>>,
    /// Commands started by a sandbox's spawner, by a number of this process's choosing: the
    /// connection on which their group's kill is asked for.
    remote: Mutex<HashMap<u64, UnixStream>>,
    next_remote: std::sync::atomic::AtomicU64,
}

impl Running {
    fn insert(&self, pgid: u32) {
        if let Ok(mut g) = self.groups.lock() {
            g.insert(pgid);
        }
    }

    fn remove(&self, pgid: u32) {
        if let Ok(mut g) = self.groups.lock() {
            g.remove(&pgid);
        }
    }

    fn insert_remote(&self, killer: UnixStream) -> u64 {
        let key = self.next_remote.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut r) = self.remote.lock() {
            r.insert(key, killer);
        }
        key
    }

    fn remove_remote(&self, key: u64) {
        if let Ok(mut r) = self.remote.lock() {
            r.remove(&key);
        }
    }

    /// Kills every group still registered (server shutdown).
    pub fn kill_all(&self, shell: &Path) {
        let groups: Vec<u32> = match self.groups.lock() {
            Ok(g) => g.iter().copied().collect(),
            Err(_) => return,
        };
        for pgid in groups {
            signal_group(shell, pgid, "KILL");
        }
        if let Ok(r) = self.remote.lock() {
            for conn in r.values() {
                spawner::send_kill(conn);
            }
        }
    }
}

/// Sends `signal` to process group `pgid` with the shell builtin `kill`.
///
/// Callers guarantee that `pgid` is the pid of their own child that has not been reaped yet, so
/// the id cannot have been reused. Groups 0 and 1 are refused here and in the shell.
pub fn signal_group(shell: &Path, pgid: u32, signal: &str) -> bool {
    if pgid <= 1 || !signal.bytes().all(|b| b.is_ascii_uppercase()) {
        return false;
    }
    // `--` is POSIX and needed by dash; busybox rejects it, hence the probe.
    let script = r#"case $2 in ''|*[!0-9]*|0|1) exit 2;; esac
if kill -s 0 -- "$$" 2>/dev/null; then kill -s "$1" -- "-$2"; else kill -s "$1" "-$2"; fi"#;
    let res = Command::new(shell)
        .args(["-c", script, "sh", signal, &pgid.to_string()])
        .env_clear()
        .env("LC_ALL", "C")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    match res {
        Ok(status) => status.success(),
        Err(err) => {
            log::warn!("could not run {} to signal process group {pgid}: {err}", shell.display());
            false
        }
    }
}

/// Sends `signal` to each of `pids` with the shell builtin `kill`, one shell for all. Pids 0 and
/// 1 and this process are skipped (here and in the shell). `Ok(false)` when a kill failed (the
/// process was already gone) or a pid was refused.
pub fn signal_pids(shell: &Path, signal: &str, pids: &[u32]) -> io::Result<bool> {
    if signal.is_empty() || !signal.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("signal name {signal:?} is not valid")));
    }
    let me = std::process::id();
    let list: Vec<String> = pids.iter().filter(|p| **p > 1 && **p != me).map(u32::to_string).collect();
    if list.is_empty() {
        return Ok(false);
    }
    let script = r#"s=$1; shift; rc=0
for p in "$@"; do case $p in ''|*[!0-9]*|0|1) rc=2 ;; *) kill -s "$s" "$p" 2>/dev/null || rc=1 ;; esac; done
exit $rc"#;
    let status = Command::new(shell)
        .args(["-c", script, "sh", signal])
        .args(&list)
        .env_clear()
        .env("LC_ALL", "C")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?;
    Ok(status.success() && list.len() == pids.len())
}

/// Runs `cmd` (program, arguments, environment and working directory already set) to completion
/// or deadline, with stdin `/dev/null`, stdout and stderr captured. The caller has put it in a
/// process group of its own whose id is its pid (`process_group(0)`, or a `setsid` program first).
/// With [`Spawn::promote_at`] and `promotable` (the child's pid is also its pid as the sandbox
/// sees it), a child still running at that moment is handed over instead ([`Ran::Promoted`]).
/// `Err` only when the child could not be started.
pub fn run<'a>(mut cmd: Command, spawn: &Spawn<'_>, shell: &'a Path, running: &'a Running, promotable: bool) -> io::Result<Ran<'a>> {
    let started = Instant::now();
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn()?;
    let pgid = child.id();
    running.insert(pgid);
    let pipes = [child.stdout.take().map(|p| File::from(OwnedFd::from(p))), child.stderr.take().map(|p| File::from(OwnedFd::from(p)))];
    // Invariant: `pgid` leaves `running` when the child is reaped (or handed over), so shutdown
    // never signals a group id that may already belong to someone else.
    let inside = promotable.then_some(pgid);
    wait_with_output(Kid::Host(HostChild { child, shell, pgid }), pipes, Default::default(), spawn, started, running, inside)
}

/// Runs `job` inside an isolated sandbox, started by the sandbox's spawner at `to`; otherwise as
/// [`run`] (a command is handed over only when the spawner told its pid). `Err` only when it
/// could not be started.
pub fn run_remote<'a>(to: &spawner::Endpoint, job: spawner::Job<'_>, spawn: &Spawn<'_>, running: &'a Running) -> io::Result<Ran<'a>> {
    let started = Instant::now();
    let pipe = || rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map(|(read, write)| (File::from(read), write));
    let (out_read, out_write) = pipe()?;
    let (err_read, err_write) = pipe()?;
    let (remote, theirs) = Remote::start(to, job, &out_write, &err_write, None)?;
    // Only the command holds the write ends now: the pipes end with it (and its group).
    drop((out_write, err_write));
    let key = running.insert_remote(remote.killer()?);
    let inside = remote.pid();
    // A shell that waited for the command writes to pipes of its own.
    let pipes = match theirs {
        Some([out, err]) => [Some(out), Some(err)],
        None => [Some(out_read), Some(err_read)],
    };
    wait_with_output(
        Kid::Remote(RemoteChild { remote, members_left: false }, key),
        pipes,
        Default::default(),
        spawn,
        started,
        running,
        inside,
    )
}

/// How a run ended.
pub enum Ran<'a> {
    /// The command ended (or was killed at its deadline).
    Done(ExecOutput),
    /// The command still ran at [`Spawn::promote_at`]: it is handed over, still running.
    Promoted(Handover<'a>),
}

/// A command still running at its promotion time: its child (still ours, unreaped), the read ends
/// of its pipes (taken from the stopped readers) and what they had captured.
pub struct Handover<'a> {
    child: Kid<'a>,
    pipes: [Option<File>; 2],
    captured: [Capture; 2],
    started: Instant,
    running: &'a Running,
    pgid: u32,
}

impl<'a> Handover<'a> {
    /// The command's process group (its leader's pid) as the sandbox sees it.
    pub fn pgid(&self) -> u32 {
        self.pgid
    }

    /// The read ends of stdout and stderr (`None` for a stream that had already ended).
    pub fn pipes(&self) -> [Option<&File>; 2] {
        [self.pipes[0].as_ref(), self.pipes[1].as_ref()]
    }

    /// The output captured so far: stdout, whether it went over the cap, stderr, likewise.
    pub fn captured(&self) -> (&[u8], bool, &[u8], bool) {
        (&self.captured[0].kept, self.captured[0].truncated, &self.captured[1].kept, self.captured[1].truncated)
    }

    /// Time since the command started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Takes the command back (its adoption failed): waits for it as if it had never been handed
    /// over, with what was captured so far kept.
    pub fn resume(self, spawn: &Spawn<'_>) -> io::Result<ExecOutput> {
        let spawn = Spawn { promote_at: None, ..*spawn };
        match wait_with_output(self.child, self.pipes, self.captured, &spawn, self.started, self.running, None)? {
            Ran::Done(out) => Ok(out),
            Ran::Promoted(_) => Err(io::Error::other("internal error: a resumed command was handed over again")),
        }
    }

    /// Lets the command go on without this call (it was adopted): closes this process's read ends,
    /// leaves shutdown's kill list, and reaps it on a thread of its own, at most `budget` (its
    /// remaining timeout and grace), then calls `on_end` with its exit status (`None` when it could
    /// not be observed).
    pub fn release(self, budget: Duration, on_end: OnEnd) {
        let Handover { child, pipes, running, .. } = self;
        drop(pipes);
        let body: Box<dyn FnOnce() + Send> = match child {
            Kid::Host(HostChild { mut child, pgid, .. }) => {
                running.remove(pgid);
                // The command's timeout is enforced by its adopter, so the wait ends.
                Box::new(move || on_end(child.wait().ok().map(status_code)))
            }
            Kid::Remote(RemoteChild { mut remote, .. }, key) => {
                running.remove_remote(key);
                Box::new(move || on_end(remote.wait_within(budget).ok().map(|e| e.code)))
            }
        };
        if let Err(err) = thread::Builder::new().name("sandbox-mcp-reap".into()).stack_size(128 * 1024).spawn(body) {
            log::warn!("could not start a thread to reap a command handed over to its task: {err}");
        }
    }
}

/// What to do with a handed-over command's exit status once it is reaped (`None`: not observed).
pub type OnEnd = Box<dyn FnOnce(Option<i32>) + Send>;

/// A child, wherever it was started.
enum Kid<'a> {
    Host(HostChild<'a>),
    /// With its key in [`Running`].
    Remote(RemoteChild, u64),
}

impl Kid<'_> {
    fn waited(&mut self) -> &mut dyn Waited {
        match self {
            Kid::Host(c) => c,
            Kid::Remote(c, _) => c,
        }
    }

    /// Leaves shutdown's kill list (the child was reaped).
    fn forget(&self, running: &Running) {
        match self {
            Kid::Host(c) => running.remove(c.pgid),
            Kid::Remote(_, key) => running.remove_remote(*key),
        }
    }
}

/// What the wait loop needs of a child, wherever it was started.
trait Waited {
    /// Its exit status (128 + N for signal N) once it has ended; never blocks.
    fn try_wait(&mut self) -> io::Result<Option<i32>>;
    /// Its exit status once it has ended, waiting at most `budget` for the end (the whole
    /// budget where the end cannot be waited for, but only looked at).
    fn wait_for(&mut self, budget: Duration) -> io::Result<Option<i32>> {
        thread::sleep(budget);
        self.try_wait()
    }
    /// Kills its whole process group and waits for it.
    fn kill_and_wait(&mut self) -> io::Result<i32>;
    /// Whether members of its group remain (they may hold the pipes), once it has ended.
    fn members_left(&self) -> bool;
}

/// A child of this process.
struct HostChild<'a> {
    child: Child,
    shell: &'a Path,
    pgid: u32,
}

/// The exit code of `status`: its code, or 128 + N for signal N.
pub(crate) fn status_code(status: std::process::ExitStatus) -> i32 {
    status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

impl Waited for HostChild<'_> {
    fn try_wait(&mut self) -> io::Result<Option<i32>> {
        Ok(self.child.try_wait()?.map(status_code))
    }

    fn kill_and_wait(&mut self) -> io::Result<i32> {
        // Invariant: the child is not reaped before the last group signal, so `pgid` stays ours.
        if !signal_group(self.shell, self.pgid, "KILL") {
            // The group could not be signalled (no fork possible?): at least end our child.
            let _ = self.child.kill();
        }
        Ok(status_code(self.child.wait()?))
    }

    fn members_left(&self) -> bool {
        group_has_live_members(self.pgid)
    }
}

/// A command a sandbox's spawner started.
struct RemoteChild {
    remote: Remote,
    members_left: bool,
}

impl Waited for RemoteChild {
    fn try_wait(&mut self) -> io::Result<Option<i32>> {
        Ok(self.remote.try_wait()?.map(|end| {
            self.members_left = end.members_left;
            end.code
        }))
    }

    fn wait_for(&mut self, budget: Duration) -> io::Result<Option<i32>> {
        // The end line wakes this at once: no polling step between the end and the answer.
        match self.remote.wait_within(budget) {
            Ok(end) => {
                self.members_left = end.members_left;
                Ok(Some(end.code))
            }
            Err(err) if err.kind() == io::ErrorKind::TimedOut => Ok(None),
            Err(err) => Err(err),
        }
    }

    fn kill_and_wait(&mut self) -> io::Result<i32> {
        self.remote.kill();
        let end = self.remote.wait()?;
        self.members_left = end.members_left;
        Ok(end.code)
    }

    fn members_left(&self) -> bool {
        self.members_left
    }
}

/// Output captured from one pipe so far. Shared with its reader thread so that the caller can
/// take what arrived even while a background process still holds the pipe open.
#[derive(Default)]
struct Capture {
    kept: Vec<u8>,
    truncated: bool,
    /// Set when the caller took the output; the reader then only drains.
    taken: bool,
}

type SharedCapture = Arc<Mutex<Capture>>;

/// How long a stoppable reader waits in `poll` before it looks at its stop flag again.
const READER_POLL: rustix::event::Timespec = rustix::event::Timespec { tv_sec: 0, tv_nsec: 20_000_000 };

/// One pipe's reader thread. A stoppable one polls its pipe and looks at its stop flag between
/// reads; stopped, it hands its pipe back (the bytes not read yet stay in the pipe).
struct Reader {
    capture: SharedCapture,
    stop: Option<Arc<AtomicBool>>,
    thread: Option<thread::JoinHandle<Option<File>>>,
}

impl Reader {
    /// Stops a stoppable reader: what it captured, and its pipe (`None` when the pipe had ended).
    fn stop(self) -> (Capture, Option<File>) {
        if let Some(stop) = &self.stop {
            stop.store(true, Ordering::Relaxed);
        }
        let pipe = self.thread.and_then(|t| t.join().ok()).flatten();
        let captured = match self.capture.lock() {
            Ok(mut c) => Capture { kept: std::mem::take(&mut c.kept), truncated: c.truncated, taken: false },
            Err(_) => Capture::default(),
        };
        (captured, pipe)
    }
}

fn spawn_reader(pipe: File, cap: usize, done: crossbeam_channel::Sender<()>, stoppable: bool, initial: Capture) -> Reader {
    let capture = Arc::new(Mutex::new(initial));
    let stop = stoppable.then(|| Arc::new(AtomicBool::new(false)));
    let (mine, flag) = (capture.clone(), stop.clone());
    let body = move || -> Option<File> {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            if let Some(flag) = &flag {
                if flag.load(Ordering::Relaxed) {
                    return Some(pipe);
                }
                let mut fds = [rustix::event::PollFd::new(&pipe, rustix::event::PollFlags::IN)];
                match rustix::event::poll(&mut fds, Some(&READER_POLL)) {
                    Ok(0) | Err(rustix::io::Errno::INTR) => continue,
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
            match (&pipe).read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    let Ok(mut c) = mine.lock() else { break };
                    if c.taken {
                        continue;
                    }
                    let room = cap.saturating_sub(c.kept.len());
                    c.kept.extend_from_slice(&buf[..n.min(room)]);
                    c.truncated |= n > room;
                }
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        let _ = done.send(());
        None
    };
    let thread = match thread::Builder::new().name("sandbox-mcp-pipe".into()).stack_size(128 * 1024).spawn(body) {
        Ok(t) => Some(t),
        Err(err) => {
            log::error!("could not start a pipe reader thread: {err}");
            None
        }
    };
    Reader { capture, stop, thread }
}

fn take(reader: Option<&Reader>) -> Capture {
    let Some(reader) = reader else {
        return Capture::default();
    };
    match reader.capture.lock() {
        Ok(mut c) => {
            c.taken = true;
            Capture { kept: std::mem::take(&mut c.kept), truncated: c.truncated, taken: true }
        }
        Err(_) => Capture::default(),
    }
}

/// Waits for `child` with readers on `pipes` (starting from `initial`), as [`run`] describes.
/// `inside`: the child's pid as the sandbox sees it, when it may be handed over.
fn wait_with_output<'a>(
    mut child: Kid<'a>,
    pipes: [Option<File>; 2],
    initial: [Capture; 2],
    spawn: &Spawn<'_>,
    started: Instant,
    running: &'a Running,
    inside: Option<u32>,
) -> io::Result<Ran<'a>> {
    let promote_at = spawn.promote_at.filter(|_| inside.is_some());
    let (done_tx, done_rx) = crossbeam_channel::bounded::<()>(2);
    let mut ended = [Capture::default(), Capture::default()];
    let mut readers: [Option<Reader>; 2] = [None, None];
    for (i, (pipe, initial)) in pipes.into_iter().zip(initial).enumerate() {
        match pipe {
            Some(pipe) => readers[i] = Some(spawn_reader(pipe, spawn.output_cap, done_tx.clone(), promote_at.is_some(), initial)),
            // A stream that had already ended keeps what it captured.
            None => ended[i] = initial,
        }
    }
    drop(done_tx);
    let mut pipes_open = readers.iter().flatten().count();
    let mut timed_out = false;
    let mut step = Duration::from_micros(50);
    let exit_code = loop {
        let cancelled = spawn.cancel.is_some_and(|c| c.load(Ordering::Relaxed));
        if Instant::now() >= spawn.deadline || cancelled {
            timed_out = true;
            match child.waited().kill_and_wait() {
                Ok(code) => break code,
                Err(err) => return Err(forget(&child, running, err)),
            }
        }
        if let (Some(at), Some(pgid)) = (promote_at, inside) {
            if Instant::now() >= at {
                match child.waited().try_wait() {
                    Ok(Some(code)) => break code,
                    Ok(None) => {}
                    Err(err) => return Err(forget(&child, running, err)),
                }
                let [out, err] = readers;
                let [out_ended, err_ended] = ended;
                let (out, out_pipe) = out.map_or((out_ended, None), Reader::stop);
                let (err, err_pipe) = err.map_or((err_ended, None), Reader::stop);
                return Ok(Ran::Promoted(Handover { child, pipes: [out_pipe, err_pipe], captured: [out, err], started, running, pgid }));
            }
        }
        let until = promote_at.map_or(spawn.deadline, |at| at.min(spawn.deadline));
        if pipes_open > 0 {
            let wait = step.min(until.saturating_duration_since(Instant::now()));
            match done_rx.recv_timeout(wait) {
                Ok(()) => {
                    pipes_open -= 1;
                    // Closed pipes usually mean the child is exiting: look again soon, not after
                    // the longest step reached while it ran.
                    step = Duration::from_micros(50);
                    continue;
                }
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => pipes_open = 0,
            }
            match child.waited().try_wait() {
                Ok(Some(code)) => break code,
                Ok(None) => {}
                Err(err) => return Err(forget(&child, running, err)),
            }
        } else {
            match child.waited().wait_for(step.min(until.saturating_duration_since(Instant::now()))) {
                Ok(Some(code)) => break code,
                Ok(None) => {}
                Err(err) => return Err(forget(&child, running, err)),
            }
        }
        step = (step * 2).min(Duration::from_millis(10));
    };
    child.forget(running);
    // The pipes normally close with the child. If they are still open, either the readers are
    // merely late (a busy machine) or a background process kept them: wait for the readers while
    // the child's group is empty (bounded), but do not let a background member hold the call.
    let first = Duration::from_millis(if timed_out { 500 } else { 50 });
    let child = child.waited();
    drain_readers_while(&done_rx, pipes_open, || !child.members_left(), first, Duration::from_millis(50));
    let [out_ended, err_ended] = ended;
    let out = readers[0].as_ref().map_or(out_ended, |r| take(Some(r)));
    let err = readers[1].as_ref().map_or(err_ended, |r| take(Some(r)));
    Ok(Ran::Done(ExecOutput {
        exit_code,
        stdout: out.kept,
        stderr: err.kept,
        stdout_truncated: out.truncated,
        stderr_truncated: err.truncated,
        timed_out,
        duration: started.elapsed(),
    }))
}

/// A wait that failed: the child leaves shutdown's kill list (its group id is no longer surely
/// its own), and the error is passed on.
fn forget(child: &Kid<'_>, running: &Running, err: io::Error) -> io::Error {
    child.forget(running);
    err
}

/// After a child that led group `pgid` exited: waits for `open` pipe readers to report the end of
/// their pipes on `done`. The pipes normally close with the child; if they are still open, either
/// the readers are merely late (a busy machine) or a background process kept them. Waits first
/// `first`, then in `window` steps while the group is empty (up to [`LATE_READER_WAIT`]), and
/// stops early when a live group member may hold the pipes. Returns how many are still open.
pub fn drain_readers(done: &crossbeam_channel::Receiver<()>, open: usize, pgid: u32, first: Duration, window: Duration) -> usize {
    drain_readers_while(done, open, || !group_has_live_members(pgid), first, window)
}

/// [`drain_readers`], with `group_empty` telling whether the child's group is empty.
fn drain_readers_while(
    done: &crossbeam_channel::Receiver<()>,
    mut open: usize,
    group_empty: impl Fn() -> bool,
    first: Duration,
    window: Duration,
) -> usize {
    let exited = Instant::now();
    let mut until = exited + first;
    while open > 0 {
        match done.recv_timeout(until.saturating_duration_since(Instant::now())) {
            Ok(()) => open -= 1,
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break,
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                if !group_empty() || exited.elapsed() >= LATE_READER_WAIT {
                    break;
                }
                until = Instant::now() + window;
            }
        }
    }
    open
}

/// Reads `pipe` to its end, at most until `deadline` (then `TimedOut`).
pub fn read_until_end(pipe: File, deadline: Instant) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "no end within the time allowed"));
        }
        let wait = rustix::event::Timespec { tv_sec: left.as_secs() as i64, tv_nsec: i64::from(left.subsec_nanos()) };
        let mut fds = [rustix::event::PollFd::new(&pipe, rustix::event::PollFlags::IN)];
        match rustix::event::poll(&mut fds, Some(&wait)) {
            Ok(0) | Err(rustix::io::Errno::INTR) => continue,
            Ok(_) => {}
            Err(err) => return Err(err.into()),
        }
        match (&pipe).read(&mut buf) {
            Ok(0) => return Ok(out),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
}

/// Whether `path` names an executable file.
pub fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false)
}

/// Finds `name` on `path_var` (a `PATH` value).
pub fn which(name: &str, path_var: &str) -> Option<PathBuf> {
    path_var.split(':').filter(|d| !d.is_empty()).map(|d| Path::new(d).join(name)).find(|p| is_executable(p))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    /// Regression: a process that named itself with bytes that are not UTF-8 (`/proc/self/comm`
    /// is its own to write) was unreadable, so scans for kill_sandbox passed over it and its
    /// children.
    #[test]
    fn a_stat_line_is_read_whatever_the_command_name_holds() {
        let line = b"4242 (a) b\xff\xfe)) R 7 4242 4242 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 987654 0 0\n";
        let st = parse_stat(line).expect("a stat line with a non-UTF-8 name is read");
        assert_eq!((st.state, st.ppid, st.pgrp, st.start, st.kernel_thread), ('R', 7, 4242, 987654, false));
        assert_eq!(parse_stat(b"4242 (no closing parenthesis R 1"), None);
        assert_eq!(parse_stat(b"4242 (x) \xff 1 2"), None, "fields after the name must be text");
    }

    fn run_sh(script: &str, deadline: Duration) -> ExecOutput {
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", script]).env_clear().env("PATH", "/usr/bin:/bin").current_dir("/");
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let spawn = Spawn { output_cap: 1 << 20, deadline: Instant::now() + deadline, cancel: None, promote_at: None };
        match run(cmd, &spawn, Path::new("/bin/sh"), &Running::default(), false).unwrap() {
            Ran::Done(out) => out,
            Ran::Promoted(_) => panic!("handed over without a promotion time"),
        }
    }

    /// Regression: on a saturated machine the pipe readers can lag the child's exit by more than
    /// the grace period meant for background holders of the pipes; output must not be lost then.
    #[test]
    fn output_is_complete_when_the_machine_is_busy() {
        let stop = Arc::new(AtomicBool::new(false));
        let burners: Vec<_> = (0..48)
            .map(|_| {
                let stop = stop.clone();
                thread::spawn(move || {
                    let mut x = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                    }
                    x
                })
            })
            .collect();
        let runners: Vec<_> = (0..16)
            .map(|i| {
                thread::spawn(move || {
                    (0..15)
                        .filter(|_| run_sh(&format!("echo out-{i}; echo err-{i} >&2"), Duration::from_secs(30)).stdout.is_empty())
                        .count()
                })
            })
            .collect();
        let lost: usize = runners.into_iter().map(|r| r.join().unwrap()).sum();
        stop.store(true, Ordering::Relaxed);
        for b in burners {
            b.join().unwrap();
        }
        assert_eq!(lost, 0, "{lost} of 240 runs lost their output");
    }

    #[test]
    fn a_background_holder_of_the_pipes_does_not_hold_the_call() {
        let t0 = Instant::now();
        let out = run_sh("sleep 3 & echo done", Duration::from_secs(30));
        assert_eq!(out.stdout, b"done\n");
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    }
}
