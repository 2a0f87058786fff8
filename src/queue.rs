//! The bounded work queue and the worker pool.
//!
//! Every tool call becomes a [`Job`] carrying its own reply channel; workers never see which
//! transport a job came from. A handler's result is an [`Outcome`], which the worker turns into
//! the transport's reply type on the worker thread. A panicking job is answered with -32603 and
//! the worker goes on; the job's work is moved into the handler, so whatever it owns (the
//! request's in-flight guard) is dropped while the panic unwinds.
//!
//! A handler may also answer [`Step::Later`]: it hands the job's reply over (as a [`Respond`])
//! to whatever will answer it, so a call that waits (a `get_task` with `wait`) does not hold the
//! worker while it waits.

use crate::jsonrpc::{self, code, RpcError};
use crossbeam_channel::{Receiver, Sender};
use serde_json::Value;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;
use std::thread::{self, JoinHandle};

/// How a job ended: the JSON-RPC response, and whether the client had cancelled the request.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// A response to send.
    Answer(Value),
    /// The response to a request the client cancelled: stdio sends nothing for it, HTTP still
    /// answers with it (the HTTP request is still waiting for a body).
    Cancelled(Value),
}

impl Outcome {
    /// The JSON-RPC response, cancelled or not.
    pub fn into_response(self) -> Value {
        match self {
            Outcome::Answer(v) | Outcome::Cancelled(v) => v,
        }
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
}

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

/// Starts `n` named workers that run `handler` on each job from a queue of `capacity` and send
/// `R::from(outcome)` on the job's reply channel (at once, or later through [`Step::Later`]).
/// Workers exit when every sender of the queue is dropped.
pub fn spawn_workers<T, R, S, H>(n: usize, capacity: usize, handler: H) -> (Sender<Job<T, R>>, Vec<JoinHandle<()>>)
where
    T: Send + 'static,
    R: From<Outcome> + Send + 'static,
    S: Into<Step>,
    H: Fn(T) -> S + Send + Sync + 'static,
{
    let (tx, rx) = crossbeam_channel::bounded::<Job<T, R>>(capacity);
    let handler = Arc::new(handler);
    let mut handles = Vec::with_capacity(n);
    for i in 0..n {
        let rx: Receiver<Job<T, R>> = rx.clone();
        let handler = handler.clone();
        let spawned = thread::Builder::new().name(format!("sandbox-mcp-worker-{i}")).spawn(move || {
            for Job { id, work, reply } in rx {
                let step = panic::catch_unwind(AssertUnwindSafe(|| handler(work).into())).unwrap_or_else(|payload| {
                    let what = payload
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| payload.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "unknown panic".into());
                    log::error!("a tool call panicked: {what}");
                    let err = RpcError::new(
                        code::INTERNAL_ERROR,
                        "internal error while running the tool; the server is still running, retry or report this",
                    );
                    Step::Done(Outcome::Answer(jsonrpc::error(&id, &err)))
                });
                match step {
                    // The receiver is gone when the client went away; nothing left to do then.
                    Step::Done(outcome) => {
                        let _ = reply.send(R::from(outcome));
                    }
                    Step::Later(park) => park(Box::new(move |outcome| {
                        let _ = reply.send(R::from(outcome));
                    })),
                }
            }
        });
        match spawned {
            Ok(h) => handles.push(h),
            Err(err) => log::error!("could not start worker {i}: {err}"),
        }
    }
    (tx, handles)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_panicking_job_answers_internal_error_and_the_worker_keeps_serving() {
        let (tx, handles) = spawn_workers(1, 4, |work: &str| {
            if work == "boom" {
                panic!("boom");
            }
            Outcome::Answer(json!({"jsonrpc": "2.0", "id": 2, "result": {}}))
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
        let (tx, handles) = spawn_workers(1, 4, move |work: &str| {
            if work == "later" {
                let park_tx = park_tx.clone();
                return Step::Later(Box::new(move |respond| park_tx.send(respond).unwrap()));
            }
            Step::Done(Outcome::Answer(json!(work)))
        });
        let (rtx, rrx) = crossbeam_channel::unbounded::<Outcome>();
        tx.send(Job { id: json!(1), work: "later", reply: rtx.clone() }).unwrap();
        tx.send(Job { id: json!(2), work: "now", reply: rtx }).unwrap();
        assert_eq!(rrx.recv().unwrap(), Outcome::Answer(json!("now")), "the one worker went on");
        let respond = park_rx.recv().unwrap();
        std::thread::spawn(move || respond(Outcome::Answer(json!("later")))).join().unwrap();
        assert_eq!(rrx.recv().unwrap(), Outcome::Answer(json!("later")));
        drop(tx);
        for h in handles {
            h.join().unwrap();
        }
    }
}
