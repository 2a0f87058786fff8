//! The stdio transport: a reader thread turns stdin lines into routed messages and answers cheap
//! ones itself; a writer thread sends the workers' replies ([`Out`] messages).
//!
//! Architecture invariant: [`write_lines`] is the only code that writes to stdout. Each call
//! holds the stdout lock for whole lines, so messages never interleave.

use crate::answer_budget::Charge;
use crate::app::App;
use crate::jsonrpc::{self, code, RpcError};
use crate::mcp::protocol::{self, Route, WorkQueue};
use crate::mcp::session::Session;
use crate::mcp::subscription;
use crate::queue::Outcome;
use crate::waiter::Waiter;
use crossbeam_channel::{Receiver, Sender};
use serde_json::Value;
use std::io::{self, BufRead, Write};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::{self, JoinHandle};

/// Writes whole lines to stdout under one lock, then flushes. The only writer of stdout.
pub fn write_lines<'a>(lines: impl IntoIterator<Item = &'a str>) {
    let mut out = io::stdout().lock();
    let mut res = Ok(());
    for line in lines {
        res = res.and_then(|()| out.write_all(line.as_bytes())).and_then(|()| out.write_all(b"\n"));
    }
    if res.and_then(|()| out.flush()).is_err() {
        // The client closed stdout; the reader will see EOF on stdin soon.
        log::warn!("stdout is closed; replies are being dropped");
    }
}

/// A message for the stdout writer thread.
#[derive(Debug)]
pub enum Out {
    /// A serialized response to write, with its share of the answer budget (given back once it
    /// is written).
    Line(String, Charge),
    /// A request the client cancelled: nothing is written for it.
    Cancelled,
    /// A barrier: signalled once every message sent before it is written and flushed.
    Flush(Sender<()>),
}

impl From<Outcome> for Out {
    /// Serializes an answer (on the worker thread that produced it).
    fn from(outcome: Outcome) -> Out {
        match outcome {
            Outcome::Answer(response) | Outcome::Busy(response) => {
                let (line, charge) = response.serialize();
                Out::Line(line, charge)
            }
            Outcome::Cancelled(_) => Out::Cancelled,
        }
    }
}

/// Starts the thread that writes the workers' replies, flushing after each batch.
pub fn spawn_writer(replies: Receiver<Out>) -> io::Result<JoinHandle<()>> {
    thread::Builder::new().name("sandbox-mcp-stdout".into()).spawn(move || {
        while let Ok(first) = replies.recv() {
            let mut batch = vec![first];
            batch.extend(replies.try_iter());
            write_lines(batch.iter().filter_map(|out| match out {
                Out::Line(line, _) => Some(line.as_str()),
                Out::Cancelled | Out::Flush(_) => None,
            }));
            let mut written = 0;
            for out in &batch {
                match out {
                    Out::Flush(done) => {
                        let _ = done.send(());
                    }
                    Out::Line(line, _) => written += line.len(),
                    Out::Cancelled => {}
                }
            }
            drop(batch);
            if written >= crate::memory::RELEASE_AFTER_BYTES {
                // The answers and the values they were made from are freed by now.
                crate::memory::release_free();
            }
        }
    })
}

/// One line read by [`read_line`].
#[derive(Debug, PartialEq)]
pub enum Line {
    /// A complete line (without its `\n` and any `\r`).
    Text,
    /// A line over the limit; it was discarded up to its end, but for its first
    /// [`jsonrpc::ID_PREFIX_BYTES`] bytes, left in the buffer (to find its id).
    TooLong,
    /// End of input.
    Eof,
}

/// Reads one line of at most `max` bytes into `buf`, discarding (not buffering) longer ones but
/// for their first bytes.
pub fn read_line(input: &mut impl BufRead, buf: &mut Vec<u8>, max: usize) -> io::Result<Line> {
    buf.clear();
    let mut too_long = false;
    loop {
        let chunk = match input.fill_buf() {
            Ok(c) => c,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(err),
        };
        if chunk.is_empty() {
            return Ok(if too_long {
                Line::TooLong
            } else if buf.is_empty() {
                Line::Eof
            } else {
                Line::Text
            });
        }
        let (take, done) = match chunk.iter().position(|b| *b == b'\n') {
            Some(i) => (i, true),
            None => (chunk.len(), false),
        };
        if !too_long {
            if buf.len() + take > max {
                too_long = true;
                let keep = jsonrpc::ID_PREFIX_BYTES.min(max).saturating_sub(buf.len()).min(take);
                buf.extend_from_slice(&chunk[..keep]);
                buf.truncate(jsonrpc::ID_PREFIX_BYTES.min(max));
            } else {
                buf.extend_from_slice(&chunk[..take]);
            }
        }
        input.consume(if done { take + 1 } else { take });
        if done {
            if too_long {
                return Ok(Line::TooLong);
            }
            if buf.last() == Some(&b'\r') {
                buf.pop();
            }
            return Ok(Line::Text);
        }
    }
}

/// Reads stdin until EOF, answering cheap requests at once and handing tool calls to `queue`,
/// answered on `replies`. Returns when stdin ends or the queue is gone.
///
/// `queue` must not block (the server passes the unbounded channel of a feeder thread, see
/// `server::run_stdio`): this thread also reads the pings and cancellations that must be
/// answered and honoured while tool calls wait for a worker.
pub fn run_reader(app: &Arc<App>, session: &Arc<Session>, queue: &WorkQueue<Out>, replies: &Sender<Out>, waiter: &Waiter, max_line: usize) {
    let stdin = io::stdin();
    let mut input = io::BufReader::with_capacity(256 * 1024, stdin.lock());
    let mut buf = Vec::new();
    loop {
        let msg = match read_line(&mut input, &mut buf, max_line) {
            Ok(Line::Eof) => return,
            Ok(Line::TooLong) => jsonrpc::Incoming::Invalid {
                // Answered with its own id when its start names one, so that the client matches it.
                id: jsonrpc::id_in_prefix(&buf).unwrap_or(Value::Null),
                error: RpcError::new(code::PARSE_ERROR, format!("message over {max_line} bytes was discarded; send smaller messages")),
            },
            Ok(Line::Text) if buf.iter().all(u8::is_ascii_whitespace) => continue,
            Ok(Line::Text) => jsonrpc::parse(&buf),
            Err(err) => {
                log::error!("reading stdin failed: {err}");
                return;
            }
        };
        match protocol::route(app, session, msg) {
            Route::Silent => {}
            // Answered on this thread: no hand-off to the writer for cheap requests.
            Route::Reply(line) | Route::Refused(line, _) => write_lines([line.as_str()]),
            // The subscription stays open until the client cancels it or the server shuts down
            // (`server::run_stdio` then closes it). In between come only the task notifications
            // of the tasks it named (the tool list never changes): the waiter follows them and
            // sends them through the writer, after the acknowledgement written here.
            Route::Listen(listen) => match session.subscriptions.open(&listen.id) {
                Some(open) => {
                    write_lines([listen.ack.as_str()]);
                    if !listen.tasks.is_empty() {
                        let (out, still) = (replies.clone(), open.clone());
                        let sink = subscription::Sink::new(
                            move |line, charge| still.load(Ordering::SeqCst) && out.send(Out::Line(line, charge)).is_ok(),
                            open,
                        );
                        if let Err(err) = subscription::follow(app, waiter, &listen.id, listen.tasks, sink) {
                            session.subscriptions.cancel(&listen.id);
                            write_lines([jsonrpc::error(&listen.id, &err).to_string().as_str()]);
                        }
                    }
                }
                None => {
                    let err = RpcError::new(
                        code::INVALID_REQUEST,
                        format!("a subscription with id {} is already open; use a new id per request", listen.id),
                    );
                    write_lines([jsonrpc::error(&listen.id, &err).to_string().as_str()]);
                }
            },
            Route::Call(work) => {
                if queue.send(work.into_job(replies.clone())).is_err() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(input: &[u8], max: usize) -> Vec<(Line, Vec<u8>)> {
        let mut r = io::BufReader::with_capacity(4, input);
        let mut buf = Vec::new();
        let mut out = Vec::new();
        loop {
            let l = read_line(&mut r, &mut buf, max).unwrap();
            if l == Line::Eof {
                return out;
            }
            out.push((l, buf.clone()));
        }
    }

    #[test]
    fn splits_lines_and_discards_long_ones() {
        let got = lines(b"ab\r\ncdefghij\n\nxy", 5);
        assert_eq!(
            got,
            vec![(Line::Text, b"ab".to_vec()), (Line::TooLong, b"cdefg".to_vec()), (Line::Text, vec![]), (Line::Text, b"xy".to_vec())]
        );
        assert_eq!(lines(b"toolongline", 3), vec![(Line::TooLong, b"too".to_vec())]);
    }
}
