//! Every trace committed under `tests/replays/` replays without divergence, for ever.
//!
//! Each `*.trace` file there is a case that once mattered: a race found in production, a
//! property-test failure, a sequence that broke an earlier version. This test replays each
//! one with [`verify`] and fails, naming the file and the first divergence, if the table no
//! longer does exactly what the trace recorded.
//!
//! # Adding a case
//!
//! 1. Get the journal: from a registry built with `LockRegistry::builder().journal(capacity)`
//!    and read with `registry.journal().await`, or from a failing proptest case (build the
//!    journal by running its script on a `JournaledTable::with_journal(usize::MAX)`).
//! 2. Write it with `keyed_locks::trace::write_trace(&journal, &StringKeys)` (for `String`
//!    keys) or `&IntegerKeys` (for unsigned integer keys, read back here as `u64`).
//! 3. Save it as `tests/replays/<what_it_shows>.trace`, with `#` comment lines at the top
//!    saying what the case is and where it came from. Keep it small: shrink it first.
//! 4. Run `cargo test --test replay_regressions`. Nothing else is needed: the file is found
//!    by its extension.
//!
//! A trace whose keys are all in double quotes is read with `StringKeys`; one whose keys are
//! unquoted is read with `IntegerKeys` as `u64`. The table only compares keys for equality,
//! so how keys are spelled never changes what a replay does.

use std::fs;
use std::path::{Path, PathBuf};

use keyed_locks::replay::verify;
use keyed_locks::trace::{IntegerKeys, StringKeys, TraceError, parse_trace};

fn committed_traces() -> Vec<PathBuf> {
    let directory = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/replays");
    let mut traces: Vec<PathBuf> = fs::read_dir(&directory)
        .unwrap_or_else(|error| panic!("cannot read {}: {error}", directory.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| {
            path.extension()
                .is_some_and(|extension| extension == "trace")
        })
        .collect();
    traces.sort();
    traces
}

/// Parses and verifies one trace; `Err` says what went wrong, in words.
fn replay_committed_trace(text: &str) -> Result<(), String> {
    match parse_trace(text, &StringKeys) {
        Ok(journal) => verify(&journal).map_err(|error| error.to_string()),
        // Unquoted keys: an integer trace.
        Err(TraceError::Key { .. }) => {
            let journal = parse_trace::<u64, _>(text, &IntegerKeys).map_err(|e| e.to_string())?;
            verify(&journal).map_err(|error| error.to_string())
        }
        Err(error) => Err(error.to_string()),
    }
}

#[test]
fn every_committed_trace_replays_without_divergence() {
    let traces = committed_traces();
    assert!(!traces.is_empty(), "tests/replays/ holds no .trace file");
    let failures: Vec<String> = traces
        .iter()
        .filter_map(|path| {
            let text = fs::read_to_string(path).expect("a readable trace");
            replay_committed_trace(&text)
                .err()
                .map(|error| format!("{}: {error}", path.display()))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_committed_trace_with_a_changed_token_would_fail() {
    // Guards the guard: a trace edited to claim another token must not pass.
    let traces = committed_traces();
    let path = traces.first().expect("a committed trace");
    let text = fs::read_to_string(path).expect("a readable trace");
    let tampered = text.replacen(" grant w1 1", " grant w1 7", 1);
    assert_ne!(
        tampered,
        text,
        "{} has no `grant w1 1` line",
        path.display()
    );
    assert!(replay_committed_trace(&tampered).is_err());
}
