//! Where the table keeps one record per acquirer, found by [`WaiterId`] in O(1).
//!
//! Ids are arrival numbers, so most live records are recent ones: a lock is usually released
//! soon after it is taken. The store keeps the records of recent arrivals in a window, a
//! `VecDeque` indexed by `arrival - base`, where inserting is a push at the back and finding is
//! an index. Records that outlive the window (a guard held while many later acquirers come and
//! go) move to a hash map, so the window never grows with the number of arrivals, only with
//! the number of live records.
//!
//! # Invariants
//!
//! Checked by `Records::check`:
//! - The window starts at a live record, or is empty: `window[0]` is never a gap.
//! - The next id issued is `base + window.len()`: every arrival number below `base` is either
//!   gone or in `older`, and every one from `base` on is a window slot.
//! - `window.len() <= 2 * live_in_window + WINDOW_SLACK`: gaps never outnumber live records
//!   by more than the slack, so memory follows the live records.

use std::collections::{HashMap, VecDeque, hash_map};
use std::num::NonZeroU64;

use super::WaiterId;

/// Gaps tolerated in the window beyond its live records before the oldest records move out.
/// Large enough that a short burst of long holds never moves anything.
const WINDOW_SLACK: usize = 64;

/// Why [`Records::remove_if`] removed nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NotRemoved {
    /// No record has the id.
    Absent,
    /// The record is there, and `wanted` turned it down.
    Refused,
}

/// The records of a table, by arrival number.
pub(super) struct Records<R> {
    /// The records of arrivals `base`, `base + 1`, ...; `None` where the record is gone.
    window: VecDeque<Option<R>>,
    /// The arrival number of `window[0]`, or of the next arrival when the window is empty.
    base: NonZeroU64,
    /// Live records in the window.
    live_in_window: usize,
    /// Records of arrivals before `base` that are still live. Ids are issued by the table,
    /// not chosen by callers, so a fixed-seed hasher is safe here.
    older: HashMap<WaiterId, R, foldhash::fast::FixedState>,
}

impl<R> Records<R> {
    pub(super) fn new() -> Self {
        Records {
            window: VecDeque::new(),
            base: NonZeroU64::MIN,
            live_in_window: 0,
            older: HashMap::default(),
        }
    }

    /// Stores `record` under the next arrival number and returns it.
    ///
    /// A `u64` of arrivals does not run out in practice: at a billion acquirers a second it
    /// lasts 584 years.
    #[inline]
    pub(super) fn insert(&mut self, record: R) -> WaiterId {
        let waiter_id = WaiterId(self.base.saturating_add(self.window.len() as u64));
        self.window.push_back(Some(record));
        self.live_in_window += 1;
        waiter_id
    }

    #[inline]
    pub(super) fn get(&self, waiter_id: WaiterId) -> Option<&R> {
        match self.window_index(waiter_id) {
            Some(index) => self.window.get(index)?.as_ref(),
            None => self.older.get(&waiter_id),
        }
    }

    #[inline]
    pub(super) fn get_mut(&mut self, waiter_id: WaiterId) -> Option<&mut R> {
        match self.window_index(waiter_id) {
            Some(index) => self.window.get_mut(index)?.as_mut(),
            None => self.older.get_mut(&waiter_id),
        }
    }

    #[inline]
    pub(super) fn contains(&self, waiter_id: WaiterId) -> bool {
        self.get(waiter_id).is_some()
    }

    /// Removes the record of `waiter_id` if `wanted` accepts it, in one lookup; otherwise
    /// changes nothing and says why.
    #[inline]
    pub(super) fn remove_if(
        &mut self,
        waiter_id: WaiterId,
        wanted: impl FnOnce(&R) -> bool,
    ) -> Result<R, NotRemoved> {
        let Some(index) = self.window_index(waiter_id) else {
            return match self.older.entry(waiter_id) {
                hash_map::Entry::Occupied(older) if wanted(older.get()) => Ok(older.remove()),
                hash_map::Entry::Occupied(_) => Err(NotRemoved::Refused),
                hash_map::Entry::Vacant(_) => Err(NotRemoved::Absent),
            };
        };
        match self.window.get(index) {
            Some(Some(record)) if wanted(record) => {}
            Some(Some(_)) => return Err(NotRemoved::Refused),
            Some(None) | None => return Err(NotRemoved::Absent),
        }
        if index == 0 {
            // The oldest record in the window: the common case of a lock released before
            // later ones. The window starts at a live record, so this one is live.
            let record = self
                .window
                .pop_front()
                .flatten()
                .ok_or(NotRemoved::Absent)?;
            self.base = self.base.saturating_add(1);
            self.live_in_window -= 1;
            self.skip_gaps();
            return Ok(record);
        }
        let record = self
            .window
            .get_mut(index)
            .and_then(Option::take)
            .ok_or(NotRemoved::Absent)?;
        self.live_in_window -= 1;
        self.skip_gaps();
        // A gap in the middle may tip the bound of the module docs; an insert cannot.
        while self.window.len() > 2 * self.live_in_window + WINDOW_SLACK {
            self.move_oldest_out();
        }
        Ok(record)
    }

    /// Removes every record and returns them in order of arrival. Ids keep counting.
    pub(super) fn drain(&mut self) -> Vec<(WaiterId, R)> {
        let base = self.base;
        let next = base.saturating_add(self.window.len() as u64);
        // Every id in `older` is below `base`, so sorted `older` then the window is the order
        // of arrival.
        let mut records: Vec<(WaiterId, R)> = self.older.drain().collect();
        records.sort_unstable_by_key(|(waiter_id, _)| *waiter_id);
        records.extend(
            (0u64..)
                .zip(self.window.drain(..))
                .filter_map(|(offset, record)| {
                    Some((WaiterId(base.saturating_add(offset)), record?))
                }),
        );
        self.base = next;
        self.live_in_window = 0;
        records
    }

    /// The id the next record will get: every live id is below it.
    #[inline]
    pub(super) fn next_arrival(&self) -> u64 {
        self.base.get().saturating_add(self.window.len() as u64)
    }

    /// Every live record, in no particular order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (WaiterId, &R)> {
        let base = self.base;
        let recent = (0u64..)
            .zip(&self.window)
            .filter_map(move |(offset, record)| {
                Some((WaiterId(base.saturating_add(offset)), record.as_ref()?))
            });
        self.older
            .iter()
            .map(|(waiter_id, record)| (*waiter_id, record))
            .chain(recent)
    }

    /// Checks the invariants of the [module docs](self); the error says which one broke.
    #[cfg(any(test, feature = "unstable-table"))]
    pub(super) fn check(&self) -> Result<(), String> {
        if matches!(self.window.front(), Some(None)) {
            return Err("the record window starts with a gap".into());
        }
        let live = self.window.iter().filter(|record| record.is_some()).count();
        if live != self.live_in_window {
            return Err(format!(
                "the record window counts {} live records and holds {live}",
                self.live_in_window
            ));
        }
        if self.window.len() > 2 * live + WINDOW_SLACK {
            return Err(format!(
                "a record window of {} slots for {live} live records",
                self.window.len()
            ));
        }
        if let Some(stray) = self.older.keys().find(|waiter_id| waiter_id.0 >= self.base) {
            return Err(format!("older record {stray} is not older than the window"));
        }
        Ok(())
    }

    /// The window slot of `waiter_id`, or `None` if it arrived before the window.
    #[inline]
    fn window_index(&self, waiter_id: WaiterId) -> Option<usize> {
        let offset = waiter_id.0.get().checked_sub(self.base.get())?;
        usize::try_from(offset).ok()
    }

    /// Moves the oldest half of the window out, live records to `older`, so that the window
    /// can start further on. Each record moves at most once and each gap is dropped once, so
    /// this is O(1) amortized per arrival.
    fn move_oldest_out(&mut self) {
        for _ in 0..self.window.len() / 2 {
            let Some(slot) = self.window.pop_front() else {
                break;
            };
            if let Some(record) = slot {
                self.older.insert(WaiterId(self.base), record);
                self.live_in_window -= 1;
            }
            self.base = self.base.saturating_add(1);
        }
        self.skip_gaps();
    }

    /// Advances the window past the gaps at its start.
    #[inline]
    fn skip_gaps(&mut self) {
        while let Some(None) = self.window.front() {
            self.window.pop_front();
            self.base = self.base.saturating_add(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn checked<R>(records: &Records<R>) -> &Records<R> {
        if let Err(broken) = records.check() {
            panic!("{broken}");
        }
        records
    }

    fn remove<R>(records: &mut Records<R>, waiter_id: WaiterId) -> Option<R> {
        records.remove_if(waiter_id, |_| true).ok()
    }

    #[test]
    fn a_record_turned_down_stays_in_the_window_or_out_of_it() {
        let mut records = Records::new();
        let held = records.insert("held");
        for _ in 0..10_000 {
            let passing = records.insert("passing");
            assert_eq!(remove(&mut records, passing), Some("passing"));
        }
        let recent = records.insert("recent");
        assert!(
            records.window_index(held).is_none() && records.window_index(recent).is_some(),
            "this test needs one record on each side of the window's start"
        );
        for waiter_id in [held, recent] {
            assert_eq!(
                records.remove_if(waiter_id, |_| false),
                Err(NotRemoved::Refused)
            );
            checked(&records);
            assert!(records.contains(waiter_id), "a refusal removes nothing");
            assert!(records.remove_if(waiter_id, |_| true).is_ok());
            assert_eq!(
                records.remove_if(waiter_id, |_| true),
                Err(NotRemoved::Absent)
            );
            checked(&records);
        }
    }

    #[test]
    fn a_long_hold_moves_out_of_the_window_and_stays_found() {
        let mut records = Records::new();
        let held = records.insert("held");
        for round in 0..10_000u64 {
            let passing = records.insert("passing");
            assert_eq!(passing.arrival(), round + 2, "ids count arrivals");
            assert_eq!(remove(&mut records, passing), Some("passing"));
            checked(&records);
        }
        assert!(
            records.window.len() <= WINDOW_SLACK,
            "the window follows the live records"
        );
        assert_eq!(records.older.len(), 1, "the held record moved out");
        assert_eq!(records.get(held), Some(&"held"));
        assert_eq!(remove(&mut records, held), Some("held"));
        assert_eq!(records.get(held), None);
        assert!(records.older.is_empty());
    }

    #[test]
    fn removed_and_unissued_ids_are_not_found() {
        let mut records = Records::new();
        let first = records.insert(1);
        let second = records.insert(2);
        assert_eq!(remove(&mut records, first), Some(1));
        assert_eq!(remove(&mut records, first), None);
        checked(&records);
        assert_eq!(records.get(first), None);
        assert_eq!(records.get_mut(second), Some(&mut 2));
        let unissued = WaiterId::new(3).unwrap();
        assert_eq!(records.get(unissued), None);
        assert!(!records.contains(unissued));
        assert_eq!(remove(&mut records, WaiterId::new(u64::MAX).unwrap()), None);
    }

    #[test]
    fn drain_returns_arrival_order_and_ids_keep_counting() {
        let mut records = Records::new();
        let ids: Vec<WaiterId> = (0..200).map(|n| records.insert(n)).collect();
        // Keep every seventh: enough gaps that the oldest records move out of the window.
        for (n, id) in ids.iter().enumerate() {
            if n % 7 != 0 {
                remove(&mut records, *id);
                checked(&records);
            }
        }
        assert!(
            !records.older.is_empty(),
            "this test needs records on both sides"
        );
        let mut listed: Vec<WaiterId> = records.iter().map(|(id, _)| id).collect();
        listed.sort_unstable();
        let drained = records.drain();
        let drained_ids: Vec<WaiterId> = drained.iter().map(|(id, _)| *id).collect();
        assert_eq!(drained_ids, listed);
        let kept: Vec<i32> = (0..200).filter(|n| n % 7 == 0).collect();
        assert_eq!(
            drained.into_iter().map(|(_, n)| n).collect::<Vec<_>>(),
            kept
        );
        checked(&records);
        assert_eq!(records.insert(-1).arrival(), 201);
    }
}
