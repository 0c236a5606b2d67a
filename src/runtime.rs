//! The owner of each shard's table at run time: the shard and the lock its steps run under
//! (`shard`), the owner's one step (`owner`), the requests (`request`), the waiters' pending
//! grants (`pending`), the kameo actor (`actor`), the shard
//! router (`router`), the stall warnings (`stall`), the shard's metrics (`metrics`), and the
//! lock type that loom swaps (`sync`).

pub(crate) mod actor;
#[cfg(all(test, loom))]
mod loom_models;
pub(crate) mod metrics;
pub(crate) mod owner;
pub(crate) mod pending;
pub(crate) mod request;
pub(crate) mod router;
pub(crate) mod shard;
pub(crate) mod stall;
pub(crate) mod sync;
