//! Journals for the tests, written as Rust: the events in order, numbered from 1.

use std::time::Duration;

use crate::pure::journal::{Journal, JournalEntry, JournalEvent, Refusal, WaiterId};

/// `events` at time 0.
pub(super) fn journal(events: impl IntoIterator<Item = JournalEvent<u64>>) -> Journal<u64> {
    timed(events.into_iter().map(|event| (0, event)))
}

/// `events`, each at its time in milliseconds.
pub(super) fn timed(events: impl IntoIterator<Item = (u64, JournalEvent<u64>)>) -> Journal<u64> {
    let entries = (1..).zip(events).map(|(seq, (at_ms, event))| JournalEntry {
        seq,
        at: Duration::from_millis(at_ms),
        event,
    });
    Journal {
        entries: entries.collect(),
        dropped: 0,
    }
}

pub(super) fn waiter(arrival: u64) -> WaiterId {
    WaiterId::new(arrival).expect("arrival numbers start at 1")
}

/// An exclusive acquire on a table of one permit per key.
pub(super) fn acquire(arrival: u64, key: u64) -> JournalEvent<u64> {
    permits(arrival, key, 1)
}

pub(super) fn permits(arrival: u64, key: u64, permits: u32) -> JournalEvent<u64> {
    JournalEvent::Acquire {
        waiter: waiter(arrival),
        key,
        permits,
    }
}

pub(super) fn try_acquire(key: u64) -> JournalEvent<u64> {
    JournalEvent::TryAcquire { key, permits: 1 }
}

pub(super) fn grant(arrival: u64, fencing_token: u64) -> JournalEvent<u64> {
    JournalEvent::Grant {
        waiter: waiter(arrival),
        fencing_token,
    }
}

pub(super) fn release(arrival: u64) -> JournalEvent<u64> {
    JournalEvent::Release {
        waiter: waiter(arrival),
    }
}

pub(super) fn cancel(arrival: u64) -> JournalEvent<u64> {
    JournalEvent::Cancel {
        waiter: waiter(arrival),
    }
}

pub(super) fn not_waiting(arrival: u64) -> JournalEvent<u64> {
    JournalEvent::Refused {
        waiter: waiter(arrival),
        reason: Refusal::NotWaiting,
    }
}

pub(super) fn closed(arrival: u64) -> JournalEvent<u64> {
    JournalEvent::Closed {
        waiter: waiter(arrival),
    }
}
