//! The e2b provider against the E2B emulator on loopback: tool by tool against the same tools on
//! the local provider (the control session), interleaved in blocks; the HTTP requests and new
//! TCP connections every e2b call makes; and the first call from a fresh server process.

use crate::bench::Bench;
use crate::control::Ctl;
use crate::emulator::{e2b_server, Emulator};
use crate::process::{running, sh};
use crate::proxy::Proxy;
use crate::requests::{mode, plural, route_text, routes, total, Requests};
use crate::session::{self, state, wait_final, Tools};
use crate::side::{Side, E2B_OPS, RUN_SHORT};
use crate::table::Row;
use crate::units::{dur, secs, times};
use anyhow::{anyhow, bail, Context, Result};
use sandbox_mcp::client::StdioClient;
use serde_json::{json, Map, Value};
use std::fs;
use std::net::SocketAddr;
use std::thread;
use std::time::{Duration, Instant};

/// A command still running when start_task first answers.
const E2B_RUNNING: &str = "sleep 2";
/// How long a first call from a fresh server process may take before the server is stopped.
const E2B_FIRST_CALL_LIMIT: Duration = Duration::from_secs(5);
/// The note of the e2b setup row (it holds for every e2b row).
const E2B_NOTE: &str = "the e2b provider talks to the E2B emulator on loopback (control plane and envd on one port; its sandboxes are \
local-provider sandboxes). The ratio to the local provider therefore mostly measures the emulator's envd path (HTTP handling and \
process spawning in the emulator) and loopback HTTP, not E2B's cloud, where every request also crosses the network. Request counts \
are the emulator's own (`GET /_emulator/requests`), read after each call (outside the timed part)";

/// Creates a sandbox in an e2b session and runs `echo hello` there to its end: the sandbox and
/// the finished task.
fn e2b_setup(rpc: &mut StdioClient) -> Result<(String, String)> {
    let created = rpc.tool("create_sandbox", &json!({"timeout": 3600}))?;
    let sandbox = created["sandbox_id"].as_str().map(str::to_string).ok_or_else(|| anyhow!("create_sandbox returned {created}"))?;
    if created["provider"] != json!("e2b") {
        bail!("the server did not use the e2b provider: {created}");
    }
    let snap = rpc.tool("start_task", &json!({"sandbox_id": sandbox, "command": "echo hello"}))?;
    let task = snap["task_id"].as_str().context("start_task returned no task_id")?.to_string();
    let fin = wait_final(rpc, &sandbox, &task, Duration::from_secs(10), Duration::from_millis(10))?;
    if state(&fin) != "succeeded" {
        bail!("`echo hello` on e2b ended {fin}");
    }
    Ok((sandbox, task))
}

/// A separate pass through a counting proxy (the timed runs go to the emulator directly): the
/// TCP connections each call opens in steady state, per tool: one warm-up call, then three calls
/// of the same tool in a row (a call that leaves its connection unusable shows on the next call).
/// The server creates a sandbox and a task of its own.
fn e2b_connections(b: &Bench, emu: &Emulator) -> Result<Map<String, Value>> {
    let target: SocketAddr = emu.url.trim_start_matches("http://").parse().with_context(|| format!("the emulator's URL {}", emu.url))?;
    let proxy = Proxy::start(target)?;
    let mut rpc = session::spawn(e2b_server(b, &proxy.url), &b.log("e2b-proxied"))?;
    session::initialize(&mut rpc)?;
    let (sandbox, task) = e2b_setup(&mut rpc)?;
    let mut per_tool: Map<String, Value> = Map::new();
    let mut side = Side::new(&mut rpc, &sandbox, &task);
    side.conns = Some(proxy.accepted.clone());
    let mut pass = || -> Result<()> {
        for op in E2B_OPS {
            side.op(op, None)?;
            for _ in 0..3 {
                for c in side.op(op, None)? {
                    if let Some(a) = per_tool.entry(c.tool.to_string()).or_insert_with(|| json!([])).as_array_mut() {
                        a.push(json!(c.conns));
                    }
                }
            }
        }
        Ok(())
    };
    let r = pass();
    let killed = rpc.tool("kill_sandbox", &json!({"sandbox_id": sandbox}));
    let closed = rpc.end();
    drop(proxy);
    r?;
    killed?;
    closed?;
    Ok(per_tool)
}

/// The rows: tool, what the call does, HTTP requests one call needs in steady state.
const E2B_TOOLS: [(&str, &str, u64); 12] = [
    (
        "run_command",
        "`run_command \"true\"` (default timeout 60 s, over `--task-after` 25 s: under the supervisor, waiting inside the sandbox)",
        1,
    ),
    (RUN_SHORT, "`run_command \"true\"` with `timeout` 20 s (within `--task-after`: run by envd alone)", 1),
    ("write_file", "`write_file` (6 bytes)", 1),
    ("read_file", "`read_file` (6 bytes)", 1),
    ("list_files", "`list_files` (a directory with one file)", 1),
    ("start_task", "`start_task \"true\"` until its first answer", 1),
    ("get_task", "`get_task` (a finished task)", 1),
    ("cancel_task", "`cancel_task` (a finished task: returns the saved result)", 1),
    ("list_tasks", "`list_tasks`", 1),
    ("delete_task", "`delete_task` (a finished task)", 1),
    ("create_sandbox", "`create_sandbox`", 1),
    ("kill_sandbox", "`kill_sandbox` (right after `create_sandbox`)", 1),
];

/// A tool call that must answer within `limit`; otherwise the server is stopped (TERM, then
/// KILL 3 s later, by its own pid) and the call fails.
fn tool_within(rpc: &mut StdioClient, tool: &str, args: &Value, limit: Duration) -> Result<Value> {
    let pid = rpc.pid();
    let (done, wait) = std::sync::mpsc::channel::<()>();
    let dog = thread::spawn(move || {
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = wait.recv_timeout(limit) {
            // The child is not reaped before this thread is joined: the pid is still its own.
            let _ = sh("kill -s TERM \"$1\"", &[&pid.to_string()]).status();
            let deadline = Instant::now() + Duration::from_secs(3);
            while running(pid) && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(10));
            }
            if running(pid) {
                let _ = sh("kill -s KILL \"$1\"", &[&pid.to_string()]).status();
            }
            true
        } else {
            false
        }
    });
    let r = rpc.tool(tool, args);
    let _ = done.send(());
    if dog.join().unwrap_or(false) {
        bail!("no answer within {} s (the server was stopped)", limit.as_secs());
    }
    r
}

/// The e2b provider against the E2B emulator on loopback, tool by tool, against the same tools
/// on the local provider (the control session), interleaved in blocks; the HTTP requests every
/// e2b call makes; and the first call from a fresh server process.
pub fn e2b_rows(b: &mut Bench, ctl: &mut Ctl) -> Result<()> {
    let Some(exe) = b.o.e2b_emulator.clone() else {
        b.row(
            Row::new("e2b", "e2b provider vs local, per tool (overhead ratio, HTTP requests per tool)")
                .not_measured("no --e2b-emulator given (tests/bench/run.sh builds target/release/e2b-emulator)"),
        );
        return Ok(());
    };
    let mut emu = Emulator::start(b, &exe)?;
    let mut rpc = session::spawn(emu.server(b), &b.log("e2b-stdio"))?;
    session::initialize(&mut rpc)?;
    let (sandbox, task) = e2b_setup(&mut rpc)?;
    let measured = e2b_measure(b, ctl, &mut emu, &mut rpc, &sandbox, &task);
    // The sandbox holds a task, so the session's end would keep it: kill it here (stopping the
    // emulator would kill it too).
    let killed = rpc.tool("kill_sandbox", &json!({"sandbox_id": sandbox}));
    let closed = rpc.end();
    drop(emu);
    measured?;
    killed?;
    closed
}

/// The e2b rows, with the emulator, the e2b session and its sandbox and task set up.
fn e2b_measure(b: &mut Bench, ctl: &mut Ctl, emu: &mut Emulator, rpc: &mut StdioClient, sandbox: &str, task: &str) -> Result<()> {
    let mut local = Side::new(&mut ctl.rpc, &ctl.plain, &ctl.done_task);
    let mut e2b = Side::new(rpc, sandbox, task);

    // Warm-up, then rounds of one block per op and provider.
    // Warm-up, then rounds of one block per op and provider: up to 40 samples per tool (4 in
    // quick mode), fewer when the rounds run past a time budget (at least two rounds).
    let (warm, block) = if b.o.quick { (2, 2) } else { (3, 8) };
    let rounds = b.n(40).div_ceil(block);
    let budget = Duration::from_secs(if b.o.quick { 8 } else { 20 });
    for op in E2B_OPS {
        for _ in 0..warm {
            local.op(op, None)?;
            e2b.op(op, Some(&mut *emu))?;
        }
    }
    let mut local_xs: Map<String, Value> = Map::new();
    let mut e2b_xs: Map<String, Value> = Map::new();
    let mut counts: Map<String, Value> = Map::new();
    let push = |m: &mut Map<String, Value>, tool: &str, v: Value| {
        if let Some(a) = m.entry(tool.to_string()).or_insert_with(|| json!([])).as_array_mut() {
            a.push(v);
        }
    };
    let timed = Instant::now();
    let mut done = 0;
    while done < rounds && (done < 2 || timed.elapsed() < budget) {
        done += 1;
        for op in E2B_OPS {
            for _ in 0..block {
                for c in local.op(op, None)? {
                    push(&mut local_xs, c.tool, json!(c.secs));
                }
            }
            for _ in 0..block {
                for c in e2b.op(op, Some(&mut *emu))? {
                    push(&mut e2b_xs, c.tool, json!(c.secs));
                    push(&mut counts, c.tool, c.counts.unwrap_or(Value::Null));
                }
            }
        }
    }
    // start_task of a command still running at its first answer (then cancelled and deleted).
    let (mut running_local, mut running_e2b) = (Vec::new(), Vec::new());
    for _ in 0..if b.o.quick { 2 } else { 3 } {
        running_local.push(local.start_running(E2B_RUNNING)?);
        running_e2b.push(e2b.start_running(E2B_RUNNING)?);
    }
    let (local_starts, e2b_starts) = ((local.direct, local.starts), (e2b.direct, e2b.starts));
    let kill_failures =
        [("local", local.creates, std::mem::take(&mut local.kill_failures)), ("e2b", e2b.creates, std::mem::take(&mut e2b.kill_failures))];

    // The first call from fresh server processes: get_task (which must learn the access token)
    // and run_command (which must also renew and read the environment for masking).
    let n_fresh = b.n(20).max(3);
    let mut first: Map<String, Value> = Map::new();
    for (tool, args) in
        [("get_task", json!({"sandbox_id": sandbox, "task_id": task})), ("run_command", json!({"sandbox_id": sandbox, "command": "true"}))]
    {
        let (mut xs, mut per_call, mut at_start, mut failure) = (Vec::new(), Vec::new(), 0, None);
        for _ in 0..n_fresh {
            emu.reset()?;
            let mut fresh = session::spawn(emu.server(b), &b.log("e2b-fresh"))?;
            session::initialize(&mut fresh)?;
            at_start += total(&emu.counts()?);
            emu.reset()?;
            let t = Instant::now();
            let r = tool_within(&mut fresh, tool, &args, E2B_FIRST_CALL_LIMIT);
            let e = secs(t);
            let c = emu.counts()?;
            match r {
                Ok(_) => {
                    xs.push(e);
                    per_call.push(c);
                    fresh.end()?;
                }
                Err(err) => {
                    failure = Some(format!("{err:#}; requests seen: {}", route_text(&routes(&c))));
                    break; // dropped: killed by its own pid if it still runs
                }
            }
        }
        first.insert(tool.into(), json!({"secs": xs, "counts": per_call, "requests_at_start": at_start, "failure": failure}));
    }

    let conns = e2b_connections(b, emu)?;

    // Rows.
    b.row(
        Row::new(
            "e2b",
            "setup: sandbox-mcp over stdio with the e2b provider → e2b-emulator on 127.0.0.1, vs the local provider's control session, \
interleaved in blocks",
        )
        .note(if done < rounds {
            format!("{E2B_NOTE}. The timed rounds stopped after {done} of {rounds} (time budget {} s)", budget.as_secs())
        } else {
            E2B_NOTE.to_string()
        }),
    );
    let mut raw = Map::new();
    for (tool, what, need) in E2B_TOOLS {
        let xs = |m: &Map<String, Value>| -> Vec<f64> {
            m.get(tool).and_then(Value::as_array).map(|a| a.iter().filter_map(Value::as_f64).collect()).unwrap_or_default()
        };
        let (lx, ex) = (xs(&local_xs), xs(&e2b_xs));
        let l = b.keep(&format!("e2b.local.{tool}"), &lx);
        let e = b.keep(&format!("e2b.e2b.{tool}"), &ex);
        let per_call: Vec<Value> = counts.get(tool).and_then(Value::as_array).cloned().unwrap_or_default();
        let req = Requests::of(&per_call);
        raw.insert(tool.into(), req.json());
        let r = e.median / l.median;
        let mut row = Row::new("e2b", format!("{what}, e2b provider"))
            .lat(&e)
            .vs(format!("local {}", dur(l.median)))
            .ratio(format!("{} local", times(r)))
            .target(
                format!("≤ {need} HTTP request{} per call; steady state {}: {}", plural(need), req.steady, route_text(&req.steady_routes)),
                req.steady <= need,
            );
        let mut notes: Vec<String> = req.note().into_iter().collect();
        if tool == "start_task" {
            notes.push(format!(
                "{} of {} e2b and {} of {} local start_task calls (warm-up included) already answered with the final state",
                e2b_starts.0, e2b_starts.1, local_starts.0, local_starts.1
            ));
        }
        if tool == "kill_sandbox" {
            for (side, creates, failures) in &kill_failures {
                if let Some(first) = failures.first() {
                    notes.push(format!(
                        "{} of {creates} {side} kill_sandbox calls right after create_sandbox failed and were retried (not timed); the first: {first}",
                        failures.len()
                    ));
                }
            }
            let log = fs::read_to_string(b.log("e2b-emulator")).unwrap_or_default();
            let warned = log.lines().filter(|l| l.contains("killing local sandbox")).count();
            if warned > 0 {
                let first = log.lines().find(|l| l.contains("killing local sandbox")).unwrap_or("");
                let first = first.split_once("] ").map_or(first, |x| x.1); // without the log prefix
                notes.push(format!(
                    "the emulator logged {warned} failed kills of its local sandboxes (answering 204 all the same); the first: {first}"
                ));
            }
        }
        if !notes.is_empty() {
            row = row.note(notes.join("; "));
        }
        b.row(row);
    }
    b.keep_value("e2b.requests", Value::Object(raw));
    b.keep_value("e2b.rounds", json!({"done": done, "planned": rounds, "block": block, "warm": warm, "budget_s": budget.as_secs()}));
    b.keep_value(
        "e2b.kill_failures",
        json!(kill_failures.iter().map(|(side, creates, f)| json!({"side": side, "creates": creates, "failures": f})).collect::<Vec<_>>()),
    );

    let states = |xs: &[(f64, String)]| {
        let mut seen: Vec<(String, usize)> = Vec::new();
        for (_, st) in xs {
            match seen.iter_mut().find(|(s, _)| s == st) {
                Some(x) => x.1 += 1,
                None => seen.push((st.clone(), 1)),
            }
        }
        seen.iter().map(|(s, n)| format!("{s} ×{n}")).collect::<Vec<_>>().join(", ")
    };
    let secs_of = |xs: &[(f64, String)]| xs.iter().map(|x| x.0).collect::<Vec<f64>>();
    let l = b.keep("e2b.local.start_task_running", &secs_of(&running_local));
    let e = b.keep("e2b.e2b.start_task_running", &secs_of(&running_e2b));
    b.row(
        Row::new("e2b", format!("`start_task \"{E2B_RUNNING}\"` (still running): time to its first answer, e2b provider"))
            .lat(&e)
            .vs(format!("local {}", dur(l.median)))
            .ratio(format!("{} local", times(e.median / l.median)))
            .target("< 0.5 s (start_task answers once the supervisor confirms the task runs)", e.median < 0.5)
            .note(format!("states at the first answer: e2b {}; local {}", states(&running_e2b), states(&running_local))),
    );

    let mut opening = Vec::new();
    let mut per_call = Vec::new();
    for (tool, _, _) in E2B_TOOLS {
        let xs: Vec<u64> =
            conns.get(tool).and_then(Value::as_array).map(|a| a.iter().filter_map(Value::as_u64).collect()).unwrap_or_default();
        let m = mode(&xs).context(format!("no connection counts for {tool}"))?;
        if m > 0 {
            opening.push(tool);
        }
        per_call.push(format!("{tool} {m}"));
    }
    b.keep_value("e2b.connections_per_call", Value::Object(conns));
    b.row(
        Row::new("e2b", "new TCP connections per call in steady state (a separate pass through a counting TCP proxy)")
            .value(format!("{} of {} tools open a connection per call", opening.len(), E2B_TOOLS.len()))
            .target("0: every call reuses a kept-alive connection", opening.is_empty())
            .note(format!(
                "new connections per call (the most common of 3 calls of the same tool in a row, after one more): {}. A request on a new \
connection costs a TCP handshake more, and on E2B's cloud (HTTPS) a TLS handshake too",
                per_call.join(", ")
            )),
    );

    let steady_get = b.raw.get("e2b.e2b.get_task").and_then(|v| v["stats"]["median"].as_f64()).unwrap_or(f64::NAN);
    let steady_run = b.raw.get("e2b.e2b.run_command").and_then(|v| v["stats"]["median"].as_f64()).unwrap_or(f64::NAN);
    for (tool, what, need, why, steady) in [
        (
            "get_task",
            "`get_task`, first call from a fresh server process",
            2,
            "`GET /sandboxes/{id}` for the access token, then the status snippet (`Start`)",
            steady_get,
        ),
        (
            "run_command",
            "`run_command \"true\"`, first call from a fresh server process",
            4,
            "`GET /sandboxes/{id}` for the TTL, `connect` (renewal), the environment read for masking and the command (`Start`)",
            steady_run,
        ),
    ] {
        let f = first.get(tool).cloned().unwrap_or(Value::Null);
        let xs: Vec<f64> = f["secs"].as_array().map(|a| a.iter().filter_map(Value::as_f64).collect()).unwrap_or_default();
        let s = b.keep(&format!("e2b.first_call.{tool}"), &xs);
        let per_call: Vec<Value> = f["counts"].as_array().cloned().unwrap_or_default();
        let req = Requests::of(&per_call);
        let at_start = f["requests_at_start"].as_u64().unwrap_or(0);
        b.keep_value(
            &format!("e2b.first_call.{tool}.requests"),
            json!({"per_call": req.json(), "requests_at_start": at_start, "failure": f["failure"]}),
        );
        let mut row = Row::new("e2b", format!("{what}, e2b provider"));
        let mut notes: Vec<String> = Vec::new();
        if let Some(err) = f["failure"].as_str() {
            notes.push(format!("a first call from a fresh server failed: {err}"));
            row = row.target(format!("answers; ≤ {need} HTTP requests ({why})"), false);
        } else {
            row = row.target(
                format!("≤ {need} HTTP requests ({why}); measured {}: {}", req.steady, route_text(&req.steady_routes)),
                req.steady <= need,
            );
        }
        if !xs.is_empty() {
            row = row.lat(&s).vs(format!("later calls {}", dur(steady))).ratio(format!("{} later calls", times(s.median / steady)));
        }
        notes.extend(req.note());
        if at_start > 0 {
            notes.push(format!("the fresh servers made {at_start} requests before their first call"));
        }
        if !notes.is_empty() {
            row = row.note(notes.join("; "));
        }
        b.row(row);
    }
    e2b_promotion(b, emu, sandbox)
}

/// A plain run_command of `echo started; sleep 30` against an e2b server with `--task-after 1`:
/// the time from the threshold to the `running` answer (the command started under the
/// supervisor, which waited inside the sandbox), and the requests it made.
fn e2b_promotion(b: &mut Bench, emu: &mut Emulator, sandbox: &str) -> Result<()> {
    let n = b.n(10).max(3);
    let mut server = emu.server(b);
    server.env("SANDBOX_MCP_TASK_AFTER", "1");
    let mut rpc = session::spawn(server, &b.log("e2b-promotion"))?;
    session::initialize(&mut rpc)?;
    // (The first command of a server also reads the environment, for masking.)
    rpc.tool("run_command", &json!({"sandbox_id": sandbox, "command": "true"}))?;
    let (mut late, mut per_call) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let args = json!({"sandbox_id": sandbox, "command": "echo started; sleep 30", "timeout": 60});
        emu.reset()?;
        let t = Instant::now();
        let r = rpc.tool("run_command", &args)?;
        let e = secs(t);
        per_call.push(emu.counts()?);
        if r["state"] != "running" || r["stdout"] != "started\n" {
            bail!("run_command on e2b was not answered as running with its output so far: {r}");
        }
        late.push((e - 1.0).max(0.0));
        let task = r["task_id"].as_str().context("no task_id")?.to_string();
        rpc.tool("cancel_task", &json!({"sandbox_id": sandbox, "task_id": task}))?;
        rpc.tool("delete_task", &json!({"sandbox_id": sandbox, "task_id": task}))?;
    }
    rpc.end()?;
    let s = b.keep("e2b.plain_promotion_latency", &late);
    let req = Requests::of(&per_call);
    let mut note = format!(
        "measured from the call's start minus --task-after 1 s; the wait runs inside the sandbox (the supervisor's timer), so the \
answer also carries the in-sandbox start's delay; requests per call: {} ({})",
        req.steady,
        route_text(&req.steady_routes)
    );
    if let Some(extra) = req.note() {
        note = format!("{note}; {extra}");
    }
    b.row(
        Row::new("e2b", "plain run_command → `running` answer at `--task-after`, e2b provider")
            .lat(&s)
            .note(note)
            .target("< 100 ms and 1 HTTP request", s.median < 0.100 && req.steady <= 1),
    );
    Ok(())
}
