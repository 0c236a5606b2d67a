//! [`LockTable::snapshot`]: the view of every key held or waited for, built in one pass over
//! the entries and one over the records, dated by the table's time marks (`marks.rs`).

use std::cmp::Reverse;
use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;

use super::marks::MARK_EVERY;
use super::{Entry, LockTable, Queued, RecordState};
use crate::pure::snapshot::{HolderSnapshot, KeyHold, KeySnapshot};

/// A key's view before its key is cloned: only the keys that make the cut are.
struct Draft<'t, K> {
    key: &'t K,
    entry: &'t Entry,
    first_waiter: Option<&'t Queued>,
    /// (table token, permits) of each holder.
    holders: Vec<(u64, u32)>,
}

impl<K> Draft<'_, K> {
    /// The shard's contention order, most contended first: more waiters, then the oldest
    /// holder's token (granted earlier), then the first waiter's arrival. Tokens and arrivals
    /// order grants and arrivals in time exactly, and the bounds of
    /// [`KeySnapshot::contention_order`] follow them, so this order refines that one.
    fn rank(&self) -> (Reverse<u32>, u64, u64) {
        let oldest_token = self.holders.iter().map(|&(token, _)| token).min();
        let first_arrival = self.first_waiter.map(|queued| queued.waiter_id.arrival());
        (
            Reverse(self.entry.waiters),
            oldest_token.unwrap_or(u64::MAX),
            first_arrival.unwrap_or(u64::MAX),
        )
    }
}

impl<K, D> LockTable<K, D>
where
    K: Hash + Eq + Clone,
{
    /// Notes that the time is `now` (since the table's start, as the caller measures it): a
    /// mark that dates the ids and tokens handed out before and after it (`table/marks.rs`).
    pub fn mark_time(&mut self, now: Duration) {
        let next_arrival = self.ledger.records.next_arrival();
        let next_token = self.ledger.next_fencing_token;
        self.ledger.marks.note(next_arrival, next_token, now);
    }

    /// Whether [`MARK_EVERY`] acquirers arrived since the last time mark: the caller then
    /// reads its clock and calls [`mark_time`](Self::mark_time), so that a clock is read once
    /// per that many arrivals, not once per lock.
    #[inline]
    pub fn wants_time_mark(&self) -> bool {
        let since_mark = self.ledger.records.next_arrival() - self.ledger.marks.last_arrival();
        since_mark >= MARK_EVERY
    }

    /// Every key held or waited for, the most contended first (more waiters, then held
    /// longer, then waited for longer), or the first `limit` of them; `now` is the time since
    /// the table's start, and marks it ([`mark_time`](Self::mark_time)).
    ///
    /// Tokens are the table's own. Durations are bounds from the time marks. O(keys + records)
    /// with one hash per key and one per holder, whatever the limit; only the keys returned
    /// are cloned.
    pub fn snapshot(&mut self, now: Duration, limit: Option<usize>) -> Vec<KeySnapshot<K>> {
        self.mark_time(now);
        let LockTable { entries, ledger } = &*self;
        let mut drafts: Vec<Draft<'_, K>> = Vec::with_capacity(entries.len());
        let mut draft_of: HashMap<&K, usize, foldhash::fast::RandomState> =
            HashMap::with_capacity_and_hasher(entries.len(), Default::default());
        for (key, entry) in entries {
            draft_of.insert(key, drafts.len());
            drafts.push(Draft {
                key,
                entry,
                first_waiter: ledger.first_live(entry),
                holders: Vec::new(),
            });
        }
        for (waiter_id, record) in ledger.records.iter() {
            let RecordState::Holding {
                permits,
                fencing_token,
            } = record.state
            else {
                continue;
            };
            let group = match ledger.groups.is_empty() {
                true => None,
                false => ledger.groups.get(&waiter_id),
            };
            let keys = group.map_or(std::slice::from_ref(&record.key), |keys| keys);
            for key in keys {
                match draft_of.get(key) {
                    Some(&draft) => drafts[draft]
                        .holders
                        .push((fencing_token.get(), permits.get())),
                    None => debug_assert!(false, "invariant 1: holder without entry"),
                }
            }
        }
        if let Some(limit) = limit
            && limit < drafts.len()
        {
            drafts.select_nth_unstable_by_key(limit, Draft::rank);
            drafts.truncate(limit);
        }
        drafts.sort_unstable_by_key(Draft::rank);
        let capacity = ledger.capacity.get();
        drafts
            .into_iter()
            .map(|mut draft| {
                draft.holders.sort_unstable();
                let permits = draft.entry.permits;
                KeySnapshot {
                    key: draft.key.clone(),
                    hold: match (permits, draft.holders.len()) {
                        (0, _) => KeyHold::NotHeld,
                        (held, 1) if held == capacity => KeyHold::Exclusive,
                        (held, _) => KeyHold::Shared {
                            permits: held,
                            capacity,
                        },
                    },
                    holders: draft
                        .holders
                        .iter()
                        .map(|&(token, permits)| HolderSnapshot {
                            fencing_token: token,
                            permits,
                            held_for: ledger.marks.since_token(token, now),
                        })
                        .collect(),
                    waiters: draft.entry.waiters,
                    first_waiter_permits: draft.first_waiter.map(|queued| queued.permits.get()),
                    oldest_waited: draft
                        .first_waiter
                        .map(|queued| ledger.marks.since_arrival(queued.waiter_id.arrival(), now)),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;
    use std::time::Duration;

    use super::super::{Acquired, Grant, KeySet, LockTable, Record, RecordState};
    use crate::pure::snapshot::{DurationBounds, KeyHold, KeySnapshot};

    type Table = LockTable<&'static str, &'static str>;

    fn secs(seconds: u64) -> Duration {
        Duration::from_secs(seconds)
    }

    fn bounds(at_least: u64, at_most: u64) -> DurationBounds {
        DurationBounds {
            at_least: secs(at_least),
            at_most: secs(at_most),
        }
    }

    #[track_caller]
    fn checked(table: &Table) {
        if let Err(violation) = table.check_invariants() {
            panic!("{violation}");
        }
    }

    #[track_caller]
    fn granted(acquired: Acquired<&'static str>) -> Grant<&'static str> {
        match acquired {
            Acquired::Granted(grant) => grant,
            Acquired::Queued(waiter_id) => panic!("{waiter_id:?} was queued"),
        }
    }

    #[track_caller]
    fn only(view: Vec<KeySnapshot<&'static str>>) -> KeySnapshot<&'static str> {
        assert_eq!(view.len(), 1, "{view:?}");
        view.into_iter().next().unwrap()
    }

    fn with_capacity(permits: u32) -> Table {
        Table::with_capacity(NonZeroU32::new(permits).unwrap())
    }

    #[test]
    fn a_record_keeps_its_token_in_room_it_already_had() {
        // The runtime's delivery: a tag, a pending grant's slot key, or a boxed reply.
        #[allow(dead_code)]
        enum DeliveryShape {
            Caller,
            Pending(u32, NonZeroU32),
            Message(Box<Box<dyn FnOnce() + Send>>),
        }
        // 24 bytes as before the token was kept (a `u64` field would make it 32).
        assert_eq!(
            std::mem::size_of::<Option<Record<u64, DeliveryShape>>>(),
            24
        );
        let _ = RecordState::<DeliveryShape>::Waiting(DeliveryShape::Caller);
    }

    #[test]
    fn free_and_absent_keys_are_not_in_the_view() {
        let mut table = Table::new();
        assert!(table.snapshot(secs(1), None).is_empty());
        let grant = granted(table.acquire("a", "a"));
        table.release(grant.waiter_id, &mut Vec::new()).unwrap();
        checked(&table);
        assert!(table.snapshot(secs(2), None).is_empty());
    }

    #[test]
    fn an_exclusive_holder_shows_its_token_and_how_long_it_has_held() {
        let mut table = Table::new();
        granted(table.acquire("other", "other"));
        table.mark_time(secs(2));
        let grant = granted(table.acquire("a", "a"));
        table.mark_time(secs(2));
        checked(&table);
        let view = table.snapshot(secs(10), None);
        let a = view.iter().find(|view| view.key == "a").unwrap();
        assert_eq!(a.hold, KeyHold::Exclusive);
        assert_eq!(
            (a.waiters, a.first_waiter_permits, a.oldest_waited),
            (0, None, None)
        );
        assert_eq!(a.holders.len(), 1);
        assert_eq!(a.holders[0].fencing_token, grant.fencing_token);
        assert_eq!(a.holders[0].permits, 1);
        // Marked just before and just after the grant: exact.
        assert_eq!(a.holders[0].held_for, bounds(8, 8));
        checked(&table);
    }

    #[test]
    fn a_hold_is_bounded_by_the_marks_around_it_and_a_second_view_tightens_it() {
        let mut table = Table::new();
        granted(table.acquire("a", "a"));
        // Only the table's start before it: held at most since then.
        assert_eq!(
            only(table.snapshot(secs(10), None)).holders[0].held_for,
            bounds(0, 10)
        );
        // That view marked 10 s after the grant.
        assert_eq!(
            only(table.snapshot(secs(15), None)).holders[0].held_for,
            bounds(5, 15)
        );
    }

    #[test]
    fn two_shared_holders_share_the_key() {
        let mut table = with_capacity(2);
        let one = table.permits(1).unwrap();
        let first = granted(table.acquire_permits("a", one, "first"));
        let second = granted(table.acquire_permits("a", one, "second"));
        checked(&table);
        let view = only(table.snapshot(secs(1), None));
        assert_eq!(
            view.hold,
            KeyHold::Shared {
                permits: 2,
                capacity: 2
            }
        );
        let tokens: Vec<u64> = view.holders.iter().map(|h| h.fencing_token).collect();
        assert_eq!(tokens, [first.fencing_token, second.fencing_token]);
        assert!(view.holders.iter().all(|holder| holder.permits == 1));
    }

    #[test]
    fn permits_partly_used_show_how_many_of_the_capacity() {
        let mut table = with_capacity(5);
        granted(table.acquire_permits("a", table.permits(2).unwrap(), "two"));
        let view = only(table.snapshot(secs(1), None));
        assert_eq!(
            view.hold,
            KeyHold::Shared {
                permits: 2,
                capacity: 5
            }
        );
        assert_eq!(view.holders[0].permits, 2);
    }

    #[test]
    fn a_writer_waiting_behind_readers_is_the_first_waiter() {
        let mut table = with_capacity(3);
        let one = table.permits(1).unwrap();
        granted(table.acquire_permits("a", one, "reader 1"));
        granted(table.acquire_permits("a", one, "reader 2"));
        table.mark_time(secs(4));
        assert!(matches!(table.acquire("a", "writer"), Acquired::Queued(_)));
        assert!(matches!(
            table.acquire_permits("a", one, "reader 3"),
            Acquired::Queued(_)
        ));
        checked(&table);
        let view = only(table.snapshot(secs(10), None));
        assert_eq!(
            view.hold,
            KeyHold::Shared {
                permits: 2,
                capacity: 3
            }
        );
        assert_eq!(view.waiters, 2);
        assert_eq!(
            view.first_waiter_permits,
            Some(3),
            "the writer asks for all"
        );
        assert_eq!(view.oldest_waited, Some(bounds(0, 6)));
    }

    #[test]
    fn a_lock_all_holder_is_listed_under_each_key_and_its_waiter_under_a_free_one() {
        let mut table = Table::new();
        let both = granted(table.acquire_all(KeySet::new(["a", "b"]).unwrap(), "a and b"));
        assert!(matches!(
            table.acquire_all(KeySet::new(["b", "c"]).unwrap(), "b and c"),
            Acquired::Queued(_)
        ));
        checked(&table);
        let view = table.snapshot(secs(1), None);
        let of = |key: &str| view.iter().find(|view| view.key == key).unwrap();
        for key in ["a", "b"] {
            assert_eq!(of(key).hold, KeyHold::Exclusive);
            assert_eq!(of(key).holders[0].fencing_token, both.fencing_token);
        }
        assert_eq!(
            (of("b").waiters, of("b").first_waiter_permits),
            (1, Some(1))
        );
        assert_eq!(of("c").hold, KeyHold::NotHeld);
        assert!(of("c").holders.is_empty());
        assert_eq!(of("c").waiters, 1);
        assert_eq!(view[0].key, "b", "the most waiters, then held longest");
    }

    #[test]
    fn holders_granted_in_one_step_keep_the_tokens_their_grants_carry() {
        let mut table = Table::new();
        let both = granted(table.acquire_all(KeySet::new(["a", "b"]).unwrap(), "both"));
        // Queued on "b" first, then on "a": granted key by key ("a" first), then their tokens
        // are put in order of arrival.
        assert!(matches!(table.acquire("b", "on b"), Acquired::Queued(_)));
        assert!(matches!(table.acquire("a", "on a"), Acquired::Queued(_)));
        let mut grants = Vec::new();
        table.release(both.waiter_id, &mut grants).unwrap();
        checked(&table);
        let view = table.snapshot(secs(1), None);
        for grant in grants {
            let key = table.key_of(grant.waiter_id).copied().unwrap();
            let shown = view.iter().find(|view| view.key == key).unwrap();
            assert_eq!(shown.holders[0].fencing_token, grant.fencing_token, "{key}");
        }
    }

    #[test]
    fn after_shutdown_the_view_is_empty() {
        let mut table = Table::new();
        granted(table.acquire("a", "a"));
        assert!(matches!(table.acquire("a", "b"), Acquired::Queued(_)));
        table.shutdown();
        checked(&table);
        assert!(table.snapshot(secs(1), None).is_empty());
    }

    #[test]
    fn a_limit_keeps_the_most_waiters_then_the_longest_held() {
        let mut table = Table::new();
        granted(table.acquire("oldest", "oldest"));
        granted(table.acquire("one waiter", "holder"));
        granted(table.acquire("two waiters", "holder"));
        granted(table.acquire("newest", "newest"));
        assert!(matches!(
            table.acquire("one waiter", "w"),
            Acquired::Queued(_)
        ));
        assert!(matches!(
            table.acquire("two waiters", "w"),
            Acquired::Queued(_)
        ));
        assert!(matches!(
            table.acquire("two waiters", "w"),
            Acquired::Queued(_)
        ));
        let keys = |view: Vec<KeySnapshot<&'static str>>| -> Vec<&'static str> {
            view.into_iter().map(|view| view.key).collect()
        };
        let all = ["two waiters", "one waiter", "oldest", "newest"];
        assert_eq!(keys(table.snapshot(secs(1), None)), all);
        for limit in 0..=5 {
            let top = keys(table.snapshot(secs(1), Some(limit)));
            assert_eq!(top, all[..limit.min(4)], "limit {limit}");
        }
    }

    #[test]
    fn a_busy_table_wants_a_time_mark_every_so_many_arrivals() {
        let mut table = Table::new();
        let mut marks = 0;
        for _ in 0..super::MARK_EVERY * 3 {
            let grant = granted(table.acquire("a", "a"));
            table.release(grant.waiter_id, &mut Vec::new()).unwrap();
            if table.wants_time_mark() {
                table.mark_time(secs(marks));
                marks += 1;
            }
        }
        assert_eq!(marks, 3);
        checked(&table);
    }
}
