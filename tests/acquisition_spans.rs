//! Every acquisition through the handle is one debug span `acquisition` (target
//! `keyed_locks::lock`) carrying the call and the key, with its wait and hold recorded as they
//! become known, and its outcome (granted, released, cancelled, would block) as events inside.

use std::time::Duration;

use keyed_locks::{LockRegistry, TryLockError};
use tokio_test::{assert_pending, task};
use tracing::Level;

use crate::recorder::{Recorded, RecordedSpan, Recorder};

fn acquisitions(recorded: &Recorded) -> Vec<&RecordedSpan> {
    recorded
        .spans
        .iter()
        .filter(|span| span.name == "acquisition")
        .collect()
}

/// The messages of the events recorded inside span number `span`, in order.
fn events_in(recorded: &Recorded, span: usize) -> Vec<String> {
    recorded
        .events
        .iter()
        .filter(|event| event.span == Some(span))
        .map(|event| event.message.clone())
        .collect()
}

fn field<'a>(span: &'a RecordedSpan, name: &str) -> &'a str {
    span.fields
        .get(name)
        .unwrap_or_else(|| panic!("no {name} in {span:?}"))
}

// On the paused clock, time moves only by the test's sleeps, so waits and holds are exact.
#[tokio::test(start_paused = true)]
async fn a_lock_is_a_span_with_its_key_wait_and_hold_and_its_events_inside() {
    let (recorder, _default) = Recorder::install();
    let registry = LockRegistry::spawn();

    let holder = registry.lock("user:42").await.unwrap();
    let mut waiter = task::spawn(registry.lock("user:42"));
    assert_pending!(waiter.poll());
    tokio::time::sleep(Duration::from_millis(30)).await;
    drop(holder);
    let guard = waiter.await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(guard);

    let recorded = recorder.recorded();
    let spans = acquisitions(&recorded);
    assert_eq!(spans.len(), 2, "{:#?}", recorded.spans);
    for span in &spans {
        assert_eq!(span.target, "keyed_locks::lock");
        assert_eq!(field(span, "call"), "\"lock\"");
        assert_eq!(field(span, "key"), "\"user:42\"");
        assert!(span.closed, "the guard is gone, so is its span: {span:?}");
    }
    let waited = spans[1];
    assert_eq!(field(waited, "fencing_token"), "2");
    assert_eq!(field(waited, "wait_us"), "30000");
    assert_eq!(field(waited, "hold_us"), "50000");
    assert_eq!(field(spans[0], "wait_us"), "0");
    assert_eq!(field(spans[0], "hold_us"), "30000");

    let second = recorded
        .spans
        .iter()
        .position(|span| std::ptr::eq(span, waited))
        .unwrap();
    assert_eq!(events_in(&recorded, second), ["granted", "released"]);
    let inside: Vec<_> = recorded
        .events
        .iter()
        .filter(|event| event.span == Some(second))
        .collect();
    assert!(
        inside
            .iter()
            .all(|event| event.level == Level::DEBUG && event.target == "keyed_locks::lock")
    );
    assert!(inside[0].fields.contains("fencing_token=2"), "{inside:?}");
    assert!(inside[1].fields.contains("hold_us=50000"), "{inside:?}");
}

#[tokio::test]
async fn a_cancelled_wait_and_a_refused_try_end_their_spans_with_an_event_saying_so() {
    let (recorder, _default) = Recorder::install();
    let registry = LockRegistry::spawn();

    let holder = registry.lock(7u64).await.unwrap();
    let mut waiter = task::spawn(registry.lock(7));
    assert_pending!(waiter.poll());
    drop(waiter);
    assert_eq!(
        registry.try_lock(7).await.unwrap_err(),
        TryLockError::WouldBlock
    );
    drop(holder);

    let recorded = recorder.recorded();
    let span_numbers: Vec<usize> = (0..recorded.spans.len())
        .filter(|&i| recorded.spans[i].name == "acquisition")
        .collect();
    let outcomes: Vec<_> = span_numbers
        .iter()
        .map(|&i| {
            (
                recorded.spans[i].fields["call"].clone(),
                events_in(&recorded, i),
            )
        })
        .collect();
    assert_eq!(
        outcomes,
        [
            ("\"lock\"".to_string(), vec!["granted", "released"]),
            ("\"lock\"".to_string(), vec!["cancelled"]),
            ("\"try_lock\"".to_string(), vec!["would block"]),
        ]
        .map(|(call, events)| (call, events.into_iter().map(String::from).collect()))
    );
    let cancelled = &recorded.spans[span_numbers[1]];
    assert!(!cancelled.fields.contains_key("fencing_token"));
    assert!(!cancelled.fields.contains_key("hold_us"));
}

#[tokio::test]
async fn every_kind_of_call_names_itself_and_lock_all_lists_its_keys() {
    let (recorder, _default) = Recorder::install();
    let registry = LockRegistry::builder()
        .capacity(std::num::NonZeroU32::new(4).unwrap())
        .spawn();

    drop(registry.lock_shared("a").await.unwrap());
    drop(registry.acquire("a", 3).await.unwrap());
    drop(registry.try_lock_shared("a").await.unwrap());
    drop(registry.try_acquire("a", 2).await.unwrap());
    drop(registry.try_lock("a").await.unwrap());
    drop(registry.lock_all(["b", "a"]).await.unwrap());
    drop(registry.try_lock_all(["c"]).await.unwrap());

    let recorded = recorder.recorded();
    let calls: Vec<(&str, &str, Option<&str>)> = acquisitions(&recorded)
        .into_iter()
        .map(|span| {
            (
                field(span, "call"),
                field(span, "key"),
                span.fields.get("permits").map(String::as_str),
            )
        })
        .collect();
    assert_eq!(
        calls,
        [
            ("\"lock_shared\"", "\"a\"", Some("1")),
            ("\"acquire\"", "\"a\"", Some("3")),
            ("\"try_lock_shared\"", "\"a\"", Some("1")),
            ("\"try_acquire\"", "\"a\"", Some("2")),
            ("\"try_lock\"", "\"a\"", None),
            ("\"lock_all\"", "[\"b\", \"a\"]", None),
            ("\"try_lock_all\"", "[\"c\"]", None),
        ]
    );
    for span in acquisitions(&recorded) {
        assert!(span.fields.contains_key("hold_us"), "{span:?}");
    }
}
