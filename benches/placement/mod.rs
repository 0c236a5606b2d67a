//! How far apart the machine's two cores are right now, measured: the round trip of one cache
//! line between two threads.
//!
//! On the 2-core VMs these benchmarks were measured on, the host moves the two virtual CPUs
//! between physical cores several times a second. This probe found a cache line going from one
//! to the other and back in about 80 to 290 ns at some moments ("near") and 300 to 1,130 ns at
//! others ("far") on such a VM. Every lock word, run queue and table that two workers share
//! pays that, so a 2-worker run of `profile_contended` takes about twice as long with the cores
//! far apart, whoever runs it. A benchmark that compares runs therefore says which placement each
//! ran under, and compares runs under the same one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Round trips per probe: about 2 ms when the cores are near, 10 ms when they are far.
const ROUND_TRIPS: u64 = 20_000;

/// Round trips below this are "near" (a shared cache), at or above it "far": between the two
/// clusters this probe finds on the 2-core VMs.
pub const NEAR_BELOW: Duration = Duration::from_nanos(300);

/// Spins before a waiting side yields its core: two threads on one core still finish, if
/// slowly (and are then measured as far, which for a run on that core they are).
const SPINS_BEFORE_YIELD: u32 = 1 << 16;

/// The mean round trip of a cache line between this thread and another, which the OS puts on
/// the other core while both spin.
pub fn round_trip() -> Duration {
    // Its own cache line, so that nothing else in the process moves it.
    #[repr(align(128))]
    struct Line(AtomicU64);
    let line = Line(AtomicU64::new(0));
    let wait_for = |wanted: u64| {
        let mut spins = 0u32;
        while line.0.load(Ordering::Acquire) != wanted {
            spins += 1;
            if spins == SPINS_BEFORE_YIELD {
                spins = 0;
                std::thread::yield_now();
            }
            std::hint::spin_loop();
        }
    };
    std::thread::scope(|scope| {
        scope.spawn(|| {
            for trip in 0..ROUND_TRIPS {
                wait_for(2 * trip + 1);
                line.0.store(2 * trip + 2, Ordering::Release);
            }
        });
        let start = Instant::now();
        for trip in 0..ROUND_TRIPS {
            line.0.store(2 * trip + 1, Ordering::Release);
            wait_for(2 * trip + 2);
        }
        start.elapsed() / ROUND_TRIPS as u32
    })
}

/// Where the cores were during a run, from probes taken just before and just after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Both probes found the cores near each other.
    Near,
    /// Both found them far apart.
    Far,
    /// They moved during the run.
    Mixed,
}

impl Placement {
    pub fn of(before: Duration, after: Duration) -> Self {
        match (before < NEAR_BELOW, after < NEAR_BELOW) {
            (true, true) => Placement::Near,
            (false, false) => Placement::Far,
            _ => Placement::Mixed,
        }
    }

    /// One letter, for a table cell: `n`, `f` or `m`.
    // Each benchmark that includes this module uses only some of its functions.
    #[allow(dead_code)]
    pub fn letter(self) -> char {
        self.name().chars().next().unwrap_or('?')
    }

    pub fn name(self) -> &'static str {
        match self {
            Placement::Near => "near",
            Placement::Far => "far",
            Placement::Mixed => "mixed",
        }
    }
}
