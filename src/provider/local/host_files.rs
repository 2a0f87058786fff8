//! The file tools of an unisolated sandbox: paths resolved lexically inside the sandbox home,
//! symbolic links of existing ancestors included (an isolated sandbox's, and a Landlock-tier
//! sandbox's, whose code may race the server, are in [`super::isolation::files`]; the lexical
//! check here still gives the Landlock tier its clear refusal of a path outside the home).

use super::LocalProvider;
use crate::provider::{DirEntry, EntryKind, ProviderError};
use std::fs;
use std::io::{self, Read};
use std::path::{Component, Path, PathBuf};

impl LocalProvider {
    /// Resolves a file-tool path inside the sandbox home; anything outside is refused.
    pub(super) fn resolve(&self, id: &str, path: &str) -> Result<PathBuf, ProviderError> {
        resolve_inside(&self.home(id), path)
    }

    /// `read_file` in unisolated sandbox `sandbox_id`.
    pub(super) fn host_read(&self, sandbox_id: &str, path: &str, max_bytes: usize) -> Result<Vec<u8>, ProviderError> {
        let full = self.resolve(sandbox_id, path)?;
        let meta = fs::metadata(&full).map_err(|err| file_error(path, err))?;
        if meta.is_dir() {
            return Err(ProviderError::Rejected(format!("{path:?} is a directory; use list_files")));
        }
        if !meta.is_file() {
            // A FIFO or device would block (or never end) on open or read.
            return Err(ProviderError::Rejected(format!("{path:?} is not a regular file; read it with run_command")));
        }
        if meta.len() > max_bytes as u64 {
            return Err(ProviderError::Rejected(format!(
                "{path:?} is {} bytes, over read_file's limit of {max_bytes}; read parts of it with run_command (head, tail, dd)",
                meta.len()
            )));
        }
        let mut data = Vec::with_capacity(meta.len() as usize);
        fs::File::open(&full).and_then(|f| f.take(max_bytes as u64 + 1).read_to_end(&mut data)).map_err(|err| file_error(path, err))?;
        if data.len() > max_bytes {
            return Err(ProviderError::Rejected(format!("{path:?} grew over read_file's limit of {max_bytes} bytes while being read")));
        }
        Ok(data)
    }

    /// `write_file` in unisolated sandbox `sandbox_id`.
    pub(super) fn host_write(&self, sandbox_id: &str, path: &str, data: &[u8]) -> Result<u64, ProviderError> {
        let full = self.resolve(sandbox_id, path)?;
        if let Some(parent) = full.parent() {
            fs::create_dir_all(parent).map_err(|err| file_error(path, err))?;
        }
        // Resolve again: the directories just created must not have raced into a symlink escape.
        let full = self.resolve(sandbox_id, path)?;
        if let Ok(existing) = fs::symlink_metadata(&full) {
            if existing.file_type().is_symlink() {
                // Its target may not exist yet, so the check above cannot see where it leads.
                return Err(ProviderError::Rejected(format!("{path:?} is a symbolic link; write to its target's path instead")));
            }
            if existing.is_dir() {
                return Err(ProviderError::Rejected(format!("{path:?} is a directory; give a file path")));
            }
            if !existing.is_file() {
                return Err(ProviderError::Rejected(format!("{path:?} is not a regular file; write to it with run_command")));
            }
        }
        fs::write(&full, data).map_err(|err| file_error(path, err))?;
        Ok(data.len() as u64)
    }

    /// `list_files` in unisolated sandbox `sandbox_id`.
    pub(super) fn host_list(&self, sandbox_id: &str, path: &str, max_entries: usize) -> Result<(Vec<DirEntry>, bool), ProviderError> {
        let full = self.resolve(sandbox_id, path)?;
        let rd = fs::read_dir(&full).map_err(|err| file_error(path, err))?;
        let mut entries = Vec::new();
        let mut truncated = false;
        for entry in rd.flatten() {
            if entries.len() >= max_entries {
                truncated = true;
                break;
            }
            let Ok(ft) = entry.file_type() else { continue };
            let kind = if ft.is_symlink() {
                EntryKind::Symlink
            } else if ft.is_dir() {
                EntryKind::Dir
            } else if ft.is_file() {
                EntryKind::File
            } else {
                EntryKind::Other
            };
            let size = if kind == EntryKind::File { entry.metadata().map(|m| m.len()).unwrap_or(0) } else { 0 };
            entries.push(DirEntry { name: entry.file_name().to_string_lossy().into_owned(), kind, size });
        }
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok((entries, truncated))
    }
}

/// Lexically resolves `path` (relative paths against `home`) and refuses anything that leaves
/// `home`, including through symbolic links of existing ancestors.
pub fn resolve_inside(home: &Path, path: &str) -> Result<PathBuf, ProviderError> {
    let outside = || {
        ProviderError::Rejected(format!(
            "path {path:?} is outside the sandbox; local file tools only reach the sandbox home {} (relative paths start there)",
            home.display()
        ))
    };
    if path.is_empty() || path.contains('\0') {
        return Err(ProviderError::Rejected("path must be a non-empty string without NUL bytes".into()));
    }
    let given = Path::new(path);
    let relative = if given.is_absolute() { given.strip_prefix(home).map_err(|_| outside())? } else { given };
    let mut out = home.to_path_buf();
    let mut depth = 0usize;
    for comp in relative.components() {
        match comp {
            Component::Normal(c) => {
                out.push(c);
                depth += 1;
            }
            Component::CurDir => {}
            Component::ParentDir => {
                if depth == 0 {
                    return Err(outside());
                }
                out.pop();
                depth -= 1;
            }
            Component::RootDir | Component::Prefix(_) => return Err(outside()),
        }
    }
    // Symbolic links: the deepest existing ancestor must resolve inside the home.
    let real_home = fs::canonicalize(home).map_err(|err| ProviderError::Unavailable(format!("sandbox home is unusable: {err}")))?;
    let mut probe = out.clone();
    loop {
        match fs::canonicalize(&probe) {
            Ok(real) => {
                if !real.starts_with(&real_home) {
                    return Err(outside());
                }
                break;
            }
            Err(_) => {
                if !probe.pop() {
                    return Err(outside());
                }
            }
        }
    }
    Ok(out)
}

pub(super) fn file_error(path: &str, err: io::Error) -> ProviderError {
    match err.kind() {
        io::ErrorKind::NotFound => {
            ProviderError::Rejected(format!("{path:?} does not exist in the sandbox; check the path with list_files"))
        }
        io::ErrorKind::PermissionDenied => ProviderError::Rejected(format!("permission denied on {path:?}")),
        _ => ProviderError::Rejected(format!("{path:?}: {err}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids;

    #[test]
    fn paths_stay_inside_home() {
        let tmp = std::env::temp_dir().join(format!("smcp-resolve-{}", ids::random_hex(4)));
        let home = tmp.join("home");
        fs::create_dir_all(home.join("sub")).unwrap();
        std::os::unix::fs::symlink("/etc", home.join("escape")).unwrap();
        assert_eq!(resolve_inside(&home, "a.txt").unwrap(), home.join("a.txt"));
        assert_eq!(resolve_inside(&home, "sub/../b").unwrap(), home.join("b"));
        assert_eq!(resolve_inside(&home, home.join("sub/c").to_str().unwrap()).unwrap(), home.join("sub/c"));
        for bad in ["../x", "/etc/passwd", "sub/../../x", "escape/passwd", "escape", ""] {
            assert!(resolve_inside(&home, bad).is_err(), "{bad}");
        }
        fs::remove_dir_all(&tmp).unwrap();
    }
}
