//! The simulator's random choices: one generator per purpose, each seeded from the run's seed,
//! so that a change to one part's draws does not reshuffle the others'.

use std::time::Duration;

use crate::cluster::locking::entropy::Jitter;

/// Random choices drawn from one seed.
#[derive(Debug, Clone)]
pub(super) struct Rng {
    bits: Jitter,
}

impl Rng {
    /// The generator for `purpose` (any distinct number per purpose) in the run of `seed`.
    pub(super) fn new(seed: u64, purpose: u64) -> Self {
        // Two different seeds or purposes start SplitMix64 at different states.
        let mut mixer = Jitter::from_seed(seed ^ purpose.wrapping_mul(0xd1b5_4a32_d192_ed03));
        Rng {
            bits: Jitter::from_seed(mixer.next_u64()),
        }
    }

    pub(super) fn next_u64(&mut self) -> u64 {
        self.bits.next_u64()
    }

    /// A number in `0..n` (`n > 0`).
    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// `true` with probability `per_mille / 1000`.
    pub(super) fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }

    /// A duration in `low..=high`, to the microsecond.
    pub(super) fn between(&mut self, low: Duration, high: Duration) -> Duration {
        let span = u64::try_from((high - low).as_micros()).unwrap_or(u64::MAX);
        low + Duration::from_micros(self.below(span.saturating_add(1)))
    }
}
