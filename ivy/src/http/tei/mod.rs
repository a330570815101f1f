//! The routes compatible with Hugging Face text-embeddings-inference 1.9:
//! `/embed`, `/embed_sparse`, `/embed_all`, `/rerank`, `/similarity`,
//! `/tokenize`, `/decode`, with TEI's request fields, response shapes,
//! defaults (`truncate` from `--auto-truncate`, `normalize` true,
//! `skip_special_tokens` true) and error shape `{"error", "error_type"}`.
//! TEI serves one model; here every route also takes an optional `model`
//! (default: `--default-model`, else the first model to come up).

use std::time::Instant;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use serde::Serialize;

mod predict;
mod tokens;

pub use self::predict::predict;
pub use self::tokens::{decode, tokenize};
use super::body::{json_object, Body};
use super::fields::{self, Object, Rows};
use super::respond::{finish, json_timed, to_json, Api};
use crate::error::ApiError;
use crate::pipeline::{self, floats, Inputs, Job, Kind, Options, Output};
use crate::state::AppState;
use crate::upstream::pools::Pool;

pub async fn embed(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    embedding(
        state,
        headers,
        body,
        |_| Kind::Dense,
        "embed",
        |out| {
            if !out.row_counts().is_empty() {
                // `long_inputs: "windows"`: each input's window vectors.
                return to_json(&multi_rows(out));
            }
            to_json(&Rows {
                data: out.data(),
                dim: out.dim,
            })
        },
    )
    .await
}

/// Several vectors per input, as `[[[float]]]`.
fn multi_rows(out: &Output) -> Vec<Rows<'_>> {
    (0..out.sequences)
        .map(|i| Rows {
            data: out.vectors(i),
            dim: out.dim,
        })
        .collect()
}

pub async fn embed_sparse(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    embedding(
        state,
        headers,
        body,
        |_| Kind::Sparse,
        "embed_sparse",
        |out| {
            let all: Vec<Vec<SparseValue>> = (0..out.sequences)
                .map(|i| {
                    let (ids, weights) = out.sparse(i);
                    ids.iter()
                        .zip(floats(weights))
                        .map(|(&index, value)| SparseValue { index, value })
                        .collect()
                })
                .collect();
            to_json(&all)
        },
    )
    .await
}

pub async fn embed_all(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let kind = |pool: &Pool| pipeline::embed_all_kind(pool.info().as_deref());
    embedding(state, headers, body, kind, "embed_all", |out| {
        to_json(&multi_rows(out))
    })
    .await
}

#[derive(Serialize)]
struct SparseValue {
    index: u32,
    value: f32,
}

/// The three embedding routes: same fields (dense adds `normalize` and
/// `dimensions`), different outputs; `kind` from the model's pool.
async fn embedding(
    state: AppState,
    headers: HeaderMap,
    body: Body,
    kind: fn(&Pool) -> Kind,
    endpoint: &'static str,
    render: fn(&Output) -> Result<Vec<u8>, ApiError>,
) -> Response {
    let started = Instant::now();
    let result = async {
        let obj = json_object(&state, &headers, body, "inputs")?;
        let (pool, _) = fields::pool(&state, &obj)?;
        let kind = kind(&pool);
        let mut options = common_options(&state, &obj)?;
        options.prompt_name = fields::opt_string(&obj, "prompt_name")?;
        // Ours, as on `/v1/embeddings`: `inputs` = one document's chunks.
        options.late_chunking = fields::late_chunking(&obj)?;
        if kind == Kind::Dense {
            options.normalize = Some(fields::opt_bool(&obj, "normalize")?.unwrap_or(true));
            options.dimensions = fields::dimensions(&obj)?;
            options.long_inputs = fields::long_inputs(&obj, state.config.long_inputs, true)?;
        }
        let job = Job {
            pool,
            kind,
            inputs: fields::inputs(&obj, "inputs")?,
            field: "inputs",
            options,
        };
        let out = pipeline::run(&state, job, state.deadline()).await?;
        Ok(json_timed(render(&out)?, &out, started))
    }
    .await;
    finish(&state, Api::Tei, endpoint, result)
}

/// `POST /similarity`: the cosine similarity of `inputs.source_sentence`
/// to each of `inputs.sentences`, in order (TEI's and the Hub's
/// sentence-similarity task).
pub async fn similarity(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let started = Instant::now();
    let result = async {
        let obj = json_object(&state, &headers, body, "inputs")?;
        let inputs = match obj.get("inputs") {
            Some(serde_json::Value::Object(o)) => o,
            _ => {
                return Err(ApiError::schema(
                    "inputs",
                    "`inputs` must be an object with `source_sentence` and `sentences`",
                ))
            }
        };
        let (pool, _) = fields::pool(&state, &obj)?;
        let source = fields::string(inputs, "source_sentence")?;
        let sentences = fields::strings(inputs, "sentences")?;
        let mut options = common_options(&state, &obj)?;
        options.prompt_name = fields::opt_string(&obj, "prompt_name")?;
        options.normalize = Some(true);
        options.long_inputs = fields::long_inputs(&obj, state.config.long_inputs, false)?;
        let job = Job {
            pool,
            kind: Kind::Dense,
            inputs: Inputs::Texts([vec![source], sentences].concat()),
            field: "inputs",
            options,
        };
        let out = pipeline::run(&state, job, state.deadline()).await?;
        let source: Vec<f32> = floats(out.row(0)).collect();
        // The rows are L2-normalised: the dot product is the cosine.
        let scores: Vec<f32> = (1..out.sequences)
            .map(|i| floats(out.row(i)).zip(&source).map(|(a, b)| a * b).sum())
            .collect();
        Ok(json_timed(to_json(&scores)?, &out, started))
    }
    .await;
    finish(&state, Api::Tei, "similarity", result)
}

pub async fn rerank(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let started = Instant::now();
    let result = async {
        let obj = json_object(&state, &headers, body, "inputs")?;
        if obj.contains_key("documents") {
            // The Cohere/Jina body, as /v1/rerank takes it.
            return super::cohere::rerank(&state, obj, started).await;
        }
        let (pool, _) = fields::pool(&state, &obj)?;
        let query = fields::string(&obj, "query")?;
        let texts = match obj.get("texts") {
            Some(serde_json::Value::String(_)) => {
                return Err(ApiError::schema(
                    "texts",
                    "`texts` must be an array of strings",
                ));
            }
            _ => fields::strings(&obj, "texts")?,
        };
        let return_text = fields::opt_bool(&obj, "return_text")?.unwrap_or(false);
        let echo = return_text.then(|| texts.clone());
        let mut options = common_options(&state, &obj)?;
        options.raw_scores = fields::opt_bool(&obj, "raw_scores")?.unwrap_or(false);
        let job = Job {
            pool,
            kind: Kind::Score,
            inputs: Inputs::Pairs { query, texts },
            field: "texts",
            options,
        };
        let out = pipeline::run(&state, job, state.deadline()).await?;
        Ok(json_timed(to_json(&out.ranks(echo)?)?, &out, started))
    }
    .await;
    finish(&state, Api::Tei, "rerank", result)
}

fn common_options(state: &AppState, obj: &Object) -> Result<Options, ApiError> {
    Ok(Options {
        truncate: fields::opt_bool(obj, "truncate")?.unwrap_or(state.config.auto_truncate),
        direction: fields::direction(obj)?,
        priority: fields::priority(obj)?,
        ..Options::default()
    })
}
