//! The bounded work queue and the worker pool.
//!
//! Every tool call becomes a [`Job`] carrying its own reply channel; workers never see which
//! transport a job came from. A handler's result is an [`Outcome`], which the worker turns into
//! the transport's reply type on the worker thread. A panicking job is answered with -32603 and
//! the worker goes on; the job's work is moved into the handler, so whatever it owns (the
//! request's in-flight guard) is dropped while the panic unwinds.
//!
//! A handler may also answer [`Step::Later`]: it hands the job's reply over (as a [`Respond`])
//! to whatever will answer it, so a call that waits (a `get_task` with `wait`, parked with the
//! waiter) does not hold the worker while it waits. A handler answers [`Step::Blocking`] for a
//! call that waits for its process (a `run_command`): the worker's thread runs it, but leaves
//! the pool meanwhile.

use crate::answer_budget::Charge;
use crate::jsonrpc::{self, code, RpcError};
use crate::limits::{MAX_RUNNING_CALLS, MAX_RUNNING_CALLS_PER_CLIENT, RUNNING_CALLS_PER_CLIENT_PER_WORKER, RUNNING_CALLS_PER_WORKER};
use crossbeam_channel::Sender;
use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};

/// How a job ended: the JSON-RPC response, and whether the client had cancelled the request.
#[derive(Debug, PartialEq)]
pub enum Outcome {
    /// A response to send.
    Answer(Response),
    /// The response to a request the client cancelled: stdio sends nothing for it, HTTP still
    /// answers with it (the HTTP request is still waiting for a body).
    Cancelled(Response),
    /// A -32000 error for a call that was not run because its client already has its share of
    /// calls waiting: HTTP answers it 503 with `Retry-After`, as a full queue.
    Busy(Response),
}

impl Outcome {
    /// The JSON-RPC response, cancelled or not.
    pub fn into_response(self) -> Response {
        match self {
            Outcome::Answer(r) | Outcome::Cancelled(r) | Outcome::Busy(r) => r,
        }
    }
}

/// A JSON-RPC response, with the share of the answer budget it holds until it is written
/// (nothing for a small one).
#[derive(Debug, Default)]
pub struct Response {
    /// The response.
    pub value: Value,
    /// Its share of the answer budget.
    pub charge: Charge,
}

impl Response {
    /// `value`, holding `charge`.
    pub fn charged(value: Value, charge: Charge) -> Response {
        Response { value, charge }
    }

    /// The serialized response, and its charge shrunk to the serialized bytes (the values it was
    /// made from are freed first).
    pub fn serialize(self) -> (String, Charge) {
        let Response { value, mut charge } = self;
        let text = value.to_string();
        drop(value);
        charge.shrink_to(text.len());
        (text, charge)
    }
}

impl From<Value> for Response {
    fn from(value: Value) -> Response {
        Response { value, charge: Charge::none() }
    }
}

impl PartialEq for Response {
    fn eq(&self, other: &Response) -> bool {
        self.value == other.value
    }
}

impl std::ops::Deref for Response {
    type Target = Value;
    fn deref(&self) -> &Value {
        &self.value
    }
}

/// Sends a job's answer, from whichever thread has it; used once.
pub type Respond = Box<dyn FnOnce(Outcome) + Send>;

/// What a handler did with a job.
pub enum Step {
    /// The answer, sent by the worker at once.
    Done(Outcome),
    /// The answer comes later: the worker passes the job's [`Respond`] to this, which must not
    /// block (it parks the call somewhere that answers it), and goes on with the next job.
    Later(Box<dyn FnOnce(Respond) + Send>),
    /// The job waits for a process in a sandbox until it ends (a `run_command`): the worker's
    /// thread runs it to its end, but leaves the pool meanwhile, as a runner, and another worker
    /// starts if work is waiting. At most [`Sharing::runners`] jobs run so, at most
    /// [`Sharing::runners_per_client`] of one client's; beyond that it runs as a worker's job.
    Blocking(Call),
}

/// A call that runs to its answer on the thread that calls it ([`Step::Blocking`]).
pub type Call = Box<dyn FnOnce() -> Outcome + Send>;

impl From<Outcome> for Step {
    fn from(outcome: Outcome) -> Step {
        Step::Done(outcome)
    }
}

/// One unit of work: what to run and where to send the answer.
pub struct Job<T, R> {
    /// The request id, for the -32603 answer if the work panics.
    pub id: Value,
    /// The work itself.
    pub work: T,
    /// Where the reply goes.
    pub reply: Sender<R>,
}

/// Work that names the client it comes from, so that workers are shared fairly between clients.
pub trait Client {
    /// The client: a 2025 session, a stateless request's connection, the stdio peer.
    fn client(&self) -> String {
        String::new()
    }
    /// Whether the call stops something (`kill_sandbox`, a cancel): when every worker is busy,
    /// it runs on a thread of its own ([`MAX_ENDERS`] at most), so that a saturated server can
    /// still end what saturates it.
    fn ends(&self) -> bool {
        false
    }
}

/// Calls that stop something running at once outside the pool while it is saturated
/// ([`Client::ends`]); beyond them such a call waits for a worker like any other.
pub const MAX_ENDERS: usize = 8;

impl Client for &str {}

/// How [`spawn_workers`] shares workers between clients.
#[derive(Debug, Clone, Copy)]
pub struct Sharing {
    /// Workers kept running (more start while every one is busy and work is waiting).
    pub workers: usize,
    /// The most workers at once.
    pub max_workers: usize,
    /// The most calls of one client that run at once.
    pub per_client: usize,
    /// The most calls of one client that wait for a worker; one more is answered busy.
    pub per_client_queue: usize,
    /// The most [`Step::Blocking`] jobs running outside the pool at once.
    pub runners: usize,
    /// Of those, the most of one client's.
    pub runners_per_client: usize,
}

impl Sharing {
    /// `workers` kept, up to four times as many when clients keep them busy; one client runs at
    /// most `workers` calls at once and queues at most `capacity` (what the whole queue held for
    /// everyone before clients had lanes of their own). Blocking jobs leave the pool up to limits
    /// that grow with `workers` ([`RUNNING_CALLS_PER_WORKER`] and
    /// [`RUNNING_CALLS_PER_CLIENT_PER_WORKER`] each, at most [`MAX_RUNNING_CALLS`] and
    /// [`MAX_RUNNING_CALLS_PER_CLIENT`]), so `--workers` still bounds what runs at once.
    pub fn for_workers(workers: usize, capacity: usize) -> Sharing {
        let workers = workers.max(1);
        Sharing {
            workers,
            max_workers: workers * 4,
            per_client: workers,
            per_client_queue: capacity.max(1),
            runners: (workers * RUNNING_CALLS_PER_WORKER).min(MAX_RUNNING_CALLS),
            runners_per_client: (workers * RUNNING_CALLS_PER_CLIENT_PER_WORKER).min(MAX_RUNNING_CALLS_PER_CLIENT),
        }
    }
}

/// The jobs waiting for a worker, one lane per client, taken round-robin.
struct Lanes<J> {
    lanes: HashMap<String, VecDeque<J>>,
    /// Clients with waiting jobs, in turn order.
    ring: VecDeque<String>,
    running: HashMap<String, usize>,
    idle: usize,
    workers: usize,
    closed: bool,
    /// Blocking jobs running outside the pool, in all and per client.
    runners: usize,
    runners_of: HashMap<String, usize>,
    /// Calls that stop something, running on threads of their own ([`MAX_ENDERS`]).
    enders: usize,
}

impl<J> Lanes<J> {
    /// The next job whose client may run one more, and its client.
    fn take(&mut self, per_client: usize) -> Option<(String, J)> {
        let at = self.ring.iter().position(|k| self.running.get(k).copied().unwrap_or(0) < per_client)?;
        let key = self.ring.remove(at)?;
        let lane = self.lanes.get_mut(&key)?;
        let job = lane.pop_front()?;
        if lane.is_empty() {
            self.lanes.remove(&key);
        } else {
            self.ring.push_back(key.clone());
        }
        *self.running.entry(key.clone()).or_insert(0) += 1;
        Some((key, job))
    }

    fn finished(&mut self, key: &str) {
        leave(&mut self.running, key);
    }

    /// Takes a runner's place for a blocking job of `key`; `false` when none is left.
    fn enter_runner(&mut self, key: &str, sharing: &Sharing) -> bool {
        let mine = self.runners_of.get(key).copied().unwrap_or(0);
        if self.runners >= sharing.runners || mine >= sharing.runners_per_client {
            return false;
        }
        self.runners += 1;
        *self.runners_of.entry(key.to_string()).or_insert(0) += 1;
        true
    }

    fn leave_runner(&mut self, key: &str) {
        self.runners = self.runners.saturating_sub(1);
        leave(&mut self.runners_of, key);
    }
}

/// Counts one less for `key`, forgetting it at zero.
fn leave(counts: &mut HashMap<String, usize>, key: &str) {
    if let Some(n) = counts.get_mut(key) {
        *n -= 1;
        if *n == 0 {
            counts.remove(key);
        }
    }
}

/// The answer to call `id` whose work panicked with `payload` (logged): -32603, and the server
/// goes on.
fn panicked(id: &Value, payload: &(dyn std::any::Any + Send)) -> Outcome {
    let what = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into());
    log::error!("a tool call panicked: {what}");
    let err =
        RpcError::new(code::INTERNAL_ERROR, "internal error while running the tool; the server is still running, retry or report this");
    Outcome::Answer(jsonrpc::error(id, &err).into())
}

/// The workers, their lanes and their handler, shared by the workers and the dispatcher.
struct Pool<T, R, H> {
    lanes: Mutex<Lanes<Job<T, R>>>,
    ready: Condvar,
    handler: H,
    sharing: Sharing,
    /// Workers started so far (for their names).
    started: AtomicUsize,
}

impl<T, R, S, H> Pool<T, R, H>
where
    T: Send + 'static,
    R: From<Outcome> + Send + 'static,
    S: Into<Step>,
    H: Fn(T) -> S + Send + Sync + 'static,
{
    fn lock(&self) -> MutexGuard<'_, Lanes<Job<T, R>>> {
        // Every update leaves the lanes consistent, so a lock poisoned by a panic elsewhere is fine.
        self.lanes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts one more worker thread, which the caller has counted in `workers`; when the
    /// thread cannot start, says so and takes the count back.
    fn start_worker(self: &Arc<Self>) -> Option<JoinHandle<()>> {
        let i = self.started.fetch_add(1, Ordering::Relaxed);
        let pool = self.clone();
        match thread::Builder::new().name(format!("sandbox-mcp-worker-{i}")).spawn(move || pool.work()) {
            Ok(handle) => Some(handle),
            Err(err) => {
                log::error!("could not start worker {i}: {err}");
                self.lock().workers -= 1;
                None
            }
        }
    }

    /// A worker: takes jobs round-robin between clients until the queue is closed and empty. A
    /// worker whose job left the pool ([`Step::Blocking`]) comes back to it after the job, unless
    /// the pool has grown to `max_workers` meanwhile: then its thread ends.
    fn work(self: Arc<Self>) {
        let mut guard = self.lock();
        loop {
            if let Some((key, job)) = guard.take(self.sharing.per_client) {
                drop(guard);
                let stayed = self.run_job(Some(&key), job);
                guard = self.lock();
                if stayed {
                    guard.finished(&key);
                    // A client under its limit again may have work waiting.
                    self.ready.notify_one();
                    continue;
                }
                if guard.workers >= self.sharing.max_workers {
                    return;
                }
                guard.workers += 1;
                set_thread_name(&thread_name());
                continue;
            }
            if guard.closed && guard.lanes.is_empty() {
                guard.workers -= 1;
                self.ready.notify_all();
                return;
            }
            guard.idle += 1;
            guard = self.ready.wait(guard).unwrap_or_else(|p| p.into_inner());
            guard.idle -= 1;
        }
    }

    /// Runs one job of client `key` and sends its answer (at once, or later through
    /// [`Step::Later`]). `false` when the job left the pool ([`Step::Blocking`]): this thread is
    /// then no longer counted as a worker. Without `key`, a job that runs outside the pool (an
    /// ender's: [`Client::ends`]), which a blocking call neither leaves nor counts as a runner.
    fn run_job(self: &Arc<Self>, key: Option<&str>, Job { id, work, reply }: Job<T, R>) -> bool {
        let step = panic::catch_unwind(AssertUnwindSafe(|| (self.handler)(work).into()))
            .unwrap_or_else(|payload| Step::Done(panicked(&id, payload.as_ref())));
        match step {
            // The receiver is gone when the client went away; nothing left to do then.
            Step::Done(outcome) => {
                let _ = reply.send(R::from(outcome));
                true
            }
            Step::Later(park) => {
                park(Box::new(move |outcome| {
                    let _ = reply.send(R::from(outcome));
                }));
                true
            }
            Step::Blocking(call) => {
                let left = key.filter(|key| self.leave_pool(key));
                let outcome = panic::catch_unwind(AssertUnwindSafe(call)).unwrap_or_else(|payload| panicked(&id, payload.as_ref()));
                if let Some(key) = left {
                    // The place is given back before the answer goes out, so that a client that
                    // sends its next call on the answer finds it free.
                    self.lock().leave_runner(key);
                }
                let _ = reply.send(R::from(outcome));
                left.is_none()
            }
        }
    }

    /// Takes this worker out of the pool for a blocking job of `key`, when a runner's place is
    /// left: its client's running count and the pool's worker count drop at once, and another
    /// worker starts when work waits and no worker is idle. `false`: no place left, the job runs
    /// as a worker's.
    fn leave_pool(self: &Arc<Self>, key: &str) -> bool {
        let mut guard = self.lock();
        if !guard.enter_runner(key, &self.sharing) {
            return false;
        }
        guard.finished(key);
        guard.workers -= 1;
        let replace = !guard.lanes.is_empty() && guard.idle == 0 && guard.workers < self.sharing.max_workers;
        if replace {
            guard.workers += 1;
        }
        drop(guard);
        set_thread_name(RUNNER_NAME);
        // The client's next job may run now that this one no longer counts.
        self.ready.notify_one();
        if replace {
            self.start_worker();
        }
        true
    }
}

/// The name a worker's thread takes while it runs a blocking job outside the pool (as the kernel
/// shows it: at most 15 bytes).
pub const RUNNER_NAME: &str = "sandbox-mcp-run";

/// This thread's name as Rust knows it (a worker's), for the kernel's view.
fn thread_name() -> String {
    thread::current().name().unwrap_or("sandbox-mcp-worker").to_string()
}

/// Sets the kernel's name of this thread (what `ps -L` and `/proc/<pid>/task/<tid>/comm` show).
/// A name the kernel refuses leaves the old one.
fn set_thread_name(name: &str) {
    let mut bytes: Vec<u8> = name.bytes().filter(|b| *b != 0).take(15).collect();
    bytes.push(0);
    if let Ok(name) = std::ffi::CStr::from_bytes_with_nul(&bytes) {
        let _ = rustix::thread::set_name(name);
    }
}

/// Starts the workers that run `handler` on each job from a queue of `capacity` and send
/// `R::from(outcome)` on the job's reply channel (at once, later through [`Step::Later`], or
/// from outside the pool for a [`Step::Blocking`] job).
///
/// Workers are shared between clients ([`Client`]) as `sharing` says: jobs wait in one lane per
/// client and are taken round-robin, a client runs at most `per_client` at once, and when every
/// worker is busy while work could run another one starts (up to `max_workers`): so one client
/// that keeps many long calls running never makes another client's quick call wait. A client
/// with `per_client_queue` calls waiting gets the next one answered busy (-32000). The queue
/// itself is bounded by `capacity` (a full queue is the transport's 503). Workers exit when
/// every sender of the queue is dropped and the lanes are empty.
pub fn spawn_workers<T, R, S, H>(sharing: Sharing, capacity: usize, handler: H) -> (Sender<Job<T, R>>, Vec<JoinHandle<()>>)
where
    T: Client + Send + 'static,
    R: From<Outcome> + Send + 'static,
    S: Into<Step>,
    H: Fn(T) -> S + Send + Sync + 'static,
{
    let (tx, rx) = crossbeam_channel::bounded::<Job<T, R>>(capacity);
    let lanes = Lanes {
        lanes: HashMap::new(),
        ring: VecDeque::new(),
        running: HashMap::new(),
        idle: 0,
        workers: 0,
        closed: false,
        runners: 0,
        runners_of: HashMap::new(),
        enders: 0,
    };
    let pool = Arc::new(Pool { lanes: Mutex::new(lanes), ready: Condvar::new(), handler, sharing, started: AtomicUsize::new(0) });
    let mut handles = Vec::with_capacity(sharing.workers + 1);
    for _ in 0..sharing.workers {
        pool.lock().workers += 1;
        handles.extend(pool.start_worker());
    }
    // The dispatcher moves jobs from the bounded queue into the clients' lanes.
    let dispatcher = thread::Builder::new().name("sandbox-mcp-dispatch".into()).spawn(move || {
        for job in rx {
            let key = job.work.client();
            let mut guard = pool.lock();
            if job.work.ends() && guard.idle == 0 && guard.workers >= sharing.max_workers && guard.enders < MAX_ENDERS {
                guard.enders += 1;
                drop(guard);
                let ender = pool.clone();
                let spawned = thread::Builder::new().name("sandbox-mcp-end".into()).spawn(move || {
                    ender.run_job(None, job);
                    ender.lock().enders -= 1;
                });
                if let Err(err) = spawned {
                    pool.lock().enders -= 1;
                    log::error!("could not start a thread for a call that stops something ({err}); the call was dropped");
                }
                continue;
            }
            let waiting = guard.lanes.get(&key).map_or(0, VecDeque::len);
            if waiting >= sharing.per_client_queue {
                drop(guard);
                let err = RpcError::new(
                    code::SERVER_BUSY,
                    format!("this client already has {waiting} calls waiting for a worker; wait for some to finish, then retry"),
                );
                let _ = job.reply.send(R::from(Outcome::Busy(jsonrpc::error(&job.id, &err).into())));
                continue;
            }
            if waiting == 0 {
                guard.ring.push_back(key.clone());
            }
            guard.lanes.entry(key.clone()).or_default().push_back(job);
            log::debug!("a call of client {key} queued ({} waiting)", waiting + 1);
            let can_run = guard.running.get(&key).copied().unwrap_or(0) < sharing.per_client;
            let grow = can_run && guard.idle == 0 && guard.workers < sharing.max_workers;
            if grow {
                guard.workers += 1;
            }
            drop(guard);
            pool.ready.notify_one();
            if grow {
                pool.start_worker();
            }
        }
        pool.lock().closed = true;
        pool.ready.notify_all();
    });
    match dispatcher {
        Ok(h) => handles.push(h),
        Err(err) => log::error!("could not start the dispatcher: {err}"),
    }
    (tx, handles)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    struct Of(&'static str, Arc<std::sync::atomic::AtomicBool>);

    impl Client for Of {
        fn client(&self) -> String {
            self.0.to_string()
        }
    }

    /// One client fills its share (per_client calls run, the rest wait in its lane) and another
    /// client's call still runs at once, on a worker started for it.
    #[test]
    fn one_client_runs_its_share_and_another_runs_beside_it() {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let running = Arc::new(AtomicUsize::new(0));
        let counter = running.clone();
        let sharing = Sharing { workers: 4, max_workers: 16, per_client: 4, per_client_queue: 32, runners: 0, runners_per_client: 0 };
        let (tx, _handles) = spawn_workers(sharing, 64, move |Of(_, release): Of| {
            counter.fetch_add(1, Ordering::SeqCst);
            while !release.load(Ordering::SeqCst) {
                thread::sleep(std::time::Duration::from_millis(1));
            }
            counter.fetch_sub(1, Ordering::SeqCst);
            Outcome::Answer(json!("done").into())
        });
        let (rtx, rrx) = crossbeam_channel::unbounded::<Outcome>();
        let hold = Arc::new(AtomicBool::new(false));
        for i in 0..12 {
            tx.send(Job { id: json!(i), work: Of("greedy", hold.clone()), reply: rtx.clone() }).unwrap();
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while running.load(Ordering::SeqCst) < 4 && std::time::Instant::now() < deadline {
            thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(running.load(Ordering::SeqCst), 4, "the greedy client runs its share");
        tx.send(Job { id: json!("other"), work: Of("other", Arc::new(AtomicBool::new(true))), reply: rtx.clone() }).unwrap();
        assert_eq!(rrx.recv_timeout(std::time::Duration::from_secs(2)).unwrap(), Outcome::Answer(json!("done").into()));
        assert_eq!(running.load(Ordering::SeqCst), 4, "still only its share");
        hold.store(true, Ordering::SeqCst);
        for _ in 0..12 {
            rrx.recv_timeout(std::time::Duration::from_secs(5)).unwrap();
        }
    }

    /// A job that stops something.
    struct Ends(&'static str);

    impl Client for Ends {
        fn client(&self) -> String {
            self.0.to_string()
        }
        fn ends(&self) -> bool {
            self.0 == "kill"
        }
    }

    /// With every worker busy (many clients, each within its share), a call that stops
    /// something still runs at once, on a thread of its own; another call waits for a worker.
    /// Before, a kill_sandbox waited 20 s behind 100 connections' long calls.
    #[test]
    fn a_call_that_stops_something_runs_while_every_worker_is_busy() {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let release = Arc::new(AtomicBool::new(false));
        let running = Arc::new(AtomicUsize::new(0));
        let (held, counter) = (release.clone(), running.clone());
        let sharing = Sharing { workers: 2, max_workers: 4, per_client: 1, per_client_queue: 8, runners: 0, runners_per_client: 0 };
        let (tx, _handles) = spawn_workers(sharing, 64, move |Ends(name): Ends| {
            if name.starts_with("long") {
                counter.fetch_add(1, Ordering::SeqCst);
                while !held.load(Ordering::SeqCst) {
                    thread::sleep(std::time::Duration::from_millis(1));
                }
            }
            Outcome::Answer(json!(name).into())
        });
        let (rtx, rrx) = crossbeam_channel::unbounded::<Outcome>();
        // One after another, so that the pool grows to its most for them.
        for (i, name) in ["long-1", "long-2", "long-3", "long-4", "long-5"].into_iter().enumerate() {
            tx.send(Job { id: json!(name), work: Ends(name), reply: rtx.clone() }).unwrap();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while running.load(Ordering::SeqCst) < (i + 1).min(4) && std::time::Instant::now() < deadline {
                thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        assert_eq!(running.load(Ordering::SeqCst), 4, "every worker is busy");
        tx.send(Job { id: json!("quick"), work: Ends("quick"), reply: rtx.clone() }).unwrap();
        tx.send(Job { id: json!("kill"), work: Ends("kill"), reply: rtx.clone() }).unwrap();
        assert_eq!(rrx.recv_timeout(std::time::Duration::from_secs(2)).unwrap(), Outcome::Answer(json!("kill").into()));
        assert!(rrx.recv_timeout(std::time::Duration::from_millis(200)).is_err(), "the other call waits for a worker");
        release.store(true, Ordering::SeqCst);
        for _ in 0..6 {
            rrx.recv_timeout(std::time::Duration::from_secs(5)).unwrap();
        }
    }

    #[test]
    fn a_panicking_job_answers_internal_error_and_the_worker_keeps_serving() {
        let (tx, handles) = spawn_workers(Sharing::for_workers(1, 4), 4, |work: &str| {
            if work == "boom" {
                panic!("boom");
            }
            Outcome::Answer(json!({"jsonrpc": "2.0", "id": 2, "result": {}}).into())
        });
        let (rtx, rrx) = crossbeam_channel::unbounded::<Outcome>();
        tx.send(Job { id: json!(1), work: "boom", reply: rtx.clone() }).unwrap();
        tx.send(Job { id: json!(2), work: "fine", reply: rtx }).unwrap();
        let first = rrx.recv().unwrap().into_response();
        assert_eq!(first["id"], 1);
        assert_eq!(first["error"]["code"], -32603);
        let second = rrx.recv().unwrap().into_response();
        assert_eq!(second["id"], 2);
        drop(tx);
        for h in handles {
            h.join().unwrap();
        }
    }

    #[test]
    fn a_job_answered_later_frees_its_worker_at_once() {
        let (park_tx, park_rx) = crossbeam_channel::unbounded::<Respond>();
        let (tx, handles) = spawn_workers(Sharing::for_workers(1, 4), 4, move |work: &str| {
            if work == "later" {
                let park_tx = park_tx.clone();
                return Step::Later(Box::new(move |respond| park_tx.send(respond).unwrap()));
            }
            Step::Done(Outcome::Answer(json!(work).into()))
        });
        let (rtx, rrx) = crossbeam_channel::unbounded::<Outcome>();
        tx.send(Job { id: json!(1), work: "later", reply: rtx.clone() }).unwrap();
        tx.send(Job { id: json!(2), work: "now", reply: rtx }).unwrap();
        assert_eq!(rrx.recv().unwrap(), Outcome::Answer(json!("now").into()), "the one worker went on");
        let respond = park_rx.recv().unwrap();
        std::thread::spawn(move || respond(Outcome::Answer(json!("later").into()))).join().unwrap();
        assert_eq!(rrx.recv().unwrap(), Outcome::Answer(json!("later").into()));
        drop(tx);
        for h in handles {
            h.join().unwrap();
        }
    }

    /// Work for the blocking tests: a client, whether the job blocks, and when it may end.
    struct Call(&'static str, bool, Arc<std::sync::atomic::AtomicBool>);

    impl Client for Call {
        fn client(&self) -> String {
            self.0.to_string()
        }
    }

    /// A blocking job leaves the pool: with one worker (and at most two), one client's blocking
    /// jobs run beside each other up to its runner share, the next one runs as a worker's job, and
    /// another client's quick job is still answered at once; at the end the pool is whole.
    #[test]
    fn blocking_jobs_leave_the_pool_up_to_the_runner_share() {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        use std::time::{Duration, Instant};
        let running = Arc::new(AtomicUsize::new(0));
        let counter = running.clone();
        let sharing = Sharing { workers: 1, max_workers: 2, per_client: 1, per_client_queue: 32, runners: 8, runners_per_client: 3 };
        let (tx, handles) = spawn_workers(sharing, 64, move |Call(_, blocks, release): Call| {
            if !blocks {
                return Step::Done(Outcome::Answer(json!("quick").into()));
            }
            let counter = counter.clone();
            Step::Blocking(Box::new(move || {
                counter.fetch_add(1, Ordering::SeqCst);
                while !release.load(Ordering::SeqCst) {
                    thread::sleep(Duration::from_millis(1));
                }
                counter.fetch_sub(1, Ordering::SeqCst);
                Outcome::Answer(json!("long").into())
            }))
        });
        let (rtx, rrx) = crossbeam_channel::unbounded::<Outcome>();
        let hold = Arc::new(AtomicBool::new(false));
        let wait_running = |n: usize| {
            let deadline = Instant::now() + Duration::from_secs(5);
            while running.load(Ordering::SeqCst) < n && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(1));
            }
            running.load(Ordering::SeqCst)
        };
        for i in 0..3 {
            tx.send(Job { id: json!(i), work: Call("greedy", true, hold.clone()), reply: rtx.clone() }).unwrap();
        }
        assert_eq!(wait_running(3), 3, "three blocking jobs run at once, with one worker kept");
        tx.send(Job { id: json!(3), work: Call("greedy", true, hold.clone()), reply: rtx.clone() }).unwrap();
        assert_eq!(wait_running(4), 4, "a fourth runs as a worker's job");
        tx.send(Job { id: json!("other"), work: Call("other", false, hold.clone()), reply: rtx.clone() }).unwrap();
        assert_eq!(rrx.recv_timeout(Duration::from_secs(5)).unwrap(), Outcome::Answer(json!("quick").into()), "another worker served it");
        hold.store(true, Ordering::SeqCst);
        for _ in 0..4 {
            assert_eq!(rrx.recv_timeout(Duration::from_secs(5)).unwrap(), Outcome::Answer(json!("long").into()));
        }
        // The runner places are free again: three more leave the pool at once.
        let again = Arc::new(AtomicBool::new(false));
        for i in 10..13 {
            tx.send(Job { id: json!(i), work: Call("greedy", true, again.clone()), reply: rtx.clone() }).unwrap();
        }
        assert_eq!(wait_running(3), 3);
        again.store(true, Ordering::SeqCst);
        for _ in 0..3 {
            rrx.recv_timeout(Duration::from_secs(5)).unwrap();
        }
        drop(tx);
        for h in handles {
            h.join().unwrap();
        }
    }

    /// A blocking job that panics is answered -32603, and its runner place comes back.
    #[test]
    fn a_panicking_blocking_job_is_answered_and_gives_its_place_back() {
        let sharing = Sharing { runners: 1, runners_per_client: 1, ..Sharing::for_workers(1, 4) };
        let (tx, handles) = spawn_workers(sharing, 4, |work: &str| {
            let boom = work == "boom";
            Step::Blocking(Box::new(move || if boom { panic!("boom") } else { Outcome::Answer(json!("fine").into()) }))
        });
        let (rtx, rrx) = crossbeam_channel::unbounded::<Outcome>();
        tx.send(Job { id: json!(1), work: "boom", reply: rtx.clone() }).unwrap();
        let first = rrx.recv().unwrap().into_response();
        assert_eq!((first["id"].clone(), first["error"]["code"].clone()), (json!(1), json!(-32603)), "{first:?}");
        tx.send(Job { id: json!(2), work: "fine", reply: rtx }).unwrap();
        assert_eq!(rrx.recv().unwrap(), Outcome::Answer(json!("fine").into()));
        drop(tx);
        for h in handles {
            h.join().unwrap();
        }
    }
}
