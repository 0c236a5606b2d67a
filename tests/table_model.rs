//! The lock table grants exactly what a naive reference model of the rules grants, and keeps
//! every rule after every step of random scripts: mutual exclusion, FIFO per key, reference
//! count = holders + waiters, no entry without a holder or a waiter, strictly increasing
//! fencing tokens, and liveness (once holders release, every waiter that was not cancelled or
//! closed is granted).
//!
//! # How it checks
//!
//! proptest generates scripts over 2 or 3 keys and at most [`MAX_LIVE_ACQUIRERS`] acquirers at
//! a time: acquire, try_acquire, cancel of a random live acquirer (still queued, or already
//! granted: in the registry a cancel can arrive after its grant), release of a random holder,
//! and shutdown. Each step goes to the [`Model`] first, which picks the waiter the step is
//! about and says which journal events the call must record (the call itself, then the grants,
//! would-blocks, closes and refusals it causes); the same call then goes to a
//! `JournaledTable<u64, ()>`, whose recorded events must be exactly those. After every step
//! the test also checks `check_invariants()` and compares the table's counts and waiters with
//! the model's. After the script every holder is released, again and again, until none is
//! left: the table must then be empty and every waiter that was not cancelled or closed must
//! have been granted. Last, each key is taken with `try_acquire` and released, so that a
//! leaked entry changes an output (a would-block instead of a grant), not just the state.
//!
//! # When it fails
//!
//! proptest shrinks the script; then the test panics with the seed, the minimal script and the
//! failure, and writes `tests/replays/failing-<seed>.trace`: the minimal script's calls with
//! the outputs the *model* expects, in the trace format. So under the broken table,
//! `cargo test --test replay_regressions` fails on that file at the first wrong output, and
//! once the table is fixed it passes: fix the bug, rename the file after what it shows, add a
//! `#` line saying what went wrong, and commit it; it is replayed for ever after. To run the
//! same cases again: `PROPTEST_RNG_SEED=<seed> cargo test --test table_model`.
//!
//! Waiters in the trace are named as the table names them: the model numbers acquirers in
//! order of arrival, from 1, so that its expected journal can be replayed id for id.

use std::collections::HashSet;
use std::collections::hash_map::RandomState;
use std::fmt::Write as _;
use std::hash::BuildHasher;
use std::path::PathBuf;
use std::time::Duration;

use keyed_locks::journal::{
    Journal, JournalEntry, JournalEvent, JournaledTable, Refusal, format_waiter,
};
use keyed_locks::table::WaiterId;
use keyed_locks::trace::{IntegerKeys, write_trace};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestError, TestRunner};

/// "A handful of waiters": an acquire or try_acquire that would exceed this does nothing.
/// Few acquirers on few keys make long queues, cancels and grants collide often.
const MAX_LIVE_ACQUIRERS: usize = 6;

/// One step of a script. Waiters are picked by position among the live ones when the step
/// runs (`pick` modulo their number), so that every script is meaningful and shrinks well.
#[derive(Debug, Clone, Copy)]
enum Op {
    Acquire {
        key: u64,
    },
    TryAcquire {
        key: u64,
    },
    /// Cancels a live acquirer: a queued one is withdrawn, a holder is refused.
    Cancel {
        pick: usize,
    },
    /// Releases a holder.
    Release {
        pick: usize,
    },
    Shutdown,
}

fn op(keys: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0..keys).prop_map(|key| Op::Acquire { key }),
        2 => (0..keys).prop_map(|key| Op::TryAcquire { key }),
        3 => (0..8usize).prop_map(|pick| Op::Cancel { pick }),
        4 => (0..8usize).prop_map(|pick| Op::Release { pick }),
        1 => Just(Op::Shutdown),
    ]
}

/// A number of keys (2 or 3) and a script over them.
fn keys_and_script() -> impl Strategy<Value = (u64, Vec<Op>)> {
    (2u64..=3).prop_flat_map(|keys| (Just(keys), prop::collection::vec(op(keys), 1..60)))
}

/// One key as the rules describe it.
#[derive(Debug, Default)]
struct ModelKey {
    holder: Option<WaiterId>,
    /// In order of arrival.
    waiters: Vec<WaiterId>,
}

impl ModelKey {
    fn holders_and_waiters(&self) -> usize {
        usize::from(self.holder.is_some()) + self.waiters.len()
    }
}

/// The deliberately naive reference: a holder and a list of waiters per key, and a counter.
#[derive(Debug)]
struct Model {
    keys: Vec<ModelKey>,
    /// Acquirers holding or waiting.
    live: usize,
    /// The arrival number of the next acquirer: the table's [`WaiterId`].
    next_arrival: u64,
    next_fencing_token: u64,
}

impl Model {
    fn new(keys: u64) -> Self {
        Model {
            keys: (0..keys).map(|_| ModelKey::default()).collect(),
            live: 0,
            next_arrival: 1,
            next_fencing_token: 1,
        }
    }

    fn holders(&self) -> Vec<WaiterId> {
        self.keys.iter().filter_map(|key| key.holder).collect()
    }

    /// Holders and waiters, key by key, each key's holder first.
    fn live_acquirers(&self) -> Vec<WaiterId> {
        self.keys
            .iter()
            .flat_map(|key| key.holder.iter().chain(&key.waiters).copied())
            .collect()
    }

    /// Names a new acquirer the way the table does (see the module docs).
    fn arrive(&mut self) -> WaiterId {
        let waiter = WaiterId::new(self.next_arrival).expect("arrivals count from 1");
        self.next_arrival += 1;
        self.live += 1;
        waiter
    }

    fn grant(&mut self, key: u64, waiter: WaiterId) -> JournalEvent<u64> {
        self.keys[key as usize].holder = Some(waiter);
        let fencing_token = self.next_fencing_token;
        self.next_fencing_token += 1;
        JournalEvent::Grant {
            waiter,
            fencing_token,
        }
    }

    /// Applies `op` and returns the events the table must record for it, the call first; an
    /// empty list if the step does not apply (nobody to pick, or too many acquirers).
    fn step(&mut self, op: Op) -> Vec<JournalEvent<u64>> {
        match op {
            Op::Acquire { key } => {
                if self.live == MAX_LIVE_ACQUIRERS {
                    return Vec::new();
                }
                let waiter = self.arrive();
                let mut events = vec![JournalEvent::Acquire { waiter, key }];
                let model_key = &mut self.keys[key as usize];
                if model_key.holders_and_waiters() == 0 {
                    events.push(self.grant(key, waiter));
                } else {
                    model_key.waiters.push(waiter);
                }
                events
            }
            Op::TryAcquire { key } => {
                if self.live == MAX_LIVE_ACQUIRERS {
                    return Vec::new();
                }
                let mut events = vec![JournalEvent::TryAcquire { key }];
                if self.keys[key as usize].holders_and_waiters() == 0 {
                    let waiter = self.arrive();
                    events.push(self.grant(key, waiter));
                } else {
                    events.push(JournalEvent::WouldBlock { key });
                }
                events
            }
            Op::Cancel { pick } => {
                let live = self.live_acquirers();
                let Some(&waiter) = live.get(pick % live.len().max(1)) else {
                    return Vec::new();
                };
                let mut events = vec![JournalEvent::Cancel { waiter }];
                let queued_in = self
                    .keys
                    .iter_mut()
                    .find(|key| key.waiters.contains(&waiter));
                match queued_in {
                    Some(model_key) => {
                        model_key.waiters.retain(|queued| *queued != waiter);
                        self.live -= 1;
                    }
                    None => events.push(JournalEvent::Refused {
                        waiter,
                        reason: Refusal::NotWaiting,
                    }),
                }
                events
            }
            Op::Release { pick } => {
                let holders = self.holders();
                let Some(&waiter) = holders.get(pick % holders.len().max(1)) else {
                    return Vec::new();
                };
                let mut events = vec![JournalEvent::Release { waiter }];
                self.live -= 1;
                let key = self
                    .keys
                    .iter()
                    .position(|key| key.holder == Some(waiter))
                    .expect("a holder holds a key") as u64;
                let model_key = &mut self.keys[key as usize];
                model_key.holder = None;
                // FIFO: the key passes to the waiter that arrived first.
                if !model_key.waiters.is_empty() {
                    let next = model_key.waiters.remove(0);
                    events.push(self.grant(key, next));
                }
                events
            }
            Op::Shutdown => {
                let mut waiting: Vec<WaiterId> = self
                    .keys
                    .iter()
                    .flat_map(|key| key.waiters.iter().copied())
                    .collect();
                // The table closes its waiters in order of arrival.
                waiting.sort_unstable();
                let mut events = vec![JournalEvent::Shutdown];
                events.extend(
                    waiting
                        .into_iter()
                        .map(|waiter| JournalEvent::Closed { waiter }),
                );
                self.live = 0;
                self.keys
                    .iter_mut()
                    .for_each(|key| *key = ModelKey::default());
                events
            }
        }
    }
}

/// The steps of a run: the script, then "release every holder" until none is left, then
/// "take each key and release it".
fn run_steps(
    model: &mut Model,
    script: &[Op],
    mut each: impl FnMut(&Model, Vec<JournalEvent<u64>>) -> Result<(), String>,
) -> Result<(), String> {
    for (index, &op) in script.iter().enumerate() {
        let events = model.step(op);
        each(model, events).map_err(|failure| format!("step {index} ({op:?}): {failure}"))?;
    }
    // Liveness: releasing the holders must drain every queue. Then every key is taken and
    // released once more: a leaked entry would refuse the take, which puts a leak among the
    // outputs, where a replay of the trace sees it too.
    let keys = model.keys.len() as u64;
    let epilogue = std::iter::once(None).chain((0..keys).map(Some));
    let mut index = script.len();
    for take in epilogue {
        if let Some(key) = take {
            let op = Op::TryAcquire { key };
            let events = model.step(op);
            each(model, events)
                .map_err(|failure| format!("final take {index} ({op:?}): {failure}"))?;
            index += 1;
        }
        while !model.holders().is_empty() {
            let op = Op::Release { pick: 0 };
            let events = model.step(op);
            each(model, events)
                .map_err(|failure| format!("final release {index} ({op:?}): {failure}"))?;
            index += 1;
        }
    }
    Ok(())
}

/// Makes the call an input event names, as the registry would.
fn feed(table: &mut JournaledTable<u64, ()>, input: &JournalEvent<u64>) {
    // Results are not looked at here: the journal records them, and the comparison judges.
    match input {
        JournalEvent::Acquire { key, .. } => {
            let _ = table.acquire(*key, ());
        }
        JournalEvent::TryAcquire { key } => {
            let _ = table.try_acquire(*key);
        }
        JournalEvent::Cancel { waiter } => {
            let _ = table.cancel(*waiter);
        }
        JournalEvent::Release { waiter } => {
            let _ = table.release(*waiter, &mut Vec::new());
        }
        JournalEvent::Shutdown => {
            let _ = table.shutdown();
        }
        output => panic!("the model made an output the first event of a step: {output:?}"),
    }
}

/// Everything the table must agree with the model on between steps.
fn check_state(table: &JournaledTable<u64, ()>, model: &Model) -> Result<(), String> {
    let table = table.table();
    table
        .check_invariants()
        .map_err(|violation| violation.to_string())?;
    let stats = table.stats();
    let expected = (
        model
            .keys
            .iter()
            .filter(|key| key.holders_and_waiters() > 0)
            .count(),
        model.holders().len(),
        model
            .keys
            .iter()
            .map(|key| key.waiters.len())
            .sum::<usize>(),
        model.next_fencing_token - 1,
    );
    let got = (stats.keys, stats.held, stats.waiting, stats.grants);
    if got != expected {
        return Err(format!(
            "(keys, held, waiting, grants) is {got:?}, the model says {expected:?}"
        ));
    }
    for (key, model_key) in (0u64..).zip(&model.keys) {
        // No entry without a holder or a waiter, and none missing.
        if table.contains_key(&key) != (model_key.holders_and_waiters() > 0) {
            return Err(format!(
                "key {key} has an entry: {}, but {} holders and waiters",
                table.contains_key(&key),
                model_key.holders_and_waiters()
            ));
        }
        // Mutual exclusion: the model's one holder holds in the table too.
        if let Some(holder) = model_key.holder
            && (table.key_of(holder) != Some(&key) || table.delivery_of(holder).is_some())
        {
            return Err(format!("{} does not hold key {key}", format_waiter(holder)));
        }
        for waiter in &model_key.waiters {
            if table.key_of(*waiter) != Some(&key) || table.delivery_of(*waiter).is_none() {
                return Err(format!(
                    "{} is not waiting for key {key}",
                    format_waiter(*waiter)
                ));
            }
        }
    }
    // Reference count: the table has no acquirer beyond the model's holders and waiters.
    if stats.held + stats.waiting != model.live {
        return Err(format!(
            "{} holders and waiters in the table, {} in the model",
            stats.held + stats.waiting,
            model.live
        ));
    }
    Ok(())
}

/// Runs a script on a journaled table, checking it against the model after every step.
fn check_script(keys: u64, script: &[Op]) -> Result<(), String> {
    let mut model = Model::new(keys);
    let mut table = JournaledTable::<u64, ()>::with_journal(usize::MAX);
    let mut last_fencing_token = 0;
    run_steps(&mut model, script, |model, expected| {
        let Some(input) = expected.first() else {
            return Ok(());
        };
        let recorded_before = table.journal().entries.len();
        feed(&mut table, input);
        let journal = table.journal();
        let recorded: Vec<&JournalEvent<u64>> = journal.entries[recorded_before..]
            .iter()
            .map(|entry| &entry.event)
            .collect();
        // FIFO and mutual exclusion show here first: a grant to anyone but the model's next
        // waiter, or to a second holder, is an event the model did not expect.
        if recorded.iter().copied().ne(expected.iter()) {
            return Err(format!(
                "the table recorded `{}`, the model expects `{}`",
                trace_lines(recorded.iter().copied()),
                trace_lines(&expected)
            ));
        }
        for event in recorded {
            if let JournalEvent::Grant { fencing_token, .. } = event {
                if *fencing_token <= last_fencing_token {
                    return Err(format!(
                        "token {fencing_token} granted after token {last_fencing_token}"
                    ));
                }
                last_fencing_token = *fencing_token;
            }
        }
        check_state(&table, model)
    })?;
    if table.table().stats().keys != 0 {
        return Err("entries left after every holder released".into());
    }
    let never_granted = waiters_never_granted(&table.journal());
    if !never_granted.is_empty() {
        let never_granted: Vec<String> = never_granted.into_iter().map(format_waiter).collect();
        return Err(format!(
            "{never_granted:?} waited, were neither cancelled nor closed, and were never granted"
        ));
    }
    Ok(())
}

/// Acquirers the journal shows arriving that never got a grant, a successful cancel or a close.
/// Read off the table's own journal, so that liveness does not rest on the model.
fn waiters_never_granted(journal: &Journal<u64>) -> Vec<WaiterId> {
    let mut arrived = Vec::new();
    let mut settled = HashSet::new();
    let mut events = journal.entries.iter().map(|entry| &entry.event).peekable();
    while let Some(event) = events.next() {
        match event {
            JournalEvent::Acquire { waiter, .. } => arrived.push(*waiter),
            JournalEvent::Grant { waiter, .. } | JournalEvent::Closed { waiter } => {
                settled.insert(*waiter);
            }
            // A refused cancel is followed by its refusal, and the waiter goes on.
            JournalEvent::Cancel { waiter }
                if !matches!(events.peek(), Some(JournalEvent::Refused { .. })) =>
            {
                settled.insert(*waiter);
            }
            _ => {}
        }
    }
    arrived.retain(|waiter| !settled.contains(waiter));
    arrived
}

/// Events as trace lines without number and time, for failure messages:
/// `release w1; grant w2 2`.
fn trace_lines<'a>(events: impl IntoIterator<Item = &'a JournalEvent<u64>>) -> String {
    let journal = Journal {
        entries: (1..)
            .zip(events)
            .map(|(seq, event)| JournalEntry {
                seq,
                at: Duration::ZERO,
                event: event.clone(),
            })
            .collect(),
        dropped: 0,
    };
    let trace = write_trace(&journal, &IntegerKeys);
    let lines: Vec<&str> = trace
        .lines()
        .filter(|line| !line.starts_with('#'))
        .map(|line| line.splitn(3, ' ').nth(2).unwrap_or(line))
        .collect();
    lines.join("; ")
}

/// The journal a correct table records for `script`: the model's events, numbered from 1.
fn expected_journal(keys: u64, script: &[Op]) -> Journal<u64> {
    let mut model = Model::new(keys);
    let mut entries = Vec::new();
    let _ = run_steps(&mut model, script, |_, events| {
        for event in events {
            entries.push(JournalEntry {
                seq: entries.len() as u64 + 1,
                at: Duration::ZERO,
                event,
            });
        }
        Ok(())
    });
    Journal {
        entries,
        dropped: 0,
    }
}

/// Writes the failing case where `replay_regressions` finds it, and returns the path.
fn write_failing_trace(seed: u64, keys: u64, script: &[Op], failure: &str) -> PathBuf {
    let trace = write_trace(&expected_journal(keys, script), &IntegerKeys);
    let (header, events) = trace.split_once('\n').expect("a header line");
    let mut comments = format!(
        "# Found by tests/table_model.rs with PROPTEST_RNG_SEED={seed}; the outputs are the\n\
         # reference model's. Script over {keys} keys: {script:?}\n"
    );
    for line in failure.lines() {
        let _ = writeln!(comments, "# failure: {line}");
    }
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/replays")
        .join(format!("failing-{seed}.trace"));
    std::fs::write(&path, format!("{header}\n{comments}{events}"))
        .unwrap_or_else(|error| panic!("cannot write {}: {error}", path.display()));
    path
}

#[test]
fn random_scripts_keep_every_rule_and_grant_as_the_reference_model() {
    let mut config = Config {
        cases: 512,
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
    let result = runner.run(&keys_and_script(), |(keys, script)| {
        check_script(keys, &script).map_err(TestCaseError::fail)
    });
    match result {
        Ok(()) => {}
        Err(TestError::Fail(reason, (keys, script))) => {
            let path = write_failing_trace(seed, keys, &script, &reason.to_string());
            panic!(
                "the table broke a rule (PROPTEST_RNG_SEED={seed})\n\
                 minimal script over {keys} keys: {script:?}\n\
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
        Op::Shutdown,
        Op::Acquire { key: 1 },
    ];
    let journal = expected_journal(2, &script);
    let count = |is: fn(&JournalEvent<u64>) -> bool| {
        journal
            .entries
            .iter()
            .filter(|entry| is(&entry.event))
            .count()
    };
    let grants = count(|event| matches!(event, JournalEvent::Grant { .. }));
    let refusals = count(|event| matches!(event, JournalEvent::Refused { .. }));
    let closes = count(|event| matches!(event, JournalEvent::Closed { .. }));
    assert_eq!(
        (grants, refusals, closes),
        (6, 1, 1),
        "this script grants (two of them in the final takes), refuses and closes: `{}`",
        trace_lines(journal.entries.iter().map(|entry| &entry.event))
    );
    keyed_locks::replay::verify(&journal).unwrap_or_else(|error| panic!("{error}"));
}
