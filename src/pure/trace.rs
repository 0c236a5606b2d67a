//! Traces: journals as JSON Lines, for reading, diffing, committing and replaying.
//!
//! Needs the `serde` feature. A trace is a header line, then one
//! [`JournalEntry`](crate::journal::JournalEntry) per line, each a JSON object as serde writes
//! the journal's types:
//!
//! ```text
//! {"format":"keyed-locks-trace","version":3,"dropped":0,"description":"two requests for 42"}
//! {"seq":1,"at_ns":0,"event":{"acquire":{"waiter":1,"key":42,"permits":1}}}
//! {"seq":2,"at_ns":0,"event":{"grant":{"waiter":1,"fencing_token":1}}}
//! {"seq":3,"at_ns":10000000,"event":{"acquire":{"waiter":2,"key":42,"permits":1}}}
//! {"seq":4,"at_ns":500000000,"event":{"release":{"waiter":1}}}
//! {"seq":5,"at_ns":500000000,"event":{"grant":{"waiter":2,"fencing_token":2}}}
//! ```
//!
//! - The header names the format (`"keyed-locks-trace"`), its version ([`TRACE_VERSION`]),
//!   how many of the oldest events the journal dropped, and optionally a `description`: free
//!   text saying what the trace shows and where it came from.
//! - An entry has its sequence number, its time since the registry started in whole
//!   nanoseconds (`at_ns`), and its event, named in `snake_case` with its fields inside
//!   (`"shutdown"` and `"would_block_all"` have none and are written as plain strings). A
//!   waiter is its arrival number at the table; an acquire carries its permit count, all of
//!   the key's permits for an exclusive lock. Keys are written as serde writes the key type:
//!   any `Serialize` key can be written, any `DeserializeOwned` key read back.
//! - Blank lines are ignored. Reading is all-or-nothing: the first problem is a
//!   `TraceError` naming its line. Beyond the JSON, the reader checks that the first entry
//!   is numbered `dropped + 1` and each later one is one more than the one before. Whether the
//!   events make sense together is what [`replay`](crate::replay) checks.
//!
//! Versions 1 and 2 were a hand-written text format (`# keyed-locks trace v2`); the reader
//! names their version in its error, and such traces are recorded again.

#[cfg(feature = "serde")]
pub use json_lines::TraceError;

/// The `format` of a trace's header line.
pub const TRACE_FORMAT: &str = "keyed-locks-trace";

/// The `version` of the traces this crate writes, and the only one it reads.
pub const TRACE_VERSION: u32 = 3;

#[cfg(feature = "serde")]
mod json_lines {
    use std::borrow::Cow;
    use std::error::Error;
    use std::fmt;
    use std::io;

    use serde::de::DeserializeOwned;
    use serde::{Deserialize, Serialize};

    use super::{TRACE_FORMAT, TRACE_VERSION};
    use crate::pure::journal::{Journal, JournalEntry};

    /// The first line of a trace.
    #[derive(Serialize, Deserialize)]
    struct Header<'a> {
        #[serde(borrow)]
        format: Cow<'a, str>,
        version: u32,
        dropped: u64,
        #[serde(default, skip_serializing_if = "Option::is_none", borrow)]
        description: Option<Cow<'a, str>>,
    }

    /// What the text traces of versions 1 and 2 began with.
    const TEXT_HEADER_PREFIX: &str = "# keyed-locks trace v";

    /// Why a trace could not be written or read.
    #[derive(Debug)]
    #[non_exhaustive]
    pub enum TraceError {
        /// The text has no header line: it is empty, or blank.
        MissingHeader,
        /// The first line is not a header line.
        Header {
            /// What JSON found wrong with it.
            source: serde_json::Error,
        },
        /// The header names another format.
        NotATrace {
            /// The format named.
            found: String,
        },
        /// The header names a version this crate does not read.
        UnsupportedVersion {
            /// The version named.
            found: u32,
        },
        /// A line after the header is not a journal entry.
        Entry {
            /// The line, counting from 1 (the header).
            line: usize,
            /// What JSON found wrong with it.
            source: serde_json::Error,
        },
        /// An entry's sequence number does not follow the one before (or, for the first entry,
        /// the dropped count).
        BadSequence {
            /// The line, counting from 1 (the header).
            line: usize,
            /// The number that should be there.
            expected: u64,
            /// The number found.
            found: u64,
        },
        /// A journal could not be written: a key's `Serialize` failed, or the writer did.
        Write {
            /// What failed.
            source: serde_json::Error,
        },
    }

    impl TraceError {
        /// The line of the trace the error is about, counting from 1 (the header); `None` for a
        /// [`Write`](TraceError::Write) error.
        pub fn line(&self) -> Option<usize> {
            match self {
                TraceError::MissingHeader
                | TraceError::Header { .. }
                | TraceError::NotATrace { .. }
                | TraceError::UnsupportedVersion { .. } => Some(1),
                TraceError::Entry { line, .. } | TraceError::BadSequence { line, .. } => {
                    Some(*line)
                }
                TraceError::Write { .. } => None,
            }
        }
    }

    impl fmt::Display for TraceError {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            match self {
                TraceError::MissingHeader => write!(f, "line 1: the trace has no header line"),
                TraceError::Header { source } => {
                    write!(f, "line 1: not a keyed-locks trace header: {source}")
                }
                TraceError::NotATrace { found } => write!(
                    f,
                    "line 1: the header names the format {found:?}, not {TRACE_FORMAT:?}"
                ),
                TraceError::UnsupportedVersion { found } => write!(
                    f,
                    "line 1: trace version {found} is not read by this version of keyed-locks, \
                     which reads version {TRACE_VERSION} (record the trace again)"
                ),
                TraceError::Entry { line, source } => {
                    write!(f, "line {line}: not a journal entry: {source}")
                }
                TraceError::BadSequence {
                    line,
                    expected,
                    found,
                } => write!(f, "line {line}: expected seq {expected}, found {found}"),
                TraceError::Write { source } => write!(f, "cannot write the trace: {source}"),
            }
        }
    }

    impl Error for TraceError {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            match self {
                TraceError::Header { source }
                | TraceError::Entry { source, .. }
                | TraceError::Write { source } => Some(source),
                _ => None,
            }
        }
    }

    impl<K: Serialize> Journal<K> {
        /// Writes the journal to `out` as a trace: a header line with `description`, if given,
        /// then one line per entry.
        ///
        /// # Errors
        ///
        /// [`TraceError::Write`] if a key cannot be written as JSON or `out` fails.
        ///
        /// # Examples
        ///
        /// ```
        /// use keyed_locks::journal::Journal;
        ///
        /// let mut file = Vec::new();
        /// Journal::<u64>::default().write_json_lines(Some("nothing yet"), &mut file)?;
        /// assert_eq!(
        ///     String::from_utf8(file)?,
        ///     "{\"format\":\"keyed-locks-trace\",\"version\":3,\"dropped\":0,\
        ///      \"description\":\"nothing yet\"}\n"
        /// );
        /// # Ok::<(), Box<dyn std::error::Error>>(())
        /// ```
        pub fn write_json_lines(
            &self,
            description: Option<&str>,
            mut out: impl io::Write,
        ) -> Result<(), TraceError> {
            let header = Header {
                format: TRACE_FORMAT.into(),
                version: TRACE_VERSION,
                dropped: self.dropped,
                description: description.map(Into::into),
            };
            write_line(&mut out, &header)
                .and_then(|()| {
                    self.entries
                        .iter()
                        .try_for_each(|entry| write_line(&mut out, entry))
                })
                .and_then(|()| out.flush().map_err(serde_json::Error::io))
                .map_err(|source| TraceError::Write { source })
        }

        /// The journal as a trace, without a description.
        ///
        /// # Errors
        ///
        /// [`TraceError::Write`] if a key cannot be written as JSON.
        pub fn to_json_lines(&self) -> Result<String, TraceError> {
            let mut text = Vec::new();
            self.write_json_lines(None, &mut text)?;
            // serde_json writes UTF-8 only.
            String::from_utf8(text).map_err(|error| TraceError::Write {
                source: serde_json::Error::io(io::Error::new(io::ErrorKind::InvalidData, error)),
            })
        }
    }

    impl<K: DeserializeOwned> Journal<K> {
        /// Reads a trace that [`write_json_lines`](Journal::write_json_lines) wrote.
        ///
        /// # Errors
        ///
        /// The first problem found, as a [`TraceError`] naming its line; no partial journal is
        /// returned.
        ///
        /// # Examples
        ///
        /// ```
        /// use keyed_locks::journal::{Journal, JournalEvent};
        ///
        /// let trace = r#"{"format":"keyed-locks-trace","version":3,"dropped":0}
        /// {"seq":1,"at_ns":0,"event":{"try_acquire":{"key":"user:42","permits":1}}}
        /// {"seq":2,"at_ns":0,"event":{"would_block":{"key":"user:42"}}}
        /// {"seq":3,"at_ns":0,"event":"shutdown"}
        /// "#;
        /// let journal = Journal::<String>::from_json_lines(trace)?;
        /// assert_eq!(journal.entries[2].event, JournalEvent::Shutdown);
        /// assert_eq!(journal.to_json_lines()?, trace);
        ///
        /// let error = Journal::<String>::from_json_lines(&trace.replace("seq\":3", "seq\":5"))
        ///     .unwrap_err();
        /// assert_eq!(error.to_string(), "line 4: expected seq 3, found 5");
        /// # Ok::<(), keyed_locks::trace::TraceError>(())
        /// ```
        pub fn from_json_lines(text: &str) -> Result<Journal<K>, TraceError> {
            let mut lines = (1..)
                .zip(text.lines())
                .filter(|(_, line)| !line.trim().is_empty());
            let Some((_, header)) = lines.next() else {
                return Err(TraceError::MissingHeader);
            };
            let dropped = read_header(header)?;
            let mut entries = Vec::new();
            let mut expected = dropped.checked_add(1);
            for (line, text) in lines {
                let entry: JournalEntry<K> = serde_json::from_str(text)
                    .map_err(|source| TraceError::Entry { line, source })?;
                // A journal numbers every event it saw, so `u64::MAX` is the last one there
                // can be: nothing may follow it.
                if expected != Some(entry.seq) {
                    return Err(TraceError::BadSequence {
                        line,
                        expected: expected.unwrap_or(u64::MAX),
                        found: entry.seq,
                    });
                }
                expected = entry.seq.checked_add(1);
                entries.push(entry);
            }
            Ok(Journal { entries, dropped })
        }
    }

    /// Checks the header line and returns its dropped count.
    fn read_header(line: &str) -> Result<u64, TraceError> {
        if let Some(version) = line.strip_prefix(TEXT_HEADER_PREFIX) {
            // The text format of versions 1 and 2: say which, rather than "not JSON".
            if let Ok(found) = version.trim_end().parse() {
                return Err(TraceError::UnsupportedVersion { found });
            }
        }
        let header: Header<'_> =
            serde_json::from_str(line).map_err(|source| TraceError::Header { source })?;
        if header.format != TRACE_FORMAT {
            return Err(TraceError::NotATrace {
                found: header.format.into_owned(),
            });
        }
        if header.version != TRACE_VERSION {
            return Err(TraceError::UnsupportedVersion {
                found: header.version,
            });
        }
        Ok(header.dropped)
    }

    /// Writes `value` as one line of JSON.
    fn write_line(out: &mut impl io::Write, value: &impl Serialize) -> serde_json::Result<()> {
        serde_json::to_writer(&mut *out, value)?;
        out.write_all(b"\n").map_err(serde_json::Error::io)
    }
}
