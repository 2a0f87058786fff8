//! `create_sandbox` and `kill_sandbox`.

use super::args::{Args, Kind, Param};
use super::{Ctx, Tool, ToolError, SANDBOX_ID_REQUIRED};
use crate::limits;
use crate::provider::CreateRequest;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// How long creating or killing a sandbox may take.
const SANDBOX_CALL_BUDGET: Duration = Duration::from_secs(60);

pub const CREATE: Tool = Tool {
    name: "create_sandbox",
    description: "Create a Linux sandbox and make it this session's default sandbox. \
It lives until kill_sandbox, until its timeout passes without use (ordinary tools renew it), or until this session ends \
(unless a background task was started in it with start_task, which keeps it alive for later sessions).",
    params: &[
        Param { name: "template", kind: Kind::Str { max_chars: 128 }, required: false, description: "Template (image) name; default \"base\"." },
        Param {
            name: "timeout",
            kind: Kind::Int { min: limits::SANDBOX_TIMEOUT_MIN_S, max: limits::SANDBOX_TIMEOUT_MAX_S, default: Some(limits::SANDBOX_TIMEOUT_DEFAULT_S) },
            required: false,
            description: "Seconds the sandbox lives without use; run_command and the file tools renew it, task tools do not.",
        },
        Param { name: "envs", kind: Kind::StrMap, required: false, description: "Environment variables of every command in the sandbox. Values of names containing KEY, TOKEN, SECRET or PASSWORD are masked in output." },
        Param { name: "metadata", kind: Kind::StrMap, required: false, description: "Free-form string labels stored with the sandbox." },
    ],
    output_schema: || {
        json!({"type": "object", "properties": {
            "sandbox_id": {"type": "string"},
            "provider": {"type": "string"},
            "template": {"type": "string"},
            "expires_at": {"type": "integer", "description": "Unix seconds"}
        }, "required": ["sandbox_id", "provider", "template", "expires_at"]})
    },
    read_only: false,
    run: create,
};

pub const KILL: Tool = Tool {
    name: "kill_sandbox",
    description: "Kill a sandbox and everything running in it, background tasks included. killed is false when it was already gone.",
    params: &[SANDBOX_ID_REQUIRED],
    output_schema: || {
        json!({"type": "object", "properties": {
            "sandbox_id": {"type": "string"},
            "killed": {"type": "boolean"}
        }, "required": ["sandbox_id", "killed"]})
    },
    read_only: false,
    run: kill,
};

fn create(ctx: &Ctx<'_>, args: &Args) -> Result<Value, ToolError> {
    let req = CreateRequest {
        template: args.str("template").unwrap_or("base").to_string(),
        timeout_s: args.int("timeout").unwrap_or(limits::SANDBOX_TIMEOUT_DEFAULT_S) as u64,
        envs: args.str_map("envs"),
        metadata: args.str_map("metadata"),
    };
    let provider = &ctx.app.provider;
    let info = provider.create(&req, Instant::now() + SANDBOX_CALL_BUDGET)?;
    if !ctx.session.adopt(&info.sandbox_id) {
        // The session ended while the sandbox was being created: nobody can reach it any more.
        let _ = provider.kill(&info.sandbox_id, Instant::now() + SANDBOX_CALL_BUDGET);
        return Err(ToolError::new("the session ended while the sandbox was being created; it was killed again"));
    }
    Ok(json!({
        "sandbox_id": info.sandbox_id,
        "provider": provider.name(),
        "template": info.template,
        "expires_at": info.expires_at,
    }))
}

fn kill(ctx: &Ctx<'_>, args: &Args) -> Result<Value, ToolError> {
    let id = super::target_sandbox(ctx, args)?;
    let killed = ctx.app.provider.kill(&id, Instant::now() + SANDBOX_CALL_BUDGET)?;
    ctx.session.forget(&id);
    Ok(json!({"sandbox_id": id, "killed": killed}))
}
