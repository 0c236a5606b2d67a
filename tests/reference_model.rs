//! The reference model of the lock table: its rules written as naively as they can be, once,
//! for the tests that check the real table against them (`table_model` on random scripts,
//! `exhaustive_small_scope` on every interleaving of small scenarios).
//!
//! # What the model is
//!
//! A capacity (the permits of each key), a list of holders in order of grant, each with the
//! keys it holds and the permits it holds of each, and a list of waiting requests in order of
//! arrival, each with the keys and permits it asks for; a counter of arrivals (the table's
//! [`WaiterId`]s are arrival numbers) and one of fencing tokens. A request for one key has one
//! key; a request for several keys at once (`acquire_all`) has them all, each once, and asks
//! for every permit of each. There are no per-key queues: a key's queue is the waiting
//! requests that name it, in the order of the one list. A test makes calls on a
//! [`ReferenceModel`] as it would on a table (`acquire`, `acquire_permits`, `acquire_all`,
//! `try_acquire`, `try_acquire_permits`, `try_acquire_all`, `release`, `cancel`, `shutdown`);
//! each call appends to the model's journal the events a correct table records for it (the
//! call, then the grants, would-blocks, closes and refusals it causes) and remembers the
//! model's state after it. Any waiter id can be named, so the model also says how the table
//! refuses a release or cancel that makes no sense.
//!
//! The rules, each in one place below: a request *fits* on a key when the permits that key's
//! holders hold plus the ones it asks for are at most the capacity (an exclusive request, and
//! a request for several keys, asks for all of them). A request is granted at once only if,
//! on every key it asks for, nobody waits and it fits; it queues otherwise, behind everyone
//! who waits, as one request however many keys it names. After a release or a cancel, the
//! waiting requests are gone through once, in order of arrival, and each one is granted if,
//! on every key it asks for, no earlier request still waits and it fits (the holders granted
//! earlier in the same pass included). So on each key the waiters are granted from the front
//! while the front one can be, stopping at the first that cannot (strict FIFO: a big request
//! at the front holds back smaller ones behind it, and its cancel lets through those that now
//! fit), and a request for several keys goes once it is first on all of them. The grants of
//! one call come out in order of arrival, with consecutive fencing tokens. A try-acquire is
//! granted under the same condition as an acquire, and otherwise would block without
//! queueing or taking an id. A set of one key is a plain exclusive request and is recorded as
//! one. With a capacity of 1 and one key per request, these are the rules of a plain lock.
//!
//! # How the table is checked
//!
//! [`check_the_table_against`] judges the real table by the model's journal, three ways:
//!
//! 1. Outputs, through replay: [`keyed_locks::replay::verify`] feeds the journal's inputs to a
//!    fresh table and compares every event. Mutual exclusion, the capacity, FIFO, the waiter
//!    ids, the fencing tokens and their order within a call, the order of closes at shutdown
//!    and every refusal show up here first, as the first event the table records differently,
//!    with its sequence number.
//! 2. State after every call: the same calls made one at a time on a `JournaledTable` of the
//!    model's capacity, the keys of `acquire_all` and `try_acquire_all` as the caller listed
//!    them (duplicates included, so the table's own removal of duplicates and its handling of
//!    a set of one key are checked too). After each call the events the table recorded for it
//!    must be the model's, what the call returned must agree with the model (the key a
//!    release or a cancel returns is the first key of the request), and the table's
//!    `check_invariants()`, `stats()` (keys, held keys, holders, permits held, waiting,
//!    grants), entries (`contains_key`, so no entry without a holder or a waiter and none
//!    missing), holders and waiters (`key_of`, `keys_of`, `delivery_of`, and no record for an
//!    id the model no longer has) must match the model; deliveries come back to the waiter
//!    that brought them, from a grant, a cancel or a close.
//! 3. On the table's own journal: fencing tokens strictly increase, and, if the script ends
//!    with nothing held, every waiter that arrived was granted, cancelled or closed
//!    (liveness), read off the table's events rather than the model's.

use std::collections::{BTreeSet, HashSet};
use std::num::NonZeroU32;
use std::time::Duration;

use keyed_locks::journal::{Journal, JournalEntry, JournalEvent, Refusal};
use keyed_locks::replay::verify;
use keyed_locks::table::JournaledTable;
use keyed_locks::table::{Acquired, KeySet, WaiterId};

/// A holder, with the keys it holds and the permits it holds of each, or a waiting request,
/// with the keys it asks for and the permits it asks for of each.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Request {
    waiter: WaiterId,
    /// One key, or the keys of a request for several at once: each once, in the order the
    /// caller first listed them.
    keys: Vec<u64>,
    permits: u32,
}

impl Request {
    fn names(&self, key: u64) -> bool {
        self.keys.contains(&key)
    }
}

/// Everything the rules talk about, as one call leaves it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct State {
    /// In order of grant.
    holders: Vec<Request>,
    /// In order of arrival.
    waiting: Vec<Request>,
    /// Every key a call named, free ones included, so that a leaked entry is looked for too.
    named: BTreeSet<u64>,
}

impl State {
    /// The permits `key`'s holders hold.
    fn permits_held(&self, key: u64) -> u32 {
        self.holders
            .iter()
            .filter(|holder| holder.names(key))
            .map(|holder| holder.permits)
            .sum()
    }

    /// Whether some request waits for `key`.
    fn is_awaited(&self, key: u64) -> bool {
        self.waiting.iter().any(|request| request.names(key))
    }

    /// Keys with a holder or a waiter: the keys a table has entries for.
    fn keys_in_use(&self) -> BTreeSet<u64> {
        self.holders
            .iter()
            .chain(&self.waiting)
            .flat_map(|request| request.keys.iter().copied())
            .collect()
    }

    /// Keys with a holder.
    fn keys_held(&self) -> BTreeSet<u64> {
        self.holders
            .iter()
            .flat_map(|holder| holder.keys.iter().copied())
            .collect()
    }

    /// `waiter`'s request, and whether it holds; `None` once it is gone.
    fn find(&self, waiter: WaiterId) -> Option<(&Request, bool)> {
        let is_waiter = |request: &&Request| request.waiter == waiter;
        match self.holders.iter().find(is_waiter) {
            Some(holder) => Some((holder, true)),
            None => self
                .waiting
                .iter()
                .find(is_waiter)
                .map(|request| (request, false)),
        }
    }
}

/// Where one call's events end in the journal, and the model as the call left it.
#[derive(Debug, Clone)]
struct CallEnd {
    events_end: usize,
    state: State,
    /// The arrival number the next acquirer would get: every id below it was issued.
    next_arrival: u64,
    grants: u64,
    /// For `acquire_all` and `try_acquire_all`, the keys as the caller listed them,
    /// duplicates included: the journal has them without duplicates.
    listed: Option<Vec<u64>>,
}

/// The deliberately naive reference: see the [module docs](self).
#[derive(Debug, Clone)]
pub struct ReferenceModel {
    /// The permits of each key; an exclusive request asks for all of them.
    capacity: u32,
    state: State,
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
            state: State::default(),
            next_arrival: 1,
            next_fencing_token: 1,
            events,
            calls: Vec::new(),
        }
    }

    /// Asks for every permit of `key` (an exclusive lock) and returns the acquirer's id.
    pub fn acquire(&mut self, key: u64) -> WaiterId {
        let waiter = self.arrival_id();
        self.events.push(JournalEvent::Acquire {
            waiter,
            key,
            permits: self.capacity,
        });
        self.grant_or_queue(vec![key], self.capacity);
        self.end_call(None);
        waiter
    }

    /// Asks for `permits` of `key`'s permits (1 is a shared lock) and returns the acquirer's
    /// id.
    pub fn acquire_permits(&mut self, key: u64, permits: u32) -> WaiterId {
        self.assert_takes(permits);
        let waiter = self.arrival_id();
        self.events.push(JournalEvent::Acquire {
            waiter,
            key,
            permits,
        });
        self.grant_or_queue(vec![key], permits);
        self.end_call(None);
        waiter
    }

    /// Asks for every permit of every key of `listed`, all at once, and returns the
    /// acquirer's id: one request however many keys, recorded as a plain `acquire` if
    /// `listed` names one key only.
    pub fn acquire_all(&mut self, listed: &[u64]) -> WaiterId {
        let keys = distinct(listed);
        let waiter = self.arrival_id();
        self.events.push(match keys[..] {
            [key] => JournalEvent::Acquire {
                waiter,
                key,
                permits: self.capacity,
            },
            _ => JournalEvent::AcquireAll {
                waiter,
                keys: keys.clone(),
            },
        });
        self.grant_or_queue(keys, self.capacity);
        self.end_call(Some(listed.to_vec()));
        waiter
    }

    /// Takes every permit of `key` if it can be granted now; the new holder's id, or `None`
    /// (a would-block, which names nobody).
    pub fn try_acquire(&mut self, key: u64) -> Option<WaiterId> {
        self.events.push(JournalEvent::TryAcquire {
            key,
            permits: self.capacity,
        });
        let taken = self.grant_or_refuse(vec![key], self.capacity);
        self.end_call(None);
        taken
    }

    /// Takes `permits` of `key`'s permits if they can be granted now; the new holder's id, or
    /// `None` (a would-block).
    pub fn try_acquire_permits(&mut self, key: u64, permits: u32) -> Option<WaiterId> {
        self.assert_takes(permits);
        self.events.push(JournalEvent::TryAcquire { key, permits });
        let taken = self.grant_or_refuse(vec![key], permits);
        self.end_call(None);
        taken
    }

    /// Takes every permit of every key of `listed` if all can be granted now; the new
    /// holder's id, or `None` (a would-block). Recorded as a plain `try_acquire` if `listed`
    /// names one key only.
    pub fn try_acquire_all(&mut self, listed: &[u64]) -> Option<WaiterId> {
        let keys = distinct(listed);
        self.events.push(match keys[..] {
            [key] => JournalEvent::TryAcquire {
                key,
                permits: self.capacity,
            },
            _ => JournalEvent::TryAcquireAll { keys: keys.clone() },
        });
        let taken = self.grant_or_refuse(keys, self.capacity);
        self.end_call(Some(listed.to_vec()));
        taken
    }

    /// Releases `waiter`'s hold on all its keys and grants what can now be granted. A waiter
    /// that does not hold is refused and nothing changes.
    pub fn release(&mut self, waiter: WaiterId) {
        self.events.push(JournalEvent::Release { waiter });
        match self.state.find(waiter) {
            Some((_, true)) => {
                self.state.holders.retain(|holder| holder.waiter != waiter);
                self.grant_in_order_of_arrival();
            }
            Some((_, false)) => self.refuse(waiter, Refusal::NotHolding),
            None => self.refuse(waiter, Refusal::Unknown),
        }
        self.end_call(None);
    }

    /// Withdraws the queued `waiter` from all its keys and grants what can now be granted: if
    /// `waiter` was a big request at the front, or a request for several keys that was not
    /// first on all of them, the ones behind it that can go now go through. A waiter that
    /// does not wait is refused and nothing changes.
    pub fn cancel(&mut self, waiter: WaiterId) {
        self.events.push(JournalEvent::Cancel { waiter });
        match self.state.find(waiter) {
            Some((_, false)) => {
                self.state.waiting.retain(|queued| queued.waiter != waiter);
                self.grant_in_order_of_arrival();
            }
            Some((_, true)) => self.refuse(waiter, Refusal::NotWaiting),
            None => self.refuse(waiter, Refusal::Unknown),
        }
        self.end_call(None);
    }

    /// Closes every waiting request once, in order of arrival, and forgets every hold.
    pub fn shutdown(&mut self) {
        self.events.push(JournalEvent::Shutdown);
        let mut waiting: Vec<WaiterId> = self
            .state
            .waiting
            .iter()
            .map(|request| request.waiter)
            .collect();
        waiting.sort_unstable();
        self.events.extend(
            waiting
                .into_iter()
                .map(|waiter| JournalEvent::Closed { waiter }),
        );
        self.state.holders.clear();
        self.state.waiting.clear();
        self.end_call(None);
    }

    /// Grants so far: the last fencing token handed out.
    pub fn grants(&self) -> u64 {
        self.next_fencing_token - 1
    }

    /// Every holder once, by its first key, those of one first key in order of grant.
    pub fn holders(&self) -> Vec<WaiterId> {
        let mut holders: Vec<&Request> = self.state.holders.iter().collect();
        holders.sort_by_key(|holder| holder.keys[0]);
        holders.into_iter().map(|holder| holder.waiter).collect()
    }

    /// Holders and waiters, by first key, those of one first key holders first (in order of
    /// grant), then waiters (in order of arrival).
    pub fn live_acquirers(&self) -> Vec<WaiterId> {
        let holders = self.state.holders.iter().map(|holder| (holder, 0));
        let waiting = self.state.waiting.iter().map(|queued| (queued, 1));
        let mut live: Vec<(&Request, u8)> = holders.chain(waiting).collect();
        live.sort_by_key(|(request, kind)| (request.keys[0], *kind));
        live.into_iter()
            .map(|(request, _)| request.waiter)
            .collect()
    }

    /// Every id the model has issued, in order of arrival.
    pub fn issued(&self) -> impl Iterator<Item = WaiterId> + '_ {
        (1..self.next_arrival).map(|arrival| WaiterId::new(arrival).expect("counts from 1"))
    }

    /// The keys `waiter` holds or waits for, and whether it holds them; `None` once it is
    /// gone.
    pub fn find(&self, waiter: WaiterId) -> Option<(&[u64], bool)> {
        self.state
            .find(waiter)
            .map(|(request, holds)| (&request.keys[..], holds))
    }

    /// The holders of `key`, in order of grant.
    pub fn holders_of(&self, key: u64) -> Vec<WaiterId> {
        self.state
            .holders
            .iter()
            .filter(|holder| holder.names(key))
            .map(|holder| holder.waiter)
            .collect()
    }

    /// The requests waiting for `key`, in order of arrival: the key's queue.
    pub fn waiters(&self, key: u64) -> Vec<WaiterId> {
        self.state
            .waiting
            .iter()
            .filter(|queued| queued.names(key))
            .map(|queued| queued.waiter)
            .collect()
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

    fn assert_takes(&self, permits: u32) {
        assert!(
            (1..=self.capacity).contains(&permits),
            "{permits} permits of {}: the table refuses to make that request",
            self.capacity
        );
    }

    /// The id of the acquirer arriving now.
    fn arrival_id(&self) -> WaiterId {
        WaiterId::new(self.next_arrival).expect("arrivals count from 1")
    }

    /// Whether `permits` more fit beside the holders of each of `keys`.
    fn fits_on_each(&self, keys: &[u64], permits: u32) -> bool {
        keys.iter()
            .all(|&key| self.state.permits_held(key) + permits <= self.capacity)
    }

    /// Whether a request for `permits` of each of `keys` is granted at once: nobody waits
    /// for any of them, and it fits on each.
    fn grantable_now(&self, keys: &[u64], permits: u32) -> bool {
        keys.iter().all(|&key| !self.state.is_awaited(key)) && self.fits_on_each(keys, permits)
    }

    /// An acquire: the new acquirer holds `keys` if it can be granted now, and queues last
    /// otherwise.
    fn grant_or_queue(&mut self, keys: Vec<u64>, permits: u32) {
        self.state.named.extend(keys.iter().copied());
        let granted_now = self.grantable_now(&keys, permits);
        let request = Request {
            waiter: self.arrive(),
            keys,
            permits,
        };
        if granted_now {
            self.grant(request);
        } else {
            self.state.waiting.push(request);
        }
    }

    /// A try-acquire: the new holder's id if it can be granted now; a would-block, which takes
    /// no id, otherwise.
    fn grant_or_refuse(&mut self, keys: Vec<u64>, permits: u32) -> Option<WaiterId> {
        self.state.named.extend(keys.iter().copied());
        if self.grantable_now(&keys, permits) {
            let waiter = self.arrive();
            self.grant(Request {
                waiter,
                keys,
                permits,
            });
            Some(waiter)
        } else {
            self.events.push(match keys[..] {
                [key] => JournalEvent::WouldBlock { key },
                _ => JournalEvent::WouldBlockAll,
            });
            None
        }
    }

    /// After a release or a cancel: goes through the waiting requests once, in order of
    /// arrival, and grants each one that no earlier waiting request shares a key with and
    /// that fits on each of its keys beside the holders so far. The ones left wait on, in
    /// the same order.
    fn grant_in_order_of_arrival(&mut self) {
        let mut still_waiting: Vec<Request> = Vec::new();
        for request in std::mem::take(&mut self.state.waiting) {
            let first_on_each = request
                .keys
                .iter()
                .all(|&key| !still_waiting.iter().any(|earlier| earlier.names(key)));
            if first_on_each && self.fits_on_each(&request.keys, request.permits) {
                self.grant(request);
            } else {
                still_waiting.push(request);
            }
        }
        self.state.waiting = still_waiting;
    }

    fn arrive(&mut self) -> WaiterId {
        let waiter = self.arrival_id();
        self.next_arrival += 1;
        waiter
    }

    fn grant(&mut self, request: Request) {
        self.events.push(JournalEvent::Grant {
            waiter: request.waiter,
            fencing_token: self.next_fencing_token,
        });
        self.next_fencing_token += 1;
        self.state.holders.push(request);
    }

    fn refuse(&mut self, waiter: WaiterId, reason: Refusal) {
        self.events.push(JournalEvent::Refused { waiter, reason });
    }

    fn end_call(&mut self, listed: Option<Vec<u64>>) {
        // The model's own rules, so that a slip in it cannot pass for a finding about the
        // table: never more permits held than a key has, and never a waiting request that is
        // first on each of its keys and fits on each.
        for &key in &self.state.named {
            assert!(
                self.state.permits_held(key) <= self.capacity,
                "the model holds {} permits of key {key}",
                self.state.permits_held(key)
            );
        }
        for (index, request) in self.state.waiting.iter().enumerate() {
            let earlier = &self.state.waiting[..index];
            let first_on_each = request
                .keys
                .iter()
                .all(|&key| !earlier.iter().any(|queued| queued.names(key)));
            assert!(
                !(first_on_each && self.fits_on_each(&request.keys, request.permits)),
                "the model left {} waiting for {:?} though it can be granted",
                request.waiter,
                request.keys
            );
        }
        self.calls.push(CallEnd {
            events_end: self.events.len(),
            state: self.state.clone(),
            next_arrival: self.next_arrival,
            grants: self.grants(),
            listed,
        });
    }
}

/// The distinct keys of `listed`, in order of first appearance: the set a request for
/// several keys asks for.
fn distinct(listed: &[u64]) -> Vec<u64> {
    let mut keys = Vec::new();
    for &key in listed {
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    assert!(
        !keys.is_empty(),
        "a request for no key: the table refuses to make it"
    );
    keys
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
    let empty = State::default();
    let mut before = &empty;
    for (index, call) in model.calls.iter().enumerate() {
        let input = &model.events[events_start];
        let events = &model.events[events_start..call.events_end];
        feed(&mut table, input, call.listed.as_deref(), before)
            .and_then(|()| check_recorded(&table, events_start, events))
            .and_then(|()| check_state(&table, call))
            .map_err(|failure| {
                format!(
                    "call {index} (`{}`): {failure}",
                    trace_lines(std::iter::once(input))
                )
            })?;
        events_start = call.events_end;
        before = &call.state;
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
            let never_granted: Vec<String> =
                never_granted.iter().map(WaiterId::to_string).collect();
            return Err(format!(
                "{never_granted:?} waited, were neither cancelled nor closed, and were never \
                 granted, though nothing is held"
            ));
        }
    }
    Ok(())
}

/// Makes the call `input` names on `table`, and checks what it returns: every delivery the
/// table hands back (in a grant, a cancel or a close) is the one its waiter brought, and a
/// release or a cancel that succeeds returns the first key of the request, as `before` (the
/// model before the call) has it. An acquire brings the id the model expects the table to
/// give it; `listed`, if given, are the keys of an `acquire_all` or a `try_acquire_all` as the
/// caller listed them, and the call is made that way even for a set of one key.
fn feed(
    table: &mut JournaledTable<u64, Option<WaiterId>>,
    input: &JournalEvent<u64>,
    listed: Option<&[u64]>,
    before: &State,
) -> Result<(), String> {
    let key_set = |listed: &[u64]| {
        KeySet::new(listed.iter().copied())
            .ok_or_else(|| format!("KeySet::new refused the keys {listed:?}"))
    };
    let mut granted = Vec::new();
    match (input, listed) {
        (
            JournalEvent::Acquire { waiter, .. } | JournalEvent::AcquireAll { waiter, .. },
            Some(listed),
        ) => {
            if let Acquired::Granted(grant) = table.acquire_all(key_set(listed)?, Some(*waiter)) {
                granted.push(grant);
            }
        }
        // A try-acquire waits for nothing, so it brings no delivery to hand back.
        (JournalEvent::TryAcquire { .. } | JournalEvent::TryAcquireAll { .. }, Some(listed)) => {
            let _ = table.try_acquire_all(key_set(listed)?);
        }
        (
            JournalEvent::Acquire {
                waiter,
                key,
                permits,
            },
            None,
        ) => {
            let permits = table
                .table()
                .permits(*permits)
                .map_err(|error| error.to_string())?;
            if let Acquired::Granted(grant) = table.acquire(*key, permits, Some(*waiter)) {
                granted.push(grant);
            }
        }
        (JournalEvent::TryAcquire { key, permits }, None) => {
            let permits = table
                .table()
                .permits(*permits)
                .map_err(|error| error.to_string())?;
            let _ = table.try_acquire(*key, permits);
        }
        (JournalEvent::Release { waiter }, None) => {
            let released = table.release(*waiter, &mut granted).ok();
            let expected = before
                .find(*waiter)
                .filter(|(_, holds)| *holds)
                .map(|(holder, _)| holder.keys[0]);
            if released != expected {
                return Err(format!(
                    "the release of {waiter} returned key {released:?}, the model expects \
                     {expected:?}"
                ));
            }
        }
        (JournalEvent::Cancel { waiter }, None) => {
            let cancelled = table.cancel(*waiter, &mut granted).ok();
            let expected = before
                .find(*waiter)
                .filter(|(_, holds)| !*holds)
                .map(|(queued, _)| (queued.keys[0], Some(*waiter)));
            if cancelled != expected {
                return Err(format!(
                    "the cancel of {waiter} returned (key, delivery) {cancelled:?}, the model \
                     expects {expected:?}"
                ));
            }
        }
        (JournalEvent::Shutdown, None) => {
            for (waiter, delivery) in table.shutdown() {
                if delivery != Some(waiter) {
                    return Err(format!("closing {waiter} handed back {delivery:?}"));
                }
            }
        }
        (other, listed) => {
            panic!("the model began a call with {other:?} (keys listed: {listed:?}), not a call")
        }
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

/// The events `table` recorded from index `start` on must be `expected`: the model's events
/// for the call just made, so the table's grants, tokens and refusals for the keys as the
/// caller listed them are the model's.
fn check_recorded(
    table: &JournaledTable<u64, Option<WaiterId>>,
    start: usize,
    expected: &[JournalEvent<u64>],
) -> Result<(), String> {
    let journal = table.journal();
    let recorded: Vec<&JournalEvent<u64>> = journal
        .entries
        .iter()
        .skip(start)
        .map(|entry| &entry.event)
        .collect();
    if recorded.iter().copied().ne(expected) {
        return Err(format!(
            "the table recorded `{}`, the model expects `{}`",
            trace_lines(recorded),
            trace_lines(expected)
        ));
    }
    Ok(())
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
    let state = &call.state;
    let keys_in_use = state.keys_in_use();
    let stats = table.stats();
    let expected = (
        keys_in_use.len(),
        state.keys_held().len(),
        state.holders.len(),
        state
            .holders
            .iter()
            .map(|holder| holder.permits as usize * holder.keys.len())
            .sum::<usize>(),
        state.waiting.len(),
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
    for key in &state.named {
        // No entry without a holder or a waiter, and none missing.
        if table.contains_key(key) != keys_in_use.contains(key) {
            return Err(format!(
                "key {key} has an entry: {}, but a holder or a waiter: {}",
                table.contains_key(key),
                keys_in_use.contains(key)
            ));
        }
    }
    // The model's holders and waiters, with their keys, and only they, are live in the table.
    for holder in &state.holders {
        let id = holder.waiter;
        if table.keys_of(id) != Some(&holder.keys[..])
            || table.key_of(id) != Some(&holder.keys[0])
            || table.delivery_of(id).is_some()
        {
            return Err(format!(
                "{id} does not hold exactly {:?}: the table has {:?}",
                holder.keys,
                table.keys_of(id)
            ));
        }
    }
    for queued in &state.waiting {
        let id = queued.waiter;
        if table.keys_of(id) != Some(&queued.keys[..])
            || table.key_of(id) != Some(&queued.keys[0])
            || table.delivery_of(id) != Some(&Some(id))
        {
            return Err(format!(
                "{id} is not waiting for exactly {:?}: the table has {:?}",
                queued.keys,
                table.keys_of(id)
            ));
        }
    }
    for arrival in 1..call.next_arrival {
        let id = WaiterId::new(arrival).expect("arrivals count from 1");
        if state.find(id).is_none() && table.keys_of(id).is_some() {
            return Err(format!(
                "{id} is gone, but the table still has it on {:?}",
                table.keys_of(id)
            ));
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
            JournalEvent::Acquire { waiter, .. } | JournalEvent::AcquireAll { waiter, .. } => {
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

/// Events on one line, short, for failure messages: `acquire w1 1 0; grant w1 1` (an
/// acquire shows its waiter, its permits and its key).
pub fn trace_lines<'a>(events: impl IntoIterator<Item = &'a JournalEvent<u64>>) -> String {
    let keys = |keys: &[u64]| {
        let listed: Vec<String> = keys.iter().map(|key| format!(" | {key}")).collect();
        format!("{}{}", keys.len(), listed.concat())
    };
    let line = |event: &JournalEvent<u64>| match event {
        JournalEvent::Acquire {
            waiter,
            key,
            permits,
        } => format!("acquire {waiter} {permits} {key}"),
        JournalEvent::TryAcquire { key, permits } => format!("try_acquire {permits} {key}"),
        JournalEvent::AcquireAll { waiter, keys: all } => {
            format!("acquire_all {waiter} {}", keys(all))
        }
        JournalEvent::TryAcquireAll { keys: all } => format!("try_acquire_all {}", keys(all)),
        JournalEvent::Capacity { permits } => format!("capacity {permits}"),
        JournalEvent::Release { waiter } => format!("release {waiter}"),
        JournalEvent::Cancel { waiter } => format!("cancel {waiter}"),
        JournalEvent::Grant {
            waiter,
            fencing_token,
        } => format!("grant {waiter} {fencing_token}"),
        JournalEvent::WouldBlock { key } => format!("would_block {key}"),
        JournalEvent::Closed { waiter } => format!("closed {waiter}"),
        JournalEvent::Refused { waiter, reason } => {
            let reason = match reason {
                Refusal::Unknown => "unknown",
                Refusal::NotHolding => "not_holding",
                Refusal::NotWaiting => "not_waiting",
                _ => "other",
            };
            format!("refused {waiter} {reason}")
        }
        JournalEvent::Shutdown => "shutdown".to_owned(),
        JournalEvent::WouldBlockAll => "would_block_all".to_owned(),
        other => format!("{other:?}"),
    };
    let lines: Vec<String> = events.into_iter().map(line).collect();
    lines.join("; ")
}
