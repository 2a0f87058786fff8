//! The disk of a local sandbox with `limits.disk_mb`: a sparse ext4 image of that size in the
//! sandbox's directory, mounted (`mount -o loop`) at its home on the host.
//!
//! The image's root is the home, owned by the sandbox's uid, so inside the sandbox the home is
//! the root `/` of a file system of its own (`/proc/self/mountinfo` names no host path for it).
//! The sandbox's temporary space comes out of the same image: [`TMP`] and [`SHM`], directories
//! of the home, are bound at `/tmp` and `/dev/shm` by a namespace-tier init, and [`TMP`] onto the
//! Landlock tier's `TMPDIR` on the host. A sandbox that fills them gets `ENOSPC`; the host's file
//! system holds at most the image. Only root can mount, and only an isolated sandbox has no other
//! writable place on the host's disks: elsewhere [`check`] says why `disk_mb` is refused.
//!
//! [`release`] detaches both mounts (lazily: processes of a sandbox being killed may still hold
//! files) before the sandbox's directory, image included, is removed; the loop device goes with
//! the last reference to the file system (`mount -o loop` sets it to clear itself).

use super::Isolation;
use rustix::mount::UnmountFlags;
use std::fs;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The image file, in the sandbox's directory.
pub const IMAGE: &str = "disk.img";

/// The directory of the home bound at `/tmp` (and onto a Landlock-tier sandbox's `TMPDIR`).
pub const TMP: &str = ".sandbox-mcp/tmp";

/// The directory of the home bound at `/dev/shm` (namespace tier).
pub const SHM: &str = ".sandbox-mcp/shm";

const MIB: u64 = 1024 * 1024;

/// Where mkfs.ext4 lives when `PATH` lacks the sbin directories.
const SBIN: &[&str] = &["/usr/sbin", "/sbin", "/usr/bin", "/bin"];

/// The program `name` on `PATH` or in the sbin directories.
fn program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(SBIN.iter().map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| crate::provider::process::is_executable(p))
}

/// Why `disk_mb` cannot be enforced for a sandbox of tier `isolation` on this host, or `Ok`.
pub fn check(isolation: Isolation) -> Result<(), String> {
    if isolation == Isolation::None {
        return Err("this server creates local sandboxes without isolation (--isolation none), whose commands can write anywhere \
the server's user can; leave disk_mb out, or run the server with isolation"
            .into());
    }
    if !super::subordinate::host_root() {
        return Err(
            "the server is not root of the host, and only root can mount a sandbox's own file system; leave disk_mb out, or run the \
server as root"
                .into(),
        );
    }
    if !Path::new("/dev/loop-control").exists() {
        return Err("this host has no loop devices (/dev/loop-control is missing); leave disk_mb out, or load the loop module".into());
    }
    for name in ["mkfs.ext4", "mount"] {
        if program(name).is_none() {
            return Err(format!("{name} was not found; leave disk_mb out, or install e2fsprogs and util-linux"));
        }
    }
    Ok(())
}

/// Runs `cmd`, its failure as a sentence naming `what` and what it said.
fn run(what: &str, cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{what}: could not run {}: {e}", cmd.get_program().to_string_lossy()))?;
    if out.status.success() {
        return Ok(());
    }
    let said = String::from_utf8_lossy(&out.stderr);
    let said: String = said.trim().chars().take(300).collect();
    Err(format!("{what} failed ({}): {said}", out.status))
}

/// Makes the disk of the sandbox whose directory is `dir`: an image of `mb` MiB mounted at its
/// `home` (an empty directory), owned by `owner`, holding [`TMP`] and [`SHM`]; with
/// `tmpdir_on_host`, [`TMP`] is also bound onto the Landlock tier's `TMPDIR` there. On failure
/// what was made is left for [`release`] and the removal of `dir`.
pub fn create(dir: &Path, mb: u64, owner: (u32, u32), tmpdir_on_host: Option<&Path>) -> Result<(), String> {
    let image = dir.join(IMAGE);
    let home = dir.join("home");
    let file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&image)
        .map_err(|e| format!("could not create the disk image {}: {e}", image.display()))?;
    file.set_len(mb * MIB).map_err(|e| format!("could not size the disk image to {mb} MiB: {e}"))?;
    drop(file);
    let mkfs = program("mkfs.ext4").ok_or("mkfs.ext4 was not found; install e2fsprogs")?;
    let (uid, gid) = owner;
    // No journal and lazy inode tables: made in milliseconds; no reserved blocks: the sandbox
    // gets all of disk_mb (its uid is never the reserve's).
    run(
        "mkfs.ext4",
        Command::new(mkfs)
            .args(["-q", "-F", "-O", "^has_journal", "-m", "0", "-E"])
            .arg(format!("lazy_itable_init=1,nodiscard,root_owner={uid}:{gid}"))
            .arg(&image)
            .env("LC_ALL", "C"),
    )?;
    let mount = program("mount").ok_or("mount was not found; install util-linux")?;
    run(
        "mount -o loop (the host may have no free loop device)",
        Command::new(mount).args(["-o", "loop,nosuid,nodev"]).arg(&image).arg(&home).env("LC_ALL", "C"),
    )?;
    let made = || -> std::io::Result<()> {
        fs::set_permissions(&home, fs::Permissions::from_mode(0o700))?;
        let _ = fs::remove_dir(home.join("lost+found"));
        let state = home.join(".sandbox-mcp");
        fs::DirBuilder::new().mode(0o700).create(&state)?;
        std::os::unix::fs::chown(&state, Some(uid), Some(gid))?;
        for sub in [TMP, SHM] {
            let path = home.join(sub);
            fs::DirBuilder::new().create(&path)?;
            fs::set_permissions(&path, fs::Permissions::from_mode(0o1777))?;
            std::os::unix::fs::chown(&path, Some(uid), Some(gid))?;
        }
        if let Some(tmpdir) = tmpdir_on_host {
            rustix::mount::mount_bind(home.join(TMP), tmpdir)?;
        }
        Ok(())
    };
    made().map_err(|e| format!("could not prepare the sandbox's disk at {}: {e}", home.display()))
}

/// Detaches the mounts a disk left in sandbox directory `dir` (the Landlock tier's `TMPDIR`,
/// then the home), if any; a directory without them is left as it is. Symbolic links are not
/// followed. Returns how many it detached.
pub fn release(dir: &Path) -> usize {
    if !super::subordinate::host_root() {
        return 0;
    }
    let flags = UnmountFlags::DETACH | UnmountFlags::NOFOLLOW;
    [dir.join(super::super::TMP_DIR), dir.join("home")].iter().filter(|p| rustix::mount::unmount(p.as_path(), flags).is_ok()).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_isolation_is_refused_with_the_reason() {
        let why = check(Isolation::None).unwrap_err();
        assert!(why.contains("without isolation") && why.contains("leave disk_mb out"), "{why}");
    }
}
