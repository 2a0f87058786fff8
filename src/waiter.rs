//! The waiter: one thread that holds the calls waiting for something in a sandbox (a `get_task`
//! with `wait`), so that they never occupy a worker.
//!
//! A worker runs such a call's first read; when the call must wait, it parks a [`Watch`] here
//! with the job's [`Respond`] and takes the next job. The waiter checks each parked watch again
//! every [`Watch::every`] (one read of the sandbox per check) and answers through its `Respond`
//! as soon as the watch has an answer, or with [`Watch::give_up`] once the watch's deadline
//! passes. At most [`MAX_WAITING_CALLS`] wait at once; [`Waiter::park`] hands a watch back
//! beyond that, and the caller answers it at once.
//!
//! Checks run one after another on this one thread: a slow read (a remote sandbox) delays the
//! others' checks, never a worker. With `n` calls waiting, each is checked at most every
//! `max(every, n × MIN_GAP)`, so many waits cost a bounded share of the CPU.

use crate::limits::MAX_WAITING_CALLS;
use crate::queue::{Outcome, Respond};
use crossbeam_channel::{RecvTimeoutError, Sender};
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// A parked call: how to check it, and its answer when the wait ends.
pub trait Watch: Send {
    /// Checks once (it may read the sandbox); `Some` when the call can be answered now (its
    /// condition holds, it failed, the client cancelled it, or the server is shutting down).
    fn check(&mut self) -> Option<Outcome>;
    /// The answer when the wait ends without an answer from [`Watch::check`].
    fn give_up(self: Box<Self>) -> Outcome;
    /// When the wait ends.
    fn until(&self) -> Instant;
    /// How long between two checks.
    fn every(&self) -> Duration;
}

/// The checks of all waiting calls together take at most about one every this long: with many
/// calls waiting, each is checked less often (local checks start a shell; this bounds the CPU
/// they take to about one core's fraction of check time per gap).
const MIN_GAP: Duration = Duration::from_millis(10);

struct Parked {
    watch: Box<dyn Watch>,
    respond: Respond,
    next: Instant,
}

/// The handle of the waiter thread.
#[derive(Clone)]
pub struct Waiter {
    tx: Sender<Parked>,
    waiting: Arc<AtomicUsize>,
}

impl Waiter {
    /// Starts the waiter thread (`sandbox-mcp-waiter`); it ends when every handle is dropped and
    /// nothing waits.
    pub fn start() -> io::Result<Waiter> {
        let (tx, rx) = crossbeam_channel::unbounded::<Parked>();
        let waiting = Arc::new(AtomicUsize::new(0));
        let count = waiting.clone();
        thread::Builder::new().name("sandbox-mcp-waiter".into()).spawn(move || {
            let mut parked: Vec<Parked> = Vec::new();
            let mut open = true;
            let mut received = 0u64;
            while open || !parked.is_empty() {
                // New calls first: checks that take longer than the poll interval must not keep
                // them out.
                for p in rx.try_iter() {
                    parked.push(p);
                    received += 1;
                    log::debug!("call {received} waits ({} waiting)", parked.len());
                }
                let now = Instant::now();
                let due = parked.iter().map(|p| p.next.min(p.watch.until())).min();
                let arrived = match due {
                    Some(due) if due <= now => None,
                    Some(due) if open => match rx.recv_timeout(due - now) {
                        Ok(p) => Some(p),
                        Err(RecvTimeoutError::Timeout) => None,
                        Err(RecvTimeoutError::Disconnected) => {
                            open = false;
                            None
                        }
                    },
                    Some(due) => {
                        thread::sleep(due - now);
                        None
                    }
                    None => match rx.recv() {
                        Ok(p) => Some(p),
                        Err(_) => return,
                    },
                };
                if let Some(p) = arrived {
                    parked.push(p);
                    received += 1;
                    log::debug!("call {received} waits ({} waiting)", parked.len());
                    continue;
                }
                // Everything due now: check it, answer what is ready or over.
                let n = parked.len();
                let mut i = 0;
                while i < parked.len() {
                    let now = Instant::now();
                    let p = &mut parked[i];
                    if p.next.min(p.watch.until()) > now {
                        i += 1;
                        continue;
                    }
                    let answer = match p.watch.check() {
                        Some(outcome) => Some(outcome),
                        None if Instant::now() >= p.watch.until() => None,
                        None => {
                            p.next = Instant::now() + p.watch.every().max(MIN_GAP * n as u32);
                            i += 1;
                            continue;
                        }
                    };
                    let Parked { watch, respond, .. } = parked.swap_remove(i);
                    let outcome = answer.unwrap_or_else(|| watch.give_up());
                    count.fetch_sub(1, Ordering::SeqCst);
                    respond(outcome);
                }
            }
        })?;
        Ok(Waiter { tx, waiting })
    }

    /// Parks `watch`, answered later through `respond`; checked first after [`Watch::every`].
    /// Hands both back when [`MAX_WAITING_CALLS`] already wait (or the thread is gone).
    #[allow(clippy::result_large_err)]
    pub fn park(&self, watch: Box<dyn Watch>, respond: Respond) -> Result<(), (Box<dyn Watch>, Respond)> {
        if self.waiting.fetch_add(1, Ordering::SeqCst) >= MAX_WAITING_CALLS {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err((watch, respond));
        }
        let next = Instant::now() + watch.every();
        self.tx.send(Parked { watch, respond, next }).map_err(|e| {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            let Parked { watch, respond, .. } = e.into_inner();
            (watch, respond)
        })
    }

    /// Parks `watch`, or answers it at once (with [`Watch::give_up`]) when the waiter is full.
    pub fn park_or_answer(&self, watch: Box<dyn Watch>, respond: Respond) {
        if let Err((watch, respond)) = self.park(watch, respond) {
            log::warn!("{MAX_WAITING_CALLS} calls are already waiting; answering one more at once");
            respond(watch.give_up());
        }
    }

    /// How many calls wait now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::atomic::AtomicBool;

    /// Ready once `flag` is set; gives up with "late".
    struct Flag {
        flag: Arc<AtomicBool>,
        until: Instant,
        checks: Arc<AtomicUsize>,
    }

    impl Watch for Flag {
        fn check(&mut self) -> Option<Outcome> {
            self.checks.fetch_add(1, Ordering::SeqCst);
            self.flag.load(Ordering::SeqCst).then(|| Outcome::Answer(json!("ready")))
        }
        fn give_up(self: Box<Self>) -> Outcome {
            Outcome::Answer(json!("late"))
        }
        fn until(&self) -> Instant {
            self.until
        }
        fn every(&self) -> Duration {
            Duration::from_millis(5)
        }
    }

    fn respond_to(tx: &crossbeam_channel::Sender<Outcome>) -> Respond {
        let tx = tx.clone();
        Box::new(move |o| {
            let _ = tx.send(o);
        })
    }

    #[test]
    fn answers_when_ready_or_when_the_wait_ends_and_bounds_the_number_waiting() {
        let waiter = Waiter::start().unwrap();
        let (tx, rx) = crossbeam_channel::unbounded::<Outcome>();
        let flag = Arc::new(AtomicBool::new(false));
        let checks = Arc::new(AtomicUsize::new(0));
        let ready = Flag { flag: flag.clone(), until: Instant::now() + Duration::from_secs(30), checks: checks.clone() };
        assert!(waiter.park(Box::new(ready), respond_to(&tx)).is_ok());
        let late =
            Flag { flag: Arc::new(AtomicBool::new(false)), until: Instant::now() + Duration::from_millis(50), checks: checks.clone() };
        assert!(waiter.park(Box::new(late), respond_to(&tx)).is_ok());
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), Outcome::Answer(json!("late")));
        assert!(rx.try_recv().is_err(), "the other one still waits");
        flag.store(true, Ordering::SeqCst);
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), Outcome::Answer(json!("ready")));
        assert!(checks.load(Ordering::SeqCst) >= 2);
        assert_eq!(waiter.waiting(), 0);
        // Full: the watch comes back, and park_or_answer answers it at once.
        let forever =
            || Flag { flag: Arc::new(AtomicBool::new(false)), until: Instant::now() + Duration::from_secs(60), checks: checks.clone() };
        for _ in 0..MAX_WAITING_CALLS {
            assert!(waiter.park(Box::new(forever()), Box::new(|_| {})).is_ok());
        }
        assert!(waiter.park(Box::new(forever()), respond_to(&tx)).is_err());
        waiter.park_or_answer(Box::new(forever()), respond_to(&tx));
        assert_eq!(rx.recv_timeout(Duration::from_secs(1)).unwrap(), Outcome::Answer(json!("late")));
        assert_eq!(waiter.waiting(), MAX_WAITING_CALLS);
    }
}
