//! The record of refused connections: the proxy appends one JSON line per block to a file in the
//! sandbox's host-side directory (out of the sandbox's sight); the server reads the blocks since
//! a command started, so a result can say why the network failed (`network_blocked`). The file is
//! bounded: past [`MAX_FILE`] bytes it starts over.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// The block log, in a sandbox's directory.
pub const FILE: &str = "egress-blocks.jsonl";

/// The file starts over past this size; a read takes at most this much.
const MAX_FILE: u64 = 64 * 1024;

/// At most this many distinct blocks on one result.
pub const MAX_REPORTED: usize = crate::limits::NETWORK_BLOCKED_MAX;

/// One refused connection.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Block {
    /// The destination name or address asked for (only names and addresses that pass the
    /// proxy's syntax check are recorded; never a URL, its query or credentials).
    pub host: String,
    /// The destination port.
    pub port: u16,
    /// The rule or class that refused it.
    pub reason: String,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Line {
    /// Unix milliseconds.
    t: u64,
    #[serde(flatten)]
    block: Block,
}

/// Now, in Unix milliseconds.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// The block log of one sandbox.
#[derive(Debug, Clone)]
pub struct BlockLog {
    path: PathBuf,
}

impl BlockLog {
    /// The log in sandbox directory `dir`.
    pub fn new(dir: &Path) -> BlockLog {
        BlockLog { path: dir.join(FILE) }
    }

    /// Appends `block` (best effort: a failure to record never affects the connection).
    pub fn record(&self, block: &Block) {
        if fs::symlink_metadata(&self.path).is_ok_and(|m| m.len() > MAX_FILE) {
            let _ = fs::remove_file(&self.path);
        }
        let Ok(mut line) = serde_json::to_vec(&Line { t: now_ms(), block: block.clone() }) else { return };
        line.push(b'\n');
        let file = fs::OpenOptions::new().create(true).append(true).mode(0o600).custom_flags(libc_nofollow()).open(&self.path);
        if let Ok(mut file) = file {
            let _ = file.write_all(&line);
        }
    }

    /// The distinct blocks recorded at or after `since_ms` (at most [`MAX_REPORTED`]).
    pub fn since(&self, since_ms: u64) -> Vec<Block> {
        let Ok(file) = fs::OpenOptions::new().read(true).custom_flags(libc_nofollow()).open(&self.path) else { return Vec::new() };
        if !file.metadata().is_ok_and(|m| m.is_file()) {
            return Vec::new();
        }
        let mut text = Vec::new();
        if file.take(MAX_FILE * 2).read_to_end(&mut text).is_err() {
            return Vec::new();
        }
        let mut out: Vec<Block> = Vec::new();
        for line in text.split(|b| *b == b'\n') {
            let Ok(line) = serde_json::from_slice::<Line>(line) else { continue };
            if line.t >= since_ms && !out.iter().any(|b| b.host == line.block.host && b.port == line.block.port) {
                out.push(line.block);
                if out.len() == MAX_REPORTED {
                    break;
                }
            }
        }
        out
    }
}

/// `O_NOFOLLOW`: the log is never reached through a link.
fn libc_nofollow() -> i32 {
    rustix::fs::OFlags::NOFOLLOW.bits() as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_read_back_since_a_time_distinct_and_bounded() {
        let dir = std::env::temp_dir().join(format!("smcp-blocks-{}", crate::ids::random_hex(4)));
        fs::create_dir_all(&dir).unwrap();
        let log = BlockLog::new(&dir);
        assert!(log.since(0).is_empty());
        let block = |host: &str| Block { host: host.into(), port: 443, reason: "no entry of the allow list matches it".into() };
        log.record(&block("a.test"));
        log.record(&block("a.test"));
        log.record(&block("b.test"));
        assert_eq!(log.since(0), vec![block("a.test"), block("b.test")]);
        assert!(log.since(now_ms() + 10_000).is_empty());
        for i in 0..2000 {
            log.record(&block(&format!("host{i}.test")));
        }
        assert!(fs::metadata(dir.join(FILE)).unwrap().len() <= MAX_FILE + 200);
        assert_eq!(log.since(0).len(), MAX_REPORTED);
        fs::remove_dir_all(&dir).unwrap();
    }
}
