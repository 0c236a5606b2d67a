//! The pure core: the lock table, its journal, the trace format and replay, and the deadline
//! queue of the stall warnings. Synchronous, with
//! no tokio, no kameo and no clock (time is passed in), and nothing from the other layers.

pub mod journal;
pub mod journaled_table;
pub(crate) mod overdue;
pub mod replay;
pub(crate) mod snapshot;
pub(crate) mod stats;
pub mod table;
pub mod trace;
