//! The reference model of the lock table: its rules written as naively as they can be, once,
//! for the tests that check the real table against them (`table_model` on random scripts,
//! `exhaustive_small_scope` on every interleaving of small scenarios).
//!
//! # What the model is
//!
//! A capacity (the permits of each key) and, per key, a list of holders with the permits each
//! holds and a list of waiters in order of arrival with the permits each asks for; a counter
//! of arrivals (the table's [`WaiterId`]s are arrival numbers) and one of fencing tokens. A
//! test makes calls on a [`ReferenceModel`] as it would on a table (`acquire`,
//! `acquire_permits`, `try_acquire`, `try_acquire_permits`, `release`, `cancel`, `shutdown`);
//! each call appends to the model's journal the events a correct table records for it (the
//! call, then the grants, would-blocks, closes and refusals it causes) and remembers the
//! model's keys after it. Any waiter id can be named, so the model also says how the table
//! refuses a release or cancel that makes no sense.
//!
//! The rules, each in one place below: a request *fits* when the permits its key's holders
//! hold plus the ones it asks for are at most the capacity (an exclusive request asks for all
//! of them). A request is granted at once only if its key has no waiter and it fits, and
//! queues otherwise. After a release or a cancel, the key's waiters are granted from the
//! front while the front one fits, stopping at the first that does not (strict FIFO: a big
//! request at the front holds back smaller ones behind it, and its cancel lets through those
//! that now fit). A try-acquire is granted under the same condition as an acquire, and
//! otherwise would block without queueing. With a capacity of 1 every request is exclusive,
//! and these are the rules of a plain lock.
//!
//! # How the table is checked
//!
//! [`check_the_table_against`] judges the real table by the model's journal, three ways:
//!
//! 1. Outputs, through replay: [`keyed_locks::replay::verify`] feeds the journal's inputs to a
//!    fresh table and compares every event. Mutual exclusion, the capacity, FIFO, the waiter
//!    ids, the fencing tokens, the order of closes at shutdown and every refusal show up here
//!    first, as the first event the table records differently, with its sequence number.
//! 2. State after every call: the same inputs fed one at a time to a `JournaledTable` of the
//!    model's capacity, whose `check_invariants()`, `stats()` (keys, held keys, holders,
//!    permits held, waiting, grants), entries (`contains_key`, so no entry without a holder
//!    or a waiter and none missing), holders and waiters (`key_of`, `delivery_of`) must match
//!    the model after each call, and whose deliveries come back to the waiter that brought
//!    them, from a grant, a cancel or a close.
//! 3. On the table's own journal: fencing tokens strictly increase, and, if the script ends
//!    with nothing held, every waiter that arrived was granted, cancelled or closed
//!    (liveness), read off the table's events rather than the model's.

use std::collections::{BTreeMap, HashSet};
use std::num::NonZeroU32;
use std::time::Duration;

use keyed_locks::journal::{
    Journal, JournalEntry, JournalEvent, JournaledTable, Refusal, format_waiter,
};
use keyed_locks::replay::verify;
use keyed_locks::table::{Acquired, WaiterId};
use keyed_locks::trace::{IntegerKeys, write_trace};

/// A holder and the permits it holds, or a waiter and the permits it asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Request {
    waiter: WaiterId,
    permits: u32,
}

/// One key as the rules describe it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct ModelKey {
    /// In order of grant.
    holders: Vec<Request>,
    /// In order of arrival.
    waiters: Vec<Request>,
}

impl ModelKey {
    fn holders_and_waiters(&self) -> usize {
        self.holders.len() + self.waiters.len()
    }

    fn permits_held(&self) -> u32 {
        self.holders.iter().map(|holder| holder.permits).sum()
    }
}

/// Every key the script named, free ones included, so that a leaked entry is looked for too.
type ModelKeys = BTreeMap<u64, ModelKey>;

/// Where one call's events end in the journal, and the keys as the call left them.
#[derive(Debug, Clone)]
struct CallEnd {
    events_end: usize,
    keys: ModelKeys,
    grants: u64,
}

/// The deliberately naive reference: see the [module docs](self).
#[derive(Debug, Clone)]
pub struct ReferenceModel {
    /// The permits of each key; an exclusive request asks for all of them.
    capacity: u32,
    keys: ModelKeys,
    /// The arrival number of the next acquirer: the table's [`WaiterId`].
    next_arrival: u64,
    next_fencing_token: u64,
    /// What a correct table records, call after call: the capacity first if it is not 1, as
    /// a table made with it records.
    events: Vec<JournalEvent<u64>>,
    calls: Vec<CallEnd>,
}

impl ReferenceModel {
    /// A model of a fresh table whose keys have `capacity` permits each (1: plain locks).
    pub fn with_capacity(capacity: u32) -> Self {
        assert!(capacity >= 1, "a key has at least one permit");
        let events = if capacity > 1 {
            vec![JournalEvent::Capacity { permits: capacity }]
        } else {
            Vec::new()
        };
        ReferenceModel {
            capacity,
            keys: ModelKeys::new(),
            next_arrival: 1,
            next_fencing_token: 1,
            events,
            calls: Vec::new(),
        }
    }

    /// Asks for every permit of `key` (an exclusive lock) and returns the acquirer's id.
    pub fn acquire(&mut self, key: u64) -> WaiterId {
        let waiter = self.arrival_id();
        self.events.push(JournalEvent::Acquire { waiter, key });
        self.grant_or_queue(key, self.capacity);
        self.end_call();
        waiter
    }

    /// Asks for `permits` of `key`'s permits (1 is a shared lock) and returns the acquirer's
    /// id.
    pub fn acquire_permits(&mut self, key: u64, permits: u32) -> WaiterId {
        assert!(
            (1..=self.capacity).contains(&permits),
            "{permits} permits of {}: the table refuses to make that request",
            self.capacity
        );
        let waiter = self.arrival_id();
        self.events.push(JournalEvent::AcquirePermits {
            waiter,
            key,
            permits,
        });
        self.grant_or_queue(key, permits);
        self.end_call();
        waiter
    }

    /// Takes every permit of `key` if it can be granted now; the new holder's id, or `None`
    /// (a would-block, which names nobody).
    pub fn try_acquire(&mut self, key: u64) -> Option<WaiterId> {
        self.events.push(JournalEvent::TryAcquire { key });
        let taken = self.grant_or_refuse(key, self.capacity);
        self.end_call();
        taken
    }

    /// Takes `permits` of `key`'s permits if they can be granted now; the new holder's id, or
    /// `None` (a would-block).
    pub fn try_acquire_permits(&mut self, key: u64, permits: u32) -> Option<WaiterId> {
        assert!(
            (1..=self.capacity).contains(&permits),
            "{permits} permits of {}: the table refuses to make that request",
            self.capacity
        );
        self.events
            .push(JournalEvent::TryAcquirePermits { key, permits });
        let taken = self.grant_or_refuse(key, permits);
        self.end_call();
        taken
    }

    /// Releases `waiter`'s hold and grants its key's waiters from the front while they fit. A
    /// waiter that does not hold is refused and nothing changes.
    pub fn release(&mut self, waiter: WaiterId) {
        self.events.push(JournalEvent::Release { waiter });
        match self.find(waiter) {
            Some((key, true)) => {
                let model_key = self.keys.get_mut(&key).expect("a found key");
                model_key.holders.retain(|holder| holder.waiter != waiter);
                self.grant_from_the_front(key);
            }
            Some((_, false)) => self.refuse(waiter, Refusal::NotHolding),
            None => self.refuse(waiter, Refusal::Unknown),
        }
        self.end_call();
    }

    /// Withdraws the queued `waiter` and grants its key's waiters from the front while they
    /// fit: if `waiter` was a big request at the front, the ones behind it that fit now go
    /// through. A waiter that does not wait is refused and nothing changes.
    pub fn cancel(&mut self, waiter: WaiterId) {
        self.events.push(JournalEvent::Cancel { waiter });
        match self.find(waiter) {
            Some((key, false)) => {
                let model_key = self.keys.get_mut(&key).expect("a found key");
                model_key.waiters.retain(|queued| queued.waiter != waiter);
                self.grant_from_the_front(key);
            }
            Some((_, true)) => self.refuse(waiter, Refusal::NotWaiting),
            None => self.refuse(waiter, Refusal::Unknown),
        }
        self.end_call();
    }

    /// Closes every waiter, in order of arrival across keys, and forgets every hold.
    pub fn shutdown(&mut self) {
        self.events.push(JournalEvent::Shutdown);
        let mut waiting: Vec<WaiterId> = self
            .keys
            .values()
            .flat_map(|key| key.waiters.iter().map(|queued| queued.waiter))
            .collect();
        waiting.sort_unstable();
        self.events.extend(
            waiting
                .into_iter()
                .map(|waiter| JournalEvent::Closed { waiter }),
        );
        self.keys
            .values_mut()
            .for_each(|key| *key = ModelKey::default());
        self.end_call();
    }

    /// Grants so far: the last fencing token handed out.
    pub fn grants(&self) -> u64 {
        self.next_fencing_token - 1
    }

    /// Every key's holders, in key order, each key's in order of grant.
    pub fn holders(&self) -> Vec<WaiterId> {
        self.keys
            .values()
            .flat_map(|key| key.holders.iter().map(|holder| holder.waiter))
            .collect()
    }

    /// Holders and waiters, key by key, each key's holders first.
    pub fn live_acquirers(&self) -> Vec<WaiterId> {
        self.keys
            .values()
            .flat_map(|key| key.holders.iter().chain(&key.waiters))
            .map(|request| request.waiter)
            .collect()
    }

    /// Every id the model has issued, in order of arrival.
    pub fn issued(&self) -> impl Iterator<Item = WaiterId> + '_ {
        (1..self.next_arrival).map(|arrival| WaiterId::new(arrival).expect("counts from 1"))
    }

    /// The key `waiter` holds or waits for, and whether it holds it; `None` once it is gone.
    pub fn find(&self, waiter: WaiterId) -> Option<(u64, bool)> {
        self.keys.iter().find_map(|(key, model_key)| {
            let is_waiter = |request: &Request| request.waiter == waiter;
            if model_key.holders.iter().any(is_waiter) {
                Some((*key, true))
            } else if model_key.waiters.iter().any(is_waiter) {
                Some((*key, false))
            } else {
                None
            }
        })
    }

    /// The holders of `key`, in order of grant.
    pub fn holders_of(&self, key: u64) -> Vec<WaiterId> {
        self.keys.get(&key).map_or_else(Vec::new, |model_key| {
            model_key
                .holders
                .iter()
                .map(|holder| holder.waiter)
                .collect()
        })
    }

    /// The waiters queued on `key`, in order of arrival.
    pub fn waiters(&self, key: u64) -> Vec<WaiterId> {
        self.keys.get(&key).map_or_else(Vec::new, |model_key| {
            model_key
                .waiters
                .iter()
                .map(|queued| queued.waiter)
                .collect()
        })
    }

    /// The journal a correct table records for the calls so far, numbered from 1.
    pub fn journal(&self) -> Journal<u64> {
        Journal {
            entries: (1..)
                .zip(&self.events)
                .map(|(seq, event)| JournalEntry {
                    seq,
                    at: Duration::ZERO,
                    event: event.clone(),
                })
                .collect(),
            dropped: 0,
        }
    }

    /// The id of the acquirer arriving now.
    fn arrival_id(&self) -> WaiterId {
        WaiterId::new(self.next_arrival).expect("arrivals count from 1")
    }

    /// Whether `permits` more fit beside `key`'s holders.
    fn fits(&self, key: u64, permits: u32) -> bool {
        let held = self.keys.get(&key).map_or(0, ModelKey::permits_held);
        held + permits <= self.capacity
    }

    /// Whether a request for `permits` of `key` is granted at once: nobody waits, and it fits.
    fn grantable_now(&self, key: u64, permits: u32) -> bool {
        self.waiters(key).is_empty() && self.fits(key, permits)
    }

    /// An acquire: the new acquirer holds `key` if it can be granted now, and queues last
    /// otherwise.
    fn grant_or_queue(&mut self, key: u64, permits: u32) {
        let request = Request {
            waiter: self.arrive(),
            permits,
        };
        if self.grantable_now(key, permits) {
            self.grant(key, request);
        } else {
            self.keys.entry(key).or_default().waiters.push(request);
        }
    }

    /// A try-acquire: the new holder's id if it can be granted now; a would-block, which takes
    /// no id, otherwise.
    fn grant_or_refuse(&mut self, key: u64, permits: u32) -> Option<WaiterId> {
        if self.grantable_now(key, permits) {
            let waiter = self.arrive();
            self.grant(key, Request { waiter, permits });
            Some(waiter)
        } else {
            self.events.push(JournalEvent::WouldBlock { key });
            None
        }
    }

    /// After a release or a cancel: grants `key`'s waiters from the front while the front one
    /// fits, and stops at the first that does not, however small the ones behind it are.
    fn grant_from_the_front(&mut self, key: u64) {
        while let Some(&first) = self.keys[&key].waiters.first() {
            if !self.fits(key, first.permits) {
                break;
            }
            self.keys.get_mut(&key).expect("a key").waiters.remove(0);
            self.grant(key, first);
        }
    }

    fn arrive(&mut self) -> WaiterId {
        let waiter = self.arrival_id();
        self.next_arrival += 1;
        waiter
    }

    fn grant(&mut self, key: u64, request: Request) {
        self.keys.entry(key).or_default().holders.push(request);
        self.events.push(JournalEvent::Grant {
            waiter: request.waiter,
            fencing_token: self.next_fencing_token,
        });
        self.next_fencing_token += 1;
    }

    fn refuse(&mut self, waiter: WaiterId, reason: Refusal) {
        self.events.push(JournalEvent::Refused { waiter, reason });
    }

    fn end_call(&mut self) {
        // The model's own rules, so that a slip in it cannot pass for a finding about the
        // table: never more permits held than a key has, and never a first waiter that fits.
        for (key, model_key) in &self.keys {
            assert!(
                model_key.permits_held() <= self.capacity,
                "the model holds {} permits of key {key}",
                model_key.permits_held()
            );
            if let Some(first) = model_key.waiters.first() {
                assert!(
                    !self.fits(*key, first.permits),
                    "the model left {} waiting on key {key} though it fits",
                    first.waiter
                );
            }
        }
        self.calls.push(CallEnd {
            events_end: self.events.len(),
            keys: self.keys.clone(),
            grants: self.grants(),
        });
    }
}

/// Checks the real table against every call made on `model` (see the module docs); `Err`
/// says where and how the table broke a rule.
pub fn check_the_table_against(model: &ReferenceModel) -> Result<(), String> {
    let expected = model.journal();
    verify(&expected).map_err(|error| {
        format!(
            "{error}; the model expects `{}`",
            trace_lines(&model.events)
        )
    })?;

    // Deliveries are waiter ids, so that each one handed back can be told apart.
    let capacity = NonZeroU32::new(model.capacity).expect("a capacity above 0");
    let mut table =
        JournaledTable::<u64, Option<WaiterId>>::for_permits(capacity, Some(usize::MAX));
    // The capacity event, if any, is the table's own record of how it was made.
    let mut events_start = usize::from(model.capacity > 1);
    for (index, call) in model.calls.iter().enumerate() {
        let input = &model.events[events_start];
        feed(
            &mut table,
            input,
            &model.events[events_start..call.events_end],
        )
        .and_then(|()| check_state(&table, call))
        .map_err(|failure| {
            format!(
                "call {index} (`{}`): {failure}",
                trace_lines(std::iter::once(input))
            )
        })?;
        events_start = call.events_end;
    }

    let recorded = table.journal();
    let mut last_fencing_token = 0;
    for entry in &recorded.entries {
        if let JournalEvent::Grant { fencing_token, .. } = entry.event {
            if fencing_token <= last_fencing_token {
                return Err(format!(
                    "token {fencing_token} granted after token {last_fencing_token}"
                ));
            }
            last_fencing_token = fencing_token;
        }
    }
    if model.holders().is_empty() {
        let never_granted = waiters_never_granted(&recorded);
        if !never_granted.is_empty() {
            let never_granted: Vec<String> = never_granted.into_iter().map(format_waiter).collect();
            return Err(format!(
                "{never_granted:?} waited, were neither cancelled nor closed, and were never \
                 granted, though nothing is held"
            ));
        }
    }
    Ok(())
}

/// Makes the call `input` names on `table`, as a replay does, and checks that every delivery
/// the table hands back (in a grant, a cancel or a close) is the one its waiter brought.
/// `events` are the model's events for the call, `input` first: an acquire brings the id the
/// model expects the table to give it.
fn feed(
    table: &mut JournaledTable<u64, Option<WaiterId>>,
    input: &JournalEvent<u64>,
    events: &[JournalEvent<u64>],
) -> Result<(), String> {
    let mut granted = Vec::new();
    match input {
        JournalEvent::Acquire { waiter, key } => {
            if let Acquired::Granted(grant) = table.acquire(*key, Some(*waiter)) {
                granted.push(grant);
            }
        }
        JournalEvent::AcquirePermits {
            waiter,
            key,
            permits,
        } => {
            let permits = table
                .table()
                .permits(*permits)
                .map_err(|error| error.to_string())?;
            if let Acquired::Granted(grant) = table.acquire_permits(*key, permits, Some(*waiter)) {
                granted.push(grant);
            }
        }
        // A try-acquire waits for nothing, so it brings no delivery to hand back.
        JournalEvent::TryAcquire { key } => {
            let _ = table.try_acquire(*key);
        }
        JournalEvent::TryAcquirePermits { key, permits } => {
            let permits = table
                .table()
                .permits(*permits)
                .map_err(|error| error.to_string())?;
            let _ = table.try_acquire_permits(*key, permits);
        }
        JournalEvent::Release { waiter } => {
            let _ = table.release(*waiter, &mut granted);
        }
        JournalEvent::Cancel { waiter } => {
            if let Ok((key, delivery)) = table.cancel(*waiter, &mut granted)
                && delivery != Some(*waiter)
            {
                return Err(format!(
                    "the cancel of {waiter} on key {key} handed back {delivery:?}"
                ));
            }
        }
        JournalEvent::Shutdown => {
            for (waiter, delivery) in table.shutdown() {
                if delivery != Some(waiter) {
                    return Err(format!("closing {waiter} handed back {delivery:?}"));
                }
            }
        }
        other => panic!("the model began a call with {other:?}, not a call: {events:?}"),
    }
    match granted
        .iter()
        .find(|grant| grant.delivery != Some(grant.waiter_id))
    {
        Some(grant) => Err(format!(
            "the grant to {} handed back {:?}",
            grant.waiter_id, grant.delivery
        )),
        None => Ok(()),
    }
}

/// Everything the table must agree with the model on after a call.
fn check_state(
    table: &JournaledTable<u64, Option<WaiterId>>,
    call: &CallEnd,
) -> Result<(), String> {
    let table = table.table();
    table
        .check_invariants()
        .map_err(|violation| violation.to_string())?;
    let stats = table.stats();
    let keys = call.keys.values();
    let expected = (
        keys.clone()
            .filter(|key| key.holders_and_waiters() > 0)
            .count(),
        keys.clone().filter(|key| !key.holders.is_empty()).count(),
        keys.clone().map(|key| key.holders.len()).sum::<usize>(),
        keys.clone()
            .map(|key| key.permits_held() as usize)
            .sum::<usize>(),
        keys.map(|key| key.waiters.len()).sum::<usize>(),
        call.grants,
    );
    let got = (
        stats.keys,
        stats.held,
        stats.holders,
        stats.permits,
        stats.waiting,
        stats.grants,
    );
    if got != expected {
        return Err(format!(
            "(keys, held, holders, permits, waiting, grants) is {got:?}, the model says \
             {expected:?}"
        ));
    }
    for (key, model_key) in &call.keys {
        // No entry without a holder or a waiter, and none missing.
        if table.contains_key(key) != (model_key.holders_and_waiters() > 0) {
            return Err(format!(
                "key {key} has an entry: {}, but {} holders and waiters",
                table.contains_key(key),
                model_key.holders_and_waiters()
            ));
        }
        // The model's holders, and only they (the counts above), hold in the table too.
        for holder in &model_key.holders {
            let holder = holder.waiter;
            if table.key_of(holder) != Some(key) || table.delivery_of(holder).is_some() {
                return Err(format!("{holder} does not hold key {key}"));
            }
        }
        for waiter in &model_key.waiters {
            let waiter = waiter.waiter;
            if table.key_of(waiter) != Some(key) || table.delivery_of(waiter).is_none() {
                return Err(format!("{waiter} is not waiting for key {key}"));
            }
        }
    }
    Ok(())
}

/// Acquirers the journal shows arriving that never got a grant, a successful cancel or a close.
fn waiters_never_granted(journal: &Journal<u64>) -> Vec<WaiterId> {
    let mut arrived = Vec::new();
    let mut settled = HashSet::new();
    let mut events = journal.entries.iter().map(|entry| &entry.event).peekable();
    while let Some(event) = events.next() {
        match event {
            JournalEvent::Acquire { waiter, .. } | JournalEvent::AcquirePermits { waiter, .. } => {
                arrived.push(*waiter);
            }
            JournalEvent::Grant { waiter, .. } | JournalEvent::Closed { waiter } => {
                settled.insert(*waiter);
            }
            // A refused cancel is followed by its refusal, and the waiter goes on.
            JournalEvent::Cancel { waiter }
                if !matches!(events.peek(), Some(JournalEvent::Refused { .. })) =>
            {
                settled.insert(*waiter);
            }
            _ => {}
        }
    }
    arrived.retain(|waiter| !settled.contains(waiter));
    arrived
}

/// Events as trace lines without number and time, for failure messages:
/// `release w1; grant w2 2`.
pub fn trace_lines<'a>(events: impl IntoIterator<Item = &'a JournalEvent<u64>>) -> String {
    let journal = Journal {
        entries: (1..)
            .zip(events)
            .map(|(seq, event)| JournalEntry {
                seq,
                at: Duration::ZERO,
                event: event.clone(),
            })
            .collect(),
        dropped: 0,
    };
    let trace = write_trace(&journal, &IntegerKeys);
    let lines: Vec<&str> = trace
        .lines()
        .filter(|line| !line.starts_with('#'))
        .map(|line| line.splitn(3, ' ').nth(2).unwrap_or(line))
        .collect();
    lines.join("; ")
}
