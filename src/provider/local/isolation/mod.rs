//! Namespace isolation of local sandboxes: whether this host allows it, and the pieces that build
//! and enter an isolated sandbox.
//!
//! An isolated sandbox lives in its own user, mount, pid, ipc, uts and network namespaces (cgroup
//! where the kernel has it; its network's one way out is its egress proxy, see `crate::egress`). Their holder is the
//! sandbox's **init**: pid 1 of its pid namespace, this binary's `sandbox-init` subcommand,
//! started through util-linux `unshare` by the sandbox's keeper. The init assembles the root
//! filesystem ([`rootfs`]), reports that it is ready, and then serves and reaps. Every later
//! exec is started by the init on the server's request ([`spawner`]), or enters the namespaces with
//! `nsenter` ([`enter`]) where the spawner cannot serve; file tools reach the sandbox's root
//! through `/proc/<init>/root` without ever leaving it ([`files`]); limits are cgroups
//! ([`cgroup`]) and a file system of the sandbox's own ([`disk`]). Ending the init makes the kernel end every process of the sandbox.
//!
//! Identity: sandbox code runs as root of its user namespace. That root is the server's own uid
//! on the host, except when the server runs as root: then it is an unprivileged uid of the
//! sandbox's own ([`uids`], from `--uid-range`), so that sandbox code is never root over host files
//! and sandboxes share no per-user kernel quota ([`SANDBOX_UID`] for sandboxes made before).

pub mod cgroup;
pub mod diagnosis;
pub mod disk;
pub mod enter;
pub mod fd_passing;
pub mod files;
pub mod init;
pub mod landlock;
pub mod landlock_spawner;
pub mod passage;
pub mod rootfs;
pub mod seccomp;
pub mod spawner;
pub mod stage;
pub mod subordinate;
pub mod uids;
pub mod warm_shell;

use crate::config::IsolationMode;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The unprivileged uid the probe runs as when the server is root, and the host uid of the root of
/// sandboxes whose metadata names none (made before per-sandbox uids).
pub const SANDBOX_UID: u32 = 100_000;

/// How one local sandbox is isolated (recorded in its metadata; sandboxes from before isolation
/// existed read as `None`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    /// Own namespaces held by an init process.
    Namespaces,
    /// Landlock: host processes tagged with the sandbox id, each under a Landlock ruleset,
    /// seccomp and `no_new_privs` (and a uid of its own under a root server).
    Landlock,
    /// None: a directory plus processes tagged with the sandbox id, as the server's user.
    #[default]
    None,
}

impl Isolation {
    /// The name used in tool results and metadata.
    pub fn name(self) -> &'static str {
        match self {
            Isolation::Namespaces => "namespaces",
            Isolation::Landlock => "landlock",
            Isolation::None => "none",
        }
    }

    /// Whether commands run on the host's file system view (landlock, none) rather than in a
    /// root of their own.
    pub fn on_host(self) -> bool {
        self != Isolation::Namespaces
    }
}

/// The layer of a namespace-isolated sandbox whose home's mount names no host path (an overlay,
/// or a disk of its own), reported by its init; where the kernel refuses the overlay the home is
/// bound, its host path shows in `/proc/self/mountinfo`, and the layer is left out.
pub const NO_HOST_PATHS: &str = "no_host_paths";

/// The layers a namespace-isolated sandbox gets: `net` unless it has the host's network,
/// `cgroup` where the kernel has cgroup namespaces.
pub fn namespace_layers(host_network: bool) -> Vec<&'static str> {
    let mut all = vec!["user", "pid", "mount"];
    if !host_network {
        all.push("net");
    }
    all.extend(["ipc", "uts"]);
    if init::has_cgroup_namespace() {
        all.push("cgroup");
    }
    all.extend(["seccomp", "no_new_privs"]);
    all
}

/// The host's answer to "can sandboxes get namespaces here?", found once per process.
static PROBE: OnceLock<Result<(), String>> = OnceLock::new();

/// Why this host cannot isolate sandboxes or enforce their limits: one sentence that names what
/// blocks it and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IsolationError(pub String);

impl std::fmt::Display for IsolationError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for IsolationError {}

/// Resolves the configured mode against this host. `Auto` becomes `Namespaces`, else
/// `Landlock`, never `None`; the error explains what blocks the tier asked for (for `Auto`: both)
/// and what would allow it.
pub fn resolve(mode: IsolationMode) -> Result<Isolation, IsolationError> {
    match mode {
        IsolationMode::None => Ok(Isolation::None),
        IsolationMode::Namespaces => probe().map(|()| Isolation::Namespaces),
        IsolationMode::Landlock => landlock::available().map(|_| Isolation::Landlock).map_err(|why| {
            IsolationError(format!("{why}; use a kernel with Landlock enabled, or --isolation namespaces where user namespaces work"))
        }),
        IsolationMode::Auto => match (probe(), landlock::available()) {
            (Ok(()), _) => Ok(Isolation::Namespaces),
            (Err(_), Ok(_)) => Ok(Isolation::Landlock),
            (Err(ns), Err(ll)) => Err(IsolationError(format!(
                "no isolation is available on this host: namespaces: {ns}; Landlock: {ll}. Fix one of them (`sandbox-mcp doctor` lists the remedies), or start the server with --isolation none to run sandboxes without isolation"
            ))),
        },
    }
}

/// Why namespaces are unavailable, or `Ok` when they work (the probe runs once per process).
pub fn probe() -> Result<(), IsolationError> {
    PROBE.get_or_init(run_probe).clone().map_err(IsolationError)
}

/// The host uid and gid a sandbox's root maps to: the server's own, or [`SANDBOX_UID`] for root
/// (the probe's id for the root of a namespace entered for subordinate ids).
pub fn sandbox_owner() -> (u32, u32) {
    let (uid, gid) = (rustix::process::getuid().as_raw(), rustix::process::getgid().as_raw());
    if let Some(entered) = subordinate::entered() {
        (entered.probe_id(), entered.probe_id())
    } else if uid == 0 {
        (SANDBOX_UID, SANDBOX_UID)
    } else {
        (uid, gid)
    }
}

/// The util-linux programs isolation needs, found on the server's `PATH` (or the usual places).
pub struct Tools {
    /// `unshare`.
    pub unshare: PathBuf,
    /// `nsenter`.
    pub nsenter: PathBuf,
    /// `setpriv`, needed only when the server runs as root (to start the sandbox unprivileged).
    pub setpriv: Option<PathBuf>,
    /// `setsid`: a program entered with `nsenter` starts in a session of its own, so that it never
    /// shares the server's controlling terminal.
    pub setsid: PathBuf,
}

/// Finds the programs of [`Tools`].
pub fn tools() -> Result<Tools, IsolationError> {
    find_tools().map_err(IsolationError)
}

/// [`tools`], its error as a sentence.
fn find_tools() -> Result<Tools, String> {
    // The system's own util-linux first: a PATH may put other implementations (busybox) ahead.
    let path = std::env::var("PATH").unwrap_or_default();
    let path = format!("/usr/bin:/bin:/usr/sbin:/sbin:{path}");
    let find = |name: &str| crate::provider::process::which(name, &path);
    let (Some(unshare), Some(nsenter), Some(setsid)) = (find("unshare"), find("nsenter"), find("setsid")) else {
        return Err("the util-linux programs unshare, nsenter and setsid were not all found on PATH; install util-linux".into());
    };
    let setpriv = find("setpriv");
    if rustix::process::getuid().is_root() && setpriv.is_none() {
        return Err("running as root needs util-linux setpriv to start sandboxes as an unprivileged uid, and it was not found on PATH; install util-linux".into());
    }
    Ok(Tools { unshare, nsenter, setpriv, setsid })
}

/// Tries what an isolated sandbox needs: the programs, then a user namespace with the other
/// namespaces inside it, created exactly as [`init`] does it.
fn run_probe() -> Result<(), String> {
    let tools = find_tools()?;
    let mut cmd = sandbox_command(&tools, &tools.unshare, sandbox_owner());
    cmd.args(init::UNSHARE_OPTIONS).args(init::sandbox_namespaces(true, false).map(|(_, option)| option));
    cmd.arg("--").arg("/bin/sh").arg("-c").arg(":");
    let out = cmd.env_clear().env("LC_ALL", "C").stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).output();
    match out {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(blocked_because(String::from_utf8_lossy(&out.stderr).trim())),
        Err(err) => Err(format!("could not run {}: {err}", tools.unshare.display())),
    }
}

/// A command that runs `program` with a sandbox's host identity `owner` (uid, gid): as it is for
/// an ordinary user (whose own uid that is); for root, through `setpriv` as `owner` with no
/// supplementary groups and no inheritable capabilities.
pub fn sandbox_command(tools: &Tools, program: &Path, owner: (u32, u32)) -> Command {
    match (&tools.setpriv, rustix::process::getuid().is_root()) {
        (Some(setpriv), true) => {
            let mut cmd = Command::new(setpriv);
            let (uid, gid) = (owner.0.to_string(), owner.1.to_string());
            cmd.args(["--reuid", &uid, "--regid", &gid, "--clear-groups", "--inh-caps=-all", "--"]).arg(program);
            cmd
        }
        _ => Command::new(program),
    }
}

/// Explains a failed user-namespace probe by the host settings known to block it.
fn blocked_because(stderr: &str) -> String {
    let read = |p: &str| std::fs::read_to_string(p).ok().map(|s| s.trim().to_string());
    let setting = if read("/proc/sys/kernel/unprivileged_userns_clone").as_deref() == Some("0") {
        Some("sysctl kernel.unprivileged_userns_clone is 0 (set it to 1)")
    } else if read("/proc/sys/user/max_user_namespaces").as_deref() == Some("0") {
        Some("sysctl user.max_user_namespaces is 0 (set it above 0)")
    } else if read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns").as_deref() == Some("1") {
        Some("AppArmor restricts unprivileged user namespaces (sysctl kernel.apparmor_restrict_unprivileged_userns is 1; set it to 0 or give sandbox-mcp an AppArmor profile that allows userns)")
    } else {
        None
    };
    match setting {
        Some(s) => format!("this host does not allow unprivileged user namespaces: {s}; unshare said: {stderr}"),
        None => format!("creating a user namespace failed: {stderr}"),
    }
}

/// Whether `path` lies under one of the host directories every isolated sandbox sees read-only.
pub fn visible_inside(path: &Path) -> bool {
    rootfs::SYSTEM_DIRS.iter().any(|d| path.starts_with(d))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn none_needs_no_probe_and_names_are_stable() {
        assert_eq!(resolve(IsolationMode::None), Ok(Isolation::None));
        assert_eq!((Isolation::Namespaces.name(), Isolation::Landlock.name(), Isolation::None.name()), ("namespaces", "landlock", "none"));
        assert!(Isolation::Landlock.on_host() && !Isolation::Namespaces.on_host());
        assert!(namespace_layers(true).iter().all(|l| *l != "net"));
        assert!(namespace_layers(false).contains(&"net"));
        assert!(visible_inside(Path::new("/usr/bin/awk")));
        assert!(!visible_inside(Path::new("/tmp/x/sh")));
    }
}
