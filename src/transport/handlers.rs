//! The threads that handle HTTP requests: as many as requests are being handled, up to a cap.
//!
//! A request is handled on one thread from its body's first byte to its answer's last, and that
//! thread can wait a long time on its client (a body sent slowly, an answer read slowly: only a
//! pause of `--http-stall` ends them, see `http::bind`) or on the work (a long call, a wait, a
//! `subscriptions/listen` stream). A fixed set of such threads would let a client that opens
//! enough slow connections stall every other client. Here the threads take requests from their
//! source (a tiny_http server's queue) themselves, and a thread that takes one while no other
//! thread waits at that source first starts one that does: one client's slow connections cost
//! threads but never delay another client's requests, up to the pool's cap of threads at once
//! (the server's: a thread for every call it admits, plus
//! [`crate::limits::HTTP_SPARE_HANDLERS`]); beyond it a request waits in the source for a thread
//! to come back. A request wakes one thread, as with a fixed set (a hand-over from a dispatcher
//! thread cost a second wake-up: 16% of the ping throughput).
//!
//! A source's first thread is made past the cap if need be. A source left with no waiting thread
//! because none could be added (the cap, or the system refused a thread) gets the next thread to
//! come free from any source, or one that [`Handlers::replenish`] starts. Beyond [`RESIDENT`]
//! threads in all, a thread left idle for [`IDLE`] ends.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Idle handler threads kept (with at least one per source).
pub const RESIDENT: usize = 8;

/// How long a handler thread beyond [`RESIDENT`] stays idle before it ends.
pub const IDLE: Duration = Duration::from_secs(10);

/// Each handler thread's stack.
const STACK: usize = 256 * 1024;

/// What a handler thread got from its source.
pub enum Next<T> {
    /// A job to handle.
    Job(T),
    /// Nothing within the wait asked for.
    Quiet,
    /// The source has ended: its threads end.
    Ended,
}

/// Where jobs come from; shared by the threads that wait in it.
pub trait Source<T>: Send + Sync {
    /// The next job, waiting at most `wait`.
    fn next(&self, wait: Duration) -> Next<T>;
}

/// The pool of handler threads for jobs of type `T`, each handled by `handle`.
pub struct Handlers<T: Send + 'static> {
    handle: Arc<dyn Fn(T) + Send + Sync>,
    /// Handler threads alive now, in all.
    live: AtomicUsize,
    /// Sources left with no waiting thread because none could be added (the cap, or no thread
    /// could be made): the next thread to come free goes there, or [`Handlers::replenish`]
    /// starts one.
    starved: Mutex<Vec<Arc<Served<T>>>>,
    /// When a source was last seen starved (the end of its last starving, as far as known).
    starved_at: Mutex<Option<Instant>>,
    max: usize,
    resident: usize,
    idle: Duration,
    name: &'static str,
}

/// One source and how many threads wait in it now.
struct Served<T> {
    source: Arc<dyn Source<T>>,
    waiting: AtomicUsize,
}

impl<T: Send + 'static> Handlers<T> {
    /// A pool of at most `max` threads named `name` that run `handle` on each job of the sources
    /// given to [`Handlers::serve`].
    pub fn new(name: &'static str, max: usize, handle: impl Fn(T) + Send + Sync + 'static) -> Arc<Handlers<T>> {
        Handlers::with_limits(name, max, RESIDENT, IDLE, handle)
    }

    fn with_limits(
        name: &'static str,
        max: usize,
        resident: usize,
        idle: Duration,
        handle: impl Fn(T) + Send + Sync + 'static,
    ) -> Arc<Handlers<T>> {
        Arc::new(Handlers {
            handle: Arc::new(handle),
            live: AtomicUsize::new(0),
            starved: Mutex::new(Vec::new()),
            starved_at: Mutex::new(None),
            max,
            resident,
            idle,
            name,
        })
    }

    /// Serves `source` until it ends, starting its first thread (past the cap if need be: every
    /// source has a waiting thread); `Err` when no thread could be made for it.
    pub fn serve(self: &Arc<Self>, source: Arc<dyn Source<T>>) -> std::io::Result<()> {
        let served = Arc::new(Served { source, waiting: AtomicUsize::new(0) });
        self.add(&served, true).map(|_| ())
    }

    /// Starts a thread for each starved source, as far as the cap and the system allow.
    pub fn replenish(self: &Arc<Self>) {
        let starved = std::mem::take(&mut *self.starved.lock().unwrap_or_else(|p| p.into_inner()));
        if !starved.is_empty() {
            self.saw_starved();
        }
        for served in starved {
            if served.waiting.load(Ordering::SeqCst) == 0 && !matches!(self.add(&served, false), Ok(true)) {
                self.starve(served);
            }
        }
    }

    /// Starts one more thread waiting in `served`, unless the pool is at its cap (`Ok(false)`)
    /// and `past_cap` is not set.
    fn add(self: &Arc<Self>, served: &Arc<Served<T>>, past_cap: bool) -> std::io::Result<bool> {
        let counted = self.live.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (past_cap || n < self.max).then_some(n + 1));
        if counted.is_err() {
            return Ok(false);
        }
        // Counted as waiting from the start, so that a job taken meanwhile by another thread
        // does not start yet another.
        served.waiting.fetch_add(1, Ordering::SeqCst);
        let (pool, serving) = (self.clone(), served.clone());
        let spawned = std::thread::Builder::new().name(self.name.into()).stack_size(STACK).spawn(move || pool.run(serving));
        match spawned {
            Ok(_) => Ok(true),
            Err(err) => {
                served.waiting.fetch_sub(1, Ordering::SeqCst);
                self.live.fetch_sub(1, Ordering::SeqCst);
                Err(err)
            }
        }
    }

    fn starve(&self, served: Arc<Served<T>>) {
        self.starved.lock().unwrap_or_else(|p| p.into_inner()).push(served);
    }

    /// Notes that a source was starved until now (one leaves the starved list).
    fn saw_starved(&self) {
        *self.starved_at.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
    }

    /// The last time a job may have waited in a source for a thread: now while a source is
    /// starved; `None` if never.
    pub fn last_starved(&self) -> Option<Instant> {
        if !self.starved.lock().unwrap_or_else(|p| p.into_inner()).is_empty() {
            return Some(Instant::now());
        }
        *self.starved_at.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A starved source for a thread leaving `from` (which keeps another waiting thread).
    fn starved_source(&self, from: &Served<T>) -> Option<Arc<Served<T>>> {
        if from.waiting.load(Ordering::SeqCst) == 0 {
            return None;
        }
        let popped = self.starved.lock().unwrap_or_else(|p| p.into_inner()).pop();
        if popped.is_some() {
            self.saw_starved();
        }
        popped
    }

    /// A handler thread: takes jobs from its source until it ends, or until it is idle and not
    /// needed (more than `resident` threads in all, and another one waiting in its source); a
    /// starved source takes it first.
    fn run(self: Arc<Self>, mut served: Arc<Served<T>>) {
        loop {
            let next = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| served.source.next(self.idle)));
            let others = served.waiting.fetch_sub(1, Ordering::SeqCst) - 1;
            match next.unwrap_or(Next::Ended) {
                Next::Job(job) => {
                    if others == 0 {
                        match self.add(&served, false) {
                            Ok(true) => {}
                            Ok(false) => {
                                log::debug!("{}: every handler thread is busy; requests wait for one", self.name);
                                self.starve(served.clone());
                            }
                            Err(err) => {
                                log::error!("{}: could not start a handler thread ({err}); requests wait for one", self.name);
                                self.starve(served.clone());
                            }
                        }
                    }
                    // A panicking job ends alone: the thread and its counts stay.
                    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (self.handle)(job))).is_err() {
                        log::error!("a handler of {} panicked; the thread goes on", self.name);
                    }
                    if let Some(starved) = self.starved_source(&served) {
                        served = starved;
                    }
                }
                Next::Quiet => {
                    if let Some(starved) = self.starved_source(&served) {
                        served = starved;
                    } else if others > 0
                        && self.live.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n > self.resident).then(|| n - 1)).is_ok()
                    {
                        return;
                    }
                }
                Next::Ended => break,
            }
            served.waiting.fetch_add(1, Ordering::SeqCst);
        }
        self.live.fetch_sub(1, Ordering::SeqCst);
    }

    /// Handler threads alive now.
    pub fn live(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crossbeam_channel::{Receiver, RecvTimeoutError};

    /// A channel as a source; it ends when its senders are gone.
    struct Channel(Receiver<u32>);

    impl Source<u32> for Channel {
        fn next(&self, wait: Duration) -> Next<u32> {
            match self.0.recv_timeout(wait) {
                Ok(job) => Next::Job(job),
                Err(RecvTimeoutError::Timeout) => Next::Quiet,
                Err(RecvTimeoutError::Disconnected) => Next::Ended,
            }
        }
    }

    fn until(what: &str, mut f: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// A pool of at most `max` threads (`resident` kept) serving one channel, whose jobs below
    /// `blocked_below` wait for a release (one per message, or all once the sender is dropped):
    /// the pool, the release, the finished jobs and the channel's sender.
    #[allow(clippy::type_complexity)]
    fn blocking_pool(
        max: usize,
        resident: usize,
        blocked_below: u32,
    ) -> (Arc<Handlers<u32>>, crossbeam_channel::Sender<()>, Receiver<u32>, crossbeam_channel::Sender<u32>) {
        let (release_tx, release_rx) = crossbeam_channel::unbounded::<()>();
        let (done_tx, done_rx) = crossbeam_channel::unbounded::<u32>();
        let pool = Handlers::with_limits("test-handler", max, resident, Duration::from_secs(60), move |job: u32| {
            if job < blocked_below {
                let _ = release_rx.recv();
            }
            let _ = done_tx.send(job);
        });
        let (jobs, rx) = crossbeam_channel::unbounded();
        pool.serve(Arc::new(Channel(rx))).unwrap();
        (pool, release_tx, done_rx, jobs)
    }

    /// Jobs that block their thread do not delay the next job: each gets a thread of its own.
    #[test]
    fn a_blocked_job_never_delays_the_next() {
        let (pool, release_tx, done_rx, jobs) = blocking_pool(64, 2, 40);
        for job in 0..40 {
            jobs.send(job).unwrap();
        }
        jobs.send(99).unwrap();
        assert_eq!(done_rx.recv_timeout(Duration::from_secs(10)), Ok(99), "the quick job was answered while 40 others block");
        // The 40 blocked, and one or two waiting (the quick job's, and the one it started).
        until("threads to wait beside the 40 blocked", || (41..=42).contains(&pool.live()));
        drop(release_tx);
        for _ in 0..40 {
            assert!(done_rx.recv_timeout(Duration::from_secs(10)).is_ok());
        }
        // Idle threads are reused rather than added.
        let before = pool.live();
        for job in 100..140 {
            jobs.send(job).unwrap();
            assert_eq!(done_rx.recv_timeout(Duration::from_secs(10)), Ok(job));
        }
        assert!(pool.live() <= before, "{} threads after {before}", pool.live());
    }

    /// At the cap a job waits for a thread to come free, and then runs.
    #[test]
    fn at_the_cap_a_job_waits_for_a_free_thread() {
        let (pool, release_tx, done_rx, jobs) = blocking_pool(3, 1, 3);
        assert_eq!(pool.last_starved(), None, "no job has waited yet");
        for job in 0..4 {
            jobs.send(job).unwrap();
        }
        assert!(done_rx.recv_timeout(Duration::from_millis(200)).is_err(), "nothing ran past the cap");
        assert_eq!(pool.live(), 3);
        // While the source is starved, a job may be waiting now.
        let now = pool.last_starved().unwrap();
        assert!(pool.last_starved().unwrap() >= now, "a starved source is starved now");
        release_tx.send(()).unwrap();
        let mut done: Vec<u32> = (0..2).map(|_| done_rx.recv_timeout(Duration::from_secs(10)).unwrap()).collect();
        done.sort_unstable();
        assert!(done.contains(&3), "the waiting job ran on the freed thread: {done:?}");
        drop(release_tx);
        for _ in 0..2 {
            assert!(done_rx.recv_timeout(Duration::from_secs(10)).is_ok());
        }
        // Once it has a waiting thread again, the last time stays the end of its starving.
        until("the source to have a waiting thread", || {
            let ended = pool.last_starved();
            ended.is_some_and(|t| t >= now) && pool.last_starved() == ended
        });
    }

    /// A source left without a waiting thread at the cap gets the next thread to come free from
    /// another source. It used to wait until one of its own busy threads came back.
    #[test]
    fn a_source_starved_at_the_cap_gets_the_next_free_thread() {
        use std::sync::atomic::AtomicBool;
        let released: Arc<[AtomicBool; 3]> = Arc::new(Default::default());
        let (done_tx, done_rx) = crossbeam_channel::unbounded::<u32>();
        let held = released.clone();
        let pool = Handlers::with_limits("test-starved", 3, 1, Duration::from_millis(50), move |job: u32| {
            if job < 3 {
                while !held[job as usize].load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            let _ = done_tx.send(job);
        });
        let (a_jobs, a) = crossbeam_channel::unbounded();
        let (b_jobs, b) = crossbeam_channel::unbounded();
        pool.serve(Arc::new(Channel(a))).unwrap();
        pool.serve(Arc::new(Channel(b))).unwrap();
        a_jobs.send(1).unwrap();
        until("A's job to run and A to get a waiting thread", || pool.live() == 3);
        b_jobs.send(2).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(pool.live(), 3, "at the cap, B has no waiting thread");
        released[1].store(true, Ordering::SeqCst);
        assert_eq!(done_rx.recv_timeout(Duration::from_secs(5)), Ok(1));
        b_jobs.send(20).unwrap();
        assert_eq!(done_rx.recv_timeout(Duration::from_secs(5)), Ok(20), "B's quick job ran beside its blocked one");
        released[2].store(true, Ordering::SeqCst);
        assert_eq!(done_rx.recv_timeout(Duration::from_secs(5)), Ok(2));
    }

    /// Threads beyond the resident ones end once idle, each source keeping one; a source that
    /// ends ends its threads.
    #[test]
    fn idle_threads_beyond_the_resident_ones_end() {
        let (release_tx, release_rx) = crossbeam_channel::unbounded::<()>();
        let pool = Handlers::with_limits("test-handler", 16, 2, Duration::from_millis(50), move |_: u32| {
            let _ = release_rx.recv();
        });
        let (jobs, rx) = crossbeam_channel::unbounded();
        pool.serve(Arc::new(Channel(rx))).unwrap();
        for job in 0..10 {
            jobs.send(job).unwrap();
        }
        until("ten busy threads and one waiting", || pool.live() == 11);
        drop(release_tx);
        until("idle threads end down to the resident two", || pool.live() == 2);
        drop(jobs);
        until("a source that ends ends its threads", || pool.live() == 0);
    }

    /// The threads of this process named `name`.
    fn threads_named(name: &str) -> usize {
        let tasks = std::fs::read_dir("/proc/self/task").unwrap();
        tasks.flatten().filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim_end() == name)).count()
    }

    /// A job that panics ends alone: its thread goes on serving, and the count is the threads'.
    #[test]
    fn a_panicking_job_leaves_its_thread_serving() {
        let (done_tx, done_rx) = crossbeam_channel::unbounded::<u32>();
        let pool = Handlers::with_limits("test-panicking", 4, 4, Duration::from_secs(60), move |job: u32| {
            assert!(job != 0, "job 0 panics");
            let _ = done_tx.send(job);
        });
        let (jobs, rx) = crossbeam_channel::unbounded();
        pool.serve(Arc::new(Channel(rx))).unwrap();
        jobs.send(0).unwrap();
        jobs.send(1).unwrap();
        assert_eq!(done_rx.recv_timeout(Duration::from_secs(10)), Ok(1));
        until("the count to be the threads'", || pool.live() == threads_named("test-panicking"));
        assert!(pool.live() >= 2, "the panicking job's thread is still there");
    }
}
