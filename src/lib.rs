//! sandbox-mcp: an MCP server that gives AI agents Linux sandboxes, with background tasks whose
//! handles outlive the session and the server process.
//!
//! Modules in reading order: configuration and limits, the JSON-RPC envelope and MCP protocol,
//! sessions, the work queue, transports and server wiring, tools, providers, the task supervisor,
//! masking, and the command-line helpers. ARCHITECTURE.md has the map and the invariants.

// `unsafe` is refused everywhere but in `descriptors`, whose reason is written there.
#![deny(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod config;
pub mod descriptors;
pub mod limits;

pub mod envelope;
pub mod jsonrpc;
pub mod protocol;
pub mod session;
pub mod subscription;

pub mod mcp_tasks;
pub mod queue;
pub mod server;
pub mod transport;
pub mod waiter;

pub mod app;
pub mod tools;

pub mod provider;
pub mod supervisor;

pub mod base64;
pub mod ids;
pub mod mask;

pub mod cli;
pub mod client;
