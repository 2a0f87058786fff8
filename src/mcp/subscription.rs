//! `subscriptions/listen` (MCP 2026-07-28): the notification filter a client asks for, the part
//! of it this server honours, the acknowledgement that opens a subscription, the result that
//! closes it, the subscriptions open on a stdio connection, and the [`TaskWatch`] that pushes
//! `notifications/tasks` for the task ids a subscription named.
//!
//! The server has tools only, and its tool list never changes: it honours `toolsListChanged`
//! (a stream that stays quiet) and leaves out the prompt and resource kinds, which it does not
//! have. `taskIds` (the tasks extension) is honoured for a request that declared the extension:
//! each named task's status is pushed once when the subscription starts following it and once
//! more when it ends. Every message of a subscription carries its id (the
//! `subscriptions/listen` request id) in `_meta`.

use crate::answer_budget::{self, Charge};
use crate::app::App;
use crate::jsonrpc::{code, RpcError};
use crate::limits::{self, MAX_SUBSCRIBED_TASKS, MAX_WAITING_CALLS};
use crate::mcp::envelope::{self, SUBSCRIPTION_ID_KEY};
use crate::mcp::tasks::{self, Handle, Room, Unfinished};
use crate::queue::{Outcome, Response};
use crate::supervisor::Snapshot;
use crate::waiter::{Waiter, Watch};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The notification kinds a client may ask for, and whether this server honours them
/// (`taskIds` is read on its own: it is a list, and honoured per request).
const KINDS: &[(&str, bool)] =
    &[("toolsListChanged", true), ("promptsListChanged", false), ("resourcesListChanged", false), ("resourceSubscriptions", false)];

/// A `subscriptions/listen` filter, read.
#[derive(Debug, Clone, PartialEq)]
pub struct Filter {
    honoured: Map<String, Value>,
    /// The `taskIds` asked for (each once, in the order given); `None` when the filter has none.
    pub task_ids: Option<Vec<String>>,
}

/// Reads the request's `notifications` filter: an object of known kinds (booleans, a list of
/// strings for `resourceSubscriptions`, at most [`MAX_SUBSCRIBED_TASKS`] strings for `taskIds`);
/// unknown kinds are ignored.
pub fn read(params: Option<&Value>) -> Result<Filter, RpcError> {
    let invalid = |m: &str| RpcError::new(code::INVALID_PARAMS, format!("subscriptions/listen: {m}"));
    let Some(Value::Object(filter)) = params.and_then(|p| p.get("notifications")) else {
        return Err(invalid("params.notifications must be an object such as {\"toolsListChanged\": true}"));
    };
    let mut honoured = Map::new();
    for (kind, supported) in KINDS {
        let Some(value) = filter.get(*kind) else { continue };
        let well_typed = if *kind == "resourceSubscriptions" {
            value.as_array().is_some_and(|uris| uris.iter().all(Value::is_string))
        } else {
            value.is_boolean()
        };
        if !well_typed {
            let wants = if *kind == "resourceSubscriptions" { "a list of URI strings" } else { "a boolean" };
            return Err(invalid(&format!("notifications.{kind} must be {wants}")));
        }
        if *supported && value == &Value::Bool(true) {
            honoured.insert(kind.to_string(), Value::Bool(true));
        }
    }
    let task_ids = match filter.get("taskIds") {
        None => None,
        Some(Value::Array(ids)) => {
            let mut unique: Vec<String> = Vec::new();
            for id in ids {
                let Value::String(id) = id else {
                    return Err(invalid("notifications.taskIds must be a list of taskId strings, as tools/call returned them"));
                };
                if !unique.contains(id) {
                    unique.push(id.clone());
                }
            }
            if unique.len() > MAX_SUBSCRIBED_TASKS {
                return Err(invalid(&format!(
                    "notifications.taskIds names {} tasks; one subscription follows at most {MAX_SUBSCRIBED_TASKS}: split them over several subscriptions",
                    unique.len()
                )));
            }
            Some(unique)
        }
        Some(_) => return Err(invalid("notifications.taskIds must be a list of taskId strings, as tools/call returned them")),
    };
    Ok(Filter { honoured, task_ids })
}

impl Filter {
    /// The `notifications/subscriptions/acknowledged` message opening subscription `id`: the
    /// kinds honoured, and `taskIds` as asked when the filter had it.
    pub fn acknowledgement(&self, id: &Value) -> Value {
        let mut notifications = self.honoured.clone();
        if let Some(ids) = &self.task_ids {
            notifications.insert("taskIds".into(), json!(ids));
        }
        json!({
            "jsonrpc": "2.0",
            "method": "notifications/subscriptions/acknowledged",
            "params": {"_meta": {SUBSCRIPTION_ID_KEY: id}, "notifications": notifications},
        })
    }
}

/// The response that ends subscription `id` gracefully (the server is shutting down).
pub fn closing(id: &Value) -> Value {
    let mut result = json!({"_meta": {SUBSCRIPTION_ID_KEY: id}});
    envelope::complete(&mut result);
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// The `notifications/tasks` message of subscription `id` for `task` (what `tasks/get` would
/// answer, without `resultType`).
pub fn task_notification(id: &Value, task: Value) -> Value {
    let mut params = match task {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    params.remove("resultType");
    params.insert("_meta".into(), json!({SUBSCRIPTION_ID_KEY: id}));
    json!({"jsonrpc": "2.0", "method": "notifications/tasks", "params": params})
}

/// The subscriptions open on one stdio connection, by serialized request id, each with the flag
/// that tells its [`TaskWatch`] it is still open.
#[derive(Debug, Default)]
pub struct Open {
    ids: Mutex<BTreeMap<String, (Value, Arc<AtomicBool>)>>,
}

impl Open {
    /// Records an open subscription and returns its open flag; `None` when one with the same
    /// id is already open.
    pub fn open(&self, id: &Value) -> Option<Arc<AtomicBool>> {
        let mut ids = self.ids.lock().unwrap_or_else(|p| p.into_inner());
        let key = id.to_string();
        if ids.contains_key(&key) {
            return None;
        }
        let flag = Arc::new(AtomicBool::new(true));
        ids.insert(key, (id.clone(), flag.clone()));
        Some(flag)
    }

    /// Ends a subscription the client cancelled; nothing more is sent for it.
    pub fn cancel(&self, id: &Value) {
        if let Some((_, flag)) = self.ids.lock().unwrap_or_else(|p| p.into_inner()).remove(&id.to_string()) {
            flag.store(false, Ordering::SeqCst);
        }
    }

    /// Removes and returns every open subscription (shutdown closes them).
    pub fn take_all(&self) -> Vec<Value> {
        let all = std::mem::take(&mut *self.ids.lock().unwrap_or_else(|p| p.into_inner()));
        all.into_values()
            .map(|(id, flag)| {
                flag.store(false, Ordering::SeqCst);
                id
            })
            .collect()
    }
}

/// Where a subscription's notifications go: `send` hands one serialized message to the
/// transport with its share of the answer budget, to be given back once written (false once the
/// subscriber is gone), `open` is cleared when the subscription ends.
pub struct Sink {
    send: Box<dyn Fn(String, Charge) -> bool + Send>,
    open: Arc<AtomicBool>,
}

impl Sink {
    /// A sink sending through `send` while `open` is set.
    pub fn new(send: impl Fn(String, Charge) -> bool + Send + 'static, open: Arc<AtomicBool>) -> Sink {
        Sink { send: Box::new(send), open }
    }

    fn is_open(&self) -> bool {
        self.open.load(Ordering::SeqCst)
    }
}

/// One task a subscription follows, and the status last pushed for it.
struct Followed {
    handle: Handle,
    sent: Option<&'static str>,
    /// Its notification's wait for room in the answer budget, once it found none.
    refused: Option<Refusal>,
}

/// A notification that found no room in the answer budget: the room it needed, and how long it
/// has waited, counted as a waiting call's wait is (`answer_budget::Budget::take`): from the
/// last time room was given back (or an answer was being made), and in all. Both are paused
/// while the subscription's own stream still holds room: it has yet to write an earlier
/// notification, its client is behind, and it gives room back as it reads.
#[derive(Debug, Clone, Copy)]
struct Refusal {
    needed: usize,
    /// When it is made again anyway (it reads the task's whole logs again).
    retry: answer_budget::Backoff,
    since: Instant,
    first: Instant,
    /// When the clocks were last brought up to date.
    looked: Instant,
    /// How many times room had been given back then.
    gives: u64,
}

impl Refusal {
    fn new(client: &str, needed: usize) -> Refusal {
        let now = Instant::now();
        let gives = answer_budget::look(client, needed).gives;
        Refusal { needed, retry: answer_budget::Backoff::default(), since: now, first: now, looked: now, gives }
    }

    /// It was refused (again), needing `needed` bytes: the next try waits.
    fn refused(&mut self, needed: usize) {
        self.needed = needed;
        self.retry.refused();
    }

    /// Brings the clocks up to date for `client`'s notification; whether it would find room now.
    fn look(&mut self, client: &str) -> bool {
        let now = Instant::now();
        let budget = answer_budget::look(client, self.needed);
        if budget.mine > 0 {
            // Paused, not restarted: a subscriber that keeps its stream busy still meets the cap.
            self.first += now.saturating_duration_since(self.looked);
            self.since = now;
        } else if budget.gives != self.gives || budget.making {
            self.since = now;
        }
        (self.gives, self.looked) = (budget.gives, now);
        budget.fits
    }

    /// Whether it has waited long enough to go cut to what needs no room.
    fn over(&self) -> bool {
        self.since.elapsed() >= limits::ANSWER_WAIT || self.first.elapsed() >= limits::ANSWER_WAIT_MOST
    }
}

/// Follows the tasks a subscription named, parked with the waiter like a waiting call (same
/// cadence: every `provider::poll_interval`, one state read per task still working). Pushes a
/// task's status when first read and whenever it changes; a task that ended, or that does not
/// exist (deleted, its sandbox gone: never a made-up status), is no longer followed. The watch
/// leaves the waiter when no task is left, the subscription ends, or the server shuts down; the
/// subscription itself stays open until the client or the shutdown ends it.
///
/// A completed task's result is inline, and takes its share of the answer budget. A push that
/// finds no room is tried again when the room it needs is there (a cheap look at every check),
/// or on its backoff. Once it has waited as long as a waiting call would ([`Refusal`]), and for
/// every task whose end is still unpushed when the watch ends, the result goes with its output
/// cut to what needs no room: the status is pushed once, and a stream whose client never gets
/// it would wait for nothing (`tasks/get` reads it whole). A subscriber that is only behind in
/// reading its own stream is not cut: its notifications wait for it.
pub struct TaskWatch {
    app: Arc<App>,
    id: Value,
    tasks: Vec<Followed>,
    sink: Sink,
    /// Whose share of the answer budget its notifications take: this watch's own.
    client: String,
    until: Instant,
    every: Duration,
}

impl TaskWatch {
    /// A watch for subscription `id` over `tasks`, pushing into `sink`.
    pub fn new(app: Arc<App>, id: Value, tasks: Vec<Handle>, sink: Sink) -> TaskWatch {
        let every = crate::provider::poll_interval(app.provider.as_ref());
        let tasks = tasks.into_iter().map(|handle| Followed { handle, sent: None, refused: None }).collect();
        // No task runs longer than the longest task timeout, so following ends by then.
        // A share of its own: two clients' subscriptions may have the same request id.
        static WATCHES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let client = format!("subscription {}", WATCHES.fetch_add(1, Ordering::Relaxed));
        TaskWatch { app, id, tasks, sink, client, until: Instant::now() + tasks::RESULT_WAIT, every }
    }

    /// The tasks still followed.
    pub fn following(&self) -> usize {
        self.tasks.len()
    }
}

/// What a finished [`TaskWatch`] answers: nothing is written for it.
fn over() -> Outcome {
    Outcome::Cancelled(Value::Null.into())
}

impl Watch for TaskWatch {
    fn check(&mut self) -> Option<Outcome> {
        let mut i = 0;
        while i < self.tasks.len() {
            if !self.sink.is_open() || self.app.is_draining() {
                return Some(over());
            }
            let task = &mut self.tasks[i];
            let (due, fits, waited) = match &mut task.refused {
                Some(refusal) => (refusal.retry.due(), refusal.look(&self.client), refusal.over()),
                None => (true, false, false),
            };
            if !due && !fits && !waited {
                i += 1;
                continue;
            }
            let state = match tasks::state(&self.app, &task.handle) {
                Ok(s) => s,
                Err(err) if err.code == code::INVALID_PARAMS => {
                    log::debug!("subscription {} stops following {}: {}", self.id, task.handle.encode(), err.message);
                    self.tasks.swap_remove(i);
                    continue;
                }
                // Cannot read it now (a remote hiccup): try again at the next check.
                Err(err) => {
                    log::debug!("subscription {}: {} could not be read: {}", self.id, task.handle.encode(), err.message);
                    i += 1;
                    continue;
                }
            };
            let status = tasks::status(&state).0;
            if task.sent != Some(status) {
                // On the waiter's thread there is no wait for room.
                let room = if waited { Room::OrCut } else { Room::Wait(Duration::ZERO) };
                match push(&self.app, &self.client, &self.id, &self.sink, task, &state, room) {
                    Pushed::Sent => task.sent = Some(status),
                    Pushed::Closed => return Some(over()),
                    Pushed::Refused(needed) => {
                        task.refused.get_or_insert_with(|| Refusal::new(&self.client, needed)).refused(needed);
                        i += 1;
                        continue;
                    }
                    Pushed::Unread => {
                        i += 1;
                        continue;
                    }
                }
            }
            // Any status but working is terminal for the protocol (as tasks/get reports it).
            if status != "working" {
                self.tasks.swap_remove(i);
                continue;
            }
            i += 1;
        }
        self.tasks.is_empty().then(over)
    }

    /// The watch's time is over: the end of each task it still follows, when that end was not
    /// pushed yet (its result refused for room, or its read failed), is pushed now, cut to fit.
    fn give_up(self: Box<Self>) -> Outcome {
        for task in &self.tasks {
            if !self.sink.is_open() || self.app.is_draining() {
                break;
            }
            let Ok(state) = tasks::state(&self.app, &task.handle) else { continue };
            let status = tasks::status(&state).0;
            if status != "working"
                && task.sent != Some(status)
                && matches!(push(&self.app, &self.client, &self.id, &self.sink, task, &state, Room::OrCut), Pushed::Closed)
            {
                break;
            }
        }
        over()
    }

    fn until(&self) -> Instant {
        self.until
    }

    fn every(&self) -> Duration {
        self.every
    }

    /// Each sandbox it follows tasks in: a sandbox whose reads stall holds one checker for all
    /// the calls and subscriptions that read it, not one per subscription.
    fn keys(&self) -> Vec<String> {
        let mut sandboxes: Vec<String> = self.tasks.iter().map(|t| t.handle.sandbox_id.clone()).collect();
        sandboxes.sort_unstable();
        sandboxes.dedup();
        sandboxes
    }
}

/// What became of one task's notification.
enum Pushed {
    Sent,
    /// The subscriber is gone.
    Closed,
    /// Its result found no room in the answer budget (it needed this many bytes).
    Refused(usize),
    /// Its result could not be read now.
    Unread,
}

/// Pushes `task`'s status as `state` shows it into `sink` (subscription `id`), a completed
/// task's result inline, taking `client`'s share of the answer budget as `room` says.
fn push(app: &App, client: &str, id: &Value, sink: &Sink, task: &Followed, state: &Snapshot, room: Room) -> Pushed {
    match tasks::detailed_2026(app, client, &task.handle, state, room) {
        Ok((detailed, charge)) => {
            // The charge is held until the stream has written the notification.
            let (line, charge) = Response::charged(task_notification(id, detailed), charge).serialize();
            if (sink.send)(line, charge) {
                Pushed::Sent
            } else {
                Pushed::Closed
            }
        }
        Err(Unfinished::NoRoom(full)) => Pushed::Refused(full.needed),
        Err(Unfinished::Error(err)) => {
            log::debug!("subscription {id}: {} could not be read: {}", task.handle.encode(), err.message);
            Pushed::Unread
        }
    }
}

/// Parks a [`TaskWatch`] for subscription `id` with the waiter. When [`MAX_WAITING_CALLS`]
/// already wait, the error to end the subscription with (its tasks cannot be followed).
pub fn follow(app: &Arc<App>, waiter: &Waiter, id: &Value, tasks: Vec<Handle>, sink: Sink) -> Result<(), RpcError> {
    let watch = TaskWatch::new(app.clone(), id.clone(), tasks, sink);
    waiter.park(Box::new(watch), Box::new(|_| {})).map_err(|_| {
        RpcError::new(
            code::SERVER_BUSY,
            format!(
                "server busy: {MAX_WAITING_CALLS} calls are already waiting, so this subscription cannot follow its tasks; \
subscribe again in a few seconds, or poll tasks/get"
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_acknowledgement_keeps_only_honoured_kinds() {
        let params = json!({"notifications": {"toolsListChanged": true, "promptsListChanged": true, "resourceSubscriptions": ["file:///x"], "future": 1}});
        let ack = read(Some(&params)).unwrap().acknowledgement(&json!(7));
        assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
        assert_eq!(ack["params"]["_meta"][SUBSCRIPTION_ID_KEY], 7);
        assert_eq!(ack["params"]["notifications"], json!({"toolsListChanged": true}));
        let quiet = read(Some(&json!({"notifications": {"toolsListChanged": false}}))).unwrap().acknowledgement(&json!("s"));
        assert_eq!(quiet["params"]["notifications"], json!({}));
        assert_eq!(quiet["params"]["_meta"][SUBSCRIPTION_ID_KEY], "s");
        assert!(ack.get("id").is_none(), "a notification has no id");
    }

    #[test]
    fn task_ids_are_read_once_each_and_acknowledged() {
        let params = json!({"notifications": {"taskIds": ["a", "b", "a"], "toolsListChanged": true}});
        let filter = read(Some(&params)).unwrap();
        assert_eq!(filter.task_ids, Some(vec!["a".to_string(), "b".to_string()]));
        let ack = filter.acknowledgement(&json!(1));
        assert_eq!(ack["params"]["notifications"], json!({"toolsListChanged": true, "taskIds": ["a", "b"]}));
        let none = read(Some(&json!({"notifications": {}}))).unwrap();
        assert_eq!(none.task_ids, None);
        assert!(none.acknowledgement(&json!(1))["params"]["notifications"].get("taskIds").is_none());
        let empty = read(Some(&json!({"notifications": {"taskIds": []}}))).unwrap();
        assert_eq!(empty.acknowledgement(&json!(1))["params"]["notifications"]["taskIds"], json!([]));
    }

    #[test]
    fn a_malformed_filter_is_invalid_params() {
        let too_many: Vec<String> = (0..=MAX_SUBSCRIBED_TASKS).map(|i| format!("t{i}")).collect();
        for params in [
            None,
            Some(json!({})),
            Some(json!({"notifications": []})),
            Some(json!({"notifications": {"toolsListChanged": "yes"}})),
            Some(json!({"notifications": {"resourceSubscriptions": [1]}})),
            Some(json!({"notifications": {"taskIds": "x"}})),
            Some(json!({"notifications": {"taskIds": [1]}})),
            Some(json!({"notifications": {"taskIds": too_many}})),
        ] {
            assert_eq!(read(params.as_ref()).unwrap_err().code, code::INVALID_PARAMS, "{params:?}");
        }
    }

    #[test]
    fn a_task_notification_is_the_task_with_the_subscription_id() {
        let task = json!({"resultType": "complete", "taskId": "t", "status": "completed", "result": {"isError": false}});
        let n = task_notification(&json!("sub"), task);
        assert_eq!(n["method"], "notifications/tasks");
        assert!(n.get("id").is_none());
        assert_eq!(n["params"]["taskId"], "t");
        assert_eq!(n["params"]["result"], json!({"isError": false}));
        assert!(n["params"].get("resultType").is_none(), "a notification is not a result");
        assert_eq!(n["params"]["_meta"][SUBSCRIPTION_ID_KEY], "sub");
    }

    #[test]
    fn open_subscriptions_are_cancelled_or_taken_at_shutdown() {
        let open = Open::default();
        let one = open.open(&json!(1)).unwrap();
        assert!(open.open(&json!(1)).is_none(), "one subscription per id");
        let other = open.open(&json!("1")).unwrap();
        open.cancel(&json!(1));
        assert!(!one.load(Ordering::SeqCst), "a cancelled subscription is closed");
        assert!(other.load(Ordering::SeqCst));
        assert_eq!(open.take_all(), vec![json!("1")]);
        assert!(!other.load(Ordering::SeqCst), "shutdown closes it");
        assert!(open.take_all().is_empty());
        let closing = closing(&json!(4));
        assert_eq!((closing["id"].as_i64(), closing["result"]["resultType"].as_str()), (Some(4), Some("complete")));
        assert_eq!(closing["result"]["_meta"][SUBSCRIPTION_ID_KEY], 4);
    }

    #[test]
    fn a_task_watch_ends_when_its_subscription_does_or_no_task_is_left() {
        let t = crate::app::testing::test_app("subscription");
        let app = t.app.clone();
        let handle = tasks::parse_handle(&app, &format!("{}.local-{}", "0".repeat(32), "0".repeat(24))).unwrap();
        let sent = Arc::new(Mutex::new(Vec::new()));
        let sink = |open: bool| {
            let sent = sent.clone();
            Sink::new(
                move |line, _| {
                    sent.lock().unwrap().push(line);
                    true
                },
                Arc::new(AtomicBool::new(open)),
            )
        };
        // Closed: it ends without reading anything.
        let mut closed = TaskWatch::new(app.clone(), json!(1), vec![handle.clone()], sink(false));
        assert_eq!(closed.check(), Some(over()));
        assert_eq!(closed.following(), 1, "nothing was read");
        // A task that does not exist is dropped without a notification (never a made-up
        // status), and with no task left the watch ends.
        let mut unknown = TaskWatch::new(app.clone(), json!(2), vec![handle.clone()], sink(true));
        assert_eq!(unknown.check(), Some(over()));
        assert_eq!(unknown.following(), 0);
        assert!(sent.lock().unwrap().is_empty());
        // Nor at the watch's end, which pushes only ends it can read.
        let ending = TaskWatch::new(app.clone(), json!(3), vec![handle], sink(true));
        assert_eq!(Box::new(ending).give_up(), over());
        assert!(sent.lock().unwrap().is_empty());
        assert!(unknown.every() <= Duration::from_secs(1) && unknown.until() > Instant::now() + Duration::from_secs(3600));
    }

    /// A watch is keyed by the sandboxes it reads, each once: the waiter then runs one check
    /// per sandbox at a time. Without keys, each subscription following a task of a sandbox
    /// whose reads stall took a checker of its own, and nine such subscriptions stalled every
    /// waiting call of the server.
    #[test]
    fn a_task_watch_is_keyed_by_the_sandboxes_it_reads() {
        let t = crate::app::testing::test_app("subscription-keys");
        let app = t.app.clone();
        let handle = |task: char, sandbox: char| {
            tasks::parse_handle(&app, &format!("{}.local-{}", task.to_string().repeat(32), sandbox.to_string().repeat(24))).unwrap()
        };
        let sink = Sink::new(|_, _| true, Arc::new(AtomicBool::new(true)));
        let watch = TaskWatch::new(app.clone(), json!(1), vec![handle('a', 'b'), handle('c', 'd'), handle('e', 'b')], sink);
        assert_eq!(watch.keys(), vec![format!("local-{}", "b".repeat(24)), format!("local-{}", "d".repeat(24))]);
        // Its share of the answer budget is its own, even beside another client's subscription
        // with the same request id (they shared one, so a stream read slowly held up the other's
        // notifications, a review found).
        let same_id =
            TaskWatch::new(app.clone(), json!(1), vec![handle('a', 'b')], Sink::new(|_, _| true, Arc::new(AtomicBool::new(true))));
        assert_ne!(watch.client, same_id.client);
    }
}
