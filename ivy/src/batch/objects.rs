//! The Batch API's objects as OpenAI renders them: the file object, the
//! batch object (status, timestamps, `request_counts`, `errors`) and lists.

use serde_json::{json, Map, Value};

use super::store::{BatchRow, FileRow, TIMES};

pub fn file(f: &FileRow) -> Value {
    json!({
        "id": f.id, "object": "file", "bytes": f.bytes, "created_at": f.created_at,
        "filename": f.filename, "purpose": f.purpose, "status": "processed",
        "status_details": null, "expires_at": null,
    })
}

pub fn batch(b: &BatchRow) -> Value {
    let mut o = Map::new();
    o.insert("id".into(), b.id.clone().into());
    o.insert("object".into(), "batch".into());
    o.insert("endpoint".into(), b.endpoint.clone().into());
    o.insert("model".into(), b.model.clone().into());
    o.insert(
        "errors".into(),
        b.errors
            .as_deref()
            .and_then(|e| serde_json::from_str(e).ok())
            .unwrap_or(Value::Null),
    );
    o.insert("input_file_id".into(), b.input_file_id.clone().into());
    o.insert(
        "completion_window".into(),
        b.completion_window.clone().into(),
    );
    o.insert("status".into(), b.status.clone().into());
    o.insert("output_file_id".into(), b.output_file_id.clone().into());
    o.insert("error_file_id".into(), b.error_file_id.clone().into());
    for (name, t) in TIMES.iter().zip(b.times) {
        o.insert((*name).into(), t.into());
    }
    o.insert(
        "request_counts".into(),
        json!({"total": b.total, "completed": b.completed, "failed": b.failed}),
    );
    o.insert(
        "usage".into(),
        json!({"input_tokens": b.input_tokens, "output_tokens": 0, "total_tokens": b.input_tokens,
               "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}),
    );
    o.insert(
        "metadata".into(),
        b.metadata
            .as_deref()
            .and_then(|m| serde_json::from_str(m).ok())
            .unwrap_or(Value::Null),
    );
    Value::Object(o)
}

/// OpenAI's cursor list: `rows` holds up to `limit + 1` items, the extra
/// one saying there are more.
pub fn list(mut rows: Vec<Value>, limit: usize) -> Value {
    let has_more = rows.len() > limit;
    rows.truncate(limit);
    let id = |v: Option<&Value>| v.and_then(|v| v.get("id")).cloned().unwrap_or(Value::Null);
    json!({"object": "list", "first_id": id(rows.first()), "last_id": id(rows.last()),
           "has_more": has_more, "data": rows})
}
