//! [`ClusterLocks`]: the lock path of cluster mode on any lease store. The local registry
//! orders the callers of one process; the process's [`Leases`] hold the key against the
//! others. [`ClusterRegistry`](crate::ClusterRegistry) is this on PostgreSQL; the simulator
//! runs it on the in-memory store, so that both run the same code.

use std::fmt;
use std::future::Future;
use std::num::NonZeroU32;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use crate::cluster::locking::guard::ClusterGuard;
use crate::cluster::locking::lease_store::LeaseStore;
use crate::cluster::locking::leases::{AcquireFailed, Ask, Interest, Lease, Leases, Next, PartUse};
use crate::cluster::locking::multi_guard::ClusterMultiGuard;
use crate::error::{LockError, PermitsError, TryLockError, TryPermitsError};
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
            // At the bound, asking whether another process wants the key: one statement of
            // ours, which a try may wait for.
            Next::AwaitCheck(answered) => {
                answered.await;
                match self.leases.next_for_holder(interest.name()) {
                    Next::Use(lease) => lease,
                    _ => return Err(TryLockError::WouldBlock),
                }
            }
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
                Err(failed) => {
                    warn_try_failed(interest.name(), &failed);
                    return Err(TryLockError::WouldBlock);
                }
            },
        };
        Ok(ClusterGuard::new(local, lease, interest))
    }

    /// As [`ClusterRegistry::acquire`](crate::ClusterRegistry::acquire), which documents it.
    pub(crate) async fn acquire(
        &self,
        key: K,
        permits: u32,
    ) -> Result<ClusterGuard<K>, PermitsError> {
        let Some(part) = self.part_of_capacity(permits)? else {
            return self
                .lock(key)
                .await
                .map_err(|LockError::Closed| PermitsError::Closed);
        };
        let interest = self.leases.register(&key.to_string());
        let local = self.local.acquire(key, permits).await?;
        let lease = self
            .part_lease_for(&interest, part)
            .await
            .map_err(|LockError::Closed| PermitsError::Closed)?;
        Ok(ClusterGuard::with_part(local, lease, interest))
    }

    /// As [`ClusterRegistry::try_acquire`](crate::ClusterRegistry::try_acquire), which
    /// documents it.
    pub(crate) async fn try_acquire(
        &self,
        key: K,
        permits: u32,
    ) -> Result<ClusterGuard<K>, TryPermitsError> {
        let part = self
            .part_of_capacity(permits)
            .map_err(|error| match error {
                PermitsError::OutOfRange {
                    requested,
                    capacity,
                } => TryPermitsError::OutOfRange {
                    requested,
                    capacity,
                },
                PermitsError::Closed => TryPermitsError::Closed,
            })?;
        let Some(part) = part else {
            return self.try_lock(key).await.map_err(|error| match error {
                TryLockError::WouldBlock => TryPermitsError::WouldBlock,
                TryLockError::Closed => TryPermitsError::Closed,
            });
        };
        let interest = self.leases.register(&key.to_string());
        let local = self.local.try_acquire(key, permits).await?;
        match self.leases.next_for_part_holder(interest.name(), part) {
            // A part of this size the process keeps: no statement.
            Next::Use(part) => return Ok(ClusterGuard::with_part(local, part, interest)),
            // The process's idle whole lease, or parts of it that must go back, are on their
            // way back (the store refuses parts beside a whole lease); until their releases
            // land the key is held, and a try does not wait for that.
            Next::Acquire {
                after_release: Some(_),
            } => return Err(TryPermitsError::WouldBlock),
            Next::Acquire {
                after_release: None,
            }
            | Next::AwaitCheck(_) => {}
        }
        match self
            .leases
            .acquire_part(interest.name(), part, Ask::Try)
            .await
        {
            Ok(Some(lease)) => Ok(ClusterGuard::with_part(local, lease, interest)),
            Ok(None) => Err(TryPermitsError::WouldBlock),
            Err(failed) => {
                warn_try_failed(interest.name(), &failed);
                Err(TryPermitsError::WouldBlock)
            }
        }
    }

    /// `permits` as a part lease takes them: `None` for all of them (a whole lease), or
    /// out of range as the local registry says.
    fn part_of_capacity(&self, permits: u32) -> Result<Option<NonZeroU32>, PermitsError> {
        let capacity = self.local.capacity();
        match NonZeroU32::new(permits) {
            Some(part) if part < capacity => Ok(Some(part)),
            Some(all) if all == capacity => Ok(None),
            _ => Err(PermitsError::OutOfRange {
                requested: permits,
                capacity: capacity.get(),
            }),
        }
    }

    /// Holds the whole lease for the local holder of `interest`'s key.
    async fn lease_for(&self, interest: &Interest) -> Result<Lease, LockError> {
        let leases = &self.leases;
        self.wait_for_lease(&[interest], || async move {
            if let Some(lease) = kept_lease(|| leases.next_for_holder(interest.name())).await {
                return Ok(Some(lease));
            }
            leases.acquire(interest.name()).await
        })
        .await
    }

    /// Holds a part lease of `permits` for a local holder of `interest`'s key: one the
    /// process keeps, or a new one.
    async fn part_lease_for(
        &self,
        interest: &Interest,
        permits: NonZeroU32,
    ) -> Result<PartUse, LockError> {
        let leases = &self.leases;
        self.wait_for_lease(&[interest], || async move {
            let next = || leases.next_for_part_holder(interest.name(), permits);
            if let Some(part) = kept_lease(next).await {
                return Ok(Some(part));
            }
            leases
                .acquire_part(interest.name(), permits, Ask::Acquire)
                .await
        })
        .await
    }

    /// Makes `attempt`s (each a step toward holding a lease, usually one statement) until one
    /// holds it: after a refusal, when the release of a key of `interests` is announced or a
    /// poll interval has passed; after a failed statement, after a delay that doubles.
    async fn wait_for_lease<T, Attempt>(
        &self,
        interests: &[&Interest],
        mut attempt: impl FnMut() -> Attempt,
    ) -> Result<T, LockError>
    where
        Attempt: Future<Output = Result<Option<T>, AcquireFailed>>,
    {
        let leases = &self.leases;
        let mut retry_delay = FIRST_RETRY_DELAY;
        let name = interests.first().map_or("", |interest| interest.name());
        loop {
            // Listening before asking: a release announced in between is not slept through.
            let mut released: Vec<_> = interests
                .iter()
                .map(|interest| Box::pin(interest.released().notified()))
                .collect();
            for notified in &mut released {
                notified.as_mut().enable();
            }
            let any_released = std::future::poll_fn(|cx| {
                if released
                    .iter_mut()
                    .any(|notified| notified.as_mut().poll(cx).is_ready())
                {
                    std::task::Poll::Ready(())
                } else {
                    std::task::Poll::Pending
                }
            });
            let mut closing = pin!(self.closing.notified());
            closing.as_mut().enable();
            if self.local.is_closed() {
                return Err(LockError::Closed);
            }
            match attempt().await {
                Ok(Some(lease)) => return Ok(lease),
                Ok(None) => {
                    // `biased` here and below: the branches are tried in the order written,
                    // not at random, so that a simulated run repeats exactly.
                    tokio::select! {
                        biased;
                        () = closing => return Err(LockError::Closed),
                        () = any_released => {}
                        () = tokio::time::sleep(leases.poll_interval()) => {}
                    }
                }
                Err(failed) => {
                    tracing::warn!(
                        target: "keyed_locks::cluster",
                        key = %name,
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

    /// As [`ClusterRegistry::lock_all`](crate::ClusterRegistry::lock_all), which documents it.
    pub(crate) async fn lock_all(&self, keys: Vec<K>) -> Result<ClusterMultiGuard<K>, LockError> {
        let names = lease_names(&keys);
        let local = self.local.lock_all(keys).await?;
        // Only now, not while it waits in the local queues: an interest keeps the process's
        // idle lease of a key (for the next local holder), and a set waiting locally for one
        // key would keep the others' leases from every process meanwhile, which can close a
        // cycle of waits across processes.
        let interests: Vec<Interest> = names
            .iter()
            .map(|name| self.leases.register(name))
            .collect();
        if names.is_empty() {
            return Ok(ClusterMultiGuard::new(local, names, Vec::new(), interests));
        }
        let leases = &self.leases;
        let waiting: Vec<&Interest> = interests.iter().collect();
        let held = self
            .wait_for_lease(&waiting, || async {
                // The process's idle leases of these keys go back first: the set's leases are
                // its own, each held by the guard (invariant 8 of `leases`).
                let releases: Vec<_> = names
                    .iter()
                    .flat_map(|name| [leases.give_back_whole(name), leases.give_back_parts(name)])
                    .flatten()
                    .collect();
                for release in releases {
                    let _round_trip = release.await;
                }
                leases.acquire_all(names.clone(), Ask::Acquire).await
            })
            .await?;
        Ok(ClusterMultiGuard::new(local, names, held, interests))
    }

    /// As [`ClusterRegistry::try_lock_all`](crate::ClusterRegistry::try_lock_all), which
    /// documents it.
    pub(crate) async fn try_lock_all(
        &self,
        keys: Vec<K>,
    ) -> Result<ClusterMultiGuard<K>, TryLockError> {
        let names = lease_names(&keys);
        let local = self.local.try_lock_all(keys).await?;
        let interests: Vec<Interest> = names
            .iter()
            .map(|name| self.leases.register(name))
            .collect();
        if names.is_empty() {
            return Ok(ClusterMultiGuard::new(local, names, Vec::new(), interests));
        }
        // A lease of this process on one of the keys, idle or on its way back, is held until
        // its release lands; a try does not wait for that.
        let idle: Vec<_> = names
            .iter()
            .flat_map(|name| {
                [
                    self.leases.give_back_whole(name),
                    self.leases.give_back_parts(name),
                ]
            })
            .flatten()
            .collect();
        if !idle.is_empty() || names.iter().any(|name| self.leases.is_being_released(name)) {
            return Err(TryLockError::WouldBlock);
        }
        match self.leases.acquire_all(names.clone(), Ask::Try).await {
            Ok(Some(held)) => Ok(ClusterMultiGuard::new(local, names, held, interests)),
            Ok(None) => Err(TryLockError::WouldBlock),
            Err(failed) => {
                warn_try_failed(&names.join(", "), &failed);
                Err(TryLockError::WouldBlock)
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

/// A try's statement failed: whether the key is free cannot be known now, and a try does not
/// wait to find out, so it is refused.
fn warn_try_failed(name: &str, failed: &AcquireFailed) {
    tracing::warn!(
        target: "keyed_locks::cluster",
        key = %name,
        error = %failed.0,
        "could not ask for a lease; the try is refused"
    );
}

/// The lease names of `keys`: their text, sorted, each once (keys that print alike share a
/// lease), in the order every statement locks rows.
fn lease_names<K: fmt::Display>(keys: &[K]) -> Vec<String> {
    let mut names: Vec<String> = keys.iter().map(ToString::to_string).collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// Follows what the leases the process keeps allow its next local holder (`next`, asked again
/// after each wait): a lease to use, or `None` once a new one must be asked for.
///
/// At a round's bound the store is being asked whether another process wants the key; its
/// answer says whether the lease serves another round, so this waits for it. When leases of
/// the key have just gone back (at the bound, or idle ones that the store would count against
/// this request), their release notices wake nobody here: waiting twice the release's round
/// trip before asking again lets a process that heard them get its request in first.
async fn kept_lease<L>(mut next: impl FnMut() -> Next<L>) -> Option<L> {
    loop {
        match next() {
            Next::Use(lease) => return Some(lease),
            Next::AwaitCheck(answered) => answered.await,
            Next::Acquire {
                after_release: None,
            } => return None,
            Next::Acquire {
                after_release: Some(release),
            } => {
                let round_trip = release.await.unwrap_or(Duration::ZERO);
                tokio::time::sleep((2 * round_trip).max(Duration::from_millis(1))).await;
                return None;
            }
        }
    }
}
