//! Shared state and the HTTP router.

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use ivy_tokenizer::Tokenizer;
use serde_json::json;

use crate::config::Config;
use crate::openai;
use crate::replicas::Replicas;

#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    pub tokenizer: Arc<Tokenizer>,
    pub replicas: Arc<Replicas>,
}

pub fn router(state: AppState) -> Router {
    let limit = state.config.max_body_bytes;
    Router::new()
        .route("/v1/embeddings", post(openai::embeddings))
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/info", get(info))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

/// Liveness: the process answers. Never looks at replicas.
async fn health() -> &'static str {
    "ok"
}

/// Readiness: at least one replica passed its last health check.
async fn ready(State(state): State<AppState>) -> Response {
    let healthy = state.replicas.all().iter().filter(|r| r.is_healthy()).count();
    let body = json!({ "ready": healthy > 0, "healthy_replicas": healthy,
                       "replicas": state.replicas.all().len() });
    let status = if healthy > 0 {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

/// The served model, in text-embeddings-inference's `/info` shape.
async fn info(State(state): State<AppState>) -> Response {
    let Some(m) = state.replicas.model() else {
        let body = json!({ "error": "no Tulip replica has answered yet", "error_type": "Unhealthy" });
        return (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
    };
    Json(json!({
        "model_id": m.model_id,
        "model_dtype": m.dtype,
        "model_type": { "embedding": { "pooling": m.pooling } },
        "architecture": m.architecture,
        "dimension": m.dimension,
        "max_input_length": m.max_input_length,
        "max_client_batch_size": state.config.max_inputs,
        "max_batch_tokens": m.max_batch_tokens,
        "max_batch_requests": m.max_batch_sequences,
        "vocab_size": m.vocab_size,
        "device": m.device,
        "version": env!("CARGO_PKG_VERSION"),
    }))
    .into_response()
}
