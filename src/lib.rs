//! sandbox-mcp: an MCP server that gives AI agents Linux sandboxes, with background tasks whose
//! handles outlive the session and the server process.
//!
//! Modules by layer, top down (each imports only from layers below it): the entry points
//! (`cli`, `server`) and the transports; the MCP layer ([`mcp`]: protocol eras, sessions,
//! subscriptions, protocol tasks); the tools ([`tools`], with the shared [`app::App`]); the task
//! supervisor and the providers. Beside them, used by every layer and knowing neither MCP nor
//! providers: the work [`queue`] and the [`waiter`], [`jsonrpc`], configuration and limits, the
//! byte [`relay`], and small helpers. ARCHITECTURE.md has the map and the invariants.

// `unsafe` is refused everywhere but in `descriptors`, `memory` and
// `provider::local::isolation::landlock`, whose reasons are written there.
#![deny(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod cli;
pub mod server;
pub mod transport;

pub mod mcp;

pub mod app;
pub mod tools;

pub mod provider;
pub mod supervisor;

pub mod answer_budget;
pub mod jsonrpc;
pub mod queue;
pub mod waiter;

pub mod config;
pub mod limits;

pub mod descriptors;
pub mod memory;

pub mod egress;
pub mod relay;

pub mod base64;
pub mod client;
pub mod ids;
pub mod log_line;
pub mod mask;
pub mod tally;
