//! A trace is read back exactly as it was written, and a malformed trace is rejected whole,
//! naming the line at fault and what was expected there.

use std::time::Duration;

use keyed_locks::journal::{
    Journal, JournalEntry, JournalEvent, LeaseEvent, LeaseNote, Refusal, parse_waiter,
};
use keyed_locks::table::WaiterId;
use keyed_locks::trace::{
    Expected, IntegerKeys, KeyCodec, StringKeyError, StringKeys, TraceError, parse_trace,
    write_trace,
};
use proptest::prelude::*;

fn waiter(text: &str) -> WaiterId {
    parse_waiter(text).expect("a well-formed waiter id")
}

fn entry<K>(seq: u64, micros: u64, event: JournalEvent<K>) -> JournalEntry<K> {
    JournalEntry {
        seq,
        at: Duration::from_micros(micros),
        event,
    }
}

/// One event of every kind, with string keys.
fn every_kind_of_event(keys: [&str; 3]) -> Journal<String> {
    let [first, second, third] = keys.map(String::from);
    Journal {
        entries: vec![
            entry(
                4,
                0,
                JournalEvent::Acquire {
                    waiter: waiter("w1"),
                    key: first,
                },
            ),
            entry(
                5,
                0,
                JournalEvent::Grant {
                    waiter: waiter("w1"),
                    fencing_token: 1,
                },
            ),
            entry(
                6,
                12,
                JournalEvent::TryAcquire {
                    key: second.clone(),
                },
            ),
            entry(7, 12, JournalEvent::WouldBlock { key: second }),
            entry(
                8,
                4_113,
                JournalEvent::Acquire {
                    waiter: waiter("w11"),
                    key: third,
                },
            ),
            entry(
                9,
                4_113,
                JournalEvent::Cancel {
                    waiter: waiter("w1"),
                },
            ),
            entry(
                10,
                4_113,
                JournalEvent::Refused {
                    waiter: waiter("w1"),
                    reason: Refusal::NotWaiting,
                },
            ),
            entry(
                11,
                5_000,
                JournalEvent::Release {
                    waiter: waiter("w73"),
                },
            ),
            entry(
                12,
                5_000,
                JournalEvent::Refused {
                    waiter: waiter("w73"),
                    reason: Refusal::Unknown,
                },
            ),
            entry(
                13,
                5_000,
                JournalEvent::Refused {
                    waiter: waiter("w11"),
                    reason: Refusal::NotHolding,
                },
            ),
            entry(14, 1_000_000_000, JournalEvent::Shutdown),
            entry(
                15,
                1_000_000_000,
                JournalEvent::Closed {
                    waiter: waiter("w11"),
                },
            ),
        ],
        dropped: 3,
    }
}

const TWO_GOOD_LINES: &str = "# keyed-locks trace v2\n\
                              # dropped 0\n\
                              1 +0.000000s acquire w1 \"k\"\n\
                              2 +0.000000s grant w1 1\n";

/// Writing `journal` gives back `trace`'s lines, after the header and the `# dropped` line.
#[track_caller]
fn assert_written_as(journal: &Journal<String>, trace: &str) {
    assert_eq!(
        write_trace(journal, &StringKeys)
            .lines()
            .skip(2)
            .collect::<Vec<_>>(),
        trace.lines().collect::<Vec<_>>()
    );
}

/// Parses `TWO_GOOD_LINES` followed by `bad_line` (line 5) and returns the error.
fn error_for_line_five(bad_line: &str) -> TraceError {
    let trace = format!("{TWO_GOOD_LINES}{bad_line}\n4 +0.000009s shutdown\n");
    match parse_trace(&trace, &StringKeys) {
        Ok(journal) => panic!("accepted {bad_line:?} as {journal:?}"),
        Err(error) => error,
    }
}

#[test]
fn every_kind_of_event_round_trips_with_string_keys() {
    let journal = every_kind_of_event(["user:42", "say \"hi\"\\ back\\\\", "naïve 🔑\n\t\r\u{7}"]);
    let trace = write_trace(&journal, &StringKeys);
    assert_eq!(
        parse_trace(&trace, &StringKeys).unwrap(),
        journal,
        "{trace}"
    );
}

#[test]
fn the_writer_produces_the_documented_lines() {
    let journal = every_kind_of_event(["user:42", "a\"b\\c", "é\nz"]);
    let expected = r#"# keyed-locks trace v2
# dropped 3
4 +0.000000s acquire w1 "user:42"
5 +0.000000s grant w1 1
6 +0.000012s try_acquire "a\"b\\c"
7 +0.000012s would_block "a\"b\\c"
8 +0.004113s acquire w11 "é\nz"
9 +0.004113s cancel w1
10 +0.004113s refused w1 not_waiting
11 +0.005000s release w73
12 +0.005000s refused w73 unknown
13 +0.005000s refused w11 not_holding
14 +1000.000000s shutdown
15 +1000.000000s closed w11
"#;
    assert_eq!(write_trace(&journal, &StringKeys), expected);
}

#[test]
fn integer_keys_round_trip_at_the_limits_of_their_types() {
    for key in [0, 1, -1, i64::MIN, i64::MAX] {
        let journal = Journal {
            entries: vec![entry(1, 0, JournalEvent::TryAcquire { key })],
            dropped: 0,
        };
        let trace = write_trace(&journal, &IntegerKeys);
        assert_eq!(parse_trace(&trace, &IntegerKeys).unwrap(), journal);
    }
    let journal = Journal {
        entries: vec![entry(1, 0, JournalEvent::TryAcquire { key: u128::MAX })],
        dropped: 0,
    };
    let trace = write_trace(&journal, &IntegerKeys);
    assert_eq!(parse_trace(&trace, &IntegerKeys).unwrap(), journal);
}

#[test]
fn times_that_are_not_whole_microseconds_are_written_with_nanoseconds() {
    let journal = Journal {
        entries: vec![
            entry(1, 0, JournalEvent::Shutdown),
            JournalEntry {
                seq: 2,
                at: Duration::new(3, 123_456_789),
                event: JournalEvent::Shutdown,
            },
        ],
        dropped: 0,
    };
    let trace = write_trace(&journal, &IntegerKeys);
    assert!(trace.contains("2 +3.123456789s shutdown\n"), "{trace}");
    assert_eq!(parse_trace::<u8, _>(&trace, &IntegerKeys).unwrap(), journal);
}

#[test]
fn header_dropped_line_comments_blank_lines_and_crlf_are_accepted() {
    let trace = "# keyed-locks trace v2\r\n\
                 # recorded on a Tuesday\r\n\
                 \r\n\
                 # dropped 5\r\n\
                 6 +0.000001s shutdown\r\n\
                 \t \n\
                 #dropped is a comment\n\
                 7 +0.000001s closed w35\n";
    let journal = parse_trace::<u8, _>(trace, &IntegerKeys).unwrap();
    assert_eq!(journal.dropped, 5);
    assert_eq!(journal.entries.len(), 2);
}

#[test]
fn an_empty_trace_is_an_empty_journal() {
    assert_eq!(
        parse_trace::<u8, _>("", &IntegerKeys).unwrap(),
        Journal::default()
    );
}

#[test]
fn a_malformed_waiter_is_rejected_with_its_line_and_what_was_expected() {
    for bad_line in [
        "3 +0.000001s release x",
        "3 +0.000001s release w0",   // arrival numbers start at 1
        "3 +0.000001s release w3v1", // the v1 form
        "3 +0.000001s release w+3",
        "3 +0.000001s release w18446744073709551616",
        "3 +0.000001s cancel W3",
        "3 +0.000001s grant 2 w3",
        "3 +0.000001s acquire \"k\" w3",
    ] {
        let error = error_for_line_five(bad_line);
        assert!(
            matches!(
                error,
                TraceError::Expected {
                    line: 5,
                    expected: Expected::Waiter,
                    ..
                }
            ),
            "{bad_line}: {error:?}"
        );
    }
    assert_eq!(
        error_for_line_five("3 +0.000001s release x").to_string(),
        "line 5: expected a waiter like w17, found \"x\""
    );
    assert_eq!(
        error_for_line_five("3 +0.000001s closed").to_string(),
        "line 5: expected a waiter like w17, found the end of the line"
    );
}

#[test]
fn each_malformed_field_is_rejected_with_what_was_expected() {
    let cases = [
        ("three +0.000001s shutdown", Expected::SequenceNumber),
        ("+3 +0.000001s shutdown", Expected::SequenceNumber),
        ("3", Expected::Time),
        ("3 0.000001s shutdown", Expected::Time),
        ("3 +0.001s shutdown", Expected::Time),
        ("3 +0.000001 shutdown", Expected::Time),
        ("3 +x.000001s shutdown", Expected::Time),
        ("3  +0.000001s shutdown", Expected::Time),
        ("3 +0.000001s grant w1", Expected::FencingToken),
        ("3 +0.000001s grant w1 -1", Expected::FencingToken),
        ("3 +0.000001s refused w1 busy", Expected::Refusal),
        ("3 +0.000001s acquire w11", Expected::Key),
        ("3 +0.000001s try_acquire", Expected::Key),
        ("3 +0.000001s shutdown now", Expected::EndOfLine),
        ("3 +0.000001s release w1 \"k\"", Expected::EndOfLine),
        ("3 +0.000001s grant w1 2 # second", Expected::EndOfLine),
        ("3 +0.000001s refused w1 unknown extra", Expected::EndOfLine),
    ];
    for (bad_line, what) in cases {
        let error = error_for_line_five(bad_line);
        assert!(
            matches!(&error, TraceError::Expected { line: 5, expected, .. } if *expected == what),
            "{bad_line}: {error:?}"
        );
        assert!(
            error
                .to_string()
                .starts_with(&format!("line 5: expected {what}")),
            "{error}"
        );
    }
}

#[test]
fn an_unknown_event_is_rejected_with_its_line() {
    let error = error_for_line_five("3 +0.000001s steal w1");
    assert!(matches!(&error, TraceError::UnknownEvent { line: 5, found } if found == "steal"));
    assert!(
        error
            .to_string()
            .starts_with("line 5: unknown event \"steal\" (expected acquire")
    );
    // Event names are case-sensitive.
    assert!(matches!(
        error_for_line_five("3 +0.000001s Shutdown"),
        TraceError::UnknownEvent { line: 5, .. }
    ));
}

#[test]
fn a_key_the_codec_cannot_read_is_rejected_with_its_line() {
    let cases = [
        (
            "3 +0.000001s try_acquire k",
            StringKeyError::NotQuoted { found: "k".into() },
        ),
        ("3 +0.000001s try_acquire \"k", StringKeyError::Unterminated),
        (
            "3 +0.000001s would_block \"k\" \"j\"",
            StringKeyError::TextAfterClosingQuote {
                found: " \"j\"".into(),
            },
        ),
        (
            "3 +0.000001s acquire w11 \"a\\qb\"",
            StringKeyError::UnknownEscape { found: "q".into() },
        ),
        (
            "3 +0.000001s acquire w11 \"\\u{110000}\"",
            StringKeyError::BadUnicodeEscape {
                found: "u{110000}\"".into(),
            },
        ),
        (
            "3 +0.000001s acquire w11 \"tab\there\"",
            StringKeyError::RawControlCharacter { found: '\t' },
        ),
    ];
    for (bad_line, cause) in cases {
        let error = error_for_line_five(bad_line);
        let TraceError::Key { line: 5, source } = &error else {
            panic!("{bad_line}: {error:?}");
        };
        assert_eq!(
            source.downcast_ref::<StringKeyError>(),
            Some(&cause),
            "{bad_line}"
        );
        assert!(
            error.to_string().starts_with("line 5: bad key: "),
            "{error}"
        );
    }
}

#[test]
fn an_integer_key_that_does_not_fit_is_rejected_with_its_line() {
    let error = parse_trace::<u8, _>("1 +0.000000s try_acquire 256\n", &IntegerKeys).unwrap_err();
    assert_eq!(
        error.to_string(),
        "line 1: bad key: key \"256\" does not fit a u8"
    );
    let error = parse_trace::<i8, _>("1 +0.000000s try_acquire +5\n", &IntegerKeys).unwrap_err();
    assert_eq!(
        error.to_string(),
        "line 1: bad key: expected an integer key like 42, found \"+5\""
    );
    let error = parse_trace::<u8, _>("1 +0.000000s try_acquire \"5\"\n", &IntegerKeys).unwrap_err();
    assert!(matches!(error, TraceError::Key { line: 1, .. }));
}

#[test]
fn sequence_numbers_must_count_up_by_one() {
    for (bad_line, expected, found) in [
        ("2 +0.000001s shutdown", 3, 2), // duplicate
        ("1 +0.000001s shutdown", 3, 1), // out of order
        ("4 +0.000001s shutdown", 3, 4), // a gap
    ] {
        let error = error_for_line_five(bad_line);
        assert!(
            matches!(error, TraceError::BadSequence { line: 5, expected: e, found: f } if (e, f) == (expected, found)),
            "{bad_line}: {error:?}"
        );
        assert_eq!(
            error.to_string(),
            format!("line 5: expected sequence number {expected}, found {found}")
        );
    }
}

#[test]
fn the_first_sequence_number_follows_the_dropped_events() {
    let trace = "# dropped 10\n\n10 +0.000000s shutdown\n";
    let error = parse_trace::<u8, _>(trace, &IntegerKeys).unwrap_err();
    assert!(matches!(
        error,
        TraceError::BadSequence {
            line: 3,
            expected: 11,
            found: 10
        }
    ));
    assert!(parse_trace::<u8, _>("11 +0.000000s shutdown\n", &IntegerKeys).is_err());
    assert!(parse_trace::<u8, _>("# dropped 10\n11 +0.000000s shutdown\n", &IntegerKeys).is_ok());
}

#[test]
fn sequence_numbers_past_u64_max_are_rejected() {
    let trace = format!("# dropped {}\n", u64::MAX);
    assert!(parse_trace::<u8, _>(&trace, &IntegerKeys).is_ok());
    let error =
        parse_trace::<u8, _>(&format!("{trace}1 +0.000000s shutdown\n"), &IntegerKeys).unwrap_err();
    assert!(matches!(error, TraceError::SequenceOverflow { line: 2 }));
}

#[test]
fn time_going_backwards_is_rejected_with_its_line() {
    let trace = "1 +0.000200s shutdown\n2 +0.000200s shutdown\n3 +0.000199s shutdown\n";
    let error = parse_trace::<u8, _>(trace, &IntegerKeys).unwrap_err();
    assert!(matches!(
        error,
        TraceError::TimeWentBackwards { line: 3, .. }
    ));
    assert_eq!(
        error.to_string(),
        "line 3: time +0.000199s is before the previous event's +0.000200s"
    );
}

#[test]
fn a_version_1_trace_is_rejected_with_what_changed() {
    let error = parse_trace::<u8, _>(
        "# keyed-locks trace v1\n1 +0.000000s acquire w1v1 7\n",
        &IntegerKeys,
    )
    .unwrap_err();
    assert!(
        matches!(error, TraceError::UnsupportedVersion { line: 1, ref found } if found == "v1")
    );
    assert_eq!(
        error.to_string(),
        "line 1: trace version \"v1\" names waiters by storage slot (w3v1), which the table no \
         longer uses; this parser reads v2 (waiters numbered in order of arrival, w17): record \
         the trace again"
    );
}

#[test]
fn headers_and_dropped_lines_are_checked() {
    let parse = |trace: &str| parse_trace::<u8, _>(trace, &IntegerKeys).unwrap_err();
    assert!(matches!(
        parse("# keyed-locks trace v3\n"),
        TraceError::UnsupportedVersion { line: 1, .. }
    ));
    assert!(matches!(
        parse("\n# keyed-locks trace v2\n"),
        TraceError::MisplacedHeader { line: 2 }
    ));
    assert!(matches!(
        parse("# dropped 1\n# dropped 1\n"),
        TraceError::DroppedTwice { line: 2 }
    ));
    assert!(matches!(
        parse("1 +0.000000s shutdown\n# dropped 0\n"),
        TraceError::DroppedAfterEvents { line: 2 }
    ));
    assert!(matches!(
        parse("# dropped many\n"),
        TraceError::Expected {
            line: 1,
            expected: Expected::DroppedCount,
            ..
        }
    ));
    assert!(matches!(
        parse("# dropped\n"),
        TraceError::Expected {
            line: 1,
            expected: Expected::DroppedCount,
            found: None
        }
    ));
}

#[test]
fn nothing_is_loaded_from_a_trace_with_one_bad_line() {
    // Many good lines, then one bad one: the result is the error alone, no partial journal.
    let mut trace = String::from(TWO_GOOD_LINES);
    for seq in 3..=1_000 {
        trace.push_str(&format!("{seq} +0.000001s try_acquire \"k\"\n"));
    }
    trace.push_str("1001 +0.000001s try_acquire k\n");
    let result: Result<Journal<String>, TraceError> = parse_trace(&trace, &StringKeys);
    let Err(error) = result else {
        panic!("a trace with a bad last line was loaded")
    };
    assert_eq!(error.line(), 1_003);
}

#[test]
fn the_string_codec_escapes_what_would_break_a_line() {
    let mut text = String::new();
    StringKeys.encode(&"a\"\\\n\r\t\u{0}\u{7f}é".to_string(), &mut text);
    assert_eq!(text, r#""a\"\\\n\r\t\u{0}\u{7f}é""#);
    assert!(!text.contains('\n') && !text.contains('\r'));
}

fn any_waiter() -> impl Strategy<Value = WaiterId> {
    (1u64..=u64::MAX).prop_map(|arrival| WaiterId::new(arrival).expect("arrivals count from 1"))
}

/// Any string, control characters included (`any::<String>()` leaves them out).
fn any_key() -> impl Strategy<Value = String> + Clone {
    proptest::collection::vec(any::<char>(), 0..12).prop_map(String::from_iter)
}

/// Any key, for the events with permits (a second strategy: `any_key` is moved into the
/// others).
fn key_for_permits() -> impl Strategy<Value = String> {
    any_key()
}

fn any_event() -> impl Strategy<Value = JournalEvent<String>> {
    let key = any_key();
    prop_oneof![
        (any_waiter(), key.clone()).prop_map(|(waiter, key)| JournalEvent::Acquire { waiter, key }),
        key.clone().prop_map(|key| JournalEvent::TryAcquire { key }),
        any_waiter().prop_map(|waiter| JournalEvent::Release { waiter }),
        any_waiter().prop_map(|waiter| JournalEvent::Cancel { waiter }),
        Just(JournalEvent::Shutdown),
        (any_waiter(), any::<u64>()).prop_map(|(waiter, fencing_token)| JournalEvent::Grant {
            waiter,
            fencing_token
        }),
        key.prop_map(|key| JournalEvent::WouldBlock { key }),
        any_waiter().prop_map(|waiter| JournalEvent::Closed { waiter }),
        (
            any_waiter(),
            prop_oneof![
                Just(Refusal::Unknown),
                Just(Refusal::NotHolding),
                Just(Refusal::NotWaiting)
            ]
        )
            .prop_map(|(waiter, reason)| JournalEvent::Refused { waiter, reason }),
        (any_waiter(), key_for_permits(), 1u32..=u32::MAX).prop_map(|(waiter, key, permits)| {
            JournalEvent::AcquirePermits {
                waiter,
                key,
                permits,
            }
        }),
        (key_for_permits(), 1u32..=u32::MAX)
            .prop_map(|(key, permits)| JournalEvent::TryAcquirePermits { key, permits }),
        (1u32..=u32::MAX).prop_map(|permits| JournalEvent::Capacity { permits }),
        (any_waiter(), proptest::collection::vec(any_key(), 1..5))
            .prop_map(|(waiter, keys)| JournalEvent::AcquireAll { waiter, keys }),
        proptest::collection::vec(any_key(), 1..5)
            .prop_map(|keys| JournalEvent::TryAcquireAll { keys }),
        Just(JournalEvent::WouldBlockAll),
        (
            any_key(),
            prop_oneof![
                Just(LeaseEvent::Requested),
                any::<u64>().prop_map(|fence| LeaseEvent::Granted { fence }),
                any::<u64>().prop_map(|fence| LeaseEvent::Lost { fence }),
                any::<u64>().prop_map(|fence| LeaseEvent::Released { fence }),
            ]
        )
            .prop_map(|(name, event)| JournalEvent::Lease(Box::new(LeaseNote { name, event }))),
    ]
}

fn any_journal() -> impl Strategy<Value = Journal<String>> {
    (
        0u64..1_000_000,
        proptest::collection::vec((0u64..2_000_000_000, any_event()), 0..40),
    )
        .prop_map(|(dropped, steps)| {
            let mut at = Duration::ZERO;
            let entries = steps
                .into_iter()
                .zip(dropped + 1..)
                .map(|((nanos_later, event), seq)| {
                    at += Duration::from_nanos(nanos_later);
                    JournalEntry { seq, at, event }
                })
                .collect();
            Journal { entries, dropped }
        })
}

proptest! {
    #[test]
    fn any_journal_round_trips_through_a_trace(journal in any_journal()) {
        let trace = write_trace(&journal, &StringKeys);
        prop_assert_eq!(parse_trace(&trace, &StringKeys).unwrap(), journal);
    }

    #[test]
    fn any_string_round_trips_through_the_string_codec(key in any_key()) {
        let mut text = String::new();
        StringKeys.encode(&key, &mut text);
        prop_assert!(!text.contains('\n') && !text.contains('\r'));
        prop_assert_eq!(StringKeys.decode(&text).unwrap(), key);
    }

    #[test]
    fn any_i128_round_trips_through_the_integer_codec(key in any::<i128>()) {
        let mut text = String::new();
        IntegerKeys.encode(&key, &mut text);
        prop_assert_eq!(KeyCodec::<i128>::decode(&IntegerKeys, &text).unwrap(), key);
    }
}

#[test]
fn lease_notes_are_written_with_quoted_names_whatever_the_key_codec() {
    let notes = [
        (LeaseEvent::Requested, "lease_requested \"account:42\""),
        (
            LeaseEvent::Granted { fence: 7 },
            "lease_granted 7 \"account:42\"",
        ),
        (LeaseEvent::Lost { fence: 7 }, "lease_lost 7 \"account:42\""),
        (
            LeaseEvent::Released { fence: 8 },
            "lease_released 8 \"account:42\"",
        ),
    ];
    let journal = Journal {
        entries: notes
            .iter()
            .zip(1..)
            .map(|((event, _), seq)| {
                entry(
                    seq,
                    0,
                    JournalEvent::<u64>::Lease(Box::new(LeaseNote {
                        name: "account:42".to_owned(),
                        event: *event,
                    })),
                )
            })
            .collect(),
        dropped: 0,
    };
    // Integer keys, yet the lease's name is text.
    let trace = write_trace(&journal, &IntegerKeys);
    for ((_, line), seq) in notes.iter().zip(1..) {
        assert!(
            trace.contains(&format!("{seq} +0.000000s {line}\n")),
            "{trace}"
        );
    }
    assert_eq!(parse_trace(&trace, &IntegerKeys).unwrap(), journal);
    assert!(
        journal
            .entries
            .iter()
            .all(|entry| entry.event.is_note() && !entry.event.is_input())
    );
}

#[test]
fn a_malformed_lease_note_is_rejected_with_what_was_expected() {
    for (bad_line, expected) in [
        ("3 +0.000001s lease_granted \"k\"", Expected::Fence),
        ("3 +0.000001s lease_lost -1 \"k\"", Expected::Fence),
        ("3 +0.000001s lease_released 4", Expected::LeaseName),
        ("3 +0.000001s lease_requested", Expected::LeaseName),
    ] {
        let error = error_for_line_five(bad_line);
        assert!(
            matches!(error, TraceError::Expected { line: 5, expected: found, .. } if found == expected),
            "{bad_line}: {error:?}"
        );
    }
    let unquoted = error_for_line_five("3 +0.000001s lease_requested k");
    assert!(
        matches!(unquoted, TraceError::Key { line: 5, .. }),
        "{unquoted:?}"
    );
}

#[test]
fn permits_and_capacity_lines_round_trip_and_bad_counts_are_rejected() {
    let trace = "1 +0.000000s capacity 3\n\
                 2 +0.000000s acquire_permits w1 2 \"k\"\n\
                 3 +0.000000s grant w1 1\n\
                 4 +0.000001s try_acquire_permits 1 \"k\"\n\
                 5 +0.000001s grant w2 2\n";
    let journal = parse_trace::<String, _>(trace, &StringKeys).unwrap();
    assert_eq!(
        journal.entries[0].event,
        JournalEvent::Capacity { permits: 3 }
    );
    assert_eq!(
        journal.entries[1].event,
        JournalEvent::AcquirePermits {
            waiter: waiter("w1"),
            key: "k".to_owned(),
            permits: 2
        }
    );
    assert_written_as(&journal, trace);
    for bad_line in [
        "3 +0.000001s acquire_permits w1 0 \"k\"",
        "3 +0.000001s try_acquire_permits 4294967296 \"k\"",
        "3 +0.000001s capacity x",
    ] {
        let error = error_for_line_five(bad_line);
        assert!(
            matches!(
                error,
                TraceError::Expected {
                    line: 5,
                    expected: Expected::Permits,
                    ..
                }
            ),
            "{bad_line}: {error:?}"
        );
    }
}

#[test]
fn multi_key_events_are_followed_by_one_key_line_per_key() {
    let trace = "1 +0.000000s acquire_all w1 2\n\
                 | \"account:7\"\n\
                 | \"account 9\"\n\
                 2 +0.000000s grant w1 1\n\
                 3 +0.000002s try_acquire_all 3\n\
                 | \"a\"\n\
                 | \"b\"\n\
                 | \"account:7\"\n\
                 4 +0.000002s would_block_all\n";
    let journal = parse_trace::<String, _>(trace, &StringKeys).unwrap();
    assert_eq!(journal.entries.len(), 4);
    assert_eq!(
        journal.entries[0].event,
        JournalEvent::AcquireAll {
            waiter: waiter("w1"),
            keys: vec!["account:7".to_owned(), "account 9".to_owned()]
        }
    );
    assert_eq!(
        journal.entries[2].event,
        JournalEvent::TryAcquireAll {
            keys: ["a", "b", "account:7"].map(String::from).to_vec()
        }
    );
    assert_eq!(journal.entries[3].event, JournalEvent::WouldBlockAll);
    assert_written_as(&journal, trace);
}

#[test]
fn missing_or_malformed_key_lines_are_rejected_with_their_line() {
    let cases: [(&str, usize, Expected); 5] = [
        // A comment where a key line is due.
        (
            "1 +0.000000s acquire_all w1 2\n| \"a\"\n# note\n",
            3,
            Expected::KeyLine,
        ),
        // The next event where a key line is due.
        (
            "1 +0.000000s try_acquire_all 2\n| \"a\"\n2 +0.000000s would_block_all\n",
            3,
            Expected::KeyLine,
        ),
        // The trace ends first.
        (
            "1 +0.000000s acquire_all w1 2\n| \"a\"\n",
            3,
            Expected::KeyLine,
        ),
        ("1 +0.000000s acquire_all w1 0\n", 1, Expected::KeyCount),
        (
            "1 +0.000000s try_acquire_all two\n| \"a\"\n",
            1,
            Expected::KeyCount,
        ),
    ];
    for (trace, line, what) in cases {
        let error = parse_trace::<String, _>(trace, &StringKeys).unwrap_err();
        assert!(
            matches!(error, TraceError::Expected { line: l, expected, .. } if l == line && expected == what),
            "{trace:?}: {error:?}"
        );
    }
    let error =
        parse_trace::<String, _>("1 +0.000000s acquire_all w1 1\n| a\n", &StringKeys).unwrap_err();
    assert!(
        matches!(error, TraceError::Key { line: 2, .. }),
        "{error:?}"
    );
    let error =
        parse_trace::<String, _>("1 +0.000000s would_block_all \"a\"\n", &StringKeys).unwrap_err();
    assert!(
        matches!(
            error,
            TraceError::Expected {
                line: 1,
                expected: Expected::EndOfLine,
                ..
            }
        ),
        "{error:?}"
    );
}
