//! The two transports: stdio (one session per process) and HTTP (sessions by header).

pub mod accept;
pub mod body_budget;
pub mod connection_guard;
pub mod handlers;
pub mod headers;
pub mod http;
pub mod stdio;
pub mod stream_shares;
