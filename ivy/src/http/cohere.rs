//! `POST /v1/rerank` in the shape Cohere's and Jina's rerank APIs use (and
//! vLLM and Infinity serve): `query`, `documents` (strings or `{"text"}`
//! objects), `top_n`, `return_documents`; the answer lists
//! `results[{index, relevance_score, document?}]` best first, with `usage`.
//! `POST /rerank` takes this body too when it carries `documents`.

use std::time::Instant;

use serde::Serialize;
use serde_json::Value;

use super::fields::{self, Object};
use super::respond::{json_timed, to_json};
use crate::error::ApiError;
use crate::pipeline::{self, Inputs, Job, Kind, Options};
use crate::request::id::RequestId;
use crate::state::AppState;

#[derive(Serialize)]
struct Body<'a> {
    id: String,
    model: &'a str,
    results: Vec<Ranked>,
    usage: Usage,
}

#[derive(Serialize)]
struct Ranked {
    index: usize,
    relevance_score: f32,
    #[serde(skip_serializing_if = "Option::is_none")]
    document: Option<Document>,
}

#[derive(Serialize)]
struct Document {
    text: String,
}

#[derive(Serialize)]
struct Usage {
    total_tokens: u64,
}

/// Runs a Cohere/Jina-shaped rerank body and renders the answer.
pub async fn rerank(
    state: &AppState,
    obj: Object,
    started: Instant,
) -> Result<axum::response::Response, ApiError> {
    let (pool, model) = fields::pool(state, &obj)?;
    let query = fields::string(&obj, "query")?;
    let documents = documents(&obj)?;
    let top_n = top_n(&obj)?.unwrap_or(documents.len());
    let return_documents = fields::opt_bool(&obj, "return_documents")?.unwrap_or(false);
    let echo = return_documents.then(|| documents.clone());
    let job = Job {
        pool,
        kind: Kind::Score,
        field: "documents",
        inputs: Inputs::Pairs {
            query,
            texts: documents,
        },
        options: Options {
            // As Cohere does: a long document is cut to fit, not refused.
            truncate: fields::opt_bool(&obj, "truncate")?.unwrap_or(true),
            direction: fields::direction(&obj)?,
            priority: fields::cohere_priority(&obj)?,
            ..Options::default()
        },
    };
    let out = pipeline::run(state, job, state.deadline()).await?;
    let results = out
        .ranks(echo)?
        .into_iter()
        .take(top_n)
        .map(|r| Ranked {
            index: r.index,
            relevance_score: r.score,
            document: r.text.map(|text| Document { text }),
        })
        .collect();
    let body = Body {
        id: RequestId::current()
            .map(|r| r.to_string())
            .unwrap_or_default(),
        model: &model,
        results,
        usage: Usage {
            total_tokens: out.tokens,
        },
    };
    Ok(json_timed(to_json(&body)?, &out, started))
}

/// `documents`: strings, or objects with a `text` field (Cohere's older
/// and Jina's form).
fn documents(obj: &Object) -> Result<Vec<String>, ApiError> {
    let Some(Value::Array(items)) = obj.get("documents") else {
        return Err(ApiError::schema(
            "documents",
            "`documents` must be an array of strings or {\"text\": …} objects",
        ));
    };
    if items.is_empty() {
        return Err(ApiError::Empty("`documents` is empty".into()));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, v)| match v {
            Value::String(s) => Ok(s.clone()),
            Value::Object(o) => match o.get("text") {
                Some(Value::String(s)) => Ok(s.clone()),
                _ => Err(ApiError::schema(
                    "documents",
                    format!("documents[{i}] has no string `text`"),
                )),
            },
            _ => Err(ApiError::schema(
                "documents",
                format!("documents[{i}] must be a string or a {{\"text\": …}} object"),
            )),
        })
        .collect()
}

fn top_n(obj: &Object) -> Result<Option<usize>, ApiError> {
    match obj.get("top_n") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 => Ok(Some(n as usize)),
            _ => Err(ApiError::schema(
                "top_n",
                format!("`top_n` must be a positive integer, got {v}"),
            )),
        },
    }
}
