//! A loop of calls that are answered at once (a free key, a would-block, a closed registry)
//! still lets the other tasks of its worker run: every answer takes a unit of tokio's budget,
//! as tokio's own `Mutex` does, so such a loop yields now and then instead of starving them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use keyed_locks::{LockRegistry, RegistryBuilder};

use crate::configurations::builders;

/// Generous: only turns a starved worker into a failure instead of a hang.
const BOUND: Duration = Duration::from_secs(20);

/// What the looping task calls, over and over.
#[derive(Debug, Clone, Copy)]
enum Call {
    /// `lock` of a free key, dropped at once.
    LockFree,
    /// `try_lock` of a key the test holds: would-block every time.
    TryLockHeld,
    /// `lock` after `shutdown`: closed every time.
    LockClosed,
}

/// On a current-thread runtime of its own (one worker, so a task that never yields starves
/// every other): a task loops on `call` until a flag says stop, and the test task, which sets
/// the flag, must get to run. Run on a thread of its own, so that a starved runtime fails the
/// test after [`BOUND`] rather than hang it.
fn other_tasks_run_while_a_task_loops_on(builder: RegistryBuilder<u32>, call: Call) {
    let (done, done_rx) = mpsc::channel();
    let description = format!("{call:?} with {builder:?}");
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime");
        runtime.block_on(async move {
            let registry: LockRegistry<u32> = builder.spawn();
            let held = registry.lock(1).await.expect("open");
            if let Call::LockClosed = call {
                registry.shutdown().await;
            }
            let stop = Arc::new(AtomicBool::new(false));
            let looper = tokio::spawn({
                let (registry, stop) = (registry.clone(), Arc::clone(&stop));
                async move {
                    let mut calls = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        match call {
                            Call::LockFree => drop(registry.lock(2).await),
                            Call::TryLockHeld => drop(registry.try_lock(1).await),
                            Call::LockClosed => drop(registry.lock(2).await),
                        }
                        calls += 1;
                    }
                    calls
                }
            });
            // The looper runs as soon as this task yields; it must yield back.
            tokio::task::yield_now().await;
            stop.store(true, Ordering::Relaxed);
            let calls = looper.await.expect("the looping task");
            drop(held);
            done.send(calls).expect("the test waits");
        });
    });
    let calls = done_rx
        .recv_timeout(BOUND)
        .unwrap_or_else(|_| panic!("{description}: the looping task never let the test run"));
    assert!(calls > 0, "{description}: the looping task ran");
}

#[test]
fn a_loop_of_locks_on_free_keys_yields_to_other_tasks() {
    for builder in builders() {
        other_tasks_run_while_a_task_loops_on(builder, Call::LockFree);
    }
}

#[test]
fn a_loop_of_try_locks_that_would_block_yields_to_other_tasks() {
    for builder in builders() {
        other_tasks_run_while_a_task_loops_on(builder, Call::TryLockHeld);
    }
}

#[test]
fn a_loop_of_locks_on_a_closed_registry_yields_to_other_tasks() {
    for builder in builders() {
        other_tasks_run_while_a_task_loops_on(builder, Call::LockClosed);
    }
}
