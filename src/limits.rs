//! Every limit of the tool contract (docs/contract.md, "Limits"), and the few this implementation
//! adds, in one place.
//!
//! docs/contract.md's "Limits" table states them for users; `tests/it/tidy.rs` checks it against
//! these constants row for row.

use std::time::Duration;

/// Maximum length of a `command` argument, in characters (not bytes).
pub const MAX_COMMAND_CHARS: usize = 65_536;

/// Maximum size of one JSON-encoded request to the sandbox (argv of a supervisor snippet).
pub const MAX_SANDBOX_REQUEST_BYTES: usize = 96 * 1024;

/// Task timeout bounds and default, in seconds.
pub const TASK_TIMEOUT_MIN_S: i64 = 1;
/// Upper bound of a task's `timeout`, in seconds.
pub const TASK_TIMEOUT_MAX_S: i64 = 3600;
/// Default task `timeout`, in seconds.
pub const TASK_TIMEOUT_DEFAULT_S: i64 = 300;

/// Log bytes saved per stream of a task, and output kept per stream of `run_command`.
pub const MAX_LOG_BYTES: usize = 1024 * 1024;

/// Bytes per stream `run_command` returns inline by default (`max_output`), and the least it may ask.
pub const MAX_OUTPUT_DEFAULT: i64 = 16_384;
/// Lower bound of `run_command`'s `max_output`.
pub const MAX_OUTPUT_MIN: i64 = 1_024;

/// Largest accepted read offset into a task log.
pub const MAX_READ_OFFSET: i64 = 1_048_576;
/// Bounds and default of `limit`, the bytes returned per stream by one task read.
pub const READ_LIMIT_MIN: i64 = 1;
/// Upper bound of `limit`.
pub const READ_LIMIT_MAX: i64 = 65_536;
/// Default `limit`.
pub const READ_LIMIT_DEFAULT: i64 = 16_384;

/// Bytes of `send_input`'s `data` per call (UTF-8).
pub const MAX_INPUT_BYTES: usize = 64 * 1024;

/// How long `send_input` waits for room in a task's input buffer before it fails.
pub const INPUT_WRITE_WAIT: Duration = Duration::from_secs(2);

/// Bounds of a task terminal's `rows` and `cols`.
pub const PTY_SIZE_MIN: i64 = 1;
/// Upper bound of a task terminal's `rows` and `cols`.
pub const PTY_SIZE_MAX: i64 = 1000;

/// Task directories per OS user per sandbox.
pub const MAX_TASKS: usize = 128;

/// How long `cancel_task` waits for a final state.
pub const CANCEL_CONFIRM: Duration = Duration::from_secs(3);

/// Largest HTTP request body, and largest stdio message.
pub const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// Bytes every large answer being made or sent may hold at once (see `answer_budget`).
pub const ANSWER_BUDGET: usize = 256 * 1024 * 1024;
/// Of [`ANSWER_BUDGET`], what one client's answers may hold (one answer larger than that fits
/// when the client holds nothing).
pub const ANSWER_BUDGET_PER_CLIENT: usize = 64 * 1024 * 1024;
/// Answers estimated below this many bytes take nothing from [`ANSWER_BUDGET`].
pub const ANSWER_FREE: usize = 1024 * 1024;
/// How long an answer waits for room in [`ANSWER_BUDGET`] with none given back meanwhile before
/// its call fails.
pub const ANSWER_WAIT: Duration = Duration::from_secs(5);
/// How long an answer waits for room in [`ANSWER_BUDGET`] at most, while room is given back
/// (answers being sent one after another).
pub const ANSWER_WAIT_MOST: Duration = Duration::from_secs(60);

/// `run_command` timeout bounds and default, in seconds.
pub const COMMAND_TIMEOUT_MIN_S: i64 = 1;
/// Upper bound of `run_command`'s `timeout`.
pub const COMMAND_TIMEOUT_MAX_S: i64 = 3600;
/// Default `run_command` `timeout`.
pub const COMMAND_TIMEOUT_DEFAULT_S: i64 = 60;

/// Sandbox TTL bounds and default, in seconds.
pub const SANDBOX_TIMEOUT_MIN_S: i64 = 1;
/// Upper bound of `create_sandbox`'s `timeout`.
pub const SANDBOX_TIMEOUT_MAX_S: i64 = 86_400;
/// Default `create_sandbox` `timeout`.
pub const SANDBOX_TIMEOUT_DEFAULT_S: i64 = 300;

/// Largest file `read_file` returns (before base64), and largest `write_file` payload.
pub const MAX_FILE_BYTES: usize = 4 * 1024 * 1024;

/// Longest `write_file` `content`, in characters: it must fit, with its JSON-RPC envelope, in one
/// message of at most `MAX_BODY_BYTES` however the client escapes it (at worst 12 bytes per
/// character: a character outside the BMP as a `\uXXXX\uXXXX` surrogate pair).
pub const MAX_WRITE_CHARS: usize = 336 * 1024;

/// Bytes one character may take in a JSON string at worst (see [`MAX_WRITE_CHARS`]).
pub const WORST_ESCAPED_CHAR_BYTES: usize = 12;

// write_file's arguments at their longest (content, a 4096-character path, a sandbox id, the
// envelope) fit in one message, escaped at worst.
const _: () = assert!((MAX_WRITE_CHARS + 4096 + 128) * WORST_ESCAPED_CHAR_BYTES + 1024 <= MAX_BODY_BYTES);

/// Most entries `list_files` returns; the result says when it stopped early.
pub const MAX_DIR_ENTRIES: usize = 10_000;

/// Secrets shorter than this many bytes are never masked (they would garble output).
pub const MIN_SECRET_BYTES: usize = 6;

/// `create_sandbox` `limits.memory_mb`, in MiB.
pub const SANDBOX_MEMORY_MB_MIN: i64 = 16;
/// See [`SANDBOX_MEMORY_MB_MIN`].
pub const SANDBOX_MEMORY_MB_MAX: i64 = 1_048_576;
/// `create_sandbox` `limits.processes`.
pub const SANDBOX_PROCESSES_MIN: i64 = 8;
/// See [`SANDBOX_PROCESSES_MIN`].
pub const SANDBOX_PROCESSES_MAX: i64 = 65_536;
/// `create_sandbox` `limits.disk_mb`, in MiB (a sparse image: the host's disk holds what the
/// sandbox writes, up to this).
pub const SANDBOX_DISK_MB_MIN: i64 = 16;
/// See [`SANDBOX_DISK_MB_MIN`].
pub const SANDBOX_DISK_MB_MAX: i64 = 1_048_576;

/// HTTP handler threads beyond one for every call the server admits (queued, running or
/// waiting): for cheap requests, and for connections whose client sends its body or reads its
/// answer slowly (each holds a thread meanwhile; tiny_http has no per-connection timeout). Past
/// them all, a request waits for a thread to come free.
pub const HTTP_SPARE_HANDLERS: usize = 1024;

/// The slowest an HTTP body may arrive and an answer be taken, on average, once a first
/// `--http-stall` has gone by (bytes per second): a connection slower than that is ended, so that
/// a client trickling bytes holds its threads for a bounded time.
pub const HTTP_MIN_RATE: usize = 64 * 1024;

/// `subscriptions/listen` streams open at once over HTTP (each holds a handler thread).
pub const MAX_HTTP_SUBSCRIPTIONS: usize = 16;

/// Of those, the most one client (its address and declared clientInfo) may hold, so that one
/// client holding its streams leaves the others room to open theirs.
pub const MAX_HTTP_SUBSCRIPTIONS_PER_CLIENT: usize = 4;

/// Task ids one `subscriptions/listen` may name (`notifications.taskIds`); -32602 beyond. Each
/// task still working costs one state read per check of the subscription.
pub const MAX_SUBSCRIBED_TASKS: usize = 16;

/// Longest `wait` of `get_task`, in seconds.
pub const MAX_WAIT_S: i64 = 60;

/// Calls waiting at once (a `get_task` with `wait`, a `tasks/result`, a 2026 run_command that
/// may become a task, a subscription following tasks); one more is answered at once, as if its
/// wait had ended (a subscription is ended with -32000). Over HTTP each waiting call holds a
/// handler thread, so the server allows this many more.
pub const MAX_WAITING_CALLS: usize = 64;

/// Of those, the most one client (a session, or a stateless request's connection) may hold, so
/// that one client parking many waits leaves the others room to wait.
pub const MAX_WAITING_CALLS_PER_CLIENT: usize = 16;

/// Calls that wait for a process in a sandbox (`run_command`) running at once outside the worker
/// pool (their thread leaves it meanwhile): this many per worker (`--workers`), at most
/// [`MAX_RUNNING_CALLS`]; one more runs as a worker's job. Over HTTP each holds a handler
/// thread, so the server allows that many more.
pub const RUNNING_CALLS_PER_WORKER: usize = 8;
/// See [`RUNNING_CALLS_PER_WORKER`].
pub const MAX_RUNNING_CALLS: usize = 64;

/// Of those, the most one client may hold: this many per worker, at most
/// [`MAX_RUNNING_CALLS_PER_CLIENT`].
pub const RUNNING_CALLS_PER_CLIENT_PER_WORKER: usize = 2;
/// See [`RUNNING_CALLS_PER_CLIENT_PER_WORKER`].
pub const MAX_RUNNING_CALLS_PER_CLIENT: usize = 16;

/// How often a waiting call reads its task again: the local provider (a shell started on the
/// host) and E2B (one request to the sandbox per read).
pub const WAIT_POLL_LOCAL: Duration = Duration::from_millis(20);
/// See [`WAIT_POLL_LOCAL`].
pub const WAIT_POLL_REMOTE: Duration = Duration::from_secs(1);

/// Entries (`allow` and `deny` together) of one network policy.
pub const NETWORK_POLICY_MAX_ENTRIES: usize = 256;
/// Bytes of JSON of one network policy.
pub const NETWORK_POLICY_MAX_BYTES: usize = 4096;

/// Connections a sandbox's egress proxy serves at once; more are closed at once.
pub const EGRESS_MAX_CONNECTIONS: usize = 64;
/// The largest request head (request line and headers) the egress proxy takes.
pub const EGRESS_MAX_HEAD_BYTES: usize = 16 * 1024;
/// How long a sandbox has to send a whole request head (or SOCKS5 greeting and request).
pub const EGRESS_HEAD_BUDGET: Duration = Duration::from_secs(10);
/// A proxied connection with no byte in either direction for this long ends.
pub const EGRESS_IDLE_BUDGET: Duration = Duration::from_secs(300);
/// Distinct blocked connections listed in one `network_blocked`.
pub const NETWORK_BLOCKED_MAX: usize = 16;

/// Ports one sandbox exposes at once (`expose_port`).
pub const EXPOSED_PORTS_MAX: usize = 16;
/// Connections one exposed port relays at once; more are closed at once.
pub const EXPOSED_PORT_MAX_CONNECTIONS: usize = 32;
/// A relayed connection of an exposed port with no byte in either direction for this long ends.
pub const EXPOSED_PORT_IDLE_BUDGET: Duration = Duration::from_secs(300);
/// Each direction's copy buffer of a relayed connection (egress proxy, exposed port) at first.
pub const RELAY_BUFFER_START: usize = 64 * 1024;
/// The most one direction's buffer grows to while a transfer fills it.
pub const RELAY_BUFFER_MAX: usize = 2 * 1024 * 1024;
/// Bytes all relays of one process (a sandbox's keeper) may hold beyond their first buffers.
pub const RELAY_GROWTH_BUDGET: usize = 16 * 1024 * 1024;
