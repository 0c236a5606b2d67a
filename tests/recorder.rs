//! Not a behaviour: a `tracing` layer that records every event and span, for the tests of
//! what the registry reports (`tracing_events`, `acquisition_spans`, `stall_warnings`).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

#[derive(Debug, Clone)]
pub struct RecordedEvent {
    pub level: Level,
    pub target: String,
    pub message: String,
    /// `name=value ` for every field but the message, values in `Debug` form.
    pub fields: String,
    /// The span the event was recorded in, as an index into [`Recorded::spans`].
    pub span: Option<usize>,
}

#[derive(Debug, Clone)]
pub struct RecordedSpan {
    pub name: &'static str,
    pub target: String,
    /// Every field given a value, at creation or later, in `Debug` form.
    pub fields: HashMap<String, String>,
    pub closed: bool,
}

#[derive(Debug, Default)]
pub struct Recorded {
    pub events: Vec<RecordedEvent>,
    pub spans: Vec<RecordedSpan>,
    ids: HashMap<Id, usize>,
}

impl Recorded {
    /// The events with this message, in order.
    pub fn events_saying(&self, message: &str) -> Vec<&RecordedEvent> {
        self.events
            .iter()
            .filter(|event| event.message == message)
            .collect()
    }

    /// The events at `level` or less verbose (WARN also matches ERROR).
    pub fn events_at_least(&self, level: Level) -> Vec<&RecordedEvent> {
        // `Level` orders by verbosity: less verbose is smaller.
        self.events
            .iter()
            .filter(|event| event.level <= level)
            .collect()
    }
}

#[derive(Clone, Default)]
pub struct Recorder(Arc<Mutex<Recorded>>);

impl Recorder {
    /// A recorder installed as this thread's default subscriber until the guard drops. With
    /// a current-thread runtime, every task of the test runs on this thread.
    pub fn install() -> (Recorder, tracing::subscriber::DefaultGuard) {
        let recorder = Recorder::default();
        let subscriber = tracing_subscriber::registry().with(recorder.clone());
        (recorder, tracing::subscriber::set_default(subscriber))
    }

    pub fn recorded(&self) -> MutexGuard<'_, Recorded> {
        self.0.lock().unwrap()
    }
}

#[derive(Default)]
struct Fields {
    message: String,
    all: Vec<(String, String)>,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            self.all
                .push((field.name().to_string(), format!("{value:?}")));
        }
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Recorder {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        let mut recorded = self.recorded();
        let index = recorded.spans.len();
        recorded.spans.push(RecordedSpan {
            name: attrs.metadata().name(),
            target: attrs.metadata().target().to_string(),
            fields: fields.all.into_iter().collect(),
            closed: false,
        });
        recorded.ids.insert(id.clone(), index);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        let mut fields = Fields::default();
        values.record(&mut fields);
        let mut recorded = self.recorded();
        if let Some(&index) = recorded.ids.get(id) {
            recorded.spans[index].fields.extend(fields.all);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let parent = ctx.event_span(event).map(|span| span.id());
        let mut recorded = self.recorded();
        let span = parent.and_then(|id| recorded.ids.get(&id).copied());
        let mut listed = String::new();
        for (name, value) in fields.all {
            let _ = write!(listed, "{name}={value} ");
        }
        recorded.events.push(RecordedEvent {
            level: *event.metadata().level(),
            target: event.metadata().target().to_string(),
            message: fields.message,
            fields: listed,
            span,
        });
    }

    fn on_close(&self, id: Id, _: Context<'_, S>) {
        let mut recorded = self.recorded();
        if let Some(index) = recorded.ids.remove(&id) {
            recorded.spans[index].closed = true;
        }
    }
}
