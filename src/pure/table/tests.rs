use super::*;

use std::num::NonZeroU32;

/// Keys and deliveries are labels, so a failing assertion names the waiter it is about.
type Table = LockTable<&'static str, &'static str>;

/// Checks every invariant; called after every step of every test.
#[track_caller]
fn step<K, D>(table: &LockTable<K, D>)
where
    K: Hash + Eq + Clone,
{
    if let Err(violation) = table.check_invariants() {
        panic!("{violation}");
    }
}

#[track_caller]
fn granted<D: fmt::Debug>(acquired: Acquired<D>) -> Grant<D> {
    match acquired {
        Acquired::Granted(grant) => grant,
        Acquired::Queued(waiter_id) => panic!("expected a grant, {waiter_id:?} was queued"),
    }
}

#[track_caller]
fn queued<D: fmt::Debug>(acquired: Acquired<D>) -> WaiterId {
    match acquired {
        Acquired::Queued(waiter_id) => waiter_id,
        Acquired::Granted(grant) => panic!("expected to be queued, got {grant:?}"),
    }
}

/// A table where `key` is held (delivery "holder") and `labels` queue behind it in order.
fn held_with_waiters(
    key: &'static str,
    labels: &[&'static str],
) -> (Table, WaiterId, Vec<WaiterId>) {
    let mut table = Table::new();
    let holder = granted(table.acquire(key, "holder")).waiter_id;
    step(&table);
    let mut waiters = Vec::new();
    for label in labels {
        waiters.push(queued(table.acquire(key, label)));
        step(&table);
    }
    (table, holder, waiters)
}

// Mutual exclusion (invariant 3).

#[test]
fn second_acquire_of_held_key_is_queued() {
    let mut table = Table::new();
    let first = granted(table.acquire("a", "first"));
    step(&table);
    assert_eq!(first.delivery, "first");
    let second = queued(table.acquire("a", "second"));
    step(&table);
    assert_ne!(second, first.waiter_id);
    assert_eq!(table.delivery_of(second), Some(&"second"));
    let stats = table.stats();
    assert_eq!((stats.keys, stats.held, stats.waiting), (1, 1, 1));
}

#[test]
fn distinct_keys_are_granted_independently() {
    let mut table = Table::new();
    let a = granted(table.acquire("a", "a"));
    step(&table);
    let b = granted(table.acquire("b", "b"));
    step(&table);
    let c = table.try_acquire("c").unwrap();
    step(&table);
    assert_eq!(table.key_of(a.waiter_id), Some(&"a"));
    assert_eq!(table.key_of(b.waiter_id), Some(&"b"));
    assert_eq!(table.key_of(c.waiter_id), Some(&"c"));
    let stats = table.stats();
    assert_eq!((stats.keys, stats.held, stats.waiting), (3, 3, 0));

    // Releasing one key grants nothing and leaves the others held.
    let mut grants = Vec::new();
    assert_eq!(table.release(b.waiter_id, &mut grants), Ok("b"));
    step(&table);
    assert!(grants.is_empty());
    assert!(!table.contains_key(&"b"));
    assert!(table.contains_key(&"a") && table.contains_key(&"c"));
    assert_eq!(table.try_acquire("a"), Err(WouldBlock));
    step(&table);
}

// Fairness: strict FIFO per key.

#[test]
fn waiters_are_granted_in_arrival_order() {
    let labels = ["w1", "w2", "w3", "w4", "w5"];
    let (mut table, holder, waiters) = held_with_waiters("a", &labels);
    let mut grants = Vec::new();
    let mut releasing = holder;
    for (turn, (&label, &waiter_id)) in labels.iter().zip(&waiters).enumerate() {
        assert_eq!(table.release(releasing, &mut grants), Ok("a"));
        step(&table);
        assert_eq!(grants.len(), turn + 1, "one grant per release");
        let grant = &grants[turn];
        assert_eq!((grant.waiter_id, grant.delivery), (waiter_id, label));
        assert_eq!(table.stats().waiting, labels.len() - turn - 1);
        releasing = grant.waiter_id;
    }
    let delivered: Vec<_> = grants.iter().map(|grant| grant.delivery).collect();
    assert_eq!(delivered, labels);
    let granted_ids: Vec<_> = grants.iter().map(|grant| grant.waiter_id).collect();
    assert_eq!(granted_ids, waiters);

    assert_eq!(table.release(releasing, &mut grants), Ok("a"));
    step(&table);
    assert_eq!(
        grants.len(),
        labels.len(),
        "the last release grants nothing"
    );
    assert_eq!(table.stats().keys, 0);
}

#[test]
fn acquirer_arriving_after_release_never_overtakes_queued_waiters() {
    let (mut table, holder, waiters) = held_with_waiters("a", &["early1", "early2"]);
    let mut grants = Vec::new();
    table.release(holder, &mut grants).unwrap();
    step(&table);
    assert_eq!(grants[0].waiter_id, waiters[0]);

    // The instant after a release the key already belongs to the next waiter.
    assert_eq!(table.try_acquire("a"), Err(WouldBlock));
    step(&table);
    let late = queued(table.acquire("a", "late"));
    step(&table);

    table.release(waiters[0], &mut grants).unwrap();
    step(&table);
    assert_eq!(grants[1].waiter_id, waiters[1], "early2 before late");
    table.release(waiters[1], &mut grants).unwrap();
    step(&table);
    assert_eq!((grants[2].waiter_id, grants[2].delivery), (late, "late"));
    table.release(late, &mut grants).unwrap();
    step(&table);
    assert_eq!(grants.len(), 3);
    assert!(!table.contains_key(&"a"));
}

// No leak (invariant 1): an entry lives exactly as long as a holder or waiter refers to it.

#[test]
fn entry_is_removed_when_last_holder_releases() {
    let mut table = Table::new();
    let holder = granted(table.acquire("a", "holder")).waiter_id;
    step(&table);
    assert!(table.contains_key(&"a"));
    table.release(holder, &mut Vec::new()).unwrap();
    step(&table);
    assert!(!table.contains_key(&"a"));
    assert_eq!(table.stats().keys, 0);
}

#[test]
fn entry_stays_until_last_holder_or_waiter_goes() {
    let (mut table, holder, waiters) = held_with_waiters("a", &["w1", "w2", "w3"]);
    let mut grants = Vec::new();

    table.cancel(waiters[1], &mut Vec::new()).unwrap();
    step(&table);
    assert!(table.contains_key(&"a"), "held and w1, w3 waiting");
    table.release(holder, &mut grants).unwrap();
    step(&table);
    assert!(table.contains_key(&"a"), "w1 holds, w3 waiting");
    table.cancel(waiters[2], &mut Vec::new()).unwrap();
    step(&table);
    assert!(table.contains_key(&"a"), "w1 holds");
    table.release(waiters[0], &mut grants).unwrap();
    step(&table);
    assert!(!table.contains_key(&"a"));
    assert_eq!(table.stats().keys, 0);
    assert_eq!(grants.len(), 1, "only w1 was ever granted");
}

#[test]
fn mix_of_acquire_try_acquire_release_and_cancel_leaves_no_entry() {
    let mut table = Table::new();
    let mut grants = Vec::new();
    let a_holder = table.try_acquire("a").unwrap().waiter_id;
    step(&table);
    let a_waiter = queued(table.acquire("a", "a waiter"));
    step(&table);
    let b_holder = granted(table.acquire("b", "b holder")).waiter_id;
    step(&table);
    let b_waiter = queued(table.acquire("b", "b waiter"));
    step(&table);
    let c_holder = table.try_acquire("c").unwrap().waiter_id;
    step(&table);
    assert_eq!(table.stats().keys, 3);

    table.cancel(b_waiter, &mut Vec::new()).unwrap();
    step(&table);
    table.release(a_holder, &mut grants).unwrap();
    step(&table);
    table.release(c_holder, &mut grants).unwrap();
    step(&table);
    assert!(!table.contains_key(&"c"));
    table.release(b_holder, &mut grants).unwrap();
    step(&table);
    assert!(!table.contains_key(&"b"), "the only b waiter was cancelled");
    assert_eq!(grants.len(), 1);
    table.release(a_waiter, &mut grants).unwrap();
    step(&table);

    let stats = table.stats();
    assert_eq!((stats.keys, stats.held, stats.waiting), (0, 0, 0));
    for key in ["a", "b", "c"] {
        assert!(!table.contains_key(&key));
    }
}

// Cancel.

#[test]
fn cancelled_waiter_returns_its_key_and_delivery_and_grants_nothing() {
    let (mut table, _holder, waiters) = held_with_waiters("a", &["w1"]);
    let before = table.stats();
    assert_eq!(table.cancel(waiters[0], &mut Vec::new()), Ok(("a", "w1")));
    step(&table);
    let after = table.stats();
    assert_eq!(after.grants, before.grants, "cancel grants nothing");
    assert_eq!((after.keys, after.held, after.waiting), (1, 1, 0));
    assert!(table.contains_key(&"a"), "the holder still holds");
    assert_eq!(table.key_of(waiters[0]), None);
}

#[test]
fn cancelled_waiter_leaves_no_entry_once_holder_releases() {
    let (mut table, holder, waiters) = held_with_waiters("a", &["w1"]);
    table.cancel(waiters[0], &mut Vec::new()).unwrap();
    step(&table);
    assert!(table.contains_key(&"a"));
    let mut grants = Vec::new();
    assert_eq!(table.release(holder, &mut grants), Ok("a"));
    step(&table);
    assert!(
        grants.is_empty(),
        "the cancelled waiter is a tombstone, not a holder"
    );
    assert!(!table.contains_key(&"a"));
    assert_eq!(table.stats().keys, 0);
}

#[test]
fn cancelled_waiter_is_never_granted() {
    let (mut table, holder, waiters) = held_with_waiters("a", &["w1", "w2", "w3"]);
    table.cancel(waiters[1], &mut Vec::new()).unwrap();
    step(&table);
    let mut grants = Vec::new();
    table.release(holder, &mut grants).unwrap();
    step(&table);
    table.release(waiters[0], &mut grants).unwrap();
    step(&table);
    table.release(waiters[2], &mut grants).unwrap();
    step(&table);
    let granted_ids: Vec<_> = grants.iter().map(|grant| grant.waiter_id).collect();
    assert_eq!(granted_ids, [waiters[0], waiters[2]]);
    assert_eq!(table.stats().keys, 0);
}

#[test]
fn cancelling_head_waiter_then_release_grants_second_waiter() {
    let (mut table, holder, waiters) = held_with_waiters("a", &["w1", "w2"]);
    table.cancel(waiters[0], &mut Vec::new()).unwrap();
    step(&table);
    let mut grants = Vec::new();
    table.release(holder, &mut grants).unwrap();
    step(&table);
    assert_eq!(grants.len(), 1);
    assert_eq!(
        (grants[0].waiter_id, grants[0].delivery),
        (waiters[1], "w2")
    );
    assert_eq!(table.key_of(waiters[1]), Some(&"a"));
    assert_eq!(table.stats().waiting, 0);
}

#[test]
fn cancel_of_granted_waiter_is_not_waiting() {
    let (mut table, holder, waiters) = held_with_waiters("a", &["w1"]);
    table.release(holder, &mut Vec::new()).unwrap();
    step(&table);
    let before = table.stats();
    assert_eq!(
        table.cancel(waiters[0], &mut Vec::new()),
        Err(WaiterError::NotWaiting(waiters[0]))
    );
    step(&table);
    assert_eq!(table.stats(), before);
    assert_eq!(table.release(waiters[0], &mut Vec::new()), Ok("a"));
    step(&table);
}

// Refusals leave the table unchanged.

#[test]
fn release_and_cancel_of_unknown_ids_are_refused_and_change_nothing() {
    let (mut table, holder, waiters) = held_with_waiters("a", &["w1", "w2", "w3"]);
    let mut grants = Vec::new();
    // A released holder, a cancelled waiter and an id never issued.
    let released = table.try_acquire("b").unwrap().waiter_id;
    step(&table);
    table.release(released, &mut grants).unwrap();
    step(&table);
    let cancelled = waiters[1];
    table.cancel(cancelled, &mut Vec::new()).unwrap();
    step(&table);
    let never_issued = WaiterId::new(u64::MAX).unwrap();

    let before = table.stats();
    for unknown in [released, cancelled, never_issued] {
        assert_eq!(
            table.release(unknown, &mut grants),
            Err(WaiterError::Unknown(unknown))
        );
        step(&table);
        assert_eq!(
            table.cancel(unknown, &mut Vec::new()),
            Err(WaiterError::Unknown(unknown))
        );
        step(&table);
        assert_eq!(table.key_of(unknown), None);
        assert_eq!(table.delivery_of(unknown), None);
        assert_eq!(table.stats(), before);
    }
    assert!(grants.is_empty());

    // The live waiters are untouched: the queue still runs w1 then w3.
    table.release(holder, &mut grants).unwrap();
    step(&table);
    table.release(waiters[0], &mut grants).unwrap();
    step(&table);
    let granted_ids: Vec<_> = grants.iter().map(|grant| grant.waiter_id).collect();
    assert_eq!(granted_ids, [waiters[0], waiters[2]]);
}

#[test]
fn release_of_queued_waiter_is_not_holding_and_changes_nothing() {
    let (mut table, holder, waiters) = held_with_waiters("a", &["w1"]);
    let before = table.stats();
    let mut grants = Vec::new();
    assert_eq!(
        table.release(waiters[0], &mut grants),
        Err(WaiterError::NotHolding(waiters[0]))
    );
    step(&table);
    assert_eq!(table.stats(), before);
    assert!(grants.is_empty());
    assert_eq!(table.delivery_of(waiters[0]), Some(&"w1"));
    table.release(holder, &mut grants).unwrap();
    step(&table);
    assert_eq!(grants[0].waiter_id, waiters[0]);
}

#[test]
fn cancel_of_holder_is_not_waiting_and_changes_nothing() {
    let (mut table, holder, waiters) = held_with_waiters("a", &["w1"]);
    let before = table.stats();
    assert_eq!(
        table.cancel(holder, &mut Vec::new()),
        Err(WaiterError::NotWaiting(holder))
    );
    step(&table);
    assert_eq!(table.stats(), before);
    assert_eq!(table.key_of(holder), Some(&"a"));
    let mut grants = Vec::new();
    table.release(holder, &mut grants).unwrap();
    step(&table);
    assert_eq!(grants[0].waiter_id, waiters[0]);
}

#[test]
fn stale_id_never_aliases_a_later_acquirer() {
    let mut table = Table::new();
    let mut grants = Vec::new();
    let stale = granted(table.acquire("a", "stale")).waiter_id;
    step(&table);
    table.release(stale, &mut grants).unwrap();
    step(&table);
    let fresh = granted(table.acquire("b", "fresh"));
    step(&table);
    assert_eq!(fresh.waiter_id.arrival(), stale.arrival() + 1);

    let before = table.stats();
    assert_eq!(
        table.release(stale, &mut grants),
        Err(WaiterError::Unknown(stale))
    );
    step(&table);
    assert_eq!(
        table.cancel(stale, &mut Vec::new()),
        Err(WaiterError::Unknown(stale))
    );
    step(&table);
    assert_eq!(table.key_of(stale), None);
    assert_eq!(table.stats(), before);
    assert!(table.contains_key(&"b"), "the fresh acquirer still holds");
    assert_eq!(table.key_of(fresh.waiter_id), Some(&"b"));
    assert_eq!(table.release(fresh.waiter_id, &mut grants), Ok("b"));
    step(&table);
    assert!(grants.is_empty());
}

#[test]
fn tombstone_is_skipped_and_a_later_waiter_behind_it_is_granted() {
    let (mut table, holder, waiters) = held_with_waiters("a", &["cancelled"]);
    table.cancel(waiters[0], &mut Vec::new()).unwrap();
    step(&table);
    // The next waiter on the same key queues behind the cancelled waiter's tombstone.
    let reuser = queued(table.acquire("a", "reuser"));
    step(&table);
    assert_ne!(reuser, waiters[0]);

    let mut grants = Vec::new();
    table.release(holder, &mut grants).unwrap();
    step(&table);
    assert_eq!(grants.len(), 1);
    assert_eq!(
        (grants[0].waiter_id, grants[0].delivery),
        (reuser, "reuser")
    );
    table.release(reuser, &mut grants).unwrap();
    step(&table);
    assert_eq!(
        grants.len(),
        1,
        "the reuser is granted once, not again for its tombstone"
    );
    assert_eq!(table.stats().keys, 0);
}

// Fencing (invariant 8).

#[test]
fn fencing_tokens_increase_by_one_across_keys_and_grant_paths() {
    let mut table = Table::new();
    let mut grants = Vec::new();
    let mut tokens = Vec::new();
    assert_eq!(table.stats().grants, 0);

    let a = table.try_acquire("a").unwrap();
    step(&table);
    tokens.push(a.fencing_token);
    let b = granted(table.acquire("b", "b"));
    step(&table);
    tokens.push(b.fencing_token);
    let a_waiter = queued(table.acquire("a", "a waiter"));
    step(&table);
    let c = granted(table.acquire("c", "c"));
    step(&table);
    tokens.push(c.fencing_token);
    table.release(a.waiter_id, &mut grants).unwrap();
    step(&table);
    assert_eq!(grants[0].waiter_id, a_waiter);
    tokens.push(grants[0].fencing_token);
    let d = table.try_acquire("d").unwrap();
    step(&table);
    tokens.push(d.fencing_token);
    table.release(b.waiter_id, &mut grants).unwrap();
    step(&table);
    let b_again = granted(table.acquire("b", "b again"));
    step(&table);
    tokens.push(b_again.fencing_token);

    assert_eq!(tokens, [1, 2, 3, 4, 5, 6]);
    assert_eq!(table.stats().grants, 6, "grants is the last token");
}

#[test]
fn refused_calls_consume_no_fencing_token() {
    let (mut table, holder, waiters) = held_with_waiters("a", &["w1"]);
    assert_eq!(table.try_acquire("a"), Err(WouldBlock));
    step(&table);
    assert_eq!(
        table.cancel(holder, &mut Vec::new()),
        Err(WaiterError::NotWaiting(holder))
    );
    step(&table);
    table.cancel(waiters[0], &mut Vec::new()).unwrap();
    step(&table);
    assert_eq!(table.stats().grants, 1);
    table.release(holder, &mut Vec::new()).unwrap();
    step(&table);
    assert_eq!(table.try_acquire("a").unwrap().fencing_token, 2);
    step(&table);
}

// try_acquire.

#[test]
fn try_acquire_of_free_key_is_granted_and_release_leaves_no_entry() {
    let mut table = Table::new();
    let grant = table.try_acquire("a").unwrap();
    step(&table);
    assert_eq!(grant.fencing_token, 1);
    assert_eq!(table.key_of(grant.waiter_id), Some(&"a"));
    assert_eq!(
        table.delivery_of(grant.waiter_id),
        None,
        "a holder has no pending delivery"
    );
    let stats = table.stats();
    assert_eq!((stats.keys, stats.held, stats.waiting), (1, 1, 0));
    let mut grants = Vec::new();
    assert_eq!(table.release(grant.waiter_id, &mut grants), Ok("a"));
    step(&table);
    assert!(grants.is_empty());
    assert_eq!(table.stats().keys, 0);
    assert!(!table.contains_key(&"a"));
}

#[test]
fn try_acquire_of_held_key_would_block_and_changes_nothing() {
    let mut table = Table::new();
    let holder = granted(table.acquire("a", "holder")).waiter_id;
    step(&table);
    let before = table.stats();
    assert_eq!(table.try_acquire("a"), Err(WouldBlock));
    step(&table);
    assert_eq!(table.stats(), before);
    // Nothing was queued: releasing the holder grants nothing and frees the key.
    let mut grants = Vec::new();
    table.release(holder, &mut grants).unwrap();
    step(&table);
    assert!(grants.is_empty());
    assert_eq!(table.stats().keys, 0);
}

#[test]
fn try_acquire_of_key_with_waiters_would_block_and_changes_nothing() {
    let (mut table, holder, waiters) = held_with_waiters("a", &["w1", "w2"]);
    let before = table.stats();
    assert_eq!(table.try_acquire("a"), Err(WouldBlock));
    step(&table);
    assert_eq!(table.stats(), before);
    let mut grants = Vec::new();
    table.release(holder, &mut grants).unwrap();
    step(&table);
    assert_eq!(
        table.try_acquire("a"),
        Err(WouldBlock),
        "w1 holds, w2 waits"
    );
    step(&table);
    assert_eq!(grants[0].waiter_id, waiters[0]);
}

// Bounded tombstones (invariant 6).

#[test]
fn queue_stays_bounded_while_ten_thousand_waiters_time_out_on_a_held_key() {
    // A timeout storm: waiters keep arriving on a key held throughout, and each times out
    // (cancels) while up to `LIVE` others wait, in an order that leaves tombstones everywhere
    // in the queue, not only at its front.
    const WAITERS: usize = 10_000;
    const LIVE: usize = 64;
    let mut table: LockTable<&str, usize> = LockTable::new();
    let holder = granted(table.acquire("a", usize::MAX)).waiter_id;
    step(&table);
    let mut live: Vec<(WaiterId, usize)> = Vec::with_capacity(LIVE + 1);
    let mut pick: usize = 1;
    let mut longest_queue = 0;
    let mut cancel_one = |table: &mut LockTable<&str, usize>, live: &mut Vec<(WaiterId, usize)>| {
        // A fixed pseudo-random sequence (LCG), so the run is the same every time.
        pick = pick.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let (waiter_id, label) = live.swap_remove((pick >> 33) % live.len());
        assert_eq!(table.cancel(waiter_id, &mut Vec::new()), Ok(("a", label)));
        // Invariant 6 bounds the queue by the waiters left after every single cancel.
        step(table);
        longest_queue = longest_queue.max(table.entries[&"a"].queue.len());
    };
    for label in 0..WAITERS {
        live.push((queued(table.acquire("a", label)), label));
        step(&table);
        if live.len() > LIVE {
            cancel_one(&mut table, &mut live);
        }
    }
    while !live.is_empty() {
        cancel_one(&mut table, &mut live);
    }
    assert!(
        longest_queue <= 2 * (LIVE + 1) + TOMBSTONE_SLACK,
        "queue grew to {longest_queue} for at most {} waiters",
        LIVE + 1
    );
    let queue_len = table.entries[&"a"].queue.len();
    assert!(
        queue_len <= TOMBSTONE_SLACK,
        "{queue_len} tombstones left for no waiter"
    );
    assert_eq!(table.stats().waiting, 0);
    assert_eq!(table.stats().grants, 1, "no cancel granted anything");

    let mut grants = Vec::new();
    table.release(holder, &mut grants).unwrap();
    step(&table);
    assert!(grants.is_empty());
    assert!(!table.contains_key(&"a"));
    assert_eq!(table.stats().keys, 0);
}

#[test]
fn long_queue_is_compacted_as_its_waiters_cancel_one_by_one() {
    // All waiters queue first, then cancel newest first. 2,000 rather than more because every
    // step's check is O(queue), which makes this test quadratic.
    const WAITERS: usize = 2_000;
    let mut table: LockTable<&str, usize> = LockTable::new();
    let holder = granted(table.acquire("a", usize::MAX)).waiter_id;
    step(&table);
    let mut waiters = Vec::with_capacity(WAITERS);
    for label in 0..WAITERS {
        waiters.push(queued(table.acquire("a", label)));
        step(&table);
    }
    for (label, &waiter_id) in waiters.iter().enumerate().rev() {
        assert_eq!(table.cancel(waiter_id, &mut Vec::new()), Ok(("a", label)));
        step(&table);
    }
    let queue_len = table.entries[&"a"].queue.len();
    assert!(
        queue_len <= TOMBSTONE_SLACK,
        "{queue_len} tombstones left for no waiter"
    );

    let mut grants = Vec::new();
    table.release(holder, &mut grants).unwrap();
    step(&table);
    assert!(grants.is_empty());
    assert!(!table.contains_key(&"a"));
}

/// Granting the head waiter lowers the bound of invariant 6 (`2 * waiters + TOMBSTONE_SLACK`)
/// by 2 but shortens the queue by only 1, so `release` must compact too. Here the queue sits
/// exactly at its bound (1 waiter, 17 tombstones behind it) when the holder releases.
#[test]
fn queue_stays_bounded_when_waiter_ahead_of_tombstones_is_granted() {
    let mut table: LockTable<&str, usize> = LockTable::new();
    let holder = granted(table.acquire("a", 0)).waiter_id;
    step(&table);
    let head = queued(table.acquire("a", 1));
    step(&table);
    // 1 live waiter + TOMBSTONE_SLACK + 1 tombstones: exactly 2 * 1 + TOMBSTONE_SLACK, allowed.
    let mut behind = Vec::new();
    for label in 0..=TOMBSTONE_SLACK {
        behind.push(queued(table.acquire("a", 2 + label)));
        step(&table);
    }
    for waiter_id in behind {
        table.cancel(waiter_id, &mut Vec::new()).unwrap();
        step(&table);
    }
    let mut grants = Vec::new();
    table.release(holder, &mut grants).unwrap();
    assert_eq!(grants[0].waiter_id, head);
    // The queue now holds TOMBSTONE_SLACK + 1 tombstones for 0 waiters.
    step(&table);
}

// Shutdown.

#[test]
fn shutdown_returns_every_waiter_delivery_once_and_empties_table() {
    let mut table = Table::new();
    let mut grants = Vec::new();
    let a_holder = granted(table.acquire("a", "a holder")).waiter_id;
    step(&table);
    let b_holder = table.try_acquire("b").unwrap().waiter_id;
    step(&table);
    let mut waiters = Vec::new();
    for (key, label) in [("a", "a1"), ("a", "a2"), ("b", "b1")] {
        waiters.push((queued(table.acquire(key, label)), label));
        step(&table);
    }
    let cancelled = queued(table.acquire("b", "cancelled"));
    step(&table);
    table.cancel(cancelled, &mut Vec::new()).unwrap();
    step(&table);
    let grants_before = table.stats().grants;

    let mut returned = table.shutdown();
    step(&table);
    returned.sort_by_key(|&(_, delivery)| delivery);
    waiters.sort_by_key(|&(_, delivery)| delivery);
    assert_eq!(
        returned, waiters,
        "each waiter once, the cancelled one not at all"
    );
    assert_eq!(
        table.stats(),
        RegistryStats {
            keys: 0,
            held: 0,
            holders: 0,
            permits: 0,
            waiting: 0,
            grants: grants_before
        }
    );
    assert!(!table.contains_key(&"a") && !table.contains_key(&"b"));
    assert!(table.shutdown().is_empty(), "nothing is returned twice");
    step(&table);

    let before = table.stats();
    for holder in [a_holder, b_holder] {
        assert_eq!(
            table.release(holder, &mut grants),
            Err(WaiterError::Unknown(holder))
        );
        step(&table);
    }
    for (waiter_id, _) in &waiters {
        assert_eq!(
            table.cancel(*waiter_id, &mut Vec::new()),
            Err(WaiterError::Unknown(*waiter_id))
        );
        step(&table);
        assert_eq!(table.key_of(*waiter_id), None);
    }
    assert_eq!(table.stats(), before);
    assert!(grants.is_empty());
}

#[test]
fn fencing_tokens_keep_increasing_after_shutdown() {
    let mut table = Table::new();
    let old = granted(table.acquire("a", "old"));
    step(&table);
    let old_waiter = queued(table.acquire("a", "old waiter"));
    step(&table);
    table.shutdown();
    step(&table);
    let new = granted(table.acquire("a", "new"));
    step(&table);
    assert_eq!((old.fencing_token, new.fencing_token), (1, 2));
    let newer = table.try_acquire("b").unwrap();
    step(&table);
    assert_eq!(newer.fencing_token, 3);
    assert_eq!(table.stats().grants, 3);

    // Old ids from before the shutdown touch nothing, even once their slots are reused.
    let mut grants = Vec::new();
    assert_eq!(
        table.release(old.waiter_id, &mut grants),
        Err(WaiterError::Unknown(old.waiter_id))
    );
    step(&table);
    assert_eq!(
        table.cancel(old_waiter, &mut Vec::new()),
        Err(WaiterError::Unknown(old_waiter))
    );
    step(&table);
    assert_eq!(table.key_of(new.waiter_id), Some(&"a"));
    assert_eq!(table.key_of(newer.waiter_id), Some(&"b"));
}

// Accessors.

#[test]
fn key_of_and_delivery_of_follow_a_waiter_through_its_life() {
    let (mut table, holder, waiters) = held_with_waiters("a", &["w1", "w2"]);
    assert_eq!(table.key_of(holder), Some(&"a"));
    assert_eq!(
        table.delivery_of(holder),
        None,
        "a holder's delivery was handed back"
    );
    assert_eq!(table.key_of(waiters[0]), Some(&"a"));
    assert_eq!(table.delivery_of(waiters[0]), Some(&"w1"));
    assert_eq!(table.delivery_of(waiters[1]), Some(&"w2"));

    table.release(holder, &mut Vec::new()).unwrap();
    step(&table);
    assert_eq!(table.key_of(holder), None);
    assert_eq!(table.delivery_of(holder), None);
    assert_eq!(table.key_of(waiters[0]), Some(&"a"), "granted: still known");
    assert_eq!(
        table.delivery_of(waiters[0]),
        None,
        "granted: delivery handed back"
    );

    table.cancel(waiters[1], &mut Vec::new()).unwrap();
    step(&table);
    assert_eq!(table.key_of(waiters[1]), None);
    assert_eq!(table.delivery_of(waiters[1]), None);
}

// Scale.

#[test]
fn fifty_thousand_held_keys_all_released_leave_no_entry() {
    const KEYS: u32 = 50_000;
    let mut table: LockTable<u32, ()> = LockTable::new();
    let holders: Vec<_> = (0..KEYS)
        .map(|key| {
            if key % 2 == 0 {
                granted(table.acquire(key, ())).waiter_id
            } else {
                table.try_acquire(key).unwrap().waiter_id
            }
        })
        .collect();
    // check_invariants is O(keys): checked at the ends only.
    step(&table);
    let stats = table.stats();
    assert_eq!(
        (stats.keys, stats.held, stats.grants),
        (50_000, 50_000, 50_000)
    );
    let mut grants = Vec::new();
    for (key, holder) in (0..KEYS).zip(holders) {
        assert_eq!(table.release(holder, &mut grants), Ok(key));
    }
    step(&table);
    assert!(grants.is_empty());
    let stats = table.stats();
    assert_eq!((stats.keys, stats.held, stats.waiting), (0, 0, 0));
}

#[test]
fn ids_number_the_acquirers_in_order_of_arrival() {
    let mut table = Table::new();
    let first = granted(table.acquire("a", "first")).waiter_id;
    assert_eq!(table.try_acquire("a"), Err(WouldBlock), "takes no number");
    let second = granted(table.acquire("b", "second")).waiter_id;
    let third = queued(table.acquire("a", "third"));
    let fourth = table.try_acquire("c").unwrap().waiter_id;
    step(&table);
    let arrivals = [first, second, third, fourth].map(WaiterId::arrival);
    assert_eq!(arrivals, [1, 2, 3, 4]);
    assert_eq!(first.to_string(), "w1");
    assert_eq!(format!("{fourth:?}"), "w4");
    assert_eq!(WaiterId::new(3), Some(third));
    assert_eq!(WaiterId::new(0), None);
}

#[test]
fn shutdown_closes_waiters_in_order_of_arrival_across_keys() {
    let mut table = Table::new();
    granted(table.acquire("a", "holder a"));
    granted(table.acquire("b", "holder b"));
    // Arrivals alternate between the keys, so neither key order nor queue order gives this.
    let labels = ["b1", "a1", "b2", "a2", "b3"];
    let waiters: Vec<WaiterId> = labels
        .iter()
        .map(|label| queued(table.acquire(&label[..1], label)))
        .collect();
    table.cancel(waiters[2], &mut Vec::new()).unwrap();
    step(&table);
    let closed = table.shutdown();
    step(&table);
    let expected: Vec<(WaiterId, &str)> = [0, 1, 3, 4]
        .into_iter()
        .map(|index| (waiters[index], labels[index]))
        .collect();
    assert_eq!(closed, expected);
    assert_eq!(table.stats().keys, 0);
}

// Permits: a key with several permits, shared and weighted requests.

/// A table whose keys have `capacity` permits.
fn table_with(capacity: u32) -> Table {
    Table::with_capacity(NonZeroU32::new(capacity).expect("a capacity above 0"))
}

#[test]
fn permits_outside_one_to_capacity_are_refused_before_reaching_the_table() {
    let table = table_with(3);
    assert_eq!(table.permits(3).map(Permits::get), Ok(3));
    assert_eq!(table.all_permits().get(), 3);
    for requested in [0, 4, u32::MAX] {
        let refused = table.permits(requested).unwrap_err();
        assert_eq!((refused.requested, refused.capacity), (requested, 3));
    }
}

#[test]
fn shared_holders_share_up_to_capacity_and_an_exclusive_waits_for_all_of_them() {
    let mut table = table_with(2);
    let one = table.permits(1).unwrap();
    let first = granted(table.acquire_permits("k", one, "reader 1"));
    let second = granted(table.acquire_permits("k", one, "reader 2"));
    step(&table);
    let stats = table.stats();
    assert_eq!(
        (stats.keys, stats.held, stats.holders, stats.permits),
        (1, 1, 2, 2)
    );
    let writer = queued(table.acquire("k", "writer"));
    step(&table);
    let mut grants = Vec::new();
    table.release(first.waiter_id, &mut grants).unwrap();
    step(&table);
    assert!(grants.is_empty(), "one reader still holds a permit");
    table.release(second.waiter_id, &mut grants).unwrap();
    step(&table);
    assert_eq!(grants.len(), 1);
    assert_eq!(
        (grants[0].waiter_id, grants[0].delivery),
        (writer, "writer")
    );
    assert!(grants[0].fencing_token > second.fencing_token);
}

/// Permits are compared as what is left of the capacity, never summed in `u32`: near
/// `u32::MAX` a sum would wrap and let a request in over the capacity.
#[test]
fn permits_near_u32_max_never_exceed_the_capacity() {
    let mut table = table_with(u32::MAX);
    let most = granted(table.acquire_permits("k", table.permits(u32::MAX - 1).unwrap(), "most"));
    let two = table.permits(2).unwrap();
    assert_eq!(table.try_acquire_permits("k", two), Err(WouldBlock));
    let waiting = queued(table.acquire_permits("k", two, "two"));
    step(&table);
    let one = granted(table.acquire_permits("j", table.permits(1).unwrap(), "elsewhere"));
    assert_eq!(table.stats().permits, u32::MAX as usize);
    let mut grants = Vec::new();
    table.release(most.waiter_id, &mut grants).unwrap();
    step(&table);
    assert_eq!(grants.len(), 1);
    assert_eq!(grants[0].waiter_id, waiting);
    assert_eq!(table.stats().permits, 3);
    table.release(one.waiter_id, &mut grants).unwrap();
    table.release(waiting, &mut grants).unwrap();
    step(&table);
    assert_eq!(table.stats().keys, 0);
}

/// With a capacity above 2^31 two exclusive requests sum past `u32::MAX`: the second must
/// wait for the first, on every path that grants (acquire, try, the queue, several keys).
#[test]
fn exclusive_locks_exclude_each_other_with_a_capacity_above_half_of_u32() {
    let mut table = table_with((1 << 31) + 1);
    let first = granted(table.acquire("k", "first"));
    assert_eq!(table.try_acquire("k"), Err(WouldBlock));
    assert_eq!(table.try_acquire_all(keys(&["k", "j"])), Err(WouldBlock));
    let second = queued(table.acquire("k", "second"));
    step(&table);
    let mut grants = Vec::new();
    table.release(first.waiter_id, &mut grants).unwrap();
    step(&table);
    assert_eq!(grants.len(), 1);
    assert_eq!(grants[0].waiter_id, second);
    assert_eq!(table.stats().holders, 1);
}

/// Ported from moby/locker's RWMutex tests: a task takes the shared lock twice and then asks
/// for the exclusive lock; it stays blocked after the first shared release and proceeds after
/// the second.
#[test]
fn exclusive_after_two_shared_holds_waits_for_both_releases() {
    let mut table = table_with(2);
    let one = table.permits(1).unwrap();
    let shared = [
        granted(table.acquire_permits("k", one, "r1")).waiter_id,
        granted(table.acquire_permits("k", one, "r2")).waiter_id,
    ];
    let exclusive = queued(table.acquire("k", "w"));
    let mut grants = Vec::new();
    table.release(shared[0], &mut grants).unwrap();
    step(&table);
    assert!(
        grants.is_empty(),
        "still blocked after the first shared release"
    );
    table.release(shared[1], &mut grants).unwrap();
    step(&table);
    assert_eq!(grants[0].waiter_id, exclusive);
}

/// Ported from moby/locker: a shared request blocks while the exclusive lock is held.
#[test]
fn shared_request_waits_while_the_exclusive_lock_is_held() {
    let mut table = table_with(4);
    let one = table.permits(1).unwrap();
    let writer = granted(table.acquire("k", "w")).waiter_id;
    let reader = queued(table.acquire_permits("k", one, "r"));
    assert_eq!(table.try_acquire_permits("k", one), Err(WouldBlock));
    let mut grants = Vec::new();
    table.release(writer, &mut grants).unwrap();
    step(&table);
    assert_eq!(grants[0].waiter_id, reader);
}

#[test]
fn a_queued_writer_holds_back_every_reader_that_arrives_after_it() {
    let mut table = table_with(8);
    let one = table.permits(1).unwrap();
    let admitted = granted(table.acquire_permits("k", one, "early reader")).waiter_id;
    let writer = queued(table.acquire("k", "writer"));
    // Permits are free (7 of 8), but the writer came first.
    let late: Vec<WaiterId> = (0..5)
        .map(|_| queued(table.acquire_permits("k", one, "late reader")))
        .collect();
    assert_eq!(table.try_acquire_permits("k", one), Err(WouldBlock));
    step(&table);
    let mut grants = Vec::new();
    table.release(admitted, &mut grants).unwrap();
    step(&table);
    assert_eq!(grants.len(), 1, "only the writer");
    assert_eq!(grants[0].waiter_id, writer);
    grants.clear();
    table.release(writer, &mut grants).unwrap();
    step(&table);
    let granted_ids: Vec<WaiterId> = grants.iter().map(|grant| grant.waiter_id).collect();
    assert_eq!(
        granted_ids, late,
        "then every late reader at once, in order"
    );
}

#[test]
fn a_big_request_is_not_overtaken_and_its_cancel_lets_the_smaller_ones_through() {
    let mut table = table_with(3);
    let (one, three) = (table.permits(1).unwrap(), table.permits(3).unwrap());
    let holder = granted(table.acquire_permits("k", one, "holder")).waiter_id;
    let big = queued(table.acquire_permits("k", three, "big"));
    let small = [
        queued(table.acquire_permits("k", one, "small 1")),
        queued(table.acquire_permits("k", one, "small 2")),
    ];
    step(&table);
    assert_eq!(
        table.stats().permits,
        1,
        "two permits free, yet nobody overtakes the big one"
    );
    let mut grants = Vec::new();
    let (key, delivery) = table.cancel(big, &mut grants).unwrap();
    step(&table);
    assert_eq!((key, delivery), ("k", "big"));
    let granted_ids: Vec<WaiterId> = grants.iter().map(|grant| grant.waiter_id).collect();
    assert_eq!(
        granted_ids, small,
        "the cancel grants what now fits, in order"
    );
    assert_eq!(table.stats().permits, 3);
    grants.clear();
    for id in [holder, small[0], small[1]] {
        table.release(id, &mut grants).unwrap();
        step(&table);
    }
    assert_eq!(table.stats().keys, 0);
}

#[test]
fn releases_grant_the_front_while_it_fits_and_stop_at_the_first_that_does_not() {
    let mut table = table_with(3);
    let (one, two) = (table.permits(1).unwrap(), table.permits(2).unwrap());
    let exclusive = granted(table.acquire("k", "x")).waiter_id;
    let queued_ids = [
        queued(table.acquire_permits("k", one, "a")),
        queued(table.acquire_permits("k", one, "b")),
        queued(table.acquire_permits("k", two, "c")),
        queued(table.acquire_permits("k", one, "d")),
    ];
    let mut grants = Vec::new();
    table.release(exclusive, &mut grants).unwrap();
    step(&table);
    let granted_ids: Vec<WaiterId> = grants.iter().map(|grant| grant.waiter_id).collect();
    assert_eq!(
        granted_ids,
        queued_ids[..2],
        "c needs 2 of the 1 left; d waits behind it"
    );
    let tokens: Vec<u64> = grants.iter().map(|grant| grant.fencing_token).collect();
    assert!(tokens.windows(2).all(|pair| pair[0] < pair[1]));
}

// Several keys at once (invariant 10).

fn keys(keys: &[&'static str]) -> KeySet<&'static str> {
    KeySet::new(keys.iter().copied()).expect("at least one key")
}

fn ids<D>(grants: &[Grant<D>]) -> Vec<WaiterId> {
    grants.iter().map(|grant| grant.waiter_id).collect()
}

#[test]
fn free_keys_are_granted_together_under_one_token_and_released_together() {
    let mut table = Table::new();
    let both = granted(table.acquire_all(keys(&["a", "b"]), "both"));
    step(&table);
    assert_eq!(both.fencing_token, 1);
    assert_eq!(table.keys_of(both.waiter_id), Some(&["a", "b"][..]));
    let stats = table.stats();
    assert_eq!(
        (
            stats.keys,
            stats.held,
            stats.holders,
            stats.permits,
            stats.grants
        ),
        (2, 2, 1, 2, 1)
    );
    assert_eq!(table.try_acquire("a"), Err(WouldBlock));
    assert_eq!(table.try_acquire("b"), Err(WouldBlock));
    assert_eq!(table.release(both.waiter_id, &mut Vec::new()), Ok("a"));
    step(&table);
    assert_eq!(table.stats().keys, 0);
    assert_eq!(table.keys_of(both.waiter_id), None);
}

#[test]
fn a_set_of_one_key_is_a_plain_acquire_and_duplicates_collapse() {
    let set = keys(&["a", "a", "b", "a"]);
    assert_eq!(set.as_slice(), ["a", "b"]);
    assert!(KeySet::<&str>::new([]).is_none());
    let mut table = Table::new();
    let one = granted(table.acquire_all(keys(&["a", "a"]), "one"));
    step(&table);
    assert_eq!(table.keys_of(one.waiter_id), Some(&["a"][..]));
    assert_eq!(table.stats().holders, 1);
    let waiting = queued(table.acquire_all(keys(&["a"]), "two"));
    step(&table);
    let mut grants = Vec::new();
    table.release(one.waiter_id, &mut grants).unwrap();
    step(&table);
    assert_eq!(ids(&grants), [waiting]);
}

#[test]
fn a_group_waits_for_every_holder_and_holds_back_later_arrivals_on_free_keys() {
    let mut table = Table::new();
    let holder_a = granted(table.acquire("a", "holder a")).waiter_id;
    let group = queued(table.acquire_all(keys(&["a", "b"]), "group"));
    step(&table);
    // `b` is free, but the group waits for it first: a later acquirer queues behind.
    let later_b = queued(table.acquire("b", "later b"));
    step(&table);
    assert_eq!(table.try_acquire("b"), Err(WouldBlock));
    assert_eq!(table.try_acquire_all(keys(&["b", "c"])), Err(WouldBlock));
    assert!(!table.contains_key(&"c"), "a refused try creates nothing");
    let mut grants = Vec::new();
    table.release(holder_a, &mut grants).unwrap();
    step(&table);
    assert_eq!(ids(&grants), [group]);
    grants.clear();
    table.release(group, &mut grants).unwrap();
    step(&table);
    assert_eq!(ids(&grants), [later_b]);
}

#[test]
fn groups_listing_keys_in_opposite_orders_are_granted_in_arrival_order() {
    let mut table = Table::new();
    let holder_a = granted(table.acquire("a", "holder a")).waiter_id;
    let holder_b = granted(table.acquire("b", "holder b")).waiter_id;
    let ab = queued(table.acquire_all(keys(&["a", "b"]), "ab"));
    let ba = queued(table.acquire_all(keys(&["b", "a"]), "ba"));
    step(&table);
    let mut grants = Vec::new();
    table.release(holder_b, &mut grants).unwrap();
    step(&table);
    assert!(
        grants.is_empty(),
        "ab still waits for a; ba waits behind ab"
    );
    table.release(holder_a, &mut grants).unwrap();
    step(&table);
    assert_eq!(ids(&grants), [ab]);
    grants.clear();
    table.release(ab, &mut grants).unwrap();
    step(&table);
    assert_eq!(ids(&grants), [ba]);
    table.release(ba, &mut Vec::new()).unwrap();
    step(&table);
    assert_eq!(table.stats().keys, 0);
}

#[test]
fn a_cancelled_group_lets_the_waiters_behind_it_through_in_arrival_order() {
    let mut table = Table::new();
    let holder_c = granted(table.acquire("c", "holder c")).waiter_id;
    let group = queued(table.acquire_all(keys(&["a", "b", "c"]), "group"));
    let behind_b = queued(table.acquire("b", "behind on b"));
    let behind_a = queued(table.acquire("a", "behind on a"));
    step(&table);
    let mut grants = Vec::new();
    let (key, delivery) = table.cancel(group, &mut grants).unwrap();
    step(&table);
    assert_eq!((key, delivery), ("a", "group"));
    assert_eq!(
        ids(&grants),
        [behind_b, behind_a],
        "arrival order, whatever the order of the group's keys"
    );
    let tokens: Vec<u64> = grants.iter().map(|grant| grant.fencing_token).collect();
    assert_eq!(tokens, [2, 3]);
    for id in [holder_c, behind_b, behind_a] {
        table.release(id, &mut Vec::new()).unwrap();
        step(&table);
    }
    assert_eq!(table.stats().keys, 0);
}

#[test]
fn a_released_group_grants_a_group_behind_it_and_the_single_waiters_in_order() {
    let mut table = Table::new();
    let first = granted(table.acquire_all(keys(&["a", "b"]), "first")).waiter_id;
    let on_b = queued(table.acquire("b", "on b"));
    let second = queued(table.acquire_all(keys(&["a", "c"]), "second"));
    let on_c = queued(table.acquire("c", "on c"));
    step(&table);
    let mut grants = Vec::new();
    table.release(first, &mut grants).unwrap();
    step(&table);
    assert_eq!(ids(&grants), [on_b, second], "on c waits behind second");
    assert!(
        grants[0].fencing_token < grants[1].fencing_token,
        "tokens follow arrival"
    );
    grants.clear();
    table.release(second, &mut grants).unwrap();
    step(&table);
    assert_eq!(ids(&grants), [on_c]);
}

#[test]
fn a_group_and_shared_holders_exclude_each_other() {
    let mut table = table_with(2);
    let one = table.permits(1).unwrap();
    let reader = granted(table.acquire_permits("a", one, "reader")).waiter_id;
    let group = queued(table.acquire_all(keys(&["a", "b"]), "group"));
    let late_reader = queued(table.acquire_permits("a", one, "late reader"));
    step(&table);
    let mut grants = Vec::new();
    table.release(reader, &mut grants).unwrap();
    step(&table);
    assert_eq!(ids(&grants), [group]);
    assert_eq!(table.stats().permits, 4, "every permit of both keys");
    grants.clear();
    table.release(group, &mut grants).unwrap();
    step(&table);
    assert_eq!(ids(&grants), [late_reader]);
}

#[test]
fn shutdown_closes_a_waiting_group_once() {
    let mut table = Table::new();
    let holder = granted(table.acquire("a", "holder")).waiter_id;
    let group = queued(table.acquire_all(keys(&["a", "b"]), "group"));
    step(&table);
    assert_eq!(table.shutdown(), [(group, "group")]);
    step(&table);
    assert_eq!(
        table.release(holder, &mut Vec::new()),
        Err(WaiterError::Unknown(holder))
    );
    assert_eq!(table.stats().keys, 0);
}
