//! Pausing and resuming an emulated sandbox: every process of its local sandbox (found by the
//! local provider's tag, see `sandbox_mcp::provider::local::tagged_pids`) is sent SIGSTOP or
//! SIGCONT, one pid at a time through the shell builtin `kill` (never an external `kill` binary,
//! and never a process group).
//!
//! In an isolated sandbox the host also sees the tag on each `nsenter` that started a program
//! (the emulator's child; the programs and everything they start are inside the sandbox's pid
//! namespace). `nsenter` waits for its program with `WUNTRACED` and, when it sees the program
//! stopped, stops itself and continues the program once it is continued. So a freeze stops the
//! host-side processes first and a thaw continues the sandbox's own processes first (a stopped
//! state already cleared is never reported to `nsenter`), and then continues any `nsenter` that
//! stopped itself all the same (it can have read the stopped state just before it was stopped).

use super::process::{ns_pids, own_ns_depth};
use sandbox_mcp::provider::{local, process};
use std::path::Path;
use std::time::Duration;

/// How often, after a thaw, the host-side processes of an isolated sandbox are checked for one
/// that stopped itself, and how long apart.
const SETTLE_CHECKS: usize = 5;
const SETTLE_STEP: Duration = Duration::from_millis(20);

/// A signal that freezes or thaws processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freeze {
    /// SIGSTOP: the processes stop running until thawed.
    Stop,
    /// SIGCONT: stopped processes run again.
    Continue,
}

impl Freeze {
    /// The signal's name as the shell's `kill -s` takes it.
    pub fn signal_name(self) -> &'static str {
        match self {
            Freeze::Stop => "STOP",
            Freeze::Continue => "CONT",
        }
    }
}

/// Sends `freeze` to every process of local sandbox `local_id` through `shell`; returns how many
/// processes it found. Fails only when the shell could not be run.
pub fn freeze(shell: &Path, local_id: &str, freeze: Freeze) -> Result<usize, String> {
    let pids = local::tagged_pids(local_id);
    if pids.is_empty() {
        return Ok(0);
    }
    // Inside: in a pid namespace below the emulator's own.
    let own_depth = own_ns_depth();
    let (inside, host): (Vec<u32>, Vec<u32>) = pids.iter().partition(|pid| ns_pids(**pid).len() > own_depth);
    let send = |pids: &[u32]| {
        if pids.is_empty() {
            return Ok(());
        }
        process::signal_pids(shell, freeze.signal_name(), pids)
            .map(|_| ())
            .map_err(|err| format!("could not run {} to send SIG{} to sandbox {local_id}: {err}", shell.display(), freeze.signal_name()))
    };
    match freeze {
        Freeze::Stop => {
            send(&host)?;
            send(&inside)?;
        }
        Freeze::Continue => {
            send(&inside)?;
            send(&host)?;
            if !inside.is_empty() {
                for _ in 0..SETTLE_CHECKS {
                    std::thread::sleep(SETTLE_STEP);
                    let stopped: Vec<u32> =
                        host.iter().copied().filter(|p| process::proc_stat(*p).is_some_and(|st| st.state == 'T')).collect();
                    send(&stopped)?;
                }
            }
        }
    }
    Ok(pids.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    fn state_of(pid: u32) -> Option<char> {
        process::proc_stat(pid).map(|st| st.state)
    }

    fn wait_for_state(pid: u32, want: impl Fn(char) -> bool) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if state_of(pid).is_some_and(&want) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    #[test]
    fn stops_and_continues_only_the_tagged_processes() {
        let id = format!("local-{}", sandbox_mcp::ids::random_hex(12));
        let spawn = |tag: &str| {
            // One exec only: while a process execs, /proc shows it no environment for a moment,
            // so a second exec after the tag became visible could hide it from `freeze`.
            Command::new("sleep")
                .arg("60")
                .env(local::TAG_VAR, tag)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        };
        let mut mine = spawn(&id);
        let mut other = spawn("local-000000000000000000000000");
        // The tag is in the environment from exec on; wait until /proc shows it.
        let deadline = Instant::now() + Duration::from_secs(5);
        while !local::tagged_pids(&id).contains(&mine.id()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(freeze(Path::new("/bin/sh"), &id, Freeze::Stop).unwrap() >= 1);
        assert!(wait_for_state(mine.id(), |s| s == 'T'), "the tagged process did not stop");
        assert_ne!(state_of(other.id()), Some('T'), "an untagged process was stopped");
        assert!(freeze(Path::new("/bin/sh"), &id, Freeze::Continue).unwrap() >= 1);
        assert!(wait_for_state(mine.id(), |s| s != 'T'), "the tagged process did not continue");
        for child in [&mut mine, &mut other] {
            child.kill().unwrap();
            child.wait().unwrap();
        }
        assert_eq!(freeze(Path::new("/bin/sh"), &id, Freeze::Stop).unwrap(), 0);
    }
}
