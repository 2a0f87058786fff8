//! The `Provider` trait: the sandbox operations, implemented by `local` and `e2b` (see
//! docs/contract.md, "Providers").
//!
//! Tools and the task supervisor are written once on top of this trait. Every method takes a
//! deadline; an implementation must return (with [`ProviderError::Timeout`] or
//! [`ProviderError::Unconfirmed`]) by then, give or take the time to kill what it started.

use crate::egress::Network;
use crate::mask::Masker;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub mod e2b;
pub mod local;
pub mod process;

/// Where task directories live, relative to a sandbox's home (`task_root` in the supervisor's
/// snippets): the hand-over and the outputs run_command keeps write there too.
pub const TASKS_DIR: &str = ".sandbox-mcp/tasks";

/// What a tool asks of a sandbox's lifetime when it reaches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Touch {
    /// Ordinary tools: resume the sandbox if the provider pauses them, and renew its TTL.
    Renew,
    /// Task tools: observe only; never resume, never extend the TTL.
    Observe,
}

/// Arguments of `create`.
#[derive(Debug, Clone, Default)]
pub struct CreateRequest {
    /// Template name (`base` when not given).
    pub template: String,
    /// TTL in seconds.
    pub timeout_s: u64,
    /// Environment of every process in the sandbox.
    pub envs: BTreeMap<String, String>,
    /// Free-form labels.
    pub metadata: BTreeMap<String, String>,
    /// The network policy: `None` the provider's default (local: none; E2B: its platform's).
    pub network: Option<Network>,
    /// Resource limits asked for.
    pub limits: Limits,
}

/// Resource limits of one sandbox (`None`: not limited).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Limits {
    /// Memory in MiB (swap included where the host accounts it).
    pub memory_mb: Option<u64>,
    /// Processes and threads at once.
    pub processes: Option<u64>,
    /// The sandbox's own disk in MiB: its home and temporary space (local provider: an ext4
    /// image of this size mounted at its home).
    #[serde(default)]
    pub disk_mb: Option<u64>,
}

impl Limits {
    /// Whether a limit enforced with cgroups (`memory_mb`, `processes`) is set.
    pub fn cgroups(&self) -> bool {
        self.memory_mb.is_some() || self.processes.is_some()
    }

    /// Whether any limit is set.
    pub fn any(&self) -> bool {
        self.cgroups() || self.disk_mb.is_some()
    }
}

/// What a provider knows about one sandbox.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxInfo {
    /// The sandbox id.
    pub sandbox_id: String,
    /// Template it was created from.
    pub template: String,
    /// When the provider will end it, in Unix seconds.
    pub expires_at: i64,
    /// How it is isolated: `namespaces` or `none` (local), `e2b` (the platform's own).
    pub isolation: &'static str,
    /// The isolation layers actually enforced on its processes (none for `none`; the platform's
    /// own for E2B, which this server cannot check, are not listed).
    pub layers: Vec<&'static str>,
    /// The network policy in force.
    pub network: Network,
    /// The limits enforced on it.
    pub limits: Limits,
}

/// A sandbox as list_sandboxes shows it: what the provider knows, when it was created (Unix
/// seconds, when known) and its metadata.
pub type Listed = (SandboxInfo, Option<i64>, BTreeMap<String, String>);

/// One command execution inside a sandbox.
#[derive(Debug, Clone)]
pub struct ExecRequest {
    /// Program and arguments. Shell commands use [`Provider::shell`] to build this.
    pub argv: Vec<String>,
    /// Extra environment for this call (on top of the sandbox's).
    pub envs: BTreeMap<String, String>,
    /// Working directory; the sandbox user's home when `None`.
    pub cwd: Option<String>,
    /// Bytes kept per output stream; the rest is drained and counted as truncated.
    pub output_cap: usize,
    /// When the command is killed (its whole process group) and reported as timed out.
    pub deadline: Instant,
    /// Set by the client cancelling the request; the command is killed like on timeout.
    pub cancel: Option<Arc<AtomicBool>>,
}

/// The observed end of an execution.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExecOutput {
    /// Exit code; 128 + signal number when killed by a signal.
    pub exit_code: i32,
    /// Captured stdout (at most `output_cap` bytes).
    pub stdout: Vec<u8>,
    /// Captured stderr (at most `output_cap` bytes).
    pub stderr: Vec<u8>,
    /// Whether stdout went over the cap.
    pub stdout_truncated: bool,
    /// Whether stderr went over the cap.
    pub stderr_truncated: bool,
    /// Whether the deadline (or a cancel) killed the command.
    pub timed_out: bool,
    /// Wall time.
    pub duration: Duration,
}

/// A command that may be handed over to the task supervisor while it runs: a plain
/// `run_command` still running at `--task-after` (ARCHITECTURE.md, "Long run_command calls").
pub struct Promotion<'a> {
    /// When a command still running is handed over.
    pub at: Instant,
    /// The task it becomes.
    pub task_id: &'a str,
    /// The command line as the caller gave it (the task's `cmd`).
    pub command: &'a str,
    /// The command's whole timeout (its remaining part goes on under the supervisor).
    pub timeout: Duration,
    /// Masks the output captured before the handover (the same masker as the tool result's).
    pub masker: &'a Masker,
    /// The argv that hands the running command over to the task supervisor (its adopt mode).
    pub adopter: &'a dyn Fn(&Adoption<'_>) -> Vec<String>,
    /// How long the supervisor gives a timed-out command between TERM and KILL (the server
    /// waits that much longer to reap a command it handed over).
    pub kill_grace: Duration,
}

/// What adopting a running command asks for (the supervisor's adopt mode: `start.sh adopt`).
#[derive(Debug, Clone, Copy)]
pub struct Adoption<'a> {
    /// The new task's id.
    pub task_id: &'a str,
    /// The command's whole timeout, in seconds.
    pub timeout: i64,
    /// What is left of it, in seconds with two decimals.
    pub left: &'a str,
    /// The command's process group as the sandbox sees it.
    pub pgid: u32,
    /// Bytes of stdout and stderr already staged (captured before).
    pub pre: (usize, usize),
    /// Whether each staged part was cut at the cap.
    pub truncated: (bool, bool),
    /// When the command started, Unix seconds.
    pub started_at: i64,
    /// The command line.
    pub command: &'a str,
}

/// How an execution that may be promoted ended.
#[derive(Debug)]
pub enum ExecEnd {
    /// It ended (or was killed) while the call waited.
    Done(ExecOutput),
    /// It still runs, as the task of its [`Promotion`]; the output captured before (unmasked).
    Promoted(ExecOutput),
}

/// How a provider keeps a run_command that may outlive `--task-after` (its one capability for
/// long commands; see ARCHITECTURE.md, "Long run_command calls").
pub enum LongCommands<'a> {
    /// The command starts directly, as any other, and is handed over to the task supervisor if it
    /// still runs at the threshold (local: the server holds the command's pipes).
    Adopt(&'a dyn Adopter),
    /// The provider cannot hand a running command over (E2B: envd holds its pipes): the command
    /// starts under the task supervisor and the call waits for its end inside the sandbox
    /// (`supervisor::run`) until the threshold.
    SuperviseFromStart,
}

/// A provider that hands a running command over to the task supervisor
/// ([`LongCommands::Adopt`]).
pub trait Adopter {
    /// Runs `promotion.command` as [`Provider::exec`] runs `req` (whose `argv` is ignored: the
    /// provider wraps the command for its hand-over), except that a command still running at
    /// `promotion.at` goes on as task `promotion.task_id` ([`ExecEnd::Promoted`]). When the
    /// hand-over fails the command is waited for as if nothing had happened.
    fn exec_or_promote(
        &self,
        sandbox_id: &str,
        req: &ExecRequest,
        touch: Touch,
        promotion: &Promotion<'_>,
    ) -> Result<ExecEnd, ProviderError>;

    /// The task id of `command` (run as `req` says) into `sandbox_id`, which may become a task.
    fn task_id(&self, _sandbox_id: &str, _req: &ExecRequest, _command: &str) -> String {
        crate::ids::task_id()
    }
}

/// Type of a directory entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (not followed).
    Symlink,
    /// Anything else (FIFO, socket, device).
    Other,
}

impl EntryKind {
    /// The name used in tool results.
    pub fn name(self) -> &'static str {
        match self {
            EntryKind::File => "file",
            EntryKind::Dir => "dir",
            EntryKind::Symlink => "symlink",
            EntryKind::Other => "other",
        }
    }
}

/// One entry of `list_dir`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// File name (not the full path).
    pub name: String,
    /// Its type.
    pub kind: EntryKind,
    /// Size in bytes (0 for directories).
    pub size: u64,
}

/// Why a provider call failed. Messages say what failed and what to do next.
#[derive(Debug, Clone, PartialEq)]
pub enum ProviderError {
    /// The sandbox id is malformed or of another provider's form; nothing was contacted.
    InvalidId {
        /// The id as given.
        id: String,
        /// Why it was refused.
        reason: String,
    },
    /// The sandbox does not exist (never did, was killed, or expired).
    NotFound {
        /// The id.
        id: String,
    },
    /// The sandbox exists but is paused and the call may not resume it.
    Paused {
        /// The id.
        id: String,
    },
    /// The request was refused before anything ran (bad path, unknown template, quota, ...).
    Rejected(String),
    /// The call did not finish before its deadline; the request was not confirmed.
    Timeout {
        /// What was being done.
        what: String,
        /// The deadline that passed.
        after: Duration,
    },
    /// The request may have been applied but its answer was lost (connection dropped after
    /// sending). Callers must not resubmit anything that is not idempotent.
    Unconfirmed {
        /// What was being done.
        what: String,
        /// What went wrong.
        detail: String,
    },
    /// The provider could not be reached, or failed before the request was applied.
    Unavailable(String),
}

impl ProviderError {
    /// Whether the request may have taken effect although no answer came back.
    pub fn maybe_applied(&self) -> bool {
        matches!(self, ProviderError::Timeout { .. } | ProviderError::Unconfirmed { .. })
    }
}

impl fmt::Display for ProviderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProviderError::InvalidId { id, reason } => write!(f, "invalid sandbox_id {id:?}: {reason}"),
            ProviderError::NotFound { id } => write!(
                f,
                "sandbox {id} does not exist (it was killed or its timeout expired); create a new one with create_sandbox"
            ),
            ProviderError::Paused { id } => write!(
                f,
                "sandbox {id} is paused; task tools never resume a sandbox, so call an ordinary tool (run_command, read_file, ...) on it first to resume it"
            ),
            ProviderError::Rejected(msg) => f.write_str(msg),
            ProviderError::Timeout { what, after } => {
                write!(f, "{what} did not finish within {:.1}s; the sandbox may be overloaded, retry later", after.as_secs_f64())
            }
            ProviderError::Unconfirmed { what, detail } => write!(f, "{what} was sent but its answer was lost ({detail})"),
            ProviderError::Unavailable(msg) => f.write_str(msg),
        }
    }
}

impl std::error::Error for ProviderError {}

/// The files of a task's input channel in its directory (the `supervisor` module doc, "Input",
/// says who makes them): the provider writes the first two from outside, never blocking.
pub mod input_channel {
    /// The FIFO the task (or its terminal) reads.
    pub const FIFO: &str = "stdin";
    /// The FIFO whose writer's close ends the input.
    pub const EOF: &str = "stdin.eof";
    /// The marker of an input that has ended.
    pub const CLOSED: &str = "stdin.closed";
}

/// What `send_input` asks of a provider.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    /// The task's directory, relative to the sandbox user's home.
    pub task_dir: &'a str,
    /// The bytes to write.
    pub data: &'a [u8],
    /// Close the input after them.
    pub eof: bool,
}

/// Why input could not be written.
#[derive(Debug, Clone, PartialEq)]
pub enum InputError {
    /// The channel does not exist: no such task, or one started without input.
    Missing,
    /// The input has ended (`eof`, or the task's end).
    Closed,
    /// Nobody reads the channel any more.
    NoReader,
    /// The task left its input full until the deadline; `written` bytes went in first (when
    /// known).
    Full {
        /// Bytes written before the buffer stayed full.
        written: Option<usize>,
    },
    /// Something in the sandbox replaced a file of the channel: what it found there. Nothing was
    /// written.
    Tampered(String),
    /// The data went in whole, but the end of input asked for with it could not be sent: why.
    EndNotSent(String),
    /// The call cannot be done as asked (why, and what to do instead).
    Refused(String),
    /// The sandbox could not be reached.
    Provider(ProviderError),
}

impl From<ProviderError> for InputError {
    fn from(e: ProviderError) -> InputError {
        InputError::Provider(e)
    }
}

/// A sandbox platform. Implementations map their failures to [`ProviderError`]: a malformed id is
/// `InvalidId` (checked before any I/O), a missing sandbox `NotFound`, a refusal `Rejected`, a
/// failure before the request could take effect `Unavailable`, and anything after which the
/// request may have taken effect `Unconfirmed` or `Timeout`.
pub trait Provider: Send + Sync {
    /// `local` or `e2b`.
    fn name(&self) -> &'static str;

    /// Checks the form of a sandbox id without contacting anything.
    fn check_id(&self, sandbox_id: &str) -> Result<(), ProviderError>;

    /// Creates a sandbox.
    fn create(&self, req: &CreateRequest, deadline: Instant) -> Result<SandboxInfo, ProviderError>;

    /// Kills a sandbox and everything in it. `Ok(false)` when it was already gone.
    fn kill(&self, sandbox_id: &str, deadline: Instant) -> Result<bool, ProviderError>;

    /// Reaches a sandbox as `touch` says and returns what is known about it.
    fn info(&self, sandbox_id: &str, touch: Touch, deadline: Instant) -> Result<SandboxInfo, ProviderError>;

    /// Sets the TTL to `timeout_s` from now.
    fn set_timeout(&self, sandbox_id: &str, timeout_s: u64, deadline: Instant) -> Result<SandboxInfo, ProviderError>;

    /// The argv that runs `script` with the sandbox's shell (`/bin/sh -c`, `/bin/bash -l -c`).
    fn shell(&self, script: &str) -> Vec<String>;

    /// The shell, with its flags before `-c`, that runs task commands (`/bin/sh`, `/bin/bash -l`).
    fn task_shell(&self) -> String;

    /// The argv that runs a POSIX `sh` snippet with positional arguments (supervisor snippets).
    fn posix_sh(&self, script: &str, args: &[&str]) -> Vec<String>;

    /// Runs one command to completion (or its deadline) and returns its capped output.
    fn exec(&self, sandbox_id: &str, req: &ExecRequest, touch: Touch) -> Result<ExecOutput, ProviderError>;

    /// How this provider keeps a run_command that may outlive `--task-after` (asked by the tools
    /// layer only; ARCHITECTURE.md, "Long run_command calls").
    fn long_commands(&self) -> LongCommands<'_>;

    /// Reads a whole file of at most `max_bytes`.
    fn read_file(&self, sandbox_id: &str, path: &str, max_bytes: usize, deadline: Instant) -> Result<Vec<u8>, ProviderError>;

    /// Writes (creates or replaces) a file, creating missing parent directories.
    fn write_file(&self, sandbox_id: &str, path: &str, data: &[u8], deadline: Instant) -> Result<u64, ProviderError>;

    /// Lists a directory (not recursive), at most `max_entries` entries sorted by name.
    fn list_dir(&self, sandbox_id: &str, path: &str, max_entries: usize, deadline: Instant)
        -> Result<(Vec<DirEntry>, bool), ProviderError>;

    /// The masker for output of a command run with the sandbox's environment plus `extra`, when
    /// this provider knows that environment on the host. An empty masker means "nothing to mask
    /// here": providers that cannot see the environment mask inside the sandbox instead.
    fn env_masker(&self, _sandbox_id: &str, _extra: &BTreeMap<String, String>) -> Result<Masker, ProviderError> {
        Ok(Masker::default())
    }

    /// Every sandbox of this server's state root, with when it was created and its metadata;
    /// `None` when the provider cannot list them (list_sandboxes then shows the ones it is told).
    fn list_sandboxes(&self) -> Option<Vec<Listed>> {
        None
    }

    /// What the model should know about a sandbox like `info` (writable places, the system,
    /// the network, how to install packages), one paragraph.
    fn describe(&self, _info: &SandboxInfo) -> String {
        String::new()
    }

    /// What every new sandbox of this provider has, for the server's `instructions`: the shell,
    /// writable places, the network by default, how to install packages (one paragraph; the
    /// interpreters found, with versions, are in each create_sandbox result).
    fn overview(&self) -> String {
        String::new()
    }

    /// The shell `run_command` and `start_task` run a command with.
    fn command_shell(&self) -> String {
        self.shell("")[0].clone()
    }

    /// When the sandbox expires (Unix seconds), as this process knows it without a request to the
    /// sandbox or its platform; `None` when it does not know.
    fn expires_at(&self, _sandbox_id: &str) -> Option<i64> {
        None
    }

    /// Secrets this provider holds now (for example per-sandbox access tokens), masked like the
    /// server's own configuration values in everything returned.
    fn secret_values(&self) -> Vec<String> {
        Vec::new()
    }

    /// Called once at server shutdown: stop commands this process started and still waits for.
    fn shutdown(&self) {}

    /// Replaces the network policy of a running sandbox (new connections follow it at once).
    fn set_network(&self, _sandbox_id: &str, _network: &Network, _deadline: Instant) -> Result<SandboxInfo, ProviderError> {
        Err(ProviderError::Rejected(format!("the {} provider cannot change a running sandbox's network", self.name())))
    }

    /// Why sandbox `sandbox_id` cannot give a task a terminal of its own (`pty`), if it cannot.
    fn terminal_refusal(&self, _sandbox_id: &str) -> Option<String> {
        None
    }

    /// Whether this provider writes a task's input itself, from the server
    /// ([`Provider::send_input`]); otherwise the supervisor's `input.sh` writes it inside the
    /// sandbox, through `exec`.
    fn task_input(&self) -> bool {
        false
    }

    /// Writes `input.data` to a task's input channel (`input_channel`) without blocking past
    /// `deadline`, then closes the input when `input.eof` (only where [`Provider::task_input`]).
    fn send_input(&self, _sandbox_id: &str, _input: &Input<'_>, _deadline: Instant) -> Result<(), InputError> {
        Err(InputError::Refused(format!("the {} provider does not write a task's input from the server", self.name())))
    }

    /// Makes TCP `port` of the sandbox reachable from the host; its URL, and what to know about it.
    fn expose_port(&self, _sandbox_id: &str, _port: u16, _deadline: Instant) -> Result<Exposed, ProviderError> {
        Err(ProviderError::Rejected(format!("the {} provider cannot expose ports", self.name())))
    }

    /// Stops [`Provider::expose_port`]'s relay of `port`: whether it closed, and what to know.
    fn unexpose_port(&self, _sandbox_id: &str, _port: u16, _deadline: Instant) -> Result<Exposed, ProviderError> {
        Err(ProviderError::Rejected(format!("the {} provider cannot expose ports", self.name())))
    }

    /// The connections the sandbox's egress proxy refused since `since_ms` (Unix milliseconds),
    /// distinct and bounded; empty where the provider has no such record.
    fn network_blocked(&self, _sandbox_id: &str, _since_ms: u64) -> Vec<crate::egress::blocks::Block> {
        Vec::new()
    }
}

/// What [`Provider::expose_port`] and [`Provider::unexpose_port`] answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exposed {
    /// The port's URL.
    pub url: String,
    /// Whether the URL now reaches the port (expose) or no longer does (unexpose).
    pub done: bool,
    /// What the caller should know (how the URL is reached, what unexposing does here).
    pub note: Option<String>,
}

/// The current time in Unix seconds.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

/// How often a waiting call reads its sandbox again: a local read is a shell on the host, a
/// remote one a request (about one per second).
pub fn poll_interval(provider: &dyn Provider) -> Duration {
    if provider.name() == "local" {
        crate::limits::WAIT_POLL_LOCAL
    } else {
        crate::limits::WAIT_POLL_REMOTE
    }
}
