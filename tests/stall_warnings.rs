//! With `warn_held_longer_than`, every hold past the threshold is warned about once (target
//! `keyed_locks::stall`, with key, fencing token and time held); with
//! `warn_ungranted_pickup_after`, so is every grant its future has not taken by then. Neither
//! runs a timer unless set, and the timer never keeps a registry alive.

use std::num::NonZeroUsize;
use std::time::Duration;

use keyed_locks::LockRegistry;
use tokio_test::{assert_pending, assert_ready, task};
use tracing::Level;

use crate::configurations::builders;
use crate::recorder::{RecordedEvent, Recorder};

const HELD: &str = "key held longer than the threshold";
const NOT_PICKED_UP: &str =
    "key granted but not picked up: is the future that asked for it still polled?";

fn warnings(recorder: &Recorder) -> Vec<RecordedEvent> {
    recorder
        .recorded()
        .events_at_least(Level::WARN)
        .into_iter()
        .cloned()
        .collect()
}

async fn sleep_ms(millis: u64) {
    tokio::time::sleep(Duration::from_millis(millis)).await;
}

#[tokio::test(start_paused = true)]
async fn a_hold_past_the_threshold_is_warned_about_once_with_its_key_token_and_time() {
    for builder in builders() {
        let (recorder, _default) = Recorder::install();
        let registry = builder
            .warn_held_longer_than(Duration::from_secs(1))
            .spawn();

        let guard = registry.lock("job:7").await.unwrap();
        sleep_ms(990).await;
        assert!(warnings(&recorder).is_empty(), "{registry:?}");
        sleep_ms(20).await;
        let warned = warnings(&recorder);
        assert_eq!(warned.len(), 1, "{warned:#?}");
        let warning = &warned[0];
        assert_eq!(warning.level, Level::WARN);
        assert_eq!(warning.target, "keyed_locks::stall");
        assert_eq!(warning.message, HELD);
        assert!(warning.fields.contains("key=\"job:7\""), "{warning:?}");
        let token = guard.fencing_token();
        assert!(
            warning.fields.contains(&format!("fencing_token={token} ")),
            "{warning:?}"
        );
        assert!(warning.fields.contains("held_for=1s"), "{warning:?}");

        // Once per hold, however long it lasts.
        sleep_ms(10_000).await;
        assert_eq!(warnings(&recorder).len(), 1);
        drop(guard);

        // A hold released in time is not warned about; the next long one is.
        let short = registry.lock("job:7").await.unwrap();
        sleep_ms(500).await;
        drop(short);
        sleep_ms(5_000).await;
        assert_eq!(warnings(&recorder).len(), 1);
        let other = registry.lock("job:8").await.unwrap();
        sleep_ms(1_500).await;
        let warned = warnings(&recorder);
        assert_eq!(warned.len(), 2, "{warned:#?}");
        assert!(warned[1].fields.contains("key=\"job:8\""), "{warned:?}");
        drop(other);
        registry.shutdown().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_grant_its_future_does_not_pick_up_is_warned_about_once() {
    for builder in builders() {
        let (recorder, _default) = Recorder::install();
        let registry = builder
            .warn_ungranted_pickup_after(Duration::from_millis(200))
            .spawn();

        let holder = registry.lock("k").await.unwrap();
        let mut waiter = task::spawn(registry.lock("k"));
        assert_pending!(waiter.poll());
        drop(holder);
        // The grant is made (at once, or by the actor at its next turn) but nobody polls the
        // waiter: a futurelock in the making.
        sleep_ms(150).await;
        assert!(waiter.is_woken());
        assert!(warnings(&recorder).is_empty());
        sleep_ms(100).await;
        let warned = warnings(&recorder);
        assert_eq!(warned.len(), 1, "{warned:#?}");
        assert_eq!(warned[0].message, NOT_PICKED_UP);
        assert_eq!(warned[0].target, "keyed_locks::stall");
        assert!(warned[0].fields.contains("key=\"k\""), "{warned:?}");
        assert!(warned[0].fields.contains("granted_for="), "{warned:?}");

        // Picked up at last; held long, which this registry does not warn about.
        let guard = assert_ready!(waiter.poll()).unwrap();
        assert!(
            warned[0]
                .fields
                .contains(&format!("fencing_token={} ", guard.fencing_token())),
            "{warned:?}"
        );
        sleep_ms(5_000).await;
        assert_eq!(warnings(&recorder).len(), 1);

        // A grant picked up in time is not warned about.
        let mut next = task::spawn(registry.lock("k"));
        assert_pending!(next.poll());
        drop(guard);
        sleep_ms(1).await;
        assert!(next.is_woken());
        let next_guard = assert_ready!(next.poll()).unwrap();
        sleep_ms(5_000).await;
        assert_eq!(warnings(&recorder).len(), 1);
        drop(next_guard);
        registry.shutdown().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_grant_given_up_before_it_was_picked_up_is_not_warned_about() {
    let (recorder, _default) = Recorder::install();
    let registry = LockRegistry::builder()
        .warn_ungranted_pickup_after(Duration::from_millis(200))
        .warn_held_longer_than(Duration::from_millis(300))
        .spawn();
    let holder = registry.lock(1u32).await.unwrap();
    let mut waiter = task::spawn(registry.lock(1));
    assert_pending!(waiter.poll());
    drop(holder);
    // Granted, then dropped unpolled: the grant is released at once, nothing is stalled.
    drop(waiter);
    sleep_ms(2_000).await;
    assert!(warnings(&recorder).is_empty(), "{:#?}", warnings(&recorder));
    assert_eq!(registry.stats().await.unwrap().keys, 0);
}

fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

#[tokio::test(start_paused = true)]
async fn a_registry_without_warnings_runs_no_timer_and_the_timer_ends_with_its_registry() {
    let before = alive_tasks();
    let shards = NonZeroUsize::new(2).unwrap();
    let plain = LockRegistry::<u8>::builder().shards(shards).spawn();
    // One actor task per shard, and nothing else.
    assert_eq!(alive_tasks(), before + 2);

    let watched = LockRegistry::<u8>::builder()
        .shards(shards)
        .warn_held_longer_than(Duration::from_millis(100))
        .spawn();
    // An actor and a stall timer per shard.
    assert_eq!(alive_tasks(), before + 6);

    let guard = watched.lock(3).await.unwrap();
    drop(watched);
    sleep_ms(1_000).await;
    // The guard keeps its shard, and so that shard's timer, alive; the other shard is gone.
    assert_eq!(alive_tasks(), before + 4);
    drop(guard);
    drop(plain);
    sleep_ms(1_000).await;
    assert_eq!(alive_tasks(), before);
}

#[tokio::test(start_paused = true)]
async fn a_hold_granted_to_a_kameo_message_is_watched_too() {
    let (recorder, _default) = Recorder::install();
    let registry = LockRegistry::builder()
        .warn_held_longer_than(Duration::from_millis(300))
        .spawn();
    let actor = registry.actor_ref().expect("one shard").clone();
    let guard = actor
        .ask(keyed_locks::messages::Acquire { key: "by message" })
        .await
        .unwrap();
    sleep_ms(400).await;
    let warned = warnings(&recorder);
    assert_eq!(warned.len(), 1, "{warned:#?}");
    assert_eq!(warned[0].message, HELD);
    assert!(
        warned[0].fields.contains("key=\"by message\""),
        "{warned:?}"
    );
    drop(guard);
}
