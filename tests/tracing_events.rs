//! The registry's owner emits `tracing` events at debug level for acquire, grant, release and
//! cancel, with target `keyed_locks::owner`, each carrying the key's `Debug`, and nothing
//! above debug in normal operation.

use keyed_locks::LockRegistry;
use tokio_test::{assert_pending, task};
use tracing::Level;

use crate::recorder::Recorder;

// A current-thread runtime runs the actor on this thread, where the subscriber is set.
#[tokio::test]
async fn acquire_grant_release_and_cancel_are_debug_events_carrying_the_key() {
    let (recorder, _default) = Recorder::install();

    let registry = LockRegistry::spawn();
    let holder = registry.lock("user:42").await.unwrap();
    let mut waiter = task::spawn(registry.lock("user:42"));
    assert_pending!(waiter.poll());
    registry.stats().await.unwrap();
    drop(waiter);
    drop(holder);
    registry.stats().await.unwrap();

    let recorded = recorder.recorded();
    for kind in ["acquire", "grant", "release", "cancel"] {
        let event = recorded
            .events_saying(kind)
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("no {kind} event in {:#?}", recorded.events));
        assert_eq!(event.level, Level::DEBUG, "{event:?}");
        assert_eq!(event.target, "keyed_locks::owner", "{event:?}");
        assert!(
            event.fields.contains(r#""user:42""#),
            "{kind} lacks the key: {event:?}"
        );
    }
    let loud = recorded.events_at_least(Level::INFO);
    assert!(loud.is_empty(), "events above debug: {loud:#?}");
}
