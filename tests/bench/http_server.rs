//! sandbox-mcp's HTTP transport as a child process on a free loopback port, its address read
//! from its log.

use crate::bench::Bench;
use crate::process::stop_child;
use anyhow::{bail, Context, Result};
use std::fs::{self, File};
use std::process::{Child, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// `sandbox-mcp http --listen 127.0.0.1:0 --workers N` and its MCP endpoint.
pub struct HttpServer {
    child: Child,
    pub url: String,
}

impl HttpServer {
    /// Starts the server and waits (up to 10 s) until it logs its address.
    pub fn start(b: &Bench, workers: usize) -> Result<HttpServer> {
        let log_path = b.log(&format!("http-workers-{workers}"));
        let log = File::create(&log_path)?;
        let w = workers.to_string();
        let child = b
            .ours(&["http", "--listen", "127.0.0.1:0", "--workers", &w])
            .env("RUST_LOG", "warn,sandbox_mcp::server=info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .context("starting sandbox-mcp http")?;
        b.track(child.id(), "sandbox-mcp")?;
        let mut server = HttpServer { child, url: String::new() };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let text = fs::read_to_string(&log_path).unwrap_or_default();
            if let Some(rest) = text.split("listening on http://").nth(1) {
                let addr = rest.split('/').next().unwrap_or_default();
                server.url = format!("http://{addr}/mcp");
                return Ok(server);
            }
            if let Ok(Some(st)) = server.child.try_wait() {
                bail!("the HTTP server exited ({st}): {text}");
            }
            if Instant::now() > deadline {
                bail!("the HTTP server did not report its address within 10 s");
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// The server's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        stop_child(&mut self.child, Duration::from_secs(5));
    }
}
