//! What the simulator checks, at every grant, write and lock call, and the resource the
//! workers write to.
//!
//! - **Fenced writes**: the resource accepts a write only with a token above every token it
//!   accepted before for the key, as a user's store must (`UPDATE ... WHERE fence < $token`).
//!   Checked apart from the resource's own check: no accepted token is at or below one
//!   accepted before.
//! - **Capacity**: when a holder that believes its lease live writes, the guards of the key
//!   that believe their leases live, in every process, hold at most the key's permits
//!   together; a holder of the whole key holds them all, so with it no other guard believes
//!   its lease live.
//! - **Tokens increase across the cluster**: each grant's token is new for the key, and above
//!   every token of a whole-key grant before it; a whole-key grant's token is above every
//!   token granted for the key before, by any process. (Holders of parts of a key hold it
//!   together, and their grants may reach them in another order than the table made them.)
//! - **The hand-off bound**: once another process's request for a key is refused while a
//!   process holds its whole lease (the store marks the key wanted), that lease serves fewer
//!   than `2 x (max_local_handoffs + 1)` more guards, none later than `2 x max_local_hold`
//!   (and one statement's way, [`TRY_BOUND`]) after the refusal. A lease nobody else wants is
//!   not bounded: the process keeps it for its own callers. (Two rounds of the bound: the
//!   renewal that asks whether the key is wanted is sent at the start of each round, and may
//!   have run just before the refusal.) The same bound holds for each part lease a process
//!   keeps for its readers, from the moment a request of another process is refused and
//!   while its waiting mark lives (a mark that lapsed is a waiter that went away; one that a
//!   grant as large cleared is renewed by the waiter's next refusal).
//! - **Every call ends**: a `lock` call without a caller's timeout ends (granted or `Closed`)
//!   within [`CALL_BOUND`].
//! - **A try does not wait**: a `try_lock` ends within [`TRY_BOUND`] of its process's running
//!   time (its process's pauses and the clock's jumps left out): one statement's way, never
//!   a wait for another process's release. That it never
//!   takes a key from a waiter is checked on each reply of the store, in `store`.
//! - **No lease kept for nobody**: a lease that no worker of its live process wants is in a
//!   linger that started less than `LINGER_BOUND` ago (checked every 100 ms, in `world`).
//! - The store's replies and the idle state are checked in `store` and `world`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::log::EventLog;
use super::plan::MAX_HOLD;
use crate::cluster::locking::lease_store::Fence;
use crate::cluster::locking::leases::HANDOFF_BITS;
use crate::cluster::{ClusterGuard, ClusterMultiGuard};

/// The longest a `lock` call without a timeout of its caller may take. Faults stop a process
/// for up to two leases and a holder keeps a key past its lease, so a call can wait behind
/// several of them; this is several times the longest wait seen in any run (the simulator's
/// tests print it), and far below a wedged key, which never ends.
pub(super) const CALL_BOUND: Duration = Duration::from_secs(60);

/// The longest a `try_lock` may take while its process runs and the clock does not jump: one
/// statement, slow both ways (2 x 400 ms) or timed out (a heartbeat), with room to spare. A
/// holder keeps a key up to two leases and several wait in line on a hot key, so a try that
/// waited for releases shows past it.
pub(super) const TRY_BOUND: Duration = Duration::from_secs(2);

/// A guard as the checker asks it: whether its lease is lost.
pub(super) trait Held: Send + Sync {
    fn is_lost(&self) -> bool;
}

impl Held for ClusterGuard<String> {
    fn is_lost(&self) -> bool {
        ClusterGuard::is_lost(self)
    }
}

impl Held for ClusterMultiGuard<String> {
    fn is_lost(&self) -> bool {
        ClusterMultiGuard::is_lost(self)
    }
}

/// A holder of a key, as the checker sees it.
struct Holder {
    who: String,
    token: u64,
    /// The key's permits it holds: all of them for a whole-key guard.
    permits: u32,
    guard: Arc<dyn Held>,
}

/// A `lock` call under way.
struct Call {
    who: String,
    key: String,
    started: Instant,
    /// Whether its caller bounds it (a timeout, a drop, an abort); those need not end on their
    /// own.
    bounded_by_caller: bool,
}

#[derive(Default)]
struct State {
    failure: Option<String>,
    /// The highest token granted per key, by any process, and of a whole-key grant.
    granted: BTreeMap<String, u64>,
    granted_whole: BTreeMap<String, u64>,
    /// Every token granted per key, none twice.
    tokens: BTreeMap<String, std::collections::BTreeSet<u64>>,
    /// The highest hand-off count (a token's low bits) granted under each lease.
    highest_use: BTreeMap<(String, Fence), u64>,
    /// Each lease that another process was refused: the hand-off count it had reached, when,
    /// and for a part lease until when the refusal's waiting mark lives.
    wanted_since: BTreeMap<(String, Fence), Wanted>,
    holders: BTreeMap<String, Vec<Holder>>,
    /// The resource's record: the highest token it accepted per key.
    resource: BTreeMap<String, u64>,
    /// The checker's own record of the tokens the resource accepted, apart from the resource.
    accepted: BTreeMap<String, u64>,
    calls: BTreeMap<u64, Call>,
    calls_made: u64,
    longest_call: Duration,
    /// The clock's jumps so far: from when to when the clock leapt.
    jumps: Vec<(Instant, Instant)>,
    stats: Stats,
}

/// A lease another process was refused while it lived.
#[derive(Debug, Clone, Copy)]
struct Wanted {
    /// The hand-off count it had reached then.
    from_use: u64,
    since: Instant,
    /// For a part lease, when the waiting mark lapses (unless a later refusal renews it);
    /// `None` for a whole lease, whose `wanted` mark lasts while it is held.
    until: Option<Instant>,
}

/// What happened in a run, for its report.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Stats {
    pub(crate) grants: u64,
    pub(crate) writes_accepted: u64,
    pub(crate) writes_refused: u64,
    pub(crate) calls_given_up: u64,
    pub(crate) calls_closed: u64,
    pub(crate) faults: u64,
}

/// The checks of one run.
pub(super) struct Checker {
    log: Arc<EventLog>,
    resource_checks_fence: bool,
    max_uses: u32,
    /// Permits per key.
    capacity: u32,
    state: Mutex<State>,
}

impl Checker {
    pub(super) fn new(
        log: Arc<EventLog>,
        resource_checks_fence: bool,
        max_uses: u32,
        capacity: u32,
    ) -> Self {
        Checker {
            log,
            resource_checks_fence,
            max_uses,
            capacity,
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records a broken promise; the run's first is its failure.
    pub(super) fn fail(&self, what: String) {
        self.log.event("CHECK", format_args!("FAILED: {what}"));
        let mut state = self.state();
        state.failure.get_or_insert(what);
    }

    pub(super) fn failure(&self) -> Option<String> {
        self.state().failure.clone()
    }

    pub(super) fn stats(&self) -> Stats {
        self.state().stats
    }

    pub(super) fn longest_call(&self) -> Duration {
        self.state().longest_call
    }

    pub(super) fn count_fault(&self) {
        self.count_faults(1);
    }

    pub(super) fn count_faults(&self, faults: u64) {
        self.state().stats.faults += faults;
    }

    /// Another process's request for `key` was refused while the lease `fence` lived: the
    /// store marked the key wanted, or for a part lease waited for until `mark_until`. The
    /// first report per lease starts its bound; for a part, so does the first after a mark
    /// lapsed.
    pub(super) fn wanted_while_held(&self, key: &str, fence: Fence, mark_until: Option<Instant>) {
        let now = Instant::now();
        let mut state = self.state();
        let lease = (key.to_owned(), fence);
        let from_use = state
            .highest_use
            .get(&lease)
            .map_or(0, |highest| highest + 1);
        let fresh = Wanted {
            from_use,
            since: now,
            until: mark_until,
        };
        let wanted = state.wanted_since.entry(lease).or_insert(fresh);
        match (wanted.until, mark_until) {
            (Some(lapsed), Some(_)) if lapsed <= now => *wanted = fresh,
            (Some(until), Some(renewed)) => wanted.until = Some(until.max(renewed)),
            _ => {}
        }
    }

    /// No waiting mark of `key` lives now (it lapsed, or a grant as large cleared it): the
    /// bounds of its part leases end here, until a refusal marks the key again.
    pub(super) fn mark_gone(&self, key: &str) {
        let now = Instant::now();
        let mut state = self.state();
        for ((of, _fence), wanted) in state.wanted_since.iter_mut() {
            if of == key
                && let Some(until) = &mut wanted.until
            {
                *until = (*until).min(now);
            }
        }
    }

    /// A `lock` call starts; returns its number for [`call_ended`](Self::call_ended).
    pub(super) fn call_started(&self, who: &str, key: &str, bounded_by_caller: bool) -> u64 {
        let mut state = self.state();
        state.calls_made += 1;
        let id = state.calls_made;
        state.calls.insert(
            id,
            Call {
                who: who.to_owned(),
                key: key.to_owned(),
                started: Instant::now(),
                bounded_by_caller,
            },
        );
        id
    }

    /// A `lock` call ended: granted, `Closed`, or given up by its caller.
    pub(super) fn call_ended(&self, id: u64, outcome: CallOutcome) {
        let mut state = self.state();
        if let Some(call) = state.calls.remove(&id) {
            let took = call.started.elapsed();
            if !call.bounded_by_caller {
                state.longest_call = state.longest_call.max(took);
            }
        }
        match outcome {
            CallOutcome::Granted => state.stats.grants += 1,
            CallOutcome::GaveUp => state.stats.calls_given_up += 1,
            CallOutcome::Closed => state.stats.calls_closed += 1,
        }
    }

    /// Fails if a call without a caller's bound has run past [`CALL_BOUND`].
    pub(super) fn check_calls(&self) {
        let late = self
            .state()
            .calls
            .values()
            .find(|call| !call.bounded_by_caller && call.started.elapsed() > CALL_BOUND)
            .map(|call| {
                format!(
                    "{}'s lock of {:?} has not ended after {CALL_BOUND:?}",
                    call.who, call.key
                )
            });
        if let Some(late) = late {
            self.fail(late);
        }
    }

    /// The whole world's clock jumps by `by`, now.
    pub(super) fn clock_jumps(&self, by: Duration) {
        let now = Instant::now();
        self.state().jumps.push((now, now + by));
    }

    /// `who`'s `try_lock` of `key` ran from `started` until now, `paused` of which its process
    /// was paused. The clock's jumps in between are left out too: no code ran through them.
    pub(super) fn tried(&self, who: &str, key: &str, started: Instant, paused: Duration) {
        let now = Instant::now();
        let jumped: Duration = self
            .state()
            .jumps
            .iter()
            .map(|&(from, to)| to.min(now).saturating_duration_since(from.max(started)))
            .sum();
        let took = (now - started).saturating_sub(paused + jumped);
        if took > TRY_BOUND {
            self.fail(format!(
                "{who}'s try_lock of {key:?} took {took:?} of running time, past {TRY_BOUND:?}: it waited"
            ));
        }
    }

    /// The calls under way (none, once every worker is done).
    pub(super) fn calls_under_way(&self) -> usize {
        self.state().calls.len()
    }

    /// `who` was granted `permits` of `key` with `guard`, just now.
    pub(super) fn granted(
        &self,
        who: &str,
        key: &str,
        guard: &Arc<ClusterGuard<String>>,
        permits: u32,
    ) {
        let token = guard.fencing_token();
        let held: Arc<dyn Held> = Arc::clone(guard) as _;
        self.granted_under(who, key, token, permits, held);
    }

    /// `who` was granted every key of `guard` (the whole of each), just now.
    pub(super) fn granted_all(&self, who: &str, guard: &Arc<ClusterMultiGuard<String>>) {
        let mut keys: Vec<&String> = guard.keys().collect();
        keys.sort();
        keys.dedup();
        for key in keys {
            let token = guard.fencing_token(key).unwrap_or(0);
            let held: Arc<dyn Held> = Arc::clone(guard) as _;
            self.granted_under(who, key, token, self.capacity, held);
        }
    }

    /// `who` was granted `permits` of `key` under `token`, held by `guard`, just now.
    fn granted_under(&self, who: &str, key: &str, token: u64, permits: u32, guard: Arc<dyn Held>) {
        let now = Instant::now();
        let fence = token >> HANDOFF_BITS;
        let uses = token & ((1 << HANDOFF_BITS) - 1);
        let whole = permits == self.capacity;
        let mut failures = Vec::new();
        {
            let mut state = self.state();
            let before = state.granted.get(key).copied().unwrap_or(0);
            let before_whole = state.granted_whole.get(key).copied().unwrap_or(0);
            let floor = if whole { before } else { before_whole };
            if token <= floor {
                let of = if whole { "" } else { " for the whole key" };
                failures.push(format!(
                    "{who} was granted {key:?} under token {token}, not above {floor} granted{of} before"
                ));
            }
            if !state
                .tokens
                .entry(key.to_owned())
                .or_default()
                .insert(token)
            {
                failures.push(format!(
                    "{who} was granted {key:?} under token {token}, granted before"
                ));
            }
            state.granted.insert(key.to_owned(), before.max(token));
            if whole {
                state
                    .granted_whole
                    .insert(key.to_owned(), before_whole.max(token));
            }
            let lease = (key.to_owned(), fence);
            let still_wanted = state
                .wanted_since
                .get(&lease)
                .filter(|wanted| wanted.until.is_none_or(|until| now < until))
                .copied();
            if let Some(Wanted {
                from_use, since, ..
            }) = still_wanted
            {
                let bound = from_use + 2 * u64::from(self.max_uses);
                if uses >= bound {
                    failures.push(format!(
                        "{who} was granted {key:?} as guard {} of lease {fence}, wanted by another process since guard {from_use}: past the bound of {bound}",
                        uses + 1,
                    ));
                }
                if now - since >= 2 * MAX_HOLD + TRY_BOUND {
                    failures.push(format!(
                        "{who} was granted {key:?} under lease {fence} {:?} after another process was refused it: past twice the hold bound of {MAX_HOLD:?}",
                        now - since
                    ));
                }
            }
            let highest = state.highest_use.entry(lease).or_insert(uses);
            *highest = (*highest).max(uses);
            state
                .holders
                .entry(key.to_owned())
                .or_default()
                .push(Holder {
                    who: who.to_owned(),
                    token,
                    permits,
                    guard,
                });
        }
        self.log
            .event(who, format_args!("granted {key} token {fence}.{uses}"));
        failures.into_iter().for_each(|failure| self.fail(failure));
    }

    /// `who` writes to `key` under `token`, holding `permits` of it; `believes_live` is what
    /// the guard said just before. Returns whether the resource accepted the write.
    pub(super) fn write(
        &self,
        who: &str,
        key: &str,
        token: u64,
        permits: u32,
        believes_live: bool,
    ) -> bool {
        let mut failures = Vec::new();
        let accepted;
        {
            let mut state = self.state();
            if believes_live {
                let live: Vec<&Holder> = state
                    .holders
                    .get(key)
                    .into_iter()
                    .flatten()
                    .filter(|other| other.who != who && !other.guard.is_lost())
                    .collect();
                let held: u32 = live.iter().map(|other| other.permits).sum();
                if held + permits > self.capacity {
                    let others: Vec<String> = live
                        .iter()
                        .map(|other| {
                            format!(
                                "{} ({} permits, token {})",
                                other.who, other.permits, other.token
                            )
                        })
                        .collect();
                    failures.push(format!(
                        "{who} (token {token}, {permits} permits) writes to {key:?} believing its lease live, while {} believe theirs live: over the capacity of {}",
                        others.join(", "),
                        self.capacity
                    ));
                }
            }
            // The resource: a fenced store refuses a token at or below the highest it saw.
            let highest = state.resource.get(key).copied().unwrap_or(0);
            accepted = !self.resource_checks_fence || token > highest;
            if accepted {
                state.resource.insert(key.to_owned(), token);
                let before = state.accepted.insert(key.to_owned(), token).unwrap_or(0);
                if token <= before {
                    failures.push(format!(
                        "the resource accepted {who}'s write to {key:?} under token {token}, not above {before} accepted before"
                    ));
                }
                state.stats.writes_accepted += 1;
            } else {
                state.stats.writes_refused += 1;
            }
        }
        let outcome = if accepted { "accepted" } else { "refused" };
        let belief = if believes_live { "live" } else { "lost" };
        self.log.event(
            who,
            format_args!("writes {key} token {token} believing it {belief}: {outcome}"),
        );
        failures.into_iter().for_each(|failure| self.fail(failure));
        accepted
    }

    /// The process named `process` was killed: its calls and guards went with it.
    pub(super) fn killed(&self, process: &str) {
        let of_process = |who: &str| who.split('.').next() == Some(process);
        let mut state = self.state();
        state.calls.retain(|_, call| !of_process(&call.who));
        for holders in state.holders.values_mut() {
            holders.retain(|holder| !of_process(&holder.who));
        }
    }

    /// `who` dropped its guard of `key`.
    pub(super) fn released(&self, who: &str, key: &str) {
        if let Some(holders) = self.state().holders.get_mut(key) {
            holders.retain(|holder| holder.who != who);
        }
        self.log.event(who, format_args!("drops {key}"));
    }
}

/// How a `lock` call ended.
#[derive(Debug, Clone, Copy)]
pub(super) enum CallOutcome {
    Granted,
    GaveUp,
    Closed,
}
