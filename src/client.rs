//! A minimal MCP client over a child's stdio: used by `sandbox-mcp demo`, the benchmarks and
//! the integration tests, so that all three drive the real server the way MCP hosts do.
//!
//! Each request goes out as one line, written at once (`write_all` of a buffer the client
//! keeps). Answers are read in one of two ways, chosen when the server is started ([`Reads`]):
//! by a reader thread, so that every read can time out (the tests and the demo), or in the
//! caller's own thread, blocking, which spares a thread hand-off per message (the benchmarks,
//! whose round trips are measured through this client).

use anyhow::{anyhow, bail, Context, Result};
use crossbeam_channel::{Receiver, RecvTimeoutError};
use serde::Serialize;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How the client reads the server's stdout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reads {
    /// A reader thread hands each line over a channel: every read waits at most its timeout.
    WithTimeouts,
    /// The calling thread reads, blocking until a line or EOF arrives: no thread hand-off, and
    /// the timeout arguments are not applied. Bound such a run another way; stopping the server
    /// ends a pending read with an error.
    Blocking,
}

/// Where the lines of the server's stdout come from.
enum Incoming {
    /// Filled by the reader thread; disconnected at EOF.
    Channel(Receiver<String>),
    /// Read in place, into a line buffer that is reused.
    Direct(Mutex<(BufReader<ChildStdout>, String)>),
}

/// A JSON-RPC request, serialized with its members in the same order as `serde_json::json!`
/// would (sorted), without `params` when there are none.
#[derive(Serialize)]
struct Request<'a> {
    id: i64,
    jsonrpc: &'static str,
    method: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    params: Option<&'a Value>,
}

/// A server process spoken to over its stdin and stdout.
pub struct StdioClient {
    child: Child,
    stdin: Option<ChildStdin>,
    incoming: Incoming,
    next_id: i64,
    /// The outgoing line, reused from request to request.
    out: Vec<u8>,
}

impl StdioClient {
    /// Starts `program args...` with `envs` added to (or, with `clear_env`, replacing) this
    /// process's environment. stderr is inherited; reads can time out.
    pub fn spawn(program: &Path, args: &[&str], envs: &[(&str, &str)], clear_env: bool) -> Result<StdioClient> {
        let mut cmd = Command::new(program);
        cmd.args(args).stderr(Stdio::inherit());
        if clear_env {
            cmd.env_clear();
        }
        cmd.envs(envs.iter().copied());
        StdioClient::start(cmd, Reads::WithTimeouts)
    }

    /// Starts `cmd` with its stdin and stdout piped to this client; its stderr stays as `cmd`
    /// sets it (inherited unless set).
    pub fn start(mut cmd: Command, reads: Reads) -> Result<StdioClient> {
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
        let mut child = cmd.spawn().with_context(|| format!("starting {cmd:?}"))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().context("the child has no stdout")?;
        let incoming = match reads {
            Reads::Blocking => Incoming::Direct(Mutex::new((BufReader::new(stdout), String::new()))),
            Reads::WithTimeouts => {
                let (tx, rx) = crossbeam_channel::unbounded();
                let reader = std::thread::Builder::new().name("mcp-client-stdout".into()).spawn(move || {
                    for line in BufReader::new(stdout).lines() {
                        let Ok(line) = line else { break };
                        if tx.send(line).is_err() {
                            break;
                        }
                    }
                });
                if let Err(err) = reader {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(err).context("starting the client's stdout reader thread");
                }
                Incoming::Channel(rx)
            }
        };
        Ok(StdioClient { child, stdin, incoming, next_id: 1, out: Vec::with_capacity(256) })
    }

    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends one raw line.
    pub fn send_line(&mut self, line: &str) -> Result<()> {
        self.out.clear();
        self.out.extend_from_slice(line.as_bytes());
        self.flush_line()
    }

    /// Writes the buffered line and a newline at once.
    fn flush_line(&mut self) -> Result<()> {
        self.out.push(b'\n');
        let stdin = self.stdin.as_mut().ok_or_else(|| anyhow!("the server's stdin is already closed"))?;
        stdin.write_all(&self.out).context("writing to the server's stdin (has it exited?)")?;
        stdin.flush()?;
        Ok(())
    }

    /// Waits for the next line on stdout (without its newline) and passes it to `f`.
    fn with_line<R>(&self, timeout: Duration, f: impl FnOnce(&str) -> R) -> Result<R> {
        match &self.incoming {
            Incoming::Channel(rx) => match rx.recv_timeout(timeout) {
                Ok(line) => Ok(f(&line)),
                Err(RecvTimeoutError::Timeout) => bail!("no message from the server within {timeout:?}"),
                Err(RecvTimeoutError::Disconnected) => bail!("the server closed its stdout (has it exited?)"),
            },
            Incoming::Direct(state) => {
                let mut state = state.lock().map_err(|_| anyhow!("a reader of this client panicked"))?;
                let (out, line) = &mut *state;
                line.clear();
                if out.read_line(line).context("reading the server's stdout")? == 0 {
                    bail!("the server closed its stdout (has it exited?)");
                }
                Ok(f(line.trim_end_matches(['\n', '\r'])))
            }
        }
    }

    /// Waits for the next line on stdout.
    pub fn recv_line(&self, timeout: Duration) -> Result<String> {
        self.with_line(timeout, str::to_string)
    }

    /// Waits for the response with id `id`, skipping notifications and other responses.
    pub fn recv_response(&self, id: &Value, timeout: Duration) -> Result<Value> {
        let deadline = Instant::now().checked_add(timeout);
        loop {
            let left = deadline.map_or(timeout, |d| d.saturating_duration_since(Instant::now()));
            let msg = self.with_line(left, |line| {
                serde_json::from_str::<Value>(line).with_context(|| format!("the server wrote a non-JSON line: {line:?}"))
            })??;
            if msg.get("id") == Some(id) {
                return Ok(msg);
            }
        }
    }

    /// Sends a request (without `params` when `None`) and returns its id.
    fn send_request(&mut self, method: &str, params: Option<&Value>) -> Result<Value> {
        let id = self.next_id;
        self.next_id += 1;
        self.out.clear();
        serde_json::to_writer(&mut self.out, &Request { id, jsonrpc: "2.0", method, params })?;
        self.flush_line()?;
        Ok(json!(id))
    }

    /// Sends a request and returns the whole response message.
    pub fn request(&mut self, method: &str, params: Value, timeout: Duration) -> Result<Value> {
        let id = self.send_request(method, Some(&params))?;
        self.recv_response(&id, timeout)
    }

    /// Sends a request (without `params` when `None`) and returns its `result` (null when the
    /// response has none); an error response is an error.
    pub fn result(&mut self, method: &str, params: Option<&Value>, timeout: Duration) -> Result<Value> {
        let id = self.send_request(method, params)?;
        let mut resp = self.recv_response(&id, timeout)?;
        if let Some(err) = resp.get("error") {
            bail!("{method} failed: {err}");
        }
        Ok(resp.get_mut("result").map(Value::take).unwrap_or(Value::Null))
    }

    /// `initialize` + `notifications/initialized`.
    pub fn initialize(&mut self) -> Result<Value> {
        self.initialize_as("sandbox-mcp-client")
    }

    /// `initialize` (naming this client `client_name`) + `notifications/initialized`.
    pub fn initialize_as(&mut self, client_name: &str) -> Result<Value> {
        let params = json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": client_name, "version": "0"}});
        let result = self.result("initialize", Some(&params), Duration::from_secs(10))?;
        self.send_line(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)?;
        Ok(result)
    }

    /// Calls a tool and returns its `CallToolResult` (errors only for protocol failures).
    pub fn call_tool(&mut self, name: &str, arguments: Value, timeout: Duration) -> Result<Value> {
        let resp = self.request("tools/call", json!({"name": name, "arguments": arguments}), timeout)?;
        match resp.get("result") {
            Some(r) => Ok(r.clone()),
            None => bail!("tools/call {name} failed: {resp}"),
        }
    }

    /// Closes stdin and waits for the process to exit (killing it after `timeout`).
    pub fn close(mut self, timeout: Duration) -> Result<ExitStatus> {
        drop(self.stdin.take());
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let status = self.child.wait()?;
                bail!("server did not exit within {timeout:?} of stdin EOF (killed: {status})");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Kills the process (SIGKILL) and reaps it.
    pub fn kill(mut self) -> Result<ExitStatus> {
        self.child.kill()?;
        Ok(self.child.wait()?)
    }
}

impl Drop for StdioClient {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `cat` answers every request line with the same line: a response to itself.
    fn cat(reads: Reads) -> StdioClient {
        StdioClient::start(Command::new("cat"), reads).expect("starting cat")
    }

    #[test]
    fn a_request_line_has_sorted_members_and_params_only_when_given() {
        for reads in [Reads::WithTimeouts, Reads::Blocking] {
            let mut c = cat(reads);
            let id = c.send_request("ping", None).unwrap();
            assert_eq!(c.recv_line(Duration::from_secs(5)).unwrap(), r#"{"id":1,"jsonrpc":"2.0","method":"ping"}"#);
            assert_eq!(id, json!(1));
            let params = json!({"name": "x", "arguments": {"b": 1, "a": 2}});
            c.send_request("tools/call", Some(&params)).unwrap();
            let want = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": params}).to_string();
            assert_eq!(c.recv_line(Duration::from_secs(5)).unwrap(), want);
        }
    }

    #[test]
    fn result_is_null_for_a_response_without_one_and_an_error_for_an_error_response() {
        // `cat` echoes the request, which has the right id but neither result nor error.
        for reads in [Reads::WithTimeouts, Reads::Blocking] {
            let mut c = cat(reads);
            assert_eq!(c.result("ping", None, Duration::from_secs(5)).unwrap(), Value::Null);
            let resp = c.request("ping", json!({}), Duration::from_secs(5)).unwrap();
            assert_eq!(resp["id"], json!(2));
            // The echoed request carries params.error, not error: still no error response.
            let params = json!({"error": 1});
            assert_eq!(c.result("x", Some(&params), Duration::from_secs(5)).unwrap(), Value::Null);
            c.send_line(r#"{"jsonrpc":"2.0","id":4,"error":{"code":-32601,"message":"no such method"}}"#).unwrap();
            let err = c.result("nothing", None, Duration::from_secs(5)).unwrap_err().to_string();
            assert!(err.contains("nothing failed") && err.contains("no such method"), "{err}");
            c.close(Duration::from_secs(5)).unwrap();
        }
    }

    #[test]
    fn responses_with_other_ids_are_skipped() {
        for reads in [Reads::WithTimeouts, Reads::Blocking] {
            let mut c = cat(reads);
            c.send_line(r#"{"jsonrpc":"2.0","method":"notifications/x"}"#).unwrap();
            c.send_line(r#"{"jsonrpc":"2.0","id":7,"result":{}}"#).unwrap();
            c.send_line(r#"{"jsonrpc":"2.0","id":1,"result":{"ok":true}}"#).unwrap();
            assert_eq!(c.recv_response(&json!(1), Duration::from_secs(5)).unwrap()["result"], json!({"ok": true}));
        }
    }

    #[test]
    fn a_closed_stdout_ends_a_read_with_an_error() {
        for reads in [Reads::WithTimeouts, Reads::Blocking] {
            let c = StdioClient::start(Command::new("true"), reads).unwrap();
            let err = c.recv_line(Duration::from_secs(5)).unwrap_err().to_string();
            assert!(err.contains("closed its stdout"), "{err}");
        }
    }

    #[test]
    fn a_read_with_timeouts_gives_up() {
        let c = cat(Reads::WithTimeouts);
        let err = c.recv_line(Duration::from_millis(50)).unwrap_err().to_string();
        assert!(err.contains("within"), "{err}");
    }
}
