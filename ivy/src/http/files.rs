//! The Batch API's files, as OpenAI's `/v1/files`: upload (multipart,
//! `purpose=batch`), list, retrieve, download and delete. A file belongs to
//! the API key that uploaded it; another key is told it does not exist.
//! An upload is counted as it streams to disk and refused with 413 past
//! `--batch-max-file-bytes`, before anything is kept.

use std::sync::Arc;

use axum::extract::{Multipart, Path, Query, State};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde::Deserialize;

use super::respond::{finish, json, to_json, Api};
use crate::batch::{ids, objects, store::FileRow, Batches};
use crate::error::ApiError;
use crate::request::auth::Owner;
use crate::state::AppState;

/// Longest file name kept (longer ones are cut, on a character boundary).
const MAX_FILENAME: usize = 255;

/// The Batch API's store, or why there is none.
pub fn batches(state: &AppState) -> Result<Arc<Batches>, ApiError> {
    state.batches.clone().ok_or_else(|| {
        ApiError::RouteNotFound(
            "the Batch API is off on this Ivy: start it with --batch-dir (IVY_BATCH_DIR), or --batch-database-url and --batch-object-store-url".into(),
        )
    })
}

pub fn not_found(kind: &str, id: &str) -> ApiError {
    // An id of the wrong shape is echoed only as its length.
    let shown = if id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        id.to_string()
    } else {
        format!("<{} bytes>", id.len())
    };
    ApiError::NotFound(format!("No such {kind} object: {shown}"))
}

/// The file `id` of `owner`, or 404.
pub async fn owned_file(b: &Batches, owner: &Owner, id: &str) -> Result<FileRow, ApiError> {
    if !ids::valid(ids::FILE, id) {
        return Err(not_found("File", id));
    }
    b.store
        .file(owner.0.clone(), id.to_string())
        .await?
        .ok_or_else(|| not_found("File", id))
}

pub async fn upload(
    State(state): State<AppState>,
    Extension(owner): Extension<Owner>,
    multipart: Result<Multipart, axum::extract::multipart::MultipartRejection>,
) -> Response {
    let result = async {
        let b = batches(&state)?;
        let multipart = multipart.map_err(|e| {
            ApiError::UnsupportedMediaType(format!(
                "POST /v1/files takes multipart/form-data with fields `purpose` and `file`: {e}"
            ))
        })?;
        let row = receive(&b, multipart).await?;
        b.store.add_file(owner.0.clone(), row.clone()).await?;
        Ok(json(to_json(&objects::file(&row))?))
    }
    .await;
    finish(&state, Api::OpenAi, "files", result)
}

/// Streams the form's file into the store, bounded; kept only once the
/// whole form is read and valid.
async fn receive(b: &Batches, mut form: Multipart) -> Result<FileRow, ApiError> {
    let limit = b.config.batch_max_file_bytes;
    let id = ids::new(ids::FILE);
    let mut purpose = None;
    let mut file: Option<(String, u64)> = None;
    let mut upload = None;
    let outcome = async {
        while let Some(mut field) = form.next_field().await.map_err(malformed)? {
            match field.name() {
                Some("purpose") => purpose = Some(field.text().await.map_err(malformed)?),
                Some("file") if upload.is_none() => {
                    let name = field.file_name().unwrap_or("upload.jsonl").to_string();
                    let out = upload.insert(b.blobs.upload(&id).await?);
                    let mut n = 0u64;
                    while let Some(chunk) = field.chunk().await.map_err(malformed)? {
                        n += chunk.len() as u64;
                        if n > limit {
                            return Err(ApiError::FileTooLarge(format!(
                                "the file is larger than {limit} bytes (Ivy's --batch-max-file-bytes); split it"
                            )));
                        }
                        out.write(&chunk).await?;
                    }
                    file = Some((name, n));
                }
                Some("file") => return Err(ApiError::schema("file", "the form has two `file` fields")),
                _ => {}
            }
        }
        let Some((name, bytes)) = file.take() else {
            return Err(ApiError::schema("file", "the form has no `file` field"));
        };
        match purpose.as_deref() {
            Some("batch") => {}
            Some(other) => {
                return Err(ApiError::validation(
                    "purpose",
                    format!("purpose {other:?} is not served here: Ivy keeps files for the Batch API only (purpose \"batch\")"),
                ))
            }
            None => return Err(ApiError::schema("purpose", "the form has no `purpose` field (\"batch\")")),
        }
        if let Some(u) = upload.take() {
            u.commit().await?;
        }
        Ok(FileRow {
            id: id.clone(),
            filename: cut(&name, MAX_FILENAME),
            purpose: "batch".into(),
            bytes: bytes as i64,
            created_at: crate::batch::clock::now_s(),
        })
    }
    .await;
    if let Some(u) = upload {
        u.abort().await;
    }
    outcome
}

fn malformed(e: axum::extract::multipart::MultipartError) -> ApiError {
    ApiError::Malformed(format!(
        "could not read the multipart form: {}",
        e.body_text()
    ))
}

fn cut(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// A list route's query, or why not; and its `limit` (default `default`,
/// 1 to `max`).
pub fn page<Q>(
    query: Result<Query<Q>, axum::extract::rejection::QueryRejection>,
    limit: impl FnOnce(&Q) -> Option<i64>,
    default: i64,
    max: i64,
) -> Result<(Q, i64), ApiError> {
    let Query(q) = query.map_err(|e| ApiError::schema("query", e.body_text()))?;
    let n = limit(&q).unwrap_or(default);
    if !(1..=max).contains(&n) {
        return Err(ApiError::validation(
            "limit",
            format!("`limit` must be between 1 and {max}"),
        ));
    }
    Ok((q, n))
}

#[derive(Deserialize)]
pub struct ListQuery {
    purpose: Option<String>,
    after: Option<String>,
    limit: Option<i64>,
    order: Option<String>,
}

pub async fn list(
    State(state): State<AppState>,
    Extension(owner): Extension<Owner>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let result = async {
        let b = batches(&state)?;
        let (q, limit) = page(query, |q: &ListQuery| q.limit, 10_000, 10_000)?;
        let asc = match q.order.as_deref() {
            None | Some("desc") => false,
            Some("asc") => true,
            Some(_) => {
                return Err(ApiError::validation(
                    "order",
                    "`order` must be \"asc\" or \"desc\"",
                ))
            }
        };
        let rows = b
            .store
            .files(owner.0.clone(), q.purpose, q.after, limit, asc)
            .await?;
        let rows = rows.iter().map(objects::file).collect();
        Ok(json(to_json(&objects::list(rows, limit as usize))?))
    }
    .await;
    finish(&state, Api::OpenAi, "files", result)
}

pub async fn get(
    State(state): State<AppState>,
    Extension(owner): Extension<Owner>,
    Path(id): Path<String>,
) -> Response {
    let result = async {
        let b = batches(&state)?;
        Ok(json(to_json(&objects::file(
            &owned_file(&b, &owner, &id).await?,
        ))?))
    }
    .await;
    finish(&state, Api::OpenAi, "file", result)
}

pub async fn content(
    State(state): State<AppState>,
    Extension(owner): Extension<Owner>,
    Path(id): Path<String>,
) -> Response {
    let result = async {
        let b = batches(&state)?;
        let f = owned_file(&b, &owner, &id).await?;
        let mut response = b.blobs.stream(&f.id).await?.into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        );
        if let Ok(v) = HeaderValue::from_str(&f.bytes.to_string()) {
            response.headers_mut().insert(header::CONTENT_LENGTH, v);
        }
        Ok(response)
    }
    .await;
    finish(&state, Api::OpenAi, "file_content", result)
}

pub async fn delete(
    State(state): State<AppState>,
    Extension(owner): Extension<Owner>,
    Path(id): Path<String>,
) -> Response {
    let result = async {
        let b = batches(&state)?;
        let f = owned_file(&b, &owner, &id).await?;
        match b.store.delete_file(owner.0.clone(), f.id.clone()).await? {
            Ok(true) => {}
            Ok(false) => return Err(not_found("File", &id)),
            Err(batch) => {
                return Err(ApiError::validation(
                    "file_id",
                    format!("{id} is the input of {batch}, which has not ended; cancel it or wait"),
                ))
            }
        }
        b.blobs.delete_file(&f.id).await;
        Ok(json(to_json(
            &serde_json::json!({"id": f.id, "object": "file", "deleted": true}),
        )?))
    }
    .await;
    finish(&state, Api::OpenAi, "file", result)
}
