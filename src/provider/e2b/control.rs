//! The E2B control plane: REST calls authenticated with the API key (`X-API-KEY`) that create,
//! inspect, connect to, re-time and kill sandboxes; their HTTP statuses as provider errors; and
//! what this process has learned about each sandbox (envd access token, domain, TTL, last
//! renewal, environment masker).
//!
//! Round trips: ordinary tools renew the TTL through `connect` at most once per
//! [`RENEW_COALESCE`] per sandbox; task tools use the envd access token cached from an earlier
//! create/connect/info and only call `GET /sandboxes/{id}` when nothing is cached or a call
//! failed (to tell a paused sandbox from a missing one).

use super::loose;
use super::reply::{self, Reply};
use crate::egress::Network;
use crate::mask::Masker;
use crate::provider::{unix_now, CreateRequest, Limits, ProviderError, SandboxInfo, Touch};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::Read;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// What `create_sandbox` reports as an E2B sandbox's isolation: the platform's own.
const ISOLATION: &str = "e2b";

/// Metadata key under which the sandbox's TTL is stored, so any server process renews it alike.
/// [`Metadata`] reads the same key.
const TIMEOUT_KEY: &str = "sandbox_mcp_timeout";

/// A renewal by this process within this window is not repeated.
pub const RENEW_COALESCE: Duration = Duration::from_secs(30);

/// TTL used by connect when the sandbox's own is unknown (E2B's default).
const DEFAULT_TIMEOUT_S: u64 = 300;

/// Largest control-plane answer read.
const MAX_ANSWER: u64 = 4 * 1024 * 1024;

/// What this process knows about one sandbox.
#[derive(Debug, Clone, Default)]
pub(super) struct Known {
    /// envd access token (sent as `X-Access-Token`).
    pub token: Option<String>,
    /// The domain the sandbox runs under, when E2B said.
    pub domain: Option<String>,
    /// envd's version; empty when unknown.
    pub envd_version: String,
    /// The sandbox's TTL in seconds.
    pub timeout_s: Option<u64>,
    /// When this process last renewed the TTL.
    pub renewed: Option<Instant>,
    /// When the sandbox expires (Unix seconds), as last learned or set by this process.
    pub expires_at: Option<i64>,
    /// Masker of the sandbox's environment, once read.
    pub masker: Option<Masker>,
}

/// A sandbox as the control plane describes it (answers of create, connect and
/// `GET /sandboxes/{id}`). Every field is optional; unknown fields are ignored.
#[derive(Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
struct SandboxReply {
    #[serde(rename = "sandboxID", deserialize_with = "loose::string")]
    sandbox_id: Option<String>,
    #[serde(rename = "templateID", deserialize_with = "loose::string")]
    template_id: Option<String>,
    #[serde(rename = "clientID", deserialize_with = "loose::string")]
    client_id: Option<String>,
    #[serde(rename = "envdVersion", deserialize_with = "loose::string")]
    envd_version: Option<String>,
    #[serde(rename = "envdAccessToken", deserialize_with = "loose::string")]
    envd_access_token: Option<String>,
    #[serde(deserialize_with = "loose::string")]
    domain: Option<String>,
    /// `running` or `paused`.
    #[serde(deserialize_with = "loose::string")]
    state: Option<String>,
    /// When E2B will end the sandbox (RFC 3339).
    #[serde(rename = "endAt", deserialize_with = "loose::string")]
    end_at: Option<String>,
    #[serde(deserialize_with = "loose::object")]
    metadata: Metadata,
}

/// The sandbox metadata this server reads back.
#[derive(Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
struct Metadata {
    /// The TTL stored under [`TIMEOUT_KEY`] at create, in seconds as text.
    #[serde(rename = "sandbox_mcp_timeout", deserialize_with = "loose::string")]
    timeout: Option<String>,
}

impl SandboxReply {
    /// The fields a create answer must carry, with their names on the wire.
    fn required(&self) -> [(&'static str, &Option<String>); 4] {
        [
            ("sandboxID", &self.sandbox_id),
            ("templateID", &self.template_id),
            ("clientID", &self.client_id),
            ("envdVersion", &self.envd_version),
        ]
    }
}

/// The control-plane client and the per-sandbox cache.
pub(super) struct ControlPlane {
    agent: ureq::Agent,
    api_url: String,
    api_key: String,
    request_timeout: Duration,
    known: Mutex<HashMap<String, Known>>,
}

impl ControlPlane {
    /// A client of `api_url` (no trailing slash) sharing `agent`'s connections.
    pub fn new(agent: ureq::Agent, api_url: String, api_key: String, request_timeout: Duration) -> ControlPlane {
        ControlPlane { agent, api_url, api_key, request_timeout, known: Mutex::new(HashMap::new()) }
    }

    fn known(&self) -> MutexGuard<'_, HashMap<String, Known>> {
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn remember(&self, id: &str, sandbox: &SandboxReply) {
        let mut all = self.known();
        let k = all.entry(id.to_string()).or_default();
        if let Some(t) = &sandbox.envd_access_token {
            k.token = Some(t.clone());
        }
        if let Some(d) = &sandbox.domain {
            k.domain = Some(d.clone());
        }
        if let Some(v) = &sandbox.envd_version {
            k.envd_version = v.clone();
        }
        if let Some(t) = sandbox.metadata.timeout.as_deref().and_then(|t| t.parse().ok()) {
            k.timeout_s = Some(t);
        }
        if let Some(at) = sandbox.end_at.as_deref().and_then(super::wire::rfc3339) {
            k.expires_at = Some(at);
        }
    }

    /// When the sandbox expires, as this process last learned or set it (no request).
    pub fn expires_at(&self, id: &str) -> Option<i64> {
        self.known().get(id).and_then(|k| k.expires_at)
    }

    /// Drops everything known about a sandbox (it is gone, or its access must be re-learned).
    pub fn forget(&self, id: &str) {
        self.known().remove(id);
    }

    /// The masker of a sandbox's environment, when already read.
    pub fn masker(&self, id: &str) -> Option<Masker> {
        self.known().get(id).and_then(|k| k.masker.clone())
    }

    /// Keeps the masker of a sandbox's environment.
    pub fn set_masker(&self, id: &str, masker: Masker) {
        self.known().entry(id.to_string()).or_default().masker = Some(masker);
    }

    /// Every envd access token held now.
    pub fn tokens(&self) -> Vec<String> {
        self.known().values().filter_map(|k| k.token.clone()).collect()
    }

    /// One control-plane request.
    fn api(&self, method: &str, path: &str, body: Option<&Value>, deadline: Instant) -> Result<Reply, ProviderError> {
        let url = format!("{}{path}", self.api_url);
        let timeout = reply::timeout_for(self.request_timeout, deadline);
        let what = format!("{method} {path}");
        let res = match method {
            "GET" => self.agent.get(&url).config().timeout_global(Some(timeout)).build().header("X-API-KEY", &self.api_key).call(),
            "DELETE" => self.agent.delete(&url).config().timeout_global(Some(timeout)).build().header("X-API-KEY", &self.api_key).call(),
            // PUT and POST carry the same JSON body.
            _ => {
                let payload = body.map(Value::to_string).unwrap_or_else(|| "{}".into());
                let request = if method == "PUT" { self.agent.put(&url) } else { self.agent.post(&url) };
                request
                    .config()
                    .timeout_global(Some(timeout))
                    .build()
                    .header("X-API-KEY", &self.api_key)
                    .header("Content-Type", "application/json")
                    .send(payload.as_bytes())
            }
        };
        let mut resp = res.map_err(|err| reply::transport_error(&what, &err, timeout))?;
        let status = resp.status().as_u16();
        let mut body = Vec::new();
        resp.body_mut()
            .as_reader()
            .take(MAX_ANSWER)
            .read_to_end(&mut body)
            .map_err(|err| ProviderError::Unconfirmed { what: what.clone(), detail: format!("reading the answer failed: {err}") })?;
        Ok(Reply { status, body })
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
    fn detail(&self, id: &str, deadline: Instant) -> Result<SandboxReply, ProviderError> {
        let reply = self.api("GET", &format!("/sandboxes/{id}"), None, deadline)?;
        if reply.status != 200 {
            return Err(self.api_error(Some(id), "sandbox info", &reply));
        }
        let sandbox: SandboxReply = loose::parse(&reply.body);
        self.remember(id, &sandbox);
        if sandbox.state.as_deref() == Some("paused") {
            return Err(ProviderError::Paused { id: id.to_string() });
        }
        Ok(sandbox)
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
        let sandbox: SandboxReply = loose::parse(&reply.body);
        self.remember(id, &sandbox);
        let mut all = self.known();
        let k = all.entry(id.to_string()).or_default();
        k.renewed = Some(Instant::now());
        k.timeout_s.get_or_insert(timeout_s);
        if sandbox.end_at.is_none() {
            // The TTL is now at least the timeout from now.
            let renewed = unix_now() + timeout_s as i64;
            k.expires_at = Some(k.expires_at.map_or(renewed, |at| at.max(renewed)));
        }
        Ok(())
    }

    /// Makes sure the sandbox (whose id the caller checked) can be reached as `touch` says;
    /// returns its envd access.
    pub fn reach(&self, id: &str, touch: Touch, deadline: Instant) -> Result<Known, ProviderError> {
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

    /// After an envd failure: is the sandbox paused, gone, or just unreachable? Returns
    /// `NotFound` or `Paused` when the control plane says so, else `original`.
    pub fn explain(&self, id: &str, original: ProviderError, deadline: Instant) -> ProviderError {
        self.forget(id);
        match self.detail(id, deadline.max(Instant::now() + Duration::from_secs(5))) {
            Err(e @ (ProviderError::NotFound { .. } | ProviderError::Paused { .. })) => e,
            _ => original,
        }
    }

    /// `POST /sandboxes`.
    pub fn create(&self, req: &CreateRequest, deadline: Instant) -> Result<SandboxInfo, ProviderError> {
        let mut metadata = req.metadata.clone();
        metadata.insert(TIMEOUT_KEY.into(), req.timeout_s.to_string());
        let (internet, network) = super::egress::create_fields(req.network.as_ref())?;
        let mut body = json!({
            "templateID": req.template,
            "timeout": req.timeout_s,
            "envVars": req.envs,
            "metadata": metadata,
            "secure": true,
            "allow_internet_access": internet,
        });
        if let Some(network) = network {
            body["network"] = network;
        }
        let reply = self.api("POST", "/sandboxes", Some(&body), deadline)?;
        if reply.status != 201 {
            if reply.status == 200 {
                return Err(ProviderError::Unavailable(
                    "E2B answered create with 200 instead of 201; the API is not E2B-compatible".into(),
                ));
            }
            return Err(self.api_error(None, &format!("creating a sandbox from template {:?}", req.template), &reply));
        }
        let sandbox: SandboxReply = loose::parse(&reply.body);
        if let Some((field, _)) = sandbox.required().into_iter().find(|(_, value)| value.is_none()) {
            return Err(ProviderError::Unavailable(format!("E2B's create answer lacks {field}; the API is not E2B-compatible")));
        }
        let id = sandbox.sandbox_id.clone().unwrap_or_default();
        self.remember(&id, &sandbox);
        {
            let mut all = self.known();
            let k = all.entry(id.clone()).or_default();
            k.timeout_s = Some(req.timeout_s);
            k.renewed = Some(Instant::now());
            k.expires_at = Some(unix_now() + req.timeout_s as i64);
        }
        Ok(SandboxInfo {
            sandbox_id: id,
            template: req.template.clone(),
            expires_at: unix_now() + req.timeout_s as i64,
            isolation: ISOLATION,
            layers: Vec::new(),
            network: req.network.clone().unwrap_or(Network::Any),
            limits: Limits::default(),
        })
    }

    /// `DELETE /sandboxes/{id}`: `Ok(false)` when it was already gone.
    pub fn kill(&self, id: &str, deadline: Instant) -> Result<bool, ProviderError> {
        let reply = self.api("DELETE", &format!("/sandboxes/{id}"), None, deadline)?;
        self.forget(id);
        match reply.status {
            200 | 204 => Ok(true),
            404 => Ok(false),
            _ => Err(self.api_error(None, "kill", &reply)),
        }
    }

    /// Renews the TTL when `touch` says so, then reads the sandbox's template and end time.
    pub fn info(&self, id: &str, touch: Touch, deadline: Instant) -> Result<SandboxInfo, ProviderError> {
        if touch == Touch::Renew {
            self.connect(id, deadline)?;
        }
        let sandbox = self.detail(id, deadline)?;
        Ok(SandboxInfo {
            sandbox_id: id.to_string(),
            template: sandbox.template_id.unwrap_or_default(),
            expires_at: sandbox.end_at.as_deref().and_then(super::wire::rfc3339).unwrap_or(0),
            isolation: ISOLATION,
            layers: Vec::new(),
            network: Network::Any,
            limits: Limits::default(),
        })
    }

    /// `PUT /sandboxes/{id}/network`: the egress rules become those of `network`.
    pub fn set_network(&self, id: &str, network: &Network, deadline: Instant) -> Result<SandboxInfo, ProviderError> {
        let body = super::egress::rules(network)?;
        let reply = self.api("PUT", &format!("/sandboxes/{id}/network"), Some(&body), deadline)?;
        if !matches!(reply.status, 200 | 204) {
            return Err(self.api_error(Some(id), "set network", &reply));
        }
        let expires_at = self.known().get(id).and_then(|k| k.expires_at).unwrap_or(0);
        Ok(SandboxInfo {
            sandbox_id: id.to_string(),
            template: String::new(),
            expires_at,
            isolation: ISOLATION,
            layers: Vec::new(),
            network: network.clone(),
            limits: Limits::default(),
        })
    }

    /// `POST /sandboxes/{id}/timeout`: the TTL becomes `timeout_s` from now.
    pub fn set_timeout(&self, id: &str, timeout_s: u64, deadline: Instant) -> Result<SandboxInfo, ProviderError> {
        let reply = self.api("POST", &format!("/sandboxes/{id}/timeout"), Some(&json!({"timeout": timeout_s})), deadline)?;
        if !matches!(reply.status, 200 | 204) {
            return Err(self.api_error(Some(id), "set timeout", &reply));
        }
        {
            let mut all = self.known();
            let k = all.entry(id.to_string()).or_default();
            k.timeout_s = Some(timeout_s);
            k.expires_at = Some(unix_now() + timeout_s as i64);
        }
        Ok(SandboxInfo {
            sandbox_id: id.to_string(),
            template: String::new(),
            expires_at: unix_now() + timeout_s as i64,
            isolation: ISOLATION,
            layers: Vec::new(),
            network: Network::Any,
            limits: Limits::default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minimal_create_answer() {
        let s: SandboxReply = loose::parse(br#"{"sandboxID":"i1a2b3","templateID":"base","clientID":"c0","envdVersion":"0.2.0"}"#);
        assert!(s.required().iter().all(|(_, v)| v.is_some()));
        assert_eq!((s.sandbox_id.as_deref(), s.envd_version.as_deref()), (Some("i1a2b3"), Some("0.2.0")));
        assert_eq!((s.envd_access_token, s.domain, s.state, s.end_at), (None, None, None, None));
        assert_eq!(s.metadata, Metadata::default());
    }

    #[test]
    fn a_full_info_answer_with_extra_fields() {
        let s: SandboxReply = loose::parse(
            br#"{"sandboxID":"i1a2b3","templateID":"base","alias":"base","clientID":"c0","envdVersion":"0.5.7",
                "envdAccessToken":"tok","domain":"e2b.app","state":"paused","startedAt":"2026-12-02T16:35:18Z",
                "endAt":"2026-12-02T16:40:18Z","cpuCount":2,"memoryMB":512,
                "metadata":{"sandbox_mcp_timeout":"600","owner":"me"}}"#,
        );
        assert_eq!(s.envd_access_token.as_deref(), Some("tok"));
        assert_eq!(s.domain.as_deref(), Some("e2b.app"));
        assert_eq!(s.state.as_deref(), Some("paused"));
        assert_eq!(s.end_at.as_deref().and_then(super::super::wire::rfc3339), Some(1_796_229_618));
        assert_eq!(s.metadata.timeout.as_deref(), Some("600"));
    }

    #[test]
    fn create_answers_name_the_first_missing_field() {
        let s: SandboxReply = loose::parse(br#"{"sandboxID":"i1","templateID":"base","clientID":7,"envdVersion":"0.2.0"}"#);
        assert_eq!(s.required().into_iter().find(|(_, v)| v.is_none()).map(|(f, _)| f), Some("clientID"));
        let s: SandboxReply = loose::parse(b"[]");
        assert_eq!(s.required().into_iter().find(|(_, v)| v.is_none()).map(|(f, _)| f), Some("sandboxID"));
    }

    #[test]
    fn the_ttl_is_read_back_from_metadata() {
        let control = ControlPlane::new(ureq::Agent::new_with_defaults(), "http://127.0.0.1:9".into(), "k".into(), Duration::from_secs(1));
        control.remember("a", &loose::parse(br#"{"metadata":{"sandbox_mcp_timeout":"900"},"envdAccessToken":"t"}"#));
        control.remember("a", &loose::parse(br#"{"metadata":{"sandbox_mcp_timeout":"soon"}}"#));
        let known = control.known().get("a").cloned().unwrap_or_default();
        assert_eq!((known.timeout_s, known.token.as_deref()), (Some(900), Some("t")));
        assert_eq!(TIMEOUT_KEY, "sandbox_mcp_timeout", "Metadata's serde name must stay the key create writes");
        assert_eq!(control.tokens(), vec!["t".to_string()]);
    }
}
