//! MCP sessions: the default sandbox, the destroy set, in-flight requests, and ending.
//!
//! A stdio connection is one session; each HTTP `Mcp-Session-Id` is one. Ending a session kills
//! every sandbox still in its destroy set; `start_task` takes its sandbox out of that set (see
//! docs/contract.md, "Sessions and sandbox lifetime"). A 2026-07-28 request over HTTP has no
//! session: it runs in a [`Session::stateless`] one of its own, which keeps no default sandbox
//! and no destroy set.
//!
//! A request is in flight from the moment [`Session::begin`] accepts its id until the
//! [`InFlight`] guard it returns is dropped, on whatever path: answered, refused, or unwound by a
//! panic. While in flight its id cannot be reused, `notifications/cancelled` can flag it, and the
//! session is not expired as idle.

use crate::mcp::subscription;
use crate::provider::Provider;
use serde_json::Value;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// What a session owns.
#[derive(Debug)]
struct State {
    initialized: bool,
    protocol_version: String,
    default_sandbox: Option<String>,
    /// Invariant: only sandboxes this session created, minus those retained by `start_task`
    /// and those a task start in flight holds.
    destroy: BTreeSet<String>,
    /// Sandboxes a task start in flight holds out of the destroy set: how many starts, and
    /// whether the sandbox was in the set before.
    holds: std::collections::BTreeMap<String, (usize, bool)>,
    /// Sandboxes retained for good (a task runs in them).
    kept: BTreeSet<String>,
    /// Sandboxes this session created and did not kill (list_sandboxes over HTTP).
    mine: BTreeSet<String>,
    ended: bool,
    last_active: Instant,
    /// Handles of the protocol tasks this session created, oldest first (`tasks/list`).
    tasks: Vec<String>,
}

/// One MCP session.
#[derive(Debug)]
pub struct Session {
    /// Identifier for logs (the HTTP session id, or `stdio`).
    pub id: String,
    /// Whether list_sandboxes shows every sandbox of the state root (see [`Session::seeing_state_root`]).
    sees_state_root: bool,
    /// When true (the `call` subcommand), sandboxes outlive the session.
    keep_sandboxes: bool,
    /// When true (one 2026-07-28 HTTP request), the session records no sandbox at all.
    stateless: bool,
    /// The `subscriptions/listen` streams open on this session (stdio).
    pub subscriptions: subscription::Open,
    state: Mutex<State>,
    inflight: Arc<Requests>,
}

/// The in-flight requests of one session: the serialized request id and its cancel flag.
type Requests = Mutex<HashMap<String, Arc<AtomicBool>>>;

fn lock(requests: &Requests) -> MutexGuard<'_, HashMap<String, Arc<AtomicBool>>> {
    // Every update is a single insert or remove, so a lock poisoned by a panic elsewhere still
    // guards a consistent map.
    requests.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
impl crate::queue::Client for InFlight {}

/// One request in flight, from [`Session::begin`] until this guard is dropped, which
/// unregisters its id (also when a panic unwinds past it).
#[derive(Debug)]
pub struct InFlight {
    requests: Arc<Requests>,
    /// The session's id: the client the request comes from.
    session: String,
    /// The request id, serialized (the map key).
    key: String,
    cancel: Arc<AtomicBool>,
}

impl InFlight {
    /// The client the request comes from, for limits shared between clients: its session's id
    /// (a stateless request's names its connection), the name the work queue shares workers by.
    pub fn client(&self) -> String {
        self.session.clone()
    }

    /// The flag set by `notifications/cancelled` and by the end of the session.
    pub fn flag(&self) -> &Arc<AtomicBool> {
        &self.cancel
    }

    /// Whether the request was cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut map = lock(&self.requests);
        // Only this guard's own entry: the id is never registered twice while it lives.
        if map.get(&self.key).is_some_and(|flag| Arc::ptr_eq(flag, &self.cancel)) {
            map.remove(&self.key);
        }
    }
}

impl Session {
    /// A new, uninitialized session.
    pub fn new(id: impl Into<String>, keep_sandboxes: bool) -> Session {
        Session {
            id: id.into(),
            sees_state_root: true,
            keep_sandboxes,
            stateless: false,
            subscriptions: subscription::Open::default(),
            state: Mutex::new(State {
                initialized: false,
                protocol_version: String::new(),
                default_sandbox: None,
                destroy: BTreeSet::new(),
                holds: Default::default(),
                kept: BTreeSet::new(),
                mine: BTreeSet::new(),
                ended: false,
                last_active: Instant::now(),
                tasks: Vec::new(),
            }),
            inflight: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// The scope of one 2026-07-28 request over HTTP: no default sandbox, no destroy set, so
    /// sandboxes it creates live until `kill_sandbox` or their own timeout.
    pub fn stateless(id: impl Into<String>) -> Session {
        Session { stateless: true, sees_state_root: false, ..Session::new(id, true) }
    }

    /// Whether list_sandboxes shows every sandbox of the state root (`yes`), or only this
    /// session's (an HTTP session; a stateless HTTP request without a bearer token sees none).
    pub fn seeing_state_root(mut self, yes: bool) -> Session {
        self.sees_state_root = yes;
        self
    }

    /// Whether this is the scope of a single 2026-07-28 HTTP request.
    pub fn is_stateless(&self) -> bool {
        self.stateless
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the state half-updated (every update is a
        // single assignment or set operation), so a poisoned lock is safe to keep using.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks the session initialized with the negotiated version.
    pub fn initialize(&self, version: &str) {
        let mut s = self.state();
        s.initialized = true;
        s.protocol_version = version.to_string();
    }

    /// Whether `initialize` was answered.
    pub fn is_initialized(&self) -> bool {
        self.state().initialized
    }

    /// Records activity (for idle expiry).
    pub fn touch(&self) {
        self.state().last_active = Instant::now();
    }

    /// How long the session has been idle.
    pub fn idle_for(&self) -> Duration {
        self.state().last_active.elapsed()
    }

    /// The default sandbox, if any.
    pub fn default_sandbox(&self) -> Option<String> {
        self.state().default_sandbox.clone()
    }

    /// Records a sandbox this session created: it becomes the default and joins the destroy set.
    /// Returns false when the session has already ended; the caller must then kill the sandbox.
    pub fn adopt(&self, sandbox_id: &str) -> bool {
        if self.stateless {
            return true;
        }
        let mut s = self.state();
        if s.ended && !self.keep_sandboxes {
            return false;
        }
        s.default_sandbox = Some(sandbox_id.to_string());
        s.mine.insert(sandbox_id.to_string());
        if !self.keep_sandboxes {
            s.destroy.insert(sandbox_id.to_string());
        }
        true
    }

    /// Takes a sandbox out of the destroy set (`start_task` retains its sandbox).
    pub fn retain(&self, sandbox_id: &str) {
        let mut s = self.state();
        s.destroy.remove(sandbox_id);
        s.kept.insert(sandbox_id.to_string());
    }

    /// A task start in flight: the sandbox leaves the destroy set until [`Session::settle`].
    pub fn hold(&self, sandbox_id: &str) {
        let mut s = self.state();
        let was = s.destroy.remove(sandbox_id);
        let hold = s.holds.entry(sandbox_id.to_string()).or_insert((0, false));
        hold.0 += 1;
        hold.1 |= was;
    }

    /// A task start ended: `started` retains the sandbox for good; otherwise, once no other start
    /// is in flight and no task was started in it, it rejoins the destroy set (a failed start
    /// retains nothing).
    pub fn settle(&self, sandbox_id: &str, started: bool) {
        let mut s = self.state();
        if started {
            s.kept.insert(sandbox_id.to_string());
        }
        let Some(hold) = s.holds.get_mut(sandbox_id) else { return };
        hold.0 = hold.0.saturating_sub(1);
        if hold.0 > 0 {
            return;
        }
        let was = hold.1;
        s.holds.remove(sandbox_id);
        if was && !s.ended && !s.kept.contains(sandbox_id) {
            s.destroy.insert(sandbox_id.to_string());
        }
    }

    /// The version `initialize` negotiated ("" before it).
    pub fn protocol_version(&self) -> String {
        self.state().protocol_version.clone()
    }

    /// Records a protocol task this session created (its handle), for `tasks/list`.
    pub fn record_task(&self, handle: &str) {
        self.state().tasks.push(handle.to_string());
    }

    /// Up to `n` of this session's task handles from position `from`, and whether more follow.
    pub fn tasks_page(&self, from: usize, n: usize) -> (Vec<String>, bool) {
        let s = self.state();
        let page: Vec<String> = s.tasks.iter().skip(from).take(n).cloned().collect();
        (page, s.tasks.len() > from + n)
    }

    /// Forgets a sandbox that was killed.
    pub fn forget(&self, sandbox_id: &str) {
        let mut s = self.state();
        s.destroy.remove(sandbox_id);
        s.kept.remove(sandbox_id);
        s.holds.remove(sandbox_id);
        s.mine.remove(sandbox_id);
        if s.default_sandbox.as_deref() == Some(sandbox_id) {
            s.default_sandbox = None;
        }
    }

    /// Whether the sandbox is in the destroy set.
    pub fn will_destroy(&self, sandbox_id: &str) -> bool {
        self.state().destroy.contains(sandbox_id)
    }

    /// Registers an in-flight request; `None` when a request with the same id is still in flight.
    /// The request stays registered until the returned guard is dropped.
    pub fn begin(&self, id: &Value) -> Option<InFlight> {
        let key = id.to_string();
        let mut map = lock(&self.inflight);
        if map.contains_key(&key) {
            return None;
        }
        let cancel = Arc::new(AtomicBool::new(false));
        map.insert(key.clone(), cancel.clone());
        Some(InFlight { requests: self.inflight.clone(), session: self.id.clone(), key, cancel })
    }

    /// Flags an in-flight request as cancelled (`notifications/cancelled`); unknown ids are ignored.
    pub fn cancel(&self, id: &Value) {
        if let Some(flag) = lock(&self.inflight).get(&id.to_string()) {
            flag.store(true, Ordering::Relaxed);
        }
    }

    /// Number of requests in flight (queued or running).
    pub fn inflight_count(&self) -> usize {
        lock(&self.inflight).len()
    }

    /// Ends the session: kills every sandbox in the destroy set (in parallel, within `deadline`).
    /// Safe to call more than once; later calls do nothing.
    pub fn end(&self, provider: &Arc<dyn Provider>, deadline: Instant) {
        let doomed = self.close();
        kill_all(provider, &doomed, deadline, &self.id);
    }

    /// Marks the session ended, stops its running calls and returns the sandboxes to kill (empty
    /// when it had already ended).
    fn close(&self) -> Vec<String> {
        let doomed: Vec<String> = {
            let mut s = self.state();
            if s.ended {
                return Vec::new();
            }
            s.ended = true;
            s.default_sandbox = None;
            std::mem::take(&mut s.destroy).into_iter().collect()
        };
        for flag in lock(&self.inflight).values() {
            flag.store(true, Ordering::Relaxed);
        }
        doomed
    }
}

/// Ends many sessions at once (shutdown): every doomed sandbox is killed in parallel.
pub fn kill_sessions(provider: &Arc<dyn Provider>, sessions: &[Arc<Session>], deadline: Instant) {
    let doomed: Vec<String> = sessions.iter().flat_map(|s| s.close()).collect();
    kill_all(provider, &doomed, deadline, "(all, at shutdown)");
}

/// Kills sandboxes in parallel, waiting at most until `deadline`.
pub fn kill_all(provider: &Arc<dyn Provider>, ids: &[String], deadline: Instant, session: &str) {
    if ids.is_empty() {
        return;
    }
    let (tx, rx) = crossbeam_channel::unbounded();
    for id in ids {
        let provider = provider.clone();
        let id = id.clone();
        let tx = tx.clone();
        let spawned = std::thread::Builder::new().name("sandbox-mcp-reaper".into()).spawn(move || {
            let res = provider.kill(&id, deadline);
            let _ = tx.send((id, res));
        });
        if let Err(err) = spawned {
            log::error!("session {session}: cannot start a thread to kill a sandbox: {err}");
        }
    }
    drop(tx);
    for _ in ids {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok((id, Ok(_))) => log::info!("session {session} ended: killed sandbox {id}"),
            Ok((id, Err(err))) => {
                log::warn!("session {session} ended: could not kill sandbox {id}: {err}")
            }
            Err(_) => {
                log::warn!("session {session} ended: some sandboxes were still being killed at the deadline");
                break;
            }
        }
    }
}

/// The HTTP session table.
#[derive(Default)]
pub struct Sessions {
    map: Mutex<HashMap<String, Arc<Session>>>,
}

impl Sessions {
    /// Adds a session.
    pub fn insert(&self, session: Arc<Session>) {
        self.lock().insert(session.id.clone(), session);
    }

    /// Looks a session up and marks it active.
    pub fn get(&self, id: &str) -> Option<Arc<Session>> {
        let s = self.lock().get(id).cloned();
        if let Some(s) = &s {
            s.touch();
        }
        s
    }

    /// Removes a session (the caller ends it).
    pub fn remove(&self, id: &str) -> Option<Arc<Session>> {
        self.lock().remove(id)
    }

    /// Removes and returns the sessions idle for longer than `idle` that run no request.
    pub fn take_idle(&self, idle: Duration) -> Vec<Arc<Session>> {
        let mut map = self.lock();
        let ids: Vec<String> =
            map.iter().filter(|(_, s)| s.idle_for() >= idle && s.inflight_count() == 0).map(|(k, _)| k.clone()).collect();
        ids.iter().filter_map(|id| map.remove(id)).collect()
    }

    /// Removes and returns every session (shutdown).
    pub fn take_all(&self) -> Vec<Arc<Session>> {
        self.lock().drain().map(|(_, s)| s).collect()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<Session>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl crate::tools::SandboxScope for Session {
    fn is_stateless(&self) -> bool {
        Session::is_stateless(self)
    }

    fn default_sandbox(&self) -> Option<String> {
        Session::default_sandbox(self)
    }

    fn adopt(&self, sandbox_id: &str) -> bool {
        Session::adopt(self, sandbox_id)
    }

    fn retain(&self, sandbox_id: &str) {
        Session::retain(self, sandbox_id)
    }

    fn hold(&self, sandbox_id: &str) {
        Session::hold(self, sandbox_id)
    }

    fn settle(&self, sandbox_id: &str, started: bool) {
        Session::settle(self, sandbox_id, started)
    }

    fn visible(&self) -> Option<Vec<String>> {
        if self.sees_state_root {
            return None;
        }
        Some(self.state().mine.iter().cloned().collect())
    }

    fn forget(&self, sandbox_id: &str) {
        Session::forget(self, sandbox_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn adopt_retain_forget_and_the_destroy_set() {
        let s = Session::new("t", false);
        assert!(s.adopt("a"));
        assert!(s.adopt("b"));
        assert_eq!(s.default_sandbox().as_deref(), Some("b"), "the newest sandbox is the default");
        assert!(s.will_destroy("a") && s.will_destroy("b"));
        s.retain("a");
        assert!(!s.will_destroy("a"), "a retained sandbox leaves the destroy set");
        assert!(s.will_destroy("b"));
        s.forget("b");
        assert!(!s.will_destroy("b"));
        assert_eq!(s.default_sandbox(), None, "forgetting the default sandbox clears the default");
        assert!(s.adopt("c"));
        s.forget("a");
        assert_eq!(s.default_sandbox().as_deref(), Some("c"), "forgetting another sandbox keeps the default");
        assert_eq!(s.close(), vec!["c".to_string()], "ending kills only what is left in the destroy set");
        assert_eq!(s.close(), Vec::<String>::new(), "a second end does nothing");
    }

    #[test]
    fn an_ended_session_refuses_to_adopt() {
        let s = Session::new("t", false);
        s.close();
        assert!(!s.adopt("late"), "the caller must kill a sandbox created after the end");
        assert!(!s.will_destroy("late"));
        assert_eq!(s.default_sandbox(), None);
        // With keep_sandboxes (the `call` subcommand) nothing is ever destroyed, ended or not.
        let keep = Session::new("call", true);
        assert!(keep.adopt("x"));
        assert!(!keep.will_destroy("x"));
        keep.close();
        assert!(keep.adopt("y"));
        assert_eq!(keep.default_sandbox().as_deref(), Some("y"));
    }

    #[test]
    fn a_stateless_session_keeps_no_sandbox() {
        let s = Session::stateless("http-2026");
        assert!(s.is_stateless());
        assert!(s.adopt("a"), "creating works, the sandbox is just not recorded");
        assert_eq!(s.default_sandbox(), None);
        assert!(!s.will_destroy("a"));
        assert!(s.close().is_empty(), "ending it kills nothing");
        assert!(!Session::new("t", false).is_stateless());
    }

    #[test]
    fn begin_refuses_a_duplicate_until_the_guard_drops() {
        let s = Session::new("t", false);
        let guard = s.begin(&json!(1)).expect("a new id is accepted");
        assert_eq!(s.inflight_count(), 1);
        assert!(s.begin(&json!(1)).is_none(), "the same id while in flight is refused");
        let other = s.begin(&json!("1")).expect("the string \"1\" is another id than the number 1");
        assert_eq!(s.inflight_count(), 2);
        drop(guard);
        assert_eq!(s.inflight_count(), 1);
        let again = s.begin(&json!(1)).expect("the id is free once its guard dropped");
        drop((again, other));
        assert_eq!(s.inflight_count(), 0);
    }

    #[test]
    fn cancel_flags_only_the_named_request_and_ending_flags_all() {
        let s = Session::new("t", false);
        let a = s.begin(&json!("a")).unwrap();
        let b = s.begin(&json!("b")).unwrap();
        s.cancel(&json!("a"));
        s.cancel(&json!("unknown"));
        assert!(a.is_cancelled());
        assert!(!b.is_cancelled());
        assert!(a.flag().load(Ordering::Relaxed), "the flag handed to tools is the same flag");
        s.close();
        assert!(b.is_cancelled(), "ending the session stops its running calls");
    }

    #[test]
    fn a_guard_dropped_during_a_panic_unregisters_its_id() {
        let s = Arc::new(Session::new("t", false));
        let guard = s.begin(&json!(7)).unwrap();
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let _held = guard;
            panic!("a tool panicked");
        }));
        assert!(unwound.is_err());
        assert_eq!(s.inflight_count(), 0);
        assert!(s.begin(&json!(7)).is_some());
    }

    #[test]
    fn take_idle_skips_sessions_with_requests_in_flight() {
        let sessions = Sessions::default();
        let busy = Arc::new(Session::new("busy", false));
        let idle = Arc::new(Session::new("idle", false));
        sessions.insert(busy.clone());
        sessions.insert(idle.clone());
        let guard = busy.begin(&json!(1)).unwrap();
        let taken = sessions.take_idle(Duration::ZERO);
        assert_eq!(taken.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), ["idle"]);
        assert!(sessions.get("idle").is_none(), "a taken session leaves the table");
        assert!(sessions.take_idle(Duration::from_secs(3600)).is_empty(), "a session used just now is not idle");
        drop(guard);
        let taken = sessions.take_idle(Duration::ZERO);
        assert_eq!(taken.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), ["busy"]);
        assert!(sessions.take_all().is_empty());
    }

    /// A worker's panic drops the job's in-flight guard before the answer goes out.
    #[test]
    fn a_panicking_job_unregisters_its_request_before_the_answer() {
        let session = Arc::new(Session::new("t", false));
        let sharing = crate::queue::Sharing::for_workers(1, 4);
        let (tx, handles) = crate::queue::spawn_workers(sharing, 4, |_guard: InFlight| -> crate::queue::Outcome { panic!("boom") });
        let (rtx, rrx) = crossbeam_channel::unbounded::<crate::queue::Outcome>();
        let guard = session.begin(&json!("p")).unwrap();
        tx.send(crate::queue::Job { id: json!("p"), work: guard, reply: rtx }).unwrap();
        let answer = rrx.recv().unwrap();
        assert!(matches!(&answer, crate::queue::Outcome::Answer(v) if v["error"]["code"] == -32603), "{answer:?}");
        assert_eq!(session.inflight_count(), 0, "the guard was dropped while the panic unwound");
        assert!(session.begin(&json!("p")).is_some(), "the id is free again");
        drop(tx);
        for h in handles {
            h.join().unwrap();
        }
    }
}
