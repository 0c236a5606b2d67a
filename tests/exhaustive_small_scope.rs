//! Every interleaving of three clients on two keys keeps every rule of the lock table, with
//! exclusive locks only and with shared and exclusive locks mixed.
//!
//! The scenarios: three clients; each picks one of two keys and a way to ask for it, acquires
//! it, and later leaves: it cancels if it is still queued, it releases if it holds the key by
//! then. With exclusive locks only, keys have one permit and every client asks with
//! `acquire`. Mixed, keys have two permits, and each client asks either for a shared lock
//! (`acquire_permits` of 1) or for the exclusive lock (`acquire`, both permits), so a key is
//! held by up to two shared holders, an exclusive request queued behind a shared holder holds
//! back the shared requests after it, and its cancel lets them through.
//!
//! Each test explores every choice of keys and ways and every order of the six steps by
//! depth-first search on the [`ReferenceModel`], which says what a correct table records for
//! each step. Each complete path is then checked against the real table with
//! [`check_the_table_against`]: its journal is replayed and compared event by event (so each
//! grant goes to the earliest client still queued on its key if it fits, FIFO, with the next
//! fencing token, never past the key's permits), and the table is compared with the model
//! after every step (`check_invariants()`, the counts keys, held, holders, permits and
//! waiting, so reference count = holders + waiters and no entry without either, each client
//! holding or waiting where the model says). Every state is a prefix of a complete path, so
//! every state is checked. At the end of every path every client has left, so all keys must
//! be free: `stats().keys == 0`, and every client that waited was granted or cancelled.
//!
//! # How many
//!
//! A complete path is a choice per client (a key, and with mixed locks a way: 2 or 4 choices)
//! and an order of the six steps in which each client acquires before it leaves:
//! 6! / (2! · 2! · 2!) = 90 orders. So 2^3 × 90 = 720 interleavings with exclusive locks only
//! and 4^3 × 90 = 5760 mixed. A state is a prefix of a path: with `c1, c2, c3` steps taken by
//! each client (0, 1 or 2), there are (c1 + c2 + c3)! / (c1! · c2! · c3!) orders and a choice
//! per client that has started; summing over the 27 triples gives 1957 states with exclusive
//! locks only and 14905 mixed, the empty start included. Both counts are asserted, so the
//! enumeration cannot silently shrink.
//!
//! Also asserted, as counted by the search: how many distinct situations it meets (client
//! states and queues, ids left out: 92 and 356), how many states have a key held by two
//! clients at once (0 and 396), and how many cancels grant another client (0 and 12). A
//! cancel grants only in one story: on one key, a shared holder, then an exclusive request,
//! then a shared one queued behind it, and the exclusive one cancels before the holder
//! leaves; 2 keys × 3! ways to cast the clients make 12. A change in any of these counts is a
//! change in what the model grants.

use std::collections::HashSet;

use keyed_locks::table::WaiterId;

use crate::reference_model::{ReferenceModel, check_the_table_against};

const CLIENTS: usize = 3;
const KEYS: [u64; 2] = [0, 1];

/// How a client asks for its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Every permit of the key: `acquire`.
    Exclusive,
    /// One permit: `acquire_permits(key, 1)`.
    Shared,
}

/// What one search explores, and what it must find.
#[derive(Debug)]
struct Scenario {
    /// Permits per key.
    capacity: u32,
    /// The ways a client may ask for its key.
    modes: &'static [Mode],
    expected: Counts,
}

/// What a search found; see the module docs for each count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Counts {
    interleavings: usize,
    states: usize,
    situations: usize,
    states_with_a_shared_key: usize,
    cancels_that_granted: usize,
}

/// One step of one client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Acquire {
        client: usize,
        key: u64,
        mode: Mode,
    },
    /// Cancel if still queued, release if holding.
    Leave {
        client: usize,
    },
}

/// Where a client is in its little life; where it waits or holds is the model's to say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Client {
    Idle,
    Acquired { waiter: WaiterId, mode: Mode },
    Done,
}

/// The model and the clients: a state of the search.
#[derive(Debug, Clone)]
struct World {
    model: ReferenceModel,
    modes: &'static [Mode],
    clients: [Client; CLIENTS],
}

impl World {
    /// The steps that can come next: an idle client acquires either key in any mode, a
    /// client that acquired leaves.
    fn next_steps(&self) -> Vec<Step> {
        let mut steps = Vec::new();
        for (client, state) in self.clients.iter().enumerate() {
            match state {
                Client::Idle => {
                    for &key in &KEYS {
                        steps.extend(self.modes.iter().map(|&mode| Step::Acquire {
                            client,
                            key,
                            mode,
                        }));
                    }
                }
                Client::Acquired { .. } => steps.push(Step::Leave { client }),
                Client::Done => {}
            }
        }
        steps
    }

    /// Makes the step's call on the model; whether it was a cancel that granted someone.
    fn apply(&mut self, step: Step) -> bool {
        match step {
            Step::Acquire { client, key, mode } => {
                let waiter = match mode {
                    Mode::Exclusive => self.model.acquire(key),
                    Mode::Shared => self.model.acquire_permits(key, 1),
                };
                self.clients[client] = Client::Acquired { waiter, mode };
                false
            }
            Step::Leave { client } => {
                let Client::Acquired { waiter, .. } = self.clients[client] else {
                    panic!("client {client} leaves from {:?}", self.clients[client]);
                };
                self.clients[client] = Client::Done;
                match self.model.find(waiter) {
                    Some((_, true)) => {
                        self.model.release(waiter);
                        false
                    }
                    Some((_, false)) => {
                        let grants = self.model.grants();
                        self.model.cancel(waiter);
                        self.model.grants() > grants
                    }
                    None => panic!("client {client} ({waiter}) is gone before it left"),
                }
            }
        }
    }

    /// Whether some key has two holders.
    fn has_a_shared_key(&self) -> bool {
        KEYS.iter().any(|&key| self.model.holders_of(key).len() > 1)
    }

    /// Client states and queues as clients, ids left out: how many situations differ.
    fn situation(&self) -> String {
        let client_of = |waiter: &WaiterId| {
            self.clients.iter().position(
                |state| matches!(state, Client::Acquired { waiter: mine, .. } if mine == waiter),
            )
        };
        let clients: Vec<_> = self
            .clients
            .iter()
            .map(|state| match *state {
                Client::Idle => ("idle", None, None),
                Client::Acquired { waiter, mode } => match self.model.find(waiter) {
                    Some((key, true)) => ("holding", Some(key), Some(mode)),
                    Some((key, false)) => ("waiting", Some(key), Some(mode)),
                    None => ("gone", None, Some(mode)),
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
    cancels_that_granted: usize,
}

impl Coverage {
    fn counts(&self) -> Counts {
        Counts {
            interleavings: self.interleavings,
            states: self.states,
            situations: self.situations.len(),
            states_with_a_shared_key: self.states_with_a_shared_key,
            cancels_that_granted: self.cancels_that_granted,
        }
    }
}

/// Explores every step from `world`, and checks the table on every complete path.
fn explore(world: &World, path: &mut Vec<Step>, coverage: &mut Coverage) {
    coverage.states += 1;
    coverage.situations.insert(world.situation());
    coverage.states_with_a_shared_key += usize::from(world.has_a_shared_key());

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
        coverage.cancels_that_granted += usize::from(next.apply(step));
        path.push(step);
        explore(&next, path, coverage);
        path.pop();
    }
}

/// Searches `scenario` and checks that it found what it says.
fn search(scenario: &Scenario) {
    let start = World {
        model: ReferenceModel::with_capacity(scenario.capacity),
        modes: scenario.modes,
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
        modes: &[Mode::Exclusive],
        expected: Counts {
            interleavings: 720,
            states: 1957,
            situations: 92,
            states_with_a_shared_key: 0,
            cancels_that_granted: 0,
        },
    });
}

#[test]
fn every_interleaving_of_three_shared_or_exclusive_clients_on_two_keys_keeps_every_rule() {
    search(&Scenario {
        capacity: 2,
        modes: &[Mode::Shared, Mode::Exclusive],
        expected: Counts {
            interleavings: 5760,
            states: 14905,
            situations: 356,
            states_with_a_shared_key: 396,
            cancels_that_granted: 12,
        },
    });
}
