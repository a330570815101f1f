//! Operational routes: liveness, readiness, model info, metrics and the
//! OpenAPI document.

use axum::extract::{Query, RawQuery, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::openapi;
use super::respond::{finish, Api};
use crate::error::ApiError;
use crate::pipeline::Kind;
use crate::state::AppState;

/// Liveness: the process answers. Never looks at replicas, so a Tulip
/// outage does not get Ivy restarted.
pub async fn health() -> &'static str {
    "ok"
}

/// Readiness: not draining, and at least one replica takes work.
pub async fn ready(State(state): State<AppState>) -> Response {
    let replicas = state.replicas.snapshot();
    let healthy = replicas.iter().filter(|r| r.is_routable()).count();
    let ready = state.is_ready();
    let body = json!({
        "ready": ready,
        "draining": state.admission.is_draining(),
        "healthy_replicas": healthy,
        "replicas": replicas.len(),
    });
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

/// `?model=`: which model `/info` describes (default: the default model).
#[derive(serde::Deserialize)]
pub struct InfoQuery {
    model: Option<String>,
}

/// The served model (`?model=`, else the default one) and Ivy's limits, in
/// text-embeddings-inference 1.9's shape (every field it sends), plus
/// `kinds`, `dimension`, `vocab_size`, `device`, `max_tokens_per_request`,
/// the prompt templates and `models` (every model served here).
pub async fn info(State(state): State<AppState>, Query(query): Query<InfoQuery>) -> Response {
    let asked = query.model;
    let chosen = state
        .pool(asked.as_deref())
        .and_then(|(pool, name)| Ok((pool.info().ok_or_else(|| pool.no_replica())?, pool, name)));
    let cpu = match &chosen {
        Ok((_, pool, _)) => cpu_runtimes(&pool.replicas()).await,
        Err(_) => serde_json::Value::Null,
    };
    let result = chosen.map(|(m, pool, name)| {
        {
            let kinds = crate::model::kinds(&m);
            // TEI names a cross-encoder a reranker, with its labels.
            let model_type = if kinds == [Kind::Score] {
                json!({ "reranker": { "id2label": { "0": "LABEL_0" }, "label2id": { "LABEL_0": 0 } } })
            } else if kinds == [Kind::Classify] {
                let id2label: serde_json::Map<String, serde_json::Value> = m
                    .labels
                    .iter()
                    .enumerate()
                    .map(|(i, l)| (i.to_string(), json!(l)))
                    .collect();
                let label2id: serde_json::Map<String, serde_json::Value> = m
                    .labels
                    .iter()
                    .enumerate()
                    .map(|(i, l)| (l.clone(), json!(i)))
                    .collect();
                json!({ "classifier": { "id2label": id2label, "label2id": label2id } })
            } else {
                json!({ "embedding": { "pooling": m.pooling } })
            };
            let templates = state.templates(&pool);
            Json(json!({
                "model_id": m.model_id,
                "served_model_name": name,
                "model_sha": null,
                "model_dtype": m.dtype,
                "model_type": model_type,
                "architecture": m.architecture,
                "dimension": m.dimension,
                "kinds": kinds.iter().map(|k| k.name()).collect::<Vec<_>>(),
                "max_concurrent_requests": state.config.max_concurrent_requests,
                "max_input_length": m.max_input_length,
                "max_batch_tokens": m.max_batch_tokens,
                "max_batch_requests": m.max_batch_sequences,
                "max_client_batch_size": state.config.max_inputs,
                "max_tokens_per_request": state.config.max_tokens_per_request,
                "auto_truncate": state.config.auto_truncate,
                // Large tokenization jobs spread over every core.
                "tokenization_workers": std::thread::available_parallelism().map_or(1, |n| n.get()),
                "vocab_size": m.vocab_size,
                "device": m.device,
                "prompts": templates.prompts.keys().collect::<Vec<_>>(),
                "default_prompt_name": templates.default_prompt_name,
                "version": env!("CARGO_PKG_VERSION"),
                "sha": null,
                "docker_label": null,
                "models": state.pools.served_names(),
                "cpu_runtimes": cpu,
                // An image model's input: what a client may send as images.
                "images": (m.image_tokens > 0).then(|| json!({
                    "height": m.image_height, "width": m.image_width, "tokens": m.image_tokens,
                })),
            }))
            .into_response()
        }
    });
    finish(&state, Api::Tei, "info", result)
}

/// How far the replicas' CPU runtimes are (the fast path `onnx`, its int8
/// copy, the bfloat16 twin): token buckets by state, summed over the
/// routable replicas asked now (`Info`, 1 s each, at once), by runtime;
/// `{}` when none has such runtimes (a GPU, or a replica not answering).
async fn cpu_runtimes(
    replicas: &[std::sync::Arc<crate::upstream::replica::Replica>],
) -> serde_json::Value {
    let asked = replicas
        .iter()
        .filter(|r| r.is_routable())
        .map(|r| r.current_info(std::time::Duration::from_secs(1)));
    let mut sums: std::collections::BTreeMap<String, [u32; 4]> = Default::default();
    for info in futures_util::future::join_all(asked)
        .await
        .into_iter()
        .flatten()
    {
        for rt in &info.cpu_runtimes {
            let s = sums.entry(rt.name.clone()).or_default();
            for (i, n) in [rt.cold, rt.pending, rt.ready, rt.failed]
                .into_iter()
                .enumerate()
            {
                s[i] += n;
            }
        }
    }
    sums.into_iter()
        .map(|(name, [cold, pending, ready, failed])| {
            (
                name,
                json!({"cold": cold, "pending": pending, "ready": ready, "failed": failed}),
            )
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// Prometheus text exposition.
pub async fn metrics(State(state): State<AppState>) -> Response {
    let pools = state.pools.all();
    let replicas = state
        .replicas
        .snapshot()
        .iter()
        .map(|r| {
            let mut sample = r.sample();
            if let Some(pool) = r.pool().and_then(|i| pools.get(i)) {
                sample.model = pool.name.to_string();
            }
            sample
        })
        .collect();
    let body = state.metrics.render(replicas, state.admission.in_flight());
    ([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], body).into_response()
}

/// The OpenAPI document of these routes.
pub async fn openapi(State(state): State<AppState>) -> Response {
    let result: Result<Response, ApiError> =
        Ok(Json(openapi::document(&state.config)).into_response());
    finish(&state, Api::Tei, "openapi.json", result)
}

/// `GET /quantization/ranges?dimensions=N&normalize=true|false`: the
/// per-dimension ranges int8/uint8 vectors of that setting are cut from
/// (default: the model's dimension and normalization), calibrating them
/// first if no request has yet. Pass `ranges` to sentence-transformers'
/// `quantize_embeddings` to get Ivy's vectors, or save the answer for
/// `--quantization-ranges`.
pub async fn quantization_ranges(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
) -> Response {
    let result = async {
        let (mut dimensions, mut normalize, mut model) = (None, None, None);
        for pair in query.as_deref().unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            match k {
                "dimensions" => {
                    dimensions = Some(v.parse::<u32>().ok().filter(|d| *d >= 1).ok_or_else(|| {
                        ApiError::validation("dimensions", format!("`dimensions` must be a positive integer, got {v:?}"))
                    })?)
                }
                "model" => model = Some(v.to_string()),
                "normalize" => {
                    normalize = Some(v.parse::<bool>().map_err(|_| {
                        ApiError::validation("normalize", format!("`normalize` must be true or false, got {v:?}"))
                    })?)
                }
                other => {
                    return Err(ApiError::validation(
                        "query",
                        format!("unknown query parameter {other:?}; this route takes model, dimensions and normalize"),
                    ))
                }
            }
        }
        let (pool, _) = state.pool(model.as_deref())?;
        if let (Some(d), Some(m)) = (dimensions, pool.info()) {
            if d > m.dimension {
                return Err(ApiError::validation(
                    "dimensions",
                    format!("`dimensions` must be between 1 and the model's dimension {}, got {d}", m.dimension),
                ));
            }
        }
        let ranges = crate::pipeline::quantize::ranges(&state, &pool, dimensions, normalize).await?;
        Ok(Json(&*ranges).into_response())
    }
    .await;
    finish(&state, Api::Tei, "ranges", result)
}
