//! `create_sandbox` and `kill_sandbox`.

use super::args::{Args, IntField, Kind, Param};
use super::{Ctx, Reply, Tool, ToolError, SANDBOX_ID_REQUIRED};
use crate::limits;
use crate::provider::{CreateRequest, Limits, Touch};
use crate::supervisor;
use serde_json::json;
use std::time::{Duration, Instant};

/// How long creating or killing a sandbox may take.
const SANDBOX_CALL_BUDGET: Duration = Duration::from_secs(60);

const TEMPLATE: Param = Param {
    name: "template",
    kind: Kind::Str { max_chars: 128 },
    required: false,
    description: "Template (image) name; default \"base\".",
};

const TIMEOUT: Param = Param {
    name: "timeout",
    kind: Kind::Int {
        min: limits::SANDBOX_TIMEOUT_MIN_S,
        max: limits::SANDBOX_TIMEOUT_MAX_S,
        default: Some(limits::SANDBOX_TIMEOUT_DEFAULT_S),
    },
    required: false,
    description: "Seconds the sandbox lives without use; run_command and the file tools renew it, task tools do not.",
};

const ENVS: Param = Param {
    name: "envs",
    kind: Kind::StrMap,
    required: false,
    description: "Environment variables of every command in the sandbox. Values of names containing KEY, TOKEN, SECRET or PASSWORD are masked in output.",
};

const METADATA: Param =
    Param { name: "metadata", kind: Kind::StrMap, required: false, description: "Free-form string labels stored with the sandbox." };

const NETWORK: Param = Param {
    name: "network",
    kind: Kind::Bool,
    required: false,
    description: "Outside network access. Local sandboxes isolated with namespaces: false (the default) gives only the sandbox's own loopback, true the host's network. E2B sandboxes have the network unless false.",
};

const LIMITS: Param = Param {
    name: "limits",
    kind: Kind::IntFields(&[
        IntField { name: "memory_mb", min: limits::SANDBOX_MEMORY_MB_MIN, max: limits::SANDBOX_MEMORY_MB_MAX },
        IntField { name: "processes", min: limits::SANDBOX_PROCESSES_MIN, max: limits::SANDBOX_PROCESSES_MAX },
    ]),
    required: false,
    description: "Resource limits of a local sandbox, enforced with cgroups: memory_mb (memory in MiB) and processes (at once). A limit the host cannot enforce fails the call.",
};

pub const CREATE: Tool = Tool {
    name: "create_sandbox",
    description: "Create a Linux sandbox and make it this session's default sandbox. \
It lives until kill_sandbox, until its timeout passes without use (ordinary tools renew it), or until this session ends \
(unless a background task was started in it with start_task, which keeps it alive for later sessions). \
A 2026-07-28 request over HTTP has no session: the sandbox is nobody's default (pass its sandbox_id to every later call) \
and lives until kill_sandbox or its own timeout.",
    params: &[TEMPLATE, TIMEOUT, ENVS, METADATA, NETWORK, LIMITS],
    output_schema: || {
        let limit = json!({"type": ["integer", "null"]});
        json!({"type": "object", "properties": {
            "sandbox_id": {"type": "string"},
            "provider": {"type": "string"},
            "template": {"type": "string"},
            "expires_at": {"type": "integer", "description": "Unix seconds"},
            "isolation": {"type": "string", "description": "namespaces, landlock or none (local provider), e2b (the platform's own)"},
            "layers": {"type": "array", "items": {"type": "string"}, "description": "the isolation layers actually enforced on the sandbox's processes (user, pid, mount, net, ipc, uts, cgroup, landlock-fs, landlock-net, landlock-scope-unix, seccomp, no_new_privs, uid); empty for none and e2b"},
            "network": {"type": "boolean", "description": "Whether commands can reach the outside network"},
            "limits": {"type": "object", "properties": {"memory_mb": limit, "processes": limit},
                "required": ["memory_mb", "processes"], "description": "Enforced limits; null where none was asked for"},
            "shell": {"type": "string", "description": "what run_command and start_task run commands with"},
            "found": {"type": "object", "additionalProperties": {"type": "string"},
                "description": "interpreters, compilers and tools found inside, with their version line"},
            "about": {"type": "string", "description": "writable places, the network, how to install packages"}
        }, "required": ["sandbox_id", "provider", "template", "expires_at", "isolation", "layers", "network", "limits"]})
    },
    read_only: false,
    destructive: false,
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
    destructive: true,
    run: kill,
};

const SET_TIMEOUT: Param = Param {
    name: "timeout",
    kind: Kind::Int { min: limits::SANDBOX_TIMEOUT_MIN_S, max: limits::SANDBOX_TIMEOUT_MAX_S, default: None },
    required: true,
    description: "Seconds from now; also what run_command and the file tools renew it to later.",
};

pub const SET: Tool = Tool {
    name: "set_timeout",
    description: "Set when a sandbox expires: timeout seconds from now (extends or shortens it). Task tools never renew a sandbox: \
before a long background task, make its timeout outlive the task.",
    params: &[SANDBOX_ID_REQUIRED, SET_TIMEOUT],
    output_schema: || {
        json!({"type": "object", "properties": {
            "sandbox_id": {"type": "string"},
            "timeout": {"type": "integer"},
            "expires_at": {"type": "integer", "description": "Unix seconds"}
        }, "required": ["sandbox_id", "timeout", "expires_at"]})
    },
    read_only: false,
    destructive: false,
    run: set_timeout,
};

pub const LIST: Tool = Tool {
    name: "list_sandboxes",
    description: "List the sandboxes this caller can use (over stdio: all of this server's; over HTTP: this session's), \
with when each expires, its metadata and its task counts: how an agent that reconnects finds its sandboxes.",
    params: &[],
    output_schema: || {
        let nullable_int = json!({"type": ["integer", "null"]});
        json!({"type": "object", "properties": {
            "sandboxes": {"type": "array", "items": {"type": "object", "properties": {
                "sandbox_id": {"type": "string"},
                "template": {"type": "string"},
                "created_at": nullable_int,
                "expires_at": {"type": "integer", "description": "Unix seconds"},
                "isolation": {"type": "string"},
                "network": {"type": "boolean"},
                "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
                "tasks": {"type": ["object", "null"], "properties": {"running": {"type": "integer"}, "total": {"type": "integer"}},
                    "description": "null when the tasks could not be read"}
            }, "required": ["sandbox_id", "expires_at", "isolation", "network", "metadata", "tasks"]}},
            "count": {"type": "integer"}
        }, "required": ["sandboxes", "count"]})
    },
    read_only: true,
    destructive: false,
    run: list,
};

fn list(ctx: &Ctx<'_>, _args: &Args) -> Result<Reply, ToolError> {
    let provider = ctx.app.provider.as_ref();
    let visible = ctx.session.visible();
    let listed = match (&visible, provider.list_sandboxes()) {
        (None, Some(all)) => all,
        (Some(ids), Some(all)) => all.into_iter().filter(|(info, _, _)| ids.contains(&info.sandbox_id)).collect(),
        // A provider that cannot list: the sandboxes the caller is known to use.
        (_, None) => visible
            .unwrap_or_default()
            .iter()
            .filter_map(|id| provider.info(id, Touch::Observe, Instant::now() + SANDBOX_CALL_BUDGET).ok())
            .map(|info| (info, None, Default::default()))
            .collect(),
    };
    let sandboxes: Vec<_> = listed
        .iter()
        .map(|(info, created_at, metadata)| {
            let target = supervisor::Target { provider, sandbox_id: &info.sandbox_id };
            let tasks = supervisor::list(&target).ok().map(|tasks| {
                let running = tasks.iter().filter(|t| t.state == supervisor::TaskState::Running).count();
                json!({"running": running, "total": tasks.len()})
            });
            json!({
                "sandbox_id": info.sandbox_id,
                "template": info.template,
                "created_at": created_at,
                "expires_at": info.expires_at,
                "isolation": info.isolation,
                "network": info.network,
                "metadata": metadata,
                "tasks": tasks,
            })
        })
        .collect();
    Ok(Reply::Now(json!({"count": sandboxes.len(), "sandboxes": sandboxes})))
}

fn set_timeout(ctx: &Ctx<'_>, args: &Args) -> Result<Reply, ToolError> {
    let id = super::target_sandbox(ctx, Some(args.required_text(&SANDBOX_ID_REQUIRED)?))?;
    let timeout = args.integer(&SET_TIMEOUT)?.max(1) as u64;
    let info = ctx.app.provider.set_timeout(&id, timeout, Instant::now() + SANDBOX_CALL_BUDGET)?;
    Ok(Reply::Now(json!({"sandbox_id": id, "timeout": timeout, "expires_at": info.expires_at})))
}

/// The arguments of `create_sandbox`.
fn create_request(args: &Args) -> Result<CreateRequest, ToolError> {
    Ok(CreateRequest {
        template: args.text(&TEMPLATE)?.unwrap_or("base").to_string(),
        timeout_s: args.integer(&TIMEOUT)?.max(0) as u64,
        envs: args.map(&ENVS)?,
        metadata: args.map(&METADATA)?,
        network: args.flag(&NETWORK)?,
        limits: {
            let given = args.int_fields(&LIMITS)?;
            let field = |name: &str| given.get(name).map(|v| (*v).max(0) as u64);
            Limits { memory_mb: field("memory_mb"), processes: field("processes") }
        },
    })
}

fn create(ctx: &Ctx<'_>, args: &Args) -> Result<Reply, ToolError> {
    let req = create_request(args)?;
    let provider = &ctx.app.provider;
    let info = provider.create(&req, Instant::now() + SANDBOX_CALL_BUDGET)?;
    if !ctx.session.adopt(&info.sandbox_id) {
        // The session ended while the sandbox was being created: nobody can reach it any more.
        let _ = provider.kill(&info.sandbox_id, Instant::now() + SANDBOX_CALL_BUDGET);
        return Err(ToolError::new("the session ended while the sandbox was being created; it was killed again"));
    }
    let found = probe(provider.as_ref(), &info.sandbox_id);
    Ok(Reply::Now(json!({
        "sandbox_id": info.sandbox_id,
        "provider": provider.name(),
        "template": info.template,
        "expires_at": info.expires_at,
        "isolation": info.isolation,
        "layers": info.layers,
        "network": info.network,
        "limits": {"memory_mb": info.limits.memory_mb, "processes": info.limits.processes},
        "shell": provider.command_shell(),
        "found": found,
        "about": provider.describe(&info),
    })))
}

/// The tools a model may want, found inside the new sandbox with the first line of their
/// `--version` (one command; nothing when it fails).
fn probe(provider: &dyn crate::provider::Provider, sandbox_id: &str) -> serde_json::Map<String, serde_json::Value> {
    const SCRIPT: &str = "for t in bash python3 node gcc cc make git curl; do \
if command -v \"$t\" >/dev/null 2>&1; then printf '%s\\t%s\\n' \"$t\" \"$(\"$t\" --version 2>&1 </dev/null | head -n 1)\"; fi; done";
    let req = crate::provider::ExecRequest {
        argv: provider.posix_sh(SCRIPT, &[]),
        envs: Default::default(),
        cwd: None,
        output_cap: 64 * 1024,
        deadline: Instant::now() + Duration::from_secs(10),
        cancel: None,
    };
    let Ok(out) = provider.exec(sandbox_id, &req, Touch::Observe) else { return Default::default() };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .map(|(name, version)| (name.to_string(), json!(version.chars().take(120).collect::<String>())))
        .collect()
}

/// The argument of `kill_sandbox`.
fn kill_target(args: &Args) -> Result<&str, ToolError> {
    args.required_text(&SANDBOX_ID_REQUIRED)
}

fn kill(ctx: &Ctx<'_>, args: &Args) -> Result<Reply, ToolError> {
    let id = super::target_sandbox(ctx, Some(kill_target(args)?))?;
    let killed = ctx.app.provider.kill(&id, Instant::now() + SANDBOX_CALL_BUDGET)?;
    ctx.session.forget(&id);
    Ok(Reply::Now(json!({"sandbox_id": id, "killed": killed})))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::args::samples;

    #[test]
    fn reads_only_declared_arguments() {
        let [all, required] = <[Args; 2]>::try_from(samples(CREATE.name, CREATE.params)).unwrap();
        let req = create_request(&all).unwrap();
        assert_eq!((req.template.as_str(), req.timeout_s, req.envs.len()), ("a", limits::SANDBOX_TIMEOUT_MIN_S as u64, 1));
        let req = create_request(&required).unwrap();
        assert_eq!((req.template.as_str(), req.timeout_s, req.metadata.len()), ("base", limits::SANDBOX_TIMEOUT_DEFAULT_S as u64, 0));
        for args in samples(KILL.name, KILL.params) {
            assert_eq!(kill_target(&args).unwrap(), "a");
        }
    }
}
