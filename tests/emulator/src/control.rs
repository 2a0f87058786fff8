//! The emulated E2B control plane: the sandbox registry (E2B id → local sandbox, access token,
//! paused state, processes) and the REST endpoints that create, inspect, list, time out,
//! connect, pause, resume and kill sandboxes.
//!
//! The TTL lives in the local provider's metadata (its keeper ends the sandbox at expiry); a
//! paused sandbox gets a long local TTL so that it does not expire, and its processes are
//! stopped with SIGSTOP until it is resumed.

use super::freezer::{self, Freeze};
use super::http::{self, HttpReply, HttpRequest};
use super::process::ProcessTable;
use super::State;
use sandbox_mcp::egress::Network;
use sandbox_mcp::ids;
use sandbox_mcp::provider::local::isolation::Isolation;
use sandbox_mcp::provider::{unix_now, CreateRequest, Provider, ProviderError, SandboxInfo, Touch};
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The envd version reported for every sandbox.
pub const ENVD_VERSION: &str = "0.6.13";

/// The `clientID` E2B reports (a fixed legacy value).
pub const CLIENT_ID: &str = "6532622b";

/// The only template.
pub const TEMPLATE: &str = "base";

/// Longest TTL, in seconds (E2B's 24 h maximum).
pub const MAX_TIMEOUT_S: i64 = 86_400;

/// Local TTL of a paused sandbox (it must outlive any test run).
const PAUSED_TTL_S: u64 = 30 * 86_400;

/// How long local kills may take.
const KILL_BUDGET: Duration = Duration::from_secs(5);

/// One emulated sandbox.
pub struct Sandbox {
    /// The E2B-style id (`i` and 19 lowercase letters or digits).
    pub id: String,
    /// The local provider's id.
    pub local_id: String,
    /// The envd access token.
    pub token: String,
    /// Unix seconds.
    pub started_at: i64,
    /// Labels given at create.
    pub metadata: BTreeMap<String, String>,
    /// Processes started through envd.
    pub procs: ProcessTable,
    /// `Some(end_at)` while paused: the end time it had when it was paused.
    paused: Mutex<Option<i64>>,
}

impl Sandbox {
    /// The message streams get when the sandbox goes away under them (the edge proxy's words).
    pub fn gone_message(&self) -> String {
        format!("the connection to sandbox {} ended before the stream completed", self.id)
    }

    fn paused(&self) -> Option<i64> {
        self.paused.lock().map(|p| *p).unwrap_or(None)
    }

    fn set_paused(&self, value: Option<i64>) {
        if let Ok(mut p) = self.paused.lock() {
            *p = value;
        }
    }
}

/// What a lookup found.
pub enum Found {
    /// Running, with what the local provider reports of it (its end time).
    Running(Arc<Sandbox>, SandboxInfo),
    /// Paused; the end time it had when paused.
    Paused(Arc<Sandbox>, i64),
    /// Never existed, killed, or expired.
    Missing,
}

/// Every sandbox this emulator created and has not seen end.
#[derive(Default)]
pub struct Registry {
    map: Mutex<HashMap<String, Arc<Sandbox>>>,
}

impl Registry {
    fn get(&self, id: &str) -> Option<Arc<Sandbox>> {
        self.map.lock().ok()?.get(id).cloned()
    }

    fn insert(&self, sb: Arc<Sandbox>) {
        if let Ok(mut m) = self.map.lock() {
            m.insert(sb.id.clone(), sb);
        }
    }

    fn remove(&self, id: &str) -> Option<Arc<Sandbox>> {
        self.map.lock().ok()?.remove(id)
    }

    /// Every id.
    pub fn ids(&self) -> Vec<String> {
        self.map.lock().map(|m| m.keys().cloned().collect()).unwrap_or_default()
    }
}

impl State {
    /// Finds a sandbox and its state; an expired or vanished one is cleaned up and reported missing.
    pub fn lookup(&self, id: &str) -> Found {
        let Some(sb) = self.sandboxes.get(id) else { return Found::Missing };
        // The local provider reports an expired sandbox as not found (and kills it).
        match self.provider.info(&sb.local_id, Touch::Observe, Instant::now() + KILL_BUDGET) {
            Ok(info) => {
                if let Some(end_at) = sb.paused() {
                    return Found::Paused(sb, end_at);
                }
                if info.expires_at > unix_now() {
                    return Found::Running(sb, info);
                }
                self.end_sandbox(&sb);
                Found::Missing
            }
            Err(ProviderError::NotFound { .. }) => {
                self.end_sandbox(&sb);
                Found::Missing
            }
            Err(err) => {
                log::warn!("sandbox {id}: {err}");
                Found::Missing
            }
        }
    }

    /// Ends a sandbox: detaches its streams, kills it locally, forgets it.
    pub fn end_sandbox(&self, sb: &Sandbox) {
        sb.procs.disconnect_all(&sb.gone_message());
        if let Err(err) = self.provider.kill(&sb.local_id, Instant::now() + KILL_BUDGET) {
            log::warn!("killing local sandbox {} of {}: {err}", sb.local_id, sb.id);
        }
        self.sandboxes.remove(&sb.id);
    }

    /// Kills every sandbox (shutdown).
    pub fn end_all(&self) {
        for id in self.sandboxes.ids() {
            if let Some(sb) = self.sandboxes.get(&id) {
                self.end_sandbox(&sb);
            }
        }
    }
}

/// An E2B error body: `{"code": status, "message": ...}`.
pub fn error(status: u16, message: impl Into<String>) -> HttpReply {
    HttpReply::json(status, &json!({ "code": status, "message": message.into() }))
}

fn not_found(id: &str) -> HttpReply {
    error(404, format!("Sandbox \"{id}\" doesn't exist or you don't have access to it"))
}

/// Answers one control-plane request (the API key was already checked).
pub fn handle(state: &State, req: &HttpRequest) -> HttpReply {
    let segs: Vec<&str> = req.path.trim_start_matches('/').split('/').collect();
    let m = req.method.as_str();
    match (m, segs.as_slice()) {
        ("POST", ["sandboxes"]) => create(state, req, false),
        ("POST", ["v2", "sandboxes"]) => create(state, req, true),
        ("GET", ["sandboxes"]) => list(state, req, false),
        ("GET", ["v2", "sandboxes"]) => list(state, req, true),
        ("GET", ["sandboxes", id]) => get(state, id),
        ("DELETE", ["sandboxes", id]) => kill(state, id),
        ("POST", ["sandboxes", id, "timeout"]) => set_timeout(state, id, req),
        ("PUT", ["sandboxes", id, "network"]) => set_network(state, id, req),
        ("POST", ["sandboxes", id, "connect"]) | ("POST", ["v2", "sandboxes", id, "connect"]) => connect(state, id, req),
        ("POST", ["sandboxes", id, "pause"]) => pause(state, id),
        ("POST", ["sandboxes", id, "resume"]) => resume(state, id, req),
        (_, ["sandboxes", ..]) | (_, ["v2", "sandboxes", ..]) => error(405, format!("{m} is not allowed on {}", req.path)),
        _ => error(404, format!("no route for {m} {}", req.path)),
    }
}

/// Whether a path belongs to the control plane.
pub fn is_control_path(path: &str) -> bool {
    path == "/sandboxes" || path.starts_with("/sandboxes/") || path == "/v2/sandboxes" || path.starts_with("/v2/sandboxes/")
}

fn body_object(req: &HttpRequest) -> Result<Map<String, Value>, HttpReply> {
    if req.body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    match serde_json::from_slice::<Value>(&req.body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(error(400, "request body must be a JSON object")),
        Err(e) => Err(error(400, format!("request body is not valid JSON: {e}"))),
    }
}

/// Reads an optional integer field.
fn int_field(body: &Map<String, Value>, name: &str) -> Result<Option<i64>, HttpReply> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_i64().map(Some).ok_or_else(|| error(400, format!("{name} must be an integer"))),
    }
}

fn string_map(body: &Map<String, Value>, name: &str) -> Result<BTreeMap<String, String>, HttpReply> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(BTreeMap::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())).ok_or_else(|| error(400, format!("{name}.{k} must be a string"))))
            .collect(),
        Some(_) => Err(error(400, format!("{name} must be an object of strings"))),
    }
}

/// A new E2B-style sandbox id: `i` and 19 lowercase letters or digits.
pub fn new_sandbox_id() -> String {
    const ALPHABET: &[u8; 36] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let hex = ids::random_hex(19);
    let mut id = String::with_capacity(20);
    id.push('i');
    for pair in hex.as_bytes().chunks(2) {
        let byte = std::str::from_utf8(pair).ok().and_then(|p| u8::from_str_radix(p, 16).ok()).unwrap_or(0);
        id.push(ALPHABET[byte as usize % 36] as char);
    }
    id
}

fn create(state: &State, req: &HttpRequest, v2: bool) -> HttpReply {
    let body = match body_object(req) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let template = match body.get("templateID") {
        Some(Value::String(t)) => t.clone(),
        _ => return error(400, "templateID is required"),
    };
    if template != TEMPLATE {
        return error(400, format!("template '{template}' not found; this emulator only has the '{TEMPLATE}' template"));
    }
    // v2 documents 300 s when omitted; the old endpoint's server default is 15 s.
    let timeout = match int_field(&body, "timeout") {
        Ok(t) => t.unwrap_or(if v2 { 300 } else { 15 }),
        Err(r) => return r,
    };
    if timeout <= 0 {
        return error(400, "Timeout must be greater than 0");
    }
    if timeout > MAX_TIMEOUT_S {
        return error(400, format!("Timeout cannot be greater than {} hours", MAX_TIMEOUT_S / 3600));
    }
    let (metadata, env_vars) = match (string_map(&body, "metadata"), string_map(&body, "envVars")) {
        (Ok(m), Ok(e)) => (m, e),
        (Err(r), _) | (_, Err(r)) => return r,
    };
    // The egress rules, enforced by the local sandbox's proxy (namespaces only).
    let internet = match body.get("allow_internet_access") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(_) => return error(400, "allow_internet_access must be a boolean"),
    };
    let network = match sandbox_mcp::provider::e2b::egress::from_e2b(internet, body.get("network")) {
        Ok(n) => n,
        Err(why) => return error(400, why),
    };
    let network = match (state.provider.isolation(), network) {
        // Without isolation a sandbox has the host's network; it cannot enforce anything else.
        (Isolation::None, Network::Any) => None,
        (Isolation::None, _) => return error(400, "this emulator enforces egress rules only with --isolation namespaces"),
        (_, n) => Some(n),
    };
    let id = new_sandbox_id();
    // envd's environment order: user identity, then its globals and the create-time envVars
    // (request envs are added per command).
    let mut envs = BTreeMap::new();
    envs.insert("USER".to_string(), state.user.clone());
    envs.insert("LOGNAME".to_string(), state.user.clone());
    envs.insert("E2B_SANDBOX".to_string(), "true".to_string());
    envs.insert("E2B_SANDBOX_ID".to_string(), id.clone());
    envs.insert("E2B_TEMPLATE_ID".to_string(), template.clone());
    envs.extend(env_vars);
    let create = CreateRequest {
        template: template.clone(),
        timeout_s: timeout as u64,
        envs,
        metadata: metadata.clone(),
        network,
        ..CreateRequest::default()
    };
    let info = match state.provider.create(&create, Instant::now() + KILL_BUDGET) {
        Ok(info) => info,
        Err(ProviderError::Rejected(msg)) => return error(400, msg),
        Err(err) => return error(500, err.to_string()),
    };
    let sb = Arc::new(Sandbox {
        id,
        local_id: info.sandbox_id,
        token: ids::random_hex(32),
        started_at: unix_now(),
        metadata,
        procs: ProcessTable::default(),
        paused: Mutex::new(None),
    });
    state.sandboxes.insert(sb.clone());
    HttpReply::json(201, &sandbox_json(&sb))
}

/// The `Sandbox` object of create and connect.
fn sandbox_json(sb: &Sandbox) -> Value {
    json!({
        "templateID": TEMPLATE,
        "alias": TEMPLATE,
        "sandboxID": sb.id,
        "clientID": CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": sb.token,
        "domain": null,
    })
}

/// The `ListedSandbox` object; `SandboxDetail` adds the token and domain.
fn listed_json(sb: &Sandbox, end_at: i64, paused: bool) -> Value {
    json!({
        "templateID": TEMPLATE,
        "alias": TEMPLATE,
        "sandboxID": sb.id,
        "clientID": CLIENT_ID,
        "startedAt": rfc3339(sb.started_at, 0),
        "endAt": rfc3339(end_at, 0),
        "cpuCount": 2,
        "memoryMB": 512,
        "diskSizeMB": 1024,
        "metadata": sb.metadata,
        "state": if paused { "paused" } else { "running" },
        "envdVersion": ENVD_VERSION,
    })
}

fn get(state: &State, id: &str) -> HttpReply {
    let (sb, end_at, paused) = match state.lookup(id) {
        Found::Running(sb, info) => (sb, info.expires_at, false),
        Found::Paused(sb, end_at) => (sb, end_at, true),
        Found::Missing => return not_found(id),
    };
    let mut v = listed_json(&sb, end_at, paused);
    v["envdAccessToken"] = json!(sb.token);
    v["domain"] = Value::Null;
    HttpReply::json(200, &v)
}

fn list(state: &State, req: &HttpRequest, v2: bool) -> HttpReply {
    let mut want_running = !v2;
    let mut want_paused = false;
    let states: Vec<&str> = req.query.iter().filter(|(k, _)| k == "state").flat_map(|(_, v)| v.split(',')).collect();
    if v2 {
        if states.is_empty() {
            (want_running, want_paused) = (true, true);
        }
        for s in states {
            match s.trim() {
                "running" => want_running = true,
                "paused" => want_paused = true,
                other => return error(400, format!("unknown state {other:?}; use running or paused")),
            }
        }
    }
    let filter: Vec<(String, String)> = req.query("metadata").map(http::parse_query).unwrap_or_default();
    let mut rows: Vec<(i64, String, Value)> = Vec::new();
    for id in state.sandboxes.ids() {
        let (sb, end_at, paused) = match state.lookup(&id) {
            Found::Running(sb, info) => (sb, info.expires_at, false),
            Found::Paused(sb, end_at) => (sb, end_at, true),
            Found::Missing => continue,
        };
        if (paused && !want_paused) || (!paused && !want_running) {
            continue;
        }
        if !filter.iter().all(|(k, v)| sb.metadata.get(k) == Some(v)) {
            continue;
        }
        if req.query("template").is_some_and(|t| t != TEMPLATE) {
            continue;
        }
        rows.push((sb.started_at, sb.id.clone(), listed_json(&sb, end_at, paused)));
    }
    rows.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    if req.query("order") != Some("asc") {
        rows.reverse();
    }
    let limit = req.query("limit").and_then(|l| l.parse::<usize>().ok()).unwrap_or(usize::MAX);
    let running = rows.iter().filter(|r| r.2["state"] == "running").count();
    let out: Vec<Value> = rows.into_iter().take(limit).map(|r| r.2).collect();
    HttpReply::json(200, &Value::Array(out)).with_header("X-Total-Running", &running.to_string())
}

fn kill(state: &State, id: &str) -> HttpReply {
    match state.lookup(id) {
        Found::Running(sb, _) | Found::Paused(sb, _) => {
            state.end_sandbox(&sb);
            HttpReply::empty(204)
        }
        Found::Missing => not_found(id),
    }
}

fn timeout_arg(req: &HttpRequest, default: Option<i64>) -> Result<i64, HttpReply> {
    let body = body_object(req)?;
    let t = int_field(&body, "timeout")?;
    let t = t.or(default).ok_or_else(|| error(400, "timeout is required"))?;
    if t < 0 {
        return Err(error(400, "Timeout must be greater than or equal to 0"));
    }
    Ok(t.min(MAX_TIMEOUT_S))
}

fn set_timeout(state: &State, id: &str, req: &HttpRequest) -> HttpReply {
    let timeout = match timeout_arg(req, None) {
        Ok(t) => t,
        Err(r) => return r,
    };
    match state.lookup(id) {
        Found::Running(sb, _) => match state.provider.set_timeout(&sb.local_id, timeout as u64, Instant::now() + KILL_BUDGET) {
            Ok(_) => HttpReply::empty(204),
            Err(ProviderError::NotFound { .. }) => not_found(id),
            Err(err) => error(500, err.to_string()),
        },
        Found::Paused(..) => error(409, format!("Sandbox \"{id}\" is not running")),
        Found::Missing => not_found(id),
    }
}

/// `PUT /sandboxes/{id}/network`: replaces the egress rules (omitted fields clear them).
fn set_network(state: &State, id: &str, req: &HttpRequest) -> HttpReply {
    let body: Value = match serde_json::from_slice(&req.body) {
        Ok(v @ Value::Object(_)) => v,
        _ => return error(400, "the body must be a JSON object"),
    };
    let network = match sandbox_mcp::provider::e2b::egress::from_e2b(None, Some(&body)) {
        Ok(n) => n,
        Err(why) => return error(400, why),
    };
    match state.lookup(id) {
        Found::Running(sb, _) => match state.provider.set_network(&sb.local_id, &network, Instant::now() + KILL_BUDGET) {
            Ok(_) => HttpReply::empty(204),
            Err(ProviderError::NotFound { .. }) => not_found(id),
            Err(ProviderError::Rejected(msg)) => error(400, msg),
            Err(err) => error(500, err.to_string()),
        },
        Found::Paused(..) => error(409, format!("Sandbox \"{id}\" is not running")),
        Found::Missing => not_found(id),
    }
}

fn connect(state: &State, id: &str, req: &HttpRequest) -> HttpReply {
    let timeout = match timeout_arg(req, Some(300)) {
        Ok(t) => t,
        Err(r) => return r,
    };
    match state.lookup(id) {
        Found::Running(sb, info) => {
            // Connect only ever extends the TTL.
            if unix_now() + timeout > info.expires_at {
                if let Err(err) = state.provider.set_timeout(&sb.local_id, timeout as u64, Instant::now() + KILL_BUDGET) {
                    return error(500, err.to_string());
                }
            }
            HttpReply::json(200, &sandbox_json(&sb))
        }
        Found::Paused(sb, _) => match resume_paused(state, &sb, timeout) {
            Ok(()) => HttpReply::json(201, &sandbox_json(&sb)),
            Err(r) => r,
        },
        Found::Missing => not_found(id),
    }
}

fn resume_paused(state: &State, sb: &Sandbox, timeout: i64) -> Result<(), HttpReply> {
    state.provider.set_timeout(&sb.local_id, timeout as u64, Instant::now() + KILL_BUDGET).map_err(|e| error(500, e.to_string()))?;
    if let Err(err) = freezer::freeze(&state.shell, &sb.local_id, Freeze::Continue) {
        log::warn!("resuming the processes of {}: {err}", sb.id);
    }
    sb.set_paused(None);
    Ok(())
}

fn pause(state: &State, id: &str) -> HttpReply {
    match state.lookup(id) {
        Found::Running(sb, info) => {
            sb.set_paused(Some(info.expires_at));
            sb.procs.disconnect_all(&sb.gone_message());
            if let Err(err) = state.provider.set_timeout(&sb.local_id, PAUSED_TTL_S, Instant::now() + KILL_BUDGET) {
                sb.set_paused(None);
                return error(500, err.to_string());
            }
            if let Err(err) = freezer::freeze(&state.shell, &sb.local_id, Freeze::Stop) {
                log::warn!("stopping the processes of {id}: {err}");
            }
            HttpReply::empty(204)
        }
        Found::Paused(..) => error(409, format!("Sandbox \"{id}\" is already paused")),
        Found::Missing => not_found(id),
    }
}

fn resume(state: &State, id: &str, req: &HttpRequest) -> HttpReply {
    let timeout = match timeout_arg(req, Some(15)) {
        Ok(t) => t,
        Err(r) => return r,
    };
    match state.lookup(id) {
        Found::Paused(sb, _) => match resume_paused(state, &sb, timeout) {
            Ok(()) => HttpReply::json(201, &sandbox_json(&sb)),
            Err(r) => r,
        },
        Found::Running(..) => error(409, format!("Sandbox \"{id}\" is already running")),
        Found::Missing => not_found(id),
    }
}

/// RFC 3339 in UTC (`2026-01-02T03:04:05Z`, or with 3, 6 or 9 fractional digits like protobuf's
/// JSON timestamps when `nanos` is not zero).
pub fn rfc3339(secs: i64, nanos: u32) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, mo, d) = civil_from_days(days);
    let mut out = format!("{y:04}-{mo:02}-{d:02}T{:02}:{:02}:{:02}", rem / 3600, rem % 3600 / 60, rem % 60);
    if nanos != 0 {
        let frac = if nanos % 1_000_000 == 0 {
            format!(".{:03}", nanos / 1_000_000)
        } else if nanos % 1_000 == 0 {
            format!(".{:06}", nanos / 1_000)
        } else {
            format!(".{nanos:09}")
        };
        out.push_str(&frac);
    }
    out.push('Z');
    out
}

/// (year, month, day) of a day count since 1970-01-01 (proleptic Gregorian).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps() {
        assert_eq!(rfc3339(0, 0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400, 0), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_796_230_871, 0), "2026-12-02T17:01:11Z");
        assert_eq!(rfc3339(1, 500_000_000), "1970-01-01T00:00:01.500Z");
        assert_eq!(rfc3339(1, 1_000), "1970-01-01T00:00:01.000001Z");
        assert_eq!(rfc3339(1, 7), "1970-01-01T00:00:01.000000007Z");
        assert_eq!(rfc3339(-1, 0), "1969-12-31T23:59:59Z");
    }

    #[test]
    fn sandbox_ids_look_like_e2b() {
        for _ in 0..50 {
            let id = new_sandbox_id();
            assert_eq!(id.len(), 20, "{id}");
            assert!(id.starts_with('i'));
            assert!(id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()), "{id}");
            assert!(sandbox_mcp::provider::local::check_local_id(&id).is_err());
        }
        assert_ne!(new_sandbox_id(), new_sandbox_id());
    }

    #[test]
    fn control_paths() {
        assert!(is_control_path("/sandboxes"));
        assert!(is_control_path("/v2/sandboxes/abc/connect"));
        assert!(!is_control_path("/sandboxesx"));
        assert!(!is_control_path("/files"));
    }
}
