//! Runs one request line of a batch through Ivy's own routes (in process,
//! the same handlers as over HTTP, at priority `batch` unless the line
//! says otherwise) and writes its line of output in OpenAI's format.
//! Ivy's transient refusals (503 without a replica, 429 over the
//! concurrency limit) are waited out; other server failures are tried
//! three times; what is left is the line's answer.

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use serde_json::{json, Value};
use tower::ServiceExt;

use super::ids;

/// Largest response body read back from a route (a line's answer).
const MAX_RESPONSE: usize = 256 * 1024 * 1024;
/// Tries of a request failing with a 5xx other than 503.
const SERVER_TRIES: u32 = 3;

/// A line's result: its line of output and which file it goes to.
pub struct Outcome {
    pub line: Vec<u8>,
    pub ok: bool,
    pub tokens: i64,
}

fn refused(custom_id: &Value, code: &str, message: String) -> Outcome {
    let v = json!({"id": ids::new(ids::REQUEST), "custom_id": custom_id, "response": null,
                   "error": {"code": code, "message": message}});
    let mut line = serde_json::to_vec(&v).unwrap_or_default();
    line.push(b'\n');
    Outcome {
        line,
        ok: false,
        tokens: 0,
    }
}

/// Runs `raw` (one line of the input file) against `endpoint`.
pub async fn run(router: &Router, endpoint: &str, raw: &[u8]) -> Outcome {
    let Ok(Value::Object(mut obj)) = serde_json::from_slice::<Value>(raw) else {
        return refused(
            &Value::Null,
            "invalid_json",
            "the line is not a JSON object".into(),
        );
    };
    let custom_id = match obj.get("custom_id") {
        Some(Value::String(s)) => Value::String(s.clone()),
        _ => {
            return refused(
                &Value::Null,
                "missing_custom_id",
                "the line needs a string `custom_id`".into(),
            )
        }
    };
    if obj.get("method").and_then(Value::as_str) != Some("POST") {
        return refused(
            &custom_id,
            "invalid_method",
            "the line's `method` must be \"POST\"".into(),
        );
    }
    if obj.get("url").and_then(Value::as_str) != Some(endpoint) {
        return refused(
            &custom_id,
            "mismatched_endpoint",
            format!("the line's `url` must be the batch's endpoint, {endpoint:?}"),
        );
    }
    let Some(Value::Object(mut body)) = obj.remove("body") else {
        return refused(
            &custom_id,
            "invalid_body",
            "the line's `body` must be a JSON object".into(),
        );
    };
    body.entry("priority").or_insert_with(|| "batch".into());
    let body = serde_json::to_vec(&body).unwrap_or_default();
    let mut server_tries = 0;
    let mut wait = Duration::from_millis(250);
    loop {
        let (status, request_id, tokens, answer) = call(router, endpoint, body.clone()).await;
        let transient =
            status == StatusCode::SERVICE_UNAVAILABLE || status == StatusCode::TOO_MANY_REQUESTS;
        if status.is_server_error() && !transient {
            server_tries += 1;
        }
        if (transient || status.is_server_error()) && server_tries < SERVER_TRIES {
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(10));
            continue;
        }
        return answered(&custom_id, status, &request_id, tokens, &answer);
    }
}

/// One call of a route: its status, request id, tokens and body.
async fn call(
    router: &Router,
    endpoint: &str,
    body: Vec<u8>,
) -> (StatusCode, String, i64, Vec<u8>) {
    let request = Request::post(endpoint)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body));
    let Ok(request) = request else {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            String::new(),
            0,
            b"{}".to_vec(),
        );
    };
    let Ok(response) = router.clone().oneshot(request).await;
    let status = response.status();
    let (parts, body) = response.into_parts();
    let text = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let request_id = text(crate::request::id::HEADER).unwrap_or_default();
    let tokens = text("x-compute-tokens")
        .and_then(|t| t.parse().ok())
        .unwrap_or(0);
    let answer = axum::body::to_bytes(body, MAX_RESPONSE)
        .await
        .map(|b| b.to_vec())
        .unwrap_or_else(|e| {
            format!("{{\"error\": {{\"message\": {:?}}}}}", e.to_string()).into_bytes()
        });
    (status, request_id, tokens, answer)
}

/// The output line of an answered request: the route's body as it came
/// (compact JSON, one line), spliced in rather than parsed again.
fn answered(
    custom_id: &Value,
    status: StatusCode,
    request_id: &str,
    tokens: i64,
    answer: &[u8],
) -> Outcome {
    let body_is_json =
        serde_json::from_slice::<serde::de::IgnoredAny>(answer).is_ok() && !answer.contains(&b'\n');
    let mut line = Vec::with_capacity(answer.len() + 160);
    line.extend_from_slice(b"{\"id\":");
    line.extend_from_slice(&serde_json::to_vec(&ids::new(ids::REQUEST)).unwrap_or_default());
    line.extend_from_slice(b",\"custom_id\":");
    line.extend_from_slice(&serde_json::to_vec(custom_id).unwrap_or_default());
    line.extend_from_slice(
        format!(
            ",\"response\":{{\"status_code\":{},\"request_id\":",
            status.as_u16()
        )
        .as_bytes(),
    );
    line.extend_from_slice(&serde_json::to_vec(request_id).unwrap_or_default());
    line.extend_from_slice(b",\"body\":");
    if body_is_json {
        line.extend_from_slice(answer);
    } else {
        line.extend_from_slice(
            &serde_json::to_vec(&String::from_utf8_lossy(answer)).unwrap_or_default(),
        );
    }
    line.extend_from_slice(b"},\"error\":null}\n");
    Outcome {
        line,
        ok: status.is_success(),
        tokens,
    }
}
