//! The driver's command line: which binaries and peers to measure, where to write, how much.

use anyhow::{anyhow, bail, Result};
use std::path::PathBuf;

const USAGE: &str = "usage: bench-driver --bin SANDBOX_MCP --work DIR --json FILE --md FILE \
[--python PYTHON --peer-py FILE] [--node NODE --everything FILE] [--pueue-dir DIR] [--e2b-emulator E2B_EMULATOR] [--quick] [--only core,peers,tasks,processes,pueue,http,protocol,concurrency,e2b,egress,ports]";

/// The parsed command line.
pub struct Opts {
    pub bin: PathBuf,
    pub work: PathBuf,
    pub json: PathBuf,
    pub md: PathBuf,
    pub python: Option<PathBuf>,
    pub peer_py: Option<PathBuf>,
    pub node: Option<PathBuf>,
    pub everything: Option<PathBuf>,
    pub pueue_dir: Option<PathBuf>,
    pub e2b_emulator: Option<PathBuf>,
    pub quick: bool,
    /// Run only the sections whose group or name contains one of these words (for development).
    pub only: Vec<String>,
}

/// Reads the command line; a missing or unknown flag is an error that shows the usage.
pub fn parse_opts() -> Result<Opts> {
    let mut o = Opts {
        bin: PathBuf::new(),
        work: PathBuf::new(),
        json: PathBuf::new(),
        md: PathBuf::new(),
        python: None,
        peer_py: None,
        node: None,
        everything: None,
        pueue_dir: None,
        e2b_emulator: None,
        quick: false,
        only: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--quick" {
            o.quick = true;
            continue;
        }
        let value = args.next().map(PathBuf::from).ok_or_else(|| anyhow!("{flag} needs a value\n{USAGE}"))?;
        match flag.as_str() {
            "--bin" => o.bin = value,
            "--work" => o.work = value,
            "--json" => o.json = value,
            "--md" => o.md = value,
            "--python" => o.python = Some(value),
            "--peer-py" => o.peer_py = Some(value),
            "--node" => o.node = Some(value),
            "--everything" => o.everything = Some(value),
            "--pueue-dir" => o.pueue_dir = Some(value),
            "--e2b-emulator" => o.e2b_emulator = Some(value),
            "--only" => o.only = value.to_string_lossy().split(',').map(str::to_string).collect(),
            _ => bail!("unknown argument {flag:?}\n{USAGE}"),
        }
    }
    for (name, p) in [("--bin", &o.bin), ("--work", &o.work), ("--json", &o.json), ("--md", &o.md)] {
        if p.as_os_str().is_empty() {
            bail!("{name} is required\n{USAGE}");
        }
    }
    Ok(o)
}
