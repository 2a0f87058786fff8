//! Claims on the host uids of Landlock-tier sandboxes: one file per uid in [`CLAIMS`], naming
//! the sandbox directory that holds it, so that servers with different state roots on one host
//! never give one uid to two sandboxes (a uid's processes are its sandbox's, and are killed with
//! it). A claim whose directory is gone is stale and taken over. Only a root server gives uids,
//! so only root writes here.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

/// Where claims live (root's run-time directory, emptied at boot like the processes it guards).
const CLAIMS: &str = "/run/sandbox-mcp/uids";

/// Claims `uid` for the sandbox at `dir`; false when a live sandbox holds it or the claim cannot
/// be written.
pub fn claim(uid: u32, dir: &Path) -> bool {
    if fs::DirBuilder::new().recursive(true).mode(0o700).create(CLAIMS).is_err() {
        return false;
    }
    let file = Path::new(CLAIMS).join(uid.to_string());
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
    let file = Path::new(CLAIMS).join(uid.to_string());
    if fs::read(&file).is_ok_and(|held| held == dir.as_os_str().as_encoded_bytes()) {
        let _ = fs::remove_file(&file);
    }
}
