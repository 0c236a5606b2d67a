//! Throughput against the peers: `distinct`, `spread` and `hot`, for keyed-locks,
//! lockable, keyed-lock, key-mutex, the reference-count pattern and a bare `tokio::sync::Mutex` per key
//! (the floor), all on one tokio multi-thread runtime with 2 workers.
//!
//! Run with `cargo bench --bench peers`; criterion writes its estimates under
//! `target/criterion/<workload>/<contender>/`, which `bench_report.rs` reads. One
//! criterion iteration is one whole run of the workload; its elements are lock/unlock pairs.

mod contenders;
mod workloads;

use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, SamplingMode, Throughput};

use contenders::{Contender, runtime};
use workloads::Workload;

fn bench_contender<C: Contender>(
    criterion: &mut Criterion,
    runtime: &tokio::runtime::Runtime,
    workload: Workload,
) {
    let contender = Arc::new(runtime.block_on(async { C::new(workload.keys()) }));
    let mut group = criterion.benchmark_group(workload.name());
    group
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Elements(workload.ops()));
    let mut round = 0;
    group.bench_function(C::NAME, |bencher| {
        bencher.iter_custom(|iterations| {
            (0..iterations)
                .map(|_| {
                    round += 1;
                    runtime.block_on(workload.run(&contender, round))
                })
                .sum()
        })
    });
    group.finish();
    workload.finish(runtime, &*contender);
}

fn main() {
    let runtime = runtime();
    let mut criterion = Criterion::default().configure_from_args();
    for workload in Workload::ALL {
        for_each_contender!(C => bench_contender::<C>(&mut criterion, &runtime, workload));
    }
    criterion.final_summary();
}
