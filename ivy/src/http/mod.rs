//! The HTTP front: routes, and the layers every request passes (request id,
//! API key, body limit). Handlers parse into a pipeline job and render.

mod batches;
mod body;
mod cohere;
mod cohere_embed;
mod fields;
mod files;
mod hf;
mod image_input;
mod lora;
mod openai;
mod openapi;
mod ops;
mod respond;
mod tei;

use std::time::Instant;

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{header, HeaderName, HeaderValue, Method, Uri};
use axum::middleware::{from_fn, from_fn_with_state, Next};
use axum::response::Response;
use axum::routing::{delete, get, post};
use axum::Router;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tracing::Instrument;

use self::respond::{endpoint_label, Api};
use crate::request::auth::PUBLIC_PATHS;
use crate::request::id::{RequestId, HEADER};
use crate::state::AppState;

/// Declares the routes behind the API key once: `guarded()` serves them and
/// `GUARDED` lists their paths, from which `endpoint_label` names them.
macro_rules! guarded_routes {
    ($($path:literal => $handler:expr,)*) => {
        /// The paths of the routes behind the API key.
        const GUARDED: &[&str] = &[$($path),*];

        fn guarded() -> Router<AppState> {
            Router::new()$(.route($path, $handler))*
        }
    };
}

guarded_routes! {
    "/v1/embeddings" => post(openai::embeddings),
    "/v1/models" => get(openai::models),
    "/v1/rerank" => post(openai::rerank),
    "/v1/load_lora_adapter" => post(lora::load),
    "/v1/unload_lora_adapter" => post(lora::unload),
    "/embed" => post(tei::embed),
    "/embed_sparse" => post(tei::embed_sparse),
    "/embed_all" => post(tei::embed_all),
    "/rerank" => post(tei::rerank),
    "/predict" => post(tei::predict),
    "/similarity" => post(tei::similarity),
    "/tokenize" => post(tei::tokenize),
    "/decode" => post(tei::decode),
    "/info" => get(ops::info),
    "/openapi.json" => get(ops::openapi),
    "/v2/embed" => post(cohere_embed::embed),
    "/quantization/ranges" => get(ops::quantization_ranges),
    "/" => post(hf::post),
    "/invocations" => post(hf::post),
}

/// The Batch API's routes (`batch/`): behind the API key, not held for a
/// replica (a corpus may be submitted to a pool scaled to zero).
const BATCH_API: [&str; 5] = [
    "/v1/files",
    "/v1/files/{id}",
    "/v1/files/{id}/content",
    "/v1/batches",
    "/v1/batches/{id}",
];

fn batch_api() -> Router<AppState> {
    Router::new()
        .route(
            BATCH_API[0],
            post(files::upload)
                .get(files::list)
                .layer(DefaultBodyLimit::disable()),
        )
        .route(BATCH_API[1], get(files::get).merge(delete(files::delete)))
        .route(BATCH_API[2], get(files::content))
        .route(BATCH_API[3], post(batches::create).get(batches::list))
        .route(BATCH_API[4], get(batches::get))
        .route("/v1/batches/{id}/cancel", post(batches::cancel))
}

/// The routes a batch's lines run through, in process (`batch/lines.rs`):
/// the same handlers as over HTTP, with a request id each, without the
/// API key (the batch's owner was checked when it was created).
pub fn batch_router(state: AppState) -> Router {
    Router::new()
        .route("/v1/embeddings", post(openai::embeddings))
        .route("/v1/rerank", post(openai::rerank))
        .route("/v2/embed", post(cohere_embed::embed))
        .layer(DefaultBodyLimit::max(state.config.max_body_bytes))
        .layer(from_fn(request_id))
        .with_state(state)
}

/// Health checks open without a key on the paths TEI serves them at
/// (`GET /` is the Inference API's, `GET /ping` SageMaker's; `hf.rs`).
const HEALTH_PATHS: [&str; 2] = ["/", "/ping"];

pub fn router(state: AppState) -> Router {
    let limit = state.config.max_body_bytes;
    // The hold runs after the key check and before the handler resolves
    // the request's model pool (none exists while no replica ever answered).
    let guarded = guarded()
        .route_layer(from_fn_with_state(state.clone(), hold_for_replica))
        .merge(batch_api())
        .route_layer(from_fn_with_state(state.clone(), require_key));
    let public = Router::new()
        .route(PUBLIC_PATHS[0], get(ops::health))
        .route(PUBLIC_PATHS[1], get(ops::ready))
        .route(PUBLIC_PATHS[2], get(ops::metrics))
        .route(HEALTH_PATHS[0], get(ops::health))
        .route(HEALTH_PATHS[1], get(ops::health));
    let cors = cors(&state.config.cors_allow_origin);
    let router = guarded
        .merge(public)
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(DefaultBodyLimit::max(limit))
        .layer(from_fn(request_id))
        .with_state(state);
    // Outermost, so a browser's preflight is answered before the API key
    // (which a preflight never carries) is checked.
    match cors {
        Some(layer) => router.layer(layer),
        None => router,
    }
}

/// An unknown path: a JSON error in its route family's shape, not an
/// empty 404.
async fn no_route(State(state): State<AppState>, method: Method, uri: Uri) -> Response {
    let path = uri.path();
    let e = crate::error::ApiError::RouteNotFound(format!(
        "no route {method} {path}; Ivy's routes are listed in GET /openapi.json"
    ));
    respond::finish(&state, Api::of_path(path), "other", Err(e))
}

/// A known path with the wrong method (e.g. GET /v1/embeddings); axum
/// adds the `Allow` header.
async fn wrong_method(State(state): State<AppState>, method: Method, uri: Uri) -> Response {
    let path = uri.path();
    let e = crate::error::ApiError::MethodNotAllowed(format!(
        "{path} does not take {method}: the Allow header says which method it takes"
    ));
    respond::finish(&state, Api::of_path(path), endpoint_label(path), Err(e))
}

/// CORS for the configured origins (`*` = any); none configured, no layer.
fn cors(origins: &[String]) -> Option<CorsLayer> {
    if origins.is_empty() {
        return None;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(origins.iter().filter_map(|o| HeaderValue::from_str(o).ok()))
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST])
            .allow_headers([
                header::CONTENT_TYPE,
                header::AUTHORIZATION,
                HeaderName::from_static(HEADER),
                HeaderName::from_static("traceparent"),
                HeaderName::from_static("tracestate"),
            ])
            .expose_headers([HeaderName::from_static(HEADER)]),
    )
}

/// Gives every request an id (the caller's `x-request-id` or a new one),
/// logs under it, and returns it in the response.
async fn request_id(request: Request, next: Next) -> Response {
    let id = RequestId::from_caller(request.headers().get(HEADER).map(|v| v.as_bytes()));
    let span = tracing::info_span!(
        "request",
        id = %id,
        method = %request.method(),
        path = %request.uri().path(),
        tokens = tracing::field::Empty,
    );
    telemetry::continue_http(&span, request.headers());
    let started = Instant::now();
    let mut response = id
        .clone()
        .scope(next.run(request))
        .instrument(span.clone())
        .await;
    if let Ok(v) = HeaderValue::from_str(id.as_str()) {
        response.headers_mut().insert(HEADER, v);
    }
    let status = response.status().as_u16();
    let ms = started.elapsed().as_secs_f64() * 1e3;
    span.in_scope(|| {
        if response.status().is_success() {
            tracing::debug!(status, ms, "answered");
        } else {
            tracing::info!(status, ms, "answered");
        }
    });
    response
}

/// Scale from zero: holds the request while no replica is ready
/// (`--cold-start-hold`, `upstream/cold_start.rs`); past the hold, the 503
/// in the route family's shape.
async fn hold_for_replica(
    State(state): State<AppState>,
    matched: MatchedPath,
    request: Request,
    next: Next,
) -> Response {
    match crate::pipeline::wait_for_replica(&state).await {
        Ok(_) => next.run(request).await,
        Err(e) => {
            let path = matched.as_str();
            respond::finish(&state, Api::of_path(path), endpoint_label(path), Err(e))
        }
    }
}

/// The API key on every route but the public ones; the caller's `Owner`
/// goes on with the request (the Batch API files what it creates under it).
async fn require_key(
    State(state): State<AppState>,
    matched: MatchedPath,
    mut request: Request,
    next: Next,
) -> Response {
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    match state.api_key.check(authorization) {
        Ok(owner) => {
            request.extensions_mut().insert(owner);
            next.run(request).await
        }
        Err(e) => {
            let path = matched.as_str();
            respond::finish(&state, Api::of_path(path), endpoint_label(path), Err(e))
        }
    }
}
