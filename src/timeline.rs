//! Lock timelines: a [`Journal`] drawn as one lane per key, as an SVG picture or as text.
//!
//! Needs the `timeline` feature. [`Journal::to_svg`] draws a journal as it is;
//! [`Timeline`] chooses the axis and the title, and draws text for a terminal too.
//!
//! ```
//! use keyed_locks::LockRegistry;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Keep the last 10 000 events (per shard) and draw them, from a service's debug endpoint
//! // say.
//! let registry = LockRegistry::builder().journal(10_000).spawn();
//! drop(registry.lock("user:42").await?);
//!
//! let picture: String = registry.journal().await?.to_svg();
//! assert!(picture.starts_with("<svg") && picture.contains(">&quot;user:42&quot;</text>"));
//! # Ok(())
//! # }
//! ```
//!
//! What the picture shows:
//!
//! - One lane per key, in the order the keys first appear in the journal, each named by the
//!   key's `Debug` (`42`, `"user:42"`). Keys that print alike share a lane.
//! - A hold is a solid bar from its grant to its release, labelled with its fencing token (and
//!   its waiter, `w2`, where there is room). Holders that share a key (shared locks, permits)
//!   overlap on its row.
//! - A wait is a lighter bar from the waiter's arrival to its grant, on the rows under its
//!   key's holds, as few rows as keep waits from overlapping. A grant that found the key free
//!   draws no wait.
//! - A wait that was cancelled ends in a red cross; a hold or a wait ended by the registry's
//!   shutdown ends in a square, and a dashed line marks the shutdown; a bar still going when
//!   the journal ends ends in an arrow. Each bar's tooltip says who, what and when.
//!
//! Try-acquires that would block, refused calls and notes change nothing and draw nothing;
//! nor does an acquisition of several keys at once (`lock_all`). A journal that dropped its
//! oldest events (it was full) draws only the holds and waits that began after its first
//! retained event, and the subtitle says how many events it dropped.
//!
//! The drawing reads nothing but the journal: no clock, no runtime. The times are the
//! journal's, since the registry started. A sharded registry keeps a journal per shard
//! ([`LockRegistry::journals`](crate::LockRegistry::journals)); draw each.
//!
//! The pictures are for people to read: the calls here follow semver, but what they draw
//! (layout, colours, the exact text) may change in any release.

mod axis;
mod lanes;
#[cfg(test)]
mod script;
mod svg;
mod text;

use std::fmt;

pub use self::axis::Axis;
use self::axis::Scale;
use self::lanes::{Layout, layout_of};
use crate::pure::journal::Journal;

/// The text timeline's narrowest width: narrower, the tick labels no longer fit.
const FEWEST_COLUMNS: usize = 20;

/// A [`Journal`] laid out for drawing, with how to draw it: the axis and the title.
///
/// Made once with [`Timeline::new`], then drawn as SVG ([`to_svg`](Self::to_svg)) or as text
/// ([`to_text`](Self::to_text)), as often as wanted; the module docs say what the drawing
/// shows.
///
/// # Examples
///
/// ```
/// use keyed_locks::LockRegistry;
/// use keyed_locks::timeline::{Axis, Timeline};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let registry = LockRegistry::builder().journal(1000).spawn();
/// drop(registry.lock(42u64).await?);
///
/// let timeline = Timeline::new(&registry.journal().await?)
///     .axis(Axis::Sequence)
///     .title("after one lock");
/// let picture = timeline.to_svg();
/// assert!(picture.contains("Lock timeline: after one lock"));
/// println!("{}", timeline.to_text(72));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Timeline {
    layout: Layout,
    axis: Option<Axis>,
    title: Option<String>,
}

impl Timeline {
    /// Lays out `journal`: its holds and waits as bars on one lane per key, each key named by
    /// its `Debug`.
    ///
    /// The journal is read as it is, not checked: an event about a waiter it never showed
    /// arriving (the waiter arrived before its oldest retained event) draws nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_locks::LockRegistry;
    /// use keyed_locks::timeline::Timeline;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let registry = LockRegistry::builder().journal(1000).spawn();
    /// let first = registry.lock("job:9").await?;
    /// let second = registry.lock("job:9");
    /// tokio::pin!(second);
    /// // Polled once, so that it queues behind the first.
    /// assert!(futures::poll!(second.as_mut()).is_pending());
    /// drop(first);
    /// drop(second.await?);
    ///
    /// let timeline = Timeline::new(&registry.journal().await?);
    /// assert_eq!(timeline.summary(), "1 key, 2 holds, 1 wait");
    /// # Ok(())
    /// # }
    /// ```
    pub fn new<K: fmt::Debug>(journal: &Journal<K>) -> Self {
        Timeline {
            layout: layout_of(journal),
            axis: None,
            title: None,
        }
    }

    /// Puts `axis` on the horizontal axis: time since the registry started, or event
    /// sequence numbers.
    ///
    /// By default, time, unless every event of the journal has the same time (as in
    /// hand-made traces and on a paused clock that never advanced), which would draw every
    /// bar at one instant.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_locks::journal::Journal;
    /// use keyed_locks::timeline::{Axis, Timeline};
    ///
    /// let journal = Journal::<u64>::default();
    /// let picture = Timeline::new(&journal).axis(Axis::Sequence).to_svg();
    /// assert!(picture.contains("event sequence number"));
    /// ```
    #[must_use = "`axis` returns the timeline with the axis set"]
    pub fn axis(mut self, axis: Axis) -> Self {
        self.axis = Some(axis);
        self
    }

    /// Names what is drawn (a trace file, a service) in the SVG picture's heading,
    /// "Lock timeline: `title`". Without a title the heading is "Lock timeline". The text
    /// timeline has no heading.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_locks::journal::Journal;
    /// use keyed_locks::timeline::Timeline;
    ///
    /// let journal = Journal::<u64>::default();
    /// let picture = Timeline::new(&journal).title("payments, node 2").to_svg();
    /// assert!(picture.contains(">Lock timeline: payments, node 2</text>"));
    /// ```
    #[must_use = "`title` returns the timeline with the title set"]
    pub fn title(mut self, title: impl Into<String>) -> Self {
        self.title = Some(title.into());
        self
    }

    /// Draws the timeline as a standalone SVG picture, 960 units wide, as tall as its lanes
    /// need: a heading, a subtitle with the counts and the span of the journal, the lanes over
    /// a labelled axis, and a legend.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_locks::journal::Journal;
    /// use keyed_locks::timeline::Timeline;
    ///
    /// let picture = Timeline::new(&Journal::<u64>::default()).to_svg();
    /// assert!(picture.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    /// assert!(picture.ends_with("</svg>\n"));
    /// ```
    pub fn to_svg(&self) -> String {
        svg::render_svg(&self.layout, &self.scale(), self.title.as_deref())
    }

    /// Draws the timeline as text `columns` wide (at least 20; fewer are taken as 20), for a
    /// terminal: a line of counts, then per key a row of holds (`1###`, from the fencing token)
    /// and rows of waits (`...`), a ruler, and a legend. Each line ends in `\n`.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_locks::LockRegistry;
    /// use keyed_locks::timeline::{Axis, Timeline};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let registry = LockRegistry::builder().journal(1000).spawn();
    /// drop(registry.lock(7u64).await?);
    ///
    /// // Events 1 to 3: the acquire, the grant and the release; the hold is the second half.
    /// let timeline = Timeline::new(&registry.journal().await?).axis(Axis::Sequence);
    /// let text = timeline.to_text(40);
    /// let lane = text.lines().nth(1).ok_or("no lane")?;
    /// assert_eq!(lane, format!("7   |{}1{}|", " ".repeat(20), "#".repeat(19)));
    /// # Ok(())
    /// # }
    /// ```
    pub fn to_text(&self, columns: usize) -> String {
        text::render_text(&self.layout, &self.scale(), columns.max(FEWEST_COLUMNS))
    }

    /// What is drawn, counted in words: keys, holds and waits, as in "1 key, 2 holds, 1 wait".
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_locks::journal::Journal;
    /// use keyed_locks::timeline::Timeline;
    ///
    /// let timeline = Timeline::new(&Journal::<u64>::default());
    /// assert_eq!(timeline.summary(), "0 keys, 0 holds, 0 waits");
    /// ```
    pub fn summary(&self) -> String {
        self.layout.counts()
    }

    fn scale(&self) -> Scale {
        // A journal whose events all share one instant would be drawn as a single line of time.
        let axis = self
            .axis
            .unwrap_or(if self.layout.first.at == self.layout.last.at {
                Axis::Sequence
            } else {
                Axis::Time
            });
        Scale::of(&self.layout, axis)
    }
}

impl<K: fmt::Debug> Journal<K> {
    /// Draws the journal as a lock timeline, an SVG picture: one lane per key, holds as solid
    /// bars labelled with their fencing token, waits as lighter bars from arrival to grant.
    ///
    /// The same as `Timeline::new(self).to_svg()`; [`Timeline`] chooses the axis and the
    /// title, and draws text too. The [`timeline`](crate::timeline) module says what the
    /// picture shows. Needs the `timeline` feature.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_locks::LockRegistry;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let registry = LockRegistry::builder().journal(1000).spawn();
    /// drop(registry.lock(42u64).await?);
    ///
    /// let picture = registry.journal().await?.to_svg();
    /// assert!(picture.contains("1 key, 1 hold, 0 waits"));
    /// // std::fs::write("timeline.svg", picture)?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn to_svg(&self) -> String {
        Timeline::new(self).to_svg()
    }
}

#[cfg(test)]
mod tests {
    //! The drawing through its public calls: what each kind of bar looks like in the picture,
    //! and that the picture is well-formed XML whatever the keys hold.

    use std::time::Duration;

    use super::*;
    use crate::pure::journal::{JournalEntry, JournalEvent};
    use crate::timeline::script::*;

    /// Fails unless `svg` is one `<svg>` element whose tags nest, whose attribute values are
    /// quoted, and whose text has no markup character left unescaped.
    fn assert_well_formed(svg: &str) {
        let mut open: Vec<&str> = Vec::new();
        let mut rest = svg.trim_end();
        let mut elements = 0;
        while let Some(start) = rest.find('<') {
            assert_text_escaped(&rest[..start], svg);
            let length = rest[start..]
                .find('>')
                .unwrap_or_else(|| panic!("a tag that never ends in\n{svg}"));
            let tag = &rest[start + 1..start + length];
            assert!(
                !tag.contains('<') && tag.matches('"').count().is_multiple_of(2),
                "malformed tag <{tag}> in\n{svg}"
            );
            if let Some(name) = tag.strip_prefix('/') {
                assert_eq!(
                    open.pop(),
                    Some(name),
                    "a closing tag out of place in\n{svg}"
                );
            } else {
                assert!(
                    elements == 0 || !open.is_empty(),
                    "a second root element <{tag}> in\n{svg}"
                );
                elements += 1;
                let name = tag.split_whitespace().next().unwrap_or_default();
                if elements == 1 {
                    assert_eq!(name, "svg", "the root element in\n{svg}");
                }
                if !tag.ends_with('/') {
                    open.push(name);
                }
            }
            rest = &rest[start + length + 1..];
        }
        assert_text_escaped(rest, svg);
        assert!(open.is_empty(), "unclosed elements {open:?} in\n{svg}");
        assert!(svg.ends_with("</svg>\n"), "{svg}");
    }

    fn assert_text_escaped(text: &str, svg: &str) {
        assert!(!text.contains('>'), "an unescaped > in {text:?} in\n{svg}");
        for (at, _) in text.match_indices('&') {
            assert!(
                ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"]
                    .iter()
                    .any(|entity| text[at..].starts_with(entity)),
                "an unescaped & in {text:?} in\n{svg}"
            );
        }
    }

    /// A hold on key 42 from 0 to 500 ms, and a wait for it from 10 ms to the grant at 500.
    fn quickstart() -> Journal<u64> {
        timed([
            (0, acquire(1, 42)),
            (0, grant(1, 1)),
            (10, acquire(2, 42)),
            (500, release(1)),
            (500, grant(2, 2)),
            (1000, release(2)),
        ])
    }

    #[test]
    fn an_empty_journal_draws_a_well_formed_picture_with_no_lane() {
        let journal = Journal::<u64>::default();
        let picture = journal.to_svg();
        assert_well_formed(&picture);
        assert!(
            picture.contains(r#"font-weight="600">Lock timeline</text>"#),
            "{picture}"
        );
        assert!(
            picture.contains(">0 keys, 0 holds, 0 waits, from "),
            "{picture}"
        );
        assert!(!picture.contains("<title>"), "{picture}");
    }

    #[test]
    fn a_grant_then_a_release_draws_a_hold_labelled_with_its_token_on_its_key_lane() {
        let journal = journal([acquire(1, 42), grant(1, 7), release(1)]);
        let picture = journal.to_svg();
        assert_well_formed(&picture);
        assert!(picture.contains(r#"monospace">42</text>"#), "{picture}");
        assert!(
            picture.contains(
                "<title>w1 held 42 with fencing token 7 from 0.000000 s (#2) to \
                 0.000000 s (#3), then released</title>"
            ),
            "{picture}"
        );
        assert!(
            picture.contains(r#"fill="white" text-anchor="middle">token 7 · w1</text>"#),
            "{picture}"
        );
        // The key was free: no wait is drawn.
        assert!(!picture.contains("waited for"), "{picture}");
    }

    #[test]
    fn a_wait_is_drawn_from_arrival_to_grant() {
        let picture = quickstart().to_svg();
        assert_well_formed(&picture);
        assert!(
            picture.contains(
                "<title>w2 waited for 42 from 0.010000 s (#3) to 0.500000 s (#5), then was \
                 granted</title>"
            ),
            "{picture}"
        );
        assert!(
            picture.contains(">1 key, 2 holds, 1 wait, from "),
            "{picture}"
        );
    }

    #[test]
    fn a_cancelled_wait_ends_in_a_red_cross_after_its_tooltip() {
        let cross = r##"stroke="#d62728""##;
        let picture = journal([acquire(1, 7), grant(1, 1), acquire(2, 7), cancel(2)]).to_svg();
        assert_well_formed(&picture);
        let tooltip = "<title>w2 waited for 7 from 0.000000 s (#3) to 0.000000 s (#4), then \
                       cancelled</title>";
        let wait = picture
            .find(tooltip)
            .unwrap_or_else(|| panic!("no cancelled wait in\n{picture}"));
        // The legend draws one cross; the wait's follows its bar (and the waiter's label).
        let mut after_wait = picture[wait..].lines().skip(1).take(2);
        assert!(
            after_wait.any(|line| line.starts_with("<path ") && line.contains(cross)),
            "{picture}"
        );
        assert_eq!(picture.matches(cross).count(), 2, "{picture}");
    }

    #[test]
    fn a_shutdown_ends_holds_and_waits_and_is_marked_across_the_lanes() {
        let picture = journal([
            acquire(1, 7),
            grant(1, 1),
            acquire(2, 7),
            JournalEvent::Shutdown,
            closed(2),
        ])
        .to_svg();
        assert_well_formed(&picture);
        assert!(picture.contains("stroke-dasharray"), "{picture}");
        assert!(
            picture.contains(r#"text-anchor="middle">shutdown</text>"#),
            "{picture}"
        );
        assert_eq!(
            picture
                .matches(", until the registry shut down</title>")
                .count(),
            2,
            "{picture}"
        );
        // One square per bar, and one in the legend.
        assert_eq!(
            picture
                .matches(r##"width="8" height="8" fill="#6a3d9a""##)
                .count(),
            3,
            "{picture}"
        );
    }

    #[test]
    fn keys_are_named_by_their_debug_and_escaped() {
        #[derive(Debug)]
        struct Account {
            #[allow(dead_code, reason = "read by Debug")]
            id: u32,
        }
        fn acquire_of<K>(key: K) -> Journal<K> {
            Journal {
                entries: vec![JournalEntry {
                    seq: 1,
                    at: Duration::ZERO,
                    event: JournalEvent::Acquire {
                        waiter: waiter(1),
                        key,
                        permits: 1,
                    },
                }],
                dropped: 0,
            }
        }
        let text = acquire_of("<a & 'b'>\u{7}").to_svg();
        assert_well_formed(&text);
        assert!(
            text.contains(r#">&quot;&lt;a &amp; &apos;b&apos;&gt;\u{7}&quot;</text>"#),
            "{text}"
        );
        let structured = acquire_of(Account { id: 3 }).to_svg();
        assert!(
            structured.contains(">Account { id: 3 }</text>"),
            "{structured}"
        );
    }

    #[test]
    fn the_title_names_what_is_drawn_escaped() {
        let picture = Timeline::new(&quickstart()).title("a<b").to_svg();
        assert_well_formed(&picture);
        assert!(
            picture.contains(">Lock timeline: a&lt;b</text>"),
            "{picture}"
        );
    }

    #[test]
    fn the_axis_is_time_unless_every_event_shares_one_instant() {
        let sequence = "; one step per event";
        let timed = quickstart().to_svg();
        assert!(timed.contains("time since the registry started"), "{timed}");
        assert!(!timed.contains(sequence), "{timed}");
        let instant = journal([acquire(1, 42), grant(1, 1), release(1)]).to_svg();
        assert!(instant.contains("event sequence number"), "{instant}");
        assert!(instant.contains(sequence), "{instant}");
        let chosen = Timeline::new(&quickstart()).axis(Axis::Sequence).to_svg();
        assert!(chosen.contains(sequence), "{chosen}");
    }

    #[test]
    fn a_journal_that_dropped_events_says_so() {
        let mut journal = quickstart();
        journal.dropped = 3;
        for entry in &mut journal.entries {
            entry.seq += 3;
        }
        let picture = journal.to_svg();
        assert!(
            picture.contains("; the journal dropped its 3 oldest events</text>"),
            "{picture}"
        );
    }

    #[test]
    fn text_is_never_narrower_than_twenty_columns() {
        let timeline = Timeline::new(&quickstart());
        assert_eq!(timeline.to_text(0), timeline.to_text(20));
        let lane = timeline.to_text(3).lines().nth(1).map(str::to_owned);
        assert_eq!(lane.map(|lane| lane.chars().count()), Some(3 + 2 + 20 + 1));
    }

    #[test]
    fn absurd_but_valid_journals_are_drawn_without_panicking() {
        let far = u64::MAX - 3;
        let events = [acquire(1, 1), grant(1, 1), release(9)];
        let journal = Journal {
            entries: (far + 1..=u64::MAX)
                .zip(events)
                .map(|(seq, event)| JournalEntry {
                    seq,
                    at: Duration::MAX,
                    event,
                })
                .collect(),
            dropped: far,
        };
        for axis in [Axis::Time, Axis::Sequence] {
            let timeline = Timeline::new(&journal).axis(axis);
            let _ = timeline.to_text(20);
            assert_well_formed(&timeline.to_svg());
        }
        let empty = Timeline::new(&Journal::<u64>::default()).axis(Axis::Time);
        let _ = empty.to_text(20);
    }

    /// The committed picture of the quickstart's trace is what the library draws of it (CI
    /// also regenerates it with the `timeline` example).
    #[cfg(feature = "serde")]
    #[test]
    fn the_quickstart_trace_draws_the_committed_picture() {
        let trace = include_str!("../docs/quickstart.jsonl");
        let journal = Journal::<u64>::from_json_lines(trace).expect("the committed trace reads");
        let picture = Timeline::new(&journal).title("quickstart.jsonl").to_svg();
        assert!(
            picture == include_str!("../docs/timeline.svg"),
            "docs/timeline.svg differs from the drawing of docs/quickstart.jsonl:\n{picture}"
        );
    }
}
