//! Fuzz target `jsonrpc_line`: the body is `targets::jsonrpc_line` in tests/fuzz/targets.rs (shared with the
//! corpus replay test in tests/it/fuzz_corpus.rs).

#![no_main]

#[allow(dead_code)]
#[path = "../targets.rs"]
mod targets;

libfuzzer_sys::fuzz_target!(|data: &[u8]| targets::jsonrpc_line(data));
