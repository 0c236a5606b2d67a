//! Random bits without a random-number crate: owner ids, backoff jitter, polling jitter.
//!
//! std's `RandomState` keys its SipHash with bits from the operating system's generator, drawn
//! once per thread and then stepped for each new `RandomState`; hashing through a new one gives
//! bits that differ between processes and between calls. Neither use needs more: an owner id
//! must not repeat, a jitter must not be in step with another process's.

use std::hash::BuildHasher;
use std::hash::RandomState;

/// 64 bits that no other process, and no other call in this one, is likely to draw.
pub(crate) fn random_u64() -> u64 {
    RandomState::new().hash_one(std::time::SystemTime::now())
}

/// A sequence of jitters from one seed: SplitMix64 (Steele, Lea and Flood, "Fast Splittable
/// Pseudorandom Number Generators", OOPSLA 2014), which passes BigCrush and needs one word of
/// state. Seeded from [`random_u64`] in production; a simulation seeds it from its run's seed,
/// so the same seed polls at the same instants.
#[derive(Debug, Clone)]
pub(crate) struct Jitter {
    state: u64,
}

impl Jitter {
    pub(crate) fn from_seed(seed: u64) -> Self {
        Jitter { state: seed }
    }

    pub(crate) fn random() -> Self {
        Jitter::from_seed(random_u64())
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn successive_draws_differ() {
        assert_ne!(random_u64(), random_u64());
    }

    #[test]
    fn one_seed_gives_one_sequence() {
        let draws = |seed| {
            let mut jitter = Jitter::from_seed(seed);
            [jitter.next_u64(), jitter.next_u64(), jitter.next_u64()]
        };
        assert_eq!(draws(7), draws(7));
        assert_ne!(draws(7), draws(8));
        // SplitMix64's published first output for seed 0.
        assert_eq!(draws(0)[0], 0xe220_a839_7b1d_cdaf);
    }
}
