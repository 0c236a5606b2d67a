//! The lease contract, written once and run against every store: [`contract_tests!`] makes one
//! test per rule for a [`Backend`], the memory store on a paused clock and PostgreSQL on a real
//! server in real time.
//!
//! Each rule is checked both by what the stores answer and by the row it leaves (owner, fence,
//! expiry), as the backend reads it. Leases that must run out are [`SHORT_LEASE`], slept past
//! by [`PAST_SHORT_LEASE`]; the others [`LONG_LEASE`], which outlives any test.

use std::time::Duration;

use tokio::time::{sleep, timeout};

use crate::cluster::error::LeaseError;
use crate::cluster::locking::lease_store::{Fence, LeaseNotice, LeaseStore, MAX_KEY_BYTES};
use crate::cluster::locking::notices::LeaseNotices;

pub(crate) const SHORT_LEASE: Duration = Duration::from_millis(300);
pub(crate) const PAST_SHORT_LEASE: Duration = Duration::from_millis(700);
pub(crate) const LONG_LEASE: Duration = Duration::from_secs(30);
/// Generous, for a loaded machine: a notice that should take milliseconds must be there by then.
pub(crate) const BOUND: Duration = Duration::from_secs(10);

/// A lease row as a backend reads it: its owner (`None` once released) and its fence.
pub(crate) type RowView = (Option<String>, Fence);

/// One kind of lease store, as the contract tests make and inspect it.
pub(crate) trait Backend: Sized {
    type Store: LeaseStore;

    /// A fresh table, named after `test` where tables have names, and one store on it per
    /// lease length in `leases`, each its own owner, with its notices.
    async fn stores(test: &str, leases: &[Duration]) -> (Self, Vec<(Self::Store, LeaseNotices)>);

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
            renew_fails_once_another_owner_took_the_lease,
            renew_fails_once_the_lease_ran_out_even_if_nobody_took_it,
            release_keeps_the_row_and_its_fence_and_the_next_acquire_gets_the_next_fence,
            release_with_a_stale_fence_returns_false_and_changes_nothing,
            a_lease_that_ran_out_untaken_is_still_released_by_its_holder,
            release_all_releases_our_leases_and_no_one_elses,
            a_release_is_announced_to_every_store,
            a_try_takes_a_free_key_and_a_refused_try_changes_nothing,
            a_try_leaves_a_released_key_to_its_waiter_for_a_lease,
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
    assert_eq!(store.renew("k", 1).await.ok(), Some(false));
    assert_eq!(store.release("k", 1).await.ok(), Some(false));
    assert_eq!(store.renew("k", 2).await.ok(), Some(true));
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
    assert_eq!(store.renew("k", fence).await.ok(), Some(true));
    assert!(backend.expires_at("k").await > before);
}

pub(crate) async fn renew_fails_once_another_owner_took_the_lease<B: Backend>() {
    let (backend, (holder, _), (other, _)) = two::<B>("renew_taken", SHORT_LEASE).await;
    let fence = acquired(&holder, "k").await;
    sleep(PAST_SHORT_LEASE).await;
    let current = acquired(&other, "k").await;
    assert_eq!(current, fence + 1);
    let before = backend.expires_at("k").await;
    assert_eq!(holder.renew("k", fence).await.ok(), Some(false));
    // Nor with the current fence: it is not the owner.
    assert_eq!(holder.renew("k", current).await.ok(), Some(false));
    assert_eq!(backend.expires_at("k").await, before);
}

pub(crate) async fn renew_fails_once_the_lease_ran_out_even_if_nobody_took_it<B: Backend>() {
    let (_backend, stores) = B::stores("renew_expired", &[SHORT_LEASE]).await;
    let holder = &stores[0].0;
    let fence = acquired(holder, "k").await;
    sleep(PAST_SHORT_LEASE).await;
    assert_eq!(holder.renew("k", fence).await.ok(), Some(false));
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
    assert_eq!(other.renew("k", current).await.ok(), Some(true));
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
        three::<B>("try_waiter", [LONG_LEASE, LONG_LEASE, SHORT_LEASE]).await;
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
