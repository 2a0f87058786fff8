//! The memory budget of HTTP request bodies: one total for every body held at once, and the
//! reading of one body within it.
//!
//! A body is held in memory from its first byte until its request is answered, so a client that
//! sends most of a large body and then stalls keeps that memory for as long as it likes; without a
//! total, a few hundred such clients hold gigabytes. Each body takes its share of the budget
//! before the bytes it covers are read, one step at a time: what a body holds is what its client
//! sent, so connections that announce large bodies and send nothing hold nothing (sixteen such
//! connections used to take the whole budget, and every other client's requests were refused).
//! A body that does not fit is read to its end and discarded, and its request answered 503 with
//! `Retry-After`; one that stops arriving for `--http-stall` (the connection's receive timeout)
//! is answered 408. A body longer than a step is read into a buffer the allocator maps for it
//! alone (see [`MAPPED`]), so that its memory returns to the system when the request is done and
//! the server's RSS goes back down after a burst.
//!
//! Parsed, a body costs more than its bytes: every JSON value becomes a node, every object member
//! a map entry (a body of many small keys parses to about fifteen times its size). Before it is
//! parsed, a body also takes the share of its parsed cost ([`parsed_cost`]), so the budget bounds
//! what the parsed messages hold as well.

use std::io::{self, Read};
use std::sync::{Arc, Mutex};

/// How much of a body is read, and charged, at a time.
const STEP: usize = 64 * 1024;

/// The capacity of the buffer of a body longer than one step: more than glibc's largest mapping
/// threshold (32 MiB on 64-bit), so that the allocator always maps it on its own and unmaps it
/// when it is freed. Only the pages a body fills become resident; a smaller buffer would come
/// from the allocator's heaps, which keep freed memory (and the threshold rises after every
/// large free, up to that maximum).
const MAPPED: usize = 33 << 20;

/// What one JSON value costs parsed, beyond its bytes: a `serde_json::Value` node, and for an
/// object member its map entry (key string, node slot), rounded up.
const PER_VALUE: usize = 64;

/// What `body` costs once parsed, in bytes: its length, plus [`PER_VALUE`] for every value it
/// holds, counted by one pass over the structural characters outside strings.
pub fn parsed_cost(body: &[u8]) -> usize {
    let (mut values, mut in_string, mut escaped) = (1usize, false, false);
    for &b in body {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
        } else {
            match b {
                b'"' => in_string = true,
                b',' | b':' | b'[' | b'{' => values += 1,
                _ => {}
            }
        }
    }
    body.len().saturating_add(values.saturating_mul(PER_VALUE))
}

/// The total of body bytes held at once, shared by every HTTP connection.
#[derive(Debug)]
pub struct BodyBudget {
    limit: usize,
    used: Mutex<usize>,
}

impl BodyBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Arc<BodyBudget> {
        Arc::new(BodyBudget { limit, used: Mutex::new(0) })
    }

    /// The budget's size in bytes.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes held now.
    pub fn used(&self) -> usize {
        self.used.lock().map(|u| *u).unwrap_or(0)
    }

    fn take(&self, n: usize) -> bool {
        let Ok(mut used) = self.used.lock() else { return false };
        if *used + n > self.limit {
            return false;
        }
        *used += n;
        true
    }

    fn give_back(&self, n: usize) {
        if let Ok(mut used) = self.used.lock() {
            *used = used.saturating_sub(n);
        }
    }
}

/// A share of the budget, returned when dropped.
#[derive(Debug)]
pub struct Share {
    budget: Arc<BodyBudget>,
    bytes: usize,
}

impl Share {
    fn new(budget: &Arc<BodyBudget>) -> Share {
        Share { budget: budget.clone(), bytes: 0 }
    }

    /// Takes `n` more bytes of the budget for this body; false (nothing taken) when they do not
    /// fit.
    pub fn grow(&mut self, n: usize) -> bool {
        let ok = self.budget.take(n);
        if ok {
            self.bytes += n;
        }
        ok
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        self.budget.give_back(self.bytes);
    }
}

/// What reading one body gave.
#[derive(Debug)]
pub enum Body {
    /// The whole body, and the share of the budget it holds until dropped.
    Ok(Vec<u8>, Share),
    /// Longer than the cap; read to its end and discarded (413) but for its first bytes (at most
    /// [`crate::jsonrpc::ID_PREFIX_BYTES`], to answer with its id).
    TooLarge(Vec<u8>),
    /// Over the budget; read to its end and discarded (503 with `Retry-After`).
    OverBudget,
    /// The client stopped sending before its announced length (nothing is parsed; 400).
    Incomplete,
    /// No byte of it came for the connection's receive timeout, `--http-stall` (408).
    Stalled,
}

/// Reads one body of at most `cap` bytes from `reader` within `budget`. `announced` is the
/// declared length, if any. A body that fails to read comes back empty (the request is then
/// answered as unparsable).
pub fn read_body(reader: &mut dyn Read, announced: Option<usize>, cap: usize, budget: &Arc<BodyBudget>) -> Body {
    let mut share = Share::new(budget);
    if let Some(n) = announced {
        if n > cap {
            let mut prefix = vec![0; crate::jsonrpc::ID_PREFIX_BYTES.min(n)];
            let got = fill(reader, &mut prefix).unwrap_or(0);
            prefix.truncate(got);
            return drain(reader, Body::TooLarge(prefix));
        }
    }
    let mut body = match announced {
        Some(n) if n > STEP => Vec::with_capacity(MAPPED),
        _ => Vec::new(),
    };
    loop {
        let want = match announced {
            Some(n) => (n - body.len().min(n)).min(STEP),
            None => STEP,
        };
        if want == 0 {
            break;
        }
        if !share.grow(want) {
            // What it holds goes back before the rest is drained, which lasts as long as its
            // client takes to send it: bodies that arrive together would otherwise each keep the
            // others out of the budget until all of them were refused.
            drop((body, share));
            return drain(reader, Body::OverBudget);
        }
        if announced.is_none() && body.len() == STEP {
            // Past one step: into a buffer of its own mapping (see MAPPED).
            let mut mapped = Vec::with_capacity(MAPPED);
            mapped.extend_from_slice(&body);
            body = mapped;
        }
        let start = body.len();
        body.resize(start + want, 0);
        let got = match fill(reader, &mut body[start..]) {
            Ok(got) => got,
            Err(err) if matches!(err.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => return Body::Stalled,
            Err(_) => return Body::Ok(Vec::new(), share),
        };
        body.truncate(start + got);
        if body.len() > cap {
            body.truncate(crate::jsonrpc::ID_PREFIX_BYTES);
            let prefix = body.to_vec();
            drop((body, share));
            return drain(reader, Body::TooLarge(prefix));
        }
        if got < want {
            if announced.is_some_and(|n| body.len() < n) {
                return Body::Incomplete;
            }
            break;
        }
    }
    Body::Ok(body, share)
}

/// Reads until `buf` is full or the body ends; how much was read.
fn fill(reader: &mut dyn Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match read_some(reader, &mut buf[got..])? {
            0 => break,
            n => got += n,
        }
    }
    Ok(got)
}

fn read_some(reader: &mut dyn Read, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match reader.read(buf) {
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// Reads and discards the rest of a body, so that its client, which may read the answer only
/// once it has sent the whole body, gets the answer; answers `then`.
fn drain(reader: &mut dyn Read, then: Body) -> Body {
    let mut chunk = [0u8; 8 * 1024];
    while let Ok(1..) = read_some(reader, &mut chunk) {}
    then
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: usize = 1000;

    #[test]
    fn parsed_cost_counts_values_outside_strings() {
        assert_eq!(parsed_cost(b"1"), 1 + PER_VALUE);
        assert_eq!(parsed_cost(br#"{"a":1,"b":[2,3]}"#), 17 + 7 * PER_VALUE);
        // Structural characters inside strings, escaped quotes included, are text.
        assert_eq!(parsed_cost(br#"{"a":"x,y:[{\",}"}"#), 18 + 3 * PER_VALUE);
        let many: String = format!("{{{}}}", (0..1000).map(|i| format!("\"k{i}\":{i}")).collect::<Vec<_>>().join(","));
        assert!(parsed_cost(many.as_bytes()) > 10 * many.len(), "many small keys cost far more than their bytes");
    }

    fn read(data: &[u8], announced: Option<usize>, budget: &Arc<BodyBudget>) -> Body {
        read_body(&mut &data[..], announced, CAP, budget)
    }

    #[test]
    fn bodies_take_their_share_until_dropped() {
        let budget = BodyBudget::new(1500);
        let a = read(&[1u8; 800], Some(800), &budget);
        assert!(matches!(&a, Body::Ok(b, _) if b.len() == 800));
        assert_eq!(budget.used(), 800);
        // A second announced body that does not fit is drained and refused.
        assert!(matches!(read(&[2u8; 800], Some(800), &budget), Body::OverBudget));
        assert_eq!(budget.used(), 800);
        drop(a);
        assert_eq!(budget.used(), 0);
        assert!(matches!(read(&[2u8; 800], Some(800), &budget), Body::Ok(b, _) if b == vec![2u8; 800]));
    }

    #[test]
    fn announced_bodies_are_charged_as_they_arrive() {
        /// Gives `left` bytes, a few at a time, noting what the budget held at the first read.
        struct Arriving<'a> {
            budget: &'a BodyBudget,
            left: usize,
            first: Option<usize>,
        }
        impl Read for Arriving<'_> {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                self.first.get_or_insert(self.budget.used());
                let n = buf.len().min(self.left).min(1000);
                self.left -= n;
                Ok(n)
            }
        }
        let budget = BodyBudget::new(4 * STEP);
        let mut body = Arriving { budget: &budget, left: 3 * STEP, first: None };
        assert!(matches!(read_body(&mut body, Some(3 * STEP), 4 * STEP, &budget), Body::Ok(b, _) if b.len() == 3 * STEP));
        assert_eq!(body.first, Some(STEP), "one step before the first read, not the whole announced length");
        // A body announced but cut short gives back what it took.
        let mut short = Arriving { budget: &budget, left: 10, first: None };
        assert!(matches!(read_body(&mut short, Some(3 * STEP), 4 * STEP, &budget), Body::Incomplete));
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn unannounced_bodies_are_charged_step_by_step() {
        let budget = BodyBudget::new(2 * STEP);
        assert!(matches!(read_body(&mut &[1u8; 10][..], Some(20), CAP, &budget), Body::Incomplete));
        assert_eq!(budget.used(), 0);
        let data = vec![7u8; 100];
        let Body::Ok(b, share) = read_body(&mut &data[..], None, 4 * STEP, &budget) else { panic!() };
        assert_eq!(b, data);
        assert_eq!(budget.used(), STEP, "one step, not filled: the end");
        drop(share);
        let long = vec![7u8; 3 * STEP];
        assert!(matches!(read_body(&mut &long[..], None, 4 * STEP, &budget), Body::OverBudget));
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn over_the_cap_is_too_large_and_drained() {
        let budget = BodyBudget::new(1 << 20);
        assert!(
            matches!(read(&[0u8; 1200], Some(1200), &budget), Body::TooLarge(p) if p.len() == 1200.min(crate::jsonrpc::ID_PREFIX_BYTES))
        );
        assert!(matches!(read(&[0u8; 1200], None, &budget), Body::TooLarge(p) if !p.is_empty()));
        assert_eq!(budget.used(), 0);
        // Announced within it but cut short: drained to its end and refused.
        assert!(matches!(read(&[0u8; 10], Some(5000), &budget), Body::TooLarge(_)));
    }
}
