//! The bounded work queue and the worker pool.
//!
//! Every tool call becomes a [`Job`] carrying its own reply channel; workers never see which
//! transport a job came from. A panicking job is answered with -32603 and the worker goes on.

use crate::jsonrpc::{self, code, RpcError};
use crossbeam_channel::{Receiver, Sender};
use serde_json::Value;
use std::panic::{self, AssertUnwindSafe};
use std::thread::{self, JoinHandle};

/// A finished request, ready for its transport.
#[derive(Debug)]
pub struct Reply {
    /// The serialized JSON-RPC response (one line, no newline).
    pub line: String,
    /// Whether the client cancelled the request (stdio then sends nothing).
    pub cancelled: bool,
    /// Signalled by the stdio writer once this reply (and all before it) is flushed.
    pub flushed: Option<Sender<()>>,
}

impl Reply {
    /// A reply to send.
    pub fn new(line: String, cancelled: bool) -> Reply {
        Reply { line, cancelled, flushed: None }
    }
}

/// One unit of work: what to run and where to send the answer.
pub struct Job<T> {
    /// The request id, for the -32603 answer if the work panics.
    pub id: Value,
    /// The work itself.
    pub work: T,
    /// Where the reply goes.
    pub reply: Sender<Reply>,
}

/// Starts `n` named workers that run `handler` on each job from a queue of `capacity`.
/// The handler returns the response and whether it was cancelled; `on_panic` cleans up after a
/// handler that panicked. Workers exit when every sender of the queue is dropped.
pub fn spawn_workers<T, H, P>(n: usize, capacity: usize, handler: H, on_panic: P) -> (Sender<Job<T>>, Vec<JoinHandle<()>>)
where
    T: Send + 'static,
    H: Fn(&T) -> (Value, bool) + Send + Sync + 'static,
    P: Fn(&T) + Send + Sync + 'static,
{
    let (tx, rx) = crossbeam_channel::bounded::<Job<T>>(capacity);
    let handler = std::sync::Arc::new(handler);
    let on_panic = std::sync::Arc::new(on_panic);
    let mut handles = Vec::with_capacity(n);
    for i in 0..n {
        let rx: Receiver<Job<T>> = rx.clone();
        let handler = handler.clone();
        let on_panic = on_panic.clone();
        let spawned = thread::Builder::new().name(format!("sandbox-mcp-worker-{i}")).spawn(move || {
            for job in rx {
                let outcome = panic::catch_unwind(AssertUnwindSafe(|| handler(&job.work)));
                let (response, cancelled) = match outcome {
                    Ok(done) => done,
                    Err(payload) => {
                        let what = payload
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| payload.downcast_ref::<String>().cloned())
                            .unwrap_or_else(|| "unknown panic".into());
                        log::error!("a tool call panicked: {what}");
                        on_panic(&job.work);
                        let err = RpcError::new(
                            code::INTERNAL_ERROR,
                            "internal error while running the tool; the server is still running, retry or report this",
                        );
                        (jsonrpc::error(&job.id, &err), false)
                    }
                };
                let line = response.to_string();
                // The receiver is gone when the client went away; nothing left to do then.
                let _ = job.reply.send(Reply::new(line, cancelled));
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
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn a_panicking_job_answers_internal_error_and_the_worker_keeps_serving() {
        let cleaned = Arc::new(AtomicUsize::new(0));
        let c2 = cleaned.clone();
        let (tx, handles) = spawn_workers(
            1,
            4,
            |work: &&str| {
                if *work == "boom" {
                    panic!("boom");
                }
                (json!({"jsonrpc": "2.0", "id": 2, "result": {}}), false)
            },
            move |_| {
                c2.fetch_add(1, Ordering::SeqCst);
            },
        );
        let (rtx, rrx) = crossbeam_channel::unbounded();
        tx.send(Job { id: json!(1), work: "boom", reply: rtx.clone() }).unwrap();
        tx.send(Job { id: json!(2), work: "fine", reply: rtx }).unwrap();
        let first: Value = serde_json::from_str(&rrx.recv().unwrap().line).unwrap();
        assert_eq!(first["id"], 1);
        assert_eq!(first["error"]["code"], -32603);
        let second: Value = serde_json::from_str(&rrx.recv().unwrap().line).unwrap();
        assert_eq!(second["id"], 2);
        assert_eq!(cleaned.load(Ordering::SeqCst), 1);
        drop(tx);
        for h in handles {
            h.join().unwrap();
        }
    }
}
