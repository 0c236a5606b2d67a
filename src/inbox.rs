//! The inbox: an unbounded multi-producer, single-consumer queue that the actor empties a
//! whole batch at a time.
//!
//! It replaces a tokio unbounded `mpsc` channel: tokio pops each value separately from a
//! lock-free block list, and checks it twice more each time the receiver goes to sleep.
//! The swap cut 11% of the instructions of a lock/unlock pair (ARCHITECTURE.md, "Performance"). Here a send
//! pushes onto a `Vec` under a mutex, and the receiver swaps the whole `Vec` out for its own
//! empty one, so a batch of any size costs one lock and no allocation once both vectors have
//! grown. The mutex is held for a push or a swap, never across user code, a wake or a drop.
//!
//! What it keeps from tokio's channel, because the registry relies on it:
//!
//! - **FIFO per sender, and across senders by the order their sends took the lock.** A send
//!   that returned is seen by every later receive.
//! - **Disconnection.** Once every [`Sender`] is gone (weak ones do not count), a receive on
//!   an empty inbox returns `0`: nobody can send again, so the actor stops.
//! - **Closing.** After [`Receiver::close`], or once the receiver is dropped, sends fail and
//!   hand the value back; values already queued can still be taken.
//! - **Cooperative scheduling.** A receive takes one unit of the task's tokio budget, as
//!   tokio's channels do, so an actor that is never short of work still yields now and then.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

/// Creates an inbox with one sender.
pub(crate) fn inbox<T>() -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            queue: Vec::new(),
            closed: false,
            receiver_waker: None,
        }),
        senders: AtomicUsize::new(1),
    });
    (
        Sender {
            shared: Arc::clone(&shared),
        },
        Receiver { shared },
    )
}

struct Shared<T> {
    state: Mutex<State<T>>,
    /// Strong senders alive. Changed outside the mutex; only the change to zero takes it, to
    /// wake the receiver.
    senders: AtomicUsize,
}

struct State<T> {
    /// Sent and not yet taken, oldest first.
    queue: Vec<T>,
    /// Set by the receiver: sends fail from now on.
    closed: bool,
    /// The receiver's waker while it waits on an empty queue. A send takes it, so only the
    /// first send after the receiver fell asleep pays for a wake.
    receiver_waker: Option<Waker>,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // Nothing panics under this lock (a push, a swap, a flag), so it cannot be poisoned;
        // if it ever were, the state is still consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The sending end. Cloning adds a sender; the inbox disconnects when the last one is dropped.
pub(crate) struct Sender<T> {
    shared: Arc<Shared<T>>,
}

impl<T> Sender<T> {
    /// Queues `value` and wakes the receiver if it sleeps. Never waits for room.
    ///
    /// # Errors
    ///
    /// Hands `value` back if the receiver has closed the inbox or is gone.
    pub(crate) fn send(&self, value: T) -> Result<(), T> {
        let waker = {
            let mut state = self.shared.lock();
            if state.closed {
                return Err(value);
            }
            state.queue.push(value);
            state.receiver_waker.take()
        };
        // Outside the lock: the receiver may run at once on another thread and want it.
        if let Some(waker) = waker {
            waker.wake();
        }
        Ok(())
    }

    /// Whether sends fail from now on.
    pub(crate) fn is_closed(&self) -> bool {
        self.shared.lock().closed
    }

    /// A sender that does not keep the inbox connected.
    pub(crate) fn downgrade(&self) -> WeakSender<T> {
        WeakSender {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        // Relaxed, as for `Arc`: this sender already keeps the count above zero.
        self.shared.senders.fetch_add(1, Ordering::Relaxed);
        Sender {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        if self.shared.senders.fetch_sub(1, Ordering::AcqRel) == 1 {
            // The last sender: a receiver asleep on an empty queue must learn that nothing
            // will come. Taking the waker under the lock orders this with its check of the
            // count, which it makes under the same lock before it sleeps.
            let waker = self.shared.lock().receiver_waker.take();
            if let Some(waker) = waker {
                waker.wake();
            }
        }
    }
}

impl<T> fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sender").finish_non_exhaustive()
    }
}

/// A sender that does not count: it can become a [`Sender`] again only while another is alive.
pub(crate) struct WeakSender<T> {
    shared: Arc<Shared<T>>,
}

impl<T> WeakSender<T> {
    /// A strong sender, unless every strong sender is gone (then the inbox is disconnected for
    /// good, and stays so).
    pub(crate) fn upgrade(&self) -> Option<Sender<T>> {
        let mut senders = self.shared.senders.load(Ordering::Relaxed);
        loop {
            if senders == 0 {
                return None;
            }
            match self.shared.senders.compare_exchange_weak(
                senders,
                senders + 1,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    return Some(Sender {
                        shared: Arc::clone(&self.shared),
                    });
                }
                Err(now) => senders = now,
            }
        }
    }
}

impl<T> fmt::Debug for WeakSender<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WeakSender").finish_non_exhaustive()
    }
}

/// The receiving end, owned by the actor.
pub(crate) struct Receiver<T> {
    shared: Arc<Shared<T>>,
}

impl<T> Receiver<T> {
    /// Waits until something is queued and moves all of it, oldest first, onto the end of
    /// `batch`, which should be empty (it is swapped with the queue when it is). Returns how
    /// many values were moved; `0` means the inbox is empty and every sender is gone, or it
    /// was closed.
    #[cfg(test)]
    pub(crate) async fn recv_batch(&mut self, batch: &mut Vec<T>) -> usize {
        std::future::poll_fn(|cx| self.poll_batch(cx, batch)).await
    }

    /// The poll function behind `recv_batch`: the same contract, for use inside a `poll_fn`.
    pub(crate) fn poll_batch(&mut self, cx: &mut Context<'_>, batch: &mut Vec<T>) -> Poll<usize> {
        let coop = std::task::ready!(tokio::task::coop::poll_proceed(cx));
        let mut state = self.shared.lock();
        if !state.queue.is_empty() {
            let taken = take_queue(&mut state.queue, batch);
            drop(state);
            coop.made_progress();
            return Poll::Ready(taken);
        }
        if state.closed || self.shared.senders.load(Ordering::Acquire) == 0 {
            return Poll::Ready(0);
        }
        match &mut state.receiver_waker {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            waker => *waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// Moves everything queued right now onto the end of `batch`, without waiting; returns
    /// how many values were moved.
    pub(crate) fn try_recv_batch(&mut self, batch: &mut Vec<T>) -> usize {
        let mut state = self.shared.lock();
        take_queue(&mut state.queue, batch)
    }

    /// Refuses every later send. Values already queued stay, for [`try_recv_batch`](Self::try_recv_batch).
    pub(crate) fn close(&mut self) {
        self.shared.lock().closed = true;
    }
}

/// Moves `queue` onto the end of `batch`. When `batch` is empty (the usual case) the two swap,
/// so the queue goes on in the batch's emptied allocation: the actor's batch vector and the
/// queue trade places at each batch, and once both have grown to the usual batch size neither
/// allocates again (the actor gives back what a burst beyond 1,024 requests took).
fn take_queue<T>(queue: &mut Vec<T>, batch: &mut Vec<T>) -> usize {
    let taken = queue.len();
    if batch.is_empty() {
        std::mem::swap(queue, batch);
    } else {
        batch.append(queue);
    }
    taken
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        // Values still queued are dropped here, outside the lock: their drops may wake tasks
        // that send again, and those sends must find the inbox closed, not wait for us.
        let leftover = {
            let mut state = self.shared.lock();
            state.closed = true;
            std::mem::take(&mut state.queue)
        };
        drop(leftover);
    }
}

impl<T> fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Receiver").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_test::{assert_pending, assert_ready, task};

    #[test]
    fn a_batch_is_everything_sent_in_order() {
        let (sender, mut receiver) = inbox();
        let other = sender.clone();
        sender.send(1).unwrap();
        other.send(2).unwrap();
        sender.send(3).unwrap();
        let mut batch = Vec::new();
        assert_eq!(receiver.try_recv_batch(&mut batch), 3);
        assert_eq!(batch, [1, 2, 3]);
        batch.clear();
        assert_eq!(receiver.try_recv_batch(&mut batch), 0);
        sender.send(4).unwrap();
        assert_eq!(receiver.try_recv_batch(&mut batch), 1);
        assert_eq!(batch, [4]);
    }

    #[test]
    fn a_batch_appends_when_the_buffer_is_not_empty() {
        let (sender, mut receiver) = inbox();
        let mut batch = vec![0];
        sender.send(1).unwrap();
        assert_eq!(receiver.try_recv_batch(&mut batch), 1);
        assert_eq!(batch, [0, 1]);
    }

    #[test]
    fn a_sleeping_receiver_is_woken_by_a_send() {
        let (sender, mut receiver) = inbox();
        let mut batch = Vec::new();
        let mut receive = task::spawn(receiver.recv_batch(&mut batch));
        assert_pending!(receive.poll());
        sender.send(7).unwrap();
        assert!(receive.is_woken());
        assert_eq!(assert_ready!(receive.poll()), 1);
        drop(receive);
        assert_eq!(batch, [7]);
    }

    #[test]
    fn the_receiver_learns_when_the_last_sender_goes_but_not_before() {
        let (sender, mut receiver) = inbox::<u8>();
        let weak = sender.downgrade();
        let second = weak.upgrade().expect("a sender is alive");
        let mut batch = Vec::new();
        let mut receive = task::spawn(receiver.recv_batch(&mut batch));
        assert_pending!(receive.poll());
        drop(sender);
        assert_pending!(receive.poll());
        drop(second);
        assert!(receive.is_woken());
        assert_eq!(assert_ready!(receive.poll()), 0);
        drop(receive);
        assert!(weak.upgrade().is_none(), "disconnected for good");
    }

    #[test]
    fn values_sent_before_the_last_sender_went_are_still_received() {
        let (sender, mut receiver) = inbox();
        sender.send(1).unwrap();
        drop(sender);
        let mut batch = Vec::new();
        let mut receive = task::spawn(receiver.recv_batch(&mut batch));
        assert_eq!(assert_ready!(receive.poll()), 1);
        drop(receive);
        let mut receive = task::spawn(receiver.recv_batch(&mut batch));
        assert_eq!(assert_ready!(receive.poll()), 0);
    }

    #[test]
    fn closing_refuses_later_sends_and_keeps_what_was_queued() {
        let (sender, mut receiver) = inbox();
        sender.send(1).unwrap();
        receiver.close();
        assert!(sender.is_closed());
        assert_eq!(sender.send(2), Err(2));
        let mut batch = Vec::new();
        assert_eq!(receiver.try_recv_batch(&mut batch), 1);
        assert_eq!(batch, [1]);
    }

    #[test]
    fn dropping_the_receiver_closes_and_drops_what_was_queued() {
        let (sender, receiver) = inbox();
        let value = Arc::new(());
        sender.send(Arc::clone(&value)).unwrap();
        drop(receiver);
        assert!(sender.is_closed());
        assert_eq!(Arc::strong_count(&value), 1);
        assert!(sender.send(Arc::clone(&value)).is_err());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_value_of_every_sender_arrives_once_and_in_each_senders_order() {
        const SENDERS: usize = 8;
        const EACH: usize = 20_000;
        let (sender, mut receiver) = inbox::<(usize, usize)>();
        for sender_number in 0..SENDERS {
            let sender = sender.clone();
            tokio::spawn(async move {
                for n in 0..EACH {
                    sender.send((sender_number, n)).unwrap();
                    if n % 64 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
            });
        }
        drop(sender);
        let mut next = [0usize; SENDERS];
        let mut batch = Vec::new();
        while receiver.recv_batch(&mut batch).await > 0 {
            for (sender_number, n) in batch.drain(..) {
                assert_eq!(
                    n, next[sender_number],
                    "sender {sender_number} out of order"
                );
                next[sender_number] += 1;
            }
        }
        assert_eq!(next, [EACH; SENDERS]);
    }
}
