//! [`ClusterSnapshot`], the cluster's live view of its keys: the lease table's live rows (who
//! holds each key, under which fence, until when, and whether a request waits for it), and
//! this process's local view beside them.
//!
//! Plain values with no connection in them: the PostgreSQL store reads the rows
//! (`postgres/view.rs`), and the registry puts them beside its local registry's snapshot.

use std::time::Duration;

use crate::cluster::owner::LeaseOwner;
use crate::pure::snapshot::{KeyHold, KeySnapshot};

/// The cluster's keys as the lease table and this process saw them, from
/// [`ClusterRegistry::snapshot`](crate::ClusterRegistry::snapshot).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct ClusterSnapshot<K> {
    /// This registry's owner name, as its rows carry it.
    pub owner: LeaseOwner,
    /// The lease table's live rows, in every process: the keys a request waits for first,
    /// then the keys whose leases run out soonest. One statement read them all, at one
    /// instant of the server's clock.
    pub leases: Vec<LeaseSnapshot>,
    /// This process's keys, as its local registry sees them
    /// ([`LockRegistry::snapshot`](crate::LockRegistry::snapshot)), the most contended
    /// first. Its fencing tokens are the local registry's, not the cluster guards'.
    pub local: Vec<KeySnapshot<K>>,
}

/// One live row of the lease table: a key held by a whole lease or by part leases, or waited
/// for by a request whose mark still counts.
///
/// The key is as the table holds it, its [`Display`](std::fmt::Display) text.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct LeaseSnapshot {
    /// The key's text, as the lease table holds it.
    pub key: String,
    /// How its permits are held: [`KeyHold::Exclusive`] by a whole lease,
    /// [`KeyHold::Shared`] by part leases, [`KeyHold::NotHeld`] if only a request's waiting
    /// mark keeps the row in the view (its holder has just let go).
    pub hold: KeyHold,
    /// The live leases: the whole lease, or each part lease in the order granted.
    pub holders: Vec<LeaseHolder>,
    /// The request that waits for the key, if its mark still counts.
    pub waiting: Option<WaitingRequest>,
    /// Whether a lease of the key is this registry's own.
    pub ours: bool,
}

/// One live lease of a key: the whole lease, or one part lease.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct LeaseHolder {
    /// The owner's name as the row holds it.
    pub owner_name: String,
    /// The owner's host, pid and random part, if its name is in the format of
    /// [`LeaseOwner`] (an owner of an older version of the crate wrote `pid-random`).
    pub owner: Option<LeaseOwner>,
    /// The lease's fence. The fencing tokens of the guards under it are
    /// `fence << 20 | hand-offs` ([`ClusterGuard::fencing_token`](crate::ClusterGuard::fencing_token)).
    pub fence: u64,
    /// The permits it holds: the key's capacity for the whole lease.
    pub permits: u32,
    /// How long until it runs out unless renewed, by the server's clock. The holder's
    /// heartbeat renews it every quarter lease (by default); a lease whose time left keeps
    /// shrinking from one view to the next is not being renewed.
    pub expires_in: Duration,
    /// Whether it is this registry's.
    pub ours: bool,
}

/// A request refused the key that still counts: while it does, no smaller request of any
/// process is granted the key, and its holders hand it back at the end of a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct WaitingRequest {
    /// The permits it asks for (the key's capacity for an exclusive lock), if the row says.
    pub permits: Option<u32>,
    /// How long its mark counts unless it asks again, by the server's clock: a waiter asks
    /// again on each release it hears of, and at least every lease.
    pub expires_in: Duration,
}
