//! The Landlock tier: where a host refuses user namespaces, each command of a sandbox runs under
//! a Landlock ruleset, `no_new_privs`, the seccomp filter of [`super::seccomp`] (with the
//! tier's socket rules), its sandbox's cgroups where they exist, and, when the server runs as
//! root, the sandbox's own uid.
//!
//! What a ruleset allows, given the running kernel's Landlock ABI ([`abi`]):
//! - reading and executing the host's system directories the namespace tier shows
//!   ([`rootfs::SYSTEM_DIRS`], the [`rootfs::ETC_ENTRIES`] of `/etc`, plus `passwd` and `group`),
//!   the server's shell, reading `/proc`, and reading and writing the device nodes `null`,
//!   `zero`, `full`, `random`, `urandom` and `tty`;
//! - everything in the sandbox's home and its own temporary directory;
//! - nothing else of the host's file system (ABI 1; moving files between directories from ABI 2,
//!   truncation from ABI 3, device ioctls from ABI 5 are handled, so refused, elsewhere);
//! - TCP: no bind, and connect only to the port given (none today), from ABI 4;
//! - abstract unix sockets and signals: only within the sandbox's own domain, from ABI 6.
//!
//! A sandbox made by this version has one domain: its spawner
//! ([`landlock_spawner`](super::landlock_spawner)) is confined once, and every command is its
//! child, so a task, `cancel_task`'s snippet and a `kill` in run_command signal each other, and
//! nothing outside (the server, the host user's processes, other sandboxes). A sandbox made
//! before the spawner existed confines each command on its own, in a domain of its own, without
//! the signal scope (which would keep a later command from signalling a task of the same
//! sandbox); its layers never claim it.
//!
//! The ruleset is built before the fork; the child only applies it. That part
//! runs between fork and exec, where only async-signal-safe calls are allowed: it makes plain
//! system calls on descriptors and memory prepared beforehand.
//!
//! `unsafe` is allowed in this one module: Landlock has no wrapper in the standard library or
//! rustix, so its three system calls are made with `libc::syscall`, and the confinement must run
//! in the child between fork and exec (`CommandExt::pre_exec`).
#![allow(unsafe_code)]

use super::rootfs;
use seccompiler::BpfProgram;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const SYS_CREATE_RULESET: libc::c_long = 444;
const SYS_ADD_RULE: libc::c_long = 445;
const SYS_RESTRICT_SELF: libc::c_long = 446;
const CREATE_RULESET_VERSION: u32 = 1;
const RULE_PATH_BENEATH: libc::c_int = 1;
const RULE_NET_PORT: libc::c_int = 2;

const FS_EXECUTE: u64 = 1 << 0;
const FS_WRITE_FILE: u64 = 1 << 1;
const FS_READ_FILE: u64 = 1 << 2;
const FS_READ_DIR: u64 = 1 << 3;
/// Every file-system right of ABI 1 (execute through make-symlink).
const FS_ABI1: u64 = (1 << 13) - 1;
const FS_REFER: u64 = 1 << 13;
const FS_TRUNCATE: u64 = 1 << 14;
const FS_IOCTL_DEV: u64 = 1 << 15;
const NET_BIND_TCP: u64 = 1 << 0;
const NET_CONNECT_TCP: u64 = 1 << 1;
const SCOPE_ABSTRACT_UNIX_SOCKET: u64 = 1 << 0;
const SCOPE_SIGNAL: u64 = 1 << 1;

/// Device nodes a sandbox reads and writes.
const DEVICES: &[&str] = &["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty"];

#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
    scoped: u64,
}

#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

#[repr(C)]
struct NetPortAttr {
    allowed_access: u64,
    port: u64,
}

/// The Landlock ABI of the running kernel: 0 when Landlock is missing or disabled.
pub fn abi() -> u32 {
    static ABI: OnceLock<u32> = OnceLock::new();
    *ABI.get_or_init(|| {
        // SAFETY: the version query reads no memory (null attribute, size 0).
        let v = unsafe { libc::syscall(SYS_CREATE_RULESET, std::ptr::null::<RulesetAttr>(), 0usize, CREATE_RULESET_VERSION) };
        u32::try_from(v).unwrap_or(0)
    })
}

/// Why the Landlock tier is unavailable here, or `Ok` with the ABI.
pub fn available() -> Result<u32, String> {
    match abi() {
        0 => Err("the kernel offers no Landlock (it needs Linux 5.13 or later with \"landlock\" in the lsm= boot parameter or CONFIG_LSM)"
            .into()),
        n => Ok(n),
    }
}

/// The layers a sandbox of this tier gets on a kernel with Landlock ABI `abi`, as
/// `create_sandbox` names them: `landlock-fs`, `landlock-net` (ABI 4), `landlock-scope-unix`
/// (ABI 6), `landlock-scope-signal` (ABI 6, with one domain: `one_domain`), `seccomp`,
/// `no_new_privs`, `uid` when `own_uid`, and `net` with a network namespace of its own (`net`).
pub fn layers(abi: u32, own_uid: bool, one_domain: bool, net: bool) -> Vec<&'static str> {
    let mut all = vec!["landlock-fs"];
    if abi >= 4 {
        all.push("landlock-net");
    }
    if abi >= 6 {
        all.push("landlock-scope-unix");
        if one_domain {
            all.push("landlock-scope-signal");
        }
    }
    all.extend(["seccomp", "no_new_privs"]);
    if own_uid {
        all.push("uid");
    }
    if net {
        all.push("net");
    }
    all
}

/// The file-system rights a ruleset handles on ABI `abi`.
fn handled_fs(abi: u32) -> u64 {
    let mut fs = FS_ABI1;
    if abi >= 2 {
        fs |= FS_REFER;
    }
    if abi >= 3 {
        fs |= FS_TRUNCATE;
    }
    if abi >= 5 {
        fs |= FS_IOCTL_DEV;
    }
    fs
}

/// What one sandbox's commands may reach.
pub struct Plan<'a> {
    /// The sandbox's home (read-write).
    pub home: &'a Path,
    /// Its own temporary directory (read-write).
    pub tmp: &'a Path,
    /// The server's shell, readable and executable wherever it lives.
    pub shell: &'a Path,
    /// Whether signals are scoped to the domain: only where every command of the sandbox shares
    /// it (started by its spawner).
    pub scope_signals: bool,
    /// The one TCP port commands may connect to (the sandbox's egress proxy), if any.
    pub connect_port: Option<u16>,
    /// The `cgroup.procs` files every command joins before it is confined.
    pub cgroups: &'a [PathBuf],
    /// Whether commands may open new pseudo-terminals (`/dev/ptmx`, `/dev/pts`): only for a
    /// sandbox with a uid of its own, since the host's terminals are on the same `/dev/pts` and
    /// only their owner's uid keeps the sandbox out of them.
    pub terminals: bool,
}

/// A ruleset and the rest of a confinement, ready for [`confine`].
pub struct Confinement {
    ruleset: OwnedFd,
    cgroups: Vec<OwnedFd>,
    filter: BpfProgram,
}

/// Builds the confinement of `plan` (in the server, before any fork).
pub fn prepare(plan: &Plan<'_>) -> Result<Confinement, String> {
    let abi = available()?;
    let attr = RulesetAttr {
        handled_access_fs: handled_fs(abi),
        handled_access_net: if abi >= 4 { NET_BIND_TCP | NET_CONNECT_TCP } else { 0 },
        scoped: match (abi >= 6, plan.scope_signals) {
            (false, _) => 0,
            (true, false) => SCOPE_ABSTRACT_UNIX_SOCKET,
            (true, true) => SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL,
        },
    };
    let size = match abi {
        1..=3 => 8,
        4 | 5 => 16,
        _ => std::mem::size_of::<RulesetAttr>(),
    };
    // SAFETY: `attr` outlives the call and `size` does not exceed it.
    let fd = unsafe { libc::syscall(SYS_CREATE_RULESET, &attr as *const RulesetAttr, size, 0u32) };
    if fd < 0 {
        return Err(format!("create a Landlock ruleset: {}", io::Error::last_os_error()));
    }
    // SAFETY: the kernel just returned this descriptor (close-on-exec) and nothing else owns it.
    let ruleset = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    let read_exec = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR;
    let file_rights = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | (handled_fs(abi) & (FS_TRUNCATE | FS_IOCTL_DEV));
    for dir in rootfs::SYSTEM_DIRS {
        allow_path(&ruleset, Path::new(dir), read_exec, false)?;
    }
    for entry in rootfs::ETC_ENTRIES.iter().chain(["passwd", "group"].iter()) {
        allow_path(&ruleset, &Path::new("/etc").join(entry), read_exec, false)?;
    }
    allow_path(&ruleset, Path::new("/proc"), FS_READ_FILE | FS_READ_DIR, false)?;
    allow_path(&ruleset, plan.shell, FS_EXECUTE | FS_READ_FILE, false)?;
    for dev in DEVICES {
        allow_path(&ruleset, Path::new(dev), FS_READ_FILE | FS_WRITE_FILE | (file_rights & FS_IOCTL_DEV), false)?;
    }
    if plan.terminals {
        let rw = FS_READ_FILE | FS_WRITE_FILE | (file_rights & FS_IOCTL_DEV);
        allow_path(&ruleset, Path::new("/dev/ptmx"), rw, false)?;
        allow_path(&ruleset, Path::new("/dev/pts"), rw | FS_READ_DIR, false)?;
    }
    for dir in [plan.home, plan.tmp] {
        allow_path(&ruleset, dir, handled_fs(abi), true)?;
    }
    if let (Some(port), true) = (plan.connect_port, abi >= 4) {
        let rule = NetPortAttr { allowed_access: NET_CONNECT_TCP, port: u64::from(port) };
        // SAFETY: `rule` outlives the call; the descriptor is the ruleset's.
        let r = unsafe { libc::syscall(SYS_ADD_RULE, ruleset.as_raw_fd(), RULE_NET_PORT, &rule as *const NetPortAttr, 0u32) };
        if r != 0 {
            return Err(format!("allow TCP connect to port {port}: {}", io::Error::last_os_error()));
        }
    }
    let mut cgroups = Vec::new();
    for file in plan.cgroups {
        let f = std::fs::OpenOptions::new().write(true).open(file).map_err(|e| format!("open {}: {e}", file.display()))?;
        cgroups.push(OwnedFd::from(f));
    }
    Ok(Confinement { ruleset, cgroups, filter: super::seccomp::landlock_program()? })
}

/// Adds a rule allowing `access` beneath `path` (a missing path is skipped unless `required`;
/// rights that do not apply to a file are dropped for one).
fn allow_path(ruleset: &OwnedFd, path: &Path, access: u64, required: bool) -> Result<(), String> {
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else { return Err(format!("{} holds a NUL byte", path.display())) };
    // SAFETY: `c` is a valid C string; the descriptor returned is taken by `OwnedFd` below.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    if fd < 0 {
        let err = io::Error::last_os_error();
        return if required { Err(format!("open {}: {err}", path.display())) } else { Ok(()) };
    }
    // SAFETY: `fd` was just opened and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let is_dir = std::fs::metadata(path).map(|m| m.is_dir()).unwrap_or(false);
    let access = if is_dir { access } else { access & (FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV) };
    let rule = PathBeneathAttr { allowed_access: access, parent_fd: fd.as_raw_fd() };
    // SAFETY: `rule` outlives the call; both descriptors are open.
    let r = unsafe { libc::syscall(SYS_ADD_RULE, ruleset.as_raw_fd(), RULE_PATH_BENEATH, &rule as *const PathBeneathAttr, 0u32) };
    if r != 0 {
        return Err(format!("add the Landlock rule for {}: {}", path.display(), io::Error::last_os_error()));
    }
    Ok(())
}

/// Makes `cmd`'s child confine itself just before its exec: join the sandbox's cgroups, set
/// `no_new_privs`, enforce the ruleset, install the seccomp filter. (A uid of its own, when
/// asked, is set by `Command` itself, before this.)
pub fn confine(cmd: &mut Command, confinement: Confinement) {
    // SAFETY: `apply` makes only async-signal-safe system calls and allocates nothing.
    unsafe {
        cmd.pre_exec(move || apply(&confinement));
    }
}

/// Confines this process, as [`confine`] confines a child (a sandbox's spawner, once its setup
/// is done; it must have one thread, so that the filter and the ruleset hold for all of it).
pub fn confine_self(confinement: &Confinement) -> io::Result<()> {
    apply(confinement)
}

/// Joins the cgroups, sets `no_new_privs`, enforces the ruleset and installs the seccomp filter:
/// plain system calls on values prepared beforehand (async-signal-safe, no allocation).
fn apply(c: &Confinement) -> io::Result<()> {
    for fd in &c.cgroups {
        // SAFETY: a write of two static bytes to an open descriptor.
        if unsafe { libc::write(fd.as_raw_fd(), b"0\n".as_ptr().cast(), 2) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    // SAFETY: plain system calls on values prepared before.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::syscall(SYS_RESTRICT_SELF, c.ruleset.as_raw_fd(), 0u32) != 0 {
            return Err(io::Error::last_os_error());
        }
        let prog = libc::sock_fprog { len: c.filter.len() as libc::c_ushort, filter: c.filter.as_ptr() as *mut libc::sock_filter };
        if libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &prog as *const libc::sock_fprog) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_follow_the_abi_and_never_claim_a_missing_uid() {
        assert_eq!(layers(1, false, true, false), ["landlock-fs", "seccomp", "no_new_privs"]);
        assert_eq!(layers(4, true, true, false), ["landlock-fs", "landlock-net", "seccomp", "no_new_privs", "uid"]);
        assert_eq!(layers(7, false, false, false), ["landlock-fs", "landlock-net", "landlock-scope-unix", "seccomp", "no_new_privs"]);
        assert_eq!(
            layers(6, false, true, true),
            ["landlock-fs", "landlock-net", "landlock-scope-unix", "landlock-scope-signal", "seccomp", "no_new_privs", "net"]
        );
        assert_eq!(handled_fs(1), FS_ABI1);
        assert_eq!(handled_fs(5), FS_ABI1 | FS_REFER | FS_TRUNCATE | FS_IOCTL_DEV);
        assert_eq!(std::mem::size_of::<PathBeneathAttr>(), 12);
    }
}
