//! The E2B emulator's request counts per call (`GET /_emulator/requests`), summarized per
//! tool: the steady state, its routes, and the calls that made more or fewer requests.

use serde_json::{json, Value};

/// The most common value (the smaller on a tie).
pub fn mode(xs: &[u64]) -> Option<u64> {
    let mut freq: Vec<(u64, usize)> = Vec::new();
    for &x in xs {
        match freq.iter_mut().find(|(v, _)| *v == x) {
            Some(f) => f.1 += 1,
            None => freq.push((x, 1)),
        }
    }
    freq.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    freq.first().map(|f| f.0)
}

/// `routes` of a request-count answer, as (route, count).
pub fn routes(counts: &Value) -> Vec<(String, u64)> {
    counts["routes"].as_object().map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0))).collect()).unwrap_or_default()
}

/// `total` of a request-count answer.
pub fn total(counts: &Value) -> u64 {
    counts["total"].as_u64().unwrap_or(0)
}

/// "`POST /process.Process/Start`" or "2 × `GET /sandboxes/{id}`, `POST …`".
pub fn route_text(routes: &[(String, u64)]) -> String {
    let parts: Vec<String> =
        routes.iter().filter(|(_, n)| *n > 0).map(|(r, n)| if *n == 1 { format!("`{r}`") } else { format!("{n} × `{r}`") }).collect();
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(", ")
    }
}

/// "s" unless `n` is 1.
pub fn plural(n: u64) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// The requests of every call of one tool: the steady state (the most common total, the smaller
/// on a tie), its routes, and what the other calls made on top of it.
pub struct Requests {
    pub calls: usize,
    pub steady: u64,
    pub steady_routes: Vec<(String, u64)>,
    /// Calls that made more than the steady state, and the routes they added.
    pub more: usize,
    pub extra: Vec<(String, u64)>,
    pub fewer: usize,
}

impl Requests {
    /// Of the request counts of every call of one tool.
    pub fn of(counts: &[Value]) -> Requests {
        let steady = mode(&counts.iter().map(total).collect::<Vec<u64>>()).unwrap_or(0);
        let steady_routes = counts.iter().find(|c| total(c) == steady).map(routes).unwrap_or_default();
        let mut extra: Vec<(String, u64)> = Vec::new();
        let (mut more, mut fewer) = (0, 0);
        for c in counts {
            if total(c) < steady {
                fewer += 1;
            }
            if total(c) <= steady {
                continue;
            }
            more += 1;
            for (route, n) in routes(c) {
                let base = steady_routes.iter().find(|(r, _)| *r == route).map(|x| x.1).unwrap_or(0);
                if n > base {
                    match extra.iter_mut().find(|(r, _)| *r == route) {
                        Some(e) => e.1 += n - base,
                        None => extra.push((route, n - base)),
                    }
                }
            }
        }
        Requests { calls: counts.len(), steady, steady_routes, more, extra, fewer }
    }

    pub fn json(&self) -> Value {
        json!({"calls": self.calls, "steady": self.steady, "steady_routes": self.steady_routes, "calls_with_more": self.more,
            "extra_routes": self.extra, "calls_with_fewer": self.fewer})
    }

    /// A sentence about the calls that did not make the steady-state requests.
    pub fn note(&self) -> Option<String> {
        let mut parts = Vec::new();
        if self.more > 0 {
            let renewals = self.extra.iter().all(|(r, _)| r == "POST /sandboxes/{id}/connect");
            parts.push(format!(
                "{} of {} calls made more than {} request{}: {} in all{}",
                self.more,
                self.calls,
                self.steady,
                plural(self.steady),
                route_text(&self.extra),
                if renewals { " (TTL renewals, coalesced to one per 30 s per sandbox)" } else { "" }
            ));
        }
        if self.fewer > 0 {
            parts.push(format!("{} of {} calls made fewer than {}", self.fewer, self.calls, self.steady));
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}
