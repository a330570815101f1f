//! `POST /v2/embed` in the shape of Cohere's v2 embed API: `texts`, or
//! `images` (data URIs), or `inputs` (each one `content` item, text or
//! `image_url`; an image model embeds text and images apart), `input_type`, `embedding_types` (`float`, `int8`, `uint8`, `binary`,
//! `ubinary`; default `float`), `output_dimension`, `truncate`
//! (`NONE`/`START`/`END`, default `END`), optional `model` (checked against
//! the served names) → `{"id", "embeddings": {type: [[…]]}, "texts",
//! "meta": {"api_version", "billed_units"}, "response_type"}`. Quantized
//! types follow sentence-transformers' `quantize_embeddings` (see
//! `pipeline/quantize.rs`). Errors `{"id", "message"}` as Cohere's.

use std::time::Instant;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use ivy_tokenizer::Direction;
use serde::Serialize;
use serde_json::{Map, Value};

use super::body::{json_object, Body};
use super::fields::{self, F32s, Object};
use super::image_input::image;
use super::respond::{finish, json_timed, to_json, Api};
use crate::error::ApiError;
use crate::pipeline::quantize::{self, Precision};
use crate::pipeline::{self, Inputs, Item, Job, Kind, Options};
use crate::request::id::RequestId;
use crate::state::AppState;
use crate::upstream::pools::Pool;

pub async fn embed(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let started = Instant::now();
    let result = async {
        let obj = json_object(&state, &headers, body, "texts")?;
        let (pool, _) = fields::pool(&state, &obj)?;
        let (field, inputs, texts) = inputs(&obj)?;
        let types = embedding_types(&obj)?;
        let (truncate, direction) = truncate(&obj)?;
        let options = Options {
            truncate,
            direction,
            dimensions: output_dimension(&obj)?,
            prompt_name: prompt_name(&state, &pool, &obj)?,
            long_inputs: fields::long_inputs(&obj, state.config.long_inputs, false)?,
            priority: fields::cohere_priority(&obj)?,
            // Ours, as on `/v1/embeddings`: `texts` = one document's chunks.
            late_chunking: fields::late_chunking(&obj)?,
            ..Options::default()
        };
        let ranges = quantize::ranges_for(&state, &pool, &types, &options).await?;
        let job = Job {
            pool,
            kind: Kind::Dense,
            inputs,
            field,
            options,
        };
        let out = pipeline::run(&state, job, state.deadline()).await?;
        let mut embeddings = Map::new();
        for p in &types {
            let value = match p {
                Precision::Float => {
                    let rows: Vec<F32s> = (0..out.sequences).map(|i| F32s(out.row(i))).collect();
                    serde_json::to_value(rows)
                }
                p => serde_json::to_value(quantize::rows(&out, *p, ranges.as_deref())),
            }
            .map_err(|e| ApiError::Internal(format!("rendering {}: {e}", p.name())))?;
            embeddings.insert(p.name().to_string(), value);
        }
        let body = Reply {
            id: RequestId::current()
                .map(|r| r.to_string())
                .unwrap_or_default(),
            embeddings,
            texts,
            meta: Meta {
                api_version: Version { version: "2" },
                billed_units: Billed {
                    input_tokens: out.tokens,
                },
            },
            response_type: "embeddings_by_type",
        };
        Ok(json_timed(to_json(&body)?, &out, started))
    }
    .await;
    finish(&state, Api::Cohere, "embed", result)
}

#[derive(Serialize)]
struct Reply {
    id: String,
    embeddings: Map<String, Value>,
    texts: Vec<String>,
    meta: Meta,
    response_type: &'static str,
}

#[derive(Serialize)]
struct Meta {
    api_version: Version,
    billed_units: Billed,
}

#[derive(Serialize)]
struct Version {
    version: &'static str,
}

#[derive(Serialize)]
struct Billed {
    input_tokens: u64,
}

/// What is embedded: `texts`, `images` or `inputs`, exactly one of them;
/// the field, the inputs, and the texts the reply echoes.
fn inputs(obj: &Object) -> Result<(&'static str, Inputs, Vec<String>), ApiError> {
    let given: Vec<&str> = ["texts", "images", "inputs"]
        .into_iter()
        .filter(|k| obj.get(*k).is_some_and(|v| !v.is_null()))
        .collect();
    match given.as_slice() {
        ["texts"] | [] => {
            let texts = fields::strings(obj, "texts")?;
            Ok(("texts", Inputs::Texts(texts.clone()), texts))
        }
        ["images"] => {
            let uris = list(obj, "images")?;
            let items = uris
                .iter()
                .enumerate()
                .map(|(i, v)| image(v, "images", &format!("images[{i}]")))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(("images", Inputs::Items(items), Vec::new()))
        }
        ["inputs"] => {
            let mut items = Vec::new();
            for (i, v) in list(obj, "inputs")?.iter().enumerate() {
                items.push(content(v, i)?);
            }
            let texts = items
                .iter()
                .filter_map(|i| match i {
                    Item::Text(t) => Some(t.clone()),
                    _ => None,
                })
                .collect::<Vec<_>>();
            if texts.len() == items.len() {
                return Ok(("inputs", Inputs::Texts(texts.clone()), texts));
            }
            Ok(("inputs", Inputs::Items(items), texts))
        }
        more => Err(ApiError::schema(
            "texts",
            format!(
                "send one of `texts`, `images` and `inputs`, not {}",
                more.join(" and ")
            ),
        )),
    }
}

fn list<'a>(obj: &'a Object, field: &'static str) -> Result<&'a [Value], ApiError> {
    match obj.get(field) {
        Some(Value::Array(a)) if a.is_empty() => {
            Err(ApiError::Empty(format!("`{field}` must not be empty")))
        }
        Some(Value::Array(a)) => Ok(a),
        _ => Err(ApiError::schema(
            field,
            format!("`{field}` must be an array"),
        )),
    }
}

/// One of `inputs`: `{"content": [one item]}`, the item
/// `{"type": "text", "text": ...}` or `{"type": "image_url", "image_url":
/// {"url": <data URI>}}` (or the URL as a string).
fn content(v: &Value, i: usize) -> Result<Item, ApiError> {
    let at = format!("inputs[{i}]");
    let parts = v.get("content").and_then(Value::as_array).ok_or_else(|| {
        ApiError::schema("inputs", format!("{at} must be {{\"content\": [...]}}"))
    })?;
    let [part] = parts.as_slice() else {
        return Err(ApiError::validation(
            "inputs",
            format!(
                "{at}.content has {} items; each input here is one text or one image (the model \
                 embeds them apart: send them as separate inputs)",
                parts.len()
            ),
        ));
    };
    match part.get("type").and_then(Value::as_str) {
        Some("text") => match part.get("text") {
            Some(Value::String(t)) => Ok(Item::Text(t.clone())),
            _ => Err(ApiError::schema(
                "inputs",
                format!("{at}.content[0].text must be a string"),
            )),
        },
        Some("image_url") => {
            let url = match part.get("image_url") {
                Some(Value::Object(o)) => o.get("url").unwrap_or(&Value::Null),
                Some(other) => other,
                None => &Value::Null,
            };
            image(url, "inputs", &format!("{at}.content[0].image_url.url"))
        }
        _ => Err(ApiError::schema(
            "inputs",
            format!("{at}.content[0].type must be \"text\" or \"image_url\""),
        )),
    }
}

/// `embedding_types`: a list of type names, each once; default `["float"]`.
fn embedding_types(obj: &Object) -> Result<Vec<Precision>, ApiError> {
    let field = "embedding_types";
    let names = match obj.get(field) {
        None | Some(Value::Null) => return Ok(vec![Precision::Float]),
        Some(_) => fields::strings(obj, field)?,
    };
    let mut types = Vec::new();
    for name in &names {
        let p = Precision::parse(name).ok_or_else(|| {
            ApiError::schema(
                field,
                format!(
                    "unknown embedding type {name:?}; use float, int8, uint8, binary or ubinary"
                ),
            )
        })?;
        if !types.contains(&p) {
            types.push(p);
        }
    }
    Ok(types)
}

/// Cohere's `truncate`: `NONE` refuses a long input, `START` cuts its
/// start, `END` (default) its end.
fn truncate(obj: &Object) -> Result<(bool, Direction), ApiError> {
    match obj.get("truncate") {
        None | Some(Value::Null) => Ok((true, Direction::Right)),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("END") => Ok((true, Direction::Right)),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("START") => Ok((true, Direction::Left)),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("NONE") => Ok((false, Direction::Right)),
        Some(other) => Err(ApiError::schema(
            "truncate",
            format!("`truncate` must be \"NONE\", \"START\" or \"END\", got {other}"),
        )),
    }
}

fn output_dimension(obj: &Object) -> Result<Option<u32>, ApiError> {
    match obj.get("output_dimension") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(d) if d >= 1 && d <= u32::MAX as u64 => Ok(Some(d as u32)),
            _ => Err(ApiError::schema(
                "output_dimension",
                format!("`output_dimension` must be a positive integer, got {v}"),
            )),
        },
    }
}

/// `input_type` chooses the prompt: one of its own name, else the usual
/// one for it (`query` for `search_query`, `document` or `passage` for
/// `search_document`), when the model or templates file has it; otherwise
/// the default prompt. An explicit `prompt_name` wins.
fn prompt_name(state: &AppState, pool: &Pool, obj: &Object) -> Result<Option<String>, ApiError> {
    if let Some(p) = fields::opt_string(obj, "prompt_name")? {
        return Ok(Some(p));
    }
    let Some(input_type) = fields::opt_string(obj, "input_type")? else {
        return Ok(None);
    };
    let candidates: &[&str] = match input_type.as_str() {
        "search_query" => &["search_query", "query"],
        "search_document" => &["search_document", "document", "passage"],
        "classification" => &["classification"],
        "clustering" => &["clustering"],
        // Cohere's type for `images`: no prompt applies.
        "image" => &[],
        _ => {
            return Err(ApiError::schema(
                "input_type",
                format!(
                    "`input_type` must be search_document, search_query, classification, clustering or image, got {input_type:?}"
                ),
            ))
        }
    };
    let templates = state.templates(pool);
    Ok(candidates
        .iter()
        .find(|c| templates.prompts.contains_key(**c))
        .map(|c| c.to_string()))
}
