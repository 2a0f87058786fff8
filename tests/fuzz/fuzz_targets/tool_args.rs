//! Fuzz target `tool_args`: the body is `targets::tool_args` in tests/fuzz/targets.rs (shared with the
//! corpus replay test in tests/it/fuzz_corpus.rs).

#![no_main]

#[allow(dead_code)]
#[path = "../targets.rs"]
mod targets;

libfuzzer_sys::fuzz_target!(|data: &[u8]| targets::tool_args(data));
