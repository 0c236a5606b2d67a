//! Draws a keyed-locks trace as a timeline: one lane per key, holds as solid bars labelled
//! with their fencing token, waits as lighter bars from arrival to grant, cancellations and
//! shutdowns marked.
//!
//! ```sh
//! cargo run --example quickstart -- --trace quickstart.trace    # record a trace
//! cargo run --example timeline -- quickstart.trace               # text, in the terminal
//! cargo run --example timeline -- quickstart.trace --svg timeline.svg
//! ```
//!
//! Options: `--keys string|int` says how keys are written (by default string keys are tried
//! first, then integer keys); `--axis time|seq` puts time or event numbers on the horizontal
//! axis (by default time, unless every event has the same time, as in hand-made traces);
//! `--width COLUMNS` sets the width of the text timeline (default 72).

mod axis;
mod lanes;
mod svg;
mod text;

use std::fmt;
use std::path::Path;
use std::process::ExitCode;

use keyed_locks::journal::Journal;
use keyed_locks::trace::{IntegerKeys, KeyCodec, StringKeys, TraceError, parse_trace};

use crate::axis::{Axis, Scale};
use crate::lanes::{Timeline, timeline_of};

const USAGE: &str = "usage: timeline TRACE [--svg OUT.svg] [--keys string|int] \
                     [--axis time|seq] [--width COLUMNS]";

/// How the trace writes its keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keys {
    /// Try `StringKeys`, then `IntegerKeys` (as `u64`).
    Detect,
    String,
    Integer,
}

/// What the command line asks for.
#[derive(Debug, PartialEq)]
struct Options {
    trace: String,
    svg: Option<String>,
    keys: Keys,
    axis: Option<Axis>,
    width: usize,
}

/// Why the timeline could not be drawn.
#[derive(Debug)]
enum Failure {
    /// The command line is wrong.
    Usage(String),
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
            Failure::Usage(problem) => write!(f, "{problem}\n{USAGE}"),
            Failure::Read { path, source } => write!(f, "cannot read {path}: {source}"),
            Failure::Parse { path, source } => write!(f, "{path} is not a valid trace: {source}"),
            Failure::Write { path, source } => write!(f, "cannot write {path}: {source}"),
        }
    }
}

impl std::error::Error for Failure {}

fn main() -> ExitCode {
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    match options(&arguments).and_then(|options| run(&options)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("timeline: {failure}");
            ExitCode::from(if matches!(failure, Failure::Usage(_)) {
                2
            } else {
                1
            })
        }
    }
}

fn options(arguments: &[String]) -> Result<Options, Failure> {
    let usage = |problem: String| Err(Failure::Usage(problem));
    let mut options = Options {
        trace: String::new(),
        svg: None,
        keys: Keys::Detect,
        axis: None,
        width: 72,
    };
    let mut trace = None;
    let mut rest = arguments.iter();
    while let Some(argument) = rest.next() {
        let mut value = |flag: &str| {
            rest.next()
                .cloned()
                .ok_or_else(|| Failure::Usage(format!("{flag} needs a value")))
        };
        match argument.as_str() {
            "--svg" => options.svg = Some(value("--svg")?),
            "--keys" => {
                options.keys = match value("--keys")?.as_str() {
                    "string" => Keys::String,
                    "int" => Keys::Integer,
                    other => return usage(format!("--keys is string or int, not {other:?}")),
                }
            }
            "--axis" => {
                options.axis = Some(match value("--axis")?.as_str() {
                    "time" => Axis::Time,
                    "seq" => Axis::Sequence,
                    other => return usage(format!("--axis is time or seq, not {other:?}")),
                })
            }
            "--width" => {
                options.width = match value("--width")?.parse() {
                    Ok(width) if (20..=1000).contains(&width) => width,
                    _ => return usage("--width is a number of columns from 20 to 1000".into()),
                }
            }
            flag if flag.starts_with("--") => return usage(format!("unknown option {flag}")),
            path if trace.is_none() => trace = Some(path.to_owned()),
            extra => return usage(format!("one trace at a time, not also {extra:?}")),
        }
    }
    options.trace = match trace {
        Some(trace) => trace,
        None => return usage("which trace?".into()),
    };
    Ok(options)
}

fn run(options: &Options) -> Result<(), Failure> {
    let text = std::fs::read_to_string(&options.trace).map_err(|source| Failure::Read {
        path: options.trace.clone(),
        source,
    })?;
    let timeline = load(&text, options.keys).map_err(|source| Failure::Parse {
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

/// Parses `text` with the key codec asked for, and builds its lanes.
///
/// Detecting tries string keys, then integer keys; if both fail, the error reported is the
/// one further down the trace, since that codec read more of it and is likely the right one.
fn load(text: &str, keys: Keys) -> Result<Timeline, TraceError> {
    match keys {
        Keys::String => lanes_with(text, &StringKeys),
        Keys::Integer => lanes_with::<u64, _>(text, &IntegerKeys),
        Keys::Detect => match lanes_with(text, &StringKeys) {
            Err(string_error @ TraceError::Key { .. }) => lanes_with::<u64, _>(text, &IntegerKeys)
                .map_err(|integer_error| {
                    if integer_error.line() > string_error.line() {
                        integer_error
                    } else {
                        string_error
                    }
                }),
            result => result,
        },
    }
}

fn lanes_with<K, C: KeyCodec<K>>(text: &str, codec: &C) -> Result<Timeline, TraceError> {
    let journal: Journal<K> = parse_trace(text, codec)?;
    Ok(timeline_of(&journal, |key| {
        let mut label = String::new();
        codec.encode(key, &mut label);
        label
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arguments(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn options_read_the_trace_and_every_flag() {
        let options = options(&arguments(
            "t.trace --svg out.svg --keys int --axis seq --width 40",
        ))
        .unwrap();
        assert_eq!(
            options,
            Options {
                trace: "t.trace".into(),
                svg: Some("out.svg".into()),
                keys: Keys::Integer,
                axis: Some(Axis::Sequence),
                width: 40,
            }
        );
    }

    #[test]
    fn bad_command_lines_are_usage_errors() {
        for line in [
            "",
            "--svg",
            "t.trace --keys float",
            "t.trace --frobnicate",
            "a b",
            "t --width 3",
        ] {
            let result = options(&arguments(line));
            assert!(
                matches!(result, Err(Failure::Usage(_))),
                "{line:?} gave {result:?}"
            );
        }
    }

    #[test]
    fn string_and_integer_keys_are_detected() {
        let strings = load("1 +0.000000s acquire w1 \"user:42\"\n", Keys::Detect).unwrap();
        assert_eq!(strings.lanes[0].key, "\"user:42\"");
        let integers = load("1 +0.000000s acquire w1 42\n", Keys::Detect).unwrap();
        assert_eq!(integers.lanes[0].key, "42");
    }

    #[test]
    fn a_malformed_trace_is_reported_at_the_line_that_is_wrong() {
        let integer_trace = "1 +0.000000s acquire w1 42\n2 +0.000000s acquire w2 4x2\n";
        let error = load(integer_trace, Keys::Detect).unwrap_err();
        assert_eq!(error.line(), 2, "{error}");
        let error = load("1 +0.000000s explode w1\n", Keys::Detect).unwrap_err();
        assert!(
            error.to_string().starts_with("line 1: unknown event"),
            "{error}"
        );
    }

    #[test]
    fn absurd_but_valid_traces_are_drawn_without_panicking() {
        let far = u64::MAX - 3;
        let trace = format!(
            "# dropped {far}\n\
             {} +18446744073709.551615s acquire w1 1\n\
             {} +18446744073709.551615s grant w1 1\n\
             {} +18446744073709.551615s release w9\n",
            far + 1,
            far + 2,
            far + 3
        );
        let timeline = load(&trace, Keys::Detect).unwrap();
        for axis in [Axis::Time, Axis::Sequence] {
            let scale = Scale::of(&timeline, axis);
            let _ = text::render_text(&timeline, &scale, 20);
            let _ = svg::render_svg(&timeline, &scale, "absurd");
        }
        let empty = load("", Keys::Detect).unwrap();
        let _ = text::render_text(&empty, &Scale::of(&empty, Axis::Time), 20);
    }
}
