//! [`RegistryStats`], the registry's counts at one instant.
//!
//! A plain value with no runtime in it: the pure lock table computes it, and the registry
//! hands it out unchanged.

/// The registry's counts at one instant, as returned by
/// [`LockRegistry::stats`](crate::LockRegistry::stats).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct RegistryStats {
    /// Entries in the lock map: keys that someone holds or waits for. Zero whenever nobody
    /// holds or waits: this is the number that must not grow for ever.
    pub keys: usize,
    /// Keys currently held, by one holder or by several sharing its permits.
    pub held: usize,
    /// Holders: one per exclusive lock, shared lock or permit guard. Above `held` only when
    /// keys are shared.
    pub holders: usize,
    /// Permits held, over every key (an exclusive lock holds all of its key's).
    pub permits: usize,
    /// Acquirers queued and not yet granted.
    pub waiting: usize,
    /// Grants since the registry started. With one shard, equal to the last fencing token
    /// handed out.
    pub grants: u64,
}

impl RegistryStats {
    /// Adds another shard's counts to these: every count is a sum over shards.
    pub(crate) fn add(&mut self, shard: RegistryStats) {
        self.keys += shard.keys;
        self.held += shard.held;
        self.holders += shard.holders;
        self.permits += shard.permits;
        self.waiting += shard.waiting;
        self.grants += shard.grants;
    }
}
