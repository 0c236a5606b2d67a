//! The design's ceiling, as a contender: the smallest single-owner keyed lock that keeps FIFO
//! per key and cancel safety, stepped by the caller like our default mode, with none of our
//! promises beyond those (no fencing tokens, stats, journal, stall watch, shards, metrics,
//! spans or coop budget). One table of key -> FIFO of waiter cells behind one `parking_lot`
//! mutex; each waiter has a cell of its own, so a woken waiter reads its grant without the
//! table's lock. What separates this from `keyed-locks` on a workload is what our promises
//! cost there.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use parking_lot::Mutex;

use super::Contender;

/// One waiter's cell: what the releaser writes and the waiter reads.
enum Cell {
    /// Queued; the waker of its last poll.
    Waiting(Option<Waker>),
    /// The key is the waiter's; it has not looked yet.
    Granted,
    /// The waiter has taken its grant.
    Taken,
    /// The waiter's future was dropped: skipped by the next release.
    Abandoned,
}

/// The waiters of each held key, in arrival order. A key has an entry exactly while it is
/// held; waiters that gave up stay in the queue as abandoned cells until a release skips them.
#[derive(Default)]
struct Table {
    queues: HashMap<u64, VecDeque<Arc<Mutex<Cell>>>>,
}

impl Table {
    /// The holder of `key` lets go: the first waiter still waiting gets it, or the entry goes.
    /// The wake runs under the table's lock, as in the reference it is written from.
    fn release(&mut self, key: u64) {
        let Some(queue) = self.queues.get_mut(&key) else {
            return;
        };
        while let Some(cell) = queue.pop_front() {
            let mut state = cell.lock();
            if let Cell::Waiting(waker) = &mut *state {
                let waker = waker.take();
                *state = Cell::Granted;
                drop(state);
                if let Some(waker) = waker {
                    waker.wake();
                }
                return;
            }
        }
        self.queues.remove(&key);
    }
}

/// The single-owner stand-in.
pub struct SingleOwner {
    table: Mutex<Table>,
}

/// Holds one key of a [`SingleOwner`] until dropped.
pub struct SingleOwnerGuard<'a> {
    owner: &'a SingleOwner,
    key: u64,
}

impl Drop for SingleOwnerGuard<'_> {
    fn drop(&mut self) {
        self.owner.table.lock().release(self.key);
    }
}

/// A queued waiter: reads its own cell; dropped after its grant, it passes the key on.
struct Wait<'a> {
    owner: &'a SingleOwner,
    key: u64,
    cell: Option<Arc<Mutex<Cell>>>,
}

impl Future for Wait<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<()> {
        let Some(cell) = self.cell.as_ref() else {
            return Poll::Ready(());
        };
        let mut state = cell.lock();
        match &mut *state {
            Cell::Waiting(waker) => {
                if !waker
                    .as_ref()
                    .is_some_and(|waker| waker.will_wake(context.waker()))
                {
                    *waker = Some(context.waker().clone());
                }
                Poll::Pending
            }
            // Granted (taken now), or an impossible state, which ends the wait all the same.
            _ => {
                *state = Cell::Taken;
                drop(state);
                self.cell = None;
                Poll::Ready(())
            }
        }
    }
}

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        let Some(cell) = self.cell.take() else {
            return;
        };
        let granted = {
            let mut state = cell.lock();
            let granted = matches!(*state, Cell::Granted);
            *state = Cell::Abandoned;
            granted
        };
        if granted {
            // A grant in flight to a future that went away: pass the key on.
            self.owner.table.lock().release(self.key);
        }
    }
}

impl SingleOwner {
    /// Waits until `key` is the caller's; the caller then owes the key one release.
    async fn acquire(&self, key: u64) {
        let cell = match self.table.lock().queues.entry(key) {
            Entry::Vacant(vacant) => {
                vacant.insert(VecDeque::new());
                None
            }
            Entry::Occupied(mut occupied) => {
                let cell = Arc::new(Mutex::new(Cell::Waiting(None)));
                occupied.get_mut().push_back(Arc::clone(&cell));
                Some(cell)
            }
        };
        if let Some(cell) = cell {
            Wait {
                owner: self,
                key,
                cell: Some(cell),
            }
            .await;
        }
    }
}

impl Contender for SingleOwner {
    const NAME: &'static str = "single-owner-stand-in";
    type Guard<'a> = SingleOwnerGuard<'a>;

    fn new(_keys: usize) -> Self {
        SingleOwner {
            table: Mutex::new(Table::default()),
        }
    }

    async fn lock(&self, key: u64) -> Self::Guard<'_> {
        self.acquire(key).await;
        SingleOwnerGuard { owner: self, key }
    }

    async fn entries(&self) -> Option<usize> {
        Some(self.table.lock().queues.len())
    }
}

/// The stand-in held to two terms of this crate's API that cost on every lock: a guard that
/// owns its hold (`'static`, so that it can move into a spawned task, at the price of an `Arc`
/// clone per grant and its drop per release, as our `KeyGuard` pays), and a unit of the task's
/// tokio budget per lock (as our registry and tokio's `Mutex` take, so that a loop of free
/// locks yields). What separates it from the stand-in is what those two terms cost; what
/// separates `keyed-locks` from it is what our other promises cost.
pub struct SingleOwnerOwned(Arc<SingleOwner>);

/// Holds one key of a [`SingleOwnerOwned`] until dropped.
pub struct SingleOwnerOwnedGuard {
    owner: Arc<SingleOwner>,
    key: u64,
}

impl Drop for SingleOwnerOwnedGuard {
    fn drop(&mut self) {
        self.owner.table.lock().release(self.key);
    }
}

impl Contender for SingleOwnerOwned {
    const NAME: &'static str = "single-owner-owned";
    type Guard<'a> = SingleOwnerOwnedGuard;

    fn new(keys: usize) -> Self {
        SingleOwnerOwned(Arc::new(SingleOwner::new(keys)))
    }

    async fn lock(&self, key: u64) -> Self::Guard<'_> {
        self.0.acquire(key).await;
        // Made before the budget's await: if the task is dropped there, the guard releases.
        let guard = SingleOwnerOwnedGuard {
            owner: Arc::clone(&self.0),
            key,
        };
        tokio::task::coop::consume_budget().await;
        guard
    }

    async fn entries(&self) -> Option<usize> {
        self.0.entries().await
    }
}
