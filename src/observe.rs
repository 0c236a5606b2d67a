//! What one acquisition tells `tracing` (and, with the `metrics` feature, the `metrics`
//! facade), from the call that asks for a key to the drop of the guard that holds it.
//!
//! Each [`lock`](crate::LockRegistry::lock)-like call of the handle opens a debug-level span
//! named `acquisition` with target [`LOCK_TARGET`], carrying the call and the key. Inside it
//! come the events `granted` (with the fencing token and the wait), `would block`, `closed`,
//! `cancelled` (the call's future dropped before its grant was taken) and `released` (the
//! guard dropped, with the hold); the span's `wait_us` and `hold_us` fields are recorded as
//! they become known. The span lives in the call's future and then in the guard.
//!
//! Nothing is made when nobody listens: if no subscriber enables debug-level events,
//! [`Acquisition`] is `None`, at the cost of one load of `tracing`'s global level filter per
//! call and one pointer in the future and in the guard. With the `metrics` feature every
//! acquisition is observed, for the clock readings of the wait and hold histograms.

use std::fmt::Debug;

use tokio::time::Instant;
use tracing::field::Empty;
use tracing::{Span, debug, debug_span};

use crate::runtime::metrics::Histograms;

/// The target of the acquisition spans and their events.
pub(crate) const LOCK_TARGET: &str = "keyed_locks::lock";

/// Which call of the handle asked: the `call` field of the span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CallKind {
    Lock,
    LockShared,
    Acquire,
    TryLock,
    TryLockShared,
    TryAcquire,
    LockAll,
    TryLockAll,
}

impl CallKind {
    fn name(self) -> &'static str {
        match self {
            CallKind::Lock => "lock",
            CallKind::LockShared => "lock_shared",
            CallKind::Acquire => "acquire",
            CallKind::TryLock => "try_lock",
            CallKind::TryLockShared => "try_lock_shared",
            CallKind::TryAcquire => "try_acquire",
            CallKind::LockAll => "lock_all",
            CallKind::TryLockAll => "try_lock_all",
        }
    }
}

/// One acquisition as observed: `None` when nothing observes it. Dropped while waiting it
/// reports `cancelled`; dropped while held (inside a guard) it reports `released`.
#[derive(Debug, Default)]
pub(crate) struct Acquisition(Option<Box<Observed>>);

#[derive(Debug)]
struct Observed {
    /// Disabled when only the `metrics` feature needs this acquisition.
    span: Span,
    #[cfg(feature = "metrics")]
    histograms: Histograms,
    asked: Instant,
    stage: Stage,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Waiting,
    Holding {
        granted: Instant,
    },
    /// Refused or closed: reported already, nothing to report on drop.
    Ended,
}

impl Acquisition {
    /// Starts observing a call for `key` (a slice of keys for `lock_all`). `permits` is the
    /// count an `acquire` asks for.
    ///
    /// Inline, the check that nothing listens: one load of `tracing`'s global level filter
    /// (unless the `metrics` feature is on). The span is made out of line.
    #[inline]
    pub(crate) fn start(
        call: CallKind,
        key: &dyn Debug,
        permits: Option<u32>,
        histograms: &Histograms,
    ) -> Self {
        if !cfg!(feature = "metrics") && !tracing::level_enabled!(tracing::Level::DEBUG) {
            return Acquisition(None);
        }
        Acquisition::start_observed(call, key, permits, histograms)
    }

    #[cold]
    #[inline(never)]
    fn start_observed(
        call: CallKind,
        key: &dyn Debug,
        permits: Option<u32>,
        #[cfg_attr(not(feature = "metrics"), expect(unused_variables))] histograms: &Histograms,
    ) -> Self {
        let span = debug_span!(
            target: LOCK_TARGET,
            "acquisition",
            call = call.name(),
            key = ?key,
            permits,
            fencing_token = Empty,
            wait_us = Empty,
            hold_us = Empty,
        );
        if span.is_disabled() && !cfg!(feature = "metrics") {
            return Acquisition(None);
        }
        Acquisition(Some(Box::new(Observed {
            span,
            #[cfg(feature = "metrics")]
            histograms: histograms.clone(),
            asked: Instant::now(),
            stage: Stage::Waiting,
        })))
    }

    /// The key was granted under `fencing_token` (the first one, for `lock_all` over shards).
    #[inline]
    pub(crate) fn granted(&mut self, fencing_token: u64) {
        if let Some(observed) = &mut self.0 {
            observed.granted(fencing_token);
        }
    }

    /// A try call found the key taken.
    pub(crate) fn would_block(mut self) {
        self.end("would block");
    }

    /// The registry closed before granting.
    pub(crate) fn closed(mut self) {
        self.end("closed");
    }

    fn end(&mut self, what: &'static str) {
        if let Some(observed) = &mut self.0 {
            debug!(target: LOCK_TARGET, parent: &observed.span, "{what}");
            observed.stage = Stage::Ended;
        }
    }
}

impl Observed {
    #[cold]
    #[inline(never)]
    fn granted(&mut self, fencing_token: u64) {
        let granted = Instant::now();
        let wait = granted.saturating_duration_since(self.asked);
        let wait_us = micros(wait);
        self.span.record("fencing_token", fencing_token);
        self.span.record("wait_us", wait_us);
        debug!(target: LOCK_TARGET, parent: &self.span, fencing_token, wait_us, "granted");
        #[cfg(feature = "metrics")]
        self.histograms.record_wait(wait);
        self.stage = Stage::Holding { granted };
    }

    /// Reports how the acquisition ended, when it is dropped.
    #[cold]
    #[inline(never)]
    fn dropped(self: Box<Self>) {
        match self.stage {
            Stage::Waiting => debug!(target: LOCK_TARGET, parent: &self.span, "cancelled"),
            Stage::Holding { granted } => {
                let hold = granted.elapsed();
                let hold_us = micros(hold);
                self.span.record("hold_us", hold_us);
                debug!(target: LOCK_TARGET, parent: &self.span, hold_us, "released");
                #[cfg(feature = "metrics")]
                self.histograms.record_hold(hold);
            }
            Stage::Ended => {}
        }
    }
}

impl Drop for Acquisition {
    #[inline]
    fn drop(&mut self) {
        if let Some(observed) = self.0.take() {
            observed.dropped();
        }
    }
}

/// Whole microseconds, saturating (584,000 years fit).
fn micros(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}
