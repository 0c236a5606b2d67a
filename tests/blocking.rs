//! The blocking calls share the async calls' queue: threads and tasks on the same keys exclude
//! each other and are granted in arrival order with increasing fencing tokens; a thread that
//! waits when the registry shuts down gets `Closed`; a holder thread that panics releases; and
//! the calls refuse to park a thread that drives async tasks, but not a `spawn_blocking` one.
//! Each in both execution modes, with one shard and with three.

use std::num::NonZeroU32;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use keyed_locks::{
    LockError, LockRegistry, PermitsError, RegistryBuilder, TryLockError, TryPermitsError,
};
use tokio::runtime::Runtime;

use crate::configurations::builders;

/// Generous: only turns a hang into a failure (two cores, shared with the rest of the suite).
const BOUND: Duration = Duration::from_secs(30);
/// The keys threads and tasks contend for.
const KEYS: u32 = 3;
/// Critical sections each thread and each task runs.
const SECTIONS: u32 = 200;
/// Threads, and as many tasks, in the contention test.
const CONTENDERS: u32 = 3;
/// The key held by the test while others queue behind it.
const HELD: u32 = 7;

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

fn spawn_on(runtime: &Runtime, builder: RegistryBuilder<u32>) -> LockRegistry<u32> {
    let _entered = runtime.enter();
    builder.spawn()
}

/// Waits (from a plain thread) until `waiting` callers are queued in `registry`.
fn wait_for_waiters(runtime: &Runtime, registry: &LockRegistry<u32>, waiting: usize) {
    let deadline = Instant::now() + BOUND;
    while runtime.block_on(registry.stats()).expect("open").waiting < waiting {
        assert!(Instant::now() < deadline, "{waiting} waiters never queued");
        thread::sleep(Duration::from_millis(1));
    }
}

/// What the holders of one key saw.
#[derive(Default)]
struct KeyRecord {
    /// Set while someone is inside the key's critical section.
    inside: AtomicBool,
    /// Critical sections that found someone else inside.
    overlaps: AtomicU64,
    /// Incremented as a read and a write apart, so that an overlap can lose an update.
    count: AtomicU64,
    /// The fencing tokens, in the order their holders entered.
    tokens: Mutex<Vec<u64>>,
}

impl KeyRecord {
    /// Enters the critical section, holding the key with `token`; returns the count read.
    fn enter(&self, token: u64) -> u64 {
        if self.inside.swap(true, Ordering::SeqCst) {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        self.tokens.lock().expect("no panic inside").push(token);
        self.count.load(Ordering::SeqCst)
    }

    /// Leaves it, writing the count read on entry plus one.
    fn leave(&self, count: u64) {
        self.count.store(count + 1, Ordering::SeqCst);
        self.inside.store(false, Ordering::SeqCst);
    }
}

/// Threads through the blocking calls and tasks through the async ones, on the same three
/// keys: no two ever inside one key's section, no update lost, and each key's tokens
/// increasing in the order its holders entered.
#[test]
fn threads_and_tasks_on_the_same_keys_exclude_each_other_with_increasing_tokens() {
    for builder in builders::<u32>() {
        let name = format!("{builder:?}");
        let runtime = runtime();
        let registry = spawn_on(&runtime, builder);
        let records: Arc<Vec<KeyRecord>> =
            Arc::new((0..KEYS).map(|_| KeyRecord::default()).collect());
        let tasks: Vec<_> = (0..CONTENDERS)
            .map(|task| {
                let (registry, records) = (registry.clone(), Arc::clone(&records));
                runtime.spawn(async move {
                    for section in 0..SECTIONS {
                        let key = (task + section) % KEYS;
                        let guard = registry.lock(key).await.expect("open");
                        let record = &records[key as usize];
                        let count = record.enter(guard.fencing_token());
                        // Yields inside the section: a thread gets every chance to break in.
                        tokio::task::yield_now().await;
                        record.leave(count);
                        drop(guard);
                    }
                })
            })
            .collect();
        let threads: Vec<_> = (0..CONTENDERS)
            .map(|thread| {
                let (registry, records) = (registry.clone(), Arc::clone(&records));
                thread::spawn(move || {
                    for section in 0..SECTIONS {
                        let key = (thread + section) % KEYS;
                        let guard = registry.blocking_lock(key).expect("open");
                        let record = &records[key as usize];
                        let count = record.enter(guard.fencing_token());
                        thread::yield_now();
                        record.leave(count);
                        drop(guard);
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("no thread panicked");
        }
        runtime.block_on(async {
            for task in tasks {
                tokio::time::timeout(BOUND, task)
                    .await
                    .expect("tasks finish")
                    .expect("no task panicked");
            }
        });
        let sections: u64 = records
            .iter()
            .map(|record| record.count.load(Ordering::SeqCst))
            .sum();
        assert_eq!(
            sections,
            u64::from(2 * CONTENDERS * SECTIONS),
            "{name}: updates lost"
        );
        for (key, record) in records.iter().enumerate() {
            assert_eq!(
                record.overlaps.load(Ordering::SeqCst),
                0,
                "{name}: key {key}"
            );
            let tokens = record.tokens.lock().expect("no panic inside");
            assert!(
                tokens.windows(2).all(|pair| pair[0] < pair[1]),
                "{name}: key {key}'s tokens do not increase: {tokens:?}"
            );
        }
        assert_eq!(runtime.block_on(registry.stats()).expect("open").keys, 0);
    }
}

/// Behind a held key, threads and tasks queue alternately, each once the previous one is
/// queued: they are granted in that order, with increasing tokens.
#[test]
fn threads_and_tasks_queued_on_one_key_are_granted_in_arrival_order() {
    const WAITERS: usize = 6;
    for builder in builders::<u32>() {
        let name = format!("{builder:?}");
        let runtime = runtime();
        let registry = spawn_on(&runtime, builder);
        let held = runtime.block_on(registry.lock(HELD)).expect("open");
        let grants = Arc::new(Mutex::new(Vec::new()));
        let mut threads = Vec::new();
        let mut tasks = Vec::new();
        for waiter in 0..WAITERS {
            let (caller, grants) = (registry.clone(), Arc::clone(&grants));
            if waiter % 2 == 0 {
                threads.push(thread::spawn(move || {
                    let guard = caller.blocking_lock(HELD).expect("open");
                    let token = guard.fencing_token();
                    grants.lock().expect("no panic").push((waiter, token));
                }));
            } else {
                tasks.push(runtime.spawn(async move {
                    let guard = caller.lock(HELD).await.expect("open");
                    let token = guard.fencing_token();
                    grants.lock().expect("no panic").push((waiter, token));
                }));
            }
            wait_for_waiters(&runtime, &registry, waiter + 1);
        }
        drop(held);
        for thread in threads {
            thread.join().expect("no thread panicked");
        }
        runtime.block_on(async {
            for task in tasks {
                tokio::time::timeout(BOUND, task)
                    .await
                    .expect("tasks finish")
                    .expect("no task panicked");
            }
        });
        let grants = grants.lock().expect("no panic");
        let order: Vec<usize> = grants.iter().map(|(waiter, _)| *waiter).collect();
        assert_eq!(order, (0..WAITERS).collect::<Vec<_>>(), "{name}");
        assert!(
            grants.windows(2).all(|pair| pair[0].1 < pair[1].1),
            "{name}: tokens do not increase: {grants:?}"
        );
    }
}

/// One of the blocking calls that wait, made to wait for [`HELD`], its error flattened to
/// `LockError`.
type WaitingCall = fn(&LockRegistry<u32>) -> Result<(), LockError>;

fn waiting_calls() -> [(&'static str, WaitingCall); 4] {
    [
        ("blocking_lock", |registry| {
            registry.blocking_lock(HELD).map(drop)
        }),
        ("blocking_lock_shared", |registry| {
            registry.blocking_lock_shared(HELD).map(drop)
        }),
        ("blocking_acquire", |registry| {
            registry
                .blocking_acquire(HELD, 1)
                .map(drop)
                .map_err(|error| match error {
                    PermitsError::Closed => LockError::Closed,
                    other => panic!("unexpected {other:?}"),
                })
        }),
        ("blocking_lock_all", |registry| {
            registry.blocking_lock_all([HELD, HELD + 1]).map(drop)
        }),
    ]
}

/// Holds `HELD` from the runtime, has a thread `wait` for it, runs `stop` once the thread is
/// queued, and checks that the thread's call answered `Closed` (the holder drops after).
fn waiting_thread_gets_closed_when<S>(
    stop: impl FnOnce(Runtime, &LockRegistry<u32>) -> S,
    builder: RegistryBuilder<u32>,
    call: &str,
    wait: WaitingCall,
) {
    let name = format!("{builder:?}");
    let runtime = runtime();
    let registry = spawn_on(&runtime, builder);
    let held = runtime.block_on(registry.lock(HELD)).expect("open");
    let waiter = thread::spawn({
        let registry = registry.clone();
        move || wait(&registry)
    });
    wait_for_waiters(&runtime, &registry, 1);
    let stopped = stop(runtime, &registry);
    let outcome = waiter
        .join()
        .unwrap_or_else(|_| panic!("the waiter panicked in {name}"));
    drop(held);
    drop(stopped);
    assert_eq!(outcome, Err(LockError::Closed), "{call} in {name}");
}

/// A thread parked in each waiting call when `shutdown` runs gets `Closed`.
#[test]
fn a_thread_waiting_when_the_registry_shuts_down_gets_closed() {
    for (call, wait) in waiting_calls() {
        for builder in builders::<u32>() {
            let shutdown = |runtime: Runtime, registry: &LockRegistry<u32>| {
                runtime.block_on(registry.shutdown());
                runtime
            };
            waiting_thread_gets_closed_when(shutdown, builder, call, wait);
        }
    }
}

/// A thread parked in `blocking_lock` when the registry's runtime shuts down (its actor task
/// dropped) gets `Closed`.
#[test]
fn a_thread_waiting_when_the_runtime_shuts_down_gets_closed() {
    for builder in builders::<u32>() {
        waiting_thread_gets_closed_when(
            |runtime, _| drop(runtime),
            builder,
            "blocking_lock",
            |registry| registry.blocking_lock(HELD).map(drop),
        );
    }
}

/// A thread that panics while holding a key releases it as it unwinds: the thread queued
/// behind it gets the key, and nothing is left behind.
#[test]
fn a_holder_thread_that_panics_releases_to_the_next_waiter() {
    for builder in builders::<u32>() {
        let name = format!("{builder:?}");
        let runtime = runtime();
        let registry = spawn_on(&runtime, builder);
        let (held_tx, held_rx) = mpsc::channel();
        let (fail_tx, fail_rx) = mpsc::channel::<()>();
        let holder = thread::spawn({
            let registry = registry.clone();
            move || {
                let guard = registry.blocking_lock(HELD).expect("open");
                held_tx
                    .send(guard.fencing_token())
                    .expect("the test listens");
                let _ = fail_rx.recv();
                panic!("the work failed while holding the key");
            }
        });
        let holder_token = held_rx.recv().expect("the holder took the key");
        let next = thread::spawn({
            let registry = registry.clone();
            move || {
                registry
                    .blocking_lock(HELD)
                    .map(|guard| guard.fencing_token())
            }
        });
        wait_for_waiters(&runtime, &registry, 1);
        fail_tx.send(()).expect("the holder listens");
        assert!(holder.join().is_err(), "{name}: the holder panicked");
        let next_token = next
            .join()
            .expect("the next waiter did not panic")
            .expect("open");
        assert!(next_token > holder_token, "{name}");
        assert_eq!(
            runtime.block_on(registry.stats()).expect("open").keys,
            0,
            "{name}"
        );
    }
}

/// Every blocking call, each run once on `registry` with [`HELD`] free.
type AnyCall = fn(&LockRegistry<u32>);

fn every_call() -> [(&'static str, &'static str, AnyCall); 8] {
    [
        ("blocking_lock", "lock", |registry| {
            drop(registry.blocking_lock(HELD));
        }),
        ("blocking_lock_shared", "lock_shared", |registry| {
            drop(registry.blocking_lock_shared(HELD));
        }),
        ("blocking_acquire", "acquire", |registry| {
            drop(registry.blocking_acquire(HELD, 1));
        }),
        ("blocking_lock_all", "lock_all", |registry| {
            drop(registry.blocking_lock_all([HELD]));
        }),
        ("blocking_try_lock", "try_lock", |registry| {
            drop(registry.blocking_try_lock(HELD));
        }),
        ("blocking_try_lock_shared", "try_lock_shared", |registry| {
            drop(registry.blocking_try_lock_shared(HELD));
        }),
        ("blocking_try_acquire", "try_acquire", |registry| {
            drop(registry.blocking_try_acquire(HELD, 1));
        }),
        ("blocking_try_lock_all", "try_lock_all", |registry| {
            drop(registry.blocking_try_lock_all([HELD]));
        }),
    ]
}

/// Calls each blocking call on this thread, which drives the test's runtime: each must panic
/// with a message naming it and its async twin, having sent nothing to the registry.
async fn every_call_panics_naming_itself() {
    for builder in builders::<u32>() {
        let registry = builder.spawn();
        for (call, async_call, run) in every_call() {
            let payload = catch_unwind(AssertUnwindSafe(|| run(&registry)))
                .expect_err(&format!("{call} blocked a thread that drives the runtime"));
            let message = payload
                .downcast_ref::<String>()
                .map(String::as_str)
                .unwrap_or_default();
            assert!(
                message.starts_with(&format!(
                    "`LockRegistry::{call}` called from inside an async execution context"
                )) && message.contains(&format!("use `{async_call}(..).await`")),
                "{call} panicked with {message:?}"
            );
        }
        let stats = registry.stats().await.expect("open");
        assert_eq!((stats.keys, stats.grants), (0, 0), "{registry:?}");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn blocking_calls_panic_on_a_current_thread_runtime() {
    every_call_panics_naming_itself().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_calls_panic_on_a_multi_thread_worker() {
    every_call_panics_naming_itself().await;
}

/// The panic reaches the caller as a plain panic, with the message tokio's own
/// `Mutex::blocking_lock` gives the same mistake in spirit: name the call, point to `.await`.
#[tokio::test]
#[should_panic(
    expected = "`LockRegistry::blocking_lock` called from inside an async execution \
                           context: blocking this thread would stall the tasks it runs; use \
                           `lock(..).await` instead"
)]
async fn blocking_lock_inside_a_task_panics() {
    let registry = LockRegistry::spawn();
    let _guard = registry.blocking_lock(1u8);
}

/// Inside `spawn_blocking`, every blocking call works, and `blocking_lock` waits for a key
/// the runtime's own task holds: the runtime keeps running while the thread is parked.
async fn every_call_works_in_spawn_blocking() {
    let capacity = NonZeroU32::new(2).expect("permits above 0");
    for builder in builders::<u32>() {
        let registry = builder.capacity(capacity).spawn();
        let held = registry.lock(HELD).await.expect("open");
        let waiter = tokio::task::spawn_blocking({
            let registry = registry.clone();
            move || {
                let guard = registry.blocking_lock(HELD)?;
                let token = guard.fencing_token();
                drop(guard);
                for (_, _, run) in every_call() {
                    run(&registry);
                }
                assert_eq!(
                    registry.blocking_try_acquire(HELD, 3).map(drop),
                    Err(TryPermitsError::OutOfRange {
                        requested: 3,
                        capacity: 2
                    })
                );
                let shared = registry.blocking_lock_shared(HELD)?;
                assert_eq!(
                    registry.blocking_try_lock(HELD).map(drop),
                    Err(TryLockError::WouldBlock)
                );
                drop(shared);
                Ok::<_, LockError>(token)
            }
        });
        while registry.stats().await.expect("open").waiting == 0 {
            assert!(
                !waiter.is_finished(),
                "the blocking thread ended before it queued"
            );
            tokio::task::yield_now().await;
        }
        let first = held.fencing_token();
        drop(held);
        let token = tokio::time::timeout(BOUND, waiter)
            .await
            .expect("the blocking thread finishes")
            .expect("it did not panic")
            .expect("open");
        assert!(token > first, "{registry:?}");
        assert_eq!(registry.stats().await.expect("open").keys, 0);
    }
}

#[tokio::test(flavor = "current_thread")]
async fn blocking_calls_work_in_spawn_blocking_of_a_current_thread_runtime() {
    every_call_works_in_spawn_blocking().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_calls_work_in_spawn_blocking_of_a_multi_thread_runtime() {
    every_call_works_in_spawn_blocking().await;
}

/// `block_in_place` hands the worker's tasks to another thread, so blocking there is allowed,
/// as it is for tokio's own blocking calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_lock_works_in_block_in_place() {
    for builder in builders::<u32>() {
        let registry = builder.spawn();
        let guard = tokio::task::block_in_place(|| registry.blocking_lock(HELD)).expect("open");
        drop(guard);
        assert_eq!(registry.stats().await.expect("open").keys, 0);
    }
}
