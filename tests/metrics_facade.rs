//! With the `metrics` feature, a registry counts grants, cancellations and would-blocks, keeps
//! gauges of keys, held keys and waiters that add up over shards and return to 0, and records
//! wait and hold times as histograms, with no label that names a key.

use std::num::NonZeroUsize;
use std::time::Duration;

use keyed_locks::{LockRegistry, TryLockError};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio_test::{assert_pending, task};

/// The value of the series `name` with no labels, from Prometheus text.
fn value(handle: &PrometheusHandle, name: &str) -> f64 {
    let text = handle.render();
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
        .parse()
        .unwrap()
}

#[test]
fn counters_gauges_and_histograms_follow_the_registry() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    // A current-thread runtime runs every task inside this closure, where the recorder is set.
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let registry = LockRegistry::builder()
                .shards(NonZeroUsize::new(2).unwrap())
                .spawn();
            let holder = registry.lock("a").await.unwrap();
            let other = registry.lock("b").await.unwrap();
            let mut waiter = task::spawn(registry.lock("a"));
            assert_pending!(waiter.poll());
            let mut gives_up = task::spawn(registry.lock("a"));
            assert_pending!(gives_up.poll());
            registry.stats().await.unwrap();
            assert_eq!(value(&handle, "keyed_locks_keys"), 2.0);
            assert_eq!(value(&handle, "keyed_locks_held"), 2.0);
            assert_eq!(value(&handle, "keyed_locks_waiting"), 2.0);

            drop(gives_up);
            assert_eq!(
                registry.try_lock("b").await.unwrap_err(),
                TryLockError::WouldBlock
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
            drop(holder);
            let guard = waiter.await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
            drop((guard, other));
            assert_eq!(registry.stats().await.unwrap().keys, 0);
        });
    });

    assert_eq!(value(&handle, "keyed_locks_grants_total"), 3.0);
    assert_eq!(value(&handle, "keyed_locks_cancellations_total"), 1.0);
    assert_eq!(value(&handle, "keyed_locks_would_blocks_total"), 1.0);
    for gauge in [
        "keyed_locks_keys",
        "keyed_locks_held",
        "keyed_locks_waiting",
    ] {
        assert_eq!(value(&handle, gauge), 0.0, "{gauge}");
    }
    // Three grants taken, three holds ended; the waiter waited the holder's 10 ms.
    assert_eq!(value(&handle, "keyed_locks_wait_seconds_count"), 3.0);
    assert_eq!(value(&handle, "keyed_locks_wait_seconds_sum"), 0.01);
    assert_eq!(value(&handle, "keyed_locks_hold_seconds_count"), 3.0);
    // Holds of 10 ms ("a", first holder), 20 ms ("a", the waiter) and 30 ms ("b").
    assert!((value(&handle, "keyed_locks_hold_seconds_sum") - 0.06).abs() < 1e-9);

    // The only label is the summaries' quantile: nothing per key.
    let text = handle.render();
    for line in text.lines().filter(|line| line.contains('{')) {
        assert!(
            line.contains("{quantile=\""),
            "a label beyond quantile: {line}"
        );
    }
}
