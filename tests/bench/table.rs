//! The results table: one row per measurement, its verdict against a target, and the Markdown
//! with numbered notes.

use crate::stats::Stats;
use crate::units::dur;
use serde_json::{json, Value};

/// How a row compares with its target.
#[derive(Clone, Copy, PartialEq)]
pub enum Verdict {
    Met,
    Missed,
    Info,
    NotMeasured,
}

impl Verdict {
    pub fn text(self) -> &'static str {
        match self {
            Verdict::Met => "met",
            Verdict::Missed => "**MISSED**",
            Verdict::Info => "",
            Verdict::NotMeasured => "not measured",
        }
    }
}

/// One line of the table.
pub struct Row {
    pub group: &'static str,
    pub what: String,
    pub n: String,
    pub median: String,
    pub p99: String,
    pub rate: String,
    pub vs: String,
    pub ratio: String,
    pub target: String,
    pub verdict: Verdict,
    pub note: Option<String>,
}

impl Row {
    pub fn new(group: &'static str, what: impl Into<String>) -> Row {
        Row {
            group,
            what: what.into(),
            n: String::new(),
            median: String::new(),
            p99: String::new(),
            rate: String::new(),
            vs: String::new(),
            ratio: String::new(),
            target: String::new(),
            verdict: Verdict::Info,
            note: None,
        }
    }

    /// A floor's row: "floor: WHAT" and its latencies.
    pub fn floor(group: &'static str, what: &str, s: &Stats) -> Row {
        Row::new(group, format!("floor: {what}")).lat(s)
    }

    pub fn lat(mut self, s: &Stats) -> Row {
        self.n = s.n.to_string();
        self.median = dur(s.median);
        self.p99 = dur(s.p99);
        self
    }

    /// Latencies with their spread: the median cell reads "median (min–max)".
    pub fn spread(mut self, s: &Stats) -> Row {
        self = self.lat(s);
        self.median = format!("{} ({}–{})", dur(s.median), dur(s.min), dur(s.max));
        self
    }

    pub fn value(mut self, v: impl Into<String>) -> Row {
        self.median = v.into();
        self
    }

    pub fn rate(mut self, r: impl Into<String>) -> Row {
        self.rate = r.into();
        self
    }

    pub fn vs(mut self, v: impl Into<String>) -> Row {
        self.vs = v.into();
        self
    }

    pub fn ratio(mut self, r: impl Into<String>) -> Row {
        self.ratio = r.into();
        self
    }

    pub fn target(mut self, t: impl Into<String>, met: bool) -> Row {
        self.target = t.into();
        self.verdict = if met { Verdict::Met } else { Verdict::Missed };
        self
    }

    pub fn note(mut self, n: impl Into<String>) -> Row {
        self.note = Some(n.into());
        self
    }

    pub fn not_measured(mut self, why: impl Into<String>) -> Row {
        self.verdict = Verdict::NotMeasured;
        self.note = Some(why.into());
        self
    }

    pub fn json(&self) -> Value {
        json!({"group": self.group, "measurement": self.what, "n": self.n, "median": self.median, "p99": self.p99, "rate": self.rate,
            "compared_with": self.vs, "ratio": self.ratio, "target": self.target, "result": self.verdict.text().trim_matches('*'),
            "note": self.note})
    }
}

/// The table as Markdown, the rows' notes numbered below it.
pub fn markdown(rows: &[Row]) -> String {
    let cell = |s: &str| s.replace('|', "\\|");
    let mut out = String::from(
        "| group | measurement | n | median | p99 | rate | compared with (median) | ratio | target | result |\n\
|---|---|--:|--:|--:|--:|---|--:|---|---|\n",
    );
    let mut notes = Vec::new();
    for r in rows {
        let mut verdict = r.verdict.text().to_string();
        if let Some(n) = &r.note {
            let k = match notes.iter().position(|x| x == n) {
                Some(i) => i + 1,
                None => {
                    notes.push(n.clone());
                    notes.len()
                }
            };
            verdict = format!("{verdict} [{k}]").trim().to_string();
        }
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.group,
            cell(&r.what),
            r.n,
            r.median,
            r.p99,
            r.rate,
            cell(&r.vs),
            r.ratio,
            cell(&r.target),
            verdict
        ));
    }
    if !notes.is_empty() {
        out.push('\n');
        for (i, n) in notes.iter().enumerate() {
            out.push_str(&format!("[{}] {}\n", i + 1, n));
        }
    }
    out
}
