//! The MCP 2026-07-28 request envelope: which era a request belongs to, its per-request `_meta`
//! (protocol version, client capabilities, client info, log level) read into a [`RequestMeta`],
//! and what every 2026-07-28 result carries (`resultType`, the server's identity in `_meta`, and
//! caching hints on `tools/list` and `server/discover`). See docs/contract.md, "Protocol".
//!
//! Extensions are declared once, in [`EXTENSIONS`]: `server/discover` advertises them in
//! `capabilities.extensions`, and [`RequestMeta::extension`] tells a handler whether the client
//! of one request declared an extension in its `clientCapabilities.extensions`. An extension
//! that adds methods routes them in `protocol.rs` beside the core methods.

use crate::jsonrpc::{code, RpcError};
use serde_json::{json, Map, Value};

/// Protocol versions served statelessly, from a request's own `_meta` (newest first).
pub const MODERN_VERSIONS: &[&str] = &["2026-07-28"];

/// `_meta` key: the request's protocol version (required).
pub const PROTOCOL_VERSION_KEY: &str = "io.modelcontextprotocol/protocolVersion";
/// `_meta` key: the client's capabilities for this request (required).
pub const CLIENT_CAPABILITIES_KEY: &str = "io.modelcontextprotocol/clientCapabilities";
/// `_meta` key: the client's name and version (optional).
pub const CLIENT_INFO_KEY: &str = "io.modelcontextprotocol/clientInfo";
/// `_meta` key: the lowest log level the client wants notifications for (optional).
pub const LOG_LEVEL_KEY: &str = "io.modelcontextprotocol/logLevel";
/// Result `_meta` key: the server's name and version.
pub const SERVER_INFO_KEY: &str = "io.modelcontextprotocol/serverInfo";
/// Notification and result `_meta` key: the `subscriptions/listen` request a message belongs to.
pub const SUBSCRIPTION_ID_KEY: &str = "io.modelcontextprotocol/subscriptionId";

/// Log levels, lowest first (`logging/setLevel` in 2025, `_meta` logLevel in 2026).
pub const LOG_LEVELS: &[&str] = &["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"];

/// Methods that exist only in 2026-07-28: a request for one is judged as a 2026 request even
/// without `_meta`, so it gets the 2026 error for a missing envelope.
pub const MODERN_ONLY_METHODS: &[&str] = &["server/discover", "subscriptions/listen"];

/// How long a client may cache `tools/list` and `server/discover` (the tools of a running
/// server never change).
pub const CACHE_TTL_MS: u64 = 3_600_000;

/// A protocol extension this server implements.
pub struct Extension {
    /// Its identifier (a `_meta`-style key with a prefix, such as `io.modelcontextprotocol/tasks`).
    pub id: &'static str,
    /// Its settings object in `server/discover` (an empty object: supported, no settings).
    pub settings: fn() -> Value,
}

/// The tasks extension (`tasks.rs`, docs/contract.md "Protocol tasks").
pub const TASKS_EXTENSION: &str = "io.modelcontextprotocol/tasks";

/// Every extension this server implements, advertised by `server/discover`.
pub const EXTENSIONS: &[Extension] = &[Extension { id: TASKS_EXTENSION, settings: || json!({}) }];

/// Whether a request is a 2026-07-28 one: its `params._meta` carries the protocol-version key
/// (whatever its value), or its method exists only in 2026-07-28. Everything else is a 2025
/// (`initialize`-era) request.
pub fn is_modern(method: &str, params: Option<&Value>) -> bool {
    MODERN_ONLY_METHODS.contains(&method)
        || params.and_then(|p| p.get("_meta")).and_then(Value::as_object).is_some_and(|m| m.contains_key(PROTOCOL_VERSION_KEY))
}

/// The validated per-request `_meta` of a 2026-07-28 request.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestMeta {
    /// `io.modelcontextprotocol/protocolVersion` (not yet checked against [`MODERN_VERSIONS`]).
    pub version: String,
    /// `io.modelcontextprotocol/clientCapabilities`.
    pub capabilities: Map<String, Value>,
    /// `io.modelcontextprotocol/clientInfo`, when given.
    pub client_info: Option<Value>,
    /// `io.modelcontextprotocol/logLevel`, when given. This server sends no log notifications,
    /// so with or without it none are sent.
    pub log_level: Option<&'static str>,
}

fn invalid(message: String) -> RpcError {
    RpcError::new(code::INVALID_PARAMS, message)
}

impl RequestMeta {
    /// Reads and checks the shape of `params._meta`: -32602 when it is missing, when a required
    /// key is missing, or when a key has the wrong type. The version itself is judged by
    /// [`RequestMeta::check_version`].
    pub fn read(params: Option<&Value>) -> Result<RequestMeta, RpcError> {
        let needs = format!("a 2026-07-28 request needs params._meta with {PROTOCOL_VERSION_KEY} and {CLIENT_CAPABILITIES_KEY}");
        let meta = match params {
            None => return Err(invalid(format!("params are missing; {needs}"))),
            Some(Value::Object(p)) => match p.get("_meta") {
                None => return Err(invalid(format!("params._meta is missing; {needs}"))),
                Some(Value::Object(m)) => m,
                Some(_) => return Err(invalid(format!("params._meta must be an object; {needs}"))),
            },
            Some(_) => return Err(invalid(format!("params must be an object; {needs}"))),
        };
        let version = match meta.get(PROTOCOL_VERSION_KEY) {
            None => return Err(invalid(format!("params._meta lacks {PROTOCOL_VERSION_KEY}; {needs}"))),
            Some(Value::String(v)) => v.clone(),
            Some(other) => {
                return Err(invalid(format!("{PROTOCOL_VERSION_KEY} must be a string such as \"{}\", not {other}", MODERN_VERSIONS[0])))
            }
        };
        let capabilities = match meta.get(CLIENT_CAPABILITIES_KEY) {
            None => return Err(invalid(format!("params._meta lacks {CLIENT_CAPABILITIES_KEY}; send {{}} when the client has none"))),
            Some(Value::Object(c)) => c.clone(),
            Some(_) => return Err(invalid(format!("{CLIENT_CAPABILITIES_KEY} must be an object ({{}} when the client has none)"))),
        };
        if let Some(ext) = capabilities.get("extensions") {
            let ok = ext.as_object().is_some_and(|e| e.values().all(Value::is_object));
            if !ok {
                return Err(invalid(format!(
                    "{CLIENT_CAPABILITIES_KEY}.extensions must map extension ids to settings objects ({{}} for none)"
                )));
            }
        }
        let client_info = match meta.get(CLIENT_INFO_KEY) {
            None => None,
            Some(info @ Value::Object(i))
                if i.get("name").is_some_and(Value::is_string) && i.get("version").is_some_and(Value::is_string) =>
            {
                Some(info.clone())
            }
            Some(_) => {
                return Err(invalid(format!("{CLIENT_INFO_KEY} must be an object with string \"name\" and \"version\" (or be left out)")))
            }
        };
        let log_level = match meta.get(LOG_LEVEL_KEY) {
            None => None,
            Some(Value::String(l)) if LOG_LEVELS.contains(&l.as_str()) => LOG_LEVELS.iter().copied().find(|k| k == l),
            Some(_) => return Err(invalid(format!("{LOG_LEVEL_KEY} must be one of {} (or be left out)", LOG_LEVELS.join(", ")))),
        };
        Ok(RequestMeta { version, capabilities, client_info, log_level })
    }

    /// UnsupportedProtocolVersion (-32022, with the supported versions and the requested one in
    /// `data`) unless the version is one of [`MODERN_VERSIONS`].
    pub fn check_version(&self) -> Result<(), RpcError> {
        if MODERN_VERSIONS.contains(&self.version.as_str()) {
            return Ok(());
        }
        let shown: String = self.version.chars().take(64).collect();
        Err(RpcError::new(
            code::UNSUPPORTED_PROTOCOL_VERSION,
            format!(
                "unsupported protocol version {shown:?} in _meta; this server serves {} per request (and 2025-11-25, 2025-06-18, 2025-03-26, 2024-11-05 through initialize)",
                MODERN_VERSIONS.join(", ")
            ),
        )
        .with_data(json!({"supported": MODERN_VERSIONS, "requested": self.version})))
    }

    /// The settings the client declared for extension `id`, if it declared it.
    pub fn extension(&self, id: &str) -> Option<&Value> {
        self.capabilities.get("extensions").and_then(|e| e.get(id))
    }
}

/// The server's identity, as `serverInfo` (2025) and `_meta` serverInfo (2026).
pub fn server_info() -> Value {
    json!({"name": "sandbox-mcp", "title": "Sandbox MCP", "version": env!("CARGO_PKG_VERSION")})
}

/// Marks a 2026-07-28 result: `resultType: "complete"` and the server's identity in `_meta`.
pub fn complete(result: &mut Value) {
    if let Value::Object(r) = result {
        r.insert("resultType".into(), Value::from("complete"));
        let meta = r.entry("_meta").or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(m) = meta {
            m.insert(SERVER_INFO_KEY.into(), server_info());
        }
    }
}

/// The same result with the caching hints of a list result (public: nothing in it depends on
/// the caller).
fn cacheable(mut result: Value) -> Value {
    complete(&mut result);
    result["ttlMs"] = json!(CACHE_TTL_MS);
    result["cacheScope"] = json!("public");
    result
}

/// The `tools/list` result of a 2026-07-28 request.
pub fn tools_list(list: Value) -> Value {
    cacheable(list)
}

/// The `server/discover` result.
pub fn discover(instructions: &str) -> Value {
    let extensions: Map<String, Value> = EXTENSIONS.iter().map(|e| (e.id.to_string(), (e.settings)())).collect();
    cacheable(json!({
        "supportedVersions": MODERN_VERSIONS,
        "capabilities": {"tools": {"listChanged": false}, "extensions": extensions},
        "instructions": instructions,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(m: Value) -> Option<Value> {
        Some(json!({"_meta": m}))
    }

    fn good() -> Value {
        json!({PROTOCOL_VERSION_KEY: "2026-07-28", CLIENT_CAPABILITIES_KEY: {}})
    }

    #[test]
    fn era_is_chosen_by_the_version_key_or_a_modern_only_method() {
        assert!(is_modern("tools/list", meta(good()).as_ref()));
        assert!(is_modern("tools/list", meta(json!({PROTOCOL_VERSION_KEY: 7})).as_ref()), "any value: judged, then refused");
        assert!(is_modern("server/discover", None));
        assert!(is_modern("subscriptions/listen", Some(&json!({}))));
        assert!(!is_modern("tools/list", None));
        assert!(!is_modern("tools/call", meta(json!({"progressToken": 1})).as_ref()), "a 2025 _meta is not an envelope");
        assert!(!is_modern("ping", Some(&json!({"_meta": "x"}))));
    }

    #[test]
    fn reads_a_valid_envelope() {
        let mut m = good();
        m[CLIENT_INFO_KEY] = json!({"name": "c", "version": "1"});
        m[LOG_LEVEL_KEY] = json!("warning");
        m[CLIENT_CAPABILITIES_KEY] = json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
        let read = RequestMeta::read(meta(m).as_ref()).unwrap();
        assert_eq!(read.version, "2026-07-28");
        assert_eq!(read.log_level, Some("warning"));
        assert_eq!(read.client_info.as_ref().unwrap()["name"], "c");
        assert_eq!(read.extension("io.modelcontextprotocol/tasks"), Some(&json!({})));
        assert_eq!(read.extension("com.example/other"), None);
        assert!(RequestMeta::read(meta(good()).as_ref()).unwrap().check_version().is_ok());
    }

    #[test]
    fn every_malformed_envelope_is_invalid_params() {
        let cases: Vec<Option<Value>> = vec![
            None,
            Some(json!([])),
            Some(json!({})),
            Some(json!({"_meta": 3})),
            meta(json!({CLIENT_CAPABILITIES_KEY: {}})),
            meta(json!({PROTOCOL_VERSION_KEY: "2026-07-28"})),
            meta(json!({PROTOCOL_VERSION_KEY: 20260728, CLIENT_CAPABILITIES_KEY: {}})),
            meta(json!({PROTOCOL_VERSION_KEY: null, CLIENT_CAPABILITIES_KEY: {}})),
            meta(json!({PROTOCOL_VERSION_KEY: "2026-07-28", CLIENT_CAPABILITIES_KEY: []})),
            meta(json!({PROTOCOL_VERSION_KEY: "2026-07-28", CLIENT_CAPABILITIES_KEY: "all"})),
            meta(json!({PROTOCOL_VERSION_KEY: "2026-07-28", CLIENT_CAPABILITIES_KEY: {"extensions": []}})),
            meta(json!({PROTOCOL_VERSION_KEY: "2026-07-28", CLIENT_CAPABILITIES_KEY: {"extensions": {"a/b": 1}}})),
            meta(json!({PROTOCOL_VERSION_KEY: "2026-07-28", CLIENT_CAPABILITIES_KEY: {}, CLIENT_INFO_KEY: "me"})),
            meta(json!({PROTOCOL_VERSION_KEY: "2026-07-28", CLIENT_CAPABILITIES_KEY: {}, CLIENT_INFO_KEY: {"name": "x"}})),
            meta(json!({PROTOCOL_VERSION_KEY: "2026-07-28", CLIENT_CAPABILITIES_KEY: {}, LOG_LEVEL_KEY: "verbose"})),
            meta(json!({PROTOCOL_VERSION_KEY: "2026-07-28", CLIENT_CAPABILITIES_KEY: {}, LOG_LEVEL_KEY: 3})),
        ];
        for params in cases {
            let err = RequestMeta::read(params.as_ref()).expect_err(&format!("{params:?}"));
            assert_eq!(err.code, code::INVALID_PARAMS, "{params:?}");
            assert!(err.message.contains("must") || err.message.contains("missing") || err.message.contains("lacks"), "{}", err.message);
        }
    }

    #[test]
    fn an_unknown_version_names_the_supported_ones() {
        for v in ["v999.0.0", "2025-11-25", "", "2026-07-28 "] {
            let mut m = good();
            m[PROTOCOL_VERSION_KEY] = json!(v);
            let err = RequestMeta::read(meta(m).as_ref()).unwrap().check_version().unwrap_err();
            assert_eq!(err.code, code::UNSUPPORTED_PROTOCOL_VERSION);
            assert_eq!(err.data, Some(json!({"supported": ["2026-07-28"], "requested": v})));
        }
    }

    #[test]
    fn results_are_complete_and_identify_the_server() {
        let mut r = json!({"content": [], "_meta": {"com.example/x": 1}});
        complete(&mut r);
        assert_eq!(r["resultType"], "complete");
        assert_eq!(r["_meta"]["com.example/x"], 1, "existing _meta keys stay");
        assert_eq!(r["_meta"][SERVER_INFO_KEY]["name"], "sandbox-mcp");
        let d = discover("hi");
        assert_eq!(d["supportedVersions"], json!(MODERN_VERSIONS));
        assert_eq!(d["capabilities"]["extensions"], json!({TASKS_EXTENSION: {}}));
        assert_eq!((d["ttlMs"].as_u64(), d["cacheScope"].as_str()), (Some(CACHE_TTL_MS), Some("public")));
        let t = tools_list(json!({"tools": []}));
        assert_eq!((t["resultType"].as_str(), t["cacheScope"].as_str()), (Some("complete"), Some("public")));
    }
}
