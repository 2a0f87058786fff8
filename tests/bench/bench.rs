//! The state of one run: the options, the isolated state root, the rows and raw samples
//! collected so far, and the sections that fill them.

use crate::options::Opts;
use crate::stats::Stats;
use crate::stdio::PeerFigures;
use crate::table::Row;
use crate::units::secs;
use anyhow::Result;
use serde_json::{json, Map, Value};
use std::fs::OpenOptions;
use std::io::Write;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// Reads `size` bytes from `from` (a transfer's receiving end), or fails on an early end.
pub fn receive(from: &mut impl std::io::Read, size: usize) -> Result<()> {
    let mut buf = vec![0u8; 256 * 1024];
    let mut got = 0;
    while got < size {
        match from.read(&mut buf)? {
            0 => return Err(anyhow::anyhow!("the transfer ended after {got} bytes")),
            n => got += n,
        }
    }
    Ok(())
}

/// Upper bound of any one request loop.
pub const MAX_ITERATIONS: u64 = 2_000_000;

/// The run: what was measured so far and how to measure more.
pub struct Bench {
    pub o: Opts,
    pub home: PathBuf,
    pub rows: Vec<Row>,
    pub raw: Map<String, Value>,
    pub nproc: usize,
    pub failed: usize,
    /// sandbox-mcp's own stdio figures, for the peer rows.
    pub ours: Option<PeerFigures>,
    /// The median stdio round trip through `cat` (the client's and the pipes' share).
    pub stdio_floor: Option<f64>,
}

impl Bench {
    /// `full` repetitions, or a tenth of them with `--quick`.
    pub fn n(&self, full: usize) -> usize {
        if self.o.quick {
            (full / 10).max(2)
        } else {
            full
        }
    }

    /// A measurement window of `full_ms`, or a quarter of it (at least 100 ms) with `--quick`.
    pub fn window(&self, full_ms: u64) -> Duration {
        Duration::from_millis(if self.o.quick { (full_ms / 4).max(100) } else { full_ms })
    }

    /// Keeps the samples (seconds) under `key` and returns their statistics.
    pub fn keep(&mut self, key: &str, xs: &[f64]) -> Stats {
        let s = Stats::of(xs);
        self.raw.insert(key.into(), json!({"unit": "s", "stats": s.json(), "samples": xs}));
        s
    }

    /// The median of samples kept earlier in this run under `key`.
    pub fn kept_median(&self, key: &str) -> Option<f64> {
        self.raw.get(key)?["stats"]["median"].as_f64()
    }

    /// Keeps `v` under `key` in the raw results.
    pub fn keep_value(&mut self, key: &str, v: Value) {
        self.raw.insert(key.into(), v);
    }

    /// Adds a row to the table.
    pub fn row(&mut self, r: Row) {
        self.rows.push(r);
    }

    /// The row of a transfer of `bytes` through a relay (samples `via`, kept as `{key}.{via_name}`)
    /// against the same transfer direct (`direct`, kept as `{key}.direct`): the share of the
    /// direct rate the relay reaches, with its target of 80%.
    #[allow(clippy::too_many_arguments)]
    pub fn transfer_row(
        &mut self,
        group: &'static str,
        label: &str,
        vs: &str,
        key: &str,
        via_name: &str,
        bytes: usize,
        via: &[f64],
        direct: &[f64],
    ) {
        let relayed = self.keep(&format!("{key}.{via_name}"), via);
        let direct = self.keep(&format!("{key}.direct"), direct);
        let share = direct.median / relayed.median;
        self.row(
            Row::new(group, label)
                .lat(&relayed)
                .rate(crate::units::per_s(bytes as f64 / relayed.median / 1e6, "MB"))
                .vs(format!("{vs}{}", crate::units::dur(direct.median)))
                .ratio(format!("{:.0}% of direct", share * 100.0))
                .target("≥ 80% of direct", share >= 0.8),
        );
    }

    /// The sandbox-mcp binary with an isolated state root and the local provider.
    pub fn ours(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.o.bin);
        c.args(args)
            .env("SANDBOX_MCP_HOME", &self.home)
            .env("SANDBOX_MCP_PROVIDER", "local")
            .env("RUST_LOG", "warn")
            // The load rows hold more live sandboxes at once than the default cap (64).
            .env("SANDBOX_MCP_MAX_SANDBOXES", "4096")
            .env_remove("E2B_API_KEY")
            .env_remove("SANDBOX_MCP_HTTP_TOKEN");
        c
    }

    /// WORK/NAME.log, where a child's stderr goes.
    pub fn log(&self, name: &str) -> PathBuf {
        self.o.work.join(format!("{name}.log"))
    }

    /// Lists a long-lived child in WORK/pids (`PID NAME`), for run.sh's cleanup.
    pub fn track(&self, pid: u32, name: &str) -> Result<()> {
        let mut f = OpenOptions::new().create(true).append(true).open(self.o.work.join("pids"))?;
        writeln!(f, "{pid} {name}")?;
        Ok(())
    }

    /// Runs one section; a failure becomes a "not measured" row and the run goes on.
    pub fn section(&mut self, group: &'static str, name: &str, f: impl FnOnce(&mut Bench) -> Result<()>) {
        if !self.o.only.is_empty() && !self.o.only.iter().any(|w| group.contains(w.as_str()) || name.contains(w.as_str())) {
            return;
        }
        eprintln!("bench: {name} …");
        let t = Instant::now();
        if let Err(err) = f(self) {
            self.failed += 1;
            eprintln!("bench: {name} FAILED: {err:#}");
            self.rows.push(Row::new(group, name).not_measured(format!("{name} failed: {err:#}")));
        }
        eprintln!("bench: {name}: {:.1} s", secs(t));
    }
}
