//! `snapshot` shows every key held or waited for, as it is, in each execution mode and across
//! shards: how it is held, by which tokens, since when, and who waits; `snapshot_top(n)` is its
//! first `n`; a closed registry answers `Closed`.

use std::num::NonZeroU32;
use std::pin::pin;
use std::time::Duration;

use futures::poll;
use keyed_locks::{KeyHold, KeySnapshot, LockError, LockRegistry};

use crate::configurations::builders;

const CAPACITY: u32 = 3;

fn of<'v>(view: &'v [KeySnapshot<&'static str>], key: &str) -> &'v KeySnapshot<&'static str> {
    view.iter()
        .find(|shown| shown.key == key)
        .unwrap_or_else(|| panic!("{key} is not in {view:?}"))
}

fn keys(view: &[KeySnapshot<&'static str>]) -> Vec<&'static str> {
    let mut keys: Vec<_> = view.iter().map(|shown| shown.key).collect();
    keys.sort_unstable();
    keys
}

fn tokens(shown: &KeySnapshot<&'static str>) -> Vec<u64> {
    shown
        .holders
        .iter()
        .map(|holder| holder.fencing_token)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn every_state_a_key_can_be_in_is_shown_in_each_mode_and_with_shards() {
    for builder in builders::<&'static str>() {
        let registry = builder.capacity(NonZeroU32::new(CAPACITY).unwrap()).spawn();
        let label = format!("{registry:?}, {} shards", registry.shards());
        assert!(registry.snapshot().await.unwrap().is_empty(), "{label}");
        drop(registry.lock("gone").await.unwrap());

        let exclusive = registry.lock("exclusive").await.unwrap();
        let reader_1 = registry.lock_shared("shared").await.unwrap();
        let reader_2 = registry.lock_shared("shared").await.unwrap();
        let permits = registry.acquire("permits", 2).await.unwrap();
        let reader = registry.lock_shared("writer waits").await.unwrap();
        let both = registry.lock_all(["all 1", "all 2"]).await.unwrap();
        tokio::time::advance(Duration::from_secs(2)).await;
        let mut writer = Box::pin(registry.lock("writer waits"));
        assert!(poll!(writer.as_mut()).is_pending());
        let mut late_reader = Box::pin(registry.lock_shared("writer waits"));
        assert!(poll!(late_reader.as_mut()).is_pending());
        tokio::time::advance(Duration::from_secs(3)).await;

        let view = registry.snapshot().await.unwrap();
        assert_eq!(
            keys(&view),
            [
                "all 1",
                "all 2",
                "exclusive",
                "permits",
                "shared",
                "writer waits"
            ],
            "{label}: free and absent keys are not shown"
        );
        let shown = of(&view, "exclusive");
        assert_eq!(shown.hold, KeyHold::Exclusive, "{label}");
        assert_eq!(tokens(shown), [exclusive.fencing_token()], "{label}");
        assert_eq!(shown.holders[0].permits, CAPACITY, "{label}");
        assert_eq!(
            (shown.waiters, shown.first_waiter_permits),
            (0, None),
            "{label}"
        );

        let shown = of(&view, "shared");
        let shared = KeyHold::Shared {
            permits: 2,
            capacity: CAPACITY,
        };
        assert_eq!(shown.hold, shared, "{label}");
        assert_eq!(
            tokens(shown),
            [reader_1.fencing_token(), reader_2.fencing_token()],
            "{label}: the oldest grant first"
        );

        let shown = of(&view, "permits");
        assert_eq!(shown.hold, shared, "{label}");
        assert_eq!(tokens(shown), [permits.fencing_token()], "{label}");

        let shown = of(&view, "writer waits");
        let one_reader = KeyHold::Shared {
            permits: 1,
            capacity: CAPACITY,
        };
        assert_eq!(shown.hold, one_reader, "{label}");
        assert_eq!(tokens(shown), [reader.fencing_token()], "{label}");
        assert_eq!(
            shown.waiters, 2,
            "{label}: the writer and the reader behind it"
        );
        assert_eq!(
            shown.first_waiter_permits,
            Some(CAPACITY),
            "{label}: the writer"
        );
        let waited = shown.oldest_waited.expect("a waiter");
        assert!(
            waited.at_most <= Duration::from_secs(5) && waited.at_least <= waited.at_most,
            "{label}: {waited:?}"
        );
        assert_eq!(
            view[0].key, "writer waits",
            "{label}: the most waiters first"
        );

        for key in ["all 1", "all 2"] {
            let shown = of(&view, key);
            assert_eq!(shown.hold, KeyHold::Exclusive, "{label}");
            assert_eq!(
                tokens(shown),
                [both.fencing_token(&key).unwrap()],
                "{label}"
            );
        }

        // Everything was granted by the registry's start; the first view marked 5 s.
        tokio::time::advance(Duration::from_secs(3)).await;
        let view = registry.snapshot().await.unwrap();
        let held_for = of(&view, "exclusive").holders[0].held_for;
        assert_eq!(
            (held_for.at_least, held_for.at_most),
            (Duration::from_secs(3), Duration::from_secs(8)),
            "{label}"
        );

        drop((exclusive, reader_1, reader_2, permits, both, reader));
        drop((writer, late_reader));
        assert!(
            registry.snapshot().await.unwrap().is_empty(),
            "{label}: released keys leave the view"
        );
        registry.shutdown().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_wait_is_dated_between_the_views_around_its_arrival() {
    for builder in builders::<&'static str>() {
        let registry = builder.spawn();
        let holder = registry.lock("k").await.unwrap();
        tokio::time::advance(Duration::from_secs(4)).await;
        registry.snapshot().await.unwrap();
        let mut waiter = pin!(registry.lock("k"));
        assert!(poll!(waiter.as_mut()).is_pending());
        registry.snapshot().await.unwrap();
        tokio::time::advance(Duration::from_secs(6)).await;
        let view = registry.snapshot().await.unwrap();
        let waited = view[0].oldest_waited.expect("a waiter");
        assert_eq!(
            (waited.at_least, waited.at_most),
            (Duration::from_secs(6), Duration::from_secs(6)),
            "{registry:?}: views just before and after its arrival date it exactly"
        );
        drop(holder);
        drop(waiter.await.unwrap());
        registry.shutdown().await;
    }
}

#[tokio::test(start_paused = true)]
async fn the_top_n_are_the_first_n_of_every_shard_merged() {
    for builder in builders::<u32>() {
        let registry = builder.spawn();
        let mut guards = Vec::new();
        for key in 0..30 {
            guards.push(registry.lock(key).await.unwrap());
        }
        // Key k gets k waiters for k in 20..24: the four most contended, in reverse order.
        let mut waiters = Vec::new();
        for key in 20..24u32 {
            for _ in 20..=key {
                let mut waiter = Box::pin(registry.lock(key));
                assert!(poll!(waiter.as_mut()).is_pending());
                waiters.push(waiter);
            }
        }
        let all = registry.snapshot().await.unwrap();
        assert_eq!(all.len(), 30, "every shard's keys");
        let most_contended: Vec<u32> = all[..4].iter().map(|shown| shown.key).collect();
        assert_eq!(most_contended, [23, 22, 21, 20]);
        for n in [0, 1, 4, 7, 30, 31] {
            let top = registry.snapshot_top(n).await.unwrap();
            assert_eq!(top.len(), n.min(30));
            let head: Vec<(u32, u32)> = all[..n.min(30)]
                .iter()
                .map(|shown| (shown.key, shown.waiters))
                .collect();
            let top: Vec<(u32, u32)> = top.iter().map(|shown| (shown.key, shown.waiters)).collect();
            assert_eq!(top, head, "n = {n}");
        }
        drop(waiters);
        drop(guards);
        registry.shutdown().await;
    }
}

#[tokio::test]
async fn a_closed_registry_answers_closed() {
    for builder in builders::<u32>() {
        let registry = builder.spawn();
        let _guard = registry.lock(1).await.unwrap();
        registry.shutdown().await;
        assert_eq!(registry.snapshot().await.unwrap_err(), LockError::Closed);
        assert_eq!(
            registry.snapshot_top(1).await.unwrap_err(),
            LockError::Closed
        );
    }
}

#[tokio::test]
async fn the_view_serializes_as_json() {
    let registry = LockRegistry::spawn();
    let _guard = registry.lock("k").await.unwrap();
    let json = serde_json::to_value(registry.snapshot().await.unwrap()).unwrap();
    assert_eq!(json[0]["key"], "k");
    assert_eq!(json[0]["hold"], "Exclusive");
    assert_eq!(json[0]["holders"][0]["fencing_token"], 1);
    assert_eq!(json[0]["waiters"], 0);
}
