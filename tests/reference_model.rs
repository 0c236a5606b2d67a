//! The reference model of the lock table: its rules written as naively as they can be, once,
//! for the tests that check the real table against them (`table_model` on random scripts,
//! `exhaustive_small_scope` on every interleaving of a small scenario).
//!
//! # What the model is
//!
//! Per key, at most one holder and a list of waiters in order of arrival; a counter of
//! arrivals (the table's [`WaiterId`]s are arrival numbers) and one of fencing tokens. A test
//! makes calls on a [`ReferenceModel`] as it would on a table (`acquire`, `try_acquire`,
//! `release`, `cancel`, `shutdown`); each call appends to the model's journal the events a
//! correct table records for it (the call, then the grants, would-blocks, closes and refusals
//! it causes) and remembers the model's keys after it. Any waiter id can be named, so the
//! model also says how the table refuses a release or cancel that makes no sense.
//!
//! # How the table is checked
//!
//! [`check_the_table_against`] judges the real table by the model's journal, three ways:
//!
//! 1. Outputs, through replay: [`keyed_locks::replay::verify`] feeds the journal's inputs to a
//!    fresh table and compares every event. Mutual exclusion, FIFO, the waiter ids, the
//!    fencing tokens, the order of closes at shutdown and every refusal show up here first,
//!    as the first event the table records differently, with its sequence number.
//! 2. State after every call: the same inputs fed one at a time to a `JournaledTable`, whose
//!    `check_invariants()`, `stats()`, entries (`contains_key`, so no entry without a holder
//!    or a waiter and none missing), holders and waiters (`key_of`, `delivery_of`) must match
//!    the model after each call, and whose deliveries come back to the waiter that brought them.
//! 3. On the table's own journal: fencing tokens strictly increase, and, if the script ends
//!    with nothing held, every waiter that arrived was granted, cancelled or closed
//!    (liveness), read off the table's events rather than the model's.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use keyed_locks::journal::{
    Journal, JournalEntry, JournalEvent, JournaledTable, Refusal, format_waiter,
};
use keyed_locks::replay::verify;
use keyed_locks::table::{Acquired, WaiterId};
use keyed_locks::trace::{IntegerKeys, write_trace};

/// One key as the rules describe it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct ModelKey {
    holder: Option<WaiterId>,
    /// In order of arrival.
    waiters: Vec<WaiterId>,
}

impl ModelKey {
    fn holders_and_waiters(&self) -> usize {
        usize::from(self.holder.is_some()) + self.waiters.len()
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
    keys: ModelKeys,
    /// The arrival number of the next acquirer: the table's [`WaiterId`].
    next_arrival: u64,
    next_fencing_token: u64,
    /// What a correct table records, call after call.
    events: Vec<JournalEvent<u64>>,
    calls: Vec<CallEnd>,
}

impl ReferenceModel {
    /// A model of a fresh table.
    pub fn new() -> Self {
        ReferenceModel {
            keys: ModelKeys::new(),
            next_arrival: 1,
            next_fencing_token: 1,
            events: Vec::new(),
            calls: Vec::new(),
        }
    }

    /// Asks for `key` and returns the acquirer's id: granted if the key has no holder and no
    /// waiter, queued behind them otherwise.
    pub fn acquire(&mut self, key: u64) -> WaiterId {
        let waiter = self.arrive();
        self.events.push(JournalEvent::Acquire { waiter, key });
        let model_key = self.keys.entry(key).or_default();
        if model_key.holders_and_waiters() == 0 {
            self.grant(key, waiter);
        } else {
            model_key.waiters.push(waiter);
        }
        self.end_call();
        waiter
    }

    /// Takes `key` if it has no holder and no waiter; the new holder's id, or `None` (a
    /// would-block, which names nobody).
    pub fn try_acquire(&mut self, key: u64) -> Option<WaiterId> {
        self.events.push(JournalEvent::TryAcquire { key });
        let taken = if self.keys.entry(key).or_default().holders_and_waiters() == 0 {
            let waiter = self.arrive();
            self.grant(key, waiter);
            Some(waiter)
        } else {
            self.events.push(JournalEvent::WouldBlock { key });
            None
        };
        self.end_call();
        taken
    }

    /// Releases `waiter`'s hold; the key passes to the waiter that arrived first (FIFO). A
    /// waiter that does not hold is refused and nothing changes.
    pub fn release(&mut self, waiter: WaiterId) {
        self.events.push(JournalEvent::Release { waiter });
        match self.find(waiter) {
            Some((key, true)) => {
                let model_key = self.keys.get_mut(&key).expect("a found key");
                model_key.holder = None;
                if !model_key.waiters.is_empty() {
                    let next = model_key.waiters.remove(0);
                    self.grant(key, next);
                }
            }
            Some((_, false)) => self.refuse(waiter, Refusal::NotHolding),
            None => self.refuse(waiter, Refusal::Unknown),
        }
        self.end_call();
    }

    /// Withdraws the queued `waiter`, which grants nothing (its key still has its holder). A
    /// waiter that does not wait is refused and nothing changes.
    pub fn cancel(&mut self, waiter: WaiterId) {
        self.events.push(JournalEvent::Cancel { waiter });
        match self.find(waiter) {
            Some((key, false)) => {
                let model_key = self.keys.get_mut(&key).expect("a found key");
                model_key.waiters.retain(|queued| *queued != waiter);
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
            .flat_map(|key| key.waiters.iter().copied())
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

    /// Every key's holder, in key order.
    pub fn holders(&self) -> Vec<WaiterId> {
        self.keys.values().filter_map(|key| key.holder).collect()
    }

    /// Holders and waiters, key by key, each key's holder first.
    pub fn live_acquirers(&self) -> Vec<WaiterId> {
        self.keys
            .values()
            .flat_map(|key| key.holder.iter().chain(&key.waiters).copied())
            .collect()
    }

    /// Every id the model has issued, in order of arrival.
    pub fn issued(&self) -> impl Iterator<Item = WaiterId> + '_ {
        (1..self.next_arrival).map(|arrival| WaiterId::new(arrival).expect("counts from 1"))
    }

    /// The key `waiter` holds or waits for, and whether it holds it; `None` once it is gone.
    pub fn find(&self, waiter: WaiterId) -> Option<(u64, bool)> {
        self.keys.iter().find_map(|(key, model_key)| {
            if model_key.holder == Some(waiter) {
                Some((*key, true))
            } else if model_key.waiters.contains(&waiter) {
                Some((*key, false))
            } else {
                None
            }
        })
    }

    /// The waiters queued on `key`, in order of arrival.
    pub fn waiters(&self, key: u64) -> &[WaiterId] {
        self.keys
            .get(&key)
            .map_or(&[], |model_key| &model_key.waiters)
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

    fn arrive(&mut self) -> WaiterId {
        let waiter = WaiterId::new(self.next_arrival).expect("arrivals count from 1");
        self.next_arrival += 1;
        waiter
    }

    fn grant(&mut self, key: u64, waiter: WaiterId) {
        self.keys.entry(key).or_default().holder = Some(waiter);
        self.events.push(JournalEvent::Grant {
            waiter,
            fencing_token: self.next_fencing_token,
        });
        self.next_fencing_token += 1;
    }

    fn refuse(&mut self, waiter: WaiterId, reason: Refusal) {
        self.events.push(JournalEvent::Refused { waiter, reason });
    }

    fn end_call(&mut self) {
        self.calls.push(CallEnd {
            events_end: self.events.len(),
            keys: self.keys.clone(),
            grants: self.next_fencing_token - 1,
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
    let mut table = JournaledTable::<u64, Option<WaiterId>>::with_journal(usize::MAX);
    let mut events_start = 0;
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
        JournalEvent::TryAcquire { key } => {
            // A try-acquire waits for nothing, so it brings no delivery to hand back.
            let _ = table.try_acquire(*key);
        }
        JournalEvent::Release { waiter } => {
            let _ = table.release(*waiter, &mut granted);
        }
        JournalEvent::Cancel { waiter } => {
            if let Ok((key, delivery)) = table.cancel(*waiter, &mut Vec::new())
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
        output => panic!("the model began a call with an output: {output:?} in {events:?}"),
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
    let expected = (
        call.keys
            .values()
            .filter(|key| key.holders_and_waiters() > 0)
            .count(),
        call.keys
            .values()
            .filter(|key| key.holder.is_some())
            .count(),
        call.keys
            .values()
            .map(|key| key.waiters.len())
            .sum::<usize>(),
        call.grants,
    );
    let got = (stats.keys, stats.held, stats.waiting, stats.grants);
    if got != expected {
        return Err(format!(
            "(keys, held, waiting, grants) is {got:?}, the model says {expected:?}"
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
        // Mutual exclusion: the model's one holder holds in the table too.
        if let Some(holder) = model_key.holder
            && (table.key_of(holder) != Some(key) || table.delivery_of(holder).is_some())
        {
            return Err(format!("{holder} does not hold key {key}"));
        }
        for waiter in &model_key.waiters {
            if table.key_of(*waiter) != Some(key) || table.delivery_of(*waiter).is_none() {
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
            JournalEvent::Acquire { waiter, .. } => arrived.push(*waiter),
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
