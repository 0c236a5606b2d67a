//! Not a behaviour: the registry configurations a test runs in when it must hold in each.

use std::num::NonZeroUsize;

use keyed_locks::{Execution, LockKey, LockRegistry, RegistryBuilder};

/// Both execution modes, each with one shard and with three.
pub fn builders<K: LockKey>() -> Vec<RegistryBuilder<K>> {
    let mut builders = Vec::new();
    for execution in [Execution::RunOnCaller, Execution::ActorTask] {
        for shards in [1, 3] {
            builders.push(
                LockRegistry::builder()
                    .execution(execution)
                    .shards(NonZeroUsize::new(shards).expect("shards above 0")),
            );
        }
    }
    builders
}
