//! Fuzz target `log_page`: the body is `targets::log_page` in tests/fuzz/targets.rs (shared with the
//! corpus replay test in tests/it/fuzz_corpus.rs).

#![no_main]

#[allow(dead_code)]
#[path = "../targets.rs"]
mod targets;

libfuzzer_sys::fuzz_target!(|data: &[u8]| targets::log_page(data));
