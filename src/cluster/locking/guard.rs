//! [`ClusterGuard`], the proof of holding a key across the cluster.

use std::fmt;

use tokio::sync::watch;

use crate::cluster::locking::lease_store::Fence;
use crate::cluster::locking::leases::{Interest, Lease, OwnedLease, Validity};
use crate::guard::KeyGuard;
use crate::key::LockKey;

/// Holds one key of a [`ClusterRegistry`](crate::ClusterRegistry), or some of its permits: the
/// local lock and a lease, until dropped.
///
/// A guard of the whole key (`lock`, `lock_all`, or every permit) uses the process's lease of
/// the key; dropping it releases the local lock without awaiting and passes the lease to the
/// next local waiter; with none left, the lease goes back to the table in a task of its own.
/// A guard of part of the key's permits (`lock_shared`, `acquire` of fewer than all) holds a
/// lease of its own, which goes back to the table, in a task of its own, when it is dropped.
#[must_use = "if unused the lock is released at once"]
#[clippy::has_significant_drop]
pub struct ClusterGuard<K: LockKey + fmt::Display> {
    fence: Fence,
    fencing_token: u64,
    validity: watch::Receiver<Validity>,
    // Field order is drop order. A part lease goes back first, so that the next local holder
    // of the key's permits, granted when the local lock goes, finds it gone from the table
    // sooner. The local lock goes before the interest, so a whole lease whose last local user
    // leaves is released after the key is free locally.
    /// The guard's own part lease; `None` for a guard of the process's whole lease.
    part: Option<OwnedLease>,
    local: KeyGuard<K>,
    interest: Interest,
}

impl<K: LockKey + fmt::Display> ClusterGuard<K> {
    /// A guard of the whole key, under the process's lease.
    pub(crate) fn new(local: KeyGuard<K>, lease: Lease, interest: Interest) -> Self {
        ClusterGuard {
            fence: lease.fence,
            fencing_token: lease.fencing_token,
            validity: lease.validity,
            part: None,
            local,
            interest,
        }
    }

    /// A guard of part of the key's permits, under its own part lease.
    pub(crate) fn with_part(local: KeyGuard<K>, part: OwnedLease, interest: Interest) -> Self {
        ClusterGuard {
            fence: part.fence,
            fencing_token: part.fencing_token(),
            validity: part.validity.clone(),
            part: Some(part),
            local,
            interest,
        }
    }

    /// The key this guard holds.
    pub fn key(&self) -> &K {
        self.local.key()
    }

    /// This grant's fencing token: strictly greater than every earlier token of the same key,
    /// in any process sharing the lease table.
    ///
    /// The lease's fence (the table's count of acquisitions of the key, whole or part) is in
    /// the high 44 bits and the number of local hand-offs under that lease in the low 20:
    /// `fence << 20 | handoffs`. Both only grow, and a lease is handed off locally fewer than
    /// 2^20 times, so the tokens increase; they stay below 2^64 for 2^44 (17.6 trillion)
    /// acquisitions of one key. A guard of part of the permits has a lease, and so a fence,
    /// of its own (hand-offs 0): holders that share a key at once have distinct tokens, in
    /// the order the table granted them.
    ///
    /// A lease can run out while its holder is paused. Have the resource you protect refuse a
    /// write whose token is lower than the highest it has seen (for a table:
    /// `UPDATE ... SET fence = $token WHERE key = $key AND fence < $token`).
    pub fn fencing_token(&self) -> u64 {
        self.fencing_token
    }

    /// Whether the process has lost this guard's lease: a renewal found it taken, no renewal
    /// was confirmed within a lease (by this process's clock, counted from before the last
    /// confirmed statement), or the registry shut down. Another process may hold the key now;
    /// the resource's fencing check is what keeps this holder's writes out.
    pub fn is_lost(&self) -> bool {
        self.validity.borrow().is_lost()
    }

    /// Completes when the lease is lost (at once if it is already). Use it to stop work that
    /// no longer holds the key, for example in a `select!` beside the work.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping it changes nothing, and a later call sees the same state.
    pub async fn lost(&self) {
        until_lost(self.validity.clone()).await;
    }
}

/// Completes when the lease that `validity` tells of is lost (at once if it is already): a
/// renewal found it gone, or its deadline passed with no renewal confirmed.
pub(crate) async fn until_lost(mut validity: watch::Receiver<Validity>) {
    loop {
        let now = *validity.borrow_and_update();
        if now.is_lost() {
            return;
        }
        tokio::select! {
            // In the order written, not at random: a simulated run repeats exactly.
            biased;
            changed = validity.changed() => {
                // The lease's record is gone, which happens only once it was lost.
                if changed.is_err() {
                    return;
                }
            }
            () = tokio::time::sleep_until(now.until) => {}
        }
    }
}

impl<K: LockKey + fmt::Display> Drop for ClusterGuard<K> {
    fn drop(&mut self) {
        // Before the local lock goes: the next local holder must find the lease free. A part
        // lease goes back as its field drops.
        if self.part.is_none() {
            self.interest.put_back(self.fence);
        }
    }
}

impl<K: LockKey + fmt::Display> fmt::Debug for ClusterGuard<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterGuard")
            .field("key", self.local.key())
            .field("fencing_token", &self.fencing_token)
            .field("lost", &self.is_lost())
            .finish()
    }
}
