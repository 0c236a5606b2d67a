//! The per-key locks the `sync` workload compares: threads that block, no async anywhere.
//!
//! Only `interleaved.rs` runs them. Every contender locks `u64` keys from plain threads and
//! hands back a guard that releases on drop.

use std::collections::HashMap;
use std::collections::hash_map;
use std::num::NonZeroUsize;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use keyed_locks::{Execution, KeyGuard, LockRegistry};
use lockable::LockPool;

/// One implementation of per-key locks for threads.
pub trait BlockingContender: Send + Sync + Sized + 'static {
    /// The name in tables.
    const NAME: &'static str;

    /// Holds one key until dropped.
    type Guard<'a>
    where
        Self: 'a;

    /// A fresh, empty instance, made on the runtime `runtime` (for ours: where the registry's
    /// actor runs).
    fn new(runtime: &tokio::runtime::Runtime) -> Self;

    /// Parks the calling thread until `key` is free, then holds it.
    fn lock(&self, key: u64) -> Self::Guard<'_>;

    /// After the last run: entries left in the map, if the implementation exposes a count;
    /// then stops whatever runs in the background.
    fn finish(&self, runtime: &tokio::runtime::Runtime) -> Option<usize>;
}

/// This crate's blocking calls, with `SHARDS` shards, in actor mode if `ACTOR_TASK`.
pub struct OursBlocking<const SHARDS: usize, const ACTOR_TASK: bool>(LockRegistry<u64>);

impl<const SHARDS: usize, const ACTOR_TASK: bool> BlockingContender
    for OursBlocking<SHARDS, ACTOR_TASK>
{
    const NAME: &'static str = match (SHARDS, ACTOR_TASK) {
        (1, false) => "keyed-locks",
        (1, true) => "keyed-locks-actor",
        (8, false) => "keyed-locks-8-shards",
        _ => "keyed-locks-other",
    };
    type Guard<'a> = KeyGuard<u64>;

    fn new(runtime: &tokio::runtime::Runtime) -> Self {
        let _entered = runtime.enter();
        let execution = if ACTOR_TASK {
            Execution::ActorTask
        } else {
            Execution::RunOnCaller
        };
        OursBlocking(
            LockRegistry::builder()
                .shards(NonZeroUsize::new(SHARDS).expect("a registry has a shard"))
                .execution(execution)
                .spawn(),
        )
    }

    fn lock(&self, key: u64) -> Self::Guard<'_> {
        self.0.blocking_lock(key).expect("the registry is open")
    }

    fn finish(&self, runtime: &tokio::runtime::Runtime) -> Option<usize> {
        let stats = runtime
            .block_on(self.0.stats())
            .expect("the registry is open");
        runtime.block_on(self.0.shutdown());
        Some(stats.keys)
    }
}

/// lockable 0.2: `LockPool<K>` and its `blocking_lock`.
pub struct LockablePool(LockPool<u64>);

impl BlockingContender for LockablePool {
    const NAME: &'static str = "lockable";
    type Guard<'a> = <LockPool<u64> as lockable::Lockable<u64, ()>>::Guard<'a>;

    fn new(_runtime: &tokio::runtime::Runtime) -> Self {
        LockablePool(LockPool::new())
    }

    fn lock(&self, key: u64) -> Self::Guard<'_> {
        self.0.blocking_lock(key)
    }

    fn finish(&self, _runtime: &tokio::runtime::Runtime) -> Option<usize> {
        Some(self.0.num_locked())
    }
}

/// What a user writes by hand: `std::sync::Mutex<HashMap<K, (Arc<slot>, count)>>`, a slot
/// being a `Mutex<bool>` ("held") and a `Condvar`, the count (holders and waiters) taken under
/// the map lock and given back by the guard, which removes the entry when it was the last.
/// The slot is a flag and a condvar rather than a `Mutex<()>` because std has no owned guard.
pub struct StdMutexMap {
    map: Mutex<HashMap<u64, (Arc<Slot>, usize)>>,
}

#[derive(Default)]
pub struct Slot {
    held: Mutex<bool>,
    freed: Condvar,
}

/// Holds a key of [`StdMutexMap`].
pub struct StdMutexMapGuard<'a> {
    map: &'a StdMutexMap,
    key: u64,
    slot: Arc<Slot>,
}

impl StdMutexMap {
    fn map(&self) -> MutexGuard<'_, HashMap<u64, (Arc<Slot>, usize)>> {
        // Nothing panics under this lock; a poisoned map is still a consistent map.
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for StdMutexMapGuard<'_> {
    fn drop(&mut self) {
        *self
            .slot
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = false;
        self.slot.freed.notify_one();
        let mut map = self.map.map();
        if let hash_map::Entry::Occupied(mut entry) = map.entry(self.key) {
            entry.get_mut().1 -= 1;
            if entry.get().1 == 0 {
                entry.remove();
            }
        }
    }
}

impl BlockingContender for StdMutexMap {
    const NAME: &'static str = "std-mutex-map";
    type Guard<'a> = StdMutexMapGuard<'a>;

    fn new(_runtime: &tokio::runtime::Runtime) -> Self {
        StdMutexMap {
            map: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self, key: u64) -> Self::Guard<'_> {
        let slot = {
            let mut map = self.map();
            let entry = map.entry(key).or_insert_with(|| (Arc::default(), 0));
            entry.1 += 1;
            Arc::clone(&entry.0)
        };
        let mut held = slot.held.lock().unwrap_or_else(PoisonError::into_inner);
        while *held {
            held = slot
                .freed
                .wait(held)
                .unwrap_or_else(PoisonError::into_inner);
        }
        *held = true;
        drop(held);
        StdMutexMapGuard {
            map: self,
            key,
            slot,
        }
    }

    fn finish(&self, _runtime: &tokio::runtime::Runtime) -> Option<usize> {
        Some(self.map().len())
    }
}

/// Calls `$body` once per blocking contender, with `$c` bound to its type, in table order.
#[macro_export]
macro_rules! for_each_blocking_contender {
    ($c:ident => $body:expr) => {{
        {
            type $c = $crate::blocking_contenders::OursBlocking<1, false>;
            $body
        }
        {
            type $c = $crate::blocking_contenders::OursBlocking<1, true>;
            $body
        }
        {
            type $c = $crate::blocking_contenders::OursBlocking<8, false>;
            $body
        }
        {
            type $c = $crate::blocking_contenders::LockablePool;
            $body
        }
        {
            type $c = $crate::blocking_contenders::StdMutexMap;
            $body
        }
    }};
}
