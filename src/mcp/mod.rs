//! The MCP layer: everything that knows the Model Context Protocol, between the transports above
//! and the tools below.
//!
//! - [`protocol`]: the methods of both eras, how a message is routed (answered now, refused,
//!   listened on, or queued as work) and how queued work executes;
//! - [`envelope`]: the 2026-07-28 request `_meta`, `server/discover` and result marking;
//! - [`session`]: MCP sessions (default sandbox, destroy set, in-flight requests);
//! - [`subscription`]: `subscriptions/listen` and the task notifications it carries;
//! - [`tasks`]: protocol tasks (2025-11-25, and the 2026-07-28 extension) over the supervisor.
//!
//! Layers, top down: the transports (`transport/`, `server.rs`) call this layer; it calls the
//! tools (`tools/`), which call the supervisor and the providers. `queue` and `waiter` serve every
//! layer and know neither MCP nor providers. No module imports one above it.

pub mod envelope;
pub mod protocol;
pub mod session;
pub mod subscription;
pub mod tasks;
