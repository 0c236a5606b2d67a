//! From a journal to what the picture shows: one lane per key, with its holds and its waits as
//! bars between two moments.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::Duration;

use crate::pure::journal::{Journal, JournalEvent, WaiterId};

/// A point of the journal: its sequence number and its time since the registry started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Moment {
    pub(super) seq: u64,
    pub(super) at: Duration,
}

/// What a bar shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BarKind {
    /// The waiter held the key under this token.
    Hold { fencing_token: u64 },
    /// The waiter was queued.
    Wait,
}

/// How a bar ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ending {
    /// A wait that ended in a grant.
    Granted,
    /// A hold that ended in a release.
    Released,
    /// A wait the waiter gave up.
    Cancelled,
    /// A wait, or a hold, ended by the registry's shutdown.
    Shutdown,
    /// Still going when the journal ends.
    Open,
}

/// One hold or one wait of one waiter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Bar {
    pub(super) waiter: WaiterId,
    pub(super) kind: BarKind,
    pub(super) start: Moment,
    pub(super) end: Moment,
    pub(super) ending: Ending,
}

/// One key: its holds on one row, its waits packed on as few rows as do not overlap.
#[derive(Debug, Clone, Default)]
pub(super) struct Lane {
    /// The key as its `Debug` writes it.
    pub(super) key: String,
    pub(super) holds: Vec<Bar>,
    pub(super) wait_rows: Vec<Vec<Bar>>,
}

/// Everything to draw, before it is placed on an axis.
#[derive(Debug, Clone)]
pub(super) struct Layout {
    /// In order of the keys' first appearance in the journal.
    pub(super) lanes: Vec<Lane>,
    pub(super) shutdowns: Vec<Moment>,
    pub(super) first: Moment,
    pub(super) last: Moment,
    /// Events the journal lost before its first entry (see `Journal::dropped`).
    pub(super) dropped: u64,
}

impl Layout {
    /// The number of bars, holds and waits.
    pub(super) fn bar_count(&self) -> usize {
        self.lanes
            .iter()
            .map(|lane| lane.holds.len() + lane.wait_rows.iter().map(Vec::len).sum::<usize>())
            .sum()
    }

    /// What is drawn, in words: "1 key, 2 holds, 1 wait".
    pub(super) fn counts(&self) -> String {
        let holds: usize = self.lanes.iter().map(|lane| lane.holds.len()).sum();
        let waits = self.bar_count() - holds;
        let plural = |count: usize, noun: &str| match count {
            1 => format!("1 {noun}"),
            _ => format!("{count} {noun}s"),
        };
        format!(
            "{}, {}, {}",
            plural(self.lanes.len(), "key"),
            plural(holds, "hold"),
            plural(waits, "wait")
        )
    }
}

/// An acquirer between the event that started its current bar and the one that ends it.
struct Open {
    lane: usize,
    since: Moment,
    kind: BarKind,
}

/// Turns `journal` into lanes, naming each key by its `Debug`.
///
/// The journal is read as it is, not checked: an event about a waiter the journal never
/// showed arriving (it arrived before the oldest retained event, or the trace was edited)
/// draws nothing, and a refused call draws nothing either, since it changed nothing.
pub(super) fn layout_of<K: fmt::Debug>(journal: &Journal<K>) -> Layout {
    let mut lanes: Vec<Lane> = Vec::new();
    // By label, so that the key type needs no `Hash` or `Eq`: keys that print alike share a
    // lane, which is what a reader of the picture would take them for anyway.
    let mut lane_of_key: HashMap<String, usize> = HashMap::new();
    let mut lane_index = |key: &K| {
        let label = format!("{key:?}");
        *lane_of_key.entry(label.clone()).or_insert_with(|| {
            lanes.push(Lane {
                key: label,
                ..Lane::default()
            });
            lanes.len() - 1
        })
    };
    // Ordered by id so that bars still open at the end come out in the same order every run.
    let mut open: BTreeMap<WaiterId, Open> = BTreeMap::new();
    let mut bars: Vec<(usize, Bar)> = Vec::new();
    let mut shutdowns = Vec::new();
    // A try_acquire's grant names a waiter that never arrived: the key is the try's.
    let mut try_acquire_lane = None;
    let close = |bars: &mut Vec<(usize, Bar)>, waiter, open: Open, end, ending| {
        bars.push((
            open.lane,
            Bar {
                waiter,
                kind: open.kind,
                start: open.since,
                end,
                ending,
            },
        ));
    };

    for entry in &journal.entries {
        let now = Moment {
            seq: entry.seq,
            at: entry.at,
        };
        let pending_try = try_acquire_lane.take();
        match &entry.event {
            // A shared lock or a permit request is drawn as a lock is; holders that share a
            // key overlap on its lane.
            JournalEvent::Acquire { waiter, key, .. } => {
                let lane = lane_index(key);
                open.insert(
                    *waiter,
                    Open {
                        lane,
                        since: now,
                        kind: BarKind::Wait,
                    },
                );
            }
            JournalEvent::TryAcquire { key, .. } => try_acquire_lane = Some(lane_index(key)),
            JournalEvent::Grant {
                waiter,
                fencing_token,
            } => {
                let hold = BarKind::Hold {
                    fencing_token: *fencing_token,
                };
                let lane = match open.remove(waiter) {
                    Some(wait) if wait.kind == BarKind::Wait => {
                        let lane = wait.lane;
                        // A grant right after its acquire found the key free: no wait to draw.
                        if wait.since.seq.checked_add(1) != Some(now.seq) {
                            close(&mut bars, *waiter, wait, now, Ending::Granted);
                        }
                        Some(lane)
                    }
                    // A grant to a holder makes no sense; keep the hold it had.
                    Some(holding) => {
                        open.insert(*waiter, holding);
                        None
                    }
                    None => pending_try,
                };
                if let Some(lane) = lane {
                    open.insert(
                        *waiter,
                        Open {
                            lane,
                            since: now,
                            kind: hold,
                        },
                    );
                }
            }
            JournalEvent::Release { waiter } => {
                if let Some(holding) = open.remove(waiter) {
                    if matches!(holding.kind, BarKind::Hold { .. }) {
                        close(&mut bars, *waiter, holding, now, Ending::Released);
                    } else {
                        // Releasing a queued waiter is refused: it goes on waiting.
                        open.insert(*waiter, holding);
                    }
                }
            }
            JournalEvent::Cancel { waiter } => {
                if let Some(waiting) = open.remove(waiter) {
                    if waiting.kind == BarKind::Wait {
                        close(&mut bars, *waiter, waiting, now, Ending::Cancelled);
                    } else {
                        // Cancelling a holder is refused: it goes on holding.
                        open.insert(*waiter, waiting);
                    }
                }
            }
            JournalEvent::Shutdown => {
                shutdowns.push(now);
                // Holders are forgotten now; waiters get a `closed` event each, next.
                let holders: Vec<WaiterId> = open
                    .iter()
                    .filter(|(_, bar)| bar.kind != BarKind::Wait)
                    .map(|(waiter, _)| *waiter)
                    .collect();
                for waiter in holders {
                    if let Some(holding) = open.remove(&waiter) {
                        close(&mut bars, waiter, holding, now, Ending::Shutdown);
                    }
                }
            }
            JournalEvent::Closed { waiter } => {
                if let Some(waiting) = open.remove(waiter) {
                    close(&mut bars, *waiter, waiting, now, Ending::Shutdown);
                }
            }
            // Would-blocks and refusals change nothing; later kinds of event are not drawn.
            _ => {}
        }
    }

    let zero = Moment {
        seq: journal.dropped,
        at: Duration::ZERO,
    };
    let first = journal.entries.first().map_or(zero, |entry| Moment {
        seq: entry.seq,
        at: entry.at,
    });
    let last = journal.entries.last().map_or(zero, |entry| Moment {
        seq: entry.seq,
        at: entry.at,
    });
    for (waiter, still_open) in std::mem::take(&mut open) {
        close(&mut bars, waiter, still_open, last, Ending::Open);
    }

    bars.sort_by_key(|(_, bar)| (bar.start.seq, bar.end.seq));
    for (lane, bar) in bars {
        match bar.kind {
            BarKind::Hold { .. } => lanes[lane].holds.push(bar),
            BarKind::Wait => place_wait(&mut lanes[lane].wait_rows, bar),
        }
    }
    Layout {
        lanes,
        shutdowns,
        first,
        last,
        dropped: journal.dropped,
    }
}

/// Puts `bar` on the first row where it overlaps nothing, or on a new row. Bars arrive sorted
/// by start, so this packs as tightly as possible.
fn place_wait(rows: &mut Vec<Vec<Bar>>, bar: Bar) {
    let free_row = rows
        .iter_mut()
        .find(|row| row.last().is_none_or(|last| last.end.seq < bar.start.seq));
    match free_row {
        Some(row) => row.push(bar),
        None => rows.push(vec![bar]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::script::*;

    fn layout(journal: Journal<u64>) -> Layout {
        layout_of(&journal)
    }

    fn shape(bars: &[Bar]) -> Vec<(BarKind, u64, u64, Ending)> {
        bars.iter()
            .map(|bar| (bar.kind, bar.start.seq, bar.end.seq, bar.ending))
            .collect()
    }

    const HOLD_1: BarKind = BarKind::Hold { fencing_token: 1 };
    const HOLD_2: BarKind = BarKind::Hold { fencing_token: 2 };

    #[test]
    fn a_wait_runs_from_arrival_to_grant_and_a_hold_from_grant_to_release() {
        let layout = layout(timed([
            (0, acquire(1, 42)),
            (0, grant(1, 1)),
            (10, acquire(2, 42)),
            (500, release(1)),
            (500, grant(2, 2)),
            (1000, release(2)),
        ]));
        assert_eq!(layout.lanes.len(), 1);
        let lane = &layout.lanes[0];
        assert_eq!(lane.key, "42");
        assert_eq!(
            shape(&lane.holds),
            [
                (HOLD_1, 2, 4, Ending::Released),
                (HOLD_2, 5, 6, Ending::Released)
            ]
        );
        assert_eq!(lane.wait_rows.len(), 1);
        assert_eq!(
            shape(&lane.wait_rows[0]),
            [(BarKind::Wait, 3, 5, Ending::Granted)]
        );
        assert_eq!(lane.wait_rows[0][0].end.at, Duration::from_millis(500));
    }

    #[test]
    fn shared_holders_and_permit_requests_are_drawn_as_locks_are() {
        let layout = layout(timed([
            (0, JournalEvent::Capacity { permits: 2 }),
            (0, permits(1, 42, 1)),
            (0, grant(1, 1)),
            (0, try_acquire(42)),
            (0, grant(2, 2)),
            (500, release(1)),
            (1000, release(2)),
        ]));
        assert_eq!(layout.lanes.len(), 1);
        assert_eq!(
            shape(&layout.lanes[0].holds),
            [
                (HOLD_1, 3, 6, Ending::Released),
                (HOLD_2, 5, 7, Ending::Released)
            ]
        );
    }

    #[test]
    fn a_cancelled_wait_ends_at_the_cancel_and_a_refused_cancel_ends_nothing() {
        let layout = layout(journal([
            acquire(1, 7),
            grant(1, 1),
            acquire(2, 7),
            cancel(1),
            not_waiting(1),
            cancel(2),
            release(1),
        ]));
        let lane = &layout.lanes[0];
        assert_eq!(shape(&lane.holds), [(HOLD_1, 2, 7, Ending::Released)]);
        assert_eq!(
            shape(&lane.wait_rows[0]),
            [(BarKind::Wait, 3, 6, Ending::Cancelled)]
        );
    }

    #[test]
    fn shutdown_ends_holds_and_closes_waits() {
        let layout = layout(journal([
            acquire(1, 7),
            grant(1, 1),
            acquire(2, 7),
            JournalEvent::Shutdown,
            closed(2),
        ]));
        let lane = &layout.lanes[0];
        assert_eq!(shape(&lane.holds), [(HOLD_1, 2, 4, Ending::Shutdown)]);
        assert_eq!(
            shape(&lane.wait_rows[0]),
            [(BarKind::Wait, 3, 5, Ending::Shutdown)]
        );
        assert_eq!(layout.shutdowns.len(), 1);
    }

    #[test]
    fn a_try_acquire_grant_holds_its_key_without_waiting_and_would_block_draws_nothing() {
        let layout = layout(journal([
            try_acquire(3),
            grant(1, 1),
            try_acquire(3),
            JournalEvent::WouldBlock { key: 3 },
        ]));
        let lane = &layout.lanes[0];
        assert_eq!(
            (lane.key.as_str(), shape(&lane.holds)),
            ("3", vec![(HOLD_1, 2, 4, Ending::Open)])
        );
        assert!(lane.wait_rows.is_empty());
    }

    #[test]
    fn overlapping_waits_go_on_separate_rows_and_later_ones_reuse_free_rows() {
        let layout = layout(journal([
            acquire(1, 5),
            grant(1, 1),
            acquire(2, 5),
            acquire(3, 5),
            cancel(2),
            acquire(4, 5),
        ]));
        let rows: Vec<Vec<u64>> = layout.lanes[0]
            .wait_rows
            .iter()
            .map(|row| row.iter().map(|bar| bar.start.seq).collect())
            .collect();
        assert_eq!(rows, [vec![3, 6], vec![4]]);
    }

    #[test]
    fn keys_get_lanes_in_order_of_first_appearance() {
        let layout = layout(journal([
            acquire(1, 9),
            grant(1, 1),
            acquire(2, 2),
            grant(2, 2),
        ]));
        let keys: Vec<&str> = layout.lanes.iter().map(|lane| lane.key.as_str()).collect();
        assert_eq!(keys, ["9", "2"]);
    }
}
