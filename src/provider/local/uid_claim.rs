//! Claims on the host uids of isolated sandboxes: one file per host uid, naming the sandbox
//! directory that holds it, so that servers with different state roots on one host never give one
//! uid to two sandboxes (a uid's processes are its sandbox's, and are killed with it). A claim
//! whose directory is gone is stale and taken over. Only a server that gives uids writes here: a
//! root server in [`ROOT_CLAIMS`]; an unprivileged server in a namespace of its own for
//! subordinate ids in its user's run-time directory (`/run/user/<uid>/sandbox-mcp/uids`, where
//! the user's servers of every state root meet), else under its state root.

use crate::provider::local::isolation::subordinate;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Where a root server's claims live (root's run-time directory, emptied at boot like the
/// processes it guards).
const ROOT_CLAIMS: &str = "/run/sandbox-mcp/uids";

/// The claim file of `uid` (an id of this process's user namespace) for the sandbox at `dir`
/// (`<state root>/sandboxes/<id>`), named by the host uid it is. In a namespace for subordinate
/// ids: under the user's run-time directory `/run/user/<host uid>` where it exists and is the
/// user's (every server and keeper of the user finds the same one, whatever its environment),
/// else under the state root.
fn claim_file(uid: u32, dir: &Path) -> PathBuf {
    let Some(entered) = subordinate::entered() else {
        return Path::new(ROOT_CLAIMS).join(uid.to_string());
    };
    let runtime = PathBuf::from(format!("/run/user/{}", entered.host_uid));
    let own = rustix::process::getuid().as_raw();
    let place = if fs::symlink_metadata(&runtime).is_ok_and(|m| m.is_dir() && m.uid() == own) {
        runtime.join("sandbox-mcp").join("uids")
    } else {
        dir.parent().and_then(Path::parent).unwrap_or(dir).join("uids")
    };
    place.join(entered.host_id(uid).to_string())
}

/// Claims `uid` for the sandbox at `dir`; false when a live sandbox holds it or the claim cannot
/// be written.
pub fn claim(uid: u32, dir: &Path) -> bool {
    let file = claim_file(uid, dir);
    if file.parent().is_none_or(|d| fs::DirBuilder::new().recursive(true).mode(0o700).create(d).is_err()) {
        return false;
    }
    for _ in 0..2 {
        match fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&file) {
            Ok(mut f) => return f.write_all(dir.as_os_str().as_encoded_bytes()).is_ok(),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                // The holder's directory, or the one being built under its `.creating-` name.
                let holder = fs::read_to_string(&file).unwrap_or_default();
                let held = Path::new(&holder);
                let building = held.file_name().map(|n| held.with_file_name(format!("{}{}", super::CREATING_PREFIX, n.to_string_lossy())));
                // An empty claim is one being written, unless it is old (its writer died).
                let fresh = fs::metadata(&file).and_then(|m| m.modified()).is_ok_and(|t| t.elapsed().unwrap_or_default().as_secs() < 10);
                if (holder.is_empty() && fresh) || (!holder.is_empty() && (held.exists() || building.is_some_and(|b| b.exists()))) {
                    return false;
                }
                let _ = fs::remove_file(&file);
            }
            Err(_) => return false,
        }
    }
    false
}

/// Gives `uid` back, when the claim is `dir`'s.
pub fn release(uid: u32, dir: &Path) {
    let file = claim_file(uid, dir);
    if fs::read(&file).is_ok_and(|held| held == dir.as_os_str().as_encoded_bytes()) {
        let _ = fs::remove_file(&file);
    }
}
