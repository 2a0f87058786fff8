//! A way to its home for a Landlock-tier sandbox's own uid when a directory above the state root
//! lets no other uid pass (a root server's state root under `/root`, mode 0700).
//!
//! Without it such a sandbox could not have a uid of its own, and uid 0 without capabilities
//! still passes the owner checks of every root-owned file Landlock does not rule, such as the
//! pathname socket of a root daemon. So its spawner starts in a mount namespace of its own
//! (private: nothing mounted there reaches the host) and, still root, covers the topmost such
//! directory with an empty tmpfs that others may pass, in which the sandbox's home and temporary
//! directory are bound again at the same paths. Commands see their usual paths; the server sees
//! the same files through the host's mounts; what else lay under the covered directory is gone
//! from the sandbox's view (Landlock refused it anyway).

use rustix::fs::{Mode, OFlags};
use rustix::mount::{MountFlags, MountPropagationFlags};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The topmost directory above `path` (or `path` itself) that uids other than its owner and
/// group cannot pass, if there is one.
pub fn blocked_at(path: &Path) -> Option<PathBuf> {
    let mut ancestors: Vec<&Path> = path.ancestors().collect();
    ancestors.reverse();
    ancestors.into_iter().find(|dir| std::fs::metadata(dir).map_or(true, |m| m.permissions().mode() & 0o001 == 0)).map(Path::to_path_buf)
}

/// Makes `home` and `tmp` reachable for any uid, in the calling process's mount namespace, which
/// must be its own and private (`unshare --mount` makes it so). Nothing changes when every
/// directory above them can be passed already. Run it as root, before the uid is dropped.
pub fn open(home: &Path, tmp: &Path) -> Result<(), String> {
    // The directories themselves belong to the sandbox's uid: only those above them count.
    let above = |dir: &Path| dir.parent().and_then(blocked_at);
    let Some(top) = above(home).or_else(|| above(tmp)) else { return Ok(()) };
    if top.parent().is_none() {
        return Err("the root directory lets no other uid pass: no sandbox uid can reach its home".into());
    }
    // The directories themselves, held before the cover hides their paths.
    let held: Vec<_> = [home, tmp]
        .into_iter()
        .map(|dir| {
            rustix::fs::open(dir, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW, Mode::empty())
                .map(|fd| (dir, fd))
                .map_err(|e| format!("open {}: {e}", dir.display()))
        })
        .collect::<Result<_, _>>()?;
    let flags = MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC;
    rustix::mount::mount("tmpfs", &top, "tmpfs", flags, Some(c"mode=0711,size=64k,nr_inodes=256"))
        .map_err(|e| format!("cover {} with a passable directory: {e}", top.display()))?;
    rustix::mount::mount_change(&top, MountPropagationFlags::PRIVATE).map_err(|e| format!("make {} private: {e}", top.display()))?;
    for (dir, fd) in held {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(dir)
            .map_err(|e| format!("make the path to {} on the cover: {e}", dir.display()))?;
        // umask may have taken bits; every directory made on the cover is passable.
        for made in dir.ancestors().take_while(|d| d.starts_with(&top) && *d != top) {
            std::fs::set_permissions(made, std::fs::Permissions::from_mode(0o711)).map_err(|e| format!("{}: {e}", made.display()))?;
        }
        rustix::mount::mount_bind(format!("/proc/self/fd/{}", fd.as_raw_fd()), dir)
            .map_err(|e| format!("bind {} again on the cover: {e}", dir.display()))?;
    }
    std::env::set_current_dir(home).map_err(|e| format!("enter {}: {e}", home.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_topmost_directory_others_cannot_pass_is_found() {
        let base = std::env::temp_dir().join(format!("smcp-passage-{}", crate::ids::random_hex(4)));
        let deep = base.join("a/b/c");
        std::fs::create_dir_all(&deep).unwrap();
        for d in [&base, &base.join("a"), &base.join("a/b"), &deep] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        // Where a directory above the temporary one already blocks others, every answer is it.
        if base.parent().and_then(blocked_at).is_some() {
            std::fs::remove_dir_all(&base).unwrap();
            return;
        }
        assert_eq!(blocked_at(&deep), None);
        std::fs::set_permissions(base.join("a/b"), std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::set_permissions(base.join("a"), std::fs::Permissions::from_mode(0o710)).unwrap();
        assert_eq!(blocked_at(&deep), Some(base.join("a")));
        assert_eq!(blocked_at(&base.join("gone/x")), Some(base.join("gone")), "a directory that is not there passes nobody");
        std::fs::set_permissions(base.join("a"), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(base.join("a/b"), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::remove_dir_all(&base).unwrap();
    }
}
