//! Replaying the journal of a real run reproduces every grant, waiter id and fencing token,
//! before and after a trip through the trace format; a tampered trace is caught at the
//! sequence number where it was changed.

use std::sync::Arc;
use std::time::Duration;

use keyed_locks::LockRegistry;
use keyed_locks::journal::{Journal, JournalEntry, JournalEvent};
use keyed_locks::replay::{ReplayError, VerifyError, replay, verify};
use tokio::sync::Notify;
use tokio::task::JoinSet;

/// Room for every event of `run_busy_workload`, so that nothing is dropped.
const JOURNAL_CAPACITY: usize = 1_000_000;

/// Keys the free-for-all tasks share.
const SHARED_KEYS: u64 = 4;
/// Keys held for the whole of a phase, so that waiting on them always ends in a give-up.
const HELD_FOR_TIMEOUTS: u64 = 100;
const HELD_FOR_SELECT: u64 = 101;
const HELD_FOR_ABORTS: u64 = 102;

/// Hundreds of tasks over a few keys: locks held across yields, try_locks, and waiters that
/// give up by timeout, by losing a `select!` and by being aborted, some of them while a
/// grant is in flight.
async fn run_busy_workload(registry: &LockRegistry<u64>) {
    // Timeouts that always fire: the key is held until every waiter has given up.
    let holder = registry
        .lock(HELD_FOR_TIMEOUTS)
        .await
        .expect("registry open");
    let mut timeouts = JoinSet::new();
    for _ in 0..40 {
        let registry = registry.clone();
        timeouts.spawn(async move {
            tokio::time::timeout(Duration::from_millis(2), registry.lock(HELD_FOR_TIMEOUTS))
                .await
                .is_err()
        });
    }
    while let Some(timed_out) = timeouts.join_next().await {
        assert!(
            timed_out.expect("task ran"),
            "the key was held: the timeout must fire"
        );
    }
    drop(holder);

    // Waiters that lose a `select!`, once all of them are queued.
    let holder = registry.lock(HELD_FOR_SELECT).await.expect("registry open");
    let give_up = Arc::new(Notify::new());
    let mut selects = JoinSet::new();
    for _ in 0..40 {
        let (registry, give_up) = (registry.clone(), give_up.clone());
        selects.spawn(async move {
            tokio::select! {
                _ = registry.lock(HELD_FOR_SELECT) => false,
                () = give_up.notified() => true,
            }
        });
    }
    wait_until_waiting(registry, 40).await;
    give_up.notify_waiters();
    while let Some(gave_up) = selects.join_next().await {
        assert!(
            gave_up.expect("task ran"),
            "the key was held: the waiter must give up"
        );
    }
    drop(holder);

    // Aborted waiters: half aborted while queued, half right after the holder released, one
    // of them with its grant in flight.
    let holder = registry.lock(HELD_FOR_ABORTS).await.expect("registry open");
    let mut aborted = Vec::new();
    for _ in 0..40 {
        let registry = registry.clone();
        aborted.push(tokio::spawn(async move {
            registry.lock(HELD_FOR_ABORTS).await.map(drop)
        }));
    }
    wait_until_waiting(registry, 40).await;
    for waiter in &aborted[..20] {
        waiter.abort();
    }
    drop(holder);
    for waiter in &aborted[20..] {
        waiter.abort();
    }
    for waiter in aborted {
        let _ = waiter.await;
    }

    // Free for all: lock, hold across yields, release; try_locks; timeouts that may fire
    // before, during or after the grant.
    let mut tasks = JoinSet::new();
    for task in 0..300u64 {
        let registry = registry.clone();
        tasks.spawn(async move {
            for round in 0..3 {
                let key = (task + round) % SHARED_KEYS;
                if task % 5 == 0 {
                    let attempt =
                        tokio::time::timeout(Duration::from_micros(50), registry.lock(key)).await;
                    drop(attempt);
                } else if task % 7 == 0 {
                    let _ = registry.try_lock(key).await;
                } else {
                    let guard = registry.lock(key).await.expect("registry open");
                    for _ in 0..(task % 3) {
                        tokio::task::yield_now().await;
                    }
                    drop(guard);
                }
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("task ran");
    }
    // Every release and cancel sent by the tasks has been handled once this returns.
    let stats = registry.stats().await.expect("registry open");
    assert_eq!((stats.keys, stats.held, stats.waiting), (0, 0, 0));
}

async fn wait_until_waiting(registry: &LockRegistry<u64>, waiters: usize) {
    while registry.stats().await.expect("registry open").waiting < waiters {
        tokio::task::yield_now().await;
    }
}

fn count<K>(journal: &[JournalEntry<K>], is_wanted: impl Fn(&JournalEvent<K>) -> bool) -> usize {
    journal
        .iter()
        .filter(|entry| is_wanted(&entry.event))
        .count()
}

/// (waiter, fencing token) of every grant, in order.
fn grants<K>(entries: &[JournalEntry<K>]) -> Vec<(String, u64)> {
    entries
        .iter()
        .filter_map(|entry| match entry.event {
            JournalEvent::Grant {
                waiter,
                fencing_token,
            } => Some((waiter.to_string(), fencing_token)),
            _ => None,
        })
        .collect()
}

async fn record_busy_run() -> Journal<u64> {
    let registry = LockRegistry::builder().journal(JOURNAL_CAPACITY).spawn();
    run_busy_workload(&registry).await;
    let journal = registry.journal().await.expect("registry open");
    assert_eq!(journal.dropped, 0, "the journal must hold the whole run");
    journal
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_reproduces_every_grant_and_token_of_a_busy_multi_task_run() {
    let journal = record_busy_run().await;

    // The run did what the test claims: many grants, give-ups and would-blocks.
    let entries = &journal.entries;
    assert!(count(entries, |e| matches!(e, JournalEvent::Grant { .. })) >= 500);
    assert!(count(entries, |e| matches!(e, JournalEvent::Cancel { .. })) >= 60);
    assert!(count(entries, |e| matches!(e, JournalEvent::WouldBlock { .. })) >= 1);

    let replayed = replay(&journal).expect("nothing dropped");
    assert_eq!(grants(&replayed), grants(&journal.entries));
    assert_eq!(replayed.len(), journal.entries.len());
    if let Err(error) = verify(&journal) {
        panic!("{error}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_reproduces_a_busy_run_after_a_trip_through_the_trace_format() {
    let journal = record_busy_run().await;
    let trace = journal.to_json_lines().expect("integer keys are JSON");
    let parsed = Journal::from_json_lines(&trace).expect("the writer writes valid traces");
    assert_eq!(parsed, journal);
    if let Err(error) = verify(&parsed) {
        panic!("{error}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_reproduces_a_run_with_string_keys_after_a_trip_through_the_trace_format() {
    let registry = LockRegistry::<String>::builder()
        .journal(JOURNAL_CAPACITY)
        .spawn();
    let mut tasks = JoinSet::new();
    for task in 0..200 {
        let registry = registry.clone();
        tasks.spawn(async move {
            let key = ["user:\"ann\"", "path\\to", "naïve 🔑", "line\nbreak"][task % 4];
            let attempt =
                tokio::time::timeout(Duration::from_micros(100), registry.lock(key.to_owned()));
            if let Ok(Ok(guard)) = attempt.await {
                tokio::task::yield_now().await;
                drop(guard);
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("task ran");
    }
    let journal = registry.journal().await.expect("registry open");
    assert_eq!(journal.dropped, 0);

    let trace = journal.to_json_lines().expect("strings are JSON");
    let parsed = Journal::from_json_lines(&trace).expect("the writer writes valid traces");
    assert_eq!(parsed, journal);
    if let Err(error) = verify(&parsed) {
        panic!("{error}");
    }
}

/// A small run, recorded on the actor: two holders in turn and a waiter that times out.
async fn record_small_run() -> Journal<u64> {
    let registry = LockRegistry::builder().journal(1_000).spawn();
    let first = registry.lock(1).await.expect("registry open");
    let second = tokio::spawn({
        let registry = registry.clone();
        async move { registry.lock(1).await.map(drop) }
    });
    let gives_up = tokio::time::timeout(Duration::from_millis(1), registry.lock(1)).await;
    assert!(gives_up.is_err());
    drop(first);
    second.await.expect("task ran").expect("registry open");
    registry.journal().await.expect("registry open")
}

fn first_grant_after(journal: &Journal<u64>, index: usize) -> usize {
    journal.entries[index..]
        .iter()
        .position(|entry| matches!(entry.event, JournalEvent::Grant { .. }))
        .map(|offset| index + offset)
        .expect("the run granted after its start")
}

#[tokio::test]
async fn a_changed_fencing_token_is_reported_at_its_sequence_number() {
    let journal = record_small_run().await;
    let tampered_index = first_grant_after(&journal, 2);
    let tampered_seq = journal.entries[tampered_index].seq;
    let trace = journal.to_json_lines().expect("integer keys are JSON");
    let tampered_trace: String = trace
        .lines()
        .map(
            |line| match line.starts_with(&format!("{{\"seq\":{tampered_seq},")) {
                true => {
                    let (before_token, _) = line.rsplit_once(':').expect("a grant line");
                    format!("{before_token}:999}}}}}}\n")
                }
                false => format!("{line}\n"),
            },
        )
        .collect();
    assert_ne!(tampered_trace, trace);

    let tampered = Journal::from_json_lines(&tampered_trace).expect("still well formed");
    let Err(VerifyError::Diverged(divergence)) = verify(&tampered) else {
        panic!("a changed fencing token went unnoticed");
    };
    assert_eq!(divergence.seq, tampered_seq);
    assert!(matches!(
        divergence.expected.map(|entry| entry.event),
        Some(JournalEvent::Grant {
            fencing_token: 999,
            ..
        })
    ));
    assert_eq!(
        divergence.got,
        Some(journal.entries[tampered_index].clone())
    );
}

#[tokio::test]
async fn a_removed_grant_is_reported_at_its_sequence_number() {
    let mut journal = record_small_run().await;
    let removed_index = first_grant_after(&journal, 2);
    let removed = journal.entries.remove(removed_index);
    // Renumber, as someone editing a trace by hand would, so that the parser's sequence check
    // does not catch it first.
    for entry in &mut journal.entries[removed_index..] {
        entry.seq -= 1;
    }

    let Err(VerifyError::Diverged(divergence)) = verify(&journal) else {
        panic!("a removed grant went unnoticed");
    };
    assert_eq!(divergence.seq, removed.seq);
    assert_eq!(divergence.got, Some(removed));
    let shown = divergence.to_string();
    assert!(
        shown.starts_with(&format!(
            "replay diverges at seq {}: expected `",
            divergence.seq
        )),
        "{shown}"
    );
    assert!(shown.contains(" Grant { waiter: w"), "{shown}");
}

#[tokio::test]
async fn a_removed_trace_line_is_reported_by_the_parser_at_the_next_line() {
    let journal = record_small_run().await;
    let trace = journal.to_json_lines().expect("integer keys are JSON");
    let mut lines: Vec<&str> = trace.lines().collect();
    let removed_line = 1 + first_grant_after(&journal, 2); // after the header line
    lines.remove(removed_line);
    let error = Journal::<u64>::from_json_lines(&lines.join("\n")).unwrap_err();
    // Lines count from 1: the line after the removed one is now number `removed_line + 1`.
    assert_eq!(error.line(), Some(removed_line + 1), "{error}");
}

#[tokio::test]
async fn a_journal_that_dropped_events_is_refused_for_replay() {
    let registry = LockRegistry::builder().journal(2).spawn();
    drop(registry.lock(1u8).await.expect("registry open"));
    let journal = registry.journal().await.expect("registry open");
    assert_eq!(journal.dropped, 1);
    assert_eq!(
        replay(&journal),
        Err(ReplayError::Incomplete { dropped: 1 })
    );
    assert_eq!(
        verify(&journal),
        Err(VerifyError::Replay(ReplayError::Incomplete { dropped: 1 }))
    );
}

#[test]
fn notes_are_copied_by_a_replay_and_change_nothing_in_the_table() {
    use keyed_locks::table::JournaledTable;
    let mut table = JournaledTable::<&str, ()>::with_journal(100);
    let every_permit = table.table().all_permits();
    let _ = table.acquire("k", every_permit, ());
    table.note(r#"lease "k" requested"#.to_owned());
    table.set_time(Duration::from_micros(100));
    table.note(r#"lease "k" granted under fence 5"#.to_owned());
    let released = table
        .journal()
        .entries
        .iter()
        .find_map(|entry| match entry.event {
            JournalEvent::Grant { waiter, .. } => Some(waiter),
            _ => None,
        })
        .expect("a free key is granted");
    let _ = table.release(released, &mut Vec::new());
    let recorded = table.journal();
    assert!(recorded.entries.iter().any(|entry| entry.event.is_note()));
    verify(&recorded).unwrap();
    assert_eq!(replay(&recorded).unwrap(), recorded.entries);

    // The table's own events are still checked around the notes.
    let mut tampered = recorded.clone();
    tampered.entries[1].event = JournalEvent::Grant {
        waiter: released,
        fencing_token: 2,
    };
    assert!(
        matches!(verify(&tampered), Err(VerifyError::Diverged(divergence)) if divergence.seq == 2)
    );
}

#[tokio::test]
async fn a_journal_of_a_registry_with_permits_starts_with_its_capacity_and_replays() {
    let registry = LockRegistry::builder()
        .capacity(std::num::NonZeroU32::new(3).unwrap())
        .journal(1_000)
        .spawn();
    let shared = registry.lock_shared(1u32).await.unwrap();
    let two = registry.acquire(1, 2).await.unwrap();
    let mut exclusive = tokio_test::task::spawn(registry.lock(1));
    tokio_test::assert_pending!(exclusive.poll());
    drop((shared, two));
    drop(exclusive.await.unwrap());
    let journal = registry.journal().await.unwrap();
    assert_eq!(
        journal.entries[0].event,
        JournalEvent::Capacity { permits: 3 }
    );
    verify(&journal).unwrap();
    let trace = journal.to_json_lines().unwrap();
    assert!(
        trace.contains(r#""event":{"capacity":{"permits":3}}"#)
            && trace.contains(r#"{"acquire":{"waiter":2,"key":1,"permits":2}}"#)
            && trace.contains(r#"{"acquire":{"waiter":3,"key":1,"permits":3}}"#),
        "{trace}"
    );
    assert_eq!(Journal::from_json_lines(&trace).unwrap(), journal);
    // The same inputs on a table of another capacity give other outputs.
    let fewer_permits = trace.replace(
        r#"{"capacity":{"permits":3}}"#,
        r#"{"capacity":{"permits":2}}"#,
    );
    let fewer_permits = Journal::<u32>::from_json_lines(&fewer_permits).unwrap();
    assert!(verify(&fewer_permits).is_err());
}

/// A trace whose permits would sum past `u32::MAX` replays without a panic, and the request
/// that does not fit is not granted.
#[test]
fn a_trace_whose_permits_would_wrap_replays_and_grants_only_what_fits() {
    let trace = r#"{"format":"keyed-locks-trace","version":3,"dropped":0}
{"seq":1,"at_ns":0,"event":{"capacity":{"permits":4294967295}}}
{"seq":2,"at_ns":0,"event":{"acquire":{"waiter":1,"key":1,"permits":4294967294}}}
{"seq":3,"at_ns":0,"event":{"acquire":{"waiter":2,"key":1,"permits":2}}}
"#;
    let journal = Journal::<u64>::from_json_lines(trace).unwrap();
    let replayed = replay(&journal).unwrap();
    let granted: Vec<_> = replayed
        .iter()
        .filter_map(|entry| match entry.event {
            JournalEvent::Grant { waiter, .. } => Some(waiter),
            _ => None,
        })
        .collect();
    assert_eq!(granted.len(), 1, "{replayed:?}");
}
