//! The leases this process holds, and who in the process wants them: lock cohorting on top of
//! a [`LeaseStore`].
//!
//! A `lock` in cluster mode first takes the key in the process's own registry (local FIFO,
//! cancel-safe), then makes sure the process holds the key's lease. While it does, the lease
//! passes from one local holder to the next without a round trip to the database, up to a
//! bound, and is then released so that other processes get their turn: the cohort locks of
//! Dice, Marathe and Shavit ("Lock Cohorting: A General Technique for Designing NUMA Locks",
//! PPoPP 2012), with the process as the cohort and the lease as the global lock.
//!
//! Unlike a cohort lock, which sees the other cohorts' waiters in shared memory, a process
//! learns of other processes' waiters only from the store. So the bound is counted in
//! *rounds*: when a round of hand-offs reaches the bound, the process gives the lease back
//! only if another process wants the key, as far as it knows; else it asks the store (a
//! renewal, whose reply says whether an acquisition was refused the key, see
//! [`Renewal`]) and, if nobody does, keeps the lease for another round. A process alone on
//! its key thus keeps its lease while its callers want it, at one renewal per round (sent
//! halfway through a round, or at its start once the key has been kept, so that its reply is
//! usually back by the bound), and another process that wants the key gets it after at most
//! two rounds: the one under way, and the next if the renewal that asked ran just before its
//! refusal. A lease taken after a refusal of ours goes back at the first bound, without
//! asking: another process held the key just before, so it is contended.
//!
//! A request for part of a key's permits (a shared lock, a few permits) takes a *part lease*
//! of that many permits instead. Local holders of parts of a key hold their part leases side
//! by side, one each, and each part lease is handed off as a whole lease is: when its guard
//! drops, the process keeps it for the next local request of the same size, in rounds with
//! the same bounds and the same question at each round's end (a renewal of the part, whose
//! reply says whether a request waits for the key). Readers of one process that lock a key
//! again and again thus send a statement per round of each part, not two per lock. A part
//! known to be wanted goes back as soon as no guard uses it, and so does every idle part
//! once nobody in the process wants the key: an idle part holds permits that another process
//! may be waiting for, and nothing in this process may come to use it.
//!
//! Every statement runs in a task of its own ([`Leases::acquire`], [`Leases::spawn_release`]),
//! so that a `lock` future dropped mid-statement never leaves its outcome unrecorded: a lease
//! taken for a caller that has gone is recorded all the same, and released if nobody in the
//! process wants the key any more.
//!
//! # Invariants
//!
//! Under the one mutex of [`Leases`]:
//! 1. A key has an entry exactly while its `interest` is above zero, it holds a lease (whole
//!    or part), or a statement of ours for it is in flight: an acquisition (`in_flight`) or a
//!    release (`releasing`). No entry outlives all of them, so the map does not grow with the
//!    keys ever used.
//! 2. `interest` counts the local callers between the start of a `lock` and the drop of its
//!    guard (or of the `lock` future). When it drops to zero, a lease still held lingers: it
//!    is released when the process next sends an acquisition, or [`IDLE_LINGER`] later,
//!    whichever comes first, unless a local caller has come back by then (at once if another
//!    process is known to want it). A task that takes the key again right after its guard
//!    drops, as a loop of `lock` or `try_lock` does, uses the lease without a statement; a
//!    task that goes on to another key sends the release with that key's acquisition, in one
//!    batch.
//! 3. A held lease is in use by at most one guard: the local registry grants the whole key to
//!    one holder at a time, and only that holder takes the whole lease; a holder of part of
//!    the key takes a kept part only while no guard uses it (`in_use`).
//! 4. `uses <= MAX_USES_OF_A_FENCE` for a lease, counting the guard in use: a fencing
//!    token's low bits never overflow into the fence, however many rounds it is kept.
//! 5. Once [`Leases::release_everything`] has begun (shutdown), no lease is recorded as held:
//!    one whose acquisition lands later is released, so no guard is made on a lease that
//!    shutdown's release may already have given back, and that another process may hold.
//! 6. A key's entry records only fences above every fence it recorded before
//!    (`highest_fence`): an acquisition's reply that comes back after a newer acquisition of
//!    ours was recorded is stale (the row carries the newer fence) and is ignored. Invariant 1
//!    keeps the entry, and so `highest_fence`, alive while such a reply can still come, even
//!    after its caller gave up and a newer lease of the key was granted and released.
//! 7. A guard learns that its lease is lost before any statement that gives the lease back
//!    is sent: a release's reply can come late, and the key may be another process's by then.
//! 8. Each whole lease of a `lock_all` belongs to one [`OwnedLease`], which gives it back when
//!    dropped, wherever it is dropped: in the guard, or as the output of an acquisition task
//!    whose caller went away. A kept part in use belongs to one [`PartUse`], which puts it
//!    back when dropped, wherever it is dropped, as above; a part put back while nobody in
//!    the process wants the key goes back to the store. The process holds no whole lease of a
//!    key while it asks for a part of it, and no part while it asks for the whole: the store
//!    would refuse (a whole lease excludes parts, ours too), so idle ones are given back first
//!    ([`Leases::give_back_whole`], [`Leases::give_back_parts`]).

use std::collections::{HashMap, HashSet};
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::futures::OwnedNotified;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::cluster::error::LeaseError;
use crate::cluster::locking::entropy::Jitter;
use crate::cluster::locking::lease_note::{LeaseEvent, LeaseNote};
use crate::cluster::locking::lease_store::{Fence, LeaseNotice, LeaseStore, Renewal};
use crate::cluster::locking::notices::LeaseNotices;

/// Records a note in the local registry's journal (when it keeps one).
pub(crate) type LeaseJournal = Box<dyn Fn(String) + Send + Sync>;

/// Bits of a fencing token that count local hand-offs under one fence; the fence is in the bits
/// above. A fence below 2^44 (17.6 trillion acquisitions of one key) keeps tokens increasing.
pub(crate) const HANDOFF_BITS: u32 = 20;

/// Guards one fence can issue: the tokens' low bits count them (invariant 4). A lease kept
/// round after round goes back when it reaches this, and the next is taken under a new fence.
const MAX_USES_OF_A_FENCE: u32 = 1 << HANDOFF_BITS;

/// How long at most the process keeps a lease that none of its callers wants any more before
/// giving it back (invariant 2), unless it sends a statement first.
pub(crate) const IDLE_LINGER: Duration = Duration::from_millis(1);

/// How the process shares the leases among its local holders.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CohortBounds {
    /// Guards issued in one round of a lease before the process asks whether another process
    /// wants the key (and gives it back if so): the first holder plus the local hand-offs.
    pub(crate) max_uses: u32,
    /// How long one round of a lease lasts while others in the process want the key.
    pub(crate) max_hold: Duration,
}

/// The fencing token of the `uses`-th guard under `fence`.
pub(crate) fn fencing_token(fence: Fence, uses: u32) -> u64 {
    (fence << HANDOFF_BITS) | u64::from(uses)
}

/// The local keys, hashed with a fixed seed: the heartbeat and a missed notice visit them in
/// an order that depends only on the keys and their history, so a simulated run repeats
/// exactly. The keys are whatever the callers lock, not chosen by an attacker against this map
/// in particular; the local registry's own map keeps its random seed.
type KeyMap = HashMap<String, KeyLease, foldhash::fast::FixedState>;

/// The leases of one cluster registry.
pub(crate) struct Leases<S> {
    store: S,
    bounds: CohortBounds,
    lease: Duration,
    keys: Mutex<KeyMap>,
    /// The keys whose leases linger ([`Leases::spawn_linger`]). Taken after `keys` when both
    /// are held.
    lingering: Mutex<HashSet<String>>,
    /// Set by [`release_everything`](Self::release_everything): a lease taken after it is
    /// given back at once, not recorded (invariant 5). Written and read under `keys`' lock,
    /// which orders them.
    closed: AtomicBool,
    /// A bug the simulator plants to show it is found: the process ignores what the store says
    /// of other processes' waiters, and keeps its leases round after round.
    #[cfg(test)]
    ignore_wanted: AtomicBool,
    /// Another planted bug: the process ignores it for its part leases only, and keeps them
    /// for its readers round after round while a writer of another process waits.
    #[cfg(test)]
    ignore_part_wanted: AtomicBool,
    /// Another planted bug: a lease nobody in the process wants any more is kept when its
    /// linger ends, not given back.
    #[cfg(test)]
    keep_unwanted: AtomicBool,
    journal: Option<LeaseJournal>,
    /// Spreads the waiters' polling (see [`Leases::poll_interval`]).
    jitter: Mutex<Jitter>,
    /// The heartbeat and notice tasks, stopped when the last handle on these leases goes.
    background: Mutex<Vec<tokio::task::AbortHandle>>,
    /// The runtime the leases were made on, where every statement's task runs: a guard may be
    /// dropped, and so a lease released, on a thread with no tokio context (a blocking
    /// caller's), where `tokio::spawn` would panic.
    runtime: Handle,
}

impl<S> Drop for Leases<S> {
    fn drop(&mut self) {
        let background = self
            .background
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        background.iter().for_each(tokio::task::AbortHandle::abort);
    }
}

/// One key's local state (invariant 1).
struct KeyLease {
    /// Local callers wanting or holding the key (invariant 2).
    interest: usize,
    /// Acquisition statements sent and not yet answered (invariant 1).
    in_flight: usize,
    /// Release statements sent and not yet answered (invariant 1): until they land the row
    /// is still ours, so a try of the key must not take it over (see `is_being_released`).
    releasing: usize,
    /// The highest fence recorded for the key while this entry lived (invariant 6).
    highest_fence: Fence,
    /// The whole lease the process holds, if any.
    held: Option<Held>,
    /// The part leases the process holds, each in use by one guard or kept for the next local
    /// request of its size.
    parts: Vec<Held>,
    /// The whole leases of a `lock_all`, each held by one guard (invariant 8).
    owned: Vec<Owned>,
    /// Woken when the key's lease is announced released, or notices were missed.
    released: Arc<Notify>,
    /// An acquisition of ours was refused the key since our last lease of it: another
    /// process held it, so the next lease is contended from its start.
    refused: bool,
    /// A linger of the key's idle leases is under way, since this instant
    /// ([`Leases::spawn_linger`]).
    lingering: Option<Instant>,
}

impl KeyLease {
    /// Whether the process holds a lease of the key that no guard uses: the whole lease, or
    /// an idle part.
    fn keeps_idle_leases(&self) -> bool {
        self.held.as_ref().is_some_and(|held| !held.in_use)
            || self.parts.iter().any(|part| !part.in_use)
    }

    /// Marks a linger under way from now: whether none was, so that the caller starts one.
    fn start_linger(&mut self) -> bool {
        let starts = self.lingering.is_none();
        if starts {
            self.lingering = Some(Instant::now());
        }
        starts
    }

    /// Nothing keeps the entry (invariant 1).
    fn is_unused(&self) -> bool {
        self.interest == 0
            && self.in_flight == 0
            && self.releasing == 0
            && self.held.is_none()
            && self.parts.is_empty()
            && self.owned.is_empty()
    }

    fn new() -> Self {
        KeyLease {
            interest: 0,
            in_flight: 0,
            releasing: 0,
            highest_fence: 0,
            held: None,
            parts: Vec::new(),
            owned: Vec::new(),
            released: Arc::new(Notify::new()),
            refused: false,
            lingering: None,
        }
    }
}

/// A lease the process holds for one guard, as the heartbeat renews it.
struct Owned {
    fence: Fence,
    kind: Kind,
    validity: watch::Sender<Validity>,
}

/// A lease the process holds and hands off among its local holders: the key's whole lease, or
/// a part lease of some of its permits.
struct Held {
    fence: Fence,
    /// The permits of a part lease; `None` for the whole lease.
    permits: Option<NonZeroU32>,
    /// Guards issued under this fence so far.
    uses: u32,
    /// Whether a guard holds it now (invariant 3).
    in_use: bool,
    /// The round of the hand-off bound under way: the use it began at, and when.
    round_from: u32,
    round_started: Instant,
    /// Another process wants the key, as far as this process knows (see the module's docs):
    /// the lease goes back at the bound, without asking.
    wanted: bool,
    /// The renewal that asks whether the key is wanted, for the round under way.
    check: Check,
    /// Wakes every holder waiting for the round's check ([`CheckAnswered`]) when it is
    /// answered, and when the lease is let go (`Drop`).
    check_answered: Arc<Notify>,
    /// Tells the guards of this fence how long it is good for, and when it is lost.
    validity: watch::Sender<Validity>,
}

impl Drop for Held {
    fn drop(&mut self) {
        // Holders waiting for this lease's check look again, and find it gone.
        self.check_answered.notify_waiters();
    }
}

/// Whether the round under way asked the store if the key is wanted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    NotAsked,
    Asked,
    /// Answered: nobody else wanted the key when the renewal ran.
    NotWanted,
}

/// What a guard knows of its lease.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Validity {
    /// The lease is gone: taken by another process, not renewable, or released at shutdown.
    pub(crate) lost: bool,
    /// The lease is surely ours until this instant: the start of the last statement that
    /// took or renewed it, plus the lease. The database counts the lease from when it runs
    /// the statement, which is later, so this errs on the safe side. Past it, with no renewal
    /// confirmed, another process may hold the key.
    pub(crate) until: Instant,
}

impl Validity {
    pub(crate) fn is_lost(&self) -> bool {
        self.lost || Instant::now() >= self.until
    }
}

impl Held {
    fn kind(&self) -> Kind {
        if self.permits.is_some() {
            Kind::Part
        } else {
            Kind::Whole
        }
    }

    /// Whether it goes back rather than wait idle for another local holder: known wanted by
    /// another process, lost, or at its fence's last use.
    fn must_go_back(&self) -> bool {
        self.wanted || self.uses >= MAX_USES_OF_A_FENCE || self.validity.borrow().is_lost()
    }
}

/// What the round of a held lease allows its next local holder.
enum Step {
    Use(Lease),
    /// At the bound; the store is being asked whether another process wants the key.
    AwaitCheck(CheckAnswered),
    /// The lease goes back: lost, at its fence's last use, or at the bound and wanted.
    GiveBack,
}

/// What the local holder of a key must do to hold its lease.
pub(crate) enum Next<L = Lease> {
    /// Use the lease the process holds: here is the fencing token and the lost signal.
    Use(L),
    /// Acquire a lease. `after_release` is set when the process has just given one back at its
    /// cohort bound: the release's task, which returns how long its statement took. Waiting a
    /// little before taking the lease again lets other processes have it.
    Acquire {
        after_release: Option<tokio::task::JoinHandle<Duration>>,
    },
    /// The lease is at its bound and the store is being asked whether another process wants
    /// it: wait for this, then ask again.
    AwaitCheck(CheckAnswered),
}

/// Ready once the check a holder waits for is answered or its lease let go. Registered with
/// the lease's [`Notify`] before the leases' lock is let go, where the check's state was read,
/// so that an answer coming in between is not missed; every holder waiting for one check is
/// woken (`notify_waiters`): several readers may wait for one part lease.
pub(crate) type CheckAnswered = Pin<Box<OwnedNotified>>;

/// Registers for the answer to `held`'s check; called with the leases' lock held.
fn await_check(held: &Held) -> CheckAnswered {
    let mut answered = Box::pin(Arc::clone(&held.check_answered).notified_owned());
    answered.as_mut().enable();
    answered
}

/// A guard's share of a held lease.
pub(crate) struct Lease {
    pub(crate) fence: Fence,
    pub(crate) fencing_token: u64,
    pub(crate) validity: watch::Receiver<Validity>,
}

impl<S: LeaseStore> Leases<S> {
    /// The leases of a process on `store`; `jitter` draws its polling intervals (seeded at
    /// random in production, from the run's seed in a simulation). Made within the runtime
    /// its statements will run on.
    pub(crate) fn new(
        store: S,
        bounds: CohortBounds,
        lease: Duration,
        journal: Option<LeaseJournal>,
        jitter: Jitter,
    ) -> Arc<Self> {
        Arc::new(Leases {
            store,
            bounds,
            lease,
            keys: Mutex::new(KeyMap::default()),
            lingering: Mutex::new(HashSet::new()),
            closed: AtomicBool::new(false),
            #[cfg(test)]
            ignore_wanted: AtomicBool::new(false),
            #[cfg(test)]
            ignore_part_wanted: AtomicBool::new(false),
            #[cfg(test)]
            keep_unwanted: AtomicBool::new(false),
            journal,
            jitter: Mutex::new(jitter),
            background: Mutex::new(Vec::new()),
            runtime: Handle::current(),
        })
    }

    /// Plants the simulator's bug: see `ignore_wanted`.
    #[cfg(test)]
    pub(crate) fn plant_ignoring_wanted(&self) {
        self.ignore_wanted.store(true, Ordering::Relaxed);
    }

    /// Plants the simulator's bug: see `ignore_part_wanted`.
    #[cfg(test)]
    pub(crate) fn plant_ignoring_part_wanted(&self) {
        self.ignore_part_wanted.store(true, Ordering::Relaxed);
    }

    /// Plants the simulator's bug: see `keep_unwanted`.
    #[cfg(test)]
    pub(crate) fn plant_keeping_unwanted(&self) {
        self.keep_unwanted.store(true, Ordering::Relaxed);
    }

    /// Whether the planted bug is on: never in a build that is not a test.
    fn keeps_unwanted(&self) -> bool {
        #[cfg(test)]
        return self.keep_unwanted.load(Ordering::Relaxed);
        #[cfg(not(test))]
        false
    }

    /// The leases the process keeps while nobody in it wants their key: `(key, fence, since)`
    /// of each whole lease and idle part of a key without local callers, `since` the start of
    /// the linger under way (none: nothing will give it back). For the simulator, which
    /// checks that none is kept for long.
    #[cfg(test)]
    pub(crate) fn kept_for_nobody(&self) -> Vec<(String, Fence, Option<Instant>)> {
        let keys = self.keys();
        keys.iter()
            .filter(|(_, entry)| entry.interest == 0)
            .flat_map(|(name, entry)| {
                entry
                    .held
                    .iter()
                    .chain(&entry.parts)
                    .filter(|held| !held.in_use)
                    .map(|held| (name.clone(), held.fence, entry.lingering))
            })
            .collect()
    }

    /// Whether the planted bug is on: never in a build that is not a test.
    fn ignores_wanted(&self) -> bool {
        #[cfg(test)]
        return self.ignore_wanted.load(Ordering::Relaxed);
        #[cfg(not(test))]
        false
    }

    /// Whether a planted bug ignores `kind`'s waiters: never in a build that is not a test.
    fn ignores_wanted_of(&self, kind: Kind) -> bool {
        #[cfg(test)]
        if matches!(kind, Kind::Part) && self.ignore_part_wanted.load(Ordering::Relaxed) {
            return true;
        }
        #[cfg(not(test))]
        let _ = kind;
        self.ignores_wanted()
    }

    fn record(&self, name: &str, event: LeaseEvent) {
        if let Some(journal) = &self.journal {
            journal(LeaseNote { name, event }.to_string());
        }
    }

    fn keys(&self) -> MutexGuard<'_, KeyMap> {
        // Nothing panics while holding the lock (no user code runs under it); a poisoned map
        // is still consistent.
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a local caller's interest in `name` (invariant 2); the returned handle
    /// withdraws it when dropped.
    pub(crate) fn register(self: &Arc<Self>, name: &str) -> Interest {
        let mut keys = self.keys();
        let entry = keys.entry(name.to_owned()).or_insert_with(KeyLease::new);
        entry.interest += 1;
        Interest {
            leases: Arc::clone(self) as Arc<dyn LocalUsers>,
            name: name.to_owned(),
            released: Arc::clone(&entry.released),
        }
    }

    /// For the local holder of `name`: use the held lease if the cohort bounds allow, or say
    /// what to do. A lease at its bound is released here, in a task of its own, and so are
    /// the process's idle part leases of the key before it asks for the whole (invariant 8).
    pub(crate) fn next_for_holder(self: &Arc<Self>, name: &str) -> Next {
        let mut keys = self.keys();
        let Some(entry) = keys.get_mut(name) else {
            return Next::Acquire {
                after_release: None,
            };
        };
        let mut give_back = Vec::new();
        if let Some(held) = &mut entry.held {
            if held.in_use {
                // Invariant 3 says the local holder (this caller) is the only user; a lease in
                // use here was taken over by a newer one of ours, which `record_answer` marks
                // lost.
                debug_assert!(false, "invariant 3: two local holders of one lease");
                return Next::Acquire {
                    after_release: None,
                };
            }
            match self.step(name, held) {
                Step::Use(lease) => return Next::Use(lease),
                Step::AwaitCheck(answered) => return Next::AwaitCheck(answered),
                Step::GiveBack => give_back.push((held.fence, Kind::Whole)),
            }
            entry.held = None;
        }
        give_back.extend(take_idle_parts(entry, None));
        drop(keys);
        Next::Acquire {
            after_release: self.spawn_releases(name, give_back),
        }
    }

    /// For a local holder of `permits` of `name`: use an idle part lease of that size that the
    /// process keeps, if its round allows, or say what to do. With none usable and one at its
    /// bound whose check is on its way, wait for the check ([`Next::AwaitCheck`]) rather than
    /// take a part of its own: a part more would hold permits that readers of other processes
    /// may be refused, and their waiting mark would then send every idle part back. Parts that
    /// must go back are released here, in tasks of their own, and so are the idle whole lease
    /// and idle parts of other sizes before a new part is asked for (invariant 8): they hold
    /// permits this request may need.
    pub(crate) fn next_for_part_holder(
        self: &Arc<Self>,
        name: &str,
        permits: NonZeroU32,
    ) -> Next<PartUse> {
        let mut keys = self.keys();
        let Some(entry) = keys.get_mut(name) else {
            return Next::Acquire {
                after_release: None,
            };
        };
        let mut give_back = Vec::new();
        let mut awaiting = None;
        let mut at = 0;
        while let Some(part) = entry.parts.get_mut(at) {
            if part.in_use || part.permits != Some(permits) {
                at += 1;
                continue;
            }
            match self.step(name, part) {
                Step::Use(lease) => {
                    drop(keys);
                    return Next::Use(PartUse {
                        users: Arc::clone(self) as Arc<dyn LocalUsers>,
                        name: name.to_owned(),
                        lease,
                    });
                }
                Step::AwaitCheck(answered) => {
                    awaiting.get_or_insert(answered);
                    at += 1;
                }
                Step::GiveBack => {
                    let part = entry.parts.swap_remove(at);
                    give_back.push((part.fence, Kind::Part));
                }
            }
        }
        if let Some(answered) = awaiting {
            drop(keys);
            // Parts that went back meanwhile need no wait: nobody here comes for them.
            drop(self.spawn_releases(name, give_back));
            return Next::AwaitCheck(answered);
        }
        if let Some(held) = entry.held.take_if(|held| !held.in_use) {
            held.validity.send_modify(|validity| validity.lost = true);
            give_back.push((held.fence, Kind::Whole));
        }
        give_back.extend(take_idle_parts(entry, Some(permits)));
        drop(keys);
        Next::Acquire {
            after_release: self.spawn_releases(name, give_back),
        }
    }

    /// What the round of `held` (a lease of `name` that no guard uses) allows its next local
    /// holder. Asks the store whether the key is wanted, in a task of its own, ahead of the
    /// bound or at it.
    fn step(self: &Arc<Self>, name: &str, held: &mut Held) -> Step {
        if held.uses >= MAX_USES_OF_A_FENCE || held.validity.borrow().is_lost() {
            return Step::GiveBack;
        }
        let round_uses = held.uses - held.round_from;
        let round_time = held.round_started.elapsed();
        let mut in_round = round_uses < self.bounds.max_uses && round_time < self.bounds.max_hold;
        if !in_round && !held.wanted {
            match held.check {
                Check::NotWanted => {
                    // Nobody else wants the key: another round.
                    held.round_from = held.uses;
                    held.round_started = Instant::now();
                    held.check = Check::NotAsked;
                    in_round = true;
                }
                Check::Asked => return Step::AwaitCheck(await_check(held)),
                Check::NotAsked => {
                    held.check = Check::Asked;
                    self.spawn_check(name, held);
                    return Step::AwaitCheck(await_check(held));
                }
            }
        }
        if !in_round {
            return Step::GiveBack;
        }
        // Ask ahead, so that the answer is usually back by the bound: halfway through the
        // first round, at the start of every round after it (the key is kept). Never at a
        // lease's first guard: a key locked once needs no renewal.
        let ask_now = held.round_from > 0
            || round_uses >= (self.bounds.max_uses / 2).max(1)
            || round_time >= self.bounds.max_hold / 2;
        if ask_now && !held.wanted && held.check == Check::NotAsked {
            held.check = Check::Asked;
            self.spawn_check(name, held);
        }
        held.in_use = true;
        let lease = Lease {
            fence: held.fence,
            fencing_token: fencing_token(held.fence, held.uses),
            validity: held.validity.subscribe(),
        };
        held.uses += 1;
        Step::Use(lease)
    }

    /// Releases `leases` of `name` (whole or part), each in a task of its own: one task that
    /// awaits them all and returns the longest round trip, or `None` if there are none.
    fn spawn_releases(
        self: &Arc<Self>,
        name: &str,
        leases: Vec<(Fence, Kind)>,
    ) -> Option<tokio::task::JoinHandle<Duration>> {
        if leases.is_empty() {
            return None;
        }
        let releases: Vec<_> = leases
            .into_iter()
            .map(|(fence, kind)| self.spawn_release_of(name.to_owned(), fence, kind))
            .collect();
        Some(self.runtime.spawn(async move {
            let mut longest = Duration::ZERO;
            for release in releases {
                longest = longest.max(release.await.unwrap_or(Duration::ZERO));
            }
            longest
        }))
    }

    /// Gives back the part leases of `name` that the process keeps and no guard uses, before
    /// a local holder of the whole key asks for its lease (invariant 8): the releases' task,
    /// to await before asking, or `None` if there were none.
    pub(crate) fn give_back_parts(
        self: &Arc<Self>,
        name: &str,
    ) -> Option<tokio::task::JoinHandle<Duration>> {
        let idle = {
            let mut keys = self.keys();
            let entry = keys.get_mut(name)?;
            take_idle_parts(entry, None)
        };
        self.spawn_releases(name, idle)
    }

    /// One acquisition attempt for the local holder of `name`, run in a task of its own so
    /// that its outcome is recorded even if the caller goes away: `Ok(Some(lease))` if taken,
    /// `Ok(None)` if another process holds it (the store then announces its release).
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        name: &str,
    ) -> Result<Option<Lease>, AcquireFailed> {
        self.ask(name, Ask::Acquire).await
    }

    /// As [`acquire`](Self::acquire), with the store's `try_acquire`: `Ok(None)` also when
    /// another process waits for the key, and nothing is announced.
    pub(crate) async fn try_acquire(
        self: &Arc<Self>,
        name: &str,
    ) -> Result<Option<Lease>, AcquireFailed> {
        self.ask(name, Ask::Try).await
    }

    async fn ask(self: &Arc<Self>, name: &str, ask: Ask) -> Result<Option<Lease>, AcquireFailed> {
        self.end_lingers();
        let leases = Arc::clone(self);
        let owned_name = name.to_owned();
        self.record(name, LeaseEvent::Requested);
        if let Some(entry) = self.keys().get_mut(name) {
            entry.in_flight += 1;
        } else {
            debug_assert!(
                false,
                "invariant 1: the local holder's key without an entry"
            );
        }
        let attempt = self.runtime.spawn(async move {
            let started = Instant::now();
            let taken = match ask {
                Ask::Acquire => leases.store.acquire(&owned_name).await,
                Ask::Try => leases.store.try_acquire(&owned_name).await,
            };
            leases.record_answer(&owned_name, taken.as_ref().ok().copied().flatten(), started);
            match taken {
                Ok(taken) => Ok(taken),
                Err(error) => Err(AcquireFailed(error.to_string())),
            }
        });
        let taken = attempt
            .await
            .unwrap_or_else(|join_error| Err(AcquireFailed(join_error.to_string())))?;
        if taken.is_none() {
            return Ok(None);
        }
        // Recorded by the task; this caller is the key's local holder, so the lease is its to
        // use (or a newer one of ours, if a late statement of a caller that went away landed).
        match self.next_for_holder(name) {
            Next::Use(lease) => Ok(Some(lease)),
            // A lease just recorded is at the start of its first round.
            Next::Acquire { .. } | Next::AwaitCheck(_) => Ok(None),
        }
    }

    /// Records the answer to an acquisition statement: `taken` is the fence if it took the
    /// lease. A lease just taken is recorded, not yet in use, unless it is stale (invariant 6),
    /// or nobody in the process wants the key any more (the caller went away mid-statement), or
    /// the leases were released for shutdown while the statement ran (invariant 5): then it is
    /// released at once.
    fn record_answer(self: &Arc<Self>, name: &str, taken: Option<Fence>, started: Instant) {
        let mut keys = self.keys();
        let closed = self.closed.load(Ordering::Relaxed);
        let Some(entry) = keys.get_mut(name) else {
            debug_assert!(false, "invariant 1: an answer for a key without an entry");
            drop(keys);
            if let Some(fence) = taken {
                self.spawn_release(name.to_owned(), fence);
            }
            return;
        };
        entry.in_flight -= 1;
        let mut release = None;
        let refused_before = std::mem::take(&mut entry.refused);
        match taken {
            Some(fence) if fence <= entry.highest_fence => entry.refused = refused_before,
            Some(fence) if entry.interest == 0 || closed => {
                entry.highest_fence = fence;
                release = Some(fence);
            }
            Some(fence) => {
                entry.highest_fence = fence;
                if let Some(held) = &entry.held {
                    // Our own later statement took the row over: the older lease is gone.
                    held.validity.send_modify(|validity| validity.lost = true);
                    self.record(name, LeaseEvent::Lost(held.fence));
                }
                // So is a `lock_all`'s lease of the key, if an acquisition of ours sent before
                // it landed after it.
                lose_whole_leases_below(entry, fence);
                self.record(name, LeaseEvent::Granted(fence));
                let (validity, _) = watch::channel(Validity {
                    lost: false,
                    until: started + self.lease,
                });
                entry.held = Some(Held {
                    fence,
                    permits: None,
                    uses: 0,
                    in_use: false,
                    round_from: 0,
                    round_started: started,
                    wanted: refused_before && !self.ignores_wanted(),
                    check: Check::NotAsked,
                    check_answered: Arc::new(Notify::new()),
                    validity,
                });
            }
            None => entry.refused = true,
        }
        if entry.is_unused() {
            keys.remove(name);
        }
        drop(keys);
        if let Some(fence) = release {
            self.spawn_release(name.to_owned(), fence);
        }
    }

    /// One attempt at the whole leases of every key of `names` (sorted, no duplicates) at
    /// once, run in a task of its own: every lease, each held by an [`OwnedLease`], or
    /// `Ok(None)` if any key was refused (then none is held). The caller holds every key
    /// locally and gave back the process's idle leases of them first.
    pub(crate) async fn acquire_all(
        self: &Arc<Self>,
        names: Vec<String>,
        ask: Ask,
    ) -> Result<Option<Vec<OwnedLease>>, AcquireFailed> {
        self.end_lingers();
        let leases = Arc::clone(self);
        {
            let mut keys = self.keys();
            for name in &names {
                self.record(name, LeaseEvent::Requested);
                keys.entry(name.clone())
                    .or_insert_with(KeyLease::new)
                    .in_flight += 1;
            }
        }
        let attempt = self.runtime.spawn(async move {
            let started = Instant::now();
            let taken = match ask {
                Ask::Acquire => leases.store.acquire_all(&names).await,
                Ask::Try => leases.store.try_acquire_all(&names).await,
            };
            let fences = taken.as_ref().ok().cloned().flatten();
            let owned = leases.record_all_answer(&names, fences, started);
            match taken {
                Ok(Some(_)) if owned.is_none() => Err(AcquireFailed(
                    "the leases were taken, and given back: they ran out before their reply \
                     came, or the registry is shutting down"
                        .to_owned(),
                )),
                Ok(_) => Ok(owned),
                Err(error) => Err(AcquireFailed(error.to_string())),
            }
        });
        attempt
            .await
            .unwrap_or_else(|join_error| Err(AcquireFailed(join_error.to_string())))
    }

    /// Records the answer to an `acquire_all`: `fences` in `names`' order if it took every
    /// key. Given back at once, as for a part (see `record_part_answer`), if the leases were
    /// released for shutdown or ran out before the reply came. A fence above a whole lease
    /// this process still records for the key took its row over: that lease is lost. A
    /// fence at or below one recorded before is stale (invariant 6): a newer statement of
    /// ours took that row over, so the set holds none of it, and the rows it still holds go
    /// back.
    fn record_all_answer(
        self: &Arc<Self>,
        names: &[String],
        fences: Option<Vec<Fence>>,
        started: Instant,
    ) -> Option<Vec<OwnedLease>> {
        let mut keys = self.keys();
        let closed = self.closed.load(Ordering::Relaxed);
        let late = Instant::now() >= started + self.lease;
        let stale = fences.as_ref().is_some_and(|fences| {
            names.iter().zip(fences).any(|(name, &fence)| {
                keys.get(name)
                    .is_some_and(|entry| fence <= entry.highest_fence)
            })
        });
        let mut owned = Vec::with_capacity(names.len());
        let mut give_back = Vec::new();
        for (at, name) in names.iter().enumerate() {
            let entry = keys.entry(name.clone()).or_insert_with(KeyLease::new);
            entry.in_flight -= 1;
            let Some(fence) = fences.as_ref().and_then(|fences| fences.get(at).copied()) else {
                if entry.is_unused() {
                    keys.remove(name);
                }
                continue;
            };
            if fence <= entry.highest_fence {
                if entry.is_unused() {
                    keys.remove(name);
                }
                continue;
            }
            entry.highest_fence = fence;
            // Our own statement took the row over (ours counts as free): whatever lease of
            // ours it held before, the process's or another set's, is gone.
            if let Some(held) = entry.held.take_if(|held| held.fence < fence) {
                held.validity.send_modify(|validity| validity.lost = true);
            }
            lose_whole_leases_below(entry, fence);
            if closed || late || stale {
                give_back.push((name.clone(), fence));
            } else {
                owned.push(self.own(entry, name, fence, Kind::Whole, started));
            }
        }
        drop(keys);
        if let Some(fences) = &fences
            && give_back.is_empty()
            && !stale
        {
            for (name, fence) in names.iter().zip(fences) {
                self.record(name, LeaseEvent::Granted(*fence));
            }
            return Some(owned);
        }
        // Dropping the leases recorded gives them back.
        drop(owned);
        for (name, fence) in give_back {
            self.spawn_release(name, fence);
        }
        None
    }

    /// Records `fence` of `kind` on `name` (whose `entry` this is) as owned by one guard, from
    /// an acquisition that started at `started`: the guard's handle on it.
    fn own(
        self: &Arc<Self>,
        entry: &mut KeyLease,
        name: &str,
        fence: Fence,
        kind: Kind,
        started: Instant,
    ) -> OwnedLease {
        let (validity, receiver) = watch::channel(Validity {
            lost: false,
            until: started + self.lease,
        });
        entry.owned.push(Owned {
            fence,
            kind,
            validity,
        });
        OwnedLease {
            users: Arc::clone(self) as Arc<dyn LocalUsers>,
            name: name.to_owned(),
            fence,
            kind,
            validity: receiver,
        }
    }

    /// Releases the whole lease `fence` on `name` in a task of its own, so that no caller's
    /// cancellation can stop it halfway; a failure leaves the lease to run out. The task
    /// returns how long the statement took.
    fn spawn_release(
        self: &Arc<Self>,
        name: String,
        fence: Fence,
    ) -> tokio::task::JoinHandle<Duration> {
        self.spawn_release_of(name, fence, Kind::Whole)
    }

    /// Starts the linger of `name`'s idle leases, which nobody in the process wants any more
    /// (invariant 2): they go back [`IDLE_LINGER`] later, or before the process's next
    /// acquisition ([`end_lingers`](Self::end_lingers)). A local caller that comes back
    /// meanwhile finds them kept: one task taking a key again and again, or trying it, holds
    /// the lease across its calls, as the callers of a round do. A task that moves on to
    /// other keys sends each release with its next acquisition, in one batch, as it would
    /// without the linger.
    fn spawn_linger(self: &Arc<Self>, name: &str) {
        self.lingering().insert(name.to_owned());
        let leases = Arc::clone(self);
        let name = name.to_owned();
        self.runtime.spawn(async move {
            tokio::time::sleep(IDLE_LINGER).await;
            leases.give_back_unwanted(&name);
        });
    }

    /// Ends every linger under way, before an acquisition is sent: the leases that nobody
    /// wants go back now, so that a store that batches sends their releases with it.
    fn end_lingers(self: &Arc<Self>) {
        let names: Vec<String> = {
            let mut lingering = self.lingering();
            if lingering.is_empty() {
                return;
            }
            lingering.drain().collect()
        };
        for name in names {
            self.give_back_unwanted(&name);
        }
    }

    fn lingering(&self) -> MutexGuard<'_, HashSet<String>> {
        // Nothing panics while holding the lock.
        self.lingering
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Ends a linger of `name`'s leases: gives back the whole lease and the idle parts if
    /// nobody in the process wants the key now; if a caller came back, its withdrawal starts
    /// the next linger.
    fn give_back_unwanted(self: &Arc<Self>, name: &str) {
        let mut keys = self.keys();
        self.lingering().remove(name);
        let Some(entry) = keys.get_mut(name) else {
            return;
        };
        if entry.lingering.take().is_none() {
            return;
        }
        if entry.interest > 0 || self.keeps_unwanted() {
            return;
        }
        let mut give_back: Vec<(Fence, Kind)> = entry
            .held
            .take()
            .map(|held| (held.fence, Kind::Whole))
            .into_iter()
            .collect();
        give_back.extend(take_idle_parts(entry, None));
        if entry.is_unused() {
            keys.remove(name);
        }
        drop(keys);
        for (fence, kind) in give_back {
            self.spawn_release_of(name.to_owned(), fence, kind);
        }
    }

    /// Releases the lease `fence` of `kind` on `name`, as [`spawn_release`](Self::spawn_release).
    fn spawn_release_of(
        self: &Arc<Self>,
        name: String,
        fence: Fence,
        kind: Kind,
    ) -> tokio::task::JoinHandle<Duration> {
        let leases = Arc::clone(self);
        self.record(&name, LeaseEvent::Released(fence));
        self.keys()
            .entry(name.clone())
            .or_insert_with(KeyLease::new)
            .releasing += 1;
        self.runtime.spawn(async move {
            let started = Instant::now();
            let released = match kind {
                Kind::Whole => leases.store.release(&name, fence).await,
                Kind::Part => leases.store.release_part(&name, fence).await,
            };
            let round_trip = started.elapsed();
            {
                let mut keys = leases.keys();
                if let Some(entry) = keys.get_mut(&name) {
                    entry.releasing -= 1;
                    if entry.is_unused() {
                        keys.remove(&name);
                    }
                }
            }
            if let Err(error) = released {
                tracing::warn!(
                    target: "keyed_locks::cluster",
                    key = %name,
                    fence,
                    %error,
                    "could not release a lease; it will run out on its own"
                );
            }
            round_trip
        })
    }

    /// Gives back the whole lease of `name` that the process holds and no guard uses, before a
    /// local holder of part of the key asks for a part lease (invariant 8): the release's
    /// task, to await before asking, or `None` if there was none.
    pub(crate) fn give_back_whole(
        self: &Arc<Self>,
        name: &str,
    ) -> Option<tokio::task::JoinHandle<Duration>> {
        let mut keys = self.keys();
        let entry = keys.get_mut(name)?;
        // In use, it would be a local holder of the whole key beside this holder of a part,
        // which the local registry does not grant.
        debug_assert!(
            entry.held.as_ref().is_none_or(|held| !held.in_use),
            "invariant 3: a part granted locally beside the whole"
        );
        let held = entry.held.take()?;
        held.validity.send_modify(|validity| validity.lost = true);
        drop(keys);
        Some(self.spawn_release(name.to_owned(), held.fence))
    }

    /// One attempt at a part lease of `permits` of `name`, run in a task of its own: the
    /// lease if taken, kept by the process and in use by the returned [`PartUse`] (which puts
    /// it back when dropped, also if this caller has gone by then), `Ok(None)` if refused.
    pub(crate) async fn acquire_part(
        self: &Arc<Self>,
        name: &str,
        permits: NonZeroU32,
        ask: Ask,
    ) -> Result<Option<PartUse>, AcquireFailed> {
        self.end_lingers();
        let leases = Arc::clone(self);
        let owned_name = name.to_owned();
        self.record(name, LeaseEvent::Requested);
        self.keys()
            .entry(name.to_owned())
            .or_insert_with(KeyLease::new)
            .in_flight += 1;
        let attempt = self.runtime.spawn(async move {
            let started = Instant::now();
            let taken = match ask {
                Ask::Acquire => leases.store.acquire_part(&owned_name, permits).await,
                Ask::Try => leases.store.try_acquire_part(&owned_name, permits).await,
            };
            let fence = taken.as_ref().ok().copied().flatten();
            let part = leases.record_part_answer(&owned_name, permits, fence, started);
            match taken {
                Ok(Some(_)) if part.is_none() => Err(AcquireFailed(
                    "the part lease was taken, and given back: it ran out before its reply came, \
                     or the registry is shutting down"
                        .to_owned(),
                )),
                Ok(_) => Ok(part),
                Err(error) => Err(AcquireFailed(error.to_string())),
            }
        });
        attempt
            .await
            .unwrap_or_else(|join_error| Err(AcquireFailed(join_error.to_string())))
    }

    /// Records the answer to a part acquisition of `permits`: the part lease if it took one,
    /// kept by the process and in use by its first guard, unless the leases were released for
    /// shutdown while the statement ran (invariant 5), or it ran out by this process's clock
    /// before its reply came (a paused process; another process may hold the permits by now):
    /// then it is released at once. A lease taken after a refusal of ours is contended from
    /// its start: it goes back when its first guard drops.
    fn record_part_answer(
        self: &Arc<Self>,
        name: &str,
        permits: NonZeroU32,
        taken: Option<Fence>,
        started: Instant,
    ) -> Option<PartUse> {
        let mut keys = self.keys();
        let closed = self.closed.load(Ordering::Relaxed);
        let entry = keys.entry(name.to_owned()).or_insert_with(KeyLease::new);
        entry.in_flight -= 1;
        let Some(fence) = taken else {
            entry.refused = true;
            if entry.is_unused() {
                keys.remove(name);
            }
            return None;
        };
        entry.highest_fence = entry.highest_fence.max(fence);
        if closed || Instant::now() >= started + self.lease {
            drop(keys);
            self.spawn_release_of(name.to_owned(), fence, Kind::Part);
            return None;
        }
        let refused_before = std::mem::take(&mut entry.refused);
        let (validity, receiver) = watch::channel(Validity {
            lost: false,
            until: started + self.lease,
        });
        entry.parts.push(Held {
            fence,
            permits: Some(permits),
            uses: 1,
            in_use: true,
            round_from: 0,
            round_started: started,
            wanted: refused_before && !self.ignores_wanted_of(Kind::Part),
            check: Check::NotAsked,
            check_answered: Arc::new(Notify::new()),
            validity,
        });
        drop(keys);
        self.record(name, LeaseEvent::Granted(fence));
        Some(PartUse {
            users: Arc::clone(self) as Arc<dyn LocalUsers>,
            name: name.to_owned(),
            lease: Lease {
                fence,
                fencing_token: fencing_token(fence, 0),
                validity: receiver,
            },
        })
    }

    /// Whether a release of `name`'s lease by this process is on its way: until it lands the
    /// row is ours, and a try that took it over (ours counts as free) would keep the key from
    /// every other process for as long as this process keeps trying.
    pub(crate) fn is_being_released(&self, name: &str) -> bool {
        self.keys()
            .get(name)
            .is_some_and(|entry| entry.releasing > 0)
    }

    /// How long a lease lasts without renewal.
    pub(crate) fn lease(&self) -> Duration {
        self.lease
    }

    /// How long to wait for another process's lease before trying again without a notice:
    /// between half the lease and the whole of it, at random, so that waiters on one key do
    /// not retry in step.
    pub(crate) fn poll_interval(&self) -> Duration {
        let half = self.lease / 2;
        let draw = self
            .jitter
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .next_u64();
        let fraction = (draw % 1_000) as u32;
        half + half * fraction / 1_000
    }

    /// Renews every held lease; marks lost those the store says are gone, and those it could
    /// not confirm for a whole lease. The renewals run at once, so that a store that batches
    /// sends them together, and a process holding many leases renews them in a round trip or
    /// a few, not one per lease.
    async fn renew_all(self: &Arc<Self>) {
        let held: Vec<(String, Fence, Kind)> = self
            .keys()
            .iter()
            .flat_map(|(name, entry)| {
                let handed_off = entry.held.iter().chain(&entry.parts);
                let handed_off = handed_off.map(|held| (held.fence, held.kind()));
                let owned = entry.owned.iter().map(|owned| (owned.fence, owned.kind));
                handed_off
                    .chain(owned)
                    .map(|(fence, kind)| (name.clone(), fence, kind))
            })
            .collect();
        let mut renewals = tokio::task::JoinSet::new();
        for (name, fence, kind) in held {
            let leases = Arc::clone(self);
            renewals.spawn(async move {
                let started = Instant::now();
                let renewed = match kind {
                    Kind::Whole => leases.store.renew(&name, fence).await,
                    Kind::Part => leases.store.renew_part(&name, fence).await,
                };
                (name, fence, kind, started, renewed)
            });
        }
        while let Some(joined) = renewals.join_next().await {
            // A renewal task panics only on a bug in the store; its lease then runs out.
            let Ok((name, fence, _kind, started, renewed)) = joined else {
                continue;
            };
            match renewed {
                Ok(Renewal::Renewed { wanted }) => {
                    self.renewed(&name, fence, started);
                    if wanted {
                        self.learn_wanted(&name, fence);
                    }
                }
                Ok(Renewal::Lost) => self.lose(&name, fence, "the lease is no longer ours"),
                Err(error) => {
                    let expired = self
                        .validity_of(&mut self.keys(), &name, fence)
                        .is_some_and(|validity| validity.borrow().is_lost());
                    if expired {
                        self.lose(&name, fence, "the lease could not be renewed in time");
                    } else {
                        tracing::debug!(
                            target: "keyed_locks::cluster",
                            key = %name,
                            fence,
                            %error,
                            "renewal failed; trying again at the next heartbeat"
                        );
                    }
                }
            }
        }
    }

    /// Asks the store, in a task of its own, whether another process wants `name`, whose lease
    /// `held` is at (or near) the hand-off bound of its round: a renewal, whose reply says so.
    /// The answer is recorded whoever waits for it.
    fn spawn_check(self: &Arc<Self>, name: &str, held: &Held) {
        let leases = Arc::clone(self);
        let name = name.to_owned();
        let (fence, kind, round_from) = (held.fence, held.kind(), held.round_from);
        self.runtime.spawn(async move {
            let started = Instant::now();
            let renewal = match kind {
                Kind::Whole => leases.store.renew(&name, fence).await,
                Kind::Part => leases.store.renew_part(&name, fence).await,
            };
            leases.check_answered(&name, fence, round_from, started, renewal);
        });
    }

    /// Records the answer to [`spawn_check`](Self::spawn_check): the renewal extends the
    /// lease; `wanted`, or no answer, makes the lease go back at the bound; a lost lease is
    /// lost. Wakes the holder waiting for it.
    fn check_answered(
        self: &Arc<Self>,
        name: &str,
        fence: Fence,
        round_from: u32,
        started: Instant,
        renewal: Result<Renewal, LeaseError>,
    ) {
        let wanted = match renewal {
            Ok(Renewal::Renewed { wanted }) => {
                self.renewed(name, fence, started);
                wanted
            }
            Ok(Renewal::Lost) => {
                self.lose(name, fence, "the lease is no longer ours");
                return;
            }
            Err(error) => {
                tracing::debug!(
                    target: "keyed_locks::cluster",
                    key = %name,
                    fence,
                    %error,
                    "could not ask whether the key is wanted; giving the lease back at its bound"
                );
                true
            }
        };
        let mut keys = self.keys();
        let Some(held) = keys
            .get_mut(name)
            .and_then(|entry| handed_off_mut(entry, fence))
        else {
            return;
        };
        let wanted = wanted && !self.ignores_wanted_of(held.kind());
        held.wanted |= wanted;
        if held.round_from == round_from && held.check == Check::Asked && !wanted {
            held.check = Check::NotWanted;
        }
        held.check_answered.notify_waiters();
        drop(keys);
        if wanted {
            self.give_back_idle_part(name, fence);
        }
    }

    /// A renewal of the heartbeat said another process wants `name`: its lease `fence` goes
    /// back at the bound, and at once if no guard uses it. A whole lease too: a caller of this
    /// process that wants the key may be queued locally behind one that waits for another
    /// process (a `lock_all`), which may wait for this very key, and then no local holder
    /// comes to give it back at the bound.
    fn learn_wanted(self: &Arc<Self>, name: &str, fence: Fence) {
        let idle_whole = {
            let mut keys = self.keys();
            let Some(entry) = keys.get_mut(name) else {
                return;
            };
            if let Some(held) = handed_off_mut(entry, fence) {
                held.wanted |= !self.ignores_wanted_of(held.kind());
            }
            entry
                .held
                .take_if(|held| held.fence == fence && !held.in_use && held.must_go_back())
        };
        match idle_whole {
            Some(held) => {
                held.validity.send_modify(|validity| validity.lost = true);
                self.spawn_release_of(name.to_owned(), fence, Kind::Whole);
            }
            None => self.give_back_idle_part(name, fence),
        }
    }

    /// Gives back the part lease `fence` of `name` if the process keeps it idle and it must go
    /// back (see [`Held::must_go_back`]): no local holder may come for it soon, and another
    /// process may be waiting for its permits.
    fn give_back_idle_part(self: &Arc<Self>, name: &str, fence: Fence) {
        let part = {
            let mut keys = self.keys();
            let Some(entry) = keys.get_mut(name) else {
                return;
            };
            let Some(at) = entry
                .parts
                .iter()
                .position(|part| part.fence == fence && !part.in_use && part.must_go_back())
            else {
                return;
            };
            entry.parts.swap_remove(at)
        };
        part.validity.send_modify(|validity| validity.lost = true);
        self.spawn_release_of(name.to_owned(), fence, Kind::Part);
    }

    /// A renewal that started at `started` succeeded. One that comes back after the lease it
    /// renewed had run out locally changes nothing: the guard may have acted on "lost".
    fn renewed(&self, name: &str, fence: Fence, started: Instant) {
        if let Some(validity) = self.validity_of(&mut self.keys(), name, fence) {
            validity.send_if_modified(|validity| {
                let extends = !validity.is_lost();
                if extends {
                    validity.until = started + self.lease;
                }
                extends
            });
        }
    }

    /// The sender of the validity of our lease `fence` on `name`, if we hold it (a fence
    /// names one lease of a key, whatever its kind).
    fn validity_of<'a>(
        &self,
        keys: &'a mut KeyMap,
        name: &str,
        fence: Fence,
    ) -> Option<&'a watch::Sender<Validity>> {
        let entry = keys.get(name)?;
        let handed_off = entry.held.iter().chain(&entry.parts);
        handed_off
            .map(|held| (held.fence, &held.validity))
            .chain(
                entry
                    .owned
                    .iter()
                    .map(|owned| (owned.fence, &owned.validity)),
            )
            .find_map(|(of, validity)| (of == fence).then_some(validity))
    }

    /// The lease `fence` of `name` is lost: its guards learn it, and the next local holder
    /// acquires a new one.
    fn lose(&self, name: &str, fence: Fence, why: &str) {
        let mut keys = self.keys();
        let Some(entry) = keys.get_mut(name) else {
            return;
        };
        let token = if let Some(held) = entry.held.take_if(|held| held.fence == fence) {
            held.validity.send_modify(|validity| validity.lost = true);
            fencing_token(fence, held.uses.saturating_sub(1))
        } else if let Some(at) = entry.parts.iter().position(|part| part.fence == fence) {
            let part = entry.parts.swap_remove(at);
            part.validity.send_modify(|validity| validity.lost = true);
            fencing_token(fence, part.uses.saturating_sub(1))
        } else {
            let Some(at) = entry.owned.iter().position(|owned| owned.fence == fence) else {
                return;
            };
            let owned = entry.owned.swap_remove(at);
            owned.validity.send_modify(|validity| validity.lost = true);
            fencing_token(fence, 0)
        };
        if entry.is_unused() {
            keys.remove(name);
        }
        drop(keys);
        self.record(name, LeaseEvent::Lost(fence));
        tracing::warn!(
            target: "keyed_locks::cluster",
            key = %name,
            fencing_token = token,
            "lease lost: {why}; writes under this token must be refused by the resource"
        );
    }

    /// Wakes the waiters of a released key, or of every key when notices were missed.
    fn notice(&self, notice: LeaseNotice) {
        let keys = self.keys();
        match notice {
            LeaseNotice::Released(name) => {
                if let Some(entry) = keys.get(&name) {
                    entry.released.notify_waiters();
                }
            }
            LeaseNotice::Missed => keys
                .values()
                .for_each(|entry| entry.released.notify_waiters()),
        }
    }

    /// Releases every lease of this process (shutdown) and tells their guards they are lost.
    pub(crate) async fn release_everything(&self) {
        let held: Vec<(String, Fence)> = {
            let mut keys = self.keys();
            // Before the statement: a lease whose acquisition lands after it is not recorded
            // but given back (invariant 5), and every guard learns its lease is lost before
            // the table can give the key to another process (invariant 7).
            self.closed.store(true, Ordering::Relaxed);
            let mut held = Vec::new();
            for (name, entry) in keys.iter_mut() {
                if let Some(whole) = entry.held.take() {
                    whole.validity.send_modify(|validity| validity.lost = true);
                    held.push((name.clone(), whole.fence));
                }
                for part in entry.parts.drain(..) {
                    part.validity.send_modify(|validity| validity.lost = true);
                    held.push((name.clone(), part.fence));
                }
                for owned in entry.owned.drain(..) {
                    owned.validity.send_modify(|validity| validity.lost = true);
                    held.push((name.clone(), owned.fence));
                }
            }
            keys.retain(|_, entry| !entry.is_unused());
            held
        };
        for (name, fence) in &held {
            self.record(name, LeaseEvent::Released(*fence));
        }
        if let Err(error) = self.store.release_all().await {
            tracing::warn!(
                target: "keyed_locks::cluster",
                %error,
                "could not release the leases at shutdown; they will run out on their own"
            );
        }
    }

    /// Local keys with an entry, and leases held, whole and part (for stats).
    pub(crate) fn counts(&self) -> (usize, usize) {
        let keys = self.keys();
        let held = keys
            .values()
            .map(|entry| usize::from(entry.held.is_some()) + entry.parts.len() + entry.owned.len())
            .sum();
        (keys.len(), held)
    }
}

/// What a local caller's [`Interest`] and its guard need of the leases, whatever their store:
/// so that the guard does not name the store.
pub(crate) trait LocalUsers: Send + Sync {
    /// The guard holding `fence` on `name` let it go; the lease stays for the next local
    /// holder, or goes back when the guard's interest is withdrawn (invariant 2).
    fn put_back(&self, name: &str, fence: Fence);

    /// The [`PartUse`] of the part lease `fence` on `name` was dropped: the part stays for the
    /// next local request of its size, or goes back if it must, or if nobody in the process
    /// wants the key any more (invariant 8).
    fn put_back_part(self: Arc<Self>, name: &str, fence: Fence);

    /// A local caller of `name` is done (its guard or its `lock` future dropped).
    fn withdraw(self: Arc<Self>, name: &str);

    /// The [`OwnedLease`] of `fence` (of `kind`) on `name` was dropped: the lease goes back
    /// (invariant 8).
    fn give_back_owned(self: Arc<Self>, name: &str, fence: Fence, kind: Kind);
}

impl<S: LeaseStore> LocalUsers for Leases<S> {
    fn put_back(&self, name: &str, fence: Fence) {
        if let Some(held) = self
            .keys()
            .get_mut(name)
            .and_then(|entry| entry.held.as_mut())
            .filter(|held| held.fence == fence)
        {
            held.in_use = false;
        }
    }

    fn put_back_part(self: Arc<Self>, name: &str, fence: Fence) {
        let mut keys = self.keys();
        let Some(entry) = keys.get_mut(name) else {
            return;
        };
        let Some(at) = entry.parts.iter().position(|part| part.fence == fence) else {
            return;
        };
        entry.parts[at].in_use = false;
        if !entry.parts[at].must_go_back() {
            // Nobody in the process wants the key (a part whose acquisition's caller went
            // away): it lingers, as in `withdraw`.
            let linger = entry.interest == 0 && entry.start_linger();
            drop(keys);
            if linger {
                self.spawn_linger(name);
            }
            return;
        }
        let part = entry.parts.swap_remove(at);
        drop(keys);
        part.validity.send_modify(|validity| validity.lost = true);
        self.spawn_release_of(name.to_owned(), fence, Kind::Part);
    }

    fn withdraw(self: Arc<Self>, name: &str) {
        let mut keys = self.keys();
        let Some(entry) = keys.get_mut(name) else {
            debug_assert!(false, "invariant 1: interest in a key without an entry");
            return;
        };
        entry.interest -= 1;
        if entry.interest > 0 {
            return;
        }
        // Known wanted or lost: no reason to linger.
        let gone = entry.held.take_if(|held| held.must_go_back());
        let linger = entry.keeps_idle_leases() && entry.start_linger();
        if entry.is_unused() {
            keys.remove(name);
        }
        drop(keys);
        if let Some(held) = gone {
            self.spawn_release_of(name.to_owned(), held.fence, Kind::Whole);
        }
        if linger {
            self.spawn_linger(name);
        }
    }

    fn give_back_owned(self: Arc<Self>, name: &str, fence: Fence, kind: Kind) {
        let mut keys = self.keys();
        let owned = keys.get_mut(name).and_then(|entry| {
            let at = entry.owned.iter().position(|owned| owned.fence == fence)?;
            Some(entry.owned.swap_remove(at))
        });
        drop(keys);
        // Lost before the release is sent (invariant 7); a lease already lost (not renewed,
        // or released at shutdown) is released all the same: it may still be in the table.
        if let Some(owned) = owned {
            owned.validity.send_modify(|validity| validity.lost = true);
        }
        if !self.closed.load(Ordering::Relaxed) {
            self.spawn_release_of(name.to_owned(), fence, kind);
        }
    }
}

/// The lease `fence` of `entry`'s key that the process hands off: the whole lease or a part.
fn handed_off_mut(entry: &mut KeyLease, fence: Fence) -> Option<&mut Held> {
    entry
        .held
        .iter_mut()
        .chain(&mut entry.parts)
        .find(|held| held.fence == fence)
}

/// Takes out of `entry` the part leases no guard uses, but for those of `keep` permits, each
/// marked lost: to be released.
fn take_idle_parts(entry: &mut KeyLease, keep: Option<NonZeroU32>) -> Vec<(Fence, Kind)> {
    let mut idle = Vec::new();
    entry.parts.retain(|part| {
        let goes = !part.in_use && (keep.is_none() || part.permits != keep);
        if goes {
            part.validity.send_modify(|validity| validity.lost = true);
            idle.push((part.fence, Kind::Part));
        }
        !goes
    });
    idle
}

/// Marks lost every `lock_all` lease of `entry`'s key below `fence`: a statement of ours took
/// the row over under `fence` (ours counts as free), so those leases are gone.
fn lose_whole_leases_below(entry: &KeyLease, fence: Fence) {
    for owned in &entry.owned {
        if matches!(owned.kind, Kind::Whole) && owned.fence < fence {
            owned.validity.send_modify(|validity| validity.lost = true);
        }
    }
}

/// A key's whole lease held for one `lock_all` guard; dropping it gives the lease back
/// (invariant 8).
pub(crate) struct OwnedLease {
    users: Arc<dyn LocalUsers>,
    name: String,
    pub(crate) fence: Fence,
    kind: Kind,
    pub(crate) validity: watch::Receiver<Validity>,
}

impl OwnedLease {
    /// The fencing token of its guard: the first and only use of its fence.
    pub(crate) fn fencing_token(&self) -> u64 {
        fencing_token(self.fence, 0)
    }
}

impl Drop for OwnedLease {
    fn drop(&mut self) {
        Arc::clone(&self.users).give_back_owned(&self.name, self.fence, self.kind);
    }
}

/// A part lease the process keeps, in use by one local guard; dropping it puts the part back
/// (invariant 8).
pub(crate) struct PartUse {
    users: Arc<dyn LocalUsers>,
    name: String,
    pub(crate) lease: Lease,
}

impl Drop for PartUse {
    fn drop(&mut self) {
        Arc::clone(&self.users).put_back_part(&self.name, self.lease.fence);
    }
}

/// A local caller's interest in a key (invariant 2), withdrawn on drop.
pub(crate) struct Interest {
    leases: Arc<dyn LocalUsers>,
    name: String,
    released: Arc<Notify>,
}

impl Interest {
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Woken when the key's lease is announced released.
    pub(crate) fn released(&self) -> &Notify {
        &self.released
    }

    /// The guard holding `fence` let it go (see [`LocalUsers::put_back`]).
    pub(crate) fn put_back(&self, fence: Fence) {
        self.leases.put_back(&self.name, fence);
    }
}

impl Drop for Interest {
    fn drop(&mut self) {
        Arc::clone(&self.leases).withdraw(&self.name);
    }
}

/// Which kind of lease a statement acts on.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kind {
    Whole,
    Part,
}

/// Which statement an acquisition attempt sends.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Ask {
    /// `acquire`: refused only while another process holds the key, and then it is wanted.
    Acquire,
    /// `try_acquire`: refused too while another process waits, and it changes nothing then.
    Try,
}

/// An acquisition statement failed (the database is unreachable, say); the caller retries.
#[derive(Debug)]
pub(crate) struct AcquireFailed(pub(crate) String);

/// Runs the heartbeat and the notice dispatch until the leases are gone.
pub(crate) fn spawn_background<S: LeaseStore>(
    leases: &Arc<Leases<S>>,
    mut notices: LeaseNotices,
    heartbeat: Duration,
) {
    let weak: Weak<Leases<S>> = Arc::downgrade(leases);
    let renewals = tokio::spawn(async move {
        let mut ticks = tokio::time::interval(heartbeat);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let Some(leases) = weak.upgrade() else {
                return;
            };
            leases.renew_all().await;
        }
    });
    let weak: Weak<Leases<S>> = Arc::downgrade(leases);
    let dispatch = tokio::spawn(async move {
        while let Some(notice) = notices.recv().await {
            let Some(leases) = weak.upgrade() else {
                return;
            };
            leases.notice(notice);
        }
    });
    leases
        .background
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .extend([renewals.abort_handle(), dispatch.abort_handle()]);
}
