//! The keeper and the sweep: a detached process (`sandbox-mcp keeper`) per sandbox that starts
//! the init of an isolated sandbox and ends the sandbox at expiry even when no server runs, and
//! the sweep that ends expired sandboxes and restarts missing keepers at server start.

use super::isolation::enter::Init;
use super::isolation::{cgroup, init, landlock_spawner, passage, seccomp, spawner, stage, Isolation};
use super::{check_local_id, zygote, LocalProvider, CREATING_PREFIX, KILL_SCAN_BUDGET};
use crate::egress;
use crate::provider::process;
use crate::provider::{unix_now, Provider, ProviderError};
use std::fs;
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// The internal subcommand that runs a sandbox's keeper (see [`run_internal`]).
pub(super) const KEEPER_COMMAND: &str = "keeper";

/// The keeper's flag that makes it start the init of a new isolated sandbox (only `create` passes
/// it: a keeper restarted by a sweep never starts an init).
const START_INIT_FLAG: &str = "--start-init";

/// The keeper's flag that says its stdout is the listening socket of a new Landlock-tier
/// sandbox's spawner.
const SPAWNER_FLAG: &str = "--spawner-on-stdout";

/// A sweep leaves sandboxes younger than this to the server creating them.
const SWEEP_GRACE_S: i64 = 60;

impl LocalProvider {
    /// Ends expired sandboxes and restarts missing keepers (run once at server start).
    pub fn sweep(&self) {
        let Ok(dir) = fs::read_dir(self.root.join("sandboxes")) else {
            return;
        };
        for entry in dir.flatten() {
            let id = entry.file_name().to_string_lossy().into_owned();
            if id.starts_with(CREATING_PREFIX) {
                // A create that died half-way; one still running finishes within milliseconds.
                let stale =
                    entry.metadata().and_then(|m| m.modified()).is_ok_and(|t| t.elapsed().unwrap_or_default() > Duration::from_secs(600));
                if stale {
                    super::isolation::disk::release(&entry.path());
                    let _ = super::removal::remove_tree(&entry.path(), Instant::now() + KILL_SCAN_BUDGET);
                }
                continue;
            }
            if check_local_id(&id).is_err() {
                continue;
            }
            match self.load(&id) {
                Ok(meta) if meta.expires_at <= unix_now() => {
                    log::info!("sweep: sandbox {id} expired, killing it");
                    let _ = self.kill(&id, Instant::now() + KILL_SCAN_BUDGET);
                }
                Ok(meta) if meta.created_at + SWEEP_GRACE_S > unix_now() => {}
                Ok(_) if !keeper_alive(&self.dir(&id)) => {
                    log::info!("sweep: restarting the keeper of sandbox {id}");
                    self.spawn_keeper(&id);
                }
                Ok(_) => {}
                Err(ProviderError::NotFound { .. }) => {
                    // A directory without metadata is the remains of a kill that was interrupted.
                    let _ = self.kill(&id, Instant::now() + KILL_SCAN_BUDGET);
                }
                Err(err) => log::warn!("sweep: sandbox {id}: {err}"),
            }
        }
    }

    pub(super) fn spawn_keeper(&self, id: &str) {
        let started = null().and_then(|(stdin, stdout)| self.launch_keeper(id, None, stdin, stdout));
        if let Err(err) = started {
            log::warn!("could not start the keeper of sandbox {id}: {err}; it ends at the next server start after expiry");
        }
    }

    /// Starts the keeper of Landlock-tier sandbox `id`, handing it the spawner's `listener`.
    pub(super) fn start_keeper_with(&self, id: &str, listener: std::os::unix::net::UnixListener) -> Result<(), ProviderError> {
        let started = null().and_then(|(stdin, _)| self.launch_keeper(id, Some(SPAWNER_FLAG), stdin, OwnedFd::from(listener)));
        started.map_err(|err| ProviderError::Unavailable(format!("could not start the keeper of sandbox {id}: {err}")))
    }

    /// Starts the keeper of `id` detached, through the provider's keeper zygote (`zygote.rs`),
    /// with start flag `flag` and the given stdin and stdout. The zygote's child forks the keeper
    /// and exits at once ([`detach`]), so the keeper is re-parented to init (no zombie under a
    /// long-running server) and is out of reach of group signals aimed at the server (the Python
    /// SDK signals the server's whole group): that child leads a group of its own, and the
    /// keeper then starts a session of its own. Fails with what went wrong when the child did not
    /// exit with 0.
    fn launch_keeper(&self, id: &str, flag: Option<&str>, stdin: OwnedFd, stdout: OwnedFd) -> io::Result<()> {
        let mut env = vec![("PATH".to_string(), std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()))];
        env.extend(self.egress.to_env().into_iter().map(|(k, v)| (k.to_string(), v.to_string())));
        if super::isolation::subordinate::entered().is_some() {
            env.push((super::isolation::subordinate::MARKER.to_string(), "1".to_string()));
        }
        match self.zygote.launch(id, flag, stdin, stdout, &env)? {
            zygote::Ended::Exit(0) => Ok(()),
            ended => Err(io::Error::other(format!("the process starting it {ended}"))),
        }
    }

    /// Starts the keeper of isolated sandbox `id` and waits for its init to be ready; the init
    /// serves spawn requests on `spawner` (bound by the keeper when `None`). With the init,
    /// whether the mount of the sandbox's home names no host path.
    pub(super) fn start_isolated(
        &self,
        id: &str,
        spawner: Option<std::os::unix::net::UnixListener>,
    ) -> Result<(Init, bool), ProviderError> {
        let unavailable = |why: String| ProviderError::Unavailable(format!("could not start the isolated sandbox: {why}"));
        let (answer_read, answer_write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| unavailable(format!("could not make its keeper's answer pipe: {e}")))?;
        let stdin = match spawner {
            Some(listener) => OwnedFd::from(listener),
            None => null().map_err(|e| unavailable(e.to_string()))?.0,
        };
        // Our copy of the answer pipe's write end goes with the request: the answer's end is the
        // keeper's (and its stage's) exit.
        let started = self.launch_keeper(id, Some(START_INIT_FLAG), stdin, answer_write);
        let budget = init::START_BUDGET + Duration::from_secs(1);
        let answer = init::read_line_within(std::fs::File::from(answer_read), budget);
        if let (Err(err), init::Answer::Closed) = (&started, &answer) {
            return Err(unavailable(format!("could not start its keeper: {err}")));
        }
        match answer {
            init::Answer::Line(line) if line.split_whitespace().next() == Some("ready") => {
                let hidden = line.split_whitespace().nth(1) == Some(super::isolation::NO_HOST_PATHS);
                let init = Init::load(&self.dir(id)).ok_or_else(|| unavailable("its keeper did not record the init".into()))?;
                Ok((init, hidden))
            }
            init::Answer::Line(line) => Err(unavailable(line.strip_prefix("error ").unwrap_or(&line).to_string())),
            init::Answer::Closed => Err(unavailable("its keeper exited without answering".into())),
            init::Answer::TimedOut => Err(unavailable(format!("its keeper did not answer within {} s", budget.as_secs()))),
            init::Answer::Failed(why) => Err(unavailable(why)),
        }
    }
}

/// Two descriptors of `/dev/null`: a keeper's stdin and stdout where it needs neither.
fn null() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok((fs::File::open("/dev/null")?.into(), fs::File::options().write(true).open("/dev/null")?.into()))
}

/// Serves the egress proxy of sandbox `id` on `listener` (bound on the sandbox's loopback
/// interface) from this keeper, for as long as it lives: the policy is read from the sandbox's
/// metadata at each new connection; unreadable metadata means no egress (fail closed).
fn serve_egress(provider: &LocalProvider, id: &str, listener: std::net::TcpListener) {
    let meta_dir = provider.dir(id);
    let meta_file = meta_dir.join("meta.json");
    let policy = move || {
        fs::read(&meta_file)
            .ok()
            .and_then(|text| serde_json::from_slice::<super::Meta>(&text).ok())
            .map(|m| m.network())
            .unwrap_or_default()
    };
    let proxy = egress::proxy::Proxy::new(Box::new(policy), egress::blocks::BlockLog::new(&meta_dir), egress::Settings::from_env());
    if let Err(err) = egress::proxy::serve(listener, std::sync::Arc::new(proxy)) {
        log::warn!("keeper: could not serve the egress proxy of sandbox {id}: {err}; it has no network");
    }
}

fn keeper_alive(dir: &Path) -> bool {
    Init::read(&dir.join("keeper.pid")).is_some_and(|keeper| keeper.alive())
}

impl LocalProvider {
    /// Whether sandbox `id` has a running keeper.
    pub(super) fn keeper_alive(&self, id: &str) -> bool {
        keeper_alive(&self.dir(id))
    }
}

/// Runs the local provider's internal subcommand that `args` (the program's arguments, without
/// the program name) names, if any: today `keeper ROOT ID SHELL`, which the provider starts
/// detached from its own executable (`std::env::current_exe()`). Every program that runs a
/// `LocalProvider` (the server, and test tools that embed the provider) calls this first and
/// exits with its result when it is `Some`; `None` means the arguments are not an internal
/// subcommand. Internal subcommands need no configuration: they start with an empty environment.
pub fn run_internal(args: &[String]) -> Option<anyhow::Result<()>> {
    match args {
        [command, root, id, shell] if command == KEEPER_COMMAND => Some(run_keeper(Path::new(root), id, Path::new(shell), Start::Nothing)),
        [command, root, id, shell, flag] if command == KEEPER_COMMAND && flag == START_INIT_FLAG => {
            Some(run_keeper(Path::new(root), id, Path::new(shell), Start::Init))
        }
        [command, root, id, shell, flag] if command == KEEPER_COMMAND && flag == SPAWNER_FLAG => {
            Some(run_keeper(Path::new(root), id, Path::new(shell), Start::Spawner))
        }
        [command, rest @ ..] if command == init::SUBCOMMAND => Some(init::run(rest)),
        [command, rest @ ..] if command == zygote::SUBCOMMAND => Some(zygote::run(rest)),
        [command, rest @ ..] if command == landlock_spawner::SUBCOMMAND => Some(landlock_spawner::run(rest)),
        [command, rest @ ..] if command == seccomp::FILTER_SUBCOMMAND => Some(seccomp::run_filtered(rest)),
        _ => None,
    }
}

/// Forks: the parent, which the server started and waits for, exits at once; the child goes on
/// as the keeper, re-parented to init (or the nearest subreaper). This is a shell's `cmd &`
/// without the shell's start, which cost every create about a millisecond.
fn detach() -> io::Result<()> {
    // `run_internal` runs first in every program that embeds the provider, before anything
    // starts a thread: the keeper has one thread here (`fork` checks).
    match stage::fork()? {
        Some(_) => std::process::exit(0),
        None => Ok(()),
    }
}

/// What a keeper starts besides keeping its sandbox.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Start {
    /// Nothing new (a keeper restarted by a sweep, or of an unisolated sandbox).
    Nothing,
    /// The init of a new isolated sandbox, answering on stdout.
    Init,
    /// The spawner of a new Landlock-tier sandbox, whose listening socket is stdout.
    Spawner,
}

/// The body of `sandbox-mcp keeper ROOT ID SHELL [--start-init | --spawner-on-stdout]`: starts
/// the init of a new isolated sandbox when asked, keeps a Landlock-tier sandbox's spawner
/// running, and waits for the sandbox's expiry (honouring renewals) and kills it; exits early
/// when the sandbox is gone or another keeper owns it.
fn run_keeper(root: &Path, id: &str, shell: &Path, start: Start) -> anyhow::Result<()> {
    if let Err(err) = detach() {
        let why = format!("the keeper could not leave the server's process: {err}");
        let _ = writeln!(io::stdout(), "error {why}");
        anyhow::bail!("sandbox {id}: {why}");
    }
    let start_init = start == Start::Init;
    // The spawner's socket, taken off stdout before anything could write there.
    let mut handed = match start {
        Start::Spawner => {
            let listener = std::os::fd::AsFd::as_fd(&io::stdout()).try_clone_to_owned().map(std::os::unix::net::UnixListener::from)?;
            rustix::stdio::dup2_stdout(fs::File::options().write(true).open("/dev/null")?)?;
            Some(listener)
        }
        // The init's spawner socket, where the server bound it (stdin is a socket then).
        Start::Init if rustix::net::sockopt::socket_type(io::stdin()).is_ok() => {
            let listener = std::os::fd::AsFd::as_fd(&io::stdin()).try_clone_to_owned().map(std::os::unix::net::UnixListener::from)?;
            rustix::stdio::dup2_stdin(fs::File::open("/dev/null")?)?;
            Some(listener)
        }
        Start::Nothing | Start::Init => None,
    };
    // A session of its own, without the controlling terminal of whoever started the server: the
    // init and every sandbox process descend from here, and none may reach an operator's
    // terminal. (The keeper is never a group leader here: the process that forked it leads the
    // group.)
    if let Err(err) = rustix::process::setsid() {
        let why = format!("the keeper could not start a session of its own: {err}");
        let _ = writeln!(io::stdout(), "error {why}");
        anyhow::bail!("sandbox {id}: {why}");
    }
    check_local_id(id)?;
    let provider = LocalProvider::new(root, shell)?;
    let dir = provider.dir(id);
    let me = std::process::id();
    let start = process::proc_stat(me).map(|st| st.start).unwrap_or(0);
    if keeper_alive(&dir) || !dir.join("meta.json").exists() {
        return Ok(());
    }
    // A stale record goes; of two keepers starting at once only the one that creates it stays.
    let _ = fs::remove_file(dir.join("keeper.pid"));
    let claimed = fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(dir.join("keeper.pid"));
    let mut pid_file = match claimed {
        Ok(f) => f,
        Err(err) if err.kind() == io::ErrorKind::AlreadyExists => return Ok(()),
        Err(err) => return Err(err.into()),
    };
    pid_file.write_all(format!("{me} {start}\n").as_bytes())?;
    drop(pid_file);
    // Exposed ports live in the keeper, which outlives the servers (ready before the sandbox is
    // reported created); a restarted keeper listens again on what the one before it exposed.
    // Their thread starts after the init: the keeper forks the stage while it has one thread.
    let serve_relays = || {
        if provider.load(id).is_ok_and(|m| m.isolation == Isolation::Namespaces && !m.host_network) {
            super::ports::Relays::serve(&dir);
        }
    };
    // An isolated sandbox's init is started once, by its first keeper; a later keeper (restarted by
    // a sweep) never starts another: a sandbox whose init died stays gone.
    let mut holder = None;
    let mut answer = io::stdout();
    match provider.load(id) {
        Ok(meta) if start_init && meta.isolation == Isolation::Namespaces && Init::load(&dir).is_none() => {
            let started = provider.tools().map_err(|e| e.to_string()).and_then(|tools| {
                let home = provider.home(id);
                let cgroups = if meta.limits.cgroups() { cgroup::procs_files(id) } else { Vec::new() };
                let owner = meta.owner.unwrap_or_else(super::isolation::sandbox_owner);
                let scratch = meta.limits.disk_mb.is_some();
                let site = init::Site { home: &home, host_network: meta.host_network, shell, cgroups: &cgroups, owner, scratch };
                let listener = handed.take().or_else(|| spawner::bind(&dir));
                init::start(tools, &provider.exe, &site, listener).map_err(|e| e.0)
            });
            match started {
                Ok(started) => {
                    Init { pid: started.pid, start: started.start }.store(&dir)?;
                    holder = Some(started.holder);
                    if let Some(listener) = started.egress {
                        serve_egress(&provider, id, listener);
                    }
                    serve_relays();
                    let _ = match started.hidden {
                        true => writeln!(answer, "ready {}", super::isolation::NO_HOST_PATHS),
                        false => writeln!(answer, "ready"),
                    };
                }
                Err(why) => {
                    let _ = writeln!(answer, "error {why}");
                    anyhow::bail!("sandbox {id}: {why}");
                }
            }
        }
        _ => {
            serve_relays();
            let _ = writeln!(answer, "ready");
        }
    }
    let _ = answer.flush();
    // What the keeper knows without its files: the init, and the last expiry it read.
    let init = Init::load(&dir);
    let meta = provider.load(id).ok();
    let owned_by = meta.as_ref().and_then(|m| m.own_uid());
    let mut expires_at = meta.as_ref().map(|m| m.expires_at);
    let (home, tmp) = (provider.home(id), dir.join(super::TMP_DIR));
    let spawned = meta.as_ref().filter(|m| m.isolation == Isolation::Landlock && m.spawner);
    let cgroups = match spawned {
        Some(m) if m.limits.cgroups() => cgroup::procs_files(id),
        _ => Vec::new(),
    };
    let tools = || provider.tools().map_err(|e| anyhow::anyhow!("sandbox {id}: {e}"));
    // A root server's sandbox has a network namespace of its own, egress through its proxy.
    let net = match spawned {
        Some(m) if m.proxy => Some(tools()?),
        _ => None,
    };
    // A uid of its own that cannot pass the directories above its home goes through a passage.
    let passage = match spawned {
        Some(_) if owned_by.is_some() && passage::blocked_at(&dir).is_some() => Some(tools()?),
        _ => None,
    };
    let site =
        landlock_spawner::Site { id, home: &home, tmp: &tmp, shell, exe: &provider.exe, cgroups: &cgroups, uid: owned_by, net, passage };
    let mut keeping = spawned.map(|_| landlock_spawner::Keeping::new(&dir, handed));
    if keeping.is_some() {
        // What a command leaves behind when sandbox code killed the spawner above it comes here
        // (not to the host's init), where kill_sandbox finds it, and is reaped at each tick.
        if let Err(err) = rustix::process::set_child_subreaper(Some(rustix::process::getpid())) {
            log::warn!("keeper: sandbox {id}: could not become a subreaper: {err}");
        }
    }
    loop {
        if let Some(h) = holder.as_mut() {
            // The stage or `unshare` that forked the init exits with it; reap it.
            if let Ok(Some(_)) = h.try_wait() {
                holder = None;
            }
        }
        if !dir.exists() {
            // The state is gone (an operator cleaned the state root, a test removed its home):
            // the sandbox would live on out of every tool's reach. It ends here instead.
            log::info!("keeper: the state of sandbox {id} is gone; ending it");
            end_without_state(&provider, id, init, owned_by);
            return Ok(());
        }
        match provider.load(id) {
            Ok(meta) => expires_at = Some(meta.expires_at),
            Err(ProviderError::NotFound { .. }) => {
                // Metadata gone but the directory still there: a kill was interrupted (a server
                // exiting mid-kill). Finish it rather than leave tagged processes behind.
                provider.kill(id, Instant::now() + KILL_SCAN_BUDGET)?;
                return Ok(());
            }
            // Unreadable for now: the last expiry read still holds.
            Err(_) => {}
        }
        if replaced(fs::read_to_string(dir.join("keeper.pid")), me) {
            return Ok(());
        }
        if expires_at.is_none_or(|at| at - unix_now() <= 0) {
            log::info!("keeper: sandbox {id} expired");
            if provider.kill(id, Instant::now() + KILL_SCAN_BUDGET).is_err() {
                end_without_state(&provider, id, init, owned_by);
            }
            return Ok(());
        }
        if let Some(keeping) = keeping.as_mut() {
            while let Ok(Some(_)) = rustix::process::wait(rustix::process::WaitOptions::NOHANG) {}
            match keeping.tend(&site) {
                Ok(Some(egress)) => serve_egress(&provider, id, egress),
                Ok(None) => {}
                Err(why) => log::warn!("keeper: sandbox {id}: {why}"),
            }
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Ends sandbox `id` from what its keeper holds in memory: its init (the kernel ends the rest),
/// or, on the host, every process tagged with its id or running as its own uid.
fn end_without_state(provider: &LocalProvider, id: &str, init: Option<Init>, owned_by: Option<u32>) {
    match init {
        Some(init) => {
            provider.signal_init(id, init);
        }
        None => {
            provider.kill_tagged(id, owned_by, Instant::now() + KILL_SCAN_BUDGET);
        }
    }
    cgroup::remove(id, Instant::now() + KILL_SCAN_BUDGET);
}

/// Whether another keeper took this one's place, from what reading its `keeper.pid` gave: only a
/// file that names another process says so. A file that is gone says nothing (a kill is under
/// way and ends this keeper anyway), and neither does a failed read: a keeper that gave up on a
/// passing error (no descriptor left, say) would leave its sandbox without a proxy, port relays
/// or an end at its expiry.
fn replaced(read: io::Result<String>, me: u32) -> bool {
    read.is_ok_and(|text| !text.starts_with(&format!("{me} ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_pid_file_naming_another_keeper_ends_this_one() {
        assert!(!replaced(Ok("42 123\n".into()), 42));
        assert!(replaced(Ok("43 123\n".into()), 42));
        assert!(replaced(Ok(String::new()), 42));
        assert!(!replaced(Err(io::Error::from_raw_os_error(libc::EMFILE)), 42));
        assert!(!replaced(Err(io::ErrorKind::NotFound.into()), 42));
    }
}
