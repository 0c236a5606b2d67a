//! The wait before each reconnection attempt: doubling from [`FIRST`] up to [`MAX`], with
//! "equal jitter" (Brooker, "Exponential Backoff And Jitter", AWS Architecture Blog, 2015):
//! half the ceiling for sure, the other half at random, so that processes that lost the server
//! together do not come back in step, and no attempt follows the last one at once.

use std::time::Duration;

use crate::cluster::locking::entropy::random_u64;

/// The ceiling of the first wait.
pub(crate) const FIRST: Duration = Duration::from_millis(100);
/// The highest ceiling: a server back after an outage is found within this.
pub(crate) const MAX: Duration = Duration::from_secs(5);

/// Consecutive failed attempts, which set the next wait's ceiling.
#[derive(Debug, Default)]
pub(crate) struct Backoff {
    failures: u32,
}

impl Backoff {
    /// The wait before the next attempt; each call counts one more failure.
    pub(crate) fn next_delay(&mut self) -> Duration {
        // `FIRST * 2^failures`, capped; the shift stops growing long before it could overflow.
        let ceiling = FIRST.saturating_mul(1 << self.failures.min(16)).min(MAX);
        self.failures = self.failures.saturating_add(1);
        let half = ceiling / 2;
        let half_nanos = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
        half + Duration::from_nanos(random_u64() % half_nanos.saturating_add(1))
    }

    /// Starts again from [`FIRST`], after a connection that lasted.
    pub(crate) fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_from_first_up_to_max_and_never_drop_below_half() {
        let mut backoff = Backoff::default();
        let mut ceiling = FIRST;
        for _ in 0..40 {
            let delay = backoff.next_delay();
            assert!(
                delay >= ceiling / 2 && delay <= ceiling,
                "{delay:?} outside {ceiling:?}"
            );
            ceiling = (ceiling * 2).min(MAX);
        }
        backoff.reset();
        assert!(backoff.next_delay() <= FIRST);
    }
}
