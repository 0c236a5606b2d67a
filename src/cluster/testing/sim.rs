//! The cluster simulator: several cluster-mode processes over one in-memory lease table, on
//! tokio's paused clock, with a fault schedule and a random workload drawn from one seed, and
//! the protocol's promises checked at every step. FoundationDB's simulation testing and
//! TigerBeetle's VOPR are the models.
//!
//! One seed gives one run: the processes, their workers and the table share one
//! current-thread runtime whose clock moves only when every task waits; every choice (the
//! workload, the faults, the statements' latencies, the polling jitter) is drawn from
//! generators seeded by the run's seed, and every map the run walks has a fixed order. So a
//! failing seed reruns exactly, and its event log is the same byte for byte.
//!
//! - `plan`: the run's shape and fault windows, drawn up front from the seed.
//! - `store`: a process's view of the table: latencies, statement failures, a dropped
//!   connection, lost notices, a stopped or killed process; and each reply checked against
//!   the table's rules.
//! - `checks`: the protected resource, and the promises checked at every grant and write.
//! - `worker`: the workload, and the wrapper that stops a process's tasks.
//! - `world`: one run, from the seed to its report.
//! - `log`: the event log; `rng`: the seeded generators, one per purpose.
//! - `tests`: many seeds, determinism, the regression seeds, the planted bugs.

mod checks;
mod log;
mod plan;
mod rng;
mod store;
mod worker;
mod world;

#[cfg(test)]
mod tests;

pub(crate) use world::{PlantedBug, Report, run};
