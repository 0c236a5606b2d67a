//! Every trace committed under `tests/replays/` replays without divergence, for ever.
//!
//! Each `*.jsonl` trace there is a case that once mattered: a race found in production, a
//! property-test failure, a sequence that broke an earlier version. This test replays each
//! one with [`verify`] and fails, naming the file and the first divergence, if the table no
//! longer does exactly what the trace recorded.
//!
//! # Adding a case
//!
//! 1. Get the journal: from a registry built with `LockRegistry::builder().journal(capacity)`
//!    and read with `registry.journal().await`, or from a failing proptest case (build the
//!    journal by running its script on a `JournaledTable::with_journal(usize::MAX)`).
//! 2. Write it with `journal.write_json_lines(Some(description), file)` (feature `serde`),
//!    the description saying what the case is and where it came from. Keep it small: shrink
//!    it first.
//! 3. Save it as `tests/replays/<what_it_shows>.jsonl` and run
//!    `cargo test --test main replay_regressions`. Nothing else is needed: the file is found
//!    by its extension.
//!
//! Keys are read as unsigned integers or strings, whichever each one is. The table only
//! compares keys for equality, so how keys are spelled never changes what a replay does.

use std::fs;
use std::path::{Path, PathBuf};

use keyed_locks::journal::Journal;
use keyed_locks::replay::verify;

/// A key of a committed trace: a number or a string.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Deserialize)]
#[serde(untagged)]
enum TraceKey {
    Integer(u64),
    Text(String),
}

fn committed_traces() -> Vec<PathBuf> {
    let directory = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/replays");
    let mut traces: Vec<PathBuf> = fs::read_dir(&directory)
        .unwrap_or_else(|error| panic!("cannot read {}: {error}", directory.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| {
            path.extension()
                .is_some_and(|extension| extension == "jsonl")
        })
        .collect();
    traces.sort();
    traces
}

/// Parses and verifies one trace; `Err` says what went wrong, in words.
fn replay_committed_trace(text: &str) -> Result<(), String> {
    let journal = Journal::<TraceKey>::from_json_lines(text).map_err(|error| error.to_string())?;
    verify(&journal).map_err(|error| error.to_string())
}

#[test]
fn every_committed_trace_replays_without_divergence() {
    let traces = committed_traces();
    assert!(!traces.is_empty(), "tests/replays/ holds no .jsonl file");
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
    let grant = r#"{"grant":{"waiter":1,"fencing_token":1}}"#;
    let tampered = text.replacen(grant, r#"{"grant":{"waiter":1,"fencing_token":7}}"#, 1);
    assert_ne!(tampered, text, "{} has no {grant} line", path.display());
    assert!(replay_committed_trace(&tampered).is_err());
}
