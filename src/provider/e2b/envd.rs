//! envd, the agent inside each E2B sandbox: commands through Connect RPC (`process.Process/Start`,
//! an enveloped server stream of JSON events), unary Connect calls such as
//! `filesystem.Filesystem/ListDir`, and file reads and writes over plain `/files`.
//!
//! Every request carries the edge-routing headers and the sandbox's access token. A failure that
//! may mean the sandbox is paused or gone is explained by asking the control plane.

use super::control::{ControlPlane, Known};
use super::loose;
use super::reply::{self, ErrorBody, Reply};
use super::wire::{self, ProcessEvent, END_STREAM};
use crate::provider::{DirEntry, EntryKind, ExecOutput, ExecRequest, ProviderError};
use serde::Deserialize;
use serde_json::{json, Value};
use std::io::Read;
use std::time::{Duration, Instant};

use super::sandbox_url::{SandboxUrl, ENVD_PORT};

/// The most of an envd answer read (ListDir's JSON).
const RPC_ANSWER_MAX: usize = 16 * 1024 * 1024;

/// One entry of a ListDir answer.
#[derive(Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
struct EntryReply {
    #[serde(deserialize_with = "loose::string")]
    name: Option<String>,
    /// `FILE_TYPE_FILE`, `FILE_TYPE_DIRECTORY`, `FILE_TYPE_SYMLINK`, ...
    #[serde(rename = "type", deserialize_with = "loose::string")]
    kind: Option<String>,
    /// Bytes; protobuf JSON writes this 64-bit integer as a string.
    #[serde(deserialize_with = "loose::number_or_text")]
    size: Option<u64>,
}

impl EntryReply {
    fn entry(self) -> DirEntry {
        let kind = match self.kind.as_deref() {
            Some("FILE_TYPE_FILE") => EntryKind::File,
            Some("FILE_TYPE_DIRECTORY") => EntryKind::Dir,
            Some("FILE_TYPE_SYMLINK") => EntryKind::Symlink,
            _ => EntryKind::Other,
        };
        let size = if kind == EntryKind::Dir { 0 } else { self.size.unwrap_or(0) };
        DirEntry { name: self.name.unwrap_or_default(), kind, size }
    }
}

/// The end-stream message of a Start stream: `{}` or `{"error": {code, message}}`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct EndOfStream {
    #[serde(deserialize_with = "loose::present")]
    error: Option<ErrorBody>,
}

/// The envd client.
pub(super) struct Envd {
    agent: ureq::Agent,
    /// How envd's address is built from the sandbox id and domain (E2B_SANDBOX_URL).
    sandbox_url: SandboxUrl,
    domain: String,
    request_timeout: Duration,
}

impl Envd {
    /// A client sharing `agent`'s connections.
    pub fn new(agent: ureq::Agent, sandbox_url: SandboxUrl, domain: String, request_timeout: Duration) -> Envd {
        Envd { agent, sandbox_url, domain, request_timeout }
    }

    fn url(&self, id: &str, known: &Known) -> String {
        self.sandbox_url.envd(id, known.domain.as_deref().unwrap_or(&self.domain))
    }

    /// The URL of TCP `port` of sandbox `id`, or why it cannot be built.
    pub fn port_url(&self, id: &str, port: u16, known: &Known) -> Result<String, String> {
        self.sandbox_url.port(id, port, known.domain.as_deref().unwrap_or(&self.domain))
    }

    fn get(&self, url: &str, id: &str, known: &Known, timeout: Duration) -> ureq::RequestBuilder<ureq::typestate::WithoutBody> {
        headers(self.agent.get(url).config().timeout_global(Some(timeout)).build(), id, known)
    }

    fn post(&self, url: &str, id: &str, known: &Known, timeout: Duration) -> ureq::RequestBuilder<ureq::typestate::WithBody> {
        headers(self.agent.post(url).config().timeout_global(Some(timeout)).build(), id, known)
    }

    /// A unary Connect call to envd; returns the raw JSON answer.
    fn rpc(
        &self,
        control: &ControlPlane,
        id: &str,
        known: &Known,
        method: &str,
        body: &Value,
        deadline: Instant,
    ) -> Result<Vec<u8>, ProviderError> {
        let url = format!("{}/{method}", self.url(id, known));
        let timeout = reply::timeout_for(self.request_timeout, deadline);
        let res = self
            .post(&url, id, known, timeout)
            .header("Content-Type", "application/json")
            .header("Connect-Protocol-Version", "1")
            .header("Connect-Timeout-Ms", timeout.as_millis().to_string())
            .send(body.to_string().as_bytes());
        let mut resp = res.map_err(|err| reply::transport_error(method, &err, timeout))?;
        let status = resp.status().as_u16();
        let mut buf = Vec::new();
        let read = resp.body_mut().as_reader().take(RPC_ANSWER_MAX as u64 + 1).read_to_end(&mut buf);
        if status != 200 {
            buf.truncate(RPC_ANSWER_MAX);
            return Err(error(control, id, method, &Reply { status, body: buf }, deadline));
        }
        // A cut or oversized answer is an error, never read as a shorter one (found by a review:
        // it read as an empty directory, reported complete).
        if let Err(err) = read {
            return Err(ProviderError::Unavailable(format!("envd's answer to {method} was cut short ({err}); try again")));
        }
        if buf.len() > RPC_ANSWER_MAX {
            return Err(ProviderError::Rejected(format!(
                "envd's answer to {method} is over {} MiB; ask for less (a smaller directory)",
                RPC_ANSWER_MAX >> 20
            )));
        }
        Ok(buf)
    }

    /// Runs one command through `process.Process/Start` and reads its event stream to the end.
    /// `started` is when the tool call began (the reported duration counts from there).
    pub fn exec(
        &self,
        control: &ControlPlane,
        id: &str,
        known: &Known,
        req: &ExecRequest,
        started: Instant,
    ) -> Result<ExecOutput, ProviderError> {
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
        let url = format!("{}/process.Process/Start", self.url(id, known));
        let res = self
            .post(&url, id, known, http_timeout)
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
                let e = reply::transport_error("process start", &err, http_timeout);
                return Err(if reply::before_sending(&err) { control.explain(id, e, req.deadline) } else { e });
            }
        };
        let status = resp.status().as_u16();
        if status != 200 {
            let mut buf = Vec::new();
            let _ = resp.body_mut().as_reader().take(64 * 1024).read_to_end(&mut buf);
            return Err(error(control, id, "process start", &Reply { status, body: buf }, req.deadline));
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

    /// `GET /files`: a whole file of at most `max_bytes`.
    pub fn read_file(
        &self,
        control: &ControlPlane,
        id: &str,
        known: &Known,
        path: &str,
        max_bytes: usize,
        deadline: Instant,
    ) -> Result<Vec<u8>, ProviderError> {
        let url = format!("{}/files?path={}", self.url(id, known), path_query(path));
        let timeout = reply::timeout_for(self.request_timeout, deadline);
        let res = self.get(&url, id, known, timeout).header("Accept-Encoding", "identity").call();
        let mut resp = res.map_err(|err| reply::transport_error("file read", &err, timeout))?;
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
            _ => Err(error(control, id, "file read", &Reply { status, body: data }, deadline)),
        }
    }

    /// `POST /files`: creates or replaces a file (envd creates missing parent directories).
    pub fn write_file(
        &self,
        control: &ControlPlane,
        id: &str,
        known: &Known,
        path: &str,
        data: &[u8],
        deadline: Instant,
    ) -> Result<u64, ProviderError> {
        let url = format!("{}/files?path={}", self.url(id, known), path_query(path));
        let timeout = reply::timeout_for(self.request_timeout, deadline);
        // Older envd (< 0.5.7) accepts only multipart uploads; every version accepts them.
        let boundary = format!("sandbox-mcp-{}", crate::ids::random_hex(12));
        let mut body = format!("--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"upload\"\r\nContent-Type: application/octet-stream\r\n\r\n").into_bytes();
        body.extend_from_slice(data);
        body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        let res = self
            .post(&url, id, known, timeout)
            .header("Content-Type", &format!("multipart/form-data; boundary={boundary}"))
            .send(&body[..]);
        let mut resp = res.map_err(|err| reply::transport_error("file write", &err, timeout))?;
        let status = resp.status().as_u16();
        let mut buf = Vec::new();
        let _ = resp.body_mut().as_reader().take(64 * 1024).read_to_end(&mut buf);
        match status {
            200 => Ok(data.len() as u64),
            400 => Err(ProviderError::Rejected(format!("{path:?} cannot be written ({})", Reply { status, body: buf }.message()))),
            507 => Err(ProviderError::Rejected("the sandbox's disk is full".into())),
            _ => Err(error(control, id, "file write", &Reply { status, body: buf }, deadline)),
        }
    }

    /// `filesystem.Filesystem/ListDir` at depth 1: at most `max_entries` entries sorted by name,
    /// and whether more were cut.
    pub fn list_dir(
        &self,
        control: &ControlPlane,
        id: &str,
        known: &Known,
        path: &str,
        max_entries: usize,
        deadline: Instant,
    ) -> Result<(Vec<DirEntry>, bool), ProviderError> {
        let answer = self.rpc(control, id, known, "filesystem.Filesystem/ListDir", &json!({"path": path, "depth": 1}), deadline)?;
        dir_entries(&answer, max_entries).ok_or_else(|| {
            ProviderError::Unavailable("envd answered ListDir with something other than a JSON object of entries; try again".into())
        })
    }
}

/// Checks a sandbox path before anything is sent.
pub(super) fn check_path(path: &str) -> Result<(), ProviderError> {
    if path.is_empty() || path.contains('\0') {
        return Err(ProviderError::Rejected("path must be a non-empty string without NUL bytes".into()));
    }
    Ok(())
}

/// The first `limit` entries by name of a ListDir answer, and whether it had more; `None` when
/// the answer is not a JSON object of entries. However many entries the answer holds, at most
/// about twice `limit` are kept while it is read (found by a review: 16 MiB of `[1,1,...]` made
/// 8 million entries, half a GiB).
fn dir_entries(answer: &[u8], limit: usize) -> Option<(Vec<DirEntry>, bool)> {
    fn by_name(entries: &mut Vec<DirEntry>, limit: usize) {
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        entries.truncate(limit);
    }
    let mut kept = Vec::new();
    let mut total = 0usize;
    loose::each_object(answer, "entries", &mut |e: EntryReply| {
        total += 1;
        kept.push(e.entry());
        if kept.len() >= limit.saturating_mul(2).max(1024) {
            by_name(&mut kept, limit);
        }
    })?;
    by_name(&mut kept, limit);
    Some((kept, total > limit))
}

/// Maps an envd (or edge proxy) error answer; failures that may mean the sandbox is paused or
/// gone are explained by the control plane.
fn error(control: &ControlPlane, id: &str, what: &str, reply: &Reply, deadline: Instant) -> ProviderError {
    let body = reply.error();
    let msg = reply.message();
    match body.code {
        Some(code) => match code.as_str() {
            "not_found" | "invalid_argument" | "failed_precondition" | "already_exists" | "permission_denied" | "out_of_range" => {
                ProviderError::Rejected(msg)
            }
            "unauthenticated" => control.explain(id, ProviderError::Rejected(format!("envd refused the access token ({msg})")), deadline),
            _ => control.explain(id, ProviderError::Unavailable(format!("envd failed {what}: {code}: {msg}")), deadline),
        },
        // Edge proxy (502 "The sandbox was not found") and other plain HTTP errors.
        None => control.explain(
            id,
            ProviderError::Unavailable(format!("envd answered {} to {what} ({msg}); retry later", reply.status)),
            deadline,
        ),
    }
}

/// Percent-encodes a path for the `/files?path=` query.
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

/// The headers E2B's SDK sends on every envd request: edge routing, and the access token.
fn headers<B>(rb: ureq::RequestBuilder<B>, id: &str, known: &Known) -> ureq::RequestBuilder<B> {
    let rb = rb.header("E2b-Sandbox-Id", id).header("E2b-Sandbox-Port", ENVD_PORT.to_string());
    match &known.token {
        Some(t) => rb.header("X-Access-Token", t),
        None => rb,
    }
}

/// What a Start stream said, read to its end.
struct StreamResult {
    out: ExecOutput,
    started: bool,
    ended: bool,
    /// Code and message of the end-stream error, if any.
    stream_error: Option<(String, String)>,
}

fn read_stream(reader: &mut impl Read, cap: usize) -> Result<StreamResult, String> {
    let mut r = StreamResult { out: ExecOutput::default(), started: false, ended: false, stream_error: None };
    loop {
        let frame = wire::read_envelope(reader, 8 * 1024 * 1024).map_err(|e| e.to_string())?;
        let Some((flags, payload)) = frame else { return Ok(r) };
        if flags & END_STREAM != 0 {
            if let Some(err) = loose::parse::<EndOfStream>(&payload).error {
                r.stream_error = Some((err.code.unwrap_or_else(|| "unknown".into()), err.message.unwrap_or_default()));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_paths_are_query_encoded() {
        assert_eq!(path_query("/home/user/a b&c=d.txt"), "/home/user/a%20b%26c%3Dd.txt");
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
        assert_eq!(r.stream_error, None);
        let cut = &s[..s.len() - 20];
        assert!(read_stream(&mut &cut[..], 100).is_err());
    }

    #[test]
    fn stream_errors_are_kept() {
        let mut s = wire::envelope(0, br#"{"event":{"start":{"pid":7}}}"#);
        s.extend(wire::envelope(END_STREAM, br#"{"error":{"code":"deadline_exceeded","message":"late","details":[]},"metadata":{}}"#));
        let r = read_stream(&mut &s[..], 10).unwrap();
        assert_eq!(r.stream_error, Some(("deadline_exceeded".into(), "late".into())));
        let s = wire::envelope(END_STREAM, br#"{"error":{}}"#);
        assert_eq!(read_stream(&mut &s[..], 10).unwrap().stream_error, Some(("unknown".into(), String::new())));
    }

    #[test]
    fn a_minimal_list_dir_answer() {
        let entries = dir_entries(br#"{"entries":[{"name":"a.txt","type":"FILE_TYPE_FILE","size":"12"}]}"#, 10);
        assert_eq!(entries, Some((vec![DirEntry { name: "a.txt".into(), kind: EntryKind::File, size: 12 }], false)));
        assert_eq!(dir_entries(b"{}", 10), Some((vec![], false)));
        assert_eq!(dir_entries(br#"{"entries":null}"#, 10), Some((vec![], false)));
    }

    /// An answer that is not a JSON object of entries, or is cut short, is no listing at all;
    /// a huge one costs what is kept, and says it was cut (found by a review: both read as an
    /// empty directory, reported complete, and 16 MiB of `[1,1,...]` cost half a GiB).
    #[test]
    fn list_dir_answers_are_whole_and_bounded() {
        for bad in [&b"[]"[..], b"\"entries\"", br#"{"entries":[{"name":"a"}"#, br#"{"entries":5}"#, b"{} x", b"\xff"] {
            assert_eq!(dir_entries(bad, 10), None, "{}", String::from_utf8_lossy(bad));
        }
        let mut many = String::from(r#"{"entries":["#);
        for i in (0..50_000).rev() {
            many.push_str(&format!(r#"{{"name":"f{i:05}","type":"FILE_TYPE_FILE"}},1,"#));
        }
        many.push_str("{}]}");
        let (entries, truncated) = dir_entries(many.as_bytes(), 3).unwrap();
        let names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
        // The nameless `{}` sorts first; the numbers are no entries.
        assert_eq!((names, truncated), (vec!["", "f00000", "f00001"], true));
        let (entries, truncated) = dir_entries(many.as_bytes(), 60_000).unwrap();
        assert_eq!((entries.len(), truncated), (50_001, false));
    }

    #[test]
    fn a_list_dir_answer_with_extra_fields() {
        let (entries, _) = dir_entries(
            br#"{"entries":[
                {"name":"d","type":"FILE_TYPE_DIRECTORY","path":"/home/user/d","size":4096,"mode":2147484141,"permissions":"drwxr-xr-x","owner":"user","group":"user","modifiedTime":"2026-12-02T16:40:18Z"},
                {"name":"l","type":"FILE_TYPE_SYMLINK","size":"7","symlinkTarget":"/tmp"},
                {"name":"p","type":"FILE_TYPE_UNSPECIFIED"},
                {"name":"big","type":"FILE_TYPE_FILE","size":"many"}
            ],"nextPage":null}"#,
            10,
        )
        .unwrap();
        assert_eq!(
            entries,
            vec![
                DirEntry { name: "big".into(), kind: EntryKind::File, size: 0 },
                DirEntry { name: "d".into(), kind: EntryKind::Dir, size: 0 },
                DirEntry { name: "l".into(), kind: EntryKind::Symlink, size: 7 },
                DirEntry { name: "p".into(), kind: EntryKind::Other, size: 0 },
            ]
        );
    }
}
