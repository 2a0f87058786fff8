//! The `sandbox-mcp` binary: parses the command line, sets up stderr logging, and runs one
//! subcommand. Exit codes: 0 success, 1 failure (or a failed tool for `call`), 2 usage error;
//! `call run_command` exits with the command's exit code.

use sandbox_mcp::config::{Args, Config, IsolationMode, ProviderKind};
use sandbox_mcp::provider::local::isolation::{self, Isolation};
use std::process::ExitCode;

fn main() -> ExitCode {
    // Nothing this process inherited beyond its stdio may reach a sandbox.
    sandbox_mcp::descriptors::close_inherited_on_exec();
    sandbox_mcp::descriptors::raise_limit();
    let argv: Vec<String> = std::env::args().skip(1).collect();
    // The local provider's internal subcommands (its keeper, a sandbox's init), started detached
    // with an empty environment: they need no config, and their arguments are their own.
    if let Some(result) = sandbox_mcp::provider::local::run_internal(&argv) {
        return match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("sandbox-mcp {}: {err:#}", argv.first().map(String::as_str).unwrap_or(""));
                ExitCode::from(1)
            }
        };
    }
    sandbox_mcp::memory::fix_thresholds();
    if argv.first().map(String::as_str) == Some("doctor") {
        return match &argv[1..] {
            [] => ExitCode::from(sandbox_mcp::cli::doctor(false)),
            [json] if json == "--json" => ExitCode::from(sandbox_mcp::cli::doctor(true)),
            _ => {
                eprintln!("sandbox-mcp: usage: sandbox-mcp doctor [--json]");
                ExitCode::from(2)
            }
        };
    }
    let args = match Args::parse(&argv) {
        Ok(a) => a,
        Err(err) => {
            eprintln!("sandbox-mcp: {err:#}");
            return ExitCode::from(2);
        }
    };
    let words = &args.positional;
    let command = words.first().map(String::as_str).unwrap_or("stdio");
    if command == "--help" || command == "help" {
        print!("{}", sandbox_mcp::cli::help());
        return ExitCode::SUCCESS;
    }
    if command == "tools" {
        print!("{}", sandbox_mcp::cli::tool_list());
        return ExitCode::SUCCESS;
    }
    if command == "--version" {
        println!("sandbox-mcp {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    // Logs go to stderr only: stdout belongs to the MCP stdio transport.
    let logger =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).target(env_logger::Target::Stderr).build();
    log::set_max_level(logger.filter());
    let _ = log::set_boxed_logger(Box::new(NoWireDumps(logger)));
    let mut config = match Config::load(&args, &|k| std::env::var(k).ok()) {
        Ok(c) => c,
        Err(err) => {
            eprintln!("sandbox-mcp: {err:#}");
            return ExitCode::from(2);
        }
    };
    if config.provider == ProviderKind::Local {
        // An unprivileged server with subordinate ids gives each sandbox one of them, and every
        // server joins the user namespace its state root's sandboxes live in; this must happen
        // while the process has one thread (see `isolation::subordinate`).
        if !rustix::process::getuid().is_root() {
            use isolation::subordinate::{Entry, Skipped};
            let wanted = config.subordinate_ids && config.isolation != IsolationMode::None;
            match isolation::subordinate::enter(&config.home, wanted) {
                Ok((entered, how)) => {
                    log::info!(
                        "isolated sandboxes get host uids of their own: subordinate ids {}-{} ({} a user namespace of this user's)",
                        entered.first_host_uid,
                        entered.host_id(entered.count),
                        if how == Entry::Joined { "joined" } else { "made" }
                    );
                    config.uid_range = entered.sandbox_ids();
                }
                Err(Skipped::Stayed(why)) if wanted => log::info!("isolated sandboxes share the server's host uid: {why}"),
                Err(Skipped::Stayed(_)) => {}
                Err(Skipped::Failed(why)) => {
                    log::warn!("isolated sandboxes share the server's host uid: subordinate ids could not be used: {why}")
                }
                Err(Skipped::Stuck(why)) => {
                    eprintln!(
                        "sandbox-mcp: {why}; refusing to start (servers and sandboxes of another kind live in the state root {})",
                        config.home.display()
                    );
                    return ExitCode::from(1);
                }
            }
        }
        // Resolved once here, so that `auto` warns once and `namespaces` refuses to start.
        match isolation::resolve(config.isolation) {
            Ok(resolved) => {
                if config.isolation == IsolationMode::Auto && resolved == Isolation::Landlock {
                    let why = isolation::probe().err().map(|e| e.0).unwrap_or_default();
                    log::warn!("local sandboxes are isolated with Landlock, not namespaces (--isolation auto): {why}");
                }
                config.isolation = match resolved {
                    Isolation::Namespaces => IsolationMode::Namespaces,
                    Isolation::Landlock => IsolationMode::Landlock,
                    Isolation::None => IsolationMode::None,
                };
            }
            // `auto` starts, and refuses to create sandboxes, saying why (the provider does).
            Err(why) if config.isolation == IsolationMode::Auto => log::warn!("create_sandbox will be refused: {why}"),
            Err(why) => {
                eprintln!("sandbox-mcp: --isolation {} is not possible on this host: {why}", config.isolation.name());
                return ExitCode::from(2);
            }
        }
        // A root server's sandboxes take their uids from --uid-range: a range someone owns is a
        // configuration error.
        if config.isolation == IsolationMode::Namespaces && rustix::process::getuid().is_root() {
            if let Err(why) = isolation::uids::UidRange::new(config.uid_range).check_free() {
                eprintln!("sandbox-mcp: {why}");
                return ExitCode::from(2);
            }
        }
    }
    let rest = &words[words.len().min(1)..];
    let result = match command {
        "stdio" if rest.is_empty() => sandbox_mcp::server::run_stdio(config).map(|()| 0),
        "http" if rest.is_empty() => sandbox_mcp::server::run_http(config).map(|()| 0),
        "call" => sandbox_mcp::cli::call(config, rest),
        "demo" if rest.is_empty() => sandbox_mcp::cli::demo(&config),
        _ => {
            eprintln!("sandbox-mcp: unknown command {:?}\n\n{}", words.join(" "), sandbox_mcp::cli::help());
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(code) => ExitCode::from(code as u8),
        Err(err) => {
            eprintln!("sandbox-mcp: {err:#}");
            ExitCode::from(1)
        }
    }
}

/// The stderr logger minus the HTTP client's trace level, and with every record's text passed
/// through `log_line::clean` (a sandbox's error line may carry terminal escapes; found by a
/// review, where a warning carried one raw to the operator's terminal). At trace level
/// ureq-proto hex-dumps every exchange with E2B (`X-API-KEY` and `X-Access-Token` headers,
/// token-bearing bodies) and ureq prints whole URLs (file paths a caller chose), and the server
/// never logs its secrets (docs/contract.md, "Secrets"), whatever `RUST_LOG` asks for. Refusing
/// `Trace` for `ureq*` targets also makes ureq's own "is trace on?" checks answer no, so its
/// debug lines keep URLs redacted.
struct NoWireDumps(env_logger::Logger);

impl NoWireDumps {
    fn dropped(meta: &log::Metadata<'_>) -> bool {
        meta.level() == log::Level::Trace && meta.target().starts_with("ureq")
    }
}

impl log::Log for NoWireDumps {
    fn enabled(&self, meta: &log::Metadata<'_>) -> bool {
        !NoWireDumps::dropped(meta) && self.0.enabled(meta)
    }

    fn log(&self, record: &log::Record<'_>) {
        if NoWireDumps::dropped(record.metadata()) {
            return;
        }
        // Log lines carry sandbox and client text: nothing in them acts on a terminal.
        let text = record.args().to_string();
        let std::borrow::Cow::Owned(clean) = sandbox_mcp::log_line::clean(&text) else {
            self.0.log(record);
            return;
        };
        self.0.log(
            &log::Record::builder()
                .args(format_args!("{clean}"))
                .metadata(record.metadata().clone())
                .module_path(record.module_path())
                .file(record.file())
                .line(record.line())
                .build(),
        );
    }

    fn flush(&self) {
        self.0.flush();
    }
}
