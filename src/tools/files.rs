//! `read_file`, `write_file` and `list_files`.

use super::args::{Args, Kind, Param};
use super::{Ctx, Tool, ToolError, SANDBOX_ID};
use crate::{base64, limits};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// How long one file operation may take.
const FILE_CALL_BUDGET: Duration = Duration::from_secs(60);

const PATH: Param = Param {
    name: "path",
    kind: Kind::Str { max_chars: 4096 },
    required: true,
    description: "File path in the sandbox; relative paths start at the sandbox user's home.",
};

pub const READ: Tool = Tool {
    name: "read_file",
    description: "Read a file from a sandbox (at most 4 MiB). Valid UTF-8 comes back as content; anything else as content_base64.",
    params: &[PATH, SANDBOX_ID],
    output_schema: || {
        json!({"type": "object", "properties": {
            "path": {"type": "string"},
            "size": {"type": "integer"},
            "content": {"type": "string"},
            "content_base64": {"type": "string"}
        }, "required": ["path", "size"]})
    },
    read_only: true,
    run: read,
};

pub const WRITE: Tool = Tool {
    name: "write_file",
    description: "Write (create or replace) a file in a sandbox, creating missing parent directories. \
content is text, or base64 when encoding is \"base64\". Larger files: write them in parts with run_command.",
    params: &[
        PATH,
        Param {
            name: "content",
            kind: Kind::Str { max_chars: limits::MAX_WRITE_CHARS },
            required: true,
            description: "File content (at most 3 MiB of text; base64 up to about 2.25 MiB of bytes).",
        },
        SANDBOX_ID,
        Param {
            name: "encoding",
            kind: Kind::Enum(&["utf8", "base64"]),
            required: false,
            description: "How content is encoded; default utf8.",
        },
    ],
    output_schema: || {
        json!({"type": "object", "properties": {
            "path": {"type": "string"},
            "bytes_written": {"type": "integer"}
        }, "required": ["path", "bytes_written"]})
    },
    read_only: false,
    run: write,
};

pub const LIST: Tool = Tool {
    name: "list_files",
    description: "List a directory in a sandbox (not recursive), sorted by name. type is file, dir, symlink or other.",
    params: &[PATH, SANDBOX_ID],
    output_schema: || {
        json!({"type": "object", "properties": {
            "path": {"type": "string"},
            "entries": {"type": "array", "items": {"type": "object", "properties": {
                "name": {"type": "string"},
                "type": {"type": "string", "enum": ["file", "dir", "symlink", "other"]},
                "size": {"type": "integer"}
            }, "required": ["name", "type", "size"]}},
            "truncated": {"type": "boolean", "description": "true when the listing stopped at 10000 entries"}
        }, "required": ["path", "entries", "truncated"]})
    },
    read_only: true,
    run: list,
};

fn read(ctx: &Ctx<'_>, args: &Args) -> Result<Value, ToolError> {
    let id = super::target_sandbox(ctx, args)?;
    let path = args.str("path").unwrap_or_default();
    let data = ctx.app.provider.read_file(&id, path, limits::MAX_FILE_BYTES, Instant::now() + FILE_CALL_BUDGET)?;
    let mut out = json!({"path": path, "size": data.len()});
    match String::from_utf8(data) {
        Ok(text) => out["content"] = json!(text),
        Err(err) => out["content_base64"] = json!(base64::encode(err.as_bytes())),
    }
    Ok(out)
}

fn write(ctx: &Ctx<'_>, args: &Args) -> Result<Value, ToolError> {
    let id = super::target_sandbox(ctx, args)?;
    let path = args.str("path").unwrap_or_default();
    let content = args.str("content").unwrap_or_default();
    let data = match args.str("encoding").unwrap_or("utf8") {
        "base64" => {
            base64::decode(content).ok_or_else(|| ToolError::new("content is not valid base64; encode the bytes with standard base64"))?
        }
        _ => content.as_bytes().to_vec(),
    };
    if data.len() > limits::MAX_FILE_BYTES {
        return Err(ToolError::new(format!("content is {} bytes, over write_file's limit of {}", data.len(), limits::MAX_FILE_BYTES)));
    }
    let n = ctx.app.provider.write_file(&id, path, &data, Instant::now() + FILE_CALL_BUDGET)?;
    Ok(json!({"path": path, "bytes_written": n}))
}

fn list(ctx: &Ctx<'_>, args: &Args) -> Result<Value, ToolError> {
    let id = super::target_sandbox(ctx, args)?;
    let path = args.str("path").unwrap_or_default();
    let (entries, truncated) = ctx.app.provider.list_dir(&id, path, limits::MAX_DIR_ENTRIES, Instant::now() + FILE_CALL_BUDGET)?;
    let entries: Vec<Value> = entries.iter().map(|e| json!({"name": e.name, "type": e.kind.name(), "size": e.size})).collect();
    Ok(json!({"path": path, "entries": entries, "truncated": truncated}))
}
