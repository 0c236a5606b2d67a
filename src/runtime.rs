//! The owner of each shard's table at run time: who runs its steps (`execution`), the shard
//! and the lock its steps run under, with the queue the actor task serves in actor mode
//! (`shard`), the owner's one step (`owner`), the requests (`request`), the waiters' pending
//! grants (`pending`), the shard router (`router`), the stall warnings (`stall`), the shard's
//! metrics (`metrics`), and the lock type that loom swaps (`sync`). It names nothing of the
//! public face above it; the kameo actor that serves a shard's queue is part of that face
//! (`messages/actor.rs`), beside the messages it handles.

pub(crate) mod execution;
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
