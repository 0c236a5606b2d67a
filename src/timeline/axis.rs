//! The horizontal axis: where a moment goes, and the ticks worth labelling.

use super::lanes::{Layout, Moment};

/// What the horizontal axis of a [`Timeline`](super::Timeline) measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Axis {
    /// Seconds since the registry started.
    Time,
    /// Sequence numbers: one step per event. For journals whose events share one time, such
    /// as hand-made or proptest traces, and to pull apart events of one instant.
    Sequence,
}

/// The visible stretch of an axis.
#[derive(Debug, Clone, Copy)]
pub(super) struct Scale {
    pub(super) axis: Axis,
    pub(super) min: f64,
    pub(super) max: f64,
}

impl Scale {
    /// The whole journal of `layout`, and on a time axis the time before its first event
    /// too, back to the registry's start, unless the journal lost its oldest events. A
    /// journal of one instant gets a stretch of one unit so that nothing divides by zero.
    pub(super) fn of(layout: &Layout, axis: Axis) -> Self {
        let min = match axis {
            Axis::Time if layout.dropped == 0 => 0.0,
            _ => axis.position(layout.first),
        };
        let max = axis.position(layout.last);
        Scale {
            axis,
            min,
            max: if max > min { max } else { min + 1.0 },
        }
    }

    /// Where `moment` falls, from 0.0 (the start) to 1.0 (the end).
    pub(super) fn fraction(&self, moment: Moment) -> f64 {
        let fraction = (self.axis.position(moment) - self.min) / (self.max - self.min);
        // NaN when the stretch is too far from zero to have a width; draw at the start.
        if fraction.is_nan() {
            0.0
        } else {
            fraction.clamp(0.0, 1.0)
        }
    }

    /// About `wanted` round positions (1, 2 or 5 times a power of ten apart) inside the
    /// stretch, each with its label and its fraction.
    pub(super) fn ticks(&self, wanted: usize) -> Vec<(String, f64)> {
        let span = self.max - self.min;
        // Also when the span is NaN, which compares false with everything.
        if span.is_nan() || span <= 0.0 {
            return Vec::new();
        }
        let wanted = wanted.max(2) as f64;
        let power = 10f64.powf((span / wanted).log10().floor());
        // The round step whose number of ticks comes closest to the number wanted.
        let mut step = [0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0]
            .into_iter()
            .map(|multiple| multiple * power)
            .min_by(|a, b| {
                ((span / a) - wanted)
                    .abs()
                    .total_cmp(&((span / b) - wanted).abs())
            })
            .unwrap_or(power);
        if self.axis == Axis::Sequence {
            step = step.max(1.0).round();
        }
        // Time in the largest unit the span is at least one of, so labels stay short.
        let (unit, per_second) = match span {
            span if span >= 1.0 => ("s", 1.0),
            span if span >= 1e-3 => ("ms", 1e3),
            _ => ("µs", 1e6),
        };
        let decimals = match self.axis {
            Axis::Time => (-(step * per_second).log10().floor()).max(0.0) as usize,
            Axis::Sequence => 0,
        };
        let first = (self.min / step).ceil() * step;
        let count = ((self.max - first) / step + 1e-9).floor();
        // Far from zero a step can be below the precision of an f64, and then there is
        // nothing sensible to label; a hand-made trace may put its events there.
        if !(0.0..=1000.0).contains(&count) || first + step == first {
            return Vec::new();
        }
        (0..=count as usize)
            .map(|index| {
                let value = first + step * index as f64;
                let label = match self.axis {
                    Axis::Time => format!("{:.decimals$} {unit}", value * per_second),
                    Axis::Sequence => format!("#{value:.0}"),
                };
                (label, (value - self.min) / span)
            })
            .collect()
    }

    /// `moment` in words, for tooltips.
    pub(super) fn describe(&self, moment: Moment) -> String {
        format!("{:.6} s (#{})", moment.at.as_secs_f64(), moment.seq)
    }

    /// What the axis measures, for its title.
    pub(super) fn title(&self) -> &'static str {
        match self.axis {
            Axis::Time => "time since the registry started",
            Axis::Sequence => "event sequence number",
        }
    }
}

impl Axis {
    fn position(self, moment: Moment) -> f64 {
        match self {
            Axis::Time => moment.at.as_secs_f64(),
            Axis::Sequence => moment.seq as f64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scale(axis: Axis, min: f64, max: f64) -> Scale {
        Scale { axis, min, max }
    }

    #[test]
    fn ticks_fall_on_round_values_inside_the_stretch() {
        let labels: Vec<String> = scale(Axis::Time, 0.0, 1.0038)
            .ticks(5)
            .into_iter()
            .map(|(label, _)| label)
            .collect();
        assert_eq!(
            labels,
            ["0.0 s", "0.2 s", "0.4 s", "0.6 s", "0.8 s", "1.0 s"]
        );
    }

    #[test]
    fn short_spans_are_labelled_in_milliseconds_or_microseconds() {
        let second_label = |max: f64| scale(Axis::Time, 0.0, max).ticks(4)[1].0.clone();
        assert_eq!(second_label(0.0012), "0.5 ms");
        assert_eq!(second_label(0.0004), "100 µs");
    }

    #[test]
    fn sequence_ticks_are_whole_events() {
        let ticks = scale(Axis::Sequence, 1.0, 4.0).ticks(10);
        let labels: Vec<&str> = ticks.iter().map(|(label, _)| label.as_str()).collect();
        assert_eq!(labels, ["#1", "#2", "#3", "#4"]);
        assert_eq!(ticks[3].1, 1.0);
    }
}
