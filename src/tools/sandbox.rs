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

/// How long list_sandboxes waits for one sandbox's task counts (a healthy one answers in
/// milliseconds).
const SANDBOX_TASK_COUNT_BUDGET: Duration = Duration::from_secs(2);

/// How long list_sandboxes spends on task counts in all; sandboxes not reached by then show
/// `tasks: null`.
const TASK_COUNTS_BUDGET: Duration = Duration::from_secs(10);

const TEMPLATE: Param = Param { name: "template", kind: Kind::Str { max_chars: 128 }, required: false, description: "" };

const TIMEOUT: Param = Param {
    name: "timeout",
    kind: Kind::Int {
        min: limits::SANDBOX_TIMEOUT_MIN_S,
        max: limits::SANDBOX_TIMEOUT_MAX_S,
        default: Some(limits::SANDBOX_TIMEOUT_DEFAULT_S),
    },
    required: false,
    description: "Idle seconds to expiry; run_command and file tools renew.",
};

const ENVS: Param =
    Param { name: "envs", kind: Kind::StrMap, required: false, description: "Masked if the name has KEY, TOKEN, SECRET or PASSWORD." };

const METADATA: Param = Param { name: "metadata", kind: Kind::StrMap, required: false, description: "" };

const NETWORK: Param = Param {
    name: "network",
    kind: Kind::Network,
    required: false,
    description: "false (default; E2B: true), true, or {\"allow\":[],\"deny\":[]} domains (*.x); never the host.",
};

const LIMITS: Param = Param {
    name: "limits",
    kind: Kind::IntFields(&[
        IntField { name: "memory_mb", min: limits::SANDBOX_MEMORY_MB_MIN, max: limits::SANDBOX_MEMORY_MB_MAX },
        IntField { name: "processes", min: limits::SANDBOX_PROCESSES_MIN, max: limits::SANDBOX_PROCESSES_MAX },
        IntField { name: "disk_mb", min: limits::SANDBOX_DISK_MB_MIN, max: limits::SANDBOX_DISK_MB_MAX },
    ]),
    required: false,
    description: "",
};

pub const CREATE: Tool = Tool {
    name: "create_sandbox",
    description: "New Linux sandbox, the session's default; bash (else sh) runs in its home. Ends at kill_sandbox, timeout, or session end unless a task ran in it.",
    params: &[TEMPLATE, TIMEOUT, ENVS, METADATA, NETWORK, LIMITS],
    output_schema: None,
    read_only: false,
    destructive: false,
    run: create,
};

pub const KILL: Tool = Tool {
    name: "kill_sandbox",
    description: "Kill a sandbox, tasks included.",
    params: &[SANDBOX_ID_REQUIRED],
    output_schema: None,
    read_only: false,
    destructive: true,
    run: kill,
};

const SET_TIMEOUT: Param = Param {
    name: "timeout",
    kind: Kind::Int { min: limits::SANDBOX_TIMEOUT_MIN_S, max: limits::SANDBOX_TIMEOUT_MAX_S, default: None },
    required: true,
    description: "",
};

pub const SET: Tool = Tool {
    name: "set_timeout",
    description: "Expire a sandbox timeout seconds from now.",
    params: &[SANDBOX_ID_REQUIRED, SET_TIMEOUT],
    output_schema: None,
    read_only: false,
    destructive: false,
    run: set_timeout,
};

pub const LIST: Tool = Tool {
    name: "list_sandboxes",
    description: "Sandboxes you can use.",
    params: &[],
    output_schema: None,
    read_only: true,
    destructive: false,
    run: list,
};

const POLICY: Param = Param { name: "network", kind: Kind::Network, required: true, description: "" };

pub const SET_NETWORK: Tool = Tool {
    name: "set_network",
    description: "Replace a sandbox's network policy.",
    params: &[SANDBOX_ID_REQUIRED, POLICY],
    output_schema: None,
    read_only: false,
    destructive: false,
    run: set_network,
};

fn set_network(ctx: &Ctx<'_>, args: &Args) -> Result<Reply, ToolError> {
    let id = super::target_sandbox(ctx, Some(args.required_text(&SANDBOX_ID_REQUIRED)?))?;
    let Some(network) = args.network(&POLICY)? else {
        return Err(ToolError::new("set_network: argument \"network\" is required"));
    };
    let info = ctx.app.provider.set_network(&id, &network, Instant::now() + SANDBOX_CALL_BUDGET)?;
    Ok(Reply::Now(json!({"sandbox_id": id, "network": info.network.to_json()})))
}

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
    // Each sandbox's task counts within a budget of their own, all of them within one: a sandbox
    // whose listing hangs costs its own `tasks` (null), not the call (found by a review: 30 s for
    // each such sandbox, one after another).
    let counted_by = Instant::now() + TASK_COUNTS_BUDGET;
    let sandboxes: Vec<_> = listed
        .iter()
        .map(|(info, created_at, metadata)| {
            let target = supervisor::Target { provider, sandbox_id: &info.sandbox_id };
            let deadline = counted_by.min(Instant::now() + SANDBOX_TASK_COUNT_BUDGET);
            let counted = if Instant::now() < deadline { supervisor::list_by(&target, deadline).ok() } else { None };
            let tasks = counted.map(|tasks| {
                let running = tasks.iter().filter(|t| t.state == supervisor::TaskState::Running).count();
                json!({"running": running, "total": tasks.len()})
            });
            json!({
                "sandbox_id": info.sandbox_id,
                "template": info.template,
                "created_at": created_at,
                "expires_at": info.expires_at,
                "isolation": info.isolation,
                "network": info.network.to_json(),
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
        network: args.network(&NETWORK)?,
        limits: {
            let given = args.int_fields(&LIMITS)?;
            let field = |name: &str| given.get(name).map(|v| (*v).max(0) as u64);
            Limits { memory_mb: field("memory_mb"), processes: field("processes"), disk_mb: field("disk_mb") }
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
    let found = found_in(provider.as_ref(), &info.sandbox_id, &info.template, info.isolation);
    Ok(Reply::Now(json!({
        "sandbox_id": info.sandbox_id,
        "provider": provider.name(),
        "template": info.template,
        "expires_at": info.expires_at,
        "isolation": info.isolation,
        "layers": info.layers,
        "network": info.network.to_json(),
        "limits": {"memory_mb": info.limits.memory_mb, "processes": info.limits.processes, "disk_mb": info.limits.disk_mb},
        "shell": provider.command_shell(),
        "found": found,
        "about": provider.describe(&info),
    })))
}

/// What [`probe`] found in a sandbox of each provider, template and isolation, once per process:
/// sandboxes made alike hold the same programs (a local sandbox shows the host's userland, an E2B
/// sandbox its template's image), and the probe costs tens of milliseconds (`node --version`).
fn found_in(
    provider: &dyn crate::provider::Provider,
    sandbox_id: &str,
    template: &str,
    isolation: &str,
) -> serde_json::Map<String, serde_json::Value> {
    type Found = std::collections::HashMap<String, serde_json::Map<String, serde_json::Value>>;
    static FOUND: std::sync::OnceLock<std::sync::Mutex<Found>> = std::sync::OnceLock::new();
    let key = format!("{} {template} {isolation}", provider.name());
    let cache = FOUND.get_or_init(Default::default);
    if let Some(known) = cache.lock().ok().and_then(|c| c.get(&key).cloned()) {
        return known;
    }
    let found = probe(provider, sandbox_id);
    if !found.is_empty() {
        if let Ok(mut c) = cache.lock() {
            c.insert(key, found.clone());
        }
    }
    found
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
