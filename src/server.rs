//! Wiring: builds the app, the queue and the threads for one transport, waits for the end, and
//! shuts down in a fixed order.
//!
//! ```text
//!  stdin ──► sandbox-mcp-stdin ──┐  (cheap methods answered here)         ┌──► sandbox-mcp-stdout ──► stdout
//!                                ├──► bounded queue ──► sandbox-mcp-worker-N ─┤
//!  tcp ──► tiny_http ──► sandbox-mcp-http ────┘   (each job carries its reply channel) └──► waiting http thread ──► tcp
//!        (a handler thread per request being handled, taking it from tiny_http: transport/handlers.rs)
//! ```

use crate::app::App;
use crate::config::Config;
use crate::limits::{HTTP_SPARE_HANDLERS, MAX_BODY_BYTES, MAX_RUNNING_CALLS, MAX_WAITING_CALLS};
use crate::mcp::protocol::{self, Executed, Work, WorkQueue};
use crate::mcp::session::{self, Session, Sessions};
use crate::mcp::subscription;
use crate::queue::{self, Outcome, Step};
use crate::transport::http::{HttpServer, Listener};
use crate::transport::stdio::{self, Out};
use crate::waiter::Waiter;
use anyhow::{Context, Result};
use crossbeam_channel::{Receiver, Sender};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// Why the server stops.
enum Stop {
    /// stdin reached end of file.
    Eof,
    /// SIGTERM or SIGINT.
    Signal(i32),
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stop::Eof => f.write_str("stdin closed"),
            Stop::Signal(n) => write!(f, "signal {n}"),
        }
    }
}

/// Starts the worker pool and the waiter; each worker runs [`protocol::execute`] and answers with
/// `R`, or parks a call that waits with the waiter, which answers it. `sharing` is how workers
/// are shared between clients.
fn start_workers<R: From<Outcome> + Send + 'static>(app: &Arc<App>, waiter: Waiter, sharing: queue::Sharing) -> Result<WorkQueue<R>> {
    let handler_app = app.clone();
    let (queue, _handles) =
        queue::spawn_workers(sharing, app.config.queue_capacity, move |work: Work| match protocol::execute(&handler_app, work) {
            Executed::Now(outcome) => Step::Done(outcome),
            Executed::Wait(watch) => {
                let waiter = waiter.clone();
                Step::Later(Box::new(move |respond| waiter.park_or_answer(watch, respond)))
            }
            Executed::Blocking(call) => Step::Blocking(call),
        });
    // Workers are not joined: they exit with the process, after shutdown has ended the sessions
    // and killed the commands they wait for.
    Ok(queue)
}

/// The first SIGTERM/SIGINT starts a graceful shutdown; a second one exits at once (sandboxes
/// not yet killed then end by their own timeouts, tasks keep running).
fn watch_signals(stop: Sender<Stop>) -> Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT]).context("installing SIGTERM/SIGINT handlers")?;
    thread::Builder::new().name("sandbox-mcp-signals".into()).spawn(move || {
        let mut seen = 0;
        for sig in signals.forever() {
            seen += 1;
            if seen == 1 {
                let _ = stop.send(Stop::Signal(sig));
            } else {
                log::warn!("second signal {sig} during shutdown: exiting now");
                std::process::exit(128 + sig);
            }
        }
    })?;
    Ok(())
}

/// Serves MCP over stdin/stdout until stdin ends or a signal arrives, then ends the session.
pub fn run_stdio(config: Config) -> Result<()> {
    let app = Arc::new(App::new(config)?);
    let waiter = Waiter::start().context("starting the waiter thread")?;
    // One client: its calls wait for a worker however many there are, as before clients had
    // lanes (the stdio reader never blocks; its feeder holds what the queue cannot).
    let sharing =
        queue::Sharing { per_client_queue: usize::MAX, ..queue::Sharing::for_workers(app.config.workers, app.config.queue_capacity) };
    let queue = start_workers::<Out>(&app, waiter.clone(), sharing)?;
    let (reply_tx, reply_rx) = crossbeam_channel::unbounded::<Out>();
    stdio::spawn_writer(reply_rx).context("starting the stdout writer")?;
    let session = Arc::new(Session::new("stdio", false));
    let (stop_tx, stop_rx) = crossbeam_channel::unbounded();
    watch_signals(stop_tx.clone())?;
    // The reader hands tool calls to a feeder thread, which waits when the work queue is full:
    // the reader itself never blocks on the queue, so with every worker busy it still answers
    // pings and reads cancellations (a call cancelled while it waits never starts). The feeder's
    // channel is unbounded: what bounds it is the client, since every call waiting in it is one
    // the client sent (at most MAX_BODY_BYTES each) and has not had answered yet, and a stdio
    // client is the one process that launched this server. stdio never refuses a call for a
    // full queue (HTTP answers 503 instead).
    let (feed_tx, feed_rx): (WorkQueue<Out>, _) = crossbeam_channel::unbounded();
    thread::Builder::new().name("sandbox-mcp-feeder".into()).spawn(move || {
        for job in feed_rx {
            if queue.send(job).is_err() {
                return;
            }
        }
    })?;
    {
        let (app, session, queue, replies) = (app.clone(), session.clone(), feed_tx, reply_tx.clone());
        thread::Builder::new().name("sandbox-mcp-stdin".into()).spawn(move || {
            stdio::run_reader(&app, &session, &queue, &replies, &waiter, MAX_BODY_BYTES);
            let _ = stop_tx.send(Stop::Eof);
        })?;
    }
    let why = stop_rx.recv().unwrap_or(Stop::Eof);
    let began = Instant::now();
    log::info!("stdio session ending: {why}");
    // Shutdown order (the server exits within 2 s of stdin EOF and within 5 s of SIGTERM):
    // 1. let requests already read finish (bounded), so piped scripts get their answers;
    let settle = began + Duration::from_millis(900);
    wait_idle(std::slice::from_ref(&session), settle);
    // 2. from now on, calls not yet started are answered "shutting down";
    app.begin_draining();
    // 3. end the session: kill the sandboxes it still owns (their commands end with them);
    session.end(&app.provider, Instant::now() + Duration::from_millis(600));
    // 4. stop commands still running in sandboxes that outlive the session;
    app.provider.shutdown();
    // 5. wait for those calls to answer, then flush what the writer has;
    wait_idle(std::slice::from_ref(&session), began + Duration::from_millis(1700));
    flush(&reply_tx, Duration::from_millis(200));
    // 6. end the open subscriptions/listen streams gracefully, with their closing results.
    let closing: Vec<String> = session.subscriptions.take_all().iter().map(|id| subscription::closing(id).to_string()).collect();
    stdio::write_lines(closing.iter().map(String::as_str));
    Ok(())
}

fn wait_idle(sessions: &[Arc<Session>], deadline: Instant) {
    while sessions.iter().any(|s| s.inflight_count() > 0) && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(10));
    }
}

/// Waits (at most `wait`) until the stdout writer has written everything sent to it so far.
fn flush(replies: &Sender<Out>, wait: Duration) {
    let (done_tx, done_rx) = crossbeam_channel::bounded(1);
    if replies.send(Out::Flush(done_tx)).is_ok() {
        let _ = done_rx.recv_timeout(wait);
    }
}

/// Serves MCP over HTTP until SIGTERM/SIGINT, then ends every session.
pub fn run_http(config: Config) -> Result<()> {
    let app = Arc::new(App::new(config)?);
    let waiter = Waiter::start().context("starting the waiter thread")?;
    let sharing = queue::Sharing::for_workers(app.config.workers, app.config.queue_capacity);
    let queue = start_workers::<Outcome>(&app, waiter.clone(), sharing)?;
    let sessions = Arc::new(Sessions::default());
    let listen = app.config.listen;
    // A handler thread for every call that can be in flight (queued, running or waiting), plus
    // spare ones for cheap requests and for clients that send or read slowly.
    let max_handlers = app.config.workers + app.config.queue_capacity + MAX_WAITING_CALLS + MAX_RUNNING_CALLS + HTTP_SPARE_HANDLERS;
    let listener = Listener::new(app.clone(), sessions.clone(), queue, waiter, listen.ip().is_loopback());
    let server = HttpServer::start(listen, max_handlers, listener)?;
    log::info!("listening on http://{}/mcp ({} provider)", server.addr, app.provider.name());
    if !listen.ip().is_loopback() && app.config.http_token.is_none() {
        log::warn!("listening on a non-loopback address without SANDBOX_MCP_HTTP_TOKEN: anyone who can reach it can run commands");
    }
    let (stop_tx, stop_rx) = crossbeam_channel::unbounded();
    watch_signals(stop_tx)?;
    let (reaper_stop, reaper_rx) = crossbeam_channel::bounded::<()>(0);
    spawn_idle_reaper(app.clone(), sessions.clone(), reaper_rx)?;
    let why = stop_rx.recv().unwrap_or(Stop::Signal(0));
    let began = Instant::now();
    log::info!("shutting down: {why}");
    drop(reaper_stop);
    // Shutdown order (every accepted request gets an answer; the server exits within 5 s):
    // 1. new requests are answered 503 "shutting down", queued calls get the same error;
    app.begin_draining();
    // 2. calls already running get a moment to finish on their own;
    let all = sessions.take_all();
    wait_idle(&all, began + Duration::from_millis(1500));
    // 3. end every session: kill the sandboxes they own (their commands end with them);
    let kill_deadline = began + Duration::from_millis(3500);
    session::kill_sessions(&app.provider, &all, kill_deadline);
    // 4. stop commands still running in sandboxes that outlive their session;
    app.provider.shutdown();
    // 5. wait for the answers to be written, then stop listening.
    wait_idle(&all, began + Duration::from_millis(4300));
    server.wait_answered(began + Duration::from_millis(4500));
    server.stop();
    Ok(())
}

fn spawn_idle_reaper(app: Arc<App>, sessions: Arc<Sessions>, stop: Receiver<()>) -> Result<()> {
    let idle = app.config.session_idle;
    let every = (idle / 4).clamp(Duration::from_millis(200), Duration::from_secs(30));
    thread::Builder::new().name("sandbox-mcp-idle".into()).spawn(move || loop {
        match stop.recv_timeout(every) {
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
            _ => return,
        }
        for s in sessions.take_idle(idle) {
            log::info!("session {} idle for {:?}; ending it", s.id, s.idle_for());
            s.end(&app.provider, Instant::now() + Duration::from_secs(30));
        }
    })?;
    Ok(())
}
