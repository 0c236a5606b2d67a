//! [`LockFuture`]: the future of [`lock`](LockRegistry::lock),
//! [`lock_shared`](LockRegistry::lock_shared) and [`acquire`](LockRegistry::acquire), the
//! registry's busiest calls, written out rather than as an `async fn`.
//!
//! It keeps the key once, until the guard takes it, and clones it into the request on the
//! first poll: one clone per acquisition. Besides the key it keeps the registry, the permits
//! asked for, the acquisition's observer and the [`GrantStage`]; the shard is found from the
//! key when needed. An `async fn` would keep every argument beside every local that lives
//! across its `.await` (the key again, the handle, the shard). The future lives in the task
//! of whoever awaits it and every poll of that task touches it, so its size is paid in cache
//! misses by a workload of many tasks.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::error::LockError;
use crate::guard::KeyGuard;
use crate::key::LockKey;
use crate::observe::{Acquisition, CallKind};
use crate::pure::table::Permits;
use crate::registry::LockRegistry;
use crate::runtime::request::{Delivery, Request};
use crate::runtime::shard::GrantStage;

/// Waits for `permits` of a key and resolves to the guard. Dropping it at any moment
/// withdraws the request ([`GrantStage::abandon`]).
#[must_use = "futures do nothing unless polled"]
pub(crate) struct LockFuture<'a, K: LockKey> {
    registry: &'a LockRegistry<K>,
    /// The key asked for, until the guard takes it; `None` once the future has resolved.
    key: Option<K>,
    /// How many of the key's permits; `None`: all of them (an exclusive lock).
    permits: Option<Permits>,
    call: CallKind,
    /// Started on the first poll, as the `async fn` did: a future dropped unpolled reports
    /// nothing.
    acquisition: Acquisition,
    stage: GrantStage,
}

impl<'a, K: LockKey> LockFuture<'a, K> {
    pub(crate) fn new(
        registry: &'a LockRegistry<K>,
        key: K,
        permits: Option<Permits>,
        call: CallKind,
    ) -> Self {
        LockFuture {
            registry,
            key: Some(key),
            permits,
            call,
            acquisition: Acquisition::default(),
            stage: GrantStage::new(),
        }
    }
}

// Nothing in the future is pinned: the key is moved out when it resolves, and the rest is
// references, counts and a slot's key.
impl<K: LockKey> Unpin for LockFuture<'_, K> {}

impl<K: LockKey> Future for LockFuture<'_, K> {
    type Output = Result<KeyGuard<K>, LockError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let Some(key) = &this.key else {
            // Polled after it resolved: as a closed registry, rather than a panic.
            return Poll::Ready(Err(LockError::Closed));
        };
        let registry = this.registry;
        let handle = registry.shard_for(key);
        let (permits, call, acquisition) = (this.permits, this.call, &mut this.acquisition);
        let answer = std::task::ready!(this.stage.poll(&handle.shard, cx, || {
            *acquisition =
                Acquisition::start(call, key, permits.map(Permits::get), &registry.histograms);
            Some(Request::Acquire {
                key: key.clone(),
                permits: permits.unwrap_or(Permits(registry.capacity)),
                delivery: Delivery::Caller,
            })
        }));
        let acquisition = std::mem::take(&mut this.acquisition);
        let Some(key) = this.key.take() else {
            // Unreachable: the key was there above, and only this line takes it.
            return Poll::Ready(Err(LockError::Closed));
        };
        Poll::Ready(match answer {
            Ok(granted) => Ok(handle.guard(key, granted, acquisition)),
            // An acquire waits rather than be refused; only a closed shard ends it early.
            Err(_) => {
                acquisition.closed();
                Err(LockError::Closed)
            }
        })
    }
}

impl<K: LockKey> Drop for LockFuture<'_, K> {
    fn drop(&mut self) {
        // A future that resolved has nothing left to withdraw, and no key to find its shard by.
        if let Some(key) = &self.key {
            self.stage.abandon(&self.registry.shard_for(key).shard);
        }
    }
}

impl<K: LockKey> fmt::Debug for LockFuture<'_, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockFuture")
            .field("key", &self.key)
            .field("permits", &self.permits)
            .field("stage", &self.stage)
            .finish_non_exhaustive()
    }
}
