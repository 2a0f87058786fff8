//! The keeper and the sweep: a detached process (`sandbox-mcp keeper`) per sandbox that starts
//! the init of an isolated sandbox and ends the sandbox at expiry even when no server runs, and
//! the sweep that ends expired sandboxes and restarts missing keepers at server start.

use super::isolation::enter::Init;
use super::isolation::{cgroup, init, spawner, Isolation};
use super::{check_local_id, LocalProvider, CREATING_PREFIX, KILL_SCAN_BUDGET};
use crate::egress;
use crate::provider::process;
use crate::provider::{unix_now, Provider, ProviderError};
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The internal subcommand that runs a sandbox's keeper (see [`run_internal`]).
const KEEPER_COMMAND: &str = "keeper";

/// The keeper's flag that makes it start the init of a new isolated sandbox (only `create` passes
/// it: a keeper restarted by a sweep never starts an init).
const START_INIT_FLAG: &str = "--start-init";

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
                    let _ = fs::remove_dir_all(entry.path());
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
        if let Err(err) = self.keeper_command(id, false).status() {
            log::warn!("could not start the keeper of sandbox {id}: {err}; it ends at the next server start after expiry");
        }
    }

    /// The command that starts the keeper of `id` detached. The intermediate shell exits at once,
    /// so the keeper is re-parented to init (no zombie under a long-running server) and sits in
    /// its own process group, out of reach of group signals aimed at the server (the Python SDK
    /// signals the server's whole group). With `answer`, the keeper's stdout is a pipe to the
    /// caller, on which it says whether the sandbox's init started (`ready` or `error ...`).
    pub(super) fn keeper_command(&self, id: &str, answer: bool) -> Command {
        let script = if answer { r#""$@" </dev/null 2>/dev/null &"# } else { r#""$@" </dev/null >/dev/null 2>&1 &"# };
        let mut cmd = Command::new(&self.shell);
        cmd.args(["-c", script, "sh"])
            .arg(&self.exe)
            .arg(KEEPER_COMMAND)
            .arg(&self.root)
            .arg(id)
            .arg(&self.shell)
            .args(answer.then_some(START_INIT_FLAG))
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()))
            .envs(self.egress.to_env())
            .stdin(Stdio::null())
            .stdout(if answer { Stdio::piped() } else { Stdio::null() })
            .stderr(Stdio::null())
            .process_group(0);
        cmd
    }

    /// Starts the keeper of isolated sandbox `id` and waits for its init to be ready.
    pub(super) fn start_isolated(&self, id: &str) -> Result<Init, ProviderError> {
        let unavailable = |why: String| ProviderError::Unavailable(format!("could not start the isolated sandbox: {why}"));
        let mut child = self.keeper_command(id, true).spawn().map_err(|e| unavailable(format!("could not start its keeper: {e}")))?;
        let budget = init::START_BUDGET + Duration::from_secs(1);
        let answer = match child.stdout.take() {
            Some(out) => init::read_line_within(out, budget),
            None => init::Answer::Failed("its keeper's answer pipe is missing".into()),
        };
        let _ = child.wait();
        match answer {
            init::Answer::Line(line) if line == "ready" => {
                Init::load(&self.dir(id)).ok_or_else(|| unavailable("its keeper did not record the init".into()))
            }
            init::Answer::Line(line) => Err(unavailable(line.strip_prefix("error ").unwrap_or(&line).to_string())),
            init::Answer::Closed => Err(unavailable("its keeper exited without answering".into())),
            init::Answer::TimedOut => Err(unavailable(format!("its keeper did not answer within {} s", budget.as_secs()))),
            init::Answer::Failed(why) => Err(unavailable(why)),
        }
    }
}

/// Binds the spawner's socket in sandbox directory `dir` for a new init; `None` (commands then
/// enter with nsenter) when it cannot be bound, for instance when the path is too long for a
/// socket address.
fn bind_spawner(dir: &Path) -> Option<std::os::unix::net::UnixListener> {
    let path = dir.join(spawner::SOCKET_FILE);
    let _ = fs::remove_file(&path);
    let bound = std::os::unix::net::UnixListener::bind(&path)
        .and_then(|listener| fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).map(|()| listener));
    match bound {
        Ok(listener) => Some(listener),
        Err(err) => {
            log::warn!("could not bind {}: {err}; commands in this sandbox enter it with nsenter", path.display());
            None
        }
    }
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

/// Runs the local provider's internal subcommand that `args` (the program's arguments, without
/// the program name) names, if any: today `keeper ROOT ID SHELL`, which the provider starts
/// detached from its own executable (`std::env::current_exe()`). Every program that runs a
/// `LocalProvider` (the server, and test tools that embed the provider) calls this first and
/// exits with its result when it is `Some`; `None` means the arguments are not an internal
/// subcommand. Internal subcommands need no configuration: they start with an empty environment.
pub fn run_internal(args: &[String]) -> Option<anyhow::Result<()>> {
    match args {
        [command, root, id, shell] if command == KEEPER_COMMAND => Some(run_keeper(Path::new(root), id, Path::new(shell), false)),
        [command, root, id, shell, flag] if command == KEEPER_COMMAND && flag == START_INIT_FLAG => {
            Some(run_keeper(Path::new(root), id, Path::new(shell), true))
        }
        [command, rest @ ..] if command == init::SUBCOMMAND => Some(init::run(rest)),
        [command, rest @ ..] if command == init::STAGE_SUBCOMMAND => Some(init::run_stage(rest)),
        _ => None,
    }
}

/// The body of `sandbox-mcp keeper ROOT ID SHELL [--start-init]`: starts the init of a new
/// isolated sandbox when asked, then waits for the sandbox's expiry (honouring renewals) and
/// kills it; exits early when the sandbox is gone or another keeper owns it.
fn run_keeper(root: &Path, id: &str, shell: &Path, start_init: bool) -> anyhow::Result<()> {
    // A session of its own, without the controlling terminal of whoever started the server: the
    // init and every sandbox process descend from here, and none may reach an operator's
    // terminal. (The keeper is never a group leader here: its starting shell leads the group.)
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
    if provider.load(id).is_ok_and(|m| m.isolation == Isolation::Namespaces && !m.host_network) {
        super::ports::Relays::serve(&dir);
    }
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
                init::start(tools, &provider.exe, &site, bind_spawner(&dir)).map_err(|e| e.0)
            });
            match started {
                Ok(started) => {
                    Init { pid: started.pid, start: started.start }.store(&dir)?;
                    holder = Some(started.holder);
                    if let Some(listener) = started.egress {
                        serve_egress(&provider, id, listener);
                    }
                    let _ = writeln!(answer, "ready");
                }
                Err(why) => {
                    let _ = writeln!(answer, "error {why}");
                    anyhow::bail!("sandbox {id}: {why}");
                }
            }
        }
        _ => {
            let _ = writeln!(answer, "ready");
        }
    }
    let _ = answer.flush();
    // What the keeper knows without its files: the init, and the last expiry it read.
    let init = Init::load(&dir);
    let owned_by = provider.load(id).ok().and_then(|m| m.own_uid());
    let mut expires_at = provider.load(id).map(|m| m.expires_at).ok();
    loop {
        if let Some(h) = holder.as_mut() {
            // The `unshare` that forked the init exits with it; reap it.
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
        let mine = fs::read_to_string(dir.join("keeper.pid")).map(|t| t.starts_with(&format!("{me} "))).unwrap_or(false);
        if !mine && dir.join("keeper.pid").exists() {
            return Ok(());
        }
        if expires_at.is_none_or(|at| at - unix_now() <= 0) {
            log::info!("keeper: sandbox {id} expired");
            if provider.kill(id, Instant::now() + KILL_SCAN_BUDGET).is_err() {
                end_without_state(&provider, id, init, owned_by);
            }
            return Ok(());
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
