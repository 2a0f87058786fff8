//! Tasks with input (docs/contract.md, "Input and terminals"): `start_task` with `stdin` or
//! `pty`, `send_input` and `resize_task`, across server processes; each bad input; and the
//! sandbox attacking the input channel (its FIFO replaced, its terminal record forged).

use crate::support::*;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn start(m: &mut Mcp, sb: &str, command: &str, extra: Value) -> String {
    let mut args = json!({"sandbox_id": sb, "command": command});
    if let (Some(a), Some(e)) = (args.as_object_mut(), extra.as_object()) {
        a.extend(e.clone());
    }
    let s = m.ok("start_task", args);
    assert_eq!(s["state"], "running", "{s}");
    s["task_id"].as_str().unwrap().to_string()
}

fn send(m: &mut Mcp, sb: &str, task: &str, data: &str) -> Value {
    m.call("send_input", json!({"sandbox_id": sb, "task_id": task, "data": data}))
}

fn send_ok(m: &mut Mcp, sb: &str, task: &str, data: &str) {
    let r = send(m, sb, task, data);
    assert_eq!(r["isError"], json!(false), "send_input {data:?}: {r}");
}

fn send_err(m: &mut Mcp, sb: &str, task: &str, data: &str) -> String {
    m.err("send_input", json!({"sandbox_id": sb, "task_id": task, "data": data}))
}

/// Waits until the task's stdout holds `want`; returns the stdout.
/// Replaces task `task`'s end-of-input FIFO with a regular file (`dir`: the task directory, as the
/// sandbox names it), then sends data with `eof`: the call fails saying so, and none of the data
/// reached the task (a later input is the first it reads). Found by a review: the data went in and
/// the answer said nothing had, inviting the model to send it again.
fn eof_replaced_writes_nothing(m: &mut Mcp, sb: &str, task: &str, dir: &str) {
    m.ok("run_command", json!({"sandbox_id": sb, "command": format!("cd {dir} && rm stdin.eof && : >stdin.eof")}));
    let e = m.err("send_input", json!({"sandbox_id": sb, "task_id": task, "data": "secret-input\n", "eof": true}));
    assert!(e.contains("stdin.eof") && e.contains("replaced") && e.contains("nothing was written"), "{e}");
    send_ok(m, sb, task, "after\n");
    let out = stdout_has(m, sb, task, "after\n");
    assert!(!out.contains("secret-input"), "{out}");
}

fn stdout_has(m: &mut Mcp, sb: &str, task: &str, want: &str) -> String {
    wait_for(Duration::from_secs(20), &format!("{want:?} in the task's output"), || {
        let s = m.ok("get_task", json!({"sandbox_id": sb, "task_id": task, "wait": 2}));
        let out = s["stdout"].as_str().unwrap_or("").to_string();
        out.contains(want).then_some(out)
    })
}

fn finish(m: &mut Mcp, sb: &str, task: &str) -> Value {
    wait_for(Duration::from_secs(30), "the task to finish", || {
        let s = m.ok("get_task", json!({"sandbox_id": sb, "task_id": task, "wait": 2, "until": "exit"}));
        (s["state"] != "running").then_some(s)
    })
}

fn task_dir(home: &Home, sb: &str, task: &str) -> PathBuf {
    home.sandbox_dir(sb).join("home/.sandbox-mcp/tasks").join(task)
}

fn sandbox(m: &mut Mcp) -> String {
    m.ok("create_sandbox", json!({"timeout": 300}))["sandbox_id"].as_str().unwrap().to_string()
}

fn across_servers(home: &Home) {
    let mut a = home.stdio();
    let sb = sandbox(&mut a);
    let task = start(&mut a, &sb, "read a; echo got:$a; read b; echo got:$b; cat; echo end", json!({"stdin": true}));
    send_ok(&mut a, &sb, &task, "one\n");
    stdout_has(&mut a, &sb, &task, "got:one\n");
    a.close();
    // A new server process writes to the task the old one started.
    let mut b = home.stdio();
    send_ok(&mut b, &sb, &task, "two\nrest");
    stdout_has(&mut b, &sb, &task, "got:two\n");
    let r = b.ok("send_input", json!({"sandbox_id": sb, "task_id": task, "data": " of it\n", "eof": true}));
    assert_eq!((r["eof"].clone(), r["bytes"].clone()), (json!(true), json!(7)), "{r}");
    let s = finish(&mut b, &sb, &task);
    assert_eq!(s["state"], "succeeded", "{s}");
    assert_eq!(s["stdout"], "got:one\ngot:two\nrest of it\nend\n");
    // Input to a finished task.
    let e = send_err(&mut b, &sb, &task, "late\n");
    assert!(e.contains("has ended (succeeded)"), "{e}");
    b.close();
}

#[test]
fn a_new_server_sends_input_to_a_task_an_old_one_started() {
    across_servers(&Home::new("input-across"));
}

#[test]
fn a_new_server_sends_input_to_a_task_an_old_one_started_unisolated() {
    across_servers(&Home::unisolated("input-across-none"));
}

#[test]
fn bad_input_gets_clear_errors() {
    let home = Home::new("input-bad");
    let mut m = home.stdio();
    let sb = sandbox(&mut m);
    // A task without stdin reads /dev/null and takes no input.
    let plain = start(&mut m, &sb, "cat; echo eof-seen; sleep 30", json!({}));
    stdout_has(&mut m, &sb, &plain, "eof-seen\n");
    let e = send_err(&mut m, &sb, &plain, "x");
    assert!(e.contains("without stdin or pty") && e.contains("stdin: true"), "{e}");
    m.ok("cancel_task", json!({"sandbox_id": sb, "task_id": plain}));
    // More than 64 KiB in one call (UTF-8 bytes count).
    let task = start(&mut m, &sb, "cat >/dev/null", json!({"stdin": true}));
    let e = send_err(&mut m, &sb, &task, &"é".repeat(32 * 1024 + 1));
    assert!(e.contains("over send_input's limit") && e.contains("several calls"), "{e}");
    // Exactly 64 KiB is fine.
    send_ok(&mut m, &sb, &task, &"a".repeat(64 * 1024));
    // After eof, nothing more.
    m.ok("send_input", json!({"sandbox_id": sb, "task_id": task, "data": "", "eof": true}));
    let s = finish(&mut m, &sb, &task);
    assert_eq!(s["state"], "succeeded", "{s}");
    let e = send_err(&mut m, &sb, &task, "x");
    assert!(e.contains("has ended"), "{e}");
    // eof on a running task, then more input.
    let task = start(&mut m, &sb, "cat; sleep 30", json!({"stdin": true}));
    m.ok("send_input", json!({"sandbox_id": sb, "task_id": task, "data": "last\n", "eof": true}));
    stdout_has(&mut m, &sb, &task, "last\n");
    let e = wait_for(Duration::from_secs(5), "the holder to mark the end", || {
        let r = send(&mut m, &sb, &task, "x");
        (r["isError"] == json!(true)).then(|| r["content"][0]["text"].as_str().unwrap().to_string())
    });
    assert!(e.contains("was closed (eof: true)"), "{e}");
    m.ok("cancel_task", json!({"sandbox_id": sb, "task_id": task}));
    // An unknown task, a malformed id, resize of a task without a terminal.
    let e = send_err(&mut m, &sb, &"0".repeat(32), "x");
    assert!(e.contains("there is no task"), "{e}");
    let e = send_err(&mut m, &sb, "nope", "x");
    assert!(e.contains("is not a task id"), "{e}");
    let task = start(&mut m, &sb, "sleep 30", json!({"stdin": true}));
    let e = m.err("resize_task", json!({"sandbox_id": sb, "task_id": task, "rows": 10, "cols": 10}));
    assert!(e.contains("without pty"), "{e}");
    let e = m.err("resize_task", json!({"sandbox_id": sb, "task_id": task, "rows": 0, "cols": 10}));
    assert!(e.contains("rows"), "{e}");
    let e = m.err("start_task", json!({"sandbox_id": sb, "command": "true", "pty": {"rows": 1001}}));
    assert!(e.contains("rows"), "{e}");
    m.ok("cancel_task", json!({"sandbox_id": sb, "task_id": task}));
    m.close();
}

#[test]
fn a_task_that_never_reads_cannot_make_send_input_hang() {
    let home = Home::new("input-full");
    let mut m = home.stdio();
    let sb = sandbox(&mut m);
    let task = start(&mut m, &sb, "sleep 60", json!({"stdin": true}));
    // The pipe holds 64 KiB; the next call waits for room at most its deadline, then says how
    // much went in.
    let chunk = "b".repeat(64 * 1024);
    let mut error = None;
    for _ in 0..4 {
        let t0 = Instant::now();
        let r = send(&mut m, &sb, &task, &chunk);
        assert!(t0.elapsed() < Duration::from_secs(6), "send_input took {:?}", t0.elapsed());
        if r["isError"] == json!(true) {
            error = Some(r["content"][0]["text"].as_str().unwrap().to_string());
            break;
        }
    }
    let e = error.expect("a full input is an error");
    assert!(e.contains("is not reading its input") && e.contains("bytes went in"), "{e}");
    // The task is untouched, and other calls on the sandbox go on.
    let s = m.ok("get_task", json!({"sandbox_id": sb, "task_id": task}));
    assert_eq!(s["state"], "running", "{s}");
    m.ok("cancel_task", json!({"sandbox_id": sb, "task_id": task}));
    m.close();
}

/// The sandbox replaces the task's FIFO (or its directory) with something else: send_input
/// refuses, writes nothing there, and never blocks.
fn attacks(home: &Home) {
    let mut m = home.stdio();
    let sb = sandbox(&mut m);
    let inside = home.inside_home(&sb);
    let attacks: &[(&str, &str)] = &[
        ("a regular file", "rm stdin && : >stdin"),
        (
            "a symbolic link",
            "rm stdin && mkfifo ../../../outside.fifo && (cat <../../../outside.fifo >../../../outside.txt 2>/dev/null &) && ln -s ../../../outside.fifo stdin",
        ),
        ("a directory", "rm stdin && mkdir stdin"),
        ("a FIFO nobody reads", "rm stdin && mkfifo stdin"),
        ("a symbolic link to a host file", "rm stdin && ln -s /etc/hostname stdin"),
        ("a linked task directory", "cd .. && mv \"$T\" \"$T.real\" && ln -s \"$T.real\" \"$T\""),
    ];
    for (what, how) in attacks {
        let task = start(&mut m, &sb, "cat; sleep 60", json!({"stdin": true}));
        let dir = format!("{inside}/.sandbox-mcp/tasks/{task}");
        let script = format!("T={task}; cd {dir} && {how}");
        let r = m.ok("run_command", json!({"sandbox_id": sb, "command": script}));
        assert_eq!(r["exit_code"], 0, "{what}: {r}");
        let t0 = Instant::now();
        let e = send_err(&mut m, &sb, &task, "secret-input\n");
        assert!(t0.elapsed() < Duration::from_secs(5), "{what}: send_input took {:?}", t0.elapsed());
        let expected = match *what {
            "a FIFO nobody reads" => "no longer reads its input",
            _ => "replaced",
        };
        assert!(e.contains(expected), "{what}: {e}");
        // Nothing was written where the channel was, or where a link led.
        let check = format!("grep -rqs -D skip secret-input {inside}/; echo $?");
        let r = m.ok("run_command", json!({"sandbox_id": sb, "command": check}));
        assert_eq!(r["stdout"], "1\n", "{what}: {r}");
        m.ok("cancel_task", json!({"sandbox_id": sb, "task_id": task}));
        let cleanup = format!("[ -p {inside}/outside.fifo ] && timeout 2 sh -c ': >{inside}/outside.fifo'; rm -f {inside}/outside.*; true");
        m.ok("run_command", json!({"sandbox_id": sb, "command": cleanup}));
    }
    let task = start(&mut m, &sb, "cat; sleep 60", json!({"stdin": true}));
    eof_replaced_writes_nothing(&mut m, &sb, &task, &format!("{inside}/.sandbox-mcp/tasks/{task}"));
    m.ok("cancel_task", json!({"sandbox_id": sb, "task_id": task}));
    // The host file behind a link is untouched.
    let hostname = std::fs::read("/etc/hostname").unwrap_or_default();
    assert!(!String::from_utf8_lossy(&hostname).contains("secret-input"));
    // A task directory of another task's FIFO cannot be reached by a crafted id.
    let e = send_err(&mut m, &sb, "../../../../etc/x", "x");
    assert!(e.contains("is not a task id"), "{e}");
    m.close();
}

#[test]
fn the_sandbox_cannot_turn_the_input_channel_against_the_server() {
    attacks(&Home::new("input-attacks"));
}

#[test]
fn the_sandbox_cannot_turn_the_input_channel_against_the_server_unisolated() {
    attacks(&Home::unisolated("input-attacks-none"));
}

#[test]
fn a_pty_task_has_a_terminal_of_its_own_that_outlives_the_server() {
    let home = Home::new("pty");
    let mut a = home.stdio();
    let sb =
        a.ok("create_sandbox", json!({"timeout": 300, "envs": {"API_TOKEN": "tok-abcdefgh"}}))["sandbox_id"].as_str().unwrap().to_string();
    let loop_ = "[ -t 0 ] && [ -t 1 ] && echo on-a-tty; [ -n \"$TERM\" ] && echo has-term; stty size; echo \"key=$API_TOKEN\"; \
while read l; do case $l in size) stty size ;; tty) tty ;; q) exit 4 ;; esac; done";
    let task = start(&mut a, &sb, loop_, json!({"pty": {"rows": 30, "cols": 100}}));
    let out = stdout_has(&mut a, &sb, &task, "30 100");
    assert!(out.contains("on-a-tty") && out.contains("has-term") && out.contains("key=***") && !out.contains("tok-abcdefgh"), "{out}");
    // Typed input is echoed by the terminal, and read by the program.
    send_ok(&mut a, &sb, &task, "tty\n");
    let out = stdout_has(&mut a, &sb, &task, "/dev/pts/");
    assert!(out.contains("tty\r\n"), "the terminal echoes: {out:?}");
    a.close();
    // A new server resizes the terminal and types into it.
    let mut b = home.stdio();
    let r = b.ok("resize_task", json!({"sandbox_id": sb, "task_id": task, "rows": 40, "cols": 120}));
    assert_eq!((r["rows"].clone(), r["cols"].clone()), (json!(40), json!(120)));
    send_ok(&mut b, &sb, &task, "size\n");
    stdout_has(&mut b, &sb, &task, "40 120");
    // The sandbox forges the terminal record: resize refuses.
    let dir = task_dir(&home, &sb, &task);
    let inside = format!("{}/.sandbox-mcp/tasks/{task}", home.inside_home(&sb));
    for forged in ["1 /dev/pts/0", "$$ /dev/pts/0", "x /dev/tty", "2 /dev/pts/../../etc/passwd"] {
        let cmd = format!("cp {inside}/pty {inside}/pty.real; echo \"{forged}\" >{inside}/pty");
        b.ok("run_command", json!({"sandbox_id": sb, "command": cmd}));
        let e = b.err("resize_task", json!({"sandbox_id": sb, "task_id": task, "rows": 5, "cols": 5}));
        assert!(e.contains("not the one its process holds"), "{forged}: {e}");
        b.ok("run_command", json!({"sandbox_id": sb, "command": format!("mv {inside}/pty.real {inside}/pty")}));
    }
    assert!(dir.join("pty").exists() || home.isolated());
    send_ok(&mut b, &sb, &task, "q\n");
    let s = finish(&mut b, &sb, &task);
    assert_eq!((s["state"].clone(), s["exit_code"].clone()), (json!("failed"), json!(4)), "{s}");
    let e = b.err("resize_task", json!({"sandbox_id": sb, "task_id": task, "rows": 5, "cols": 5}));
    assert!(e.contains("has ended"), "{e}");
    b.close();
}

#[test]
fn ctrl_c_reaches_a_pty_task_cancel_ends_it_and_its_log_is_capped() {
    let home = Home::new("pty-cancel");
    let mut m = home.stdio();
    let sb = sandbox(&mut m);
    let task = start(&mut m, &sb, "trap 'echo interrupted' INT; echo ready; sleep 30 & wait; sleep 30", json!({"pty": {}}));
    stdout_has(&mut m, &sb, &task, "ready");
    send_ok(&mut m, &sb, &task, "\u{3}");
    stdout_has(&mut m, &sb, &task, "interrupted");
    let t0 = Instant::now();
    let c = m.ok("cancel_task", json!({"sandbox_id": sb, "task_id": task}));
    assert_eq!(c["state"], "cancelled", "{c}");
    assert!(t0.elapsed() < Duration::from_secs(4));
    // Nothing of the task is left in the sandbox.
    let r = m.ok(
        "run_command",
        json!({"sandbox_id": sb, "command": format!("grep -l SANDBOX_MCP_TASK={task} /proc/[0-9]*/environ 2>/dev/null | wc -l")}),
    );
    assert_eq!(r["stdout"].as_str().unwrap().trim(), "0", "{r}");
    // The log cap and offsets as for any task: 1.5 MB through the terminal keeps 1 MiB.
    let cmd = "head -c 1500000 /dev/zero | tr '\\0' a";
    let started = m.ok("start_task", json!({"sandbox_id": sb, "command": cmd, "pty": {}}));
    let big = started["task_id"].as_str().unwrap().to_string();
    let s = finish(&mut m, &sb, &big);
    assert_eq!((s["stdout_bytes"].clone(), s["stdout_truncated"].clone()), (json!(1 << 20), json!(true)), "{}", s["state"]);
    let page = m.ok("get_task", json!({"sandbox_id": sb, "task_id": big, "stdout_offset": (1 << 20) - 3}));
    assert_eq!(page["stdout"], "aaa");
    m.close();
}

/// E2B (through the emulator): the same channel, written by the supervisor's snippet inside the
/// sandbox; a new server process sends input and resizes; the channel's attacks fail there too.
#[test]
fn input_and_terminals_on_e2b() {
    let e = E2bHome::new("input-e2b");
    let mut a = e.stdio();
    let sb = sandbox(&mut a);
    let task = start(&mut a, &sb, "read -r a; printf 'got:%s\\n' \"$a\"; cat; echo end", json!({"stdin": true}));
    // Backslashes, % and a NUL byte arrive as they were sent.
    send_ok(&mut a, &sb, &task, "one \\c %s\n");
    stdout_has(&mut a, &sb, &task, "got:one \\c %s\n");
    let pty =
        start(&mut a, &sb, "stty size; while read l; do [ \"$l\" = size ] && stty size; done", json!({"pty": {"rows": 12, "cols": 34}}));
    stdout_has(&mut a, &sb, &pty, "12 34");
    a.close();
    let mut b = e.stdio();
    b.ok("send_input", json!({"sandbox_id": sb, "task_id": task, "data": "x\u{0}y\n", "eof": true}));
    let s = finish(&mut b, &sb, &task);
    assert_eq!(s["stdout"], "got:one \\c %s\nx\u{0}y\nend\n", "{s}");
    let e2 = send_err(&mut b, &sb, &task, "late");
    assert!(e2.contains("has ended"), "{e2}");
    b.ok("resize_task", json!({"sandbox_id": sb, "task_id": pty, "rows": 50, "cols": 60}));
    send_ok(&mut b, &sb, &pty, "size\n");
    stdout_has(&mut b, &sb, &pty, "50 60");
    // A task without input, one that never reads, a replaced FIFO.
    let plain = start(&mut b, &sb, "sleep 30", json!({}));
    assert!(send_err(&mut b, &sb, &plain, "x").contains("without stdin or pty"));
    let idle = start(&mut b, &sb, "sleep 60", json!({"stdin": true}));
    let chunk = "z".repeat(64 * 1024);
    let failed = (0..4).find_map(|_| {
        let t0 = Instant::now();
        let r = send(&mut b, &sb, &idle, &chunk);
        assert!(t0.elapsed() < Duration::from_secs(8), "{:?}", t0.elapsed());
        (r["isError"] == json!(true)).then(|| r["content"][0]["text"].as_str().unwrap().to_string())
    });
    assert!(failed.is_some_and(|m| m.contains("is not reading its input")));
    let dir = format!(".sandbox-mcp/tasks/{plain}");
    let fake = start(&mut b, &sb, "cat; sleep 60", json!({"stdin": true}));
    let fake_dir = format!(".sandbox-mcp/tasks/{fake}");
    b.ok("run_command", json!({"sandbox_id": sb, "command": format!("cd ~/{fake_dir} && rm stdin && ln -s ~/{dir}/cmd stdin")}));
    let m = send_err(&mut b, &sb, &fake, "x");
    assert!(m.contains("replaced"), "{m}");
    let eof = start(&mut b, &sb, "cat; sleep 60", json!({"stdin": true}));
    eof_replaced_writes_nothing(&mut b, &sb, &eof, &format!("~/.sandbox-mcp/tasks/{eof}"));
    for t in [&pty, &plain, &idle, &fake, &eof] {
        b.ok("cancel_task", json!({"sandbox_id": sb, "task_id": t}));
    }
    b.close();
}
