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

mod axis;
mod lanes;
#[cfg(test)]
mod script;
mod svg;
mod text;

use std::fmt;
use std::path::Path;
use std::process::ExitCode;

use clap::Parser;
use clap::builder::RangedU64ValueParser;
use keyed_locks::journal::Journal;
use keyed_locks::trace::TraceError;

use crate::axis::{Axis, Scale};
use crate::lanes::{Timeline, timeline_of};

/// A key of a trace: a number or a string, whichever each one is.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Deserialize)]
#[serde(untagged)]
enum TraceKey {
    Integer(u64),
    Text(String),
}

impl fmt::Display for TraceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TraceKey::Integer(number) => write!(f, "{number}"),
            // As the trace writes it, in double quotes with JSON's escapes.
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
    axis: Option<Axis>,
    /// The width of the text timeline, from 20 to 1000
    #[arg(
        long,
        value_name = "COLUMNS",
        default_value_t = 72,
        value_parser = RangedU64ValueParser::<usize>::new().range(20..=1000)
    )]
    width: usize,
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
    let timeline = load(&text).map_err(|source| Failure::Parse {
        path: options.trace.clone(),
        source,
    })?;
    if timeline.dropped > 0 {
        eprintln!(
            "timeline: the journal dropped its {} oldest events; holds and waits that began \
             before its first event are not drawn",
            timeline.dropped
        );
    }
    // A trace whose events all share one instant would be drawn as a single line of time.
    let axis = options
        .axis
        .unwrap_or(if timeline.first.at == timeline.last.at {
            Axis::Sequence
        } else {
            Axis::Time
        });
    let scale = Scale::of(&timeline, axis);
    match &options.svg {
        None => print!("{}", text::render_text(&timeline, &scale, options.width)),
        Some(path) => {
            let title = Path::new(&options.trace)
                .file_name()
                .map_or(options.trace.clone(), |name| {
                    name.to_string_lossy().into_owned()
                });
            let picture = svg::render_svg(&timeline, &scale, &title);
            std::fs::write(path, picture).map_err(|source| Failure::Write {
                path: path.clone(),
                source,
            })?;
            println!("wrote {path}: {}", timeline.counts());
        }
    }
    Ok(())
}

/// Parses `text` and builds its lanes.
fn load(text: &str) -> Result<Timeline, TraceError> {
    let journal = Journal::<TraceKey>::from_json_lines(text)?;
    Ok(timeline_of(&journal, TraceKey::to_string))
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
                axis: Some(Axis::Sequence),
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

    #[test]
    fn string_and_integer_keys_are_read_and_shown_as_the_trace_writes_them() {
        let acquire = |key: &str| {
            one_entry(&format!(
                r#"{{"acquire":{{"waiter":1,"key":{key},"permits":1}}}}"#
            ))
        };
        let strings = load(&acquire(r#""user:42""#)).unwrap();
        assert_eq!(strings.lanes[0].key, r#""user:42""#);
        let integers = load(&acquire("42")).unwrap();
        assert_eq!(integers.lanes[0].key, "42");
    }

    #[test]
    fn a_malformed_trace_is_reported_at_the_line_that_is_wrong() {
        let error = load(&one_entry(r#""explode""#)).unwrap_err();
        assert_eq!(error.line(), Some(2), "{error}");
        assert!(
            error.to_string().starts_with("line 2: not a journal entry"),
            "{error}"
        );
    }

    #[test]
    fn absurd_but_valid_traces_are_drawn_without_panicking() {
        let far = u64::MAX - 3;
        let latest = u128::from(u64::MAX) * 1_000_000_000 + 999_999_999;
        let events = [
            r#"{"acquire":{"waiter":1,"key":1,"permits":1}}"#,
            r#"{"grant":{"waiter":1,"fencing_token":1}}"#,
            r#"{"release":{"waiter":9}}"#,
        ];
        let mut trace = format!(r#"{{"format":"keyed-locks-trace","version":3,"dropped":{far}}}"#);
        for (seq, event) in (far + 1..=u64::MAX).zip(events) {
            trace += &format!("\n{{\"seq\":{seq},\"at_ns\":{latest},\"event\":{event}}}");
        }
        let timeline = load(&trace).unwrap();
        for axis in [Axis::Time, Axis::Sequence] {
            let scale = Scale::of(&timeline, axis);
            let _ = text::render_text(&timeline, &scale, 20);
            let _ = svg::render_svg(&timeline, &scale, "absurd");
        }
        let empty = load(HEADER).unwrap();
        let _ = text::render_text(&empty, &Scale::of(&empty, Axis::Time), 20);
    }
}
