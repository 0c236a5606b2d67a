//! `GET /locks` and `GET /locks/page`: which accounts' locks are contended right now, as JSON
//! and as a page for people.
//!
//! Both read [`LockRegistry::snapshot_top`]: the `top` most contended keys (50 unless the
//! query says `?top=n`, 1 to [`MAX_TOP`]), most waiters first, then held longest. `/locks`
//! answers the library's `KeySnapshot`s as they serialize with its `serde` feature; durations
//! are bounds, `{"at_least": ..., "at_most": ...}`, each `{"secs": s, "nanos": n}`, because
//! the registry dates grants and arrivals by time marks rather than reading a clock on every
//! lock (each snapshot is a mark, so polling tightens them).
//!
//! `/locks/page` is server-rendered HTML that reloads itself every second: a line of the
//! registry's counts, a table of the contended keys, and, when the service keeps a journal
//! (`--journal`), the lock timeline of the journal's last [`TIMELINE_WINDOW`] as inline SVG.

use std::fmt::Write as _;
use std::time::Duration;

use axum::Router;
use axum::extract::{RawQuery, State};
use axum::http::header::CACHE_CONTROL;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use keyed_locks::timeline::Timeline;
use keyed_locks::{DurationBounds, KeySnapshot, LockRegistry};

use crate::api::{ApiError, AppState};

/// How many keys are shown without `?top=n`.
const DEFAULT_TOP: usize = 50;

/// The most keys one request may ask for: a snapshot pauses each shard for a pass over its
/// keys, and a page of more rows than this is no longer read at a glance anyway.
pub const MAX_TOP: usize = 1000;

/// How much of the journal the page draws, back from its last event: enough to see a queue
/// form and drain, short enough that each hold is still wide enough to read.
const TIMELINE_WINDOW: Duration = Duration::from_secs(5);

/// The two routes.
pub fn routes(state: AppState) -> Router {
    Router::new()
        .route("/locks", get(locks_json))
        .route("/locks/page", get(locks_page))
        .with_state(state)
}

async fn locks_json(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let top = top(query.as_deref())?;
    let view = state.registry.snapshot_top(top).await?;
    Ok(fresh(axum::Json(view).into_response()))
}

async fn locks_page(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let top = top(query.as_deref())?;
    let view = state.registry.snapshot_top(top).await?;
    let stats = state.registry.stats().await?;
    let timeline = if state.journal {
        Some(timeline_svg(&state.registry).await?)
    } else {
        None
    };
    let counts = Counts {
        held: stats.held,
        waiting: stats.waiting,
        grants: stats.grants,
    };
    let page = render_page(&view, &counts, top, timeline.as_deref());
    Ok(fresh(Html(page).into_response()))
}

/// Marks an answer as never to be reused: each one is the registry at one instant.
fn fresh(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// The number of keys asked for: `top=n` in the query, else [`DEFAULT_TOP`]. Any other
/// parameter is refused, so that a misspelt one is not silently ignored.
fn top(query: Option<&str>) -> Result<usize, ApiError> {
    let mut top = DEFAULT_TOP;
    for pair in query
        .unwrap_or("")
        .split('&')
        .filter(|pair| !pair.is_empty())
    {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if name != "top" {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("unknown query parameter {name:?}: the only one is top=n"),
            ));
        }
        top = match value.parse::<usize>() {
            Ok(n @ 1..=MAX_TOP) => n,
            _ => {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    format!("top must be a whole number from 1 to {MAX_TOP}, not {value:?}"),
                ));
            }
        };
    }
    Ok(top)
}

/// The journal's last [`TIMELINE_WINDOW`], drawn. Events before it are dropped as a full
/// journal drops its oldest, so the picture counts them among the dropped ones and draws no
/// hold or wait that began before the window.
async fn timeline_svg(registry: &LockRegistry<u64>) -> Result<String, ApiError> {
    let mut journal = registry.journal().await.map_err(|error| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("no journal: {error}"),
        )
    })?;
    if let Some(last) = journal.entries.last() {
        let from = last.at.saturating_sub(TIMELINE_WINDOW);
        let before = journal.entries.partition_point(|entry| entry.at < from);
        journal.entries.drain(..before);
        journal.dropped += before as u64;
    }
    let title = format!("the last {} s of the journal", TIMELINE_WINDOW.as_secs());
    Ok(Timeline::new(&journal).title(title).to_svg())
}

/// The registry's counts that head the page.
struct Counts {
    held: usize,
    waiting: usize,
    grants: u64,
}

/// The whole page. `timeline` is the SVG picture, if the service keeps a journal.
fn render_page(
    view: &[KeySnapshot<u64>],
    counts: &Counts,
    top: usize,
    timeline: Option<&str>,
) -> String {
    let mut page = String::with_capacity(4096 + timeline.map_or(0, str::len));
    page.push_str(HEAD);
    let _ = writeln!(
        page,
        r#"<p class="counts"><b>{}</b> held · <b>{}</b> waiting · <b>{}</b> grants · reloads every second</p>"#,
        counts.held, counts.waiting, counts.grants
    );
    let _ = writeln!(page, "<h2>Contended keys (top {top})</h2>");
    if view.is_empty() {
        page.push_str(
            "<p class=\"empty\">Nothing is contended: no account is locked or waited for.</p>\n",
        );
    } else {
        page.push_str(
            "<table>\n<thead><tr><th>key</th><th>holders</th><th>tokens</th><th>held for</th>\
             <th>waiters</th><th>oldest wait</th></tr></thead>\n<tbody>\n",
        );
        for key in view {
            render_row(&mut page, key);
        }
        page.push_str("</tbody>\n</table>\n");
        page.push_str(
            "<p class=\"note\">Durations are bounds: the registry dates grants and arrivals by \
             time marks, one per snapshot (each reload), so a short hold reads as at most \
             the time since the last reload, and a stuck one as its age to within that.</p>\n",
        );
    }
    page.push_str("<h2>Timeline</h2>\n");
    match timeline {
        Some(svg) => {
            // The library's own markup: it escapes the keys and labels it draws.
            page.push_str("<div class=\"timeline\">\n");
            page.push_str(svg);
            page.push_str("</div>\n");
        }
        None => page.push_str(
            "<p class=\"empty\">No journal: start the service with <code>--journal 2000</code> \
             to see the last seconds of locking here.</p>\n",
        ),
    }
    page.push_str("</body>\n</html>\n");
    page
}

/// One key's row: the oldest holder's hold is the one that matters for a stuck key.
fn render_row(page: &mut String, key: &KeySnapshot<u64>) {
    let class = if key.waiters > 0 {
        " class=\"waited\""
    } else {
        ""
    };
    let tokens = if key.holders.is_empty() {
        "—".to_owned()
    } else {
        key.holders
            .iter()
            .map(|holder| holder.fencing_token.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let held_for = key
        .holders
        .first()
        .map_or_else(|| "—".to_owned(), |holder| bounds(holder.held_for));
    let oldest_wait = key.oldest_waited.map_or_else(|| "—".to_owned(), bounds);
    let _ = writeln!(
        page,
        "<tr{class}><td class=\"key\">{}</td><td>{}</td><td class=\"tokens\">{}</td>\
         <td>{held_for}</td><td class=\"waiters\">{}</td><td>{oldest_wait}</td></tr>",
        escape(&key.key.to_string()),
        key.holders.len(),
        escape(&tokens),
        key.waiters,
    );
}

/// Bounds as one duration when they agree to within a tenth, else as a range; the exact
/// bounds in a tooltip.
fn bounds(bounds: DurationBounds) -> String {
    let (least, most) = (bounds.at_least, bounds.at_most);
    let shown = if least.is_zero() {
        // Nothing was marked between the event and this snapshot: only the upper bound says
        // anything.
        format!("≤ {}", readable(most))
    } else if most.saturating_sub(least) <= least / 10 {
        readable(least)
    } else {
        format!("{} – {}", readable(least), readable(most))
    };
    format!(
        "<span title=\"at least {least:?}, at most {most:?}\">{}</span>",
        escape(&shown)
    )
}

/// A duration in the unit that suits it, to three figures or so: `850 ns`, `12.3 ms`, `4.07 s`.
fn readable(duration: Duration) -> String {
    let nanos = duration.as_nanos();
    let seconds = duration.as_secs_f64();
    if nanos < 1_000 {
        format!("{nanos} ns")
    } else if nanos < 1_000_000 {
        format!("{:.1} µs", seconds * 1e6)
    } else if nanos < 1_000_000_000 {
        format!("{:.1} ms", seconds * 1e3)
    } else if seconds < 60.0 {
        format!("{seconds:.2} s")
    } else {
        let whole = duration.as_secs();
        format!("{} min {} s", whole / 60, whole % 60)
    }
}

/// `text` with the characters that mean something in HTML, in text or in a quoted
/// attribute, written as entities.
fn escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for character in text.chars() {
        match character {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&#39;"),
            other => escaped.push(other),
        }
    }
    escaped
}

/// Everything before the counts: the reload, and a small style sheet that keeps the table
/// narrow, its numbers aligned, and the waited-for keys marked.
const HEAD: &str = r#"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="refresh" content="1">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>payments: locks</title>
<style>
body { font: 15px/1.4 system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color: #1f2328; margin: 1.5rem 2rem; max-width: 1200px; }
h1 { font-size: 1.4rem; margin: 0 0 .3rem; }
h2 { font-size: 1.05rem; margin: 1.4rem 0 .5rem; }
.counts { color: #59636e; margin: 0; }
.counts b { color: #1f2328; font-variant-numeric: tabular-nums; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
th, td { padding: .3rem .9rem; text-align: right; border-bottom: 1px solid #d8dee4; }
th { font-weight: 600; color: #59636e; background: #f6f8fa; }
th:first-child, td.key { text-align: left; }
td.key { font-weight: 600; font-family: ui-monospace, Menlo, Consolas, monospace; }
td.tokens { font-family: ui-monospace, Menlo, Consolas, monospace; }
tr.waited td { background: #fff8c5; }
tr.waited td.waiters { color: #9a6700; font-weight: 700; }
.empty { color: #59636e; font-style: italic; }
.note { color: #59636e; font-size: .85rem; margin: .4rem 0 0; max-width: 640px; }
.timeline svg { max-width: 100%; height: auto; border: 1px solid #d8dee4; }
code { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: .9em; }
</style>
</head>
<body>
<h1>Locks of the payments service</h1>
"#;
