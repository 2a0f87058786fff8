//! Removing a sandbox's directory whatever its sandbox did to the modes inside: sandbox code
//! may take every right away from a directory of its home (`chmod 000`), and the kernel makes
//! the home overlay's work directory with mode 0. Root passes them anyway; a server that is not
//! root (whose sandbox's files are its own) cannot list them, and the sandbox's files would
//! outlive it. So a removal refused for permission gives the owner's rights back to every
//! directory of the tree (never through a symbolic link) and tries again.

use rustix::fs::{Mode, OFlags};
use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Directories given their rights back at most, in one removal.
const MOST_DIRECTORIES: usize = 1_000_000;

/// Removes `dir` and all it holds: a few tries (a keeper or init starting at this moment may
/// still write into it), each refused one for permission after [`open_up`] (until `until`).
pub fn remove_tree(dir: &Path, until: Instant) -> io::Result<()> {
    let mut attempt = 0;
    loop {
        match fs::remove_dir_all(dir) {
            Ok(()) => return Ok(()),
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(err) if attempt < 5 => {
                attempt += 1;
                if err.kind() == io::ErrorKind::PermissionDenied {
                    open_up(dir, until);
                }
            }
            Err(err) => return Err(err),
        }
    }
}

/// Gives the owner read, write and search on every directory under `top` that lacks one of
/// them, walking without following symbolic links (each directory is opened with `O_NOFOLLOW`
/// and changed through that descriptor), until `until` or [`MOST_DIRECTORIES`].
fn open_up(top: &Path, until: Instant) {
    let mut stack: Vec<PathBuf> = vec![top.to_path_buf()];
    let mut seen = 0;
    while let Some(path) = stack.pop() {
        if seen >= MOST_DIRECTORIES || Instant::now() >= until {
            return;
        }
        seen += 1;
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let Ok(held) = rustix::fs::open(&path, flags, Mode::empty()) else { continue };
        let lacking = rustix::fs::fstat(&held).is_ok_and(|st| st.st_mode & 0o700 != 0o700);
        if lacking {
            // The descriptor's link names the directory opened, whatever its path is now.
            let _ = rustix::fs::chmod(format!("/proc/self/fd/{}", held.as_raw_fd()), Mode::RWXU);
        }
        let listing = rustix::fs::openat(&held, ".", OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty());
        let Ok(entries) = listing.and_then(|fd| rustix::fs::Dir::read_from(&fd)) else { continue };
        for entry in entries.flatten() {
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            if matches!(entry.file_type(), rustix::fs::FileType::Directory | rustix::fs::FileType::Unknown) {
                stack.push(path.join(std::ffi::OsStr::from_bytes(name)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::time::Duration;

    /// A tree whose directories lost every right (as sandbox code may leave its home) is removed,
    /// and a symbolic link in it is not followed: the directory it names keeps its mode. As root
    /// every removal passes; the check that matters runs as any other user.
    #[test]
    fn a_tree_without_rights_is_removed_and_links_are_not_followed() {
        let base = std::env::temp_dir().join(format!("smcp-removal-{}", crate::ids::random_hex(4)));
        let outside = base.with_extension("outside");
        fs::create_dir_all(base.join("a/b/c")).unwrap();
        fs::create_dir_all(&outside).unwrap();
        fs::write(base.join("a/b/c/f"), "x").unwrap();
        std::os::unix::fs::symlink(&outside, base.join("a/link")).unwrap();
        fs::set_permissions(&outside, fs::Permissions::from_mode(0o500)).unwrap();
        for d in ["a/b/c", "a/b", "a"] {
            fs::set_permissions(base.join(d), fs::Permissions::from_mode(0o000)).unwrap();
        }
        remove_tree(&base, Instant::now() + Duration::from_secs(10)).unwrap();
        assert!(!base.exists());
        assert_eq!(fs::metadata(&outside).unwrap().permissions().mode() & 0o777, 0o500, "the link was followed");
        fs::set_permissions(&outside, fs::Permissions::from_mode(0o700)).unwrap();
        fs::remove_dir(&outside).unwrap();
    }
}
