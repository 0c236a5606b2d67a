//! The lock path over any lease store: how a process takes, keeps, shares among its tasks and
//! gives back the lease of a key, knowing the store only through
//! [`LeaseStore`](lease_store::LeaseStore). No SQL here.
//!
//! - `lease_store`: the interface every store implements
//!   ([`LeaseStore`](lease_store::LeaseStore), [`Fence`](lease_store::Fence),
//!   [`LeaseNotice`](lease_store::LeaseNotice)) and the key-length rule. A new kind of lease
//!   (shared, permits, several keys) is a new call here first, then a statement in `postgres`
//!   and a rule in the store contract and the simulator (`testing`).
//! - `locks`: [`ClusterLocks`](locks::ClusterLocks), a lock call step by step: interest, the
//!   local registry, the lease, the guard.
//! - `leases`: the process's leases and who in the process wants them (lock cohorting, the
//!   heartbeat, the hand-off bound). `lease_note`: what it notes in the journal.
//! - `guard`: [`ClusterGuard`](guard::ClusterGuard), the local guard plus the lease's fence;
//!   `multi_guard`: [`ClusterMultiGuard`](multi_guard::ClusterMultiGuard), the same for a set
//!   of keys.
//! - `notices`: the channel from a store's release announcements to the waiters.
//! - `entropy`: random bits for owner names and jitter, without a dependency.

pub(crate) mod entropy;
pub(crate) mod guard;
pub(crate) mod lease_note;
pub(crate) mod lease_store;
pub(crate) mod leases;
pub(crate) mod locks;
pub(crate) mod multi_guard;
pub(crate) mod notices;
