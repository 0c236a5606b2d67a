//! Parsing and replay never panic, whatever the input: random bytes, trace-like text, and
//! well-formed journals whose events make no sense together.

use std::time::Duration;

use keyed_locks::journal::WaiterId;
use keyed_locks::journal::{Journal, JournalEntry, JournalEvent, Refusal};
use keyed_locks::replay::{ReplayError, VerifyError, first_divergence, replay, verify};
use keyed_locks::table::JournaledTable;
use proptest::prelude::*;

/// Ids a fresh table hands out early (arrivals 1 to 8), plus ones it does not for a long
/// time, so that random journals name both live and unknown waiters.
fn any_waiter() -> impl Strategy<Value = WaiterId> {
    prop_oneof![4 => 1u64..9, 1 => 1u64..=u64::MAX]
        .prop_map(|arrival| WaiterId::new(arrival).expect("arrivals count from 1"))
}

fn any_refusal() -> impl Strategy<Value = Refusal> {
    prop_oneof![
        Just(Refusal::Unknown),
        Just(Refusal::NotHolding),
        Just(Refusal::NotWaiting)
    ]
}

/// Any event over three keys: inputs and outputs alike, in no sensible order.
fn any_event() -> impl Strategy<Value = JournalEvent<u8>> {
    let key = 0u8..3;
    prop_oneof![
        // Permit counts a table of one permit per key refuses (0, 2) included.
        3 => (any_waiter(), key.clone(), 0u32..3)
            .prop_map(|(waiter, key, permits)| JournalEvent::Acquire { waiter, key, permits }),
        2 => (key.clone(), 0u32..3).prop_map(|(key, permits)| JournalEvent::TryAcquire { key, permits }),
        3 => any_waiter().prop_map(|waiter| JournalEvent::Release { waiter }),
        2 => any_waiter().prop_map(|waiter| JournalEvent::Cancel { waiter }),
        1 => Just(JournalEvent::Shutdown),
        2 => (any_waiter(), 0u64..20)
            .prop_map(|(waiter, fencing_token)| JournalEvent::Grant { waiter, fencing_token }),
        1 => key.prop_map(|key| JournalEvent::WouldBlock { key }),
        1 => any_waiter().prop_map(|waiter| JournalEvent::Closed { waiter }),
        1 => (any_waiter(), any_refusal()).prop_map(|(waiter, reason)| JournalEvent::Refused { waiter, reason }),
    ]
}

/// Journals with well-formed lines (numbered from 1, times not going backwards, or sometimes
/// not) whose events are random.
fn any_inconsistent_journal() -> impl Strategy<Value = Journal<u8>> {
    (
        prop_oneof![4 => Just(0u64), 1 => any::<u64>()],
        any::<bool>(),
        proptest::collection::vec((any_event(), 0u64..1_000, any::<u64>()), 0..60),
    )
        .prop_map(|(dropped, numbered_in_order, steps)| {
            let mut at = Duration::ZERO;
            let entries = steps
                .into_iter()
                .enumerate()
                .map(|(index, (event, micros_later, random_seq))| {
                    at += Duration::from_micros(micros_later);
                    let seq = if numbered_in_order {
                        index as u64 + 1
                    } else {
                        random_seq
                    };
                    JournalEntry { seq, at, event }
                })
                .collect();
            Journal { entries, dropped }
        })
}

/// A valid trace of a random journal with a few random edits: characters deleted, replaced
/// or inserted, lines swapped or repeated. Most results are invalid in one small place.
fn mutated_trace() -> impl Strategy<Value = String> {
    let edit = (
        0u8..5,
        any::<prop::sample::Index>(),
        any::<prop::sample::Index>(),
        any::<char>(),
    );
    (
        any_inconsistent_journal(),
        proptest::collection::vec(edit, 0..4),
    )
        .prop_map(|(journal, edits)| {
            let journal = Journal {
                dropped: 0,
                ..journal
            };
            let trace = journal.to_json_lines().expect("integer keys are JSON");
            let mut characters: Vec<char> = trace.chars().collect();
            for (kind, first, second, character) in edits {
                if characters.is_empty() {
                    break;
                }
                let at = first.index(characters.len());
                match kind {
                    0 => {
                        characters.remove(at);
                    }
                    1 => characters[at] = character,
                    2 => characters.insert(at, character),
                    _ => {
                        let text: String = characters.iter().collect();
                        let mut lines: Vec<&str> = text.split('\n').collect();
                        let (one, other) = (first.index(lines.len()), second.index(lines.len()));
                        if kind == 3 {
                            lines.swap(one, other);
                        } else {
                            lines.insert(other, lines[one]);
                        }
                        characters = lines.join("\n").chars().collect();
                    }
                }
            }
            characters.into_iter().collect()
        })
}

/// One input of a script applied to a real table: a key or an index into the ids seen so far.
#[derive(Debug, Clone)]
enum Step {
    Acquire(u8),
    TryAcquire(u8),
    Release(usize),
    Cancel(usize),
    Shutdown,
}

fn any_step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0u8..3).prop_map(Step::Acquire),
        2 => (0u8..3).prop_map(Step::TryAcquire),
        4 => any::<usize>().prop_map(Step::Release),
        2 => any::<usize>().prop_map(Step::Cancel),
        1 => Just(Step::Shutdown),
    ]
}

fn one_permit(table: &JournaledTable<u8, ()>) -> keyed_locks::table::Permits {
    table.table().all_permits()
}

/// The journal a real table records for `steps`, releases and cancels naming ids it issued
/// (some long gone), so that many of them are refused.
fn journal_of(steps: &[Step]) -> Journal<u8> {
    let mut table = JournaledTable::<u8, ()>::with_journal(usize::MAX);
    let mut issued: Vec<WaiterId> = Vec::new();
    let mut granted = Vec::new();
    for (index, step) in steps.iter().enumerate() {
        table.set_time(Duration::from_micros(index as u64 * 10));
        let pick = |choice: &usize| issued.get(choice % issued.len().max(1)).copied();
        match step {
            Step::Acquire(key) => issued.push(match table.acquire(*key, one_permit(&table), ()) {
                keyed_locks::table::Acquired::Granted(grant) => grant.waiter_id,
                keyed_locks::table::Acquired::Queued(waiter_id) => waiter_id,
            }),
            Step::TryAcquire(key) => {
                if let Ok(grant) = table.try_acquire(*key, one_permit(&table)) {
                    issued.push(grant.waiter_id);
                }
            }
            Step::Release(choice) => {
                if let Some(waiter) = pick(choice) {
                    let _ = table.release(waiter, &mut granted);
                }
            }
            Step::Cancel(choice) => {
                if let Some(waiter) = pick(choice) {
                    let _ = table.cancel(waiter, &mut Vec::new());
                }
            }
            Step::Shutdown => {
                let _ = table.shutdown();
            }
        }
    }
    table.journal()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1_000))]

    #[test]
    fn parsing_random_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let text = String::from_utf8_lossy(&bytes);
        let _ = Journal::<u64>::from_json_lines(&text);
        let _ = Journal::<String>::from_json_lines(&text);
    }

    #[test]
    fn parsing_a_mutated_trace_never_panics_and_what_parses_round_trips(text in mutated_trace()) {
        if let Ok(journal) = Journal::<u64>::from_json_lines(&text) {
            let written = journal.to_json_lines().unwrap();
            prop_assert_eq!(Journal::from_json_lines(&written).unwrap(), journal.clone());
            let _ = verify(&journal);
        }
        let _ = Journal::<String>::from_json_lines(&text);
    }

    #[test]
    fn replaying_an_inconsistent_journal_never_panics(journal in any_inconsistent_journal()) {
        match replay(&journal) {
            Ok(replayed) => {
                let _ = first_divergence(&journal.entries, &replayed);
                // Whatever went in, what comes out is what a table records: it verifies.
                let replayed = Journal { entries: replayed, dropped: 0 };
                prop_assert_eq!(verify(&replayed), Ok(()));
            }
            Err(ReplayError::Incomplete { dropped }) => prop_assert_eq!(dropped, journal.dropped),
            Err(other) => prop_assert!(false, "unexpected {other:?}"),
        }
        match verify(&journal) {
            Ok(()) | Err(VerifyError::Replay(_)) => {}
            Err(VerifyError::Diverged(divergence)) => {
                let _ = divergence.to_string();
            }
            Err(other) => prop_assert!(false, "unexpected {other:?}"),
        }
    }

    #[test]
    fn a_journal_recorded_by_a_table_verifies_even_when_its_calls_make_no_sense(
        steps in proptest::collection::vec(any_step(), 0..80)
    ) {
        let journal = journal_of(&steps);
        prop_assert_eq!(verify(&journal), Ok(()));
        let trace = journal.to_json_lines().unwrap();
        prop_assert_eq!(Journal::from_json_lines(&trace).unwrap(), journal);
    }

    #[test]
    fn comparing_any_two_event_lists_never_panics(
        recorded in any_inconsistent_journal(),
        replayed in any_inconsistent_journal(),
    ) {
        if let Some(divergence) = first_divergence(&recorded.entries, &replayed.entries) {
            prop_assert!(divergence.expected.is_some() || divergence.got.is_some());
            prop_assert_ne!(divergence.expected, divergence.got);
        } else {
            prop_assert_eq!(recorded.entries.len(), replayed.entries.len());
        }
    }
}
