//! The lock registries the benchmarks compare, behind one trait.
//!
//! Shared by `peers.rs` (throughput, criterion) and `memory.rs` (bytes and leftover entries),
//! so that both measure exactly the same code. Every contender locks `u64` keys and hands back
//! a guard that releases on drop.

use std::collections::HashMap;
use std::collections::hash_map;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use lockable::{AsyncLimit, InfallibleUnwrap, Lockable, LockableHashMap};

mod single_owner;
pub use single_owner::{SingleOwner, SingleOwnerOwned};

/// One implementation of per-key async locks.
pub trait Contender: Send + Sync + Sized + 'static {
    /// The name in tables, charts and criterion ids.
    const NAME: &'static str;

    /// Holds one key until dropped.
    type Guard<'a>: Send
    where
        Self: 'a;

    /// A fresh, empty instance. `keys` is the number of distinct keys the workload uses; only
    /// the floor, which has no map, needs it. Must run inside a tokio runtime.
    fn new(keys: usize) -> Self;

    /// Waits for `key`.
    fn lock(&self, key: u64) -> impl Future<Output = Self::Guard<'_>> + Send;

    /// Entries in the map right now, if the implementation exposes a count.
    fn entries(&self) -> impl Future<Output = Option<usize>> + Send;

    /// Stops whatever runs in the background, so that its memory is freed before the next
    /// measurement starts. Nothing to do for the mutex maps.
    fn close(&self) -> impl Future<Output = ()> + Send {
        std::future::ready(())
    }
}

/// This crate as users get it: one shard, steps run by the caller when the shard is idle.
pub type Ours = OursWith<1, false>;

/// This crate in actor mode: every request goes to the registry's actor task
/// (`RegistryBuilder::execution(Execution::ActorTask)`).
pub type OursActorMode = OursWith<1, true>;

/// This crate with `RegistryBuilder::shards(8)`: DashMap's default for these 2-core machines
/// (the next power of two at or above 4x the available parallelism, `default_shard_amount`).
pub type OursSharded = OursWith<8, false>;

/// This crate, built with `SHARDS` shards, in actor mode if `ACTOR_TASK`.
pub struct OursWith<const SHARDS: usize, const ACTOR_TASK: bool>(keyed_locks::LockRegistry<u64>);

impl<const SHARDS: usize, const ACTOR_TASK: bool> Contender for OursWith<SHARDS, ACTOR_TASK> {
    const NAME: &'static str = match (SHARDS, ACTOR_TASK) {
        (1, false) => "keyed-locks",
        (1, true) => "keyed-locks-actor",
        (8, false) => "keyed-locks-8-shards",
        _ => "keyed-locks-other",
    };
    type Guard<'a> = keyed_locks::KeyGuard<u64>;

    fn new(_keys: usize) -> Self {
        let shards = std::num::NonZeroUsize::new(SHARDS).expect("a registry has a shard");
        let execution = if ACTOR_TASK {
            keyed_locks::Execution::ActorTask
        } else {
            keyed_locks::Execution::RunOnCaller
        };
        OursWith(
            keyed_locks::LockRegistry::builder()
                .shards(shards)
                .execution(execution)
                .spawn(),
        )
    }

    async fn lock(&self, key: u64) -> Self::Guard<'_> {
        self.0.lock(key).await.expect("the registry is open")
    }

    async fn entries(&self) -> Option<usize> {
        Some(self.0.stats().await.expect("the registry is open").keys)
    }

    async fn close(&self) {
        self.0.shutdown().await;
    }
}

/// lockable 0.2: `LockableHashMap<K, ()>` with its async API.
pub struct LockablePeer(LockableHashMap<u64, ()>);

impl Contender for LockablePeer {
    const NAME: &'static str = "lockable";
    type Guard<'a> = <LockableHashMap<u64, ()> as Lockable<u64, ()>>::Guard<'a>;

    fn new(_keys: usize) -> Self {
        LockablePeer(LockableHashMap::new())
    }

    async fn lock(&self, key: u64) -> Self::Guard<'_> {
        self.0
            .async_lock(key, AsyncLimit::no_limit())
            .await
            .infallible_unwrap()
    }

    async fn entries(&self) -> Option<usize> {
        Some(self.0.num_entries_or_locked())
    }
}

/// keyed-lock 0.2: `parking_lot::Mutex<HashMap<K, Arc<tokio::sync::Mutex<()>>>>`.
pub struct KeyedLockPeer(keyed_lock::r#async::KeyedLock<u64>);

impl Contender for KeyedLockPeer {
    const NAME: &'static str = "keyed-lock";
    type Guard<'a> = keyed_lock::r#async::Guard<'a, u64>;

    fn new(_keys: usize) -> Self {
        KeyedLockPeer(keyed_lock::r#async::KeyedLock::new())
    }

    async fn lock(&self, key: u64) -> Self::Guard<'_> {
        self.0.lock(key).await
    }

    /// keyed-lock exposes no count (its `registry_len` is test-only); `memory.rs` estimates
    /// it from live allocations instead.
    async fn entries(&self) -> Option<usize> {
        None
    }
}

/// key-mutex 0.1 (feature `tokio`): a `DashMap<K, Arc<tokio::sync::Mutex<()>>>`.
pub struct KeyMutexPeer(key_mutex::tokio::KeyMutex<u64, ()>);

impl Contender for KeyMutexPeer {
    const NAME: &'static str = "key-mutex";
    type Guard<'a> = key_mutex::tokio::OwnedMutexGuard<u64, ()>;

    fn new(_keys: usize) -> Self {
        KeyMutexPeer(key_mutex::tokio::KeyMutex::new())
    }

    async fn lock(&self, key: u64) -> Self::Guard<'_> {
        self.0.lock(key).await
    }

    async fn entries(&self) -> Option<usize> {
        Some(self.0.len())
    }
}

/// The reference-count pattern, `Mutex<HashMap<K, (Arc<tokio::sync::Mutex<()>>, count)>>`, written
/// cancel-safely: the count is taken under the map lock before the first await and given back
/// by a drop guard, so a waiting future that is dropped gives it back too.
pub struct RefCountMap {
    map: Mutex<RefCountEntries>,
}

/// Each key's mutex and reference count: holders plus waiters.
type RefCountEntries = HashMap<u64, (Arc<tokio::sync::Mutex<()>>, usize)>;

/// One unit of a key's reference count in [`RefCountMap`]; dropping it gives the unit back and
/// removes the entry when it was the last.
pub struct RefCount<'a> {
    map: &'a RefCountMap,
    key: u64,
}

impl Drop for RefCount<'_> {
    fn drop(&mut self) {
        let mut map = self.map.map();
        if let hash_map::Entry::Occupied(mut entry) = map.entry(self.key) {
            entry.get_mut().1 -= 1;
            if entry.get().1 == 0 {
                entry.remove();
            }
        }
    }
}

/// The reference-counted map's guard. Fields drop in order: the mutex is unlocked before the count goes.
pub struct RefCountGuard<'a> {
    _held: tokio::sync::OwnedMutexGuard<()>,
    _count: RefCount<'a>,
}

impl RefCountMap {
    fn map(&self) -> MutexGuard<'_, RefCountEntries> {
        // Nothing panics under this lock; a poisoned map is still a consistent map.
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Contender for RefCountMap {
    const NAME: &'static str = "refcount-map";
    type Guard<'a> = RefCountGuard<'a>;

    fn new(_keys: usize) -> Self {
        RefCountMap {
            map: Mutex::new(HashMap::new()),
        }
    }

    async fn lock(&self, key: u64) -> Self::Guard<'_> {
        let mutex = {
            let mut map = self.map();
            let entry = map
                .entry(key)
                .or_insert_with(|| (Arc::new(tokio::sync::Mutex::new(())), 0));
            entry.1 += 1;
            Arc::clone(&entry.0)
        };
        // Armed before the first await: from here on, dropping this future gives the count back.
        let count = RefCount { map: self, key };
        let held = mutex.lock_owned().await;
        RefCountGuard {
            _held: held,
            _count: count,
        }
    }

    async fn entries(&self) -> Option<usize> {
        Some(self.map().len())
    }
}

/// A naive actor, for two comparisons: what the round trip to an actor costs by itself, and
/// what an actor without this crate's pending grants leaves behind. A tokio task owns
/// `HashMap<u64, VecDeque<oneshot::Sender<()>>>` (holder implied, waiters queued); `lock`
/// sends the key with a oneshot and waits, a guard's drop sends an unlock. It skips waiters
/// whose oneshot is already closed, but it cannot know that a waiter gives up *after* its
/// grant was sent: that grant is lost and the key stays held for ever.
pub struct NaiveActor {
    requests: tokio::sync::mpsc::UnboundedSender<NaiveRequest>,
}

enum NaiveRequest {
    Lock(u64, tokio::sync::oneshot::Sender<()>),
    Unlock(u64),
    Entries(tokio::sync::oneshot::Sender<usize>),
    Stop,
}

/// Holds a key of [`NaiveActor`]; dropping it sends the unlock.
pub struct NaiveGuard {
    key: u64,
    requests: tokio::sync::mpsc::UnboundedSender<NaiveRequest>,
}

impl Drop for NaiveGuard {
    fn drop(&mut self) {
        let _ = self.requests.send(NaiveRequest::Unlock(self.key));
    }
}

impl NaiveActor {
    async fn run(mut requests: tokio::sync::mpsc::UnboundedReceiver<NaiveRequest>) {
        let mut waiters: HashMap<
            u64,
            std::collections::VecDeque<tokio::sync::oneshot::Sender<()>>,
        > = HashMap::new();
        let mut batch = Vec::with_capacity(256);
        while requests.recv_many(&mut batch, 256).await > 0 {
            for request in batch.drain(..) {
                match request {
                    NaiveRequest::Lock(key, grant) => match waiters.entry(key) {
                        hash_map::Entry::Occupied(mut queue) => queue.get_mut().push_back(grant),
                        hash_map::Entry::Vacant(vacant) => {
                            if grant.send(()).is_ok() {
                                vacant.insert(std::collections::VecDeque::new());
                            }
                        }
                    },
                    NaiveRequest::Unlock(key) => {
                        if let hash_map::Entry::Occupied(mut queue) = waiters.entry(key) {
                            // The next waiter still listening gets the key; none left: gone.
                            let granted = std::iter::from_fn(|| queue.get_mut().pop_front())
                                .any(|grant| grant.send(()).is_ok());
                            if !granted {
                                queue.remove();
                            }
                        }
                    }
                    NaiveRequest::Entries(reply) => {
                        let _ = reply.send(waiters.len());
                    }
                    NaiveRequest::Stop => return,
                }
            }
        }
    }
}

impl Contender for NaiveActor {
    const NAME: &'static str = "naive-actor";
    type Guard<'a> = NaiveGuard;

    fn new(_keys: usize) -> Self {
        let (requests, receiver) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(NaiveActor::run(receiver));
        NaiveActor { requests }
    }

    async fn lock(&self, key: u64) -> Self::Guard<'_> {
        let (grant, granted) = tokio::sync::oneshot::channel();
        let _ = self.requests.send(NaiveRequest::Lock(key, grant));
        granted.await.expect("the naive actor is running");
        NaiveGuard {
            key,
            requests: self.requests.clone(),
        }
    }

    async fn entries(&self) -> Option<usize> {
        let (reply, count) = tokio::sync::oneshot::channel();
        let _ = self.requests.send(NaiveRequest::Entries(reply));
        count.await.ok()
    }

    async fn close(&self) {
        let _ = self.requests.send(NaiveRequest::Stop);
    }
}

/// The floor: a bare `tokio::sync::Mutex<()>` per key, allocated up front, no map.
pub struct Floor(Vec<tokio::sync::Mutex<()>>);

impl Contender for Floor {
    const NAME: &'static str = "floor";
    type Guard<'a> = tokio::sync::MutexGuard<'a, ()>;

    fn new(keys: usize) -> Self {
        Floor(
            (0..keys.max(1))
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
        )
    }

    async fn lock(&self, key: u64) -> Self::Guard<'_> {
        // The modulo keeps `distinct` in range when criterion repeats it with fresh keys.
        self.0[(key % self.0.len() as u64) as usize].lock().await
    }

    /// No map, nothing to leave behind.
    async fn entries(&self) -> Option<usize> {
        None
    }
}

/// The runtime every benchmark runs on: tokio multi-thread with 2 workers.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Calls `$body` once per contender, with `$c` bound to the contender's type, in table order.
#[macro_export]
macro_rules! for_each_contender {
    ($c:ident => $body:expr) => {
        $crate::for_each_contender!(@each $c => $body;
            Ours, OursActorMode, OursSharded, LockablePeer, KeyedLockPeer, KeyMutexPeer, RefCountMap, NaiveActor, SingleOwner, SingleOwnerOwned, Floor)
    };
    (@each $c:ident => $body:expr; $($contender:ident),*) => {{
        $({
            type $c = $crate::contenders::$contender;
            $body
        })*
    }};
}
