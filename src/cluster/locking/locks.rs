//! [`ClusterLocks`]: the lock path of cluster mode on any lease store. The local registry
//! orders the callers of one process; the process's [`Leases`] hold the key against the
//! others. [`ClusterRegistry`](crate::ClusterRegistry) is this on PostgreSQL; the simulator
//! runs it on the in-memory store, so that both run the same code.

use std::fmt;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use crate::cluster::locking::guard::ClusterGuard;
use crate::cluster::locking::lease_store::LeaseStore;
use crate::cluster::locking::leases::{Interest, Lease, Leases, Next};
use crate::error::{LockError, TryLockError};
use crate::key::LockKey;
use crate::registry::LockRegistry;

/// The first wait before asking again after a failed statement; it doubles up to half the
/// lease.
const FIRST_RETRY_DELAY: Duration = Duration::from_millis(10);

/// One process's locks across the cluster: its local registry and its leases on `S`.
pub(crate) struct ClusterLocks<K: LockKey + fmt::Display, S> {
    pub(crate) local: LockRegistry<K>,
    pub(crate) leases: Arc<Leases<S>>,
    /// Woken by [`shutdown`](Self::shutdown), for callers waiting for a lease.
    closing: Arc<Notify>,
}

impl<K: LockKey + fmt::Display, S> Clone for ClusterLocks<K, S> {
    fn clone(&self) -> Self {
        ClusterLocks {
            local: self.local.clone(),
            leases: Arc::clone(&self.leases),
            closing: Arc::clone(&self.closing),
        }
    }
}

impl<K: LockKey + fmt::Display, S: LeaseStore> ClusterLocks<K, S> {
    pub(crate) fn new(local: LockRegistry<K>, leases: Arc<Leases<S>>) -> Self {
        ClusterLocks {
            local,
            leases,
            closing: Arc::new(Notify::new()),
        }
    }

    /// As [`ClusterRegistry::lock`](crate::ClusterRegistry::lock), which documents it.
    pub(crate) async fn lock(&self, key: K) -> Result<ClusterGuard<K>, LockError> {
        let interest = self.leases.register(&key.to_string());
        let local = self.local.lock(key).await?;
        let lease = self.lease_for(&interest).await?;
        Ok(ClusterGuard::new(local, lease, interest))
    }

    /// As [`ClusterRegistry::try_lock`](crate::ClusterRegistry::try_lock), which documents it.
    pub(crate) async fn try_lock(&self, key: K) -> Result<ClusterGuard<K>, TryLockError> {
        let interest = self.leases.register(&key.to_string());
        // Held or waited for in this process: the local registry says so without a statement.
        let local = self.local.try_lock(key).await?;
        let lease = match self.leases.next_for_holder(interest.name()) {
            Next::Use(lease) => lease,
            // Given back at the hand-off bound just now, so that other processes get a turn:
            // they come first.
            Next::Acquire {
                after_release: Some(_),
            } => return Err(TryLockError::WouldBlock),
            // Still held by this process's lease until its release lands.
            Next::Acquire {
                after_release: None,
            } if self.leases.is_being_released(interest.name()) => {
                return Err(TryLockError::WouldBlock);
            }
            Next::Acquire {
                after_release: None,
            } => match self.leases.try_acquire(interest.name()).await {
                Ok(Some(lease)) => lease,
                // Held or waited for by another process.
                Ok(None) => return Err(TryLockError::WouldBlock),
                // Whether it is free cannot be known now; a try does not wait to find out.
                Err(failed) => {
                    tracing::warn!(
                        target: "keyed_locks::cluster",
                        key = %interest.name(),
                        error = %failed.0,
                        "could not ask for a lease; the try is refused"
                    );
                    return Err(TryLockError::WouldBlock);
                }
            },
        };
        Ok(ClusterGuard::new(local, lease, interest))
    }

    /// Holds the lease for the local holder of `interest`'s key.
    async fn lease_for(&self, interest: &Interest) -> Result<Lease, LockError> {
        let leases = &self.leases;
        let mut retry_delay = FIRST_RETRY_DELAY;
        loop {
            // Listening before asking: a release announced in between is not slept through.
            let mut released = pin!(interest.released().notified());
            released.as_mut().enable();
            let mut closing = pin!(self.closing.notified());
            closing.as_mut().enable();
            if self.local.is_closed() {
                return Err(LockError::Closed);
            }
            match leases.next_for_holder(interest.name()) {
                Next::Use(lease) => return Ok(lease),
                Next::Acquire {
                    after_release: None,
                } => {}
                Next::Acquire {
                    after_release: Some(release),
                } => {
                    // The process gave the lease back at its bound. Waiting twice the release's
                    // round trip before asking again lets a process that heard the release
                    // notice get its acquire in first.
                    let round_trip = release.await.unwrap_or(Duration::ZERO);
                    tokio::time::sleep((2 * round_trip).max(Duration::from_millis(1))).await;
                }
            }
            match leases.acquire(interest.name()).await {
                Ok(Some(lease)) => return Ok(lease),
                Ok(None) => {
                    // `biased` here and below: the branches are tried in the order written,
                    // not at random, so that a simulated run repeats exactly.
                    tokio::select! {
                        biased;
                        () = closing => return Err(LockError::Closed),
                        () = released => {}
                        () = tokio::time::sleep(leases.poll_interval()) => {}
                    }
                }
                Err(failed) => {
                    tracing::warn!(
                        target: "keyed_locks::cluster",
                        key = %interest.name(),
                        error = %failed.0,
                        "could not ask for a lease; trying again in {retry_delay:?}"
                    );
                    tokio::select! {
                        biased;
                        () = closing => return Err(LockError::Closed),
                        () = tokio::time::sleep(retry_delay) => {}
                    }
                    retry_delay = (retry_delay * 2).min(leases.lease() / 2);
                }
            }
        }
    }

    /// As [`ClusterRegistry::shutdown`](crate::ClusterRegistry::shutdown), which documents it.
    pub(crate) async fn shutdown(&self) {
        self.local.shutdown().await;
        self.closing.notify_waiters();
        self.leases.release_everything().await;
    }
}
