//! The doorbell: a waker that remembers it was rung, so the actor looks at kameo's mailbox only
//! when something may be in it.
//!
//! The actor waits on two sources, its request inbox and kameo's mailbox, but the mailbox
//! carries only the rare public messages and stop signals. Polling it at every wake-up (one
//! pop, a waker registration and a second pop) cost a tenth of the instructions of a
//! lock/unlock pair (ARCHITECTURE.md, "Performance"). Instead the actor polls the mailbox
//! with this waker: when kameo's channel wakes it, the doorbell sets a flag and wakes the
//! actor's task, and the actor polls the mailbox again only while the flag is set.
//!
//! The rule that makes this lose nothing: *the flag is cleared only by a mailbox poll that
//! returned `Pending`*, which leaves the doorbell registered with the mailbox, so the next
//! message rings it again. A poll that returned a message leaves the flag set, since more may
//! be queued behind it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Wake, Waker};

#[derive(Debug)]
pub(crate) struct Doorbell {
    /// Set when rung; starts set, because nothing has been registered with the mailbox yet.
    rung: AtomicBool,
    /// The actor task's waker, woken on every ring.
    task: Mutex<Option<Waker>>,
}

impl Doorbell {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Doorbell {
            rung: AtomicBool::new(true),
            task: Mutex::new(None),
        })
    }

    /// Makes `waker` the one a ring wakes. Call it before [`take_ring`](Self::take_ring)
    /// when about to sleep, so that a ring in between is not lost.
    pub(crate) fn wake_on_ring(&self, waker: &Waker) {
        let mut task = self.task.lock().unwrap_or_else(PoisonError::into_inner);
        match &mut *task {
            Some(current) if current.will_wake(waker) => {}
            task => *task = Some(waker.clone()),
        }
    }

    /// Whether it was rung since the last call that returned `true`; clears the flag. The
    /// caller must then poll the mailbox and, unless that poll returns `Pending`, ring again.
    pub(crate) fn take_ring(&self) -> bool {
        self.rung.swap(false, Ordering::AcqRel)
    }

    /// Sets the flag without waking anyone: the actor is awake and will look again.
    pub(crate) fn ring_again(&self) {
        self.rung.store(true, Ordering::Release);
    }
}

impl Wake for Doorbell {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // The flag first: the task, once woken, must find it set.
        self.rung.store(true, Ordering::Release);
        let task = self
            .task
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        // Outside the lock: waking may run the task on another thread at once.
        if let Some(task) = task {
            task.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    struct CountingWaker(AtomicUsize);

    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn starts_rung_so_that_the_mailbox_is_polled_once() {
        let doorbell = Doorbell::new();
        assert!(doorbell.take_ring());
        assert!(!doorbell.take_ring());
    }

    #[test]
    fn a_ring_sets_the_flag_and_wakes_the_task() {
        let doorbell = Doorbell::new();
        doorbell.take_ring();
        let counter = Arc::new(CountingWaker(AtomicUsize::new(0)));
        doorbell.wake_on_ring(&Waker::from(Arc::clone(&counter)));
        Waker::from(Arc::clone(&doorbell)).wake();
        assert_eq!(counter.0.load(Ordering::SeqCst), 1);
        assert!(doorbell.take_ring());
        assert!(!doorbell.take_ring());
    }

    #[test]
    fn ring_again_keeps_the_mailbox_looked_at() {
        let doorbell = Doorbell::new();
        doorbell.take_ring();
        doorbell.ring_again();
        assert!(doorbell.take_ring());
    }
}
