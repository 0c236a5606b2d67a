//! The lease store as the rest of the crate sees it: take, keep and give back the lease of a
//! key, each acquisition numbered by a fence. No SQL here: `postgres` implements it on a table,
//! `memory_store` (tests only) in memory; `contract` holds them to the same rules.
//!
//! # What a fence is for
//!
//! A lease can run out while its holder is paused (a GC pause, a stalled network), and the holder
//! cannot tell. So the resource a lease protects must check the fence: a holder whose fence is
//! lower than one it has already seen is stale (Kleppmann, "How to do distributed locking",
//! 2016). The same number makes every statement here safe to see applied late: renew and release
//! name the fence they act for, and a fence names one acquisition for ever.

use std::future::Future;
use std::num::NonZeroU32;

use crate::cluster::error::LeaseError;

/// A fence: the lease row's counter, incremented by every acquisition, never reset.
pub(crate) type Fence = u64;

pub(crate) use crate::cluster::limits::MAX_KEY_BYTES;

/// Refuses a key longer than [`MAX_KEY_BYTES`], as every store does before it touches its table.
pub(crate) fn check_key(key: &str) -> Result<(), LeaseError> {
    if key.len() > MAX_KEY_BYTES {
        return Err(LeaseError::KeyTooLong { bytes: key.len() });
    }
    Ok(())
}

/// Leases on string keys, held by one owner per store.
///
/// The lease's length (and the heartbeat that renews it) belong to the store, fixed and checked
/// once when it is made, not passed per call: a length per call would skip the check that the
/// heartbeat can keep it.
///
/// A lease ends by [`release`](LeaseStore::release) or by running out. A release is announced
/// on every store's [`LeaseNotices`](crate::cluster::locking::notices::LeaseNotices) if an `acquire` was refused
/// the key while the lease was held (a store may announce other releases too); a lease that
/// runs out is not announced, so a waiter must also retry when the holder's lease would run
/// out.
///
/// # Errors
///
/// Every call can fail with a [`LeaseError`]. After a lost connection or a timeout the
/// statement may still have been applied; the calls are written so that repeating one is safe:
/// an `acquire` that took the lease unseen is taken again by the next `acquire` of ours, with
/// a new fence; a `renew` or `release` with an outdated fence changes nothing.
pub(crate) trait LeaseStore: Send + Sync + 'static {
    /// Takes the lease of `key` if it is free, expired, or already ours (an earlier acquire
    /// whose reply was lost): `Some(new fence)` if taken, `None` if someone else holds it (and
    /// then its release will be announced).
    fn acquire(&self, key: &str) -> impl Future<Output = Result<Option<Fence>, LeaseError>> + Send;

    /// Takes the lease of `key` as [`acquire`](LeaseStore::acquire) does, unless another
    /// process waits for it: refused (`None`) if the key is held by another owner, or if an
    /// acquisition was refused the key (it is wanted) and its last lease ended less than one
    /// lease length ago, or has not ended. A waiter that was refused asks again within its
    /// poll interval, shorter than a lease, so a waiter that is alive finds the key before a
    /// try can take it; a mark older than that is a waiter that went away. A refusal changes
    /// nothing: a try does not wait, so its release need not be announced.
    fn try_acquire(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<Option<Fence>, LeaseError>> + Send;

    /// Extends our live lease by the store's lease length from now, and says whether another
    /// request waits for the key (it was refused the key since we took it: the row is
    /// `wanted`); [`Renewal::Lost`] when the lease is no longer ours or has already run out
    /// (stop using the resource).
    fn renew(
        &self,
        key: &str,
        fence: Fence,
    ) -> impl Future<Output = Result<Renewal, LeaseError>> + Send;

    /// Ends our lease (the row and its fence stay) and notifies every store's listener; `false`
    /// if someone else took it after ours ran out. A lease that ran out untaken is still ours
    /// to release: nobody held the key in between.
    fn release(
        &self,
        key: &str,
        fence: Fence,
    ) -> impl Future<Output = Result<bool, LeaseError>> + Send;

    /// Takes a *part lease* of `permits` of `key`'s permits, beside the other part leases of
    /// the key: refused (`None`) while another owner's whole lease is live, while the live
    /// part leases would then hold more than the table's capacity, or while a larger request
    /// waits (its refusal is recorded less than a lease ago and no request at least as large
    /// was granted since). A refusal records this request as waiting, so that its release is
    /// announced and smaller requests do not overtake it. `permits` is at least one and below
    /// the capacity (the whole of it is [`acquire`](LeaseStore::acquire)'s); any other count
    /// is refused with [`LeaseError::Permits`].
    ///
    /// Each part lease has a fence of its own, from the key's one counter: a part lease and
    /// a whole lease are never live together, and fences of a key only grow, whatever kind.
    /// Our own whole lease counts as another's here: a process gives it back before it takes
    /// parts of the key.
    fn acquire_part(
        &self,
        key: &str,
        permits: NonZeroU32,
    ) -> impl Future<Output = Result<Option<Fence>, LeaseError>> + Send;

    /// Takes a part lease as [`acquire_part`](LeaseStore::acquire_part) does, unless any
    /// request for the key waits: a refusal of any size recorded less than the refused
    /// store's lease ago (it asks again within its poll interval, shorter than its lease). A
    /// refusal changes nothing.
    fn try_acquire_part(
        &self,
        key: &str,
        permits: NonZeroU32,
    ) -> impl Future<Output = Result<Option<Fence>, LeaseError>> + Send;

    /// Extends our live part lease `fence` by the store's lease length from now, and says
    /// whether a request waits for the key (a refusal's waiting mark lives: a process keeping
    /// the part for its own callers must give it back); [`Renewal::Lost`] when it has run out
    /// or is gone.
    fn renew_part(
        &self,
        key: &str,
        fence: Fence,
    ) -> impl Future<Output = Result<Renewal, LeaseError>> + Send;

    /// Ends our part lease `fence`, announcing the release if the key is wanted; `false` if it
    /// is gone (it ran out and a later acquisition cleared it away).
    fn release_part(
        &self,
        key: &str,
        fence: Fence,
    ) -> impl Future<Output = Result<bool, LeaseError>> + Send;

    /// Takes the whole leases of every key of `keys` (sorted, no duplicates) in one step, or
    /// none: each key is taken as [`acquire`](LeaseStore::acquire) would take it alone, and
    /// only if every one of them can be; the fences in `keys`' order, or `None` if any is
    /// held by another owner or by part leases (then each key is marked as an acquisition's
    /// refusal marks it: wanted, and waited for by a request of the whole capacity). Rows
    /// are locked in key order, as every statement locks them, so sets cannot deadlock.
    fn acquire_all(
        &self,
        keys: &[String],
    ) -> impl Future<Output = Result<Option<Vec<Fence>>, LeaseError>> + Send;

    /// As [`acquire_all`](LeaseStore::acquire_all), on [`try_acquire`](LeaseStore::try_acquire)'s
    /// terms for every key (none waited for); a refusal changes nothing.
    fn try_acquire_all(
        &self,
        keys: &[String],
    ) -> impl Future<Output = Result<Option<Vec<Fence>>, LeaseError>> + Send;

    /// Releases every lease this store's owner holds, whole and part, as
    /// [`release`](LeaseStore::release) does each (used by shutdown); returns the number of
    /// keys it released leases of.
    fn release_all(&self) -> impl Future<Output = Result<u64, LeaseError>> + Send;
}

/// What a [`renew`](LeaseStore::renew) or [`renew_part`](LeaseStore::renew_part) found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// The lease was ours and live, and now runs a lease from the renewal. `wanted`: an
    /// acquisition was refused the key while it was held (the mark a release announces), so a
    /// process keeping the lease for its own callers must give it back at its hand-off bound.
    Renewed { wanted: bool },
    /// The lease is no longer ours, or ran out: it is lost.
    Lost,
}

impl Renewal {
    /// Whether the lease was still ours and is renewed.
    #[cfg(test)]
    pub(crate) fn is_renewed(self) -> bool {
        matches!(self, Renewal::Renewed { .. })
    }
}

/// Refuses a part lease's `permits` unless below `capacity`, as every store does first.
pub(crate) fn check_part(permits: NonZeroU32, capacity: NonZeroU32) -> Result<(), LeaseError> {
    if permits >= capacity {
        return Err(LeaseError::Permits {
            requested: permits.get(),
            capacity: capacity.get(),
        });
    }
    Ok(())
}

/// What the notices of a lease store say, in the order the listener learnt it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LeaseNotice {
    /// The lease of this key was released, by any store (ours included): whoever waits for it
    /// may try to acquire it.
    Released(String),
    /// Notices may have been lost, because the listening connection was lost and made again,
    /// or because the receiver fell too far behind: every waiter must try again, whatever key
    /// it waits for.
    Missed,
}
