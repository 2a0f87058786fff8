//! `read_file`, `write_file` and `list_files`.

use super::args::{Args, Kind, Param};
use super::{Ctx, Reply, Tool, ToolError, SANDBOX_ID};
use crate::{base64, limits};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// How long one file operation may take.
const FILE_CALL_BUDGET: Duration = Duration::from_secs(60);

const PATH: Param = Param { name: "path", kind: Kind::Str { max_chars: 4096 }, required: true, description: "" };

const CONTENT: Param = Param { name: "content", kind: Kind::Str { max_chars: limits::MAX_WRITE_CHARS }, required: true, description: "" };

const ENCODING: Param = Param { name: "encoding", kind: Kind::Enum(&["utf8", "base64"]), required: false, description: "" };

pub const READ: Tool = Tool {
    name: "read_file",
    description: "Read a file (≤ 4 MiB) as UTF-8 content or content_base64; images ≤ 1 MiB also as image.",
    params: &[PATH, SANDBOX_ID],
    output_schema: None,
    read_only: true,
    destructive: false,
    run: read,
};

pub const WRITE: Tool = Tool {
    name: "write_file",
    description: "Create or replace a file (and parents); join bigger ones from parts with run_command.",
    params: &[PATH, CONTENT, SANDBOX_ID, ENCODING],
    output_schema: None,
    read_only: false,
    destructive: true,
    run: write,
};

pub const LIST: Tool = Tool {
    name: "list_files",
    description: "List a directory (sorted, ≤ 10000 entries).",
    params: &[PATH, SANDBOX_ID],
    output_schema: None,
    read_only: true,
    destructive: false,
    run: list,
};

/// The sandbox and path of `read_file` and `list_files`.
fn located(args: &Args) -> Result<(Option<&str>, &str), ToolError> {
    Ok((args.text(&SANDBOX_ID)?, args.required_text(&PATH)?))
}

/// The arguments of `write_file`.
struct Write<'a> {
    sandbox_id: Option<&'a str>,
    path: &'a str,
    content: &'a str,
    /// Whether `content` is base64 (`encoding` is `base64`).
    encoded: bool,
}

impl<'a> Write<'a> {
    fn read(args: &'a Args) -> Result<Write<'a>, ToolError> {
        let (sandbox_id, path) = located(args)?;
        let encoded = args.text(&ENCODING)? == Some("base64");
        Ok(Write { sandbox_id, path, content: args.required_text(&CONTENT)?, encoded })
    }
}

fn read(ctx: &Ctx<'_>, args: &Args) -> Result<Reply, ToolError> {
    let (sandbox_id, path) = located(args)?;
    let id = super::target_sandbox(ctx, sandbox_id)?;
    let data = ctx.app.provider.read_file(&id, path, limits::MAX_FILE_BYTES, Instant::now() + FILE_CALL_BUDGET)?;
    let mut out = json!({"path": path, "size": data.len()});
    if let Some(mime) = image_type(&data).filter(|_| data.len() <= IMAGE_MAX_BYTES) {
        out["mime_type"] = json!(mime);
    }
    match String::from_utf8(data) {
        Ok(text) => out["content"] = json!(text),
        Err(err) => out["content_base64"] = json!(base64::encode(err.as_bytes())),
    }
    Ok(Reply::Now(out))
}

/// Largest image read_file also returns as an MCP `image` content block.
pub const IMAGE_MAX_BYTES: usize = 1024 * 1024;

/// The MIME type of a PNG, JPEG, GIF or WebP image, from its first bytes.
pub fn image_type(data: &[u8]) -> Option<&'static str> {
    if data.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if data.starts_with(&[0xFF, 0xD8, 0xFF]) {
        Some("image/jpeg")
    } else if data.starts_with(b"GIF87a") || data.starts_with(b"GIF89a") {
        Some("image/gif")
    } else if data.len() >= 12 && data.starts_with(b"RIFF") && &data[8..12] == b"WEBP" {
        Some("image/webp")
    } else {
        None
    }
}

fn write(ctx: &Ctx<'_>, args: &Args) -> Result<Reply, ToolError> {
    let Write { sandbox_id, path, content, encoded } = Write::read(args)?;
    let id = super::target_sandbox(ctx, sandbox_id)?;
    let data = if encoded {
        base64::decode(content).ok_or_else(|| ToolError::new("content is not valid base64; encode the bytes with standard base64"))?
    } else {
        content.as_bytes().to_vec()
    };
    if data.len() > limits::MAX_FILE_BYTES {
        return Err(ToolError::new(format!("content is {} bytes, over write_file's limit of {}", data.len(), limits::MAX_FILE_BYTES)));
    }
    let n = ctx.app.provider.write_file(&id, path, &data, Instant::now() + FILE_CALL_BUDGET)?;
    Ok(Reply::Now(json!({"path": path, "bytes_written": n})))
}

fn list(ctx: &Ctx<'_>, args: &Args) -> Result<Reply, ToolError> {
    let (sandbox_id, path) = located(args)?;
    let id = super::target_sandbox(ctx, sandbox_id)?;
    let (entries, truncated) = ctx.app.provider.list_dir(&id, path, limits::MAX_DIR_ENTRIES, Instant::now() + FILE_CALL_BUDGET)?;
    let entries: Vec<Value> = entries.iter().map(|e| json!({"name": e.name, "type": e.kind.name(), "size": e.size})).collect();
    Ok(Reply::Now(json!({"path": path, "entries": entries, "truncated": truncated})))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::args::samples;

    #[test]
    fn reads_only_declared_arguments() {
        for tool in [READ, LIST] {
            for args in samples(tool.name, tool.params) {
                assert_eq!(located(&args).unwrap().1, "a", "{}", tool.name);
            }
        }
        for args in samples(WRITE.name, WRITE.params) {
            let w = Write::read(&args).unwrap();
            assert_eq!((w.path, w.content, w.encoded), ("a", "a", false));
        }
    }
}
