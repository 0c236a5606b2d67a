//! A trace is a journal as JSON Lines: a header, then one entry per line. Every event kind
//! round-trips whatever its keys, and a bad header or line is refused with its line number.

use std::collections::BTreeMap;
use std::time::Duration;

use keyed_locks::journal::WaiterId;
use keyed_locks::journal::{Journal, JournalEntry, JournalEvent, Refusal};
use keyed_locks::replay::verify;
use keyed_locks::trace::{TRACE_FORMAT, TRACE_VERSION, TraceError};

const HEADER: &str = r#"{"format":"keyed-locks-trace","version":3,"dropped":0}"#;

fn waiter(arrival: u64) -> WaiterId {
    WaiterId::new(arrival).expect("arrivals count from 1")
}

/// A journal with every kind of event, keys made by `key`.
fn every_event<K: Clone>(key: impl Fn(u8) -> K) -> Journal<K> {
    let events = [
        JournalEvent::Capacity { permits: 3 },
        JournalEvent::Acquire {
            waiter: waiter(1),
            key: key(0),
            permits: 3,
        },
        JournalEvent::Grant {
            waiter: waiter(1),
            fencing_token: 1,
        },
        JournalEvent::TryAcquire {
            key: key(1),
            permits: 1,
        },
        JournalEvent::WouldBlock { key: key(1) },
        JournalEvent::AcquireAll {
            waiter: waiter(2),
            keys: vec![key(0), key(1)],
        },
        JournalEvent::TryAcquireAll {
            keys: vec![key(1), key(2)],
        },
        JournalEvent::WouldBlockAll,
        JournalEvent::Cancel { waiter: waiter(2) },
        JournalEvent::Release { waiter: waiter(9) },
        JournalEvent::Refused {
            waiter: waiter(9),
            reason: Refusal::Unknown,
        },
        JournalEvent::Refused {
            waiter: waiter(1),
            reason: Refusal::NotHolding,
        },
        JournalEvent::Refused {
            waiter: waiter(1),
            reason: Refusal::NotWaiting,
        },
        JournalEvent::Note {
            text: "lease \"a\" granted under fence 7\n".to_owned(),
        },
        JournalEvent::Shutdown,
        JournalEvent::Closed { waiter: waiter(3) },
    ];
    Journal {
        entries: (1..)
            .zip(events)
            .map(|(seq, event)| JournalEntry {
                seq: seq + 40,
                // Nanoseconds too, and a time far off: a trace keeps both exactly.
                at: Duration::new(seq * 1_000_000, 1 + seq as u32),
                event,
            })
            .collect(),
        dropped: 40,
    }
}

#[test]
fn every_event_kind_round_trips_with_integer_keys() {
    let journal = every_event(u64::from);
    let trace = journal.to_json_lines().unwrap();
    assert_eq!(trace.lines().count(), 1 + journal.entries.len());
    assert_eq!(Journal::from_json_lines(&trace).unwrap(), journal);
}

#[test]
fn every_event_kind_round_trips_with_string_keys_of_any_characters() {
    let names = ["user:\"ann\"", "path\\to\nline\tbreak\u{0}", "naïve 🔑"];
    let journal = every_event(|index| names[usize::from(index)].to_owned());
    let trace = journal.to_json_lines().unwrap();
    assert_eq!(trace.lines().count(), 1 + journal.entries.len());
    assert_eq!(Journal::from_json_lines(&trace).unwrap(), journal);
}

#[test]
fn a_trace_is_a_header_line_then_one_entry_per_line() {
    let journal = Journal {
        entries: vec![
            JournalEntry {
                seq: 1,
                at: Duration::from_micros(850),
                event: JournalEvent::Acquire {
                    waiter: waiter(1),
                    key: "user:42",
                    permits: 1,
                },
            },
            JournalEntry {
                seq: 2,
                at: Duration::from_micros(850),
                event: JournalEvent::Shutdown,
            },
        ],
        dropped: 0,
    };
    let mut written = Vec::new();
    journal
        .write_json_lines(Some("what it shows"), &mut written)
        .unwrap();
    assert_eq!(
        String::from_utf8(written).unwrap(),
        format!(
            "{{\"format\":\"{TRACE_FORMAT}\",\"version\":{TRACE_VERSION},\"dropped\":0,\
             \"description\":\"what it shows\"}}\n\
             {{\"seq\":1,\"at_ns\":850000,\"event\":{{\"acquire\":\
             {{\"waiter\":1,\"key\":\"user:42\",\"permits\":1}}}}}}\n\
             {{\"seq\":2,\"at_ns\":850000,\"event\":\"shutdown\"}}\n"
        )
    );
}

#[test]
fn the_description_and_blank_lines_change_nothing_read() {
    let plain = every_event(u64::from).to_json_lines().unwrap();
    let mut described = Vec::new();
    every_event(u64::from)
        .write_json_lines(Some("why this trace matters"), &mut described)
        .unwrap();
    let described = String::from_utf8(described).unwrap().replace('\n', "\n\n");
    assert_eq!(
        Journal::<u64>::from_json_lines(&described).unwrap(),
        Journal::<u64>::from_json_lines(&plain).unwrap()
    );
}

/// The error for a trace of `HEADER` and the given entry lines.
fn error_of(entries: &[&str]) -> TraceError {
    let trace = std::iter::once(HEADER)
        .chain(entries.iter().copied())
        .collect::<Vec<_>>()
        .join("\n");
    Journal::<String>::from_json_lines(&trace).expect_err("a malformed trace")
}

#[test]
fn a_malformed_line_is_refused_with_its_line_number() {
    let good = r#"{"seq":1,"at_ns":0,"event":{"try_acquire":{"key":"k","permits":1}}}"#;
    for bad in [
        "not json",
        r#"{"seq":2,"at_ns":0,"event":"explode"}"#,
        r#"{"seq":2,"at_ns":0,"event":{"release":{}}}"#,
        r#"{"seq":2,"at_ns":0,"event":{"release":{"waiter":0}}}"#,
        r#"{"seq":2,"at_ns":0,"event":{"release":{"waiter":1,"extra":true}}}"#,
        r#"{"seq":2,"at_ns":-1,"event":"shutdown"}"#,
        r#"{"seq":2,"at_ns":0,"event":{"would_block":{"key":7}}}"#,
        r#"{"seq":2,"at_ns":0,"event":{"refused":{"waiter":1,"reason":"bored"}}}"#,
    ] {
        let error = error_of(&[good, bad, good]);
        assert!(
            matches!(error, TraceError::Entry { line: 3, .. }),
            "{bad}: {error:?}"
        );
        assert_eq!(error.line(), Some(3));
        assert!(
            error
                .to_string()
                .starts_with("line 3: not a journal entry: "),
            "{error}"
        );
    }
}

#[test]
fn entries_must_be_numbered_on_from_the_dropped_count() {
    let entry = |seq: u64| format!(r#"{{"seq":{seq},"at_ns":0,"event":"shutdown"}}"#);
    let error = error_of(&[&entry(1), &entry(3)]);
    assert!(
        matches!(
            error,
            TraceError::BadSequence {
                line: 3,
                expected: 2,
                found: 3
            }
        ),
        "{error:?}"
    );
    assert_eq!(error.to_string(), "line 3: expected seq 2, found 3");
    assert!(matches!(
        error_of(&[&entry(2)]),
        TraceError::BadSequence { line: 2, .. }
    ));
    let resumed = format!(
        "{}\n{}\n",
        HEADER.replace("\"dropped\":0", "\"dropped\":10"),
        entry(11)
    );
    assert_eq!(
        Journal::<String>::from_json_lines(&resumed)
            .unwrap()
            .entries
            .len(),
        1
    );
}

#[test]
fn a_missing_or_bad_header_is_refused_at_line_one() {
    let entry = r#"{"seq":1,"at_ns":0,"event":"shutdown"}"#;
    let parse = |trace: &str| Journal::<String>::from_json_lines(trace).unwrap_err();
    assert!(matches!(parse(""), TraceError::MissingHeader));
    assert!(matches!(parse("\n  \n"), TraceError::MissingHeader));
    assert!(matches!(parse(entry), TraceError::Header { .. }));
    assert!(matches!(
        parse(&HEADER.replace("\"dropped\":0", "\"dropped\":\"none\"")),
        TraceError::Header { .. }
    ));
    let other = parse(&HEADER.replace("keyed-locks-trace", "csv"));
    assert!(matches!(&other, TraceError::NotATrace { found } if found == "csv"));
    let newer = parse(&HEADER.replace("\"version\":3", "\"version\":4"));
    assert!(matches!(newer, TraceError::UnsupportedVersion { found: 4 }));
    assert_eq!(
        newer.to_string(),
        "line 1: trace version 4 is not read by this version of keyed-locks, which reads \
         version 3 (record the trace again)"
    );
    // The text format that versions 1 and 2 wrote is named by its version, not "not JSON".
    let text = parse("# keyed-locks trace v2\n# dropped 0\n1 +0.000000s shutdown\n");
    assert!(matches!(text, TraceError::UnsupportedVersion { found: 2 }));
    for error in [other, newer, text] {
        assert_eq!(error.line(), Some(1));
    }
}

#[test]
fn a_key_that_json_cannot_write_is_a_write_error() {
    // JSON objects have string keys only.
    let key = BTreeMap::from([(vec![1u8], 1u8)]);
    let journal = Journal {
        entries: vec![JournalEntry {
            seq: 1,
            at: Duration::ZERO,
            event: JournalEvent::WouldBlock { key },
        }],
        dropped: 0,
    };
    let error = journal.to_json_lines().unwrap_err();
    assert!(matches!(error, TraceError::Write { .. }), "{error:?}");
    assert_eq!(error.line(), None);
    assert!(
        error.to_string().starts_with("cannot write the trace: "),
        "{error}"
    );
}

#[test]
fn the_quickstart_trace_in_the_docs_parses_and_replays() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/quickstart.jsonl");
    let text = std::fs::read_to_string(path).expect("docs/quickstart.jsonl");
    let journal = Journal::<u64>::from_json_lines(&text).unwrap();
    assert!(
        journal.entries.len() >= 6,
        "{} entries",
        journal.entries.len()
    );
    verify(&journal).unwrap();
}
