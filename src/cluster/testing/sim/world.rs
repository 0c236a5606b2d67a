//! One simulated run: the table, the processes and their workers, the faults that touch the
//! whole world (clock jumps, kills, an early shutdown), and the checks once everyone is idle.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::{AbortHandle, JoinHandle};
use tokio::time::{Instant, sleep, sleep_until};

use super::checks::{Checker, Stats};
use super::log::EventLog;
use super::plan::{HEARTBEAT, LEASE, MAX_HOLD, Plan, ProcessClock};
use super::rng::Rng;
use super::store::{SimStore, relay_notices};
use super::worker::{Pausable, Worker};
use crate::cluster::locking::entropy::Jitter;
use crate::cluster::locking::lease_store::Fence;
use crate::cluster::locking::leases::{self, CohortBounds, IDLE_LINGER, Leases};
use crate::cluster::locking::locks::ClusterLocks;
use crate::cluster::testing::memory_store::MemoryLeaseTable;
use crate::registry::builder::RegistryBuilder;

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
    /// The store's `try_acquire` takes a key that a waiter was refused just before.
    TrySnatchesFromWaiter,
    /// `try_lock` waits for the key as `lock` does.
    TryWaits,
    /// The store grants part leases past the capacity.
    PartOverCapacity,
    /// The store grants a whole lease over live part leases.
    WholeOverParts,
    /// The store grants a part lease past a larger request that waits.
    PartOvertakesWaiter,
    /// `lock_all` locks its keys one by one in the order listed, holding each while it waits
    /// for the next.
    LockAllOneByOne,
    /// Every process ignores what the store says of other processes' waiters (a renewal's
    /// `wanted`, its own refusals), and keeps its leases round after round.
    KeepsWantedLease,
    /// Every process ignores what the store says of other processes' waiters for its part
    /// leases alone, and keeps them for its readers round after round.
    KeepsWantedPart,
    /// Every process keeps a lease that none of its workers wants any more, where it should
    /// give it back a turn later.
    KeepsUnwantedLease,
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
    log.event(
        "plan",
        format_args!("seed {seed}, planted {planted:?}: {plan:?}"),
    );
    let checker = Arc::new(Checker::new(
        Arc::clone(&log),
        planted != Some(PlantedBug::NoFenceCheck),
        plan.max_uses,
        plan.capacity.get(),
    ));
    // The planned windows count as faults once each; the rest are counted as they happen.
    let planned: usize = plan
        .processes
        .iter()
        .map(|process| process.pauses.len() + process.outages.len())
        .sum();
    checker.count_faults(planned as u64);
    let table = MemoryLeaseTable::with_capacity(plan.capacity);
    match planted {
        Some(PlantedBug::RenewIgnoresFence) => table.plant_renew_ignoring_fence(),
        Some(PlantedBug::TrySnatchesFromWaiter) => table.plant_try_ignoring_wanted(),
        Some(PlantedBug::PartOverCapacity) => table.plant_part_ignoring_capacity(),
        Some(PlantedBug::WholeOverParts) => table.plant_whole_ignoring_parts(),
        Some(PlantedBug::PartOvertakesWaiter) => table.plant_part_ignoring_waiting(),
        _ => {}
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
    let run = Run {
        seed,
        start: Instant::now(),
        plan,
        log,
        checker,
        table,
        bounds,
        planted,
    };

    let mut processes: Vec<Process> = (0..run.plan.processes.len())
        .map(|index| run.start_process(index))
        .collect();
    let world = run.spawn_world_events(&processes);
    let watchdog = {
        let checker = Arc::clone(&run.checker);
        let leases: Vec<_> = processes
            .iter()
            .map(|process| {
                (
                    Arc::clone(&process.clock),
                    Arc::clone(&process.locks.leases),
                )
            })
            .collect();
        tokio::spawn(async move {
            let mut overdue = HashSet::new();
            loop {
                sleep(WATCH_EVERY).await;
                checker.check_calls();
                overdue = check_kept_for_nobody(&leases, overdue, &checker).await;
            }
        })
    };
    let workers: Vec<_> = processes
        .iter_mut()
        .flat_map(|process| process.workers.drain(..))
        .collect();
    let finished = tokio::time::timeout(RUN_LIMIT, async {
        for worker in workers {
            // A killed process's workers end aborted; that is their plan.
            let _ = worker.await;
        }
    })
    .await;
    watchdog.abort();
    world.abort();
    let (checker, log) = (&run.checker, &run.log);
    if finished.is_err() {
        checker.fail(format!("the workers had not finished after {RUN_LIMIT:?}"));
    }
    checker.check_calls();
    log.event("world", format_args!("every worker is done"));
    check_idle(&processes, &run.table, checker, log).await;
    for process in &processes {
        if !process.clock.is_dead(Instant::now()) {
            process.locks.shutdown().await;
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

/// What the processes of one run share.
struct Run {
    seed: u64,
    start: Instant,
    plan: Plan,
    log: Arc<EventLog>,
    checker: Arc<Checker>,
    table: MemoryLeaseTable,
    bounds: CohortBounds,
    planted: Option<PlantedBug>,
}

/// One simulated process: its plan in time, its locks, its workers until they are awaited.
struct Process {
    clock: Arc<ProcessClock>,
    locks: ClusterLocks<String, SimStore>,
    workers: Vec<JoinHandle<()>>,
}

impl Run {
    /// Starts process `index`: its store on the shared table, its notices, its local registry,
    /// its leases with their heartbeat, and its workers.
    fn start_process(&self, index: usize) -> Process {
        let (seed, plan) = (self.seed, &self.plan);
        let process_plan = &plan.processes[index];
        let stream = (index as u64) << 32;
        let clock = Arc::new(ProcessClock::new(
            format!("p{index}"),
            self.start,
            process_plan.clone(),
        ));
        let (inner, table_notices) = self.table.store(LEASE);
        let store = SimStore::new(
            inner,
            self.table.clone(),
            Arc::clone(&clock),
            Rng::new(seed, STORE | stream),
            Arc::clone(&self.checker),
            Arc::clone(&self.log),
        );
        let notices = relay_notices(
            table_notices,
            Arc::clone(&clock),
            Rng::new(seed, NOTICES | stream),
            Arc::clone(&self.checker),
            Arc::clone(&self.log),
        );
        let local = RegistryBuilder::new()
            .capacity(plan.capacity)
            .shards(plan.shards)
            .execution(plan.execution)
            .router_seed(seed)
            .spawn();
        let polling = Jitter::from_seed(Rng::new(seed, POLLING | stream).next_u64());
        let leases = Leases::new(store, self.bounds, LEASE, None, polling);
        if self.planted == Some(PlantedBug::KeepsWantedLease) {
            leases.plant_ignoring_wanted();
        }
        if self.planted == Some(PlantedBug::KeepsWantedPart) {
            leases.plant_ignoring_part_wanted();
        }
        if self.planted == Some(PlantedBug::KeepsUnwantedLease) {
            leases.plant_keeping_unwanted();
        }
        leases::spawn_background(&leases, notices, HEARTBEAT);
        let locks = ClusterLocks::new(local, leases);
        let workers = (0..process_plan.workers)
            .map(|worker| {
                let job = Worker {
                    who: format!("p{index}.w{worker}"),
                    locks: locks.clone(),
                    process: Arc::clone(&clock),
                    keys: plan.keys,
                    capacity: plan.capacity.get(),
                    reader: plan.reader_process && index == 0,
                    ops: plan.ops_per_worker,
                    rng: Rng::new(seed, WORKER | stream | ((worker as u64) << 16)),
                    checker: Arc::clone(&self.checker),
                    log: Arc::clone(&self.log),
                    try_waits: self.planted == Some(PlantedBug::TryWaits),
                    lock_all_one_by_one: self.planted == Some(PlantedBug::LockAllOneByOne),
                };
                tokio::spawn(Pausable::new(job.run(), Arc::clone(&clock)))
            })
            .collect();
        Process {
            clock,
            locks,
            workers,
        }
    }

    /// The world's own faults, in a task: kills, early shutdowns, clock jumps.
    fn spawn_world_events(&self, processes: &[Process]) -> JoinHandle<()> {
        let mut events: Vec<(Duration, WorldEvent)> = Vec::new();
        for (index, process_plan) in self.plan.processes.iter().enumerate() {
            if let Some(at) = process_plan.killed_at {
                events.push((at, WorldEvent::Kill(index)));
            }
            if let Some(at) = process_plan.shutdown_at {
                events.push((at, WorldEvent::Shutdown(index)));
            }
        }
        for &(at, by) in &self.plan.clock_jumps {
            events.push((at, WorldEvent::Jump(by)));
        }
        events.sort_by_key(|(at, _)| *at);
        let targets: Vec<_> = processes
            .iter()
            .map(|process| {
                let aborts: Vec<_> = process
                    .workers
                    .iter()
                    .map(JoinHandle::abort_handle)
                    .collect();
                (process.clock.name.clone(), process.locks.clone(), aborts)
            })
            .collect();
        let (log, checker, start) = (Arc::clone(&self.log), Arc::clone(&self.checker), self.start);
        tokio::spawn(async move {
            for (at, event) in events {
                sleep_until(start + at).await;
                log.event("world", format_args!("{event:?}"));
                match event {
                    WorldEvent::Kill(index) => {
                        let (name, _, aborts) = &targets[index];
                        checker.count_fault();
                        checker.killed(name);
                        aborts.iter().for_each(AbortHandle::abort);
                    }
                    WorldEvent::Shutdown(index) => {
                        let locks = targets[index].1.clone();
                        tokio::spawn(async move { locks.shutdown().await });
                    }
                    WorldEvent::Jump(by) => {
                        checker.count_fault();
                        checker.clock_jumps(by);
                        tokio::time::advance(by).await;
                    }
                }
            }
        })
    }
}

/// How often the watchdog checks that every call ends, and that no lease is kept for nobody.
const WATCH_EVERY: Duration = Duration::from_millis(100);

/// A lease that no worker of its live process wants lingers [`IDLE_LINGER`] at most before it
/// goes back (invariant 2 of `leases`): each one kept for nobody is in a linger. A linger found
/// under way past [`LINGER_BOUND`] fails the check if it still is at the next check (a jump of
/// the clock wakes many tasks at once, and the linger's end may not have run yet at the first).
/// Returns the lingers overdue now, for the next check.
async fn check_kept_for_nobody(
    processes: &[(Arc<ProcessClock>, Arc<Leases<SimStore>>)],
    overdue_before: HashSet<(String, String, Fence, Instant)>,
    checker: &Checker,
) -> HashSet<(String, String, Fence, Instant)> {
    // The tasks queued at this instant (a linger's end among them) run first.
    for _ in 0..4 {
        tokio::task::yield_now().await;
    }
    let now = Instant::now();
    let mut overdue = HashSet::new();
    for (clock, leases) in processes {
        if clock.is_dead(now) {
            continue;
        }
        for (key, fence, lingering) in leases.kept_for_nobody() {
            match lingering {
                Some(since) if now - since <= LINGER_BOUND => {}
                Some(since) => {
                    let linger = (clock.name.clone(), key, fence, since);
                    if overdue_before.contains(&linger) {
                        checker.fail(format!(
                            "{} kept its lease of {:?} (fence {fence}) for nobody for {:?}",
                            linger.0,
                            linger.1,
                            now - since
                        ));
                    }
                    overdue.insert(linger);
                }
                None => checker.fail(format!(
                    "{} keeps its lease of {key:?} (fence {fence}) for nobody, and nothing will \
                     give it back",
                    clock.name
                )),
            }
        }
    }
    overdue
}

/// How long past its start a linger is found still under way, at most: [`IDLE_LINGER`] and a
/// timer's rounding to the millisecond, with room.
const LINGER_BOUND: Duration = IDLE_LINGER.saturating_mul(10);

/// Once every worker is done: no call under way, no local entry or held lease in a live
/// process once its releases had time to land, and no live lease in the table a lease later.
async fn check_idle(
    processes: &[Process],
    table: &MemoryLeaseTable,
    checker: &Checker,
    log: &EventLog,
) {
    if checker.calls_under_way() > 0 {
        checker.fail(format!(
            "{} lock calls never ended",
            checker.calls_under_way()
        ));
    }
    // Releases run in tasks of their own: give them (and any pause or outage) time to land.
    sleep(Duration::from_secs(5)).await;
    for Process { clock, locks, .. } in processes {
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
