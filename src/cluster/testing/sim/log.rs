//! The event log of a run: one line per event, stamped with the simulated time since the start.
//! Nothing in a line depends on the real clock or on addresses, so one seed writes one log.

use std::fmt;
use std::sync::{Mutex, PoisonError};

use tokio::time::Instant;

/// A run's events, in the order they happened.
pub(super) struct EventLog {
    start: Instant,
    lines: Mutex<String>,
}

impl EventLog {
    pub(super) fn new() -> Self {
        EventLog {
            start: Instant::now(),
            lines: Mutex::new(String::new()),
        }
    }

    /// Appends `what`, done by `who`, at the current simulated time.
    pub(super) fn event(&self, who: &str, what: fmt::Arguments<'_>) {
        use fmt::Write as _;
        let micros = self.start.elapsed().as_micros();
        let mut lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        // Writing to a String cannot fail.
        let _ = writeln!(
            lines,
            "{:>7}.{:06} {who:<6} {what}",
            micros / 1_000_000,
            micros % 1_000_000
        );
    }

    /// The time since the start of the run.
    pub(super) fn elapsed(&self) -> std::time::Duration {
        self.start.elapsed()
    }

    pub(super) fn text(&self) -> String {
        self.lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}
