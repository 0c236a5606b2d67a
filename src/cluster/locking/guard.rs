//! [`ClusterGuard`], the proof of holding a key across the cluster.

use std::fmt;

use tokio::sync::watch;

use crate::cluster::locking::lease_store::Fence;
use crate::cluster::locking::leases::{Interest, Lease, PartUse, Validity};
use crate::guard::KeyGuard;
use crate::key::LockKey;

/// Holds one key of a [`ClusterRegistry`](crate::ClusterRegistry), or some of its permits: the
/// local lock and a lease, until dropped.
///
/// A guard of the whole key (`lock`, `lock_all`, or every permit) uses the process's lease of
/// the key; dropping it releases the local lock without awaiting and passes the lease to the
/// next local waiter; with none left, the lease goes back to the table in a task of its own.
/// A guard of part of the key's permits (`lock_shared`, `acquire` of fewer than all) uses a
/// part lease of that many permits, its own while it holds it; dropping it passes the part on
/// to the next local request of its size, or gives it back to the table, in a task of its
/// own.
#[must_use = "if unused the lock is released at once"]
#[clippy::has_significant_drop]
pub struct ClusterGuard<K: LockKey + fmt::Display> {
    fence: Fence,
    fencing_token: u64,
    validity: watch::Receiver<Validity>,
    // Field order is drop order. A part lease is put back first, so that the next local holder
    // of the key's permits, granted when the local lock goes, finds it free. The local lock
    // goes before the interest, so a lease whose last local user leaves is released after
    // the key is free locally.
    /// The part lease this guard uses; `None` for a guard of the process's whole lease.
    part: Option<PartUse>,
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

    /// A guard of part of the key's permits, under a part lease it uses alone.
    pub(crate) fn with_part(local: KeyGuard<K>, part: PartUse, interest: Interest) -> Self {
        ClusterGuard {
            fence: part.lease.fence,
            fencing_token: part.lease.fencing_token,
            validity: part.lease.validity.clone(),
            part: Some(part),
            local,
            interest,
        }
    }

    /// The key this guard holds.
    pub fn key(&self) -> &K {
        self.local.key()
    }

    /// This grant's fencing token: never granted before for the key in any process sharing
    /// the lease table, and for a guard of the whole key strictly greater than every earlier
    /// token of the key.
    ///
    /// The lease's fence (the table's count of acquisitions of the key, whole or part) is in
    /// the high 44 bits and the number of local hand-offs under that lease in the low 20:
    /// `fence << 20 | handoffs`. Both only grow, and a lease is handed off locally fewer than
    /// 2^20 times, so the tokens of whole-key guards increase; they stay below 2^64 for 2^44
    /// (17.6 trillion) acquisitions of one key. Guards of parts of the permits use part
    /// leases, each with a fence of its own, handed off in the same way: holders that share a
    /// key at once have distinct tokens, all above every whole-key token before them, but
    /// not in the order they were granted (a part taken earlier may serve a later reader).
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
        // lease is put back as its field drops.
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
