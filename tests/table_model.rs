//! The lock table grants exactly what the reference model of its rules grants, and keeps
//! every rule after every step of random scripts: mutual exclusion of exclusive requests,
//! never more permits held than a key has, strict FIFO per key (a big request at the front is
//! not overtaken, and its cancel lets through the ones behind it that now fit), requests for
//! several keys at once (queued on all their keys as one request, granted all together when
//! first on each, their release and cancel letting through what can now go on every key),
//! the grants of one step in order of arrival with consecutive fencing tokens, reference
//! count = holders + waiters, no entry without a holder or a waiter, strictly increasing
//! fencing tokens, liveness (once holders release, every waiter that was not cancelled or
//! closed is granted), shutdown closing waiters in order of arrival, and refusals of releases
//! and cancels that make no sense.
//!
//! # How it checks
//!
//! proptest generates a capacity (1, 2 or 3 permits per key) and scripts over 2 or 3 keys and
//! at most [`MAX_LIVE_ACQUIRERS`] acquirers at a time: acquire (exclusive), acquire_permits
//! of 1 (a shared lock) up to the capacity, try_acquire, try_acquire_permits, acquire_all and
//! try_acquire_all of 1 to 3 keys listed (a key may be listed twice, so a list can come down
//! to a set of one key, which is a plain exclusive request), cancel of a random live acquirer
//! (still queued, or already granted: in the registry a cancel can arrive after its grant),
//! cancel of a random queued waiter, release of a random holder, release of a waiter still
//! queued, release and cancel of a waiter that is gone, and shutdown. Each step is a call on
//! the [`ReferenceModel`], which picks the waiter the step is about and writes the journal a
//! correct table records for it. After the script every holder is released, again and again,
//! until none is left; then each key is taken with `try_acquire` (every permit) and released,
//! so that a leaked entry or permit changes an output (a would-block instead of a grant), not
//! just the state. [`check_the_table_against`] then replays that journal on the real table and
//! compares every event, makes the same calls on a table that records them (the keys of
//! `acquire_all` as listed, duplicates included) and compares what it records and returns,
//! and checks the table's state after every call (see `reference_model`).
//!
//! # When it fails
//!
//! proptest shrinks the script; then the test panics with the seed, the minimal script and the
//! failure, and writes `tests/replays/failing-<seed>.jsonl`: the minimal script's calls with
//! the outputs the *model* expects, in the trace format (its capacity first, if not 1). So
//! under the broken table, `cargo test --test main replay_regressions` fails on that file at
//! the first wrong output, and once the table is fixed it passes: fix the bug, rename the file
//! after what it shows, add a `#` line saying what went wrong, and commit it; it is replayed
//! for ever after. To run the same cases again:
//! `PROPTEST_RNG_SEED=<seed> cargo test --test main table_model`.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::path::PathBuf;

use keyed_locks::journal::WaiterId;
use keyed_locks::journal::{Journal, JournalEvent, Refusal};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestError, TestRunner};

use crate::reference_model::{ReferenceModel, check_the_table_against, trace_lines};

/// "A handful of waiters": an acquire or try-acquire that would exceed this does nothing.
/// Few acquirers on few keys make long queues, cancels and grants collide often.
const MAX_LIVE_ACQUIRERS: usize = 6;

/// One step of a script. Waiters are picked by position among the ones the step can name
/// when it runs (`pick` modulo their number), so that every script is meaningful and shrinks
/// well; a step with nobody to name does nothing.
#[derive(Debug, Clone, Copy)]
enum Op {
    /// Asks for every permit of `key`: an exclusive lock.
    Acquire {
        key: u64,
    },
    /// Asks for `permits` of `key`'s permits, between 1 (a shared lock) and the capacity.
    AcquirePermits {
        key: u64,
        permits: u32,
    },
    TryAcquire {
        key: u64,
    },
    TryAcquirePermits {
        key: u64,
        permits: u32,
    },
    /// Asks for every permit of each listed key, all at once.
    AcquireAll {
        keys: Listed,
    },
    TryAcquireAll {
        keys: Listed,
    },
    /// Cancels a live acquirer: a queued one is withdrawn, a holder is refused.
    Cancel {
        pick: usize,
    },
    /// Cancels a queued waiter, so that a cancel at the front of a queue, which lets the
    /// requests behind it through, comes often.
    CancelQueued {
        pick: usize,
    },
    /// Releases a holder.
    Release {
        pick: usize,
    },
    /// Releases a waiter that is still queued: refused, nothing changes.
    ReleaseQueued {
        pick: usize,
    },
    /// Releases, then cancels, a waiter that was released, cancelled or closed: both are
    /// refused as unknown, and no later acquirer is touched.
    ReleaseAndCancelGone {
        pick: usize,
    },
    Shutdown,
}

/// One to three keys as a caller lists them for `acquire_all`: a key may come twice. An array
/// rather than a `Vec`, so that an [`Op`] stays `Copy`.
#[derive(Clone, Copy)]
struct Listed {
    keys: [u64; 3],
    len: usize,
}

impl Listed {
    fn new(listed: &[u64]) -> Self {
        let mut keys = [0; 3];
        keys[..listed.len()].copy_from_slice(listed);
        Listed {
            keys,
            len: listed.len(),
        }
    }

    fn as_slice(&self) -> &[u64] {
        &self.keys[..self.len]
    }
}

impl std::fmt::Debug for Listed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.as_slice().fmt(f)
    }
}

/// 1 to 3 of the `keys` keys, each drawn on its own, so that some lists name a key twice.
fn listed(keys: u64) -> impl Strategy<Value = Listed> {
    prop::collection::vec(0..keys, 1..=3).prop_map(|listed| Listed::new(&listed))
}

/// A step over `keys` keys of `capacity` permits each.
fn op(keys: u64, capacity: u32) -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..keys).prop_map(|key| Op::Acquire { key }),
        4 => (0..keys, 1..=capacity).prop_map(|(key, permits)| Op::AcquirePermits { key, permits }),
        1 => (0..keys).prop_map(|key| Op::TryAcquire { key }),
        1 => (0..keys, 1..=capacity)
            .prop_map(|(key, permits)| Op::TryAcquirePermits { key, permits }),
        3 => listed(keys).prop_map(|keys| Op::AcquireAll { keys }),
        1 => listed(keys).prop_map(|keys| Op::TryAcquireAll { keys }),
        2 => (0..8usize).prop_map(|pick| Op::Cancel { pick }),
        2 => (0..8usize).prop_map(|pick| Op::CancelQueued { pick }),
        4 => (0..8usize).prop_map(|pick| Op::Release { pick }),
        1 => (0..8usize).prop_map(|pick| Op::ReleaseQueued { pick }),
        1 => (0..8usize).prop_map(|pick| Op::ReleaseAndCancelGone { pick }),
        1 => Just(Op::Shutdown),
    ]
}

/// What a script runs on: the permits of each key, and how many keys.
#[derive(Debug, Clone, Copy)]
struct Setting {
    capacity: u32,
    keys: u64,
}

/// A capacity (1, 2 or 3), a number of keys (2 or 3) and a script over them.
fn setting_and_script() -> impl Strategy<Value = (Setting, Vec<Op>)> {
    (1u32..=3, 2u64..=3).prop_flat_map(|(capacity, keys)| {
        (
            Just(Setting { capacity, keys }),
            prop::collection::vec(op(keys, capacity), 1..60),
        )
    })
}

/// The `pick`-th of `candidates`, counting round; `None` if there are none.
fn nth<T: Copy>(candidates: &[T], pick: usize) -> Option<T> {
    candidates.get(pick % candidates.len().max(1)).copied()
}

/// The live acquirers still queued, key by key.
fn queued(model: &ReferenceModel) -> Vec<WaiterId> {
    model
        .live_acquirers()
        .into_iter()
        .filter(|waiter| model.find(*waiter).is_some_and(|(_, holds)| !holds))
        .collect()
}

/// Makes the calls `op` stands for on the model.
fn step(model: &mut ReferenceModel, op: Op) {
    let room = model.live_acquirers().len() < MAX_LIVE_ACQUIRERS;
    match op {
        Op::Acquire { key } if room => {
            model.acquire(key);
        }
        Op::AcquirePermits { key, permits } if room => {
            model.acquire_permits(key, permits);
        }
        Op::TryAcquire { key } if room => {
            model.try_acquire(key);
        }
        Op::TryAcquirePermits { key, permits } if room => {
            model.try_acquire_permits(key, permits);
        }
        Op::AcquireAll { keys } if room => {
            model.acquire_all(keys.as_slice());
        }
        Op::TryAcquireAll { keys } if room => {
            model.try_acquire_all(keys.as_slice());
        }
        Op::Acquire { .. }
        | Op::AcquirePermits { .. }
        | Op::TryAcquire { .. }
        | Op::TryAcquirePermits { .. }
        | Op::AcquireAll { .. }
        | Op::TryAcquireAll { .. } => {}
        Op::Cancel { pick } => {
            if let Some(waiter) = nth(&model.live_acquirers(), pick) {
                model.cancel(waiter);
            }
        }
        Op::CancelQueued { pick } => {
            if let Some(waiter) = nth(&queued(model), pick) {
                model.cancel(waiter);
            }
        }
        Op::Release { pick } => {
            if let Some(holder) = nth(&model.holders(), pick) {
                model.release(holder);
            }
        }
        Op::ReleaseQueued { pick } => {
            if let Some(waiter) = nth(&queued(model), pick) {
                model.release(waiter);
            }
        }
        Op::ReleaseAndCancelGone { pick } => {
            let gone: Vec<_> = model
                .issued()
                .filter(|waiter| model.find(*waiter).is_none())
                .collect();
            if let Some(waiter) = nth(&gone, pick) {
                model.release(waiter);
                model.cancel(waiter);
            }
        }
        Op::Shutdown => model.shutdown(),
    }
}

/// The model after `script`, then "release every holder" until none is left, then "take each
/// key and release it".
fn run_on_the_model(setting: Setting, script: &[Op]) -> ReferenceModel {
    let mut model = ReferenceModel::with_capacity(setting.capacity);
    for &op in script {
        step(&mut model, op);
    }
    // Liveness: releasing the holders must drain every queue. Then every key is taken, every
    // permit of it, and released once more: a leaked entry or permit would refuse the take,
    // which puts a leak among the outputs, where a replay of the trace sees it too.
    for key in std::iter::once(None).chain((0..setting.keys).map(Some)) {
        if let Some(key) = key {
            model.try_acquire(key);
        }
        while let Some(&holder) = model.holders().first() {
            model.release(holder);
        }
    }
    model
}

/// The journal a correct table records for `script`.
fn expected_journal(setting: Setting, script: &[Op]) -> Journal<u64> {
    run_on_the_model(setting, script).journal()
}

/// Writes the failing case where `replay_regressions` finds it, and returns the path.
fn write_failing_trace(seed: u64, setting: Setting, script: &[Op], failure: &str) -> PathBuf {
    let Setting { capacity, keys } = setting;
    let description = format!(
        "Found by tests/table_model.rs with PROPTEST_RNG_SEED={seed}; the outputs are the \
         reference model's. Script over {keys} keys of {capacity} permits: {script:?}. \
         Failure: {failure}"
    );
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/replays")
        .join(format!("failing-{seed}.jsonl"));
    std::fs::File::create(&path)
        .map_err(|error| error.to_string())
        .and_then(|file| {
            expected_journal(setting, script)
                .write_json_lines(Some(&description), file)
                .map_err(|error| error.to_string())
        })
        .unwrap_or_else(|error| panic!("cannot write {}: {error}", path.display()));
    path
}

#[test]
fn random_scripts_keep_every_rule_and_grant_as_the_reference_model() {
    let mut config = Config {
        cases: 1024,
        // The trace file written below is this test's record of failures.
        failure_persistence: None,
        ..Config::default()
    };
    let seed = match config.rng_seed {
        RngSeed::Fixed(seed) => seed,
        // A seed of our own, so that a failure can print it.
        RngSeed::Random => RandomState::new().hash_one("table_model"),
    };
    config.rng_seed = RngSeed::Fixed(seed);
    let mut runner = TestRunner::new(config);
    let result = runner.run(&setting_and_script(), |(setting, script)| {
        check_the_table_against(&run_on_the_model(setting, &script)).map_err(TestCaseError::fail)
    });
    match result {
        Ok(()) => {}
        Err(TestError::Fail(reason, (setting, script))) => {
            let path = write_failing_trace(seed, setting, &script, &reason.to_string());
            panic!(
                "the table broke a rule (PROPTEST_RNG_SEED={seed})\n\
                 minimal script over {setting:?}: {script:?}\n\
                 failure: {reason}\n\
                 expected journal written to {}",
                path.display()
            );
        }
        Err(TestError::Abort(reason)) => panic!("proptest gave up (seed {seed}): {reason}"),
    }
}

#[test]
fn the_expected_journal_of_a_script_replays_without_divergence() {
    // The failing-case trace is only useful if a correct table replays it as written.
    let script = [
        Op::Acquire { key: 0 },
        Op::Acquire { key: 0 },
        Op::Acquire { key: 0 },
        Op::TryAcquire { key: 1 },
        Op::Cancel { pick: 1 },
        Op::Cancel { pick: 0 },
        Op::Release { pick: 0 },
        Op::Acquire { key: 1 },
        Op::ReleaseQueued { pick: 0 },
        Op::Shutdown,
        Op::ReleaseAndCancelGone { pick: 0 },
        Op::Acquire { key: 1 },
    ];
    let journal = expected_journal(
        Setting {
            capacity: 1,
            keys: 2,
        },
        &script,
    );
    let count = |is: fn(&JournalEvent<u64>) -> bool| {
        journal
            .entries
            .iter()
            .filter(|entry| is(&entry.event))
            .count()
    };
    let grants = count(|event| matches!(event, JournalEvent::Grant { .. }));
    let closes = count(|event| matches!(event, JournalEvent::Closed { .. }));
    let refusals: Vec<(u64, Refusal)> = journal
        .entries
        .iter()
        .filter_map(|entry| match entry.event {
            JournalEvent::Refused { waiter, reason } => Some((waiter.arrival(), reason)),
            _ => None,
        })
        .collect();
    assert_eq!(
        (grants, closes, refusals),
        (
            6,
            1,
            vec![
                (1, Refusal::NotWaiting),
                (5, Refusal::NotHolding),
                (1, Refusal::Unknown),
                (1, Refusal::Unknown)
            ]
        ),
        "this script grants (two of them in the final takes), closes and refuses: `{}`",
        trace_lines(journal.entries.iter().map(|entry| &entry.event))
    );
    keyed_locks::replay::verify(&journal).unwrap_or_else(|error| panic!("{error}"));
}

#[test]
fn the_expected_journal_of_a_permits_script_lets_the_requests_behind_a_cancelled_head_through() {
    // Three permits: a shared holder, an exclusive request queued, a request for two queued
    // behind it though two are free (FIFO), then the exclusive request cancelled.
    let script = [
        Op::AcquirePermits { key: 0, permits: 1 },
        Op::Acquire { key: 0 },
        Op::AcquirePermits { key: 0, permits: 2 },
        Op::TryAcquirePermits { key: 0, permits: 1 },
        Op::CancelQueued { pick: 0 },
        Op::AcquirePermits { key: 0, permits: 1 },
        Op::Release { pick: 0 },
    ];
    let journal = expected_journal(
        Setting {
            capacity: 3,
            keys: 1,
        },
        &script,
    );
    assert_eq!(
        trace_lines(journal.entries.iter().map(|entry| &entry.event)),
        "capacity 3; acquire w1 1 0; grant w1 1; acquire w2 3 0; \
         acquire w3 2 0; try_acquire 1 0; would_block 0; \
         cancel w2; grant w3 2; acquire w4 1 0; release w1; grant w4 3; \
         release w3; release w4; try_acquire 3 0; grant w5 4; release w5"
    );
    keyed_locks::replay::verify(&journal).unwrap_or_else(|error| panic!("{error}"));
}

#[test]
fn the_expected_journal_of_a_lock_all_script_grants_in_order_of_arrival() {
    // w1 holds keys 0 and 1; w2 waits for 1, w3 for 0; w4 asks for 1, 2 and 1 again (the set
    // {1, 2}) and waits behind w2 on key 1; w5 waits for key 2 behind w4, though nobody holds
    // it (FIFO). Tries of {2, 0} and of {1, 1} (a set of one key) would block. The release of
    // w1 grants w2 and w3 in order of arrival; the cancel of w4 lets w5 through.
    let script = [
        Op::AcquireAll {
            keys: Listed::new(&[0, 1]),
        },
        Op::Acquire { key: 1 },
        Op::Acquire { key: 0 },
        Op::AcquireAll {
            keys: Listed::new(&[1, 2, 1]),
        },
        Op::Acquire { key: 2 },
        Op::TryAcquireAll {
            keys: Listed::new(&[2, 0]),
        },
        Op::TryAcquireAll {
            keys: Listed::new(&[1, 1]),
        },
        Op::Release { pick: 0 },
        Op::CancelQueued { pick: 0 },
    ];
    let setting = Setting {
        capacity: 1,
        keys: 3,
    };
    let journal = expected_journal(setting, &script);
    assert_eq!(
        trace_lines(journal.entries.iter().map(|entry| &entry.event)),
        "acquire_all w1 2 | 0 | 1; grant w1 1; acquire w2 1 1; acquire w3 1 0; \
         acquire_all w4 2 | 1 | 2; acquire w5 1 2; try_acquire_all 2 | 2 | 0; would_block_all; \
         try_acquire 1 1; would_block 1; release w1; grant w2 2; grant w3 3; cancel w4; \
         grant w5 4; release w3; release w2; release w5; try_acquire 1 0; grant w6 5; \
         release w6; try_acquire 1 1; grant w7 6; release w7; try_acquire 1 2; grant w8 7; \
         release w8"
    );
    keyed_locks::replay::verify(&journal).unwrap_or_else(|error| panic!("{error}"));
    check_the_table_against(&run_on_the_model(setting, &script))
        .unwrap_or_else(|failure| panic!("{failure}"));
}
