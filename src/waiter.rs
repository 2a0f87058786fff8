//! The waiter: the calls waiting for something in a sandbox (a `get_task` with `wait`), held
//! aside so that they never occupy a worker.
//!
//! A worker runs such a call's first read; when the call must wait, it parks a [`Watch`] here
//! with the job's [`Respond`] and takes the next job. The waiter's scheduler thread knows when
//! each parked watch is due (every [`Watch::every`]) and hands due checks to a few checker
//! threads (at most [`CHECKERS`]); it answers through the watch's `Respond` as soon as a check has
//! an answer, or with [`Watch::give_up`] (also run on a checker) once the watch's deadline
//! passes. At most [`MAX_WAITING_CALLS`] wait at once; [`Waiter::park`] hands a watch back
//! beyond that, and the caller answers it at once.
//!
//! A check reads a sandbox, which its code controls: it may be slow or stall until its own
//! deadline (a FIFO put in place of a state file). Checks that read one sandbox run one at a
//! time ([`Watch::keys`]: a subscription's watch reads every sandbox it follows tasks in), so a
//! stalled sandbox holds at most one checker and delays only the calls that read it; the
//! scheduler itself never runs a check. With `n` calls waiting, each is checked at
//! most every `max(every, n × MIN_GAP)`, so many waits cost a bounded share of the CPU.

use crate::limits::{MAX_WAITING_CALLS, MAX_WAITING_CALLS_PER_CLIENT};
use crate::queue::{Outcome, Respond};
use crate::tally::Tally;
use crossbeam_channel::{Receiver, Sender};
use std::collections::{HashMap, HashSet};
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
    /// What the check reads (the ids of the sandboxes it reads): a check runs only while no
    /// other check reads one of them, so a sandbox whose reads stall holds at most one checker.
    /// Empty: a key of its own.
    fn keys(&self) -> Vec<String> {
        Vec::new()
    }
    /// The client the call comes from: one client holds at most
    /// [`MAX_WAITING_CALLS_PER_CLIENT`] of the waiting places. `None`: counted on its own.
    fn client(&self) -> Option<String> {
        None
    }
}

/// The most checks that run at once (each on a thread of its own, started when first needed).
pub const CHECKERS: usize = 8;

/// The checks of all waiting calls together take at most about one every this long: with many
/// calls waiting, each is checked less often (local checks start a shell; this bounds the CPU
/// they take to about one core's fraction of check time per gap).
const MIN_GAP: Duration = Duration::from_millis(10);

struct Parked {
    watch: Box<dyn Watch>,
    respond: Respond,
    next: Instant,
}

/// How many calls each client has waiting.
type PerClient = Arc<std::sync::Mutex<HashMap<String, usize>>>;

fn per_client(map: &PerClient) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
    // Single inserts and removals: a poisoned map is still consistent.
    map.lock().unwrap_or_else(|p| p.into_inner())
}

/// Gives back a client's waiting place.
fn leave(map: &PerClient, client: Option<&str>) {
    let Some(client) = client else { return };
    let mut counts = per_client(map);
    if let Some(n) = counts.get_mut(client) {
        *n -= 1;
        if *n == 0 {
            counts.remove(client);
        }
    }
}

/// A parked call as the scheduler holds it: its watch is away while a checker has it.
struct Slot {
    watch: Option<Box<dyn Watch>>,
    respond: Option<Respond>,
    next: Instant,
    until: Instant,
    every: Duration,
    /// What its checks read ([`Watch::keys`], or a key of its own).
    keys: Vec<String>,
    client: Option<String>,
}

/// Work for a checker: check a watch, or end its wait.
enum Job {
    Check(u64, Box<dyn Watch>),
    GiveUp(u64, Box<dyn Watch>),
}

/// What a checker sends back: the watch and its answer, if any (always one after `GiveUp`).
type Checked = (u64, Option<Box<dyn Watch>>, Option<Outcome>);

/// The handle of the waiter.
#[derive(Clone)]
pub struct Waiter {
    tx: Sender<Parked>,
    waiting: Arc<AtomicUsize>,
    clients: PerClient,
}

impl Waiter {
    /// Starts the waiter's scheduler thread (`sandbox-mcp-waiter`); it ends when every handle is
    /// dropped and nothing waits.
    pub fn start() -> io::Result<Waiter> {
        let (tx, rx) = crossbeam_channel::unbounded::<Parked>();
        let waiting = Arc::new(AtomicUsize::new(0));
        let clients = PerClient::default();
        let (count, left) = (waiting.clone(), clients.clone());
        thread::Builder::new().name("sandbox-mcp-waiter".into()).spawn(move || schedule(&rx, &count, &left))?;
        Ok(Waiter { tx, waiting, clients })
    }

    /// Parks `watch`, answered later through `respond`; checked first after [`Watch::every`].
    /// Hands both back when [`MAX_WAITING_CALLS`] already wait, or its client already has
    /// [`MAX_WAITING_CALLS_PER_CLIENT`] waiting (or the thread is gone).
    #[allow(clippy::result_large_err)]
    pub fn park(&self, watch: Box<dyn Watch>, respond: Respond) -> Result<(), (Box<dyn Watch>, Respond)> {
        let client = watch.client();
        if let Some(client) = &client {
            let mut counts = per_client(&self.clients);
            let n = counts.entry(client.clone()).or_insert(0);
            if *n >= MAX_WAITING_CALLS_PER_CLIENT {
                return Err((watch, respond));
            }
            *n += 1;
        }
        if self.waiting.fetch_add(1, Ordering::SeqCst) >= MAX_WAITING_CALLS {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            leave(&self.clients, client.as_deref());
            return Err((watch, respond));
        }
        let next = Instant::now() + watch.every();
        self.tx.send(Parked { watch, respond, next }).map_err(|e| {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            leave(&self.clients, client.as_deref());
            let Parked { watch, respond, .. } = e.into_inner();
            (watch, respond)
        })
    }

    /// Parks `watch`, or answers it at once (with [`Watch::give_up`]) when the waiter is full.
    pub fn park_or_answer(&self, watch: Box<dyn Watch>, respond: Respond) {
        if let Err((watch, respond)) = self.park(watch, respond) {
            static REFUSED: Tally = Tally::new();
            if let Some(n) = REFUSED.add() {
                log::warn!("the waiting places are taken ({MAX_WAITING_CALLS} in all, {MAX_WAITING_CALLS_PER_CLIENT} per client): {n} calls answered at once so far");
            }
            respond(watch.give_up());
        }
    }

    /// How many calls wait now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }
}

/// The scheduler: takes parked calls, hands due checks to checkers (one per key at a time, at
/// most [`CHECKERS`] at once), and answers calls whose check answered or whose wait is over.
fn schedule(rx: &Receiver<Parked>, count: &AtomicUsize, clients: &PerClient) {
    let (jobs_tx, jobs_rx) = crossbeam_channel::unbounded::<Job>();
    let (done_tx, done_rx) = crossbeam_channel::unbounded::<Checked>();
    let mut s = Schedule { slots: HashMap::new(), busy_keys: HashSet::new(), in_flight: 0, next_id: 0, count, clients };
    let mut checkers = 0usize;
    let mut open = true;
    while open || !s.slots.is_empty() {
        // New calls first: checks that take longer than the poll interval must not keep them out.
        for p in rx.try_iter() {
            s.take(p);
        }
        for checked in done_rx.try_iter() {
            s.settle(checked);
        }
        // Everything due now whose key is free goes to a checker.
        for job in s.due_jobs() {
            if checkers < s.in_flight.min(CHECKERS) {
                let (jobs, done) = (jobs_rx.clone(), done_tx.clone());
                if thread::Builder::new().name("sandbox-mcp-check".into()).spawn(move || check_forever(&jobs, &done)).is_ok() {
                    checkers += 1;
                }
            }
            if checkers == 0 || jobs_tx.send(job).is_err() {
                log::error!("the waiter has no checker thread; waiting calls are answered late");
                return;
            }
        }
        if !open && s.slots.is_empty() {
            return;
        }
        // Sleep until something is due, a check comes back or a call arrives.
        let timeout = s.next_due().map_or(Duration::from_secs(3600), |w| w.saturating_duration_since(Instant::now()));
        let arrivals = if open { rx.clone() } else { crossbeam_channel::never() };
        crossbeam_channel::select! {
            recv(arrivals) -> p => match p {
                Ok(p) => s.take(p),
                Err(_) => open = false,
            },
            recv(done_rx) -> checked => {
                if let Ok(checked) = checked {
                    s.settle(checked);
                }
            },
            default(timeout) => {}
        }
    }
}

/// The scheduler's state: the parked calls, the keys with a check out, and the counts it keeps.
struct Schedule<'a> {
    slots: HashMap<u64, Slot>,
    busy_keys: HashSet<String>,
    in_flight: usize,
    next_id: u64,
    count: &'a AtomicUsize,
    clients: &'a PerClient,
}

impl Schedule<'_> {
    /// Holds a newly parked call.
    fn take(&mut self, p: Parked) {
        self.next_id += 1;
        let id = self.next_id;
        let mut keys = p.watch.keys();
        if keys.is_empty() {
            keys.push(format!("#{id}"));
        }
        let slot = Slot {
            until: p.watch.until(),
            every: p.watch.every(),
            client: p.watch.client(),
            watch: Some(p.watch),
            respond: Some(p.respond),
            next: p.next,
            keys,
        };
        self.slots.insert(id, slot);
        log::debug!("call {id} waits ({} waiting)", self.slots.len());
    }

    /// A checker's result: the call is answered, or waits for its next check.
    fn settle(&mut self, (id, watch, answer): Checked) {
        self.in_flight -= 1;
        let n = self.slots.len() as u32;
        let Some(slot) = self.slots.get_mut(&id) else { return };
        for key in &slot.keys {
            self.busy_keys.remove(key);
        }
        match answer {
            Some(outcome) => {
                if let Some(respond) = slot.respond.take() {
                    self.count.fetch_sub(1, Ordering::SeqCst);
                    leave(self.clients, slot.client.as_deref());
                    respond(outcome);
                }
                self.slots.remove(&id);
            }
            None => {
                slot.watch = watch;
                slot.next = Instant::now() + slot.every.max(MIN_GAP * n);
            }
        }
    }

    /// Takes out the checks due now, earliest first, one per free key and at most
    /// [`CHECKERS`] out at once. A due call whose keys are not all free holds the free ones for
    /// this pass: later calls on them wait, so a call over several sandboxes is not starved by
    /// checks that take turns on each of them.
    fn due_jobs(&mut self) -> Vec<Job> {
        let now = Instant::now();
        let mut due: Vec<(Instant, u64)> = self
            .slots
            .iter()
            .filter(|(_, s)| s.watch.is_some() && s.next.min(s.until) <= now)
            .map(|(id, s)| (s.next.min(s.until), *id))
            .collect();
        due.sort();
        let mut jobs = Vec::new();
        let mut held: HashSet<String> = HashSet::new();
        for (_, id) in due {
            if self.in_flight >= CHECKERS {
                break;
            }
            let Some(slot) = self.slots.get_mut(&id) else { continue };
            if slot.keys.iter().any(|k| self.busy_keys.contains(k) || held.contains(k)) {
                held.extend(slot.keys.iter().cloned());
                continue;
            }
            let Some(watch) = slot.watch.take() else { continue };
            jobs.push(if Instant::now() >= slot.until { Job::GiveUp(id, watch) } else { Job::Check(id, watch) });
            self.busy_keys.extend(slot.keys.iter().cloned());
            self.in_flight += 1;
        }
        jobs
    }

    /// When the next check of an idle call is due.
    fn next_due(&self) -> Option<Instant> {
        self.slots.values().filter(|s| self.idle(s)).map(|s| s.next.min(s.until)).min()
    }

    /// Whether a call waits here with no check out for it or its key.
    fn idle(&self, s: &Slot) -> bool {
        s.watch.is_some() && !s.keys.iter().any(|k| self.busy_keys.contains(k))
    }
}

/// A checker thread: runs jobs until the scheduler is gone.
fn check_forever(jobs: &Receiver<Job>, done: &Sender<Checked>) {
    for job in jobs.iter() {
        let sent = match job {
            Job::Check(id, mut watch) => {
                let answer = watch.check();
                done.send((id, Some(watch), answer))
            }
            Job::GiveUp(id, watch) => done.send((id, None, Some(watch.give_up()))),
        };
        if sent.is_err() {
            return;
        }
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
            self.flag.load(Ordering::SeqCst).then(|| Outcome::Answer(json!("ready").into()))
        }
        fn give_up(self: Box<Self>) -> Outcome {
            Outcome::Answer(json!("late").into())
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

    /// A watch over the sandboxes `keys` (comma-separated) whose check is `check`, given them.
    struct Scripted {
        keys: &'static str,
        until: Instant,
        check: Box<dyn FnMut(&'static str) -> Option<Outcome> + Send>,
    }

    impl Watch for Scripted {
        fn check(&mut self) -> Option<Outcome> {
            (self.check)(self.keys)
        }
        fn give_up(self: Box<Self>) -> Outcome {
            Outcome::Answer(json!("late").into())
        }
        fn until(&self) -> Instant {
            self.until
        }
        fn every(&self) -> Duration {
            Duration::from_millis(1)
        }
        fn keys(&self) -> Vec<String> {
            self.keys.split(',').map(str::to_string).collect()
        }
    }

    /// A watch whose check stalls (a FIFO in place of a state file) for as long as `stall` is
    /// set, then answers its keys.
    fn stalled(key: &'static str, stall: Arc<AtomicBool>, until: Instant) -> Scripted {
        let check = move |keys: &'static str| {
            while stall.load(Ordering::SeqCst) {
                thread::sleep(Duration::from_millis(5));
            }
            Some(Outcome::Answer(json!(keys).into()))
        };
        Scripted { keys: key, until, check: Box::new(check) }
    }

    /// Parks a call over each of `keys` (comma-separated sandboxes) whose reads stall, then
    /// checks that twenty calls on another sandbox are answered at once, and the stalled ones
    /// once their reads return.
    fn stalled_calls_cost_only_their_sandbox(keys: &[&'static str]) {
        let waiter = Waiter::start().unwrap();
        let (tx, rx) = crossbeam_channel::unbounded::<Outcome>();
        let stall = Arc::new(AtomicBool::new(true));
        let until = Instant::now() + Duration::from_secs(30);
        for key in keys {
            waiter.park(Box::new(stalled(key, stall.clone(), until)), respond_to(&tx)).ok().unwrap();
        }
        let t0 = Instant::now();
        for _ in 0..20 {
            let free = Arc::new(AtomicBool::new(false));
            waiter.park(Box::new(stalled("third", free, until)), respond_to(&tx)).ok().unwrap();
            assert_eq!(rx.recv_timeout(Duration::from_secs(2)).unwrap(), Outcome::Answer(json!("third").into()));
        }
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        stall.store(false, Ordering::SeqCst);
        let mut answered: Vec<Outcome> = keys.iter().map(|_| rx.recv_timeout(Duration::from_secs(5)).unwrap()).collect();
        let mut expected: Vec<Outcome> = keys.iter().map(|k| Outcome::Answer(json!(k).into())).collect();
        answered.sort_by_key(|o| format!("{o:?}"));
        expected.sort_by_key(|o| format!("{o:?}"));
        assert_eq!(answered, expected);
        assert_eq!(waiter.waiting(), 0);
    }

    /// One sandbox whose reads stall costs only its own calls: the others are answered at once,
    /// and the stalled one when its read returns.
    #[test]
    fn a_stalled_sandbox_delays_only_its_own_calls() {
        stalled_calls_cost_only_their_sandbox(&["hostile"; 3]);
    }

    /// More calls on a stalled sandbox than there are checkers, some of them also reading
    /// another sandbox, still hold one checker: a third sandbox's calls are answered at once.
    #[test]
    fn many_calls_on_a_stalled_sandbox_hold_one_checker() {
        let keys: Vec<&'static str> = (0..2 * CHECKERS).map(|i| if i % 2 == 0 { "hostile" } else { "hostile,other" }).collect();
        stalled_calls_cost_only_their_sandbox(&keys);
    }

    /// A call over two sandboxes is answered although single-sandbox calls on each keep taking
    /// turns (each check takes a while): the free sandbox is held for it until the other is free.
    #[test]
    fn a_call_over_two_sandboxes_is_not_starved_by_calls_on_each() {
        /// A check that takes 30 ms and answers a call over several sandboxes at once, one over
        /// a single sandbox once `done` is set.
        fn slow(keys: &'static str, until: Instant, done: Arc<AtomicBool>) -> Box<Scripted> {
            let check = move |keys: &'static str| {
                thread::sleep(Duration::from_millis(30));
                (keys.contains(',') || done.load(Ordering::SeqCst)).then(|| Outcome::Answer(json!(keys).into()))
            };
            Box::new(Scripted { keys, until, check: Box::new(check) })
        }
        let waiter = Waiter::start().unwrap();
        let (tx, rx) = crossbeam_channel::unbounded::<Outcome>();
        let done = Arc::new(AtomicBool::new(false));
        let until = Instant::now() + Duration::from_secs(20);
        // The checks on "b" run half a check behind those on "a": never both free at once.
        for keys in ["a", "a", "a", "a"] {
            waiter.park(slow(keys, until, done.clone()), respond_to(&tx)).ok().unwrap();
        }
        thread::sleep(Duration::from_millis(15));
        for keys in ["b", "b", "b", "b"] {
            waiter.park(slow(keys, until, done.clone()), respond_to(&tx)).ok().unwrap();
        }
        thread::sleep(Duration::from_millis(40));
        waiter.park(slow("a,b", until, done.clone()), respond_to(&tx)).ok().unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), Outcome::Answer(json!("a,b").into()));
        done.store(true, Ordering::SeqCst);
        for _ in 0..8 {
            assert!(rx.recv_timeout(Duration::from_secs(5)).is_ok());
        }
    }

    /// A Flag of one client.    /// A Flag of one client.
    struct Of(&'static str, Flag);

    impl Watch for Of {
        fn check(&mut self) -> Option<Outcome> {
            self.1.check()
        }
        fn give_up(self: Box<Self>) -> Outcome {
            Outcome::Answer(json!("late").into())
        }
        fn until(&self) -> Instant {
            self.1.until
        }
        fn every(&self) -> Duration {
            self.1.every()
        }
        fn client(&self) -> Option<String> {
            Some(self.0.to_string())
        }
    }

    /// One client holds at most its share of the waiting places; another still parks.
    #[test]
    fn one_client_holds_at_most_its_share_of_the_waits() {
        let waiter = Waiter::start().unwrap();
        let checks = Arc::new(AtomicUsize::new(0));
        let until = Instant::now() + Duration::from_secs(60);
        let of = |client: &'static str| Of(client, Flag { flag: Arc::new(AtomicBool::new(false)), until, checks: checks.clone() });
        for _ in 0..MAX_WAITING_CALLS_PER_CLIENT {
            assert!(waiter.park(Box::new(of("greedy")), Box::new(|_| {})).is_ok());
        }
        assert!(waiter.park(Box::new(of("greedy")), Box::new(|_| {})).is_err(), "over its share");
        assert!(waiter.park(Box::new(of("other")), Box::new(|_| {})).is_ok(), "another client still waits");
        assert_eq!(waiter.waiting(), MAX_WAITING_CALLS_PER_CLIENT + 1);
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
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), Outcome::Answer(json!("late").into()));
        assert!(rx.try_recv().is_err(), "the other one still waits");
        flag.store(true, Ordering::SeqCst);
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), Outcome::Answer(json!("ready").into()));
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
        assert_eq!(rx.recv_timeout(Duration::from_secs(1)).unwrap(), Outcome::Answer(json!("late").into()));
        assert_eq!(waiter.waiting(), MAX_WAITING_CALLS);
    }
}
