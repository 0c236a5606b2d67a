//! What a shard reports to the [`metrics`](https://docs.rs/metrics) facade (feature `metrics`);
//! without the feature, [`ShardMetrics`] is empty and every method does nothing.
//!
//! | name | kind | what |
//! |---|---|---|
//! | `keyed_locks_grants_total` | counter | grants made, to any caller |
//! | `keyed_locks_cancellations_total` | counter | waiters withdrawn from a queue, and grants refused because their waiter had given up (one that gives up after its grant reached it counts as a grant and a release) |
//! | `keyed_locks_would_blocks_total` | counter | try calls refused because the key was taken |
//! | `keyed_locks_keys` | gauge | entries in the lock map |
//! | `keyed_locks_held` | gauge | keys held |
//! | `keyed_locks_waiting` | gauge | callers queued |
//! | `keyed_locks_wait_seconds` | histogram | from a call to its grant |
//! | `keyed_locks_hold_seconds` | histogram | from a grant to the guard's drop |
//!
//! No labels: a label per key would make one series per key, without bound. The gauges go up
//! and down by each shard's changes, so several shards, and several registries in one
//! process, add up. A shard takes its counter and gauge handles when it is built, from the
//! recorder installed at that moment (and so does the registry, for its histograms): install
//! the recorder before building the registry.

#[cfg(feature = "metrics")]
pub(crate) use enabled::*;

#[cfg(not(feature = "metrics"))]
pub(crate) use disabled::*;

/// The metric names, as the crate documents them.
#[cfg(feature = "metrics")]
pub(crate) mod names {
    pub(crate) const GRANTS: &str = "keyed_locks_grants_total";
    pub(crate) const CANCELLATIONS: &str = "keyed_locks_cancellations_total";
    pub(crate) const WOULD_BLOCKS: &str = "keyed_locks_would_blocks_total";
    pub(crate) const KEYS: &str = "keyed_locks_keys";
    pub(crate) const HELD: &str = "keyed_locks_held";
    pub(crate) const WAITING: &str = "keyed_locks_waiting";
    pub(crate) const WAIT_SECONDS: &str = "keyed_locks_wait_seconds";
    pub(crate) const HOLD_SECONDS: &str = "keyed_locks_hold_seconds";
}

#[cfg(feature = "metrics")]
mod enabled {
    use std::time::Duration;

    use metrics::{Counter, Gauge, Histogram, counter, gauge, histogram};

    use super::names;
    use crate::pure::stats::RegistryStats;

    /// One shard's handles, and the counts it last reported to the gauges.
    pub(crate) struct ShardMetrics {
        grants: Counter,
        cancellations: Counter,
        would_blocks: Counter,
        keys: Gauge,
        held: Gauge,
        waiting: Gauge,
        reported: RegistryStats,
    }

    impl ShardMetrics {
        pub(crate) fn new() -> Self {
            ShardMetrics {
                grants: counter!(names::GRANTS),
                cancellations: counter!(names::CANCELLATIONS),
                would_blocks: counter!(names::WOULD_BLOCKS),
                keys: gauge!(names::KEYS),
                held: gauge!(names::HELD),
                waiting: gauge!(names::WAITING),
                reported: RegistryStats::default(),
            }
        }

        #[inline]
        pub(crate) fn grant(&self) {
            self.grants.increment(1);
        }

        #[inline]
        pub(crate) fn cancellation(&self) {
            self.cancellations.increment(1);
        }

        #[inline]
        pub(crate) fn would_block(&self) {
            self.would_blocks.increment(1);
        }

        /// Moves the gauges by what changed since the last report.
        #[inline]
        pub(crate) fn report(&mut self, stats: impl FnOnce() -> RegistryStats) {
            let now = stats();
            let before = std::mem::replace(&mut self.reported, now);
            move_gauge(&self.keys, before.keys, now.keys);
            move_gauge(&self.held, before.held, now.held);
            move_gauge(&self.waiting, before.waiting, now.waiting);
        }

        /// Takes this shard's counts back out of the gauges: the shard has closed.
        pub(crate) fn close(&mut self) {
            self.report(RegistryStats::default);
        }
    }

    fn move_gauge(gauge: &Gauge, before: usize, now: usize) {
        // Counts far below 2^53, so exact as `f64`.
        if now > before {
            gauge.increment((now - before) as f64);
        } else if now < before {
            gauge.decrement((before - now) as f64);
        }
    }

    /// A registry's wait and hold histograms, taken from the recorder once, when the
    /// registry is built: a handle records without looking its series up again.
    #[derive(Clone)]
    pub(crate) struct Histograms {
        wait: Histogram,
        hold: Histogram,
    }

    impl Histograms {
        pub(crate) fn new() -> Self {
            Histograms {
                wait: histogram!(names::WAIT_SECONDS),
                hold: histogram!(names::HOLD_SECONDS),
            }
        }

        pub(crate) fn record_wait(&self, wait: Duration) {
            self.wait.record(wait.as_secs_f64());
        }

        pub(crate) fn record_hold(&self, hold: Duration) {
            self.hold.record(hold.as_secs_f64());
        }
    }

    impl std::fmt::Debug for Histograms {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Histograms").finish_non_exhaustive()
        }
    }
}

#[cfg(not(feature = "metrics"))]
mod disabled {
    use crate::pure::stats::RegistryStats;

    /// Nothing: the `metrics` feature is off.
    #[derive(Debug, Clone)]
    pub(crate) struct Histograms;

    impl Histograms {
        pub(crate) fn new() -> Self {
            Histograms
        }
    }

    /// Nothing: the `metrics` feature is off.
    pub(crate) struct ShardMetrics;

    impl ShardMetrics {
        pub(crate) fn new() -> Self {
            ShardMetrics
        }

        #[inline(always)]
        pub(crate) fn grant(&self) {}

        #[inline(always)]
        pub(crate) fn cancellation(&self) {}

        #[inline(always)]
        pub(crate) fn would_block(&self) {}

        #[inline(always)]
        pub(crate) fn report(&mut self, _stats: impl FnOnce() -> RegistryStats) {}

        pub(crate) fn close(&mut self) {}
    }
}
