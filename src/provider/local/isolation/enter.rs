//! Entering an isolated sandbox: the record of its init, and the command line that runs a
//! program inside its namespaces.
//!
//! Commands run through the init's spawner (see `spawner`) where they can; what cannot (a process
//! whose pipes the caller holds itself, as the emulator's envd streams; a sandbox made before the
//! spawner existed) goes through `nsenter --target <init>`: user, mount, pid,
//! ipc and uts namespaces (network and cgroup when the sandbox has its own), root and working
//! directory taken from the init, credentials those of the sandbox's root. `nsenter` forks once
//! more so that the program is born inside the pid namespace; both stay in one process group on
//! the host, so a group signal from the server still reaches the program.
//!
//! When the sandbox has limits, a host shell first moves itself into the sandbox's cgroups and
//! then becomes `nsenter`, so the program and everything it starts are counted there.

use super::init::has_cgroup_namespace;
use super::{seccomp, Tools};
use crate::provider::process;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The file in a sandbox's directory that names its init: `<pid> <start time>`.
pub const INIT_FILE: &str = "init.pid";

/// The init of an isolated sandbox, as recorded by its keeper.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Init {
    /// Pid in the server's pid namespace.
    pub pid: u32,
    /// Start time in clock ticks since boot (guards against pid reuse).
    pub start: u64,
}

impl Init {
    /// Reads the record in `dir`; `None` when there is none (yet) or it is malformed.
    pub fn load(dir: &Path) -> Option<Init> {
        Init::read(&dir.join(INIT_FILE))
    }

    /// Reads any `<pid> <start time>` record (a sandbox keeper's `keeper.pid` has the same form);
    /// `None` when it is missing, malformed, or names pid 0 or 1.
    pub fn read(file: &Path) -> Option<Init> {
        let text = fs::read_to_string(file).ok()?;
        let mut it = text.split_whitespace();
        let pid = it.next()?.parse().ok()?;
        let start = it.next()?.parse().ok()?;
        (pid > 1).then_some(Init { pid, start })
    }

    /// Writes the record into `dir` (mode 0600, temp file + rename).
    pub fn store(&self, dir: &Path) -> io::Result<()> {
        self.store_as(dir, INIT_FILE)
    }

    /// Writes the record into `dir` as `name` (another process's record of the same form).
    pub fn store_as(&self, dir: &Path, name: &str) -> io::Result<()> {
        let tmp = dir.join(format!("{name}.{}.tmp", crate::ids::random_hex(4)));
        let mut f = fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
        f.write_all(format!("{} {}\n", self.pid, self.start).as_bytes())?;
        drop(f);
        fs::rename(&tmp, dir.join(name))
    }

    /// Whether this exact process still runs (same pid, same start time, not a zombie).
    pub fn alive(&self) -> bool {
        matches!(process::proc_stat(self.pid), Some(st) if st.start == self.start && st.state != 'Z')
    }

    /// Whether this init has ended entirely, every thread of it. Its first thread can be a zombie
    /// while another still runs: the last one to exit is the one that ends every process of the
    /// pid namespace, so until then [`Init::alive`] may already be false while the sandbox's
    /// processes still run.
    pub fn ended(&self) -> bool {
        if !matches!(process::proc_stat(self.pid), Some(st) if st.start == self.start) {
            return true;
        }
        let Ok(tasks) = fs::read_dir(format!("/proc/{}/task", self.pid)) else { return true };
        !tasks.flatten().any(|task| process::stat_at(&task.path().join("stat")).is_some_and(|st| !matches!(st.state, 'Z' | 'X' | 'x')))
    }

    /// The init's root directory as seen from the host.
    pub fn root_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root", self.pid))
    }
}

/// The script a host shell runs to join the cgroups named before `--`, then become the rest.
const JOIN_CGROUPS: &str = r#"while [ "$1" != -- ]; do echo $$ >"$1" || exit 126; shift; done; shift; exec "$@""#;

/// A command that runs `program` (arguments follow from the caller) after joining the cgroups
/// whose `cgroup.procs` files are `cgroups`; just `program` when there are none.
pub fn joined(cgroups: &[PathBuf], program: &Path) -> Command {
    if cgroups.is_empty() {
        return Command::new(program);
    }
    let mut c = Command::new("/bin/sh");
    c.args(["-c", JOIN_CGROUPS, "sh"]).args(cgroups).arg("--").arg(program);
    c
}

/// The command that runs `argv` inside the sandbox whose init is `init`, from directory `cwd`
/// inside it (the home when `None`; the caller has checked that it exists), after joining the
/// cgroups whose `cgroup.procs` files are `cgroups`.
///
/// It gets what the init's children get: the seccomp filter with `no_new_privs`, installed on
/// the host side by this program (`exe`, [`seccomp::FILTER_SUBCOMMAND`]) before `nsenter`, and,
/// inside, `CAP_SYS_PTRACE` dropped from its bounding set (`setpriv`, where the host has it:
/// entering the user namespace gives back a full bounding set), so that it can no more trace the
/// init than a command the init started.
///
/// It starts with `setsid`: a session of its own, with no controlling terminal (the server's may
/// be an operator's, which `/dev/tty` inside would otherwise open), and a process group of its
/// own whose id is its pid. The caller must not also ask for a new process group: `setsid` run as
/// a group leader forks, and the group would no longer be the child's.
pub fn command(
    tools: &Tools,
    exe: &Path,
    init: Init,
    own_network: bool,
    argv: &[String],
    cwd: Option<&str>,
    cgroups: &[PathBuf],
) -> Command {
    let mut cmd = Command::new(&tools.setsid);
    if !cgroups.is_empty() {
        cmd.args(["/bin/sh", "-c", JOIN_CGROUPS, "sh"]).args(cgroups).arg("--");
    }
    cmd.arg(exe).arg(seccomp::FILTER_SUBCOMMAND);
    cmd.arg(&tools.nsenter).arg("--target").arg(init.pid.to_string()).args(["--user", "--mount", "--pid", "--ipc", "--uts"]);
    if own_network {
        cmd.arg("--net");
    }
    if has_cgroup_namespace() {
        cmd.arg("--cgroup");
    }
    if !rustix::process::getuid().is_root() {
        // The server's uid is the one the sandbox's root maps to: it already is that root inside,
        // and an unprivileged process may not drop its groups as nsenter would.
        cmd.arg("--preserve-credentials");
    }
    cmd.args(["--root", "--wd", "--"]);
    if let Some(setpriv) = &tools.setpriv {
        cmd.arg(setpriv).args(["--bounding-set=-sys_ptrace", "--"]);
    }
    if let Some(dir) = cwd {
        cmd.args(["/bin/sh", "-c", r#"cd -- "$0" && exec "$@""#, dir]);
    }
    cmd.args(argv);
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_refuse_init_of_the_host() {
        let dir = std::env::temp_dir().join(format!("smcp-init-{}", crate::ids::random_hex(4)));
        fs::create_dir_all(&dir).unwrap();
        assert_eq!(Init::load(&dir), None);
        let init = Init { pid: 4242, start: 77 };
        init.store(&dir).unwrap();
        assert_eq!(Init::load(&dir), Some(init));
        fs::write(dir.join(INIT_FILE), "1 5\n").unwrap();
        assert_eq!(Init::load(&dir), None, "pid 1 is never a sandbox's init");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_command_enters_then_changes_directory() {
        let tools = Tools { unshare: "/u".into(), nsenter: "/n".into(), setpriv: None, setsid: "/s".into() };
        let argv = vec!["sh".to_string(), "-c".into(), "true".into()];
        let cmd = command(&tools, Path::new("/x"), Init { pid: 9, start: 1 }, true, &argv, Some("sub dir"), &[]);
        let args: Vec<String> = cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(cmd.get_program(), "/s", "a session of its own first");
        assert_eq!(&args[..2], ["/x", seccomp::FILTER_SUBCOMMAND], "then the filter");
        assert_eq!(&args[2..5], ["/n", "--target", "9"]);
        assert!(args.contains(&"--net".to_string()));
        let tail = &args[args.iter().position(|a| a == "--").unwrap() + 1..];
        assert_eq!(tail[..4], ["/bin/sh", "-c", r#"cd -- "$0" && exec "$@""#, "sub dir"]);
        assert_eq!(tail[4..], argv[..]);
        let joined = command(&tools, Path::new("/x"), Init { pid: 9, start: 1 }, false, &argv, None, &[PathBuf::from("/cg/procs")]);
        let args: Vec<String> = joined.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!((joined.get_program(), args[0].as_str()), ("/s".as_ref(), "/bin/sh"));
    }
}
