//! What only the tests build: stores and tools that hold every store, and the lock path over
//! them, to the same rules.
//!
//! - `contract`: the rules every [`LeaseStore`](super::locking::lease_store::LeaseStore)
//!   keeps, as tests run against each store (a new kind of lease adds its rules here).
//! - `leases_in_flight`: the process's leases with statements held in flight, each case a bug
//!   the simulator found.
//! - `memory_store`: the lease table in memory on tokio's clock, which the simulator runs on.
//! - `sim`: the simulator, several processes over one in-memory table with faults drawn by a
//!   seed; `sim/checks.rs` holds the cluster-wide rules checked after every step (a new kind
//!   of lease adds its checks there, and a planted bug that they must find).

pub(crate) mod contract;
mod leases_in_flight;
pub(crate) mod memory_store;
pub(crate) mod sim;
