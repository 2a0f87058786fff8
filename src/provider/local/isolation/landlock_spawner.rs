//! The spawner of a Landlock-tier sandbox: one process per sandbox, confined once and kept by
//! its keeper, that starts every command of the sandbox on the server's request (the protocol
//! of [`spawner`], which the init of an isolated sandbox serves too).
//!
//! Confined once, as a command would be (the sandbox's uid when it has one, its cgroups,
//! `no_new_privs`, the Landlock ruleset, seccomp), its children are all in one Landlock domain:
//! the ruleset can then scope signals to the sandbox (ABI 6), since a task, `cancel_task`'s
//! snippet and a `kill` in run_command all share that domain, while the server, the host user's
//! processes and other sandboxes are outside it. It also spares each command a fork of the
//! server. It is a child subreaper, so whatever a command leaves behind stays beneath it and is
//! reaped there, and not dumpable: nothing of the sandbox may trace it.
//!
//! The server binds the socket ([`spawner::SOCKET_FILE`] in the sandbox's directory) when it
//! creates the sandbox and hands the listening socket to the keeper as its stdout; a connection
//! made before the spawner runs waits in the socket's backlog. The keeper passes it on as the
//! spawner's stdout, records the spawner (`spawner.pid`), and starts another one when it ends
//! (sandbox code can kill it: it runs as the sandbox). A keeper restarted by a sweep binds the
//! socket again once the spawner it did not start has ended. The spawner is executed through a
//! descriptor of this binary opened by the keeper, as the init is, and the ruleset lets it (and
//! so the sandbox) execute this one file.

use super::enter::Init;
use super::{init, landlock, spawner};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The subcommand of this binary that runs as a Landlock-tier sandbox's spawner.
pub const SUBCOMMAND: &str = "sandbox-landlock-spawner";

/// The file in a sandbox's directory that names its spawner: `<pid> <start time>`.
pub const RECORD: &str = "spawner.pid";

/// The least time between two starts of a sandbox's spawner.
const RESTART_EVERY: Duration = Duration::from_secs(1);

/// What a Landlock-tier sandbox's spawner is confined to.
pub struct Site<'a> {
    /// The sandbox's id (its processes carry it in their environment, as every command does).
    pub id: &'a str,
    /// The sandbox's home, the spawner's working directory.
    pub home: &'a Path,
    /// Its own temporary directory.
    pub tmp: &'a Path,
    /// The server's shell.
    pub shell: &'a Path,
    /// This program.
    pub exe: &'a Path,
    /// The `cgroup.procs` files of the sandbox's limits.
    pub cgroups: &'a [PathBuf],
    /// The sandbox's own uid, if it has one.
    pub uid: Option<u32>,
}

/// A keeper's hold on its sandbox's spawner.
pub struct Keeping {
    dir: PathBuf,
    listener: Option<UnixListener>,
    child: Option<Child>,
    last_start: Option<Instant>,
}

impl Keeping {
    /// Keeps the spawner of the sandbox in `dir`, serving `listener` (the socket the server
    /// bound), or, without it (a keeper restarted by a sweep), a socket bound again once no
    /// spawner runs.
    pub fn new(dir: &Path, listener: Option<UnixListener>) -> Keeping {
        Keeping { dir: dir.to_path_buf(), listener, child: None, last_start: None }
    }

    /// Starts the spawner when none runs (at most once per [`RESTART_EVERY`]); reaps one that
    /// ended. Says why when it could not.
    pub fn tend(&mut self, site: &Site<'_>) -> Result<(), String> {
        if let Some(child) = self.child.as_mut() {
            match child.try_wait() {
                Ok(None) => return Ok(()),
                Ok(Some(_)) | Err(_) => self.child = None,
            }
        } else if Init::read(&self.dir.join(RECORD)).is_some_and(|spawner| spawner.alive()) {
            // Started by a keeper before this one: it serves the socket as long as it lives.
            return Ok(());
        }
        if self.last_start.is_some_and(|at| at.elapsed() < RESTART_EVERY) {
            return Ok(());
        }
        self.last_start = Some(Instant::now());
        if self.listener.is_none() {
            self.listener = spawner::bind(&self.dir);
        }
        let listener = self.listener.as_ref().ok_or("could not bind the spawner's socket")?;
        let child = start(listener, site)?;
        let start = crate::provider::process::proc_stat(child.id()).map(|st| st.start).unwrap_or(0);
        let record = Init { pid: child.id(), start };
        self.child = Some(child);
        record.store_as(&self.dir, RECORD).map_err(|e| format!("could not record the spawner: {e}"))
    }
}

/// Starts the spawner of `site` on `listener`, confined.
fn start(listener: &UnixListener, site: &Site<'_>) -> Result<Child, String> {
    // Opened with the keeper's rights: the sandbox's uid needs no path to this binary.
    let exe = rustix::fs::open(site.exe, rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC, rustix::fs::Mode::empty())
        .map_err(|e| format!("could not open this program ({}) to start the sandbox's spawner: {e}", site.exe.display()))?;
    let plan = landlock::Plan {
        home: site.home,
        tmp: site.tmp,
        shell: site.shell,
        program: Some(site.exe),
        scope_signals: true,
        connect_port: None,
        cgroups: site.cgroups,
        terminals: site.uid.is_some(),
    };
    let confinement = landlock::prepare(&plan)?;
    let socket = listener.try_clone().map_err(|e| format!("could not pass the spawner's socket: {e}"))?;
    let null = File::options().read(true).write(true).open("/dev/null").map_err(|e| format!("could not open /dev/null: {e}"))?;
    let mut cmd = Command::new(init::EXE_FROM_STDIN);
    cmd.arg(SUBCOMMAND)
        .current_dir(site.home)
        .env_clear()
        .env(super::super::TAG_VAR, site.id)
        .stdin(Stdio::from(exe))
        .stdout(Stdio::from(OwnedFd::from(socket)))
        .stderr(Stdio::from(null));
    if let Some(uid) = site.uid {
        cmd.uid(uid).gid(uid);
    }
    landlock::confine(&mut cmd, confinement);
    cmd.spawn().map_err(|e| format!("could not start the sandbox's spawner: {e}"))
}

/// The body of `sandbox-mcp sandbox-landlock-spawner`, already confined: its stdout is the
/// listening socket, its working directory the sandbox's home. Returns only on a setup failure.
pub fn run() -> anyhow::Result<()> {
    // A session of its own: no controlling terminal for it or anything it starts.
    rustix::process::setsid()?;
    let listener = UnixListener::from(io::stdout().as_fd().try_clone_to_owned()?);
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)?;
    rustix::process::set_child_subreaper(Some(rustix::process::getpid()))?;
    let home = std::env::current_dir()?;
    // Let go of this binary (stdin) and of the keeper's copy of the socket (stdout).
    let null = File::options().read(true).write(true).open("/dev/null")?;
    rustix::stdio::dup2_stdin(&null)?;
    rustix::stdio::dup2_stdout(&null)?;
    rustix::stdio::dup2_stderr(&null)?;
    spawner::serve(listener, home)
}
