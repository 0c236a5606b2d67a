//! A simulated process's connection to the shared in-memory table: what PostgreSQL and the
//! network do to its statements and notices, drawn from the seed, and each statement's reply
//! checked against the table's rules (the `memory_store` invariants).
//!
//! A statement, in order:
//! 1. waits while the process is paused (a stopped process sends nothing), and never returns
//!    once it is killed;
//! 2. fails unsent with [`LeaseError::Reconnecting`] while the connection is down;
//! 3. may fail by timing out after the heartbeat, unsent or applied (its reply lost);
//! 4. otherwise reaches the table after a latency (usually a few milliseconds, sometimes
//!    hundreds), is applied there in one step, and its reply comes back after another;
//! 5. a reply that comes back while the process is paused is read when it resumes.

use std::future::Future;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::{Instant, sleep, sleep_until};

use super::checks::Checker;
use super::log::EventLog;
use super::plan::{HEARTBEAT, LEASE, ProcessClock};
use super::rng::Rng;
use crate::cluster::error::LeaseError;
use crate::cluster::locking::lease_store::{Fence, LeaseNotice, LeaseStore, Renewal};
use crate::cluster::locking::notices::{self, LeaseNotices};
use crate::cluster::testing::memory_store::{MemoryLeaseStore, MemoryLeaseTable, Row};

/// In thousandths: how often a statement times out before reaching the table, or after.
const TIMEOUT_UNSENT: u64 = 15;
const TIMEOUT_APPLIED: u64 = 15;
/// In thousandths: how often a statement is slow (a lock wait, a checkpoint).
const SLOW: u64 = 20;
/// In thousandths: how often a release notice is lost on its way to one process.
const NOTICE_LOST: u64 = 30;

/// One process's lease store in the simulation.
pub(super) struct SimStore {
    inner: MemoryLeaseStore,
    table: MemoryLeaseTable,
    process: Arc<ProcessClock>,
    rng: Mutex<Rng>,
    checker: Arc<Checker>,
    log: Arc<EventLog>,
}

/// One statement, for the log and the reply check.
#[derive(Clone, Copy)]
enum Statement<'a> {
    Acquire(&'a str),
    TryAcquire(&'a str),
    AcquirePart(&'a str, u32),
    TryAcquirePart(&'a str, u32),
    Renew(&'a str, Fence),
    RenewPart(&'a str, Fence),
    Release(&'a str, Fence),
    ReleasePart(&'a str, Fence),
    AcquireAll(&'a [String]),
    TryAcquireAll(&'a [String]),
    ReleaseAll,
}

impl Statement<'_> {
    /// The key whose row the statement reads and writes; none for `release all`.
    fn key(&self) -> Option<&str> {
        match *self {
            Statement::Acquire(key)
            | Statement::TryAcquire(key)
            | Statement::AcquirePart(key, _)
            | Statement::TryAcquirePart(key, _)
            | Statement::Renew(key, _)
            | Statement::RenewPart(key, _)
            | Statement::Release(key, _)
            | Statement::ReleasePart(key, _) => Some(key),
            Statement::AcquireAll(_) | Statement::TryAcquireAll(_) | Statement::ReleaseAll => None,
        }
    }
}

/// A boolean reply against what the rules say it must be, given the row before.
fn expect(reply: bool, rule: bool, rule_says: &str) -> Result<(), String> {
    if reply == rule {
        Ok(())
    } else {
        Err(format!("{rule_says}: {rule}"))
    }
}

impl std::fmt::Display for Statement<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Statement::Acquire(key) => write!(f, "acquire {key}"),
            Statement::TryAcquire(key) => write!(f, "try acquire {key}"),
            Statement::AcquirePart(key, permits) => write!(f, "acquire {permits} of {key}"),
            Statement::TryAcquirePart(key, permits) => {
                write!(f, "try acquire {permits} of {key}")
            }
            Statement::Renew(key, fence) => write!(f, "renew {key} fence {fence}"),
            Statement::RenewPart(key, fence) => write!(f, "renew part {key} fence {fence}"),
            Statement::Release(key, fence) => write!(f, "release {key} fence {fence}"),
            Statement::ReleasePart(key, fence) => write!(f, "release part {key} fence {fence}"),
            Statement::AcquireAll(keys) => write!(f, "acquire all {}", keys.join(" ")),
            Statement::TryAcquireAll(keys) => write!(f, "try acquire all {}", keys.join(" ")),
            Statement::ReleaseAll => f.write_str("release all"),
        }
    }
}

impl SimStore {
    pub(super) fn new(
        inner: MemoryLeaseStore,
        table: MemoryLeaseTable,
        process: Arc<ProcessClock>,
        rng: Rng,
        checker: Arc<Checker>,
        log: Arc<EventLog>,
    ) -> Self {
        SimStore {
            inner,
            table,
            process,
            rng: Mutex::new(rng),
            checker,
            log,
        }
    }

    fn draw<T>(&self, choose: impl FnOnce(&mut Rng) -> T) -> T {
        choose(&mut self.rng.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn latency(&self) -> Duration {
        self.draw(|rng| {
            if rng.chance(SLOW) {
                rng.between(Duration::from_millis(20), Duration::from_millis(400))
            } else {
                rng.between(Duration::ZERO, Duration::from_millis(3))
            }
        })
    }

    fn event(&self, what: std::fmt::Arguments<'_>) {
        self.log.event(&self.process.name, what);
    }

    /// Waits out a pause under way; never returns once the process is dead.
    async fn while_stopped(&self) {
        loop {
            if self.process.is_dead(Instant::now()) {
                std::future::pending::<()>().await;
            }
            match self.process.paused_until(Instant::now()) {
                Some(resume) => sleep_until(resume).await,
                None => return,
            }
        }
    }

    /// Runs `statement` through the simulated connection; `apply` is its step on the table,
    /// and `check` says whether its reply keeps the table's rules, given the rows before.
    async fn run<T: std::fmt::Debug, F: Future<Output = Result<T, LeaseError>>>(
        &self,
        statement: Statement<'_>,
        apply: impl FnOnce() -> F,
        check: impl FnOnce(&T, Option<&Row>, Instant) -> Result<(), String>,
    ) -> Result<T, LeaseError> {
        self.while_stopped().await;
        if let Some(back) = self.process.down_until(Instant::now()) {
            self.event(format_args!("{statement}: connection down"));
            return Err(LeaseError::Reconnecting {
                retry_in: back - Instant::now(),
            });
        }
        let (unsent, applied_unanswered) =
            self.draw(|rng| (rng.chance(TIMEOUT_UNSENT), rng.chance(TIMEOUT_APPLIED)));
        if unsent {
            self.checker.count_fault();
            sleep(HEARTBEAT).await;
            self.event(format_args!("{statement}: timed out, not applied"));
            return Err(LeaseError::Timeout { after: HEARTBEAT });
        }
        sleep(self.latency()).await;
        if self.process.is_dead(Instant::now()) {
            std::future::pending::<()>().await;
        }
        let before = statement.key().and_then(|key| self.table.row(key));
        let now = Instant::now();
        // The memory store's calls complete at once: the statement is one step of the table.
        let reply = apply().await;
        self.event(format_args!("{statement} -> {reply:?}"));
        self.report_wanted_holders(&statement, now);
        if let Ok(value) = &reply
            && let Err(broken) = check(value, before.as_ref(), now)
        {
            self.checker.fail(format!(
                "the store broke its rules: {} {statement} -> {value:?}: {broken}",
                self.process.name
            ));
        }
        if applied_unanswered {
            self.checker.count_fault();
            sleep(HEARTBEAT).await;
            self.event(format_args!("{statement}: applied, reply lost (timed out)"));
            return Err(LeaseError::Timeout { after: HEARTBEAT });
        }
        sleep(self.latency()).await;
        self.while_stopped().await;
        reply
    }

    fn owner(&self) -> &str {
        self.inner.owner()
    }

    /// Tells the checker of every key `statement` touched that is now wanted while another
    /// owner's whole lease of it lives, or waited for (its waiting mark lives) while another
    /// owner's part leases of it live: from here on, those leases' hand-offs are bounded.
    fn report_wanted_holders(&self, statement: &Statement<'_>, now: Instant) {
        let keys: &[String] = match statement {
            Statement::AcquireAll(keys) | Statement::TryAcquireAll(keys) => keys,
            _ => &[],
        };
        let names = statement
            .key()
            .into_iter()
            .chain(keys.iter().map(String::as_str));
        for key in names {
            let Some(row) = self.table.row(key) else {
                continue;
            };
            if row.wanted && row.is_held_at(now) && !row.is_owned_by(self.owner()) {
                self.checker.wanted_while_held(key, row.fence, None);
            }
            // A part renewal says the key is wanted while the waiting mark lives; a grant as
            // large as the waiting request clears it.
            match row.waiting_at(now) {
                Some(waiting) => {
                    for part in &row.parts {
                        if part.expires_at > now && part.owner != self.owner() {
                            self.checker
                                .wanted_while_held(key, part.fence, Some(waiting.until));
                        }
                    }
                }
                None => self.checker.mark_gone(key),
            }
        }
    }

    /// `acquire_all` or (`trying`) `try_acquire_all`, its reply checked against the rows of
    /// every key as they were just before: all taken, each at its next fence, if every key was
    /// free on the statement's terms; else none, and a refused try changes no row.
    async fn take_all(
        &self,
        keys: &[String],
        trying: bool,
    ) -> Result<Option<Vec<Fence>>, LeaseError> {
        let owner = self.owner().to_owned();
        let before = Mutex::new(Vec::new());
        let statement = if trying {
            Statement::TryAcquireAll(keys)
        } else {
            Statement::AcquireAll(keys)
        };
        self.run(
            statement,
            || {
                // Read in the same step as the statement is applied: nothing runs in between.
                *before.lock().unwrap_or_else(PoisonError::into_inner) =
                    keys.iter().map(|key| self.table.row(key)).collect();
                let inner = &self.inner;
                async move {
                    if trying {
                        inner.try_acquire_all(keys).await
                    } else {
                        inner.acquire_all(keys).await
                    }
                }
            },
            |taken, _, now| {
                let before = before.lock().unwrap_or_else(PoisonError::into_inner);
                let free = |row: &Option<Row>| {
                    row.as_ref().is_none_or(|row| {
                        whole_is_free(row, &owner, now) && !(trying && is_awaited(row, now))
                    })
                };
                let all_free = before.iter().all(free);
                let next: Vec<Fence> = before
                    .iter()
                    .map(|row| row.as_ref().map_or(1, |row| row.fence + 1))
                    .collect();
                match taken {
                    Some(fences) if all_free && *fences == next => Ok(()),
                    Some(fences) if all_free => {
                        Err(format!("fences {fences:?}, where {next:?} were next"))
                    }
                    Some(_) => Err("taken while a key of the set was not free".to_owned()),
                    None if all_free => Err("refused while every key was free".to_owned()),
                    None if trying
                        && keys
                            .iter()
                            .map(|key| self.table.row(key))
                            .collect::<Vec<_>>()
                            != *before =>
                    {
                        Err("refused, and still changed a row".to_owned())
                    }
                    None => Ok(()),
                }
            },
        )
        .await
    }
}

impl LeaseStore for SimStore {
    async fn acquire(&self, key: &str) -> Result<Option<Fence>, LeaseError> {
        let owner = self.owner().to_owned();
        self.run(
            Statement::Acquire(key),
            || self.inner.acquire(key),
            |taken, row, now| {
                let free = row.is_none_or(|row| whole_is_free(row, &owner, now));
                let next = row.map_or(1, |row| row.fence + 1);
                let parts = row.map_or(0, |row| row.parts_held_at(now));
                match taken {
                    Some(fence) if free && *fence == next => Ok(()),
                    Some(fence) if free => Err(format!("fence {fence}, where {next} was next")),
                    Some(_) if parts > 0 => {
                        Err(format!("taken beside part leases of {parts} permits"))
                    }
                    Some(_) => Err("taken while another owner held it live".to_owned()),
                    None if free => Err("refused while free, expired or ours".to_owned()),
                    None => Ok(()),
                }
            },
        )
        .await
    }

    async fn try_acquire(&self, key: &str) -> Result<Option<Fence>, LeaseError> {
        let owner = self.owner().to_owned();
        self.run(
            Statement::TryAcquire(key),
            || self.inner.try_acquire(key),
            |taken, row, now| {
                let free = row.is_none_or(|row| whole_is_free(row, &owner, now));
                let awaited = row.is_some_and(|row| is_awaited(row, now));
                let next = row.map_or(1, |row| row.fence + 1);
                match taken {
                    Some(fence) if free && !awaited && *fence == next => Ok(()),
                    Some(fence) if free && !awaited => {
                        Err(format!("fence {fence}, where {next} was next"))
                    }
                    Some(_) if free => {
                        Err("taken from a waiter refused it less than a lease ago".to_owned())
                    }
                    Some(_) => Err("taken while another owner held it live".to_owned()),
                    None if free && !awaited => {
                        Err("refused while free, expired or ours, and not awaited".to_owned())
                    }
                    None if self.table.row(key).as_ref() != row => {
                        Err("refused, and still changed the row".to_owned())
                    }
                    None => Ok(()),
                }
            },
        )
        .await
    }

    async fn renew(&self, key: &str, fence: Fence) -> Result<Renewal, LeaseError> {
        let owner = self.owner().to_owned();
        self.run(
            Statement::Renew(key, fence),
            || self.inner.renew(key, fence),
            |renewal, row, now| {
                let ours_and_live = row.is_some_and(|row| {
                    row.is_held_at(now) && row.fence == fence && row.is_owned_by(&owner)
                });
                expect(
                    renewal.is_renewed(),
                    ours_and_live,
                    "the row was ours, live and under this fence",
                )?;
                match (renewal, row) {
                    (Renewal::Renewed { wanted }, Some(row)) if *wanted != row.wanted => {
                        Err(format!(
                            "renewed with wanted {wanted}, where the row said {}",
                            row.wanted
                        ))
                    }
                    _ => Ok(()),
                }
            },
        )
        .await
    }

    async fn release(&self, key: &str, fence: Fence) -> Result<bool, LeaseError> {
        let owner = self.owner().to_owned();
        self.run(
            Statement::Release(key, fence),
            || self.inner.release(key, fence),
            |released, row, _| {
                let ours = row.is_some_and(|row| row.fence == fence && row.is_owned_by(&owner));
                expect(*released, ours, "the row was ours under this fence")
            },
        )
        .await
    }

    async fn acquire_part(
        &self,
        key: &str,
        permits: NonZeroU32,
    ) -> Result<Option<Fence>, LeaseError> {
        let capacity = self.table.capacity().get();
        self.run(
            Statement::AcquirePart(key, permits.get()),
            || self.inner.acquire_part(key, permits),
            |taken, row, now| {
                let refusal = row.and_then(|row| part_refusal(row, permits.get(), capacity, now));
                let next = row.map_or(1, |row| row.fence + 1);
                match (taken, refusal) {
                    (Some(fence), None) if *fence == next => Ok(()),
                    (Some(fence), None) => Err(format!("fence {fence}, where {next} was next")),
                    (Some(_), Some(refusal)) => Err(format!("taken {refusal}")),
                    (None, None) => Err("refused while it fitted".to_owned()),
                    (None, Some(_)) => Ok(()),
                }
            },
        )
        .await
    }

    async fn try_acquire_part(
        &self,
        key: &str,
        permits: NonZeroU32,
    ) -> Result<Option<Fence>, LeaseError> {
        let capacity = self.table.capacity().get();
        self.run(
            Statement::TryAcquirePart(key, permits.get()),
            || self.inner.try_acquire_part(key, permits),
            |taken, row, now| {
                let refusal = row.and_then(|row| {
                    part_refusal(row, permits.get(), capacity, now).or_else(|| {
                        row.waiting_at(now)
                            .map(|_| "while a request for it waited".to_owned())
                    })
                });
                let next = row.map_or(1, |row| row.fence + 1);
                match (taken, refusal) {
                    (Some(fence), None) if *fence == next => Ok(()),
                    (Some(fence), None) => Err(format!("fence {fence}, where {next} was next")),
                    (Some(_), Some(refusal)) => Err(format!("taken {refusal}")),
                    (None, None) => Err("refused while it fitted and nobody waited".to_owned()),
                    (None, Some(_)) if self.table.row(key).as_ref() != row => {
                        Err("refused, and still changed the row".to_owned())
                    }
                    (None, Some(_)) => Ok(()),
                }
            },
        )
        .await
    }

    async fn acquire_all(&self, keys: &[String]) -> Result<Option<Vec<Fence>>, LeaseError> {
        self.take_all(keys, false).await
    }

    async fn try_acquire_all(&self, keys: &[String]) -> Result<Option<Vec<Fence>>, LeaseError> {
        self.take_all(keys, true).await
    }

    async fn renew_part(&self, key: &str, fence: Fence) -> Result<Renewal, LeaseError> {
        let owner = self.owner().to_owned();
        self.run(
            Statement::RenewPart(key, fence),
            || self.inner.renew_part(key, fence),
            |renewal, row, now| {
                let ours_and_live = row.is_some_and(|row| {
                    row.parts.iter().any(|part| {
                        part.fence == fence && part.owner == owner && part.expires_at > now
                    })
                });
                expect(
                    renewal.is_renewed(),
                    ours_and_live,
                    "the part was ours and live",
                )?;
                match (renewal, row) {
                    (Renewal::Renewed { wanted }, Some(row))
                        if *wanted != row.waiting_at(now).is_some() =>
                    {
                        Err(format!(
                            "renewed with wanted {wanted}, where the row's waiting mark said {:?}",
                            row.waiting_at(now)
                        ))
                    }
                    _ => Ok(()),
                }
            },
        )
        .await
    }

    async fn release_part(&self, key: &str, fence: Fence) -> Result<bool, LeaseError> {
        let owner = self.owner().to_owned();
        self.run(
            Statement::ReleasePart(key, fence),
            || self.inner.release_part(key, fence),
            |released, row, _| {
                let ours = row.is_some_and(|row| {
                    row.parts
                        .iter()
                        .any(|part| part.fence == fence && part.owner == owner)
                });
                expect(*released, ours, "the part was ours")
            },
        )
        .await
    }

    async fn release_all(&self) -> Result<u64, LeaseError> {
        self.run(
            Statement::ReleaseAll,
            || self.inner.release_all(),
            |_, _, _| Ok(()),
        )
        .await
    }
}

/// Whether `owner` may take `row`'s whole lease now: free, expired or ours, and no live part
/// lease (invariants 1 and 6 of the memory store).
fn whole_is_free(row: &Row, owner: &str, now: Instant) -> bool {
    (!row.is_held_at(now) || row.is_owned_by(owner)) && row.parts_held_at(now) == 0
}

/// Whether a waiter refused `row` may still be on its way, so that a try must leave it
/// (invariant 5): a whole lease wanted and ended less than a lease ago, or a refusal of any
/// request recorded less than a lease ago.
fn is_awaited(row: &Row, now: Instant) -> bool {
    (row.wanted && row.expires_at + LEASE > now) || row.waiting_at(now).is_some()
}

/// Why a part lease of `permits` of `row` must be refused now, if it must (invariants 6, 7).
fn part_refusal(row: &Row, permits: u32, capacity: u32, now: Instant) -> Option<String> {
    if row.is_held_at(now) {
        return Some("beside a live whole lease".to_owned());
    }
    let held = row.parts_held_at(now);
    if held + permits > capacity {
        return Some(format!(
            "past the capacity: {permits} permits beside {held} held of {capacity}"
        ));
    }
    row.waiting_at(now)
        .filter(|waiting| waiting.permits > permits)
        .map(|waiting| {
            format!(
                "past a larger request that waits: {permits} permits while {} wait",
                waiting.permits
            )
        })
}

/// Passes the table's notices to one process as its listener would: lost now and then, lost
/// while the connection is down and followed by [`LeaseNotice::Missed`] when it comes back,
/// none once the process is dead. Returns the notices the process reads.
pub(super) fn relay_notices(
    mut from_table: LeaseNotices,
    process: Arc<ProcessClock>,
    mut rng: Rng,
    checker: Arc<Checker>,
    log: Arc<EventLog>,
) -> LeaseNotices {
    let (sender, notices) = notices::channel();
    // When each outage ends, the listener reconnects and says notices may have been missed.
    let mut reconnections: Vec<Instant> = process
        .plan()
        .outages
        .iter()
        .map(|window| process.at(window.until))
        .collect();
    reconnections.sort();
    let relay = tokio::spawn(async move {
        let mut reconnections = reconnections.into_iter().peekable();
        loop {
            let next_reconnection = reconnections.peek().copied();
            let notice = tokio::select! {
                biased;
                () = async {
                    match next_reconnection {
                        Some(at) => sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                } => {
                    reconnections.next();
                    LeaseNotice::Missed
                }
                notice = from_table.recv() => match notice {
                    Some(notice) => notice,
                    None => return,
                },
            };
            let now = Instant::now();
            if process.is_dead(now) {
                return;
            }
            let lost = matches!(notice, LeaseNotice::Released(_))
                && (process.down_until(now).is_some() || rng.chance(NOTICE_LOST));
            if lost {
                checker.count_fault();
                log.event(&process.name, format_args!("notice {notice:?} lost"));
                continue;
            }
            sender.send(notice);
        }
    });
    let mut notices = notices;
    notices.stop_on_drop(relay.abort_handle());
    notices
}
