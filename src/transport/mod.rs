//! The two transports: stdio (one session per process) and HTTP (sessions by header).

pub mod http;
pub mod stdio;
