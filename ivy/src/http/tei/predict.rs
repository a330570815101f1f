//! `POST /predict`, as text-embeddings-inference serves it: a sequence
//! classifier's labels with their scores, best first. `inputs` is a text, a
//! pair of texts (`["premise", "hypothesis"]`), or a list of texts or pairs
//! (the answer is then one list per input). A cross-encoder with one label
//! answers too, with that label.

use std::time::Instant;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use serde::Serialize;
use serde_json::Value;

use super::common_options;
use crate::error::ApiError;
use crate::http::body::{json_object, Body};
use crate::http::fields::{self, Object};
use crate::http::respond::{finish, json_timed, to_json, Api};
use crate::pipeline::{predict, Inputs, Options};
use crate::state::AppState;

pub async fn predict(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let started = Instant::now();
    let result = async {
        let obj = json_object(&state, &headers, body, "inputs")?;
        let (pool, _) = fields::pool(&state, &obj)?;
        let (inputs, batch) = parse_inputs(&obj)?;
        let hub = hub_parameters(&obj)?;
        let raw_scores = fields::opt_bool(&obj, "raw_scores")?.unwrap_or(false);
        let options = Options {
            // The Hub's `function_to_apply` works on the logits.
            raw_scores: raw_scores || hub.as_ref().is_some_and(|h| h.function.is_some()),
            ..common_options(&state, &obj)?
        };
        let (out, mut labelled) =
            predict::run(&state, pool, inputs, options, state.deadline()).await?;
        if let Some(hub) = &hub {
            for one in &mut labelled {
                hub.apply(one);
            }
        }
        let predictions: Vec<Vec<Prediction>> = labelled
            .iter()
            .map(|one| one.iter().map(Prediction::of).collect())
            .collect();
        // The Hub's task answers one list per input, a single input too
        // (`InferenceClient.text_classification` reads the first list).
        let body = if batch || hub.is_some() {
            to_json(&predictions)?
        } else {
            to_json(&predictions[0])?
        };
        Ok(json_timed(body, &out, started))
    }
    .await;
    finish(&state, Api::Tei, "predict", result)
}

/// The Hub's text-classification `parameters` (`{"inputs", "parameters":
/// {"top_k", "function_to_apply"}}`, what `InferenceClient` sends), an
/// extension TEI's `/predict` does not read: present, the answer takes the
/// Hub's shape.
struct HubParameters {
    top_k: Option<usize>,
    /// `softmax`, `sigmoid` or `none`, over the logits; unset: `/predict`'s own.
    function: Option<Function>,
}

#[derive(Clone, Copy)]
enum Function {
    Softmax,
    Sigmoid,
    None,
}

fn hub_parameters(obj: &Object) -> Result<Option<HubParameters>, ApiError> {
    let field = "parameters";
    let p = match obj.get(field) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(p)) => p,
        Some(_) => return Err(ApiError::schema(field, "`parameters` must be an object")),
    };
    let top_k = match p.get("top_k") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(k) if k >= 1 => Some(k as usize),
            _ => {
                return Err(ApiError::schema(
                    field,
                    format!("`parameters.top_k` must be a positive integer, got {v}"),
                ))
            }
        },
    };
    let function = match p.get("function_to_apply") {
        None | Some(Value::Null) => None,
        Some(Value::String(f)) if f == "softmax" => Some(Function::Softmax),
        Some(Value::String(f)) if f == "sigmoid" => Some(Function::Sigmoid),
        Some(Value::String(f)) if f == "none" => Some(Function::None),
        Some(v) => {
            return Err(ApiError::schema(
                field,
                format!("`parameters.function_to_apply` must be \"softmax\", \"sigmoid\" or \"none\", got {v}"),
            ))
        }
    };
    Ok(Some(HubParameters { top_k, function }))
}

impl HubParameters {
    /// One input's predictions (best first, logits when `function` is set)
    /// as the Hub's parameters ask; the order never changes (each function
    /// is monotonic).
    fn apply(&self, one: &mut Vec<predict::Prediction>) {
        match self.function {
            Some(Function::Softmax) => {
                let max = one
                    .iter()
                    .map(|p| p.score)
                    .fold(f32::NEG_INFINITY, f32::max);
                let sum: f32 = one.iter().map(|p| (p.score - max).exp()).sum();
                for p in one.iter_mut() {
                    p.score = (p.score - max).exp() / sum;
                }
            }
            Some(Function::Sigmoid) => {
                for p in one.iter_mut() {
                    p.score = 1.0 / (1.0 + (-p.score).exp());
                }
            }
            Some(Function::None) | None => {}
        }
        if let Some(k) = self.top_k {
            one.truncate(k);
        }
    }
}

/// TEI's JSON for one prediction (score first).
#[derive(Serialize)]
struct Prediction<'a> {
    score: f32,
    label: &'a str,
}

impl<'a> Prediction<'a> {
    fn of(p: &'a predict::Prediction) -> Self {
        Self {
            score: p.score,
            label: &p.label,
        }
    }
}

/// `inputs` as TEI reads it: whether it is a batch, and the sequences.
fn parse_inputs(obj: &Object) -> Result<(Inputs, bool), ApiError> {
    let field = "inputs";
    let shape = "`inputs` must be a string, a pair of strings, or a list of strings or pairs";
    let pair = |v: &Value| match v.as_array().map(Vec::as_slice) {
        Some([Value::String(a), Value::String(b)]) => Some((a.clone(), b.clone())),
        _ => None,
    };
    let items = match obj.get(field) {
        None | Some(Value::Null) => return Err(ApiError::schema(field, "missing field `inputs`")),
        Some(Value::String(s)) => return Ok((Inputs::Texts(vec![s.clone()]), false)),
        Some(v) if pair(v).is_some() => {
            return Ok((Inputs::PairList(vec![pair(v).unwrap_or_default()]), false))
        }
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(ApiError::Empty("`inputs` must not be empty".into()))
        }
        Some(Value::Array(items)) => items,
        Some(_) => return Err(ApiError::schema(field, shape)),
    };
    if items.iter().all(Value::is_string) {
        let texts = items.iter().filter_map(|v| v.as_str().map(str::to_string));
        return Ok((Inputs::Texts(texts.collect()), true));
    }
    let mut pairs = Vec::with_capacity(items.len());
    for (i, v) in items.iter().enumerate() {
        match pair(v) {
            Some(p) => pairs.push(p),
            None => {
                return Err(ApiError::schema(
                    field,
                    format!("inputs[{i}] must be a pair of strings like the other items ({shape})"),
                ))
            }
        }
    }
    Ok((Inputs::PairList(pairs), true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<(Inputs, bool), ApiError> {
        parse_inputs(json!({ "inputs": v }).as_object().unwrap())
    }

    #[test]
    fn inputs_read_as_tei_reads_them() {
        assert!(matches!(parse(json!("a")), Ok((Inputs::Texts(t), false)) if t == ["a"]));
        assert!(
            matches!(parse(json!(["a", "b"])), Ok((Inputs::PairList(p), false)) if p.len() == 1)
        );
        assert!(matches!(parse(json!(["a"])), Ok((Inputs::Texts(t), true)) if t == ["a"]));
        assert!(
            matches!(parse(json!(["a", "b", "c"])), Ok((Inputs::Texts(t), true)) if t.len() == 3)
        );
        assert!(
            matches!(parse(json!([["a", "b"], ["c", "d"]])), Ok((Inputs::PairList(p), true)) if p.len() == 2)
        );
        assert!(parse(json!([])).is_err());
        assert!(parse(json!([["a", "b"], "c"])).is_err());
        assert!(parse(json!(3)).is_err());
    }
}
