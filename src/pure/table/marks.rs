//! Time marks: when the table stood at which arrival number and which fencing token.
//!
//! The table reads no clock, and a lock's step is too short to pay for a clock reading in it,
//! so no record keeps the instant it arrived or was granted. Waiter ids count arrivals and
//! tokens count grants, so both order events in time: a mark (the next arrival, the next
//! token, the time) taken now and then dates every id and token around it. A holder whose
//! token lies between two marks was granted between their instants; one granted after the
//! last mark, between it and now. So each duration the view gives is a pair of bounds, exact
//! when a mark was taken at the very event, and as tight as the marks are dense: the runtime
//! takes one at the shard's start, at every view, and every [`MARK_EVERY`] arrivals.
//!
//! # Invariants
//!
//! Checked by `Marks::check`: there is at least one mark (the table's start); marks are in
//! order of time, of arrival and of token (each not decreasing); at most [`MAX_MARKS`].

use std::time::Duration;

use crate::pure::snapshot::DurationBounds;

/// Arrivals after which the runtime takes a mark: often enough that on a busy shard the bounds
/// are tight, rarely enough that the clock reading costs nothing per lock.
pub(crate) const MARK_EVERY: u64 = 256;

/// Marks kept. When full, about half go, those left spread evenly over the table's life (the
/// first and the last stay), so a long hold keeps bounds about as wide as a short one's
/// relative to the table's age, and thinning costs O(1) per mark taken.
pub(crate) const MAX_MARKS: usize = 64;

/// Where the table stood from one instant to another: nothing arrived and nothing was
/// granted between `first_seen` and `last_seen`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mark {
    /// The arrival number of the next acquirer: every waiter id below it arrived before
    /// `first_seen`, every other after `last_seen`.
    next_arrival: u64,
    /// The next fencing token: every token below it was handed out before `first_seen`,
    /// every other after `last_seen`.
    next_token: u64,
    /// Times since the table's start.
    first_seen: Duration,
    last_seen: Duration,
}

/// A table's marks, oldest first.
#[derive(Debug)]
pub(super) struct Marks {
    marks: Vec<Mark>,
    /// The arrival at which the next mark is due ([`MARK_EVERY`] after the last), kept apart
    /// so that the check on every acquire is one comparison.
    due: u64,
}

impl Marks {
    /// The marks of a new table: one at its start, before the first arrival and grant.
    pub(super) fn new() -> Self {
        Marks {
            marks: vec![Mark {
                next_arrival: 1,
                next_token: 1,
                first_seen: Duration::ZERO,
                last_seen: Duration::ZERO,
            }],
            due: 1 + MARK_EVERY,
        }
    }

    /// Whether a mark is due once the next arrival is `next_arrival`.
    #[inline]
    pub(super) fn is_due(&self, next_arrival: u64) -> bool {
        next_arrival >= self.due
    }

    /// Notes that at `at` (time since the table's start) the next arrival is `next_arrival`
    /// and the next token `next_token`. A time before the last mark's is taken as the last
    /// mark's: the clock the caller reads never goes back, and bounds must stay ordered.
    pub(super) fn note(&mut self, next_arrival: u64, next_token: u64, at: Duration) {
        let Some(last) = self.marks.last_mut() else {
            return;
        };
        self.due = next_arrival.saturating_add(MARK_EVERY);
        let at = at.max(last.last_seen);
        if last.next_arrival == next_arrival && last.next_token == next_token {
            // Nothing happened since: what comes next comes after this later instant.
            last.last_seen = at;
            return;
        }
        if self.marks.len() == MAX_MARKS {
            self.thin_out();
        }
        self.marks.push(Mark {
            next_arrival,
            next_token,
            first_seen: at,
            last_seen: at,
        });
    }

    /// How long ago, seen at `now`, the token `token` was handed out.
    pub(super) fn since_token(&self, token: u64, now: Duration) -> DurationBounds {
        self.since(|mark| mark.next_token <= token, now)
    }

    /// How long ago, seen at `now`, the acquirer numbered `arrival` arrived.
    pub(super) fn since_arrival(&self, arrival: u64, now: Duration) -> DurationBounds {
        self.since(|mark| mark.next_arrival <= arrival, now)
    }

    /// Bounds for an event that came after every mark for which `before_event` holds (a
    /// prefix, the marks being ordered) and before the others.
    fn since(&self, before_event: impl Fn(&Mark) -> bool, now: Duration) -> DurationBounds {
        let after = self.marks.partition_point(before_event);
        // The first mark is the table's start, before every event.
        let earliest = after
            .checked_sub(1)
            .and_then(|last_before| self.marks.get(last_before))
            .map_or(Duration::ZERO, |mark| mark.last_seen);
        let latest = self.marks.get(after).map_or(now, |mark| mark.first_seen);
        DurationBounds {
            at_least: now.saturating_sub(latest),
            at_most: now.saturating_sub(earliest),
        }
    }

    /// Keeps marks at least a 32nd of their span apart, so that about half go and those left
    /// are spread evenly in time; the first (the table's start) and the last stay. Each mark
    /// is looked at once per thinning, and a thinning frees about half the room: O(1) per mark
    /// taken.
    fn thin_out(&mut self) {
        let (Some(first), Some(last)) = (self.marks.first(), self.marks.last()) else {
            return;
        };
        let spacing = last.first_seen.saturating_sub(first.last_seen) / (MAX_MARKS as u32 / 2);
        let final_index = self.marks.len() - 1;
        let mut index = 0;
        let mut kept_until: Option<Duration> = None;
        self.marks.retain(|mark| {
            let keep = index == 0
                || index == final_index
                || kept_until.is_none_or(|until| mark.first_seen >= until + spacing);
            if keep {
                kept_until = Some(mark.last_seen);
            }
            index += 1;
            keep
        });
        if self.marks.len() >= MAX_MARKS {
            // All within one instant, or nearly: every other one goes.
            let final_index = self.marks.len() - 1;
            let mut index = 0;
            self.marks.retain(|_| {
                let keep = index % 2 == 0 || index == final_index;
                index += 1;
                keep
            });
        }
    }

    /// Checks the invariants of the [module docs](self).
    #[cfg(any(test, feature = "unstable-table"))]
    pub(super) fn check(&self) -> Result<(), String> {
        if self.marks.is_empty() || self.marks.len() > MAX_MARKS {
            return Err(format!("{} time marks", self.marks.len()));
        }
        for pair in self.marks.windows(2) {
            let (earlier, later) = (pair[0], pair[1]);
            if earlier.first_seen > earlier.last_seen
                || earlier.last_seen > later.first_seen
                || earlier.next_arrival > later.next_arrival
                || earlier.next_token > later.next_token
            {
                return Err(format!("time mark {later:?} after {earlier:?}"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(seconds: u64) -> Duration {
        Duration::from_secs(seconds)
    }

    #[test]
    fn a_token_between_two_marks_is_dated_by_both() {
        let mut marks = Marks::new();
        marks.note(5, 3, secs(10));
        marks.note(9, 7, secs(20));
        // Token 4 was handed out between the marks at 10 s and 20 s.
        let bounds = marks.since_token(4, secs(25));
        assert_eq!((bounds.at_least, bounds.at_most), (secs(5), secs(15)));
        // Token 8, after the last mark: between 20 s and now.
        let bounds = marks.since_token(8, secs(25));
        assert_eq!((bounds.at_least, bounds.at_most), (secs(0), secs(5)));
        // Arrival 2, before the mark at 10 s: between the start and 10 s.
        let bounds = marks.since_arrival(2, secs(25));
        assert_eq!((bounds.at_least, bounds.at_most), (secs(15), secs(25)));
        marks.check().unwrap();
    }

    #[test]
    fn a_mark_with_nothing_new_stretches_the_last_over_both_instants() {
        let mut marks = Marks::new();
        marks.note(2, 2, secs(10));
        marks.note(2, 2, secs(30));
        assert_eq!(marks.marks.len(), 2);
        // Token 1 came before 10 s, token 2 after 30 s.
        let bounds = marks.since_token(1, secs(40));
        assert_eq!((bounds.at_least, bounds.at_most), (secs(30), secs(40)));
        let bounds = marks.since_token(2, secs(40));
        assert_eq!((bounds.at_least, bounds.at_most), (secs(0), secs(10)));
        marks.check().unwrap();
    }

    #[test]
    fn a_clock_that_goes_back_is_held_at_the_last_mark() {
        let mut marks = Marks::new();
        marks.note(2, 2, secs(10));
        marks.note(3, 3, secs(5));
        marks.check().unwrap();
    }

    #[test]
    fn full_marks_thin_out_and_keep_the_start_and_the_last() {
        let mut marks = Marks::new();
        for step in 1..1_000u64 {
            marks.note(step + 1, step + 1, secs(step));
            marks.check().unwrap();
        }
        assert!(marks.marks.len() <= MAX_MARKS);
        assert_eq!(marks.marks[0].last_seen, Duration::ZERO);
        assert_eq!(marks.marks.last().unwrap().first_seen, secs(999));
        // Spread over the whole life, not bunched at one end.
        let widest = marks
            .marks
            .windows(2)
            .map(|pair| pair[1].first_seen - pair[0].last_seen)
            .max()
            .unwrap();
        // No gap wider than an eighth of the life (halving by index left one of 838 s).
        assert!(widest <= secs(125), "widest gap {widest:?}");
    }
}
