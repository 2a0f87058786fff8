//! The request headers of a 2026-07-28 request over Streamable HTTP: `MCP-Protocol-Version`,
//! `Mcp-Method` and `Mcp-Name` are required and must match the body (HeaderMismatch, -32020,
//! answered 400). Header names are case-insensitive, values case-sensitive, and whitespace
//! around a value is ignored, on both sides: a header cannot carry it, so a body's version or
//! method padded with spaces is judged as what it is (an unsupported version, an unknown method),
//! never as a mismatch no client could mend. An `Mcp-Name` may arrive Base64-encoded as
//! `=?base64?…?=` (which can carry any name).
//!
//! Pure functions over a header lookup, so the rules are tested without a socket; the HTTP
//! transport calls [`check`] between reading a request's `_meta` and judging its version.

use crate::base64;
use crate::jsonrpc::{code, RpcError};
use crate::mcp::envelope::RequestMeta;
use serde_json::Value;

/// Methods whose `Mcp-Name` header mirrors a body parameter, and that parameter.
const NAMED: &[(&str, &str)] = &[
    ("tools/call", "name"),
    ("resources/read", "uri"),
    ("prompts/get", "name"),
    ("tasks/get", "taskId"),
    ("tasks/cancel", "taskId"),
    ("tasks/update", "taskId"),
];

fn mismatch(message: String) -> RpcError {
    RpcError::new(code::HEADER_MISMATCH, message)
}

/// Decodes an `Mcp-Name` value: `=?base64?…?=` is Base64 of UTF-8, anything else is literal.
pub fn decode_value(raw: &str) -> Result<String, RpcError> {
    let value = raw.trim();
    match value.strip_prefix("=?base64?").and_then(|v| v.strip_suffix("?=")) {
        None => Ok(value.to_string()),
        Some(encoded) => base64::decode(encoded).and_then(|bytes| String::from_utf8(bytes).ok()).ok_or_else(|| {
            mismatch("Mcp-Name is not valid =?base64?…?= (Base64 of UTF-8); send the name as plain ASCII or encode it correctly".into())
        }),
    }
}

/// Checks the headers of a 2026-07-28 request against its body. `header` looks a header up by
/// name (case-insensitively).
pub fn check<'a>(
    header: impl Fn(&str) -> Option<&'a str>,
    method: &str,
    params: Option<&Value>,
    meta: &RequestMeta,
) -> Result<(), RpcError> {
    match header("MCP-Protocol-Version").map(str::trim) {
        None => return Err(mismatch(format!("the MCP-Protocol-Version header is required; send MCP-Protocol-Version: {}", meta.version))),
        Some(v) if v != meta.version.trim() => {
            return Err(mismatch(format!(
                "the MCP-Protocol-Version header {v:?} does not match the body's _meta version {:?}; send the same version in both",
                meta.version
            )))
        }
        Some(_) => {}
    }
    match header("Mcp-Method").map(str::trim) {
        None => return Err(mismatch(format!("the Mcp-Method header is required; send Mcp-Method: {method}"))),
        Some(m) if m != method.trim() => {
            return Err(mismatch(format!(
                "the Mcp-Method header {m:?} does not match the body's method {method:?} (values are case-sensitive)"
            )))
        }
        Some(_) => {}
    }
    let Some((_, key)) = NAMED.iter().find(|(m, _)| *m == method) else { return Ok(()) };
    let Some(Value::String(body)) = params.and_then(|p| p.get(*key)) else { return Ok(()) };
    match header("Mcp-Name") {
        None => Err(mismatch(format!("the Mcp-Name header is required for {method}; send Mcp-Name with params.{key}"))),
        Some(raw) => {
            let name = decode_value(raw)?;
            if name == *body {
                Ok(())
            } else {
                let shown: String = name.chars().take(80).collect();
                Err(mismatch(format!("the Mcp-Name header {shown:?} does not match params.{key} in the body; send the same value in both")))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn meta() -> RequestMeta {
        RequestMeta { version: "2026-07-28".into(), capabilities: Default::default(), client_info: None, log_level: None }
    }

    type Headers<'a> = &'a [(&'a str, &'a str)];

    fn run(headers: Headers<'_>, method: &str, params: Value) -> Result<(), i64> {
        let lookup = |name: &str| headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| *v);
        check(lookup, method, Some(&params), &meta()).map_err(|e| e.code)
    }

    #[test]
    fn headers_must_be_present_and_match_the_body() {
        let call = json!({"name": "run_command"});
        let v = ("MCP-Protocol-Version", "2026-07-28");
        assert_eq!(run(&[v, ("Mcp-Method", "tools/list")], "tools/list", json!({})), Ok(()));
        assert_eq!(run(&[v, ("mcp-method", " tools/list ")], "tools/list", json!({})), Ok(()), "names any case, values trimmed");
        assert_eq!(run(&[v, ("Mcp-Method", "tools/call"), ("Mcp-Name", "  run_command  ")], "tools/call", call.clone()), Ok(()));
        // A body's version or method padded with spaces: the header (which cannot carry them)
        // matches, and the version or method is judged afterwards. Found by fuzzing: it was a
        // mismatch no client could mend.
        let padded = RequestMeta { version: " 026-07-28".into(), ..meta() };
        let lookup = |name: &str| {
            [("MCP-Protocol-Version", "026-07-28"), ("Mcp-Method", "tools/list")].iter().find(|(k, _)| *k == name).map(|(_, v)| *v)
        };
        assert_eq!(check(lookup, " tools/list ", Some(&json!({})), &padded), Ok(()));
        let mismatches: &[(Headers<'_>, &str, Value)] = &[
            (&[("Mcp-Method", "tools/list")], "tools/list", json!({})),
            (&[("MCP-Protocol-Version", "2025-11-25"), ("Mcp-Method", "tools/list")], "tools/list", json!({})),
            (&[v], "tools/list", json!({})),
            (&[v, ("Mcp-Method", "prompts/list")], "tools/list", json!({})),
            (&[v, ("Mcp-Method", "TOOLS/LIST")], "tools/list", json!({})),
            (&[v, ("Mcp-Method", "tools/call")], "tools/call", call.clone()),
            (&[v, ("Mcp-Method", "tools/call"), ("Mcp-Name", "wrong_tool_name")], "tools/call", call.clone()),
            (&[v, ("Mcp-Method", "tools/call"), ("Mcp-Name", "RUN_COMMAND")], "tools/call", call.clone()),
            (&[v, ("Mcp-Method", "tools/call"), ("Mcp-Name", "=?base64?!!!?=")], "tools/call", call.clone()),
        ];
        for (headers, method, params) in mismatches {
            assert_eq!(run(headers, method, params.clone()), Err(code::HEADER_MISMATCH), "{headers:?}");
        }
        // A call without a name in its body needs no Mcp-Name (the method then reports the error).
        assert_eq!(run(&[v, ("Mcp-Method", "tools/call")], "tools/call", json!({})), Ok(()));
        // Task methods name their task.
        for method in ["tasks/get", "tasks/cancel", "tasks/update"] {
            let task = json!({"taskId": "t.s"});
            assert_eq!(run(&[v, ("Mcp-Method", method), ("Mcp-Name", "t.s")], method, task.clone()), Ok(()), "{method}");
            assert_eq!(run(&[v, ("Mcp-Method", method)], method, task.clone()), Err(code::HEADER_MISMATCH), "{method}");
            assert_eq!(run(&[v, ("Mcp-Method", method), ("Mcp-Name", "x.s")], method, task), Err(code::HEADER_MISMATCH), "{method}");
        }
    }

    #[test]
    fn mcp_name_may_be_base64() {
        let encoded = format!("=?base64?{}?=", base64::encode("run_command".as_bytes()));
        let headers = [("MCP-Protocol-Version", "2026-07-28"), ("Mcp-Method", "tools/call"), ("Mcp-Name", encoded.as_str())];
        assert_eq!(run(&headers, "tools/call", json!({"name": "run_command"})), Ok(()));
        assert_eq!(decode_value("=?base64?SGVsbG8sIOS4lueVjA==?=").unwrap(), "Hello, 世界");
        assert_eq!(decode_value("=?base64?abc").unwrap(), "=?base64?abc", "no suffix: literal");
        assert!(decode_value("=?base64?/w==?=").is_err(), "not UTF-8");
    }
}
