//! The shares of HTTP `subscriptions/listen` streams: at most [`MAX_HTTP_SUBSCRIPTIONS`] open
//! at once, and at most [`MAX_HTTP_SUBSCRIPTIONS_PER_CLIENT`] of them one client's, so that one
//! client holding its streams leaves the others room to open theirs.
//!
//! A 2026-07-28 request has no session, and each stream is a connection of its own, so a
//! stream's client is what its request carries: the peer's IP address (not its port) and the
//! `io.modelcontextprotocol/clientInfo` name and version it declares ([`client_key`]). The
//! bearer token is not part of it: one token is configured for every caller, so it tells no one
//! apart. clientInfo is the client's word: a client that declares a new clientInfo for every
//! stream gets a new share each time, and is then told apart from the others of its address by
//! nothing; only the global cap bounds it. Clients on other addresses are told apart by address
//! whatever they declare. Streams are not counted per sandbox: a sandbox id is a capability its
//! holders share, not a client, and a stream may name the tasks of several sandboxes or none.

use crate::limits::{MAX_HTTP_SUBSCRIPTIONS, MAX_HTTP_SUBSCRIPTIONS_PER_CLIENT};
use serde_json::Value;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

/// Characters of a declared clientInfo name or version kept in a client's key (the key lives as
/// long as its streams; a longer declaration is still the same address's client).
const MAX_INFO_CHARS: usize = 128;

/// The client a stream belongs to: its peer's address and its declared clientInfo (name and
/// version, each cut to [`MAX_INFO_CHARS`]; one key for every stream that declares none).
pub fn client_key(peer: Option<IpAddr>, client_info: Option<&Value>) -> String {
    let addr = peer.map_or_else(|| "unknown address".to_string(), |ip| ip.to_string());
    let field = |name: &str| -> String {
        client_info.and_then(|i| i.get(name)).and_then(Value::as_str).map(|s| s.chars().take(MAX_INFO_CHARS).collect()).unwrap_or_default()
    };
    match client_info {
        // Debug-quoted, so that no name and version run into each other.
        Some(_) => format!("{addr} {:?} {:?}", field("name"), field("version")),
        None => format!("{addr} without clientInfo"),
    }
}

/// Why a stream was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Every stream of the server is open.
    Full,
    /// This client already holds its share.
    ClientShare,
}

impl Refused {
    /// The message of the 503 / -32000 answer: which limit was hit and what to do.
    pub fn message(self) -> String {
        match self {
            Refused::Full => format!(
                "server busy: all {MAX_HTTP_SUBSCRIPTIONS} subscriptions/listen streams of this server are open (at most \
{MAX_HTTP_SUBSCRIPTIONS_PER_CLIENT} per client); retry in a few seconds (Retry-After), or poll get_task instead"
            ),
            Refused::ClientShare => format!(
                "server busy: this client already holds {MAX_HTTP_SUBSCRIPTIONS_PER_CLIENT} subscriptions/listen streams, its share \
of the server's {MAX_HTTP_SUBSCRIPTIONS} (a client is its address and its io.modelcontextprotocol/clientInfo); close one, or \
name several tasks in one stream's notifications.taskIds"
            ),
        }
    }
}

#[derive(Default)]
struct Counts {
    total: usize,
    per_client: HashMap<String, usize>,
}

/// The open streams, counted in all and per client.
#[derive(Clone)]
pub struct StreamShares {
    counts: Arc<Mutex<Counts>>,
    max: usize,
    per_client: usize,
}

impl StreamShares {
    /// [`MAX_HTTP_SUBSCRIPTIONS`] in all, [`MAX_HTTP_SUBSCRIPTIONS_PER_CLIENT`] per client.
    pub fn new() -> StreamShares {
        StreamShares::with_limits(MAX_HTTP_SUBSCRIPTIONS, MAX_HTTP_SUBSCRIPTIONS_PER_CLIENT)
    }

    fn with_limits(max: usize, per_client: usize) -> StreamShares {
        StreamShares { counts: Arc::default(), max, per_client }
    }

    fn lock(&self) -> MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place for one more stream of `client`, given back when the [`Slot`] is dropped.
    pub fn take(&self, client: String) -> Result<Slot, Refused> {
        let mut counts = self.lock();
        let held = counts.per_client.get(&client).copied().unwrap_or(0);
        if held >= self.per_client {
            return Err(Refused::ClientShare);
        }
        if counts.total >= self.max {
            return Err(Refused::Full);
        }
        counts.total += 1;
        *counts.per_client.entry(client.clone()).or_insert(0) += 1;
        Ok(Slot { shares: self.clone(), client })
    }

    /// Streams open right now.
    pub fn open(&self) -> usize {
        self.lock().total
    }
}

impl Default for StreamShares {
    fn default() -> StreamShares {
        StreamShares::new()
    }
}

/// One open stream's place; dropping it gives the place back.
pub struct Slot {
    shares: StreamShares,
    client: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = self.shares.lock();
        counts.total = counts.total.saturating_sub(1);
        if let Some(n) = counts.per_client.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                counts.per_client.remove(&self.client);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ip(s: &str) -> Option<IpAddr> {
        s.parse().ok()
    }

    #[test]
    fn a_client_is_its_address_and_declared_client_info() {
        let a = json!({"name": "agent", "version": "1"});
        let key = client_key(ip("127.0.0.1"), Some(&a));
        assert_eq!(key, client_key(ip("127.0.0.1"), Some(&json!({"name": "agent", "version": "1", "title": "x"}))));
        assert_ne!(key, client_key(ip("127.0.0.2"), Some(&a)), "another address");
        assert_ne!(key, client_key(ip("127.0.0.1"), Some(&json!({"name": "agent", "version": "2"}))), "another version");
        assert_ne!(key, client_key(ip("127.0.0.1"), None), "no clientInfo");
        assert_eq!(client_key(ip("::1"), None), client_key(ip("::1"), None));
        // Name and version cannot run into each other.
        assert_ne!(
            client_key(ip("127.0.0.1"), Some(&json!({"name": "a b", "version": "c"}))),
            client_key(ip("127.0.0.1"), Some(&json!({"name": "a", "version": "b c"})))
        );
        assert_ne!(
            client_key(ip("127.0.0.1"), Some(&json!({"name": "a\" \"b", "version": ""}))),
            client_key(ip("127.0.0.1"), Some(&json!({"name": "a", "version": "b"})))
        );
        // A long declaration is cut.
        let long = "x".repeat(10_000);
        assert!(client_key(ip("127.0.0.1"), Some(&json!({"name": long, "version": long}))).len() < 4 * MAX_INFO_CHARS);
    }

    #[test]
    fn one_client_holds_its_share_and_another_still_opens() {
        let shares = StreamShares::with_limits(4, 2);
        let greedy: Vec<Slot> = (0..2).map(|_| shares.take("greedy".into()).unwrap()).collect();
        assert_eq!(shares.take("greedy".into()).err(), Some(Refused::ClientShare));
        let other = shares.take("other".into()).unwrap();
        let third = shares.take("third".into()).unwrap();
        assert_eq!(shares.take("fourth".into()).err(), Some(Refused::Full), "every stream is open");
        assert_eq!(shares.take("greedy".into()).err(), Some(Refused::ClientShare), "its share is named first");
        drop(other);
        assert_eq!(shares.open(), 3);
        let fourth = shares.take("fourth".into()).unwrap();
        drop(greedy);
        assert_eq!(shares.open(), 2);
        let again = shares.take("greedy".into()).unwrap();
        drop((third, fourth, again));
        assert_eq!(shares.open(), 0);
        assert!(shares.lock().per_client.is_empty(), "no client is remembered without streams");
    }

    #[test]
    fn refusals_name_the_limit_and_what_to_do() {
        let full = Refused::Full.message();
        assert!(full.contains(&MAX_HTTP_SUBSCRIPTIONS.to_string()) && full.contains("retry"), "{full}");
        let share = Refused::ClientShare.message();
        assert!(share.contains(&MAX_HTTP_SUBSCRIPTIONS_PER_CLIENT.to_string()) && share.contains("clientInfo"), "{share}");
        assert!(share.contains("close one"), "{share}");
    }
}
