//! The e2b provider: E2B and E2B-compatible platforms (SPEC §5, `reference/e2b-protocol.md`).
//!
//! The control plane is REST (`X-API-KEY`); commands and files go to the sandbox's envd over
//! Connect RPC (JSON over HTTP/1.1, enveloped server streams for `process.Process/Start`) and
//! plain `/files`. One shared `ureq` agent, explicit timeouts, and HTTP status handled here
//! (ureq never turns a status into an error, so error bodies are kept).
//!
//! Round trips: ordinary tools renew the TTL through `connect` at most once per
//! [`RENEW_COALESCE`] per sandbox; task tools use the envd access token cached from an earlier
//! create/connect/info and only call `GET /sandboxes/{id}` when nothing is cached or a call
//! failed (to tell a paused sandbox from a missing one).

pub mod wire;

use crate::config::E2bConfig;
use crate::mask::Masker;
use crate::provider::{unix_now, CreateRequest, DirEntry, EntryKind, ExecOutput, ExecRequest, Provider, ProviderError, SandboxInfo, Touch};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};
use wire::{ProcessEvent, END_STREAM};

/// envd's port.
const ENVD_PORT: &str = "49983";

/// Domains whose envd is reached through the shared `sandbox.<domain>` host.
const SHARED_HOST_DOMAINS: &[&str] =
    &["e2b.app", "e2b.dev", "e2b.pro", "e2b-staging.dev", "e2b-tango.dev", "e2b-juliett.dev", "foxtrot-2.e2b.dev"];

/// Metadata key under which the sandbox's TTL is stored, so any server process renews it alike.
const TIMEOUT_KEY: &str = "sandbox_mcp_timeout";

/// A renewal by this process within this window is not repeated.
pub const RENEW_COALESCE: Duration = Duration::from_secs(30);

/// TTL used by connect when the sandbox's own is unknown (E2B's default).
const DEFAULT_TIMEOUT_S: u64 = 300;

/// What this process knows about one sandbox.
#[derive(Debug, Clone, Default)]
struct Known {
    token: Option<String>,
    domain: Option<String>,
    envd_version: String,
    timeout_s: Option<u64>,
    renewed: Option<Instant>,
    masker: Option<Masker>,
}

/// The provider.
pub struct E2bProvider {
    agent: ureq::Agent,
    api_url: String,
    sandbox_url: Option<String>,
    domain: String,
    api_key: String,
    request_timeout: Duration,
    known: Mutex<HashMap<String, Known>>,
}

/// A finished HTTP exchange: status and (bounded) body.
struct Reply {
    status: u16,
    body: Vec<u8>,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// The `message` of an error body, else the raw text.
    fn message(&self) -> String {
        let v = self.json();
        match v.get("message").and_then(Value::as_str) {
            Some(m) => m.to_string(),
            None => String::from_utf8_lossy(&self.body[..self.body.len().min(300)]).trim().to_string(),
        }
    }
}

/// Whether a transport error happened before the request could have reached the server.
fn before_sending(err: &ureq::Error) -> bool {
    use ureq::{Error, Timeout};
    matches!(err, Error::HostNotFound | Error::ConnectionFailed | Error::BadUri(_) | Error::Timeout(Timeout::Resolve | Timeout::Connect))
        || matches!(err, Error::Io(e) if e.kind() == std::io::ErrorKind::ConnectionRefused)
}

impl E2bProvider {
    /// Builds the provider from its configuration (no I/O).
    pub fn new(config: &E2bConfig) -> Result<E2bProvider, ProviderError> {
        let api_key = config.api_key.clone().ok_or_else(|| ProviderError::Unavailable("E2B_API_KEY is not set".into()))?;
        let agent_config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(config.connect_timeout))
            .timeout_global(Some(config.request_timeout))
            .user_agent(format!("sandbox-mcp/{}", env!("CARGO_PKG_VERSION")))
            .build();
        let domain = config.domain.clone();
        let api_url = config.api_url.clone().unwrap_or_else(|| format!("https://api.{domain}")).trim_end_matches('/').to_string();
        Ok(E2bProvider {
            agent: ureq::Agent::new_with_config(agent_config),
            api_url,
            sandbox_url: config.sandbox_url.as_ref().map(|u| u.trim_end_matches('/').to_string()),
            domain,
            api_key,
            request_timeout: config.request_timeout,
            known: Mutex::new(HashMap::new()),
        })
    }

    fn known(&self) -> MutexGuard<'_, HashMap<String, Known>> {
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn remember(&self, id: &str, sandbox: &Value) {
        let mut all = self.known();
        let k = all.entry(id.to_string()).or_default();
        if let Some(t) = sandbox.get("envdAccessToken").and_then(Value::as_str) {
            k.token = Some(t.to_string());
        }
        if let Some(d) = sandbox.get("domain").and_then(Value::as_str) {
            k.domain = Some(d.to_string());
        }
        if let Some(v) = sandbox.get("envdVersion").and_then(Value::as_str) {
            k.envd_version = v.to_string();
        }
        if let Some(t) = sandbox.get("metadata").and_then(|m| m.get(TIMEOUT_KEY)).and_then(Value::as_str).and_then(|t| t.parse().ok()) {
            k.timeout_s = Some(t);
        }
    }

    fn forget(&self, id: &str) {
        self.known().remove(id);
    }

    fn timeout_for(&self, deadline: Instant) -> Duration {
        self.request_timeout.min(deadline.saturating_duration_since(Instant::now())).max(Duration::from_millis(1))
    }

    /// One control-plane request.
    fn api(&self, method: &str, path: &str, body: Option<&Value>, deadline: Instant) -> Result<Reply, ProviderError> {
        let url = format!("{}{path}", self.api_url);
        let timeout = self.timeout_for(deadline);
        let what = format!("{method} {path}");
        let res = match method {
            "GET" => self.agent.get(&url).config().timeout_global(Some(timeout)).build().header("X-API-KEY", &self.api_key).call(),
            "DELETE" => self.agent.delete(&url).config().timeout_global(Some(timeout)).build().header("X-API-KEY", &self.api_key).call(),
            _ => {
                let payload = body.map(Value::to_string).unwrap_or_else(|| "{}".into());
                self.agent
                    .post(&url)
                    .config()
                    .timeout_global(Some(timeout))
                    .build()
                    .header("X-API-KEY", &self.api_key)
                    .header("Content-Type", "application/json")
                    .send(payload.as_bytes())
            }
        };
        let mut resp = res.map_err(|err| self.transport_error(&what, &err, timeout))?;
        let status = resp.status().as_u16();
        let mut body = Vec::new();
        resp.body_mut()
            .as_reader()
            .take(4 * 1024 * 1024)
            .read_to_end(&mut body)
            .map_err(|err| ProviderError::Unconfirmed { what: what.clone(), detail: format!("reading the answer failed: {err}") })?;
        Ok(Reply { status, body })
    }

    fn transport_error(&self, what: &str, err: &ureq::Error, timeout: Duration) -> ProviderError {
        if before_sending(err) {
            ProviderError::Unavailable(format!("cannot reach E2B for {what}: {err}; check the network and E2B_DOMAIN/E2B_API_URL"))
        } else if matches!(err, ureq::Error::Timeout(_)) {
            ProviderError::Timeout { what: what.to_string(), after: timeout }
        } else {
            ProviderError::Unconfirmed { what: what.to_string(), detail: err.to_string() }
        }
    }

    /// Maps a control-plane error status to a provider error.
    fn api_error(&self, id: Option<&str>, what: &str, reply: &Reply) -> ProviderError {
        let msg = reply.message();
        match reply.status {
            404 => match id {
                Some(id) => {
                    self.forget(id);
                    ProviderError::NotFound { id: id.to_string() }
                }
                None => ProviderError::Rejected(format!("E2B: {what} not found ({msg})")),
            },
            400 => ProviderError::Rejected(format!("E2B refused {what}: {msg}")),
            401 | 403 => ProviderError::Rejected(format!("E2B refused the API key ({}: {msg}); check E2B_API_KEY", reply.status)),
            409 => ProviderError::Rejected(format!("E2B: the sandbox is changing state ({msg}); retry in a few seconds")),
            429 => ProviderError::Rejected(format!("E2B rate limit or quota reached ({msg}); retry later or kill unused sandboxes")),
            s => ProviderError::Unavailable(format!("E2B answered {s} to {what} ({msg}); retry later")),
        }
    }

    /// `GET /sandboxes/{id}`: state, token, end time.
    fn detail(&self, id: &str, deadline: Instant) -> Result<Value, ProviderError> {
        let reply = self.api("GET", &format!("/sandboxes/{id}"), None, deadline)?;
        if reply.status != 200 {
            return Err(self.api_error(Some(id), "sandbox info", &reply));
        }
        let v = reply.json();
        self.remember(id, &v);
        if v.get("state").and_then(Value::as_str) == Some("paused") {
            return Err(ProviderError::Paused { id: id.to_string() });
        }
        Ok(v)
    }

    /// `connect`: resumes a paused sandbox and extends its TTL to at least now + its timeout.
    fn connect(&self, id: &str, deadline: Instant) -> Result<(), ProviderError> {
        // Bind first: a lock guard in the match scrutinee would live through the arms, and
        // `detail` locks again (a deadlock found by make bench).
        let cached = self.known().get(id).and_then(|k| k.timeout_s);
        let timeout_s = match cached {
            Some(t) => t,
            None => {
                // Learn the sandbox's own TTL once (stored in its metadata at create).
                match self.detail(id, deadline) {
                    Ok(_) | Err(ProviderError::Paused { .. }) => {}
                    Err(err) => return Err(err),
                }
                self.known().get(id).and_then(|k| k.timeout_s).unwrap_or(DEFAULT_TIMEOUT_S)
            }
        };
        let reply = self.api("POST", &format!("/sandboxes/{id}/connect"), Some(&json!({"timeout": timeout_s})), deadline)?;
        if !matches!(reply.status, 200 | 201) {
            return Err(self.api_error(Some(id), "connect", &reply));
        }
        self.remember(id, &reply.json());
        let mut all = self.known();
        let k = all.entry(id.to_string()).or_default();
        k.renewed = Some(Instant::now());
        k.timeout_s.get_or_insert(timeout_s);
        Ok(())
    }

    /// Makes sure the sandbox can be reached as `touch` says; returns its envd access.
    fn reach(&self, id: &str, touch: Touch, deadline: Instant) -> Result<Known, ProviderError> {
        self.check_id(id)?;
        let cached = self.known().get(id).cloned();
        match touch {
            Touch::Renew => {
                let fresh = cached.as_ref().and_then(|k| k.renewed).is_some_and(|t| t.elapsed() < RENEW_COALESCE);
                if !fresh {
                    self.connect(id, deadline)?;
                }
            }
            Touch::Observe => {
                if cached.as_ref().is_none_or(|k| k.token.is_none() && k.envd_version.is_empty()) {
                    self.detail(id, deadline)?;
                }
            }
        }
        Ok(self.known().get(id).cloned().unwrap_or_default())
    }

    /// After an envd failure: is the sandbox paused, gone, or just unreachable?
    fn explain(&self, id: &str, original: ProviderError, deadline: Instant) -> ProviderError {
        self.forget(id);
        match self.detail(id, deadline.max(Instant::now() + Duration::from_secs(5))) {
            Err(e @ (ProviderError::NotFound { .. } | ProviderError::Paused { .. })) => e,
            _ => original,
        }
    }

    fn envd_url(&self, id: &str, known: &Known) -> String {
        if let Some(u) = &self.sandbox_url {
            return u.clone();
        }
        let domain = known.domain.as_deref().unwrap_or(&self.domain);
        if SHARED_HOST_DOMAINS.contains(&domain) {
            format!("https://sandbox.{domain}")
        } else {
            format!("https://{ENVD_PORT}-{id}.{domain}")
        }
    }

    fn envd_get(&self, url: &str, id: &str, known: &Known, timeout: Duration) -> ureq::RequestBuilder<ureq::typestate::WithoutBody> {
        envd_headers(self.agent.get(url).config().timeout_global(Some(timeout)).build(), id, known)
    }

    fn envd_post(&self, url: &str, id: &str, known: &Known, timeout: Duration) -> ureq::RequestBuilder<ureq::typestate::WithBody> {
        envd_headers(self.agent.post(url).config().timeout_global(Some(timeout)).build(), id, known)
    }

    /// A unary Connect call to envd; returns the JSON answer.
    fn rpc(&self, id: &str, known: &Known, method: &str, body: &Value, deadline: Instant) -> Result<Value, ProviderError> {
        let url = format!("{}/{method}", self.envd_url(id, known));
        let timeout = self.timeout_for(deadline);
        let res = self
            .envd_post(&url, id, known, timeout)
            .header("Content-Type", "application/json")
            .header("Connect-Protocol-Version", "1")
            .header("Connect-Timeout-Ms", timeout.as_millis().to_string())
            .send(body.to_string().as_bytes());
        let mut resp = res.map_err(|err| self.transport_error(method, &err, timeout))?;
        let status = resp.status().as_u16();
        let mut buf = Vec::new();
        let _ = resp.body_mut().as_reader().take(16 * 1024 * 1024).read_to_end(&mut buf);
        let reply = Reply { status, body: buf };
        if status == 200 {
            return Ok(reply.json());
        }
        Err(self.envd_error(id, method, &reply, deadline))
    }

    /// Maps an envd (or edge proxy) error answer.
    fn envd_error(&self, id: &str, what: &str, reply: &Reply, deadline: Instant) -> ProviderError {
        let v = reply.json();
        let msg = reply.message();
        match v.get("code") {
            Some(Value::String(code)) => match code.as_str() {
                "not_found" | "invalid_argument" | "failed_precondition" | "already_exists" | "permission_denied" | "out_of_range" => {
                    ProviderError::Rejected(msg)
                }
                "unauthenticated" => self.explain(id, ProviderError::Rejected(format!("envd refused the access token ({msg})")), deadline),
                _ => self.explain(id, ProviderError::Unavailable(format!("envd failed {what}: {code}: {msg}")), deadline),
            },
            // Edge proxy (502 "The sandbox was not found") and other plain HTTP errors.
            _ => self.explain(
                id,
                ProviderError::Unavailable(format!("envd answered {} to {what} ({msg}); retry later", reply.status)),
                deadline,
            ),
        }
    }

    fn path_query(path: &str) -> String {
        let mut q = String::with_capacity(path.len() + 8);
        for b in path.bytes() {
            match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => q.push(b as char),
                _ => q.push_str(&format!("%{b:02X}")),
            }
        }
        q
    }

    fn check_path(path: &str) -> Result<(), ProviderError> {
        if path.is_empty() || path.contains('\0') {
            return Err(ProviderError::Rejected("path must be a non-empty string without NUL bytes".into()));
        }
        Ok(())
    }
}

/// The headers E2B's SDK sends on every envd request: edge routing, and the access token.
fn envd_headers<B>(rb: ureq::RequestBuilder<B>, id: &str, known: &Known) -> ureq::RequestBuilder<B> {
    let rb = rb.header("E2b-Sandbox-Id", id).header("E2b-Sandbox-Port", ENVD_PORT);
    match &known.token {
        Some(t) => rb.header("X-Access-Token", t),
        None => rb,
    }
}

/// Reads a Start stream to its end.
struct StreamResult {
    out: ExecOutput,
    started: bool,
    ended: bool,
    stream_error: Option<(String, String)>,
}

fn read_stream(reader: &mut impl Read, cap: usize) -> Result<StreamResult, String> {
    let mut r = StreamResult { out: ExecOutput::default(), started: false, ended: false, stream_error: None };
    loop {
        let frame = wire::read_envelope(reader, 8 * 1024 * 1024).map_err(|e| e.to_string())?;
        let Some((flags, payload)) = frame else { return Ok(r) };
        if flags & END_STREAM != 0 {
            let v: Value = serde_json::from_slice(&payload).unwrap_or(Value::Null);
            if let Some(err) = v.get("error") {
                let code = err.get("code").and_then(Value::as_str).unwrap_or("unknown").to_string();
                let message = err.get("message").and_then(Value::as_str).unwrap_or("").to_string();
                r.stream_error = Some((code, message));
            }
            return Ok(r);
        }
        match wire::process_event(&payload) {
            Some(ProcessEvent::Start(_)) => r.started = true,
            Some(ProcessEvent::Stdout(b)) => append(&mut r.out.stdout, &mut r.out.stdout_truncated, &b, cap),
            Some(ProcessEvent::Stderr(b)) => append(&mut r.out.stderr, &mut r.out.stderr_truncated, &b, cap),
            Some(ProcessEvent::End { exit_code, status }) => {
                r.ended = true;
                r.out.exit_code = wire::exit_code(exit_code, &status);
            }
            Some(ProcessEvent::Other) => {}
            None => return Err("an unreadable event".into()),
        }
    }
}

fn append(buf: &mut Vec<u8>, truncated: &mut bool, data: &[u8], cap: usize) {
    let room = cap.saturating_sub(buf.len());
    buf.extend_from_slice(&data[..data.len().min(room)]);
    *truncated |= data.len() > room;
}

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
        let mut metadata = req.metadata.clone();
        metadata.insert(TIMEOUT_KEY.into(), req.timeout_s.to_string());
        let body = json!({
            "templateID": req.template,
            "timeout": req.timeout_s,
            "envVars": req.envs,
            "metadata": metadata,
            "secure": true,
            "allow_internet_access": true,
        });
        let reply = self.api("POST", "/sandboxes", Some(&body), deadline)?;
        if reply.status != 201 {
            if reply.status == 200 {
                return Err(ProviderError::Unavailable(
                    "E2B answered create with 200 instead of 201; the API is not E2B-compatible".into(),
                ));
            }
            return Err(self.api_error(None, &format!("creating a sandbox from template {:?}", req.template), &reply));
        }
        let v = reply.json();
        for field in ["sandboxID", "templateID", "clientID", "envdVersion"] {
            if v.get(field).and_then(Value::as_str).is_none() {
                return Err(ProviderError::Unavailable(format!("E2B's create answer lacks {field}; the API is not E2B-compatible")));
            }
        }
        let id = v["sandboxID"].as_str().unwrap_or_default().to_string();
        self.remember(&id, &v);
        {
            let mut all = self.known();
            let k = all.entry(id.clone()).or_default();
            k.timeout_s = Some(req.timeout_s);
            k.renewed = Some(Instant::now());
        }
        Ok(SandboxInfo { sandbox_id: id, template: req.template.clone(), expires_at: unix_now() + req.timeout_s as i64 })
    }

    fn kill(&self, sandbox_id: &str, deadline: Instant) -> Result<bool, ProviderError> {
        self.check_id(sandbox_id)?;
        let reply = self.api("DELETE", &format!("/sandboxes/{sandbox_id}"), None, deadline)?;
        self.forget(sandbox_id);
        match reply.status {
            200 | 204 => Ok(true),
            404 => Ok(false),
            _ => Err(self.api_error(None, "kill", &reply)),
        }
    }

    fn info(&self, sandbox_id: &str, touch: Touch, deadline: Instant) -> Result<SandboxInfo, ProviderError> {
        self.check_id(sandbox_id)?;
        if touch == Touch::Renew {
            self.connect(sandbox_id, deadline)?;
        }
        let v = self.detail(sandbox_id, deadline)?;
        Ok(SandboxInfo {
            sandbox_id: sandbox_id.to_string(),
            template: v.get("templateID").and_then(Value::as_str).unwrap_or("").to_string(),
            expires_at: v.get("endAt").and_then(Value::as_str).and_then(wire::rfc3339).unwrap_or(0),
        })
    }

    fn set_timeout(&self, sandbox_id: &str, timeout_s: u64, deadline: Instant) -> Result<SandboxInfo, ProviderError> {
        self.check_id(sandbox_id)?;
        let reply = self.api("POST", &format!("/sandboxes/{sandbox_id}/timeout"), Some(&json!({"timeout": timeout_s})), deadline)?;
        if !matches!(reply.status, 200 | 204) {
            return Err(self.api_error(Some(sandbox_id), "set timeout", &reply));
        }
        self.known().entry(sandbox_id.to_string()).or_default().timeout_s = Some(timeout_s);
        Ok(SandboxInfo { sandbox_id: sandbox_id.to_string(), template: String::new(), expires_at: unix_now() + timeout_s as i64 })
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
        let known = self.reach(sandbox_id, touch, req.deadline)?;
        let (cmd, args) = req.argv.split_first().ok_or_else(|| ProviderError::Rejected("empty command".into()))?;
        let mut process = json!({"cmd": cmd, "args": args});
        if !req.envs.is_empty() {
            process["envs"] = json!(req.envs);
        }
        if let Some(cwd) = &req.cwd {
            process["cwd"] = json!(cwd);
        }
        let body = wire::envelope(0, json!({"process": process, "stdin": false}).to_string().as_bytes());
        let lifetime = req.deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        // envd kills the process when Connect-Timeout-Ms elapses and then sends its end event:
        // give the HTTP exchange a margin beyond that.
        let http_timeout = lifetime + Duration::from_secs(10);
        let url = format!("{}/process.Process/Start", self.envd_url(sandbox_id, &known));
        let res = self
            .envd_post(&url, sandbox_id, &known, http_timeout)
            .header("Content-Type", "application/connect+json")
            .header("Connect-Protocol-Version", "1")
            .header("Connect-Content-Encoding", "identity")
            .header("Connect-Accept-Encoding", "identity")
            .header("Keepalive-Ping-Interval", "50")
            .header("Connect-Timeout-Ms", lifetime.as_millis().to_string())
            .send(&body[..]);
        let mut resp = match res {
            Ok(r) => r,
            Err(err) => {
                let e = self.transport_error("process start", &err, http_timeout);
                return Err(if before_sending(&err) { self.explain(sandbox_id, e, req.deadline) } else { e });
            }
        };
        let status = resp.status().as_u16();
        if status != 200 {
            let mut buf = Vec::new();
            let _ = resp.body_mut().as_reader().take(64 * 1024).read_to_end(&mut buf);
            return Err(self.envd_error(sandbox_id, "process start", &Reply { status, body: buf }, req.deadline));
        }
        let mut reader = resp.body_mut().as_reader();
        let result = read_stream(&mut reader, req.output_cap);
        // Read the reply to its end (the last chunk marker follows the end-stream frame) so that
        // ureq keeps the connection for the next call instead of opening a new one.
        let _ = std::io::copy(&mut reader.take(64 * 1024), &mut std::io::sink());
        let mut r = match result {
            Ok(r) => r,
            Err(detail) => {
                return Err(ProviderError::Unconfirmed { what: "the command".into(), detail: format!("the output stream broke: {detail}") })
            }
        };
        if let Some((code, message)) = r.stream_error.take() {
            // envd's request deadline (Connect-Timeout-Ms) fires just before it kills the process
            // and ends the stream without an end event: that is the command's timeout.
            if code == "deadline_exceeded" && r.started && !r.ended && Instant::now() + Duration::from_secs(1) >= req.deadline {
                r.out.exit_code = 128 + 9;
                r.out.timed_out = true;
                r.out.duration = started.elapsed();
                return Ok(r.out);
            }
            if !r.started {
                return Err(match code.as_str() {
                    "invalid_argument" | "not_found" | "failed_precondition" | "permission_denied" => ProviderError::Rejected(message),
                    _ => ProviderError::Unavailable(format!("envd could not start the command: {code}: {message}")),
                });
            }
            if !r.ended {
                return Err(ProviderError::Unconfirmed { what: "the command".into(), detail: format!("{code}: {message}") });
            }
        }
        if !r.ended {
            return Err(ProviderError::Unconfirmed { what: "the command".into(), detail: "the stream ended without an end event".into() });
        }
        r.out.timed_out = Instant::now() >= req.deadline && r.out.exit_code == 137;
        r.out.duration = started.elapsed();
        Ok(r.out)
    }

    fn read_file(&self, sandbox_id: &str, path: &str, max_bytes: usize, deadline: Instant) -> Result<Vec<u8>, ProviderError> {
        Self::check_path(path)?;
        let known = self.reach(sandbox_id, Touch::Renew, deadline)?;
        let url = format!("{}/files?path={}", self.envd_url(sandbox_id, &known), Self::path_query(path));
        let timeout = self.timeout_for(deadline);
        let res = self.envd_get(&url, sandbox_id, &known, timeout).header("Accept-Encoding", "identity").call();
        let mut resp = res.map_err(|err| self.transport_error("file read", &err, timeout))?;
        let status = resp.status().as_u16();
        let mut data = Vec::new();
        resp.body_mut()
            .as_reader()
            .take(max_bytes as u64 + 1)
            .read_to_end(&mut data)
            .map_err(|err| ProviderError::Unavailable(format!("reading {path:?} failed: {err}")))?;
        match status {
            200 if data.len() > max_bytes => Err(ProviderError::Rejected(format!(
                "{path:?} is over read_file's limit of {max_bytes} bytes; read parts of it with run_command (head, tail, dd)"
            ))),
            200 => Ok(data),
            404 => Err(ProviderError::Rejected(format!("{path:?} does not exist in the sandbox; check the path with list_files"))),
            400 => Err(ProviderError::Rejected(format!(
                "{path:?} cannot be read ({}); it may be a directory",
                Reply { status, body: data }.message()
            ))),
            _ => Err(self.envd_error(sandbox_id, "file read", &Reply { status, body: data }, deadline)),
        }
    }

    fn write_file(&self, sandbox_id: &str, path: &str, data: &[u8], deadline: Instant) -> Result<u64, ProviderError> {
        Self::check_path(path)?;
        let known = self.reach(sandbox_id, Touch::Renew, deadline)?;
        let url = format!("{}/files?path={}", self.envd_url(sandbox_id, &known), Self::path_query(path));
        let timeout = self.timeout_for(deadline);
        // Older envd (< 0.5.7) accepts only multipart uploads; every version accepts them.
        let boundary = format!("sandbox-mcp-{}", crate::ids::random_hex(12));
        let mut body = format!("--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"upload\"\r\nContent-Type: application/octet-stream\r\n\r\n").into_bytes();
        body.extend_from_slice(data);
        body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        let res = self
            .envd_post(&url, sandbox_id, &known, timeout)
            .header("Content-Type", &format!("multipart/form-data; boundary={boundary}"))
            .send(&body[..]);
        let mut resp = res.map_err(|err| self.transport_error("file write", &err, timeout))?;
        let status = resp.status().as_u16();
        let mut buf = Vec::new();
        let _ = resp.body_mut().as_reader().take(64 * 1024).read_to_end(&mut buf);
        match status {
            200 => Ok(data.len() as u64),
            400 => Err(ProviderError::Rejected(format!("{path:?} cannot be written ({})", Reply { status, body: buf }.message()))),
            507 => Err(ProviderError::Rejected("the sandbox's disk is full".into())),
            _ => Err(self.envd_error(sandbox_id, "file write", &Reply { status, body: buf }, deadline)),
        }
    }

    fn list_dir(
        &self,
        sandbox_id: &str,
        path: &str,
        max_entries: usize,
        deadline: Instant,
    ) -> Result<(Vec<DirEntry>, bool), ProviderError> {
        Self::check_path(path)?;
        let known = self.reach(sandbox_id, Touch::Renew, deadline)?;
        let v = self.rpc(sandbox_id, &known, "filesystem.Filesystem/ListDir", &json!({"path": path, "depth": 1}), deadline)?;
        let mut entries: Vec<DirEntry> = v
            .get("entries")
            .and_then(Value::as_array)
            .map(|a| a.as_slice())
            .unwrap_or_default()
            .iter()
            .map(|e| {
                let kind = match e.get("type").and_then(Value::as_str) {
                    Some("FILE_TYPE_FILE") => EntryKind::File,
                    Some("FILE_TYPE_DIRECTORY") => EntryKind::Dir,
                    Some("FILE_TYPE_SYMLINK") => EntryKind::Symlink,
                    _ => EntryKind::Other,
                };
                let size = match e.get("size") {
                    Some(Value::String(s)) => s.parse().unwrap_or(0),
                    Some(v) => v.as_u64().unwrap_or(0),
                    None => 0,
                };
                let name = e.get("name").and_then(Value::as_str).unwrap_or("").to_string();
                DirEntry { name, kind, size: if kind == EntryKind::Dir { 0 } else { size } }
            })
            .collect();
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        let truncated = entries.len() > max_entries;
        entries.truncate(max_entries);
        Ok((entries, truncated))
    }

    fn env_masker(&self, sandbox_id: &str, extra: &BTreeMap<String, String>) -> Result<Masker, ProviderError> {
        let extra_masker = Masker::from_env(extra.iter().map(|(a, b)| (a.as_str(), b.as_str())));
        if let Some(m) = self.known().get(sandbox_id).and_then(|k| k.masker.clone()) {
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
        let m = Masker::from_env(pairs.iter().map(|(a, b)| (a.as_str(), b.as_str())));
        self.known().entry(sandbox_id.to_string()).or_default().masker = Some(m.clone());
        Ok(m.merged(&extra_masker))
    }

    fn secret_values(&self) -> Vec<String> {
        self.known().values().filter_map(|k| k.token.clone()).collect()
    }
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

    #[test]
    fn file_paths_are_query_encoded() {
        assert_eq!(E2bProvider::path_query("/home/user/a b&c=d.txt"), "/home/user/a%20b%26c%3Dd.txt");
    }

    #[test]
    fn streams_are_read_to_their_end() {
        let mut s = wire::envelope(0, br#"{"event":{"start":{"pid":7}}}"#);
        s.extend(wire::envelope(0, br#"{"event":{"data":{"stdout":"aGVsbG8="}}}"#));
        s.extend(wire::envelope(0, br#"{"event":{"end":{"exitCode":3,"exited":true,"status":"exit status 3"}}}"#));
        s.extend(wire::envelope(END_STREAM, b"{}"));
        let r = read_stream(&mut &s[..], 3).unwrap();
        assert!(r.started && r.ended);
        assert_eq!((r.out.exit_code, r.out.stdout.as_slice(), r.out.stdout_truncated), (3, &b"hel"[..], true));
        let cut = &s[..s.len() - 20];
        assert!(read_stream(&mut &cut[..], 100).is_err());
    }
}
