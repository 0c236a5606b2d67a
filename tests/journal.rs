//! The journal records every table input and output in order, with sequence numbers and
//! times, in a bounded ring that counts what it dropped; it is empty when turned off; and a
//! scripted run under paused time gives the same journal every time. After a shutdown it stays
//! readable and ends with the shutdown.

use std::time::Duration;

use keyed_locks::journal::{Journal, JournalEvent, Refusal};
use keyed_locks::{Execution, LockRegistry};
use tokio_test::{assert_pending, task};

#[tokio::test]
async fn the_journal_is_empty_when_off() {
    let registry = LockRegistry::spawn();
    drop(registry.lock(1).await.unwrap());
    assert_eq!(registry.journal().await.unwrap(), Journal::default());
}

#[tokio::test]
async fn inputs_and_outputs_are_recorded_in_order() {
    let registry = LockRegistry::builder().journal(100).spawn();
    let holder = registry.lock("k").await.unwrap();
    let mut gives_up = task::spawn(registry.lock("k"));
    assert_pending!(gives_up.poll());
    registry.stats().await.unwrap();
    drop(gives_up);
    assert!(registry.try_lock("k").await.is_err());
    drop(holder);
    let journal = registry.journal().await.unwrap();

    let events: Vec<_> = journal.entries.iter().map(|entry| &entry.event).collect();
    let (holder_id, waiter_id) = match (events[0], events[2]) {
        (JournalEvent::Acquire { waiter: h, .. }, JournalEvent::Acquire { waiter: w, .. }) => {
            (*h, *w)
        }
        other => panic!("unexpected start {other:?}"),
    };
    assert_eq!(
        events,
        [
            &JournalEvent::Acquire {
                waiter: holder_id,
                key: "k",
                permits: 1
            },
            &JournalEvent::Grant {
                waiter: holder_id,
                fencing_token: 1
            },
            &JournalEvent::Acquire {
                waiter: waiter_id,
                key: "k",
                permits: 1
            },
            &JournalEvent::Cancel { waiter: waiter_id },
            &JournalEvent::TryAcquire {
                key: "k",
                permits: 1
            },
            &JournalEvent::WouldBlock { key: "k" },
            &JournalEvent::Release { waiter: holder_id },
        ]
    );
    let seqs: Vec<u64> = journal.entries.iter().map(|entry| entry.seq).collect();
    assert_eq!(seqs, (1..=7).collect::<Vec<_>>());
    assert_eq!(journal.dropped, 0);
}

#[tokio::test]
async fn a_full_journal_drops_the_oldest_and_counts_them() {
    let registry = LockRegistry::builder().journal(10).spawn();
    for key in 0..20u32 {
        drop(registry.lock(key).await.unwrap()); // acquire, grant, release: 3 events
    }
    let journal = registry.journal().await.unwrap();
    assert_eq!((journal.entries.len(), journal.dropped), (10, 50));
    let seqs: Vec<u64> = journal.entries.iter().map(|entry| entry.seq).collect();
    assert_eq!(seqs, (51..=60).collect::<Vec<_>>());
}

#[tokio::test]
async fn a_refused_release_is_recorded_as_refused() {
    // The only refused call a registry makes on its own: a cancel that arrives after its
    // waiter's grant was refused in flight and released. In actor mode both requests wait in
    // the queue, release first; with the default mode this takes two threads.
    let registry = LockRegistry::builder()
        .execution(Execution::ActorTask)
        .journal(100)
        .spawn();
    let holder = registry.lock(1).await.unwrap();
    let mut waiter = task::spawn(registry.lock(1));
    assert_pending!(waiter.poll());
    registry.stats().await.unwrap();
    drop(holder);
    drop(waiter);
    let journal = registry.journal().await.unwrap();
    let tail = last_events(&journal, 2);
    assert!(
        matches!(
            tail[..],
            [
                JournalEvent::Refused {
                    reason: Refusal::Unknown,
                    ..
                },
                JournalEvent::Cancel { .. }
            ]
        ),
        "{tail:?}"
    );
}

/// The last `count` events of `journal`, newest first.
fn last_events<K>(journal: &Journal<K>, count: usize) -> Vec<&JournalEvent<K>> {
    journal
        .entries
        .iter()
        .rev()
        .take(count)
        .map(|e| &e.event)
        .collect()
}

/// A scripted scenario with timeouts and several tasks, on tokio's paused clock.
async fn scripted_run() -> Journal<String> {
    let registry = LockRegistry::builder().journal(10_000).spawn();
    let tasks: Vec<_> = (0..60u64)
        .map(|n| {
            let registry = registry.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(n % 7)).await;
                let key = format!("user:{}", n % 3);
                let patience = Duration::from_millis(2 + n % 5);
                if let Ok(Ok(_guard)) = tokio::time::timeout(patience, registry.lock(key)).await {
                    tokio::time::sleep(Duration::from_millis(1 + n % 4)).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    registry.journal().await.unwrap()
}

#[test]
fn a_scripted_run_under_paused_time_gives_the_same_journal_twice() {
    let run = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap()
            .block_on(scripted_run())
    };
    let (first, second) = (run(), run());
    assert!(first.entries.len() > 100, "{} events", first.entries.len());
    assert!(
        first
            .entries
            .iter()
            .any(|e| matches!(e.event, JournalEvent::Cancel { .. })),
        "the script should include timeouts"
    );
    // Byte for byte, as the trace files a user would diff.
    let (first, second) = (
        first.to_json_lines().unwrap(),
        second.to_json_lines().unwrap(),
    );
    assert_eq!(first, second);
}

#[tokio::test]
async fn the_journal_stays_readable_after_shutdown_and_ends_with_it() {
    let registry = LockRegistry::builder().journal(100).spawn();
    let holder = registry.lock(1).await.unwrap();
    let mut waiter = task::spawn(registry.lock(1));
    assert_pending!(waiter.poll());
    registry.stats().await.unwrap();
    registry.shutdown().await;

    let journal = registry.journal().await.unwrap();
    let tail = last_events(&journal, 2);
    assert!(
        matches!(
            tail[..],
            [JournalEvent::Closed { .. }, JournalEvent::Shutdown]
        ),
        "{tail:?}"
    );
    assert!(keyed_locks::replay::verify(&journal).is_ok());
    drop(holder);
}
