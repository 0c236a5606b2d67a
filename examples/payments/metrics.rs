//! `GET /metrics`: Prometheus text when built with `--features metrics`, else a JSON 404
//! saying how to turn it on.

use axum::Router;
use axum::routing::get;

#[cfg(feature = "metrics")]
/// Installs the Prometheus recorder as the process's `metrics` recorder, so that whatever
/// the lock registry records shows up at `/metrics`, and returns the route that renders it.
pub fn routes() -> Result<Router, String> {
    use std::time::Duration;

    use axum::http::header::CONTENT_TYPE;
    use metrics_exporter_prometheus::PrometheusBuilder;

    let handle = PrometheusBuilder::new()
        .install_recorder()
        .map_err(|error| format!("cannot install the Prometheus recorder: {error}"))?;
    // The recorder leaves its periodic upkeep (draining histogram buckets) to its installer.
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(5));
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });
    let render = get(move || {
        let handle = handle.clone();
        async move {
            (
                [(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
                handle.render(),
            )
        }
    });
    Ok(Router::new().route("/metrics", render))
}

#[cfg(not(feature = "metrics"))]
/// The route that says `/metrics` needs the `metrics` feature (404, as JSON).
pub fn routes() -> Result<Router, String> {
    use axum::http::StatusCode;

    use crate::api::ApiError;

    let off = get(|| async {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "metrics are off: run with `cargo run --example payments --features metrics`",
        )
    });
    Ok(Router::new().route("/metrics", off))
}
