//! A small HTTP server beside gRPC: `GET /metrics` (Prometheus) and
//! `GET /health` (liveness: answers while the process runs, never waits on
//! the engine, so a busy replica is not restarted).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use crate::engine::EngineHandle;
use crate::metrics::Metrics;
use crate::queue::Pool;

pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    pool: Arc<Pool>,
    engine: Arc<EngineHandle>,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let m = Arc::clone(&metrics);
                let engine = Arc::clone(&engine);
                m.set_backlog(&pool.backlog());
                // Read now: the threads finishing steps set these gauges
                // from reads that can land out of order (one stale).
                m.inflight_steps.set(pool.inflight() as i64);
                m.queued_sequences.set(pool.queued_sequences() as i64);
                async move {
                    m.set_cpu_buckets(&engine.cpu_readiness_off_reactor().await);
                    (
                        [(
                            header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        m.render(),
                    )
                        .into_response()
                }
            }),
        )
        .route("/health", get(|| async { "ok" }));
    let addr: Option<SocketAddr> = listener.local_addr().ok();
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(stop)
        .await
    {
        tracing::warn!(?addr, error = %e, "metrics server error");
    }
}
