//! The root filesystem of an isolated sandbox, assembled by its init inside the new mount
//! namespace and then made the root with `pivot_root`.
//!
//! What the sandbox sees:
//! - the host's system directories ([`SYSTEM_DIRS`]) and the parts of `/etc` programs need
//!   ([`ETC_ENTRIES`]), bound read-only, plus a generated `/etc/passwd`, `/etc/group` and
//!   `/etc/hostname`;
//! - its home at [`HOME`], read-write: the sandbox's home directory on the host, as the only
//!   writable layer of an overlay so that no host path shows ([`mount_home`]);
//! - a private `/tmp`, its own `/proc`, and a read-only `/dev` holding only `null`, `zero`,
//!   `full`, `random`, `urandom` and `tty` (bound from the host), `/dev/shm`, and `/dev/pts`
//!   where the kernel allows a private instance; `/tmp` and `/dev/shm` are tmpfs, or with a disk
//!   of the sandbox's own ([`super::disk`]) its directories, so that they share its space;
//! - when the server's shell lives elsewhere (tests use shells of their own), that one file,
//!   read-only, at the same path.
//!
//! Nothing else of the host: not `/root`, `/home`, the server's state root, other sandboxes, or
//! the host's `/tmp`. The new root itself is a tmpfs remounted read-only at the end.

use rustix::fs::{Mode, OFlags, StatVfsMountFlags};
use rustix::mount::{self, MountFlags, UnmountFlags};
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

/// Host directories every isolated sandbox sees read-only (those that exist; symbolic links,
/// as on merged-/usr systems, are recreated as links).
pub const SYSTEM_DIRS: &[&str] = &["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt"];

/// Entries of the host's `/etc` bound read-only into the sandbox's `/etc`: name resolution,
/// the dynamic linker, time zones, certificates, Debian's alternatives (`awk` and friends) and
/// shell start-up files. Host accounts are not among them: `passwd` and `group` are generated.
pub const ETC_ENTRIES: &[&str] = &[
    "alternatives",
    "bash.bashrc",
    "ca-certificates",
    "ca-certificates.conf",
    "environment",
    "gai.conf",
    "host.conf",
    "hosts",
    "inputrc",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "locale.alias",
    "localtime",
    "mime.types",
    "nsswitch.conf",
    "os-release",
    "profile",
    "profile.d",
    "protocols",
    "resolv.conf",
    "services",
    "shells",
    "ssl",
    "terminfo",
    "timezone",
    "debian_version",
];

/// The sandbox's home inside it: `HOME` and the default working directory.
pub const HOME: &str = "/home/user";

/// Device nodes bound from the host.
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// What the init needs to know to assemble the root.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The home directory, as a path the init can open.
    pub home: PathBuf,
    /// An extra host file made visible read-only at the same path (the server's shell when it is
    /// outside [`SYSTEM_DIRS`]).
    pub extra_file: Option<PathBuf>,
    /// Whether `/tmp` and `/dev/shm` are the home's [`super::disk::TMP`] and
    /// [`super::disk::SHM`] rather than tmpfs.
    pub scratch: bool,
}

/// A path naming an open file descriptor of this process (usable as a bind source once the
/// original path is covered).
fn fd_path(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

pub(super) fn open_path(path: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(path, OFlags::PATH | OFlags::CLOEXEC, Mode::empty())?)
}

/// Builds the new root under a staging mount point, moves into it with `pivot_root`, detaches
/// the host's tree and leaves the process in [`HOME`]; whether the home's mount names no host
/// path (an overlay, or a disk of the sandbox's own, rather than a bind mount of the home, whose
/// host path shows in mountinfo). Each error says which step failed.
pub fn assemble(plan: &Plan) -> Result<bool, String> {
    let step = |what: &str, res: io::Result<()>| res.map_err(|e| format!("{what}: {e}"));
    // Held open before the staging mount can cover their paths (the home may lie under /tmp).
    let home_fd = open_path(&plan.home).map_err(|e| format!("open the sandbox home {}: {e}", plan.home.display()))?;
    let layers = layers_of(&plan.home, plan.scratch);
    let scratch = match plan.scratch {
        true => {
            let open = |sub: &str| {
                rustix::fs::openat(&home_fd, sub, OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())
                    .map_err(|e| format!("open {sub} in the sandbox home: {e}"))
            };
            Some((open(super::disk::TMP)?, open(super::disk::SHM)?))
        }
        false => None,
    };
    let extra = match &plan.extra_file {
        Some(f) => Some((f, open_path(f).map_err(|e| format!("open {}: {e}", f.display()))?)),
        None => None,
    };
    let stage = staging_point()?;
    let nosuid_nodev = MountFlags::NOSUID | MountFlags::NODEV;
    step("mount the new root (tmpfs)", mount_tmpfs(&stage, nosuid_nodev, "mode=0755"))?;
    for dir in SYSTEM_DIRS {
        step(&format!("bind {dir} read-only"), bind_host_entry(Path::new(dir), &stage))?;
    }
    let etc = stage.join("etc");
    step("create /etc", fs::create_dir(&etc))?;
    for name in ETC_ENTRIES {
        step(&format!("bind /etc/{name} read-only"), bind_host_entry(&Path::new("/etc").join(name), &stage))?;
    }
    step("write /etc/passwd", fs::write(etc.join("passwd"), PASSWD))?;
    step("write /etc/group", fs::write(etc.join("group"), GROUP))?;
    step("write /etc/hostname", fs::write(etc.join("hostname"), "sandbox\n"))?;
    let home = stage.join(HOME.trim_start_matches('/'));
    step("create /home/user", fs::create_dir_all(&home))?;
    let overlay = mount_home(&home_fd, layers.as_ref(), &home).map_err(|e| format!("mount the sandbox home: {e}"))?;
    let tmp = stage.join("tmp");
    step("create /tmp", fs::create_dir(&tmp))?;
    match &scratch {
        Some((tmp_fd, _)) => step("bind /tmp from the sandbox's disk", mount::mount_bind(fd_path(tmp_fd), &tmp).map_err(io::Error::from))?,
        None => step("mount /tmp", mount_tmpfs(&tmp, nosuid_nodev, "mode=1777"))?,
    }
    // After /tmp: the file may live under it (tests keep their shells there).
    if let Some((file, fd)) = &extra {
        step(&format!("bind {} read-only", file.display()), bind_file_ro(&fd_path(fd), &stage.join(strip_root(file))))?;
    }
    let shm = scratch.as_ref().map(|(_, shm)| fd_path(shm));
    step("assemble /dev", populate_dev(&stage.join("dev"), shm.as_deref()))?;
    drop((home_fd, layers, extra, scratch));
    let proc = stage.join("proc");
    step("create /proc", fs::create_dir(&proc))?;
    let proc_flags = MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC;
    step("mount /proc", mount::mount("proc", &proc, "proc", proc_flags, None).map_err(io::Error::from))?;
    // The uts namespace is private: the name is the sandbox's alone.
    let _ = rustix::system::sethostname(b"sandbox");
    step("pivot_root", pivot_into(&stage))?;
    step("make the root read-only", mount::mount_remount("/", MountFlags::RDONLY | nosuid_nodev, "").map_err(io::Error::from))?;
    step("enter the home", rustix::process::chdir(HOME).map_err(io::Error::from))?;
    // A disk of the sandbox's own is bound from its own file system, whose paths are not the host's.
    Ok(overlay || plan.scratch)
}

/// The home's name in the sandbox's directory: the overlay's upper layer ([`mount_home`]).
pub const LAYER_HOME: &str = "home";
/// The overlay's empty lower layer, beside the home.
pub const LAYER_LOWER: &str = "lower";
/// The overlay's work directory, which the kernel needs on the home's file system, beside it.
pub const LAYER_WORK: &str = "work";

/// The overlay's options: its layers named relative to the sandbox's directory (the working
/// directory of whoever mounts it), which is all `/proc/self/mountinfo` shows of them.
fn overlay_options(user_xattr: bool) -> String {
    let options = format!("lowerdir={LAYER_LOWER},upperdir={LAYER_HOME},workdir={LAYER_WORK}");
    // In a user namespace the kernel keeps the overlay's own attributes as `user.` ones.
    if user_xattr {
        options + ",userxattr"
    } else {
        options
    }
}

/// Mounts the sandbox home at `target`. Bound as it is, the home's host path (the state root's)
/// would show in the sandbox's `/proc/self/mountinfo`, whose root field is the bound directory's
/// path on its file system. So where the sandbox's directory (`layers`) is at hand and the
/// kernel allows it, the home is the only writable layer of an overlay whose lower layer is
/// empty: nothing is ever copied up, every write lands in the home itself, and mountinfo shows
/// the layers by their names in that directory. Otherwise (no overlayfs, a file system that
/// cannot be an upper layer, a directory this uid may not write) the home is bound as it is.
fn mount_home(home_fd: &OwnedFd, layers: Option<&OwnedFd>, target: &Path) -> io::Result<bool> {
    if let Some(dir) = layers {
        if mount_layers(dir, target).is_ok() {
            return Ok(true);
        }
    }
    mount::mount_bind(fd_path(home_fd), target)?;
    Ok(false)
}

/// The sandbox's directory above `home`, opened, where the home can be an overlay's upper layer
/// ([`mount_home`]): none for a disk of the sandbox's own (`own_fs`: its mount names no host
/// path anyway) or a home that is not a sandbox directory's [`LAYER_HOME`].
fn layers_of(home: &Path, own_fs: bool) -> Option<OwnedFd> {
    let dir = home.parent().filter(|_| !own_fs && home.file_name() == Some(std::ffi::OsStr::new(LAYER_HOME)))?;
    open_path(dir).ok()
}

/// The overlay of [`mount_home`] from the sandbox's directory `dir` (made this process's working
/// directory meanwhile) onto `target`, by the init in the sandbox's user namespace, which keeps
/// the overlay's own attributes as `user.` ones (or, where the file system has none, tries the
/// `trusted.` ones). An overlay that cannot keep them is mounted all the same, crippled (renaming
/// a directory at the top of the home fails with `EXDEV`), so each one is tried before it is
/// kept ([`renames_work`]); `Err` when none works.
fn mount_layers(dir: &OwnedFd, target: &Path) -> io::Result<()> {
    rustix::process::fchdir(dir)?;
    let made = (|| -> io::Result<()> {
        make_layers(dir)?;
        let mut last = io::Error::other("no overlay was tried");
        for user_xattr in [true, false] {
            let options = std::ffi::CString::new(overlay_options(user_xattr)).map_err(io::Error::other)?;
            match mount::mount("overlay", target, "overlay", MountFlags::NOSUID | MountFlags::NODEV, Some(options.as_c_str())) {
                Ok(()) => match renames_work(target) {
                    Ok(()) => return Ok(()),
                    Err(e) => {
                        last = e;
                        let _ = mount::unmount(target, UnmountFlags::DETACH);
                    }
                },
                Err(e) => last = e.into(),
            }
        }
        Err(last)
    })();
    let _ = rustix::process::chdir("/");
    made
}

/// Makes the overlay's [`LAYER_LOWER`] and [`LAYER_WORK`] (mode 0700) in the sandbox's directory
/// `dir`, where they are not already.
pub fn make_layers(dir: &OwnedFd) -> io::Result<()> {
    for layer in [LAYER_LOWER, LAYER_WORK] {
        match rustix::fs::mkdirat(dir, layer, Mode::RWXU) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Whether a directory made at the top of the overlay at `target` can be renamed there (what a
/// crippled overlay refuses), leaving nothing behind.
fn renames_work(target: &Path) -> io::Result<()> {
    let (made, renamed) = (target.join(".sandbox-mcp-probe"), target.join(".sandbox-mcp-probed"));
    fs::create_dir(&made)?;
    let result = fs::rename(&made, &renamed);
    let _ = fs::remove_dir(if result.is_ok() { &renamed } else { &made });
    result
}

const PASSWD: &str = "root:x:0:0:root:/home/user:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";
const GROUP: &str = "root:x:0:\nnogroup:x:65534:\n";

/// A directory of the host's tree to mount the new root on; it is covered only inside the
/// sandbox's private mount namespace.
fn staging_point() -> Result<PathBuf, String> {
    ["/tmp", "/var/tmp", "/mnt"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_dir())
        .ok_or_else(|| "no directory to assemble the root on (/mnt, /tmp and /var/tmp are all missing)".into())
}

fn mount_tmpfs(target: &Path, flags: MountFlags, options: &str) -> io::Result<()> {
    let data = std::ffi::CString::new(options).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    mount::mount("tmpfs", target, "tmpfs", flags, Some(data.as_c_str())).map_err(io::Error::from)
}

fn strip_root(path: &Path) -> PathBuf {
    path.components().filter(|c| matches!(c, std::path::Component::Normal(_))).collect()
}

/// Recreates a host entry under `stage`: a symbolic link as the same link, a directory as a
/// read-only recursive bind, a file as a read-only bind. A missing entry is skipped.
fn bind_host_entry(host: &Path, stage: &Path) -> io::Result<()> {
    let Ok(meta) = fs::symlink_metadata(host) else { return Ok(()) };
    let target = stage.join(strip_root(host));
    if meta.file_type().is_symlink() {
        return symlink(fs::read_link(host)?, &target);
    }
    if meta.is_dir() {
        fs::create_dir_all(&target)?;
        mount::mount_bind_recursive(host, &target)?;
        return remount_ro(&target);
    }
    bind_file_ro(host, &target)
}

fn bind_file_ro(host: &Path, target: &Path) -> io::Result<()> {
    if let Some(parent) = target.parent() {
        fs::create_dir_all(parent)?;
    }
    fs::write(target, b"")?;
    mount::mount_bind(host, target)?;
    remount_ro(target)
}

/// Makes a bind mount read-only. Inside a user namespace the remount must keep the flags the
/// host locked on the original mount (nosuid, nodev, noexec, atime), so they are read first.
fn remount_ro(target: &Path) -> io::Result<()> {
    let have = rustix::fs::statvfs(target)?.f_flag;
    let mut flags = MountFlags::BIND | MountFlags::RDONLY;
    for (st, ms) in [
        (StatVfsMountFlags::NOSUID, MountFlags::NOSUID),
        (StatVfsMountFlags::NODEV, MountFlags::NODEV),
        (StatVfsMountFlags::NOEXEC, MountFlags::NOEXEC),
        (StatVfsMountFlags::NOATIME, MountFlags::NOATIME),
        (StatVfsMountFlags::NODIRATIME, MountFlags::NODIRATIME),
        (StatVfsMountFlags::RELATIME, MountFlags::RELATIME),
    ] {
        if have.contains(st) {
            flags |= ms;
        }
    }
    mount::mount_remount(target, flags, "").map_err(io::Error::from)
}

/// A tmpfs `/dev` with the allowed device nodes bound from the host, the usual links,
/// `/dev/shm` (a tmpfs, or a bind of `shm`) and, where the kernel allows one here, a private
/// `/dev/pts`; read-only once made, so that nothing but `/dev/shm` can be written there.
fn populate_dev(dev: &Path, shm_from: Option<&Path>) -> io::Result<()> {
    fs::create_dir(dev)?;
    mount_tmpfs(dev, MountFlags::NOSUID, "mode=0755")?;
    for name in DEVICES {
        let host = Path::new("/dev").join(name);
        if fs::symlink_metadata(&host).is_ok() {
            let node = dev.join(name);
            fs::write(&node, b"")?;
            mount::mount_bind(&host, &node)?;
        }
    }
    for (link, to) in [("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")]
    {
        symlink(to, dev.join(link))?;
    }
    let shm = dev.join("shm");
    fs::create_dir(&shm)?;
    match shm_from {
        Some(from) => mount::mount_bind(from, &shm)?,
        None => mount_tmpfs(&shm, MountFlags::NOSUID | MountFlags::NODEV, "mode=1777")?,
    }
    let pts = dev.join("pts");
    fs::create_dir(&pts)?;
    let data = c"newinstance,ptmxmode=0666,mode=0620";
    if mount::mount("devpts", &pts, "devpts", MountFlags::NOSUID | MountFlags::NOEXEC, Some(data)).is_ok() {
        symlink("pts/ptmx", dev.join("ptmx"))?;
    }
    rustix::fs::chmod(dev, Mode::from_raw_mode(0o755))?;
    mount::mount_remount(dev, MountFlags::RDONLY | MountFlags::NOSUID, "")?;
    Ok(())
}

/// `pivot_root` into `stage` without a put-old directory: the old root ends up stacked on the
/// new one and is detached at once.
fn pivot_into(stage: &Path) -> io::Result<()> {
    rustix::process::chdir(stage)?;
    rustix::process::pivot_root(".", ".")?;
    mount::unmount(".", UnmountFlags::DETACH)?;
    rustix::process::chdir("/")?;
    Ok(())
}
