//! A shell started ahead of a sandbox's next command, so that the command does not wait for
//! bash to start: the exec, the dynamic loader, the locale, bash's own start take about 1 ms
//! here, several times what the rest of a `run_command` costs.
//!
//! When a `bash -c SCRIPT` command whose request allows it has ended ([`fits`], and the
//! request's `next_env`, which the server names only without per-call environment or working
//! directory), the spawner starts one more bash of the same program and working directory, with
//! the environment `next_env` names (the sandbox's, with the task tag of the next command),
//! running [`WAITING`]: it reads its script from its stdin, a pipe the spawner holds, until end of
//! file. The sandbox's first command finds one too: the server asks for it with the create, in a
//! request that starts nothing else (`prepare`). The next request with that program, environment and working directory takes it: the
//! spawner writes the script into the pipe at once (at most [`SCRIPT_MAX`] bytes, atomic),
//! closes it, and answers with the shell's own stdout and stderr pipes in place of the server's.
//! A request that differs makes the spawner drop the waiting shell: its pipe closes empty and it
//! exits 0 having run nothing.
//!
//! The script runs as `bash -c` runs it: `$0`, `$#`, `$_`, `$LINENO`, `$SECONDS`,
//! `BASH_EXECUTION_STRING`, the options, stdin `/dev/null`, the environment and the working
//! directory are the same. What differs: a syntax error is reported as `bash: eval: line N` (not
//! `bash: -c: line N`); `ps` shows the waiting shell's command line for the command's shell;
//! the script's last command is not exec'd in bash's place (`bash -c 'a; b'` becomes `b`), so
//! the shell stays while it runs, one more process of the sandbox, and when it is killed by a
//! signal bash says so on stderr (`bash: line 1: 42 Killed ...`; the exit status is the same);
//! `PIPESTATUS` is set when the script starts; what bash reads once as it starts (`$HOSTNAME`,
//! its start time) dates from when the command before ended. An environment that would act on
//! bash before the script runs never gets a waiting shell ([`fits`]). The shell is a process of
//! the sandbox like any other: sandbox code can kill it (the next command then starts cold), or
//! write into its stdin through `/proc` (changing what it runs), which is running code in its
//! own sandbox.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

/// The longest script a waiting shell takes: one atomic pipe write (`PIPE_BUF`), which an empty
/// pipe takes whole without blocking, or refuses whole. Longer scripts start cold.
pub const SCRIPT_MAX: usize = 4096;

/// What a waiting shell runs (as `bash -c`). The script is read into `BASH_EXECUTION_STRING`,
/// where `bash -c` keeps its script, in one `read` call (`-N`), which answers 1 at the end of
/// input (any other status, and nothing runs); stdin becomes `/dev/null`; `SECONDS` counts from
/// the start of the script; `: "$0"` leaves `$_` as a shell just started sets it (the request's
/// environment has no `_`: see [`fits`]); `eval` runs the script.
pub const WAITING: &str = r#"IFS= read -r -N 4096 BASH_EXECUTION_STRING; [ "$?" -le 1 ] || exit 125; exec 0</dev/null; SECONDS=0; : "$0"; eval "$BASH_EXECUTION_STRING""#;

/// Variables that act on bash as it starts or on the lines above before the script runs
/// (options such as `errexit` or `xtrace`, a startup file that would read the script's pipe,
/// `read`'s time limit, functions that replace `read` or `eval`): where the environment has
/// one, commands start cold.
const STARTUP_VARIABLES: &[&str] =
    &["SHELLOPTS", "BASHOPTS", "BASH_ENV", "ENV", "TMOUT", "POSIXLY_CORRECT", "BASH_XTRACEFD", "PS4", "BASH_COMPAT", "_"];

/// Whether a command `argv` with environment `env` may run in a waiting shell: `bash -c SCRIPT`,
/// a script of at most [`SCRIPT_MAX`] bytes without a NUL (which `bash -c` refuses and `read`
/// would drop), and none of the startup variables (`STARTUP_VARIABLES`) nor an exported function
/// (`BASH_FUNC_*`) in the environment.
pub fn fits(argv: &[String], env: &[(String, String)]) -> bool {
    let [program, flag, script] = argv else { return false };
    Path::new(program).file_name().is_some_and(|name| name == "bash")
        && flag == "-c"
        && script.len() <= SCRIPT_MAX
        && !script.contains('\0')
        && !env.iter().any(|(name, _)| STARTUP_VARIABLES.contains(&name.as_str()) || name.starts_with("BASH_FUNC_"))
}

/// A bash waiting for its script.
pub struct WarmShell {
    pid: i32,
    program: String,
    env: Vec<(String, String)>,
    cwd: Option<String>,
    /// The write end of its stdin, non-blocking.
    script: File,
    /// The read ends of its stdout and stderr.
    stdout: OwnedFd,
    stderr: OwnedFd,
}

impl WarmShell {
    /// Starts `program` (a bash) waiting, with exactly `env`, in `dir` (`cwd` is the request's
    /// own, kept to compare), in a process group of its own. The caller reaps it.
    pub fn start(program: &str, env: &[(String, String)], cwd: Option<&str>, dir: &Path) -> io::Result<WarmShell> {
        let pipe = || rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC);
        let (stdin_read, stdin_write) = pipe()?;
        let (stdout_read, stdout_write) = pipe()?;
        let (stderr_read, stderr_write) = pipe()?;
        // Only this end: the shell's stays blocking (a separate open file description).
        rustix::fs::fcntl_setfl(&stdin_write, rustix::fs::OFlags::NONBLOCK)?;
        let child = Command::new(program)
            .args(["-c", WAITING])
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .current_dir(dir)
            .stdin(Stdio::from(stdin_read))
            .stdout(Stdio::from(stdout_write))
            .stderr(Stdio::from(stderr_write))
            .process_group(0)
            .spawn()?;
        // Never waited for through `Child`: the spawner's reaper reaps it.
        let pid = i32::try_from(child.id()).map_err(io::Error::other)?;
        Ok(WarmShell {
            pid,
            program: program.to_string(),
            env: env.to_vec(),
            cwd: cwd.map(str::to_string),
            script: File::from(stdin_write),
            stdout: stdout_read,
            stderr: stderr_read,
        })
    }

    /// Its pid, which is also its process group.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Whether it was started for commands of `program`, `env` and `cwd`.
    pub fn serves(&self, program: &str, env: &[(String, String)], cwd: Option<&str>) -> bool {
        self.program == program && self.env == env && self.cwd.as_deref() == cwd
    }

    /// Gives it `script` (at most [`SCRIPT_MAX`] bytes) and lets it run; returns the read ends
    /// of its stdout and stderr. The write is all or nothing: on `Err` the shell got no byte of
    /// it (it is gone, or sandbox code filled its pipe) and exits when dropped, running nothing
    /// of this script.
    pub fn hand(self, script: &str) -> io::Result<(OwnedFd, OwnedFd)> {
        if script.len() > SCRIPT_MAX {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "the script is too long for a waiting shell"));
        }
        let mut pipe = &self.script;
        let written = pipe.write(script.as_bytes())?;
        if written != script.len() {
            // Not possible for a write of at most PIPE_BUF bytes; never let a part of it run.
            return Err(io::Error::other("the waiting shell took only part of its script"));
        }
        // Closing the pipe is the end of the script: the shell runs it.
        drop(self.script);
        Ok((self.stdout, self.stderr))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn argv(program: &str, script: &str) -> Vec<String> {
        vec![program.into(), "-c".into(), script.into()]
    }

    #[test]
    fn only_short_bash_scripts_in_an_environment_that_leaves_bash_alone_fit() {
        let env = vec![("PATH".to_string(), "/usr/bin:/bin".to_string())];
        assert!(fits(&argv("/bin/bash", "true"), &env));
        assert!(fits(&argv("/usr/bin/bash", &"x".repeat(SCRIPT_MAX)), &env));
        assert!(!fits(&argv("/bin/bash", &"x".repeat(SCRIPT_MAX + 1)), &env));
        assert!(!fits(&argv("/bin/sh", "true"), &env));
        assert!(!fits(&["/bin/bash".into(), "-lc".into(), "true".into()], &env));
        assert!(!fits(&["/bin/bash".into(), "-c".into(), "true".into(), "arg0".into()], &env));
        assert!(!fits(&argv("/bin/bash", "echo a\0b"), &env));
        for name in ["_", "SHELLOPTS", "BASH_ENV", "TMOUT", "PS4", "BASH_FUNC_eval%%"] {
            assert!(!fits(&argv("/bin/bash", "true"), &[(name.into(), "x".into())]), "{name}");
        }
    }

    /// Runs `script` as `bash -c` and in a waiting shell (started, then given the script after
    /// it had time to wait); both answers: stdout, stderr, exit status.
    fn both_ways(script: &str) -> [(String, String, Option<i32>); 2] {
        let bash = "/bin/bash";
        let env = vec![("PATH".to_string(), "/usr/bin:/bin".to_string()), ("LANG".to_string(), "C".to_string())];
        let dir = std::env::temp_dir();
        let cold =
            Command::new(bash).args(["-c", script]).env_clear().envs(env.clone()).current_dir(&dir).stdin(Stdio::null()).output().unwrap();
        let shell = WarmShell::start(bash, &env, None, &dir).unwrap();
        let pid = shell.pid();
        // Give it time to reach its read: the script must not depend on when it arrives.
        std::thread::sleep(std::time::Duration::from_millis(50));
        let (out, err) = shell.hand(script).unwrap();
        let (mut stdout, mut stderr) = (String::new(), String::new());
        File::from(out).read_to_string(&mut stdout).unwrap();
        File::from(err).read_to_string(&mut stderr).unwrap();
        let status = rustix::process::waitpid(rustix::process::Pid::from_raw(pid), rustix::process::WaitOptions::empty()).unwrap();
        let code = status.and_then(|(_, s)| s.exit_status());
        let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
        [(text(cold.stdout), text(cold.stderr), cold.status.code()), (stdout, stderr, code)]
    }

    /// A waiting shell runs a script as `bash -c` does: the variables bash sets for its script,
    /// stdin, the descriptors it holds, exit codes and traps.
    #[test]
    fn a_waiting_shell_runs_a_script_as_bash_c_does() {
        if !Path::new("/bin/bash").exists() {
            return;
        }
        for script in [
            "true",
            "echo \"$0 $# [$_] $SECONDS $LINENO $-\"; echo \"$BASH_EXECUTION_STRING\"",
            "exit 3",
            "trap 'echo bye' EXIT; false",
            "cat; echo \"read $?\"; ls /proc/self/fd | sort -n | tr '\\n' ' '",
            "  echo lead\\\\ing  \n\n\necho \"$LINENO\"",
            "echo a\nnot-a-command-here\necho \"${BASH_SOURCE[*]}|${FUNCNAME[*]}|${BASH_LINENO[*]}\"",
            "f() { echo \"${FUNCNAME[*]} ${BASH_LINENO[*]}\"; return 4; }; f",
            "return 2",
            "set -o | tr -s ' \\t' ' '; shopt | tr -s ' \\t' ' '",
            "env | sort",
            "",
        ] {
            let [cold, warm] = both_ways(script);
            assert_eq!(cold, warm, "script {script:?}");
        }
    }

    #[test]
    fn a_dropped_waiting_shell_exits_having_run_nothing() {
        if !Path::new("/bin/bash").exists() {
            return;
        }
        let shell = WarmShell::start("/bin/bash", &[], None, &std::env::temp_dir()).unwrap();
        let pid = shell.pid();
        let mut out = File::from(shell.stdout.try_clone().unwrap());
        drop(shell);
        let status = rustix::process::waitpid(rustix::process::Pid::from_raw(pid), rustix::process::WaitOptions::empty()).unwrap();
        assert_eq!(status.and_then(|(_, s)| s.exit_status()), Some(0));
        let mut got = String::new();
        out.read_to_string(&mut got).unwrap();
        assert_eq!(got, "");
    }
}
