//! The JSON-RPC 2.0 envelope: classifying an incoming message and building responses.
//!
//! This module knows nothing about MCP. Ids are kept as raw `serde_json::Value`s so that they are
//! echoed with their exact JSON type (`"1"` is not `1`).

use serde_json::{json, Map, Value};

/// JSON-RPC error codes used by this server.
pub mod code {
    /// Invalid JSON.
    pub const PARSE_ERROR: i64 = -32700;
    /// Not a valid request object.
    pub const INVALID_REQUEST: i64 = -32600;
    /// Unknown method.
    pub const METHOD_NOT_FOUND: i64 = -32601;
    /// Invalid method parameters (unknown tool, params not an object).
    pub const INVALID_PARAMS: i64 = -32602;
    /// Internal fault.
    pub const INTERNAL_ERROR: i64 = -32603;
    /// The server cannot take the request now: overloaded (a full queue, the body budget, too
    /// many streams or waiting calls) or shutting down. Retry later (clients rely on it).
    pub const SERVER_BUSY: i64 = -32000;
    /// HTTP: the `Mcp-Session-Id` names no live session (404; as the MCP SDKs answer it).
    pub const SESSION_NOT_FOUND: i64 = -32001;
    /// HTTP: the bearer token is missing or wrong (401).
    pub const UNAUTHORIZED: i64 = -32010;
    /// HTTP: the `Origin` or `Host` header is not a loopback one (403).
    pub const FORBIDDEN: i64 = -32011;
    /// HTTP: the method is not served on this path (405).
    pub const METHOD_NOT_ALLOWED: i64 = -32012;
    /// HTTP: a request of a 2025 session came without its `Mcp-Session-Id` header (400).
    pub const SESSION_REQUIRED: i64 = -32013;
    /// HTTP: the `MCP-Protocol-Version` header of a 2025 session names a version not served (400).
    pub const UNSUPPORTED_VERSION_HEADER: i64 = -32014;
    /// Request cancelled by the client (as in LSP).
    pub const REQUEST_CANCELLED: i64 = -32800;
    /// MCP 2026-07-28: HTTP headers missing, malformed, or not matching the body.
    pub const HEADER_MISMATCH: i64 = -32020;
    /// MCP 2026-07-28: the request needs a client capability it did not declare.
    pub const MISSING_CLIENT_CAPABILITY: i64 = -32021;
    /// MCP 2026-07-28: the request's protocol version is not served here.
    pub const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;
}

/// A protocol-level error, answered as a JSON-RPC error response.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    /// One of [`code`].
    pub code: i64,
    /// What went wrong and what to do next.
    pub message: String,
    /// Machine-readable detail (`error.data`), when the code defines one.
    pub data: Option<Value>,
}

impl RpcError {
    /// A new error with `code` and `message`.
    pub fn new(code: i64, message: impl Into<String>) -> RpcError {
        RpcError { code, message: message.into(), data: None }
    }

    /// The same error with `error.data`.
    pub fn with_data(mut self, data: Value) -> RpcError {
        self.data = Some(data);
        self
    }
}

/// One classified incoming message.
#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    /// A request: has a (non-null string or integer) id and a method.
    Request {
        /// The id, echoed verbatim.
        id: Value,
        /// The method name.
        method: String,
        /// `params`, if present.
        params: Option<Value>,
    },
    /// A notification: a method and no id. Never answered.
    Notification {
        /// The method name.
        method: String,
        /// `params`, if present.
        params: Option<Value>,
    },
    /// A response to a request we never sent (we send none); ignored.
    Response,
    /// Not a valid message; answer with this error (the id is `null` when it could not be read).
    Invalid {
        /// The id to answer with.
        id: Value,
        /// The error.
        error: RpcError,
    },
}

/// Classifies one message from its raw bytes.
pub fn parse(bytes: &[u8]) -> Incoming {
    let value: Value = match serde_json::from_slice(bytes) {
        Ok(value) => value,
        Err(err) => {
            let what = if std::str::from_utf8(bytes).is_err() { "invalid UTF-8" } else { "invalid JSON" };
            return invalid(Value::Null, code::PARSE_ERROR, format!("parse error: {what} ({err}); send one JSON-RPC object per message"));
        }
    };
    classify(value)
}

/// Classifies an already-parsed JSON value.
pub fn classify(value: Value) -> Incoming {
    let mut obj = match value {
        Value::Object(obj) => obj,
        Value::Array(_) => {
            return invalid(Value::Null, code::INVALID_REQUEST, "batches are not supported; send one JSON-RPC object per message")
        }
        _ => return invalid(Value::Null, code::INVALID_REQUEST, "a JSON-RPC message must be a JSON object"),
    };
    let id = obj.remove("id");
    let id_ok = matches!(&id, Some(Value::String(_))) || matches!(&id, Some(Value::Number(n)) if n.is_i64() || n.is_u64());
    let echo_id = if id_ok { id.clone().unwrap_or(Value::Null) } else { Value::Null };
    if obj.get("jsonrpc") != Some(&Value::String("2.0".into())) {
        return invalid(echo_id, code::INVALID_REQUEST, "\"jsonrpc\" must be \"2.0\"");
    }
    let params = obj.remove("params");
    if let Some(p) = &params {
        if !p.is_object() && !p.is_array() {
            return invalid(echo_id, code::INVALID_REQUEST, "\"params\" must be an object or an array");
        }
    }
    let method = match obj.remove("method") {
        Some(Value::String(m)) => m,
        Some(_) => return invalid(echo_id, code::INVALID_REQUEST, "\"method\" must be a string"),
        None => {
            if id.is_some() && (obj.contains_key("result") || obj.contains_key("error")) {
                return Incoming::Response;
            }
            return invalid(echo_id, code::INVALID_REQUEST, "a request needs a \"method\"");
        }
    };
    match id {
        None => Incoming::Notification { method, params },
        Some(_) if id_ok => Incoming::Request { id: echo_id, method, params },
        Some(Value::Null) => invalid(
            Value::Null,
            code::INVALID_REQUEST,
            "\"id\" must not be null in MCP; use a string or an integer, or omit it for a notification",
        ),
        Some(_) => invalid(Value::Null, code::INVALID_REQUEST, "\"id\" must be a string or an integer"),
    }
}

fn invalid(id: Value, code: i64, message: impl Into<String>) -> Incoming {
    Incoming::Invalid { id, error: RpcError::new(code, message) }
}

/// A success response.
pub fn result(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// An error response.
pub fn error(id: &Value, err: &RpcError) -> Value {
    let mut e = Map::new();
    e.insert("code".into(), Value::from(err.code));
    e.insert("message".into(), Value::from(err.message.clone()));
    if let Some(data) = &err.data {
        e.insert("data".into(), data.clone());
    }
    json!({"jsonrpc": "2.0", "id": id, "error": e})
}

/// How many bytes of a message too large to parse are kept to find its id ([`id_in_prefix`]).
pub const ID_PREFIX_BYTES: usize = 4096;

/// The `id` of a JSON-RPC message read from its first bytes only (a message too large to parse):
/// a string or number given as a key of the top-level object, before any cut. `None` when the
/// prefix is not an object's start or holds no complete top-level `id`.
pub fn id_in_prefix(prefix: &[u8]) -> Option<Value> {
    let ws = |b: u8| matches!(b, b' ' | b'\t' | b'\r' | b'\n');
    let mut i = prefix.iter().position(|b| !ws(*b))?;
    if prefix[i] != b'{' {
        return None;
    }
    i += 1;
    let mut depth = 1usize;
    // End of the string that starts at `at` (its opening quote): the index after its closing quote.
    let string_end = |at: usize| -> Option<usize> {
        let mut j = at + 1;
        while j < prefix.len() {
            match prefix[j] {
                b'\\' => j += 2,
                b'"' => return Some(j + 1),
                _ => j += 1,
            }
        }
        None
    };
    while i < prefix.len() {
        match prefix[i] {
            b'"' => {
                let end = string_end(i)?;
                let mut after = end;
                while after < prefix.len() && ws(prefix[after]) {
                    after += 1;
                }
                let is_key = prefix.get(after) == Some(&b':');
                if depth == 1 && is_key && &prefix[i..end] == b"\"id\"" {
                    let mut v = after + 1;
                    while v < prefix.len() && ws(prefix[v]) {
                        v += 1;
                    }
                    let value_end = match prefix.get(v)? {
                        b'"' => string_end(v)?,
                        b'-' | b'0'..=b'9' => {
                            let n = prefix[v..].iter().position(|b| !matches!(b, b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9'))?;
                            v + n
                        }
                        _ => return None,
                    };
                    return serde_json::from_slice::<Value>(&prefix[v..value_end]).ok().filter(|id| id.is_string() || id.is_number());
                }
                i = end;
            }
            b'{' | b'[' => {
                depth += 1;
                i += 1;
            }
            b'}' | b']' => {
                depth -= 1;
                if depth == 0 {
                    return None;
                }
                i += 1;
            }
            _ => i += 1,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    #[test]
    fn finds_the_top_level_id_in_a_prefix() {
        use super::id_in_prefix;
        use serde_json::json;
        let cases: &[(&[u8], Option<serde_json::Value>)] = &[
            (br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"arguments":{"content":"xxx"#, Some(json!(7))),
            (br#" { "id" : "a\"b", "x": 1"#, Some(json!("a\"b"))),
            (br#"{"method":"m","params":{"id":3,"content":"xx"#, None),
            (br#"{"method":"m","params":{"id":3},"id":-4.5,"x""#, Some(json!(-4.5))),
            (br#"{"params":{"content":"\"id\":9"},"id":12}"#, Some(json!(12))),
            (br#"{"id":12"#, None),
            (br#"{"id":null,"x":1"#, None),
            (br#"[{"id":1}]"#, None),
        ];
        for (prefix, id) in cases {
            assert_eq!(&id_in_prefix(prefix), id, "{}", String::from_utf8_lossy(prefix));
        }
    }

    use super::*;

    fn check(input: &str, expected: Incoming) {
        assert_eq!(parse(input.as_bytes()), expected, "{input}");
    }

    fn invalid_code(input: &[u8]) -> (Value, i64) {
        match parse(input) {
            Incoming::Invalid { id, error } => (id, error.code),
            other => panic!("expected invalid for {:?}, got {other:?}", String::from_utf8_lossy(input)),
        }
    }

    #[test]
    fn requests_keep_their_id_type() {
        check(r#"{"jsonrpc":"2.0","id":"1","method":"ping"}"#, Incoming::Request { id: json!("1"), method: "ping".into(), params: None });
        check(
            r#"{"jsonrpc":"2.0","id":1,"method":"ping","params":{}}"#,
            Incoming::Request { id: json!(1), method: "ping".into(), params: Some(json!({})) },
        );
    }

    #[test]
    fn notifications_and_responses() {
        check(
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            Incoming::Notification { method: "notifications/initialized".into(), params: None },
        );
        check(r#"{"jsonrpc":"2.0","id":4,"result":{}}"#, Incoming::Response);
    }

    #[test]
    fn malformed_input() {
        assert_eq!(invalid_code(b"{not json"), (Value::Null, code::PARSE_ERROR));
        assert_eq!(invalid_code(b"\xff\xfe{}"), (Value::Null, code::PARSE_ERROR));
        assert_eq!(invalid_code(b"[]"), (Value::Null, code::INVALID_REQUEST));
        assert_eq!(invalid_code(b"[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}]").1, code::INVALID_REQUEST);
        assert_eq!(invalid_code(b"42"), (Value::Null, code::INVALID_REQUEST));
        assert_eq!(invalid_code(b"\"str\""), (Value::Null, code::INVALID_REQUEST));
        assert_eq!(invalid_code(br#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#), (Value::Null, code::INVALID_REQUEST));
        assert_eq!(invalid_code(br#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#), (Value::Null, code::INVALID_REQUEST));
        assert_eq!(invalid_code(br#"{"jsonrpc":"2.0","id":{},"method":"ping"}"#), (Value::Null, code::INVALID_REQUEST));
        assert_eq!(invalid_code(br#"{"id":7,"method":"ping"}"#), (json!(7), code::INVALID_REQUEST));
        assert_eq!(invalid_code(br#"{"jsonrpc":"2.0","id":7,"method":3}"#), (json!(7), code::INVALID_REQUEST));
        assert_eq!(invalid_code(br#"{"jsonrpc":"2.0","id":7}"#), (json!(7), code::INVALID_REQUEST));
        assert_eq!(invalid_code(br#"{"jsonrpc":"2.0","id":7,"method":"x","params":3}"#), (json!(7), code::INVALID_REQUEST));
    }

    #[test]
    fn responses_are_compact_and_echo_ids() {
        let line = serde_json::to_string(&result(&json!("a"), json!({}))).unwrap();
        assert!(!line.contains('\n') && !line.contains(' '), "{line}");
        assert_eq!(serde_json::from_str::<Value>(&line).unwrap()["id"], json!("a"));
        let err = error(&Value::Null, &RpcError::new(code::PARSE_ERROR, "x"));
        assert_eq!(err["id"], Value::Null);
        assert_eq!(err["error"]["code"], json!(-32700));
    }
}
