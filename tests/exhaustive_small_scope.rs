//! Every interleaving of three clients on two keys keeps every rule of the lock table.
//!
//! The scenario: three clients; each picks one of two keys and acquires it, and later leaves:
//! it cancels if it is still queued, it releases if it holds the key by then. The test
//! explores every choice of keys and every order of the six steps by depth-first search; the
//! table is not `Clone`, so each state is rebuilt by replaying its prefix of steps on a fresh
//! [`LockTable`]. In every state it checks `check_invariants()`, at most one holder per key,
//! that each grant goes to the earliest client still queued on the key (FIFO) with the next
//! fencing token, that the table's counts (keys, held, waiting) are the clients' (reference
//! count = holders + waiters, no entry without either), and that no client waits on a free
//! key. At the end of every path all keys must be free: `stats().keys == 0`.
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

use std::collections::{HashSet, VecDeque};

use keyed_locks::table::{Acquired, LockTable, WaiterId};

const CLIENTS: usize = 3;
const KEYS: [u8; 2] = [0, 1];
/// Complete paths: 2^3 key choices × 6!/(2!·2!·2!) orders (see the module docs).
const INTERLEAVINGS: usize = 720;
/// Prefixes of paths, the empty one included (see the module docs).
const STATES: usize = 1957;

/// One step of one client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Acquire {
        client: usize,
        key: u8,
    },
    /// Cancel if still queued, release if holding.
    Leave {
        client: usize,
    },
}

/// Where a client is in its little life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Client {
    Idle,
    Waiting { key: u8, waiter_id: WaiterId },
    Holding { key: u8, waiter_id: WaiterId },
    Done,
}

/// The table, the clients, and what the clients know about the order they queued in.
struct World {
    /// Deliveries are client numbers, so a grant says whom it is for.
    table: LockTable<u8, usize>,
    clients: [Client; CLIENTS],
    /// Per key, the clients queued on it in order of arrival.
    queues: [VecDeque<usize>; KEYS.len()],
    last_fencing_token: u64,
}

impl World {
    fn new() -> Self {
        World {
            table: LockTable::new(),
            clients: [Client::Idle; CLIENTS],
            queues: Default::default(),
            last_fencing_token: 0,
        }
    }

    /// The steps that can come next: an idle client acquires either key, a client that
    /// acquired leaves.
    fn next_steps(&self) -> Vec<Step> {
        let mut steps = Vec::new();
        for (client, state) in self.clients.iter().enumerate() {
            match state {
                Client::Idle => {
                    steps.extend(KEYS.iter().map(|&key| Step::Acquire { client, key }));
                }
                Client::Waiting { .. } | Client::Holding { .. } => {
                    steps.push(Step::Leave { client });
                }
                Client::Done => {}
            }
        }
        steps
    }

    fn holder_of(&self, key: u8) -> Option<usize> {
        self.clients
            .iter()
            .position(|state| matches!(state, Client::Holding { key: held, .. } if *held == key))
    }

    fn take_token(&mut self, fencing_token: u64) -> Result<(), String> {
        if fencing_token != self.last_fencing_token + 1 {
            return Err(format!(
                "token {fencing_token} after token {}",
                self.last_fencing_token
            ));
        }
        self.last_fencing_token = fencing_token;
        Ok(())
    }

    fn apply(&mut self, step: Step) -> Result<(), String> {
        match step {
            Step::Acquire { client, key } => {
                let free = self.holder_of(key).is_none() && self.queues[key as usize].is_empty();
                match self.table.acquire(key, client) {
                    Acquired::Granted(grant) if free => {
                        self.take_token(grant.fencing_token)?;
                        self.clients[client] = Client::Holding {
                            key,
                            waiter_id: grant.waiter_id,
                        };
                    }
                    Acquired::Queued(waiter_id) if !free => {
                        self.clients[client] = Client::Waiting { key, waiter_id };
                        self.queues[key as usize].push_back(client);
                    }
                    acquired => {
                        return Err(format!("key free: {free}, but acquire gave {acquired:?}"));
                    }
                }
            }
            Step::Leave { client } => match self.clients[client] {
                Client::Waiting { key, waiter_id } => {
                    if self.table.cancel(waiter_id) != Ok((key, client)) {
                        return Err(format!("cancel of queued client {client} refused"));
                    }
                    self.queues[key as usize].retain(|queued| *queued != client);
                    self.clients[client] = Client::Done;
                }
                Client::Holding { key, waiter_id } => {
                    let mut grants = Vec::new();
                    if self.table.release(waiter_id, &mut grants) != Ok(key) {
                        return Err(format!("release by holder {client} refused"));
                    }
                    self.clients[client] = Client::Done;
                    // FIFO: the key goes to the client queued first on it, and only to it.
                    match (self.queues[key as usize].pop_front(), grants.as_slice()) {
                        (None, []) => {}
                        (Some(next), [grant]) if grant.delivery == next => {
                            self.take_token(grant.fencing_token)?;
                            self.clients[next] = Client::Holding {
                                key,
                                waiter_id: grant.waiter_id,
                            };
                        }
                        (next, grants) => {
                            return Err(format!(
                                "release granted {grants:?}; first in line was {next:?}"
                            ));
                        }
                    }
                }
                state => return Err(format!("client {client} cannot leave from {state:?}")),
            },
        }
        Ok(())
    }

    /// Every rule that must hold between steps.
    fn check(&self) -> Result<(), String> {
        self.table
            .check_invariants()
            .map_err(|violation| violation.to_string())?;
        let mut keys_in_use = 0;
        let mut held_keys = 0;
        for key in KEYS {
            let holders = self
                .clients
                .iter()
                .filter(|state| matches!(state, Client::Holding { key: held, .. } if *held == key))
                .count();
            if holders > 1 {
                return Err(format!("{holders} clients hold key {key}"));
            }
            let waiters = self.queues[key as usize].len();
            if waiters > 0 && holders == 0 {
                return Err(format!("{waiters} clients wait for free key {key}"));
            }
            if self.table.contains_key(&key) != (holders + waiters > 0) {
                return Err(format!(
                    "key {key}: entry {}, {holders} holders, {waiters} waiters",
                    self.table.contains_key(&key)
                ));
            }
            keys_in_use += usize::from(holders + waiters > 0);
            held_keys += holders;
        }
        for (client, state) in self.clients.iter().enumerate() {
            let (key, waiter_id, waiting) = match *state {
                Client::Waiting { key, waiter_id } => (key, waiter_id, true),
                Client::Holding { key, waiter_id } => (key, waiter_id, false),
                Client::Idle | Client::Done => continue,
            };
            if self.table.key_of(waiter_id) != Some(&key)
                || self.table.delivery_of(waiter_id).is_some() != waiting
            {
                return Err(format!("the table disagrees on client {client}: {state:?}"));
            }
        }
        let stats = self.table.stats();
        let waiting: usize = self.queues.iter().map(VecDeque::len).sum();
        if (stats.keys, stats.held, stats.waiting) != (keys_in_use, held_keys, waiting) {
            return Err(format!(
                "stats {stats:?}, but the clients use {keys_in_use} keys, hold {held_keys}, \
                 wait for {waiting}"
            ));
        }
        Ok(())
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

/// Rebuilds the state `prefix` leads to, checks it, and explores every step from it.
fn explore(prefix: &mut Vec<Step>, coverage: &mut Coverage) {
    let mut world = World::new();
    for &step in prefix.iter() {
        // Each step was checked when its own prefix was explored; replaying must agree.
        world
            .apply(step)
            .unwrap_or_else(|failure| panic!("after {prefix:?}: {failure}"));
    }
    world
        .check()
        .unwrap_or_else(|failure| panic!("after {prefix:?}: {failure}"));
    coverage.states += 1;
    coverage.situations.insert(format!(
        "{:?} {:?}",
        situation(&world.clients),
        world.queues
    ));

    let next_steps = world.next_steps();
    if next_steps.is_empty() {
        // Liveness: once every client has left, nothing is held, queued or stored.
        let stats = world.table.stats();
        assert_eq!(
            (stats.keys, stats.held, stats.waiting),
            (0, 0, 0),
            "after {prefix:?}"
        );
        coverage.interleavings += 1;
        return;
    }
    for step in next_steps {
        prefix.push(step);
        explore(prefix, coverage);
        prefix.pop();
    }
}

/// Client states without their waiter ids.
fn situation(clients: &[Client; CLIENTS]) -> Vec<(&'static str, Option<u8>)> {
    clients
        .iter()
        .map(|state| match *state {
            Client::Idle => ("idle", None),
            Client::Waiting { key, .. } => ("waiting", Some(key)),
            Client::Holding { key, .. } => ("holding", Some(key)),
            Client::Done => ("done", None),
        })
        .collect()
}

#[test]
fn every_interleaving_of_three_clients_on_two_keys_keeps_every_rule() {
    let mut coverage = Coverage::default();
    explore(&mut Vec::new(), &mut coverage);
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
