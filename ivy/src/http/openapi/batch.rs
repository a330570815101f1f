//! The Batch API's part of `/openapi.json` (`/v1/files`, `/v1/batches`):
//! its operations and schemas, in OpenAI's shapes (docs/batch.md).

use serde_json::{json, Map, Value};

use super::schema;

fn answer(name: &str, what: &str) -> Value {
    json!({ "description": what, "content": { "application/json": { "schema": schema(name) } } })
}

/// The statuses a Batch API route answers besides 200: `extra` ones on top
/// of those every one of them may (401; 404 for what the key does not own,
/// or the Batch API being off; 500).
fn responses(ok: Value, extra: &[(&str, &str)]) -> Value {
    let mut r = Map::new();
    r.insert("200".into(), ok);
    let always = [
        ("401", "Missing or wrong API key"),
        (
            "404",
            "No such file or batch for this API key, or the Batch API is off (no --batch-dir)",
        ),
        ("500", "Internal error (the message carries the request id)"),
    ];
    for (code, what) in always.iter().chain(extra) {
        r.insert((*code).into(), answer("OpenAiError", what));
    }
    Value::Object(r)
}

fn op(summary: &str, ok: Value, extra: &[(&str, &str)]) -> Value {
    json!({ "summary": summary, "security": [{ "bearer": [] }, {}], "responses": responses(ok, extra) })
}

fn id_param(name: &str) -> Value {
    json!([{ "name": name, "in": "path", "required": true, "schema": { "type": "string" } }])
}

const QUERY_ERRORS: [(&str, &str); 1] = [("422", "A bad query parameter (limit, order)")];

pub(super) fn paths() -> Map<String, Value> {
    let mut upload = op(
        "Upload a JSONL file of batch requests (OpenAI's files API; purpose `batch`)",
        answer("BatchFile", "The file object"),
        &[
            ("400", "The multipart form could not be read"),
            ("408", "The body was not received within the body timeout"),
            ("413", "The file is larger than --batch-max-file-bytes"),
            ("415", "Not multipart/form-data"),
            ("422", "No `file` field, or a purpose other than `batch`"),
        ],
    );
    upload["requestBody"] = json!({ "required": true, "content": { "multipart/form-data": { "schema": {
        "type": "object", "required": ["file", "purpose"], "properties": {
            "file": { "type": "string", "format": "binary" },
            "purpose": { "type": "string", "enum": ["batch"] } } } } } });
    let mut list_files = op(
        "The caller's files, newest first",
        answer("BatchFileList", "A page of files"),
        &QUERY_ERRORS,
    );
    list_files["parameters"] = json!([
        { "name": "purpose", "in": "query", "required": false, "schema": { "type": "string" } },
        { "name": "after", "in": "query", "required": false, "schema": { "type": "string" } },
        { "name": "limit", "in": "query", "required": false, "schema": { "type": "integer", "minimum": 1, "maximum": 10000 } },
        { "name": "order", "in": "query", "required": false, "schema": { "type": "string", "enum": ["asc", "desc"] } } ]);
    let mut get_file = op("A file object", answer("BatchFile", "The file object"), &[]);
    get_file["parameters"] = id_param("file_id");
    let mut delete_file = op(
        "Delete a file",
        answer("BatchFileDeleted", "Deleted"),
        &[("422", "A batch that has not ended reads this file")],
    );
    delete_file["parameters"] = id_param("file_id");
    let mut content = op(
        "A file's bytes",
        json!({ "description": "The file, streamed", "content": { "application/octet-stream": { "schema": { "type": "string", "format": "binary" } } } }),
        &[],
    );
    content["parameters"] = id_param("file_id");
    let mut create = op(
        "Create a batch over an uploaded file (OpenAI's batches API); it runs at priority batch",
        answer("Batch", "The batch, validating"),
        &[
            ("400", "Body is not JSON"),
            ("408", "The body was not received within the body timeout"),
            ("413", "Body larger than --max-body-bytes"),
            ("415", "Content-Type is not application/json"),
            ("422", "A missing or bad field: endpoint, completion_window, metadata, or a file that is not for batches"),
        ],
    );
    create["requestBody"] = json!({ "required": true, "content": { "application/json": { "schema": schema("CreateBatchRequest") } } });
    let mut list_batches = op(
        "The caller's batches, newest first",
        answer("BatchList", "A page of batches"),
        &QUERY_ERRORS,
    );
    list_batches["parameters"] = json!([
        { "name": "after", "in": "query", "required": false, "schema": { "type": "string" } },
        { "name": "limit", "in": "query", "required": false, "schema": { "type": "integer", "minimum": 1, "maximum": 100 } } ]);
    let mut get_batch = op("A batch object", answer("Batch", "The batch"), &[]);
    get_batch["parameters"] = id_param("batch_id");
    let mut cancel = op(
        "Cancel a batch: it stops within seconds; what finished stays in its output",
        answer("Batch", "The batch, cancelling"),
        &[("422", "The batch has already ended or is finalizing")],
    );
    cancel["parameters"] = id_param("batch_id");
    let mut paths = Map::new();
    paths.insert(
        "/v1/files".into(),
        json!({ "post": upload, "get": list_files }),
    );
    paths.insert(
        "/v1/files/{file_id}".into(),
        json!({ "get": get_file, "delete": delete_file }),
    );
    paths.insert(
        "/v1/files/{file_id}/content".into(),
        json!({ "get": content }),
    );
    paths.insert(
        "/v1/batches".into(),
        json!({ "post": create, "get": list_batches }),
    );
    paths.insert("/v1/batches/{batch_id}".into(), json!({ "get": get_batch }));
    paths.insert(
        "/v1/batches/{batch_id}/cancel".into(),
        json!({ "post": cancel }),
    );
    paths
}

pub(super) fn schemas() -> Value {
    let ts = json!({ "type": ["integer", "null"] });
    let list = |item: &str| {
        json!({ "type": "object", "required": ["object", "data", "has_more"], "properties": {
        "object": { "type": "string", "enum": ["list"] }, "data": { "type": "array", "items": schema(item) },
        "first_id": { "type": ["string", "null"] }, "last_id": { "type": ["string", "null"] },
        "has_more": { "type": "boolean" } } })
    };
    json!({
        "BatchFile": { "type": "object", "required": ["id", "object", "bytes", "created_at", "filename", "purpose"], "properties": {
            "id": { "type": "string" }, "object": { "type": "string", "enum": ["file"] },
            "bytes": { "type": "integer" }, "created_at": { "type": "integer" }, "filename": { "type": "string" },
            "purpose": { "type": "string", "enum": ["batch", "batch_output"] }, "status": { "type": "string" } } },
        "BatchFileList": list("BatchFile"),
        "BatchFileDeleted": { "type": "object", "required": ["id", "object", "deleted"], "properties": {
            "id": { "type": "string" }, "object": { "type": "string" }, "deleted": { "type": "boolean" } } },
        "CreateBatchRequest": { "type": "object", "required": ["input_file_id", "endpoint"], "properties": {
            "input_file_id": { "type": "string" },
            "endpoint": { "type": "string", "enum": crate::batch::ENDPOINTS },
            "completion_window": { "type": "string", "default": "24h", "description": "<hours>h, 1h to 720h" },
            "metadata": { "type": ["object", "null"], "additionalProperties": { "type": "string" } } } },
        "Batch": { "type": "object", "required": ["id", "object", "endpoint", "input_file_id", "status", "created_at", "request_counts"], "properties": {
            "id": { "type": "string" }, "object": { "type": "string", "enum": ["batch"] },
            "endpoint": { "type": "string" }, "model": { "type": ["string", "null"] },
            "input_file_id": { "type": "string" }, "completion_window": { "type": "string" },
            "status": { "type": "string", "enum": ["validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled"] },
            "output_file_id": { "type": ["string", "null"] }, "error_file_id": { "type": ["string", "null"] },
            "errors": { "type": ["object", "null"] },
            "created_at": { "type": "integer" }, "in_progress_at": ts, "expires_at": ts, "finalizing_at": ts,
            "completed_at": ts, "failed_at": ts, "expired_at": ts, "cancelling_at": ts, "cancelled_at": ts,
            "request_counts": { "type": "object", "required": ["total", "completed", "failed"], "properties": {
                "total": { "type": "integer" }, "completed": { "type": "integer" }, "failed": { "type": "integer" } } },
            "usage": { "type": "object" }, "metadata": { "type": ["object", "null"] } } },
        "BatchList": list("Batch"),
    })
}
