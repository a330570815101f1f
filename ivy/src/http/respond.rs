//! How every HTTP route answers: `finish` records the request's metric
//! (API family, endpoint label, status, error kind) and renders an error in
//! the family's shape (OpenAI's or TEI's; the status mapping itself lives in
//! `error.rs`); JSON bodies, with TEI's timing headers when timed.

use std::time::Instant;

use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::error::ApiError;
use crate::pipeline::Output;
use crate::request::auth::PUBLIC_PATHS;
use crate::request::id::{model_label, RequestId};
use crate::state::Gateway;

/// The HTTP API families.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `/v1/*`: OpenAI's error shape.
    OpenAi,
    /// Everything else: text-embeddings-inference's error shape.
    Tei,
    /// `/v2/*`: Cohere's error shape `{"id", "message"}`, OpenAI's statuses.
    Cohere,
}

impl Api {
    pub fn of_path(path: &str) -> Self {
        if path.starts_with("/v1/") {
            Self::OpenAi
        } else if path.starts_with("/v2/") {
            Self::Cohere
        } else {
            Self::Tei
        }
    }

    fn label(self) -> &'static str {
        match self {
            Self::OpenAi => "openai",
            Self::Tei => "tei",
            Self::Cohere => "cohere",
        }
    }
}

/// A bounded metric label for a matched route: the last part of a path
/// the router serves (`http/mod.rs`), else `other`.
pub fn endpoint_label(path: &str) -> &'static str {
    super::GUARDED
        .iter()
        .chain(&PUBLIC_PATHS)
        .chain(&super::HEALTH_PATHS)
        .find(|known| **known == path)
        .and_then(|known| known.rsplit('/').next())
        .map(|last| if last.is_empty() { "root" } else { last })
        .unwrap_or("other")
}

/// Records the request's outcome and renders an error in the family's shape.
pub fn finish(
    state: &Gateway,
    api: Api,
    endpoint: &'static str,
    result: Result<Response, ApiError>,
) -> Response {
    match result {
        Ok(response) => {
            state.metrics.request(
                api.label(),
                endpoint,
                model_label(),
                response.status().as_u16().to_string(),
                None,
            );
            response
        }
        Err(e) => {
            let response = error(api, &e);
            state.metrics.request(
                api.label(),
                endpoint,
                model_label(),
                response.status().as_u16().to_string(),
                Some(e.kind()),
            );
            response
        }
    }
}

/// Seconds a client is told to wait before retrying a 503 (no replica,
/// draining): a replica starting or a pod replacing this one.
const RETRY_AFTER_SECONDS: &str = "5";

fn error(api: Api, e: &ApiError) -> Response {
    let mut response = render_error(api, e);
    if response.status() == StatusCode::SERVICE_UNAVAILABLE {
        response.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from_static(RETRY_AFTER_SECONDS),
        );
    }
    response
}

fn render_error(api: Api, e: &ApiError) -> Response {
    let message = e.client_message(RequestId::current());
    match api {
        Api::OpenAi => {
            let status = e.openai_status();
            let body = json!({ "error": {
                "message": message, "type": e.openai_type(), "param": e.param(), "code": e.openai_code(),
            }});
            (status, Json(body)).into_response()
        }
        Api::Cohere => {
            let id = RequestId::current()
                .map(|r| r.to_string())
                .unwrap_or_default();
            let body = json!({ "id": id, "message": message });
            (e.openai_status(), Json(body)).into_response()
        }
        Api::Tei => {
            let (status, error_type) = e.tei_status();
            (
                status,
                Json(json!({ "error": message, "error_type": error_type })),
            )
                .into_response()
        }
    }
}

/// A JSON body.
pub fn json(body: Vec<u8>) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

/// A JSON body with TEI's timing headers (milliseconds) and token count.
pub fn json_timed(body: Vec<u8>, out: &Output, started: Instant) -> Response {
    let mut response = json(body);
    let ms = |d: std::time::Duration| d.as_millis().to_string();
    let total = ms(started.elapsed());
    let headers = [
        ("x-compute-tokens", out.tokens.to_string()),
        ("x-compute-time", total.clone()),
        ("x-total-time", total),
        ("x-tokenization-time", ms(out.timing.tokenize)),
        ("x-queue-time", ms(out.timing.queue)),
        ("x-inference-time", ms(out.timing.inference)),
    ];
    for (name, value) in headers {
        if let Ok(v) = HeaderValue::from_str(&value) {
            response
                .headers_mut()
                .insert(HeaderName::from_static(name), v);
        }
    }
    response
}

/// Serialises a response body; our own types always serialise.
pub fn to_json<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, ApiError> {
    let _span = tracing::debug_span!("render").entered();
    serde_json::to_vec(value)
        .map_err(|e| ApiError::Internal(format!("serialising the response: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_and_labels() {
        assert_eq!(Api::of_path("/v1/embeddings"), Api::OpenAi);
        assert_eq!(Api::of_path("/embed"), Api::Tei);
        assert_eq!(endpoint_label("/v1/embeddings"), "embeddings");
        assert_eq!(endpoint_label("/embed_sparse"), "embed_sparse");
        assert_eq!(endpoint_label("/nope"), "other");
        assert_eq!(endpoint_label("/"), "root");
        assert_eq!(endpoint_label("/invocations"), "invocations");
    }

    /// Every route has its own label: a 401 on `/decode` was once counted
    /// as `other` (the labels were a copy of the route table that missed it).
    #[test]
    fn every_route_has_its_own_label() {
        assert_eq!(endpoint_label("/decode"), "decode");
        let labels: Vec<&str> = super::super::GUARDED
            .iter()
            .chain(&PUBLIC_PATHS)
            .map(|p| endpoint_label(p))
            .collect();
        assert!(!labels.contains(&"other"), "{labels:?}");
    }
}
