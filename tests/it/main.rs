//! Integration tests: the real binary over stdio and HTTP, on the local provider and (through the
//! E2B emulator) on the e2b provider.

mod support;

mod e2b;
mod faults;
mod fuzz_corpus;
mod http;
mod interactive;
mod isolation;
mod landlock;
mod modern;
mod network;
mod ports;
mod processes;
mod promote;
mod protocol_tasks;
mod security;
mod shutdown;
mod stdio;
mod subordinate;
mod tasks;
mod tidy;
mod tools;
mod waiting;
mod warm_shell;
