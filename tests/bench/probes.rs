//! Probes: timed operations measured round-robin in blocks, so that a drifting machine affects
//! each alike.

use anyhow::Result;

/// One timed operation, in seconds.
pub type Probe<'a> = Box<dyn FnMut() -> Result<f64> + 'a>;

/// Measures the probes round-robin in blocks (after `warm` unrecorded calls each), so that a
/// drifting machine affects each alike.
pub fn interleave(warm: usize, rounds: usize, block: usize, probes: &mut [Probe<'_>]) -> Result<Vec<Vec<f64>>> {
    let mut out = vec![Vec::with_capacity(rounds * block); probes.len()];
    for p in probes.iter_mut() {
        for _ in 0..warm {
            p()?;
        }
    }
    for _ in 0..rounds {
        for (i, p) in probes.iter_mut().enumerate() {
            for _ in 0..block {
                out[i].push(p()?);
            }
        }
    }
    Ok(out)
}
