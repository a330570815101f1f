//! `POST /v1/embeddings`, compatible with OpenAI's embeddings API.
//!
//! Extensions beyond OpenAI's fields: `truncate` (default true) and
//! `truncation_direction` ("right" or "left"), as in text-embeddings-inference.

use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use bytes::Bytes;
use ivy_tokenizer::Direction;
use serde::ser::{SerializeSeq, Serializer};
use serde::Serialize;
use serde_json::{Map, Value};

use crate::app::AppState;
use crate::body::json_body;
use crate::embed::{embed, EmbedOptions, Embeddings, Inputs};
use crate::error::{ApiError, OpenAiError};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Float,
    Base64,
}

struct Request {
    inputs: Inputs,
    format: Format,
    opts: EmbedOptions,
}

pub async fn embeddings(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, OpenAiError> {
    let value = json_body(&headers, body, state.config.max_body_bytes)?;
    let request = parse(value)?;
    let out = embed(&state, request.inputs, request.opts).await?;
    let model = state
        .replicas
        .model()
        .map(|m| m.model_id.clone())
        .unwrap_or_default();
    let body = render(&out, request.format, &model)?;
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response())
}

fn parse(value: Value) -> Result<Request, ApiError> {
    let Value::Object(obj) = value else {
        return Err(ApiError::validation(
            "input",
            "request body must be a JSON object with an `input` field",
        ));
    };
    let inputs = parse_input(obj.get("input"))?;
    let format = match obj.get("encoding_format") {
        None | Some(Value::Null) => Format::Float,
        Some(Value::String(s)) if s == "float" => Format::Float,
        Some(Value::String(s)) if s == "base64" => Format::Base64,
        Some(other) => {
            return Err(ApiError::validation(
                "encoding_format",
                format!("`encoding_format` must be \"float\" or \"base64\", got {other}"),
            ))
        }
    };
    let dimensions = match obj.get("dimensions") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_i64() {
            Some(d) if d >= 1 && d <= u32::MAX as i64 => Some(d as u32),
            _ => {
                return Err(ApiError::validation(
                    "dimensions",
                    format!("`dimensions` must be a positive integer, got {v}"),
                ))
            }
        },
    };
    let opts = EmbedOptions {
        truncate: opt_bool(&obj, "truncate")?.unwrap_or(true),
        direction: parse_direction(&obj)?,
        dimensions,
        normalize: None,
    };
    Ok(Request {
        inputs,
        format,
        opts,
    })
}

fn opt_bool(obj: &Map<String, Value>, key: &'static str) -> Result<Option<bool>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(ApiError::validation(
            key,
            format!("`{key}` must be true or false, got {other}"),
        )),
    }
}

fn parse_direction(obj: &Map<String, Value>) -> Result<Direction, ApiError> {
    match obj.get("truncation_direction") {
        None | Some(Value::Null) => Ok(Direction::Right),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("right") => Ok(Direction::Right),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("left") => Ok(Direction::Left),
        Some(other) => Err(ApiError::validation(
            "truncation_direction",
            format!("`truncation_direction` must be \"right\" or \"left\", got {other}"),
        )),
    }
}

const INPUT_SHAPE: &str =
    "`input` must be a string, an array of strings, an array of token ids, or an array of arrays of token ids";

fn parse_input(input: Option<&Value>) -> Result<Inputs, ApiError> {
    match input {
        None | Some(Value::Null) => Err(ApiError::validation("input", "missing field `input`")),
        Some(Value::String(s)) => Ok(Inputs::Texts(vec![s.clone()])),
        Some(Value::Array(items)) => {
            let Some(first) = items.first() else {
                return Err(ApiError::validation("input", "`input` must not be empty"));
            };
            match first {
                Value::String(_) => items
                    .iter()
                    .enumerate()
                    .map(|(i, v)| match v {
                        Value::String(s) => Ok(s.clone()),
                        other => Err(element_error(i, other, "a string")),
                    })
                    .collect::<Result<_, _>>()
                    .map(Inputs::Texts),
                Value::Number(_) => token_ids(items, None).map(|ids| Inputs::Ids(vec![ids])),
                Value::Array(_) => items
                    .iter()
                    .enumerate()
                    .map(|(i, v)| match v {
                        Value::Array(inner) => token_ids(inner, Some(i)),
                        other => Err(element_error(i, other, "an array of token ids")),
                    })
                    .collect::<Result<_, _>>()
                    .map(Inputs::Ids),
                other => Err(element_error(0, other, "a string or a token id")),
            }
        }
        Some(other) => Err(ApiError::validation(
            "input",
            format!("{INPUT_SHAPE}; got {}", type_name(other)),
        )),
    }
}

fn token_ids(items: &[Value], outer: Option<usize>) -> Result<Vec<u32>, ApiError> {
    items
        .iter()
        .enumerate()
        .map(|(j, v)| {
            v.as_u64()
                .filter(|&t| t <= u32::MAX as u64)
                .map(|t| t as u32)
                .ok_or_else(|| {
                    let at = match outer {
                        Some(i) => format!("input[{i}][{j}]"),
                        None => format!("input[{j}]"),
                    };
                    ApiError::validation(
                        "input",
                        format!("{at} must be a non-negative integer token id, got {v}"),
                    )
                })
        })
        .collect()
}

fn element_error(i: usize, v: &Value, expected: &str) -> ApiError {
    ApiError::validation(
        "input",
        format!("input[{i}] must be {expected}, got {}; {INPUT_SHAPE}", type_name(v)),
    )
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[derive(Serialize)]
struct ResponseBody<'a> {
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

/// One row, written straight from the replica's little-endian bytes.
enum Vector<'a> {
    Float(&'a [u8]),
    Base64(String),
}

impl Serialize for Vector<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Base64(b) => s.serialize_str(b),
            Self::Float(bytes) => {
                let mut seq = s.serialize_seq(Some(bytes.len() / 4))?;
                for c in bytes.chunks_exact(4) {
                    seq.serialize_element(&f32::from_le_bytes([c[0], c[1], c[2], c[3]]))?;
                }
                seq.end()
            }
        }
    }
}

fn render(out: &Embeddings, format: Format, model: &str) -> Result<Vec<u8>, ApiError> {
    let data = (0..out.rows)
        .map(|i| {
            let row = out.row_bytes(i);
            Item {
                object: "embedding",
                index: i,
                embedding: match format {
                    Format::Float => Vector::Float(row),
                    Format::Base64 => {
                        Vector::Base64(base64::engine::general_purpose::STANDARD.encode(row))
                    }
                },
            }
        })
        .collect();
    let body = ResponseBody {
        object: "list",
        data,
        model,
        usage: Usage {
            prompt_tokens: out.prompt_tokens,
            total_tokens: out.prompt_tokens,
        },
    };
    serde_json::to_vec(&body).map_err(|e| ApiError::Internal(format!("serialising response: {e}")))
}
