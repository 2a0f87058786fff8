//! File tools inside an isolated sandbox, done from the server without entering it.
//!
//! Paths mean what they mean inside the sandbox: absolute paths from its root, relative ones
//! from its home. Every lookup starts at the init's root (`/proc/<init>/root`) and is resolved
//! by the kernel with `RESOLVE_IN_ROOT` (`openat2`), so `..` and symbolic links, absolute ones
//! included, never leave the sandbox's tree. Files on `/proc` or `/sys` of the sandbox are
//! refused (a server running as root would otherwise act on them with its own privileges), and
//! so is anything that is not a regular file or directory.
//!
//! The Landlock tier's file tools use the same code with the sandbox's home as the root of every
//! lookup ([`SandboxFs::home`]): its commands share the host's file system, so a race that swaps
//! a directory of the home for a symbolic link must not carry a write of a root server outside.
//!
//! When the server runs as root, each operation runs on its worker thread with the sandbox's
//! uid and gid as effective ids ([`ActAs`], restored on drop): the kernel then checks access as
//! for the sandbox's own root (no host-root powers over what the sandbox can see), and what the
//! server creates belongs to the sandbox. Linux keeps these ids per thread, so no other thread of
//! the server is affected.

use super::enter::Init;
use super::rootfs::HOME;
use crate::provider::{DirEntry, EntryKind, ProviderError};
use rustix::fs::{fstat, fstatfs, mkdirat, openat2, statat, AtFlags, FileType, Gid, Mode, OFlags, ResolveFlags, Uid, CWD};
use rustix::io::Errno;
use rustix::thread::{set_thread_res_gid, set_thread_res_uid};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};

/// `statfs` magic numbers of the file systems file tools refuse.
const PROC_SUPER_MAGIC: i64 = 0x9fa0;
const SYSFS_MAGIC: i64 = 0x6265_6572;

/// One isolated sandbox's file system, opened at its root.
pub struct SandboxFs {
    root: OwnedFd,
    owner: (u32, u32),
    /// Where relative paths start, as a path below `root`.
    base: &'static str,
}

impl SandboxFs {
    /// Opens the root of the sandbox whose init is `init`; `owner` is the host uid and gid of the
    /// sandbox's root (the identity file operations run with).
    pub fn open(id: &str, init: Init, owner: (u32, u32)) -> Result<SandboxFs, ProviderError> {
        let gone = || gone(id);
        if !init.alive() {
            return Err(gone());
        }
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let root = openat2(CWD, init.root_path(), flags, Mode::empty(), ResolveFlags::empty()).map_err(|e| match e {
            Errno::ACCESS | Errno::PERM if init.alive() => out_of_reach(id),
            _ => gone(),
        })?;
        // The pid may have been reused between the check and the open: check again.
        if !init.alive() {
            return Err(gone());
        }
        Ok(SandboxFs { root, owner, base: HOME })
    }

    /// Opens a Landlock-tier sandbox's `home` as the root of every lookup: tool paths must then
    /// be given relative to it (relative paths, or absolute ones with `/` the home).
    pub fn home(home: &std::path::Path, owner: (u32, u32)) -> Result<SandboxFs, ProviderError> {
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW;
        let root = openat2(CWD, home, flags, Mode::empty(), ResolveFlags::empty())
            .map_err(|e| ProviderError::Unavailable(format!("cannot open the sandbox home {}: {e}", home.display())))?;
        Ok(SandboxFs { root, owner, base: "" })
    }

    /// Reads a regular file of at most `max_bytes`.
    pub fn read(&self, path: &str, max_bytes: usize) -> Result<Vec<u8>, ProviderError> {
        let inside = self.inside(path)?;
        let _as = act_as(self.owner)?;
        let flags = OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK;
        let fd = self.open_at(&inside, flags, Mode::empty()).map_err(|e| self.refused(&inside, path, e))?;
        let st = fstat(&fd).map_err(|e| errno_error(path, e))?;
        match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => {}
            FileType::Directory => return Err(ProviderError::Rejected(format!("{path:?} is a directory; use list_files"))),
            _ => return Err(ProviderError::Rejected(format!("{path:?} is not a regular file; read it with run_command"))),
        }
        refuse_kernel_fs(&fd, path)?;
        if st.st_size as u64 > max_bytes as u64 {
            return Err(ProviderError::Rejected(format!(
                "{path:?} is {} bytes, over read_file's limit of {max_bytes}; read parts of it with run_command (head, tail, dd)",
                st.st_size
            )));
        }
        let mut data = Vec::with_capacity(st.st_size.max(0) as usize);
        File::from(fd).take(max_bytes as u64 + 1).read_to_end(&mut data).map_err(|e| io_error(path, e))?;
        if data.len() > max_bytes {
            return Err(ProviderError::Rejected(format!("{path:?} grew over read_file's limit of {max_bytes} bytes while being read")));
        }
        Ok(data)
    }

    /// Writes a regular file, creating missing parent directories.
    pub fn write(&self, path: &str, data: &[u8]) -> Result<u64, ProviderError> {
        let inside = self.inside(path)?;
        let _as = act_as(self.owner)?;
        let (parent, name) = match inside.rsplit_once('/') {
            Some((p, n)) if !n.is_empty() && n != "." && n != ".." => (if p.is_empty() { "/" } else { p }, n),
            _ => return Err(ProviderError::Rejected(format!("{path:?} does not name a file; give a file path"))),
        };
        let dir = self.make_dirs(parent).map_err(|e| errno_error(path, e))?;
        refuse_kernel_fs(&dir, path)?;
        let beneath = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS;
        let base = OFlags::WRONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY;
        let fd = match openat2(&dir, name, base, Mode::empty(), beneath) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => openat2(&dir, name, base | OFlags::CREATE | OFlags::EXCL, Mode::from_raw_mode(0o644), beneath)
                .map_err(|e| errno_error(path, e))?,
            Err(e) => return Err(errno_error(path, e)),
        };
        let st = fstat(&fd).map_err(|e| errno_error(path, e))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(ProviderError::Rejected(format!("{path:?} is not a regular file; write to it with run_command")));
        }
        refuse_kernel_fs(&fd, path)?;
        rustix::fs::ftruncate(&fd, 0).map_err(|e| errno_error(path, e))?;
        File::from(fd).write_all(data).map_err(|e| io_error(path, e))?;
        Ok(data.len() as u64)
    }

    /// Lists a directory (at most `max_entries`, sorted by name; `true` when more were left out).
    pub fn list(&self, path: &str, max_entries: usize) -> Result<(Vec<DirEntry>, bool), ProviderError> {
        let inside = self.inside(path)?;
        let _as = act_as(self.owner)?;
        let fd =
            self.open_at(&inside, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()).map_err(|e| errno_error(path, e))?;
        let dir = rustix::fs::Dir::read_from(&fd).map_err(|e| errno_error(path, e))?;
        let mut entries = Vec::new();
        let mut truncated = false;
        for entry in dir {
            let Ok(entry) = entry else { break };
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            if entries.len() >= max_entries {
                truncated = true;
                break;
            }
            let Ok(st) = statat(&fd, entry.file_name(), AtFlags::SYMLINK_NOFOLLOW) else { continue };
            let kind = match FileType::from_raw_mode(st.st_mode) {
                FileType::Symlink => EntryKind::Symlink,
                FileType::Directory => EntryKind::Dir,
                FileType::RegularFile => EntryKind::File,
                _ => EntryKind::Other,
            };
            let size = if kind == EntryKind::File { st.st_size.max(0) as u64 } else { 0 };
            entries.push(DirEntry { name: String::from_utf8_lossy(name).into_owned(), kind, size });
        }
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok((entries, truncated))
    }

    /// `send_input`: writes a task's input channel in `task_dir` (relative to the home), with
    /// the sandbox's identity, never following a link (see [`crate::provider::local`]'s input).
    pub fn input(&self, input: &crate::provider::Input<'_>, deadline: std::time::Instant) -> Result<(), crate::provider::InputError> {
        let _as = act_as(self.owner)?;
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let at = if self.base.is_empty() { "/" } else { self.base };
        let home = self.open_at(at, flags, Mode::empty()).map_err(|e| errno_error(at, e))?;
        let dir = super::super::input::open_task_dir(&home, input.task_dir)?;
        super::super::input::write(&dir, input.data, input.eof, deadline)
    }

    /// Whether `path` is an existing directory inside the sandbox.
    pub fn is_dir(&self, path: &str) -> bool {
        let Ok(_as) = act_as(self.owner) else { return false };
        self.inside(path).is_ok_and(|p| self.open_at(&p, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()).is_ok())
    }

    /// The sandbox path of a tool path: absolute as given, relative under the home.
    fn inside(&self, path: &str) -> Result<String, ProviderError> {
        if path.is_empty() || path.contains('\0') {
            return Err(ProviderError::Rejected("path must be a non-empty string without NUL bytes".into()));
        }
        Ok(if path.starts_with('/') { path.to_string() } else { format!("{}/{path}", self.base) })
    }

    /// The error of an open of `inside` (tool path `path`) that failed with `errno`: a file of
    /// /proc or /sys the kernel refused (the init's own, say) is named as such.
    fn refused(&self, inside: &str, path: &str, errno: Errno) -> ProviderError {
        if errno == Errno::ACCESS || errno == Errno::PERM {
            if let Ok(fd) = self.open_at(inside, OFlags::PATH | OFlags::CLOEXEC, Mode::empty()) {
                if let Err(err) = refuse_kernel_fs(&fd, path) {
                    return err;
                }
            }
        }
        errno_error(path, errno)
    }

    fn open_at(&self, inside: &str, flags: OFlags, mode: Mode) -> rustix::io::Result<OwnedFd> {
        openat2(&self.root, inside, flags, mode, ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS)
    }

    /// Opens directory `dir` (a sandbox path), creating what is missing of it one level at a time.
    fn make_dirs(&self, dir: &str) -> rustix::io::Result<OwnedFd> {
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        match self.open_at(dir, flags, Mode::empty()) {
            Err(Errno::NOENT) => {}
            other => return other,
        }
        let mut prefix = String::new();
        let mut at = self.open_at("/", flags, Mode::empty())?;
        for part in dir.split('/').filter(|p| !p.is_empty()) {
            prefix.push('/');
            prefix.push_str(part);
            match self.open_at(&prefix, flags, Mode::empty()) {
                Ok(fd) => at = fd,
                Err(Errno::NOENT) => {
                    match mkdirat(&at, part, Mode::from_raw_mode(0o755)) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(e),
                    }
                    at = self.open_at(&prefix, flags, Mode::empty())?;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(at)
    }
}

/// The calling thread's effective uid and gid switched to a sandbox's root for as long as it
/// lives (only when the process runs as root and the sandbox's root is not; a no-op otherwise).
/// The saved ids stay root, so the drop can switch back; the kernel clears the effective
/// capabilities while the uid is not 0. Linux keeps these ids per thread: no other thread of the
/// process is affected.
pub struct ActAs {
    switched: bool,
}

impl ActAs {
    /// Switches the calling thread to `(uid, gid)`, the host ids of a sandbox's root.
    pub fn sandbox((uid, gid): (u32, u32)) -> std::io::Result<ActAs> {
        if !rustix::process::geteuid().is_root() || uid == 0 {
            return Ok(ActAs { switched: false });
        }
        set_thread_res_gid(None, Some(Gid::from_raw(gid)), None)?;
        let guard = ActAs { switched: true };
        set_thread_res_uid(None, Some(Uid::from_raw(uid)), None)?;
        Ok(guard)
    }
}

impl Drop for ActAs {
    fn drop(&mut self) {
        if self.switched {
            // Saved ids are root: both calls succeed; the uid first, then the gid it allows.
            let _ = set_thread_res_uid(None, Some(Uid::ROOT), None);
            let _ = set_thread_res_gid(None, Some(Gid::ROOT), None);
        }
    }
}

/// [`ActAs::sandbox`] for a file tool: a failure to switch is a provider error.
fn act_as(owner: (u32, u32)) -> Result<ActAs, ProviderError> {
    ActAs::sandbox(owner).map_err(|e| ProviderError::Unavailable(format!("cannot take the sandbox's identity for a file operation: {e}")))
}

fn refuse_kernel_fs(fd: &impl AsFd, path: &str) -> Result<(), ProviderError> {
    let kind = fstatfs(fd).map_err(|e| errno_error(path, e))?.f_type as i64;
    if kind == PROC_SUPER_MAGIC || kind == SYSFS_MAGIC {
        return Err(ProviderError::Rejected(format!(
            "{path:?} is on /proc or /sys; file tools do not touch kernel files, use run_command"
        )));
    }
    Ok(())
}

fn gone(id: &str) -> ProviderError {
    ProviderError::Rejected(format!(
        "sandbox {id} is gone: the init that held its namespaces is no longer running, so every process in it has ended. \
Call kill_sandbox to remove what is left, and create_sandbox for a new sandbox"
    ))
}

/// The error of a sandbox whose init runs, in a user namespace this server process has no rights
/// over.
pub fn out_of_reach(id: &str) -> ProviderError {
    ProviderError::Unavailable(format!(
        "sandbox {id} runs in a user namespace this server process cannot reach (it was made by a server of this state root with other subordinate-id settings, see --subordinate-ids); use it from a server started as the one that made it"
    ))
}

/// The error of a sandbox whose init died (the keeper was killed, or the host rebooted).
pub fn init_gone(id: &str) -> ProviderError {
    gone(id)
}

fn errno_error(path: &str, e: Errno) -> ProviderError {
    io_error(path, std::io::Error::from(e))
}

fn io_error(path: &str, e: std::io::Error) -> ProviderError {
    let msg = match e.raw_os_error().map(Errno::from_raw_os_error) {
        Some(Errno::NOENT) => format!("{path:?} does not exist in the sandbox; check the path with list_files"),
        Some(Errno::ROFS) => {
            format!("{path:?} is on a read-only part of the sandbox (the system directories are read-only); write under {HOME} or /tmp")
        }
        Some(Errno::ACCESS) | Some(Errno::PERM) => format!("permission denied on {path:?}"),
        Some(Errno::LOOP) => format!("{path:?} is a symbolic link; write to its target's path instead"),
        Some(Errno::NOTDIR) => format!("a part of {path:?} is not a directory"),
        Some(Errno::ISDIR) => format!("{path:?} is a directory; give a file path"),
        Some(Errno::NXIO) => format!("{path:?} is not a regular file; use run_command"),
        Some(Errno::NOSPC) | Some(Errno::DQUOT) => format!("no space left for {path:?} in the sandbox"),
        _ => format!("{path:?}: {e}"),
    };
    ProviderError::Rejected(msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_paths_map_to_sandbox_paths() {
        let home = SandboxFs::home(std::path::Path::new("/"), (0, 0)).unwrap();
        let isolated = SandboxFs { base: HOME, ..SandboxFs::home(std::path::Path::new("/"), (0, 0)).unwrap() };
        assert_eq!(isolated.inside("a/b.txt").unwrap(), "/home/user/a/b.txt");
        assert_eq!(isolated.inside("/etc/hosts").unwrap(), "/etc/hosts");
        assert_eq!(home.inside("a/b.txt").unwrap(), "/a/b.txt");
        assert!(isolated.inside("").is_err());
        assert!(home.inside("a\0b").is_err());
    }
}
