//! Ivy's errors and their one mapping to HTTP status codes.
//!
//! Handlers return `ApiError`; how it is rendered (OpenAI's shape on
//! `/v1/*`) is decided at the edge, but the status code is decided here.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The body is not valid JSON.
    #[error("{0}")]
    Malformed(String),
    /// The request names a content type Ivy does not read.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// Valid JSON that breaks a rule (missing field, wrong type, too many
    /// inputs, too long without truncation, out-of-range option).
    #[error("{message}")]
    Validation {
        message: String,
        param: Option<&'static str>,
    },
    #[error("request body is larger than the limit of {limit} bytes")]
    PayloadTooLarge { limit: usize },
    /// No Tulip replica is healthy.
    #[error("{0}")]
    Unavailable(String),
    /// A replica answered with an error that is the caller's fault.
    #[error("{0}")]
    UpstreamInvalid(String),
    /// A replica failed.
    #[error("{0}")]
    Upstream(String),
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    pub fn validation(param: &'static str, message: impl Into<String>) -> Self {
        Self::Validation {
            message: message.into(),
            param: Some(param),
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Self::Malformed(_) => StatusCode::BAD_REQUEST,
            Self::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::Validation { .. } | Self::UpstreamInvalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Upstream(_) => StatusCode::BAD_GATEWAY,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// A short, bounded label (for OpenAI's `type` field and for metrics).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Malformed(_)
            | Self::UnsupportedMediaType(_)
            | Self::Validation { .. }
            | Self::UpstreamInvalid(_)
            | Self::PayloadTooLarge { .. } => "invalid_request_error",
            Self::Unavailable(_) => "service_unavailable",
            Self::Upstream(_) | Self::Internal(_) => "server_error",
        }
    }

    fn param(&self) -> Option<&'static str> {
        match self {
            Self::Validation { param, .. } => *param,
            _ => None,
        }
    }
}

/// Renders an error in OpenAI's shape: `{"error": {message, type, param, code}}`.
pub struct OpenAiError(pub ApiError);

impl From<ApiError> for OpenAiError {
    fn from(e: ApiError) -> Self {
        Self(e)
    }
}

impl IntoResponse for OpenAiError {
    fn into_response(self) -> Response {
        let e = self.0;
        let status = e.status();
        if status.is_server_error() {
            tracing::warn!(status = status.as_u16(), error = %e, "request failed");
        }
        let body = json!({
            "error": {
                "message": e.to_string(),
                "type": e.kind(),
                "param": e.param(),
                "code": status.as_u16(),
            }
        });
        (status, Json(body)).into_response()
    }
}
