//! What the acquisition spans cost: one task locks and unlocks free keys, on a current-thread
//! runtime, under three subscribers:
//!
//! - `no subscriber`: nothing listens, the case the crate promises costs nothing;
//! - `subscriber at info`: a subscriber that filters debug out, as most services run;
//! - `subscriber at debug`: a subscriber that takes every span and event (and does nothing
//!   with them), the price of listening.
//!
//! The first two should be equal, and equal to a build without spans (the instruction counts
//! of `profile_distinct.rs` under callgrind compare builds; see
//! `docs/performance-log.md`). Run with `cargo bench --bench observability`.

use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use keyed_locks::LockRegistry;
use tracing::Dispatch;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::{Layer, SubscriberExt};

/// Lock/unlock pairs per measured iteration.
const PAIRS: u64 = 1_000;

/// A layer that takes everything and keeps nothing: the registry under it still builds every
/// span, which is what listening costs.
struct Discard;

impl<S: tracing::Subscriber> Layer<S> for Discard {}

/// Makes a case's subscriber; `None` for none.
type MakeDispatch = fn() -> Option<Dispatch>;

/// The subscribers, each made only when its turn comes: `tracing` sets its global level
/// filter and each callsite's interest from every subscriber alive, so one that takes debug
/// would make the one at info pay for it too.
fn subscribers() -> [(&'static str, MakeDispatch); 3] {
    [
        ("no subscriber", || None),
        ("subscriber at info", || {
            Some(Dispatch::new(
                tracing_subscriber::registry().with(Discard.with_filter(LevelFilter::INFO)),
            ))
        }),
        ("subscriber at debug", || {
            Some(Dispatch::new(tracing_subscriber::registry().with(Discard)))
        }),
    ]
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime");
    let mut criterion = Criterion::default().configure_from_args();
    let mut group = criterion.benchmark_group("uncontended lock/unlock");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Elements(PAIRS));
    // In this order: a subscriber, once made, may leave `tracing`'s global level filter raised.
    for (name, make_dispatch) in subscribers() {
        let mut run = || {
            let registry = runtime.block_on(async { LockRegistry::<u64>::spawn() });
            let mut next_key = 0u64;
            group.bench_function(name, |bencher| {
                bencher.iter_custom(|iterations| {
                    runtime.block_on(async {
                        let start = Instant::now();
                        for _ in 0..iterations * PAIRS {
                            next_key += 1;
                            drop(registry.lock(next_key).await.expect("registry open"));
                        }
                        start.elapsed()
                    })
                })
            });
        };
        match make_dispatch() {
            None => run(),
            Some(dispatch) => tracing::dispatcher::with_default(&dispatch, run),
        }
    }
    group.finish();
    criterion.final_summary();
}
