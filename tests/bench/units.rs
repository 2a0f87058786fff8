//! How figures are written in the table: durations, counts, sizes, ratios and rates.

use std::time::Instant;

/// A duration in seconds, in µs, ms or s with three significant digits or so.
pub fn dur(s: f64) -> String {
    if !s.is_finite() {
        return "–".into();
    }
    let us = s * 1e6;
    if us < 100.0 {
        format!("{us:.1} µs")
    } else if us < 1000.0 {
        format!("{us:.0} µs")
    } else if s < 0.1 {
        format!("{:.2} ms", s * 1e3)
    } else if s < 1.0 {
        format!("{:.0} ms", s * 1e3)
    } else {
        format!("{s:.2} s")
    }
}

/// `n` with thousands separators.
pub fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// KiB as MiB.
pub fn mib(kb: u64) -> String {
    format!("{:.1} MiB", kb as f64 / 1024.0)
}

/// A ratio, as "1.23×" or "12×".
pub fn times(r: f64) -> String {
    if !r.is_finite() {
        "–".into()
    } else if r >= 10.0 {
        format!("{r:.0}×")
    } else {
        format!("{r:.2}×")
    }
}

/// A rate in `unit` per second.
pub fn per_s(r: f64, unit: &str) -> String {
    if r >= 100.0 {
        format!("{r:.0} {unit}/s")
    } else {
        format!("{r:.1} {unit}/s")
    }
}

/// Seconds since `d`.
pub fn secs(d: Instant) -> f64 {
    d.elapsed().as_secs_f64()
}
