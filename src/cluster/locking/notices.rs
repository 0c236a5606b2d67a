//! The notices channel, from the listening task to whoever waits for keys: bounded, and the
//! sender never waits.
//!
//! The listener must keep reading its connection: a listener that stops reading makes the
//! server queue notifications, and when that queue is full every NOTIFY, and so every release,
//! fails. So the channel cannot push back as a bounded `mpsc` would. Instead, past
//! [`CAPACITY`] unread notices it forgets them all and keeps one [`LeaseNotice::Missed`],
//! which tells the receiver everything it needs: re-read every key.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;
use tokio::task::AbortHandle;

use crate::cluster::locking::lease_store::LeaseNotice;

/// Unread notices kept before they collapse into one [`LeaseNotice::Missed`]: a key (up to
/// 2 KiB) each, so at most 2 MiB.
pub(crate) const CAPACITY: usize = 1024;

/// Creates a channel; [`LeaseNotices::stop_on_drop`] names the task that sends into it.
pub(crate) fn channel() -> (NoticeSender, LeaseNotices) {
    let shared = Arc::new(Shared {
        queue: Mutex::new(Queue {
            notices: VecDeque::new(),
            sender_gone: false,
        }),
        queued: Notify::new(),
    });
    (
        NoticeSender {
            shared: Arc::clone(&shared),
        },
        LeaseNotices {
            shared,
            source: None,
        },
    )
}

struct Shared {
    queue: Mutex<Queue>,
    /// Wakes the receiver: a notice was queued, or the sender is gone. `notify_one` keeps a
    /// permit when nobody waits, so a notice queued between the receiver's look at the queue
    /// and its wait is not slept through.
    queued: Notify,
}

/// Invariant: `notices` holds at most [`CAPACITY`] notices, and never two `Missed` in a row
/// (a second says nothing the first did not).
struct Queue {
    notices: VecDeque<LeaseNotice>,
    sender_gone: bool,
}

impl Shared {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        // No code panics while holding the lock; a poisoned queue is still a valid queue.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The receiving end of a lease store's notices.
///
/// Dropping it stops the listener, which has nobody left to tell.
pub(crate) struct LeaseNotices {
    shared: Arc<Shared>,
    /// The task that sends, stopped on drop.
    source: Option<AbortHandle>,
}

impl LeaseNotices {
    /// Makes dropping the notices stop `source`, the task that sends them: the sender is
    /// made first, so that the task can use it from its first message on.
    pub(crate) fn stop_on_drop(&mut self, source: AbortHandle) {
        self.source = Some(source);
    }

    /// Waits for the next notice; `None` once the store (and with it the listener) is gone and
    /// every queued notice has been read.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a notice leaves the queue only in the call that returns it.
    pub(crate) async fn recv(&mut self) -> Option<LeaseNotice> {
        loop {
            {
                let mut queue = self.shared.queue();
                if let Some(notice) = queue.notices.pop_front() {
                    return Some(notice);
                }
                if queue.sender_gone {
                    return None;
                }
            }
            self.shared.queued.notified().await;
        }
    }
}

impl Drop for LeaseNotices {
    fn drop(&mut self) {
        if let Some(source) = &self.source {
            source.abort();
        }
    }
}

impl fmt::Debug for LeaseNotices {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let queue = self.shared.queue();
        f.debug_struct("LeaseNotices")
            .field("unread", &queue.notices.len())
            .field("sender_gone", &queue.sender_gone)
            .finish()
    }
}

/// The listener's end: queues without waiting.
pub(crate) struct NoticeSender {
    shared: Arc<Shared>,
}

impl NoticeSender {
    /// Queues a notice, or, with the queue full, replaces everything unread by one `Missed`.
    pub(crate) fn send(&self, notice: LeaseNotice) {
        {
            let mut queue = self.shared.queue();
            let notices = &mut queue.notices;
            if notice == LeaseNotice::Missed && notices.back() == Some(&LeaseNotice::Missed) {
                return;
            }
            if notices.len() >= CAPACITY {
                // Whatever is unread, `Missed` makes the receiver re-read it; so does it for
                // `notice`, which is dropped too.
                notices.clear();
                notices.push_back(LeaseNotice::Missed);
            } else {
                notices.push_back(notice);
            }
            debug_assert!(notices.len() <= CAPACITY);
        }
        self.shared.queued.notify_one();
    }
}

impl Drop for NoticeSender {
    fn drop(&mut self) {
        self.shared.queue().sender_gone = true;
        self.shared.queued.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::future::pending;

    fn released(key: &str) -> LeaseNotice {
        LeaseNotice::Released(key.to_owned())
    }

    #[tokio::test]
    async fn notices_arrive_in_order_then_none_once_the_sender_is_gone() {
        let (sender, mut notices) = channel();
        sender.send(released("a"));
        sender.send(LeaseNotice::Missed);
        sender.send(released("b"));
        drop(sender);
        assert_eq!(notices.recv().await, Some(released("a")));
        assert_eq!(notices.recv().await, Some(LeaseNotice::Missed));
        assert_eq!(notices.recv().await, Some(released("b")));
        assert_eq!(notices.recv().await, None);
    }

    #[tokio::test]
    async fn a_full_queue_collapses_into_one_missed() {
        let (sender, mut notices) = channel();
        for key in 0..CAPACITY {
            sender.send(released(&key.to_string()));
        }
        sender.send(released("one too many"));
        sender.send(released("after"));
        drop(sender);
        assert_eq!(notices.recv().await, Some(LeaseNotice::Missed));
        assert_eq!(notices.recv().await, Some(released("after")));
        assert_eq!(notices.recv().await, None);
    }

    #[tokio::test]
    async fn missed_twice_in_a_row_is_kept_once() {
        let (sender, mut notices) = channel();
        sender.send(LeaseNotice::Missed);
        sender.send(LeaseNotice::Missed);
        drop(sender);
        assert_eq!(notices.recv().await, Some(LeaseNotice::Missed));
        assert_eq!(notices.recv().await, None);
    }

    #[tokio::test]
    async fn a_waiting_receiver_wakes_for_a_notice_sent_later() {
        let (sender, mut notices) = channel();
        let receiver = tokio::spawn(async move { notices.recv().await });
        tokio::task::yield_now().await;
        sender.send(released("k"));
        assert_eq!(receiver.await.ok().flatten(), Some(released("k")));
    }

    #[tokio::test]
    async fn dropping_the_receiver_stops_the_source_task() {
        let source = tokio::spawn(pending::<()>());
        let (_sender, mut notices) = channel();
        notices.stop_on_drop(source.abort_handle());
        drop(notices);
        assert!(source.await.is_err_and(|error| error.is_cancelled()));
    }
}
