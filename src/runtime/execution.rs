//! Who runs a shard's steps: [`Execution`], the runtime's own choice, which the builder sets
//! and the shard obeys.

/// Who runs a registry's bookkeeping (set with [`RegistryBuilder::execution`](crate::RegistryBuilder::execution)).
///
/// Each shard's lock table has one owner and changes one step at a time, in one total order,
/// whoever runs the step. The two modes differ only in who that is; FIFO, cancel safety,
/// fencing tokens, ordering and shutdown hold the same in both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Execution {
    /// Every call runs its own step on the caller's thread, inside the shard's lock: a free
    /// key costs no task switch, and a guard's drop wakes the next waiter directly. A call
    /// that finds another step running waits for it on the lock (a step never awaits, and
    /// runs no user code but the key's `Hash`, `Eq`, `Clone` and `Debug`), then runs its own.
    /// The default.
    RunOnCaller,
    /// Every request goes through a queue to the registry's actor task, which runs every
    /// step: two task switches per `lock`, but the caller never runs bookkeeping itself.
    ActorTask,
}

impl Default for Execution {
    fn default() -> Self {
        // The test suite runs a second time with every registry in actor mode (`.ci/run`).
        if cfg!(keyed_locks_actor_default) {
            Execution::ActorTask
        } else {
            Execution::RunOnCaller
        }
    }
}
