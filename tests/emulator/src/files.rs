//! envd's file access in the emulator: where a sandbox's files are ([`Tree`]), path resolution
//! (`~`, and relative paths under the sandbox's HOME), the plain HTTP `/files` endpoint
//! (download; multipart or octet-stream upload), the multipart parser, and the `EntryInfo`
//! objects of the filesystem service.
//!
//! Paths mean what they mean inside the sandbox, as for envd: `~` and relative paths start at the
//! sandbox's home, absolute ones at the sandbox's root, and paths reported back are those sandbox
//! paths. Like envd, paths are not confined to the home. Without isolation the sandbox's root is
//! the host's `/` (the emulator isolates nothing of its own). With namespace isolation the
//! emulator reaches the sandbox's files from the host under `/proc/<init>/root` and resolves
//! every symbolic link itself, inside that tree (see [`Tree::reach`]); when the emulator runs as
//! root, each file operation runs with the sandbox root's host uid and gid ([`Tree::act`]).

use super::control::rfc3339;
use super::http::{HttpReply, HttpRequest};
use sandbox_mcp::provider::local::isolation::files::ActAs;
use serde_json::{json, Value};
use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

/// Most symbolic links one path resolution follows (Linux's own limit).
const MAX_LINKS: usize = 40;

/// The uid and gid the kernel shows for ids a user namespace does not map.
const OVERFLOW_ID: u32 = 65_534;

/// One sandbox's file tree as the emulator reaches it from the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tree {
    /// The host path of the sandbox's `/`: `/` without isolation; with it, `/proc/<init>/root`,
    /// or that directory held open by the emulator ([`Tree::held`]).
    root: PathBuf,
    /// The sandbox's home, as a sandbox path.
    home: PathBuf,
    /// The host uid and gid of the sandbox's root, for isolated sandboxes (see [`Tree::act`]).
    owner: Option<(u32, u32)>,
    /// `/proc/<init>` of an isolated sandbox (its id maps).
    proc_dir: PathBuf,
    /// The sandbox's `/`, opened by the emulator itself (see [`Tree::held`]).
    held: Option<Held>,
}

/// A directory the emulator holds open, compared by identity.
#[derive(Debug, Clone)]
struct Held(std::sync::Arc<fs::File>);

impl PartialEq for Held {
    fn eq(&self, other: &Held) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Held {}

impl Tree {
    /// A tree whose `/` is the host path `root` (`/` for an unisolated sandbox), whose home is
    /// the sandbox path `home`, and whose root is host uid and gid `owner` (isolated sandboxes;
    /// file operations take that identity, see [`Tree::act`]).
    pub fn new(root: PathBuf, home: PathBuf, owner: Option<(u32, u32)>) -> Tree {
        let proc_dir = root.parent().unwrap_or(Path::new("/")).to_path_buf();
        Tree { root, home, owner, proc_dir, held: None }
    }

    /// [`Tree::new`], with the isolated sandbox's `/` (`/proc/<init>/root`) opened now, with the
    /// emulator's own rights, and reached through `/proc/self/fd` from then on. Following
    /// `/proc/<init>/root` takes the right to trace the sandbox's init, which the sandbox root's
    /// identity ([`Tree::act`]) does not have: the init is not dumpable, and it is the host's
    /// user namespace that guards it.
    pub fn held(root: PathBuf, home: PathBuf, owner: (u32, u32)) -> io::Result<Tree> {
        use std::os::fd::AsRawFd;
        let dir = fs::File::open(&root)?;
        let proc_dir = root.parent().unwrap_or(Path::new("/")).to_path_buf();
        let via = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
        Ok(Tree { root: via, home, owner: Some(owner), proc_dir, held: Some(Held(std::sync::Arc::new(dir))) })
    }

    /// Whether the sandbox's `/` is not the host's (its paths must be resolved in [`Tree::reach`]).
    pub fn isolated(&self) -> bool {
        self.root != Path::new("/")
    }

    /// The sandbox path a client's path names (see [`resolve`]).
    pub fn resolve(&self, given: &str) -> PathBuf {
        resolve(&self.home, given)
    }

    /// Where the emulator reaches sandbox path `path` (absolute, from [`Tree::resolve`]) on the
    /// host. Without isolation that is `path` itself. With isolation every symbolic link on the
    /// way (the last component too when `follow_final`) is read and resolved by the emulator as
    /// the sandbox would resolve it, absolute targets from the sandbox's root and `..` never
    /// above it, so that the host path it returns holds no link the kernel would follow out of
    /// the sandbox's tree (an absolute link followed through `/proc/<init>/root` by the kernel
    /// would lead into the host's `/`). This is a test tool, not a security boundary: a process
    /// inside that swaps a directory for a link between this check and the use can still lead
    /// one operation outside (the product's file tools use `openat2(RESOLVE_IN_ROOT)` instead).
    /// The sandbox's `/proc` and `/sys` are refused: the emulator may run as root, and what it
    /// writes there would act on the host's kernel.
    pub fn reach(&self, path: &Path, follow_final: bool) -> io::Result<PathBuf> {
        if !self.isolated() {
            return Ok(path.to_path_buf());
        }
        let inside = self.resolve_links(path, follow_final)?;
        if inside.starts_with("/proc") || inside.starts_with("/sys") {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "the path is on the sandbox's /proc or /sys, which the emulator does not touch",
            ));
        }
        Ok(self.host(&inside))
    }

    /// The host path of a sandbox path whose links are resolved.
    fn host(&self, inside: &Path) -> PathBuf {
        let mut out = self.root.clone();
        out.extend(inside.components().filter_map(|c| match c {
            Component::Normal(n) => Some(n),
            _ => None,
        }));
        out
    }

    /// `path` with every symbolic link resolved inside the tree (see [`Tree::reach`]).
    fn resolve_links(&self, path: &Path, follow_final: bool) -> io::Result<PathBuf> {
        fn push_parts(todo: &mut Vec<OsString>, path: &Path) {
            for c in path.components().rev() {
                match c {
                    Component::Normal(n) => todo.push(n.to_os_string()),
                    Component::ParentDir => todo.push("..".into()),
                    Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
                }
            }
        }
        let mut todo = Vec::new();
        push_parts(&mut todo, path);
        let mut done = PathBuf::from("/");
        let mut links = 0;
        while let Some(part) = todo.pop() {
            if part == ".." {
                done.pop();
                continue;
            }
            let next = done.join(&part);
            let host = self.host(&next);
            let link = fs::symlink_metadata(&host).is_ok_and(|md| md.file_type().is_symlink());
            if link && (follow_final || !todo.is_empty()) {
                links += 1;
                if links > MAX_LINKS {
                    return Err(io::Error::other(format!("{}: too many levels of symbolic links", path.display())));
                }
                let target = fs::read_link(&host)?;
                if target.has_root() {
                    done = PathBuf::from("/");
                }
                push_parts(&mut todo, &target);
            } else {
                done = next;
            }
        }
        Ok(done)
    }

    /// Makes the calling thread act as the sandbox's root for as long as the guard lives, when
    /// the sandbox is isolated and the emulator runs as root (a no-op otherwise: an unprivileged
    /// emulator's uid already is the sandbox root's). Its file operations are then checked as the
    /// sandbox's own, and what it creates belongs to the sandbox; without this, host root could
    /// not even create files on the sandbox's private `/tmp` (a file system of the sandbox's
    /// user namespace, where host root has no id: `EOVERFLOW`). Linux keeps these ids per
    /// thread, so the emulator's other threads are unaffected.
    pub fn act(&self) -> io::Result<Option<ActAs>> {
        self.owner.map(ActAs::sandbox).transpose()
    }

    /// The user and group names the sandbox sees for host ids `uid` and `gid`: from the host's
    /// `/etc/passwd` and `/etc/group` without isolation; with it, the ids as the sandbox's user
    /// namespace maps them, named by the sandbox's own files.
    pub fn names(&self, uid: u32, gid: u32) -> (String, String) {
        if !self.isolated() {
            return (user_name(uid), group_name(gid));
        }
        let inside = |map: &str, id: u32| map_id(&fs::read_to_string(self.proc_dir.join(map)).unwrap_or_default(), id);
        let file = |name: &str| self.reach(Path::new(name), true).unwrap_or_else(|_| PathBuf::from("/nonexistent"));
        (name_from(&file("/etc/passwd"), inside("uid_map", uid)), name_from(&file("/etc/group"), inside("gid_map", gid)))
    }
}

/// The id inside a user namespace of host id `id`, by the namespace's `uid_map` or `gid_map`
/// text (lines `inside outside count`); the overflow id when it is not mapped.
pub fn map_id(map: &str, id: u32) -> u32 {
    map.lines()
        .find_map(|line| {
            let mut f = line.split_whitespace().map(|x| x.parse::<u64>().ok());
            let (Some(Some(inside)), Some(Some(outside)), Some(Some(count))) = (f.next(), f.next(), f.next()) else { return None };
            let id = u64::from(id);
            (outside <= id && id < outside + count).then(|| u32::try_from(inside + (id - outside)).ok()).flatten()
        })
        .unwrap_or(OVERFLOW_ID)
}

/// Largest file `GET /files` serves (it is read into memory).
pub const MAX_DOWNLOAD_BYTES: u64 = 256 * 1024 * 1024;

/// envd's JSON error body for `/files`: `{"code": status, "message": ...}`.
pub fn error(status: u16, message: impl Into<String>) -> HttpReply {
    HttpReply::json(status, &json!({ "code": status, "message": message.into() }))
}

/// Resolves a path as envd does: empty or `~` is the home, `~/x` and relative paths are under
/// the home, absolute paths stay; `.` and `..` are removed lexically.
pub fn resolve(home: &Path, given: &str) -> PathBuf {
    let joined = if given.is_empty() || given == "~" {
        home.to_path_buf()
    } else if let Some(rest) = given.strip_prefix("~/") {
        home.join(rest)
    } else if Path::new(given).is_absolute() {
        PathBuf::from(given)
    } else {
        home.join(given)
    };
    let mut out = PathBuf::from("/");
    for comp in joined.components() {
        match comp {
            Component::Normal(c) => out.push(c),
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
    out
}

fn show(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// The `/files` answer to an error reaching `path`: 403 for a path the emulator refuses, else 500.
fn reach_error(path: &Path, err: &io::Error) -> HttpReply {
    let status = if err.kind() == io::ErrorKind::PermissionDenied { 403 } else { 500 };
    error(status, format!("error resolving path '{}': {err}", show(path)))
}

/// `GET /files?path=…`: the file's bytes, or 404 / 400 with envd's messages.
pub fn download(tree: &Tree, req: &HttpRequest) -> HttpReply {
    let path = tree.resolve(req.query("path").unwrap_or(""));
    let _as = match tree.act() {
        Ok(a) => a,
        Err(err) => return error(500, format!("error taking the sandbox's identity: {err}")),
    };
    let host = match tree.reach(&path, true) {
        Ok(h) => h,
        Err(err) => return reach_error(&path, &err),
    };
    let md = match fs::metadata(&host) {
        Ok(md) => md,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return error(404, format!("path '{}' does not exist", show(&path))),
        Err(err) => return error(500, format!("error checking if path exists '{}': {err}", show(&path))),
    };
    if md.is_dir() {
        return error(400, format!("path '{}' is a directory", show(&path)));
    }
    if md.len() > MAX_DOWNLOAD_BYTES {
        return error(
            500,
            format!("path '{}' is {} bytes, over the emulator's download limit of {MAX_DOWNLOAD_BYTES}", show(&path), md.len()),
        );
    }
    let data = match fs::read(&host) {
        Ok(d) => d,
        Err(err) => return error(500, format!("error opening file '{}': {err}", show(&path))),
    };
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let content_type = sniff(&data);
    HttpReply::bytes(200, content_type, data)
        .with_header("Content-Disposition", &format!("inline; filename=\"{}\"", name.replace('"', "")))
        .with_header("Vary", "Accept-Encoding")
}

/// A coarse version of Go's content sniffing: text or binary.
fn sniff(data: &[u8]) -> &'static str {
    let head = &data[..data.len().min(512)];
    if head.is_empty() {
        return "text/plain; charset=utf-8";
    }
    let cut = std::str::from_utf8(head).err().map(|e| e.valid_up_to()).unwrap_or(head.len());
    let textual = head.len() - cut < 4 && !head.iter().any(|b| matches!(b, 0..=8 | 0x0e..=0x1a | 0x1c..=0x1f));
    if textual {
        "text/plain; charset=utf-8"
    } else {
        "application/octet-stream"
    }
}

/// `POST /files`: multipart parts named `file` (destination: the `path` parameter, else the
/// part's file name) or a raw `application/octet-stream` body (destination: `path`).
pub fn upload(tree: &Tree, req: &HttpRequest) -> HttpReply {
    if req.header("Content-Encoding").is_some_and(|e| !e.eq_ignore_ascii_case("identity")) {
        return error(400, "error decompressing request body: the emulator does not support Content-Encoding on uploads");
    }
    let media = req.media_type();
    let param = req.query("path");
    let _as = match tree.act() {
        Ok(a) => a,
        Err(err) => return error(500, format!("error taking the sandbox's identity: {err}")),
    };
    let mut written = Vec::new();
    if media == "application/octet-stream" {
        let Some(p) = param else {
            return error(400, "path query parameter is required for raw body upload");
        };
        let path = tree.resolve(p);
        if let Err(reply) = write_file(tree, &path, &req.body) {
            return reply;
        }
        written.push(path);
    } else if media.starts_with("multipart/") {
        let Some(boundary) = boundary(req.header("Content-Type").unwrap_or("")) else {
            return error(500, "error parsing multipart form: no multipart boundary param in Content-Type");
        };
        let parts = match parse_multipart(&req.body, &boundary) {
            Ok(p) => p,
            Err(e) => return error(500, format!("error reading form: {e}")),
        };
        for part in parts.iter().filter(|p| p.name.as_deref() == Some("file")) {
            let target = match (param, part.filename.as_deref()) {
                (Some(p), _) => p,
                (None, Some(f)) => f,
                (None, None) => return error(400, "error getting multipart custom part file name: the part has no file name"),
            };
            let path = tree.resolve(target);
            if written.contains(&path) {
                return error(
                    400,
                    format!(
                        "you cannot upload multiple files to the same path '{}' in one upload request, only the first specified file was uploaded",
                        show(&path)
                    ),
                );
            }
            if let Err(reply) = write_file(tree, &path, &part.body) {
                return reply;
            }
            written.push(path);
        }
    } else {
        return error(
            400,
            format!(
                "unsupported content type: {}, expected multipart/form-data or application/octet-stream",
                req.header("Content-Type").unwrap_or("")
            ),
        );
    }
    let entries: Vec<Value> = written
        .iter()
        .map(|p| json!({ "path": show(p), "name": p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(), "type": "file" }))
        .collect();
    HttpReply::json(200, &Value::Array(entries))
}

/// Writes sandbox path `path` (reported as is in errors), creating missing directories.
fn write_file(tree: &Tree, path: &Path, data: &[u8]) -> Result<(), HttpReply> {
    let host = tree.reach(path, true).map_err(|e| reach_error(path, &e))?;
    if let Some(parent) = host.parent() {
        fs::create_dir_all(parent).map_err(|e| error(500, format!("error ensuring directories: {e}")))?;
    }
    if host.is_dir() {
        return Err(error(400, format!("path is a directory: {}", show(path))));
    }
    fs::write(&host, data).map_err(|e| {
        if e.raw_os_error() == Some(28) {
            error(507, format!("not enough disk space available: {e}"))
        } else {
            error(500, format!("error opening file: {e}"))
        }
    })
}

/// The `boundary` parameter of a multipart content type.
pub fn boundary(content_type: &str) -> Option<String> {
    content_type.split(';').skip(1).find_map(|param| {
        let (k, v) = param.split_once('=')?;
        if !k.trim().eq_ignore_ascii_case("boundary") {
            return None;
        }
        let v = v.trim().trim_matches('"');
        (!v.is_empty()).then(|| v.to_string())
    })
}

/// One multipart part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// The form field name.
    pub name: Option<String>,
    /// The file name.
    pub filename: Option<String>,
    /// The content.
    pub body: Vec<u8>,
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    if needle.is_empty() || from > hay.len() {
        return None;
    }
    hay[from..].windows(needle.len()).position(|w| w == needle).map(|i| i + from)
}

/// Parses a `multipart/form-data` body (RFC 7578) into its parts.
pub fn parse_multipart(body: &[u8], boundary: &str) -> Result<Vec<Part>, String> {
    let dash = format!("--{boundary}");
    let delim = format!("\r\n--{boundary}");
    // The first delimiter may come without the leading CRLF.
    let mut pos = if body.starts_with(dash.as_bytes()) {
        dash.len()
    } else {
        find(body, delim.as_bytes(), 0).ok_or("no multipart boundary found")? + delim.len()
    };
    let mut parts = Vec::new();
    loop {
        if body[pos..].starts_with(b"--") {
            return Ok(parts);
        }
        // Transport padding, then CRLF.
        while body.get(pos).is_some_and(|b| *b == b' ' || *b == b'\t') {
            pos += 1;
        }
        if !body[pos..].starts_with(b"\r\n") {
            return Err("malformed multipart delimiter line".into());
        }
        pos += 2;
        let (head, content_start) = if body[pos..].starts_with(b"\r\n") {
            (String::new(), pos + 2)
        } else {
            let head_end = find(body, b"\r\n\r\n", pos).ok_or("multipart part headers do not end")?;
            (String::from_utf8_lossy(&body[pos..head_end]).into_owned(), head_end + 4)
        };
        let next = find(body, delim.as_bytes(), content_start).ok_or("multipart: NextPart: EOF")?;
        let (name, filename) = disposition(&head);
        parts.push(Part { name, filename, body: body[content_start..next].to_vec() });
        pos = next + delim.len();
        if pos > body.len() {
            return Err("truncated multipart body".into());
        }
    }
}

fn disposition(head: &str) -> (Option<String>, Option<String>) {
    let Some(line) = head.split("\r\n").find(|l| l.to_ascii_lowercase().starts_with("content-disposition:")) else {
        return (None, None);
    };
    let mut name = None;
    let mut filename = None;
    for param in line.split(';').skip(1) {
        let Some((k, v)) = param.split_once('=') else { continue };
        let v = v.trim();
        let v = v.strip_prefix('"').and_then(|v| v.strip_suffix('"')).unwrap_or(v).replace("\\\"", "\"").replace("\\\\", "\\");
        match k.trim().to_ascii_lowercase().as_str() {
            "name" => name = Some(v),
            "filename" => filename = Some(v),
            _ => {}
        }
    }
    (name, filename)
}

/// The `EntryInfo` of host path `path` in `tree` (not following a final symlink), zero values
/// omitted; `shown` is the (sandbox) path reported.
pub fn entry_info(tree: &Tree, path: &Path, shown: &Path) -> io::Result<Value> {
    let md = fs::symlink_metadata(path)?;
    let ft = md.file_type();
    let (owner, group) = tree.names(md.uid(), md.gid());
    let mut entry = json!({
        "name": shown.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "/".into()),
        "path": show(shown),
        "permissions": go_mode_string(md.mode()),
        "owner": owner,
        "group": group,
        "modifiedTime": rfc3339(md.mtime(), u32::try_from(md.mtime_nsec()).unwrap_or(0)),
    });
    let kind = if ft.is_symlink() {
        Some("FILE_TYPE_SYMLINK")
    } else if ft.is_dir() {
        Some("FILE_TYPE_DIRECTORY")
    } else if ft.is_file() {
        Some("FILE_TYPE_FILE")
    } else {
        None
    };
    if let Some(kind) = kind {
        entry["type"] = json!(kind);
    }
    if md.len() != 0 {
        // int64 is a JSON string in the proto3 mapping.
        entry["size"] = json!(md.len().to_string());
    }
    let perm = md.permissions().mode() & 0o777;
    if perm != 0 {
        entry["mode"] = json!(perm);
    }
    if ft.is_symlink() {
        if let Ok(target) = fs::read_link(path) {
            entry["symlinkTarget"] = json!(show(&target));
        }
    }
    Ok(entry)
}

/// Go's `FileMode.String()` for a Unix `st_mode` (`-rw-r--r--`, `drwxr-xr-x`, `Lrwxrwxrwx`).
pub fn go_mode_string(mode: u32) -> String {
    let mut out = String::new();
    match mode & 0o170000 {
        0o040000 => out.push('d'),
        0o120000 => out.push('L'),
        0o060000 => out.push('D'),
        0o020000 => out.push('D'),
        0o010000 => out.push('p'),
        0o140000 => out.push('S'),
        _ => {}
    }
    if mode & 0o4000 != 0 {
        out.push('u');
    }
    if mode & 0o2000 != 0 {
        out.push('g');
    }
    if mode & 0o170000 == 0o020000 {
        out.push('c');
    }
    if mode & 0o1000 != 0 {
        out.push('t');
    }
    if out.is_empty() {
        out.push('-');
    }
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        out.push(if mode & (1 << (8 - i)) != 0 { c } else { '-' });
    }
    out
}

fn name_from(file: &Path, id: u32) -> String {
    let text = fs::read_to_string(file).unwrap_or_default();
    text.lines()
        .find_map(|l| {
            let mut f = l.split(':');
            let name = f.next()?;
            let _ = f.next()?;
            (f.next()?.parse::<u32>().ok()? == id).then(|| name.to_string())
        })
        .unwrap_or_else(|| id.to_string())
}

/// The user name of a uid (from /etc/passwd), else the number.
pub fn user_name(uid: u32) -> String {
    name_from(Path::new("/etc/passwd"), uid)
}

/// The group name of a gid (from /etc/group), else the number.
pub fn group_name(gid: u32) -> String {
    name_from(Path::new("/etc/group"), gid)
}

/// The entries under host directory `dir` of `tree` down to `depth` levels (walk order: sorted by
/// name, parents first; symbolic links are listed, never descended); paths are shown under `shown`.
pub fn walk(tree: &Tree, dir: &Path, shown: &Path, depth: u32, out: &mut Vec<Value>) -> io::Result<()> {
    let mut names: Vec<_> = fs::read_dir(dir)?.filter_map(Result::ok).map(|e| e.file_name()).collect();
    names.sort();
    for name in names {
        let path = dir.join(&name);
        let shown_path = shown.join(&name);
        let Ok(entry) = entry_info(tree, &path, &shown_path) else { continue };
        out.push(entry);
        let is_dir = fs::symlink_metadata(&path).map(|m| m.is_dir()).unwrap_or(false);
        if depth > 1 && is_dir {
            walk(tree, &path, &shown_path, depth - 1, out)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_like_envd() {
        let home = Path::new("/h/user");
        assert_eq!(resolve(home, ""), PathBuf::from("/h/user"));
        assert_eq!(resolve(home, "~"), PathBuf::from("/h/user"));
        assert_eq!(resolve(home, "~/a/b"), PathBuf::from("/h/user/a/b"));
        assert_eq!(resolve(home, "a/./b/../c"), PathBuf::from("/h/user/a/c"));
        assert_eq!(resolve(home, "/tmp/x"), PathBuf::from("/tmp/x"));
        assert_eq!(resolve(home, "../../../.."), PathBuf::from("/"));
    }

    #[test]
    fn isolated_trees_resolve_links_inside_their_root() {
        use std::os::unix::fs::symlink;
        let root = std::env::temp_dir().join(format!("e2b-emulator-tree-{}", sandbox_mcp::ids::random_hex(6)));
        fs::create_dir_all(root.join("home/user/sub")).unwrap();
        fs::create_dir_all(root.join("etc")).unwrap();
        fs::write(root.join("etc/passwd"), "root:x:0:0:root:/home/user:/bin/sh\n").unwrap();
        symlink("/etc", root.join("home/user/abs")).unwrap();
        symlink("../../../../../../etc", root.join("home/user/up")).unwrap();
        symlink("sub", root.join("home/user/rel")).unwrap();
        symlink("/proc/1", root.join("home/user/p")).unwrap();
        symlink("b", root.join("home/user/a")).unwrap();
        symlink("a", root.join("home/user/b")).unwrap();
        let tree = Tree::new(root.clone(), PathBuf::from("/home/user"), None);
        assert!(tree.isolated());
        let reach = |given: &str, follow: bool| tree.reach(&tree.resolve(given), follow);
        assert_eq!(tree.resolve("x/y"), PathBuf::from("/home/user/x/y"));
        assert_eq!(reach("abs/passwd", true).unwrap(), root.join("etc/passwd"), "an absolute link starts at the sandbox's root");
        assert_eq!(reach("up/passwd", true).unwrap(), root.join("etc/passwd"), "`..` never climbs above the sandbox's root");
        assert_eq!(reach("/../../etc/passwd", true).unwrap(), root.join("etc/passwd"));
        assert_eq!(reach("rel/new/file", true).unwrap(), root.join("home/user/sub/new/file"));
        assert_eq!(reach("abs", false).unwrap(), root.join("home/user/abs"), "a final link is kept when not followed");
        assert_eq!(reach("abs", true).unwrap(), root.join("etc"));
        assert_eq!(reach("a", true).unwrap_err().to_string(), "/home/user/a: too many levels of symbolic links");
        assert_eq!(reach("p/environ", true).unwrap_err().kind(), io::ErrorKind::PermissionDenied);
        assert_eq!(reach("/sys/kernel", true).unwrap_err().kind(), io::ErrorKind::PermissionDenied);
        assert_eq!(reach("rel/x/y", true).unwrap(), root.join("home/user/sub/x/y"));
        fs::remove_dir_all(&root).unwrap();

        let plain = Tree::new(PathBuf::from("/"), PathBuf::from("/h/user"), None);
        assert!(!plain.isolated());
        assert_eq!(plain.reach(Path::new("/h/user/abs/x"), true).unwrap(), PathBuf::from("/h/user/abs/x"));
    }

    #[test]
    fn ids_map_through_user_namespaces() {
        assert_eq!(map_id("         0     100000          1\n", 100_000), 0);
        assert_eq!(map_id("0 1000 1\n", 100_000), OVERFLOW_ID);
        assert_eq!(map_id("0 100000 65536\n", 100_005), 5);
        assert_eq!(map_id("", 0), OVERFLOW_ID);
    }

    #[test]
    fn multipart_parts() {
        let body = b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"dir/a.txt\"\r\nContent-Type: text/plain\r\n\r\nhello\r\nworld\r\n--XyZ\r\nContent-Disposition: form-data; name=\"other\"\r\n\r\n\r\n--XyZ--\r\n";
        let parts = parse_multipart(body, "XyZ").unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].name.as_deref(), Some("file"));
        assert_eq!(parts[0].filename.as_deref(), Some("dir/a.txt"));
        assert_eq!(parts[0].body, b"hello\r\nworld");
        assert_eq!(parts[1].name.as_deref(), Some("other"));
        assert_eq!(parts[1].body, b"");
        assert!(parse_multipart(b"--XyZ\r\nContent-Disposition: form-data\r\n\r\nno end", "XyZ").is_err());
        assert!(parse_multipart(b"garbage", "XyZ").is_err());
        assert_eq!(boundary("multipart/form-data; boundary=\"a b\""), Some("a b".into()));
        assert_eq!(boundary("multipart/form-data;boundary=1234"), Some("1234".into()));
        assert_eq!(boundary("multipart/form-data"), None);
    }

    #[test]
    fn mode_strings() {
        assert_eq!(go_mode_string(0o100644), "-rw-r--r--");
        assert_eq!(go_mode_string(0o040755), "drwxr-xr-x");
        assert_eq!(go_mode_string(0o120777), "Lrwxrwxrwx");
        assert_eq!(go_mode_string(0o020666), "Dcrw-rw-rw-");
        assert_eq!(go_mode_string(0o104755), "urwxr-xr-x");
        assert_eq!(go_mode_string(0o041777), "dtrwxrwxrwx");
    }

    #[test]
    fn sniffing() {
        assert_eq!(sniff(b"hello\n"), "text/plain; charset=utf-8");
        assert_eq!(sniff(&[0, 1, 2, 255]), "application/octet-stream");
        assert_eq!(sniff("é".as_bytes()), "text/plain; charset=utf-8");
    }
}
