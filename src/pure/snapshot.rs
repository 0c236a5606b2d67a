//! [`KeySnapshot`], a live view of one key: who holds it, how, since when, and who waits.
//!
//! Plain values with no runtime in them: the pure lock table builds a shard's view
//! (`LockTable::snapshot`, time passed in), and the registry merges its shards' views.

use std::cmp::Ordering;
use std::time::Duration;

/// How long something has lasted, as far as the shard can tell: at least `at_least`, at most
/// `at_most`.
///
/// No clock is read on a lock's way, so grants and arrivals are dated by the shard's time
/// marks: one at its start, one at every snapshot, one every 256 arrivals. The bounds are the
/// marks on either side of the event; a second snapshot tightens them for everything the first
/// one saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct DurationBounds {
    /// It has lasted at least this long.
    pub at_least: Duration,
    /// It has lasted at most this long.
    pub at_most: Duration,
}

/// How a key's permits are held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub enum KeyHold {
    /// Nobody holds the key; it is in the view because someone waits for it (a `lock_all`
    /// waiting for another of its keys).
    NotHeld,
    /// One holder has every permit: an exclusive lock, or `acquire` of the key's capacity.
    Exclusive,
    /// `permits` of the key's `capacity` are held, by shared locks or `acquire`.
    Shared {
        /// Permits held, by all holders together.
        permits: u32,
        /// Permits the key has.
        capacity: u32,
    },
}

/// One holder of a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct HolderSnapshot {
    /// The fencing token its guard shows.
    pub fencing_token: u64,
    /// The permits it holds.
    pub permits: u32,
    /// How long it has held them.
    pub held_for: DurationBounds,
}

/// One key that is held or waited for, as a shard saw it at one instant.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct KeySnapshot<K> {
    /// The key.
    pub key: K,
    /// How its permits are held.
    pub hold: KeyHold,
    /// Its holders, the oldest grant first. A `lock_all` holder is listed under each of its
    /// keys, with the same token.
    pub holders: Vec<HolderSnapshot>,
    /// Acquirers waiting for it (a `lock_all` counts once on each of its keys).
    pub waiters: u32,
    /// The permits the first waiter asks for; `None` with no waiter.
    pub first_waiter_permits: Option<u32>,
    /// How long the first waiter, the oldest (the queue is FIFO), has waited; `None` with no
    /// waiter.
    pub oldest_waited: Option<DurationBounds>,
}

impl<K> KeySnapshot<K> {
    /// The most contended first: more waiters, then held longer (its oldest holder), then
    /// waited for longer. Shards give their keys in an order that refines this one (tokens
    /// and arrivals, which the bounds follow), so a stable sort of their lists by it keeps
    /// each shard's order, and the first `n` of the merge are the first `n` of all keys.
    pub(crate) fn contention_order(&self, other: &Self) -> Ordering {
        let longest_held = |view: &Self| view.holders.first().map(|holder| holder.held_for);
        let descending = |bounds: Option<DurationBounds>| {
            std::cmp::Reverse(bounds.map(|bounds| (bounds.at_most, bounds.at_least)))
        };
        other
            .waiters
            .cmp(&self.waiters)
            .then_with(|| descending(longest_held(self)).cmp(&descending(longest_held(other))))
            .then_with(|| descending(self.oldest_waited).cmp(&descending(other.oldest_waited)))
    }
}

/// The first `limit` of several shards' views, each already in contention order, merged.
pub(crate) fn merge<K>(
    shards: Vec<Vec<KeySnapshot<K>>>,
    limit: Option<usize>,
) -> Vec<KeySnapshot<K>> {
    let mut merged: Vec<KeySnapshot<K>> = shards.into_iter().flatten().collect();
    // Stable: ties keep shard order, then each shard's own.
    merged.sort_by(KeySnapshot::contention_order);
    if let Some(limit) = limit {
        merged.truncate(limit);
    }
    merged
}
