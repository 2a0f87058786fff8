//! Fault injection: SIGKILL of the server at random points of `start_task`,
//! `cancel_task` and `kill_sandbox`; SIGKILL of a task's supervisor; a full disk under the task
//! logs; the E2B emulator dropping streams and answering 5xx at random. After each, every task is
//! either confirmed in its true state with its true logs or reported `unknown` with a reason,
//! never a success that did not happen, and nothing the docs call stopped is left running.
//!
//! Fault points come from a seeded generator: the seed is printed at the start of each test and
//! is part of every failure message; `FAULT_SEED=<n>` replays it. Each test prints one tally line,
//! `faults: FAMILY cases=N running=.. succeeded=.. failed=.. cancelled=.. timed_out=.. unknown=..
//! absent=..` (see them with `--nocapture`).

use crate::support::*;
use sandbox_mcp::client::StdioClient;
use sandbox_mcp::provider::process::proc_stat;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Display;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Fault points per family for the SIGKILL families.
const CASES: usize = 10;

/// Tool calls made while the emulator injects faults.
const EMULATOR_CALLS: usize = 60;

/// Request id of the call a test kills the server under.
const KILLED_CALL: u64 = 1000;

// ---------------------------------------------------------------------------------------------
// Seeded randomness and tallies

/// One fault family: its seed, generator and tally.
struct Run {
    family: &'static str,
    seed: u64,
    rng: Rng,
    cases: usize,
    states: BTreeMap<String, usize>,
}

impl Run {
    fn new(family: &'static str) -> Run {
        let seed = seed("FAULT_SEED");
        println!("faults: {family} seed={seed} (replay with FAULT_SEED={seed})");
        // Each family draws its own sequence from the one seed.
        let salt = family.bytes().fold(0xCBF2_9CE4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01B3));
        Run { family, seed, rng: Rng((seed ^ salt) | 1), cases: 0, states: BTreeMap::new() }
    }

    /// The prefix of every failure message: family, seed and case.
    fn at(&self, case: impl Display) -> String {
        format!("[faults {} case {case}; seed {}, replay with FAULT_SEED={}]", self.family, self.seed, self.seed)
    }

    /// Counts one case that ended in `state`.
    fn count(&mut self, state: &str) {
        self.cases += 1;
        *self.states.entry(state.to_string()).or_default() += 1;
    }

    /// Prints the tally line.
    fn report(&self, extra: &str) {
        let n = |s: &str| self.states.get(s).copied().unwrap_or(0);
        println!(
            "faults: {} cases={} running={} succeeded={} failed={} cancelled={} timed_out={} unknown={} absent={}{extra}",
            self.family,
            self.cases,
            n("running"),
            n("succeeded"),
            n("failed"),
            n("cancelled"),
            n("timed_out"),
            n("unknown"),
            n("absent")
        );
    }
}

fn tally(map: &BTreeMap<String, usize>) -> String {
    map.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")
}

// ---------------------------------------------------------------------------------------------
// Commands whose truth is known in advance, and the judge

/// A task command and what it really does.
#[derive(Clone, Debug)]
struct Expect {
    command: String,
    stdout: String,
    stderr: String,
    /// Its own exit code; `None` for a command that runs until it is stopped.
    exit: Option<i64>,
}

impl Expect {
    /// A line on stdout, a pause, a line on stderr, then exit `code`.
    fn timed(token: &str, pause: &str, code: i64) -> Expect {
        Expect {
            command: format!("echo A-{token}; sleep {pause}; echo B-{token} >&2; exit {code}"),
            stdout: format!("A-{token}\n"),
            stderr: format!("B-{token}\n"),
            exit: Some(code),
        }
    }

    /// Like `timed`, with a random pause (none, short, longer) and exit code (0 or 3).
    fn quick(token: &str, rng: &mut Rng) -> Expect {
        let pause = *rng.pick(&["0", "0.1", "0.3"]);
        let code = *rng.pick(&[0, 3]);
        Expect::timed(token, pause, code)
    }

    /// A line on stdout, then sleeps until stopped; a `stubborn` one ignores TERM (it takes KILL).
    fn long(token: &str, stubborn: bool) -> Expect {
        let trap = if stubborn { "trap '' TERM; " } else { "" };
        Expect { command: format!("{trap}echo L-{token}; sleep 30"), stdout: format!("L-{token}\n"), stderr: String::new(), exit: None }
    }
}

/// Checks that a task snapshot tells the truth about the task running `expect`, or says
/// `unknown` with a reason; `allowed` lists the states possible at this point. Returns the state.
fn judge(at: &str, snap: &Value, expect: &Expect, allowed: &[&str]) -> String {
    let state = snap["state"].as_str().unwrap_or("<none>").to_string();
    assert!(allowed.contains(&state.as_str()), "{at} state {state:?} is not possible here (possible: {allowed:?}): {snap}");
    let out = snap["stdout"].as_str().unwrap_or("<none>");
    let err = snap["stderr"].as_str().unwrap_or("<none>");
    assert!(
        expect.stdout.starts_with(out) && expect.stderr.starts_with(err),
        "{at} logs the task never wrote (expected prefixes of {:?} / {:?}): {snap}",
        expect.stdout,
        expect.stderr
    );
    let code = snap["exit_code"].as_i64();
    match state.as_str() {
        "succeeded" | "failed" => {
            assert_eq!(code, expect.exit, "{at} {state} with an exit code the task never had: {snap}");
            assert_eq!(state == "succeeded", code == Some(0), "{at} {state} does not match exit code {code:?}: {snap}");
            assert!(out == expect.stdout && err == expect.stderr, "{at} a finished task with incomplete logs: {snap}");
        }
        "running" => assert!(snap["exit_code"].is_null() && snap["finished_at"].is_null(), "{at} running with an exit: {snap}"),
        "unknown" => assert!(snap["error"].as_str().is_some_and(|e| !e.trim().is_empty()), "{at} unknown without a reason: {snap}"),
        _ => {}
    }
    state
}

// ---------------------------------------------------------------------------------------------
// Tool calls, server kills and processes

/// A tool result, or the failure message with `at` when no result came (a hang, a dead server, a
/// JSON-RPC error such as a caught panic).
fn call(m: &mut Mcp, at: &str, tool: &str, args: Value) -> Value {
    m.client.call_tool(tool, args.clone(), TIMEOUT).unwrap_or_else(|e| panic!("{at} {tool} {args} got no tool result: {e}"))
}

/// The structuredContent of a successful tool result.
fn structured(result: &Value) -> Option<&Value> {
    (result["isError"] == json!(false)).then(|| &result["structuredContent"])
}

/// The task an error names ("... background task ID ...").
fn named_task(text: &str) -> Option<String> {
    let id = text.split("background task ").nth(1)?.get(..32)?;
    id.bytes().all(|b| b.is_ascii_hexdigit()).then(|| id.to_string())
}

fn error_text(result: &Value) -> &str {
    result["content"][0]["text"].as_str().unwrap_or("")
}

/// A tool call that must succeed.
fn ok(m: &mut Mcp, at: &str, tool: &str, args: Value) -> Value {
    let r = call(m, at, tool, args.clone());
    structured(&r).cloned().unwrap_or_else(|| panic!("{at} {tool} {args} failed: {r}"))
}

fn task_id(snap: &Value) -> String {
    snap["task_id"].as_str().unwrap_or_default().to_string()
}

/// A shell that SIGKILLs one process (the test's own, or one it verified), by its positive pid,
/// with the builtin `kill` (never an external kill binary, never a group), as soon as it is
/// fired: started beforehand, it kills within moments of the chosen fault point.
struct Killer(Child);

impl Killer {
    fn arm(pid: u32) -> Killer {
        assert!(pid > 1, "refusing to signal pid {pid}");
        let script = format!("read _ && kill -s KILL {pid} 2>/dev/null");
        Killer(Command::new("/bin/sh").args(["-c", &script]).stdin(Stdio::piped()).spawn().expect("starting the killer shell"))
    }

    fn fire(mut self) {
        if let Some(mut input) = self.0.stdin.take() {
            let _ = input.write_all(b"now\n");
        }
    }
}

impl Drop for Killer {
    /// Reaps the shell; one never fired reads end-of-file and exits without killing.
    fn drop(&mut self) {
        drop(self.0.stdin.take());
        let _ = self.0.wait();
    }
}

/// Sends a tool call to the server, waits `delay`, SIGKILLs the server (our unreaped child, so
/// its pid cannot have been reused) and returns the tool result it wrote before dying, if any.
fn call_then_sigkill(at: &str, mut m: Mcp, tool: &str, args: Value, delay: Duration) -> Option<Value> {
    let killer = Killer::arm(m.client.pid());
    let msg = json!({"jsonrpc": "2.0", "id": KILLED_CALL, "method": "tools/call", "params": {"name": tool, "arguments": args}});
    m.client.send_line(&msg.to_string()).expect("sending the call");
    std::thread::sleep(delay);
    killer.fire();
    // What the server wrote before it died is still in the pipe; then the pipe ends.
    let answer = m.client.recv_response(&json!(KILLED_CALL), Duration::from_secs(5)).ok();
    drop(m);
    answer.map(|a| a.get("result").cloned().unwrap_or_else(|| panic!("{at} a JSON-RPC error instead of a tool result: {a}")))
}

/// Live (non-zombie) processes whose environment holds exactly `entry` (`NAME=value`).
fn tagged(entry: &str) -> Vec<u32> {
    let me = std::process::id();
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        if pid == me {
            continue;
        }
        let Ok(env) = std::fs::read(e.path().join("environ")) else { continue };
        if env.split(|b| *b == 0).any(|v| v == entry.as_bytes()) && pid_alive(pid) {
            pids.push(pid);
        }
    }
    pids
}

/// Waits until no process of sandbox `sb` is left; names those still there when it gives up.
fn settle(sb: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !sandbox_procs(sb).is_empty() {
        if Instant::now() >= deadline {
            let left: Vec<String> = sandbox_procs(sb)
                .into_iter()
                .map(|p| {
                    let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
                    let cmd: String = String::from_utf8_lossy(&cmd).replace('\0', " ").chars().take(160).collect();
                    let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
                    let wchan = std::fs::read_to_string(format!("/proc/{p}/wchan")).unwrap_or_default();
                    format!("{p} [{}] {wchan}: {cmd}", stat.rsplit(") ").next().unwrap_or("").chars().take(30).collect::<String>())
                })
                .collect();
            panic!("after 30 s, processes of the sandbox are still there:\n{}", left.join("\n"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Processes of a local sandbox (the local provider tags each with `SANDBOX_MCP_SANDBOX`), but
/// the shell an isolated sandbox keeps waiting for its next command (there from its create on).
fn sandbox_procs(sb: &str) -> Vec<u32> {
    tagged(&format!("SANDBOX_MCP_SANDBOX={sb}")).into_iter().filter(|p| !is_waiting_shell(*p)).collect()
}

/// Processes of a task (the supervisor tags the task's with `SANDBOX_MCP_TASK`).
fn task_procs(task: &str) -> Vec<u32> {
    tagged(&format!("SANDBOX_MCP_TASK={task}"))
}

/// Live members of process group `pgid` that belong to sandbox `sb` (a group id can be reused by
/// strangers once the group is empty).
fn group_members(pgid: u32, sb: &str) -> Vec<u32> {
    sandbox_procs(sb).into_iter().filter(|p| proc_stat(*p).is_some_and(|s| s.pgrp == pgid)).collect()
}

fn tasks_dir(home: &Home, sb: &str) -> PathBuf {
    home.sandbox_dir(sb).join("home/.sandbox-mcp/tasks")
}

/// One `key=value` of a task's state file (its last value: the file is a series of blocks, the
/// last one the state).
fn state_field(dir: &Path, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(dir.join("state")).ok()?;
    text.lines().rev().find_map(|l| l.strip_prefix(key)?.strip_prefix('=')).map(str::to_string)
}

/// The keeper of sandbox `sb`: its pid and start time, from its pid file (waited for).
fn keeper_of(home: &Home, sb: &str) -> (u32, u64) {
    wait_for(Duration::from_secs(5), "the keeper's pid file", || {
        let text = std::fs::read_to_string(home.sandbox_dir(sb).join("keeper.pid")).ok()?;
        let mut it = text.split_whitespace().map(|s| s.parse::<u64>().ok());
        Some((it.next()?? as u32, it.next()??))
    })
}

/// The tasks (among `ids`) whose command file holds `command`, read from the sandbox directory.
fn tasks_with_command(home: &Home, sb: &str, ids: &[String], command: &str) -> Vec<String> {
    ids.iter().filter(|id| std::fs::read_to_string(tasks_dir(home, sb).join(id).join("cmd")).is_ok_and(|c| c == command)).cloned().collect()
}

fn list_ids(m: &mut Mcp, at: &str, sb: &str) -> Vec<String> {
    let l = ok(m, at, "list_tasks", json!({"sandbox_id": sb}));
    l["tasks"].as_array().unwrap().iter().map(task_id).collect()
}

// ---------------------------------------------------------------------------------------------
// SIGKILL of the server

#[test]
fn server_sigkill_during_start_task() {
    let mut run = Run::new("start_task");
    let home = Home::new("fault-start");
    let sb = home.create_detached(json!({"timeout": 600}));
    let mut cases: Vec<(Expect, Option<Value>)> = Vec::new();
    for k in 0..CASES {
        let expect = Expect::quick(&format!("s{k}"), &mut run.rng);
        // start_task takes some 30 to 60 ms here: before (at once), during and after it.
        let delay = if run.rng.one_in(4) { Duration::ZERO } else { run.rng.ms(0, 90) };
        let at = run.at(format!("{k}: SIGKILL {delay:?} into start_task of {:?}", expect.command));
        let args = json!({"sandbox_id": sb, "command": expect.command, "timeout": 60});
        let answer = call_then_sigkill(&at, home.stdio(), "start_task", args, delay);
        let snap = answer.as_ref().and_then(structured).cloned();
        if let Some(s) = &snap {
            judge(&at, s, &expect, &["running", "succeeded", "failed", "unknown"]);
        }
        // A new server reads every task now: each is truthful (maybe still running) or unknown.
        let mut b = home.stdio();
        let ids = list_ids(&mut b, &at, &sb);
        for id in &ids {
            let g = ok(&mut b, &at, "get_task", json!({"sandbox_id": sb, "task_id": id}));
            let cmd = std::fs::read_to_string(tasks_dir(&home, &sb).join(id).join("cmd")).unwrap_or_default();
            match cases.iter().map(|(e, _)| e).chain([&expect]).find(|e| e.command == cmd) {
                Some(e) => judge(&at, &g, e, &["running", "succeeded", "failed", "unknown"]),
                // Claimed, its command not written yet: nothing can be known.
                None => judge(&at, &g, &Expect { command: cmd, stdout: String::new(), stderr: String::new(), exit: None }, &["unknown"]),
            };
        }
        b.close();
        cases.push((expect, snap));
    }
    // Let every start, supervisor and task the killed servers left behind finish.
    settle(&sb);
    let mut b = home.stdio();
    let ids = list_ids(&mut b, &run.at("final"), &sb);
    for (k, (expect, snap)) in cases.iter().enumerate() {
        let at = run.at(format!("{k} (final read): {:?}", expect.command));
        let found = tasks_with_command(&home, &sb, &ids, &expect.command);
        assert!(found.len() <= 1, "{at} the command was started {} times: {found:?}", found.len());
        if let Some(s) = snap {
            if s["state"] != "unknown" {
                assert_eq!(found, vec![task_id(s)], "{at} a confirmed start must exist with its handle: {s}");
            }
        }
        let state = match found.first() {
            Some(id) => {
                let g = ok(&mut b, &at, "get_task", json!({"sandbox_id": sb, "task_id": id}));
                judge(&at, &g, expect, &["succeeded", "failed", "unknown"])
            }
            None => "absent".to_string(),
        };
        run.count(&state);
    }
    let started: usize = cases.iter().map(|(e, _)| tasks_with_command(&home, &sb, &ids, &e.command).len()).sum();
    assert_eq!(started, ids.len(), "{} tasks that no case started: {ids:?}", run.at("final"));
    run.report("");
}

#[test]
fn server_sigkill_during_cancel_task() {
    let mut run = Run::new("cancel_task");
    let home = Home::new("fault-cancel");
    let sb = home.create_detached(json!({"timeout": 600}));
    let mut after = BTreeMap::new();
    for k in 0..CASES {
        let stubborn = run.rng.one_in(4);
        let expect = Expect::long(&format!("c{k}"), stubborn);
        let mut a = home.stdio();
        let at = run.at(format!("{k}: {:?}", expect.command));
        let s = ok(&mut a, &at, "start_task", json!({"sandbox_id": sb, "command": expect.command, "timeout": 60}));
        judge(&at, &s, &expect, &["running"]);
        let task = task_id(&s);
        let dir = tasks_dir(&home, &sb).join(&task);
        let pgid: u32 = state_field(&dir, "pgid").and_then(|p| p.parse().ok()).expect("the task's group");
        // cancel_task takes some 60 ms for a polite task, 1.5 s for a stubborn one.
        let delay = run.rng.ms(0, 150);
        let at = run.at(format!("{k}: SIGKILL {delay:?} into cancel_task of {:?}", expect.command));
        let args = json!({"sandbox_id": sb, "task_id": task});
        if let Some(r) = call_then_sigkill(&at, a, "cancel_task", args.clone(), delay) {
            match structured(&r) {
                Some(c) => {
                    judge(&at, c, &expect, &["cancelled"]);
                }
                None => assert!(error_text(&r).contains("not confirmed"), "{at} {r}"),
            }
        }
        // A new server: the task is truthful; cancelling again ends it for sure.
        let mut b = home.stdio();
        let seen = ok(&mut b, &at, "get_task", args.clone());
        run.count(&judge(&at, &seen, &expect, &["running", "cancelled", "unknown"]));
        let done = ok(&mut b, &at, "cancel_task", args.clone());
        *after.entry(judge(&at, &done, &expect, &["cancelled"])).or_insert(0usize) += 1;
        wait_for(Duration::from_secs(5), "the cancelled task's processes to end", || {
            (task_procs(&task).is_empty() && group_members(pgid, &sb).is_empty()).then_some(())
        });
        b.close();
    }
    run.report(&format!(" (seen by a new server before cancelling again; after that: {}; process groups left=0)", tally(&after)));
}

#[test]
fn server_sigkill_during_kill_sandbox() {
    let mut run = Run::new("kill_sandbox");
    let home = Home::new("fault-kill");
    let (mut first_seen, mut answers) = (BTreeMap::new(), BTreeMap::new());
    for k in 0..CASES {
        let mut a = home.stdio();
        let at = run.at(k);
        let sb = a.create();
        let long = Expect::long(&format!("k{k}"), false);
        let quick = Expect::timed(&format!("k{k}"), "0", 0);
        let mut tasks = Vec::new();
        for expect in [long, quick] {
            let s = ok(&mut a, &at, "start_task", json!({"sandbox_id": sb, "command": expect.command}));
            tasks.push((expect, s));
        }
        // A process outside every task, found only by the sandbox's tag.
        ok(&mut a, &at, "run_command", json!({"sandbox_id": sb, "command": "setsid sleep 300 </dev/null >/dev/null 2>&1 &"}));
        let keeper = keeper_of(&home, &sb);
        // kill_sandbox takes a few ms: before (at once), during and after it.
        let delay = if run.rng.one_in(4) { Duration::ZERO } else { run.rng.ms(0, 20) };
        let at = run.at(format!("{k}: SIGKILL {delay:?} into kill_sandbox"));
        let answer = call_then_sigkill(&at, a, "kill_sandbox", json!({"sandbox_id": sb}), delay);
        if let Some(r) = &answer {
            let s = structured(r).unwrap_or_else(|| panic!("{at} kill_sandbox failed: {r}"));
            assert_eq!(s["killed"], true, "{at} {s}");
            assert!(sandbox_procs(&sb).is_empty(), "{at} an answered kill left processes: {:?}", sandbox_procs(&sb));
        }
        let dir = home.sandbox_dir(&sb);
        let left = match (dir.join("meta.json").exists(), dir.exists()) {
            (true, _) => "untouched",
            (false, true) => "half-killed",
            (false, false) => "gone",
        };
        *first_seen.entry(left.to_string()).or_insert(0usize) += 1;
        // A new server: every task is truthful, or gone with its sandbox.
        let mut b = home.stdio();
        for (i, (expect, s)) in tasks.iter().enumerate() {
            let r = call(&mut b, &at, "get_task", json!({"sandbox_id": sb, "task_id": task_id(s)}));
            let state = match structured(&r) {
                Some(g) => judge(&at, g, expect, &["running", "succeeded", "failed", "unknown"]),
                None => {
                    assert!(error_text(&r).contains("does not exist"), "{at} {r}");
                    "absent".to_string()
                }
            };
            if i == 0 {
                run.count(&state);
            }
        }
        *answers.entry(if answer.is_some() { "answered" } else { "unanswered" }.to_string()).or_insert(0usize) += 1;
        if left == "half-killed" {
            // Nobody may ever call kill_sandbox again: the keeper finishes an interrupted kill.
            wait_for(Duration::from_secs(10), "the keeper to finish the interrupted kill", || {
                (!dir.exists() && sandbox_procs(&sb).is_empty()).then_some(())
            });
        }
        // kill_sandbox again: nothing of the sandbox is left.
        let again = ok(&mut b, &at, "kill_sandbox", json!({"sandbox_id": sb}));
        assert!(again["killed"].is_boolean(), "{at} {again}");
        // (The keeper may be finishing an interrupted kill at the same moment: allow it a moment.)
        wait_for(Duration::from_secs(5), "the sandbox directory to go", || (!home.sandbox_dir(&sb).exists()).then_some(()));
        wait_for(Duration::from_secs(5), "no process of the killed sandbox", || sandbox_procs(&sb).is_empty().then_some(()));
        wait_for(Duration::from_secs(5), "the keeper to exit", || {
            (!proc_stat(keeper.0).is_some_and(|st| st.start == keeper.1 && st.state != 'Z')).then_some(())
        });
        let r = call(&mut b, &at, "get_task", json!({"sandbox_id": sb, "task_id": task_id(&tasks[0].1)}));
        assert!(r["isError"] == true && error_text(&r).contains("does not exist"), "{at} {r}");
        b.close();
    }
    run.report(&format!(
        " (the long task as a new server saw it before killing again; the sandbox then: {}; kill_sandbox {})",
        tally(&first_seen),
        tally(&answers)
    ));
}

/// Regression: kill_sandbox on a half-killed sandbox (metadata gone, processes left: a server
/// killed mid-kill, before its keeper noticed) finished the kill but answered `killed: false`, as
/// if nothing had been there.
#[test]
fn kill_sandbox_finishes_an_interrupted_kill_and_says_so() {
    let home = Home::new("fault-rekill");
    let mut m = home.stdio();
    let sb = m.create();
    let at = format!("sandbox {sb}");
    ok(&mut m, &at, "run_command", json!({"sandbox_id": sb, "command": "setsid sleep 300 </dev/null >/dev/null 2>&1 &"}));
    let dir = home.sandbox_dir(&sb);
    // The keeper would finish the kill itself within a second: stop it first (verified by start time).
    let (pid, start) = keeper_of(&home, &sb);
    assert!(proc_stat(pid).is_some_and(|st| st.start == start), "{at}: the keeper {pid} is not running");
    Killer::arm(pid).fire();
    wait_for(Duration::from_secs(5), "the keeper to die", || {
        (!proc_stat(pid).is_some_and(|st| st.start == start && st.state != 'Z')).then_some(())
    });
    // What an interrupted kill leaves: no metadata, processes and directory still there.
    std::fs::remove_file(dir.join("meta.json")).expect("removing meta.json");
    assert!(!sandbox_procs(&sb).is_empty(), "{at}: the background process is gone already");
    let first = ok(&mut m, &at, "kill_sandbox", json!({"sandbox_id": sb}));
    assert_eq!(first["killed"], true, "{at}: {first}");
    assert!(sandbox_procs(&sb).is_empty() && !dir.exists(), "{at}: left {:?}", sandbox_procs(&sb));
    let again = ok(&mut m, &at, "kill_sandbox", json!({"sandbox_id": sb}));
    assert_eq!(again["killed"], false, "{at}: {again}");
    m.close();
}

// ---------------------------------------------------------------------------------------------
// SIGKILL of the supervisor

/// Fires `killer` at a task's supervisor after checking that the pid still is that process (start
/// time) and belongs to sandbox `sb` (its tag); false when it had already exited.
fn kill_supervisor(at: &str, killer: Killer, pid: u32, start: u64, sb: &str) -> bool {
    let same = || proc_stat(pid).is_some_and(|s| s.start == start && s.state != 'Z');
    if !same() {
        return false;
    }
    let tag = format!("SANDBOX_MCP_SANDBOX={sb}");
    let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    if !env.split(|b| *b == 0).any(|v| v == tag.as_bytes()) {
        if env.is_empty() {
            // An exiting process shows no environment for a moment before it is a zombie.
            wait_for(Duration::from_secs(5), "the exiting supervisor to end", || (!same()).then_some(()));
        }
        assert!(!same(), "{at} pid {pid} is not a process of sandbox {sb}");
        return false;
    }
    killer.fire();
    true
}

/// Where the supervisor was when it died: `running` (the task too), `ending` (the task had
/// exited, the final state was not written yet) or `after` (the final state was written, or the
/// supervisor had already exited).
fn supervisor_window(dir: &Path) -> &'static str {
    match state_field(dir, "status").as_deref() {
        Some("running") if dir.join("done").exists() => "ending",
        Some("running") => "running",
        _ => "after",
    }
}

#[test]
fn supervisor_sigkill() {
    let mut run = Run::new("supervisor");
    let home = Home::unisolated("fault-sup");
    let mut m = home.stdio();
    let sb = m.create();
    let mut cases = Vec::new();
    let mut windows = BTreeMap::new();
    for k in 0..=CASES {
        // Case 0 runs until stopped, so that kill_sandbox must find it. Case 1 exits at once but
        // leaves a process (outside its group, without its tag) holding its output for 2 s, so
        // its supervisor is still finishing when it dies. The others end on their own within 0.1
        // to 0.3 s, and their supervisor dies at a random point of their life or near its end.
        let pause_ms: u64 = *run.rng.pick(&[100, 200, 300]);
        let expect = match k {
            0 => Expect::long("sup0", false),
            1 => Expect {
                command: "env -i setsid sleep 2 & echo A-sup1; exit 3".into(),
                stdout: "A-sup1\n".into(),
                stderr: String::new(),
                exit: Some(3),
            },
            _ => Expect::timed(&format!("sup{k}"), &format!("{}", pause_ms as f64 / 1000.0), *run.rng.pick(&[0, 3])),
        };
        let at = run.at(format!("{k}: {:?}", expect.command));
        let s = ok(&mut m, &at, "start_task", json!({"command": expect.command, "timeout": 30}));
        let task = task_id(&s);
        judge(&at, &s, &expect, &["running", "succeeded", "failed"]);
        let dir = tasks_dir(&home, &sb).join(&task);
        let field = |key| state_field(&dir, key).and_then(|v| v.parse::<u64>().ok()).expect("supervisor pid and start time");
        let (sup, sup_start) = (field("sup_pid") as u32, field("sup_start"));
        let killer = Killer::arm(sup);
        // Anywhere in the task's life, or (half the time) close to its end, where the supervisor
        // reaps it, cleans up and writes the final state.
        let delay = match k {
            1 => run.rng.ms(150, 1200),
            _ if run.rng.one_in(2) => run.rng.ms(0, 400),
            _ => run.rng.ms(pause_ms - 70, pause_ms + 10),
        };
        std::thread::sleep(delay);
        let at = run.at(format!("{k}: supervisor SIGKILLed {delay:?} after start_task of {:?}", expect.command));
        if kill_supervisor(&at, killer, sup, sup_start, &sb) {
            wait_for(Duration::from_secs(5), "the supervisor to die", || (!pid_alive(sup)).then_some(()));
        }
        let window = supervisor_window(&dir);
        *windows.entry(window.to_string()).or_insert(0usize) += 1;
        assert!(k != 1 || window == "ending", "{at} the supervisor was meant to die while finishing, not {window}");
        if k == 0 {
            // Its supervisor is gone while it runs: unknown, with its processes said to be alive.
            let g = ok(&mut m, &at, "get_task", json!({"sandbox_id": sb, "task_id": task}));
            judge(&at, &g, &expect, &["unknown"]);
            assert!(g["error"].as_str().unwrap_or("").contains("still running"), "{at} {g}");
            assert!(!task_procs(&task).is_empty(), "{at} the task died with its supervisor");
        }
        cases.push((at, task, expect, dir));
    }
    // The unsupervised tasks (all but case 0) end on their own.
    wait_for(Duration::from_secs(15), "the unsupervised tasks to end", || {
        cases[1..].iter().all(|(_, t, _, _)| task_procs(t).is_empty()).then_some(())
    });
    let mut b = home.stdio();
    for (at, task, expect, dir) in &cases {
        // The state file is the supervisor's word: a final one is reported, a dead supervisor's
        // `running` is unknown, whatever the task did meanwhile. (A final state can still appear
        // after the supervisor's death: the `mv` it started renames the complete temp file.)
        let status = state_field(dir, "status").unwrap_or_default();
        let g = ok(&mut b, at, "get_task", json!({"sandbox_id": sb, "task_id": task}));
        let state = judge(at, &g, expect, &["succeeded", "failed", "unknown"]);
        assert_eq!(state == "unknown", status == "running", "{at} state file says {status:?}: {g}");
        run.count(&state);
    }
    // kill_sandbox stops what the lost supervisors left: case 0's task, their timers.
    ok(&mut b, &run.at("kill_sandbox"), "kill_sandbox", json!({"sandbox_id": sb}));
    wait_for(Duration::from_secs(5), "no process of the killed sandbox", || sandbox_procs(&sb).is_empty().then_some(()));
    b.close();
    m.close();
    run.report(&format!(" (supervisor killed: {})", tally(&windows)));
}

// ---------------------------------------------------------------------------------------------
// A full disk under the task logs

/// The tmpfs size under the task directories.
const SMALL_DISK: &str = "512k";

/// Fails with a clear message unless this process may mount a tmpfs in a private mount namespace.
fn require_mount() {
    let dir = std::env::temp_dir().join(format!("smcp-mount-probe-{}", sandbox_mcp::ids::random_hex(4)));
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new("unshare")
        .args(["-m", "/bin/sh", "-c", r#"mount -t tmpfs -o size=64k tmpfs "$1" && umount "$1""#, "sh"])
        .arg(&dir)
        .output();
    let _ = std::fs::remove_dir(&dir);
    let why = match out {
        Ok(o) if o.status.success() => return,
        Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_string(),
        Err(e) => format!("cannot run unshare: {e}"),
    };
    panic!(
        "the full-disk fault test mounts a {SMALL_DISK} tmpfs in a private mount namespace (unshare -m, mount -t tmpfs), \
which needs root (CAP_SYS_ADMIN), and that failed here: {why}. Run the suite as root through `make test`."
    );
}

/// `sandbox-mcp stdio` in a private mount namespace of its own with a small tmpfs on each of
/// `dirs` (nothing outside that namespace sees the mounts; they go with its last process).
fn stdio_on_small_disks(home: &Home, dirs: &[PathBuf]) -> Mcp {
    let script =
        format!(r#"bin=$1; shift; for d; do mount -t tmpfs -o size={SMALL_DISK},mode=0700 tmpfs "$d" || exit 97; done; exec "$bin" stdio"#);
    let bin = bin();
    let mut args = vec!["-m", "/bin/sh", "-c", &script, "sh", bin.to_str().unwrap()];
    args.extend(dirs.iter().map(|d| d.to_str().unwrap()));
    let env = home.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut client = StdioClient::spawn(Path::new("unshare"), &args, &env, false).expect("starting the server under unshare");
    client.initialize().expect("initialize (under unshare, with the small disks mounted)");
    Mcp { client }
}

/// A task's snapshot with both logs read whole, page by page.
fn read_logs(m: &mut Mcp, at: &str, sb: &str, task: &str) -> Value {
    let (mut out, mut err, mut oo, mut eo) = (String::new(), String::new(), 0, 0);
    loop {
        let args = json!({"sandbox_id": sb, "task_id": task, "stdout_offset": oo, "stderr_offset": eo, "limit": 65536});
        let g = ok(m, at, "get_task", args);
        out.push_str(g["stdout"].as_str().unwrap());
        err.push_str(g["stderr"].as_str().unwrap());
        let (no, ne) = (g["stdout_next_offset"].as_u64().unwrap(), g["stderr_next_offset"].as_u64().unwrap());
        if (no, ne) == (oo, eo) {
            let mut whole = g;
            (whole["stdout"], whole["stderr"]) = (json!(out), json!(err));
            return whole;
        }
        (oo, eo) = (no, ne);
    }
}

#[test]
fn full_disk_under_the_task_logs() {
    require_mount();
    let mut run = Run::new("full_disk");
    let home = Home::unisolated("fault-disk");
    // One sandbox whose logs are copied as they are, one whose logs go through the masker.
    let plain = home.create_detached(json!({"timeout": 600}));
    let masked = home.create_detached(json!({"timeout": 600, "envs": {"SERVICE_TOKEN": "tok-full-disk-123"}}));
    let dirs: Vec<PathBuf> = [&plain, &masked].iter().map(|sb| tasks_dir(&home, sb)).collect();
    for d in &dirs {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(d).unwrap();
        std::fs::set_permissions(d.parent().unwrap(), std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    let mut m = stdio_on_small_disks(&home, &dirs);
    let lines: String = (1..=150_000).map(|i| format!("{i}\n")).collect();
    // More than the disk holds on each stream (some 0.9 MB each), then the task's own end.
    let flood = Expect {
        command: "seq 1 150000 & seq 1 150000 >&2; wait; echo the-end; exit 7".into(),
        stdout: format!("{lines}the-end\n"),
        stderr: lines.clone(),
        exit: Some(7),
    };
    let mut notes = Vec::new();
    for (name, sb) in [("plain", &plain), ("masked", &masked)] {
        let at = run.at(format!("{name} logs: {:?}", flood.command));
        let s = ok(&mut m, &at, "start_task", json!({"sandbox_id": sb, "command": flood.command, "timeout": 120}));
        let task = task_id(&s);
        // The task is never blocked by the full disk: it ends, and nothing of it is left.
        let done = wait_for(Duration::from_secs(60), "the flooding task to end", || {
            let g = ok(&mut m, &at, "get_task", json!({"sandbox_id": sb, "task_id": task}));
            (g["state"] != "running").then_some(g)
        });
        wait_for(Duration::from_secs(10), "the flooding task's processes to end", || task_procs(&task).is_empty().then_some(()));
        let g = read_logs(&mut m, &at, sb, &task);
        assert_eq!(g["state"], done["state"], "{at}");
        let (out, err) = (g["stdout"].as_str().unwrap().to_string(), g["stderr"].as_str().unwrap().to_string());
        // The supervisor saw the whole run: the task's own exit code, logs cut where the disk was
        // full (a prefix of what was written, never anything else) and flagged as incomplete.
        let incomplete = Expect { stdout: out.clone(), stderr: err.clone(), ..flood.clone() };
        let state = judge(&at, &g, &incomplete, &["failed"]);
        assert!(flood.stdout.starts_with(&out) && flood.stderr.starts_with(&err), "{at} logs the task never wrote");
        assert!(out.len() + err.len() < flood.stdout.len() + flood.stderr.len(), "{at} the small disk held everything?");
        assert_eq!(
            (g["stdout_truncated"].as_bool(), g["stderr_truncated"].as_bool()),
            (Some(out.len() < flood.stdout.len()), Some(err.len() < flood.stderr.len())),
            "{at} incomplete logs must be flagged: {g}"
        );
        assert!(g["error"].as_str().is_some_and(|e| e.contains("disk")), "{at} the reason the logs are short: {g}");
        run.count(&state);
        notes.push(format!(
            "{name}: {state} {}, kept {} + {} of {} + {} log bytes",
            g["exit_code"],
            out.len(),
            err.len(),
            flood.stdout.len(),
            flood.stderr.len()
        ));

        // A start on the full disk answers at once and never claims what it could not record.
        let on_full = Expect::timed(&format!("full-{name}"), "0", 0);
        let at = run.at(format!("{name}: start_task on the full disk"));
        let t0 = Instant::now();
        let r = call(&mut m, &at, "start_task", json!({"sandbox_id": sb, "command": on_full.command}));
        assert!(t0.elapsed() < Duration::from_secs(8), "{at} took {:?}", t0.elapsed());
        let state = match structured(&r) {
            Some(s) => judge(&at, s, &on_full, &["running", "succeeded", "failed", "unknown"]),
            None => {
                assert!(error_text(&r).contains("could not be started"), "{at} {r}");
                "absent".to_string()
            }
        };
        run.count(&state);
        notes.push(format!("{name}, start on the full disk: {}", if state == "absent" { "refused, nothing started" } else { &state }));

        // Room again: the sandbox works as before.
        let at = run.at(format!("{name}: after delete_task"));
        ok(&mut m, &at, "delete_task", json!({"sandbox_id": sb, "task_id": task}));
        let again = Expect::timed(&format!("again-{name}"), "0", 5);
        let s = ok(&mut m, &at, "start_task", json!({"sandbox_id": sb, "command": again.command}));
        let g = wait_for(Duration::from_secs(20), "the task to end", || {
            let g = ok(&mut m, &at, "get_task", json!({"sandbox_id": sb, "task_id": task_id(&s)}));
            (g["state"] != "running").then_some(g)
        });
        judge(&at, &g, &again, &["failed"]);
    }
    m.close();
    run.report(&format!(" ({})", notes.join("; ")));
}

// ---------------------------------------------------------------------------------------------
// The E2B emulator dropping streams and answering 5xx

/// A task started through the e2b provider, as the client knows it.
struct E2bTask {
    id: String,
    expect: Expect,
    /// The start was answered `unknown`: the task may or may not exist.
    unconfirmed: bool,
    /// A cancel_task was sent for it (whatever its answer).
    cancel_sent: bool,
}

/// The emulator's faults at random: 5xx answers (the request is not carried out) and streams
/// broken at several points (the request is carried out, the answer is lost).
fn random_faults(seed: u64) -> Value {
    let rule = |n: u64, rule: Value| {
        let mut r = rule;
        r["seed"] = json!(seed.wrapping_add(n.wrapping_mul(0x9E37_79B9)));
        r["count"] = json!(1_000_000);
        r
    };
    json!([
        rule(1, json!({"path_prefix": "/", "status": 503, "chance": 0.08})),
        rule(2, json!({"path_prefix": "/", "status": 500, "chance": 0.04})),
        rule(3, json!({"path_prefix": "/", "status": 502, "chance": 0.04})),
        rule(4, json!({"path_prefix": "/", "drop_after_bytes": 0, "chance": 0.08})),
        rule(5, json!({"path_prefix": "/process.Process/Start", "drop_after_bytes": 40, "chance": 0.08})),
        rule(6, json!({"path_prefix": "/process.Process/Start", "drop_after_bytes": 200, "chance": 0.08})),
    ])
}

#[test]
fn emulator_drops_streams_and_answers_5xx_at_random() {
    let mut run = Run::new("emulator");
    let e = E2bHome::new("fault-e2b");
    let mut m = e.stdio();
    let at = run.at("setup");
    let sb = ok(&mut m, &at, "create_sandbox", json!({"timeout": 600}))["sandbox_id"].as_str().unwrap().to_string();
    let (_, sandboxes) = e.emulator.request("GET", "/_emulator/sandboxes", Value::Null);
    let local =
        sandboxes.as_array().unwrap().iter().find(|s| s["sandboxID"] == sb.as_str()).unwrap()["localID"].as_str().unwrap().to_string();
    e.emulator.fault(random_faults(run.seed));
    let mut tasks: Vec<E2bTask> = Vec::new();
    let mut calls = BTreeMap::new();
    for k in 0..EMULATOR_CALLS {
        let op = *run.rng.pick(&["start_task", "start_task", "get_task", "cancel_task", "run_command", "list_tasks"]);
        let at = run.at(format!("{k}: {op} under faults"));
        let (tool, args, expect) = match op {
            "start_task" => {
                let expect =
                    if run.rng.one_in(3) { Expect::long(&format!("e{k}"), false) } else { Expect::quick(&format!("e{k}"), &mut run.rng) };
                ("start_task", json!({"sandbox_id": sb, "command": expect.command, "timeout": 120}), Some(expect))
            }
            "get_task" | "cancel_task" if !tasks.is_empty() => {
                let i = run.rng.below(tasks.len() as u64) as usize;
                tasks[i].cancel_sent |= op == "cancel_task";
                (op, json!({"sandbox_id": sb, "task_id": tasks[i].id}), None)
            }
            "run_command" => ("run_command", json!({"sandbox_id": sb, "command": format!("echo R-{k}; exit 4")}), None),
            _ => ("list_tasks", json!({"sandbox_id": sb}), None),
        };
        // Every call is answered (an error is fine; a hang or a JSON-RPC error is not).
        let r = call(&mut m, &at, tool, args.clone());
        let outcome = match structured(&r) {
            None => "error",
            Some(s) => s["state"].as_str().unwrap_or("ok"),
        };
        *calls.entry(format!("{tool}:{outcome}")).or_insert(0usize) += 1;
        if tool == "run_command" && structured(&r).is_none() {
            // A run_command on E2B runs as a task (its timeout exceeds --task-after): when its
            // answer is lost, the error names the task, which may have run.
            if let Some(id) = named_task(error_text(&r)) {
                let expect =
                    Expect { command: format!("echo R-{k}; exit 4"), stdout: format!("R-{k}\n"), stderr: String::new(), exit: Some(4) };
                tasks.push(E2bTask { id, expect, unconfirmed: true, cancel_sent: false });
            }
        }
        let Some(s) = structured(&r) else { continue };
        match tool {
            "start_task" => {
                let expect = expect.unwrap();
                judge(&at, s, &expect, &["running", "succeeded", "failed", "unknown"]);
                tasks.push(E2bTask { id: task_id(s), expect, unconfirmed: s["state"] == "unknown", cancel_sent: false });
            }
            "get_task" | "cancel_task" => {
                let t = tasks.iter().find(|t| t.id == args["task_id"]).unwrap();
                let possible: &[&str] = if tool == "cancel_task" {
                    &["cancelled", "succeeded", "failed"]
                } else {
                    &["running", "succeeded", "failed", "cancelled", "unknown"]
                };
                judge(&at, s, &t.expect, possible);
            }
            "run_command" => {
                let want = format!("R-{}\n", k);
                assert_eq!((s["exit_code"].as_i64(), s["stdout"].as_str()), (Some(4), Some(want.as_str())), "{at} {s}");
            }
            _ => {
                for t in s["tasks"].as_array().unwrap() {
                    assert!(tasks.iter().any(|known| known.id == t["task_id"]), "{at} a task nobody got a handle for: {t}");
                }
            }
        }
    }
    let (status, _) = e.emulator.request("DELETE", "/_emulator/faults", Value::Null);
    assert_eq!(status, 204);
    // Faults off: every task is truthful or unknown; a confirmed start exists; nothing else does.
    let at = run.at("after the faults");
    for t in &ok(&mut m, &at, "list_tasks", json!({"sandbox_id": sb}))["tasks"].as_array().unwrap().clone() {
        assert!(tasks.iter().any(|known| known.id == t["task_id"]), "{at} a task nobody got a handle for: {t}");
    }
    // Let the quick tasks (some started by starts whose answer was lost) finish.
    wait_for(Duration::from_secs(20), "the quick tasks to end", || {
        let l = ok(&mut m, &at, "list_tasks", json!({"sandbox_id": sb}));
        let running: BTreeSet<String> = l["tasks"].as_array().unwrap().iter().filter(|t| t["state"] == "running").map(task_id).collect();
        tasks.iter().filter(|t| t.expect.exit.is_some()).all(|t| !running.contains(&t.id)).then_some(())
    });
    for t in &tasks {
        let at = run.at(format!("final read of {} ({:?})", t.id, t.expect.command));
        let args = json!({"sandbox_id": sb, "task_id": t.id});
        let r = call(&mut m, &at, "get_task", args.clone());
        let state = match structured(&r) {
            Some(g) => {
                let mut possible = if t.expect.exit.is_none() { vec!["running"] } else { vec!["succeeded", "failed"] };
                possible.extend(["unknown"].iter().chain(t.cancel_sent.then_some(&"cancelled")));
                let state = judge(&at, g, &t.expect, &possible);
                if state == "running" {
                    judge(&at, &ok(&mut m, &at, "cancel_task", args), &t.expect, &["cancelled"]);
                }
                state
            }
            None => {
                assert!(t.unconfirmed && error_text(&r).contains("there is no task"), "{at} a handle that does not read: {r}");
                "absent".to_string()
            }
        };
        run.count(&state);
    }
    // kill_sandbox whose answer is lost, then again: nothing of the sandbox is left.
    e.emulator.fault(json!({"path_prefix": "/sandboxes/", "method": "DELETE", "drop_after_bytes": 0}));
    let at = run.at("kill_sandbox with its answer lost");
    let first = call(&mut m, &at, "kill_sandbox", json!({"sandbox_id": sb}));
    e.emulator.request("DELETE", "/_emulator/faults", Value::Null);
    let again = ok(&mut m, &at, "kill_sandbox", json!({"sandbox_id": sb}));
    assert!(again["killed"].is_boolean(), "{at} {first} {again}");
    let (status, body) = e.emulator.request("GET", &format!("/sandboxes/{sb}"), Value::Null);
    assert_eq!(status, 404, "{at} {body}");
    wait_for(Duration::from_secs(5), "no process of the killed sandbox", || sandbox_procs(&local).is_empty().then_some(()));
    wait_for(Duration::from_secs(5), "its directory to go", || (!e.emulator.home.join("sandboxes").join(&local).exists()).then_some(()));
    m.close();
    run.report(&format!(" (tasks after the faults; calls under faults: {})", tally(&calls)));
}
