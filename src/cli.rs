//! The non-server subcommands: `call` (one tool call from a shell), `demo` (the walkthrough of
//! docs/contract.md, "The walkthrough", against real server processes) and the `--help` text.

use crate::app::App;
use crate::client::StdioClient;
use crate::config::{Config, OPTIONS};
use crate::mcp::session::Session;
use crate::tools::{self, Ctx, Reply};
use anyhow::{bail, Context, Result};
use serde_json::{json, Map, Value};
use std::io::Write;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The `--help` text.
pub fn help() -> String {
    let mut out = String::from(
        "sandbox-mcp: an MCP server that gives AI agents Linux sandboxes\n\n\
USAGE:\n  sandbox-mcp [stdio]            MCP over stdin/stdout (what MCP clients launch)\n  \
sandbox-mcp http [--listen ADDR] MCP over HTTP on POST /mcp\n  \
sandbox-mcp call TOOL [JSON|-]   one tool call (`-`: the JSON arguments from stdin); result JSON on stdout;\n    \
exit 1 when the tool failed, and call run_command exits with the command's exit code\n  \
sandbox-mcp call TOOL --help     that tool's description and arguments\n  \
sandbox-mcp tools                the list of tools\n  \
sandbox-mcp demo                 the durable-task walkthrough, step by step\n  \
sandbox-mcp doctor [--json]      what this host allows for isolation, the tier auto picks, remedies;\n    \
exit 0 when some isolated tier is available\n  \
sandbox-mcp -h, --help           this text\n\nOPTIONS (flag / environment / default):\n",
    );
    for o in OPTIONS {
        out.push_str(&format!("  {:<16} {:<24} {}  [{}]\n", o.flag.unwrap_or("-"), o.env.unwrap_or("-"), o.help, o.default));
    }
    out
}

/// `sandbox-mcp doctor [--json]`: prints the host's diagnosis; the exit status is 0 when some
/// isolated tier is available, else 1.
pub fn doctor(json: bool) -> u8 {
    let d = crate::provider::local::isolation::diagnosis::diagnose();
    if json {
        println!("{}", serde_json::to_string_pretty(&d).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}")));
    } else {
        print!("{}", d.text());
    }
    if d.isolated() {
        0
    } else {
        1
    }
}

/// `sandbox-mcp tools`: each tool's name and the first sentence of its description.
pub fn tool_list() -> String {
    let mut out = String::from("TOOLS (sandbox-mcp call TOOL --help for a tool's arguments):\n");
    for t in tools::all() {
        let first = t.description.split(". ").next().unwrap_or(t.description).trim_end_matches('.');
        out.push_str(&format!("  {:<15} {first}\n", t.name));
    }
    out
}

/// `sandbox-mcp call TOOL --help`: the tool's description and its arguments (from its input schema).
pub fn tool_help(tool: &tools::Tool) -> String {
    let schema = tools::args::input_schema(tool.params);
    let required: Vec<&str> = schema["required"].as_array().map(|r| r.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
    let mut out = format!("sandbox-mcp call {} [JSON|-]\n\n{}\n\nARGUMENTS (one JSON object; * required):\n", tool.name, tool.description);
    for p in tool.params {
        let prop = &schema["properties"][p.name];
        let mut kind = match &prop["enum"] {
            Value::Array(values) => values.iter().map(|v| v.to_string()).collect::<Vec<_>>().join("|"),
            _ => prop["type"].as_str().unwrap_or("value").to_string(),
        };
        if let (Some(min), Some(max)) = (prop["minimum"].as_i64(), prop["maximum"].as_i64()) {
            kind.push_str(&format!(" {min}..{max}"));
        }
        if let Some(default) = prop.get("default") {
            kind.push_str(&format!(", default {default}"));
        }
        let star = if required.contains(&p.name) { "*" } else { "" };
        out.push_str(&format!("  {:<14} {kind}\n", format!("{}{star}", p.name)));
        if !p.description.is_empty() {
            out.push_str(&format!("      {}\n", p.description));
        }
    }
    out
}

/// `sandbox-mcp call TOOL [JSON|-]`: prints `structuredContent` on success (exit 0; for
/// run_command the command's exit code), or the error text on stderr (exit 1). `-` reads the
/// arguments from stdin. Sandboxes created this way outlive the call: pass their id later.
pub fn call(config: Config, words: &[String]) -> Result<i32> {
    let Some(name) = words.first() else { bail!("usage: sandbox-mcp call TOOL [JSON-ARGUMENTS|-]; sandbox-mcp tools lists the tools") };
    let Some(tool) = tools::find(name) else {
        let names: Vec<&str> = tools::all().iter().map(|t| t.name).collect();
        bail!("unknown tool {name:?}; tools are: {}", names.join(", "));
    };
    if words.get(1).is_some_and(|w| w == "--help") {
        print!("{}", tool_help(tool));
        return Ok(0);
    }
    let stdin_text;
    let given = match words.get(1).map(String::as_str) {
        Some("-") => {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut text).context("reading the JSON arguments from stdin")?;
            stdin_text = text;
            Some(stdin_text.as_str())
        }
        other => other,
    };
    let arguments: Map<String, Value> = match given {
        None => Map::new(),
        Some(text) => match serde_json::from_str(text).with_context(|| format!("arguments {:?} are not JSON", crate::cli::shown(text)))? {
            Value::Object(m) => m,
            _ => bail!("arguments must be a JSON object, like '{{\"command\": \"ls\"}}'"),
        },
    };
    if words.len() > 2 {
        bail!("too many words after the tool name; pass the arguments as one JSON object");
    }
    // The caller of `call` waits for the end, however long: a run_command is never handed over to
    // a task at --task-after here.
    let app = App::new(Config { task_after: Duration::ZERO, ..config })?;
    let session = Session::new("call", true);
    session.initialize("2025-11-25");
    let cancel = Arc::new(AtomicBool::new(false));
    let ctx = Ctx { app: &app, session: &session, cancel: &cancel, client: "call" };
    let result = match tools::call(&ctx, tool, &arguments) {
        Reply::Now(finished) => finished.result,
        Reply::Wait(pending) => tools::finish(&app, "call", pending.block(), None).result,
    };
    let mut stdout = std::io::stdout().lock();
    if result["isError"] == json!(true) {
        let text = result["content"][0]["text"].as_str().unwrap_or("the tool failed");
        eprintln!("{name}: {text}");
        return Ok(1);
    }
    writeln!(stdout, "{}", result["structuredContent"])?;
    if tool.name == "run_command" {
        // The command's own exit code (modulo 256, as a shell reports it).
        return Ok(result["structuredContent"]["exit_code"].as_i64().map_or(0, |c| c.rem_euclid(256) as i32));
    }
    Ok(0)
}

/// At most 200 characters of `text`, for an error message.
fn shown(text: &str) -> String {
    let mut out: String = text.chars().take(200).collect();
    if out.len() < text.len() {
        out.push('…');
    }
    out
}

struct Demo {
    exe: std::path::PathBuf,
    args: Vec<String>,
    failures: usize,
}

impl Demo {
    fn server(&self, label: &str) -> Result<StdioClient> {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        // The servers' own logs would interleave with the walkthrough; keep them to warnings.
        let log = std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into());
        let mut client = StdioClient::spawn(&self.exe, &args, &[("RUST_LOG", log.as_str())], false)?;
        let init = client.initialize()?;
        println!(
            "\n[{label}] started a new server process (pid {}), negotiated MCP {}",
            client.pid(),
            init["protocolVersion"].as_str().unwrap_or("?")
        );
        Ok(client)
    }

    fn call(&mut self, client: &mut StdioClient, tool: &str, args: Value) -> Result<Value> {
        println!("\n-> {tool} {args}");
        let result = client.call_tool(tool, args, Duration::from_secs(120))?;
        if result["isError"] == json!(true) {
            let text = result["content"][0]["text"].as_str().unwrap_or("");
            println!("<- error: {text}");
            return Ok(Value::Null);
        }
        let structured = result["structuredContent"].clone();
        println!("<- {}", serde_json::to_string_pretty(&structured).unwrap_or_default().replace('\n', "\n   "));
        Ok(structured)
    }

    fn expect(&mut self, ok: bool, what: &str) {
        if ok {
            println!("   ok: {what}");
        } else {
            println!("   FAILED: {what}");
            self.failures += 1;
        }
    }
}

/// The demo's last steps: a 2026-07-28 client that declares the tasks extension runs a command
/// longer than `--task-after` (2 s here): the call answers with a task, read to its end through
/// `tasks/get`. Then a plain client does the same (local provider): the call answers
/// `state: "running"` with a task_id, read to its end with a waiting `get_task`.
fn long_command_as_task(d: &mut Demo, sandbox: &str, provider: &str) -> Result<()> {
    d.args = vec!["--provider".into(), provider.into(), "--task-after".into(), "2".into(), "stdio".into()];
    let mut c = d.server("session 3, --task-after 2")?;
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
    });
    let args = json!({"sandbox_id": sandbox, "command": "printf LONG-; sleep 5; printf DONE", "timeout": 60});
    println!("\n-> (2026-07-28, tasks extension declared) run_command {args}");
    let t0 = Instant::now();
    let resp = c.request("tools/call", json!({"name": "run_command", "arguments": args, "_meta": meta}), Duration::from_secs(60))?;
    let task = &resp["result"];
    println!("<- after {} ms: {task}", t0.elapsed().as_millis());
    d.expect(task["resultType"] == json!("task"), "the long run_command was answered with a task at --task-after");
    let id = task["taskId"].as_str().unwrap_or_default().to_string();
    let every = Duration::from_millis(task["pollIntervalMs"].as_u64().unwrap_or(1000));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = Value::Null;
    while Instant::now() < deadline {
        let got = c.request("tasks/get", json!({"taskId": id, "_meta": meta}), Duration::from_secs(30))?;
        last = got["result"].clone();
        println!("-> tasks/get: status {}", last["status"]);
        if last["status"] != json!("working") {
            break;
        }
        std::thread::sleep(every);
    }
    let result = &last["result"]["structuredContent"];
    println!("<- {}", serde_json::to_string(result).unwrap_or_default());
    d.expect(
        last["status"] == json!("completed") && result["stdout"] == json!("LONG-DONE") && result["exit_code"] == json!(0),
        "tasks/get returned the complete result (exit 0, LONG-DONE)",
    );
    if provider == "local" {
        let t0 = Instant::now();
        let plain =
            d.call(&mut c, "run_command", json!({"sandbox_id": sandbox, "command": "printf PLAIN-; sleep 4; printf DONE", "timeout": 60}))?;
        println!("   (answered after {} ms)", t0.elapsed().as_millis());
        d.expect(
            plain["state"] == json!("running") && plain["exit_code"].is_null() && plain["stdout"] == json!("PLAIN-"),
            "a plain client's long run_command was answered running, with a task_id and the output so far, at --task-after",
        );
        let task = plain["task_id"].as_str().unwrap_or_default().to_string();
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut last = plain.clone();
        let offset = plain["stdout_next_offset"].clone();
        while last["state"] == json!("running") && Instant::now() < deadline {
            last = d.call(
                &mut c,
                "get_task",
                json!({"sandbox_id": sandbox, "task_id": task, "stdout_offset": offset, "wait": 30, "until": "exit"}),
            )?;
        }
        d.expect(
            last["state"] == json!("succeeded") && last["exit_code"] == json!(0) && last["stdout"] == json!("DONE"),
            "a waiting get_task read the rest (DONE) and exit 0",
        );
    }
    c.close(Duration::from_secs(5))?;
    Ok(())
}

/// `sandbox-mcp demo`: a task started by one server process is read to its end by a second one,
/// which then cancels another task and kills the sandbox (docs/contract.md, "The walkthrough").
pub fn demo(config: &Config) -> Result<i32> {
    let exe = std::env::current_exe().context("finding this program")?;
    let provider = config.provider.name();
    let mut d = Demo { exe, args: vec!["--provider".into(), provider.into(), "stdio".into()], failures: 0 };
    println!("sandbox-mcp demo: a background task that outlives its MCP session ({provider} provider)");

    let mut a = d.server("session 1")?;
    let created = d.call(&mut a, "create_sandbox", json!({"template": "base", "timeout": 600}))?;
    let Some(sandbox) = created["sandbox_id"].as_str().map(str::to_string) else { bail!("create_sandbox failed") };
    let out = d.call(&mut a, "run_command", json!({"command": "echo hello from $(uname -s); pwd"}))?;
    d.expect(out["exit_code"] == json!(0), "run_command exits 0");
    d.call(&mut a, "write_file", json!({"path": "notes/hello.txt", "content": "written by the demo\n"}))?;
    let read = d.call(&mut a, "read_file", json!({"path": "notes/hello.txt"}))?;
    d.expect(read["content"] == json!("written by the demo\n"), "read_file returns what write_file wrote");
    let started = d.call(&mut a, "start_task", json!({"command": "printf BEFORE; sleep 10; printf AFTER", "timeout": 120}))?;
    let Some(task) = started["task_id"].as_str().map(str::to_string) else { bail!("start_task failed") };
    let status = a.close(Duration::from_secs(5))?;
    println!("\n[session 1] stdin closed: the server exited ({status}) and its session ended.");
    println!("            The sandbox lives on because start_task retained it; the handle is {sandbox} / {task}.");

    let mut b = d.server("session 2")?;
    // One waiting call follows the task to its end (until "exit"): no polling loop.
    let mut last = d.call(&mut b, "get_task", json!({"sandbox_id": sandbox, "task_id": task, "wait": 60, "until": "exit"}))?;
    if last["state"] == json!("running") {
        last = d.call(&mut b, "get_task", json!({"sandbox_id": sandbox, "task_id": task, "wait": 60, "until": "exit"}))?;
    }
    println!("\n   final: state {}, exit_code {}, stdout {}", last["state"], last["exit_code"], last["stdout"]);
    d.expect(last["state"] == json!("succeeded") && last["exit_code"] == json!(0), "the task finished with exit 0");
    d.expect(last["stdout"] == json!("BEFOREAFTER"), "stdout is the complete BEFOREAFTER, read by a different server process");

    let long = d.call(&mut b, "start_task", json!({"sandbox_id": sandbox, "command": "echo working; sleep 600", "timeout": 900}))?;
    let long_id = long["task_id"].as_str().unwrap_or_default().to_string();
    let t0 = Instant::now();
    let cancelled = d.call(&mut b, "cancel_task", json!({"sandbox_id": sandbox, "task_id": long_id}))?;
    d.expect(cancelled["state"] == json!("cancelled") && t0.elapsed() < Duration::from_secs(3), "cancel_task confirmed within 3 s");
    let listed = d.call(&mut b, "list_tasks", json!({"sandbox_id": sandbox}))?;
    d.expect(listed["count"] == json!(2), "list_tasks shows both tasks");
    long_command_as_task(&mut d, &sandbox, provider)?;
    let killed = d.call(&mut b, "kill_sandbox", json!({"sandbox_id": sandbox}))?;
    d.expect(killed["killed"] == json!(true), "kill_sandbox ended the sandbox");
    b.close(Duration::from_secs(5))?;
    if d.failures > 0 {
        println!("\ndemo finished with {} failed check(s)", d.failures);
        return Ok(1);
    }
    println!("\ndemo finished: every step behaved as specified");
    Ok(0)
}
