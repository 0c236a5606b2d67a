//! What cluster mode notes in the local registry's journal about each lease.
//!
//! The pure journal knows nothing of leases: it keeps a note's text in order with the table's
//! events ([`JournalEvent::Note`](crate::journal::JournalEvent::Note)), and a replay copies it.
//! The text is written here, once: `lease "account:42" granted under fence 7`.

use std::fmt;

/// What happened to a key's lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseEvent {
    /// The key's local holder asked the lease table for the lease.
    Requested,
    /// The process took the lease under this fence.
    Granted(u64),
    /// The lease under this fence was lost: taken by another process, not renewed in time, or
    /// given up at shutdown.
    Lost(u64),
    /// The process gave the lease under this fence back.
    Released(u64),
}

/// A note's text: the lease, by its name (its key's `Display`), and what happened to it.
pub(crate) struct LeaseNote<'a> {
    pub(crate) name: &'a str,
    pub(crate) event: LeaseEvent,
}

impl fmt::Display for LeaseNote<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self.name;
        match self.event {
            LeaseEvent::Requested => write!(f, "lease {name:?} requested"),
            LeaseEvent::Granted(fence) => write!(f, "lease {name:?} granted under fence {fence}"),
            LeaseEvent::Lost(fence) => write!(f, "lease {name:?} lost under fence {fence}"),
            LeaseEvent::Released(fence) => {
                write!(f, "lease {name:?} released under fence {fence}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_note_names_the_lease_what_happened_and_the_fence() {
        let note = |event| {
            LeaseNote {
                name: "account:42",
                event,
            }
            .to_string()
        };
        assert_eq!(
            note(LeaseEvent::Requested),
            r#"lease "account:42" requested"#
        );
        assert_eq!(
            note(LeaseEvent::Granted(7)),
            r#"lease "account:42" granted under fence 7"#
        );
        assert_eq!(
            note(LeaseEvent::Lost(7)),
            r#"lease "account:42" lost under fence 7"#
        );
        assert_eq!(
            note(LeaseEvent::Released(7)),
            r#"lease "account:42" released under fence 7"#
        );
    }
}
