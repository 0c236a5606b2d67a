//! Pending grants: where a waiting [`lock`](crate::LockRegistry::lock) future and the shard's
//! owner meet.
//!
//! A waiter's grant lives in a slot of its shard, under the shard's lock, and the waiting
//! future keeps only the slot's key. Both sides change a slot only while they hold the lock, so
//! whichever gives up first learns exactly what the other must undo, with no channel, no
//! allocation per waiter and no atomic of its own (tokio's `batch_semaphore` keeps its waiters
//! under its one mutex the same way):
//!
//! | the future is dropped while its slot is | the drop then | the owner, if it gets there after |
//! |---|---|---|
//! | `Sent` (actor mode: the request waits for the actor) | removes the slot | finds no slot and skips the request: no entry is made |
//! | `Queued(id)` | removes the slot and cancels `id` | (actor mode, a release queued before the cancel) grants `id`, finds no slot and releases it; the cancel then finds nothing |
//! | `Granted(grant)` | removes the slot and releases the grant | — |
//! | `WouldBlock` or `Closed` | removes the slot | — |
//!
//! A grant delivered to a slot that is gone is released on the spot: that is the grant in
//! flight whose waiter gave up, and the key passes to the next waiter. Slots are generational
//! ([`slotmap`]), so the key of a removed slot never reaches a newer waiter's slot.

use std::task::{Poll, Waker};

use slotmap::{SlotMap, new_key_type};

use crate::pure::table::WaiterId;

new_key_type! {
    /// Names one waiter's pending grant in its shard.
    pub(crate) struct PendingKey;
}

/// A grant as delivered: who holds the key now and under which fencing token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Granted {
    pub(crate) waiter_id: WaiterId,
    pub(crate) fencing_token: u64,
}

/// Why a request ended without a grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NotGranted {
    /// A try-acquire found the key taken.
    WouldBlock,
    /// The shard closed before granting.
    Closed,
}

/// The waiter gave up: its slot is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Gone;

/// What the shard must do once a waiter has given up its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Undo {
    /// Nothing: the request never reached the table, or was answered without a grant.
    Nothing,
    /// Withdraw this waiter from its queue.
    Cancel(WaiterId),
    /// Release the key this waiter was granted but never received.
    Release(WaiterId),
}

/// The pending grants of one shard.
#[derive(Debug, Default)]
pub(crate) struct PendingGrants {
    slots: SlotMap<PendingKey, Slot>,
}

#[derive(Debug)]
struct Slot {
    state: SlotState,
    /// The waiting future's waker, taken to be woken (after the shard's lock is let go) when
    /// the state leaves `Sent` or `Queued`: one wake per answer, and no clone.
    waker: Option<Waker>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    /// The request waits in the queue for the actor task.
    Sent,
    /// The table queued the request under this id.
    Queued(WaiterId),
    /// The table granted the key; the future has not taken the grant yet.
    Granted(Granted),
    /// A try-acquire found the key taken.
    WouldBlock,
    /// The shard closed: no grant will come.
    Closed,
}

impl PendingGrants {
    /// A slot for a request on its way to the actor task.
    pub(crate) fn sent(&mut self, waker: &Waker) -> PendingKey {
        self.insert(SlotState::Sent, waker)
    }

    /// A slot for a request the table has just queued under `waiter_id`.
    pub(crate) fn queued(&mut self, waiter_id: WaiterId, waker: &Waker) -> PendingKey {
        self.insert(SlotState::Queued(waiter_id), waker)
    }

    fn insert(&mut self, state: SlotState, waker: &Waker) -> PendingKey {
        self.slots.insert(Slot {
            state,
            waker: Some(waker.clone()),
        })
    }

    /// Whether the waiter of `key` has given up.
    pub(crate) fn is_gone(&self, key: PendingKey) -> bool {
        !self.slots.contains_key(key)
    }

    /// Records that the request of `key` waits under `waiter_id`, so that giving up becomes a
    /// cancel.
    ///
    /// # Errors
    ///
    /// [`Gone`] if the waiter gave up: the caller must cancel `waiter_id`.
    pub(crate) fn mark_queued(&mut self, key: PendingKey, waiter_id: WaiterId) -> Result<(), Gone> {
        let slot = self.slots.get_mut(key).ok_or(Gone)?;
        slot.state = SlotState::Queued(waiter_id);
        Ok(())
    }

    /// Delivers a grant and returns the waker to wake once the shard's lock is let go.
    ///
    /// # Errors
    ///
    /// [`Gone`] if the waiter gave up: the caller must release `granted.waiter_id`.
    pub(crate) fn grant(
        &mut self,
        key: PendingKey,
        granted: Granted,
    ) -> Result<Option<Waker>, Gone> {
        let slot = self.slots.get_mut(key).ok_or(Gone)?;
        slot.state = SlotState::Granted(granted);
        Ok(slot.waker.take())
    }

    /// Answers a try-acquire with "the key is taken"; returns the waker to wake, if the waiter
    /// is still there.
    pub(crate) fn would_block(&mut self, key: PendingKey) -> Option<Waker> {
        let slot = self.slots.get_mut(key)?;
        slot.state = SlotState::WouldBlock;
        slot.waker.take()
    }

    /// Whether the grant of `key` was made and still waits for its future: a grant nobody
    /// picked up (for the stall warnings).
    pub(crate) fn is_unpicked(&self, key: PendingKey) -> bool {
        self.slots
            .get(key)
            .is_some_and(|slot| matches!(slot.state, SlotState::Granted(_)))
    }

    /// Polls the slot of `key`: ready (and the slot removed) once the request is answered,
    /// else the waker is kept for the answer.
    pub(crate) fn poll(
        &mut self,
        key: PendingKey,
        waker: &Waker,
    ) -> Poll<Result<Granted, NotGranted>> {
        let Some(slot) = self.slots.get_mut(key) else {
            // Only a closed shard drops slots it did not answer.
            return Poll::Ready(Err(NotGranted::Closed));
        };
        let answer = match slot.state {
            SlotState::Granted(granted) => Ok(granted),
            SlotState::WouldBlock => Err(NotGranted::WouldBlock),
            SlotState::Closed => Err(NotGranted::Closed),
            SlotState::Sent | SlotState::Queued(_) => {
                match &mut slot.waker {
                    Some(kept) if kept.will_wake(waker) => {}
                    kept => *kept = Some(waker.clone()),
                }
                return Poll::Pending;
            }
        };
        self.slots.remove(key);
        Poll::Ready(answer)
    }

    /// The future of `key` gives up: removes its slot and says what the shard must undo so
    /// that nothing is left behind.
    pub(crate) fn abandon(&mut self, key: PendingKey) -> Undo {
        match self.slots.remove(key).map(|slot| slot.state) {
            Some(SlotState::Queued(waiter_id)) => Undo::Cancel(waiter_id),
            Some(SlotState::Granted(granted)) => Undo::Release(granted.waiter_id),
            Some(SlotState::Sent | SlotState::WouldBlock | SlotState::Closed) | None => {
                Undo::Nothing
            }
        }
    }

    /// Answers every slot not yet answered with [`NotGranted::Closed`], grants not yet picked
    /// up included (the table they came from is gone), and hands each waiter's waker to `wake`.
    pub(crate) fn close_all(&mut self, mut wake: impl FnMut(Waker)) {
        for slot in self.slots.values_mut() {
            match slot.state {
                SlotState::Sent | SlotState::Queued(_) | SlotState::Granted(_) => {
                    slot.state = SlotState::Closed;
                    if let Some(waker) = slot.waker.take() {
                        wake(waker);
                    }
                }
                SlotState::WouldBlock | SlotState::Closed => {}
            }
        }
    }

    /// Slots held, answered or not.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    use super::*;

    #[derive(Default)]
    struct CountingWaker(AtomicUsize);

    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn waker() -> (Arc<CountingWaker>, Waker) {
        let counter = Arc::new(CountingWaker::default());
        (Arc::clone(&counter), Waker::from(counter))
    }

    fn waiter(n: u64) -> WaiterId {
        WaiterId::new(n).expect("ids count from 1")
    }

    fn granted(n: u64) -> Granted {
        Granted {
            waiter_id: waiter(n),
            fencing_token: n,
        }
    }

    #[test]
    fn a_grant_is_taken_once_and_frees_the_slot() {
        let (_, waker) = waker();
        let mut pending = PendingGrants::default();
        let key = pending.queued(waiter(1), &waker);
        assert_eq!(pending.poll(key, &waker), Poll::Pending);
        let wake = pending.grant(key, granted(1)).expect("the waiter is there");
        assert!(wake.is_some(), "the waiter's waker, to wake after the lock");
        assert_eq!(pending.poll(key, &waker), Poll::Ready(Ok(granted(1))));
        assert_eq!(pending.len(), 0);
    }

    #[test]
    fn a_waiter_giving_up_says_what_to_undo_at_each_stage() {
        let (_, waker) = waker();
        let mut pending = PendingGrants::default();
        let sent = pending.sent(&waker);
        assert_eq!(pending.abandon(sent), Undo::Nothing);
        assert!(pending.is_gone(sent), "the actor will skip the request");
        let queued = pending.queued(waiter(2), &waker);
        assert_eq!(pending.abandon(queued), Undo::Cancel(waiter(2)));
        let in_flight = pending.queued(waiter(3), &waker);
        pending.grant(in_flight, granted(3)).expect("not gone yet");
        assert_eq!(pending.abandon(in_flight), Undo::Release(waiter(3)));
        assert_eq!(pending.len(), 0);
    }

    #[test]
    fn a_grant_to_a_waiter_that_gave_up_comes_back_to_be_released() {
        let (_, waker) = waker();
        let mut pending = PendingGrants::default();
        let key = pending.sent(&waker);
        pending.abandon(key);
        assert!(pending.grant(key, granted(1)).is_err());
        assert_eq!(pending.mark_queued(key, waiter(1)), Err(Gone));
        // A newer slot is not reachable through the old key.
        let newer = pending.sent(&waker);
        assert_ne!(newer, key);
        assert!(pending.is_gone(key));
    }

    #[test]
    fn closing_answers_every_unanswered_slot_and_wakes_its_waiter() {
        let (woken, waker) = waker();
        let mut pending = PendingGrants::default();
        let sent = pending.sent(&waker);
        let queued = pending.queued(waiter(1), &waker);
        let unpicked = pending.queued(waiter(2), &waker);
        // The grant took its waker: the waiter was woken for it already.
        let grant_wake = pending.grant(unpicked, granted(2)).expect("there");
        let mut wakers = Vec::new();
        pending.close_all(|waker| wakers.push(waker));
        wakers.into_iter().chain(grant_wake).for_each(Waker::wake);
        assert_eq!(woken.0.load(Ordering::SeqCst), 3);
        for key in [sent, queued, unpicked] {
            assert_eq!(
                pending.poll(key, &waker),
                Poll::Ready(Err(NotGranted::Closed))
            );
        }
    }
}
