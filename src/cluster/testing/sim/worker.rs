//! The workload of one simulated worker, and [`Pausable`], which stops a process's tasks while
//! the plan pauses it.
//!
//! A worker runs `ops` lock calls on random keys: most wait as long as it takes, some under a
//! timeout, some with a timeout of zero, some in a task aborted part-way, and some are
//! tries, which must answer within one statement's time. Each asks for the whole key (`lock`,
//! `try_lock`) or, when keys have more than one permit, now and then for some of them
//! (`acquire`, `try_acquire`; all of them, sometimes, which is the whole key). A granted
//! worker holds the key for a few milliseconds, sometimes for hundreds, sometimes past the
//! lease; then it writes to the resource under its token: only if its guard says the lease is
//! live, or, now and then, regardless (a careless holder, which the fence must stop).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep, sleep, sleep_until, timeout};

use super::checks::{CallOutcome, Checker};
use super::log::EventLog;
use super::plan::{LEASE, ProcessClock};
use super::rng::Rng;
use crate::cluster::locking::lease_store::LeaseStore;
use crate::cluster::locking::locks::ClusterLocks;
use crate::cluster::{ClusterGuard, ClusterMultiGuard};
use crate::error::{LockError, PermitsError, TryLockError, TryPermitsError};

/// One worker of a simulated process.
pub(super) struct Worker<S> {
    pub(super) who: String,
    pub(super) locks: ClusterLocks<String, S>,
    pub(super) process: Arc<ProcessClock>,
    pub(super) keys: usize,
    /// Permits per key.
    pub(super) capacity: u32,
    /// A worker of the plan's reader process (see `Plan::reader_process`).
    pub(super) reader: bool,
    pub(super) ops: usize,
    pub(super) rng: Rng,
    pub(super) checker: Arc<Checker>,
    pub(super) log: Arc<EventLog>,
    /// The planted bug of a `try_lock` that waits for the key as `lock` does.
    pub(super) try_waits: bool,
    /// The planted bug of a `lock_all` that locks its keys one by one, in the order listed,
    /// holding each while it waits for the next.
    pub(super) lock_all_one_by_one: bool,
}

/// How a worker asks for a key.
#[derive(Debug, Clone, Copy)]
enum Call {
    Wait,
    Timeout(Duration),
    Abort(Duration),
    Try,
}

impl<S: LeaseStore> Worker<S> {
    pub(super) async fn run(mut self) {
        if self.reader {
            return self.read().await;
        }
        for _ in 0..self.ops {
            // The first key is the hot one.
            let key = match self.rng.below(4) {
                0..=1 => 0,
                _ => self.rng.below(self.keys as u64),
            };
            let key = format!("k{key}");
            let call = match self.rng.below(12) {
                0..=5 => Call::Wait,
                6..=7 => Call::Timeout(
                    self.rng
                        .between(Duration::from_millis(1), Duration::from_millis(1500)),
                ),
                8 => Call::Timeout(Duration::ZERO),
                9 => Call::Abort(self.rng.between(Duration::ZERO, Duration::from_millis(300))),
                _ => Call::Try,
            };
            // Now and then two keys at once, listed in either order.
            if self.keys >= 2 && self.rng.chance(150) {
                let first = self.rng.below(self.keys as u64);
                let second = (first + 1 + self.rng.below(self.keys as u64 - 1)) % self.keys as u64;
                let set = [format!("k{first}"), format!("k{second}")];
                if !self.all(&set, call).await {
                    return;
                }
            } else {
                // `None`: the whole key, by `lock`; else `acquire` of that many permits.
                let permits = (self.capacity > 1 && self.rng.chance(500))
                    .then(|| 1 + self.rng.below(u64::from(self.capacity)) as u32);
                if !self.once(&key, call, permits).await {
                    return;
                }
            }
            let think = self.rng.between(Duration::ZERO, Duration::from_millis(10));
            sleep(think).await;
        }
        self.log.event(&self.who, format_args!("done"));
    }

    /// The reader process's workload: many short holds of one permit of the hot key, waiting
    /// for it, now and then under a timeout.
    async fn read(mut self) {
        for _ in 0..self.ops * 4 {
            let call = if self.rng.chance(100) {
                Call::Timeout(
                    self.rng
                        .between(Duration::from_millis(1), Duration::from_millis(300)),
                )
            } else {
                Call::Wait
            };
            if !self.once("k0", call, Some(1)).await {
                return;
            }
            let think = self.rng.between(Duration::ZERO, Duration::from_millis(2));
            sleep(think).await;
        }
        self.log.event(&self.who, format_args!("done"));
    }

    /// One lock call for `permits` of `key` (`None`: the whole key), and what follows;
    /// `false` once the registry is closed.
    async fn once(&mut self, key: &str, call: Call, permits: Option<u32>) -> bool {
        match permits {
            None => self
                .log
                .event(&self.who, format_args!("locks {key} ({call:?})")),
            Some(permits) => self.log.event(
                &self.who,
                format_args!("acquires {permits} of {key} ({call:?})"),
            ),
        }
        let held = permits.unwrap_or(self.capacity);
        let ask = Ask {
            key,
            permits,
            held,
            who: &self.who,
            checker: &self.checker,
        };
        let id = self
            .checker
            .call_started(&self.who, key, !matches!(call, Call::Wait | Call::Try));
        let locked = match call {
            Call::Wait => Some(ask.lock(&self.locks).await),
            Call::Timeout(limit) => timeout(limit, ask.lock(&self.locks)).await.ok(),
            Call::Abort(after) => {
                let (locks, checker) = (self.locks.clone(), Arc::clone(&self.checker));
                let (owned, who) = (key.to_owned(), self.who.clone());
                let task = tokio::spawn(Pausable::new(
                    async move {
                        let ask = Ask {
                            key: &owned,
                            permits,
                            held,
                            who: &who,
                            checker: &checker,
                        };
                        ask.lock(&locks).await
                    },
                    Arc::clone(&self.process),
                ));
                sleep(after).await;
                // Abort, then take what it got if it finished first: an aborted task that was
                // granted already hands its guard over, as a real caller's would.
                task.abort();
                task.await.ok()
            }
            Call::Try => {
                let started = Instant::now();
                let tried = if self.try_waits {
                    ask.lock(&self.locks)
                        .await
                        .map_err(|LockError::Closed| TryLockError::Closed)
                } else {
                    ask.try_lock(&self.locks).await
                };
                let paused = self.process.paused_between(started, Instant::now());
                self.checker.tried(&self.who, key, started, paused);
                match tried {
                    Ok(guard) => Some(Ok(guard)),
                    Err(TryLockError::WouldBlock) => None,
                    Err(_closed) => Some(Err(LockError::Closed)),
                }
            }
        };
        let guard = match locked {
            None => {
                self.log.event(&self.who, format_args!("gives up {key}"));
                self.checker.call_ended(id, CallOutcome::GaveUp);
                return true;
            }
            Some(Err(LockError::Closed)) => {
                self.log.event(&self.who, format_args!("closed"));
                self.checker.call_ended(id, CallOutcome::Closed);
                return false;
            }
            Some(Ok(guard)) => guard,
        };
        self.checker.call_ended(id, CallOutcome::Granted);
        let hold = match self.rng.below(20) {
            0..=16 => self.rng.between(Duration::ZERO, Duration::from_millis(20)),
            17..=18 => self
                .rng
                .between(Duration::from_millis(50), Duration::from_millis(400)),
            _ => self.rng.between(LEASE + LEASE / 5, 2 * LEASE),
        };
        sleep(hold).await;
        let believes_live = !guard.is_lost();
        if believes_live || self.rng.chance(500) {
            self.checker
                .write(&self.who, key, guard.fencing_token(), held, believes_live);
        }
        self.checker.released(&self.who, key);
        drop(guard);
        true
    }
}

impl<S: LeaseStore> Worker<S> {
    /// One `lock_all` (or `try_lock_all`) of `set`, and what follows; `false` once the
    /// registry is closed. An abort is a timeout here.
    async fn all(&mut self, set: &[String; 2], call: Call) -> bool {
        self.log.event(
            &self.who,
            format_args!("locks all {} ({call:?})", set.join(" ")),
        );
        let id = self.checker.call_started(
            &self.who,
            &set.join("+"),
            !matches!(call, Call::Wait | Call::Try),
        );
        let locked = match call {
            Call::Wait => Some(self.lock_all(set).await),
            Call::Timeout(limit) | Call::Abort(limit) => {
                timeout(limit, self.lock_all(set)).await.ok()
            }
            Call::Try => {
                let started = Instant::now();
                let tried = self.locks.try_lock_all(set.to_vec()).await;
                let paused = self.process.paused_between(started, Instant::now());
                self.checker
                    .tried(&self.who, &set.join("+"), started, paused);
                match tried {
                    Ok(guard) => Some(Ok(vec![self.granted_all(guard)])),
                    Err(TryLockError::WouldBlock) => None,
                    Err(TryLockError::Closed) => Some(Err(LockError::Closed)),
                }
            }
        };
        let held = match locked {
            None => {
                self.log
                    .event(&self.who, format_args!("gives up {}", set.join(" ")));
                self.checker.call_ended(id, CallOutcome::GaveUp);
                return true;
            }
            Some(Err(LockError::Closed)) => {
                self.log.event(&self.who, format_args!("closed"));
                self.checker.call_ended(id, CallOutcome::Closed);
                return false;
            }
            Some(Ok(held)) => held,
        };
        self.checker.call_ended(id, CallOutcome::Granted);
        let hold = self.rng.between(Duration::ZERO, Duration::from_millis(20));
        sleep(hold).await;
        for guard in &held {
            let believes_live = !guard.is_lost();
            for key in set {
                if let Some(token) = guard.fencing_token(key)
                    && believes_live
                {
                    self.checker
                        .write(&self.who, key, token, self.capacity, believes_live);
                }
            }
        }
        for key in set {
            self.checker.released(&self.who, key);
        }
        drop(held);
        true
    }

    /// Waits for every key of `set`: one `lock_all`, or, with the planted bug, a `lock` of
    /// each in turn, each guard kept while the next is awaited.
    async fn lock_all(&self, set: &[String; 2]) -> Result<Vec<SetHeld>, LockError> {
        if !self.lock_all_one_by_one {
            let guard = self.locks.lock_all(set.to_vec()).await?;
            return Ok(vec![self.granted_all(guard)]);
        }
        let mut held = Vec::new();
        for key in set {
            let guard = Arc::new(self.locks.lock(key.clone()).await?);
            self.checker.granted(&self.who, key, &guard, self.capacity);
            held.push(SetHeld::One(key.clone(), guard));
        }
        Ok(held)
    }

    fn granted_all(&self, guard: ClusterMultiGuard<String>) -> SetHeld {
        let guard = Arc::new(guard);
        self.checker.granted_all(&self.who, &guard);
        SetHeld::All(guard)
    }
}

/// What a worker holds of a set: one guard of every key, or (the planted bug) one per key.
enum SetHeld {
    All(Arc<ClusterMultiGuard<String>>),
    One(String, Arc<ClusterGuard<String>>),
}

impl SetHeld {
    fn is_lost(&self) -> bool {
        match self {
            SetHeld::All(guard) => guard.is_lost(),
            SetHeld::One(_, guard) => guard.is_lost(),
        }
    }

    fn fencing_token(&self, key: &String) -> Option<u64> {
        match self {
            SetHeld::All(guard) => guard.fencing_token(key),
            SetHeld::One(held, guard) => (held == key).then(|| guard.fencing_token()),
        }
    }
}

/// One worker's request: `permits` of `key` (`None`: the whole key), which hold `held` of the
/// key's permits.
struct Ask<'a> {
    key: &'a str,
    permits: Option<u32>,
    held: u32,
    who: &'a str,
    checker: &'a Checker,
}

impl Ask<'_> {
    /// Waits for the key, and tells the checker at the instant of the grant (an aborted
    /// task's guard reaches its worker later).
    async fn lock<S: LeaseStore>(
        &self,
        locks: &ClusterLocks<String, S>,
    ) -> Result<Arc<ClusterGuard<String>>, LockError> {
        let key = self.key.to_owned();
        let guard = match self.permits {
            None => locks.lock(key).await?,
            Some(permits) => match locks.acquire(key, permits).await {
                Ok(guard) => guard,
                Err(PermitsError::Closed) => return Err(LockError::Closed),
                Err(error) => {
                    self.checker.fail(format!("{}: {error}", self.who));
                    return Err(LockError::Closed);
                }
            },
        };
        Ok(self.granted(guard))
    }

    /// Tries the key, and tells the checker at the instant of the grant.
    async fn try_lock<S: LeaseStore>(
        &self,
        locks: &ClusterLocks<String, S>,
    ) -> Result<Arc<ClusterGuard<String>>, TryLockError> {
        let key = self.key.to_owned();
        let guard = match self.permits {
            None => locks.try_lock(key).await?,
            Some(permits) => match locks.try_acquire(key, permits).await {
                Ok(guard) => guard,
                Err(TryPermitsError::WouldBlock) => return Err(TryLockError::WouldBlock),
                Err(TryPermitsError::Closed) => return Err(TryLockError::Closed),
                Err(error) => {
                    self.checker.fail(format!("{}: {error}", self.who));
                    return Err(TryLockError::Closed);
                }
            },
        };
        Ok(self.granted(guard))
    }

    fn granted(&self, guard: ClusterGuard<String>) -> Arc<ClusterGuard<String>> {
        let guard = Arc::new(guard);
        self.checker.granted(self.who, self.key, &guard, self.held);
        guard
    }
}

/// A task of a simulated process: not polled while the process is paused, as a stopped
/// process's code does not run. Its timers still fire; it reads them when it resumes.
pub(super) struct Pausable<F> {
    inner: Pin<Box<F>>,
    process: Arc<ProcessClock>,
    pause: Option<Pin<Box<Sleep>>>,
}

impl<F> Pausable<F> {
    pub(super) fn new(inner: F, process: Arc<ProcessClock>) -> Self {
        Pausable {
            inner: Box::pin(inner),
            process,
            pause: None,
        }
    }
}

impl<F: Future> Future for Pausable<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        loop {
            if let Some(pause) = &mut self.pause {
                if pause.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.pause = None;
            }
            match self.process.paused_until(Instant::now()) {
                Some(resume) => self.pause = Some(Box::pin(sleep_until(resume))),
                None => return self.inner.as_mut().poll(cx),
            }
        }
    }
}
