//! Once `shutdown().await` has returned, every call on the registry gets its `Closed` error,
//! in both execution modes and with shards, while other tasks keep calling: every waiter at
//! the time of the shutdown gets `Closed`, nothing hangs, and guards still out drop quietly.

use std::fmt::Debug;
use std::future::Future;
use std::num::NonZeroU32;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::future::join_all;
use keyed_locks::{
    JournalError, LockError, LockRegistry, PermitsError, TryLockError, TryPermitsError,
};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::time::{sleep, timeout};

use crate::configurations::builders;

/// Generous: only turns a hang into a failure (two cores, shared with the rest of the suite).
const BOUND: Duration = Duration::from_secs(30);
/// Rounds per configuration, each a fresh registry shut down at a random moment.
const ROUNDS: u64 = 30;
/// Tasks calling the registry in each round.
const TASKS: usize = 64;
/// The keys the tasks contend for: few, so that most calls find them held or waited for.
const KEYS: u32 = 4;
/// Permits per key, so that shared locks and permit counts mean something.
const PERMITS: u32 = 2;
/// A key the test holds for the whole round, with one waiter of each kind queued behind it.
const HELD: u32 = 1_000;
/// Calls each task checks after it saw `shutdown` return, at least.
const CHECKS_PER_TASK: usize = 3;
/// Broken calls shown per configuration.
const EXAMPLES: usize = 10;

/// Each configuration, 30 rounds: 64 tasks lock, try, share and take permits of 4 keys, some
/// under timeouts of 0 to 2 ms, and `shutdown` comes after 1 to 20 ms. Every call that the test
/// task or a worker starts after `shutdown().await` returned must get `Closed`, the waiters
/// queued before it too, and every task must finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn calls_after_shutdown_returned_all_get_closed_while_others_keep_calling() {
    let capacity = NonZeroU32::new(PERMITS).expect("permits above 0");
    let mut report = Vec::new();
    for configuration in 0..builders::<u32>().len() {
        let mut name = String::new();
        let mut rounds_broken = 0;
        let mut examples = Vec::new();
        for round in 0..ROUNDS {
            let builder = builders().swap_remove(configuration).capacity(capacity);
            name = format!("{builder:?}");
            // Seeded, so that a failure names the choices it made (the scheduling is not).
            let seed = configuration as u64 * 1_000 + round;
            let broken = one_round(builder.spawn(), seed).await;
            if !broken.is_empty() {
                rounds_broken += 1;
            }
            examples.extend(
                broken
                    .into_iter()
                    .map(|what| format!("  round {round} (seed {seed}): {what}")),
            );
        }
        if rounds_broken > 0 {
            examples.truncate(EXAMPLES);
            report.push(format!(
                "{name}: {rounds_broken} of {ROUNDS} rounds broke the rule, first:\n{}",
                examples.join("\n")
            ));
        }
    }
    assert!(
        report.is_empty(),
        "calls started after `shutdown().await` returned did not all get `Closed`:\n{}",
        report.join("\n")
    );
}

/// Set by the test task, read by every worker before it starts a call.
#[derive(Default)]
struct Flags {
    /// `shutdown().await` has returned: every call started from now on must get `Closed`.
    shutdown_returned: AtomicBool,
    /// The test task has made its own checks: workers may finish.
    stop: AtomicBool,
}

/// One registry, shut down while 64 tasks call it; what broke the rule, if anything.
async fn one_round(registry: LockRegistry<u32>, seed: u64) -> Vec<String> {
    let mut numbers = StdRng::seed_from_u64(seed);
    let flags = Arc::new(Flags::default());

    // Waiters behind a key the test holds throughout: only the shutdown can end them.
    let held = registry.lock(HELD).await.expect("a fresh registry is open");
    let mut lock = pin!(registry.lock(HELD));
    let mut lock_shared = pin!(registry.lock_shared(HELD));
    let mut acquire = pin!(registry.acquire(HELD, 1));
    let mut lock_all = pin!(registry.lock_all([HELD, HELD + 1]));
    // The first poll sends each request (`lock_all` its first shard's at least) before the
    // shutdown is sent; none can be granted while `held` is out.
    assert!(futures::poll!(lock.as_mut()).is_pending());
    assert!(futures::poll!(lock_shared.as_mut()).is_pending());
    assert!(futures::poll!(acquire.as_mut()).is_pending());
    assert!(futures::poll!(lock_all.as_mut()).is_pending());

    let workers: Vec<_> = (0..TASKS)
        .map(|_| {
            let worker_numbers = StdRng::seed_from_u64(numbers.random());
            tokio::spawn(worker(registry.clone(), Arc::clone(&flags), worker_numbers))
        })
        .collect();
    sleep(Duration::from_millis(numbers.random_range(1..=20))).await;

    let mut violations = Vec::new();
    if timeout(BOUND, registry.shutdown()).await.is_err() {
        violations.push("`shutdown` did not return".to_owned());
    }
    flags.shutdown_returned.store(true, Ordering::SeqCst);
    // At once, while the workers still call: the test task's own calls, one of each kind, in
    // an order that changes from round to round so that each kind is sometimes the first.
    let mut calls = Call::one_of_each(&mut numbers);
    let first = numbers.random_range(0..calls.len());
    calls.rotate_left(first);
    for call in calls {
        if let Some(got) = call.unless_closed(&registry).await {
            violations.push(format!("the test task's {call:?} got {got}"));
        }
    }
    flags.stop.store(true, Ordering::SeqCst);

    match timeout(BOUND, join_all(workers)).await {
        Err(_) => violations.push("a worker hung".to_owned()),
        Ok(outcomes) => {
            for outcome in outcomes {
                match outcome {
                    Ok(broken) => violations.extend(broken),
                    Err(error) => violations.push(format!("a worker failed: {error}")),
                }
            }
        }
    }

    let waiters = [
        ("lock", unless_closed(lock, LockError::Closed).await),
        (
            "lock_shared",
            unless_closed(lock_shared, LockError::Closed).await,
        ),
        (
            "acquire",
            unless_closed(acquire, PermitsError::Closed).await,
        ),
        ("lock_all", unless_closed(lock_all, LockError::Closed).await),
    ];
    for (call, got) in waiters {
        if let Some(got) = got {
            violations.push(format!("a {call} waiting at the shutdown got {got}"));
        }
    }
    drop(held); // a guard still out drops quietly
    violations
}

/// Calls the registry at random until `shutdown` has returned, then checks that every call it
/// starts gets `Closed`, until the test task says stop. What broke the rule, if anything.
async fn worker(
    registry: LockRegistry<u32>,
    flags: Arc<Flags>,
    mut numbers: StdRng,
) -> Vec<String> {
    let mut violations = Vec::new();
    let mut checked = 0;
    loop {
        if flags.shutdown_returned.load(Ordering::SeqCst) {
            let call = Call::random(&mut numbers);
            if let Some(got) = call.unless_closed(&registry).await {
                violations.push(format!("a worker's {call:?} got {got}"));
            }
            checked += 1;
            if checked >= CHECKS_PER_TASK && flags.stop.load(Ordering::SeqCst) {
                return violations;
            }
        } else {
            keep_busy(&registry, &mut numbers).await;
        }
        // A call that a closed registry answers at once never yields; without this, tasks
        // spinning on it could starve the test task.
        tokio::task::yield_now().await;
    }
}

/// One random call before the shutdown (any answer will do), holding what it gets briefly.
async fn keep_busy(registry: &LockRegistry<u32>, numbers: &mut StdRng) {
    let key = numbers.random_range(0..KEYS);
    let other = (key + numbers.random_range(1..KEYS)) % KEYS;
    let limit = numbers
        .random_bool(0.5)
        .then(|| Duration::from_millis(numbers.random_range(0..=2)));
    let permits = numbers.random_range(1..=PERMITS);
    let yields = numbers.random_range(0..=2);
    match numbers.random_range(0..9) {
        0 => hold(waited(limit, registry.lock(key)).await, yields).await,
        1 => hold(waited(limit, registry.lock_shared(key)).await, yields).await,
        2 => hold(waited(limit, registry.acquire(key, permits)).await, yields).await,
        3 => hold(waited(limit, registry.lock_all([key, other])).await, yields).await,
        4 => hold(registry.try_lock(key).await.ok(), yields).await,
        5 => hold(registry.try_lock_shared(key).await.ok(), yields).await,
        6 => hold(registry.try_acquire(key, permits).await.ok(), yields).await,
        7 => hold(registry.try_lock_all([key, other]).await.ok(), yields).await,
        _ => drop(registry.stats().await),
    }
}

/// The guard `call` gives, waiting at most `limit` if one is set.
async fn waited<G, E>(
    limit: Option<Duration>,
    call: impl Future<Output = Result<G, E>>,
) -> Option<G> {
    match limit {
        Some(limit) => timeout(limit, call).await.ok()?.ok(),
        None => call.await.ok(),
    }
}

/// Holds `guard`, if any, while other tasks run a little.
async fn hold<G>(guard: Option<G>, yields: u32) {
    if guard.is_some() {
        for _ in 0..yields {
            tokio::task::yield_now().await;
        }
    }
    drop(guard);
}

/// `None` if `call` ends in its `closed` error within `BOUND`, else what it gave instead.
async fn unless_closed<T: Debug, E: Debug + PartialEq>(
    call: impl Future<Output = Result<T, E>>,
    closed: E,
) -> Option<String> {
    match timeout(BOUND, call).await {
        Err(_) => Some(format!("no answer within {BOUND:?}")),
        Ok(Err(error)) if error == closed => None,
        Ok(other) => Some(format!("{other:?}")),
    }
}

/// One call of the public API, with its arguments.
#[derive(Debug, Clone, Copy)]
enum Call {
    Lock(u32),
    LockShared(u32),
    Acquire(u32, u32),
    TryLock(u32),
    TryLockShared(u32),
    TryAcquire(u32, u32),
    LockAll([u32; 2]),
    TryLockAll([u32; 2]),
    Stats,
    /// `journal` with one shard, `journals` with several (`journal` is `Sharded` by design).
    Journal,
    Journals,
}

impl Call {
    /// Every kind of call once, on random keys.
    fn one_of_each(numbers: &mut StdRng) -> Vec<Call> {
        (0..Call::KINDS)
            .map(|kind| Call::of_kind(kind, numbers))
            .collect()
    }

    fn random(numbers: &mut StdRng) -> Call {
        let kind = numbers.random_range(0..Call::KINDS);
        Call::of_kind(kind, numbers)
    }

    const KINDS: usize = 11;

    fn of_kind(kind: usize, numbers: &mut StdRng) -> Call {
        let key = numbers.random_range(0..KEYS);
        let keys = [key, (key + numbers.random_range(1..KEYS)) % KEYS];
        let permits = numbers.random_range(1..=PERMITS);
        match kind {
            0 => Call::Lock(key),
            1 => Call::LockShared(key),
            2 => Call::Acquire(key, permits),
            3 => Call::TryLock(key),
            4 => Call::TryLockShared(key),
            5 => Call::TryAcquire(key, permits),
            6 => Call::LockAll(keys),
            7 => Call::TryLockAll(keys),
            8 => Call::Stats,
            9 => Call::Journal,
            _ => Call::Journals,
        }
    }

    /// Makes the call on a registry that has shut down: `None` if it got its `Closed` error,
    /// else what it got instead (a guard, `WouldBlock`, no answer within `BOUND`).
    async fn unless_closed(self, registry: &LockRegistry<u32>) -> Option<String> {
        match self {
            Call::Lock(key) => unless_closed(registry.lock(key), LockError::Closed).await,
            Call::LockShared(key) => {
                unless_closed(registry.lock_shared(key), LockError::Closed).await
            }
            Call::Acquire(key, permits) => {
                unless_closed(registry.acquire(key, permits), PermitsError::Closed).await
            }
            Call::TryLock(key) => unless_closed(registry.try_lock(key), TryLockError::Closed).await,
            Call::TryLockShared(key) => {
                unless_closed(registry.try_lock_shared(key), TryLockError::Closed).await
            }
            Call::TryAcquire(key, permits) => {
                unless_closed(registry.try_acquire(key, permits), TryPermitsError::Closed).await
            }
            Call::LockAll(keys) => unless_closed(registry.lock_all(keys), LockError::Closed).await,
            Call::TryLockAll(keys) => {
                unless_closed(registry.try_lock_all(keys), TryLockError::Closed).await
            }
            Call::Stats => unless_closed(registry.stats(), LockError::Closed).await,
            // Built without `.journal(n)`, a registry keeps no final journal to read after
            // it stopped (`journal`'s docs): `Closed`, as for any other call.
            Call::Journal if registry.shards() == 1 => {
                unless_closed(registry.journal(), JournalError::Closed).await
            }
            Call::Journal | Call::Journals => {
                unless_closed(registry.journals(), LockError::Closed).await
            }
        }
    }
}
