//! Statistics of a set of samples: count, median, nearest-rank p99, minimum and maximum.

use serde_json::{json, Value};

/// The statistics of one set of samples (seconds, unless the caller says otherwise).
#[derive(Clone, Copy, Debug)]
pub struct Stats {
    pub n: usize,
    pub median: f64,
    pub p99: f64,
    pub min: f64,
    pub max: f64,
}

impl Stats {
    /// Of the finite samples in `xs`.
    pub fn of(xs: &[f64]) -> Stats {
        let mut v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        if n == 0 {
            return Stats { n, median: f64::NAN, p99: f64::NAN, min: f64::NAN, max: f64::NAN };
        }
        let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        // Nearest rank: with fewer than 100 samples the p99 is the maximum.
        let rank = ((0.99 * n as f64).ceil() as usize).clamp(1, n);
        Stats { n, median, p99: v[rank - 1], min: v[0], max: v[n - 1] }
    }

    pub fn json(&self) -> Value {
        json!({"n": self.n, "median": self.median, "p99": self.p99, "min": self.min, "max": self.max})
    }
}
