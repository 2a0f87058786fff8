//! The e2b provider: E2B and E2B-compatible platforms (see docs/contract.md, "Providers").
//!
//! Two clients share one `ureq` agent with explicit timeouts: `control`, the REST control
//! plane (`X-API-KEY`) that creates, renews, inspects and kills sandboxes and caches what it
//! learns about each one; and `envd`, the agent in the sandbox, reached over Connect RPC
//! (JSON over HTTP/1.1, enveloped server streams for `process.Process/Start`) and plain
//! `/files`. The `Provider` methods here check their arguments, reach the sandbox through the
//! control plane, and hand the work to the right client. E2B's JSON answers are read into typed
//! structs through `loose`, which keeps every field optional.

mod connection;
mod control;
pub mod egress;
mod envd;
mod loose;
mod reply;
pub mod sandbox_url;
pub mod wire;

use crate::config::E2bConfig;
use crate::mask::Masker;
use crate::provider::{
    CreateRequest, DirEntry, ExecOutput, ExecRequest, Exposed, LongCommands, Provider, ProviderError, SandboxInfo, Touch,
};
use control::ControlPlane;
use envd::Envd;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

pub use control::RENEW_COALESCE;

/// The provider.
pub struct E2bProvider {
    control: ControlPlane,
    envd: Envd,
}

impl E2bProvider {
    /// Builds the provider from its configuration (no I/O).
    pub fn new(config: &E2bConfig) -> Result<E2bProvider, ProviderError> {
        let api_key = config.api_key.clone().ok_or_else(|| ProviderError::Unavailable("E2B_API_KEY is not set".into()))?;
        // ureq never turns an HTTP status into an error here, so error bodies are kept. A
        // redirect is never followed: it is answered as what it is (found by a review: a sandbox
        // answering envd's requests with one made the server fetch host-side addresses with the
        // sandbox's access token, and the control plane's would carry the API key elsewhere).
        let agent_config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .timeout_connect(Some(config.connect_timeout))
            .timeout_global(Some(config.request_timeout))
            .user_agent(format!("sandbox-mcp/{}", env!("CARGO_PKG_VERSION")))
            .build();
        let agent = connection::agent(agent_config);
        let domain = config.domain.clone();
        let api_url = config.api_url.clone().unwrap_or_else(|| format!("https://api.{domain}")).trim_end_matches('/').to_string();
        Ok(E2bProvider {
            control: ControlPlane::new(agent.clone(), api_url, api_key, config.request_timeout),
            envd: Envd::new(agent, config.sandbox_url.clone(), domain, config.request_timeout),
        })
    }
}

/// The most secret-named variables of a sandbox's environment its masker holds, and the most
/// bytes of their values.
const ENV_SECRETS_MAX: usize = 256;
const ENV_SECRETS_MAX_BYTES: usize = 64 * 1024;

/// What E2B's ports are, said with each expose and unexpose.
const E2B_PORTS: &str =
    "E2B's edge serves every port a sandbox process listens on (on 0.0.0.0) at this URL while the sandbox runs, whether exposed or not.";

/// Checks the form of an E2B sandbox id.
pub fn check_e2b_id(id: &str) -> Result<(), ProviderError> {
    if id.starts_with("local-") {
        return Err(ProviderError::InvalidId {
            id: id.chars().take(80).collect(),
            reason: "this is a local-provider sandbox id; this server runs the e2b provider. Use a sandbox created by this server, or start the server with --provider local".into(),
        });
    }
    if id.is_empty() || id.len() > 128 || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return Err(ProviderError::InvalidId {
            id: id.chars().take(80).collect(),
            reason: "E2B sandbox ids are letters, digits and dashes; use the sandbox_id returned by create_sandbox".into(),
        });
    }
    Ok(())
}

impl Provider for E2bProvider {
    fn name(&self) -> &'static str {
        "e2b"
    }

    fn check_id(&self, sandbox_id: &str) -> Result<(), ProviderError> {
        check_e2b_id(sandbox_id)
    }

    fn create(&self, req: &CreateRequest, deadline: Instant) -> Result<SandboxInfo, ProviderError> {
        if req.limits.disk_mb.is_some() {
            return Err(ProviderError::Rejected(
                "limits.disk_mb cannot be enforced on E2B: E2B has no per-sandbox disk argument (an E2B sandbox's disk comes from its template); leave disk_mb out"
                    .into(),
            ));
        }
        if req.limits.any() {
            return Err(ProviderError::Rejected(
                "limits are enforced by the local provider only; an E2B sandbox's resources come from its template".into(),
            ));
        }
        self.control.create(req, deadline)
    }

    fn set_network(&self, sandbox_id: &str, network: &crate::egress::Network, deadline: Instant) -> Result<SandboxInfo, ProviderError> {
        check_e2b_id(sandbox_id)?;
        self.control.set_network(sandbox_id, network, deadline)
    }

    fn kill(&self, sandbox_id: &str, deadline: Instant) -> Result<bool, ProviderError> {
        check_e2b_id(sandbox_id)?;
        self.control.kill(sandbox_id, deadline)
    }

    fn expose_port(&self, sandbox_id: &str, port: u16, deadline: Instant) -> Result<Exposed, ProviderError> {
        check_e2b_id(sandbox_id)?;
        let known = self.control.reach(sandbox_id, Touch::Renew, deadline)?;
        let url = self.envd.port_url(sandbox_id, port, &known).map_err(ProviderError::Rejected)?;
        Ok(Exposed { url, done: true, note: Some(E2B_PORTS.into()) })
    }

    fn unexpose_port(&self, sandbox_id: &str, port: u16, deadline: Instant) -> Result<Exposed, ProviderError> {
        check_e2b_id(sandbox_id)?;
        let known = self.control.reach(sandbox_id, Touch::Renew, deadline)?;
        let url = self.envd.port_url(sandbox_id, port, &known).unwrap_or_default();
        Ok(Exposed {
            url,
            done: false,
            note: Some(format!("{E2B_PORTS} E2B has no switch to close one port: stop the process listening on it, or kill the sandbox")),
        })
    }

    fn info(&self, sandbox_id: &str, touch: Touch, deadline: Instant) -> Result<SandboxInfo, ProviderError> {
        check_e2b_id(sandbox_id)?;
        self.control.info(sandbox_id, touch, deadline)
    }

    fn describe(&self, info: &SandboxInfo) -> String {
        about(info.network.reaches_out())
    }

    fn overview(&self) -> String {
        let about = about(true);
        format!("E2B sandboxes. Commands run with {}. {about}", self.command_shell())
    }

    fn command_shell(&self) -> String {
        "/bin/bash -l (/bin/sh where bash is missing)".into()
    }

    fn expires_at(&self, sandbox_id: &str) -> Option<i64> {
        self.control.expires_at(sandbox_id)
    }

    fn set_timeout(&self, sandbox_id: &str, timeout_s: u64, deadline: Instant) -> Result<SandboxInfo, ProviderError> {
        check_e2b_id(sandbox_id)?;
        self.control.set_timeout(sandbox_id, timeout_s, deadline)
    }

    fn shell(&self, script: &str) -> Vec<String> {
        // Like E2B's SDK (`/bin/bash -l -c`), falling back to /bin/sh where bash is missing; exec
        // keeps the pid envd watches.
        let wrapper = r#"if [ -x /bin/bash ]; then exec /bin/bash -l -c "$1"; fi; exec /bin/sh -c "$1""#;
        vec!["/bin/sh".into(), "-c".into(), wrapper.into(), "sh".into(), script.into()]
    }

    fn task_shell(&self) -> String {
        "/bin/bash -l".into()
    }

    fn posix_sh(&self, script: &str, args: &[&str]) -> Vec<String> {
        let mut argv = vec!["/bin/sh".to_string(), "-c".into(), script.into(), "sh".into()];
        argv.extend(args.iter().map(|a| a.to_string()));
        argv
    }

    fn exec(&self, sandbox_id: &str, req: &ExecRequest, touch: Touch) -> Result<ExecOutput, ProviderError> {
        let started = Instant::now();
        check_e2b_id(sandbox_id)?;
        let known = self.control.reach(sandbox_id, touch, req.deadline)?;
        self.envd.exec(&self.control, sandbox_id, &known, req, started)
    }

    fn long_commands(&self) -> LongCommands<'_> {
        // envd owns a command's pipes: a command that may become a task starts as one.
        LongCommands::SuperviseFromStart
    }

    fn read_file(&self, sandbox_id: &str, path: &str, max_bytes: usize, deadline: Instant) -> Result<Vec<u8>, ProviderError> {
        envd::check_path(path)?;
        check_e2b_id(sandbox_id)?;
        let known = self.control.reach(sandbox_id, Touch::Renew, deadline)?;
        self.envd.read_file(&self.control, sandbox_id, &known, path, max_bytes, deadline)
    }

    fn write_file(&self, sandbox_id: &str, path: &str, data: &[u8], deadline: Instant) -> Result<u64, ProviderError> {
        envd::check_path(path)?;
        check_e2b_id(sandbox_id)?;
        let known = self.control.reach(sandbox_id, Touch::Renew, deadline)?;
        self.envd.write_file(&self.control, sandbox_id, &known, path, data, deadline)
    }

    fn list_dir(
        &self,
        sandbox_id: &str,
        path: &str,
        max_entries: usize,
        deadline: Instant,
    ) -> Result<(Vec<DirEntry>, bool), ProviderError> {
        envd::check_path(path)?;
        check_e2b_id(sandbox_id)?;
        let known = self.control.reach(sandbox_id, Touch::Renew, deadline)?;
        self.envd.list_dir(&self.control, sandbox_id, &known, path, max_entries, deadline)
    }

    fn env_masker(&self, sandbox_id: &str, extra: &BTreeMap<String, String>) -> Result<Masker, ProviderError> {
        let extra_masker = Masker::from_env(extra.iter().map(|(a, b)| (a.as_str(), b.as_str())));
        if let Some(m) = self.control.masker(sandbox_id) {
            return Ok(m.merged(&extra_masker));
        }
        // Read the environment once per sandbox, exactly as envd gives it to every command (the
        // template may add secret-named variables beyond the create call's envs): the same
        // values the supervisor masks in task logs.
        let req = ExecRequest {
            argv: vec!["/bin/cat".into(), "/proc/self/environ".into()],
            envs: BTreeMap::new(),
            cwd: None,
            output_cap: 1024 * 1024,
            deadline: Instant::now() + Duration::from_secs(30),
            cancel: None,
        };
        let out = self.exec(sandbox_id, &req, Touch::Renew)?;
        let pairs: Vec<(String, String)> = out
            .stdout
            .split(|b| *b == 0)
            .filter_map(|kv| {
                let kv = String::from_utf8_lossy(kv);
                kv.split_once('=').map(|(k, v)| (k.to_string(), v.to_string()))
            })
            .collect();
        // The sandbox wrote this answer: what it can make the masker hold is bounded (found by a
        // review: 66 000 secret-named values).
        let mut room = ENV_SECRETS_MAX_BYTES;
        let secrets = pairs
            .iter()
            .filter(|(name, _)| crate::mask::is_secret_name(name))
            .take(ENV_SECRETS_MAX)
            .take_while(|(_, value)| room.checked_sub(value.len()).map(|left| room = left).is_some());
        let m = Masker::from_values(secrets.map(|(_, value)| value.as_str()));
        self.control.set_masker(sandbox_id, m.clone());
        Ok(m.merged(&extra_masker))
    }

    fn secret_values(&self) -> Vec<String> {
        self.control.tokens()
    }
}

/// What the model should know about an E2B sandbox.
fn about(network: bool) -> String {
    let network = if network { "It reaches the outside network." } else { "It has no outside network." };
    format!(
        "An E2B sandbox (a small VM of the template): commands run as the template's user, whose home /home/user is the default \
working directory; system paths need sudo. {network} Install packages with pip install --user NAME (or a venv), npm, or sudo apt-get."
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids() {
        assert!(check_e2b_id("i1a2b3c4d5e6f7g8h9j0").is_ok());
        for bad in ["", "../x", "a/b", "local-0123456789abcdef01234567", "x y"] {
            assert!(check_e2b_id(bad).is_err(), "{bad}");
        }
    }

    /// E2B has no per-sandbox disk argument: disk_mb is refused, with that reason, before any
    /// request is sent (the control plane here is an address nothing listens on).
    #[test]
    fn disk_mb_is_refused_with_the_reason() {
        let config = crate::config::E2bConfig {
            api_key: Some("e2b_test".into()),
            domain: "e2b.invalid".into(),
            api_url: Some("http://127.0.0.1:9".into()),
            sandbox_url: crate::provider::e2b::sandbox_url::SandboxUrl::Platform,
            connect_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(1),
        };
        let provider = E2bProvider::new(&config).unwrap();
        let req = CreateRequest {
            limits: crate::provider::Limits { disk_mb: Some(64), ..crate::provider::Limits::default() },
            ..CreateRequest::default()
        };
        let err = provider.create(&req, Instant::now() + Duration::from_secs(1)).unwrap_err().to_string();
        assert!(err.contains("no per-sandbox disk argument") && err.contains("leave disk_mb out"), "{err}");
    }

    /// A loopback server answering each of up to `n` connections with `answer`; how many
    /// connections it took.
    fn answering(answer: String, n: usize) -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let taken = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = taken.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().take(n).flatten() {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut conn = conn;
                let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
                let mut head = [0u8; 4096];
                let _ = conn.read(&mut head);
                let _ = conn.write_all(answer.as_bytes());
            }
        });
        (port, taken)
    }

    /// Neither envd's nor the control plane's redirect is followed: the place it names is never
    /// asked, and the error says what came (found by a review: a sandbox answering envd's
    /// requests made the server fetch host-side addresses with its access token, and a control
    /// plane's redirect carried the API key to any host).
    #[test]
    fn redirects_are_never_followed() {
        let (elsewhere, reached) = answering("HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecret".into(), 4);
        let redirect =
            |code: &str| format!("HTTP/1.1 {code}\r\nLocation: http://127.0.0.1:{elsewhere}/latest/meta-data\r\nContent-Length: 0\r\n\r\n");
        let (envd, _) = answering(redirect("302 Found"), 4);
        let (api, _) = answering(redirect("307 Temporary Redirect"), 4);
        let config = crate::config::E2bConfig {
            api_key: Some("e2b_test".into()),
            domain: "e2b.invalid".into(),
            api_url: Some(format!("http://127.0.0.1:{api}")),
            sandbox_url: sandbox_url::SandboxUrl::Fixed(format!("http://127.0.0.1:{envd}")),
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(5),
        };
        let p = E2bProvider::new(&config).unwrap();
        let known = control::Known { token: Some("t0123456".into()), ..control::Known::default() };
        let soon = || Instant::now() + Duration::from_secs(5);
        let read = p.envd.read_file(&p.control, "i1", &known, "notes.txt", 1 << 20, soon());
        assert!(read.as_ref().is_err_and(|e| e.to_string().contains("redirect")), "{read:?}");
        let listed = p.envd.list_dir(&p.control, "i1", &known, "/", 10, soon());
        assert!(listed.as_ref().is_err_and(|e| e.to_string().contains("redirect")), "{listed:?}");
        let info = p.info("i1", crate::provider::Touch::Observe, soon());
        assert!(info.is_err(), "{info:?}");
        assert_eq!(reached.load(std::sync::atomic::Ordering::SeqCst), 0, "a redirect was followed");
    }
}
