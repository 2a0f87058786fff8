//! The E2B emulator (`e2b-emulator`, built beside sandbox-mcp) as a child process, its request
//! counts, and sandbox-mcp servers whose e2b provider points at it.

use crate::bench::Bench;
use crate::http_client::Http;
use crate::process::stop_child;
use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::fs::{self, File};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// An API key of E2B's form (the emulator accepts any non-empty key).
const E2B_KEY: &str = "e2b_0000000000000000000000000000000000000000";

/// The E2B emulator (`e2b-emulator`) on a free loopback port with a new state root under the
/// work directory, and a keep-alive client for its test API.
pub struct Emulator {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    api: Option<Http>,
}

impl Emulator {
    pub fn start(b: &Bench, exe: &Path) -> Result<Emulator> {
        let log_path = b.log("e2b-emulator");
        let log = File::create(&log_path)?;
        let child = Command::new(exe)
            .args(["--listen", "127.0.0.1:0", "--home"])
            .arg(b.o.work.join("e2b-home"))
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        b.track(child.id(), "e2b-emulator")?;
        let mut emu = Emulator { child, url: String::new(), api: None };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let text = fs::read_to_string(&log_path).unwrap_or_default();
            if let Some(rest) = text.split("listening on http://").nth(1) {
                let addr = rest.split_whitespace().next().unwrap_or_default().trim_end_matches('/');
                emu.url = format!("http://{addr}");
                emu.api = Some(Http::new(&format!("{}/_emulator/requests", emu.url))?);
                return Ok(emu);
            }
            if let Ok(Some(st)) = emu.child.try_wait() {
                bail!("the E2B emulator exited ({st}): {text}");
            }
            if Instant::now() > deadline {
                bail!("the E2B emulator did not report its address within 10 s");
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// `GET /_emulator/requests`: `{"total": N, "routes": {"POST /process.Process/Start": n, …}}`.
    pub fn counts(&mut self) -> Result<Value> {
        let api = self.api.as_mut().context("the emulator is not running")?;
        let (status, text) = api.send("GET", "")?;
        if status != 200 {
            bail!("GET /_emulator/requests answered {status} {text}");
        }
        serde_json::from_str(&text).with_context(|| format!("GET /_emulator/requests answered {text:?}"))
    }

    /// `DELETE /_emulator/requests`: the counts start again from zero.
    pub fn reset(&mut self) -> Result<()> {
        let api = self.api.as_mut().context("the emulator is not running")?;
        let (status, text) = api.send("DELETE", "")?;
        if !matches!(status, 200 | 204) {
            bail!("DELETE /_emulator/requests answered {status} {text}");
        }
        Ok(())
    }

    /// sandbox-mcp over stdio with the e2b provider pointed at this emulator.
    pub fn server(&self, b: &Bench) -> Command {
        e2b_server(b, &self.url)
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        self.api = None; // closes the test API connection
        stop_child(&mut self.child, Duration::from_secs(10)); // SIGTERM: it kills its sandboxes and exits
    }
}

/// sandbox-mcp over stdio with the e2b provider pointed at `url` (control plane and envd).
pub fn e2b_server(b: &Bench, url: &str) -> Command {
    let mut c = b.ours(&["stdio"]);
    c.env("SANDBOX_MCP_PROVIDER", "e2b").env("E2B_API_KEY", E2B_KEY).env("E2B_API_URL", url).env("E2B_SANDBOX_URL", url);
    c
}
