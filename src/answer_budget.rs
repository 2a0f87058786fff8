//! The memory budget of answers: one total for every large answer being made or sent at once,
//! and a share of it per client.
//!
//! An answer costs several times its structured result. A tool's `CallToolResult` holds the
//! result twice (as `structuredContent`, and serialized as the text block), and the serialized
//! response escapes that text again: a 4 MiB file of control bytes, read with `read_file`, is a
//! 54 MB answer and about 86 MiB of memory while it is made. Without a total, sixteen such reads
//! at once took the server to 981 MiB, every worker and runner building one; and an answer stays
//! in memory until its client has read it (over HTTP, at most `--http-stall` per write).
//!
//! So before a result becomes an answer, its maker takes a [`Charge`] of what the answer will
//! cost ([`estimate`], from one counting pass over the result, no allocation), and the charge
//! goes with the answer until the transport has written it; after serializing, it shrinks to
//! the serialized bytes. Answers smaller than [`crate::limits::ANSWER_FREE`] take nothing:
//! every ordinary answer. A charge that does not fit waits for room while other answers are
//! being made or give theirs back, and charges get the total's room in the order they began to wait (one held back
//! only by its own client's share holds up nobody), [`crate::limits::ANSWER_WAIT`] after the last did and
//! [`crate::limits::ANSWER_WAIT_MOST`] in all, then the call fails with a message saying so; on the waiter's
//! thread it does not wait: the call stays parked and is made again later ([`Backoff`]; a
//! subscription's notification likewise). One client
//! holds at most [`crate::limits::ANSWER_BUDGET_PER_CLIENT`] of the total, so a client that
//! makes large answers and never reads them delays only its own; an answer larger than a share
//! (or than the total) fits when its client (or everyone) holds nothing.

use crate::limits::{ANSWER_BUDGET, ANSWER_BUDGET_PER_CLIENT, ANSWER_FREE};
use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long a call parked with the waiter, or a subscription's notification, waits before it is
/// made again after it first found no room: making it again reads it again (a task's whole
/// logs, from the sandbox), which must not repeat at every check while the budget stays full.
/// Each refusal after that doubles the wait, up to [`RETRY_MOST`].
pub const RETRY: Duration = Duration::from_secs(1);

/// The longest wait between two tries of [`Backoff`].
pub const RETRY_MOST: Duration = Duration::from_secs(30);

/// When an answer the waiter's thread makes, refused for room, is made again: [`RETRY`] after the
/// first refusal, twice as long after each next one, at most [`RETRY_MOST`].
#[derive(Debug, Default, Clone, Copy)]
pub struct Backoff {
    at: Option<Instant>,
    refusals: u32,
}

impl Backoff {
    /// Whether it is time to make the answer (again).
    pub fn due(&self) -> bool {
        self.at.is_none_or(|at| Instant::now() >= at)
    }

    /// The answer was refused now: the next try waits.
    pub fn refused(&mut self) {
        let wait = RETRY.saturating_mul(1 << self.refusals.min(16)).min(RETRY_MOST);
        self.at = Some(Instant::now() + wait);
        self.refusals = self.refusals.saturating_add(1);
    }
}

/// What the budget looks like to an answer that found no room and is made again later (a
/// subscription's notification), without taking anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Look {
    /// How many times room was given back so far.
    pub gives: u64,
    /// Whether an answer is being made now (it gives room back once sent).
    pub making: bool,
    /// Bytes the asking client's answers hold now.
    pub mine: usize,
    /// Whether a charge of the bytes asked about would be taken now without waiting.
    pub fits: bool,
}

/// [`Look`] for a charge of `bytes` for `client`: a cheap test, so that the answer, whose
/// making reads it again, is made only when it can be sent.
pub fn look(client: &str, bytes: usize) -> Look {
    ANSWERS.look(client, bytes)
}

/// The server's budget.
static ANSWERS: Budget = Budget::new(ANSWER_BUDGET, ANSWER_BUDGET_PER_CLIENT);

/// A total of bytes held by answers, with a share per client.
pub struct Budget {
    held: Mutex<Held>,
    freed: Condvar,
    total: usize,
    per_client: usize,
}

/// What is held now: in all, and by each client holding anything.
struct Held {
    all: usize,
    by: Option<HashMap<String, usize>>,
    /// How many times room was given back so far (a waiting charge waits on while it grows).
    gives: u64,
    /// The charges waiting, oldest first: (ticket, client, bytes).
    queue: VecDeque<(u64, String, usize)>,
    /// Charges of answers still being made (not yet serialized, [`Charge::shrink_to`]): work
    /// that gives room back soon, unlike an answer being sent to a client that does not read.
    making: usize,
    /// The next waiting charge's ticket.
    next_ticket: u64,
}

impl Held {
    /// Bytes `client` holds.
    fn of(&self, client: &str) -> usize {
        self.by.as_ref().and_then(|by| by.get(client)).copied().unwrap_or(0)
    }

    /// Whether a charge waiting before `ticket` (every waiting one for `None`) would fit its
    /// client's share: then the room it waits for is its to take first, and a later charge
    /// (waiting or new) that fits the total now does not pass it. A charge held back only by
    /// its own client's share holds up nobody else.
    fn first_in_line(&self, ticket: Option<u64>, per_client: usize) -> bool {
        self.queue.iter().take_while(|(t, _, _)| Some(*t) != ticket).any(|(_, client, bytes)| {
            let mine = self.of(client);
            mine == 0 || mine.saturating_add(*bytes) <= per_client
        })
    }

    /// Takes waiting charge `ticket` out of the line.
    fn leave(&mut self, ticket: Option<u64>) {
        if let Some(t) = ticket {
            self.queue.retain(|(queued, _, _)| *queued != t);
        }
    }
}

/// Why a charge was not taken: what it needed, and what the budget held then.
#[derive(Debug, Clone, PartialEq)]
pub struct Full {
    /// The bytes the answer needs.
    pub needed: usize,
    /// The bytes held by every answer.
    pub held: usize,
    /// Of those, the asking client's.
    pub held_by_client: usize,
    /// The budget.
    pub total: usize,
    /// One client's share.
    pub per_client: usize,
}

impl Full {
    /// What happened, for the model or person who made the call: the room the answer needs and
    /// what holds the budget.
    pub fn message(&self) -> String {
        const MIB: usize = 1 << 20;
        let mib = |n: usize| n.div_ceil(MIB);
        format!(
            "it needs about {} MiB of the server's memory for answers, and answers being made or sent hold {} of {} MiB \
now ({} of this client's {} MiB share)",
            mib(self.needed),
            mib(self.held),
            mib(self.total),
            mib(self.held_by_client),
            mib(self.per_client),
        )
    }
}

impl Budget {
    /// A budget of `total` bytes, at most `per_client` of them for one client.
    pub const fn new(total: usize, per_client: usize) -> Budget {
        Budget {
            held: Mutex::new(Held { all: 0, by: None, gives: 0, queue: VecDeque::new(), next_ticket: 0, making: 0 }),
            freed: Condvar::new(),
            total,
            per_client,
        }
    }

    /// Takes `bytes` for `client`, waiting for room while answers give theirs back or are still
    /// being made: at most `wait` since the last time any did give room back and none was being
    /// made, and at most [`crate::limits::ANSWER_WAIT_MOST`] in all (so answers made one after
    /// another under load are served, however slowly each is made, while answers nobody reads
    /// make the others fail soon). Nothing is taken for fewer than [`ANSWER_FREE`] bytes.
    pub fn take(&'static self, client: &str, bytes: usize, wait: Duration) -> Result<Charge, Full> {
        if bytes < ANSWER_FREE {
            return Ok(Charge::none());
        }
        let start = Instant::now();
        let most = if wait.is_zero() { start } else { start + crate::limits::ANSWER_WAIT_MOST.max(wait) };
        let mut until = start + wait;
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let mut gives = held.gives;
        // This charge's place in line once it waits.
        let mut ticket = None;
        loop {
            if self.admits(&held, client, bytes, ticket) {
                held.leave(ticket);
                held.all += bytes;
                held.making += 1;
                *held.by.get_or_insert_with(HashMap::new).entry(client.to_string()).or_insert(0) += bytes;
                drop(held);
                if ticket.is_some() {
                    // The next in line may fit now.
                    self.freed.notify_all();
                }
                return Ok(Charge { bytes, taken: Some((self, client.to_string())), making: true });
            }
            if held.gives != gives || held.making > 0 {
                // Room was given back meanwhile, or an answer is being made (it will give room
                // back once sent): the budget is turning over, wait on.
                gives = held.gives;
                until = (Instant::now() + wait).min(most);
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let (all, mine) = (held.all, held.of(client));
                held.leave(ticket);
                drop(held);
                if ticket.is_some() {
                    // Those behind it may fit now.
                    self.freed.notify_all();
                }
                return Err(Full { needed: bytes, held: all, held_by_client: mine, total: self.total, per_client: self.per_client });
            }
            if ticket.is_none() {
                let t = held.next_ticket;
                held.next_ticket += 1;
                held.queue.push_back((t, client.to_string(), bytes));
                ticket = Some(t);
            }
            held = self.freed.wait_timeout(held, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// Whether `held` admits a charge of `bytes` for `client` (waiting charge `ticket`, or a new
    /// one): within the total and the client's share, and no charge waiting before it fits
    /// its own share.
    fn admits(&self, held: &Held, client: &str, bytes: usize, ticket: Option<u64>) -> bool {
        let mine = held.of(client);
        let fits_all = held.all == 0 || held.all.saturating_add(bytes) <= self.total;
        let fits_mine = mine == 0 || mine.saturating_add(bytes) <= self.per_client;
        // In the order charges began to wait: a large one is not passed over for good by
        // smaller ones that keep the total from ever having its room.
        fits_all && fits_mine && !held.first_in_line(ticket, self.per_client)
    }

    fn look(&self, client: &str, bytes: usize) -> Look {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let fits = bytes < ANSWER_FREE || self.admits(&held, client, bytes, None);
        Look { gives: held.gives, making: held.making > 0, mine: held.of(client), fits }
    }

    /// Gives `bytes` of `client`'s back; `made`: the answer is no longer being made.
    fn give(&self, client: &str, bytes: usize, made: bool) {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if made {
            held.making = held.making.saturating_sub(1);
        }
        held.all = held.all.saturating_sub(bytes);
        held.gives = held.gives.wrapping_add(1);
        if let Some(by) = held.by.as_mut() {
            if let Some(n) = by.get_mut(client) {
                *n = n.saturating_sub(bytes);
                if *n == 0 {
                    by.remove(client);
                }
            }
        }
        drop(held);
        self.freed.notify_all();
    }

    /// Bytes held now, in all.
    pub fn held(&self) -> usize {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).all
    }
}

/// A share of the budget, given back when it is dropped (once the answer is written, or
/// dropped unsent).
#[derive(Debug, Default)]
pub struct Charge {
    bytes: usize,
    taken: Option<(&'static Budget, String)>,
    /// Whether its answer is still being made (until it is shrunk or dropped).
    making: bool,
}

impl std::fmt::Debug for Budget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Budget").field("total", &self.total).field("per_client", &self.per_client).finish()
    }
}

impl Charge {
    /// A charge of nothing (small answers, and answers made outside the server).
    pub fn none() -> Charge {
        Charge::default()
    }

    /// Gives back what is held beyond `bytes` (the answer's serialized size, once the values it
    /// was made from are freed).
    pub fn shrink_to(&mut self, bytes: usize) {
        if let Some((budget, client)) = &self.taken {
            let made = std::mem::take(&mut self.making);
            let given = self.bytes.saturating_sub(bytes);
            if given > 0 || made {
                budget.give(client, given, made);
                self.bytes -= given;
            }
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        if let Some((budget, client)) = self.taken.take() {
            budget.give(&client, self.bytes, self.making);
        }
    }
}

/// Takes the charge of the answer that `structured` will become, for `client`, from the
/// server's budget, waiting at most `wait` for room.
pub fn charge(client: &str, structured: &Value, wait: Duration) -> Result<Charge, Full> {
    ANSWERS.take(client, estimate(structured), wait)
}

/// Bytes held by the server's answers now.
pub fn held() -> usize {
    ANSWERS.held()
}

/// What the answer made of the structured result `structured` costs at its peak, from its
/// serialized size `s` (counted, not made): the result itself (at most `s`), its text block
/// (`s`), and the serialized response (`s` again for `structuredContent`, the text escaped once
/// more: `s` plus a byte for each quote and backslash in it), while either is being written;
/// for a read image, its base64 string twice more (the image block, and that block serialized);
/// and the envelope.
pub fn estimate(structured: &Value) -> usize {
    let mut count = Count::default();
    if serde_json::to_writer(&mut count, structured).is_err() {
        return usize::MAX;
    }
    let image = read_image(structured).map_or(0, |(_, data)| data.len());
    count.bytes.saturating_mul(4).saturating_add(count.escapable).saturating_add(image.saturating_mul(2)).saturating_add(4096)
}

/// A read image in a tool's structured result (`mime_type` image/*, beside `content_base64`):
/// its MIME type and base64 data. Its answer carries it once more as an `image` block (the
/// tools' `success`), which [`estimate`] counts.
pub fn read_image(structured: &Value) -> Option<(&str, &str)> {
    let mime = structured.get("mime_type").and_then(Value::as_str).filter(|m| m.starts_with("image/"))?;
    Some((mime, structured.get("content_base64").and_then(Value::as_str)?))
}

/// A writer that only counts: bytes, and the quotes and backslashes among them.
#[derive(Default)]
struct Count {
    bytes: usize,
    escapable: usize,
}

impl io::Write for Count {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.bytes += buf.len();
        self.escapable += buf.iter().filter(|b| matches!(b, b'"' | b'\\')).count();
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const MIB: usize = 1 << 20;

    fn budget(total: usize, per_client: usize) -> &'static Budget {
        Box::leak(Box::new(Budget::new(total, per_client)))
    }

    #[test]
    fn small_answers_take_nothing() {
        let b = budget(4 * MIB, 2 * MIB);
        let charges: Vec<Charge> = (0..100).map(|_| b.take("c", ANSWER_FREE - 1, Duration::ZERO).unwrap()).collect();
        assert_eq!(b.held(), 0);
        drop(charges);
    }

    #[test]
    fn a_client_holds_at_most_its_share_and_others_go_on() {
        let b = budget(8 * MIB, 3 * MIB);
        let first = b.take("greedy", 2 * MIB, Duration::ZERO).unwrap();
        let full = b.take("greedy", 2 * MIB, Duration::ZERO).unwrap_err();
        assert_eq!(full, Full { needed: 2 * MIB, held: 2 * MIB, held_by_client: 2 * MIB, total: 8 * MIB, per_client: 3 * MIB });
        assert!(full.message().contains("hold 2 of 8 MiB now (2 of this client's 3 MiB share)"), "{}", full.message());
        let other = b.take("other", 3 * MIB, Duration::ZERO).unwrap();
        assert_eq!(b.held(), 5 * MIB);
        drop((first, other));
        assert_eq!(b.held(), 0);
    }

    #[test]
    fn an_answer_larger_than_a_share_fits_when_its_client_holds_nothing() {
        let b = budget(8 * MIB, 2 * MIB);
        let big = b.take("c", 5 * MIB, Duration::ZERO).unwrap();
        assert!(b.take("c", 2 * MIB, Duration::ZERO).is_err());
        let alone = b.take("d", 3 * MIB, Duration::ZERO).unwrap();
        assert!(b.take("e", 2 * MIB, Duration::ZERO).is_err(), "the total is reached");
        drop((big, alone));
        let huge = b.take("e", 20 * MIB, Duration::ZERO).unwrap();
        assert!(b.take("f", 2 * MIB, Duration::ZERO).is_err());
        drop(huge);
    }

    /// A charge of `bytes` for `client` taken on a thread of its own, once it waits for room (at
    /// most 30 s); the thread gives the bytes it got.
    fn waiting(b: &'static Budget, client: &'static str, bytes: usize) -> std::thread::JoinHandle<Result<usize, Full>> {
        let waiter = std::thread::spawn(move || b.take(client, bytes, Duration::from_secs(30)).map(|c| c.bytes));
        let deadline = Instant::now() + Duration::from_secs(10);
        // In line, it waits: it joins the line and waits under one hold of the lock.
        while b.held.lock().unwrap().queue.is_empty() {
            assert!(Instant::now() < deadline, "the charge of {bytes} bytes for {client} never waited");
            std::thread::yield_now();
        }
        waiter
    }

    /// Charges take the total's room in the order they began to wait: a large one waiting is not
    /// passed by a later one that fits now (which kept it from ever having its room), while one
    /// held back by its own client's share holds up nobody.
    #[test]
    fn a_waiting_charge_is_not_passed_over() {
        let b = budget(4 * MIB, 4 * MIB);
        let first = b.take("a", 2 * MIB, Duration::ZERO).unwrap();
        let waiter = waiting(b, "w", 3 * MIB);
        assert!(b.take("t", 2 * MIB, Duration::ZERO).is_err(), "a later charge passed the one waiting");
        drop(first);
        assert_eq!(waiter.join().unwrap(), Ok(3 * MIB));
        assert_eq!(b.held(), 0);
        assert!(b.held.lock().unwrap().queue.is_empty());

        let b = budget(8 * MIB, 3 * MIB);
        let own = b.take("w", 2 * MIB, Duration::ZERO).unwrap();
        let waiter = waiting(b, "w", 2 * MIB);
        let other = b.take("t", 2 * MIB, Duration::ZERO).expect("a charge held back by its own share holds up nobody");
        drop((own, other));
        assert_eq!(waiter.join().unwrap(), Ok(2 * MIB));
    }

    #[test]
    fn a_waiting_charge_fits_once_another_is_given_back() {
        let b = budget(4 * MIB, 4 * MIB);
        let first = b.take("c", 3 * MIB, Duration::ZERO).unwrap();
        let waiter = waiting(b, "c", 3 * MIB);
        drop(first);
        assert_eq!(waiter.join().unwrap(), Ok(3 * MIB));
        assert_eq!(b.held(), 0);
    }

    /// A charge waits on while others give room back (answers sent one after another under
    /// load), and fails `wait` after the last time any did. With a plain deadline, sixteen large
    /// reads at once on a loaded machine failed after 5 s although the budget kept turning over.
    #[test]
    fn a_charge_waits_on_while_room_is_given_back() {
        let b = budget(4 * MIB, 4 * MIB);
        // Both answers are made already (being sent): only room given back keeps the wait on.
        let mut first = b.take("a", 3 * MIB, Duration::ZERO).unwrap();
        first.shrink_to(3 * MIB);
        let mut turning = b.take("c", MIB, Duration::ZERO).unwrap();
        turning.shrink_to(MIB);
        let wait = Duration::from_millis(300);
        let t0 = Instant::now();
        let waiter = std::thread::spawn(move || b.take("b", 3 * MIB, wait).map(|c| c.bytes));
        // Room is given back every 100 ms for 1.5 s (an answer shrinking as it is sent; a new
        // answer would wait behind the waiting charge).
        let mut left = MIB;
        while t0.elapsed() < Duration::from_millis(1500) {
            left -= MIB / 32;
            turning.shrink_to(left);
            std::thread::sleep(Duration::from_millis(100));
        }
        drop(first);
        assert_eq!(waiter.join().unwrap(), Ok(3 * MIB), "it waited on");
        assert!(t0.elapsed() >= Duration::from_millis(1500));
        // Nothing given back, and no answer being made (this one is being sent): it fails
        // `wait` later.
        let mut held = b.take("a", 3 * MIB, Duration::ZERO).unwrap();
        held.shrink_to(3 * MIB);
        let t1 = Instant::now();
        assert!(b.take("b", 3 * MIB, wait).is_err());
        assert!(t1.elapsed() < Duration::from_millis(1200), "{:?}", t1.elapsed());
        drop((held, turning));
    }

    /// A charge waits on while another answer is being made, however long that takes (it gives
    /// room back once sent): under load, sixteen large reads at once had some fail after 5 s
    /// while the answers ahead of them were still being made.
    #[test]
    fn a_charge_waits_on_while_an_answer_is_being_made() {
        let b = budget(4 * MIB, 4 * MIB);
        let being_made = b.take("a", 3 * MIB, Duration::ZERO).unwrap();
        let t0 = Instant::now();
        let waiter = std::thread::spawn(move || b.take("b", 3 * MIB, Duration::from_millis(200)).map(|c| c.bytes));
        // Made for 1 s, five times the wait, before it is sent and gives its room back.
        std::thread::sleep(Duration::from_secs(1));
        drop(being_made);
        assert_eq!(waiter.join().unwrap(), Ok(3 * MIB), "it waited on");
        assert!(t0.elapsed() >= Duration::from_secs(1));
        assert_eq!(b.held.lock().unwrap().making, 0);
    }

    /// A refused answer is made again after 1 s, then 2 s, 4 s, … at most 30 s: each try reads
    /// it again (before, every second: a reviewer measured a task's logs read 27.5 MiB/s while
    /// four unread streams kept the budget full).
    #[test]
    fn a_refused_answer_is_tried_again_less_and_less_often() {
        let mut b = Backoff::default();
        assert!(b.due());
        let mut waits = Vec::new();
        for _ in 0..8 {
            let before = Instant::now();
            b.refused();
            assert!(!b.due());
            waits.push((b.at.unwrap() - before).as_secs());
        }
        assert_eq!(waits, vec![1, 2, 4, 8, 16, 30, 30, 30]);
    }

    /// A look tells what a zero-wait charge would meet, without taking anything.
    #[test]
    fn a_look_takes_nothing_and_tells_what_a_charge_would_meet() {
        let b = budget(8 * MIB, 4 * MIB);
        let mut held = b.take("a", 3 * MIB, Duration::ZERO).unwrap();
        let first = b.look("a", 2 * MIB);
        assert_eq!((first.mine, first.fits, first.making), (3 * MIB, false, true), "past a's share, its answer being made");
        assert!(b.look("b", 4 * MIB).fits, "b has room");
        assert_eq!(b.held(), 3 * MIB, "a look takes nothing");
        held.shrink_to(MIB);
        let after = b.look("a", 2 * MIB);
        assert_eq!((after.mine, after.fits, after.making), (MIB, true, false));
        assert_ne!(after.gives, first.gives, "room given back shows");
        assert!(b.look("a", 100).fits, "what takes nothing always fits");
    }

    #[test]
    fn a_charge_shrinks_to_what_was_serialized() {
        let b = budget(8 * MIB, 8 * MIB);
        let mut c = b.take("c", 6 * MIB, Duration::ZERO).unwrap();
        c.shrink_to(2 * MIB);
        assert_eq!(b.held(), 2 * MIB);
        c.shrink_to(4 * MIB);
        assert_eq!(b.held(), 2 * MIB, "a charge never grows");
        drop(c);
        assert_eq!(b.held(), 0);
    }

    /// The estimate covers what serializing the answer really makes: the text block and the
    /// whole response; for a read image, its block too (it was 17% short of a read image's).
    #[test]
    fn the_estimate_covers_the_answer_it_becomes() {
        let data = "QUJD".repeat(100_000);
        let image = json!({"path": "i.png", "content_base64": data, "mime_type": "image/png", "size": 300_000});
        let text = image.to_string();
        let response = json!({"jsonrpc": "2.0", "id": 1, "result": {
            "content": [{"type": "text", "text": text}, {"type": "image", "data": data, "mimeType": "image/png"}],
            "structuredContent": image, "isError": false}});
        let made = data.len() + text.len() + data.len() + response.to_string().len();
        assert!(estimate(&image) >= made, "estimate {} < {made}", estimate(&image));
        for content in ["\u{1}".repeat(100_000), "\"\\".repeat(50_000), "plain text ".repeat(10_000)] {
            let structured = json!({"path": "f", "content": content, "size": 100_000});
            let text = structured.to_string();
            let response = json!({"jsonrpc": "2.0", "id": 1, "result": {
                "content": [{"type": "text", "text": text}], "structuredContent": structured, "isError": false}});
            let made = content.len() + text.len() + response.to_string().len();
            let estimate = estimate(&structured);
            assert!(estimate >= made, "estimate {estimate} < {made}");
            assert!(estimate <= 2 * made, "estimate {estimate} far above {made}");
        }
    }
}
