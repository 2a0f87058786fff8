//! The runners: a thread of its own for each call that waits for a process in a sandbox (a
//! `run_command`), so that such a call holds no worker while its command runs.
//!
//! A worker hands the call over ([`Runners::run`]) with the job's [`Respond`] and takes the next
//! job; a runner thread runs the call to its end and answers. At most [`MAX_RUNNING_CALLS`] run
//! this way at once, at most [`MAX_RUNNING_CALLS_PER_CLIENT`] of them one client's: beyond that,
//! [`Runners::run`] hands the call back and the worker runs it itself (the queue's fair sharing
//! of workers then applies, as for every other call). A call that panics is answered -32603, as
//! on a worker.
//!
//! Runner threads start with the calls and wait for the next one for [`IDLE_EXIT`] before they
//! end: a new thread's first call pays for its stack and its allocator arena (0.4 ms measured on
//! a quick command), a waiting one only for a wake-up. A call goes to a waiting runner when there
//! is one (`idle` counts them less the calls already sent their way; the send happens under the
//! lock, and a runner that gives up waiting looks for a call once more under the lock before it
//! ends), else to a new thread.

use crate::limits::{MAX_RUNNING_CALLS, MAX_RUNNING_CALLS_PER_CLIENT};
use crate::queue::{self, Outcome, Respond};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use serde_json::Value;
use std::collections::HashMap;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::Duration;

/// How long a runner with nothing to run waits for the next call before its thread ends.
pub const IDLE_EXIT: Duration = Duration::from_secs(30);

/// A call to run: it blocks until its answer.
pub type Call = Box<dyn FnOnce() -> Outcome + Send>;

/// A call handed back by [`Runners::run`], to run where it came from.
pub type Refused = (Call, Respond);

/// One call for a runner: its id (for the answer to a panic), its client, the call, its answer.
struct Task {
    id: Value,
    client: String,
    call: Call,
    respond: Respond,
}

/// The runner threads of one server: how many calls run, whose, and the runners waiting.
#[derive(Clone)]
pub struct Runners {
    running: Arc<Mutex<Running>>,
    tx: Sender<Task>,
    rx: Receiver<Task>,
}

#[derive(Default)]
struct Running {
    all: usize,
    per_client: HashMap<String, usize>,
    /// Runners waiting for a call, less the calls already sent to them.
    idle: usize,
    /// Runner threads alive.
    threads: usize,
}

impl Running {
    /// Takes a place for `client`; `false` when the server or the client has none left.
    fn enter(&mut self, client: &str) -> bool {
        let mine = self.per_client.get(client).copied().unwrap_or(0);
        if self.all >= MAX_RUNNING_CALLS || mine >= MAX_RUNNING_CALLS_PER_CLIENT {
            return false;
        }
        self.all += 1;
        *self.per_client.entry(client.to_string()).or_default() += 1;
        true
    }

    fn leave(&mut self, client: &str) {
        self.all = self.all.saturating_sub(1);
        if let Some(n) = self.per_client.get_mut(client) {
            *n -= 1;
            if *n == 0 {
                self.per_client.remove(client);
            }
        }
    }
}

impl Default for Runners {
    fn default() -> Runners {
        let (tx, rx) = crossbeam_channel::unbounded();
        Runners { running: Arc::default(), tx, rx }
    }
}

impl Runners {
    /// No runner yet: threads start with the calls.
    pub fn new() -> Runners {
        Runners::default()
    }

    fn lock(&self) -> MutexGuard<'_, Running> {
        // Every update leaves the counts consistent, so a lock poisoned elsewhere is fine.
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Calls running on runner threads now.
    pub fn running(&self) -> usize {
        self.lock().all
    }

    /// Runner threads alive now (running a call or waiting for one).
    pub fn threads(&self) -> usize {
        self.lock().threads
    }

    /// Runs call `id` of `client` on a runner thread, which answers through `respond`. `Err`
    /// gives the call back when the server or the client has no runner place left, or no thread
    /// could be started: the caller runs it itself.
    pub fn run(&self, id: Value, client: String, call: Call, respond: Respond) -> Result<(), Refused> {
        let mut running = self.lock();
        if !running.enter(&client) {
            return Err((call, respond));
        }
        let task = Task { id, client, call, respond };
        if running.idle > 0 {
            running.idle -= 1;
            // Sent under the lock, so a runner giving up its wait finds it (see `serve`).
            return match self.tx.send(task) {
                Ok(()) => Ok(()),
                // Unreachable while `self` holds the receiver; give the call back all the same.
                Err(crossbeam_channel::SendError(task)) => {
                    running.idle += 1;
                    running.leave(&task.client);
                    Err((task.call, task.respond))
                }
            };
        }
        running.threads += 1;
        drop(running);
        // The thread's first call travels in this slot, so that it comes back if the thread
        // cannot start.
        let slot = Arc::new(Mutex::new(Some(task)));
        let (runners, first) = (self.clone(), slot.clone());
        let started = thread::Builder::new().name("sandbox-mcp-runner".into()).spawn(move || {
            let task = first.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(task) = task {
                runners.serve(task);
            }
        });
        if let Err(err) = started {
            log::warn!("could not start a runner thread ({err}); the call runs on its worker");
            let task = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
            let mut running = self.lock();
            running.threads -= 1;
            if let Some(task) = task {
                running.leave(&task.client);
                return Err((task.call, task.respond));
            }
        }
        Ok(())
    }

    /// A runner thread's life: runs `task`, then the calls sent to it, until none came for
    /// [`IDLE_EXIT`].
    fn serve(&self, mut task: Task) {
        loop {
            let Task { id, client, call, respond } = task;
            let outcome = panic::catch_unwind(AssertUnwindSafe(call)).unwrap_or_else(|payload| queue::panicked(&id, payload.as_ref()));
            {
                // The place is given back before the answer goes out, so that a client that sends
                // its next call on the answer finds it free; and this runner waits from now on.
                let mut running = self.lock();
                running.leave(&client);
                running.idle += 1;
            }
            respond(outcome);
            task = match self.rx.recv_timeout(IDLE_EXIT) {
                Ok(next) => next,
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {
                    let mut running = self.lock();
                    // A call sent while this runner was giving up was counted on a waiting runner.
                    match self.rx.try_recv() {
                        Ok(next) => next,
                        Err(_) => {
                            running.idle = running.idle.saturating_sub(1);
                            running.threads -= 1;
                            return;
                        }
                    }
                }
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crossbeam_channel::bounded;
    use serde_json::json;
    use std::time::Duration;

    fn answer(n: u64) -> Outcome {
        Outcome::Answer(json!({"id": n}))
    }

    /// Calls run beside each other on threads of their own, up to the client's share; one more of
    /// that client's comes back to run on its worker, while another client's still gets a runner.
    #[test]
    fn a_client_gets_its_share_and_no_more() {
        let runners = Runners::new();
        let (release_tx, release_rx) = bounded::<()>(0);
        let (answers_tx, answers_rx) = crossbeam_channel::unbounded::<Outcome>();
        for n in 0..MAX_RUNNING_CALLS_PER_CLIENT as u64 {
            let release = release_rx.clone();
            let answers = answers_tx.clone();
            let call: Call = Box::new(move || {
                let _ = release.recv();
                answer(n)
            });
            assert!(runners.run(json!(n), "a".into(), call, Box::new(move |o| drop(answers.send(o)))).is_ok());
        }
        assert_eq!(runners.running(), MAX_RUNNING_CALLS_PER_CLIENT);
        let refused = runners.run(json!(99), "a".into(), Box::new(|| answer(99)), Box::new(|_| {}));
        let Err((call, _respond)) = refused else { panic!("a client got more than its share") };
        assert_eq!(call(), answer(99), "the call comes back whole");
        let other = answers_tx.clone();
        assert!(runners.run(json!(7), "b".into(), Box::new(|| answer(1000)), Box::new(move |o| drop(other.send(o)))).is_ok());
        assert_eq!(answers_rx.recv_timeout(Duration::from_secs(10)).unwrap(), answer(1000), "the other client's call ran at once");
        for _ in 0..MAX_RUNNING_CALLS_PER_CLIENT {
            release_tx.send(()).unwrap();
        }
        for _ in 0..MAX_RUNNING_CALLS_PER_CLIENT {
            answers_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while runners.running() > 0 && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        assert_eq!(runners.running(), 0);
        // The runners wait for the next calls: seventeen more calls start no thread.
        let threads = runners.threads();
        assert_eq!(threads, MAX_RUNNING_CALLS_PER_CLIENT + 1);
        let (tx, rx) = crossbeam_channel::unbounded::<Outcome>();
        for n in 0..threads as u64 {
            let tx = tx.clone();
            assert!(runners.run(json!(n), format!("c{n}"), Box::new(move || answer(n)), Box::new(move |o| drop(tx.send(o)))).is_ok());
        }
        for _ in 0..threads {
            rx.recv_timeout(Duration::from_secs(10)).unwrap();
        }
        assert_eq!(runners.threads(), threads, "a waiting runner took each call");
    }

    /// A call that panics is answered -32603 and gives its place back.
    #[test]
    fn a_panicking_call_is_answered_and_gives_its_place_back() {
        let runners = Runners::new();
        let (tx, rx) = bounded::<Outcome>(1);
        let call: Call = Box::new(|| panic!("boom"));
        assert!(runners.run(json!(5), "a".into(), call, Box::new(move |o| drop(tx.send(o)))).is_ok());
        match rx.recv_timeout(Duration::from_secs(10)).unwrap() {
            Outcome::Answer(v) => assert_eq!(v["error"]["code"], -32603, "{v}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(runners.running(), 0);
    }
}
