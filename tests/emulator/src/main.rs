//! The `e2b-emulator` binary: parses the command line, runs the emulator of the `e2b_emulator`
//! library until SIGTERM/SIGINT, then kills its sandboxes and removes a temporary state root.
//! Also runs the local provider's internal subcommands (its keeper, `e2b-emulator keeper …`),
//! which the provider starts from the current executable.

#![forbid(unsafe_code)]

use e2b_emulator::edge::Routing;
use e2b_emulator::{Emulator, Options};
use sandbox_mcp::provider::local::isolation::Isolation;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage: e2b-emulator [--listen ADDR] [--home DIR] [--shell PATH] [--api-key KEY] [--threads N]
                    [--isolation none|namespaces] [--routing header|host|path]

An E2B-compatible control plane and envd on one loopback port, for tests. Prints
`listening on http://ADDR` on stderr once bound; stops on SIGTERM or SIGINT and kills its
sandboxes. Point the E2B SDK at it with E2B_API_URL=http://ADDR and E2B_SANDBOX_URL=http://ADDR.

  --listen ADDR    loopback address (default 127.0.0.1:0, a free port)
  --home DIR       state root (default: a new temporary directory, removed at exit)
  --shell PATH     POSIX shell for wrappers and signals (default /bin/sh)
  --api-key KEY    the only accepted X-API-KEY (default: any non-empty key)
  --threads N      request threads (default 16; streams get their own)
  --isolation MODE how the local sandboxes underneath are isolated: none (default) or
                   namespaces (the local provider's; fails when the host does not allow them)
  --routing MODE   how envd requests find their sandbox: header (default: E2b-Sandbox-Id, else
                   the Host), host (a <port>-<id>.<domain> Host only; use the emulator as an
                   HTTP proxy), or path (http://ADDR/proxy/<id>/<port>/… only)
";

struct Cli {
    listen: SocketAddr,
    home: Option<PathBuf>,
    shell: PathBuf,
    api_key: Option<String>,
    threads: usize,
    isolation: Isolation,
    routing: Routing,
}

fn parse(args: &[String]) -> Result<Cli, String> {
    let mut cli = Cli {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        home: None,
        shell: PathBuf::from("/bin/sh"),
        api_key: None,
        threads: 16,
        isolation: Isolation::None,
        routing: Routing::Header,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (flag.as_str(), None),
        };
        let mut value = || inline.clone().or_else(|| it.next().cloned()).ok_or(format!("{name} needs a value"));
        match name {
            "--listen" => cli.listen = value()?.parse().map_err(|e| format!("--listen: {e}"))?,
            "--home" => cli.home = Some(PathBuf::from(value()?)),
            "--shell" => cli.shell = PathBuf::from(value()?),
            "--api-key" => cli.api_key = Some(value()?),
            "--threads" => cli.threads = value()?.parse().map_err(|e| format!("--threads: {e}"))?,
            "--isolation" => {
                cli.isolation = match value()?.as_str() {
                    "none" => Isolation::None,
                    "namespaces" => Isolation::Namespaces,
                    other => return Err(format!("--isolation: {other:?} is not none or namespaces")),
                }
            }
            "--routing" => cli.routing = Routing::parse(&value()?)?,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(cli)
}

fn main() -> ExitCode {
    // As sandbox-mcp's own main: nothing this process inherited beyond its stdio may reach a
    // sandbox.
    sandbox_mcp::descriptors::close_inherited_on_exec();
    let args: Vec<String> = std::env::args().skip(1).collect();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).target(env_logger::Target::Stderr).init();
    // Started detached by the local provider (this program is its current executable).
    if let Some(result) = sandbox_mcp::provider::local::run_internal(&args) {
        return match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("e2b-emulator {}: {err:#}", args.first().map(String::as_str).unwrap_or(""));
                ExitCode::from(1)
            }
        };
    }
    if args.iter().any(|a| a == "--help" || a == "-h") {
        print!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let cli = match parse(&args) {
        Ok(c) => c,
        Err(err) => {
            eprintln!("e2b-emulator: {err}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("e2b-emulator: {err:#}");
            ExitCode::from(1)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let temporary = cli.home.is_none();
    let home = match cli.home {
        Some(h) => h,
        None => std::env::temp_dir().join(format!("e2b-emulator.{}", sandbox_mcp::ids::random_hex(6))),
    };
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])?;
    let emulator = match Emulator::start(Options {
        listen: cli.listen,
        home: home.clone(),
        shell: cli.shell,
        api_key: cli.api_key,
        threads: cli.threads,
        isolation: cli.isolation,
        routing: cli.routing,
    }) {
        Ok(e) => e,
        Err(err) => {
            if temporary {
                let _ = std::fs::remove_dir_all(&home);
            }
            return Err(err);
        }
    };
    eprintln!("listening on http://{}", emulator.addr());
    let _ = signals.forever().next();
    emulator.shutdown();
    if temporary {
        let _ = std::fs::remove_dir_all(&home);
    }
    Ok(())
}
