//! Random bits without a random-number crate, for owner ids and backoff jitter.
//!
//! std's `RandomState` keys its SipHash with bits from the operating system's generator, drawn
//! once per thread and then stepped for each new `RandomState`; hashing through a new one gives
//! bits that differ between processes and between calls. Neither use needs more: an owner id
//! must not repeat, a jitter must not be in step with another process's.

use std::hash::BuildHasher;
use std::hash::RandomState;

/// 64 bits that no other process, and no other call in this one, is likely to draw.
pub(super) fn random_u64() -> u64 {
    RandomState::new().hash_one(std::time::SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn successive_draws_differ() {
        assert_ne!(random_u64(), random_u64());
    }
}
