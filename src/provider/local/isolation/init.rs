//! The init of an isolated sandbox: how the keeper starts it, and what it does as pid 1.
//!
//! An unprivileged keeper runs `unshare` (namespaces, `--fork`) with this binary's `sandbox-init`
//! subcommand; the forked child is pid 1 of the new pid namespace. Its stdin is this binary,
//! opened by the keeper (`O_PATH`) and executed as `/proc/self/fd/0`, so the init starts even
//! when the binary lies in a directory the sandbox's uid cannot traverse (a clone under `/root`).
//! When the server runs as root, the sandbox's uid cannot reach the home inside the private state
//! root: the keeper forks a privileged first step, the stage ([`super::stage`]), which hands the
//! home over and makes the namespaces itself, then forks the init without executing anything.
//! Either way the init's stdout is one end of a socket pair with the keeper, which carries the
//! spawner's listening socket in (`SCM_RIGHTS`) and the answer line out, and its stderr a pipe,
//! read only when the start fails (what the stage, `unshare` or the init said). The init starts a
//! session of its own (no controlling terminal: see the keeper), assembles the root filesystem,
//! brings up the loopback interface of a private network namespace, answers one line — `ready
//! <host pid> <start time>` or `error <what failed>` — and from then on serves the sandbox's
//! spawner (commands started on request, see [`spawner`](super::spawner)) and reaps orphans,
//! forever: the sandbox ends when something sends this init SIGKILL (no other signal reaches a
//! pid-namespace init from outside), and the kernel then ends every process inside.

use super::rootfs::{self, Plan};
use super::{fd_passing, seccomp, spawner, stage, IsolationError, Tools};
use crate::provider::process;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Each namespace of an isolated sandbox, as `unshare(2)` makes it (the stage) and as util-linux
/// `unshare` names it: the one list both ways of starting an init read. The network namespace
/// can be left out (`Site::host_network`; no sandbox of this version does), and the cgroup one is
/// made where the kernel has it.
const NAMESPACES: [(rustix::thread::UnshareFlags, &str); 7] = {
    use rustix::thread::UnshareFlags as Ns;
    [
        (Ns::NEWUSER, "--user"),
        (Ns::NEWNS, "--mount"),
        (Ns::NEWPID, "--pid"),
        (Ns::NEWIPC, "--ipc"),
        (Ns::NEWUTS, "--uts"),
        (Ns::NEWNET, "--net"),
        (Ns::NEWCGROUP, "--cgroup"),
    ]
};

/// The namespaces of a sandbox: all of [`NAMESPACES`], but the network one only with `net` and
/// the cgroup one only with `cgroup`.
pub fn sandbox_namespaces(net: bool, cgroup: bool) -> impl Iterator<Item = (rustix::thread::UnshareFlags, &'static str)> {
    use rustix::thread::UnshareFlags as Ns;
    NAMESPACES.into_iter().filter(move |(ns, _)| (net || *ns != Ns::NEWNET) && (cgroup || *ns != Ns::NEWCGROUP))
}

/// util-linux `unshare`'s options besides the namespaces: root inside is the caller, the program
/// is forked as pid 1 of the new pid namespace, mounts are private.
pub const UNSHARE_OPTIONS: &[&str] = &["--map-root-user", "--fork", "--propagation", "private"];

/// The subcommand of this binary that runs as the sandbox's init.
pub const SUBCOMMAND: &str = "sandbox-init";

/// How long the keeper waits for the init's answer.
pub const START_BUDGET: Duration = Duration::from_secs(10);

/// A running init, as the keeper sees it.
pub struct Started {
    /// The init's pid in the keeper's pid namespace.
    pub pid: u32,
    /// Its start time (clock ticks since boot), which identifies it against pid reuse.
    pub start: u64,
    /// The process that forked it, the stage or `unshare` (it waits for the init and reaps it).
    pub holder: Holder,
    /// The listening socket of the sandbox's egress proxy, bound on its loopback interface (none
    /// for a sandbox on the host's network).
    pub egress: Option<std::net::TcpListener>,
    /// Whether the mount of its home names no host path ([`rootfs::assemble`]): its `ready` line
    /// then ends with [`super::NO_HOST_PATHS`].
    pub hidden: bool,
}

/// Whether the kernel offers cgroup namespaces.
pub fn has_cgroup_namespace() -> bool {
    Path::new("/proc/self/ns/cgroup").exists()
}

/// The program path the init is executed by: this binary, open as the holder's stdin.
pub(super) const EXE_FROM_STDIN: &str = "/proc/self/fd/0";

/// At most this much of what `unshare` or the init wrote to stderr goes into a start error.
const STDERR_KEPT: u64 = 2048;

/// Where a new init starts: the sandbox's home, whether it keeps the host's network, the shell
/// to make visible inside, and the `cgroup.procs` files it joins before its namespaces exist.
pub struct Site<'a> {
    /// The sandbox's home on the host.
    pub home: &'a Path,
    /// Whether the sandbox shares the host's network namespace (always false now: every isolated
    /// sandbox gets a private one and an egress proxy).
    pub host_network: bool,
    /// The server's shell (bound inside when it lives outside the system directories).
    pub shell: &'a Path,
    /// The sandbox's cgroup leaves (none without limits).
    pub cgroups: &'a [PathBuf],
    /// The host uid and gid of the sandbox's root.
    pub owner: (u32, u32),
    /// Whether the home is a disk of the sandbox's own whose directories are bound at `/tmp`
    /// and `/dev/shm` (see [`super::disk`]).
    pub scratch: bool,
}

/// Starts the init of a sandbox at `site` and waits for its answer. With `spawner`, the init
/// serves spawn requests on that listening socket (passed over the answer socket).
pub fn start(tools: &Tools, exe: &Path, site: &Site<'_>, spawner: Option<UnixListener>) -> Result<Started, IsolationError> {
    start_init(tools, exe, site, spawner).map_err(IsolationError)
}

/// The keeper's child that forked the init, the stage or `unshare`: it exits with the init. (The
/// keeper zygote waits for its own children, each forking a keeper away, with it too.)
pub struct Holder {
    pid: rustix::process::Pid,
    /// Whether it was waited for (its pid may name another process since).
    reaped: bool,
}

impl Holder {
    /// The holder of pid `pid`, a child of this process not waited for yet.
    pub(crate) fn of(pid: rustix::process::Pid) -> Holder {
        Holder { pid, reaped: false }
    }

    /// Its pid.
    pub fn id(&self) -> u32 {
        self.pid.as_raw_nonzero().get().unsigned_abs()
    }

    /// Sends it SIGKILL, unless it was reaped.
    pub fn kill(&self) {
        if !self.reaped {
            let _ = rustix::process::kill_process(self.pid, rustix::process::Signal::KILL);
        }
    }

    /// Waits for it to exit.
    pub fn wait(&mut self) -> io::Result<std::process::ExitStatus> {
        loop {
            match self.wait_with(rustix::process::WaitOptions::empty()) {
                Ok(Some(status)) => return Ok(status),
                Ok(None) | Err(_) if self.reaped => return Err(io::Error::other("it was reaped already")),
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Ok(None) => {}
                Err(err) => return Err(err),
            }
        }
    }

    /// Its exit status, if it has exited.
    pub fn try_wait(&mut self) -> io::Result<Option<std::process::ExitStatus>> {
        if self.reaped {
            return Err(io::Error::other("it was reaped already"));
        }
        self.wait_with(rustix::process::WaitOptions::NOHANG)
    }

    fn wait_with(&mut self, options: rustix::process::WaitOptions) -> io::Result<Option<std::process::ExitStatus>> {
        let waited = rustix::process::waitpid(Some(self.pid), options)?;
        Ok(waited.map(|(_, status)| {
            self.reaped = true;
            std::os::unix::process::ExitStatusExt::from_raw(status.as_raw())
        }))
    }
}

/// Starts `cmd` (`unshare`, which executes the init as `/proc/self/fd/0`) with this program `exe`
/// as its stdin, `answer` as its stdout and a pipe as its stderr; `what` names it in an error.
fn exec_holder(mut cmd: Command, exe: &Path, answer: UnixStream, what: &str) -> Result<(Holder, Option<File>), String> {
    // Opened here, with the keeper's rights, and inherited as stdin through every exec up to the
    // init's own (a duplicate without close-on-exec; the original closes at the first exec): the
    // sandbox's uid needs no path to this binary.
    let exe_fd = rustix::fs::open(exe, rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC, rustix::fs::Mode::empty())
        .map_err(|e| format!("could not open this program ({}) to start the sandbox's init: {e}", exe.display()))?;
    let mut child = cmd
        .env("LC_ALL", "C")
        .stdin(Stdio::from(exe_fd))
        .stdout(Stdio::from(OwnedFd::from(answer)))
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("could not run {what}: {e}"))?;
    let stderr = child.stderr.take().map(|e| File::from(OwnedFd::from(e)));
    let pid = rustix::process::Pid::from_child(&child);
    // The command holds our copy of the init's end: without dropping it, an init that exits
    // early would look like one that never answers. (The child is reaped through its pid.)
    drop(cmd);
    Ok((Holder::of(pid), stderr))
}

/// [`start`], its error as a sentence.
fn start_init(tools: &Tools, exe: &Path, site: &Site<'_>, spawner: Option<UnixListener>) -> Result<Started, String> {
    start_init_as(rustix::process::getuid().is_root(), tools, exe, site, spawner)
}

/// [`start_init`] through the stage when `as_root`, else through `unshare`.
fn start_init_as(as_root: bool, tools: &Tools, exe: &Path, site: &Site<'_>, spawner: Option<UnixListener>) -> Result<Started, String> {
    let Site { home, host_network, shell, cgroups, scratch, .. } = *site;
    let text = |path: &Path| path.to_str().map(str::to_string).ok_or_else(|| format!("the path {} is not UTF-8", path.display()));
    // The init's arguments (after `sandbox-init`).
    let mut init_args = Vec::new();
    if as_root {
        init_args.extend(["--home".to_string(), stage::handed_over_home(scratch)]);
    }
    if !super::visible_inside(shell) {
        init_args.extend(["--bind-file".to_string(), text(shell)?]);
    }
    if !host_network {
        init_args.extend(["--loopback".to_string(), EGRESS_FLAG.to_string()]);
    }
    if spawner.is_some() {
        init_args.push(SPAWNER_FLAG.to_string());
    }
    if scratch {
        init_args.push(SCRATCH_FLAG.to_string());
    }
    let (ours, theirs) = UnixStream::pair().map_err(|e| format!("could not make the init's answer socket: {e}"))?;
    let (mut holder, stderr) = if as_root {
        // The stage joins the cgroups, hands the home over, drops to the sandbox's uid, makes the
        // namespaces and forks the init itself: each program less on the way is an exec less.
        let cgroups = cgroups.iter().map(|file| text(file)).collect::<Result<Vec<_>, _>>()?;
        let stage = stage::Stage { owner: site.owner, cgroups, net: !host_network, home: text(home)?, own_fs: scratch, init: init_args };
        // (Nothing in the keeper starts a thread before the init; `fork` checks.)
        let (pid, stderr) = stage::fork_stage(stage, theirs).map_err(|e| format!("could not fork the sandbox's stage: {e}"))?;
        (Holder::of(pid), Some(stderr))
    } else {
        let mut cmd = super::sandbox_command(tools, &tools.unshare, site.owner);
        cmd.args(UNSHARE_OPTIONS).args(sandbox_namespaces(!host_network, has_cgroup_namespace()).map(|(_, option)| option));
        cmd.args(["--", EXE_FROM_STDIN, SUBCOMMAND]).args(&init_args);
        if !cgroups.is_empty() {
            // The first process joins the cgroup leaves before anything makes a namespace: the
            // init's cgroup namespace is rooted there (as root, the stage is that process).
            let mut joined = super::enter::joined(cgroups, Path::new(cmd.get_program()));
            joined.args(cmd.get_args());
            cmd = joined;
        }
        // The home's host path reaches the init in its environment, which sandbox code cannot
        // read (the init is not dumpable), rather than in its argv (`/proc/1/cmdline`).
        cmd.env_clear().env(HOME_VAR, home);
        exec_holder(cmd, exe, theirs, &tools.unshare.display().to_string())?
    };
    let sent = match &spawner {
        Some(listener) => send_fd(&ours, listener).map_err(|e| format!("could not pass the spawner's socket to the init: {e}")),
        None => Ok(()),
    };
    drop(spawner);
    let begun = Instant::now();
    let (answer, egress) = match sent {
        Ok(()) => read_answer(&ours, START_BUDGET),
        Err(why) => (Answer::Failed(why), None),
    };
    drop(ours);
    let parsed = match &answer {
        Answer::Line(line) => {
            let mut it = line.split_whitespace();
            match (it.next(), it.next().and_then(|p| p.parse().ok()), it.next().and_then(|s| s.parse().ok())) {
                (Some("ready"), Some(pid), Some(start)) => Some((pid, start, it.next() == Some(super::NO_HOST_PATHS))),
                _ => None,
            }
        }
        _ => None,
    };
    if let Some((pid, start, hidden)) = parsed {
        if host_network || egress.is_some() {
            return Ok(Started { pid, start, holder, egress: egress.map(std::net::TcpListener::from), hidden });
        }
    }
    // Whatever it got to, the namespaces end with the init; the holder follows.
    if let Some(pid) = child_of(holder.id()) {
        kill_child_of(holder.id(), pid);
    }
    holder.kill();
    let status = holder.wait().ok();
    // Every writer of the pipe is gone now: what it holds is what they said, read within a bound.
    let said = stderr.map(|e| read_within(e, STDERR_KEPT, Duration::from_secs(1))).unwrap_or_default();
    let said = said.split_whitespace().collect::<Vec<_>>().join(" ");
    let said = if said.is_empty() { String::new() } else { format!("; it said: {said}") };
    Err(match answer {
        Answer::Line(line) if parsed.is_some() => format!("the sandbox's init answered {line:?} without its egress socket{said}"),
        Answer::Line(line) => match line.strip_prefix("error ") {
            Some(why) => why.to_string(),
            None => format!("the sandbox's init answered {line:?} instead of ready{said}"),
        },
        Answer::Closed => {
            let how = status.map(|s| format!(" ({s})")).unwrap_or_default();
            format!("the sandbox's init exited before it was ready{how}{said}")
        }
        Answer::TimedOut => {
            format!("the sandbox's init did not answer within {} s{said}", begun.elapsed().max(START_BUDGET).as_secs())
        }
        Answer::Failed(why) => format!("{why}{said}"),
    })
}

/// What came back on an answer channel.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// One line, without its newline.
    Line(String),
    /// The other end closed (or failed) before a whole line.
    Closed,
    /// Nothing whole within the budget.
    TimedOut,
    /// The exchange could not start.
    Failed(String),
}

/// The longest answer line taken (the answers are a few words).
const ANSWER_MAX: u64 = 4096;

/// Reads one line from `pipe`, at most [`ANSWER_MAX`] bytes, within `budget` (the answers of a
/// starting init and of a starting keeper).
pub(crate) fn read_line_within(pipe: impl io::Read + Send + 'static, budget: Duration) -> Answer {
    let (tx, rx) = crossbeam_channel::bounded(1);
    let spawned = std::thread::Builder::new().name("sandbox-mcp-answer".into()).spawn(move || {
        let mut line = Vec::new();
        let mut limited = pipe.take(ANSWER_MAX);
        let mut byte = [0u8; 1];
        let answer = loop {
            match limited.read(&mut byte) {
                Ok(0) => break Answer::Closed,
                Ok(_) if byte[0] == b'\n' => break Answer::Line(String::from_utf8_lossy(&line).trim_end().to_string()),
                Ok(_) => line.push(byte[0]),
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break Answer::Closed,
            }
        };
        let _ = tx.send(answer);
    });
    if let Err(err) = spawned {
        return Answer::Failed(format!("could not start a thread to read the answer: {err}"));
    }
    rx.recv_timeout(budget).unwrap_or(Answer::TimedOut)
}

/// Reads the init's answer line from `conn`, at most [`ANSWER_MAX`] bytes within `budget`, with
/// the descriptor attached to it (the egress proxy's listening socket), if any.
pub(super) fn read_answer(conn: &UnixStream, budget: Duration) -> (Answer, Option<OwnedFd>) {
    let deadline = Instant::now() + budget;
    let mut line = Vec::new();
    let mut got = None;
    let mut buf = [0u8; 256];
    loop {
        if let Some(at) = line.iter().position(|b| *b == b'\n') {
            line.truncate(at);
            return (Answer::Line(String::from_utf8_lossy(&line).trim_end().to_string()), got);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return (Answer::TimedOut, None);
        }
        if line.len() as u64 > ANSWER_MAX || conn.set_read_timeout(Some(left)).is_err() {
            return (Answer::Closed, None);
        }
        match fd_passing::recv_with_fds(conn, &mut buf, 1) {
            Ok((0, _)) => return (Answer::Closed, None),
            Ok((n, fds)) => {
                line.extend_from_slice(&buf[..n]);
                got = got.or_else(|| fds.into_iter().next());
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(rustix::io::Errno::AGAIN) => return (Answer::TimedOut, None),
            Err(_) => return (Answer::Closed, None),
        }
    }
}

/// Up to `max` bytes of what `pipe` holds until its end, within `budget`, as text.
fn read_within(pipe: impl io::Read + Send + 'static, max: u64, budget: Duration) -> String {
    let (tx, rx) = crossbeam_channel::bounded(1);
    let spawned = std::thread::Builder::new().name("sandbox-mcp-stderr".into()).spawn(move || {
        let mut text = Vec::new();
        let _ = pipe.take(max).read_to_end(&mut text);
        let _ = tx.send(String::from_utf8_lossy(&text).into_owned());
    });
    if spawned.is_err() {
        return String::new();
    }
    rx.recv_timeout(budget).unwrap_or_default()
}

/// Sends one descriptor over `conn` (one byte of data carries it).
pub(super) fn send_fd(conn: &UnixStream, fd: impl std::os::fd::AsFd) -> io::Result<()> {
    fd_passing::send_with_fds(conn, b"L", &[fd.as_fd()])
}

/// Receives the one descriptor [`send_fd`] sent on `conn` (close-on-exec).
pub(super) fn receive_fd(conn: impl std::os::fd::AsFd) -> io::Result<OwnedFd> {
    let (_, fds) = fd_passing::recv_with_fds(conn, &mut [0u8; 1], 1)?;
    fds.into_iter().next().ok_or_else(|| io::Error::other("the keeper sent no spawner socket"))
}

/// Sends SIGKILL to process `pid` if it is a child of `parent`, checked once a pidfd holds it: a
/// pid reused since it was read is never signalled (the parent, unreaped, forks one child).
fn kill_child_of(parent: u32, pid: u32) {
    let Some(target) = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw) else { return };
    let Ok(pidfd) = rustix::process::pidfd_open(target, rustix::process::PidfdFlags::empty()) else { return };
    if process::proc_stat(pid).is_some_and(|st| st.ppid == parent) {
        let _ = rustix::process::pidfd_send_signal(&pidfd, rustix::process::Signal::KILL);
    }
}

/// The first child of process `pid` (the init forked by the stage or `unshare`), from `/proc`.
fn child_of(pid: u32) -> Option<u32> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// The variable that gives the init its home's host path when it is not given as `--home`.
const HOME_VAR: &str = "SANDBOX_MCP_INIT_HOME";

/// The flag that tells the init its stdin is the spawner's listening socket.
const SPAWNER_FLAG: &str = "--spawner";

/// The flag that tells the init to take `/tmp` and `/dev/shm` from the home's disk.
const SCRATCH_FLAG: &str = "--scratch-in-home";

/// The flag that tells the init to bind the egress proxy's port on its loopback interface and
/// pass the listening socket to the keeper with its answer.
const EGRESS_FLAG: &str = "--egress";

/// The body of `sandbox-mcp sandbox-init [--home PATH] [--bind-file PATH] [--loopback]
/// [--egress] [--spawner] [--scratch-in-home]` (the home from [`HOME_VAR`] without `--home`), pid 1 of a new pid
/// namespace. Returns only on a setup failure (after answering `error ...`).
pub fn run(args: &[String]) -> anyhow::Result<()> {
    let mut extra_file = None;
    let mut home = None;
    let mut loopback = false;
    let mut serve = false;
    let mut egress = false;
    let mut scratch = false;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--home" => home = it.next().map(PathBuf::from),
            "--bind-file" => extra_file = it.next().map(PathBuf::from),
            "--loopback" => loopback = true,
            SPAWNER_FLAG => serve = true,
            EGRESS_FLAG => egress = true,
            SCRATCH_FLAG => scratch = true,
            other => anyhow::bail!("unknown argument {other:?}"),
        }
    }
    let Some(home) = home.or_else(|| std::env::var_os(HOME_VAR).map(PathBuf::from)) else {
        anyhow::bail!("sandbox-init needs --home PATH or {HOME_VAR}")
    };
    std::env::remove_var(HOME_VAR);
    // A session of its own: no controlling terminal for the init or anything it starts.
    let session = rustix::process::setsid().map(drop).map_err(|e| format!("start a session of its own: {e}"));
    // The spawner's listening socket comes over the answer socket (stdout), close-on-exec so
    // that no command inherits it.
    let listener = if serve {
        receive_fd(io::stdout()).map(|fd| Some(UnixListener::from(fd))).map_err(|e| format!("receive the spawner's socket: {e}"))
    } else {
        Ok(None)
    };
    let identity = session.and_then(|()| host_identity());
    let plan = Plan { home, extra_file, scratch };
    let setup = identity.and_then(|id| {
        let hidden = rootfs::assemble(&plan)?;
        if loopback {
            loopback_up().map_err(|e| format!("bring up the loopback interface: {e}"))?;
        }
        let egress = if egress {
            let port = crate::egress::PROXY_PORT;
            Some(std::net::TcpListener::bind(("127.0.0.1", port)).map_err(|e| format!("bind the egress proxy's port {port}: {e}"))?)
        } else {
            None
        };
        limit_nested_namespaces()?;
        out_of_reach()?;
        // Last, while this process has one thread: the filter holds for everything it starts.
        seccomp::install()?;
        Ok((id, egress, hidden))
    });
    let mut out = io::stdout().lock();
    let ready = setup.and_then(|id| listener.map(|l| (id, l)));
    let (((pid, start), egress, hidden), listener) = match ready {
        Ok(ready) => ready,
        Err(err) => {
            let _ = writeln!(out, "error {}", err.replace('\n', " "));
            let _ = out.flush();
            anyhow::bail!("{err}");
        }
    };
    let mut ready = format!("ready {pid} {start}");
    if hidden {
        ready = format!("{ready} {}", super::NO_HOST_PATHS);
    }
    ready.push('\n');
    match egress {
        // The keeper serves the proxy on this socket; the init keeps no copy.
        Some(egress) => fd_passing::send_with_fds(io::stdout(), ready.as_bytes(), &[egress.as_fd()])?,
        None => {
            out.write_all(ready.as_bytes())?;
            out.flush()?;
        }
    }
    drop(out);
    // Let go of the keeper's socket and pipe, and of this binary (stdin).
    let null = File::options().read(true).write(true).open("/dev/null")?;
    rustix::stdio::dup2_stdin(&null)?;
    rustix::stdio::dup2_stdout(&null)?;
    rustix::stdio::dup2_stderr(&null)?;
    match listener {
        Some(listener) => spawner::serve(listener, PathBuf::from(rootfs::HOME), None),
        None => reap_forever(),
    }
}

/// How many namespaces of each kind the sandbox's processes may hold at once.
pub const NESTED_NAMESPACES: u32 = 64;

/// Bounds the namespaces sandbox code may make inside (tools need some) through the limits of
/// the sandbox's own user namespace, which its root sets: every nested namespace counts against
/// them, so one sandbox cannot use up a count that the host's user shares with every sandbox
/// (and then `create_sandbox` of other clients fails). A kernel without one of the files has no
/// such namespace kind.
fn limit_nested_namespaces() -> Result<(), String> {
    for kind in ["user", "mnt", "pid", "net", "ipc", "uts", "cgroup", "time"] {
        let file = format!("/proc/sys/user/max_{kind}_namespaces");
        match std::fs::write(&file, NESTED_NAMESPACES.to_string()) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("limit nested {kind} namespaces ({file}): {e}")),
        }
    }
    Ok(())
}

/// Puts this init out of reach of the sandbox's code, which runs as the same uid, as root of the
/// same user namespace: the init becomes non-dumpable, so tracing it, reading its memory or
/// taking its descriptors (`ptrace`, `/proc/1/mem`, `/proc/1/fd`, `pidfd_getfd`) needs
/// `CAP_SYS_PTRACE` in that namespace, and `CAP_SYS_PTRACE` leaves the bounding set of this
/// thread and so of every command it starts (a nested user namespace gives it back only over
/// that namespace, never over the init's). Tracing the sandbox's own processes keeps working:
/// a command is dumpable again after its exec, and the same uid needs no capability for it.
fn out_of_reach() -> Result<(), String> {
    use rustix::process::{set_dumpable_behavior, DumpableBehavior};
    set_dumpable_behavior(DumpableBehavior::NotDumpable).map_err(|e| format!("make the init non-dumpable: {e}"))?;
    rustix::thread::remove_capability_from_bounding_set(rustix::thread::CapabilitySet::SYS_PTRACE)
        .map_err(|e| format!("drop CAP_SYS_PTRACE from the sandbox's bounding set: {e}"))
}

/// This process's pid and start time as the keeper sees them, read from the host's `/proc`
/// before it is replaced (its `self` link names the pid in the mounting pid namespace).
fn host_identity() -> Result<(u32, u64), String> {
    let link = std::fs::read_link("/proc/self").map_err(|e| format!("read /proc/self: {e}"))?;
    let pid: u32 = link.to_string_lossy().parse().map_err(|_| format!("unexpected /proc/self link {}", link.display()))?;
    let st = process::proc_stat(pid).ok_or_else(|| format!("cannot read /proc/{pid}/stat"))?;
    Ok((pid, st.start))
}

/// Waits for every child, forever. With none to wait for, it naps briefly: an orphan adopted
/// meanwhile is reaped on the next round, well within a second of its exit.
fn reap_forever() -> ! {
    loop {
        match rustix::process::wait(rustix::process::WaitOptions::empty()) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Sets `lo` up in the sandbox's network namespace through one rtnetlink request (ifindex 1 is
/// the loopback interface of every new network namespace).
pub(super) fn loopback_up() -> io::Result<()> {
    use rustix::net::{recv, send, socket, AddressFamily, RecvFlags, SendFlags, SocketType};
    const RTM_NEWLINK: u16 = 16;
    const NLM_F_REQUEST: u16 = 1;
    const NLM_F_ACK: u16 = 4;
    const IFF_UP: u32 = 1;
    // Protocol 0 of the netlink family is NETLINK_ROUTE.
    let fd = socket(AddressFamily::NETLINK, SocketType::RAW, None).map_err(io::Error::from)?;
    let mut msg = Vec::with_capacity(32);
    msg.extend_from_slice(&32u32.to_ne_bytes()); // nlmsg_len
    msg.extend_from_slice(&RTM_NEWLINK.to_ne_bytes());
    msg.extend_from_slice(&(NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
    msg.extend_from_slice(&1u32.to_ne_bytes()); // seq
    msg.extend_from_slice(&0u32.to_ne_bytes()); // pid: the kernel fills it in
    msg.extend_from_slice(&[0, 0]); // ifi_family AF_UNSPEC, padding
    msg.extend_from_slice(&0u16.to_ne_bytes()); // ifi_type
    msg.extend_from_slice(&1i32.to_ne_bytes()); // ifi_index: lo
    msg.extend_from_slice(&IFF_UP.to_ne_bytes()); // ifi_flags
    msg.extend_from_slice(&IFF_UP.to_ne_bytes()); // ifi_change
    send(&fd, &msg, SendFlags::empty()).map_err(io::Error::from)?;
    let mut reply = [0u8; 256];
    let (n, _) = recv(&fd, &mut reply, RecvFlags::empty()).map_err(io::Error::from)?;
    // An NLMSG_ERROR (type 2) answer carries the errno (0 for the acknowledgement) after the header.
    if n >= 20 && u16::from_ne_bytes([reply[4], reply[5]]) == 2 {
        let errno = i32::from_ne_bytes([reply[16], reply[17], reply[18], reply[19]]);
        if errno != 0 {
            return Err(io::Error::from_raw_os_error(-errno));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A start that fails says what failed: what `unshare` wrote and how it exited, not a
    /// time-out that never happened. (The stage is forked by the keeper, a process of one
    /// thread, which a test harness is not: its answers go the same way, `error ...` on the
    /// answer socket, what it wrote on the pipe.)
    #[test]
    fn a_failed_start_reports_what_unshare_said() {
        let dir = std::env::temp_dir().join(format!("smcp-init-{}", crate::ids::random_hex(4)));
        std::fs::create_dir_all(&dir).unwrap();
        let fake = dir.join("unshare");
        std::fs::write(&fake, "#!/bin/sh\necho 'unshare: unshare failed: No space left on device' >&2\nexit 1\n").unwrap();
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        let tools = Tools { unshare: fake.clone(), nsenter: fake.clone(), setpriv: Some(fake.clone()), setsid: fake.clone() };
        let begun = Instant::now();
        let site = Site {
            home: &dir,
            host_network: false,
            shell: Path::new("/bin/sh"),
            cgroups: &[],
            owner: super::super::sandbox_owner(),
            scratch: false,
        };
        let err = start_init_as(false, &tools, &fake, &site, None).err().unwrap();
        assert!(err.contains("exited before it was ready") && err.contains("No space left on device"), "{err}");
        assert!(begun.elapsed() < START_BUDGET / 2, "it waited {:?}", begun.elapsed());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn answers_are_lines_ends_or_time_outs() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        theirs.write_all(b"ready 12 34\n").unwrap();
        assert_eq!(read_line_within(ours, Duration::from_secs(5)), Answer::Line("ready 12 34".into()));
        let (ours, theirs) = UnixStream::pair().unwrap();
        drop(theirs);
        assert_eq!(read_line_within(ours, Duration::from_secs(5)), Answer::Closed);
        let (ours, _theirs) = UnixStream::pair().unwrap();
        assert_eq!(read_line_within(ours, Duration::from_millis(50)), Answer::TimedOut);
        // An endless line is cut short, not read forever.
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        std::thread::spawn(move || while theirs.write_all(&[b'x'; 1024]).is_ok() {});
        assert_eq!(read_line_within(ours, Duration::from_secs(5)), Answer::Closed);
    }
}
