//! A run's shape and its fault windows, drawn from the seed before the run starts.

use std::num::{NonZeroU32, NonZeroUsize};
use std::time::Duration;

use tokio::time::Instant;

use super::rng::Rng;
use crate::runtime::execution::Execution;

/// Every process's leases last this long. With the default heartbeat (a quarter of it) and
/// hand-off hold (half of it).
pub(super) const LEASE: Duration = Duration::from_secs(1);
pub(super) const HEARTBEAT: Duration = Duration::from_millis(250);
pub(super) const MAX_HOLD: Duration = Duration::from_millis(500);

/// Faults are planned within this much of the start; the workload usually outlasts it.
const FAULT_HORIZON: Duration = Duration::from_secs(8);

/// A stretch of simulated time, from the start of the run.
#[derive(Debug, Clone, Copy)]
pub(super) struct Window {
    pub(super) from: Duration,
    pub(super) until: Duration,
}

impl Window {
    fn draw(rng: &mut Rng, shortest: Duration, longest: Duration) -> Self {
        let from = rng.between(Duration::ZERO, FAULT_HORIZON);
        Window {
            from,
            until: from + rng.between(shortest, longest),
        }
    }
}

/// What happens to one simulated process.
#[derive(Debug, Clone)]
pub(super) struct ProcessPlan {
    pub(super) workers: usize,
    /// Its tasks are not polled and its statements not sent (a GC pause, a stopped VM).
    pub(super) pauses: Vec<Window>,
    /// Its connection to the table is down: statements fail unsent, notices are lost, and a
    /// `Missed` notice follows when it comes back.
    pub(super) outages: Vec<Window>,
    /// Killed here: its tasks stop for good and its statements never arrive.
    pub(super) killed_at: Option<Duration>,
    /// Shut down here, while its workers still run.
    pub(super) shutdown_at: Option<Duration>,
}

/// The run's shape, from its seed.
#[derive(Debug, Clone)]
pub(super) struct Plan {
    pub(super) processes: Vec<ProcessPlan>,
    pub(super) keys: usize,
    pub(super) ops_per_worker: usize,
    pub(super) max_uses: u32,
    pub(super) shards: NonZeroUsize,
    pub(super) execution: Execution,
    /// The whole world's clock jumps forward by `.1` at `.0` (a suspended VM, a stalled host).
    pub(super) clock_jumps: Vec<(Duration, Duration)>,
    /// Permits per key, in the table and in every process.
    pub(super) capacity: NonZeroU32,
    /// The first process is a reader: its workers mostly take one permit of the hot key, for
    /// a moment, again and again, so that its part leases are handed off among them while the
    /// other processes' writers wait.
    pub(super) reader_process: bool,
}

impl Plan {
    pub(super) fn draw(rng: &mut Rng) -> Self {
        let process_count = 2 + rng.below(3) as usize;
        let mut processes: Vec<ProcessPlan> = (0..process_count)
            .map(|_| ProcessPlan {
                workers: 1 + rng.below(3) as usize,
                pauses: (0..rng.below(3))
                    .map(|_| Window::draw(rng, Duration::from_millis(100), 2 * LEASE))
                    .collect(),
                outages: (0..rng.below(3))
                    .map(|_| Window::draw(rng, Duration::from_millis(50), 2 * LEASE))
                    .collect(),
                killed_at: None,
                shutdown_at: None,
            })
            .collect();
        if rng.chance(150) {
            let victim = rng.below(process_count as u64) as usize;
            processes[victim].killed_at = Some(rng.between(Duration::ZERO, FAULT_HORIZON));
        }
        if rng.chance(150) {
            let leaving = rng.below(process_count as u64) as usize;
            processes[leaving].shutdown_at = Some(rng.between(Duration::ZERO, FAULT_HORIZON));
        }
        let keys = 1 + rng.below(3) as usize;
        let ops_per_worker = 10 + rng.below(30) as usize;
        let max_uses = [1, 4, 16][rng.below(3) as usize];
        let shards = NonZeroUsize::new([1, 4][rng.below(2) as usize]).unwrap_or(NonZeroUsize::MIN);
        let execution = if rng.chance(500) {
            Execution::RunOnCaller
        } else {
            Execution::ActorTask
        };
        let clock_jumps = (0..rng.below(3))
            .map(|_| {
                (
                    rng.between(Duration::ZERO, FAULT_HORIZON),
                    rng.between(LEASE, 2 * LEASE),
                )
            })
            .collect();
        // Drawn last, so that the draws above give the runs they gave before it was drawn.
        let capacity = NonZeroU32::new([1, 2, 3][rng.below(3) as usize]).unwrap_or(NonZeroU32::MIN);
        let reader_process = capacity.get() > 1 && rng.chance(250);
        if reader_process {
            processes[0].workers = 2 + rng.below(3) as usize;
        }
        Plan {
            reader_process,
            capacity,
            processes,
            keys,
            ops_per_worker,
            max_uses,
            shards,
            execution,
            clock_jumps,
        }
    }
}

/// A process's plan in instants of the run that started at `start`.
#[derive(Debug)]
pub(super) struct ProcessClock {
    pub(super) name: String,
    start: Instant,
    plan: ProcessPlan,
}

impl ProcessClock {
    pub(super) fn new(name: String, start: Instant, plan: ProcessPlan) -> Self {
        ProcessClock { name, start, plan }
    }

    pub(super) fn plan(&self) -> &ProcessPlan {
        &self.plan
    }

    fn within(&self, windows: &[Window], now: Instant) -> Option<Instant> {
        let offset = now.duration_since(self.start);
        windows
            .iter()
            .filter(|window| window.from <= offset && offset < window.until)
            .map(|window| self.start + window.until)
            .max()
    }

    /// When the pause under way at `now` ends, if one is.
    pub(super) fn paused_until(&self, now: Instant) -> Option<Instant> {
        self.within(&self.plan.pauses, now)
    }

    /// How long the process was paused between `from` and `to` (overlapping pauses counted
    /// once each: at most an over-estimate).
    pub(super) fn paused_between(&self, from: Instant, to: Instant) -> Duration {
        self.plan
            .pauses
            .iter()
            .map(|window| {
                let start = self.at(window.from).max(from);
                let end = self.at(window.until).min(to);
                end.saturating_duration_since(start)
            })
            .sum()
    }

    /// When the outage under way at `now` ends, if one is.
    pub(super) fn down_until(&self, now: Instant) -> Option<Instant> {
        self.within(&self.plan.outages, now)
    }

    pub(super) fn is_dead(&self, now: Instant) -> bool {
        self.plan
            .killed_at
            .is_some_and(|at| now.duration_since(self.start) >= at)
    }

    /// The instant `offset` after the start of the run.
    pub(super) fn at(&self, offset: Duration) -> Instant {
        self.start + offset
    }
}
