//! Running a host child process with a deadline: its own process group, capped concurrent
//! stdout/stderr capture, and a group kill on timeout or cancel.
//!
//! Group signals go through the shell's builtin `kill` (never an external `kill` binary, whose
//! procps version turns `kill -SIG -PGID` into "signal everything"), only to a group whose leader
//! is our own unreaped child, and never to group 0 or 1.

use crate::provider::ExecOutput;
use std::collections::HashSet;
use std::io::{self, Read};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// One child to run.
pub struct Spawn<'a> {
    /// Program and arguments.
    pub argv: &'a [String],
    /// The complete environment (nothing is inherited).
    pub env: &'a [(String, String)],
    /// Working directory.
    pub cwd: &'a Path,
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

    /// Kills every group still registered (server shutdown).
    pub fn kill_all(&self, shell: &Path) {
        let groups: Vec<u32> = match self.groups.lock() {
            Ok(g) => g.iter().copied().collect(),
            Err(_) => return,
        };
        for pgid in groups {
            signal_group(shell, pgid, "KILL");
        }
    }
}

/// Sends `signal` to process group `pgid` with the shell builtin `kill`.
///
/// Callers guarantee that `pgid` is the pid of their own child that has not been reaped yet, so
/// the id cannot have been reused. Groups 0 and 1 are refused here and in the shell.
pub fn signal_group(shell: &Path, pgid: u32, signal: &str) {
    if pgid <= 1 || !signal.bytes().all(|b| b.is_ascii_uppercase()) {
        return;
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
    if let Err(err) = res {
        log::warn!("could not run {} to signal process group {pgid}: {err}", shell.display());
    }
}

/// Runs `spawn` to completion or deadline. `Err` only when the child could not be started.
pub fn run(spawn: &Spawn<'_>, shell: &Path, running: &Running) -> io::Result<ExecOutput> {
    let started = Instant::now();
    let (program, args) = spawn.argv.split_first().ok_or_else(|| io::Error::other("empty argv"))?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .envs(spawn.env.iter().map(|(k, v)| (k, v)))
        .current_dir(spawn.cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = cmd.spawn()?;
    let pgid = child.id();
    running.insert(pgid);
    let out = wait_with_output(&mut child, spawn, shell, started);
    running.remove(pgid);
    out
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

fn wait_with_output(child: &mut Child, spawn: &Spawn<'_>, shell: &Path, started: Instant) -> io::Result<ExecOutput> {
    let pgid = child.id();
    let (done_tx, done_rx) = crossbeam_channel::bounded::<()>(2);
    let mut readers = Vec::new();
    if let Some(out) = child.stdout.take() {
        readers.push(spawn_reader(out, spawn.output_cap, done_tx.clone()));
    }
    if let Some(err) = child.stderr.take() {
        readers.push(spawn_reader(err, spawn.output_cap, done_tx.clone()));
    }
    drop(done_tx);
    let mut pipes_open = readers.len();
    let mut timed_out = false;
    let mut step = Duration::from_micros(50);
    // Invariant: the child is not reaped before the last group signal, so `pgid` stays ours.
    let status = loop {
        let cancelled = spawn.cancel.is_some_and(|c| c.load(Ordering::Relaxed));
        if Instant::now() >= spawn.deadline || cancelled {
            timed_out = true;
            signal_group(shell, pgid, "KILL");
            break child.wait()?;
        }
        if pipes_open > 0 {
            let wait = step.min(spawn.deadline.saturating_duration_since(Instant::now()));
            match done_rx.recv_timeout(wait) {
                Ok(()) => {
                    pipes_open -= 1;
                    continue;
                }
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => pipes_open = 0,
            }
        } else {
            thread::sleep(step.min(spawn.deadline.saturating_duration_since(Instant::now())));
        }
        if let Some(status) = child.try_wait()? {
            break status;
        }
        step = (step * 2).min(Duration::from_millis(10));
    };
    // A background process that kept the pipes open must not hold the call: give the readers a
    // moment, then return what they have (they keep draining until the holder exits).
    let grace = Instant::now() + Duration::from_millis(if timed_out { 500 } else { 50 });
    while pipes_open > 0 && done_rx.recv_timeout(grace.saturating_duration_since(Instant::now())).is_ok() {
        pipes_open -= 1;
    }
    let out = take(readers.first());
    let err = take(readers.get(1));
    Ok(ExecOutput {
        exit_code: status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0)),
        stdout: out.kept,
        stderr: err.kept,
        stdout_truncated: out.truncated,
        stderr_truncated: err.truncated,
        timed_out,
        duration: started.elapsed(),
    })
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
