//! A count of a repeated event that a client can cause at will, logged at the 1st, 2nd, 4th,
//! 8th, … occurrence rather than at each (the log stays small whatever the client does).

use std::sync::atomic::{AtomicUsize, Ordering};

/// How often something happened.
pub struct Tally(AtomicUsize);

impl Tally {
    /// Nothing counted yet.
    pub const fn new() -> Tally {
        Tally(AtomicUsize::new(0))
    }

    /// Counts one more; `Some(count)` when this one should be logged.
    pub fn add(&self) -> Option<usize> {
        let n = self.0.fetch_add(1, Ordering::Relaxed) + 1;
        n.is_power_of_two().then_some(n)
    }
}

impl Default for Tally {
    fn default() -> Tally {
        Tally::new()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn logs_at_powers_of_two() {
        let t = super::Tally::new();
        let logged: Vec<usize> = (0..20).filter_map(|_| t.add()).collect();
        assert_eq!(logged, vec![1, 2, 4, 8, 16]);
    }
}
