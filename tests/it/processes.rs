//! Process creations per tool call on the local provider: each task tool runs one supervisor
//! snippet, and the start path creates only what the POSIX-shell design needs (see
//! `src/supervisor/start.sh` and `supervise.sh`). `make bench` reports the same counts.
//!
//! Counting: the server runs in a pid namespace of its own (`unshare --pid`), where nothing else
//! creates processes, so the pid of a probe command (`echo $$`, run with run_command) numbers the
//! clones since the previous probe: those of the call between them, plus the server's own pipe
//! reader threads of each exec (measured by two probes in a row, and taken off). Where no pid
//! namespace can be made, the `processes` line of /proc/stat (every clone on the machine) is read
//! instead, keeping the smallest of several rounds (other activity only adds).

use crate::support::*;
use sandbox_mcp::client::StdioClient;
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// The most processes each call may create: the counts of this design with dash and coreutils
/// (1, 2, 12 and 6), plus one for a provider that enters the sandbox through a process of its
/// own (such as `nsenter`), and for cancel_task two more polls on a busy machine.
const MAX_RUN_COMMAND: u64 = 2; // the shell (`true` is a builtin)
const MAX_GET_TASK: u64 = 3; // the snippet's shell, dd for the stdout page
const MAX_START_TASK: u64 = 13; // shell, the substitution's subshell, the claim's subshell + mkdir, supervisor, the task, 2 pumps + 2 copiers, the timer + its sleep
const MAX_CANCEL_TASK: u64 = 9; // shell, the supervisor's end (2 pump probes, wc), polls

enum Counter {
    /// Pids of probes in the server's own pid namespace.
    Namespace,
    /// The machine-wide clone counter.
    Machine,
}

struct Counted {
    m: Mcp,
    sb: String,
    counter: Counter,
    /// Server threads per exec (the pipe readers), measured.
    threads: u64,
}

impl Counted {
    fn start(home: &Home) -> Counted {
        let unshare = Command::new("unshare").args(["--fork", "--pid", "--mount-proc", "true"]).status();
        let counter = if unshare.is_ok_and(|s| s.success()) { Counter::Namespace } else { Counter::Machine };
        let env = home.env();
        let envs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let bin = bin();
        let mut client = match counter {
            Counter::Namespace => {
                StdioClient::spawn(Path::new("unshare"), &["--fork", "--pid", "--mount-proc", bin.to_str().unwrap(), "stdio"], &envs, false)
            }
            Counter::Machine => StdioClient::spawn(&bin, &["stdio"], &envs, false),
        }
        .expect("spawn server");
        client.initialize().expect("initialize");
        let mut m = Mcp { client };
        let sb = m.create();
        let mut c = Counted { m, sb, counter, threads: 0 };
        // Warm: the first task of a user probes its tools once and remembers them.
        let s = c.m.ok("start_task", json!({"sandbox_id": c.sb, "command": "echo warm"}));
        c.finish(&s);
        // An isolated sandbox's first command leaves a shell waiting for the next one, where
        // every later probe runs.
        c.probe();
        let sb = c.sb.clone();
        c.threads = match c.counter {
            // One probe's threads lie between two probes.
            Counter::Namespace => (0..5).map(|_| c.count(|_| {})).min().unwrap(),
            // The probes run nothing: a command that is one shell and its threads.
            Counter::Machine => {
                let one = |c: &mut Counted| {
                    c.m.ok("run_command", json!({"sandbox_id": sb, "command": ":"}));
                };
                (0..5).map(|_| c.count(one)).min().unwrap().saturating_sub(1)
            }
        };
        c
    }

    fn probe(&mut self) -> u64 {
        match self.counter {
            Counter::Namespace => {
                // The last pid taken in the sandbox's pid namespace, read without a fork: `$$`
                // would not do, since a command may run in a shell started before it.
                let probe = "read -r pid </proc/sys/kernel/ns_last_pid && echo \"$pid\"";
                let r = self.m.ok("run_command", json!({"sandbox_id": self.sb, "command": probe}));
                r["stdout"].as_str().unwrap().trim().parse().unwrap()
            }
            Counter::Machine => {
                let stat = std::fs::read_to_string("/proc/stat").unwrap();
                stat.lines().find_map(|l| l.strip_prefix("processes ")).unwrap().trim().parse().unwrap()
            }
        }
    }

    /// Clones between two probes around `f`, less the probes' own share.
    fn count(&mut self, f: impl FnOnce(&mut Counted)) -> u64 {
        let a = self.probe();
        f(self);
        let b = self.probe();
        match self.counter {
            Counter::Namespace => b - a - 1,
            Counter::Machine => b - a,
        }
    }

    /// Processes created by one call of `f`, which makes one exec: the clones less the server's
    /// threads for that exec and for the first probe's.
    fn processes(&mut self, f: impl FnOnce(&mut Counted)) -> u64 {
        let clones = self.count(f);
        let probes = match self.counter {
            Counter::Namespace => 1,
            Counter::Machine => 0,
        };
        clones.saturating_sub(self.threads * (1 + probes))
    }

    fn finish(&mut self, s: &Value) -> Value {
        let task = s["task_id"].as_str().unwrap().to_string();
        let sb = self.sb.clone();
        wait_for(Duration::from_secs(20), "the task to finish", || {
            let g = self.m.ok("get_task", json!({"sandbox_id": sb, "task_id": task}));
            (g["state"] != "running").then_some(g)
        })
    }

    /// Waits until the supervisor of a task started with `timeout` has settled: its timer's sleep
    /// and both pumps' copiers run (they are started last, possibly just after the answer).
    fn settled(&self, timeout: u64) {
        let tag = format!("SANDBOX_MCP_SANDBOX={}", self.sb);
        let timer = format!("sleep\0{timeout}\0");
        wait_for(Duration::from_secs(10), "the task's timer and pumps", || {
            let dir = std::fs::read_dir("/proc").ok()?;
            let (mut timers, mut copiers) = (0, 0);
            for e in dir.flatten().filter(|e| e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))) {
                let env = std::fs::read(e.path().join("environ")).unwrap_or_default();
                if !env.windows(tag.len()).any(|w| w == tag.as_bytes()) {
                    continue;
                }
                let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
                let argv0 = cmd.split(|b| *b == 0).next().unwrap_or_default();
                timers += usize::from(cmd == timer.as_bytes());
                copiers += usize::from(matches!(argv0, b"head" | b"dd" | b"awk"));
            }
            (timers == 1 && copiers == 2).then_some(())
        });
    }
}

#[test]
fn tool_calls_create_few_processes() {
    let home = Home::new("processes");
    let mut c = Counted::start(&home);
    let sb = c.sb.clone();
    // The smallest of a few rounds: polls (cancel_task waits for the supervisor's word) add
    // processes on a busy machine, and so does other activity when the counter is the machine's.
    let rounds = match c.counter {
        Counter::Namespace => 3,
        Counter::Machine => 5,
    };
    let min = |c: &mut Counted, f: &mut dyn FnMut(&mut Counted)| (0..rounds).map(|_| c.processes(&mut *f)).min().unwrap();

    let run = min(&mut c, &mut |c| {
        c.m.ok("run_command", json!({"sandbox_id": sb, "command": "true"}));
    });
    let done = c.m.ok("start_task", json!({"sandbox_id": sb, "command": "echo hello"}));
    let done = c.finish(&done);
    let task = done["task_id"].as_str().unwrap().to_string();
    let get = min(&mut c, &mut |c| {
        assert_eq!(c.m.ok("get_task", json!({"sandbox_id": sb, "task_id": task}))["stdout"], "hello\n");
    });
    // A task that execs its one process (no process of its own beyond the task shell).
    let mut starts = Vec::new();
    let mut cancels = Vec::new();
    for _ in 0..rounds {
        let mut task = String::new();
        starts.push(c.processes(|c| {
            let s = c.m.ok("start_task", json!({"sandbox_id": sb, "command": "exec sleep 60", "timeout": 3599}));
            assert_eq!(s["state"], "running", "{s}");
            task = s["task_id"].as_str().unwrap().to_string();
            c.settled(3599);
        }));
        cancels.push(c.processes(|c| {
            assert_eq!(c.m.ok("cancel_task", json!({"sandbox_id": sb, "task_id": task}))["state"], "cancelled");
        }));
    }
    let (start, cancel) = (starts.into_iter().min().unwrap(), cancels.into_iter().min().unwrap());
    let report =
        format!("run_command {run}, get_task {get}, start_task {start}, cancel_task {cancel} (server threads per exec: {})", c.threads);
    eprintln!("process creations: {report}");
    assert!(run <= MAX_RUN_COMMAND, "{report}");
    assert!(get <= MAX_GET_TASK, "{report}");
    assert!(start <= MAX_START_TASK, "{report}");
    assert!(cancel <= MAX_CANCEL_TASK, "{report}");
    c.m.close();
}
