//! The Batch API's batches, as OpenAI's `/v1/batches`: create over an
//! uploaded file, retrieve, list (newest first, `after`/`limit`) and
//! cancel. Creating checks what can be checked at once (the file, the
//! endpoint, the window, the metadata); the file's lines are checked by the
//! first Ivy to take the batch (`batch/validate.rs`), as OpenAI's
//! `validating` state does.

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::Extension;
use serde::Deserialize;
use serde_json::Value;

use super::body::{json_object, Body};
use super::fields;
use super::files::{batches, not_found, owned_file, page};
use super::respond::{finish, json, to_json, Api};
use crate::batch::{ids, objects, store::NewBatch, window_seconds, Batches, ENDPOINTS};
use crate::error::ApiError;
use crate::request::auth::Owner;
use crate::state::AppState;

pub async fn create(
    State(state): State<AppState>,
    Extension(owner): Extension<Owner>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let result = async {
        let b = batches(&state)?;
        let obj = json_object(&state, &headers, body, "input_file_id")?;
        let input = fields::opt_string(&obj, "input_file_id")?
            .ok_or_else(|| ApiError::schema("input_file_id", "`input_file_id` is required: the id of a file uploaded with purpose \"batch\""))?;
        let endpoint = fields::opt_string(&obj, "endpoint")?
            .ok_or_else(|| ApiError::schema("endpoint", "`endpoint` is required"))?;
        if !ENDPOINTS.contains(&endpoint.as_str()) {
            return Err(ApiError::validation(
                "endpoint",
                format!("endpoint {endpoint:?} is not served in batches here; one of {}", ENDPOINTS.join(", ")),
            ));
        }
        let window = fields::opt_string(&obj, "completion_window")?.unwrap_or_else(|| "24h".into());
        let window_s = window_seconds(&window).ok_or_else(|| {
            ApiError::validation("completion_window", format!("completion_window {window:?} must be hours, 1h to 720h (e.g. \"24h\")"))
        })?;
        let metadata = metadata(obj.get("metadata"))?;
        let file = owned_file(&b, &owner, &input).await?;
        if file.purpose != "batch" {
            return Err(ApiError::validation(
                "input_file_id",
                format!("{input} has purpose {:?}; a batch reads a file uploaded with purpose \"batch\"", file.purpose),
            ));
        }
        let id = ids::new(ids::BATCH);
        b.store
            .add_batch(NewBatch {
                id: id.clone(),
                owner: owner.0.clone(),
                endpoint,
                input_file_id: input,
                completion_window: window,
                window_s,
                metadata,
            })
            .await?;
        b.wake();
        batch_object(&b, &owner, &id).await
    }
    .await;
    finish(&state, Api::OpenAi, "batches", result)
}

/// OpenAI's metadata: up to 16 string pairs, keys up to 64 characters,
/// values up to 512.
fn metadata(v: Option<&Value>) -> Result<Option<String>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m)) => {
            let ok = m.len() <= 16
                && m.iter().all(|(k, v)| {
                    k.chars().count() <= 64 && v.as_str().is_some_and(|s| s.chars().count() <= 512)
                });
            if ok {
                Ok(Some(Value::Object(m.clone()).to_string()))
            } else {
                Err(ApiError::validation(
                    "metadata",
                    "`metadata` holds up to 16 pairs of strings: keys up to 64 characters, values up to 512",
                ))
            }
        }
        Some(_) => Err(ApiError::schema(
            "metadata",
            "`metadata` must be an object of strings",
        )),
    }
}

/// The batch `id` of `owner` as its object, or 404.
async fn batch_object(b: &Batches, owner: &Owner, id: &str) -> Result<Response, ApiError> {
    if !ids::valid(ids::BATCH, id) {
        return Err(not_found("Batch", id));
    }
    let row = b
        .store
        .batch(owner.0.clone(), id.to_string())
        .await?
        .ok_or_else(|| not_found("Batch", id))?;
    Ok(json(to_json(&objects::batch(&row))?))
}

pub async fn get(
    State(state): State<AppState>,
    Extension(owner): Extension<Owner>,
    Path(id): Path<String>,
) -> Response {
    let result = async { batch_object(&*batches(&state)?, &owner, &id).await }.await;
    finish(&state, Api::OpenAi, "batch", result)
}

#[derive(Deserialize)]
pub struct ListQuery {
    after: Option<String>,
    limit: Option<i64>,
}

pub async fn list(
    State(state): State<AppState>,
    Extension(owner): Extension<Owner>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let result = async {
        let b = batches(&state)?;
        let (q, limit) = page(query, |q: &ListQuery| q.limit, 20, 100)?;
        let rows = b.store.batches(owner.0.clone(), q.after, limit).await?;
        let rows = rows.iter().map(objects::batch).collect();
        Ok(json(to_json(&objects::list(rows, limit as usize))?))
    }
    .await;
    finish(&state, Api::OpenAi, "batches", result)
}

pub async fn cancel(
    State(state): State<AppState>,
    Extension(owner): Extension<Owner>,
    Path(id): Path<String>,
) -> Response {
    let result = async {
        let b = batches(&state)?;
        if !ids::valid(ids::BATCH, &id) {
            return Err(not_found("Batch", &id));
        }
        match b.store.cancel(owner.0.clone(), id.clone()).await? {
            None => return Err(not_found("Batch", &id)),
            Some(Err(status)) => {
                return Err(ApiError::validation(
                    "batch_id",
                    format!("{id} cannot be cancelled: its status is {status:?}"),
                ))
            }
            Some(Ok(())) => b.wake(),
        }
        batch_object(&b, &owner, &id).await
    }
    .await;
    finish(&state, Api::OpenAi, "batch_cancel", result)
}
