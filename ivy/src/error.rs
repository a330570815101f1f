//! Ivy's one error type and, in one place, its mapping for each API family:
//! OpenAI (`/v1/*`), text-embeddings-inference (the TEI routes) and gRPC
//! (`ivy.v1`). Stages return `ApiError`; each front renders it.

use axum::http::StatusCode;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The body is not valid JSON.
    #[error("{0}")]
    Malformed(String),
    /// The request names a content type Ivy does not read.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// Valid JSON of the wrong shape: a missing field, a wrong type, an
    /// unknown option value.
    #[error("{message}")]
    Schema {
        message: String,
        param: Option<&'static str>,
    },
    /// A well-formed request that breaks a rule or a limit: too many inputs
    /// or tokens, an input too long without truncation, an unknown prompt.
    #[error("{message}")]
    Validation {
        message: String,
        param: Option<&'static str>,
    },
    /// Nothing to process.
    #[error("{0}")]
    Empty(String),
    #[error("request body is larger than the limit of {limit} bytes (Ivy's --max-body-bytes)")]
    PayloadTooLarge { limit: usize },
    /// An uploaded file over its own bound (`--batch-max-file-bytes`).
    #[error("{0}")]
    FileTooLarge(String),
    /// An image over --max-image-bytes or --max-image-pixels (a
    /// decompression bomb is refused on its header).
    #[error("{0}")]
    ImageTooLarge(String),
    /// A Batch API file or batch that does not exist for this API key.
    #[error("{0}")]
    NotFound(String),
    /// No route at this path.
    #[error("{0}")]
    RouteNotFound(String),
    /// The path exists, not with this method.
    #[error("{0}")]
    MethodNotAllowed(String),
    #[error("{0}")]
    Unauthorized(String),
    /// Over the concurrency limit: refused at once, not queued.
    #[error("{0}")]
    Overloaded(String),
    /// No healthy replica, or Ivy is shutting down.
    #[error("{0}")]
    Unavailable(String),
    /// The served model cannot produce what was asked (e.g. sparse vectors
    /// from a model without a sparse head).
    #[error("{0}")]
    Unsupported(String),
    /// The request names a model this gateway does not serve.
    #[error("{0}")]
    ModelNotFound(String),
    /// The request's deadline passed.
    #[error("{0}")]
    Timeout(String),
    /// The client did not send its request in time (--body-timeout).
    #[error("{0}")]
    ClientTimeout(String),
    /// A replica refused the request as invalid.
    #[error("{0}")]
    UpstreamInvalid(String),
    /// A replica failed and no attempt was left.
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

    pub fn schema(param: &'static str, message: impl Into<String>) -> Self {
        Self::Schema {
            message: message.into(),
            param: Some(param),
        }
    }

    /// The request field at fault, when there is one.
    pub fn param(&self) -> Option<&'static str> {
        match self {
            Self::Schema { param, .. } | Self::Validation { param, .. } => *param,
            _ => None,
        }
    }

    /// A short, bounded label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Malformed(_) => "malformed",
            Self::UnsupportedMediaType(_) => "media_type",
            Self::Schema { .. } => "schema",
            Self::Validation { .. } => "validation",
            Self::Empty(_) => "empty",
            Self::PayloadTooLarge { .. } => "too_large",
            Self::FileTooLarge(_) => "file_too_large",
            Self::ImageTooLarge(_) => "image_too_large",
            Self::NotFound(_) => "not_found",
            Self::RouteNotFound(_) => "route_not_found",
            Self::MethodNotAllowed(_) => "method_not_allowed",
            Self::Unauthorized(_) => "unauthorized",
            Self::Overloaded(_) => "overloaded",
            Self::Unavailable(_) => "unavailable",
            Self::Unsupported(_) => "unsupported",
            Self::ModelNotFound(_) => "model_not_found",
            Self::Timeout(_) => "timeout",
            Self::ClientTimeout(_) => "client_timeout",
            Self::UpstreamInvalid(_) => "upstream_invalid",
            Self::Upstream(_) => "upstream",
            Self::Internal(_) => "internal",
        }
    }

    /// OpenAI's family: 400 malformed, 401, 408 for a body sent too slowly,
    /// 413, 415, 422 for every other request problem, 429, 503, 504, 502 for replica failures, 500.
    pub fn openai_status(&self) -> StatusCode {
        match self {
            Self::Malformed(_) => StatusCode::BAD_REQUEST,
            Self::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::Schema { .. }
            | Self::Validation { .. }
            | Self::Empty(_)
            | Self::Unsupported(_)
            | Self::UpstreamInvalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Self::PayloadTooLarge { .. } | Self::FileTooLarge(_) | Self::ImageTooLarge(_) => {
                StatusCode::PAYLOAD_TOO_LARGE
            }
            Self::ModelNotFound(_) | Self::RouteNotFound(_) | Self::NotFound(_) => {
                StatusCode::NOT_FOUND
            }
            Self::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            Self::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            Self::Overloaded(_) => StatusCode::TOO_MANY_REQUESTS,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            Self::ClientTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Self::Upstream(_) => StatusCode::BAD_GATEWAY,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// OpenAI's `error.type`.
    pub fn openai_type(&self) -> &'static str {
        match self.openai_status() {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            StatusCode::SERVICE_UNAVAILABLE => "service_unavailable",
            s if s.is_client_error() => "invalid_request_error",
            _ => "server_error",
        }
    }

    /// text-embeddings-inference's family, status and `error_type` as TEI
    /// 1.9 sends them (its `From<&ErrorType> for StatusCode`): a broken rule
    /// is 422 "Validation" (413 before 1.9), an empty batch 400 "Empty", a
    /// model that cannot do it 424 "Backend", 429 "Overloaded", 503
    /// "Unhealthy"; JSON of the wrong shape is 422 as in TEI's extractor. A
    /// body over the size limit stays 413, as axum's limit answers in TEI.
    pub fn tei_status(&self) -> (StatusCode, &'static str) {
        match self {
            Self::Malformed(_) => (StatusCode::BAD_REQUEST, "Validation"),
            Self::UnsupportedMediaType(_) => (StatusCode::UNSUPPORTED_MEDIA_TYPE, "Validation"),
            Self::Schema { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "Validation"),
            Self::Validation { .. } | Self::UpstreamInvalid(_) => {
                (StatusCode::UNPROCESSABLE_ENTITY, "Validation")
            }
            Self::Empty(_) => (StatusCode::BAD_REQUEST, "Empty"),
            Self::PayloadTooLarge { .. } | Self::FileTooLarge(_) | Self::ImageTooLarge(_) => {
                (StatusCode::PAYLOAD_TOO_LARGE, "Validation")
            }
            Self::ModelNotFound(_) | Self::RouteNotFound(_) | Self::NotFound(_) => {
                (StatusCode::NOT_FOUND, "Validation")
            }
            Self::MethodNotAllowed(_) => (StatusCode::METHOD_NOT_ALLOWED, "Validation"),
            Self::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "Unauthorized"),
            Self::Overloaded(_) => (StatusCode::TOO_MANY_REQUESTS, "Overloaded"),
            Self::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "Unhealthy"),
            Self::Unsupported(_) | Self::Upstream(_) => (StatusCode::FAILED_DEPENDENCY, "Backend"),
            Self::Timeout(_) => (StatusCode::GATEWAY_TIMEOUT, "Backend"),
            Self::ClientTimeout(_) => (StatusCode::REQUEST_TIMEOUT, "Validation"),
            Self::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "Backend"),
        }
    }

    /// The gRPC family (`ivy.v1`).
    pub fn grpc_code(&self) -> tonic::Code {
        use tonic::Code;
        match self {
            Self::Malformed(_)
            | Self::UnsupportedMediaType(_)
            | Self::Schema { .. }
            | Self::Validation { .. }
            | Self::Empty(_)
            | Self::UpstreamInvalid(_) => Code::InvalidArgument,
            Self::PayloadTooLarge { .. }
            | Self::FileTooLarge(_)
            | Self::ImageTooLarge(_)
            | Self::Overloaded(_) => Code::ResourceExhausted,
            Self::Unauthorized(_) => Code::Unauthenticated,
            Self::Unavailable(_) => Code::Unavailable,
            Self::Unsupported(_) => Code::FailedPrecondition,
            Self::ModelNotFound(_) | Self::RouteNotFound(_) | Self::NotFound(_) => Code::NotFound,
            Self::MethodNotAllowed(_) => Code::Unimplemented,
            Self::Timeout(_) | Self::ClientTimeout(_) => Code::DeadlineExceeded,
            Self::Upstream(_) | Self::Internal(_) => Code::Internal,
        }
    }

    /// OpenAI's `error.code`: always a string, as OpenAI's clients type it
    /// (`model_not_found` is OpenAI's own; the others are Ivy's labels).
    pub fn openai_code(&self) -> serde_json::Value {
        self.kind().into()
    }

    /// Whether the failure is Ivy's or a replica's rather than the caller's
    /// (logged as a warning, and its message carries the request id).
    pub fn is_server_side(&self) -> bool {
        matches!(
            self,
            Self::Unavailable(_) | Self::Timeout(_) | Self::Upstream(_) | Self::Internal(_)
        )
    }

    /// The message the caller sees. A server-side failure is also logged
    /// (in the current span) and its message carries the request id, so
    /// that the caller can point at the log line.
    pub fn client_message(&self, request_id: Option<impl std::fmt::Display>) -> String {
        let mut message = self.to_string();
        if self.is_server_side() {
            tracing::warn!(kind = self.kind(), error = %self, "request failed");
            if let Some(id) = request_id {
                message.push_str(&format!(" (request id {id})"));
            }
        }
        message
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> Vec<ApiError> {
        vec![
            ApiError::Malformed("m".into()),
            ApiError::UnsupportedMediaType("m".into()),
            ApiError::schema("input", "m"),
            ApiError::validation("input", "m"),
            ApiError::Empty("m".into()),
            ApiError::PayloadTooLarge { limit: 1 },
            ApiError::FileTooLarge("m".into()),
            ApiError::ImageTooLarge("m".into()),
            ApiError::NotFound("m".into()),
            ApiError::Unauthorized("m".into()),
            ApiError::Overloaded("m".into()),
            ApiError::Unavailable("m".into()),
            ApiError::Unsupported("m".into()),
            ApiError::ModelNotFound("m".into()),
            ApiError::RouteNotFound("m".into()),
            ApiError::MethodNotAllowed("m".into()),
            ApiError::Timeout("m".into()),
            ApiError::ClientTimeout("m".into()),
            ApiError::UpstreamInvalid("m".into()),
            ApiError::Upstream("m".into()),
            ApiError::Internal("m".into()),
        ]
    }

    #[test]
    fn kinds_are_distinct_labels() {
        let mut kinds: Vec<_> = all().iter().map(|e| e.kind()).collect();
        kinds.sort();
        kinds.dedup();
        assert_eq!(kinds.len(), all().len());
    }

    #[test]
    fn server_side_errors_are_5xx_in_every_family() {
        for e in all() {
            assert_eq!(
                e.is_server_side(),
                e.openai_status().is_server_error(),
                "{e:?}"
            );
            // A client too slow to send its body is its own fault, but
            // gRPC has no code for it but DEADLINE_EXCEEDED.
            if matches!(e, ApiError::ClientTimeout(_)) {
                continue;
            }
            let server_grpc = matches!(
                e.grpc_code(),
                tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Internal
            );
            assert_eq!(e.is_server_side(), server_grpc, "{e:?}");
        }
    }

    #[test]
    fn tei_codes_follow_tei() {
        assert_eq!(
            ApiError::validation("inputs", "x").tei_status(),
            (StatusCode::UNPROCESSABLE_ENTITY, "Validation")
        );
        assert_eq!(
            ApiError::PayloadTooLarge { limit: 1 }
                .tei_status()
                .0
                .as_u16(),
            413
        );
        assert_eq!(
            ApiError::Empty("x".into()).tei_status(),
            (StatusCode::BAD_REQUEST, "Empty")
        );
        assert_eq!(
            ApiError::Unsupported("x".into()).tei_status().0.as_u16(),
            424
        );
        assert_eq!(
            ApiError::Overloaded("x".into()).tei_status().1,
            "Overloaded"
        );
    }
}
