//! `expose_port` and `unexpose_port`.

use super::args::{Args, Kind, Param};
use super::{Ctx, Reply, Tool, ToolError, SANDBOX_ID};
use crate::provider::Exposed;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// How long exposing or unexposing may take.
const PORT_CALL_BUDGET: Duration = Duration::from_secs(20);

const PORT: Param = Param { name: "port", kind: Kind::Int { min: 1, max: 65535, default: None }, required: true, description: "" };

pub const EXPOSE: Tool = Tool {
    name: "expose_port",
    description: "A sandbox TCP port at a host url, until unexpose_port or kill_sandbox.",
    params: &[SANDBOX_ID, PORT],
    output_schema: None,
    read_only: false,
    destructive: false,
    run: expose,
};

pub const UNEXPOSE: Tool = Tool {
    name: "unexpose_port",
    description: "Close an exposed port.",
    params: &[SANDBOX_ID, PORT],
    output_schema: None,
    read_only: false,
    // It closes the port's open connections.
    destructive: true,
    run: unexpose,
};

fn port(args: &Args) -> Result<u16, ToolError> {
    u16::try_from(args.integer(&PORT)?).map_err(|_| ToolError::new("port must be 1 to 65535"))
}

fn result(id: &str, port: u16, field: &str, exposed: Exposed) -> Value {
    let mut v = json!({"sandbox_id": id, "port": port, "url": exposed.url, field: exposed.done});
    if let Some(note) = exposed.note {
        v["note"] = json!(note);
    }
    v
}

fn expose(ctx: &Ctx<'_>, args: &Args) -> Result<Reply, ToolError> {
    let id = super::target_sandbox(ctx, args.text(&SANDBOX_ID)?)?;
    let port = port(args)?;
    let exposed = ctx.app.provider.expose_port(&id, port, Instant::now() + PORT_CALL_BUDGET)?;
    Ok(Reply::Now(result(&id, port, "exposed", exposed)))
}

fn unexpose(ctx: &Ctx<'_>, args: &Args) -> Result<Reply, ToolError> {
    let id = super::target_sandbox(ctx, args.text(&SANDBOX_ID)?)?;
    let port = port(args)?;
    let closed = ctx.app.provider.unexpose_port(&id, port, Instant::now() + PORT_CALL_BUDGET)?;
    Ok(Reply::Now(result(&id, port, "closed", closed)))
}
