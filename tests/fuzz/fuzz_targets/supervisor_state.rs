//! Fuzz target `supervisor_state`: the body is `targets::supervisor_state` in tests/fuzz/targets.rs (shared with the
//! corpus replay test in tests/it/fuzz_corpus.rs).

#![no_main]

#[allow(dead_code)]
#[path = "../targets.rs"]
mod targets;

libfuzzer_sys::fuzz_target!(|data: &[u8]| targets::supervisor_state(data));
