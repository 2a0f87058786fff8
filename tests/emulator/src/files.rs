//! envd's file access in the emulator: path resolution (`~`, and relative paths under the
//! sandbox HOME), the plain HTTP `/files` endpoint (download; multipart or octet-stream upload),
//! the multipart parser, and the `EntryInfo` objects of the filesystem service.
//!
//! Like envd, paths are not confined to the home: an absolute path names the host path (the
//! emulator runs sandboxes as host directories and isolates nothing).

use super::control::rfc3339;
use super::http::{HttpReply, HttpRequest};
use serde_json::{json, Value};
use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

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

/// `GET /files?path=…`: the file's bytes, or 404 / 400 with envd's messages.
pub fn download(home: &Path, req: &HttpRequest) -> HttpReply {
    let path = resolve(home, req.query("path").unwrap_or(""));
    let md = match fs::metadata(&path) {
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
    let data = match fs::read(&path) {
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
pub fn upload(home: &Path, req: &HttpRequest) -> HttpReply {
    if req.header("Content-Encoding").is_some_and(|e| !e.eq_ignore_ascii_case("identity")) {
        return error(400, "error decompressing request body: the emulator does not support Content-Encoding on uploads");
    }
    let media = req.media_type();
    let param = req.query("path");
    let mut written = Vec::new();
    if media == "application/octet-stream" {
        let Some(p) = param else {
            return error(400, "path query parameter is required for raw body upload");
        };
        let path = resolve(home, p);
        if let Err(reply) = write_file(&path, &req.body) {
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
            let path = resolve(home, target);
            if written.contains(&path) {
                return error(
                    400,
                    format!(
                        "you cannot upload multiple files to the same path '{}' in one upload request, only the first specified file was uploaded",
                        show(&path)
                    ),
                );
            }
            if let Err(reply) = write_file(&path, &part.body) {
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

fn write_file(path: &Path, data: &[u8]) -> Result<(), HttpReply> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).map_err(|e| error(500, format!("error ensuring directories: {e}")))?;
    }
    if path.is_dir() {
        return Err(error(400, format!("path is a directory: {}", show(path))));
    }
    fs::write(path, data).map_err(|e| {
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

/// The `EntryInfo` of `path` (not following a final symlink), zero values omitted; `shown` is
/// the path reported.
pub fn entry_info(path: &Path, shown: &Path) -> io::Result<Value> {
    let md = fs::symlink_metadata(path)?;
    let ft = md.file_type();
    let mut entry = json!({
        "name": shown.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "/".into()),
        "path": show(shown),
        "permissions": go_mode_string(md.mode()),
        "owner": user_name(md.uid()),
        "group": group_name(md.gid()),
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

fn name_from(file: &str, id: u32) -> String {
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
    name_from("/etc/passwd", uid)
}

/// The group name of a gid (from /etc/group), else the number.
pub fn group_name(gid: u32) -> String {
    name_from("/etc/group", gid)
}

/// The entries under `dir` down to `depth` levels (walk order: sorted by name, parents first);
/// paths are shown under `shown`.
pub fn walk(dir: &Path, shown: &Path, depth: u32, out: &mut Vec<Value>) -> io::Result<()> {
    let mut names: Vec<_> = fs::read_dir(dir)?.filter_map(Result::ok).map(|e| e.file_name()).collect();
    names.sort();
    for name in names {
        let path = dir.join(&name);
        let shown_path = shown.join(&name);
        let Ok(entry) = entry_info(&path, &shown_path) else { continue };
        out.push(entry);
        let is_dir = fs::symlink_metadata(&path).map(|m| m.is_dir()).unwrap_or(false);
        if depth > 1 && is_dir {
            walk(&path, &shown_path, depth - 1, out)?;
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
