//! Traces: journals as text, one event per line, for reading, diffing, committing and replaying.
//!
//! [`write_trace`] turns a [`Journal`] into text and [`parse_trace`] reads it back; for every
//! journal `j`, `parse_trace(&write_trace(&j, &codec), &codec) == Ok(j)`. Keys are written by a
//! [`KeyCodec`] the caller chooses: [`IntegerKeys`] for the integer types, [`StringKeys`] for
//! `String`, or one of your own.
//!
//! ```text
//! # keyed-locks trace v2
//! # dropped 0
//! 1 +0.000000s acquire w1 "user:42"
//! 2 +0.000000s grant w1 1
//! 3 +0.000850s acquire w2 "user:42"
//! 4 +0.004113s release w1
//! 5 +0.004113s grant w2 2
//! ```
//!
//! # Grammar
//!
//! Lines end with `\n` (a `\r` before it is ignored, so Windows checkouts read the same).
//! Tokens are separated by exactly one space. Everything is case-sensitive.
//!
//! ```text
//! trace    = [ header ] { line } ;
//! header   = "# keyed-locks trace v2" ;              (* only as the first line *)
//! line     = blank | dropped | comment | event ;   (* key lines follow their event *)
//! blank    = { " " | "\t" } ;
//! dropped  = "# dropped " count ;                   (* at most once, before any event *)
//! comment  = "#" { any character } ;               (* not a header or dropped line *)
//! event    = seq " " time " " action ;
//! seq      = count ;                                (* see "Checks" below *)
//! time     = "+" count "." micros "s" ;             (* seconds since the registry started *)
//! micros   = 6 * digit | 9 * digit ;                (* 9 digits only if not whole µs *)
//! action   = "acquire " waiter " " key                (* exclusive: every permit *)
//!          | "try_acquire " key
//!          | "acquire_permits " waiter " " count " " key  (* 1 for a shared lock *)
//!          | "try_acquire_permits " count " " key
//!          | "capacity " count                     (* permits per key; first, if not 1 *)
//!          | "acquire_all " waiter " " count keys   (* several keys, exclusive, at once *)
//!          | "try_acquire_all " count keys
//!          | "would_block_all"
//!          | "release " waiter
//!          | "cancel " waiter
//!          | "shutdown"
//!          | "grant " waiter " " count              (* the fencing token *)
//!          | "would_block " key
//!          | "closed " waiter
//!          | "refused " waiter " " refusal
//!          | "lease_requested " name                 (* notes: see "Lease notes" *)
//!          | "lease_granted " count " " name         (* the lease's fence *)
//!          | "lease_lost " count " " name
//!          | "lease_released " count " " name ;
//! keys     = count * ( "\n| " key ) ;                (* one key line per key, in order *)
//! refusal  = "unknown" | "not_holding" | "not_waiting" ;
//! waiter   = "w" count ;                            (* arrival number, from 1: w17 *)
//! key      = { any character } ;                    (* the rest of the line, read by the codec *)
//! name     = { any character } ;                    (* the rest of the line, as StringKeys *)
//! count    = digit { digit } ;                      (* fits a u64 *)
//! ```
//!
//! The `count` lines after a multi-key event are its keys, each as `| ` and the key; nothing
//! else (no blank line, no comment) may come between them:
//!
//! ```text
//! 6 +0.000210s acquire_all w4 2
//! | "account:7"
//! | "account:9"
//! 7 +0.000210s grant w4 5
//! ```
//!
//! A line that starts with `# dropped` is a dropped line and must be well formed; a line that
//! starts with `# keyed-locks trace ` is a header and must name `v2`. A comment cannot follow an
//! event on the same line, because a key runs to the end of its line.
//!
//! # Lease notes
//!
//! In cluster mode the journal also records what the process did with each key's lease
//! (`lease_granted 7 "account:42"`). These lines are notes: neither inputs nor outputs of the
//! table. A replay copies them where they stand, so a cluster process's journal replays
//! against its table like any other. A lease is named by text (its key's `Display`), written
//! as [`StringKeys`] writes a key, whatever the registry's key codec.
//!
//! # Versions
//!
//! - `v2`: a waiter is named by its arrival number at the table ([`WaiterId`]), and a shutdown
//!   closes waiters in order of arrival.
//! - `v1` named a waiter by the slot and generation of the table's former storage (`w3v1`) and
//!   closed waiters in storage order, which the table no longer reproduces. The parser rejects
//!   it with [`TraceError::UnsupportedVersion`]; record the trace again.
//!
//! # Checks
//!
//! [`parse_trace`] is strict and all-or-nothing: the first problem is returned as a
//! [`TraceError`] naming its line, and no partial journal is ever returned. Beyond the grammar
//! it checks that the first event is numbered `dropped + 1` (numbers count dropped events too),
//! that each later number is one more than the one before, and that times never go backwards.
//! It does not check that the events make sense together (a grant nobody asked for, a release
//! of a waiter that never held): that is what [`replay`](crate::replay) is for.

use std::error::Error;
use std::fmt;
use std::fmt::Write as _;
use std::time::Duration;

use crate::pure::journal::{
    Journal, JournalEntry, JournalEvent, LeaseEvent, LeaseNote, Refusal, format_waiter,
    parse_waiter,
};
use crate::pure::table::WaiterId;

/// The first line [`write_trace`] writes, and the only trace version [`parse_trace`] reads.
pub const TRACE_HEADER: &str = "# keyed-locks trace v2";

const HEADER_PREFIX: &str = "# keyed-locks trace ";
const DROPPED_PREFIX: &str = "# dropped";
/// Starts each key line of a multi-key event.
const KEY_LINE_PREFIX: &str = "| ";

/// Writes keys into trace lines and reads them back.
///
/// A codec must round-trip: `decode` of what `encode` wrote gives an equal key. What `encode`
/// writes must not contain a line break (`\n` or `\r`), since a key runs to the end of its line.
///
/// # Examples
///
/// ```
/// use keyed_locks::trace::{KeyCodec, StringKeys};
///
/// let mut text = String::new();
/// StringKeys.encode(&"say \"hi\"".to_string(), &mut text);
/// assert_eq!(text, r#""say \"hi\"""#);
/// assert_eq!(StringKeys.decode(&text).unwrap(), "say \"hi\"");
/// ```
pub trait KeyCodec<K> {
    /// Why a text is not a key.
    type Error: Error + Send + Sync + 'static;

    /// Appends `key`, as text without line breaks, to `out`.
    fn encode(&self, key: &K, out: &mut String);

    /// Reads a key from `text`, the rest of a trace line after the event's other fields.
    ///
    /// # Errors
    ///
    /// When `text` is not exactly one key as `encode` writes it.
    fn decode(&self, text: &str) -> Result<K, Self::Error>;
}

/// Keys of any std integer type, written in decimal: `42`, `-7`.
///
/// # Examples
///
/// ```
/// use keyed_locks::trace::{IntegerKeys, KeyCodec};
///
/// let key: u16 = IntegerKeys.decode("4096").unwrap();
/// assert_eq!(key, 4096);
/// assert!(KeyCodec::<u8>::decode(&IntegerKeys, "4096").is_err());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IntegerKeys;

/// Why [`IntegerKeys`] could not read a key.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum IntegerKeyError {
    /// The text is not an optional `-` followed by decimal digits.
    NotAnInteger {
        /// The text found.
        found: String,
    },
    /// The number does not fit the key type.
    OutOfRange {
        /// The text found.
        found: String,
        /// The key type, such as `u8`.
        type_name: &'static str,
    },
}

impl fmt::Display for IntegerKeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IntegerKeyError::NotAnInteger { found } => {
                write!(
                    f,
                    "expected an integer key like 42, found {}",
                    quoted(found)
                )
            }
            IntegerKeyError::OutOfRange { found, type_name } => {
                write!(f, "key {} does not fit a {type_name}", quoted(found))
            }
        }
    }
}

impl Error for IntegerKeyError {}

macro_rules! integer_keys {
    ($($integer:ty),*) => {$(
        impl KeyCodec<$integer> for IntegerKeys {
            type Error = IntegerKeyError;

            fn encode(&self, key: &$integer, out: &mut String) {
                // Writing into a String cannot fail.
                let _ = write!(out, "{key}");
            }

            fn decode(&self, text: &str) -> Result<$integer, IntegerKeyError> {
                // `str::parse` also takes a leading `+`; the grammar has one spelling per key.
                let digits = text.strip_prefix('-').unwrap_or(text);
                if !crate::pure::journal::is_decimal(digits) {
                    return Err(IntegerKeyError::NotAnInteger { found: text.to_owned() });
                }
                text.parse().map_err(|_| IntegerKeyError::OutOfRange {
                    found: text.to_owned(),
                    type_name: stringify!($integer),
                })
            }
        }
    )*};
}

integer_keys!(
    u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize
);

/// `String` keys, written in double quotes: `"user:42"`.
///
/// Inside the quotes, `"` and `\` are escaped as `\"` and `\\`; newline, carriage return and
/// tab as `\n`, `\r` and `\t`; any other control character as `\u{7f}` (hexadecimal). Every
/// other character, non-ASCII included, is written as itself.
///
/// Keys of type `&'static str` can be written by turning them into `String`s first; they
/// cannot be read back, since parsing creates new strings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StringKeys;

/// Why [`StringKeys`] could not read a key.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StringKeyError {
    /// The text does not start with `"`.
    NotQuoted {
        /// The text found.
        found: String,
    },
    /// The closing `"` is missing.
    Unterminated,
    /// A `\` is followed by something other than `"`, `\`, `n`, `r`, `t` or `u{...}`.
    UnknownEscape {
        /// The escape found, without its backslash.
        found: String,
    },
    /// A `\u{...}` escape does not name a character.
    BadUnicodeEscape {
        /// The escape found, without its backslash.
        found: String,
    },
    /// A control character appears unescaped.
    RawControlCharacter {
        /// The character.
        found: char,
    },
    /// Something follows the closing `"`.
    TextAfterClosingQuote {
        /// What follows.
        found: String,
    },
}

impl fmt::Display for StringKeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StringKeyError::NotQuoted { found } => write!(
                f,
                "expected a key in double quotes like \"user:42\", found {}",
                quoted(found)
            ),
            StringKeyError::Unterminated => f.write_str("the key has no closing quote"),
            StringKeyError::UnknownEscape { found } => write!(
                f,
                "unknown escape \\{} in key (expected \\\", \\\\, \\n, \\r, \\t or \\u{{...}})",
                found
            ),
            StringKeyError::BadUnicodeEscape { found } => {
                write!(f, "\\{found} in key is not a character")
            }
            StringKeyError::RawControlCharacter { found } => {
                write!(f, "control character {found:?} in key must be escaped")
            }
            StringKeyError::TextAfterClosingQuote { found } => write!(
                f,
                "expected the end of the line after the key, found {}",
                quoted(found)
            ),
        }
    }
}

impl Error for StringKeyError {}

impl KeyCodec<String> for StringKeys {
    type Error = StringKeyError;

    fn encode(&self, key: &String, out: &mut String) {
        out.push('"');
        for character in key.chars() {
            match character {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                // Raw control characters would be invisible in a diff, or end the line.
                control if control.is_control() => {
                    let _ = write!(out, "\\u{{{:x}}}", u32::from(control));
                }
                other => out.push(other),
            }
        }
        out.push('"');
    }

    fn decode(&self, text: &str) -> Result<String, StringKeyError> {
        let Some(quoted_text) = text.strip_prefix('"') else {
            return Err(StringKeyError::NotQuoted {
                found: text.to_owned(),
            });
        };
        let mut key = String::new();
        let mut characters = quoted_text.char_indices();
        while let Some((index, character)) = characters.next() {
            match character {
                '"' => {
                    let after = &quoted_text[index + 1..];
                    if !after.is_empty() {
                        return Err(StringKeyError::TextAfterClosingQuote {
                            found: after.to_owned(),
                        });
                    }
                    return Ok(key);
                }
                '\\' => key.push(decode_escape(&quoted_text[index + 1..], &mut characters)?),
                control if control.is_control() => {
                    return Err(StringKeyError::RawControlCharacter { found: control });
                }
                other => key.push(other),
            }
        }
        Err(StringKeyError::Unterminated)
    }
}

/// Reads the escape after a `\`; `after` is the text following the backslash, and
/// `characters` is advanced past the escape.
fn decode_escape(
    after: &str,
    characters: &mut std::str::CharIndices<'_>,
) -> Result<char, StringKeyError> {
    let Some((_, escape)) = characters.next() else {
        return Err(StringKeyError::Unterminated);
    };
    match escape {
        '"' => Ok('"'),
        '\\' => Ok('\\'),
        'n' => Ok('\n'),
        'r' => Ok('\r'),
        't' => Ok('\t'),
        'u' => {
            // `after` is `u{hex}...`; the escape is everything up to the first `}`.
            let bad = || StringKeyError::BadUnicodeEscape {
                found: after.chars().take(12).collect(),
            };
            let hex_and_rest = after.strip_prefix("u{").ok_or_else(bad)?;
            let (hex, _) = hex_and_rest.split_once('}').ok_or_else(bad)?;
            if hex.is_empty() || hex.len() > 6 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(bad());
            }
            let character = u32::from_str_radix(hex, 16)
                .ok()
                .and_then(char::from_u32)
                .ok_or_else(bad)?;
            // Skip `{`, the hex digits (ASCII, one char each) and `}`.
            for _ in 0..hex.len() + 2 {
                characters.next();
            }
            Ok(character)
        }
        other => Err(StringKeyError::UnknownEscape {
            found: other.to_string(),
        }),
    }
}

/// What the parser expected where it found something else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Expected {
    /// A sequence number.
    SequenceNumber,
    /// A time like `+0.004113s`.
    Time,
    /// A waiter id like `w17`.
    Waiter,
    /// A fencing token.
    FencingToken,
    /// `unknown`, `not_holding` or `not_waiting`.
    Refusal,
    /// A key after the event name.
    Key,
    /// Nothing more on the line.
    EndOfLine,
    /// The count of a `# dropped` line.
    DroppedCount,
    /// A lease's fence.
    Fence,
    /// A count of permits, from 1 to `u32::MAX`.
    Permits,
    /// A lease's name, quoted.
    LeaseName,
    /// The number of keys of a multi-key event, 1 or more.
    KeyCount,
    /// One of the key lines that follow a multi-key event.
    KeyLine,
}

impl fmt::Display for Expected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Expected::SequenceNumber => "a sequence number",
            Expected::Time => "a time like +0.004113s",
            Expected::Waiter => "a waiter like w17",
            Expected::FencingToken => "a fencing token (a whole number)",
            Expected::Refusal => "a refusal reason (unknown, not_holding or not_waiting)",
            Expected::Key => "a key",
            Expected::EndOfLine => "the end of the line",
            Expected::DroppedCount => "a count of dropped events",
            Expected::Fence => "a fence (a whole number)",
            Expected::Permits => "a count of permits (1 or more)",
            Expected::LeaseName => "a lease name in double quotes",
            Expected::KeyCount => "a count of keys (1 or more)",
            Expected::KeyLine => "a key line like `| \"user:42\"`",
        })
    }
}

/// Why [`parse_trace`] rejected a trace. Every variant names the 1-based line at fault.
#[derive(Debug)]
#[non_exhaustive]
pub enum TraceError {
    /// A field is missing or malformed.
    Expected {
        /// The line.
        line: usize,
        /// What should have been there.
        expected: Expected,
        /// What was there; `None` if the line ended first.
        found: Option<String>,
    },
    /// The event name is not one of the grammar's.
    UnknownEvent {
        /// The line.
        line: usize,
        /// The name found.
        found: String,
    },
    /// An event's sequence number is not the one expected.
    BadSequence {
        /// The line.
        line: usize,
        /// `dropped + 1` for the first event, the previous number plus one after.
        expected: u64,
        /// The number found.
        found: u64,
    },
    /// The sequence numbers would go past `u64::MAX`.
    SequenceOverflow {
        /// The line.
        line: usize,
    },
    /// An event is earlier than the one before it.
    TimeWentBackwards {
        /// The line.
        line: usize,
        /// The previous event's time.
        previous: Duration,
        /// This event's time.
        found: Duration,
    },
    /// The codec could not read a key.
    Key {
        /// The line.
        line: usize,
        /// The codec's error.
        source: Box<dyn Error + Send + Sync + 'static>,
    },
    /// The header names a version other than `v2`.
    UnsupportedVersion {
        /// The line.
        line: usize,
        /// The version found.
        found: String,
    },
    /// A header appears after the first line.
    MisplacedHeader {
        /// The line.
        line: usize,
    },
    /// A second `# dropped` line.
    DroppedTwice {
        /// The line.
        line: usize,
    },
    /// A `# dropped` line after the first event.
    DroppedAfterEvents {
        /// The line.
        line: usize,
    },
}

impl TraceError {
    /// The 1-based line the error is about.
    pub fn line(&self) -> usize {
        match self {
            TraceError::Expected { line, .. }
            | TraceError::UnknownEvent { line, .. }
            | TraceError::BadSequence { line, .. }
            | TraceError::SequenceOverflow { line }
            | TraceError::TimeWentBackwards { line, .. }
            | TraceError::Key { line, .. }
            | TraceError::UnsupportedVersion { line, .. }
            | TraceError::MisplacedHeader { line }
            | TraceError::DroppedTwice { line }
            | TraceError::DroppedAfterEvents { line } => *line,
        }
    }
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: ", self.line())?;
        match self {
            TraceError::Expected {
                expected, found, ..
            } => match found {
                Some(found) => write!(f, "expected {expected}, found {}", quoted(found)),
                None => write!(f, "expected {expected}, found the end of the line"),
            },
            TraceError::UnknownEvent { found, .. } => write!(
                f,
                "unknown event {} (expected acquire, try_acquire, acquire_permits, \
                 try_acquire_permits, acquire_all, try_acquire_all, capacity, release, cancel, \
                 shutdown, grant, would_block, would_block_all, closed, refused or a lease_ \
                 event)",
                quoted(found)
            ),
            TraceError::BadSequence {
                expected, found, ..
            } => write!(f, "expected sequence number {expected}, found {found}"),
            TraceError::SequenceOverflow { .. } => {
                f.write_str("sequence numbers run past the largest u64")
            }
            TraceError::TimeWentBackwards {
                previous, found, ..
            } => write!(
                f,
                "time {} is before the previous event's {}",
                TraceTime(*found),
                TraceTime(*previous)
            ),
            TraceError::Key { source, .. } => write!(f, "bad key: {source}"),
            TraceError::UnsupportedVersion { found, .. } if found == "v1" => f.write_str(
                "trace version \"v1\" names waiters by storage slot (w3v1), which the table no \
                 longer uses; this parser reads v2 (waiters numbered in order of arrival, w17): \
                 record the trace again",
            ),
            TraceError::UnsupportedVersion { found, .. } => write!(
                f,
                "unsupported trace version {} (this parser reads v2)",
                quoted(found)
            ),
            TraceError::MisplacedHeader { .. } => {
                f.write_str("the trace header must be the first line")
            }
            TraceError::DroppedTwice { .. } => f.write_str("a second `# dropped` line"),
            TraceError::DroppedAfterEvents { .. } => {
                f.write_str("`# dropped` must come before the first event")
            }
        }
    }
}

impl Error for TraceError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            TraceError::Key { source, .. } => Some(source.as_ref()),
            _ => None,
        }
    }
}

/// Writes `journal` as a trace: the header, a `# dropped` line, then one line per event.
///
/// # Examples
///
/// ```
/// use keyed_locks::trace::{IntegerKeys, parse_trace, write_trace};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let registry = keyed_locks::LockRegistry::builder().journal(1_000).spawn();
/// drop(registry.lock(7u32).await?);
/// let journal = registry.journal().await?;
///
/// let trace = write_trace(&journal, &IntegerKeys);
/// assert!(trace.contains(" acquire w1 7\n"));
/// assert_eq!(parse_trace(&trace, &IntegerKeys)?, journal);
/// # Ok(())
/// # }
/// ```
pub fn write_trace<K, C: KeyCodec<K>>(journal: &Journal<K>, codec: &C) -> String {
    let mut out = String::with_capacity(64 + 40 * journal.entries.len());
    out.push_str(TRACE_HEADER);
    out.push('\n');
    let _ = writeln!(out, "{DROPPED_PREFIX} {}", journal.dropped);
    for entry in &journal.entries {
        let _ = write!(out, "{} {} ", entry.seq, TraceTime(entry.at));
        write_event(&mut out, &entry.event, &|key, out| codec.encode(key, out));
        out.push('\n');
    }
    out
}

/// Reads a trace written by [`write_trace`] (or by hand, following the
/// [grammar](self#grammar)).
///
/// # Errors
///
/// The first problem found, with its line: a malformed or unknown line, a sequence number out
/// of order, a time going backwards, a key the codec cannot read, or a misplaced header or
/// `# dropped` line (see [`TraceError`]). Nothing is returned on error, not even the lines
/// before the bad one.
///
/// # Examples
///
/// ```
/// use keyed_locks::trace::{StringKeys, parse_trace};
///
/// let journal = parse_trace("1 +0.000000s try_acquire \"job\"\n", &StringKeys).unwrap();
/// assert_eq!(journal.entries.len(), 1);
///
/// let error = parse_trace("1 +0.000000s release x\n", &StringKeys).unwrap_err();
/// assert_eq!(error.to_string(), "line 1: expected a waiter like w17, found \"x\"");
/// ```
pub fn parse_trace<K, C: KeyCodec<K>>(text: &str, codec: &C) -> Result<Journal<K>, TraceError> {
    let mut journal = Journal::default();
    let mut dropped_line_seen = false;
    let mut previous: Option<(u64, Duration)> = None;
    // Key lines still owed by the last event (a multi-key event is followed by its keys).
    let mut key_lines_due = 0;
    let mut last_line = 0;
    for (index, raw_line) in text.split('\n').enumerate() {
        let line = index + 1;
        last_line = line;
        let text = raw_line.strip_suffix('\r').unwrap_or(raw_line);
        if key_lines_due > 0 {
            if let Some(entry) = journal.entries.last_mut() {
                parse_key_line(text, line, codec, entry)?;
            }
            key_lines_due -= 1;
            continue;
        }
        if text.bytes().all(|byte| byte == b' ' || byte == b'\t') {
            continue;
        }
        if let Some(version) = text.strip_prefix(HEADER_PREFIX) {
            if version != "v2" {
                return Err(TraceError::UnsupportedVersion {
                    line,
                    found: version.to_owned(),
                });
            }
            if line != 1 {
                return Err(TraceError::MisplacedHeader { line });
            }
            continue;
        }
        if let Some(count) = dropped_count_text(text) {
            if dropped_line_seen {
                return Err(TraceError::DroppedTwice { line });
            }
            if previous.is_some() {
                return Err(TraceError::DroppedAfterEvents { line });
            }
            journal.dropped = parse_count(count).ok_or_else(|| TraceError::Expected {
                line,
                expected: Expected::DroppedCount,
                found: found(count),
            })?;
            dropped_line_seen = true;
            continue;
        }
        if text.starts_with('#') {
            continue;
        }
        let (entry, key_lines) = parse_event_line(text, line, codec)?;
        key_lines_due = key_lines;
        let expected_seq = match previous {
            None => journal.dropped.checked_add(1),
            Some((seq, _)) => seq.checked_add(1),
        }
        .ok_or(TraceError::SequenceOverflow { line })?;
        if entry.seq != expected_seq {
            return Err(TraceError::BadSequence {
                line,
                expected: expected_seq,
                found: entry.seq,
            });
        }
        if let Some((_, previous_at)) = previous
            && entry.at < previous_at
        {
            return Err(TraceError::TimeWentBackwards {
                line,
                previous: previous_at,
                found: entry.at,
            });
        }
        previous = Some((entry.seq, entry.at));
        journal.entries.push(entry);
    }
    if key_lines_due > 0 {
        return Err(TraceError::Expected {
            line: last_line,
            expected: Expected::KeyLine,
            found: None,
        });
    }
    Ok(journal)
}

/// The count text of a `# dropped` line, or `None` if `text` is not one. `# droppedX` is a
/// comment; `# dropped`, `# dropped ` and `# dropped x` are malformed dropped lines.
fn dropped_count_text(text: &str) -> Option<&str> {
    let after = text.strip_prefix(DROPPED_PREFIX)?;
    if after.is_empty() {
        return Some("");
    }
    after.strip_prefix(' ')
}

/// Reads one event line. A multi-key event comes back with no keys yet and the number of key
/// lines that must follow it.
fn parse_event_line<K, C: KeyCodec<K>>(
    text: &str,
    line: usize,
    codec: &C,
) -> Result<(JournalEntry<K>, u64), TraceError> {
    let expected = |expected: Expected, found_text: &str| TraceError::Expected {
        line,
        expected,
        found: found(found_text),
    };
    let (seq_text, rest) = split_token(text);
    let seq = parse_count(seq_text).ok_or_else(|| expected(Expected::SequenceNumber, seq_text))?;
    let (time_text, rest) = split_token(rest);
    let at = parse_time(time_text).ok_or_else(|| expected(Expected::Time, time_text))?;
    let (name, rest) = split_token(rest);
    let waiter = |rest| split_waiter(rest, line);
    let key = |rest: &str| -> Result<K, TraceError> {
        if rest.is_empty() {
            return Err(expected(Expected::Key, rest));
        }
        codec.decode(rest).map_err(|error| TraceError::Key {
            line,
            source: Box::new(error),
        })
    };
    let end = |rest: &str| -> Result<(), TraceError> {
        if rest.is_empty() {
            Ok(())
        } else {
            Err(expected(Expected::EndOfLine, rest))
        }
    };
    let mut key_lines = 0;
    let mut key_count = |rest: &str| -> Result<(), TraceError> {
        let (count_text, rest) = split_token(rest);
        key_lines = parse_count(count_text)
            .filter(|count| *count > 0)
            .ok_or_else(|| expected(Expected::KeyCount, count_text))?;
        end(rest)
    };
    let event = match name {
        names::ACQUIRE_ALL => {
            let (waiter, rest) = waiter(rest)?;
            key_count(rest)?;
            JournalEvent::AcquireAll {
                waiter,
                keys: Vec::new(),
            }
        }
        names::TRY_ACQUIRE_ALL => {
            key_count(rest)?;
            JournalEvent::TryAcquireAll { keys: Vec::new() }
        }
        names::WOULD_BLOCK_ALL => {
            end(rest)?;
            JournalEvent::WouldBlockAll
        }
        names::ACQUIRE => {
            let (waiter, rest) = waiter(rest)?;
            JournalEvent::Acquire {
                waiter,
                key: key(rest)?,
            }
        }
        names::TRY_ACQUIRE => JournalEvent::TryAcquire { key: key(rest)? },
        names::ACQUIRE_PERMITS => {
            let (waiter, rest) = waiter(rest)?;
            let (permits, rest) = split_permits(rest, line)?;
            JournalEvent::AcquirePermits {
                waiter,
                key: key(rest)?,
                permits,
            }
        }
        names::TRY_ACQUIRE_PERMITS => {
            let (permits, rest) = split_permits(rest, line)?;
            JournalEvent::TryAcquirePermits {
                key: key(rest)?,
                permits,
            }
        }
        names::CAPACITY => {
            let (permits, rest) = split_permits(rest, line)?;
            end(rest)?;
            JournalEvent::Capacity { permits }
        }
        names::RELEASE => {
            let (waiter, rest) = waiter(rest)?;
            end(rest)?;
            JournalEvent::Release { waiter }
        }
        names::CANCEL => {
            let (waiter, rest) = waiter(rest)?;
            end(rest)?;
            JournalEvent::Cancel { waiter }
        }
        names::SHUTDOWN => {
            end(rest)?;
            JournalEvent::Shutdown
        }
        names::GRANT => {
            let (waiter, rest) = waiter(rest)?;
            let (token_text, rest) = split_token(rest);
            let fencing_token = parse_count(token_text)
                .ok_or_else(|| expected(Expected::FencingToken, token_text))?;
            end(rest)?;
            JournalEvent::Grant {
                waiter,
                fencing_token,
            }
        }
        names::WOULD_BLOCK => JournalEvent::WouldBlock { key: key(rest)? },
        names::CLOSED => {
            let (waiter, rest) = waiter(rest)?;
            end(rest)?;
            JournalEvent::Closed { waiter }
        }
        names::REFUSED => {
            let (waiter, rest) = waiter(rest)?;
            let (reason_text, rest) = split_token(rest);
            let reason = REFUSALS
                .into_iter()
                .find(|reason| refusal_name(*reason) == reason_text)
                .ok_or_else(|| expected(Expected::Refusal, reason_text))?;
            end(rest)?;
            JournalEvent::Refused { waiter, reason }
        }
        names::LEASE_REQUESTED => JournalEvent::Lease(Box::new(LeaseNote {
            name: lease_name(rest, line)?,
            event: LeaseEvent::Requested,
        })),
        names::LEASE_GRANTED | names::LEASE_LOST | names::LEASE_RELEASED => {
            let (fence_text, rest) = split_token(rest);
            let fence =
                parse_count(fence_text).ok_or_else(|| expected(Expected::Fence, fence_text))?;
            let event = match name {
                names::LEASE_GRANTED => LeaseEvent::Granted { fence },
                names::LEASE_LOST => LeaseEvent::Lost { fence },
                _ => LeaseEvent::Released { fence },
            };
            JournalEvent::Lease(Box::new(LeaseNote {
                name: lease_name(rest, line)?,
                event,
            }))
        }
        unknown => {
            return Err(TraceError::UnknownEvent {
                line,
                found: unknown.to_owned(),
            });
        }
    };
    Ok((JournalEntry { seq, at, event }, key_lines))
}

/// Reads a key line (`| key`) of the multi-key event `entry`, and adds its key.
fn parse_key_line<K, C: KeyCodec<K>>(
    text: &str,
    line: usize,
    codec: &C,
    entry: &mut JournalEntry<K>,
) -> Result<(), TraceError> {
    let key_text = text
        .strip_prefix(KEY_LINE_PREFIX)
        .filter(|key_text| !key_text.is_empty())
        .ok_or_else(|| TraceError::Expected {
            line,
            expected: Expected::KeyLine,
            found: found(text),
        })?;
    let key = codec.decode(key_text).map_err(|error| TraceError::Key {
        line,
        source: Box::new(error),
    })?;
    if let JournalEvent::AcquireAll { keys, .. } | JournalEvent::TryAcquireAll { keys } =
        &mut entry.event
    {
        keys.push(key);
    }
    Ok(())
}

/// Splits off a count of permits (1 or more, fitting a `u32`) at the start of `text`.
fn split_permits(text: &str, line: usize) -> Result<(u32, &str), TraceError> {
    let (permits_text, rest) = split_token(text);
    let permits = parse_count(permits_text)
        .and_then(|count| u32::try_from(count).ok())
        .filter(|count| *count > 0)
        .ok_or_else(|| TraceError::Expected {
            line,
            expected: Expected::Permits,
            found: found(permits_text),
        })?;
    Ok((permits, rest))
}

/// The lease name that ends a lease line, quoted as [`StringKeys`] writes it.
fn lease_name(text: &str, line: usize) -> Result<String, TraceError> {
    if text.is_empty() {
        return Err(TraceError::Expected {
            line,
            expected: Expected::LeaseName,
            found: None,
        });
    }
    StringKeys.decode(text).map_err(|error| TraceError::Key {
        line,
        source: Box::new(error),
    })
}

/// Splits off the waiter at the start of `text`.
fn split_waiter(text: &str, line: usize) -> Result<(WaiterId, &str), TraceError> {
    let (waiter_text, rest) = split_token(text);
    let waiter = parse_waiter(waiter_text).ok_or_else(|| TraceError::Expected {
        line,
        expected: Expected::Waiter,
        found: found(waiter_text),
    })?;
    Ok((waiter, rest))
}

/// Splits off the text before the first space; the rest starts after that space.
fn split_token(text: &str) -> (&str, &str) {
    text.split_once(' ').unwrap_or((text, ""))
}

/// What an error shows as found: `None` for nothing left on the line.
fn found(text: &str) -> Option<String> {
    (!text.is_empty()).then(|| text.to_owned())
}

/// A decimal `u64` without sign: `str::parse` would also take `+7`.
fn parse_count(text: &str) -> Option<u64> {
    if !crate::pure::journal::is_decimal(text) {
        return None;
    }
    text.parse().ok()
}

/// Reads `+<secs>.<6 or 9 digits>s`.
fn parse_time(text: &str) -> Option<Duration> {
    let (secs, fraction) = text.strip_prefix('+')?.strip_suffix('s')?.split_once('.')?;
    let secs = parse_count(secs)?;
    let fraction_value = u32::try_from(parse_count(fraction)?).ok()?;
    let nanos = match fraction.len() {
        6 => fraction_value * 1_000,
        9 => fraction_value,
        _ => return None,
    };
    Some(Duration::new(secs, nanos))
}

/// A time as a trace writes it: whole microseconds in 6 digits, nanoseconds in 9 only when
/// the time is not a whole number of microseconds, so that writing never loses precision.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TraceTime(pub(crate) Duration);

impl fmt::Display for TraceTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (secs, nanos) = (self.0.as_secs(), self.0.subsec_nanos());
        if nanos % 1_000 == 0 {
            write!(f, "+{secs}.{:06}s", nanos / 1_000)
        } else {
            write!(f, "+{secs}.{nanos:09}s")
        }
    }
}

/// The grammar's event names, each written once, for the writer and the parser.
mod names {
    pub(super) const ACQUIRE: &str = "acquire";
    pub(super) const TRY_ACQUIRE: &str = "try_acquire";
    pub(super) const RELEASE: &str = "release";
    pub(super) const CANCEL: &str = "cancel";
    pub(super) const SHUTDOWN: &str = "shutdown";
    pub(super) const GRANT: &str = "grant";
    pub(super) const WOULD_BLOCK: &str = "would_block";
    pub(super) const CLOSED: &str = "closed";
    pub(super) const REFUSED: &str = "refused";
    pub(super) const ACQUIRE_PERMITS: &str = "acquire_permits";
    pub(super) const TRY_ACQUIRE_PERMITS: &str = "try_acquire_permits";
    pub(super) const CAPACITY: &str = "capacity";
    pub(super) const ACQUIRE_ALL: &str = "acquire_all";
    pub(super) const TRY_ACQUIRE_ALL: &str = "try_acquire_all";
    pub(super) const WOULD_BLOCK_ALL: &str = "would_block_all";
    pub(super) const LEASE_REQUESTED: &str = "lease_requested";
    pub(super) const LEASE_GRANTED: &str = "lease_granted";
    pub(super) const LEASE_LOST: &str = "lease_lost";
    pub(super) const LEASE_RELEASED: &str = "lease_released";
}

/// Every refusal, for the parser to look names up in.
const REFUSALS: [Refusal; 3] = [Refusal::Unknown, Refusal::NotHolding, Refusal::NotWaiting];

/// The grammar's name of a refusal, for the writer and the parser.
fn refusal_name(reason: Refusal) -> &'static str {
    match reason {
        Refusal::Unknown => "unknown",
        Refusal::NotHolding => "not_holding",
        Refusal::NotWaiting => "not_waiting",
    }
}

/// Writes one event as the grammar's `action`, keys by `write_key`. Shared with
/// [`replay`](crate::replay), whose divergence reports show events the same way.
pub(crate) fn write_event<K>(
    out: &mut String,
    event: &JournalEvent<K>,
    write_key: &dyn Fn(&K, &mut String),
) {
    match event {
        JournalEvent::Acquire { waiter, key } => {
            let _ = write!(out, "{} {} ", names::ACQUIRE, format_waiter(*waiter));
            write_key(key, out);
        }
        JournalEvent::TryAcquire { key } => {
            let _ = write!(out, "{} ", names::TRY_ACQUIRE);
            write_key(key, out);
        }
        JournalEvent::AcquirePermits {
            waiter,
            key,
            permits,
        } => {
            let _ = write!(
                out,
                "{} {} {permits} ",
                names::ACQUIRE_PERMITS,
                format_waiter(*waiter)
            );
            write_key(key, out);
        }
        JournalEvent::TryAcquirePermits { key, permits } => {
            let _ = write!(out, "{} {permits} ", names::TRY_ACQUIRE_PERMITS);
            write_key(key, out);
        }
        JournalEvent::Capacity { permits } => {
            let _ = write!(out, "{} {permits}", names::CAPACITY);
        }
        JournalEvent::AcquireAll { waiter, keys } => {
            let _ = write!(
                out,
                "{} {} {}",
                names::ACQUIRE_ALL,
                format_waiter(*waiter),
                keys.len()
            );
            write_key_lines(out, keys, write_key);
        }
        JournalEvent::TryAcquireAll { keys } => {
            let _ = write!(out, "{} {}", names::TRY_ACQUIRE_ALL, keys.len());
            write_key_lines(out, keys, write_key);
        }
        JournalEvent::WouldBlockAll => out.push_str(names::WOULD_BLOCK_ALL),
        JournalEvent::Release { waiter } => {
            let _ = write!(out, "{} {}", names::RELEASE, format_waiter(*waiter));
        }
        JournalEvent::Cancel { waiter } => {
            let _ = write!(out, "{} {}", names::CANCEL, format_waiter(*waiter));
        }
        JournalEvent::Shutdown => out.push_str(names::SHUTDOWN),
        JournalEvent::Grant {
            waiter,
            fencing_token,
        } => {
            let _ = write!(
                out,
                "{} {} {fencing_token}",
                names::GRANT,
                format_waiter(*waiter)
            );
        }
        JournalEvent::WouldBlock { key } => {
            let _ = write!(out, "{} ", names::WOULD_BLOCK);
            write_key(key, out);
        }
        JournalEvent::Closed { waiter } => {
            let _ = write!(out, "{} {}", names::CLOSED, format_waiter(*waiter));
        }
        JournalEvent::Refused { waiter, reason } => {
            let reason = refusal_name(*reason);
            let _ = write!(
                out,
                "{} {} {reason}",
                names::REFUSED,
                format_waiter(*waiter)
            );
        }
        JournalEvent::Lease(note) => {
            let LeaseNote { name, event } = note.as_ref();
            let _ = match *event {
                LeaseEvent::Requested => write!(out, "{} ", names::LEASE_REQUESTED),
                LeaseEvent::Granted { fence } => write!(out, "{} {fence} ", names::LEASE_GRANTED),
                LeaseEvent::Lost { fence } => write!(out, "{} {fence} ", names::LEASE_LOST),
                LeaseEvent::Released { fence } => {
                    write!(out, "{} {fence} ", names::LEASE_RELEASED)
                }
            };
            // A lease is named by text whatever the registry's keys are.
            StringKeys.encode(name, out);
        }
    }
}

/// The key lines that follow a multi-key event, one `| key` line per key.
fn write_key_lines<K>(out: &mut String, keys: &[K], write_key: &dyn Fn(&K, &mut String)) {
    for key in keys {
        out.push('\n');
        out.push_str(KEY_LINE_PREFIX);
        write_key(key, out);
    }
}

/// `text` in double quotes with Rust escapes, cut short if long, for error messages: a fuzzed
/// or binary line should not make a message of megabytes.
fn quoted(text: &str) -> String {
    const SHOWN_CHARACTERS: usize = 40;
    let mut characters = text.chars();
    let shown: String = characters.by_ref().take(SHOWN_CHARACTERS).collect();
    if characters.next().is_some() {
        format!("{shown:?}...")
    } else {
        format!("{shown:?}")
    }
}
