//! The timeline as an SVG picture, written by hand: lanes of bars over a time axis.

use std::fmt::Write as _;

use super::axis::{Axis, Scale};
use super::lanes::{Bar, BarKind, Ending, Lane, Layout};

const WIDTH: f64 = 960.0;
const MARGIN: f64 = 16.0;
/// Where the first lane starts, below the title and subtitle.
const PLOT_TOP: f64 = 72.0;
/// Room right of the plot for a label of a bar that ends at the very end.
const PLOT_RIGHT_ROOM: f64 = 28.0;
const HOLD_ROW: f64 = 26.0;
const WAIT_ROW: f64 = 16.0;
const LANE_PADDING: f64 = 6.0;
const AXIS_HEIGHT: f64 = 48.0;
const LEGEND_HEIGHT: f64 = 36.0;

const HOLD_COLOUR: &str = "#2f6db5";
const WAIT_COLOUR: &str = "#b3cdee";
const CANCEL_COLOUR: &str = "#d62728";
const SHUTDOWN_COLOUR: &str = "#6a3d9a";
const OPEN_COLOUR: &str = "#555555";
const TEXT_COLOUR: &str = "#1d2733";
const KEY_FONT: &str = "ui-monospace, SFMono-Regular, Menlo, Consolas, monospace";

/// Horizontal placement: the plot's left edge and width.
struct Frame<'a> {
    scale: &'a Scale,
    left: f64,
    width: f64,
}

impl Frame<'_> {
    /// The left edge of `bar` and its width, at least 2 so that an instant still shows.
    fn span_of(&self, bar: &Bar) -> (f64, f64) {
        let start = self.left + self.width * self.scale.fraction(bar.start);
        let end = self.left + self.width * self.scale.fraction(bar.end);
        (start, (end - start).max(2.0))
    }
}

/// The whole picture; `title`, if any, names what was drawn (a trace file, a service).
pub(super) fn render_svg(layout: &Layout, scale: &Scale, title: Option<&str>) -> String {
    let longest_key = layout
        .lanes
        .iter()
        .map(|lane| lane.key.chars().count())
        .max()
        .unwrap_or(0);
    let label_width = (7.5 * longest_key as f64 + 20.0).clamp(60.0, 260.0);
    let frame = Frame {
        scale,
        left: MARGIN + label_width,
        width: WIDTH - 2.0 * MARGIN - label_width - PLOT_RIGHT_ROOM,
    };
    let lanes_height: f64 = layout.lanes.iter().map(lane_height).sum();
    let plot_bottom = PLOT_TOP + lanes_height;
    let height = plot_bottom + AXIS_HEIGHT + LEGEND_HEIGHT;

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="system-ui, -apple-system, Segoe UI, Helvetica, Arial, sans-serif" fill="{TEXT_COLOUR}">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let heading = match title {
        Some(title) => format!("Lock timeline: {}", escape(title)),
        None => "Lock timeline".to_owned(),
    };
    let _ = writeln!(
        svg,
        r#"<text x="{MARGIN}" y="28" font-size="17" font-weight="600">{heading}</text>"#
    );
    let _ = writeln!(
        svg,
        r##"<text x="{MARGIN}" y="50" font-size="12" fill="#5a6673">{}</text>"##,
        escape(&subtitle(layout, scale))
    );

    // Bands, then the grid over them, then the bars over the grid.
    let mut lane_top = PLOT_TOP;
    for (index, lane) in layout.lanes.iter().enumerate() {
        let band = if index % 2 == 0 { "#f3f6fa" } else { "#ffffff" };
        let _ = writeln!(
            svg,
            r#"<rect x="{MARGIN}" y="{lane_top:.1}" width="{:.1}" height="{:.1}" fill="{band}"/>"#,
            WIDTH - 2.0 * MARGIN,
            lane_height(lane)
        );
        lane_top += lane_height(lane);
    }
    draw_axis(&mut svg, &frame, plot_bottom);
    let mut lane_top = PLOT_TOP;
    for lane in &layout.lanes {
        draw_lane(&mut svg, lane, lane_top, &frame);
        lane_top += lane_height(lane);
    }
    for shutdown in &layout.shutdowns {
        let x = frame.left + frame.width * scale.fraction(*shutdown);
        let _ = writeln!(
            svg,
            r#"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{plot_bottom:.1}" stroke="{SHUTDOWN_COLOUR}" stroke-width="1.5" stroke-dasharray="5 3"/>"#,
            PLOT_TOP - 8.0
        );
        let _ = writeln!(
            svg,
            r#"<text x="{x:.1}" y="{:.1}" font-size="11" fill="{SHUTDOWN_COLOUR}" text-anchor="middle">shutdown</text>"#,
            PLOT_TOP - 11.0
        );
    }
    draw_legend(&mut svg, plot_bottom + AXIS_HEIGHT + 14.0);
    svg.push_str("</svg>\n");
    svg
}

fn subtitle(layout: &Layout, scale: &Scale) -> String {
    let mut text = format!(
        "{}, from {} to {}",
        layout.counts(),
        scale.describe(layout.first),
        scale.describe(layout.last),
    );
    if scale.axis == Axis::Sequence {
        text.push_str("; one step per event");
    }
    if layout.dropped > 0 {
        let _ = write!(
            text,
            "; the journal dropped its {} oldest events",
            layout.dropped
        );
    }
    text
}

fn lane_height(lane: &Lane) -> f64 {
    HOLD_ROW + WAIT_ROW * lane.wait_rows.len() as f64 + 2.0 * LANE_PADDING
}

fn draw_lane(svg: &mut String, lane: &Lane, top: f64, frame: &Frame<'_>) {
    let hold_top = top + LANE_PADDING;
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" font-size="13" font-family="{KEY_FONT}">{}</text>"#,
        MARGIN + 6.0,
        baseline(hold_top + HOLD_ROW / 2.0, 13.0),
        escape(&lane.key)
    );
    for hold in &lane.holds {
        draw_hold(svg, hold, hold_top, frame, &lane.key);
    }
    for (row, waits) in lane.wait_rows.iter().enumerate() {
        let row_top = hold_top + HOLD_ROW + WAIT_ROW * row as f64;
        for wait in waits {
            draw_wait(svg, wait, row_top, frame, &lane.key);
        }
    }
}

fn draw_hold(svg: &mut String, hold: &Bar, top: f64, frame: &Frame<'_>, key: &str) {
    let BarKind::Hold { fencing_token } = hold.kind else {
        return;
    };
    let (x, width) = frame.span_of(hold);
    let (y, height) = (top + 2.0, HOLD_ROW - 4.0);
    let tooltip = format!(
        "{} held {key} with fencing token {fencing_token} from {} to {}{}",
        hold.waiter,
        frame.scale.describe(hold.start),
        frame.scale.describe(hold.end),
        ending_words(hold.ending)
    );
    let _ = writeln!(
        svg,
        r#"<rect x="{x:.1}" y="{y:.1}" width="{width:.1}" height="{height:.1}" rx="2" fill="{HOLD_COLOUR}" stroke="white" stroke-width="1"><title>{}</title></rect>"#,
        escape(&tooltip)
    );
    let centre_y = y + height / 2.0;
    // The waiter too where there is room: it ties the hold to the wait before it.
    let long_label = format!("token {fencing_token} · {}", hold.waiter);
    let short_label = fencing_token.to_string();
    let label = [long_label, short_label]
        .into_iter()
        .find(|label| width >= 7.0 * label.chars().count() as f64 + 10.0);
    match label {
        Some(label) => {
            let _ = writeln!(
                svg,
                r#"<text x="{:.1}" y="{:.1}" font-size="12" font-weight="600" fill="white" text-anchor="middle">{label}</text>"#,
                x + width / 2.0,
                baseline(centre_y, 12.0)
            );
        }
        None => {
            // Too narrow to hold its token: put it just after the bar.
            let _ = writeln!(
                svg,
                r#"<text x="{:.1}" y="{:.1}" font-size="11" font-weight="600" fill="{HOLD_COLOUR}">{fencing_token}</text>"#,
                x + width + 2.0,
                baseline(centre_y, 11.0)
            );
        }
    }
    draw_ending(svg, hold.ending, x + width, centre_y);
}

fn draw_wait(svg: &mut String, wait: &Bar, row_top: f64, frame: &Frame<'_>, key: &str) {
    let (x, width) = frame.span_of(wait);
    let (y, height) = (row_top + 3.0, WAIT_ROW - 6.0);
    let waiter = wait.waiter.to_string();
    let tooltip = format!(
        "{waiter} waited for {key} from {} to {}{}",
        frame.scale.describe(wait.start),
        frame.scale.describe(wait.end),
        ending_words(wait.ending)
    );
    let _ = writeln!(
        svg,
        r#"<rect x="{x:.1}" y="{y:.1}" width="{width:.1}" height="{height:.1}" rx="2" fill="{WAIT_COLOUR}" stroke="white" stroke-width="0.5"><title>{}</title></rect>"#,
        escape(&tooltip)
    );
    if width >= 6.0 * waiter.len() as f64 + 8.0 {
        let _ = writeln!(
            svg,
            r##"<text x="{:.1}" y="{:.1}" font-size="9" fill="#294a73">{waiter}</text>"##,
            x + 4.0,
            baseline(y + height / 2.0, 9.0)
        );
    }
    draw_ending(svg, wait.ending, x + width, y + height / 2.0);
}

fn ending_words(ending: Ending) -> &'static str {
    match ending {
        Ending::Granted => ", then was granted",
        Ending::Released => ", then released",
        Ending::Cancelled => ", then cancelled",
        Ending::Shutdown => ", until the registry shut down",
        Ending::Open => ", still going when the journal ends",
    }
}

/// The mark at the end of a bar that did not end normally.
fn draw_ending(svg: &mut String, ending: Ending, x: f64, y: f64) {
    match ending {
        Ending::Granted | Ending::Released => {}
        Ending::Cancelled => {
            let size = 5.0;
            let _ = writeln!(
                svg,
                r#"<path d="M{:.1} {:.1}L{:.1} {:.1}M{:.1} {:.1}L{:.1} {:.1}" stroke="{CANCEL_COLOUR}" stroke-width="2.2" stroke-linecap="round"/>"#,
                x - size,
                y - size,
                x + size,
                y + size,
                x - size,
                y + size,
                x + size,
                y - size
            );
        }
        Ending::Shutdown => {
            let _ = writeln!(
                svg,
                r#"<rect x="{:.1}" y="{:.1}" width="8" height="8" fill="{SHUTDOWN_COLOUR}"/>"#,
                x - 4.0,
                y - 4.0
            );
        }
        Ending::Open => {
            let _ = writeln!(
                svg,
                r#"<path d="M{x:.1} {:.1}L{:.1} {y:.1}L{x:.1} {:.1}Z" fill="{OPEN_COLOUR}"/>"#,
                y - 5.0,
                x + 7.0,
                y + 5.0
            );
        }
    }
}

/// Grid lines, the axis line, tick labels and the axis title.
fn draw_axis(svg: &mut String, frame: &Frame<'_>, plot_bottom: f64) {
    let wanted_ticks = (frame.width / 90.0) as usize;
    for (label, fraction) in frame.scale.ticks(wanted_ticks) {
        let x = frame.left + frame.width * fraction;
        let _ = writeln!(
            svg,
            r##"<line x1="{x:.1}" y1="{PLOT_TOP}" x2="{x:.1}" y2="{plot_bottom:.1}" stroke="#c9d1da" stroke-width="0.8"/>"##
        );
        let _ = writeln!(
            svg,
            r##"<line x1="{x:.1}" y1="{plot_bottom:.1}" x2="{x:.1}" y2="{:.1}" stroke="#5a6673"/>"##,
            plot_bottom + 5.0
        );
        let _ = writeln!(
            svg,
            r#"<text x="{x:.1}" y="{:.1}" font-size="11" text-anchor="middle">{}</text>"#,
            plot_bottom + 18.0,
            escape(&label)
        );
    }
    let _ = writeln!(
        svg,
        r##"<line x1="{:.1}" y1="{plot_bottom:.1}" x2="{:.1}" y2="{plot_bottom:.1}" stroke="#5a6673"/>"##,
        frame.left,
        frame.left + frame.width
    );
    let _ = writeln!(
        svg,
        r##"<text x="{:.1}" y="{:.1}" font-size="11" fill="#5a6673" text-anchor="middle">{}</text>"##,
        frame.left + frame.width / 2.0,
        plot_bottom + 36.0,
        frame.scale.title()
    );
}

/// One sample of each mark, with its meaning.
fn draw_legend(svg: &mut String, y: f64) {
    let mut x = MARGIN + 6.0;
    let label = |svg: &mut String, x: &mut f64, words: &str| {
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" font-size="11">{words}</text>"#,
            *x,
            baseline(y, 11.0)
        );
        *x += 5.7 * words.len() as f64 + 24.0;
    };
    let _ = writeln!(
        svg,
        r#"<rect x="{x:.1}" y="{:.1}" width="28" height="16" rx="2" fill="{HOLD_COLOUR}"/><text x="{:.1}" y="{:.1}" font-size="11" font-weight="600" fill="white" text-anchor="middle">7</text>"#,
        y - 8.0,
        x + 14.0,
        baseline(y, 11.0)
    );
    x += 34.0;
    label(svg, &mut x, "held, labelled with its fencing token");
    let _ = writeln!(
        svg,
        r#"<rect x="{x:.1}" y="{:.1}" width="28" height="10" rx="2" fill="{WAIT_COLOUR}"/>"#,
        y - 5.0
    );
    x += 34.0;
    label(svg, &mut x, "waiting, from arrival to grant");
    draw_ending(svg, Ending::Cancelled, x + 5.0, y);
    x += 16.0;
    label(svg, &mut x, "cancelled");
    draw_ending(svg, Ending::Shutdown, x + 4.0, y);
    x += 14.0;
    label(svg, &mut x, "ended by shutdown");
    draw_ending(svg, Ending::Open, x, y);
    x += 13.0;
    label(svg, &mut x, "still open");
}

/// The baseline that centres text of `font_size` on `centre_y`. Computed, rather than left to
/// `dominant-baseline`, which some renderers ignore.
fn baseline(centre_y: f64, font_size: f64) -> f64 {
    centre_y + 0.35 * font_size
}

/// `text` safe inside SVG text and attribute values.
fn escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for character in text.chars() {
        match character {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&apos;"),
            // Not allowed in XML 1.0 at all; a key may still contain them.
            control if control.is_control() && !matches!(control, '\t' | '\n' | '\r') => {
                let _ = write!(escaped, "\\u{{{:x}}}", u32::from(control));
            }
            other => escaped.push(other),
        }
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_with_markup_characters_are_escaped() {
        assert_eq!(
            escape(r#""a<b>&'c'""#),
            "&quot;a&lt;b&gt;&amp;&apos;c&apos;&quot;"
        );
        assert_eq!(escape("bell\u{7}"), "bell\\u{7}");
    }
}
