//! One simulated run: the table, the processes and their workers, the faults that touch the
//! whole world (clock jumps, kills, an early shutdown), and the checks once everyone is idle.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, sleep, sleep_until};

use super::checks::{Checker, Stats};
use super::log::EventLog;
use super::plan::{HEARTBEAT, LEASE, MAX_HOLD, Plan, ProcessClock};
use super::rng::Rng;
use super::store::{SimStore, relay_notices};
use super::worker::{Pausable, Worker};
use crate::builder::RegistryBuilder;
use crate::cluster::entropy::Jitter;
use crate::cluster::leases::{self, CohortBounds, Leases};
use crate::cluster::locks::ClusterLocks;
use crate::cluster::memory_store::MemoryLeaseTable;

/// A bug planted on purpose, to show that the simulator finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PlantedBug {
    /// The resource accepts every write, stale tokens included.
    NoFenceCheck,
    /// The store renews a lease named by an older fence of the same owner.
    RenewIgnoresFence,
    /// Every process passes its leases on locally without bound, never giving them back while
    /// its workers want them.
    HandoffPastBound,
}

/// What one run did.
#[derive(Debug, Clone)]
pub(crate) struct Report {
    pub(crate) seed: u64,
    pub(crate) failure: Option<String>,
    /// The event log: the same bytes for the same seed.
    pub(crate) log: String,
    pub(crate) simulated: Duration,
    pub(crate) longest_call: Duration,
    pub(crate) stats: Stats,
}

/// Purposes of the run's random generators (see [`Rng::new`]).
const PLAN: u64 = 1;
const STORE: u64 = 2;
const NOTICES: u64 = 3;
const WORKER: u64 = 4;
const POLLING: u64 = 5;

/// Gives up on a run whose workers have not finished by then: a wedged call shows as a check
/// failure long before.
const RUN_LIMIT: Duration = Duration::from_secs(3600);

/// Runs the simulation of `seed`, with `planted` planted.
pub(crate) fn run(seed: u64, planted: Option<PlantedBug>) -> Report {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime builds");
    runtime.block_on(simulate(seed, planted))
}

async fn simulate(seed: u64, planted: Option<PlantedBug>) -> Report {
    let plan = Plan::draw(&mut Rng::new(seed, PLAN));
    let log = Arc::new(EventLog::new());
    let start = Instant::now();
    log.event(
        "plan",
        format_args!("seed {seed}, planted {planted:?}: {plan:?}"),
    );
    let checker = Arc::new(Checker::new(
        Arc::clone(&log),
        planted != Some(PlantedBug::NoFenceCheck),
        plan.max_uses,
    ));
    // The planned windows count as faults once each; the rest are counted as they happen.
    let planned: usize = plan
        .processes
        .iter()
        .map(|process| process.pauses.len() + process.outages.len())
        .sum();
    checker.count_faults(planned as u64);
    let table = MemoryLeaseTable::new();
    if planted == Some(PlantedBug::RenewIgnoresFence) {
        table.plant_renew_ignoring_fence();
    }
    let bounds = if planted == Some(PlantedBug::HandoffPastBound) {
        CohortBounds {
            max_uses: 1 << leases::HANDOFF_BITS,
            max_hold: RUN_LIMIT,
        }
    } else {
        CohortBounds {
            max_uses: plan.max_uses,
            max_hold: MAX_HOLD,
        }
    };

    let mut processes = Vec::new();
    let mut workers = Vec::new();
    for (index, process_plan) in plan.processes.iter().enumerate() {
        let stream = (index as u64) << 32;
        let clock = Arc::new(ProcessClock::new(
            format!("p{index}"),
            start,
            process_plan.clone(),
        ));
        let (inner, table_notices) = table.store(LEASE);
        let store = SimStore::new(
            inner,
            table.clone(),
            Arc::clone(&clock),
            Rng::new(seed, STORE | stream),
            Arc::clone(&checker),
            Arc::clone(&log),
        );
        let notices = relay_notices(
            table_notices,
            Arc::clone(&clock),
            Rng::new(seed, NOTICES | stream),
            Arc::clone(&checker),
            Arc::clone(&log),
        );
        let local = RegistryBuilder::new()
            .shards(plan.shards)
            .execution(plan.execution)
            .router_seed(seed)
            .spawn();
        let polling = Jitter::from_seed(Rng::new(seed, POLLING | stream).next_u64());
        let leases = Leases::new(store, bounds, LEASE, None, polling);
        leases::spawn_background(&leases, notices, HEARTBEAT);
        let locks = ClusterLocks::new(local, leases);
        for worker in 0..process_plan.workers {
            let who = format!("p{index}.w{worker}");
            let job = Worker {
                who,
                locks: locks.clone(),
                process: Arc::clone(&clock),
                keys: plan.keys,
                ops: plan.ops_per_worker,
                rng: Rng::new(seed, WORKER | stream | ((worker as u64) << 16)),
                checker: Arc::clone(&checker),
                log: Arc::clone(&log),
            };
            workers.push((
                index,
                tokio::spawn(Pausable::new(job.run(), Arc::clone(&clock))),
            ));
        }
        processes.push((clock, locks));
    }

    // The world's own faults: kills, early shutdowns, clock jumps.
    let mut world_events: Vec<(Duration, WorldEvent)> = Vec::new();
    for (index, process_plan) in plan.processes.iter().enumerate() {
        if let Some(at) = process_plan.killed_at {
            world_events.push((at, WorldEvent::Kill(index)));
        }
        if let Some(at) = process_plan.shutdown_at {
            world_events.push((at, WorldEvent::Shutdown(index)));
        }
    }
    for &(at, by) in &plan.clock_jumps {
        world_events.push((at, WorldEvent::Jump(by)));
    }
    world_events.sort_by_key(|(at, _)| *at);
    let world = {
        let log = Arc::clone(&log);
        let checker = Arc::clone(&checker);
        let processes: Vec<_> = processes.clone();
        let worker_aborts: Vec<_> = workers
            .iter()
            .map(|(index, task)| (*index, task.abort_handle()))
            .collect();
        tokio::spawn(async move {
            for (at, event) in world_events {
                sleep_until(start + at).await;
                log.event("world", format_args!("{event:?}"));
                match event {
                    WorldEvent::Kill(index) => {
                        checker.count_fault();
                        checker.killed(&processes[index].0.name);
                        for (_, abort) in worker_aborts.iter().filter(|(of, _)| *of == index) {
                            abort.abort();
                        }
                    }
                    WorldEvent::Shutdown(index) => {
                        let locks = processes[index].1.clone();
                        tokio::spawn(async move { locks.shutdown().await });
                    }
                    WorldEvent::Jump(by) => {
                        checker.count_fault();
                        tokio::time::advance(by).await;
                    }
                }
            }
        })
    };
    let watchdog = {
        let checker = Arc::clone(&checker);
        tokio::spawn(async move {
            loop {
                sleep(Duration::from_millis(100)).await;
                checker.check_calls();
            }
        })
    };

    let finished = tokio::time::timeout(RUN_LIMIT, async {
        for (_, worker) in workers {
            // A killed process's workers end aborted; that is their plan.
            let _ = worker.await;
        }
    })
    .await;
    watchdog.abort();
    world.abort();
    if finished.is_err() {
        checker.fail(format!("the workers had not finished after {RUN_LIMIT:?}"));
    }
    checker.check_calls();
    log.event("world", format_args!("every worker is done"));
    check_idle(&processes, &table, &checker, &log).await;
    for (clock, locks) in &processes {
        if !clock.is_dead(Instant::now()) {
            locks.shutdown().await;
        }
    }

    Report {
        seed,
        failure: checker.failure(),
        log: log.text(),
        simulated: log.elapsed(),
        longest_call: checker.longest_call(),
        stats: checker.stats(),
    }
}

/// Once every worker is done: no call under way, no local entry or held lease in a live
/// process once its releases had time to land, and no live lease in the table a lease later.
async fn check_idle<S>(
    processes: &[(Arc<ProcessClock>, ClusterLocks<String, S>)],
    table: &MemoryLeaseTable,
    checker: &Checker,
    log: &EventLog,
) where
    S: crate::cluster::lease_store::LeaseStore,
{
    if checker.calls_under_way() > 0 {
        checker.fail(format!(
            "{} lock calls never ended",
            checker.calls_under_way()
        ));
    }
    // Releases run in tasks of their own: give them (and any pause or outage) time to land.
    sleep(Duration::from_secs(5)).await;
    for (clock, locks) in processes {
        if clock.is_dead(Instant::now()) {
            continue;
        }
        let (keys, held) = locks.leases.counts();
        if keys > 0 || held > 0 {
            checker.fail(format!(
                "{} is idle but keeps {keys} lease entries, {held} leases held",
                clock.name
            ));
        }
        match locks.local.stats().await {
            Ok(stats) if stats.keys > 0 => checker.fail(format!(
                "{} is idle but its local registry keeps {} keys",
                clock.name, stats.keys
            )),
            _ => {}
        }
    }
    sleep(LEASE).await;
    let now = Instant::now();
    for (key, row) in table.rows() {
        if row.is_held_at(now) {
            checker.fail(format!(
                "lease {key:?} still held by {:?} with everyone idle",
                row.owner
            ));
        }
    }
    log.event("world", format_args!("idle checks done"));
}

#[derive(Debug, Clone, Copy)]
enum WorldEvent {
    Kill(usize),
    Shutdown(usize),
    Jump(Duration),
}
