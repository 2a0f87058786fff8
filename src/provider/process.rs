//! Running a child process with a deadline: its own process group, capped concurrent
//! stdout/stderr capture, and a group kill on timeout or cancel. The child is either the server's
//! own ([`run`]) or one that the init of an isolated sandbox started on request ([`run_remote`],
//! see `isolation::spawner`); both are waited for by one loop.
//!
//! Group signals go through the shell's builtin `kill` (never an external `kill` binary, whose
//! procps version turns `kill -SIG -PGID` into "signal everything"), only to a group whose leader
//! is our own unreaped child, and never to group 0 or 1.

use crate::provider::isolation::spawner::{self, Remote};
use crate::provider::ExecOutput;
use std::collections::{HashMap, HashSet};
use std::io::{self, Read};
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
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
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses: fields start after the last ')'.
    let rest = text.get(text.rfind(')')? + 2..)?;
    let fields: Vec<&str> = rest.split(' ').collect();
    Some(ProcStat {
        state: fields.first()?.chars().next()?,
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
pub struct Spawn<'a> {
    /// Bytes kept per stream.
    pub output_cap: usize,
    /// When the group is killed.
    pub deadline: Instant,
    /// Kill early when this becomes true.
    pub cancel: Option<&'a AtomicBool>,
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
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?;
    Ok(status.success() && list.len() == pids.len())
}

/// Runs `cmd` (program, arguments, environment and working directory already set) to completion
/// or deadline, with stdin `/dev/null`, stdout and stderr captured, in a process group of its own.
/// `Err` only when the child could not be started.
pub fn run(mut cmd: Command, spawn: &Spawn<'_>, shell: &Path, running: &Running) -> io::Result<ExecOutput> {
    let started = Instant::now();
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
    let mut child = cmd.spawn()?;
    let pgid = child.id();
    running.insert(pgid);
    let pipes = [child.stdout.take().map(|p| Box::new(p) as Pipe), child.stderr.take().map(|p| Box::new(p) as Pipe)];
    // Invariant: `pgid` leaves `running` when the child is reaped, so shutdown never signals a
    // group id that may already belong to someone else.
    let out = wait_with_output(&mut HostChild { child, shell, pgid }, pipes, spawn, started);
    running.remove(pgid);
    out
}

/// Runs `argv` with exactly `env` from `cwd` inside an isolated sandbox, started by the sandbox's
/// spawner listening on `socket`; otherwise as [`run`]. `Err` only when it could not be started.
pub fn run_remote(
    socket: &Path,
    argv: &[String],
    env: Vec<(String, String)>,
    cwd: Option<&str>,
    spawn: &Spawn<'_>,
    running: &Running,
) -> io::Result<ExecOutput> {
    let started = Instant::now();
    let pipe = || rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map(|(read, write)| (std::fs::File::from(read), write));
    let (out_read, out_write) = pipe()?;
    let (err_read, err_write) = pipe()?;
    let remote = Remote::spawn(socket, argv, env, cwd, &out_write, &err_write)?;
    // Only the command holds the write ends now: the pipes end with it (and its group).
    drop((out_write, err_write));
    let key = running.insert_remote(remote.killer()?);
    let pipes = [Some(Box::new(out_read) as Pipe), Some(Box::new(err_read) as Pipe)];
    let out = wait_with_output(&mut RemoteChild { remote, members_left: false }, pipes, spawn, started);
    running.remove_remote(key);
    out
}

/// A pipe a reader thread drains.
type Pipe = Box<dyn Read + Send>;

/// What the wait loop needs of a child, wherever it was started.
trait Waited {
    /// Its exit status (128 + N for signal N) once it has ended; never blocks.
    fn try_wait(&mut self) -> io::Result<Option<i32>>;
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

fn status_code(status: std::process::ExitStatus) -> i32 {
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

fn spawn_reader(mut pipe: impl Read + Send + 'static, cap: usize, done: crossbeam_channel::Sender<()>) -> SharedCapture {
    let shared = SharedCapture::default();
    let mine = shared.clone();
    let body = move || {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match pipe.read(&mut buf) {
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
    };
    if let Err(err) = thread::Builder::new().name("sandbox-mcp-pipe".into()).stack_size(128 * 1024).spawn(body) {
        log::error!("could not start a pipe reader thread: {err}");
    }
    shared
}

fn take(capture: Option<&SharedCapture>) -> Capture {
    let Some(capture) = capture else {
        return Capture::default();
    };
    match capture.lock() {
        Ok(mut c) => {
            c.taken = true;
            Capture { kept: std::mem::take(&mut c.kept), truncated: c.truncated, taken: true }
        }
        Err(_) => Capture::default(),
    }
}

fn wait_with_output(child: &mut dyn Waited, pipes: [Option<Pipe>; 2], spawn: &Spawn<'_>, started: Instant) -> io::Result<ExecOutput> {
    let (done_tx, done_rx) = crossbeam_channel::bounded::<()>(2);
    let readers: Vec<SharedCapture> =
        pipes.into_iter().flatten().map(|pipe| spawn_reader(pipe, spawn.output_cap, done_tx.clone())).collect();
    drop(done_tx);
    let mut pipes_open = readers.len();
    let mut timed_out = false;
    let mut step = Duration::from_micros(50);
    let exit_code = loop {
        let cancelled = spawn.cancel.is_some_and(|c| c.load(Ordering::Relaxed));
        if Instant::now() >= spawn.deadline || cancelled {
            timed_out = true;
            break child.kill_and_wait()?;
        }
        if pipes_open > 0 {
            let wait = step.min(spawn.deadline.saturating_duration_since(Instant::now()));
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
        } else {
            thread::sleep(step.min(spawn.deadline.saturating_duration_since(Instant::now())));
        }
        if let Some(code) = child.try_wait()? {
            break code;
        }
        step = (step * 2).min(Duration::from_millis(10));
    };
    // The pipes normally close with the child. If they are still open, either the readers are
    // merely late (a busy machine) or a background process kept them: wait for the readers while
    // the child's group is empty (bounded), but do not let a background member hold the call.
    let first = Duration::from_millis(if timed_out { 500 } else { 50 });
    drain_readers_while(&done_rx, pipes_open, || !child.members_left(), first, Duration::from_millis(50));
    let out = take(readers.first());
    let err = take(readers.get(1));
    Ok(ExecOutput {
        exit_code,
        stdout: out.kept,
        stderr: err.kept,
        stdout_truncated: out.truncated,
        stderr_truncated: err.truncated,
        timed_out,
        duration: started.elapsed(),
    })
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

    fn run_sh(script: &str, deadline: Duration) -> ExecOutput {
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", script]).env_clear().env("PATH", "/usr/bin:/bin").current_dir("/");
        let spawn = Spawn { output_cap: 1 << 20, deadline: Instant::now() + deadline, cancel: None };
        run(cmd, &spawn, Path::new("/bin/sh"), &Running::default()).unwrap()
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
