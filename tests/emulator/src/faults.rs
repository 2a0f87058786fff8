//! Test instrumentation of the emulator: faults injected on demand and request counts per route.
//!
//! The wire API is documented in the `emulator` module; this file holds the rules, their
//! matching and consumption, and the counters.

use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Mutex;

/// One injected fault: what it matches and what it does.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    /// Matches requests whose path (without the query) starts with this.
    pub path_prefix: String,
    /// Matches only this method (`GET`, `POST`, ...) when given.
    #[serde(default)]
    pub method: Option<String>,
    /// Answer with this status at once; the request is not carried out.
    #[serde(default)]
    pub status: Option<u16>,
    /// The body of a `status` answer (default `{"code":<status>,"message":"fault injected by the emulator"}`).
    #[serde(default)]
    pub body: Option<Value>,
    /// Carry the request out, send the headers and this many body bytes, then break the response.
    #[serde(default)]
    pub drop_after_bytes: Option<usize>,
    /// Wait this long before handling the request.
    #[serde(default)]
    pub delay_ms: Option<u64>,
    /// How many matching requests the fault applies to (default 1).
    #[serde(default = "one")]
    pub count: u32,
    /// Applies to a matching request only with this probability (0 < chance <= 1), drawn from a
    /// generator seeded with `seed`, so that a run can be replayed; a request the draw spares
    /// goes on to the next matching rule and does not use up `count`. Default: every request.
    #[serde(default)]
    pub chance: Option<f64>,
    /// Seed of this rule's generator (with `chance`; default 0).
    #[serde(default)]
    pub seed: Option<u64>,
}

fn one() -> u32 {
    1
}

impl Fault {
    fn matches(&self, method: &str, path: &str) -> bool {
        path.starts_with(&self.path_prefix) && self.method.as_deref().is_none_or(|m| m.eq_ignore_ascii_case(method))
    }

    fn check(&self) -> Result<(), String> {
        if !self.path_prefix.starts_with('/') {
            return Err(format!("path_prefix {:?} must start with '/'", self.path_prefix));
        }
        if self.status.is_none() && self.drop_after_bytes.is_none() && self.delay_ms.is_none() {
            return Err("a fault needs at least one of status, drop_after_bytes, delay_ms".into());
        }
        if self.status.is_some() && self.drop_after_bytes.is_some() {
            return Err("status and drop_after_bytes exclude each other".into());
        }
        if let Some(s) = self.status {
            if !(200..=599).contains(&s) {
                return Err(format!("status {s} is not between 200 and 599"));
            }
        }
        if self.count == 0 {
            return Err("count must be at least 1".into());
        }
        if self.delay_ms.is_some_and(|d| d > 600_000) {
            return Err("delay_ms must be at most 600000".into());
        }
        if self.chance.is_some_and(|c| !(c > 0.0 && c <= 1.0)) {
            return Err("chance must be above 0 and at most 1".into());
        }
        Ok(())
    }
}

/// Parses the body of `POST /_emulator/faults`: one fault object or an array of them.
pub fn parse_faults(body: &[u8]) -> Result<Vec<Fault>, String> {
    let value: Value = serde_json::from_slice(body).map_err(|e| format!("the body is not JSON: {e}"))?;
    let list = match value {
        Value::Array(items) => items,
        other => vec![other],
    };
    let mut out = Vec::with_capacity(list.len());
    for item in list {
        let fault: Fault = serde_json::from_value(item).map_err(|e| format!("bad fault: {e}"))?;
        fault.check()?;
        out.push(fault);
    }
    Ok(out)
}

/// One active rule and the state of its generator.
struct Rule {
    fault: Fault,
    rng: u64,
}

impl Rule {
    /// Whether this request gets the fault: always without `chance`, else a seeded draw.
    fn draw(&mut self) -> bool {
        let Some(chance) = self.fault.chance else { return true };
        // splitmix64: any seed (0 included) gives a full-period sequence.
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z >> 11) as f64 / (1u64 << 53) as f64) < chance
    }
}

/// The active faults, first match wins.
#[derive(Default)]
pub struct Faults {
    rules: Mutex<Vec<Rule>>,
}

impl Faults {
    /// Appends rules.
    pub fn add(&self, faults: Vec<Fault>) {
        if let Ok(mut rules) = self.rules.lock() {
            rules.extend(faults.into_iter().map(|fault| Rule { rng: fault.seed.unwrap_or(0), fault }));
        }
    }

    /// Removes every rule.
    pub fn clear(&self) {
        if let Ok(mut rules) = self.rules.lock() {
            rules.clear();
        }
    }

    /// The remaining rules as JSON.
    pub fn list(&self) -> Value {
        let rules: Vec<Fault> = self.rules.lock().map(|r| r.iter().map(|rule| rule.fault.clone()).collect()).unwrap_or_default();
        Value::Array(
            rules
                .iter()
                .map(|f| {
                    json!({
                        "path_prefix": f.path_prefix, "method": f.method, "status": f.status, "body": f.body,
                        "drop_after_bytes": f.drop_after_bytes, "delay_ms": f.delay_ms, "count": f.count,
                        "chance": f.chance, "seed": f.seed,
                    })
                })
                .collect(),
        )
    }

    /// Consumes one use of the first rule that matches the request and whose draw (if it has a
    /// `chance`) hits, if any.
    pub fn take(&self, method: &str, path: &str) -> Option<Fault> {
        let mut rules = self.rules.lock().ok()?;
        let i = (0..rules.len()).find(|&i| rules[i].fault.matches(method, path) && rules[i].draw())?;
        let fault = rules[i].fault.clone();
        if rules[i].fault.count <= 1 {
            rules.remove(i);
        } else {
            rules[i].fault.count -= 1;
        }
        Some(fault)
    }
}

/// Requests seen per route since start (or the last reset).
#[derive(Default)]
pub struct RequestCounts {
    counts: Mutex<BTreeMap<String, u64>>,
}

impl RequestCounts {
    /// Counts one request.
    pub fn count(&self, method: &str, path: &str) {
        if let Ok(mut c) = self.counts.lock() {
            *c.entry(route_key(method, path)).or_default() += 1;
        }
    }

    /// `{"total": N, "routes": {"POST /sandboxes/{id}/timeout": n, ...}}`.
    pub fn snapshot(&self) -> Value {
        let counts = self.counts.lock().map(|c| c.clone()).unwrap_or_default();
        let total: u64 = counts.values().sum();
        json!({ "total": total, "routes": counts })
    }

    /// Forgets every count.
    pub fn reset(&self) {
        if let Ok(mut c) = self.counts.lock() {
            c.clear();
        }
    }
}

/// `METHOD /path` with sandbox ids replaced by `{id}`, so that counts add up across sandboxes.
pub fn route_key(method: &str, path: &str) -> String {
    let mut out = String::with_capacity(path.len() + method.len() + 1);
    out.push_str(method);
    out.push(' ');
    let mut after_sandboxes = false;
    for (i, seg) in path.split('/').enumerate() {
        if i > 0 {
            out.push('/');
        }
        if after_sandboxes && !seg.is_empty() {
            out.push_str("{id}");
        } else {
            out.push_str(seg);
        }
        after_sandboxes = seg == "sandboxes";
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_hide_ids() {
        assert_eq!(route_key("POST", "/sandboxes/iabc123/timeout"), "POST /sandboxes/{id}/timeout");
        assert_eq!(route_key("POST", "/v2/sandboxes"), "POST /v2/sandboxes");
        assert_eq!(route_key("POST", "/v2/sandboxes/iabc/connect"), "POST /v2/sandboxes/{id}/connect");
        assert_eq!(route_key("GET", "/files"), "GET /files");
        assert_eq!(route_key("POST", "/process.Process/Start"), "POST /process.Process/Start");
    }

    #[test]
    fn parse_and_consume() {
        let faults = parse_faults(
            br#"[{"path_prefix":"/sandboxes","status":502},{"path_prefix":"/process.Process/Start","drop_after_bytes":10,"count":2}]"#,
        )
        .unwrap();
        let table = Faults::default();
        table.add(faults);
        assert!(table.take("POST", "/files").is_none());
        let f = table.take("POST", "/sandboxes/x/timeout").unwrap();
        assert_eq!(f.status, Some(502));
        assert!(table.take("POST", "/sandboxes/x/timeout").is_none());
        assert_eq!(table.take("POST", "/process.Process/Start").unwrap().drop_after_bytes, Some(10));
        assert_eq!(table.list().as_array().unwrap().len(), 1);
        assert!(table.take("POST", "/process.Process/Start").is_some());
        assert!(table.take("POST", "/process.Process/Start").is_none());
    }

    #[test]
    fn method_filter_and_validation() {
        let table = Faults::default();
        table.add(parse_faults(br#"{"path_prefix":"/files","method":"get","delay_ms":5}"#).unwrap());
        assert!(table.take("POST", "/files").is_none());
        assert_eq!(table.take("GET", "/files").unwrap().delay_ms, Some(5));
        for bad in [
            &br#"{"path_prefix":"files","status":500}"#[..],
            br#"{"path_prefix":"/files"}"#,
            br#"{"path_prefix":"/files","status":99}"#,
            br#"{"path_prefix":"/files","status":500,"drop_after_bytes":1}"#,
            br#"{"path_prefix":"/files","status":500,"count":0}"#,
            br#"{"path_prefix":"/files","status":500,"typo":1}"#,
            br#"{"path_prefix":"/files","status":500,"chance":0}"#,
            br#"{"path_prefix":"/files","status":500,"chance":1.5}"#,
            b"nope",
        ] {
            assert!(parse_faults(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn chance_is_seeded_and_falls_through() {
        let draws = |seed: u64| {
            let table = Faults::default();
            let rules = format!(
                r#"[{{"path_prefix":"/","status":503,"chance":0.3,"seed":{seed},"count":1000}},{{"path_prefix":"/","drop_after_bytes":0,"chance":0.5,"seed":{seed},"count":1000}}]"#
            );
            table.add(parse_faults(rules.as_bytes()).unwrap());
            (0..400).map(|_| table.take("GET", "/x").map(|f| f.status.unwrap_or(0))).collect::<Vec<_>>()
        };
        let a = draws(7);
        assert_eq!(a, draws(7), "the same seed gives the same faults");
        assert_ne!(a, draws(8));
        let statuses = a.iter().filter(|f| **f == Some(503)).count();
        let drops = a.iter().filter(|f| **f == Some(0)).count();
        let spared = a.iter().filter(|f| f.is_none()).count();
        // About 30 % get the first rule, half of the rest the second (which it falls through to).
        assert!(
            (80..160).contains(&statuses) && (100..180).contains(&drops) && (100..180).contains(&spared),
            "{statuses} {drops} {spared}"
        );
    }

    #[test]
    fn counts() {
        let c = RequestCounts::default();
        c.count("POST", "/sandboxes/a/timeout");
        c.count("POST", "/sandboxes/b/timeout");
        c.count("GET", "/health");
        let s = c.snapshot();
        assert_eq!(s["total"], 3);
        assert_eq!(s["routes"]["POST /sandboxes/{id}/timeout"], 2);
        c.reset();
        assert_eq!(c.snapshot()["total"], 0);
    }
}
