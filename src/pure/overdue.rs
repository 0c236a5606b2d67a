//! [`Overdue`]: things to look at again a fixed time after they happened, such as a grant to
//! check on once it has been held for a threshold. Pure: the caller passes the time in, as a
//! `Duration` since a start of its choosing.
//!
//! With one fixed delay, an item added later is due later, so a FIFO queue is also a deadline
//! queue: adding is O(1), and finding what is due looks only at the front. Nothing is ever
//! removed early; the caller checks, when an item comes due, whether it still matters (a hold
//! already released is skipped then), so a release costs the queue nothing.

use std::collections::VecDeque;
use std::time::Duration;

/// Items that come due `after` a fixed delay, in the order they were added.
///
/// Invariant: the queue is in order of the times the items were added, so in deadline order.
/// [`add`](Self::add) keeps it by clamping a time earlier than the last one up to it.
#[derive(Debug, Clone)]
pub(crate) struct Overdue<T> {
    after: Duration,
    queue: VecDeque<(Duration, T)>,
}

impl<T> Overdue<T> {
    /// Items come due `after` they are added.
    pub(crate) fn new(after: Duration) -> Self {
        Overdue {
            after,
            queue: VecDeque::new(),
        }
    }

    /// The delay after which an item comes due.
    pub(crate) fn after(&self) -> Duration {
        self.after
    }

    /// Adds `item`, which happened at `now`. A `now` earlier than the last item's (a clock
    /// that went back) counts as the last item's time, so nothing comes due out of order.
    pub(crate) fn add(&mut self, now: Duration, item: T) {
        let at = match self.queue.back() {
            Some(&(last, _)) => now.max(last),
            None => now,
        };
        self.queue.push_back((at, item));
    }

    /// Takes the oldest item if it is due at `now`, with how long ago it happened.
    pub(crate) fn take_due(&mut self, now: Duration) -> Option<(T, Duration)> {
        let &(at, _) = self.queue.front()?;
        let age = now.saturating_sub(at);
        if age < self.after {
            return None;
        }
        self.queue.pop_front().map(|(_, item)| (item, age))
    }

    /// How long after `now` the next item comes due (zero if one is due already); `None`
    /// if there is none.
    pub(crate) fn next_due_in(&self, now: Duration) -> Option<Duration> {
        let &(at, _) = self.queue.front()?;
        Some(at.saturating_add(self.after).saturating_sub(now))
    }

    /// Items added and not yet taken.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    #[test]
    fn an_item_comes_due_exactly_its_delay_after_it_was_added() {
        let mut overdue = Overdue::new(ms(100));
        overdue.add(ms(10), "a");
        assert_eq!(overdue.next_due_in(ms(10)), Some(ms(100)));
        assert_eq!(overdue.take_due(ms(109)), None);
        assert_eq!(overdue.next_due_in(ms(109)), Some(ms(1)));
        assert_eq!(overdue.take_due(ms(110)), Some(("a", ms(100))));
        assert_eq!(overdue.take_due(ms(500)), None);
        assert_eq!(overdue.next_due_in(ms(500)), None);
    }

    #[test]
    fn items_come_due_in_the_order_added_each_once() {
        let mut overdue = Overdue::new(ms(50));
        for (at, item) in [(0, 1), (5, 2), (5, 3), (30, 4)] {
            overdue.add(ms(at), item);
        }
        let mut taken = Vec::new();
        while let Some((item, age)) = overdue.take_due(ms(60)) {
            taken.push((item, age));
        }
        assert_eq!(taken, [(1, ms(60)), (2, ms(55)), (3, ms(55))]);
        assert_eq!(overdue.len(), 1);
        assert_eq!(overdue.next_due_in(ms(60)), Some(ms(20)));
        assert_eq!(overdue.take_due(ms(80)), Some((4, ms(50))));
        assert_eq!(overdue.len(), 0);
    }

    #[test]
    fn a_time_that_goes_back_counts_as_the_last_one() {
        let mut overdue = Overdue::new(ms(10));
        overdue.add(ms(100), "late");
        overdue.add(ms(40), "from a clock that went back");
        assert_eq!(overdue.take_due(ms(109)), None);
        assert_eq!(overdue.take_due(ms(110)), Some(("late", ms(10))));
        assert_eq!(
            overdue.take_due(ms(110)),
            Some(("from a clock that went back", ms(10)))
        );
    }

    #[test]
    fn times_near_the_end_of_duration_saturate() {
        let mut overdue = Overdue::new(Duration::MAX);
        overdue.add(ms(1), ());
        assert_eq!(overdue.take_due(Duration::MAX), None);
        assert_eq!(
            overdue.next_due_in(ms(1)),
            Some(Duration::MAX.saturating_sub(ms(1)))
        );
    }
}
