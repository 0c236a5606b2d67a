//! The grant channel: where a waiting [`lock`](crate::LockRegistry::lock) call and the registry
//! actor meet.
//!
//! It is a oneshot channel that also knows *where the waiter is*, so that whichever side gives
//! up first learns exactly what the other must undo. A plain `tokio::sync::oneshot` cannot do
//! this: its sender learns that the receiver is gone only when it sends, and a value sent but
//! never received is dropped without a trace. Here one small mutex orders the two sides:
//!
//! | receiver gives up while the slot is | the receiver then sends | the actor, if it gets there after |
//! |---|---|---|
//! | `Sent` (actor has not seen the request) | nothing | skips the request, no entry is made |
//! | `Queued(id)` | a cancel of `id` | finds `Abandoned` when granting and releases at once |
//! | `Granted(id, token)` | a release of `id` | — |
//! | `WouldBlock` or `Closed` | nothing | — |
//!
//! The actor never learns about a give-up by any other route, and every route ends in exactly
//! one cancel or one release, so no key can be left held by a waiter that is gone.
//!
//! ## Spare slots
//!
//! Each `lock` call needs a slot that both sides can reach, so it lives on the heap. Instead of
//! freeing it, whichever side drops its [`SlotHold`] last puts it back, reset, into a small
//! per-thread stock ([`SPARE_SLOTS_PER_THREAD`]) that the next channel made on that thread
//! takes from. A slot is allocated on one worker and often let go on the other, and with the
//! system allocator those cross-thread frees are a large part of the channel's cost
//! (`docs/performance-log.md` has the runs with and without the stock). A slot is reused
//! only when nobody else holds it (`Arc::get_mut`), so no state can leak from one lock call
//! to the next. Every way a side lets go (a grant, a give-up, a drop) ends in that one `Drop`.

use std::cell::RefCell;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use crate::table::WaiterId;

/// Spare slots kept per thread: at most 256, 16 KiB on a 64-bit target (a slot is an `Arc`'s two
/// counts, the mutex, and the slot's state and waker: 64 bytes there). A worker running
/// hundreds of lock calls takes slots in bursts as their tasks run and gets them back in bursts
/// as grants arrive, so the stock must cover a burst. Beyond it, slots are allocated and freed.
pub(crate) const SPARE_SLOTS_PER_THREAD: usize = 256;

thread_local! {
    /// Slots nobody holds any more, reset to [`Slot::FRESH`], for the next channel made here.
    static SPARE_SLOTS: RefCell<Vec<Arc<Mutex<Slot>>>> = const { RefCell::new(Vec::new()) };
}

/// Creates a grant channel for one acquire request that is on its way to the owner.
pub(crate) fn channel() -> (GrantSender, GrantReceiver) {
    channel_in(SlotState::Sent)
}

/// Creates a grant channel for a request the owner has just queued under `waiter_id`, by a
/// caller that runs the step itself: nobody else knows the channel yet, so it starts queued.
pub(crate) fn queued_channel(waiter_id: WaiterId) -> (GrantSender, GrantReceiver) {
    channel_in(SlotState::Queued(waiter_id))
}

fn channel_in(state: SlotState) -> (GrantSender, GrantReceiver) {
    // `try_with` fails only while the thread is being torn down; then allocate.
    let spare = SPARE_SLOTS
        .try_with(|spare| spare.borrow_mut().pop())
        .ok()
        .flatten();
    let mut slot = spare.unwrap_or_else(|| Arc::new(Mutex::new(Slot::FRESH)));
    // A new or spare slot is held by nobody else, so it needs no locking.
    if let Some(unshared) = Arc::get_mut(&mut slot) {
        unshared_slot(unshared).state = state;
    }
    (
        GrantSender {
            slot: Some(SlotHold(Arc::clone(&slot))),
        },
        GrantReceiver {
            slot: Some(SlotHold(slot)),
        },
    )
}

/// A grant as delivered: who holds the key now and under which fencing token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Granted {
    pub(crate) waiter_id: WaiterId,
    pub(crate) fencing_token: u64,
}

/// Why a grant channel resolved without a grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NotGranted {
    /// A try-acquire found the key taken.
    WouldBlock,
    /// The registry stopped (or dropped the request) before granting.
    Closed,
}

/// The receiver gave up before the grant arrived; the caller must undo the grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Abandoned;

/// What the receiver must tell the actor after giving up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Undo {
    /// Nothing: the actor has not enqueued the request or will never grant it.
    Nothing,
    /// Withdraw this waiter from its queue.
    Cancel(WaiterId),
    /// Release the key this waiter was granted but never received.
    Release(WaiterId),
}

#[derive(Debug)]
struct Slot {
    state: SlotState,
    waker: Option<Waker>,
}

impl Slot {
    /// A slot as a new channel starts: request sent, nobody waiting yet.
    const FRESH: Slot = Slot {
        state: SlotState::Sent,
        waker: None,
    };
}

/// One side's hold on a channel's slot. Dropping the last hold resets the slot and keeps it
/// as a spare for this thread, if there is room; otherwise it is freed.
struct SlotHold(Arc<Mutex<Slot>>);

impl SlotHold {
    fn lock(&self) -> MutexGuard<'_, Slot> {
        // No code runs under this lock that can panic, so poisoning cannot happen; if it ever
        // did, the state is still a plain value and safe to use.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for SlotHold {
    fn drop(&mut self) {
        // The other side still holds it: its drop decides. (If both drop at the same moment,
        // each may see the other's hold and neither keeps it: the slot is then just freed.)
        let Some(unshared) = Arc::get_mut(&mut self.0) else {
            return;
        };
        // The waker goes now, not when the slot is reused: it keeps the previous caller's task
        // alive.
        *unshared_slot(unshared) = Slot::FRESH;
        // The stock's reference outlives this hold, whose own ends when `drop` returns.
        let spare = Arc::clone(&self.0);
        let _ = SPARE_SLOTS.try_with(|stock| {
            let mut stock = stock.borrow_mut();
            if stock.len() < SPARE_SLOTS_PER_THREAD {
                stock.push(spare);
            }
        });
    }
}

/// The slot behind a mutex nobody else can reach. Poisoning cannot happen (no code that can
/// panic runs under the lock); if it ever did, the state is still a plain value.
fn unshared_slot(slot: &mut Mutex<Slot>) -> &mut Slot {
    slot.get_mut().unwrap_or_else(PoisonError::into_inner)
}

impl fmt::Debug for SlotHold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    /// The request is on its way to the actor.
    Sent,
    /// The actor queued the request under this id.
    Queued(WaiterId),
    /// The actor granted the key; the receiver has not taken the grant yet.
    Granted(Granted),
    /// The receiver took the grant: nothing is left to undo on either side.
    Received,
    /// The receiver gave up; the actor undoes whatever it does next for this request.
    Abandoned,
    /// The actor refused a try-acquire: the key was taken.
    WouldBlock,
    /// The actor will never grant this request.
    Closed,
}

/// The actor's end. Dropping it without granting closes the channel, so a waiter whose request
/// is lost (actor stopped, message dropped) gets [`NotGranted::Closed`] instead of waiting forever.
#[derive(Debug)]
pub(crate) struct GrantSender {
    /// `None` once a grant or a would-block was given, so that the drop need not take the lock
    /// again to find out (one lock fewer per lock call, and no flag to make records larger).
    slot: Option<SlotHold>,
}

impl GrantSender {
    /// Whether the receiver has given up already.
    pub(crate) fn is_abandoned(&self) -> bool {
        self.slot
            .as_ref()
            .is_none_or(|slot| slot.lock().state == SlotState::Abandoned)
    }

    /// A way for the owner to see, after granting, whether the receiver took the grant.
    /// `None` once a grant or a would-block was given.
    pub(crate) fn pickup_check(&self) -> Option<PickupCheck> {
        self.slot
            .as_ref()
            .map(|slot| PickupCheck(SlotHold(Arc::clone(&slot.0))))
    }

    /// Records that the request waits under `waiter_id`, so that a give-up becomes a cancel.
    ///
    /// # Errors
    ///
    /// [`Abandoned`] if the receiver already gave up: the caller must cancel `waiter_id`.
    pub(crate) fn queued(&self, waiter_id: WaiterId) -> Result<(), Abandoned> {
        let Some(slot) = &self.slot else {
            return Err(Abandoned);
        };
        let mut slot = slot.lock();
        match slot.state {
            SlotState::Sent => {
                slot.state = SlotState::Queued(waiter_id);
                Ok(())
            }
            _ => Err(Abandoned),
        }
    }

    /// Delivers the grant and returns the receiver's waker, for the owner to wake once it has
    /// let go of the run token.
    ///
    /// # Errors
    ///
    /// [`Abandoned`] if the receiver gave up: the caller must release `granted.waiter_id` itself.
    pub(crate) fn grant(mut self, granted: Granted) -> Result<Option<Waker>, Abandoned> {
        // Taken: either way nothing is left for the drop to resolve.
        let Some(slot) = self.slot.take() else {
            return Err(Abandoned);
        };
        let mut slot_state = slot.lock();
        if slot_state.state == SlotState::Abandoned {
            return Err(Abandoned);
        }
        slot_state.state = SlotState::Granted(granted);
        Ok(slot_state.waker.take())
    }

    /// Answers a try-acquire with "the key is taken" and returns the receiver's waker, for
    /// the owner to wake once it has let go of the run token.
    pub(crate) fn would_block(mut self) -> Option<Waker> {
        let slot = self.slot.take()?;
        resolve_unless_granted(&slot, SlotState::WouldBlock)
    }
}

/// The owner's look at a channel it granted through: whether the grant still waits for its
/// receiver. Holding it keeps the slot from being reused; the last hold recycles it as usual.
#[derive(Debug)]
pub(crate) struct PickupCheck(SlotHold);

impl PickupCheck {
    /// Whether the grant was made and its receiver has neither taken it nor given up.
    pub(crate) fn is_waiting(&self) -> bool {
        matches!(self.0.lock().state, SlotState::Granted(_))
    }
}

/// Moves an unresolved slot to `state` and returns the receiver's waker; a slot that was
/// granted, received or abandoned is left as it is.
fn resolve_unless_granted(slot: &SlotHold, state: SlotState) -> Option<Waker> {
    let mut slot = slot.lock();
    match slot.state {
        SlotState::Sent | SlotState::Queued(_) => {
            slot.state = state;
            slot.waker.take()
        }
        _ => None,
    }
}

impl Drop for GrantSender {
    fn drop(&mut self) {
        // A channel dropped unresolved: its request was dropped with a closing registry.
        if let Some(slot) = self.slot.take()
            && let Some(waker) = resolve_unless_granted(&slot, SlotState::Closed)
        {
            waker.wake();
        }
    }
}

/// The waiting side. It does not undo anything by itself: [`abandon`](Self::abandon) says what
/// the owner must send to the actor, which keeps this module free of the actor's types.
#[derive(Debug)]
pub(crate) struct GrantReceiver {
    /// `None` once `poll_grant` returned `Ready` or the receiver gave up: nothing is left to
    /// undo, and [`abandon`](Self::abandon) need not take the lock (one lock fewer per lock call).
    slot: Option<SlotHold>,
}

impl GrantReceiver {
    /// Polls for the grant.
    pub(crate) fn poll_grant(&mut self, cx: &mut Context<'_>) -> Poll<Result<Granted, NotGranted>> {
        // Polled after completion or after giving up: behave like a closed channel rather
        // than panic.
        let Some(slot) = &self.slot else {
            return Poll::Ready(Err(NotGranted::Closed));
        };
        let outcome = {
            let mut slot = slot.lock();
            match slot.state {
                SlotState::Granted(granted) => {
                    slot.state = SlotState::Received;
                    Ok(granted)
                }
                SlotState::Closed | SlotState::Received | SlotState::Abandoned => {
                    Err(NotGranted::Closed)
                }
                SlotState::WouldBlock => Err(NotGranted::WouldBlock),
                SlotState::Sent | SlotState::Queued(_) => {
                    match &mut slot.waker {
                        Some(waker) if waker.will_wake(cx.waker()) => {}
                        waker => *waker = Some(cx.waker().clone()),
                    }
                    return Poll::Pending;
                }
            }
        };
        self.slot = None;
        Poll::Ready(outcome)
    }

    /// Gives up on the grant and says what the actor must be told so that nothing is left
    /// behind. Idempotent: a second call returns [`Undo::Nothing`].
    pub(crate) fn abandon(&mut self) -> Undo {
        let Some(slot) = self.slot.take() else {
            return Undo::Nothing;
        };
        let mut slot = slot.lock();
        let undo = match slot.state {
            SlotState::Sent => Undo::Nothing,
            SlotState::Queued(waiter_id) => Undo::Cancel(waiter_id),
            SlotState::Granted(granted) => Undo::Release(granted.waiter_id),
            SlotState::Received
            | SlotState::Abandoned
            | SlotState::WouldBlock
            | SlotState::Closed => return Undo::Nothing,
        };
        slot.state = SlotState::Abandoned;
        slot.waker = None;
        undo
    }
}

#[cfg(test)]
mod tests {
    use std::task::Poll;

    use tokio_test::task;

    use super::*;

    fn waiter(n: u64) -> WaiterId {
        WaiterId::new(n).expect("test ids count from 1")
    }

    fn granted(n: u64) -> Granted {
        Granted {
            waiter_id: waiter(n),
            fencing_token: n,
        }
    }

    #[test]
    fn grant_wakes_the_waiting_receiver() {
        let (sender, mut receiver) = channel();
        let mut wait = task::spawn(std::future::poll_fn(|cx| receiver.poll_grant(cx)));
        assert!(wait.poll().is_pending());
        sender.queued(waiter(1)).unwrap();
        let waker = sender.grant(granted(1)).unwrap();
        assert!(
            !wait.is_woken(),
            "the owner wakes, after letting go of the token"
        );
        waker.expect("the receiver's waker").wake();
        assert!(wait.is_woken());
        assert_eq!(wait.poll(), Poll::Ready(Ok(granted(1))));
    }

    #[test]
    fn a_channel_made_by_the_step_that_queued_it_starts_queued() {
        let (sender, mut receiver) = queued_channel(waiter(9));
        assert!(!sender.is_abandoned());
        assert_eq!(receiver.abandon(), Undo::Cancel(waiter(9)));
        assert!(sender.is_abandoned());
    }

    #[test]
    fn giving_up_before_the_actor_sees_the_request_needs_no_undo() {
        let (sender, mut receiver) = channel();
        assert_eq!(receiver.abandon(), Undo::Nothing);
        assert!(sender.is_abandoned());
        assert_eq!(sender.queued(waiter(1)), Err(Abandoned));
    }

    #[test]
    fn giving_up_while_queued_cancels_and_a_later_grant_is_refused() {
        let (sender, mut receiver) = channel();
        sender.queued(waiter(7)).unwrap();
        assert_eq!(receiver.abandon(), Undo::Cancel(waiter(7)));
        assert!(matches!(sender.grant(granted(7)), Err(Abandoned)));
    }

    #[test]
    fn giving_up_with_a_grant_in_flight_releases_it() {
        let (sender, mut receiver) = channel();
        sender.queued(waiter(3)).unwrap();
        sender.grant(granted(3)).unwrap();
        assert_eq!(receiver.abandon(), Undo::Release(waiter(3)));
        assert_eq!(receiver.abandon(), Undo::Nothing, "abandon is idempotent");
    }

    #[test]
    fn a_received_grant_needs_no_undo() {
        let (sender, mut receiver) = channel();
        sender.grant(granted(2)).unwrap();
        let mut wait = task::spawn(std::future::poll_fn(|cx| receiver.poll_grant(cx)));
        assert_eq!(wait.poll(), Poll::Ready(Ok(granted(2))));
        drop(wait);
        assert_eq!(receiver.abandon(), Undo::Nothing);
    }

    #[test]
    fn dropping_the_sender_unresolved_closes_and_wakes() {
        let (sender, mut receiver) = channel();
        let mut wait = task::spawn(std::future::poll_fn(|cx| receiver.poll_grant(cx)));
        assert!(wait.poll().is_pending());
        sender.queued(waiter(1)).unwrap();
        drop(sender);
        assert!(wait.is_woken());
        assert_eq!(wait.poll(), Poll::Ready(Err(NotGranted::Closed)));
    }

    #[test]
    fn would_block_wakes_the_receiver_and_needs_no_undo() {
        let (sender, mut receiver) = channel();
        let mut wait = task::spawn(std::future::poll_fn(|cx| receiver.poll_grant(cx)));
        assert!(wait.poll().is_pending());
        sender.would_block().expect("the receiver's waker").wake();
        assert!(wait.is_woken());
        assert_eq!(wait.poll(), Poll::Ready(Err(NotGranted::WouldBlock)));
        drop(wait);
        assert_eq!(receiver.abandon(), Undo::Nothing);
    }

    /// The slot behind a receiver, to tell whether two channels share one.
    fn slot_of(receiver: &GrantReceiver) -> *const Mutex<Slot> {
        Arc::as_ptr(
            &receiver
                .slot
                .as_ref()
                .expect("the receiver holds its slot")
                .0,
        )
    }

    fn clear_spare_slots() {
        SPARE_SLOTS.with(|spare| spare.borrow_mut().clear());
    }

    #[test]
    fn a_slot_both_sides_let_go_of_is_reused_and_starts_fresh() {
        clear_spare_slots();
        let (sender, mut receiver) = channel();
        let first = slot_of(&receiver);
        let mut wait = task::spawn(std::future::poll_fn(|cx| receiver.poll_grant(cx)));
        assert!(wait.poll().is_pending(), "a waker is stored in the slot");
        sender.queued(waiter(1)).unwrap();
        sender.grant(granted(1)).unwrap();
        assert_eq!(wait.poll(), Poll::Ready(Ok(granted(1))));
        drop(wait);

        let (sender, mut receiver) = channel();
        assert_eq!(slot_of(&receiver), first, "the spare slot is taken");
        let slot = receiver.slot.as_ref().unwrap().lock();
        assert_eq!(slot.state, SlotState::Sent);
        assert!(
            slot.waker.is_none(),
            "the previous caller's waker was dropped"
        );
        drop(slot);
        // And it works like a new one.
        assert!(!sender.is_abandoned());
        sender.grant(granted(2)).unwrap();
        let mut wait = task::spawn(std::future::poll_fn(|cx| receiver.poll_grant(cx)));
        assert_eq!(wait.poll(), Poll::Ready(Ok(granted(2))));
    }

    #[test]
    fn a_slot_the_other_side_still_holds_is_not_reused() {
        clear_spare_slots();
        let (sender, mut receiver) = channel();
        let abandoned = slot_of(&receiver);
        sender.queued(waiter(5)).unwrap();
        assert_eq!(receiver.abandon(), Undo::Cancel(waiter(5)));
        let (_other_sender, other_receiver) = channel();
        assert_ne!(
            slot_of(&other_receiver),
            abandoned,
            "the actor still holds it"
        );
        // The actor's side sees the give-up, then lets go last: now it is a spare.
        assert!(sender.is_abandoned());
        assert!(matches!(sender.grant(granted(5)), Err(Abandoned)));
        let (_sender, receiver) = channel();
        assert_eq!(slot_of(&receiver), abandoned);
    }

    #[test]
    fn spare_slots_are_bounded_per_thread() {
        clear_spare_slots();
        let channels: Vec<_> = (0..SPARE_SLOTS_PER_THREAD + 10)
            .map(|_| channel())
            .collect();
        drop(channels);
        let spare = SPARE_SLOTS.with(|spare| spare.borrow().len());
        assert_eq!(spare, SPARE_SLOTS_PER_THREAD);
    }

    #[test]
    fn dropping_the_sender_after_granting_keeps_the_grant() {
        let (sender, mut receiver) = channel();
        sender.grant(granted(4)).unwrap();
        let mut wait = task::spawn(std::future::poll_fn(|cx| receiver.poll_grant(cx)));
        assert_eq!(wait.poll(), Poll::Ready(Ok(granted(4))));
    }
}
