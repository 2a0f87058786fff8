//! The two transports: stdio (one session per process) and HTTP (sessions by header).

pub mod accept;
pub mod body_budget;
pub mod handlers;
pub mod head_guard;
pub mod headers;
pub mod http;
pub mod stdio;
pub mod stream_shares;
