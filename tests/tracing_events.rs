//! The registry emits `tracing` events at debug level for acquire, grant, release and cancel,
//! each carrying the key's `Debug`, and nothing above debug in normal operation.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use keyed_locks::LockRegistry;
use tokio_test::{assert_pending, task};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

#[derive(Debug, Clone)]
struct Recorded {
    level: Level,
    message: String,
    fields: String,
}

#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<Recorded>>>);

impl<S: Subscriber> Layer<S> for Recorder {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        struct Fields(String, String);
        impl Visit for Fields {
            fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    let _ = write!(self.0, "{value:?}");
                } else {
                    let _ = write!(self.1, "{}={value:?} ", field.name());
                }
            }
        }
        let mut fields = Fields(String::new(), String::new());
        event.record(&mut fields);
        self.0.lock().unwrap().push(Recorded {
            level: *event.metadata().level(),
            message: fields.0,
            fields: fields.1,
        });
    }
}

// A current-thread runtime runs the actor on this thread, where the subscriber is set.
#[tokio::test]
async fn acquire_grant_release_and_cancel_are_debug_events_carrying_the_key() {
    let recorder = Recorder::default();
    let subscriber = tracing_subscriber::registry().with(recorder.clone());
    let _default = tracing::subscriber::set_default(subscriber);

    let registry = LockRegistry::spawn();
    let holder = registry.lock("user:42").await.unwrap();
    let mut waiter = task::spawn(registry.lock("user:42"));
    assert_pending!(waiter.poll());
    registry.stats().await.unwrap();
    drop(waiter);
    drop(holder);
    registry.stats().await.unwrap();

    let events = recorder.0.lock().unwrap().clone();
    for kind in ["acquire", "grant", "release", "cancel"] {
        let event = events
            .iter()
            .find(|event| event.message == kind)
            .unwrap_or_else(|| panic!("no {kind} event in {events:#?}"));
        assert_eq!(event.level, Level::DEBUG, "{event:?}");
        assert!(
            event.fields.contains(r#""user:42""#),
            "{kind} lacks the key: {event:?}"
        );
    }
    let loud: Vec<_> = events
        .iter()
        .filter(|event| event.level < Level::DEBUG)
        .collect();
    // `Level` orders by verbosity: anything less verbose than DEBUG is INFO, WARN or ERROR.
    assert!(loud.is_empty(), "events above debug: {loud:#?}");
}
