//! The local provider: a sandbox is a directory under the state root plus its processes. It
//! needs nothing but the host.
//!
//! Each sandbox is isolated one of two ways, fixed at creation and recorded in its metadata:
//! - **namespaces** ([`isolation`]): its own user, mount, pid, ipc and uts namespaces
//!   (network unless it asked for the host's), a read-only view of the host's system
//!   directories, its home read-write, private `/tmp`, `/proc` and `/dev`, held by an init
//!   process, which starts every command and snippet on request (its spawner; `nsenter` for
//!   sandboxes made before it), and file tools resolve paths inside its root;
//! - **none**: commands run on the host as the server's user, tagged with the sandbox id, and
//!   file tools are confined to the sandbox home (SECURITY.md says what this does not isolate).
//!
//! Layout: `<root>/sandboxes/<id>/meta.json` (0600, written by temp file + rename),
//! `<root>/sandboxes/<id>/home/` (the sandbox's home: `HOME` and default cwd), `keeper.pid` and,
//! with namespaces, `init.pid` and `spawn.sock` (the init's spawner); with `limits.disk_mb`,
//! `disk.img`, the file system mounted at the home ([`isolation::disk`]). A detached keeper process (`sandbox-mcp keeper`) starts the init
//! of an isolated sandbox and ends the sandbox at expiry even when no server runs.
//!
//! One file per part: this one is the [`Provider`] impl and what the parts share;
//! `metadata.rs` the on-disk record of a sandbox ([`Meta`]); `keeper.rs` the detached keeper,
//! the sweep and the internal subcommands ([`run_internal`]); `zygote.rs` the process of one
//! thread that forks each new keeper for the server; `launch.rs` how a command starts in
//! a sandbox and runs; `handover.rs` the hand-over of a running command to the task supervisor;
//! `scan.rs` the processes of an unisolated sandbox ([`tagged_pids`]); `host_files.rs` the file
//! tools of an unisolated sandbox; `input.rs` the writer of a task's input channel;
//! [`isolation`] namespace isolation.

mod handover;
mod host_files;
mod input;
pub mod isolation;
mod keeper;
mod launch;
mod metadata;
pub mod ports;
mod removal;
mod scan;
mod uid_claim;
mod zygote;

pub use host_files::resolve_inside;
pub use keeper::run_internal;
pub use metadata::Meta;
pub use scan::tagged_pids;

use crate::egress::Network;
use crate::ids;
use crate::mask::Masker;
use crate::provider::process::{self, Running};
use crate::provider::{
    unix_now, CreateRequest, DirEntry, ExecEnd, ExecOutput, ExecRequest, Exposed, Input, InputError, Limits, LongCommands, Provider,
    ProviderError, SandboxInfo, Touch,
};
use isolation::enter::Init;
use isolation::files::{self as sandbox_files, SandboxFs};
use isolation::uids::UidRange;
use isolation::{cgroup, disk, rootfs, Isolation, Tools};
use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Prefix of every local sandbox id; the rest is 24 lowercase hex characters.
pub const ID_PREFIX: &str = "local-";

/// Name prefix of a sandbox directory being built by `create` (renamed into place when complete).
const CREATING_PREFIX: &str = ".creating-";

/// A Landlock-tier sandbox's own temporary directory (`TMPDIR`), beside its home.
pub(super) const TMP_DIR: &str = "tmp";

/// The lock file that orders creates against the cap on live sandboxes, in the state root.
const CREATE_LOCK: &str = "create.lock";

/// Environment variable carried by every process of a sandbox (value: the sandbox id).
pub const TAG_VAR: &str = "SANDBOX_MCP_SANDBOX";

/// Environment variable carried by every process of a task (value: the task id); a promotable
/// run_command carries it from its start.
pub const TASK_TAG_VAR: &str = "SANDBOX_MCP_TASK";

/// Host variables passed through to sandbox commands; nothing else of the server's environment is.
const ALLOWED_ENV: &[&str] = &["PATH", "LANG", "TERM", "TZ"];

/// Templates the local provider knows.
const TEMPLATES: &[&str] = &["base"];

/// How long `kill` keeps scanning for tagged processes before giving up.
const KILL_SCAN_BUDGET: Duration = Duration::from_secs(3);

/// The local provider.
pub struct LocalProvider {
    root: PathBuf,
    /// The POSIX shell of the supervisor snippets and the provider's own scripts.
    shell: PathBuf,
    /// What run_command and start_task run commands with: bash where the host (whose system
    /// directories every sandbox shows) has it, else `shell`.
    command_shell: PathBuf,
    /// The program started as the keeper (this binary).
    exe: PathBuf,
    /// The process that forks new keepers, started on first use.
    zygote: zygote::Zygote,
    inherited_env: Vec<(String, String)>,
    running: Running,
    /// How new sandboxes are isolated.
    isolation: Isolation,
    /// The util-linux programs isolated sandboxes need, when this host has them.
    tools: Option<Tools>,
    /// How many live sandboxes the state root may hold; `None`: no cap.
    max_sandboxes: Option<usize>,
    /// Limits of a sandbox whose request sets none, where the host can enforce them.
    default_limits: Limits,
    /// Where the host uid of each new isolated sandbox comes from when the server is root;
    /// `None`: the one [`isolation::SANDBOX_UID`].
    uid_range: Option<UidRange>,
    /// What the operator decided for every sandbox's egress proxy.
    egress: crate::egress::Settings,
    /// Why sandboxes cannot be created (`--isolation auto` on a host with no isolation).
    refusal: Option<String>,
    /// The host address exposed ports listen on.
    expose_address: std::net::IpAddr,
    /// Whether Landlock-tier sandboxes get a network namespace of their own (found once).
    landlock_network: std::sync::OnceLock<Result<(), String>>,
    /// The task tag ([`TASK_TAG_VAR`]) of the shell each sandbox's spawner keeps waiting for the
    /// next command (see `isolation::warm_shell`), as this server asked for it: the next
    /// `run_command` into the sandbox takes it, so that its environment is the waiting shell's.
    next_tags: std::sync::Mutex<std::collections::HashMap<String, String>>,
}

impl LocalProvider {
    /// Opens (creating if needed) the state root and sweeps expired sandboxes.
    pub fn new(root: &Path, shell: &Path) -> Result<LocalProvider, ProviderError> {
        let sandboxes = root.join("sandboxes");
        fs::DirBuilder::new().recursive(true).mode(0o700).create(&sandboxes).map_err(|err| {
            ProviderError::Unavailable(format!(
                "cannot create the local state root {}: {err}; set SANDBOX_MCP_HOME to a writable directory",
                sandboxes.display()
            ))
        })?;
        // A directory that already existed keeps its mode: make it private (it names every
        // sandbox and holds their metadata, envs included); this fails when it is someone else's.
        // 0711 (passable, not listable) is kept: a root server's Landlock-tier sandboxes pass
        // through it to their homes.
        let passable = fs::metadata(&sandboxes).is_ok_and(|m| m.permissions().mode() & 0o777 == 0o711);
        fs::set_permissions(&sandboxes, fs::Permissions::from_mode(if passable { 0o711 } else { 0o700 })).map_err(|err| {
            ProviderError::Unavailable(format!(
                "cannot make the local state root {} private (mode 0700): {err}; set SANDBOX_MCP_HOME to a directory of your own",
                sandboxes.display()
            ))
        })?;
        if !process::is_executable(shell) {
            return Err(ProviderError::Unavailable(format!(
                "the local shell {} is not an executable file; set SANDBOX_MCP_LOCAL_SH",
                shell.display()
            )));
        }
        let exe = std::env::current_exe()
            .map_err(|err| ProviderError::Unavailable(format!("cannot find this program's own path for the keeper: {err}")))?;
        let inherited_env = ALLOWED_ENV.iter().filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v))).collect::<Vec<_>>();
        let provider = LocalProvider {
            zygote: zygote::Zygote::new(&exe, root, shell),
            root: root.to_path_buf(),
            shell: shell.to_path_buf(),
            command_shell: command_shell(shell),
            exe,
            inherited_env,
            running: Running::default(),
            isolation: Isolation::None,
            tools: isolation::tools().ok(),
            max_sandboxes: None,
            default_limits: Limits::default(),
            uid_range: None,
            egress: crate::egress::Settings::default(),
            refusal: None,
            expose_address: std::net::IpAddr::from([127, 0, 0, 1]),
            landlock_network: std::sync::OnceLock::new(),
            next_tags: Default::default(),
        };
        Ok(provider)
    }

    /// Caps the live sandboxes of the state root at `max` (counting those other server processes
    /// sharing it created), and gives a sandbox whose request sets no limits `defaults` where the
    /// host can enforce them (elsewhere it gets none, as before).
    pub fn with_policy(mut self, max: usize, defaults: Limits) -> LocalProvider {
        self.max_sandboxes = Some(max);
        self.default_limits = defaults;
        self
    }

    /// Whether this server's isolated sandboxes have an egress proxy (a network they can change).
    fn has_proxies(&self) -> bool {
        match self.isolation {
            Isolation::Namespaces => true,
            Isolation::Landlock => self.landlock_network().is_ok(),
            Isolation::None => false,
        }
    }

    /// Whether this server can give a Landlock-tier sandbox a network namespace of its own (the
    /// egress proxy's only way out), or why not: it must be root (of its user namespace) and
    /// `unshare --net` must work. Found once.
    fn landlock_network(&self) -> Result<(), String> {
        self.landlock_network
            .get_or_init(|| {
                if !rustix::process::getuid().is_root() {
                    return Err("the server does not run as root, and only root makes a network namespace without a user namespace".into());
                }
                let tools = self.tools().map_err(|e| e.to_string())?;
                let made = std::process::Command::new(&tools.unshare)
                    .args(["--net", "true"])
                    .stdin(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .status();
                match made {
                    Ok(status) if status.success() => Ok(()),
                    Ok(status) => Err(format!("`unshare --net true` failed here ({status})")),
                    Err(err) => Err(format!("`unshare --net` could not run: {err}")),
                }
            })
            .clone()
    }

    /// Gives each new isolated sandbox a host uid of its own from `range` when the server runs
    /// as root (elsewhere sandboxes have the server's uid); fails when the range is not free on
    /// this host (see [`UidRange::check_free`]). A Landlock-tier sandbox gets one only where the
    /// range is mapped here (a user namespace may map root alone) and its uid can reach its home:
    /// every directory above the state root lets others pass, or `unshare` can give its spawner
    /// a passage; else it runs as the server's uid and its layers do not name `uid`.
    pub fn with_uid_range(mut self, range: UidRange) -> Result<LocalProvider, ProviderError> {
        if !rustix::process::getuid().is_root() {
            return Ok(self);
        }
        let usable = match self.isolation {
            Isolation::Namespaces => true,
            Isolation::Landlock => {
                let mapped = fs::read_to_string("/proc/self/uid_map").unwrap_or_default().lines().any(|l| {
                    let n: Vec<u64> = l.split_whitespace().filter_map(|x| x.parse().ok()).collect();
                    n.len() == 3 && n[0] <= u64::from(range.first) && u64::from(range.last) < n[0] + n[2]
                });
                // Where a directory above the state root lets no other uid pass (it lies under
                // `/root`, say), each spawner opens a passage to its home in a mount namespace of
                // its own (see `isolation::passage`), which needs `unshare`.
                let blocked = isolation::passage::blocked_at(&self.root.join("sandboxes"));
                let reachable = blocked.is_none() || self.tools.is_some();
                if !mapped {
                    log::info!(
                        "landlock sandboxes run as the server's uid: uids {}-{} are not mapped in this user namespace (/proc/self/uid_map)",
                        range.first,
                        range.last
                    );
                } else if !reachable {
                    log::info!(
                        "landlock sandboxes run as the server's uid: {} lets no other uid pass and util-linux unshare, which would open a passage to the homes, was not found",
                        blocked.unwrap_or_default().display()
                    );
                }
                mapped && reachable
            }
            Isolation::None => false,
        };
        if usable {
            range.check_free().map_err(ProviderError::Unavailable)?;
            self.uid_range = Some(range);
        }
        Ok(self)
    }

    /// The host uid and gid of new sandbox `id`'s root: one of its own from the range (the
    /// server is root), else the server's own (namespaces: mapped to root inside; landlock: none
    /// recorded). Called with the creation lock held (with the cap on). A picked uid is also
    /// claimed host-wide, so servers of other state roots sharing the range never take it.
    fn new_owner(&self, id: &str, isolation: Isolation) -> Result<Option<(u32, u32)>, ProviderError> {
        let Some(range) = self.uid_range.filter(|_| isolation != Isolation::None) else {
            return Ok((isolation == Isolation::Namespaces).then(isolation::sandbox_owner));
        };
        let mut taken: std::collections::HashSet<u32> = fs::read_dir(self.root.join("sandboxes"))
            .map(|dir| {
                dir.flatten()
                    .filter_map(|e| self.load(&e.file_name().to_string_lossy()).ok())
                    .filter_map(|meta| meta.owner.map(|(uid, _)| uid))
                    .collect()
            })
            .unwrap_or_default();
        let dir = self.dir(id);
        // A claim refused (another state root holds the uid) marks it taken; a few tries.
        for _ in 0..8 {
            let Some(uid) = range.pick(&taken) else { break };
            if uid_claim::claim(uid, &dir) {
                return Ok(Some((uid, uid)));
            }
            taken.insert(uid);
        }
        Err(ProviderError::Rejected(format!(
            "no free uid in the sandbox uid range {}-{} (--uid-range): live sandboxes hold them; end a sandbox with kill_sandbox, or give the server a larger range",
            range.first, range.last
        )))
    }

    /// The limits a new sandbox gets for a request asking `asked`: the default cgroup limits
    /// when it asks for neither `memory_mb` nor `processes` (where cgroups work), and the default
    /// `disk_mb` when it asks for none (where a disk can be made).
    fn limits_for(&self, asked: Limits) -> Limits {
        static ENFORCEABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let mut limits = asked;
        let defaults = self.default_limits;
        if !asked.cgroups() && defaults.cgroups() && *ENFORCEABLE.get_or_init(|| cgroup::check().is_ok()) {
            limits.memory_mb = defaults.memory_mb;
            limits.processes = defaults.processes;
        }
        if asked.disk_mb.is_none() && defaults.disk_mb.is_some() && disk::check(self.isolation).is_ok() {
            limits.disk_mb = defaults.disk_mb;
        }
        limits
    }

    /// Holds the state root's creation lock and checks the cap on live sandboxes; the slot is
    /// the new sandbox's once its directory is in place (the lock goes with the returned file).
    fn reserve_slot(&self) -> Result<Option<fs::File>, ProviderError> {
        let Some(max) = self.max_sandboxes else { return Ok(None) };
        let sandboxes = self.root.join("sandboxes");
        let unavailable =
            |err: io::Error| ProviderError::Unavailable(format!("cannot lock the local state root {}: {err}", sandboxes.display()));
        let lock = fs::OpenOptions::new().create(true).append(true).mode(0o600).open(self.root.join(CREATE_LOCK)).map_err(unavailable)?;
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive).map_err(|e| unavailable(e.into()))?;
        let live = fs::read_dir(&sandboxes)
            .map_err(unavailable)?
            .flatten()
            .filter(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                check_local_id(&name).is_ok() || name.starts_with(CREATING_PREFIX)
            })
            .count();
        if live >= max {
            return Err(ProviderError::Rejected(format!(
                "this server allows at most {max} live sandboxes (--max-sandboxes) and {live} exist; end one with kill_sandbox (or wait for one to expire), then create again"
            )));
        }
        Ok(Some(lock))
    }

    /// Gives the egress proxies of new sandboxes (and keepers restarted by a sweep) `settings`.
    pub fn with_egress(mut self, settings: crate::egress::Settings) -> LocalProvider {
        self.egress = settings;
        self
    }

    /// Makes exposed ports listen on `address` of the host (loopback by default).
    pub fn with_expose_address(mut self, address: std::net::IpAddr) -> LocalProvider {
        self.expose_address = address;
        self
    }

    /// Makes new sandboxes isolated as `isolation` says (existing ones keep their own way).
    pub fn with_isolation(mut self, isolation: Isolation) -> Result<LocalProvider, ProviderError> {
        if isolation == Isolation::Namespaces {
            let tools = isolation::tools().map_err(|e| ProviderError::Unavailable(e.0))?;
            self.tools = Some(tools);
        }
        if isolation == Isolation::Landlock && rustix::process::getuid().is_root() {
            // Sandboxes of their own uid reach their homes through the state root: it may be
            // passed through (mode 0711), never listed; each sandbox's directory is its own.
            let _ = fs::set_permissions(self.root.join("sandboxes"), fs::Permissions::from_mode(0o711));
        }
        self.isolation = isolation;
        Ok(self)
    }

    /// Refuses every `create_sandbox` with `why` (a sentence naming the reason and the fix):
    /// `--isolation auto` on a host that allows no isolation.
    pub fn refusing(mut self, why: String) -> LocalProvider {
        self.refusal = Some(why);
        self
    }

    /// How new sandboxes are isolated.
    pub fn isolation(&self) -> Isolation {
        self.isolation
    }

    /// Where live sandbox `id`'s own file tree is reachable from the host, and its home inside
    /// that tree: `/` and the host home without isolation; `/proc/<init>/root` and `/home/user`
    /// with it (then every path below the first must be resolved within it, as the file tools do:
    /// an absolute symbolic link inside points at the sandbox's root, not the host's).
    pub fn file_tree(&self, id: &str) -> Result<(PathBuf, PathBuf), ProviderError> {
        match self.reach_with_init(id, Touch::Observe)? {
            (_, Some(init)) => Ok((init.root_path(), PathBuf::from(rootfs::HOME))),
            (_, None) => Ok((PathBuf::from("/"), self.home(id))),
        }
    }

    fn tools(&self) -> Result<&Tools, ProviderError> {
        self.tools.as_ref().ok_or_else(|| {
            ProviderError::Unavailable(
                "this sandbox is isolated with namespaces, and util-linux unshare and nsenter were not found on PATH; install util-linux"
                    .into(),
            )
        })
    }

    /// The init of isolated sandbox `id`, checked to be still running.
    fn live_init(&self, id: &str) -> Result<Init, ProviderError> {
        match Init::load(&self.dir(id)) {
            Some(init) if init.alive() => Ok(init),
            _ => Err(sandbox_files::init_gone(id)),
        }
    }

    /// The file system of isolated sandbox `id`, reached as `reach_with_init` found it.
    /// A Landlock-tier sandbox's home as a [`SandboxFs`], and `path` as a path in it (checked
    /// lexically here for a clear refusal; the kernel keeps every lookup inside).
    fn home_fs(&self, id: &str, meta: &Meta, path: &str) -> Result<(SandboxFs, String), ProviderError> {
        let home = self.home(id);
        let full = host_files::resolve_inside(&home, path)?;
        let inside = format!("/{}", full.strip_prefix(&home).map(|p| p.to_string_lossy().into_owned()).unwrap_or_default());
        let server = (rustix::process::getuid().as_raw(), rustix::process::getgid().as_raw());
        Ok((SandboxFs::home(&home, meta.owner.unwrap_or(server))?, inside))
    }

    fn sandbox_fs(id: &str, meta: &Meta, init: Init) -> Result<SandboxFs, ProviderError> {
        SandboxFs::open(id, init, meta.owner.unwrap_or_else(isolation::sandbox_owner))
    }

    /// Loads a live sandbox, renewing its TTL when asked; an expired one is killed and reported gone.
    fn reach(&self, id: &str, touch: Touch) -> Result<Meta, ProviderError> {
        self.reach_with_init(id, touch).map(|(meta, _)| meta)
    }

    /// [`LocalProvider::reach`], also giving an isolated sandbox's init, checked to be running.
    fn reach_with_init(&self, id: &str, touch: Touch) -> Result<(Meta, Option<Init>), ProviderError> {
        check_local_id(id)?;
        let mut meta = self.load(id)?;
        let now = unix_now();
        if meta.expires_at <= now {
            let _ = self.kill(id, Instant::now() + KILL_SCAN_BUDGET);
            return Err(ProviderError::NotFound { id: id.into() });
        }
        let init = match meta.isolation {
            Isolation::Namespaces => Some(self.live_init(id)?),
            Isolation::Landlock | Isolation::None => None,
        };
        if touch == Touch::Renew {
            let renewed = now + meta.timeout as i64;
            if renewed > meta.expires_at {
                meta.expires_at = renewed;
                self.store(&meta)?;
            }
        }
        Ok((meta, init))
    }

    /// Sends SIGKILL to the init of isolated sandbox `id` (the kernel then ends every process of
    /// its pid namespace). Returns 1 when it was running, else 0.
    pub(super) fn signal_init(&self, id: &str, init: Init) -> usize {
        if !init.alive() {
            return 0;
        }
        if let Err(err) = process::signal_pids(&self.shell, "KILL", &[init.pid]) {
            log::warn!("could not run {} to kill the init of sandbox {id}: {err}", self.shell.display());
        }
        1
    }
}

impl LocalProvider {
    /// One request to the keeper's port relays of isolated sandbox `id`.
    fn ports_request(&self, id: &str, line: &str, deadline: Instant) -> Result<String, ProviderError> {
        ports::request(&self.dir(id), line, deadline).map_err(|err| {
            ProviderError::Unavailable(format!(
                "could not reach the port relay of sandbox {id} ({err}); its keeper may be restarting: retry in a few seconds, \
or recreate the sandbox if it was made by an older version"
            ))
        })
    }
}

/// A keeper's `error ...` answer (or an answer that is not one) as a tool error.
fn ports_error(id: &str, answer: &str) -> ProviderError {
    match answer.strip_prefix("error ") {
        Some(why) if why.contains("nothing listens") => ProviderError::Rejected(format!(
            "{why}; start the server first (listening on 127.0.0.1 or 0.0.0.0 inside {id}), then call expose_port again"
        )),
        Some(why) => ProviderError::Rejected(why.chars().take(300).collect()),
        None => ProviderError::Unavailable(format!("the port relay of sandbox {id} gave no answer; retry")),
    }
}

/// The limits of a create request, as a tool error names them.
fn describe_limits(limits: &Limits) -> String {
    let parts: Vec<String> = [("memory_mb", limits.memory_mb), ("processes", limits.processes), ("disk_mb", limits.disk_mb)]
        .iter()
        .filter_map(|(name, v)| v.map(|v| format!("{name}: {v}")))
        .collect();
    format!("limits {{{}}}", parts.join(", "))
}

/// The shell of commands: bash, as on E2B, so that `[[ ]]` and `{a,b}` mean the same on both
/// providers; `posix` where bash is missing. Not a login shell: `/etc/profile` would replace the
/// sandbox's PATH with the host's.
fn command_shell(posix: &Path) -> PathBuf {
    ["/bin/bash", "/usr/bin/bash"].iter().map(PathBuf::from).find(|p| process::is_executable(p)).unwrap_or_else(|| posix.to_path_buf())
}

/// What the model should know about a local sandbox of isolation `tier`; `own_uid`: whether it
/// has a host uid of its own.
fn about(tier: &str, network: &Network, own_uid: bool, proxy: bool) -> String {
    let identity = if own_uid {
        "It has a host uid of its own."
    } else {
        "It shares the server's host uid with the server's other sandboxes (per-user limits such as processes and inotify watches are shared)."
    };
    let network = match (network, tier) {
        (_, "none") => "It reaches the outside network.",
        (_, _) if !proxy => "It has no network: TCP connect and bind and UDP are refused.",
        (Network::Off, _) => "It has no outside network (set_network with true or an allow list of domains enables downloads).",
        (Network::Any, _) => {
            "Its network reaches public destinations through its egress proxy (HTTP_PROXY, HTTPS_PROXY and ALL_PROXY are set; \
pip, npm, git and curl use them; a program that ignores them gets no connection); never the host or private addresses."
        }
        (Network::Rules(_), _) => {
            "Its network reaches only the domains its policy allows, through its egress proxy (HTTP_PROXY, HTTPS_PROXY and ALL_PROXY \
are set); a refused connection is answered 403 and listed as network_blocked in the command's result."
        }
    };
    match tier {
        "namespaces" => format!(
            "An isolated Linux sandbox: the host's system directories (/usr, /bin, /lib, /opt) are read-only; write in the home \
directory /home/user (the default working directory) and /tmp. {network} System packages cannot be installed; install Python \
packages into a virtual environment (python3 -m venv ~/venv && ~/venv/bin/pip install NAME) and others under the home directory. \
{identity}"
        ),
        "landlock" => format!(
            "A Linux sandbox confined by Landlock: commands see the host's file system but may read only its system directories \
(/usr, /bin, /lib, /opt, parts of /etc) and read and write only the home directory (the default working directory, $HOME) and \
$TMPDIR (use it instead of /tmp). {network} System packages cannot be installed; \
install Python packages into a virtual environment (python3 -m venv ~/venv) and others under the home directory. {identity}"
        ),
        _ => format!(
            "Commands run on the host as the server's user, without isolation; the file tools are confined to the sandbox's home \
directory (the default working directory). {network} Install packages under the home directory (for Python: python3 -m venv)."
        ),
    }
}

/// Checks the form of a local sandbox id.
pub fn check_local_id(id: &str) -> Result<(), ProviderError> {
    let hex = id.strip_prefix(ID_PREFIX).unwrap_or("");
    if hex.len() == 24 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Ok(());
    }
    let reason = if !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric()) {
        "this looks like another provider's sandbox id (E2B ids are plain letters and digits); this server runs the local provider, whose ids look like local-0123456789abcdef01234567. Use a sandbox created by this server, or start the server with --provider e2b".to_string()
    } else {
        "local sandbox ids look like local-0123456789abcdef01234567; use the sandbox_id returned by create_sandbox".to_string()
    };
    Err(ProviderError::InvalidId { id: id.chars().take(80).collect(), reason })
}

impl Provider for LocalProvider {
    fn name(&self) -> &'static str {
        "local"
    }

    fn check_id(&self, sandbox_id: &str) -> Result<(), ProviderError> {
        check_local_id(sandbox_id)
    }

    fn create(&self, req: &CreateRequest, _deadline: Instant) -> Result<SandboxInfo, ProviderError> {
        if !TEMPLATES.contains(&req.template.as_str()) {
            return Err(ProviderError::Rejected(format!(
                "unknown template {:?}; the local provider knows: {}",
                req.template,
                TEMPLATES.join(", ")
            )));
        }
        if let Some(bad) = req.envs.keys().find(|k| k.is_empty() || k.contains('=') || k.contains('\0')) {
            return Err(ProviderError::Rejected(format!("environment variable name {bad:?} is not valid")));
        }
        if let Some(why) = &self.refusal {
            return Err(ProviderError::Unavailable(why.clone()));
        }
        let isolation = self.isolation;
        let landlock_network = isolation == Isolation::Landlock && self.landlock_network().is_ok();
        let (host_network, policy) = match (isolation, &req.network) {
            (Isolation::Landlock, Some(Network::Any | Network::Rules(_))) if !landlock_network => {
                let why = self.landlock_network().err().unwrap_or_default();
                return Err(ProviderError::Rejected(format!(
                    "a network (true or a policy) is not available here in the landlock isolation tier: its sandboxes have no egress (TCP connect and bind are refused), \
since {why}; leave network out, or run the server as root or where user namespaces work (--isolation namespaces)"
                )));
            }
            (Isolation::Landlock, network) => (false, network.clone().unwrap_or_default()),
            (Isolation::None, Some(Network::Off | Network::Rules(_))) => {
                return Err(ProviderError::Rejected(
                    "network: false or a network policy needs namespace isolation, and this server creates local sandboxes without it \
(--isolation none, or namespaces are unavailable on this host: see the server's startup warning); leave network out to get the host's network"
                        .into(),
                ))
            }
            (Isolation::None, _) => (true, Network::Any),
            // Every isolated sandbox keeps a private network namespace: egress only through its proxy.
            (Isolation::Namespaces, network) => (false, network.clone().unwrap_or_default()),
        };
        if req.limits.disk_mb.is_some() {
            disk::check(isolation).map_err(|why| ProviderError::Rejected(format!("cannot enforce limits.disk_mb: {why}")))?;
        }
        let limits = self.limits_for(req.limits);
        let slot = self.reserve_slot()?;
        let id = format!("{ID_PREFIX}{}", ids::random_hex(12));
        // Picked while the create lock is held (with the cap on), among the live sandboxes.
        let owner = self.new_owner(&id, isolation)?;
        // Built aside and renamed into place, so that a sandbox directory never exists without
        // its metadata: a sweep running meanwhile (another server starting) takes a directory
        // without metadata for the remains of an interrupted kill.
        let building = self.root.join("sandboxes").join(format!("{CREATING_PREFIX}{id}"));
        let mk = fs::DirBuilder::new()
            .mode(0o700)
            .create(&building)
            .and_then(|()| fs::DirBuilder::new().mode(0o700).create(building.join("home")));
        let on_host_tmp = isolation == Isolation::Landlock;
        let mk = mk.and_then(|()| if on_host_tmp { fs::DirBuilder::new().mode(0o700).create(building.join(TMP_DIR)) } else { Ok(()) });
        let mk = mk.and_then(|()| match owner {
            // The home belongs to the sandbox's root, which is another uid when the server is root.
            Some((uid, gid)) if uid != rustix::process::getuid().as_raw() => {
                std::os::unix::fs::chown(building.join("home"), Some(uid), Some(gid))?;
                if on_host_tmp {
                    // Its own uid passes through its directory to reach them.
                    std::os::unix::fs::chown(building.join(TMP_DIR), Some(uid), Some(gid))?;
                    fs::set_permissions(&building, fs::Permissions::from_mode(0o711))?;
                }
                Ok(())
            }
            _ => Ok(()),
        });
        mk.map_err(|err| ProviderError::Unavailable(format!("cannot create sandbox directory {}: {err}", building.display())))?;
        let now = unix_now();
        let meta = Meta {
            sandbox_id: id.clone(),
            template: req.template.clone(),
            created_at: now,
            timeout: req.timeout_s,
            expires_at: now + req.timeout_s as i64,
            envs: req.envs.clone(),
            metadata: req.metadata.clone(),
            isolation,
            host_network,
            policy,
            proxy: isolation == Isolation::Namespaces || landlock_network,
            spawner: isolation == Isolation::Landlock,
            limits,
            owner,
        };
        let placed = self.store_in(&building, &meta).and_then(|()| {
            fs::rename(&building, self.dir(&id))
                .map_err(|err| ProviderError::Unavailable(format!("cannot create sandbox directory {}: {err}", building.display())))
        });
        if let Err(err) = placed {
            let _ = fs::remove_dir_all(&building);
            if let Some((uid, _)) = meta.owner {
                uid_claim::release(uid, &self.dir(&id));
            }
            return Err(err);
        }
        // In place: it counts against the cap from here on.
        drop(slot);
        let fail = |err: ProviderError| {
            let _ = self.kill(&id, Instant::now() + KILL_SCAN_BUDGET);
            err
        };
        if let Some(mb) = limits.disk_mb {
            let server = (rustix::process::getuid().as_raw(), rustix::process::getgid().as_raw());
            let tmpdir = on_host_tmp.then(|| self.dir(&id).join(TMP_DIR));
            disk::create(&self.dir(&id), mb, owner.unwrap_or(server), tmpdir.as_deref())
                .map_err(|why| fail(ProviderError::Rejected(format!("cannot enforce {}: {why}", describe_limits(&limits)))))?;
        }
        if limits.cgroups() {
            cgroup::create(&id, &limits)
                .map_err(|why| fail(ProviderError::Rejected(format!("cannot enforce {}: {why}", describe_limits(&limits)))))?;
        }
        // Whether the home's mount names no host path, as the init reports it.
        let mut hidden = false;
        match isolation {
            Isolation::None => self.spawn_keeper(&id),
            // Bound here, so that the first command can connect at once: it waits in the
            // socket's backlog until the keeper's spawner takes it.
            Isolation::Landlock => {
                // Other sandboxes of the same uid can connect to the socket, but not read the key.
                isolation::spawner::make_key(&self.dir(&id)).map_err(|e| {
                    fail(ProviderError::Unavailable(format!("could not write the spawner's key in {}: {e}", self.dir(&id).display())))
                })?;
                let listener = isolation::spawner::bind(&self.dir(&id)).ok_or_else(|| {
                    fail(ProviderError::Unavailable(format!(
                        "could not bind the spawner's socket in {}; see the server log",
                        self.dir(&id).display()
                    )))
                })?;
                self.prepare_first_shell(&id, &meta);
                self.start_keeper_with(&id, listener).map_err(fail)?;
            }
            // The init joins the sandbox's cgroups itself, before its cgroup namespace exists.
            Isolation::Namespaces => {
                // Bound here too, so that the request for the first command's shell waits in its
                // backlog and is the first the init takes.
                let listener = isolation::spawner::bind(&self.dir(&id));
                if listener.is_some() {
                    self.prepare_first_shell(&id, &meta);
                }
                hidden = self.start_isolated(&id, listener).map_err(fail)?.1;
            }
        }
        let mut info = meta.info();
        if hidden {
            info.layers.push(isolation::NO_HOST_PATHS);
        }
        Ok(info)
    }

    fn kill(&self, sandbox_id: &str, deadline: Instant) -> Result<bool, ProviderError> {
        check_local_id(sandbox_id)?;
        self.next_tags.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(sandbox_id);
        let dir = self.dir(sandbox_id);
        if !dir.exists() {
            return Ok(false);
        }
        let init = Init::load(&dir);
        // An init this process may not signal (it runs in a user namespace out of this server's
        // reach) would outlive a kill that removed its directory: refuse before anything changes.
        if let Some(init) = init.filter(|i| i.alive()) {
            let pid = rustix::process::Pid::from_raw(init.pid as i32);
            if pid.is_some_and(|p| rustix::process::test_kill_process(p) == Err(rustix::io::Errno::PERM)) {
                return Err(isolation::files::out_of_reach(sandbox_id));
            }
        }
        // Metadata goes first, so that no new command starts while the scan runs. Of two racing
        // kills only the one that removes it answers true, unless the other still finds processes
        // (an interrupted kill, say by a server killed mid-way: its rest is this call's work).
        let meta = self.load(sandbox_id).ok();
        let owned_by = meta.as_ref().and_then(|m| m.own_uid());
        let claimed = meta.and_then(|m| m.owner).map(|(uid, _)| uid);
        let existed = fs::remove_file(dir.join("meta.json")).is_ok();
        let budget = deadline.min(Instant::now() + KILL_SCAN_BUDGET);
        let n = match init {
            // The kernel ends every process of the pid namespace with its init; the directory
            // can go at once (nothing inside runs again), the wait for the end comes after.
            Some(init) => self.signal_init(sandbox_id, init),
            None => self.kill_tagged(sandbox_id, owned_by, budget),
        };
        if n > 0 {
            log::debug!("sandbox {sandbox_id}: killed {n} processes");
        }
        // A disk's mounts go first: removing the directory must not descend into them.
        disk::release(&dir);
        // (A keeper starting at this moment may still write its pid file into the directory:
        // make bench saw "Directory not empty"; `remove_tree` tries again.)
        let removed = removal::remove_tree(&dir, budget);
        if let Some(init) = init {
            while !init.ended() && Instant::now() < budget {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        cgroup::remove(sandbox_id, budget);
        if let Some(uid) = claimed {
            uid_claim::release(uid, &dir);
        }
        if let Err(err) = removed {
            return Err(ProviderError::Unavailable(format!(
                "killed the processes of {sandbox_id} but could not remove {}: {err}",
                dir.display()
            )));
        }
        Ok(existed || n > 0)
    }

    fn info(&self, sandbox_id: &str, touch: Touch, _deadline: Instant) -> Result<SandboxInfo, ProviderError> {
        Ok(self.reach(sandbox_id, touch)?.info())
    }

    fn overview(&self) -> String {
        let tier = self.isolation.name();
        let about = about(tier, &Network::Off, self.uid_range.is_some(), self.has_proxies());
        format!("Local sandboxes (isolation: {tier}). Commands run with {}. {about}", self.command_shell.display())
    }

    fn expose_port(&self, sandbox_id: &str, port: u16, deadline: Instant) -> Result<Exposed, ProviderError> {
        let meta = self.reach(sandbox_id, Touch::Renew)?;
        if meta.isolation == Isolation::None || meta.host_network {
            return Ok(Exposed {
                url: format!("http://127.0.0.1:{port}"),
                done: true,
                note: Some("this sandbox shares the host's network: the port is already on the host's loopback, and no relay runs".into()),
            });
        }
        if meta.isolation == Isolation::Landlock {
            return Err(ProviderError::Rejected(format!(
                "sandbox {sandbox_id} is in the landlock isolation tier, where Landlock refuses every TCP bind, so no port of it can listen or be exposed; \
run the server where user namespaces work (--isolation namespaces) to serve ports"
            )));
        }
        let answer = self.ports_request(sandbox_id, &format!("expose {port} {}", self.expose_address), deadline)?;
        let host = answer.strip_prefix("exposed ").and_then(|a| a.parse().ok()).ok_or_else(|| ports_error(sandbox_id, &answer))?;
        Ok(Exposed { url: ports::url(host), done: true, note: None })
    }

    fn unexpose_port(&self, sandbox_id: &str, port: u16, deadline: Instant) -> Result<Exposed, ProviderError> {
        let meta = self.reach(sandbox_id, Touch::Renew)?;
        if meta.isolation == Isolation::None || meta.host_network {
            return Ok(Exposed {
                url: format!("http://127.0.0.1:{port}"),
                done: false,
                note: Some("this sandbox shares the host's network: its port is on the host's loopback while a process listens on it; stop that process to close it".into()),
            });
        }
        let url = ports::exposed(&self.dir(sandbox_id)).get(&port).map(|a| ports::url(*a));
        let answer = self.ports_request(sandbox_id, &format!("unexpose {port}"), deadline)?;
        match (answer.as_str(), url) {
            ("unexposed", Some(url)) => Ok(Exposed { url, done: true, note: None }),
            ("unexposed", None) => Ok(Exposed { url: String::new(), done: true, note: None }),
            _ => Err(ports_error(sandbox_id, &answer)),
        }
    }

    fn set_network(&self, sandbox_id: &str, network: &Network, _deadline: Instant) -> Result<SandboxInfo, ProviderError> {
        let mut meta = self.reach(sandbox_id, Touch::Observe)?;
        if !meta.proxy {
            return Err(ProviderError::Rejected(format!(
                "sandbox {sandbox_id} has no egress proxy (it is not isolated with namespaces, nor with landlock under a root server, or was created by an older version); its network cannot change"
            )));
        }
        meta.policy = network.clone();
        self.store(&meta)?;
        Ok(meta.info())
    }

    fn network_blocked(&self, sandbox_id: &str, since_ms: u64) -> Vec<crate::egress::blocks::Block> {
        if check_local_id(sandbox_id).is_err() {
            return Vec::new();
        }
        crate::egress::blocks::BlockLog::new(&self.dir(sandbox_id)).since(since_ms)
    }

    fn describe(&self, info: &SandboxInfo) -> String {
        let about = about(info.isolation, &info.network, self.uid_range.is_some(), self.has_proxies());
        match info.limits.disk_mb {
            Some(mb) => format!(
                "{about} Its home and temporary space share a disk of {mb} MiB: writes beyond it fail with \"No space left on device\"."
            ),
            None => about,
        }
    }

    fn list_sandboxes(&self) -> Option<Vec<crate::provider::Listed>> {
        let mut all = Vec::new();
        for entry in fs::read_dir(self.root.join("sandboxes")).ok()?.flatten() {
            let id = entry.file_name().to_string_lossy().into_owned();
            if check_local_id(&id).is_err() {
                continue;
            }
            if let Ok(meta) = self.load(&id) {
                if meta.expires_at > unix_now() {
                    all.push((meta.info(), Some(meta.created_at), meta.metadata.clone()));
                }
            }
        }
        all.sort_by(|a, b| (a.1, &a.0.sandbox_id).cmp(&(b.1, &b.0.sandbox_id)));
        Some(all)
    }

    fn expires_at(&self, sandbox_id: &str) -> Option<i64> {
        check_local_id(sandbox_id).ok()?;
        self.load(sandbox_id).ok().map(|meta| meta.expires_at)
    }

    fn set_timeout(&self, sandbox_id: &str, timeout_s: u64, _deadline: Instant) -> Result<SandboxInfo, ProviderError> {
        let mut meta = self.reach(sandbox_id, Touch::Observe)?;
        meta.timeout = timeout_s;
        meta.expires_at = unix_now() + timeout_s as i64;
        self.store(&meta)?;
        Ok(meta.info())
    }

    fn shell(&self, script: &str) -> Vec<String> {
        vec![self.command_shell.to_string_lossy().into_owned(), "-c".into(), script.into()]
    }

    fn task_shell(&self) -> String {
        self.command_shell.to_string_lossy().into_owned()
    }

    fn posix_sh(&self, script: &str, args: &[&str]) -> Vec<String> {
        let mut argv = vec![self.shell.to_string_lossy().into_owned(), "-c".into(), script.into(), "sh".into()];
        argv.extend(args.iter().map(|a| a.to_string()));
        argv
    }

    fn exec(&self, sandbox_id: &str, req: &ExecRequest, touch: Touch) -> Result<ExecOutput, ProviderError> {
        let tagged;
        let mut req = req;
        let runs_there = || req.envs.is_empty() && req.cwd.is_none() && self.warm(&req.argv, &BTreeMap::new());
        if let Some(tag) = self.waiting_tag(sandbox_id, runs_there) {
            // A command that will never be a task carries the tag all the same, so that it runs
            // in the shell waiting for the sandbox's next command (whose environment has it).
            let mut with_tag = req.clone();
            with_tag.envs.insert(TASK_TAG_VAR.to_string(), tag);
            tagged = with_tag;
            req = &tagged;
        }
        match self.run_exec(sandbox_id, req, touch, None)? {
            ExecEnd::Done(out) | ExecEnd::Promoted(out) => Ok(out),
        }
    }

    fn long_commands(&self) -> LongCommands<'_> {
        // The server holds a command's pipes: a long command is handed over while it runs.
        LongCommands::Adopt(self)
    }

    fn read_file(&self, sandbox_id: &str, path: &str, max_bytes: usize, _deadline: Instant) -> Result<Vec<u8>, ProviderError> {
        let (sandbox, init) = self.reach_with_init(sandbox_id, Touch::Renew)?;
        if let Some(init) = init {
            return Self::sandbox_fs(sandbox_id, &sandbox, init)?.read(path, max_bytes);
        }
        if sandbox.isolation == Isolation::Landlock {
            let (fs, inside) = self.home_fs(sandbox_id, &sandbox, path)?;
            return fs.read(&inside, max_bytes);
        }
        self.host_read(sandbox_id, path, max_bytes)
    }

    fn write_file(&self, sandbox_id: &str, path: &str, data: &[u8], _deadline: Instant) -> Result<u64, ProviderError> {
        let (sandbox, init) = self.reach_with_init(sandbox_id, Touch::Renew)?;
        if let Some(init) = init {
            return Self::sandbox_fs(sandbox_id, &sandbox, init)?.write(path, data);
        }
        if sandbox.isolation == Isolation::Landlock {
            let (fs, inside) = self.home_fs(sandbox_id, &sandbox, path)?;
            return fs.write(&inside, data);
        }
        self.host_write(sandbox_id, path, data)
    }

    fn list_dir(
        &self,
        sandbox_id: &str,
        path: &str,
        max_entries: usize,
        _deadline: Instant,
    ) -> Result<(Vec<DirEntry>, bool), ProviderError> {
        let (sandbox, init) = self.reach_with_init(sandbox_id, Touch::Renew)?;
        if let Some(init) = init {
            return Self::sandbox_fs(sandbox_id, &sandbox, init)?.list(path, max_entries);
        }
        if sandbox.isolation == Isolation::Landlock {
            let (fs, inside) = self.home_fs(sandbox_id, &sandbox, path)?;
            return fs.list(&inside, max_entries);
        }
        self.host_list(sandbox_id, path, max_entries)
    }

    fn task_input(&self) -> bool {
        true
    }

    fn terminal_refusal(&self, sandbox_id: &str) -> Option<String> {
        let meta = self.load(sandbox_id).ok()?;
        (meta.isolation == Isolation::Landlock && meta.own_uid().is_none()).then(|| {
            format!(
                "sandbox {sandbox_id} cannot give a task a terminal: it is in the landlock tier without a host uid of its own (the server is not root, \
or its state root lies below a directory other users cannot pass), and there the host's own terminals would be within its reach; \
start the task with stdin: true instead (the operator can give sandboxes uids of their own: see sandbox-mcp doctor)"
            )
        })
    }

    fn send_input(&self, sandbox_id: &str, req: &Input<'_>, deadline: Instant) -> Result<(), InputError> {
        let (sandbox, init) = self.reach_with_init(sandbox_id, Touch::Observe)?;
        if let Some(init) = init {
            return Self::sandbox_fs(sandbox_id, &sandbox, init)?.input(req, deadline);
        }
        if sandbox.isolation == Isolation::Landlock {
            // As the sandbox's uid (a root server), like its other file tools.
            let (fs, _) = self.home_fs(sandbox_id, &sandbox, ".")?;
            return fs.input(req, deadline);
        }
        let flags = rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC;
        let home = rustix::fs::open(self.home(sandbox_id), flags, rustix::fs::Mode::empty())
            .map_err(|e| ProviderError::Unavailable(format!("cannot open the sandbox home: {e}")))?;
        let dir = input::open_task_dir(&home, req.task_dir)?;
        input::write(&dir, req.data, req.eof, deadline)
    }

    fn env_masker(&self, sandbox_id: &str, extra: &BTreeMap<String, String>) -> Result<Masker, ProviderError> {
        let meta = self.reach(sandbox_id, Touch::Observe)?;
        let all = meta.envs.iter().chain(extra.iter());
        Ok(Masker::from_env(all.map(|(k, v)| (k.as_str(), v.as_str()))))
    }

    fn shutdown(&self) {
        self.running.kill_all(&self.shell);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids() {
        assert!(check_local_id("local-0123456789abcdef01234567").is_ok());
        for bad in ["", "../x", "local-../../etc", "local-0123456789ABCDEF01234567", "local-0123"] {
            assert!(check_local_id(bad).is_err(), "{bad}");
        }
        let ProviderError::InvalidId { reason, .. } = check_local_id("i3xkq8n2m1p0zj7w5v4ty").unwrap_err() else { panic!() };
        assert!(reason.contains("another provider"), "{reason}");
    }
}
