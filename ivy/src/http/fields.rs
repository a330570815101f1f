//! Reading request fields from parsed JSON, with messages that name the
//! field and say what is expected. Shared by the OpenAI and TEI routes.

use ivy_tokenizer::Direction;
use serde::ser::{SerializeSeq, Serializer};
use serde::Serialize;
use serde_json::{Map, Value};

use std::sync::Arc;

use crate::error::ApiError;
use crate::pipeline::{floats, Inputs, LongInputs, Priority};
use crate::state::Gateway;
use crate::upstream::pools::Pool;

pub type Object = Map<String, Value>;

/// The body as a JSON object.
pub fn object(value: Value, required: &'static str) -> Result<Object, ApiError> {
    match value {
        Value::Object(obj) => Ok(obj),
        other => Err(ApiError::schema(
            required,
            format!(
                "request body must be a JSON object with an `{required}` field, got {}",
                type_name(&other)
            ),
        )),
    }
}

/// A required field that is missing, or present as `null` (said so: the
/// client sent it, and may not know its value was null).
fn absent(obj: &Object, field: &'static str) -> ApiError {
    if obj.contains_key(field) {
        ApiError::schema(
            field,
            format!("`{field}` is null; it must be given a value"),
        )
    } else {
        ApiError::schema(field, format!("missing field `{field}`"))
    }
}

fn shape(field: &str) -> String {
    format!("`{field}` must be a string, an array of strings, an array of token ids, or an array of arrays of token ids")
}

/// Texts or token ids: a string, strings, token ids, or lists of token ids.
pub fn inputs(obj: &Object, field: &'static str) -> Result<Inputs, ApiError> {
    match obj.get(field) {
        None | Some(Value::Null) => Err(absent(obj, field)),
        Some(Value::String(s)) => Ok(Inputs::Texts(vec![s.clone()])),
        Some(Value::Array(items)) => {
            let Some(first) = items.first() else {
                return Err(ApiError::Empty(format!("`{field}` must not be empty")));
            };
            if items.iter().any(Value::is_object) {
                return super::image_input::items(items, field);
            }
            match first {
                Value::String(_) => each(items, |i, v| match v {
                    Value::String(s) => Ok(s.clone()),
                    other => Err(element_error(field, i, other, "a string")),
                })
                .map(Inputs::Texts),
                Value::Number(_) => token_ids(items, field, None).map(|ids| Inputs::Ids(vec![ids])),
                Value::Array(_) => each(items, |i, v| match v {
                    Value::Array(inner) => token_ids(inner, field, Some(i)),
                    other => Err(element_error(field, i, other, "an array of token ids")),
                })
                .map(Inputs::Ids),
                other => Err(element_error(field, 0, other, "a string or a token id")),
            }
        }
        Some(other) => Err(ApiError::schema(
            field,
            format!("{}; got {}", shape(field), type_name(other)),
        )),
    }
}

/// A string or an array of strings.
pub fn strings(obj: &Object, field: &'static str) -> Result<Vec<String>, ApiError> {
    match obj.get(field) {
        None | Some(Value::Null) => Err(absent(obj, field)),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(items)) if items.is_empty() => {
            Err(ApiError::Empty(format!("`{field}` must not be empty")))
        }
        Some(Value::Array(items)) => each(items, |i, v| match v {
            Value::String(s) => Ok(s.clone()),
            other => Err(ApiError::schema(
                field,
                format!("{field}[{i}] must be a string, got {}", type_name(other)),
            )),
        }),
        Some(other) => Err(ApiError::schema(
            field,
            format!(
                "`{field}` must be a string or an array of strings, got {}",
                type_name(other)
            ),
        )),
    }
}

/// A required string.
pub fn string(obj: &Object, field: &'static str) -> Result<String, ApiError> {
    match obj.get(field) {
        None | Some(Value::Null) => Err(absent(obj, field)),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(ApiError::schema(
            field,
            format!("`{field}` must be a string, got {}", type_name(other)),
        )),
    }
}

pub fn opt_string(obj: &Object, field: &'static str) -> Result<Option<String>, ApiError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(ApiError::schema(
            field,
            format!("`{field}` must be a string, got {}", type_name(other)),
        )),
    }
}

/// The pool of the body's `model` (every route takes it; without it, the
/// default model) and the name to answer under.
pub fn pool(state: &Gateway, obj: &Object) -> Result<(Arc<Pool>, String), ApiError> {
    state.pool(opt_string(obj, "model")?.as_deref())
}

pub fn opt_bool(obj: &Object, field: &'static str) -> Result<Option<bool>, ApiError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(ApiError::schema(
            field,
            format!("`{field}` must be true or false, got {other}"),
        )),
    }
}

/// `late_chunking` (Jina's field): the inputs are the chunks of one
/// document, each embedded from one pass over the whole document. Long
/// documents go in windows of their own, so `long_inputs` does not combine.
pub fn late_chunking(obj: &Object) -> Result<bool, ApiError> {
    let on = opt_bool(obj, "late_chunking")?.unwrap_or(false);
    if on && obj.get("long_inputs").is_some_and(|v| !v.is_null()) {
        return Err(ApiError::schema(
            "long_inputs",
            "`late_chunking` embeds documents longer than the model in windows of its own; leave out `long_inputs`",
        ));
    }
    Ok(on)
}

/// `truncation_direction`: "right" (default) or "left", any case.
pub fn direction(obj: &Object) -> Result<Direction, ApiError> {
    match obj.get("truncation_direction") {
        None | Some(Value::Null) => Ok(Direction::Right),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("right") => Ok(Direction::Right),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("left") => Ok(Direction::Left),
        Some(other) => Err(ApiError::schema(
            "truncation_direction",
            format!("`truncation_direction` must be \"right\" or \"left\", got {other}"),
        )),
    }
}

/// `priority`: "interactive" or "batch"; absent means "decide by size".
pub fn priority(obj: &Object) -> Result<Option<Priority>, ApiError> {
    match obj.get("priority") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("interactive") => {
            Ok(Some(Priority::Interactive))
        }
        Some(Value::String(s)) if s.eq_ignore_ascii_case("batch") => Ok(Some(Priority::Batch)),
        Some(other) => Err(ApiError::schema(
            "priority",
            format!("`priority` must be \"interactive\" or \"batch\", got {other}"),
        )),
    }
}

/// Cohere's `priority`: Ivy's two names as on every route, or Cohere's
/// number (lower is served first; 0, the highest, is its default): 0 is
/// interactive, anything above batch. Absent means "decide by size".
pub fn cohere_priority(obj: &Object) -> Result<Option<Priority>, ApiError> {
    match obj.get("priority") {
        Some(Value::Number(n)) => match n.as_u64() {
            Some(0) => Ok(Some(Priority::Interactive)),
            Some(_) => Ok(Some(Priority::Batch)),
            None => Err(ApiError::schema(
                "priority",
                format!("a numeric `priority` must be an integer >= 0 (0 = interactive, above = batch), got {n}"),
            )),
        },
        _ => priority(obj),
    }
}

/// `dimensions`: a positive integer (range-checked against the model later).
pub fn dimensions(obj: &Object) -> Result<Option<u32>, ApiError> {
    match obj.get("dimensions") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_i64() {
            Some(d) if d >= 1 && d <= u32::MAX as i64 => Ok(Some(d as u32)),
            _ => Err(ApiError::schema(
                "dimensions",
                format!("`dimensions` must be a positive integer, got {v}"),
            )),
        },
    }
}

/// `long_inputs`: "truncate", "pool" or "windows"; absent: `--long-inputs`.
/// A route that returns one vector per input (`several` false) refuses an
/// asked "windows" and pools where the server default is "windows".
pub fn long_inputs(
    obj: &Object,
    default: LongInputs,
    several: bool,
) -> Result<LongInputs, ApiError> {
    let asked = match obj.get("long_inputs") {
        None | Some(Value::Null) => {
            return Ok(match default {
                LongInputs::Windows if !several => LongInputs::Pool,
                d => d,
            })
        }
        Some(Value::String(s)) if s == "truncate" => LongInputs::Truncate,
        Some(Value::String(s)) if s == "pool" => LongInputs::Pool,
        Some(Value::String(s)) if s == "windows" => LongInputs::Windows,
        Some(other) => {
            return Err(ApiError::schema(
                "long_inputs",
                format!("`long_inputs` must be \"truncate\", \"pool\" or \"windows\", got {other}"),
            ))
        }
    };
    if asked == LongInputs::Windows && !several {
        return Err(ApiError::schema(
            "long_inputs",
            "`long_inputs: \"windows\"` returns several vectors per input, which this route and format cannot; use \"pool\"",
        ));
    }
    Ok(asked)
}

fn each<T>(
    items: &[Value],
    f: impl Fn(usize, &Value) -> Result<T, ApiError>,
) -> Result<Vec<T>, ApiError> {
    items.iter().enumerate().map(|(i, v)| f(i, v)).collect()
}

fn token_ids(
    items: &[Value],
    field: &'static str,
    outer: Option<usize>,
) -> Result<Vec<u32>, ApiError> {
    each(items, |j, v| {
        v.as_u64()
            .filter(|&t| t <= u32::MAX as u64)
            .map(|t| t as u32)
            .ok_or_else(|| {
                let at = match outer {
                    Some(i) => format!("{field}[{i}][{j}]"),
                    None => format!("{field}[{j}]"),
                };
                ApiError::schema(
                    field,
                    format!("{at} must be a non-negative integer token id, got {v}"),
                )
            })
    })
}

fn element_error(field: &'static str, i: usize, v: &Value, expected: &str) -> ApiError {
    ApiError::schema(
        field,
        format!(
            "{field}[{i}] must be {expected}, got {}; {}",
            type_name(v),
            shape(field)
        ),
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

/// Little-endian f32 bytes written as a JSON array of numbers, without an
/// intermediate `Vec<f32>`.
pub struct F32s<'a>(pub &'a [u8]);

impl Serialize for F32s<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len() / 4))?;
        for v in floats(self.0) {
            seq.serialize_element(&v)?;
        }
        seq.end()
    }
}

/// Rows of `dim` little-endian f32 values, as an array of arrays.
pub struct Rows<'a> {
    pub data: &'a [u8],
    pub dim: usize,
}

impl Serialize for Rows<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let n = (self.dim * 4).max(1);
        let mut seq = s.serialize_seq(Some(self.data.len() / n))?;
        for row in self.data.chunks_exact(n) {
            seq.serialize_element(&F32s(row))?;
        }
        seq.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Object {
        object(v, "input").unwrap()
    }

    #[test]
    fn reads_every_input_shape() {
        assert!(
            matches!(inputs(&obj(json!({"input": "a"})), "input"), Ok(Inputs::Texts(t)) if t == ["a"])
        );
        assert!(
            matches!(inputs(&obj(json!({"input": [1, 2]})), "input"), Ok(Inputs::Ids(i)) if i == [vec![1, 2]])
        );
        assert!(
            matches!(inputs(&obj(json!({"input": [[1], [2, 3]]})), "input"), Ok(Inputs::Ids(i)) if i.len() == 2)
        );
        let e = inputs(&obj(json!({"input": ["a", [1]]})), "input")
            .unwrap_err()
            .to_string();
        assert!(e.contains("input[1] must be a string"), "{e}");
        assert!(matches!(
            inputs(&obj(json!({"input": []})), "input"),
            Err(ApiError::Empty(_))
        ));
        assert!(matches!(
            inputs(&obj(json!({"inputs": "a"})), "input"),
            Err(ApiError::Schema { .. })
        ));
    }

    #[test]
    fn cohere_priorities_take_ivys_names_or_cohere_numbers() {
        let p = |v: Value| cohere_priority(&obj(json!({"input": "a", "priority": v})));
        assert_eq!(p(json!(0)).unwrap(), Some(Priority::Interactive));
        assert_eq!(p(json!(3)).unwrap(), Some(Priority::Batch));
        assert_eq!(p(json!("batch")).unwrap(), Some(Priority::Batch));
        assert_eq!(p(Value::Null).unwrap(), None);
        for bad in [json!(-1), json!(1.5), json!("urgent"), json!(true)] {
            let e = p(bad).unwrap_err().to_string();
            assert!(e.contains("priority"), "{e}");
        }
        // Elsewhere a number is refused: only Cohere's routes define one.
        assert!(priority(&obj(json!({"input": "a", "priority": 0}))).is_err());
    }

    #[test]
    fn rows_serialise_from_bytes() {
        let data: Vec<u8> = [1.0f32, 2.0, 3.5, -4.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let s = serde_json::to_string(&Rows {
            data: &data,
            dim: 2,
        })
        .unwrap();
        assert_eq!(s, "[[1.0,2.0],[3.5,-4.0]]");
    }
}
