//! Configuration: command-line flags and environment variables turned into one validated `Config`.
//!
//! Every default lives here (limits live in `limits.rs`). The README's configuration table mirrors
//! [`OPTIONS`]; `tests/it/tidy.rs` checks that every option appears there.

use anyhow::{bail, Context, Result};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

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

/// Settings of the E2B provider.
#[derive(Debug, Clone)]
pub struct E2bConfig {
    /// `E2B_API_KEY`; required for the e2b provider.
    pub api_key: Option<String>,
    /// `E2B_DOMAIN`: the region's domain.
    pub domain: String,
    /// `E2B_API_URL`: control-plane base URL override.
    pub api_url: Option<String>,
    /// `E2B_SANDBOX_URL`: envd base URL override (self-hosting, tests).
    pub sandbox_url: Option<String>,
    /// Connect timeout of every HTTP request.
    pub connect_timeout: Duration,
    /// Overall timeout of a control-plane request.
    pub request_timeout: Duration,
}

/// The validated configuration of one server process.
#[derive(Debug, Clone)]
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
    /// State root of the local provider.
    pub home: PathBuf,
    /// The POSIX shell the local provider runs snippets and commands with.
    pub local_shell: PathBuf,
    /// E2B settings.
    pub e2b: E2bConfig,
}

/// One configuration option, for parsing and for the README table.
pub struct OptionSpec {
    /// Command-line flag, if any (`--workers`).
    pub flag: Option<&'static str>,
    /// Environment variable, if any.
    pub env: Option<&'static str>,
    /// Default, as shown to users.
    pub default: &'static str,
    /// What it does.
    pub help: &'static str,
}

/// Every option, in README order.
pub const OPTIONS: &[OptionSpec] = &[
    OptionSpec {
        flag: Some("--provider"),
        env: Some("SANDBOX_MCP_PROVIDER"),
        default: "e2b if E2B_API_KEY is set, else local",
        help: "sandbox provider: local or e2b",
    },
    OptionSpec {
        flag: Some("--listen"),
        env: Some("SANDBOX_MCP_LISTEN"),
        default: "127.0.0.1:8765",
        help: "HTTP listen address (http mode)",
    },
    OptionSpec { flag: Some("--workers"), env: Some("SANDBOX_MCP_WORKERS"), default: "8", help: "worker threads running tool calls" },
    OptionSpec {
        flag: Some("--queue"),
        env: Some("SANDBOX_MCP_QUEUE"),
        default: "64",
        help: "capacity of the work queue; HTTP answers 503 when it is full",
    },
    OptionSpec {
        flag: Some("--session-idle"),
        env: Some("SANDBOX_MCP_SESSION_IDLE"),
        default: "3600",
        help: "seconds after which an idle HTTP session ends (its sandboxes are killed)",
    },
    OptionSpec {
        flag: None,
        env: Some("SANDBOX_MCP_HTTP_TOKEN"),
        default: "none",
        help: "bearer token required on every HTTP request (environment only, never a flag)",
    },
    OptionSpec {
        flag: Some("--home"),
        env: Some("SANDBOX_MCP_HOME"),
        default: "$XDG_STATE_HOME/sandbox-mcp or ~/.local/state/sandbox-mcp",
        help: "state root of the local provider",
    },
    OptionSpec {
        flag: Some("--local-shell"),
        env: Some("SANDBOX_MCP_LOCAL_SH"),
        default: "/bin/sh",
        help: "POSIX shell the local provider runs commands and supervisor snippets with",
    },
    OptionSpec { flag: None, env: Some("E2B_API_KEY"), default: "none", help: "E2B API key; selects the e2b provider by default" },
    OptionSpec { flag: None, env: Some("E2B_DOMAIN"), default: "e2b.app", help: "E2B region domain" },
    OptionSpec {
        flag: None,
        env: Some("E2B_API_URL"),
        default: "https://api.$E2B_DOMAIN",
        help: "control-plane URL override (self-hosting, tests)",
    },
    OptionSpec {
        flag: None,
        env: Some("E2B_SANDBOX_URL"),
        default: "https://<port>-<sandbox>.$E2B_DOMAIN",
        help: "envd URL override (self-hosting, tests)",
    },
    OptionSpec {
        flag: None,
        env: Some("SANDBOX_MCP_E2B_TIMEOUT"),
        default: "30",
        help: "seconds allowed for one E2B control-plane request",
    },
    OptionSpec { flag: None, env: Some("RUST_LOG"), default: "info", help: "log filter; logs go to stderr only" },
];

/// Flags that take a value.
const VALUE_FLAGS: &[&str] = &["--provider", "--listen", "--workers", "--queue", "--session-idle", "--home", "--local-shell"];

/// The command line split into a subcommand's positional words and flag values.
#[derive(Debug, Default)]
pub struct Args {
    /// Positional words (`http`, `call`, the tool name, its JSON...).
    pub positional: Vec<String>,
    flags: Vec<(String, String)>,
}

impl Args {
    /// Splits `args` (without the program name) into flags and positional words.
    pub fn parse(args: &[String]) -> Result<Args> {
        let mut out = Args::default();
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            if arg == "--" {
                out.positional.extend(it.by_ref().cloned());
                break;
            }
            if let Some(flag) = arg.strip_prefix("--").map(|_| arg.as_str()) {
                let (name, value) = match flag.split_once('=') {
                    Some((n, v)) => (n.to_string(), Some(v.to_string())),
                    None => (flag.to_string(), None),
                };
                if name == "--help" || name == "--version" {
                    out.positional.insert(0, name);
                    continue;
                }
                if !VALUE_FLAGS.contains(&name.as_str()) {
                    bail!("unknown flag {name}; run `sandbox-mcp --help` for the list");
                }
                let value = match value {
                    Some(v) => v,
                    None => it.next().cloned().with_context(|| format!("flag {name} needs a value"))?,
                };
                out.flags.push((name, value));
            } else {
                out.positional.push(arg.clone());
            }
        }
        Ok(out)
    }

    fn flag(&self, name: &str) -> Option<&str> {
        self.flags.iter().rev().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

impl Config {
    /// Builds the configuration from parsed flags and an environment lookup.
    pub fn load(args: &Args, env: &dyn Fn(&str) -> Option<String>) -> Result<Config> {
        let get = |flag: &str, var: &str| -> Option<String> {
            args.flag(flag).map(str::to_string).or_else(|| env(var).filter(|v| !v.is_empty()))
        };
        let api_key = env("E2B_API_KEY").filter(|v| !v.is_empty());
        let provider = match get("--provider", "SANDBOX_MCP_PROVIDER").as_deref() {
            Some("local") => ProviderKind::Local,
            Some("e2b") => ProviderKind::E2b,
            Some(other) => bail!("unknown provider {other:?}; use local or e2b"),
            None if api_key.is_some() => ProviderKind::E2b,
            None => ProviderKind::Local,
        };
        if provider == ProviderKind::E2b && api_key.is_none() {
            bail!("the e2b provider needs E2B_API_KEY; set it, or use --provider local");
        }
        let workers = parse_num(get("--workers", "SANDBOX_MCP_WORKERS"), 8, 1, 1024, "--workers")?;
        let queue_capacity = parse_num(get("--queue", "SANDBOX_MCP_QUEUE"), 64, 1, 65_536, "--queue")?;
        let idle = parse_num(get("--session-idle", "SANDBOX_MCP_SESSION_IDLE"), 3600, 1, 30 * 86_400, "--session-idle")?;
        let listen_text = get("--listen", "SANDBOX_MCP_LISTEN").unwrap_or_else(|| "127.0.0.1:8765".into());
        let listen: SocketAddr =
            listen_text.parse().with_context(|| format!("--listen {listen_text:?} is not an address like 127.0.0.1:8765"))?;
        let home = match get("--home", "SANDBOX_MCP_HOME") {
            Some(h) => PathBuf::from(h),
            None => default_home(env)?,
        };
        let local_shell = PathBuf::from(get("--local-shell", "SANDBOX_MCP_LOCAL_SH").unwrap_or_else(|| "/bin/sh".into()));
        let e2b_timeout = parse_num(env("SANDBOX_MCP_E2B_TIMEOUT"), 30, 1, 3600, "SANDBOX_MCP_E2B_TIMEOUT")?;
        Ok(Config {
            provider,
            workers,
            queue_capacity,
            listen,
            http_token: env("SANDBOX_MCP_HTTP_TOKEN").filter(|t| !t.is_empty()),
            session_idle: Duration::from_secs(idle as u64),
            home,
            local_shell,
            e2b: E2bConfig {
                api_key,
                domain: env("E2B_DOMAIN").filter(|v| !v.is_empty()).unwrap_or_else(|| "e2b.app".into()),
                api_url: env("E2B_API_URL").filter(|v| !v.is_empty()),
                sandbox_url: env("E2B_SANDBOX_URL").filter(|v| !v.is_empty()),
                connect_timeout: Duration::from_secs(10),
                request_timeout: Duration::from_secs(e2b_timeout as u64),
            },
        })
    }

    /// Values of this configuration that must never appear in output or logs (SPEC §8).
    pub fn secrets(&self) -> Vec<String> {
        let mut out = Vec::new();
        out.extend(self.http_token.clone());
        out.extend(self.e2b.api_key.clone());
        out
    }
}

fn parse_num(value: Option<String>, default: usize, min: usize, max: usize, what: &str) -> Result<usize> {
    let Some(text) = value else {
        return Ok(default);
    };
    let n: usize = text.trim().parse().with_context(|| format!("{what} {text:?} is not a whole number"))?;
    if n < min || n > max {
        bail!("{what} {n} is out of range; use {min} to {max}");
    }
    Ok(n)
}

fn default_home(env: &dyn Fn(&str) -> Option<String>) -> Result<PathBuf> {
    if let Some(state) = env("XDG_STATE_HOME").filter(|v| v.starts_with('/')) {
        return Ok(PathBuf::from(state).join("sandbox-mcp"));
    }
    let home = env("HOME").filter(|v| !v.is_empty()).context("neither SANDBOX_MCP_HOME nor HOME is set; set SANDBOX_MCP_HOME")?;
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
}
