//! The supervisor snippets: which POSIX-shell programs exist, the text each is sent as, the
//! constants they get from the Rust side, and the argv of every call.
//!
//! The positional arguments of each snippet are ordered here and only here ([`Call::argv`]); the
//! table in the module doc of `supervisor` describes them. Values the Rust side also uses (the
//! log cap, the task limit, the minimum secret length, the cancel timings) are never written in
//! the shell files: each snippet starts with a generated preamble of `NAME=value` lines built
//! from the Rust constants ([`Snippet::constants`]).

use super::Window;
use crate::limits;
use crate::provider::{Adoption, Provider};
use std::sync::OnceLock;
use std::time::Duration;

const COMMON: &str = include_str!("common.sh");
const INSPECT: &str = include_str!("inspect.sh");
const MASK_AWK: &str = include_str!("mask.awk");

/// The line of a snippet's file where `inspect.sh` (and, for the supervisor, the masker) is sent;
/// at the start of the file when it has none. A shell parses its program as it runs it: what
/// comes after this line is parsed only when the snippet gets there.
const INSPECT_HERE: &str = "# @inspect\n";

/// The line of `start.sh` and `supervise.sh` where the program of an adoption (a running
/// run_command handed over to the supervisor) gets its adopt mode, `start-adopt.sh` or
/// `supervise-adopt.sh`; the program of a start has nothing there, so that a start_task request
/// does not carry it.
const ADOPT_HERE: &str = "# @adopt\n";

/// The line of `supervise.sh` where the program of a start with input (`stdin` or `pty`) gets
/// `supervise-input.sh`; other programs have nothing there.
const INPUT_HERE: &str = "# @input\n";

/// Which program of a snippet: the plain one, an adoption's, or a start's with input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    Plain,
    Adopt,
    Input,
}

/// After a task's timeout: how long its group has between TERM and KILL.
pub const TIMEOUT_KILL_GRACE: Duration = Duration::from_secs(2);

/// `cancel_task`: how long the task's group has between TERM and KILL.
pub const CANCEL_KILL_GRACE: Duration = Duration::from_millis(1500);

/// `cancel_task`: how long the snippet waits for the supervisor's final state; the tool's
/// confirmation budget less a margin for the round trip.
pub const CANCEL_WAIT: Duration = limits::CANCEL_CONFIRM.saturating_sub(Duration::from_millis(100));

/// `delete_task`: a claimed task directory younger than this belongs to a start in progress.
pub const CLAIM_FRESH: Duration = Duration::from_secs(60);

/// One supervisor snippet. Each is sent as its preamble, `common.sh`, then its own file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Snippet {
    /// `start.sh`: claims a task directory and launches the supervisor.
    Start,
    /// `supervise.sh`: the detached supervisor of one task (launched by `start.sh`).
    Supervise,
    /// `status.sh`: one task's snapshot and log pages.
    Status,
    /// `cancel.sh`: stops a task, then its snapshot and log pages.
    Cancel,
    /// `list.sh`: the state of every task.
    List,
    /// `delete.sh`: removes a finished task.
    Delete,
    /// `resize.sh`: sets the size of a pty task's terminal.
    Resize,
    /// `input.sh`: writes a task's input from inside the sandbox.
    Input,
}

impl Snippet {
    /// Every snippet, in declaration order.
    pub const ALL: [Snippet; 8] = [
        Snippet::Start,
        Snippet::Supervise,
        Snippet::Status,
        Snippet::Cancel,
        Snippet::List,
        Snippet::Delete,
        Snippet::Resize,
        Snippet::Input,
    ];

    /// The snippet's own file, without `common.sh`.
    fn file(self) -> &'static str {
        match self {
            Snippet::Start => include_str!("start.sh"),
            Snippet::Supervise => include_str!("supervise.sh"),
            Snippet::Status => include_str!("status.sh"),
            Snippet::Cancel => include_str!("cancel.sh"),
            Snippet::List => include_str!("list.sh"),
            Snippet::Delete => include_str!("delete.sh"),
            Snippet::Resize => include_str!("resize.sh"),
            Snippet::Input => include_str!("input.sh"),
        }
    }

    /// The shell variables of the snippet's preamble, each with its value from the Rust side.
    pub fn constants(self) -> Vec<(&'static str, u128)> {
        match self {
            Snippet::Start => vec![("MAX_TASKS", limits::MAX_TASKS as u128)],
            Snippet::Supervise => vec![("LOG_CAP", limits::MAX_LOG_BYTES as u128), ("TERM_GRACE_CS", centis(TIMEOUT_KILL_GRACE))],
            Snippet::Cancel => vec![("CANCEL_KILL_CS", centis(CANCEL_KILL_GRACE)), ("CANCEL_WAIT_CS", centis(CANCEL_WAIT))],
            Snippet::Delete => vec![("CLAIM_FRESH_CS", centis(CLAIM_FRESH))],
            Snippet::Input => vec![("INPUT_WAIT_S", limits::INPUT_WRITE_WAIT.as_secs() as u128)],
            Snippet::Status | Snippet::List | Snippet::Resize => Vec::new(),
        }
    }

    /// The whole program: the preamble, `common.sh`, the snippet's file up to its `# @inspect`
    /// line, `inspect.sh` (after the supervisor's masker), then the rest of the file, each passed
    /// through `shape` (compaction for the wire, nothing for the linter).
    fn assemble(self, shape: fn(&str) -> String) -> String {
        self.assemble_for(shape, Variant::Plain)
    }

    /// The adopt mode's own file, for `start.sh` and `supervise.sh`.
    fn adopt_file(self) -> Option<&'static str> {
        match self {
            Snippet::Start => Some(include_str!("start-adopt.sh")),
            Snippet::Supervise => Some(include_str!("supervise-adopt.sh")),
            _ => None,
        }
    }

    /// [`Snippet::assemble`], with the adopt mode's file at the `# @adopt` line for
    /// `Variant::Adopt`, and the input's at the `# @input` line for `Variant::Input`.
    fn assemble_for(self, shape: fn(&str) -> String, variant: Variant) -> String {
        let adopt = variant == Variant::Adopt;
        let mut out = String::new();
        for (name, value) in self.constants() {
            out.push_str(&format!("{name}={value}\n"));
        }
        out.push_str(&shape(COMMON));
        let file = self.file();
        let (head, tail) = match file.find(INSPECT_HERE) {
            Some(at) => (&file[..at], &file[at + INSPECT_HERE.len()..]),
            None => ("", file),
        };
        match head.find(INPUT_HERE) {
            Some(at) if variant == Variant::Input => {
                out.push_str(&shape(&head[..at]));
                out.push_str(&shape(include_str!("supervise-input.sh")));
                out.push_str(&shape(&head[at + INPUT_HERE.len()..]));
            }
            _ => out.push_str(&shape(head)),
        }
        if self == Snippet::Supervise {
            // (A comment: kept for the linter, dropped from what is sent.)
            out.push_str(&shape("# shellcheck disable=SC2016 # an awk program: its $ fields are awk's, not the shell's\n"));
            out.push_str(&format!("MASK_AWK='{}'\n", mask_program(shape)));
        }
        out.push_str(&shape(INSPECT));
        match (tail.find(ADOPT_HERE), self.adopt_file()) {
            (Some(at), Some(adopt_file)) if adopt => {
                out.push_str(&shape(&tail[..at]));
                out.push_str(&shape(adopt_file));
                out.push_str(&shape(&tail[at + ADOPT_HERE.len()..]));
            }
            _ => out.push_str(&shape(tail)),
        }
        out
    }

    /// The program as sent to the sandbox (comments and indentation dropped).
    pub fn source(self) -> &'static str {
        static SOURCES: OnceLock<[String; 8]> = OnceLock::new();
        let all = SOURCES.get_or_init(|| Snippet::ALL.map(|s| s.assemble(compact)));
        &all[self as usize]
    }

    /// The program of an adoption as sent to the sandbox: [`Snippet::source`] with the adopt
    /// mode (`start.sh` and `supervise.sh`; the others have none).
    pub fn adopt_source(self) -> &'static str {
        static SOURCES: OnceLock<[String; 8]> = OnceLock::new();
        let all = SOURCES.get_or_init(|| Snippet::ALL.map(|s| s.assemble_for(compact, Variant::Adopt)));
        &all[self as usize]
    }

    /// The supervisor's program for a start with input (`stdin` or `pty`): its source with
    /// `supervise-input.sh` at the `# @input` line.
    pub fn input_source() -> &'static str {
        static SOURCE: OnceLock<String> = OnceLock::new();
        SOURCE.get_or_init(|| Snippet::Supervise.assemble_for(compact, Variant::Input))
    }
}

/// Whole hundredths of a second, the unit the snippets count time in.
fn centis(d: Duration) -> u128 {
    d.as_millis() / 10
}

/// The masker program: a generated `BEGIN` that sets the minimum secret length, then
/// `mask.awk`.
fn mask_program(shape: fn(&str) -> String) -> String {
    format!("BEGIN {{ min_len = {} }}\n{}", limits::MIN_SECRET_BYTES, shape(MASK_AWK))
}

/// The masker program as the supervisor runs it (for tests that compare it with the Rust masker).
pub fn mask_awk() -> String {
    mask_program(compact)
}

/// Drops comment lines, blank lines and indentation: the scripts travel in every request.
fn compact(script: &str) -> String {
    let mut out = String::with_capacity(script.len());
    for line in script.lines() {
        let line = line.trim_start();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// What `start_task` asks for.
#[derive(Debug, Clone, Copy)]
pub struct Launch<'a> {
    /// The new task's id.
    pub task_id: &'a str,
    /// Seconds before the task is stopped.
    pub timeout: i64,
    /// Working directory; the sandbox user's home when `None`.
    pub cwd: Option<&'a str>,
    /// The shell command line.
    pub command: &'a str,
    /// Bytes of each log returned with the first snapshot.
    pub page_limit: u64,
    /// Seconds the start waits inside the sandbox for the task's end before it answers (0: it
    /// answers once the task runs; see `start.sh`'s `run`).
    pub wait: u64,
    /// The task's input: none (`/dev/null`), a stdin channel, or a terminal.
    pub input: Option<TaskInput>,
}

/// What a task reads: `send_input` writes to it (docs/contract.md, "Input and terminals").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskInput {
    /// Its stdin is a FIFO kept open until `eof`.
    Stdin,
    /// It runs on a terminal of its own of this size; what is typed reaches the terminal.
    Pty {
        /// Rows.
        rows: u16,
        /// Columns.
        cols: u16,
    },
}

impl TaskInput {
    /// The INPUT argument of `start.sh`.
    fn arg(input: Option<TaskInput>) -> String {
        match input {
            None => String::new(),
            Some(TaskInput::Stdin) => "stdin".into(),
            Some(TaskInput::Pty { rows, cols }) => format!("pty {rows} {cols}"),
        }
    }
}

/// One call of a snippet with its arguments.
#[derive(Debug, Clone, Copy)]
pub enum Call<'a> {
    /// Start a task.
    Start(Launch<'a>),
    /// Adopt a running command as a task.
    Adopt(Adoption<'a>),
    /// Read one task.
    Status {
        /// The task.
        task_id: &'a str,
        /// The log pages to return.
        window: Window,
    },
    /// Cancel one task, then read it.
    Cancel {
        /// The task.
        task_id: &'a str,
        /// The log pages to return.
        window: Window,
    },
    /// List every task.
    List,
    /// Delete one finished task.
    Delete {
        /// The task.
        task_id: &'a str,
    },
    /// Write a task's input (`data` in printf %b form) and close it when `eof`.
    Input {
        /// The task.
        task_id: &'a str,
        /// The bytes, escaped for printf's %b.
        data: &'a str,
        /// Close the input after them.
        eof: bool,
    },
    /// Resize a pty task's terminal.
    Resize {
        /// The task.
        task_id: &'a str,
        /// Rows.
        rows: u16,
        /// Columns.
        cols: u16,
    },
}

impl Call<'_> {
    /// The snippet this call runs.
    pub fn snippet(&self) -> Snippet {
        match self {
            Call::Start(_) | Call::Adopt(_) => Snippet::Start,
            Call::Status { .. } => Snippet::Status,
            Call::Cancel { .. } => Snippet::Cancel,
            Call::List => Snippet::List,
            Call::Delete { .. } => Snippet::Delete,
            Call::Resize { .. } => Snippet::Resize,
            Call::Input { .. } => Snippet::Input,
        }
    }

    /// The positional arguments (`$1`, `$2`, ...), in the order the table in the `supervisor`
    /// module doc gives.
    fn args(&self, provider: &dyn Provider) -> Vec<String> {
        match *self {
            Call::Start(l) => {
                // The shell that runs snippets, which start.sh uses to run the supervisor.
                let sh = provider.posix_sh("", &[]).into_iter().next().unwrap_or_else(|| "/bin/sh".into());
                vec![
                    l.task_id.to_string(),
                    l.timeout.to_string(),
                    provider.task_shell(),
                    l.cwd.unwrap_or("").to_string(),
                    l.command.to_string(),
                    if l.input.is_some() { Snippet::input_source() } else { Snippet::Supervise.source() }.to_string(),
                    sh,
                    l.page_limit.to_string(),
                    l.wait.to_string(),
                    TaskInput::arg(l.input),
                ]
            }
            Call::Adopt(a) => {
                let sh = provider.posix_sh("", &[]).into_iter().next().unwrap_or_else(|| "/bin/sh".into());
                let flag = |b: bool| u8::from(b).to_string();
                vec![
                    "adopt".to_string(),
                    a.task_id.to_string(),
                    a.timeout.to_string(),
                    a.left.to_string(),
                    a.pgid.to_string(),
                    a.pre.0.to_string(),
                    a.pre.1.to_string(),
                    flag(a.truncated.0),
                    flag(a.truncated.1),
                    a.started_at.to_string(),
                    a.command.to_string(),
                    Snippet::Supervise.adopt_source().to_string(),
                    sh,
                ]
            }
            Call::Status { task_id, window } | Call::Cancel { task_id, window } => {
                vec![task_id.to_string(), window.stdout_offset.to_string(), window.stderr_offset.to_string(), window.limit.to_string()]
            }
            Call::List => Vec::new(),
            Call::Delete { task_id } => vec![task_id.to_string()],
            Call::Resize { task_id, rows, cols } => vec![task_id.to_string(), rows.to_string(), cols.to_string()],
            Call::Input { task_id, data, eof } => vec![task_id.to_string(), u8::from(eof).to_string(), data.to_string()],
        }
    }

    /// The argv that runs this call in a sandbox of `provider`.
    pub fn argv(&self, provider: &dyn Provider) -> Vec<String> {
        let args = self.args(provider);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let program = match self {
            Call::Adopt(_) => self.snippet().adopt_source(),
            _ => self.snippet().source(),
        };
        provider.posix_sh(program, &args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::process::{Command, Stdio};

    #[test]
    fn scripts_are_embeddable() {
        assert!(!MASK_AWK.contains('\''), "mask.awk must not contain a single quote");
        for (i, snippet) in Snippet::ALL.into_iter().enumerate() {
            assert_eq!(snippet as usize, i, "Snippet::ALL must list the snippets in declaration order");
            assert!(snippet.source().len() > 100, "{snippet:?}");
        }
        // Start and the supervisor parse the helpers that read tasks only after their answer.
        for snippet in [Snippet::Start, Snippet::Supervise] {
            assert_eq!(snippet.file().matches(INSPECT_HERE).count(), 1, "{snippet:?}");
            // The adopt mode comes after that line, only in an adoption's program.
            let at = snippet.file().find(INSPECT_HERE).unwrap_or(0);
            assert_eq!(snippet.file()[at..].matches(ADOPT_HERE).count(), 1, "{snippet:?}");
            assert!(!snippet.source().contains("\nadopt() {"), "{snippet:?}");
            assert!(snippet.adopt_source().contains("\nadopt() {"), "{snippet:?}");
        }
        // The start request must leave room for a 65,536-character command within 96 KiB (the
        // tasks tests start the longest ASCII one).
        let overhead = Snippet::Start.source().len() + Snippet::Supervise.source().len();
        assert!(overhead < 27 * 1024, "snippets are {overhead} bytes");
        // An adoption's request carries the same with the adopt modes, and the command line.
        let overhead = Snippet::Start.adopt_source().len() + Snippet::Supervise.adopt_source().len();
        assert!(overhead < 29 * 1024, "the adoption's snippets are {overhead} bytes");
        // A start with input carries its part of the supervisor, and only it.
        assert_eq!(Snippet::Supervise.file().matches(INPUT_HERE).count(), 1);
        assert!(!Snippet::Supervise.source().contains("\nopen_input() {"));
        assert!(Snippet::input_source().contains("\nopen_input() {"));
        let overhead = Snippet::Start.source().len() + Snippet::input_source().len();
        assert!(overhead < 28 * 1024, "the input start's snippets are {overhead} bytes");
    }

    #[test]
    fn constants_come_from_rust() {
        assert_eq!(Snippet::Supervise.constants(), vec![("LOG_CAP", 1_048_576), ("TERM_GRACE_CS", 200)]);
        assert_eq!(Snippet::Cancel.constants(), vec![("CANCEL_KILL_CS", 150), ("CANCEL_WAIT_CS", 290)]);
        assert!(CANCEL_KILL_GRACE < CANCEL_WAIT && CANCEL_WAIT < limits::CANCEL_CONFIRM);
        assert!(mask_awk().starts_with(&format!("BEGIN {{ min_len = {} }}\n", limits::MIN_SECRET_BYTES)));
        // Every preamble variable is read by its snippet, and no snippet sets one itself.
        for snippet in Snippet::ALL {
            for (name, _) in snippet.constants() {
                assert!(snippet.file().contains(name), "{snippet:?} never reads {name}");
                assert!(!snippet.file().contains(&format!("{name}=")), "{snippet:?} sets {name} itself");
            }
        }
    }

    /// `program` run by /bin/sh with `args`, HOME at `home` and `path` as PATH (else this
    /// process's): its stdout and stderr.
    fn sh(program: &str, args: &[&str], home: &std::path::Path, path: Option<&std::ffi::OsStr>) -> (String, String) {
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", program, "sh"]).args(args).env("HOME", home);
        if let Some(path) = path {
            cmd.env("PATH", path);
        }
        let out = cmd.output().expect("sh runs");
        (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    }

    /// start.sh's run (wait mode) as a provider would run it, with HOME at `home`.
    fn run_mode(home: &std::path::Path, id: &str, command: &str, wait: &str) -> (String, String) {
        let args = [id, "30", "/bin/sh", "", command, Snippet::Supervise.source(), "/bin/sh", "1048576", wait];
        sh(Snippet::Start.source(), &args, home, None)
    }

    #[test]
    fn run_mode_answers_at_the_end_or_after_the_wait() {
        let home = std::env::temp_dir().join(format!("sandbox-mcp-run-{}", std::process::id()));
        std::fs::create_dir_all(&home).unwrap();
        let tasks = home.join(".sandbox-mcp/tasks");
        // Ends in time: the whole logs, and the task directory goes.
        let id = "0123456789abcdef0123456789abcde0";
        let (out, err) = run_mode(&home, id, "echo out; head -c 1500000 /dev/zero | tr '\\0' e >&2; exit 3", "5");
        assert!(out.starts_with(&format!("@task {id}\nstatus=exited\nexit_code=3\n")), "{out}");
        assert!(out.ends_with("@end\nout\n"), "{out}");
        assert_eq!(err.len(), 1 << 20, "{}", &err[..err.len().min(200)]);
        let gone = until(|| !tasks.join(id).exists());
        assert!(gone, "the directory of a run that ended in time is removed");
        // Still running after the wait: the output so far; the task goes on.
        let id = "0123456789abcdef0123456789abcde1";
        let t0 = std::time::Instant::now();
        let (out, _) = run_mode(&home, id, "echo early; sleep 3; echo late", "1");
        assert!(t0.elapsed() < std::time::Duration::from_millis(2500), "{:?}", t0.elapsed());
        assert!(out.contains("status=running\n") && out.ends_with("@end\nearly\n"), "{out}");
        let state = tasks.join(id).join("state");
        let ended = until(|| std::fs::read_to_string(&state).is_ok_and(|s| s.contains("status=exited")));
        assert!(ended, "the task goes on to its end");
        let _ = std::fs::remove_dir_all(&home);
    }

    /// A finished task read while its directory is removed (a run's clean-up, a delete_task)
    /// comes with its whole logs, or reads as removed; never as finished with logs cut short.
    /// get_task answered a finished run's task with an empty page of its 4-byte log when the
    /// run's clean-up removed the logs between the state's read and theirs.
    #[test]
    fn a_finished_task_removed_while_it_is_read_keeps_its_logs_or_is_gone() {
        let home = std::env::temp_dir().join(format!("sandbox-mcp-removed-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&home);
        let bin = home.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let tasks = home.join(".sandbox-mcp/tasks");
        let id = "0123456789abcdef0123456789abcde2";
        let (out, _) = run_mode(&home, id, "printf out; printf err >&2; exit 4", "0");
        assert!(out.starts_with(&format!("@task {id}\n")), "{out}");
        let state = tasks.join(id).join("state");
        assert!(until(|| std::fs::read_to_string(&state).is_ok_and(|s| s.contains("status=exited"))), "the task ends");
        // The removal lands between the state's read and the logs': a `dd` that removes the
        // directory first stands for it.
        let real_dd = ["/bin/dd", "/usr/bin/dd"].into_iter().find(|p| std::path::Path::new(p).exists()).expect("dd");
        let dd = bin.join("dd");
        std::fs::write(&dd, format!("#!/bin/sh\nrm -rf '{}'\nexec {real_dd} \"$@\"\n", tasks.join(id).display())).unwrap();
        std::fs::set_permissions(&dd, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let path = std::env::join_paths(std::iter::once(bin.clone()).chain(std::env::split_paths(&std::env::var_os("PATH").unwrap())));
        let path = path.unwrap();
        let (out, err) = sh(Snippet::Status.source(), &[id, "0", "0", "16384"], &home, Some(&path));
        assert!(out.contains("status=exited\nexit_code=4\n") && out.contains("out_size=3\nerr_size=3\n"), "{out}");
        assert!(out.ends_with("@end\nout"), "the whole stdout: {out}");
        assert_eq!(err, "err", "the whole stderr");
        assert!(!tasks.join(id).exists(), "the directory was removed during the read");
        // Logs already gone while the state is still there: the task is being removed.
        let id = "0123456789abcdef0123456789abcde3";
        run_mode(&home, id, "printf out; exit 4", "0");
        let state = tasks.join(id).join("state");
        assert!(until(|| std::fs::read_to_string(&state).is_ok_and(|s| s.contains("status=exited"))), "the task ends");
        std::fs::remove_file(tasks.join(id).join("stdout.log")).unwrap();
        let (out, _) = sh(Snippet::Status.source(), &[id, "0", "0", "16384"], &home, None);
        assert_eq!(out, "@none\n");
        let _ = std::fs::remove_dir_all(&home);
    }

    /// Polls `f` for up to 10 seconds.
    fn until(mut f: impl FnMut() -> bool) -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if f() {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        false
    }

    #[test]
    fn compact_keeps_code_only() {
        assert_eq!(compact("# c\n\n  a=1 # keep\n\tb\n"), "a=1 # keep\nb\n");
    }

    /// `shellcheck -s sh` over every snippet exactly as assembled (preamble, `common.sh`, the
    /// snippet), with comments kept so that its `disable` directives apply.
    #[test]
    fn snippets_pass_shellcheck() {
        let probe = Command::new("shellcheck").arg("--version").output();
        assert!(
            probe.is_ok_and(|o| o.status.success()),
            "shellcheck is not installed; `make setup` (tests/interop/setup.sh) installs it, or run `apt-get install -y shellcheck`"
        );
        let mut failures = String::new();
        let programs = Snippet::ALL.into_iter().map(|s| (s, Variant::Plain)).chain([
            (Snippet::Start, Variant::Adopt),
            (Snippet::Supervise, Variant::Adopt),
            (Snippet::Supervise, Variant::Input),
        ]);
        for (snippet, variant) in programs {
            let text = snippet.assemble_for(str::to_string, variant);
            let snippet = if variant == Variant::Plain { format!("{snippet:?}") } else { format!("{snippet:?} ({variant:?})") };
            let mut child = Command::new("shellcheck")
                .args(["-s", "sh", "-f", "gcc", "-"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("shellcheck starts");
            child.stdin.take().expect("stdin is piped").write_all(text.as_bytes()).expect("shellcheck reads the script");
            let out = child.wait_with_output().expect("shellcheck finishes");
            if !out.status.success() {
                let report = String::from_utf8_lossy(&out.stdout);
                failures.push_str(&format!("{snippet}:\n"));
                for line in report.lines() {
                    // `-:LINE:COL: ...`: show the offending line of the assembled script.
                    let at = line.split(':').nth(1).and_then(|n| n.parse::<usize>().ok());
                    let source = at.and_then(|n| text.lines().nth(n - 1)).unwrap_or("");
                    failures.push_str(&format!("  {line}\n      {}\n", source.trim()));
                }
                failures.push_str(&String::from_utf8_lossy(&out.stderr));
            }
        }
        assert!(failures.is_empty(), "shellcheck findings (fix them, or disable one check with a comment saying why):\n{failures}");
    }
}
