//! The lease contract, written once and run against every store: [`contract_tests!`] makes one
//! test per rule for a [`Backend`], the memory store on a paused clock and PostgreSQL on a real
//! server in real time.
//!
//! Each rule is checked both by what the stores answer and by the row it leaves (owner, fence,
//! expiry), as the backend reads it. Leases that must run out are [`SHORT_LEASE`], slept past
//! by [`PAST_SHORT_LEASE`]; the others [`LONG_LEASE`], which outlives any test.

use std::num::NonZeroU32;
use std::time::Duration;

use tokio::time::{sleep, timeout};

use crate::cluster::error::LeaseError;
use crate::cluster::locking::lease_store::{
    Fence, LeaseNotice, LeaseStore, MAX_KEY_BYTES, Renewal,
};
use crate::cluster::locking::notices::LeaseNotices;

pub(crate) const SHORT_LEASE: Duration = Duration::from_millis(300);
pub(crate) const PAST_SHORT_LEASE: Duration = Duration::from_millis(700);
pub(crate) const LONG_LEASE: Duration = Duration::from_secs(30);
/// Generous, for a loaded machine: a notice that should take milliseconds must be there by then.
pub(crate) const BOUND: Duration = Duration::from_secs(10);

/// A lease row as a backend reads it: its owner (`None` once released) and its fence.
pub(crate) type RowView = (Option<String>, Fence);

/// A part lease as a backend reads it: owner, fence, permits.
pub(crate) type PartView = (String, Fence, u32);

/// One kind of lease store, as the contract tests make and inspect it.
pub(crate) trait Backend: Sized {
    type Store: LeaseStore;

    /// A fresh table of `capacity` permits per key, named after `test` where tables have
    /// names, and one store on it per lease length in `leases`, each its own owner, with its
    /// notices.
    async fn stores_with_capacity(
        test: &str,
        capacity: NonZeroU32,
        leases: &[Duration],
    ) -> (Self, Vec<(Self::Store, LeaseNotices)>);

    /// As [`stores_with_capacity`](Self::stores_with_capacity), with one permit per key.
    async fn stores(test: &str, leases: &[Duration]) -> (Self, Vec<(Self::Store, LeaseNotices)>) {
        Self::stores_with_capacity(test, NonZeroU32::MIN, leases).await
    }

    /// `key`'s part leases, live or run out, in the order they were taken.
    async fn parts(&self, key: &str) -> Vec<PartView>;

    /// The owner id that `store` writes in its rows.
    fn owner(store: &Self::Store) -> String;

    /// `key`'s row, if it was ever acquired.
    async fn row(&self, key: &str) -> Option<RowView>;

    /// When `key`'s lease runs out, as a time since some fixed instant of the backend's (only
    /// compared with another expiry of the same backend).
    async fn expires_at(&self, key: &str) -> Duration;
}

/// Makes a module `contract` of one `#[$test]` function per rule, each running the rule against
/// `$backend` (a type named in the calling module), so that `contract::` picks them all.
macro_rules! contract_tests {
    (#[$test:meta] $backend:ty) => {
        $crate::cluster::testing::contract::contract_tests!(
            @each #[$test] $backend;
            a_free_key_is_acquired_with_fence_1,
            a_live_lease_is_not_acquired_by_another_owner,
            an_expired_lease_is_acquired_by_another_owner_with_the_next_fence,
            the_holder_acquiring_again_gets_a_new_fence_and_the_old_one_is_dead,
            a_key_too_long_to_announce_is_refused_and_the_longest_allowed_works,
            renew_extends_a_live_lease_from_now,
            a_renewal_says_whether_an_acquisition_was_refused_the_key,
            renew_fails_once_another_owner_took_the_lease,
            renew_fails_once_the_lease_ran_out_even_if_nobody_took_it,
            release_keeps_the_row_and_its_fence_and_the_next_acquire_gets_the_next_fence,
            release_with_a_stale_fence_returns_false_and_changes_nothing,
            a_lease_that_ran_out_untaken_is_still_released_by_its_holder,
            release_all_releases_our_leases_and_no_one_elses,
            a_release_is_announced_to_every_store,
            a_try_takes_a_free_key_and_a_refused_try_changes_nothing,
            a_try_leaves_a_released_key_to_its_waiter_for_a_lease,
            parts_share_a_key_up_to_its_capacity_each_under_a_fence_of_its_own,
            a_whole_lease_and_part_leases_exclude_each_other,
            a_refused_larger_request_holds_back_smaller_ones_until_it_is_served,
            a_part_lease_runs_out_and_its_permits_come_back,
            only_its_owner_renews_or_releases_a_part_and_only_while_it_is_there,
            a_part_release_is_announced_when_a_request_waits,
            a_part_renewal_says_whether_a_request_waits_for_the_key,
            a_request_held_back_by_a_larger_one_hears_of_the_key_after_it,
            a_try_of_a_part_leaves_the_key_to_a_waiter_and_changes_nothing,
            release_all_releases_our_parts_too,
            a_part_of_no_permits_or_of_the_whole_capacity_is_refused,
            a_set_is_taken_whole_or_not_at_all,
            a_refused_set_waits_for_each_key_as_a_writer_does,
            a_try_of_a_set_changes_nothing_and_leaves_its_keys_to_waiters,
        );
    };
    (@each #[$test:meta] $backend:ty; $($rule:ident),* $(,)?) => {
        /// The lease contract (`lease_store::contract`), one test per rule.
        mod contract {
            use super::*;

            $(
                #[$test]
                async fn $rule() {
                    $crate::cluster::testing::contract::$rule::<$backend>().await;
                }
            )*
        }
    };
}
pub(crate) use contract_tests;

async fn acquired<S: LeaseStore>(store: &S, key: &str) -> Fence {
    match store.acquire(key).await {
        Ok(Some(fence)) => fence,
        other => panic!("acquire of {key:?}: {other:?}"),
    }
}

pub(crate) async fn next_notice(notices: &mut LeaseNotices) -> Option<LeaseNotice> {
    timeout(BOUND, notices.recv())
        .await
        .expect("a notice within the bound")
}

pub(crate) fn released(key: &str) -> Option<LeaseNotice> {
    Some(LeaseNotice::Released(key.to_owned()))
}

/// Two stores, the first with `first`'s lease, the second with a long one.
async fn two<B: Backend>(
    test: &str,
    first: Duration,
) -> (B, (B::Store, LeaseNotices), (B::Store, LeaseNotices)) {
    let (backend, stores) = B::stores(test, &[first, LONG_LEASE]).await;
    let mut stores = stores.into_iter();
    match (stores.next(), stores.next()) {
        (Some(holder), Some(other)) => (backend, holder, other),
        _ => panic!("the backend made fewer than two stores"),
    }
}

/// Three stores on one table, each its own owner, with the given leases.
async fn three<B: Backend>(test: &str, leases: [Duration; 3]) -> (B, [B::Store; 3]) {
    let (backend, stores) = B::stores(test, &leases).await;
    let stores: Vec<B::Store> = stores.into_iter().map(|(store, _notices)| store).collect();
    match <[B::Store; 3]>::try_from(stores) {
        Ok(stores) => (backend, stores),
        Err(_) => panic!("the backend made other than three stores"),
    }
}

// Acquire.

pub(crate) async fn a_free_key_is_acquired_with_fence_1<B: Backend>() {
    let (backend, stores) = B::stores("acquire_free", &[LONG_LEASE]).await;
    let store = &stores[0].0;
    assert_eq!(store.acquire("k").await.ok(), Some(Some(1)));
    assert_eq!(backend.row("k").await, Some((Some(B::owner(store)), 1)));
}

pub(crate) async fn a_live_lease_is_not_acquired_by_another_owner<B: Backend>() {
    let (backend, (holder, _), (other, _)) = two::<B>("acquire_live", LONG_LEASE).await;
    assert_eq!(acquired(&holder, "k").await, 1);
    assert_eq!(other.acquire("k").await.ok(), Some(None));
    assert_eq!(backend.row("k").await, Some((Some(B::owner(&holder)), 1)));
}

pub(crate) async fn an_expired_lease_is_acquired_by_another_owner_with_the_next_fence<
    B: Backend,
>() {
    let (backend, (holder, _), (other, _)) = two::<B>("acquire_expired", SHORT_LEASE).await;
    assert_eq!(acquired(&holder, "k").await, 1);
    sleep(PAST_SHORT_LEASE).await;
    assert_eq!(other.acquire("k").await.ok(), Some(Some(2)));
    assert_eq!(backend.row("k").await, Some((Some(B::owner(&other)), 2)));
}

pub(crate) async fn the_holder_acquiring_again_gets_a_new_fence_and_the_old_one_is_dead<
    B: Backend,
>() {
    // What makes a lost acquire reply harmless: the next acquire of ours takes the key again.
    let (_backend, stores) = B::stores("acquire_again", &[LONG_LEASE]).await;
    let store = &stores[0].0;
    assert_eq!(acquired(store, "k").await, 1);
    assert_eq!(acquired(store, "k").await, 2);
    assert_eq!(
        store.renew("k", 1).await.ok().map(Renewal::is_renewed),
        Some(false)
    );
    assert_eq!(store.release("k", 1).await.ok(), Some(false));
    assert_eq!(
        store.renew("k", 2).await.ok().map(Renewal::is_renewed),
        Some(true)
    );
}

pub(crate) async fn a_key_too_long_to_announce_is_refused_and_the_longest_allowed_works<
    B: Backend,
>() {
    let (_backend, stores) = B::stores("key_length", &[LONG_LEASE, LONG_LEASE]).await;
    let mut stores = stores.into_iter();
    let (Some((store, mut notices)), Some((other, _))) = (stores.next(), stores.next()) else {
        panic!("the backend made fewer than two stores");
    };
    let too_long = "k".repeat(MAX_KEY_BYTES + 1);
    assert!(matches!(
        store.acquire(&too_long).await,
        Err(LeaseError::KeyTooLong { .. })
    ));
    assert!(matches!(
        store.release(&too_long, 1).await,
        Err(LeaseError::KeyTooLong { .. })
    ));
    // Random-looking, so that compression cannot shrink it below PostgreSQL's index limit.
    let longest: String = (0..MAX_KEY_BYTES)
        .map(|i| char::from(b'a' + (i * 7 % 26) as u8))
        .collect();
    let fence = acquired(&store, &longest).await;
    assert_eq!(other.acquire(&longest).await.ok(), Some(None));
    assert_eq!(store.release(&longest, fence).await.ok(), Some(true));
    assert_eq!(next_notice(&mut notices).await, released(&longest));
}

// Renew.

pub(crate) async fn renew_extends_a_live_lease_from_now<B: Backend>() {
    let (backend, stores) = B::stores("renew_live", &[LONG_LEASE]).await;
    let store = &stores[0].0;
    let fence = acquired(store, "k").await;
    let before = backend.expires_at("k").await;
    sleep(Duration::from_millis(50)).await;
    assert_eq!(
        store.renew("k", fence).await.ok().map(Renewal::is_renewed),
        Some(true)
    );
    assert!(backend.expires_at("k").await > before);
}

pub(crate) async fn a_renewal_says_whether_an_acquisition_was_refused_the_key<B: Backend>() {
    // What lets a process keep its lease for its own callers while nobody else wants the key.
    let (_backend, (holder, _), (other, _)) = two::<B>("renew_wanted", LONG_LEASE).await;
    let fence = acquired(&holder, "k").await;
    let not_wanted = Some(Renewal::Renewed { wanted: false });
    assert_eq!(holder.renew("k", fence).await.ok(), not_wanted);
    // A try that is refused changes nothing: it does not wait.
    assert_eq!(other.try_acquire("k").await.ok(), Some(None));
    assert_eq!(holder.renew("k", fence).await.ok(), not_wanted);
    assert_eq!(other.acquire("k").await.ok(), Some(None));
    let wanted = Some(Renewal::Renewed { wanted: true });
    assert_eq!(holder.renew("k", fence).await.ok(), wanted);
    assert_eq!(
        holder.renew("k", fence).await.ok(),
        wanted,
        "until the key is taken"
    );
}

pub(crate) async fn renew_fails_once_another_owner_took_the_lease<B: Backend>() {
    let (backend, (holder, _), (other, _)) = two::<B>("renew_taken", SHORT_LEASE).await;
    let fence = acquired(&holder, "k").await;
    sleep(PAST_SHORT_LEASE).await;
    let current = acquired(&other, "k").await;
    assert_eq!(current, fence + 1);
    let before = backend.expires_at("k").await;
    assert_eq!(
        holder.renew("k", fence).await.ok().map(Renewal::is_renewed),
        Some(false)
    );
    // Nor with the current fence: it is not the owner.
    assert_eq!(
        holder
            .renew("k", current)
            .await
            .ok()
            .map(Renewal::is_renewed),
        Some(false)
    );
    assert_eq!(backend.expires_at("k").await, before);
}

pub(crate) async fn renew_fails_once_the_lease_ran_out_even_if_nobody_took_it<B: Backend>() {
    let (_backend, stores) = B::stores("renew_expired", &[SHORT_LEASE]).await;
    let holder = &stores[0].0;
    let fence = acquired(holder, "k").await;
    sleep(PAST_SHORT_LEASE).await;
    assert_eq!(
        holder.renew("k", fence).await.ok().map(Renewal::is_renewed),
        Some(false)
    );
}

// Release.

pub(crate) async fn release_keeps_the_row_and_its_fence_and_the_next_acquire_gets_the_next_fence<
    B: Backend,
>() {
    let (backend, (holder, _), (other, _)) = two::<B>("release_keeps", LONG_LEASE).await;
    let fence = acquired(&holder, "k").await;
    assert_eq!(holder.release("k", fence).await.ok(), Some(true));
    assert_eq!(backend.row("k").await, Some((None, 1)));
    assert_eq!(acquired(&other, "k").await, 2);
}

pub(crate) async fn release_with_a_stale_fence_returns_false_and_changes_nothing<B: Backend>() {
    let (backend, (holder, _), (other, _)) = two::<B>("release_stale", SHORT_LEASE).await;
    let stale = acquired(&holder, "k").await;
    sleep(PAST_SHORT_LEASE).await;
    let current = acquired(&other, "k").await;
    let before = (backend.row("k").await, backend.expires_at("k").await);
    assert_eq!(holder.release("k", stale).await.ok(), Some(false));
    // Nor can the stale holder release with the current fence: it is not the owner.
    assert_eq!(holder.release("k", current).await.ok(), Some(false));
    let after = (backend.row("k").await, backend.expires_at("k").await);
    assert_eq!(after, before);
    assert_eq!(
        other
            .renew("k", current)
            .await
            .ok()
            .map(Renewal::is_renewed),
        Some(true)
    );
}

pub(crate) async fn a_lease_that_ran_out_untaken_is_still_released_by_its_holder<B: Backend>() {
    let (backend, stores) = B::stores("release_expired", &[SHORT_LEASE]).await;
    let holder = &stores[0].0;
    let fence = acquired(holder, "k").await;
    sleep(PAST_SHORT_LEASE).await;
    assert_eq!(holder.release("k", fence).await.ok(), Some(true));
    assert_eq!(backend.row("k").await, Some((None, 1)));
}

pub(crate) async fn release_all_releases_our_leases_and_no_one_elses<B: Backend>() {
    let (backend, (ours, mut notices), (theirs, _)) = two::<B>("release_all", LONG_LEASE).await;
    acquired(&ours, "a").await;
    acquired(&ours, "b").await;
    acquired(&theirs, "c").await;
    // Wanted, so that their releases are announced.
    assert_eq!(theirs.acquire("a").await.ok(), Some(None));
    assert_eq!(theirs.acquire("b").await.ok(), Some(None));
    assert_eq!(ours.release_all().await.ok(), Some(2));
    assert_eq!(backend.row("a").await, Some((None, 1)));
    assert_eq!(backend.row("b").await, Some((None, 1)));
    assert_eq!(backend.row("c").await, Some((Some(B::owner(&theirs)), 1)));
    let mut announced = vec![
        next_notice(&mut notices).await,
        next_notice(&mut notices).await,
    ];
    announced.sort_by_key(|notice| format!("{notice:?}"));
    assert_eq!(announced, vec![released("a"), released("b")]);
    assert_eq!(ours.release_all().await.ok(), Some(0));
}

// Notices.

pub(crate) async fn a_release_is_announced_to_every_store<B: Backend>() {
    let (_backend, (holder, mut holder_notices), (waiter, mut waiter_notices)) =
        two::<B>("notify", LONG_LEASE).await;
    let fence = acquired(&holder, "k").await;
    assert_eq!(waiter.acquire("k").await.ok(), Some(None));
    assert_eq!(holder.release("k", fence).await.ok(), Some(true));
    assert_eq!(next_notice(&mut waiter_notices).await, released("k"));
    assert_eq!(next_notice(&mut holder_notices).await, released("k"));
}

// Try (invariant 5 of the stores).

pub(crate) async fn a_try_takes_a_free_key_and_a_refused_try_changes_nothing<B: Backend>() {
    let (backend, [holder, tryer, third]) =
        three::<B>("try_free", [LONG_LEASE, LONG_LEASE, LONG_LEASE]).await;
    assert_eq!(holder.try_acquire("k").await.ok(), Some(Some(1)));
    assert_eq!(tryer.try_acquire("k").await.ok(), Some(None));
    assert_eq!(backend.row("k").await, Some((Some(B::owner(&holder)), 1)));
    // Ours counts as free, as for an acquisition: a new fence.
    assert_eq!(holder.try_acquire("k").await.ok(), Some(Some(2)));
    assert_eq!(holder.release("k", 2).await.ok(), Some(true));
    // The refused try left no waiting mark: the released key is free for any try at once.
    assert_eq!(third.try_acquire("k").await.ok(), Some(Some(3)));
    assert_eq!(backend.row("k").await, Some((Some(B::owner(&third)), 3)));
}

pub(crate) async fn a_try_leaves_a_released_key_to_its_waiter_for_a_lease<B: Backend>() {
    // The tryer's lease is short: a waiting mark counts for one of its leases after the release.
    let (backend, [holder, waiter, tryer]) =
        three::<B>("try_waiter", [LONG_LEASE, SHORT_LEASE, SHORT_LEASE]).await;
    assert_eq!(acquired(&holder, "k").await, 1);
    assert_eq!(
        waiter.acquire("k").await.ok(),
        Some(None),
        "refused: now it waits"
    );
    assert_eq!(holder.release("k", 1).await.ok(), Some(true));
    assert_eq!(
        tryer.try_acquire("k").await.ok(),
        Some(None),
        "the waiter comes first"
    );
    assert_eq!(backend.row("k").await, Some((None, 1)));
    // A waiter that never comes back: a lease after the release, its mark no longer counts.
    sleep(PAST_SHORT_LEASE).await;
    assert_eq!(tryer.try_acquire("k").await.ok(), Some(Some(2)));
    // Taking it cleared the mark: the next holder's release is free for a try at once.
    assert_eq!(tryer.release("k", 2).await.ok(), Some(true));
    assert_eq!(waiter.try_acquire("k").await.ok(), Some(Some(3)));
}

// Part leases (invariants 6 and 7 of the stores).

fn permits(count: u32) -> NonZeroU32 {
    NonZeroU32::new(count).expect("a test asks for at least one permit")
}

async fn part<S: LeaseStore>(store: &S, key: &str, count: u32) -> Fence {
    match store.acquire_part(key, permits(count)).await {
        Ok(Some(fence)) => fence,
        other => panic!("part of {count} of {key:?}: {other:?}"),
    }
}

/// Three stores on a table of `capacity` permits per key, with the given leases.
async fn three_sharing<B: Backend>(
    test: &str,
    capacity: u32,
    leases: [Duration; 3],
) -> (B, [(B::Store, LeaseNotices); 3]) {
    let (backend, stores) = B::stores_with_capacity(test, permits(capacity), &leases).await;
    match <[(B::Store, LeaseNotices); 3]>::try_from(stores) {
        Ok(stores) => (backend, stores),
        Err(_) => panic!("the backend made other than three stores"),
    }
}

pub(crate) async fn parts_share_a_key_up_to_its_capacity_each_under_a_fence_of_its_own<
    B: Backend,
>() {
    let (backend, [(a, _), (b, _), (c, _)]) =
        three_sharing::<B>("parts_share", 3, [LONG_LEASE; 3]).await;
    assert_eq!(part(&a, "k", 2).await, 1);
    assert_eq!(part(&b, "k", 1).await, 2);
    assert_eq!(
        c.acquire_part("k", permits(1)).await.ok(),
        Some(None),
        "3 of 3 held"
    );
    assert_eq!(
        backend.parts("k").await,
        vec![(B::owner(&a), 1, 2), (B::owner(&b), 2, 1)]
    );
    assert_eq!(b.release_part("k", 2).await.ok(), Some(true));
    assert_eq!(part(&c, "k", 1).await, 3);
    // One owner may hold several parts of a key, each its own.
    assert_eq!(b.acquire_part("k", permits(1)).await.ok(), Some(None));
    assert_eq!(a.release_part("k", 1).await.ok(), Some(true));
    assert_eq!(part(&c, "k", 1).await, 4);
    assert_eq!(backend.row("k").await, Some((None, 4)));
}

pub(crate) async fn a_whole_lease_and_part_leases_exclude_each_other<B: Backend>() {
    let (_backend, [(a, _), (b, _), _]) =
        three_sharing::<B>("whole_and_parts", 2, [LONG_LEASE; 3]).await;
    assert_eq!(acquired(&a, "k").await, 1);
    assert_eq!(b.acquire_part("k", permits(1)).await.ok(), Some(None));
    // Our own whole lease counts too: a process gives it back before it takes parts.
    assert_eq!(a.acquire_part("k", permits(1)).await.ok(), Some(None));
    assert_eq!(a.release("k", 1).await.ok(), Some(true));
    assert_eq!(part(&b, "k", 1).await, 2);
    assert_eq!(a.acquire("k").await.ok(), Some(None), "a part is live");
    // Our own part counts too.
    assert_eq!(
        b.acquire("k").await.ok(),
        Some(None),
        "its own part is live"
    );
    assert_eq!(b.try_acquire("k").await.ok(), Some(None));
    assert_eq!(b.release_part("k", 2).await.ok(), Some(true));
    assert_eq!(acquired(&a, "k").await, 3);
}

pub(crate) async fn a_refused_larger_request_holds_back_smaller_ones_until_it_is_served<
    B: Backend,
>() {
    let (_backend, [(a, _), (b, _), (c, _)]) =
        three_sharing::<B>("larger_first", 3, [LONG_LEASE; 3]).await;
    assert_eq!(part(&a, "k", 2).await, 1);
    assert_eq!(
        b.acquire_part("k", permits(2)).await.ok(),
        Some(None),
        "2 + 2 > 3"
    );
    // One permit is free, but a larger request waits: it comes first.
    assert_eq!(c.acquire_part("k", permits(1)).await.ok(), Some(None));
    assert_eq!(a.release_part("k", 1).await.ok(), Some(true));
    assert_eq!(part(&b, "k", 2).await, 2);
    // Served, its mark is gone.
    assert_eq!(part(&c, "k", 1).await, 3);
    assert_eq!(b.release_part("k", 2).await.ok(), Some(true));
    // A refused whole lease is the largest request of all.
    assert_eq!(a.acquire("k").await.ok(), Some(None), "c holds a part");
    assert_eq!(b.acquire_part("k", permits(2)).await.ok(), Some(None));
    assert_eq!(c.release_part("k", 3).await.ok(), Some(true));
    assert_eq!(acquired(&a, "k").await, 4);
}

pub(crate) async fn a_part_lease_runs_out_and_its_permits_come_back<B: Backend>() {
    let (backend, [(short, _), (other, _), (third, _)]) =
        three_sharing::<B>("part_runs_out", 2, [SHORT_LEASE, LONG_LEASE, LONG_LEASE]).await;
    assert_eq!(part(&short, "k", 1).await, 1);
    assert_eq!(part(&other, "k", 1).await, 2);
    assert_eq!(third.acquire_part("k", permits(1)).await.ok(), Some(None));
    sleep(PAST_SHORT_LEASE).await;
    assert_eq!(short.renew_part("k", 1).await.ok(), Some(Renewal::Lost));
    // The refused request above was as large: it does not hold this one back.
    assert_eq!(part(&third, "k", 1).await, 3);
    // Taking it cleared the part that ran out away: not there to release.
    assert_eq!(short.release_part("k", 1).await.ok(), Some(false));
    assert_eq!(
        backend.parts("k").await,
        vec![(B::owner(&other), 2, 1), (B::owner(&third), 3, 1)]
    );
}

pub(crate) async fn only_its_owner_renews_or_releases_a_part_and_only_while_it_is_there<
    B: Backend,
>() {
    let (backend, [(a, _), (b, _), _]) = three_sharing::<B>("part_owner", 2, [LONG_LEASE; 3]).await;
    assert_eq!(part(&a, "k", 1).await, 1);
    assert_eq!(
        a.renew_part("k", 1).await.ok(),
        Some(Renewal::Renewed { wanted: false })
    );
    assert_eq!(b.renew_part("k", 1).await.ok(), Some(Renewal::Lost));
    assert_eq!(b.release_part("k", 1).await.ok(), Some(false));
    assert_eq!(
        a.renew_part("k", 2).await.ok(),
        Some(Renewal::Lost),
        "no such fence"
    );
    assert_eq!(backend.parts("k").await, vec![(B::owner(&a), 1, 1)]);
    assert_eq!(a.release_part("k", 1).await.ok(), Some(true));
    assert_eq!(
        a.release_part("k", 1).await.ok(),
        Some(false),
        "released already"
    );
    assert_eq!(a.renew_part("k", 1).await.ok(), Some(Renewal::Lost));
    assert_eq!(backend.parts("k").await, vec![]);
}

/// A process keeping a part lease for its own readers learns from its renewal that a request
/// was refused the key (here a writer's, held back by the part), so that it gives the part back.
pub(crate) async fn a_part_renewal_says_whether_a_request_waits_for_the_key<B: Backend>() {
    let (_backend, [(a, _), (writer, _), _]) =
        three_sharing::<B>("part_wanted", 2, [LONG_LEASE; 3]).await;
    assert_eq!(part(&a, "k", 1).await, 1);
    assert_eq!(
        a.renew_part("k", 1).await.ok(),
        Some(Renewal::Renewed { wanted: false }),
        "nobody was refused the key"
    );
    assert_eq!(writer.acquire("k").await.ok(), Some(None));
    assert_eq!(
        a.renew_part("k", 1).await.ok(),
        Some(Renewal::Renewed { wanted: true }),
        "the writer's refusal is waiting"
    );
    assert_eq!(a.release_part("k", 1).await.ok(), Some(true));
    assert_eq!(acquired(&writer, "k").await, 2);
}

pub(crate) async fn a_part_release_is_announced_when_a_request_waits<B: Backend>() {
    let (_backend, [(a, _), (b, _), (waiter, mut notices)]) =
        three_sharing::<B>("part_notice", 2, [LONG_LEASE; 3]).await;
    assert_eq!(part(&a, "k", 1).await, 1);
    assert_eq!(part(&b, "k", 1).await, 2);
    assert_eq!(waiter.acquire_part("k", permits(1)).await.ok(), Some(None));
    assert_eq!(a.release_part("k", 1).await.ok(), Some(true));
    assert_eq!(next_notice(&mut notices).await, released("k"));
}

pub(crate) async fn a_request_held_back_by_a_larger_one_hears_of_the_key_after_it<B: Backend>() {
    let (_backend, [(a, _), (writer, _), (reader, mut notices)]) =
        three_sharing::<B>("held_back", 3, [LONG_LEASE; 3]).await;
    assert_eq!(part(&a, "k", 2).await, 1);
    assert_eq!(writer.acquire("k").await.ok(), Some(None), "a part is live");
    assert_eq!(a.release_part("k", 1).await.ok(), Some(true));
    assert_eq!(next_notice(&mut notices).await, released("k"));
    // The reader asks first: the key is free, but the writer waits, so it is held back.
    assert_eq!(reader.acquire_part("k", permits(1)).await.ok(), Some(None));
    let fence = acquired(&writer, "k").await;
    // The reader was refused while the key was free: only the writer's release can tell it.
    assert_eq!(writer.release("k", fence).await.ok(), Some(true));
    assert_eq!(next_notice(&mut notices).await, released("k"));
    assert_eq!(part(&reader, "k", 1).await, fence + 1);
}

pub(crate) async fn a_try_of_a_part_leaves_the_key_to_a_waiter_and_changes_nothing<B: Backend>() {
    let (backend, [(a, _), (writer, _), (tryer, _)]) =
        three_sharing::<B>("part_try", 3, [LONG_LEASE, SHORT_LEASE, LONG_LEASE]).await;
    assert_eq!(
        tryer.try_acquire_part("k", permits(1)).await.ok(),
        Some(Some(1))
    );
    assert_eq!(part(&a, "k", 1).await, 2);
    assert_eq!(writer.acquire("k").await.ok(), Some(None), "parts are live");
    let before = (backend.row("k").await, backend.parts("k").await);
    // A permit is free, but a writer waits.
    assert_eq!(
        tryer.try_acquire_part("k", permits(1)).await.ok(),
        Some(None)
    );
    assert_eq!((backend.row("k").await, backend.parts("k").await), before);
    // A writer that went away: its mark counts for its own lease, no longer.
    sleep(PAST_SHORT_LEASE).await;
    assert_eq!(
        tryer.try_acquire_part("k", permits(1)).await.ok(),
        Some(Some(3))
    );
}

pub(crate) async fn release_all_releases_our_parts_too<B: Backend>() {
    let (backend, [(ours, _), (theirs, _), _]) =
        three_sharing::<B>("release_all_parts", 3, [LONG_LEASE; 3]).await;
    assert_eq!(part(&ours, "a", 1).await, 1);
    assert_eq!(part(&ours, "a", 1).await, 2);
    assert_eq!(part(&theirs, "a", 1).await, 3);
    assert_eq!(acquired(&ours, "b").await, 1);
    assert_eq!(ours.release_all().await.ok(), Some(2), "two keys");
    assert_eq!(backend.parts("a").await, vec![(B::owner(&theirs), 3, 1)]);
    assert_eq!(backend.row("b").await, Some((None, 1)));
    assert_eq!(ours.release_all().await.ok(), Some(0));
}

pub(crate) async fn a_part_of_no_permits_or_of_the_whole_capacity_is_refused<B: Backend>() {
    let (backend, [(store, _), _, _]) = three_sharing::<B>("part_range", 2, [LONG_LEASE; 3]).await;
    for count in [2, 3] {
        assert!(matches!(
            store.acquire_part("k", permits(count)).await,
            Err(LeaseError::Permits { requested, capacity: 2 }) if requested == count
        ));
        assert!(matches!(
            store.try_acquire_part("k", permits(count)).await,
            Err(LeaseError::Permits { .. })
        ));
    }
    assert_eq!(backend.row("k").await, None, "nothing was sent");
}

// Sets of keys (`acquire_all`).

fn set(keys: &[&str]) -> Vec<String> {
    keys.iter().map(|&key| key.to_owned()).collect()
}

pub(crate) async fn a_set_is_taken_whole_or_not_at_all<B: Backend>() {
    let (backend, (holder, _), (other, _)) = two::<B>("set_whole", LONG_LEASE).await;
    assert_eq!(acquired(&holder, "b").await, 1);
    assert_eq!(
        other.acquire_all(&set(&["a", "b", "c"])).await.ok(),
        Some(None)
    );
    for key in ["a", "c"] {
        let row = backend.row(key).await;
        assert!(
            row.as_ref().is_none_or(|(owner, _)| owner.is_none()),
            "{key} was taken alone: {row:?}"
        );
    }
    assert_eq!(holder.release("b", 1).await.ok(), Some(true));
    let fences = other
        .acquire_all(&set(&["a", "b", "c"]))
        .await
        .ok()
        .flatten()
        .expect("every key is free");
    assert_eq!(fences[1], 2, "b's next fence");
    for (key, fence) in ["a", "b", "c"].into_iter().zip(&fences) {
        assert_eq!(
            backend.row(key).await,
            Some((Some(B::owner(&other)), *fence))
        );
        assert_eq!(
            other.renew(key, *fence).await.ok().map(Renewal::is_renewed),
            Some(true)
        );
    }
    // Each is a whole lease of its own, released alone.
    assert_eq!(other.release("a", fences[0]).await.ok(), Some(true));
    assert_eq!(holder.acquire("a").await.ok(), Some(Some(fences[0] + 1)));
    assert_eq!(holder.acquire("c").await.ok(), Some(None));
}

pub(crate) async fn a_refused_set_waits_for_each_key_as_a_writer_does<B: Backend>() {
    let (_backend, [(holder, _), (sets, mut notices), (reader, _)]) =
        three_sharing::<B>("set_waits", 2, [LONG_LEASE; 3]).await;
    assert_eq!(acquired(&holder, "b").await, 1);
    assert_eq!(sets.acquire_all(&set(&["a", "b"])).await.ok(), Some(None));
    // "a" is free, but a set waits for it as a writer: a reader does not overtake it.
    assert_eq!(reader.acquire_part("a", permits(1)).await.ok(), Some(None));
    assert_eq!(holder.release("b", 1).await.ok(), Some(true));
    assert_eq!(next_notice(&mut notices).await, released("b"));
    assert!(
        sets.acquire_all(&set(&["a", "b"]))
            .await
            .ok()
            .flatten()
            .is_some()
    );
}

pub(crate) async fn a_try_of_a_set_changes_nothing_and_leaves_its_keys_to_waiters<B: Backend>() {
    let (backend, [(holder, _), (waiter, _), (tryer, _)]) =
        three_sharing::<B>("set_try", 1, [LONG_LEASE, SHORT_LEASE, SHORT_LEASE]).await;
    assert_eq!(acquired(&holder, "b").await, 1);
    let before = (backend.row("a").await, backend.row("b").await);
    assert_eq!(
        tryer.try_acquire_all(&set(&["a", "b"])).await.ok(),
        Some(None)
    );
    assert_eq!((backend.row("a").await, backend.row("b").await), before);
    // A waiter for "b": once released, "b" is its, not the try's.
    assert_eq!(waiter.acquire("b").await.ok(), Some(None));
    assert_eq!(holder.release("b", 1).await.ok(), Some(true));
    assert_eq!(
        tryer.try_acquire_all(&set(&["a", "b"])).await.ok(),
        Some(None)
    );
    // A waiter that went away: a lease after, the set is free for a try.
    sleep(PAST_SHORT_LEASE).await;
    let fences = tryer
        .try_acquire_all(&set(&["a", "b"]))
        .await
        .ok()
        .flatten();
    assert_eq!(fences.map(|fences| fences[1]), Some(2));
}
