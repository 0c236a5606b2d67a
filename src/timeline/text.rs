//! The timeline as fixed-width text, for a terminal.

use super::axis::{Axis, Scale};
use super::lanes::{Bar, BarKind, Ending, Layout};

/// Key labels longer than this are cut, so that the bars keep their room.
const LONGEST_KEY_SHOWN: usize = 20;

const LEGEND: &str = "legend: 1### held, from its fencing token   ... waiting   x cancelled   \
                          ! ended by shutdown   > still open at the end";

/// One row per key for its holds, then rows for its waits, `columns` wide, a ruler and the
/// legend.
pub(super) fn render_text(layout: &Layout, scale: &Scale, columns: usize) -> String {
    let label_width = layout
        .lanes
        .iter()
        .map(|lane| lane.key.chars().count().min(LONGEST_KEY_SHOWN))
        .max()
        .unwrap_or(0)
        .max(3);
    let mut out = summary(layout, scale, columns);
    for lane in &layout.lanes {
        let mut row = vec![' '; columns];
        for hold in &lane.holds {
            draw(&mut row, hold, scale);
        }
        push_row(&mut out, &shorten(&lane.key), label_width, &row);
        for wait_row in &lane.wait_rows {
            let mut row = vec![' '; columns];
            for wait in wait_row {
                draw(&mut row, wait, scale);
            }
            push_row(&mut out, "", label_width, &row);
        }
    }
    push_ruler(&mut out, scale, label_width, columns);
    out.push_str(LEGEND);
    out.push('\n');
    out
}

/// The first line: what is shown, and how much one column is.
fn summary(layout: &Layout, scale: &Scale, columns: usize) -> String {
    let per_column = (scale.max - scale.min) / columns as f64;
    let column = match scale.axis {
        Axis::Time => format!("{:.3} ms", per_column * 1e3),
        Axis::Sequence => format!("{per_column:.2} events"),
    };
    format!(
        "{}, from {} to {}; one column is {column}\n",
        layout.counts(),
        scale.describe(layout.first),
        scale.describe(layout.last),
    )
}

/// The columns `bar` covers: from the one its start falls in, up to (not including) the one
/// its end falls in, and at least one.
fn columns_of(bar: &Bar, scale: &Scale, columns: usize) -> (usize, usize) {
    let column = |fraction: f64| ((fraction * columns as f64) as usize).min(columns);
    let first = column(scale.fraction(bar.start)).min(columns - 1);
    let end = column(scale.fraction(bar.end)).max(first + 1);
    (first, end)
}

fn draw(row: &mut [char], bar: &Bar, scale: &Scale) {
    let (first, end) = columns_of(bar, scale, row.len());
    let fill = match bar.kind {
        BarKind::Hold { .. } => '#',
        BarKind::Wait => '.',
    };
    row[first..end].fill(fill);
    if let BarKind::Hold { fencing_token } = bar.kind {
        let token = fencing_token.to_string();
        // Only where the token fits with room to spare, or holds would read as numbers.
        if token.len() < end - first {
            for (cell, digit) in row[first..].iter_mut().zip(token.chars()) {
                *cell = digit;
            }
        }
    }
    let mark = match bar.ending {
        Ending::Granted | Ending::Released => None,
        Ending::Cancelled => Some('x'),
        Ending::Shutdown => Some('!'),
        Ending::Open => Some('>'),
    };
    if let Some(mark) = mark {
        row[end - 1] = mark;
    }
}

fn shorten(key: &str) -> String {
    if key.chars().count() <= LONGEST_KEY_SHOWN {
        return key.to_owned();
    }
    let mut shown: String = key.chars().take(LONGEST_KEY_SHOWN - 1).collect();
    shown.push('…');
    shown
}

fn push_row(out: &mut String, label: &str, label_width: usize, row: &[char]) {
    let padding = label_width - label.chars().count();
    out.push_str(label);
    out.extend(std::iter::repeat_n(' ', padding));
    out.push_str(" |");
    out.extend(row);
    out.push_str("|\n");
}

/// A line with a `+` at each tick, and the ticks' labels under it where they fit.
fn push_ruler(out: &mut String, scale: &Scale, label_width: usize, columns: usize) {
    let mut ruler = vec!['-'; columns];
    let mut labels = vec![' '; columns + 12];
    let mut free_from = 0;
    for (label, fraction) in scale.ticks(columns / 12) {
        let column = ((fraction * columns as f64) as usize).min(columns - 1);
        ruler[column] = '+';
        // Characters, not bytes: "µs" is one column.
        let label: Vec<char> = label.chars().collect();
        if column >= free_from && column + label.len() <= labels.len() {
            labels[column..column + label.len()].copy_from_slice(&label);
            free_from = column + label.len() + 1;
        }
    }
    let indent = " ".repeat(label_width + 2);
    out.push_str(&indent);
    out.extend(ruler);
    out.push('\n');
    out.push_str(&indent);
    out.push_str(labels.iter().collect::<String>().trim_end());
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pure::journal::JournalEvent;
    use crate::timeline::lanes::layout_of;
    use crate::timeline::script::*;

    #[test]
    fn text_shows_holds_with_tokens_waits_and_how_each_ended() {
        let journal = journal([
            acquire(1, 7),
            grant(1, 1),
            acquire(2, 7),
            acquire(3, 7),
            cancel(2),
            release(1),
            grant(3, 2),
            acquire(4, 7),
            JournalEvent::Shutdown,
            closed(4),
            try_acquire(8),
            grant(5, 3),
        ]);
        let layout = layout_of(&journal);
        let scale = Scale::of(&layout, Axis::Sequence);
        let text = render_text(&layout, &scale, 22);
        let rows: Vec<&str> = text.lines().skip(1).take(6).collect();
        assert_eq!(
            rows,
            [
                "7   |  1#######  2##!      |",
                "    |    ...x      ...!    |",
                "    |      ......          |",
                "8   |                     >|",
                "     --------+---------+---",
                "             #5        #10",
            ],
            "\n{text}"
        );
    }
}
