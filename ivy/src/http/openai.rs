//! `POST /v1/embeddings`, compatible with OpenAI's embeddings API.
//!
//! Beyond OpenAI's fields: `truncate` (default true here), `truncation_direction`
//! ("right" or "left") and `prompt_name`, as in text-embeddings-inference, and
//! quantized `encoding_format`s (`int8`, `uint8`, `binary`, `ubinary`: arrays
//! of integers, as `/v2/embed` makes them), and Jina's `late_chunking`
//! (`input` = one document's chunks; `pipeline/late_chunk.rs`).

use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use base64::Engine as _;
use serde::Serialize;
use serde_json::Value;

use super::body::{json_object, Body};
use super::fields::{self, F32s, Object, Rows};
use super::respond::{finish, json_timed, to_json, Api};
use crate::error::ApiError;
use crate::pipeline::quantize::{self, Precision, Quantized};
use crate::pipeline::{self, Job, Kind, Options, Output};
use crate::state::AppState;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Float,
    Base64,
    /// int8, uint8, binary or ubinary.
    Quantized(Precision),
}

pub async fn embeddings(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let started = Instant::now();
    let result = async {
        let obj = json_object(&state, &headers, body, "input")?;
        let format = format(&obj)?;
        let (pool, model) = fields::pool(&state, &obj)?;
        let options = Options {
            truncate: fields::opt_bool(&obj, "truncate")?.unwrap_or(true),
            direction: fields::direction(&obj)?,
            dimensions: fields::dimensions(&obj)?,
            prompt_name: fields::opt_string(&obj, "prompt_name")?,
            priority: fields::priority(&obj)?,
            // Several vectors per input only as float arrays.
            long_inputs: fields::long_inputs(
                &obj,
                state.config.long_inputs,
                format == Format::Float,
            )?,
            late_chunking: fields::late_chunking(&obj)?,
            ..Options::default()
        };
        let ranges = match format {
            Format::Quantized(p) => quantize::ranges_for(&state, &pool, &[p], &options).await?,
            _ => None,
        };
        let job = Job {
            pool,
            kind: Kind::Dense,
            inputs: fields::inputs(&obj, "input")?,
            field: "input",
            options,
        };
        let out = pipeline::run(&state, job, state.deadline()).await?;
        let quantized = match format {
            Format::Quantized(p) => quantize::rows(&out, p, ranges.as_deref()),
            _ => Vec::new(),
        };
        Ok(json_timed(
            render(&out, format, quantized, &model)?,
            &out,
            started,
        ))
    }
    .await;
    finish(&state, Api::OpenAi, "embeddings", result)
}

/// `POST /v1/rerank`: the Cohere/Jina shape (see `cohere.rs`), with
/// OpenAI-shaped errors like every `/v1` route.
pub async fn rerank(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let started = Instant::now();
    let result = async {
        let obj = json_object(&state, &headers, body, "query")?;
        super::cohere::rerank(&state, obj, started).await
    }
    .await;
    finish(&state, Api::OpenAi, "rerank", result)
}

/// `GET /v1/models`: every pool's served names, in OpenAI's list shape,
/// the default model's first.
pub async fn models(State(state): State<AppState>) -> Response {
    let pools = state.pools.all();
    let default = state.pools.default_pool();
    let ordered: Vec<&Arc<crate::upstream::pools::Pool>> = default
        .iter()
        .chain(
            pools
                .iter()
                .filter(|p| !default.as_ref().is_some_and(|d| Arc::ptr_eq(d, p))),
        )
        .collect();
    // Each model, then its LoRA adapters with their parent (vLLM's shape).
    let mut data: Vec<Value> = Vec::new();
    for pool in ordered {
        let names = pool.served_names();
        let parent = names.first().cloned().unwrap_or_default();
        for id in &names {
            data.push(serde_json::json!({
                "id": id, "object": "model", "created": state.started_unix, "owned_by": "tulip-rose",
                "root": id, "parent": null,
            }));
        }
        for (id, a) in pool.adapters.list() {
            data.push(serde_json::json!({
                "id": id, "object": "model", "created": state.started_unix, "owned_by": "tulip-rose",
                "root": a.path, "parent": parent,
            }));
        }
    }
    let result = if data.is_empty() {
        Err(crate::upstream::no_replica(&state.replicas))
    } else {
        to_json(&serde_json::json!({ "object": "list", "data": data })).map(super::respond::json)
    };
    finish(&state, Api::OpenAi, "models", result)
}

fn format(obj: &Object) -> Result<Format, ApiError> {
    match obj.get("encoding_format") {
        None | Some(Value::Null) => Ok(Format::Float),
        Some(Value::String(s)) if s == "float" => Ok(Format::Float),
        Some(Value::String(s)) if s == "base64" => Ok(Format::Base64),
        Some(Value::String(s)) if Precision::parse(s).is_some() => {
            Ok(Format::Quantized(Precision::parse(s).unwrap_or(Precision::Float)))
        }
        Some(other) => Err(ApiError::schema(
            "encoding_format",
            format!("`encoding_format` must be \"float\", \"base64\", \"int8\", \"uint8\", \"binary\" or \"ubinary\", got {other}"),
        )),
    }
}

#[derive(Serialize)]
struct EmbeddingList<'a> {
    object: &'static str,
    data: Vec<Item<'a>>,
    model: &'a str,
    usage: Usage,
}

#[derive(Serialize)]
struct Item<'a> {
    object: &'static str,
    index: usize,
    embedding: Vector<'a>,
}

#[derive(Serialize)]
struct Usage {
    prompt_tokens: u64,
    total_tokens: u64,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Vector<'a> {
    Float(F32s<'a>),
    Base64(String),
    Quantized(Quantized),
    /// `long_inputs: "windows"`: one vector per window.
    Windows(Rows<'a>),
}

fn render(
    out: &Output,
    format: Format,
    quantized: Vec<Quantized>,
    model: &str,
) -> Result<Vec<u8>, ApiError> {
    let mut quantized = quantized.into_iter();
    let data = (0..out.sequences)
        .map(|i| Item {
            object: "embedding",
            index: i,
            embedding: match format {
                Format::Float if !out.row_counts().is_empty() => Vector::Windows(Rows {
                    data: out.vectors(i),
                    dim: out.dim,
                }),
                Format::Float => Vector::Float(F32s(out.row(i))),
                Format::Base64 => {
                    Vector::Base64(base64::engine::general_purpose::STANDARD.encode(out.row(i)))
                }
                Format::Quantized(_) => {
                    Vector::Quantized(quantized.next().unwrap_or(Quantized::Unsigned(Vec::new())))
                }
            },
        })
        .collect();
    to_json(&EmbeddingList {
        object: "list",
        data,
        model,
        usage: Usage {
            prompt_tokens: out.tokens,
            total_tokens: out.tokens,
        },
    })
}
