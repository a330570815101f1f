//! Reading a JSON request body: content type, size limit, syntax.
//! Every JSON route goes through here so they all fail the same way.

use axum::extract::rejection::BytesRejection;
use axum::http::{header, HeaderMap, StatusCode};
use bytes::Bytes;
use serde_json::Value;

use super::fields::{self, Object};
use crate::error::ApiError;
use crate::state::Gateway;

/// A request body as bytes, or why it could not be read (too large: 413).
pub type Body = Result<Bytes, BytesRejection>;

/// The request's JSON object, read as every JSON route reads it
/// (`required` names the field a non-object lacks).
pub fn json_object(
    state: &Gateway,
    headers: &HeaderMap,
    body: Body,
    required: &'static str,
) -> Result<Object, ApiError> {
    fields::object(
        json_body(headers, body, state.config.max_body_bytes)?,
        required,
    )
}

pub fn json_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Value, ApiError> {
    let _span = tracing::debug_span!("parse").entered();
    check_content_type(headers)?;
    let body = body.map_err(|e| {
        if let Some(timeout) = crate::net::body_deadline::find(&e) {
            ApiError::ClientTimeout(timeout.to_string())
        } else if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::PayloadTooLarge { limit }
        } else {
            ApiError::Malformed(format!("could not read the request body: {e}"))
        }
    })?;
    serde_json::from_slice(&body)
        .map_err(|e| ApiError::Malformed(format!("request body is not valid JSON: {e}")))
}

fn check_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return Err(ApiError::UnsupportedMediaType(
            "missing Content-Type; send `Content-Type: application/json`".into(),
        ));
    };
    let mime = value
        .to_str()
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim();
    let json = mime.eq_ignore_ascii_case("application/json")
        || (mime.starts_with("application/") && mime.ends_with("+json"));
    if json {
        Ok(())
    } else {
        Err(ApiError::UnsupportedMediaType(format!(
            "Content-Type `{mime}` is not supported; send `application/json`"
        )))
    }
}
