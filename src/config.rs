//! Configuration: command-line flags and environment variables turned into one validated `Config`.
//!
//! [`OPTIONS`] declares every option once: its flag, environment variable, default and help text.
//! The flag parser ([`Args`]), [`Config::load`] and `--help` read that table, and
//! `tests/it/tidy.rs` checks that the README's configuration table matches it row for row.
//! Limits that are not configurable live in `limits.rs`.

use crate::provider::e2b::sandbox_url::SandboxUrl;
use anyhow::{anyhow, bail, Context, Result};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use DefaultValue::{Derived, Text, Unset};

/// Which sandbox provider serves the tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderKind {
    /// Sandboxes are directories and process trees on this host.
    Local,
    /// E2B or an E2B-compatible platform.
    E2b,
}

impl ProviderKind {
    /// The name used on the command line and in tool results.
    pub fn name(self) -> &'static str {
        match self {
            ProviderKind::Local => "local",
            ProviderKind::E2b => "e2b",
        }
    }
}

/// The `--isolation` setting of the local provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IsolationMode {
    /// Namespaces when this host allows them, else Landlock, else sandboxes are refused (never
    /// none silently).
    Auto,
    /// Namespaces, or refuse to start.
    Namespaces,
    /// Landlock (each command under a ruleset), or refuse to start.
    Landlock,
    /// No isolation: commands run as the server's user on the host.
    None,
}

impl IsolationMode {
    /// Every mode, in the order `--help` lists them.
    pub const ALL: [IsolationMode; 4] = [IsolationMode::Auto, IsolationMode::Namespaces, IsolationMode::Landlock, IsolationMode::None];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            IsolationMode::Auto => "auto",
            IsolationMode::Namespaces => "namespaces",
            IsolationMode::Landlock => "landlock",
            IsolationMode::None => "none",
        }
    }
}

/// Settings of the E2B provider.
#[derive(Debug, Clone, PartialEq)]
pub struct E2bConfig {
    /// `E2B_API_KEY`; required for the e2b provider.
    pub api_key: Option<String>,
    /// `E2B_DOMAIN`: the region's domain.
    pub domain: String,
    /// `E2B_API_URL`: control-plane base URL override.
    pub api_url: Option<String>,
    /// `E2B_SANDBOX_URL`: how sandbox URLs are built (E2B's own form when unset).
    pub sandbox_url: SandboxUrl,
    /// Connect timeout of every HTTP request.
    pub connect_timeout: Duration,
    /// Overall timeout of a control-plane request.
    pub request_timeout: Duration,
}

/// The validated configuration of one server process.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The sandbox provider.
    pub provider: ProviderKind,
    /// Worker threads that run tool calls.
    pub workers: usize,
    /// Capacity of the bounded work queue.
    pub queue_capacity: usize,
    /// HTTP listen address.
    pub listen: SocketAddr,
    /// Bearer token required on HTTP requests, when set.
    pub http_token: Option<String>,
    /// HTTP sessions idle for longer than this end as if deleted.
    pub session_idle: Duration,
    /// After this long a run_command of a 2026-07-28 client with the tasks extension is answered
    /// with a task; zero: never.
    pub task_after: Duration,
    /// Bytes of HTTP request bodies held in memory at once.
    pub body_budget: usize,
    /// How long an HTTP connection may make no progress (`--http-stall`).
    pub http_stall: Duration,
    /// State root of the local provider.
    pub home: PathBuf,
    /// The POSIX shell the local provider runs snippets and commands with.
    pub local_shell: PathBuf,
    /// How local sandboxes are isolated (resolved against the host when the provider starts).
    pub isolation: IsolationMode,
    /// The most live local sandboxes the state root may hold.
    pub max_sandboxes: usize,
    /// Limits of a local sandbox whose request sets none, where the host can enforce them.
    pub default_limits: DefaultLimits,
    /// The host uids (first, last) of isolated local sandboxes when the server runs as root.
    pub uid_range: (u32, u32),
    /// Whether an unprivileged server gives each isolated sandbox one of its user's subordinate
    /// ids where it can (`--subordinate-ids auto`).
    pub subordinate_ids: bool,
    /// What every sandbox's egress proxy does beyond its policy.
    pub egress: crate::egress::Settings,
    /// The host address exposed ports of local sandboxes listen on.
    pub expose_address: std::net::IpAddr,
    /// E2B settings.
    pub e2b: E2bConfig,
}

/// Limits given to a local sandbox whose request sets none (`None`: that resource unlimited).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DefaultLimits {
    /// Memory in MiB.
    pub memory_mb: Option<u64>,
    /// Processes and threads at once.
    pub processes: Option<u64>,
    /// The sandbox's own disk in MiB (never in the default value: it costs about 20 ms per
    /// create).
    pub disk_mb: Option<u64>,
}

/// One configuration option: a row of [`OPTIONS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionSpec {
    /// Command-line flag, if any (`--workers`).
    pub flag: Option<&'static str>,
    /// Whether the flag is followed by a value (`--workers 3`, `--workers=3`). A flag without
    /// one is a switch: giving it reads as the text `true`.
    pub takes_value: bool,
    /// Environment variable, if any.
    pub env: Option<&'static str>,
    /// What applies when neither the flag nor the environment variable is given.
    pub default: DefaultValue,
    /// What it does, for `--help` and the README.
    pub help: &'static str,
}

/// The default of an option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DefaultValue {
    /// A value written as a user would write it; `Config::load` parses it with the same parser
    /// as the flag's or the environment variable's text.
    Text(&'static str),
    /// Worked out from other settings when the option is not given; the text says how.
    Derived(&'static str),
    /// Not set unless given (shown as `none`).
    Unset,
}

impl DefaultValue {
    /// The default as text to parse, for `Text` defaults only.
    pub fn text(self) -> Option<&'static str> {
        match self {
            DefaultValue::Text(text) => Some(text),
            DefaultValue::Derived(_) | DefaultValue::Unset => None,
        }
    }
}

impl std::fmt::Display for DefaultValue {
    /// The default as shown in `--help` and in the README table.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DefaultValue::Text(text) | DefaultValue::Derived(text) => f.write_str(text),
            DefaultValue::Unset => f.write_str("none"),
        }
    }
}

impl OptionSpec {
    /// How messages name this option: its flag, else its environment variable.
    pub fn name(&self) -> &'static str {
        self.flag.or(self.env).unwrap_or("an option")
    }
}

/// Declares each option as a `pub const` of its own (what `Config::load` reads) and lists them
/// all, in the order written, as [`OPTIONS`].
macro_rules! options {
    ($($(#[$doc:meta])* $name:ident = $spec:expr;)*) => {
        $($(#[$doc])* pub const $name: OptionSpec = $spec;)*

        /// Every option, in README order: the one place options are declared.
        ///
        /// Adding an option is exactly one row below, one `Config` field, and the line in
        /// [`Config::load`] that reads the row into that field with one of the readers of
        /// `Source` (`given`, `text`, `number`, `seconds`, `address`, `choice`). The flag
        /// parser and `--help` follow from the row; `tests/it/tidy.rs` then asks for the same
        /// row in the README's configuration table.
        pub const OPTIONS: &[OptionSpec] = &[$($name),*];
    };
}

options! {
    /// Which provider serves the tools.
    PROVIDER = OptionSpec {
        flag: Some("--provider"),
        takes_value: true,
        env: Some("SANDBOX_MCP_PROVIDER"),
        default: Derived("e2b if E2B_API_KEY is set, else local"),
        help: "sandbox provider: local or e2b",
    };
    /// HTTP listen address.
    LISTEN = OptionSpec {
        flag: Some("--listen"),
        takes_value: true,
        env: Some("SANDBOX_MCP_LISTEN"),
        default: Text("127.0.0.1:8765"),
        help: "HTTP listen address (http mode)",
    };
    /// Worker threads.
    WORKERS = OptionSpec {
        flag: Some("--workers"),
        takes_value: true,
        env: Some("SANDBOX_MCP_WORKERS"),
        default: Text("8"),
        help: "worker threads running tool calls",
    };
    /// Work-queue capacity.
    QUEUE = OptionSpec {
        flag: Some("--queue"),
        takes_value: true,
        env: Some("SANDBOX_MCP_QUEUE"),
        default: Text("64"),
        help: "capacity of the work queue; HTTP answers 503 when it is full",
    };
    /// When a run_command still running becomes a task, in seconds.
    TASK_AFTER = OptionSpec {
        flag: Some("--task-after"),
        takes_value: true,
        env: Some("SANDBOX_MCP_TASK_AFTER"),
        default: Text("25"),
        help: "seconds after which a run_command still running is answered as a task: a protocol task with the tasks extension, else state running with a task_id (0 = never)",
    };
    /// Idle time after which an HTTP session ends, in seconds.
    SESSION_IDLE = OptionSpec {
        flag: Some("--session-idle"),
        takes_value: true,
        env: Some("SANDBOX_MCP_SESSION_IDLE"),
        default: Text("3600"),
        help: "seconds after which an idle HTTP session ends (its sandboxes are killed)",
    };
    /// Memory for HTTP request bodies held at once, in MiB.
    BODY_BUDGET = OptionSpec {
        flag: Some("--body-budget"),
        takes_value: true,
        env: Some("SANDBOX_MCP_BODY_BUDGET"),
        default: Text("64"),
        help: "MiB of HTTP request bodies held in memory at once; beyond it 503 with Retry-After",
    };
    /// How long an HTTP connection may make no progress, in seconds.
    HTTP_STALL = OptionSpec {
        flag: Some("--http-stall"),
        takes_value: true,
        env: Some("SANDBOX_MCP_HTTP_STALL"),
        default: Text("30"),
        help: "seconds an HTTP connection may make no progress (idle, a body that stops arriving, an answer the client does not read) before it is closed; also the most a request head may take after the last answer, and the grace before a body or answer must average 64 KiB/s",
    };
    /// HTTP bearer token; never a flag, so it stays out of process listings.
    HTTP_TOKEN = OptionSpec {
        flag: None,
        takes_value: true,
        env: Some("SANDBOX_MCP_HTTP_TOKEN"),
        default: Unset,
        help: "bearer token required on every HTTP request (environment only, never a flag)",
    };
    /// State root of the local provider.
    STATE_ROOT = OptionSpec {
        flag: Some("--home"),
        takes_value: true,
        env: Some("SANDBOX_MCP_HOME"),
        default: Derived("$XDG_STATE_HOME/sandbox-mcp or ~/.local/state/sandbox-mcp"),
        help: "state root of the local provider",
    };
    /// The local provider's POSIX shell.
    LOCAL_SHELL = OptionSpec {
        flag: Some("--local-shell"),
        takes_value: true,
        env: Some("SANDBOX_MCP_LOCAL_SH"),
        default: Text("/bin/sh"),
        help: "POSIX shell of the local provider's supervisor snippets, and of commands where the host has no bash",
    };
    /// Namespace isolation of local sandboxes.
    ISOLATION = OptionSpec {
        flag: Some("--isolation"),
        takes_value: true,
        env: Some("SANDBOX_MCP_ISOLATION"),
        default: Text("auto"),
        help: "isolation of local sandboxes: auto (namespaces, else landlock, else create_sandbox is refused), namespaces, landlock, or none",
    };
    /// Cap on live local sandboxes.
    MAX_SANDBOXES = OptionSpec {
        flag: Some("--max-sandboxes"),
        takes_value: true,
        env: Some("SANDBOX_MCP_MAX_SANDBOXES"),
        default: Text("64"),
        help: "most live local sandboxes in the state root; create_sandbox beyond it is refused",
    };
    /// Default limits of local sandboxes.
    DEFAULT_LIMITS = OptionSpec {
        flag: Some("--default-limits"),
        takes_value: true,
        env: Some("SANDBOX_MCP_DEFAULT_LIMITS"),
        default: Text("memory_mb=2048,processes=1024"),
        help: "limits of a local sandbox whose request sets none, where the host can enforce them (none: no limits; disk_mb=N may be added)",
    };
    /// Host uids of isolated sandboxes of a root server.
    UID_RANGE = OptionSpec {
        flag: Some("--uid-range"),
        takes_value: true,
        env: Some("SANDBOX_MCP_UID_RANGE"),
        default: Text("2000000000-2000065535"),
        help: "host uids of isolated local sandboxes when the server runs as root, one per sandbox (FIRST-LAST; outside /etc/subuid, /etc/subgid and the user database)",
    };
    /// Whether an unprivileged server uses its user's subordinate ids.
    SUBORDINATE_IDS = OptionSpec {
        flag: Some("--subordinate-ids"),
        takes_value: true,
        env: Some("SANDBOX_MCP_SUBORDINATE_IDS"),
        default: Text("auto"),
        help: "auto: an unprivileged server whose user has /etc/subuid and /etc/subgid ranges and newuidmap gives each isolated sandbox one of those ids; off: it makes no namespace for them (it still joins the one its state root's sandboxes live in)",
    };
    /// The parent HTTP proxy of every sandbox's egress proxy.
    EGRESS_PROXY = OptionSpec {
        flag: Some("--egress-proxy"),
        takes_value: true,
        env: Some("SANDBOX_MCP_EGRESS_PROXY"),
        default: Unset,
        help: "parent HTTP proxy (http://[user:password@]host:port) that sandboxes' allowed traffic goes through, names unresolved",
    };
    /// Whether sandboxes may reach the host's own and private addresses.
    EGRESS_ALLOW_HOST_SERVICES = OptionSpec {
        flag: Some("--egress-allow-host-services"),
        takes_value: false,
        env: Some("SANDBOX_MCP_EGRESS_ALLOW_HOST_SERVICES"),
        default: Text("false"),
        help: "let sandboxes with network reach loopback, private, link-local and the host's own addresses (off: never)",
    };
    /// The host address exposed ports listen on.
    EXPOSE_ADDRESS = OptionSpec {
        flag: Some("--expose-address"),
        takes_value: true,
        env: Some("SANDBOX_MCP_EXPOSE_ADDRESS"),
        default: Text("127.0.0.1"),
        help: "host address that expose_port's URLs listen on (0.0.0.0: every interface)",
    };
    /// E2B API key.
    E2B_API_KEY = OptionSpec {
        flag: None,
        takes_value: true,
        env: Some("E2B_API_KEY"),
        default: Unset,
        help: "E2B API key; selects the e2b provider by default",
    };
    /// E2B region domain.
    E2B_DOMAIN = OptionSpec {
        flag: None,
        takes_value: true,
        env: Some("E2B_DOMAIN"),
        default: Text("e2b.app"),
        help: "E2B region domain",
    };
    /// E2B control-plane URL override.
    E2B_API_URL = OptionSpec {
        flag: None,
        takes_value: true,
        env: Some("E2B_API_URL"),
        default: Derived("https://api.$E2B_DOMAIN"),
        help: "control-plane URL override (self-hosting, tests)",
    };
    /// E2B envd URL override.
    E2B_SANDBOX_URL = OptionSpec {
        flag: None,
        takes_value: true,
        env: Some("E2B_SANDBOX_URL"),
        default: Derived("https://{port}-{sandbox_id}.$E2B_DOMAIN"),
        help: "sandbox URL: fixed (envd only), or a template with {sandbox_id}, {port}, optional {domain}: http://10.0.0.5:3000/proxy/{sandbox_id}/{port}",
    };
    /// Time allowed for one E2B control-plane request, in seconds.
    E2B_TIMEOUT = OptionSpec {
        flag: None,
        takes_value: true,
        env: Some("SANDBOX_MCP_E2B_TIMEOUT"),
        default: Text("30"),
        help: "seconds allowed for one E2B control-plane request",
    };
    /// The log filter; read by the binary's logger setup, not by `Config::load`.
    RUST_LOG = OptionSpec {
        flag: None,
        takes_value: true,
        env: Some("RUST_LOG"),
        default: Text("info"),
        help: "log filter; logs go to stderr only",
    };
}

/// The command line split into a subcommand's positional words and flag values.
#[derive(Debug, Default)]
pub struct Args {
    /// Positional words (`http`, `call`, the tool name, its JSON...).
    pub positional: Vec<String>,
    flags: Vec<(String, String)>,
}

impl Args {
    /// Splits `args` (without the program name) into flags and positional words; the flags are
    /// those of [`OPTIONS`].
    pub fn parse(args: &[String]) -> Result<Args> {
        Args::parse_with(args, OPTIONS)
    }

    /// [`Args::parse`] against the flags of `options`.
    fn parse_with(args: &[String], options: &[OptionSpec]) -> Result<Args> {
        let mut out = Args::default();
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            if arg == "--" {
                out.positional.extend(it.by_ref().cloned());
                break;
            }
            if arg == "-h" || arg == "--help" {
                // After `call TOOL`: that tool's help; anywhere else: the global help.
                if out.positional.first().is_some_and(|w| w == "call") && out.positional.len() >= 2 {
                    out.positional.push("--help".into());
                } else {
                    out.positional.insert(0, "--help".into());
                }
                continue;
            }
            if !arg.starts_with("--") {
                out.positional.push(arg.clone());
                continue;
            }
            let (name, value) = match arg.split_once('=') {
                Some((n, v)) => (n.to_string(), Some(v.to_string())),
                None => (arg.clone(), None),
            };
            if name == "--version" {
                out.positional.insert(0, name);
                continue;
            }
            let Some(spec) = options.iter().find(|o| o.flag == Some(name.as_str())) else {
                bail!("unknown flag {name}; run `sandbox-mcp --help` for the list");
            };
            let value = match (spec.takes_value, value) {
                (true, Some(v)) => v,
                (true, None) => it.next().cloned().with_context(|| format!("flag {name} needs a value"))?,
                (false, Some(_)) => bail!("flag {name} takes no value; write it alone"),
                (false, None) => "true".to_string(),
            };
            out.flags.push((name, value));
        }
        Ok(out)
    }

    fn flag(&self, name: &str) -> Option<&str> {
        self.flags.iter().rev().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// Where `Config::load` reads options from: a flag wins over its environment variable, which
/// wins over the default; an empty environment variable counts as not set.
struct Source<'a> {
    args: &'a Args,
    env: &'a dyn Fn(&str) -> Option<String>,
}

impl Source<'_> {
    /// The text given for `spec` by flag or environment, if any.
    fn given(&self, spec: &OptionSpec) -> Option<String> {
        let flag = spec.flag.and_then(|f| self.args.flag(f)).map(str::to_string);
        flag.or_else(|| spec.env.and_then(|var| (self.env)(var)).filter(|v| !v.is_empty()))
    }

    /// The text given for `spec`, else its written default.
    fn text(&self, spec: &OptionSpec) -> Result<String> {
        match self.given(spec).or_else(|| spec.default.text().map(str::to_string)) {
            Some(text) => Ok(text),
            None => bail!("{} is not set and has no default; set it", spec.name()),
        }
    }

    /// A whole number from `min` to `max`.
    fn number(&self, spec: &OptionSpec, min: usize, max: usize) -> Result<usize> {
        let text = self.text(spec)?;
        let what = spec.name();
        let n: usize = text.trim().parse().with_context(|| format!("{what} {text:?} is not a whole number"))?;
        if n < min || n > max {
            bail!("{what} {n} is out of range; use {min} to {max}");
        }
        Ok(n)
    }

    /// A switch: `true` or `1` on, `false` or `0` off.
    fn switch(&self, spec: &OptionSpec) -> Result<bool> {
        match self.text(spec)?.trim() {
            "true" | "1" => Ok(true),
            "false" | "0" => Ok(false),
            other => bail!("{} {other:?} must be true or false", spec.name()),
        }
    }

    /// A number of seconds from `min` to `max`.
    fn seconds(&self, spec: &OptionSpec, min: usize, max: usize) -> Result<Duration> {
        Ok(Duration::from_secs(self.number(spec, min, max)? as u64))
    }

    /// Limits written `memory_mb=N,processes=N,disk_mb=N` (any may be left out), or `none`.
    fn limits(&self, spec: &OptionSpec) -> Result<DefaultLimits> {
        use crate::limits::{
            SANDBOX_DISK_MB_MAX, SANDBOX_DISK_MB_MIN, SANDBOX_MEMORY_MB_MAX, SANDBOX_MEMORY_MB_MIN, SANDBOX_PROCESSES_MAX,
            SANDBOX_PROCESSES_MIN,
        };
        let text = self.text(spec)?;
        let what = spec.name();
        let mut out = DefaultLimits::default();
        if text.trim() == "none" {
            return Ok(out);
        }
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = part.split_once('=').with_context(|| format!("{what}: {part:?} is not name=value"))?;
            let (slot, min, max) = match key.trim() {
                "memory_mb" => (&mut out.memory_mb, SANDBOX_MEMORY_MB_MIN, SANDBOX_MEMORY_MB_MAX),
                "processes" => (&mut out.processes, SANDBOX_PROCESSES_MIN, SANDBOX_PROCESSES_MAX),
                "disk_mb" => (&mut out.disk_mb, SANDBOX_DISK_MB_MIN, SANDBOX_DISK_MB_MAX),
                other => bail!("{what}: unknown limit {other:?}; use memory_mb, processes and disk_mb, or none"),
            };
            let n: i64 = value.trim().parse().with_context(|| format!("{what}: {key}={value:?} is not a whole number"))?;
            if n < min || n > max {
                bail!("{what}: {key}={n} is out of range; use {min} to {max}");
            }
            *slot = Some(n as u64);
        }
        Ok(out)
    }

    /// A uid range `FIRST-LAST` (1 ≤ FIRST ≤ LAST < 2^31: some tools read a uid as signed).
    fn uid_range(&self, spec: &OptionSpec) -> Result<(u32, u32)> {
        let text = self.text(spec)?;
        let bad = || anyhow::anyhow!("{} {text:?} is not a range like 2000000000-2000065535 (FIRST-LAST, 1 to 2147483647)", spec.name());
        let (a, b) = text.trim().split_once('-').ok_or_else(bad)?;
        let (first, last): (u32, u32) = (a.trim().parse().map_err(|_| bad())?, b.trim().parse().map_err(|_| bad())?);
        if first == 0 || first > last || last > i32::MAX as u32 {
            return Err(bad());
        }
        Ok((first, last))
    }

    /// A socket address such as the default of [`LISTEN`].
    fn address(&self, spec: &OptionSpec) -> Result<SocketAddr> {
        let text = self.text(spec)?;
        let example = LISTEN.default;
        text.parse().with_context(|| format!("{} {text:?} is not an address like {example}", spec.name()))
    }

    /// One of the named `choices`; `what` names the kind of value in the error message.
    fn choice<T: Copy>(&self, spec: &OptionSpec, what: &str, choices: &[(&str, T)]) -> Result<T> {
        let text = self.text(spec)?;
        if let Some((_, value)) = choices.iter().find(|(name, _)| *name == text) {
            return Ok(*value);
        }
        let names: Vec<&str> = choices.iter().map(|(name, _)| *name).collect();
        let list = match names.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
            _ => names.join(""),
        };
        bail!("unknown {what} {text:?}; use {list}")
    }
}

impl Config {
    /// Builds the configuration from parsed flags and an environment lookup, one line per
    /// option of [`OPTIONS`] (`RUST_LOG` excepted: the binary's logger reads it).
    pub fn load(args: &Args, env: &dyn Fn(&str) -> Option<String>) -> Result<Config> {
        let src = Source { args, env };
        let api_key = src.given(&E2B_API_KEY);
        let providers = [ProviderKind::Local, ProviderKind::E2b].map(|kind| (kind.name(), kind));
        let provider = match src.given(&PROVIDER) {
            Some(_) => src.choice(&PROVIDER, "provider", &providers)?,
            None if api_key.is_some() => ProviderKind::E2b,
            None => ProviderKind::Local,
        };
        if provider == ProviderKind::E2b && api_key.is_none() {
            let (key, flag) = (E2B_API_KEY.name(), PROVIDER.name());
            bail!("the e2b provider needs {key}; set it, or use {flag} local");
        }
        Ok(Config {
            provider,
            workers: src.number(&WORKERS, 1, 1024)?,
            queue_capacity: src.number(&QUEUE, 1, 65_536)?,
            session_idle: src.seconds(&SESSION_IDLE, 1, 30 * 86_400)?,
            task_after: src.seconds(&TASK_AFTER, 0, 3600)?,
            // At least one body of the largest size must fit.
            body_budget: src.number(&BODY_BUDGET, crate::limits::MAX_BODY_BYTES >> 20, 1 << 20)? << 20,
            http_stall: src.seconds(&HTTP_STALL, 1, 3600)?,
            listen: src.address(&LISTEN)?,
            http_token: src.given(&HTTP_TOKEN),
            home: match src.given(&STATE_ROOT) {
                Some(dir) => PathBuf::from(dir),
                None => default_home(env)?,
            },
            local_shell: PathBuf::from(src.text(&LOCAL_SHELL)?),
            isolation: src.choice(&ISOLATION, "isolation", &IsolationMode::ALL.map(|m| (m.name(), m)))?,
            max_sandboxes: src.number(&MAX_SANDBOXES, 1, 100_000)?,
            default_limits: src.limits(&DEFAULT_LIMITS)?,
            uid_range: src.uid_range(&UID_RANGE)?,
            subordinate_ids: src.choice(&SUBORDINATE_IDS, "subordinate-ids setting", &[("auto", true), ("off", false)])?,
            egress: crate::egress::Settings {
                upstream: match src.given(&EGRESS_PROXY) {
                    Some(url) => Some(crate::egress::Upstream::parse(&url).map_err(anyhow::Error::msg).context(EGRESS_PROXY.name())?),
                    None => None,
                },
                host_services: src.switch(&EGRESS_ALLOW_HOST_SERVICES)?,
            },
            expose_address: {
                let text = src.text(&EXPOSE_ADDRESS)?;
                text.trim().parse().map_err(|_| {
                    anyhow!("{} {text:?} is not an IP address; use one such as 127.0.0.1, 0.0.0.0 or ::1", EXPOSE_ADDRESS.name())
                })?
            },
            e2b: E2bConfig {
                api_key,
                domain: src.text(&E2B_DOMAIN)?,
                api_url: src.given(&E2B_API_URL),
                sandbox_url: match src.given(&E2B_SANDBOX_URL) {
                    None => SandboxUrl::Platform,
                    Some(text) => SandboxUrl::parse(&text).map_err(|e| anyhow!("{} {text:?} is not valid: {e}", E2B_SANDBOX_URL.name()))?,
                },
                connect_timeout: Duration::from_secs(10),
                request_timeout: src.seconds(&E2B_TIMEOUT, 1, 3600)?,
            },
        })
    }

    /// Values of this configuration that must never appear in output or logs.
    pub fn secrets(&self) -> Vec<String> {
        let mut out = Vec::new();
        out.extend(self.http_token.clone());
        out.extend(self.e2b.api_key.clone());
        // A parent proxy's URL with credentials.
        out.extend(self.egress.upstream.as_ref().filter(|u| u.auth.is_some()).map(|u| u.url.clone()));
        out
    }
}

/// The derived default of [`STATE_ROOT`]: under `$XDG_STATE_HOME` when that is an absolute path, else
/// under `$HOME/.local/state`.
fn default_home(env: &dyn Fn(&str) -> Option<String>) -> Result<PathBuf> {
    if let Some(state) = env("XDG_STATE_HOME").filter(|v| v.starts_with('/')) {
        return Ok(PathBuf::from(state).join("sandbox-mcp"));
    }
    let var = STATE_ROOT.env.unwrap_or(STATE_ROOT.name());
    let home = env("HOME").filter(|v| !v.is_empty()).with_context(|| format!("neither {var} nor HOME is set; set {var}"))?;
    Ok(PathBuf::from(home).join(".local/state/sandbox-mcp"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn load(args: &[&str], env: &[(&str, &str)]) -> Result<Config> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let env: HashMap<String, String> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Config::load(&Args::parse(&args)?, &|k| env.get(k).cloned())
    }

    #[test]
    fn defaults() {
        let c = load(&[], &[("HOME", "/h")]).unwrap();
        assert_eq!(c.provider, ProviderKind::Local);
        assert_eq!(c.workers, 8);
        assert_eq!(c.listen.to_string(), "127.0.0.1:8765");
        assert_eq!(c.home, PathBuf::from("/h/.local/state/sandbox-mcp"));
        assert_eq!(c.session_idle, Duration::from_secs(3600));
    }

    #[test]
    fn uid_ranges_parse_strictly() {
        let range = |v: &str| load(&[], &[("HOME", "/h"), ("SANDBOX_MCP_UID_RANGE", v)]).map(|c| c.uid_range);
        assert_eq!(load(&[], &[("HOME", "/h")]).unwrap().uid_range, (2_000_000_000, 2_000_065_535));
        assert_eq!(range(" 5-5 ").unwrap(), (5, 5));
        for bad in ["5", "0-10", "10-5", "a-b", "1-2147483648", "-1-5"] {
            let err = range(bad).unwrap_err().to_string();
            assert!(err.contains("FIRST-LAST"), "{bad}: {err}");
        }
    }

    #[test]
    fn max_sandboxes_and_default_limits() {
        let c = load(&[], &[("HOME", "/h")]).unwrap();
        assert_eq!(
            (c.max_sandboxes, c.default_limits),
            (64, DefaultLimits { memory_mb: Some(2048), processes: Some(1024), disk_mb: None })
        );
        let c = load(&["--default-limits", "none", "--max-sandboxes", "3"], &[("HOME", "/h")]).unwrap();
        assert_eq!((c.max_sandboxes, c.default_limits), (3, DefaultLimits::default()));
        let c = load(&[], &[("HOME", "/h"), ("SANDBOX_MCP_DEFAULT_LIMITS", "processes=100")]).unwrap();
        assert_eq!(c.default_limits, DefaultLimits { memory_mb: None, processes: Some(100), disk_mb: None });
        let c = load(&["--default-limits", "memory_mb=512,disk_mb=256"], &[("HOME", "/h")]).unwrap();
        assert_eq!(c.default_limits, DefaultLimits { memory_mb: Some(512), processes: None, disk_mb: Some(256) });
        for bad in ["cpu=1", "memory_mb=1", "processes=x", "memory_mb", "disk_mb=1"] {
            let err = load(&["--default-limits", bad], &[("HOME", "/h")]).unwrap_err().to_string();
            assert!(err.contains("--default-limits"), "{bad}: {err}");
        }
        assert!(load(&["--max-sandboxes", "0"], &[("HOME", "/h")]).is_err());
    }

    #[test]
    fn e2b_key_selects_e2b_and_flags_win_over_env() {
        let c = load(&[], &[("HOME", "/h"), ("E2B_API_KEY", "e2b_x")]).unwrap();
        assert_eq!(c.provider, ProviderKind::E2b);
        let c =
            load(&["--provider", "local", "--workers=3"], &[("HOME", "/h"), ("E2B_API_KEY", "k"), ("SANDBOX_MCP_WORKERS", "5")]).unwrap();
        assert_eq!(c.provider, ProviderKind::Local);
        assert_eq!(c.workers, 3);
        assert_eq!(c.secrets(), vec!["k".to_string()]);
    }

    #[test]
    fn bad_values_are_explained() {
        let err = load(&["--workers", "0"], &[("HOME", "/h")]).unwrap_err().to_string();
        assert!(err.contains("out of range"), "{err}");
        let err = load(&["--provider", "e2b"], &[("HOME", "/h")]).unwrap_err().to_string();
        assert!(err.contains("E2B_API_KEY"), "{err}");
        assert!(load(&["--bogus"], &[]).is_err());
        assert!(load(&["--listen", "nope"], &[("HOME", "/h")]).is_err());
    }

    #[test]
    fn positional_words_are_kept_in_order() {
        let a = Args::parse(&["call".into(), "--home".into(), "/x".into(), "run_command".into(), "{}".into()]).unwrap();
        assert_eq!(a.positional, vec!["call", "run_command", "{}"]);
    }

    #[test]
    fn every_option_has_a_unique_flag_and_environment_variable() {
        let mut names = std::collections::HashSet::new();
        for o in OPTIONS {
            assert!(o.flag.is_some() || o.env.is_some(), "{} has neither a flag nor a variable", o.help);
            for name in o.flag.into_iter().chain(o.env) {
                assert!(names.insert(name), "{name} is declared twice");
            }
            if let Some(flag) = o.flag {
                assert!(flag.starts_with("--") && flag.len() > 2 && !flag.contains('='), "{flag}");
                assert!(!["--help", "--version"].contains(&flag), "{flag} is taken");
            }
            assert!(!o.help.is_empty(), "{} has no help text", o.name());
        }
    }

    #[test]
    fn every_written_default_parses_to_the_default_config() {
        let home = [("HOME", "/h")];
        let mut given: Vec<(&str, &str)> = home.to_vec();
        for o in OPTIONS {
            if let (Some(var), Some(text)) = (o.env, o.default.text()) {
                given.push((var, text));
            }
        }
        assert!(given.len() > 5, "{given:?}");
        assert_eq!(load(&[], &given).unwrap(), load(&[], &home).unwrap());
        let flags: Vec<String> =
            OPTIONS.iter().filter(|o| o.takes_value).filter_map(|o| Some(format!("{}={}", o.flag?, o.default.text()?))).collect();
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        assert!(flags.len() > 3, "{flags:?}");
        assert_eq!(load(&flags, &home).unwrap(), load(&[], &home).unwrap());
    }

    #[test]
    fn flags_win_over_environment_over_default() {
        let env = [("HOME", "/h"), ("SANDBOX_MCP_QUEUE", "7"), ("SANDBOX_MCP_HOME", "/env"), ("E2B_DOMAIN", "")];
        let c = load(&["--queue", "9", "--home=/flag"], &env).unwrap();
        assert_eq!((c.queue_capacity, c.home.clone()), (9, PathBuf::from("/flag")));
        let c = load(&[], &env).unwrap();
        assert_eq!((c.queue_capacity, c.home.clone()), (7, PathBuf::from("/env")));
        assert_eq!(c.e2b.domain, "e2b.app", "an empty variable counts as not set");
        let c = load(&["--queue", "1", "--queue", "2"], &env).unwrap();
        assert_eq!(c.queue_capacity, 2, "the last flag wins");
    }

    #[test]
    fn messages_name_the_option_and_the_fix() {
        let err = |args: &[&str], env: &[(&str, &str)]| load(args, env).unwrap_err().to_string();
        let h = ("HOME", "/h");
        assert_eq!(err(&["--bogus"], &[]), "unknown flag --bogus; run `sandbox-mcp --help` for the list");
        assert_eq!(err(&["--workers"], &[]), "flag --workers needs a value");
        assert_eq!(err(&["--workers=0"], &[h]), "--workers 0 is out of range; use 1 to 1024");
        assert_eq!(err(&[], &[h, ("SANDBOX_MCP_WORKERS", "x")]), "--workers \"x\" is not a whole number");
        assert_eq!(err(&["--session-idle", "99999999"], &[h]), "--session-idle 99999999 is out of range; use 1 to 2592000");
        assert_eq!(err(&[], &[h, ("SANDBOX_MCP_E2B_TIMEOUT", "0")]), "SANDBOX_MCP_E2B_TIMEOUT 0 is out of range; use 1 to 3600");
        assert_eq!(err(&["--listen", "nope"], &[h]), "--listen \"nope\" is not an address like 127.0.0.1:8765");
        assert_eq!(err(&["--provider", "foo"], &[h]), "unknown provider \"foo\"; use local or e2b");
        assert_eq!(err(&["--provider", "e2b"], &[h]), "the e2b provider needs E2B_API_KEY; set it, or use --provider local");
        assert_eq!(err(&[], &[]), "neither SANDBOX_MCP_HOME nor HOME is set; set SANDBOX_MCP_HOME");
    }

    #[test]
    fn switches_take_no_value() {
        let table = [OptionSpec { flag: Some("--quiet"), takes_value: false, env: None, default: Unset, help: "less output" }];
        let words: Vec<String> = ["--quiet", "run"].iter().map(|s| s.to_string()).collect();
        let a = Args::parse_with(&words, &table).unwrap();
        assert_eq!((a.flag("--quiet"), a.positional.as_slice()), (Some("true"), ["run".to_string()].as_slice()));
        let err = Args::parse_with(&["--quiet=yes".to_string()], &table).unwrap_err().to_string();
        assert!(err.contains("takes no value"), "{err}");
    }

    #[test]
    fn choices_are_listed_when_none_matches() {
        let spec = OptionSpec { flag: None, takes_value: true, env: Some("X"), default: Text("b"), help: "x" };
        let args = Args::default();
        let pick = |value: &'static str| {
            let src = Source { args: &args, env: &move |_: &str| Some(value.to_string()) };
            src.choice(&spec, "mode", &[("a", 1), ("b", 2), ("c", 3)]).map_err(|e| e.to_string())
        };
        assert_eq!(pick("c"), Ok(3));
        assert_eq!(pick(""), Ok(2), "an empty variable means the default");
        assert_eq!(pick("d"), Err("unknown mode \"d\"; use a, b or c".to_string()));
    }

    #[test]
    fn defaults_are_shown_as_written() {
        assert_eq!(WORKERS.default.to_string(), "8");
        assert_eq!(HTTP_TOKEN.default.to_string(), "none");
        assert_eq!(PROVIDER.default.to_string(), "e2b if E2B_API_KEY is set, else local");
        assert_eq!((E2B_TIMEOUT.name(), WORKERS.name()), ("SANDBOX_MCP_E2B_TIMEOUT", "--workers"));
    }
}
