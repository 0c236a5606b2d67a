//! [`LockTable::snapshot`]: the view of every key held or waited for, dated by the table's
//! time marks (`marks.rs`).
//!
//! Entries do not point at their holders (a record names its key, not the other way round),
//! so the view joins the records to the entries. For every key that is one hash per key and
//! one per holder. For the first `n`, the join is kept to `n` keys: a pass over the entries
//! finds the contended keys that can make the cut, a pass over the records finds each one's
//! oldest holder and the `n` uncontended keys held longest (one comparison per holder for most
//! of them), and a last pass collects the holders of the `n` keys chosen. So a large table pays
//! three linear scans and no hash per key for a short view.

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::time::Duration;

use super::{Entry, EntryMap, Ledger, LockTable, Queued, RecordState};
use crate::pure::snapshot::{HolderSnapshot, KeyHold, KeySnapshot};
use crate::pure::table::WaiterId;

/// A map from keys the view borrows, small or large.
type KeyIndex<'t, K> = HashMap<&'t K, usize, foldhash::fast::RandomState>;

/// A key's view before its key is cloned: only the keys that make the cut are.
struct Draft<'t, K> {
    key: &'t K,
    entry: &'t Entry,
    first_waiter: Option<&'t Queued>,
    /// The smallest token of its holders, `u64::MAX` if none has been seen.
    oldest_token: u64,
    /// (table token, permits) of each holder.
    holders: Vec<(u64, u32)>,
}

impl<'t, K> Draft<'t, K> {
    fn new<D>(ledger: &Ledger<K, D>, key: &'t K, entry: &'t Entry) -> Self {
        Draft {
            key,
            entry,
            first_waiter: ledger.first_live(entry),
            oldest_token: u64::MAX,
            holders: Vec::new(),
        }
    }

    /// The shard's contention order, most contended first: more waiters, then the oldest
    /// holder's token (granted earlier), then the first waiter's arrival. Tokens and arrivals
    /// order grants and arrivals in time exactly, and the bounds of
    /// [`KeySnapshot::contention_order`] follow them, so this order refines that one.
    fn rank(&self) -> (Reverse<u32>, u64, u64) {
        let first_arrival = self.first_waiter.map(|queued| queued.waiter_id.arrival());
        (
            Reverse(self.entry.waiters),
            self.oldest_token,
            first_arrival.unwrap_or(u64::MAX),
        )
    }
}

/// The `limit` keys with the oldest holders among those offered, each with its oldest
/// holder's (token, permits): a key whose holder is older than the newest kept replaces it.
///
/// A key of the true first `limit` is never refused nor pushed out (that would take `limit`
/// other keys with older holders), and its oldest holder, once offered, stays its own.
struct OldestHeld<'t, K> {
    limit: usize,
    /// The keys kept by (token, order of offer), with the permits of that holder; the order
    /// tells apart the keys of one holder of several, which share a token.
    by_token: BTreeMap<(u64, usize), (&'t K, u32)>,
    /// Each key kept, with its place in `by_token`.
    kept: HashMap<&'t K, (u64, usize), foldhash::fast::RandomState>,
    /// The newest token kept once `limit` keys are: a holder this new or newer is refused
    /// with one comparison.
    cut: u64,
    offers: usize,
}

impl<'t, K: Hash + Eq> OldestHeld<'t, K> {
    fn new(limit: usize) -> Self {
        OldestHeld {
            limit,
            by_token: BTreeMap::new(),
            kept: HashMap::default(),
            cut: u64::MAX,
            offers: 0,
        }
    }

    #[inline]
    fn offer(&mut self, key: &'t K, token: u64, permits: u32) {
        if token >= self.cut {
            // Newer than every key kept: neither a key to keep nor an older holder of one.
            // Most holders of a large table end here, without a hash.
            return;
        }
        self.take(key, token, permits);
    }

    fn take(&mut self, key: &'t K, token: u64, permits: u32) {
        if let Some(place) = self.kept.get_mut(key) {
            if token < place.0 {
                self.by_token.remove(place);
                *place = (token, place.1);
                self.by_token.insert(*place, (key, permits));
            }
        } else {
            if self.by_token.len() == self.limit
                && let Some((_, (newest, _))) = self.by_token.pop_last()
            {
                self.kept.remove(newest);
            }
            let place = (token, self.offers);
            self.offers += 1;
            self.kept.insert(key, place);
            self.by_token.insert(place, (key, permits));
        }
        if self.by_token.len() == self.limit {
            self.cut = self
                .by_token
                .last_key_value()
                .map_or(u64::MAX, |(&(newest, _), _)| newest);
        }
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

    /// Whether `MARK_EVERY` (256) acquirers arrived since the last time mark: the caller then
    /// reads its clock and calls [`mark_time`](Self::mark_time), so that a clock is read once
    /// per that many arrivals, not once per lock.
    #[inline]
    pub fn wants_time_mark(&self) -> bool {
        self.ledger.marks.is_due(self.ledger.records.next_arrival())
    }

    /// Every key held or waited for, the most contended first (more waiters, then held
    /// longer, then waited for longer), or the first `limit` of them; `now` is the time since
    /// the table's start, and marks it ([`mark_time`](Self::mark_time)).
    ///
    /// Tokens are the table's own. Durations are bounds from the time marks. Every key: one
    /// hash per key and one per holder. The first `limit`: three passes over the entries and
    /// records, hashing only into maps of about `limit` keys (see the module docs of
    /// `table/view.rs`). Only the keys returned are cloned.
    pub fn snapshot(&mut self, now: Duration, limit: Option<usize>) -> Vec<KeySnapshot<K>> {
        self.mark_time(now);
        let LockTable { entries, ledger } = &*self;
        let drafts = match limit {
            Some(limit) if limit < entries.len() => ledger.first_drafts(entries, limit),
            _ => ledger.every_draft(entries),
        };
        drafts
            .into_iter()
            .map(|draft| ledger.view(draft, now))
            .collect()
    }
}

impl<K: Hash + Eq + Clone, D> Ledger<K, D> {
    /// Each live holder: its id, its token and permits, and its key or keys.
    fn holders(&self) -> impl Iterator<Item = (WaiterId, u64, u32, &[K])> {
        self.records.iter().filter_map(|(waiter_id, record)| {
            let RecordState::Holding {
                permits,
                fencing_token,
            } = record.state
            else {
                return None;
            };
            let group = match self.groups.is_empty() {
                true => None,
                false => self.groups.get(&waiter_id),
            };
            let keys = group.map_or(std::slice::from_ref(&record.key), |keys| keys);
            Some((waiter_id, fencing_token.get(), permits.get(), keys))
        })
    }

    /// A draft of every key, with its holders, in contention order.
    fn every_draft<'t>(&'t self, entries: &'t EntryMap<K>) -> Vec<Draft<'t, K>> {
        let mut drafts: Vec<Draft<'t, K>> = Vec::with_capacity(entries.len());
        let mut draft_of: KeyIndex<'t, K> =
            HashMap::with_capacity_and_hasher(entries.len(), Default::default());
        for (key, entry) in entries {
            draft_of.insert(key, drafts.len());
            drafts.push(Draft::new(self, key, entry));
        }
        self.collect_holders(&mut drafts, &draft_of);
        drafts.sort_unstable_by_key(Draft::rank);
        drafts
    }

    /// Drafts of the first `limit` keys (fewer than there are), with their holders, in
    /// contention order.
    fn first_drafts<'t>(&'t self, entries: &'t EntryMap<K>, limit: usize) -> Vec<Draft<'t, K>> {
        if limit == 0 {
            return Vec::new();
        }
        // The contended keys that can make the cut: as many waiters as the `limit`-th most.
        let mut candidates: Vec<Draft<'t, K>> = Vec::new();
        // With nobody waiting (a count kept in O(1)), no entry is contended: no pass over them.
        if self.counts.waiting > 0 {
            candidates.extend(
                entries
                    .iter()
                    .filter(|(_, entry)| entry.waiters > 0)
                    .map(|(key, entry)| Draft::new(self, key, entry)),
            );
        }
        if candidates.len() > limit {
            let mut waiters: Vec<u32> =
                candidates.iter().map(|draft| draft.entry.waiters).collect();
            let (_, cut, _) =
                waiters.select_nth_unstable_by_key(limit - 1, |&count| Reverse(count));
            let cut = *cut;
            candidates.retain(|draft| draft.entry.waiters >= cut);
        }
        let contended: KeyIndex<'t, K> = candidates
            .iter()
            .enumerate()
            .map(|(index, draft)| (draft.key, index))
            .collect();
        // Their holders, and the uncontended keys held longest with their oldest holder.
        let mut oldest = OldestHeld::new(limit);
        for (_, token, permits, keys) in self.holders() {
            for key in keys {
                match contended.is_empty() {
                    false if let Some(&index) = contended.get(key) => {
                        let draft = &mut candidates[index];
                        draft.holders.push((token, permits));
                        draft.oldest_token = draft.oldest_token.min(token);
                    }
                    _ => oldest.offer(key, token, permits),
                }
            }
        }
        for ((token, _), (key, permits)) in oldest.by_token {
            match entries.get_key_value(key) {
                Some((key, entry)) => {
                    let mut draft = Draft::new(self, key, entry);
                    draft.oldest_token = token;
                    draft.holders.push((token, permits));
                    candidates.push(draft);
                }
                None => debug_assert!(false, "invariant 1: holder without entry"),
            }
        }
        if candidates.len() > limit {
            candidates.select_nth_unstable_by_key(limit, Draft::rank);
            candidates.truncate(limit);
        }
        candidates.sort_unstable_by_key(Draft::rank);
        // A key whose one holder holds all its held permits has no other (each holds one at
        // least); the keys shared by several need one more pass to find the rest.
        let shared: KeyIndex<'t, K> = candidates
            .iter_mut()
            .enumerate()
            .filter(|(_, draft)| {
                draft.holders.len() == 1 && draft.holders[0].1 != draft.entry.permits
            })
            .map(|(index, draft)| {
                draft.holders.clear();
                (draft.key, index)
            })
            .collect();
        if !shared.is_empty() {
            self.collect_holders(&mut candidates, &shared);
        }
        candidates
    }

    /// Gives each draft of `draft_of` its holders, and its oldest token.
    fn collect_holders(&self, drafts: &mut [Draft<'_, K>], draft_of: &KeyIndex<'_, K>) {
        for (_, token, permits, keys) in self.holders() {
            for key in keys {
                if let Some(&index) = draft_of.get(key) {
                    let draft = &mut drafts[index];
                    draft.holders.push((token, permits));
                    draft.oldest_token = draft.oldest_token.min(token);
                }
            }
        }
    }

    /// The view of one drafted key, dated at `now`.
    fn view(&self, mut draft: Draft<'_, K>, now: Duration) -> KeySnapshot<K> {
        draft.holders.sort_unstable();
        let capacity = self.capacity.get();
        KeySnapshot {
            key: draft.key.clone(),
            hold: match (draft.entry.permits, draft.holders.len()) {
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
                    held_for: self.marks.since_token(token, now),
                })
                .collect(),
            waiters: draft.entry.waiters,
            first_waiter_permits: draft.first_waiter.map(|queued| queued.permits.get()),
            oldest_waited: draft
                .first_waiter
                .map(|queued| self.marks.since_arrival(queued.waiter_id.arrival(), now)),
        }
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

    /// The view of `key` in `view`, if there.
    fn shown<'v, K: PartialEq>(view: &'v [KeySnapshot<K>], key: &K) -> Option<&'v KeySnapshot<K>> {
        view.iter().find(|shown| shown.key == *key)
    }

    #[test]
    fn the_first_n_are_the_first_n_of_every_key_in_random_tables() {
        // xorshift: a fixed sequence, no dependency.
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move |below: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % below
        };
        for round in 0..300 {
            let mut table: LockTable<u64, ()> =
                LockTable::with_capacity(NonZeroU32::new(2).unwrap());
            let (mut holding, mut waiting) = (Vec::new(), Vec::new());
            let mut granted = Vec::new();
            for _ in 0..next(60) {
                let key = next(12);
                let acquired = match next(6) {
                    0 | 1 => table.acquire(key, ()),
                    2 | 3 => table.acquire_permits(key, table.permits(1).unwrap(), ()),
                    4 => table.acquire_all(KeySet::new([key, next(12)]).unwrap(), ()),
                    _ if !holding.is_empty() => {
                        let holder = holding.swap_remove(next(holding.len() as u64) as usize);
                        table.release(holder, &mut granted).unwrap();
                        continue;
                    }
                    _ if !waiting.is_empty() => {
                        let waiter = waiting.swap_remove(next(waiting.len() as u64) as usize);
                        let _ = table.cancel(waiter, &mut granted);
                        continue;
                    }
                    _ => continue,
                };
                match acquired {
                    Acquired::Granted(grant) => holding.push(grant.waiter_id),
                    Acquired::Queued(waiter_id) => waiting.push(waiter_id),
                }
                for grant in granted.drain(..) {
                    waiting.retain(|waiter| *waiter != grant.waiter_id);
                    holding.push(grant.waiter_id);
                }
            }
            table.check_invariants().unwrap();
            let now = secs(round);
            let every = table.snapshot(now, None);
            for limit in 0..=every.len() + 1 {
                let first = table.snapshot(now, Some(limit));
                assert_eq!(first.len(), limit.min(every.len()), "round {round}");
                let order = |view: &[KeySnapshot<u64>]| -> Vec<(u32, Option<u64>)> {
                    view.iter()
                        .map(|shown| {
                            (
                                shown.waiters,
                                shown.holders.first().map(|h| h.fencing_token),
                            )
                        })
                        .collect()
                };
                assert_eq!(
                    order(&first),
                    order(&every[..first.len()]),
                    "round {round}, limit {limit}"
                );
                for view in &first {
                    assert_eq!(
                        Some(view),
                        shown(&every, &view.key),
                        "round {round}, limit {limit}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_key_offered_again_with_an_older_holder_keeps_the_older() {
        // Records outside the window come in no order, so a key's older holder can come last.
        let mut oldest = super::OldestHeld::new(2);
        oldest.offer(&"shared", 10, 1);
        oldest.offer(&"other", 5, 1);
        oldest.offer(&"shared", 3, 1);
        oldest.offer(&"newer", 4, 1);
        let kept: Vec<(u64, &str)> = oldest
            .by_token
            .iter()
            .map(|(&(token, _), (key, _))| (token, **key))
            .collect();
        assert_eq!(kept, [(3, "shared"), (4, "newer")]);
    }

    #[test]
    fn a_busy_table_wants_a_time_mark_every_so_many_arrivals() {
        let mut table = Table::new();
        let mut marks = 0;
        for _ in 0..super::super::marks::MARK_EVERY * 3 {
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
