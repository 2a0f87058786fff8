//! What every worker shares: the configuration, the provider, and the host-side masker.

use crate::config::{Config, IsolationMode, ProviderKind};
use crate::mask::Masker;
use crate::provider::e2b::E2bProvider;
use crate::provider::local::isolation::{self, uids::UidRange};
use crate::provider::local::LocalProvider;
use crate::provider::{Limits, Provider};
use anyhow::{Context, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Shared, immutable server state.
pub struct App {
    /// The configuration.
    pub config: Config,
    /// The sandbox provider.
    pub provider: Arc<dyn Provider>,
    /// Masks the server's own secrets (API keys, tokens) in everything it returns.
    pub host_masker: Masker,
    /// Set once shutdown begins: calls not yet started are answered with an error instead.
    draining: AtomicBool,
}

impl App {
    /// Builds the provider named by `config`.
    pub fn new(config: Config) -> Result<App> {
        let provider: Arc<dyn Provider> = match config.provider {
            ProviderKind::Local => {
                // `auto` never means none: with no isolation here, the provider refuses creation.
                let (isolation, refusal) = match isolation::resolve(config.isolation) {
                    Ok(isolation) => (isolation, None),
                    Err(why) if config.isolation == IsolationMode::Auto => (isolation::Isolation::None, Some(why.0)),
                    Err(why) => return Err(anyhow::Error::msg(why)).context("starting the local provider"),
                };
                let d = config.default_limits;
                let defaults = Limits { memory_mb: d.memory_mb, processes: d.processes, disk_mb: d.disk_mb };
                let local = LocalProvider::new(&config.home, &config.local_shell)
                    .and_then(|p| p.with_isolation(isolation))
                    .and_then(|p| p.with_uid_range(UidRange::new(config.uid_range)))
                    .map(|p| {
                        p.with_policy(config.max_sandboxes, defaults)
                            .with_egress(config.egress.clone())
                            .with_expose_address(config.expose_address)
                    })
                    .map(|p| match refusal {
                        Some(why) => p.refusing(why),
                        None => p,
                    })
                    .context("starting the local provider")?;
                let local = Arc::new(local);
                let sweeper = local.clone();
                std::thread::Builder::new()
                    .name("sandbox-mcp-sweep".into())
                    .spawn(move || sweeper.sweep())
                    .context("starting the sweep thread")?;
                local
            }
            ProviderKind::E2b => Arc::new(E2bProvider::new(&config.e2b).context("starting the e2b provider")?),
        };
        Ok(App::with_provider(config, provider))
    }

    /// Wraps an existing provider (tests, emulator).
    pub fn with_provider(config: Config, provider: Arc<dyn Provider>) -> App {
        let secrets = config.secrets();
        App { host_masker: Masker::from_values(secrets.iter().map(String::as_str)), config, provider, draining: AtomicBool::new(false) }
    }

    /// Marks the server as shutting down (SIGTERM, stdin closed).
    pub fn begin_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Whether shutdown has begun: requests then get an answer saying so, not a cancellation.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }
}

/// An app for unit tests that route requests without a running server.
#[cfg(test)]
pub mod testing {
    use super::App;
    use crate::config::{Args, Config};
    use crate::provider::local::LocalProvider;
    use std::path::{Path, PathBuf};
    use std::sync::Arc;

    /// An app on a local provider under a fresh temporary directory (removed on drop).
    pub struct TestApp {
        /// The app.
        pub app: Arc<App>,
        /// Its state root.
        pub dir: PathBuf,
    }

    impl Drop for TestApp {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// A [`TestApp`] whose directory name starts with `smcp-<name>-`.
    pub fn test_app(name: &str) -> TestApp {
        let dir = std::env::temp_dir().join(format!("smcp-{name}-{}", crate::ids::random_hex(8)));
        let home = dir.to_string_lossy().into_owned();
        let env = move |k: &str| match k {
            "SANDBOX_MCP_HOME" => Some(home.clone()),
            "SANDBOX_MCP_PROVIDER" => Some("local".to_string()),
            _ => None,
        };
        let config = Config::load(&Args::default(), &env).unwrap();
        let provider = LocalProvider::new(&dir, Path::new("/bin/sh")).unwrap();
        TestApp { app: Arc::new(App::with_provider(config, Arc::new(provider))), dir }
    }
}
