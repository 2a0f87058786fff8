//! Fuzz target bodies, shared through `#[path]` by the libFuzzer binaries
//! (`tests/fuzz/fuzz_targets/*.rs`) and by the corpus replay test (`tests/it/fuzz_corpus.rs`), so
//! plain `cargo test` runs every committed input through exactly the code the fuzzer runs, and the
//! library carries no fuzz code. Each body takes raw bytes, must not panic, and asserts what the
//! code under test promises (often against a naive model written here); a panic is a finding.
//!
//! Input formats (seeds in `fixtures/fuzz/<target>/`, crash regressions in
//! `fixtures/fuzz/regressions/<target>/`):
//! * `jsonrpc_line`: byte 0 picks the line limit (bits 0-5) and the read-buffer size (bits 6-7);
//!   the rest is stdin for the stdio line reader, and also one HTTP body. Requests in the
//!   2026-07-28 form also go through the `_meta` envelope reader and the HTTP header check.
//! * `tool_args`: a JSON object, validated as the arguments of every tool (and, when it has the
//!   `tools/call` shape `{"name": …, "arguments": {…}}`, its `arguments` for that tool).
//! * `connect_envelope`: a Connect response stream (envelopes of flags, u32 length, payload).
//! * `supervisor_state`: byte 0 flags (bit 0: use the id the answer names), stdout offset, stderr
//!   offset and limit - 1 as big-endian u16s, then the snippet's stdout, a NUL, its stderr.
//! * `log_page`: offset and limit - 1 as big-endian u16s, the saved size as a big-endian u32,
//!   then secret values separated by 0x01, a NUL, and the log page.

use sandbox_mcp::jsonrpc::{self, code, Incoming};
use sandbox_mcp::limits::MIN_SECRET_BYTES;
use sandbox_mcp::mask::Masker;
use sandbox_mcp::mcp::envelope::{self, RequestMeta};
use sandbox_mcp::provider::e2b::wire::{self, ProcessEvent};
use sandbox_mcp::supervisor::{self, Snapshot, TaskState, Window};
use sandbox_mcp::tools::{self, args::Kind, args::Param};
use sandbox_mcp::transport::headers;
use sandbox_mcp::transport::stdio::{read_line, Line};
use serde_json::{json, Map, Value};
use std::io::{self, BufReader, Read};

/// One fuzz target: raw input in, a panic on a finding.
pub type Target = fn(&[u8]);

/// Every target by name, in the order `run.sh` runs them.
pub const TARGETS: &[(&str, Target)] = &[
    ("jsonrpc_line", jsonrpc_line),
    ("tool_args", tool_args),
    ("connect_envelope", connect_envelope),
    ("supervisor_state", supervisor_state),
    ("log_page", log_page),
];

/// A task id in the format the server generates.
const ID: &str = "0123456789abcdef0123456789abcdef";

// ---------------------------------------------------------------------------------------------
// jsonrpc_line: the stdio line reader and the JSON-RPC classifier.

/// The stdio line reader against a naive model, then every line (and the whole input, as an HTTP
/// body would be) through `jsonrpc::parse`.
pub fn jsonrpc_line(data: &[u8]) {
    let Some((&ctl, input)) = data.split_first() else { return };
    let max = 1 + usize::from(ctl & 0x3f) * 8;
    let capacity = 1 + usize::from(ctl >> 6) * 5;
    let expected = model_lines(input, max);
    let mut reader = BufReader::with_capacity(capacity, input);
    let mut buf = Vec::new();
    let mut got = Vec::new();
    loop {
        assert!(got.len() <= expected.len(), "read_line yields more lines than its input has");
        match read_line(&mut reader, &mut buf, max).expect("reading a slice cannot fail") {
            Line::Eof => break,
            Line::TooLong => got.push(None),
            Line::Text => {
                assert!(buf.len() <= max, "a line of {} bytes passed the {max} byte limit", buf.len());
                got.push(Some(buf.clone()));
            }
        }
    }
    assert_eq!(got, expected, "lines with max {max}, buffer {capacity}");
    assert_eq!(read_line(&mut reader, &mut buf, max).expect("reading a slice cannot fail"), Line::Eof, "EOF is final");
    for line in got.iter().flatten() {
        // The reader skips blank lines as run_reader does.
        if !line.iter().all(u8::is_ascii_whitespace) {
            check_message(line);
        }
    }
    check_message(input);
}

/// Lines as `read_line` must return them: `None` for a line over `max` bytes (counting a final
/// `\r`), a final `\r` dropped from terminated lines, and an unterminated last line kept as is.
fn model_lines(input: &[u8], max: usize) -> Vec<Option<Vec<u8>>> {
    let mut pieces: Vec<&[u8]> = input.split(|b| *b == b'\n').collect();
    let last = pieces.pop().unwrap_or_default();
    let mut out: Vec<Option<Vec<u8>>> =
        pieces.into_iter().map(|p| (p.len() <= max).then(|| p.strip_suffix(b"\r").unwrap_or(p).to_vec())).collect();
    if !last.is_empty() {
        out.push((last.len() <= max).then(|| last.to_vec()));
    }
    out
}

fn is_id(id: &Value) -> bool {
    id.is_string() || id.is_i64() || id.is_u64()
}

/// One message through `parse`, with the properties of its classification and of the replies
/// built from it.
fn check_message(bytes: &[u8]) {
    let msg = jsonrpc::parse(bytes);
    let json_ok = serde_json::from_slice::<Value>(bytes).is_ok();
    match &msg {
        Incoming::Request { id, method, params } => {
            assert!(json_ok && is_id(id), "{msg:?}");
            assert!(params.as_ref().is_none_or(|p| p.is_object() || p.is_array()), "{msg:?}");
            let mut rebuilt = json!({"jsonrpc": "2.0", "id": id, "method": method});
            if let Some(p) = params {
                rebuilt["params"] = p.clone();
            }
            assert_eq!(jsonrpc::classify(rebuilt), msg, "a request must survive a round trip");
            check_reply(jsonrpc::result(id, json!({"ok": true})));
            if envelope::is_modern(method, params.as_ref()) {
                check_envelope(id, method, params.as_ref());
            }
        }
        Incoming::Notification { method, params } => {
            assert!(json_ok, "{msg:?}");
            assert!(params.as_ref().is_none_or(|p| p.is_object() || p.is_array()), "{msg:?}");
            let mut rebuilt = json!({"jsonrpc": "2.0", "method": method});
            if let Some(p) = params {
                rebuilt["params"] = p.clone();
            }
            assert_eq!(jsonrpc::classify(rebuilt), msg, "a notification must survive a round trip");
        }
        Incoming::Response => assert!(json_ok),
        Incoming::Invalid { id, error } => {
            assert!(id.is_null() || is_id(id), "{msg:?}");
            let expected = if json_ok { code::INVALID_REQUEST } else { code::PARSE_ERROR };
            assert_eq!(error.code, expected, "{msg:?}");
            if !json_ok {
                assert!(id.is_null(), "an unparsable message has no id to echo");
            }
            assert!(!error.message.is_empty() && error.message.len() <= 1024, "error messages do not echo the input: {msg:?}");
            check_reply(jsonrpc::error(id, error));
        }
    }
}

/// A 2026-07-28 request: its `_meta` is read or refused with -32602, a readable one is accepted
/// or refused with -32022 naming the version asked for, headers built from the body always
/// pass the HTTP check, and a method header that differs never does.
fn check_envelope(id: &Value, method: &str, params: Option<&Value>) {
    let meta = match RequestMeta::read(params) {
        Ok(meta) => meta,
        Err(err) => {
            assert_eq!(err.code, code::INVALID_PARAMS, "{err:?}");
            assert!(err.message.len() <= 1024, "envelope errors do not echo the input: {err:?}");
            check_reply(jsonrpc::error(id, &err));
            return;
        }
    };
    match meta.check_version() {
        Ok(()) => assert!(envelope::MODERN_VERSIONS.contains(&meta.version.as_str())),
        Err(err) => {
            assert_eq!(err.code, code::UNSUPPORTED_PROTOCOL_VERSION);
            assert_eq!(err.data.as_ref().map(|d| &d["requested"]), Some(&json!(meta.version)));
            assert!(err.message.len() <= 1024, "{err:?}");
            check_reply(jsonrpc::error(id, &err));
        }
    }
    let name = params.and_then(|p| p.get("name").or_else(|| p.get("uri"))).and_then(Value::as_str);
    let encoded = name.map(|n| format!("=?base64?{}?=", sandbox_mcp::base64::encode(n.as_bytes())));
    let from_body = |h: &str| match h {
        "MCP-Protocol-Version" => Some(meta.version.as_str()),
        "Mcp-Method" => Some(method),
        "Mcp-Name" => encoded.as_deref(),
        _ => None,
    };
    assert_eq!(headers::check(from_body, method, params, &meta), Ok(()), "headers mirroring the body pass");
    let other = format!("{method}x");
    let wrong_method = |h: &str| if h == "Mcp-Method" { Some(other.as_str()) } else { from_body(h) };
    assert_eq!(headers::check(wrong_method, method, params, &meta).map_err(|e| e.code), Err(code::HEADER_MISMATCH));
    let mut result = json!({"tools": []});
    envelope::complete(&mut result);
    check_reply(jsonrpc::result(id, result));
}

/// A reply is one line of JSON that this server would itself classify as a response.
fn check_reply(reply: Value) {
    let line = serde_json::to_string(&reply).expect("a reply serializes");
    assert!(!line.contains('\n'), "a reply must fit on one line: {line}");
    assert_eq!(jsonrpc::parse(line.as_bytes()), Incoming::Response, "{line}");
}

// ---------------------------------------------------------------------------------------------
// tool_args: strict validation against every tool's parameter table.

/// A JSON object validated as the arguments of every tool.
pub fn tool_args(data: &[u8]) {
    let Ok(Value::Object(arguments)) = serde_json::from_slice::<Value>(data) else { return };
    for tool in tools::all() {
        check_tool_args(tool.name, tool.params, &arguments);
    }
    if let (Some(Value::String(name)), Some(Value::Object(inner))) = (arguments.get("name"), arguments.get("arguments")) {
        if let Some(tool) = tools::find(name) {
            check_tool_args(tool.name, tool.params, inner);
        }
    }
}

/// Whether `value` is acceptable for `kind`, decided independently of `args::check`.
fn model_accepts(kind: Kind, value: &Value) -> bool {
    match kind {
        Kind::Str { max_chars } => value.as_str().is_some_and(|s| s.chars().count() <= max_chars),
        Kind::Enum(allowed) => value.as_str().is_some_and(|s| allowed.contains(&s)),
        Kind::Int { min, max, .. } => match value.as_i64() {
            Some(n) => (min..=max).contains(&n),
            // Integral floats (`5.0`) count; u64 beyond i64 is out of every range.
            None => value.as_f64().is_some_and(|f| f.fract() == 0.0 && f >= min as f64 && f <= max as f64),
        },
        Kind::StrMap => value.as_object().is_some_and(|m| m.values().all(Value::is_string)),
        Kind::Bool => value.is_boolean(),
        // A policy's rules (names, sizes) are the egress module's own, unit-tested there.
        Kind::Network => value.is_boolean() || (value.is_object() && sandbox_mcp::egress::Network::from_json(value).is_ok()),
        Kind::IntFields(fields) => value.as_object().is_some_and(|m| {
            m.iter().all(|(k, v)| {
                fields
                    .iter()
                    .find(|f| f.name == k)
                    .is_some_and(|f| v.is_null() || model_accepts(Kind::Int { min: f.min, max: f.max, default: None }, v))
            })
        }),
    }
}

fn check_tool_args(name: &str, params: &[Param], arguments: &Map<String, Value>) {
    let result = tools::args::validate(name, params, arguments);
    let unknown = arguments.keys().any(|k| !params.iter().any(|p| p.name == k.as_str()));
    let given = |p: &Param| arguments.get(p.name).filter(|v| !v.is_null());
    let acceptable = !unknown
        && params.iter().all(|p| match given(p) {
            None => !p.required,
            Some(v) => model_accepts(p.kind, v),
        });
    let args = match result {
        Ok(args) => args,
        Err(err) => {
            let msg = err.to_string();
            assert!(!acceptable, "{name}: valid arguments refused: {msg} ({arguments:?})");
            assert!(msg.starts_with(&format!("{name}: ")), "{msg}");
            if !unknown {
                assert!(msg.len() <= 4096, "an error about one value must not echo it whole: {} bytes", msg.len());
            }
            return;
        }
    };
    assert!(acceptable, "{name}: invalid arguments accepted: {arguments:?}");
    for p in params {
        let given = given(p);
        match p.kind {
            Kind::Str { .. } | Kind::Enum(_) => assert_eq!(args.str(p.name), given.and_then(Value::as_str), "{name}.{}", p.name),
            Kind::Int { min, max, default } => match (args.int(p.name), given) {
                (Some(n), Some(v)) => {
                    assert!((min..=max).contains(&n) && v.as_f64() == Some(n as f64), "{name}.{}: {v} became {n}", p.name)
                }
                (n, None) => assert_eq!(n, default, "{name}.{}: the default applies", p.name),
                (None, Some(v)) => panic!("{name}.{}: {v} was accepted but not kept", p.name),
            },
            Kind::StrMap => {
                let map = args.str_map(p.name);
                let mut expected: Vec<(&str, &str)> = match given.and_then(Value::as_object) {
                    Some(m) => m.iter().filter_map(|(k, v)| Some((k.as_str(), v.as_str()?))).collect(),
                    None => Vec::new(),
                };
                expected.sort_unstable();
                let map: Vec<(&str, &str)> = map.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                assert_eq!(map, expected, "{name}.{}", p.name);
            }
            Kind::Bool => assert_eq!(args.bool(p.name), given.and_then(Value::as_bool), "{name}.{}", p.name),
            Kind::Network => {}
            Kind::IntFields(_) => {
                let kept = args.fields(p.name);
                let expected: Vec<(&str, f64)> = match given.and_then(Value::as_object) {
                    Some(m) => m.iter().filter_map(|(k, v)| Some((k.as_str(), v.as_f64()?))).collect(),
                    None => Vec::new(),
                };
                let kept: Vec<(&str, f64)> = kept.iter().map(|(k, v)| (k.as_str(), *v as f64)).collect();
                assert_eq!(kept, expected, "{name}.{}", p.name);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// connect_envelope: Connect framing, envd process events, exit codes, RFC 3339.

/// The largest payload the target accepts (small, so the limit branch is reachable).
const MAX_ENVELOPE: usize = 1024;

/// A reader that returns short reads and `Interrupted`, as a network stream may.
struct Trickle<'a> {
    data: &'a [u8],
    calls: usize,
}

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.calls += 1;
        if self.calls % 4 == 0 {
            return Err(io::Error::from(io::ErrorKind::Interrupted));
        }
        let n = buf.len().min(self.data.len()).min(1 + self.calls % 7);
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

/// Frames as `read_envelope` must return them, ending at a clean end or at the first error.
fn model_frames(data: &[u8]) -> Vec<Result<(u8, Vec<u8>), io::ErrorKind>> {
    let mut out = Vec::new();
    let mut rest = data;
    while !rest.is_empty() {
        if rest.len() < 5 {
            out.push(Err(io::ErrorKind::UnexpectedEof));
            break;
        }
        let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        if len > MAX_ENVELOPE {
            out.push(Err(io::ErrorKind::InvalidData));
            break;
        }
        let Some(payload) = rest.get(5..5 + len) else {
            out.push(Err(io::ErrorKind::UnexpectedEof));
            break;
        };
        out.push(Ok((rest[0], payload.to_vec())));
        rest = &rest[5 + len..];
    }
    out
}

/// A Connect stream through `read_envelope`, and every payload through the event parser.
pub fn connect_envelope(data: &[u8]) {
    let expected = model_frames(data);
    let mut reader = Trickle { data, calls: 0 };
    let mut got = Vec::new();
    loop {
        assert!(got.len() <= expected.len(), "read_envelope yields more frames than its input has");
        match wire::read_envelope(&mut reader, MAX_ENVELOPE) {
            Ok(Some(frame)) => got.push(Ok(frame)),
            Ok(None) => break,
            Err(err) => {
                got.push(Err(err.kind()));
                break;
            }
        }
    }
    assert_eq!(got, expected);
    let mut framed = Vec::new();
    for (flags, payload) in got.iter().flatten() {
        framed.extend_from_slice(&wire::envelope(*flags, payload));
        check_payload(payload);
    }
    assert!(data.starts_with(&framed), "envelope() must rebuild the frames read");
    if let Ok(text) = std::str::from_utf8(data) {
        check_rfc3339(text);
    }
}

fn check_payload(payload: &[u8]) {
    let parsed = serde_json::from_slice::<Value>(payload);
    // The typed reader skips fields it does not read, so a number beyond f64 there does not
    // make it refuse the payload as `Value` does (a documented difference): no oracle then.
    let overflow = matches!(&parsed, Err(e) if e.to_string().contains("number out of range"));
    let json = parsed.ok();
    let event = wire::process_event(payload);
    if json.as_ref().and_then(|v| v.get("event")).is_none() && !overflow {
        assert_eq!(event, None, "an event needs a JSON payload with an \"event\"");
    }
    let data = |key: &str| json.as_ref().and_then(|v| v.pointer(&format!("/event/data/{key}"))).and_then(Value::as_str);
    match &event {
        Some(ProcessEvent::Stdout(bytes)) => assert_eq!(sandbox_mcp::base64::decode(data("stdout").unwrap_or("")).as_ref(), Some(bytes)),
        Some(ProcessEvent::Stderr(bytes)) => assert_eq!(sandbox_mcp::base64::decode(data("stderr").unwrap_or("")).as_ref(), Some(bytes)),
        Some(ProcessEvent::End { exit_code, status }) => check_exit_code(*exit_code, status),
        _ => {}
    }
    if let Ok(text) = std::str::from_utf8(payload) {
        check_rfc3339(text);
        let code = payload.iter().take(4).fold(0i32, |acc, b| acc.wrapping_shl(8) | i32::from(*b));
        check_exit_code(code, text);
    }
    if let Some(v) = &json {
        for_each_string(v, 0, &mut |s| {
            check_rfc3339(s);
            check_exit_code(-1, s);
        });
    }
}

fn for_each_string(v: &Value, depth: usize, f: &mut impl FnMut(&str)) {
    match v {
        Value::String(s) => f(s),
        Value::Array(items) if depth < 32 => items.iter().for_each(|i| for_each_string(i, depth + 1, f)),
        Value::Object(map) if depth < 32 => map.iter().for_each(|(k, i)| {
            f(k);
            for_each_string(i, depth + 1, f)
        }),
        _ => {}
    }
}

fn check_exit_code(code: i32, status: &str) {
    let got = wire::exit_code(code, status);
    if status.starts_with("signal: ") {
        assert!(got == code || (129..=143).contains(&got), "exit_code({code}, {status:?}) = {got}");
        assert!(got >= 0 || got == code, "a signal never makes a negative code: exit_code({code}, {status:?}) = {got}");
    } else {
        assert_eq!(got, code, "without a signal the code is kept: {status:?}");
    }
}

/// RFC 3339 against an independent strict parser: both accept the same texts, with the same value.
fn check_rfc3339(s: &str) {
    assert_eq!(wire::rfc3339(s), strict_rfc3339(s), "{s:?}");
}

fn strict_rfc3339(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    let digits = |at: usize, n: usize| -> Option<i64> {
        b.get(at..at + n)?.iter().try_fold(0i64, |acc, c| c.is_ascii_digit().then(|| acc * 10 + i64::from(c - b'0')))
    };
    let seps = [(4, b'-'), (7, b'-'), (13, b':'), (16, b':')];
    if b.len() < 20 || !seps.iter().all(|&(i, c)| b[i] == c) || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let (y, mo, d) = (digits(0, 4)?, digits(5, 2)?, digits(8, 2)?);
    let (h, mi, se) = (digits(11, 2)?, digits(14, 2)?, digits(17, 2)?);
    let leap = y % 4 == 0 && (y % 100 != 0 || y % 400 == 0);
    let month_days = [31, if leap { 29 } else { 28 }, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    if y < 1 || !(1..=12).contains(&mo) || d < 1 || d > month_days[(mo - 1) as usize] || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    let mut rest = &b[19..];
    if let Some(frac) = rest.strip_prefix(b".") {
        let n = frac.iter().take_while(|c| c.is_ascii_digit()).count();
        if n == 0 {
            return None;
        }
        rest = &frac[n..];
    }
    let offset = match rest {
        b"Z" | b"z" => 0,
        [sign @ (b'+' | b'-'), _, _, b':', _, _] => {
            let (oh, om) = (digits(b.len() - 5, 2)?, digits(b.len() - 2, 2)?);
            if oh > 23 || om > 59 {
                return None;
            }
            (oh * 3600 + om * 60) * if *sign == b'+' { 1 } else { -1 }
        }
        _ => return None,
    };
    // Days from 0001-01-01 to the date, then to 1970-01-01 (719,162 days later).
    let yy = y - 1;
    let before_month: i64 = month_days[..(mo - 1) as usize].iter().sum();
    let days = yy * 365 + yy / 4 - yy / 100 + yy / 400 + before_month + d - 1 - 719_162;
    Some(days * 86_400 + h * 3600 + mi * 60 + se - offset)
}

// ---------------------------------------------------------------------------------------------
// supervisor_state: the parser of the supervisor's answers and the derived states.

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Header lines as `str::lines` splits them (a final `\r` dropped).
fn header_lines(header: &str) -> Vec<&str> {
    header.lines().collect()
}

/// The necessary condition of a success: the supervisor wrote `status=exited` and `exit_code=0`.
fn observed_success(lines: &[&str]) -> bool {
    lines.contains(&"status=exited") && lines.iter().any(|l| l.strip_prefix("exit_code=").is_some_and(|v| v.trim().parse::<i64>() == Ok(0)))
}

fn check_page(page: &[u8], next: u64, input: &[u8], size: u64, offset: u64, limit: u64, what: &str) {
    let want = size.saturating_sub(offset).min(limit).min(input.len() as u64) as usize;
    assert_eq!(page, &input[..want], "{what}: the page is the first {want} bytes that arrived");
    assert!(page.len() as u64 <= limit, "{what}: page over the limit");
    assert_eq!(next, offset + page.len() as u64, "{what}: next offset");
}

fn check_snapshot_state(s: &Snapshot, lines: &[&str]) {
    if s.state == TaskState::Succeeded {
        assert!(s.exit_code == Some(0) && observed_success(lines), "an unobserved success: {s:?}");
    }
    if s.state == TaskState::Running {
        assert!(s.exit_code.is_none() && lines.contains(&"live=1"), "{s:?}");
    }
    if !s.state.is_final() {
        assert!(s.finished_at.is_none(), "{s:?}");
    }
    if s.state == TaskState::Unknown {
        assert!(s.error.is_some(), "an unknown state says why: {s:?}");
    }
}

/// A single-task answer through `parse_answer`, and the same stdout as a list answer.
pub fn supervisor_state(data: &[u8]) {
    let Some((head, rest)) = data.split_first_chunk::<7>() else { return };
    let u16_at = |i: usize| u64::from(u16::from_be_bytes([head[i], head[i + 1]]));
    let window = Window { stdout_offset: u16_at(1), stderr_offset: u16_at(3), limit: u16_at(5) + 1 };
    let (stdout, stderr) = match rest.iter().position(|b| *b == 0) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    let named = stdout
        .strip_prefix(b"@task ")
        .and_then(|r| r.split(|b| *b == b'\n').next())
        .and_then(|id| std::str::from_utf8(id).ok())
        .map(str::trim);
    let task_id = if head[0] & 1 == 1 { named.unwrap_or("") } else { ID };

    let marker = b"\n@end\n";
    let head_end = find(stdout, marker);
    let header = head_end.and_then(|e| std::str::from_utf8(&stdout[..e + 1]).ok());
    match supervisor::parse_answer(stdout, stderr, task_id, window) {
        Some(s) => {
            let (Some(head_end), Some(header)) = (head_end, header) else { panic!("a snapshot without a readable header: {s:?}") };
            assert_eq!(s.task_id, task_id);
            let lines = header_lines(header);
            check_snapshot_state(&s, &lines);
            let out_page = &stdout[head_end + marker.len()..];
            check_page(&s.stdout, s.stdout_next_offset, out_page, s.stdout_bytes, window.stdout_offset, window.limit, "stdout");
            check_page(&s.stderr, s.stderr_next_offset, stderr, s.stderr_bytes, window.stderr_offset, window.limit, "stderr");
        }
        None => {
            let well_formed = header.is_some() && stdout.starts_with(format!("@task {task_id}\n").as_bytes());
            assert!(!well_formed, "a well-formed answer was refused");
        }
    }

    let text = String::from_utf8_lossy(stdout);
    match supervisor::parse_list(stdout) {
        None => assert!(!text.contains("@done"), "a list with @done was refused"),
        Some(tasks) => {
            assert!(text.contains("@done"));
            assert_eq!(tasks.len(), text.matches("@task ").count());
            // Blocks end where the next `@task ` starts, even inside a line.
            let lines: Vec<&str> = text.split("@task ").flat_map(str::lines).collect();
            for s in &tasks {
                check_snapshot_state(s, &lines);
                assert!(s.stdout.is_empty() && s.stderr.is_empty() && s.stdout_next_offset == 0 && s.stderr_next_offset == 0, "{s:?}");
            }
            assert!(tasks.windows(2).all(|w| (w[0].started_at, &w[0].task_id) <= (w[1].started_at, &w[1].task_id)), "sorted");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// log_page: page arithmetic, masking of log bytes, base64.

/// Secret pieces as `Masker::from_values` documents them.
fn model_secrets(values: &[&str]) -> Vec<Vec<u8>> {
    values
        .iter()
        .flat_map(|v| v.split('\n'))
        .map(|l| l.trim_matches([' ', '\t', '\r']))
        .filter(|l| l.len() >= MIN_SECRET_BYTES)
        .map(|l| l.as_bytes().to_vec())
        .collect()
}

/// Masking as documented: every byte inside some occurrence of some secret is covered, and each
/// maximal run of covered bytes (overlapping or touching occurrences) becomes one `***`; repeated
/// while a secret is left (one with `*` in it can line up with a mask).
fn model_mask(secrets: &[Vec<u8>], text: &[u8]) -> Vec<u8> {
    let mut out = model_mask_once(secrets, text);
    while secrets.iter().any(|s| find(&out, s).is_some()) {
        out = model_mask_once(secrets, &out);
    }
    out
}

fn model_mask_once(secrets: &[Vec<u8>], text: &[u8]) -> Vec<u8> {
    let mut covered = vec![false; text.len()];
    for s in secrets {
        for (i, w) in text.windows(s.len()).enumerate() {
            if w == s.as_slice() {
                covered[i..i + s.len()].fill(true);
            }
        }
    }
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        if covered[i] {
            out.extend_from_slice(sandbox_mcp::mask::MASK.as_bytes());
            while i < text.len() && covered[i] {
                i += 1;
            }
        } else {
            out.push(text[i]);
            i += 1;
        }
    }
    out
}

fn check_mask(masker: &Masker, secrets: &[Vec<u8>], text: &[u8]) {
    let out = masker.mask_bytes(text);
    assert_eq!(out, model_mask(secrets, text), "mask_bytes");
    if std::str::from_utf8(text).is_ok() {
        assert!(std::str::from_utf8(&out).is_ok(), "masking UTF-8 must keep it UTF-8");
    }
    for s in secrets {
        assert!(find(&out, s).is_none(), "a secret survived masking");
    }
    let lossy = String::from_utf8_lossy(text);
    assert_eq!(masker.mask_str(&lossy).as_bytes(), model_mask(secrets, lossy.as_bytes()), "mask_str");
}

/// A decoded base64 text re-encodes to the same symbols (whitespace, padding and the URL-safe
/// alphabet aside): decoding is strict about stray bits.
fn check_base64_text(text: &str) {
    let Some(bytes) = sandbox_mcp::base64::decode(text) else { return };
    let canonical: String = text
        .chars()
        .filter(|c| !c.is_ascii_whitespace() && *c != '=')
        .map(|c| match c {
            '-' => '+',
            '_' => '/',
            c => c,
        })
        .collect();
    assert_eq!(sandbox_mcp::base64::encode(&bytes).trim_end_matches('='), canonical, "{text:?}");
}

/// One log page: cut by a synthetic status answer, masked as the tools mask it, and base64
/// encoded as envd carries it.
pub fn log_page(data: &[u8]) {
    let Some((head, rest)) = data.split_first_chunk::<8>() else { return };
    let offset = u64::from(u16::from_be_bytes([head[0], head[1]]));
    let limit = u64::from(u16::from_be_bytes([head[2], head[3]])) + 1;
    let size = u64::from(u32::from_be_bytes([head[4], head[5], head[6], head[7]]));
    let (values_part, page) = match rest.iter().position(|b| *b == 0) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (&[][..], rest),
    };

    let header = format!("@task {ID}\nstatus=running\nlive=1\nout_size={size}\nerr_size={size}\n@end\n");
    let answer = [header.as_bytes(), page].concat();
    let window = Window { stdout_offset: offset, stderr_offset: offset, limit };
    let s = supervisor::parse_answer(&answer, page, ID, window).expect("a well-formed answer parses");
    assert_eq!((s.state, s.stdout_bytes, s.stderr_bytes), (TaskState::Running, size, size));
    check_page(&s.stdout, s.stdout_next_offset, page, size, offset, limit, "stdout");
    check_page(&s.stderr, s.stderr_next_offset, page, size, offset, limit, "stderr");

    let values_text = String::from_utf8_lossy(values_part);
    let values: Vec<&str> = values_text.split('\u{1}').collect();
    let masker = Masker::from_values(values.iter().copied());
    let (first, second) = values.split_at(values.len() / 2);
    let merged = Masker::from_values(first.iter().copied()).merged(&Masker::from_values(second.iter().copied()));
    assert_eq!(merged, masker, "merging maskers equals one masker of all values");
    let secrets = model_secrets(&values);
    assert_eq!(masker.is_empty(), secrets.is_empty());
    check_mask(&masker, &secrets, page);
    check_mask(&masker, &secrets, &s.stdout);

    // As tools/mod.rs masks a rendered snapshot: every string, at any depth, keys included (the
    // test's own keys are shorter than any secret).
    let text = String::from_utf8_lossy(&s.stdout).into_owned();
    let mut keyed = Map::new();
    keyed.insert(text.clone(), json!(1));
    let mut rendered = json!({"out": text, "deep": [{"page": text}], "off": s.stdout_next_offset, "keyed": keyed});
    masker.mask_json(&mut rendered);
    let masked = masker.mask_str(&text);
    let mut keyed = Map::new();
    keyed.insert(masked.clone(), json!(1));
    let expected = json!({"out": masked, "deep": [{"page": masked}], "off": s.stdout_next_offset, "keyed": keyed});
    assert_eq!(rendered, expected, "mask_json");

    let encoded = sandbox_mcp::base64::encode(page);
    assert_eq!(encoded.len(), page.len().div_ceil(3) * 4);
    assert_eq!(sandbox_mcp::base64::decode(&encoded).as_deref(), Some(page), "base64 round trip");
    if let Ok(text) = std::str::from_utf8(page) {
        check_base64_text(text);
    }
    check_base64_text(&values_text);
}
