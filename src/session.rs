//! MCP sessions (SPEC §4): the default sandbox, the destroy set, in-flight requests, and ending.
//!
//! A stdio connection is one session; each HTTP `Mcp-Session-Id` is one. Ending a session kills
//! every sandbox still in its destroy set; `start_task` takes its sandbox out of that set.

use crate::provider::Provider;
use serde_json::Value;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// What a session owns.
#[derive(Debug)]
struct State {
    initialized: bool,
    protocol_version: String,
    default_sandbox: Option<String>,
    /// Invariant: only sandboxes this session created, minus those retained by `start_task`.
    destroy: BTreeSet<String>,
    ended: bool,
    last_active: Instant,
}

/// One MCP session.
#[derive(Debug)]
pub struct Session {
    /// Identifier for logs (the HTTP session id, or `stdio`).
    pub id: String,
    /// When true (the `call` subcommand), sandboxes outlive the session.
    keep_sandboxes: bool,
    state: Mutex<State>,
    inflight: Mutex<HashMap<String, Arc<AtomicBool>>>,
}

impl Session {
    /// A new, uninitialized session.
    pub fn new(id: impl Into<String>, keep_sandboxes: bool) -> Session {
        Session {
            id: id.into(),
            keep_sandboxes,
            state: Mutex::new(State {
                initialized: false,
                protocol_version: String::new(),
                default_sandbox: None,
                destroy: BTreeSet::new(),
                ended: false,
                last_active: Instant::now(),
            }),
            inflight: Mutex::new(HashMap::new()),
        }
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
        let mut s = self.state();
        if s.ended && !self.keep_sandboxes {
            return false;
        }
        s.default_sandbox = Some(sandbox_id.to_string());
        if !self.keep_sandboxes {
            s.destroy.insert(sandbox_id.to_string());
        }
        true
    }

    /// Takes a sandbox out of the destroy set (SPEC §4: `start_task` retains its sandbox).
    pub fn retain(&self, sandbox_id: &str) {
        self.state().destroy.remove(sandbox_id);
    }

    /// Forgets a sandbox that was killed.
    pub fn forget(&self, sandbox_id: &str) {
        let mut s = self.state();
        s.destroy.remove(sandbox_id);
        if s.default_sandbox.as_deref() == Some(sandbox_id) {
            s.default_sandbox = None;
        }
    }

    /// Whether the sandbox is in the destroy set.
    pub fn will_destroy(&self, sandbox_id: &str) -> bool {
        self.state().destroy.contains(sandbox_id)
    }

    /// Registers an in-flight request; `None` when a request with the same id is still running.
    pub fn begin(&self, id: &Value) -> Option<Arc<AtomicBool>> {
        let key = id.to_string();
        let mut map = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
        if map.contains_key(&key) {
            return None;
        }
        let flag = Arc::new(AtomicBool::new(false));
        map.insert(key, flag.clone());
        Some(flag)
    }

    /// Unregisters a finished request.
    pub fn finish(&self, id: &Value) {
        self.inflight.lock().unwrap_or_else(|p| p.into_inner()).remove(&id.to_string());
    }

    /// Flags an in-flight request as cancelled (`notifications/cancelled`).
    pub fn cancel(&self, id: &Value) {
        if let Some(flag) = self.inflight.lock().unwrap_or_else(|p| p.into_inner()).get(&id.to_string()) {
            flag.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Number of requests still running.
    pub fn inflight_count(&self) -> usize {
        self.inflight.lock().unwrap_or_else(|p| p.into_inner()).len()
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
        for flag in self.inflight.lock().unwrap_or_else(|p| p.into_inner()).values() {
            flag.store(true, std::sync::atomic::Ordering::Relaxed);
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
