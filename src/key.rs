//! [`LockKey`]: what a key must be. Below every layer that handles keys.

use std::fmt::Debug;
use std::hash::Hash;

/// What a key must be: hashable, comparable, cloneable, printable for `tracing`, and movable
/// across tasks. Implemented for every such type.
///
/// # Panics
///
/// The registry runs a key's `Hash`, `Eq`, `Clone` and `Debug` inside the step that changes
/// its shard's table. If one of them panics, the table may be half-changed, so the shard
/// closes rather than go on with it: the panic reaches the caller, and every waiter and every
/// later call on that shard gets [`LockError::Closed`](crate::LockError::Closed). With one shard (the default) that is
/// every key of the registry. Keys whose traits cannot panic (integers, strings, and
/// `#[derive]`d types of them) never close anything.
pub trait LockKey: Hash + Eq + Clone + Debug + Send + Sync + 'static {}

impl<K> LockKey for K where K: Hash + Eq + Clone + Debug + Send + Sync + 'static {}
