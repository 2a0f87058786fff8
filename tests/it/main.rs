//! Integration tests: the real binary over stdio and HTTP, on the local provider.

mod support;

mod http;
mod stdio;
mod tasks;
mod tidy;
mod tools;
