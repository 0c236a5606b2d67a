//! Every interleaving of three clients on two keys keeps every rule of the lock table, with
//! exclusive locks only, with shared and exclusive locks mixed, and with requests for both
//! keys at once mixed in as well.
//!
//! The scenarios: three clients; each picks a way to ask for one key or both, asks, and later
//! leaves: it cancels if it is still queued, it releases if it holds by then. With exclusive
//! locks only, keys have one permit and every client asks for one key with `acquire`. Mixed,
//! keys have two permits, and each client asks for one key either for a shared lock
//! (`acquire_permits` of 1) or for the exclusive lock (`acquire`, both permits), so a key is
//! held by up to two shared holders, an exclusive request queued behind a shared holder holds
//! back the shared requests after it, and its cancel lets them through. With both keys, a
//! client may also ask for both keys at once, exclusively, listing them in either order
//! (`acquire_all`, queued on both keys as one request and granted when first on both), or
//! take both only if they are free now (`try_acquire_all`, in either order); a try that would
//! block leaves nothing behind, and its client's leave makes no call.
//!
//! Each test explores every choice of requests and every order of the six steps by
//! depth-first search on the [`ReferenceModel`], which says what a correct table records for
//! each step. Each complete path is then checked against the real table with
//! [`check_the_table_against`]: its journal is replayed and compared event by event (so each
//! grant goes to the earliest client still queued on its keys if it fits, FIFO on each key,
//! the grants of one step in order of arrival with consecutive fencing tokens, never past a
//! key's permits), the same calls are made on a table that records them and what it records
//! and returns is compared with the model's, and the table is compared with the model after
//! every step (`check_invariants()`, the counts keys, held, holders, permits and waiting, so
//! reference count = holders + waiters and no entry without either, each client holding or
//! waiting on exactly the keys the model says). Every state is a prefix of a complete path,
//! so every state is checked. At the end of every path every client has left, so all keys
//! must be free: `stats().keys == 0`, and every client that waited was granted or cancelled.
//!
//! Two keys cannot show every rule of requests for several keys. A key is free yet awaited
//! only while a request for both keys waits for the other key, and then a new request for
//! both is blocked by that other key anyway; so that a request for several keys is not
//! granted at once past a waiter of a free key, and that it does not overtake an earlier
//! request for several keys that waits for a third key, need three keys, which `table_model`
//! has.
//!
//! # How many
//!
//! A complete path is a request per client (2 with exclusive locks only: either key; 4 mixed:
//! either key, shared or exclusive; 8 with both keys: the 4, both keys at once in either
//! order, or the try of both in either order) and an order of the six steps in which each
//! client asks before it leaves: 6! / (2! · 2! · 2!) = 90 orders. So 2^3 × 90 = 720
//! interleavings with exclusive locks only, 4^3 × 90 = 5760 mixed and 8^3 × 90 = 46080 with
//! both keys. A state is a prefix of a path: with `c1, c2, c3` steps taken by each client (0,
//! 1 or 2), there are (c1 + c2 + c3)! / (c1! · c2! · c3!) orders and a request per client that
//! has started; summing over the 27 triples gives 1957 states with exclusive locks only, 14905
//! mixed and 116401 with both keys, the empty start included. These counts are asserted, so
//! the enumeration cannot silently shrink.
//!
//! Also asserted, as counted by the search: how many distinct situations it meets (client
//! states and queues, ids left out); how many states have a key held by two clients at once;
//! how many states have a request for both keys waiting; how many cancels grant another
//! client; how many steps grant two clients at once; and how many tries of both keys would
//! block. With exclusive locks only: 92 situations and none of the rest. Mixed: 356
//! situations, 396 states with a shared key, and 12 cancels that grant: a cancel grants only
//! in one story, on one key a shared holder, then an exclusive request, then a shared one
//! queued behind it, and the exclusive one cancels before the holder leaves; 2 keys × 3! ways
//! to cast the clients make 12. 12 steps grant two: an exclusive holder leaves while two
//! shared requests wait on its key, again 2 keys × 3! casts.
//!
//! With both keys: 2810 situations, 756 states with a shared key, 5664 states with a request
//! for both keys waiting, and 2976 tries of both keys that would block. 132 cancels grant: the
//! 12 above, and 120 cancels of a request for both keys waiting behind a holder of one key
//! while a later request on the other key, or a shared one on the held key if the holder is
//! shared, waits behind it though it fits (2 keys held × (2 requests behind an exclusive
//! holder + 3 behind a shared one) × 2 orders of the keys × 3! casts). 252 steps grant two: the
//! 12 above, and 240 leaves of a holder of both keys (from `acquire_all` or
//! `try_acquire_all`, either order: 4 ways) while two requests for one key wait that can both
//! go (on different keys, in any mode: 8 ordered pairs; both shared on one key: 2), × 3! casts.
//! Among these are the releases that grant a request for each key, whose grants the table
//! must put in order of arrival whatever the order of the keys in the released request. A
//! change in any of these counts is a change in what the model grants.

use std::collections::HashSet;

use keyed_locks::journal::WaiterId;

use crate::reference_model::{ReferenceModel, check_the_table_against};

const CLIENTS: usize = 3;
const KEYS: [u64; 2] = [0, 1];

/// How a client asks, and for which keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ask {
    /// Every permit of the key: `acquire`.
    Exclusive(u64),
    /// One permit: `acquire_permits(key, 1)`.
    Shared(u64),
    /// Every permit of both keys, all at once, listed in this order: `acquire_all`.
    All([u64; 2]),
    /// Every permit of both keys if they are free now, listed in this order:
    /// `try_acquire_all`.
    TryAll([u64; 2]),
}

/// One key, exclusive: the requests of plain locks.
const EXCLUSIVE: &[Ask] = &[Ask::Exclusive(0), Ask::Exclusive(1)];

/// One key, shared or exclusive.
const MIXED: &[Ask] = &[
    Ask::Shared(0),
    Ask::Exclusive(0),
    Ask::Shared(1),
    Ask::Exclusive(1),
];

/// One key shared or exclusive, or both keys at once, or the try of both, in either order.
const WITH_BOTH_KEYS: &[Ask] = &[
    Ask::Shared(0),
    Ask::Exclusive(0),
    Ask::Shared(1),
    Ask::Exclusive(1),
    Ask::All([0, 1]),
    Ask::All([1, 0]),
    Ask::TryAll([0, 1]),
    Ask::TryAll([1, 0]),
];

/// What one search explores, and what it must find.
#[derive(Debug)]
struct Scenario {
    /// Permits per key.
    capacity: u32,
    /// The requests a client may make.
    asks: &'static [Ask],
    expected: Counts,
}

/// What a search found; see the module docs for each count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Counts {
    interleavings: usize,
    states: usize,
    situations: usize,
    states_with_a_shared_key: usize,
    states_with_both_keys_awaited_at_once: usize,
    cancels_that_granted: usize,
    steps_that_granted_two: usize,
    tries_that_would_block: usize,
}

/// One step of one client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Ask {
        client: usize,
        ask: Ask,
    },
    /// Cancel if still queued, release if holding; nothing after a try that would block.
    Leave {
        client: usize,
    },
}

/// Where a client is in its little life; where it waits or holds is the model's to say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Client {
    Idle,
    /// `waiter` is `None` after a try that would block: the client has nothing to leave.
    Asked {
        waiter: Option<WaiterId>,
        ask: Ask,
    },
    Done,
}

/// What a step did, for the counts.
#[derive(Debug, Clone, Copy, Default)]
struct Effect {
    granted: u64,
    was_cancel: bool,
    would_block: bool,
}

/// The model and the clients: a state of the search.
#[derive(Debug, Clone)]
struct World {
    model: ReferenceModel,
    asks: &'static [Ask],
    clients: [Client; CLIENTS],
}

impl World {
    /// The steps that can come next: an idle client makes any request, a client that asked
    /// leaves.
    fn next_steps(&self) -> Vec<Step> {
        let mut steps = Vec::new();
        for (client, state) in self.clients.iter().enumerate() {
            match state {
                Client::Idle => {
                    steps.extend(self.asks.iter().map(|&ask| Step::Ask { client, ask }));
                }
                Client::Asked { .. } => steps.push(Step::Leave { client }),
                Client::Done => {}
            }
        }
        steps
    }

    /// Makes the step's call on the model, and says what it did.
    fn apply(&mut self, step: Step) -> Effect {
        let grants = self.model.grants();
        let mut effect = Effect::default();
        match step {
            Step::Ask { client, ask } => {
                let waiter = match ask {
                    Ask::Exclusive(key) => Some(self.model.acquire(key)),
                    Ask::Shared(key) => Some(self.model.acquire_permits(key, 1)),
                    Ask::All(keys) => Some(self.model.acquire_all(&keys)),
                    Ask::TryAll(keys) => self.model.try_acquire_all(&keys),
                };
                effect.would_block = waiter.is_none();
                self.clients[client] = Client::Asked { waiter, ask };
            }
            Step::Leave { client } => {
                let Client::Asked { waiter, .. } = self.clients[client] else {
                    panic!("client {client} leaves from {:?}", self.clients[client]);
                };
                self.clients[client] = Client::Done;
                if let Some(waiter) = waiter {
                    match self.model.find(waiter) {
                        Some((_, true)) => self.model.release(waiter),
                        Some((_, false)) => {
                            effect.was_cancel = true;
                            self.model.cancel(waiter);
                        }
                        None => panic!("client {client} ({waiter}) is gone before it left"),
                    }
                }
            }
        }
        effect.granted = self.model.grants() - grants;
        effect
    }

    /// Whether some key has two holders.
    fn has_a_shared_key(&self) -> bool {
        KEYS.iter().any(|&key| self.model.holders_of(key).len() > 1)
    }

    /// Whether a request for both keys waits.
    fn has_both_keys_awaited_at_once(&self) -> bool {
        self.model.waiters(KEYS[0]).iter().any(|waiter| {
            self.model
                .find(*waiter)
                .is_some_and(|(keys, _)| keys.len() > 1)
        })
    }

    /// Client states and queues as clients, ids left out: how many situations differ.
    fn situation(&self) -> String {
        let client_of = |waiter: &WaiterId| {
            self.clients.iter().position(
                |state| matches!(state, Client::Asked { waiter: Some(mine), .. } if mine == waiter),
            )
        };
        let clients: Vec<_> = self
            .clients
            .iter()
            .map(|state| match *state {
                Client::Idle => ("idle", None, None),
                Client::Asked { waiter: None, ask } => ("refused", None, Some(ask)),
                Client::Asked {
                    waiter: Some(waiter),
                    ask,
                } => match self.model.find(waiter) {
                    Some((keys, true)) => ("holding", Some(keys.to_vec()), Some(ask)),
                    Some((keys, false)) => ("waiting", Some(keys.to_vec()), Some(ask)),
                    None => ("gone", None, Some(ask)),
                },
                Client::Done => ("done", None, None),
            })
            .collect();
        let queues: Vec<Vec<_>> = KEYS
            .iter()
            .map(|&key| self.model.waiters(key).iter().map(client_of).collect())
            .collect();
        format!("{clients:?} {queues:?}")
    }
}

/// What the search saw so far.
#[derive(Debug, Default)]
struct Coverage {
    states: usize,
    interleavings: usize,
    situations: HashSet<String>,
    states_with_a_shared_key: usize,
    states_with_both_keys_awaited_at_once: usize,
    cancels_that_granted: usize,
    steps_that_granted_two: usize,
    tries_that_would_block: usize,
}

impl Coverage {
    fn counts(&self) -> Counts {
        Counts {
            interleavings: self.interleavings,
            states: self.states,
            situations: self.situations.len(),
            states_with_a_shared_key: self.states_with_a_shared_key,
            states_with_both_keys_awaited_at_once: self.states_with_both_keys_awaited_at_once,
            cancels_that_granted: self.cancels_that_granted,
            steps_that_granted_two: self.steps_that_granted_two,
            tries_that_would_block: self.tries_that_would_block,
        }
    }

    fn count(&mut self, effect: Effect) {
        self.cancels_that_granted += usize::from(effect.was_cancel && effect.granted > 0);
        self.steps_that_granted_two += usize::from(effect.granted >= 2);
        self.tries_that_would_block += usize::from(effect.would_block);
    }
}

/// Explores every step from `world`, and checks the table on every complete path.
fn explore(world: &World, path: &mut Vec<Step>, coverage: &mut Coverage) {
    coverage.states += 1;
    coverage.situations.insert(world.situation());
    coverage.states_with_a_shared_key += usize::from(world.has_a_shared_key());
    coverage.states_with_both_keys_awaited_at_once +=
        usize::from(world.has_both_keys_awaited_at_once());

    let next_steps = world.next_steps();
    if next_steps.is_empty() {
        assert!(
            world.model.live_acquirers().is_empty(),
            "every client left, yet the model has {:?} after {path:?}",
            world.model.live_acquirers()
        );
        check_the_table_against(&world.model)
            .unwrap_or_else(|failure| panic!("after {path:?}: {failure}"));
        coverage.interleavings += 1;
        return;
    }
    for step in next_steps {
        let mut next = world.clone();
        coverage.count(next.apply(step));
        path.push(step);
        explore(&next, path, coverage);
        path.pop();
    }
}

/// Searches `scenario` and checks that it found what it says.
fn search(scenario: &Scenario) {
    let start = World {
        model: ReferenceModel::with_capacity(scenario.capacity),
        asks: scenario.asks,
        clients: [Client::Idle; CLIENTS],
    };
    let mut coverage = Coverage::default();
    explore(&start, &mut Vec::new(), &mut coverage);
    let found = coverage.counts();
    eprintln!("{scenario:?}: found {found:?}");
    assert_eq!(
        found, scenario.expected,
        "the search covered a different space than the module docs count"
    );
}

#[test]
fn every_interleaving_of_three_clients_on_two_keys_keeps_every_rule() {
    search(&Scenario {
        capacity: 1,
        asks: EXCLUSIVE,
        expected: Counts {
            interleavings: 720,
            states: 1957,
            situations: 92,
            states_with_a_shared_key: 0,
            states_with_both_keys_awaited_at_once: 0,
            cancels_that_granted: 0,
            steps_that_granted_two: 0,
            tries_that_would_block: 0,
        },
    });
}

#[test]
fn every_interleaving_of_three_shared_or_exclusive_clients_on_two_keys_keeps_every_rule() {
    search(&Scenario {
        capacity: 2,
        asks: MIXED,
        expected: Counts {
            interleavings: 5760,
            states: 14905,
            situations: 356,
            states_with_a_shared_key: 396,
            states_with_both_keys_awaited_at_once: 0,
            cancels_that_granted: 12,
            steps_that_granted_two: 12,
            tries_that_would_block: 0,
        },
    });
}

#[test]
fn every_interleaving_of_three_clients_asking_for_one_key_or_both_keeps_every_rule() {
    search(&Scenario {
        capacity: 2,
        asks: WITH_BOTH_KEYS,
        expected: Counts {
            interleavings: 46080,
            states: 116401,
            situations: 2810,
            states_with_a_shared_key: 756,
            states_with_both_keys_awaited_at_once: 5664,
            cancels_that_granted: 132,
            steps_that_granted_two: 252,
            tries_that_would_block: 2976,
        },
    });
}
