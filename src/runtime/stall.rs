//! Stall warnings: a hold that lasts longer than a threshold, and a grant that its future
//! has not picked up after one (the "futurelock" symptom: the key went to a future whose
//! owner stopped polling it, so the key is held by nobody who runs).
//!
//! The owner keeps a [`StallWatch`] only if the builder asked for a warning; otherwise the
//! owner's grant path pays one check of an `Option`. The watch notes every grant with the time
//! it was made ([`Overdue`], pure, time passed in), and a timer task per shard
//! ([`watch_for_stalls`]) asks the owner to look at whatever came due. Each hold and each
//! grant is warned about at most once.

use std::sync::Weak;
use std::time::Duration;

use tokio::time::Instant;
use tracing::warn;

use crate::key::LockKey;
use crate::pure::overdue::Overdue;
use crate::pure::table::{LockTable, WaiterId};
use crate::runtime::pending::{PendingGrants, PendingKey};
use crate::runtime::request::Delivery;
use crate::runtime::shard::Shard;

/// The target of the stall warnings (see `RegistryBuilder::warn_held_longer_than`).
pub(crate) const STALL_TARGET: &str = "keyed_locks::stall";

/// The thresholds a registry warns at; neither is set by default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct StallThresholds {
    pub(crate) held_longer_than: Option<Duration>,
    pub(crate) ungranted_pickup_after: Option<Duration>,
}

impl StallThresholds {
    /// The shortest threshold set, which is also the longest the timer sleeps between checks.
    pub(crate) fn shortest(&self) -> Option<Duration> {
        match (self.held_longer_than, self.ungranted_pickup_after) {
            (Some(held), Some(pickup)) => Some(held.min(pickup)),
            (held, pickup) => held.or(pickup),
        }
    }
}

/// A grant to look at again: which waiter, under which registry-wide token.
#[derive(Debug)]
struct Noted {
    waiter_id: WaiterId,
    fencing_token: u64,
}

/// One shard's grants still to check on.
#[derive(Debug)]
pub(crate) struct StallWatch {
    holds: Option<Overdue<Noted>>,
    pickups: Option<Overdue<(Noted, PendingKey)>>,
    /// The shortest threshold: the longest the timer sleeps.
    shortest: Duration,
}

impl StallWatch {
    /// A watch for the thresholds set; `None` if none is.
    pub(crate) fn new(thresholds: StallThresholds) -> Option<Self> {
        Some(StallWatch {
            holds: thresholds.held_longer_than.map(Overdue::new),
            pickups: thresholds.ungranted_pickup_after.map(Overdue::new),
            shortest: thresholds.shortest()?,
        })
    }

    /// Notes a grant made now, `started` being the time the owner counts from, and about to
    /// be delivered by `delivery`. Out of line: the grant path of a registry without stall
    /// warnings only checks that there is no watch.
    #[cold]
    #[inline(never)]
    pub(crate) fn granted<K: LockKey>(
        &mut self,
        started: Instant,
        waiter_id: WaiterId,
        fencing_token: u64,
        delivery: &Delivery<K>,
    ) {
        let now = started.elapsed();
        // Only a grant written to a pending slot has a future to pick it up; the caller that
        // runs the step takes its own at once.
        let pickup = match delivery {
            Delivery::Pending(pending) if self.pickups.is_some() => Some(*pending),
            _ => None,
        };
        let noted = || Noted {
            waiter_id,
            fencing_token,
        };
        if let Some(holds) = &mut self.holds {
            holds.add(now, noted());
        }
        if let (Some(pickups), Some(pickup)) = (&mut self.pickups, pickup) {
            pickups.add(now, (noted(), pickup));
        }
    }

    /// Warns about every hold and every grant that came due by `now` and is still stalled,
    /// and says how long the timer may sleep before the next check.
    pub(crate) fn check<K: LockKey, D>(
        &mut self,
        now: Duration,
        table: &LockTable<K, D>,
        pending: &PendingGrants,
    ) -> Duration {
        let mut next = self.shortest;
        if let Some(holds) = &mut self.holds {
            while let Some((noted, held_for)) = holds.take_due(now) {
                // Waiter ids are never reused, so a record under this id is this very hold.
                if let Some(key) = table.key_of(noted.waiter_id) {
                    warn!(
                        target: STALL_TARGET,
                        ?key,
                        fencing_token = noted.fencing_token,
                        ?held_for,
                        threshold = ?holds.after(),
                        "key held longer than the threshold"
                    );
                }
            }
            next = next.min(holds.next_due_in(now).unwrap_or(next));
        }
        if let Some(pickups) = &mut self.pickups {
            while let Some(((noted, pickup), waited)) = pickups.take_due(now) {
                if pending.is_unpicked(pickup)
                    && let Some(key) = table.key_of(noted.waiter_id)
                {
                    warn!(
                        target: STALL_TARGET,
                        ?key,
                        fencing_token = noted.fencing_token,
                        granted_for = ?waited,
                        threshold = ?pickups.after(),
                        "key granted but not picked up: is the future that asked for it still polled?"
                    );
                }
            }
            next = next.min(pickups.next_due_in(now).unwrap_or(next));
        }
        next
    }
}

/// The timer of one shard: sleeps until something may be due, then has the owner check.
/// Holds only a weak reference, so it never keeps the registry running; it ends when the
/// registry does.
pub(crate) async fn watch_for_stalls<K: LockKey>(shard: Weak<Shard<K>>, first: Duration) {
    let mut sleep = first;
    loop {
        tokio::time::sleep(sleep).await;
        let Some(next) = shard.upgrade().and_then(|shard| shard.check_stalls()) else {
            return;
        };
        sleep = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sizes `RegistryBuilder`'s docs state: a note per grant for holds, and one with the
    /// pending grant's key for pickups.
    #[test]
    fn a_note_is_32_bytes_and_a_pickup_note_40() {
        assert_eq!(std::mem::size_of::<(Duration, Noted)>(), 32);
        assert_eq!(std::mem::size_of::<(Duration, (Noted, PendingKey))>(), 40);
    }
}
