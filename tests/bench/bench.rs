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

/// What a relay row names ([`Bench::transfer_rows`]).
pub struct Transfer<'a> {
    pub group: &'static str,
    pub label: &'a str,
    /// What the direct transfer is, before its time.
    pub vs: &'a str,
    pub key: &'a str,
    pub via_name: &'a str,
    pub bytes: usize,
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

    /// The rows of a transfer through a relay: its samples (`xs`, in the order the product's
    /// relay, direct, the bare relay of [`crate::bare_relay`]) kept as `{key}.{via_name}`,
    /// `{key}.direct` and `{key}.bare`; the share of the direct rate the relay reaches, with its
    /// target of 80%, and a floor row: the share a bare copy loop reaches in the same run, and
    /// the relay's share of that.
    pub fn transfer_rows(&mut self, t: Transfer<'_>, xs: &[Vec<f64>]) {
        let [via, direct, bare] = xs else {
            self.row(Row::new(t.group, t.label).not_measured(format!("{} sample sets, not 3", xs.len())));
            return;
        };
        let relayed = self.keep(&format!("{}.{}", t.key, t.via_name), via);
        let direct = self.keep(&format!("{}.direct", t.key), direct);
        let bare = self.keep(&format!("{}.bare", t.key), bare);
        let share = direct.median / relayed.median;
        self.row(
            Row::new(t.group, t.label)
                .lat(&relayed)
                .rate(crate::units::per_s(t.bytes as f64 / relayed.median / 1e6, "MB"))
                .vs(format!("{}{}", t.vs, crate::units::dur(direct.median)))
                .ratio(format!("{:.0}% of direct", share * 100.0))
                .target("≥ 80% of direct", share >= 0.8),
        );
        self.row(
            Row::floor(t.group, "the same transfer through a bare relay (read/write loop, 2 MiB buffer, no limits)", &bare)
                .rate(crate::units::per_s(t.bytes as f64 / bare.median / 1e6, "MB"))
                .vs(format!("direct {}", crate::units::dur(direct.median)))
                .ratio(format!(
                    "{:.0}% of direct; the relay {:.0}% of it",
                    direct.median / bare.median * 100.0,
                    bare.median / relayed.median * 100.0
                )),
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
