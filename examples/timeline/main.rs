//! Draws a keyed-locks trace as a timeline: one lane per key, holds as solid bars labelled
//! with their fencing token, waits as lighter bars from arrival to grant, cancellations and
//! shutdowns marked.
//!
//! ```sh
//! cargo run --example quickstart -- --trace quickstart.jsonl    # record a trace
//! cargo run --example timeline -- quickstart.jsonl               # text, in the terminal
//! cargo run --example timeline -- quickstart.jsonl --svg timeline.svg
//! ```
//!
//! The trace is JSON Lines (`keyed_locks::trace`); its keys may be unsigned integers or
//! strings, and are shown as JSON writes them (`42`, `"user:42"`). Options (`--help` lists
//! them): `--axis time|seq` puts time or event numbers on the horizontal axis (by default
//! time, unless every event has the same time, as in hand-made traces); `--width COLUMNS` sets
//! the width of the text timeline (default 72).
//!
//! The drawing is the library's (`keyed_locks::timeline`, the `timeline` feature): a service
//! draws its own journal with `registry.journal().await?.to_svg()`. This program reads the
//! trace, and writes what the library draws.

use std::fmt;
use std::path::Path;
use std::process::ExitCode;

use clap::Parser;
use clap::builder::RangedU64ValueParser;
use keyed_locks::journal::Journal;
use keyed_locks::timeline::{Axis, Timeline};
use keyed_locks::trace::TraceError;

/// A key of a trace: a number or a string, whichever each one is.
#[derive(Clone, PartialEq, Eq, Hash, serde::Deserialize)]
#[serde(untagged)]
enum TraceKey {
    Integer(u64),
    Text(String),
}

/// As the trace writes the key, since the timeline names keys by their `Debug`: `42`, and
/// `"user:42"` in double quotes with JSON's escapes.
impl fmt::Debug for TraceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TraceKey::Integer(number) => write!(f, "{number}"),
            TraceKey::Text(text) => match serde_json::to_string(text) {
                Ok(quoted) => f.write_str(&quoted),
                Err(_) => write!(f, "{text:?}"),
            },
        }
    }
}

/// Draws a keyed-locks trace as a timeline: one lane per key, holds as solid bars labelled
/// with their fencing token, waits as lighter bars from arrival to grant.
#[derive(Debug, PartialEq, Parser)]
#[command(args_override_self = true)]
struct Options {
    /// The trace, JSON Lines (`keyed_locks::trace`)
    trace: String,
    /// Draw an SVG picture into this file instead of text on stdout
    #[arg(long, value_name = "OUT.svg")]
    svg: Option<String>,
    /// What the horizontal axis measures [default: time, unless every event has the same time]
    #[arg(long, value_enum)]
    axis: Option<AxisChoice>,
    /// The width of the text timeline, from 20 to 1000
    #[arg(
        long,
        value_name = "COLUMNS",
        default_value_t = 72,
        value_parser = RangedU64ValueParser::<usize>::new().range(20..=1000)
    )]
    width: usize,
}

/// The values of `--axis`, each the library's axis of the same name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum AxisChoice {
    /// Seconds since the registry started.
    Time,
    /// Sequence numbers: one step per event. For traces whose events share one time, such
    /// as hand-made or proptest traces, and to pull apart events of one instant.
    #[value(name = "seq")]
    Sequence,
}

impl From<AxisChoice> for Axis {
    fn from(choice: AxisChoice) -> Self {
        match choice {
            AxisChoice::Time => Axis::Time,
            AxisChoice::Sequence => Axis::Sequence,
        }
    }
}

/// Why the timeline could not be drawn.
#[derive(Debug)]
enum Failure {
    /// The trace could not be read.
    Read {
        path: String,
        source: std::io::Error,
    },
    /// The trace is not a valid trace.
    Parse { path: String, source: TraceError },
    /// The picture could not be written.
    Write {
        path: String,
        source: std::io::Error,
    },
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Read { path, source } => write!(f, "cannot read {path}: {source}"),
            Failure::Parse { path, source } => write!(f, "{path} is not a valid trace: {source}"),
            Failure::Write { path, source } => write!(f, "cannot write {path}: {source}"),
        }
    }
}

impl std::error::Error for Failure {}

fn main() -> ExitCode {
    // A usage error exits 2 (clap's code); `--help` exits 0.
    let options = Options::parse();
    match run(&options) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("timeline: {failure}");
            ExitCode::FAILURE
        }
    }
}

fn run(options: &Options) -> Result<(), Failure> {
    let text = std::fs::read_to_string(&options.trace).map_err(|source| Failure::Read {
        path: options.trace.clone(),
        source,
    })?;
    let journal = Journal::<TraceKey>::from_json_lines(&text).map_err(|source| Failure::Parse {
        path: options.trace.clone(),
        source,
    })?;
    if journal.dropped > 0 {
        eprintln!(
            "timeline: the journal dropped its {} oldest events; holds and waits that began \
             before its first event are not drawn",
            journal.dropped
        );
    }
    let mut timeline = Timeline::new(&journal);
    if let Some(axis) = options.axis {
        timeline = timeline.axis(axis.into());
    }
    match &options.svg {
        None => print!("{}", timeline.to_text(options.width)),
        Some(path) => {
            let title = Path::new(&options.trace)
                .file_name()
                .map_or(options.trace.clone(), |name| {
                    name.to_string_lossy().into_owned()
                });
            let timeline = timeline.title(title);
            let picture = timeline.to_svg();
            std::fs::write(path, picture).map_err(|source| Failure::Write {
                path: path.clone(),
                source,
            })?;
            println!("wrote {path}: {}", timeline.summary());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(line: &str) -> Result<Options, clap::Error> {
        Options::try_parse_from(std::iter::once("timeline").chain(line.split_whitespace()))
    }

    #[test]
    fn options_read_the_trace_and_every_flag() {
        let options = options("t.jsonl --svg out.svg --axis seq --width 40").unwrap();
        assert_eq!(
            options,
            Options {
                trace: "t.jsonl".into(),
                svg: Some("out.svg".into()),
                axis: Some(AxisChoice::Sequence),
                width: 40,
            }
        );
    }

    #[test]
    fn without_flags_the_timeline_is_text_72_columns_wide() {
        let options = options("t.jsonl").unwrap();
        assert_eq!(
            options,
            Options {
                trace: "t.jsonl".into(),
                svg: None,
                axis: None,
                width: 72,
            }
        );
    }

    #[test]
    fn bad_command_lines_are_usage_errors_and_help_is_not() {
        for line in [
            "",
            "--svg",
            "t.jsonl --axis space",
            "t.jsonl --frobnicate",
            "a b",
            "t --width 3",
            "t --width 1001",
            "t --width x",
        ] {
            let result = options(line);
            assert!(
                result
                    .as_ref()
                    .is_err_and(|error| error.use_stderr() && error.exit_code() == 2),
                "{line:?} gave {result:?}"
            );
        }
        let help = options("--help").unwrap_err();
        assert_eq!((help.use_stderr(), help.exit_code()), (false, 0));
    }

    const HEADER: &str = r#"{"format":"keyed-locks-trace","version":3,"dropped":0}"#;

    /// A trace of one entry, `event` at time 0.
    fn one_entry(event: &str) -> String {
        format!("{HEADER}\n{{\"seq\":1,\"at_ns\":0,\"event\":{event}}}\n")
    }

    /// The key of the trace's one lane, as the text timeline shows it.
    fn lane_key(trace: &str) -> String {
        let journal = Journal::<TraceKey>::from_json_lines(trace).unwrap();
        let text = Timeline::new(&journal).to_text(40);
        let lane = text.lines().nth(1).unwrap_or_default();
        lane.split(" |")
            .next()
            .unwrap_or_default()
            .trim_end()
            .to_owned()
    }

    #[test]
    fn string_and_integer_keys_are_read_and_shown_as_the_trace_writes_them() {
        let acquire = |key: &str| {
            one_entry(&format!(
                r#"{{"acquire":{{"waiter":1,"key":{key},"permits":1}}}}"#
            ))
        };
        assert_eq!(lane_key(&acquire(r#""user:42""#)), r#""user:42""#);
        assert_eq!(lane_key(&acquire("42")), "42");
        assert_eq!(lane_key(&acquire(r#""bell\u0007""#)), r#""bell\u0007""#);
    }

    #[test]
    fn a_malformed_trace_is_reported_at_the_line_that_is_wrong() {
        let error = Journal::<TraceKey>::from_json_lines(&one_entry(r#""explode""#)).unwrap_err();
        assert_eq!(error.line(), Some(2), "{error}");
        assert!(
            error.to_string().starts_with("line 2: not a journal entry"),
            "{error}"
        );
    }
}
