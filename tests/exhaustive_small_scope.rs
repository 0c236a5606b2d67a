//! Every interleaving of three clients on two keys keeps every rule of the lock table.
//!
//! The scenario: three clients; each picks one of two keys and acquires it, and later leaves:
//! it cancels if it is still queued, it releases if it holds the key by then. The test
//! explores every choice of keys and every order of the six steps by depth-first search on
//! the [`ReferenceModel`], which says what a correct table records for each step. Each
//! complete path is then checked against the real table with [`check_the_table_against`]:
//! its journal is replayed and compared event by event (so each grant goes to the earliest
//! client still queued on its key, FIFO, with the next fencing token, and to no second
//! holder), and the table is compared with the model after every step (`check_invariants()`,
//! the counts keys, held and waiting, so reference count = holders + waiters and no entry
//! without either, each client holding or waiting where the model says). Every state is a
//! prefix of a complete path, so every state is checked. At the end of every path every
//! client has left, so all keys must be free: `stats().keys == 0`, and every client that
//! waited was granted or cancelled.
//!
//! # How many
//!
//! A complete path is a key per client (2^3 = 8 choices) and an order of the six steps in
//! which each client acquires before it leaves: 6! / (2! · 2! · 2!) = 90 orders, so
//! 8 × 90 = [`INTERLEAVINGS`] = 720 interleavings. A state is a prefix of a path: with
//! `c1, c2, c3` steps taken by each client (0, 1 or 2), there are
//! (c1 + c2 + c3)! / (c1! · c2! · c3!) orders and 2 key choices per client that has started,
//! and summing over the 27 triples gives [`STATES`] = 1957 states, the empty start included.
//! Both counts are asserted, so the enumeration cannot silently shrink.

use std::collections::HashSet;

use keyed_locks::table::WaiterId;

use crate::reference_model::{ReferenceModel, check_the_table_against};

const CLIENTS: usize = 3;
const KEYS: [u64; 2] = [0, 1];
/// Complete paths: 2^3 key choices × 6!/(2!·2!·2!) orders (see the module docs).
const INTERLEAVINGS: usize = 720;
/// Prefixes of paths, the empty one included (see the module docs).
const STATES: usize = 1957;

/// One step of one client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Acquire {
        client: usize,
        key: u64,
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
    Acquired(WaiterId),
    Done,
}

/// The model and the clients: a state of the search.
#[derive(Debug, Clone)]
struct World {
    model: ReferenceModel,
    clients: [Client; CLIENTS],
}

impl World {
    /// The steps that can come next: an idle client acquires either key, a client that
    /// acquired leaves.
    fn next_steps(&self) -> Vec<Step> {
        let mut steps = Vec::new();
        for (client, state) in self.clients.iter().enumerate() {
            match state {
                Client::Idle => {
                    steps.extend(KEYS.iter().map(|&key| Step::Acquire { client, key }));
                }
                Client::Acquired(_) => steps.push(Step::Leave { client }),
                Client::Done => {}
            }
        }
        steps
    }

    fn apply(&mut self, step: Step) {
        match step {
            Step::Acquire { client, key } => {
                self.clients[client] = Client::Acquired(self.model.acquire(key));
            }
            Step::Leave { client } => {
                let Client::Acquired(waiter) = self.clients[client] else {
                    panic!("client {client} leaves from {:?}", self.clients[client]);
                };
                match self.model.find(waiter) {
                    Some((_, true)) => self.model.release(waiter),
                    Some((_, false)) => self.model.cancel(waiter),
                    None => panic!("client {client} ({waiter}) is gone before it left"),
                }
                self.clients[client] = Client::Done;
            }
        }
    }

    /// Client states and queues as clients, ids left out: how many situations differ.
    fn situation(&self) -> String {
        let client_of = |waiter: &WaiterId| {
            self.clients
                .iter()
                .position(|state| *state == Client::Acquired(*waiter))
        };
        let clients: Vec<_> = self
            .clients
            .iter()
            .map(|state| match *state {
                Client::Idle => ("idle", None),
                Client::Acquired(waiter) => match self.model.find(waiter) {
                    Some((key, true)) => ("holding", Some(key)),
                    Some((key, false)) => ("waiting", Some(key)),
                    None => ("gone", None),
                },
                Client::Done => ("done", None),
            })
            .collect();
        let queues: Vec<Vec<_>> = KEYS
            .iter()
            .map(|&key| self.model.waiters(key).iter().map(client_of).collect())
            .collect();
        format!("{clients:?} {queues:?}")
    }
}

/// What the search saw.
#[derive(Debug, Default)]
struct Coverage {
    states: usize,
    interleavings: usize,
    /// Distinct (client states, queues) pairs, ids left out: how many situations differ.
    situations: HashSet<String>,
}

/// Explores every step from `world`, and checks the table on every complete path.
fn explore(world: &World, path: &mut Vec<Step>, coverage: &mut Coverage) {
    coverage.states += 1;
    coverage.situations.insert(world.situation());

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
        next.apply(step);
        path.push(step);
        explore(&next, path, coverage);
        path.pop();
    }
}

#[test]
fn every_interleaving_of_three_clients_on_two_keys_keeps_every_rule() {
    let start = World {
        model: ReferenceModel::new(),
        clients: [Client::Idle; CLIENTS],
    };
    let mut coverage = Coverage::default();
    explore(&start, &mut Vec::new(), &mut coverage);
    eprintln!(
        "covered {} interleavings, {} states, {} distinct situations",
        coverage.interleavings,
        coverage.states,
        coverage.situations.len()
    );
    assert_eq!(
        (coverage.interleavings, coverage.states),
        (INTERLEAVINGS, STATES),
        "the search covered a different space than the module docs count"
    );
}
