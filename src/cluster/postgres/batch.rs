//! Group commit on the client: requests that arrive while a batch of the same statement is at
//! the server go together in the next one, so that many keys cost one statement and one commit.
//!
//! No timer decides when a batch leaves: the first request goes at once, and the ones that come
//! while it is under way wait for it to return, then leave together. Under a light load every
//! request is a batch of one, as fast as before; under a heavy one, each round trip carries
//! everything that queued during the last (the "natural batching" of group commit in databases).
//! Before taking a batch, the flush task yields once to the runtime, so that the callers the
//! last batch answered, which often ask again at once (a release, then the next acquisition),
//! join this batch rather than the next.
//!
//! # Invariants
//!
//! 1. At most one batch of a batcher is under way; `flushing` is set exactly while a flush task
//!    exists, so every queued request is taken by one (the task clears it under the lock, and
//!    only when the queue is empty, or when it is dropped, aborted with its runtime).
//! 2. A batch holds each [`Batched::conflict`] class at most once: the server may touch a row
//!    once per statement, and two requests for one key keep their order (the second waits for
//!    the next batch).
//! 3. Every request gets exactly one answer: the batch's answer at its position, the batch's
//!    error, or, if the flush task is gone, a closed channel.

use std::collections::HashSet;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::oneshot;

use crate::cluster::error::LeaseError;

/// A request that can share a batch with others.
pub(crate) trait Batched: Send + 'static {
    /// Requests with equal classes never share a batch (invariant 2).
    type Conflict: Hash + Eq + ?Sized;

    fn conflict(&self) -> &Self::Conflict;
}

/// Runs one batch: the answers, one per request and in their order, or the batch's error.
pub(crate) type RunBatch<Request, Answer> = dyn Fn(Vec<Request>) -> Pin<Box<dyn Future<Output = Result<Vec<Answer>, LeaseError>> + Send>>
    + Send
    + Sync;

/// What a request gets: its answer, or the error of the batch it went in (shared with the
/// batch's other requests).
pub(crate) type BatchResult<Answer> = Result<Answer, Arc<LeaseError>>;

/// Batches the requests of one statement.
pub(crate) struct Batcher<Request, Answer> {
    shared: Arc<Shared<Request, Answer>>,
}

struct Shared<Request, Answer> {
    run: Box<RunBatch<Request, Answer>>,
    queue: Mutex<Queue<Request, Answer>>,
}

struct Queue<Request, Answer> {
    waiting: Vec<(Request, oneshot::Sender<BatchResult<Answer>>)>,
    /// Whether a flush task is running (invariant 1).
    flushing: bool,
}

impl<Request: Batched, Answer: Send + 'static> Batcher<Request, Answer> {
    /// A batcher that runs each batch with `run`.
    pub(crate) fn new(run: Box<RunBatch<Request, Answer>>) -> Self {
        Batcher {
            shared: Arc::new(Shared {
                run,
                queue: Mutex::new(Queue {
                    waiting: Vec::new(),
                    flushing: false,
                }),
            }),
        }
    }

    /// Sends `request` in the next batch and waits for its answer.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves the request in its batch: it is sent all the same, and its
    /// answer dropped.
    pub(crate) async fn submit(&self, request: Request) -> BatchResult<Answer> {
        let (answer, answered) = oneshot::channel();
        let start_flushing = {
            let mut queue = self.shared.queue();
            queue.waiting.push((request, answer));
            !std::mem::replace(&mut queue.flushing, true)
        };
        if start_flushing {
            tokio::spawn(flush(Arc::clone(&self.shared)));
        }
        answered
            .await
            .unwrap_or_else(|_| Err(Arc::new(LeaseError::BatchDropped)))
    }
}

impl<Request, Answer> Shared<Request, Answer> {
    fn queue(&self) -> MutexGuard<'_, Queue<Request, Answer>> {
        // Nothing panics under this lock (no user code runs under it).
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Clears `flushing` if the flush task ends without doing so (aborted with its runtime), and
/// drops the requests still queued, whose callers then learn the batch is gone (invariant 3).
struct FlushingFlag<'a, Request, Answer> {
    shared: &'a Shared<Request, Answer>,
    cleared: bool,
}

impl<Request, Answer> Drop for FlushingFlag<'_, Request, Answer> {
    fn drop(&mut self) {
        if !self.cleared {
            let mut queue = self.shared.queue();
            queue.flushing = false;
            queue.waiting.clear();
        }
    }
}

/// Sends batches until the queue is empty.
async fn flush<Request: Batched, Answer>(shared: Arc<Shared<Request, Answer>>) {
    let mut flag = FlushingFlag {
        shared: &shared,
        cleared: false,
    };
    loop {
        // The callers just answered run before the next batch is taken: each sends its next
        // request (a release, its next acquisition) into it, instead of into the one after.
        tokio::task::yield_now().await;
        let batch = {
            let mut queue = shared.queue();
            if queue.waiting.is_empty() {
                queue.flushing = false;
                flag.cleared = true;
                return;
            }
            take_batch(&mut queue.waiting)
        };
        let (requests, answers): (Vec<Request>, Vec<_>) = batch.into_iter().unzip();
        let sent = requests.len();
        let replies = match (shared.run)(requests).await {
            Ok(replies) if replies.len() != sent => Err(LeaseError::BatchAnswers {
                sent,
                answered: replies.len(),
            }),
            replies => replies,
        };
        // A caller that went away does not want its answer.
        match replies {
            Ok(replies) => {
                for (answer, reply) in answers.into_iter().zip(replies) {
                    let _ = answer.send(Ok(reply));
                }
            }
            Err(error) => {
                let error = Arc::new(error);
                for answer in answers {
                    let _ = answer.send(Err(Arc::clone(&error)));
                }
            }
        }
    }
}

/// Takes from `waiting`, in order, every request whose conflict class is not in the batch yet
/// (invariant 2); the others stay, in order, for the next batch.
fn take_batch<Request: Batched, Answer>(
    waiting: &mut Vec<(Request, Answer)>,
) -> Vec<(Request, Answer)> {
    // Which to take, decided while the classes are borrowed from `waiting`.
    let mut classes = HashSet::new();
    let taken: Vec<bool> = waiting
        .iter()
        .map(|(request, _)| classes.insert(request.conflict()))
        .collect();
    drop(classes);
    let mut taken = taken.into_iter();
    let (batch, rest): (Vec<_>, Vec<_>) = std::mem::take(waiting)
        .into_iter()
        .partition(|_| taken.next().unwrap_or(false));
    *waiting = rest;
    batch
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    impl Batched for String {
        type Conflict = str;

        fn conflict(&self) -> &str {
            self
        }
    }

    /// The batches a batcher sent, in order.
    type Sent = Arc<Mutex<Vec<Vec<String>>>>;

    /// A batcher that answers each key with its batch's number and length, and records the
    /// batches.
    fn numbering() -> (Batcher<String, (usize, usize)>, Sent) {
        let batches = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&batches);
        let counter = Arc::new(AtomicUsize::new(0));
        let batcher = Batcher::new(Box::new(move |keys: Vec<String>| {
            let number = counter.fetch_add(1, Ordering::SeqCst);
            seen.lock().unwrap().push(keys.clone());
            Box::pin(async move {
                // A round trip: the requests that come meanwhile make the next batch.
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                Ok(vec![(number, keys.len()); keys.len()])
            })
        }));
        (batcher, batches)
    }

    #[tokio::test(start_paused = true)]
    async fn requests_that_come_during_a_batch_leave_together_in_the_next() {
        let (batcher, batches) = numbering();
        let batcher = Arc::new(batcher);
        let submit = |n: usize| {
            let batcher = Arc::clone(&batcher);
            tokio::spawn(async move { batcher.submit(format!("k{n}")).await })
        };
        let mut requests = vec![submit(0)];
        // Let the first leave (its flush task takes it) before the others come.
        for _ in 0..3 {
            tokio::task::yield_now().await;
        }
        requests.extend((1..10).map(submit));
        let mut answers = Vec::new();
        for request in requests {
            answers.push(request.await.unwrap().unwrap());
        }
        // The first goes alone at once; the nine that queued behind it go as one.
        assert_eq!(answers[0], (0, 1));
        assert!(
            answers[1..].iter().all(|&answer| answer == (1, 9)),
            "{answers:?}"
        );
        assert_eq!(batches.lock().unwrap().len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn callers_that_ask_again_once_answered_join_the_next_batch() {
        let (batcher, batches) = numbering();
        let batcher = Arc::new(batcher);
        // Three callers that each ask twice, the second time as soon as the first is answered.
        let callers: Vec<_> = ["a", "b", "c"]
            .into_iter()
            .map(|name| {
                let batcher = Arc::clone(&batcher);
                tokio::spawn(async move {
                    batcher.submit(format!("{name}0")).await.unwrap();
                    batcher.submit(format!("{name}1")).await.unwrap();
                })
            })
            .collect();
        // And one that comes while the first batch is at the server.
        let during = {
            let batcher = Arc::clone(&batcher);
            tokio::spawn(async move {
                tokio::time::sleep(std::time::Duration::from_micros(500)).await;
                batcher.submit("r".to_owned()).await.unwrap();
            })
        };
        for caller in callers {
            caller.await.unwrap();
        }
        during.await.unwrap();
        let batches = batches.lock().unwrap().clone();
        // Not `r` alone and then the three: one round trip fewer for each of them.
        assert_eq!(
            batches,
            vec![
                vec!["a0".to_owned(), "b0".to_owned(), "c0".to_owned()],
                vec![
                    "r".to_owned(),
                    "a1".to_owned(),
                    "b1".to_owned(),
                    "c1".to_owned()
                ],
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn one_key_goes_once_per_batch_and_keeps_its_order() {
        let (batcher, batches) = numbering();
        let batcher = Arc::new(batcher);
        let blocker = {
            let batcher = Arc::clone(&batcher);
            tokio::spawn(async move { batcher.submit("first".to_owned()).await })
        };
        tokio::task::yield_now().await;
        let same: Vec<_> = ["a", "a", "b", "a"]
            .into_iter()
            .map(|key| {
                let batcher = Arc::clone(&batcher);
                tokio::spawn(async move { batcher.submit(key.to_owned()).await })
            })
            .collect();
        blocker.await.unwrap().unwrap();
        for request in same {
            request.await.unwrap().unwrap();
        }
        let batches = batches.lock().unwrap().clone();
        assert_eq!(
            batches,
            vec![
                vec!["first".to_owned()],
                vec!["a".to_owned(), "b".to_owned()],
                vec!["a".to_owned()],
                vec!["a".to_owned()],
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_batch_fails_each_of_its_requests_and_the_next_batch_runs() {
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&calls);
        let batcher: Batcher<String, bool> = Batcher::new(Box::new(move |keys: Vec<String>| {
            let call = counted.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                if call == 0 {
                    Err(LeaseError::Timeout {
                        after: std::time::Duration::from_secs(1),
                    })
                } else {
                    Ok(vec![true; keys.len()])
                }
            })
        }));
        let failed = batcher.submit("k".to_owned()).await.unwrap_err();
        assert!(matches!(*failed, LeaseError::Timeout { .. }), "{failed}");
        assert!(batcher.submit("k".to_owned()).await.unwrap());
    }

    #[tokio::test(start_paused = true)]
    async fn a_caller_that_goes_away_does_not_stop_its_batch() {
        let (batcher, batches) = numbering();
        let gone = tokio::time::timeout(
            std::time::Duration::ZERO,
            batcher.submit("dropped".to_owned()),
        )
        .await;
        assert!(gone.is_err());
        batcher.submit("next".to_owned()).await.unwrap();
        let sent: Vec<String> = batches.lock().unwrap().concat();
        assert_eq!(sent, vec!["dropped".to_owned(), "next".to_owned()]);
    }
}
