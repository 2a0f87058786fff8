//! Replays the committed fuzz corpus (`fixtures/fuzz/<target>/*`) and every crash regression
//! (`fixtures/fuzz/regressions/<target>/*`) through the fuzz target bodies, so plain `cargo test`
//! checks them without libFuzzer. The fuzzer itself runs from `tests/fuzz/run.sh`.

#[path = "../fuzz/targets.rs"]
mod targets;

use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};

fn files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut files: Vec<PathBuf> = entries.map(|e| e.unwrap().path()).filter(|p| p.is_file()).collect();
    files.sort();
    files
}

fn subdirs(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries.map(|e| e.unwrap()).filter(|e| e.path().is_dir()).map(|e| e.file_name().to_string_lossy().into_owned()).collect()
}

#[test]
fn corpus_and_regressions_pass_every_target() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/fuzz");
    let known: Vec<&str> = targets::TARGETS.iter().map(|(name, _)| *name).collect();
    for dir in subdirs(&root).iter().filter(|d| *d != "regressions").chain(subdirs(&root.join("regressions")).iter()) {
        assert!(known.contains(&dir.as_str()), "fixtures/fuzz has inputs for an unknown target {dir:?}");
    }
    let mut failures = Vec::new();
    for (name, run) in targets::TARGETS {
        let seeds = files(&root.join(name));
        assert!(!seeds.is_empty(), "fixtures/fuzz/{name} has no seed inputs");
        for file in seeds.iter().chain(files(&root.join("regressions").join(name)).iter()) {
            let data = std::fs::read(file).unwrap();
            if let Err(panic) = panic::catch_unwind(AssertUnwindSafe(|| run(&data))) {
                let why = panic.downcast_ref::<String>().cloned().or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()));
                failures.push(format!("{}: {}", file.display(), why.unwrap_or_default()));
            }
        }
    }
    assert!(failures.is_empty(), "fuzz inputs that fail:\n{}", failures.join("\n"));
}
