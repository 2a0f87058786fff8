//! The threads that handle HTTP requests: as many as requests are being handled, up to a cap.
//!
//! A request is handled on one thread from its body's first byte to its answer's last, and that
//! thread can wait a long time on its client (a body sent slowly, an answer the client does not
//! read; tiny_http offers no per-connection timeout) or on the work (a long call, a wait, a
//! `subscriptions/listen` stream). A fixed set of such threads would let a client that opens
//! enough slow connections stall every other client. Here a request goes to a thread waiting for
//! one, else to a new thread, so one client's slow connections cost threads but never delay
//! another client's requests, up to the pool's cap of threads at once (the server's: a thread for
//! every call it admits, plus [`crate::limits::HTTP_SPARE_HANDLERS`]); beyond it a request waits
//! for a thread to come free.
//!
//! The hand-over cannot leave a request queued behind a busy thread while another is idle (the
//! race of tiny_http's own pool): it goes through a channel of capacity zero, which hands a
//! request only to a thread waiting in `recv` at that moment, and otherwise fails at once.
//! Beyond [`RESIDENT`], a thread left idle for [`IDLE`] ends.

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TrySendError};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Idle handler threads kept.
pub const RESIDENT: usize = 8;

/// How long a handler thread beyond [`RESIDENT`] stays idle before it ends.
pub const IDLE: Duration = Duration::from_secs(10);

/// Each handler thread's stack.
const STACK: usize = 256 * 1024;

/// The pool of handler threads for jobs of type `T`, each handled by `handle`.
pub struct Handlers<T: Send + 'static> {
    handoff: Sender<T>,
    waiting: Receiver<T>,
    handle: Arc<dyn Fn(T) + Send + Sync>,
    /// Handler threads alive now.
    live: Arc<AtomicUsize>,
    max: usize,
    resident: usize,
    idle: Duration,
    name: &'static str,
}

impl<T: Send + 'static> Handlers<T> {
    /// A pool of at most `max` threads named `name` that run `handle` on each job given to
    /// [`Handlers::dispatch`].
    pub fn new(name: &'static str, max: usize, handle: impl Fn(T) + Send + Sync + 'static) -> Handlers<T> {
        Handlers::with_limits(name, max, RESIDENT, IDLE, handle)
    }

    fn with_limits(
        name: &'static str,
        max: usize,
        resident: usize,
        idle: Duration,
        handle: impl Fn(T) + Send + Sync + 'static,
    ) -> Handlers<T> {
        let (handoff, waiting) = crossbeam_channel::bounded(0);
        Handlers { handoff, waiting, handle: Arc::new(handle), live: Arc::new(AtomicUsize::new(0)), max, resident, idle, name }
    }

    /// Hands `job` to an idle thread, else to a new one; with `max` threads busy, waits until one
    /// takes it. Dropping the pool ends its idle threads; busy ones end after their job.
    pub fn dispatch(&self, job: T) {
        let job = match self.handoff.try_send(job) {
            Ok(()) => return,
            Err(TrySendError::Full(job) | TrySendError::Disconnected(job)) => job,
        };
        let claimed = self.live.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < self.max).then_some(n + 1));
        if claimed.is_err() {
            // Every thread is busy: the job waits for the first to come free.
            let _ = self.handoff.send(job);
            return;
        }
        let (waiting, handle, live) = (self.waiting.clone(), self.handle.clone(), self.live.clone());
        let (resident, idle) = (self.resident, self.idle);
        let spawned = std::thread::Builder::new().name(self.name.into()).stack_size(STACK).spawn(move || {
            // A panicking job ends alone: the thread and its count stay.
            let run = |job: T| {
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handle(job))).is_err() {
                    log::error!("a handler of {} panicked; the thread goes on", std::thread::current().name().unwrap_or("a pool"));
                }
            };
            run(job);
            loop {
                match waiting.recv_timeout(idle) {
                    Ok(job) => run(job),
                    Err(RecvTimeoutError::Timeout) => {
                        if live.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n > resident).then(|| n - 1)).is_ok() {
                            return;
                        }
                    }
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            }
            live.fetch_sub(1, Ordering::SeqCst);
        });
        if let Err(err) = spawned {
            // The job went with the closure: its request is dropped, which answers it 500.
            self.live.fetch_sub(1, Ordering::SeqCst);
            log::error!("could not start an HTTP handler thread ({err}); the request was answered 500");
        }
    }

    /// Hands `job` to an idle thread only; `false` (and the job dropped) when none waits.
    #[cfg(test)]
    fn dispatch_idle(&self, job: T) -> bool {
        self.handoff.try_send(job).is_ok()
    }

    /// Handler threads alive now.
    pub fn live(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn until(what: &str, mut f: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Jobs that block their thread do not delay the next job: each gets a thread of its own.
    #[test]
    fn a_blocked_job_never_delays_the_next() {
        let (release_tx, release_rx) = crossbeam_channel::unbounded::<()>();
        let (done_tx, done_rx) = crossbeam_channel::unbounded::<u32>();
        let pool = Handlers::with_limits("test-handler", 64, 2, Duration::from_secs(60), move |job: u32| {
            if job < 40 {
                let _ = release_rx.recv();
            }
            let _ = done_tx.send(job);
        });
        for job in 0..40 {
            pool.dispatch(job);
        }
        pool.dispatch(99);
        assert_eq!(done_rx.recv_timeout(Duration::from_secs(10)), Ok(99), "the quick job was answered while 40 others block");
        assert_eq!(pool.live(), 41);
        drop(release_tx);
        for _ in 0..40 {
            assert!(done_rx.recv_timeout(Duration::from_secs(10)).is_ok());
        }
        // Idle threads are reused rather than added.
        let before = pool.live();
        for job in 100..140 {
            pool.dispatch(job);
            assert_eq!(done_rx.recv_timeout(Duration::from_secs(10)), Ok(job));
        }
        assert!(pool.live() <= before, "{} threads after {before}", pool.live());
    }

    /// At the cap a job waits for a thread to come free, and then runs.
    #[test]
    fn at_the_cap_a_job_waits_for_a_free_thread() {
        let (release_tx, release_rx) = crossbeam_channel::unbounded::<()>();
        let (done_tx, done_rx) = crossbeam_channel::unbounded::<u32>();
        let pool = Arc::new(Handlers::with_limits("test-handler", 3, 1, Duration::from_secs(60), move |job: u32| {
            if job < 3 {
                let _ = release_rx.recv();
            }
            let _ = done_tx.send(job);
        }));
        for job in 0..3 {
            pool.dispatch(job);
        }
        let p = pool.clone();
        let fourth = std::thread::spawn(move || p.dispatch(3));
        assert!(done_rx.recv_timeout(Duration::from_millis(200)).is_err(), "nothing ran past the cap");
        assert_eq!(pool.live(), 3);
        release_tx.send(()).unwrap();
        let mut done: Vec<u32> = (0..2).map(|_| done_rx.recv_timeout(Duration::from_secs(10)).unwrap()).collect();
        done.sort_unstable();
        assert!(done.contains(&3), "the waiting job ran on the freed thread: {done:?}");
        fourth.join().unwrap();
        drop(release_tx);
    }

    /// A job that panics ends alone: its thread serves the next job and is still counted.
    #[test]
    fn a_panicking_job_leaves_its_thread_serving() {
        let (done_tx, done_rx) = crossbeam_channel::unbounded::<u32>();
        let pool = Handlers::with_limits("test-handler", 4, 4, Duration::from_secs(60), move |job: u32| {
            assert!(job != 0, "job 0 panics");
            let _ = done_tx.send(job);
        });
        pool.dispatch(0);
        until("the panicking job's thread to wait for the next", || pool.live() == 1 && pool.dispatch_idle(1));
        assert_eq!(done_rx.recv_timeout(Duration::from_secs(10)), Ok(1));
        assert_eq!(pool.live(), 1, "the same thread took the next job");
    }

    /// Threads beyond the resident ones end once idle; dropping the pool ends the rest.
    #[test]
    fn idle_threads_beyond_the_resident_ones_end() {
        let (release_tx, release_rx) = crossbeam_channel::unbounded::<()>();
        let pool = Handlers::with_limits("test-handler", 16, 2, Duration::from_millis(50), move |_: u32| {
            let _ = release_rx.recv();
        });
        for job in 0..10 {
            pool.dispatch(job);
        }
        assert_eq!(pool.live(), 10);
        drop(release_tx);
        until("idle threads end down to the resident two", || pool.live() == 2);
        let live = pool.live.clone();
        drop(pool);
        until("dropping the pool ends the resident threads", || live.load(Ordering::SeqCst) == 0);
    }
}
