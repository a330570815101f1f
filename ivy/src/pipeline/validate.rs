//! Checks that need no tokenizer: counts, options against the model, and
//! whether the model produces the output asked for.

use proto::tulip::v1::InfoResponse;

use super::{Inputs, Job, Kind};
use crate::config::Config;
use crate::error::ApiError;

pub fn job(job: &Job, model: &InfoResponse, config: &Config) -> Result<(), ApiError> {
    let n = job.inputs.len();
    if n == 0 {
        return Err(ApiError::Empty("the request has no inputs".into()));
    }
    count(n, config.max_inputs, job.field, "inputs")?;
    supported(job.kind, model)?;
    if let Some(d) = job.options.dimensions {
        if job.kind != Kind::Dense {
            return Err(ApiError::validation(
                "dimensions",
                "`dimensions` applies to dense embeddings only",
            ));
        }
        if d == 0 || d > model.dimension {
            return Err(ApiError::validation(
                "dimensions",
                format!(
                    "`dimensions` must be between 1 and the model's dimension {}, got {d}",
                    model.dimension
                ),
            ));
        }
    }
    match &job.inputs {
        Inputs::Texts(texts) => no_empty_text(texts, job.field),
        Inputs::Pairs { query, texts } => {
            if query.is_empty() {
                return Err(ApiError::validation("query", "`query` is an empty string"));
            }
            no_empty_text(texts, job.field)
        }
        Inputs::PairList(pairs) => {
            match pairs.iter().position(|(a, b)| a.is_empty() || b.is_empty()) {
                Some(i) => Err(ApiError::validation(
                    "inputs",
                    format!("inputs[{i}] holds an empty string"),
                )),
                None => Ok(()),
            }
        }
        Inputs::Items(items) => {
            match items
                .iter()
                .position(|i| matches!(i, super::Item::Text(t) if t.is_empty()))
            {
                Some(i) => Err(ApiError::validation(
                    job.field,
                    format!("{}[{i}] is an empty string", job.field),
                )),
                None => Ok(()),
            }
        }
        Inputs::Ids(_) => {
            if job.options.prompt_name.is_some() {
                return Err(ApiError::validation(
                    "prompt_name",
                    "`prompt_name` applies to text inputs; token-id inputs are sent as they are",
                ));
            }
            Ok(())
        }
    }
}

pub fn tokens(total: usize, limit: usize, field: &'static str) -> Result<(), ApiError> {
    if total > limit {
        return Err(ApiError::validation(
            field,
            format!("the request has {total} tokens, over the limit of {limit} per request; split the request"),
        ));
    }
    Ok(())
}

/// `n` inputs (named `noun`: inputs, sequences) against the limit per
/// request, `--max-inputs`.
pub fn count(n: usize, max: usize, field: &'static str, noun: &str) -> Result<(), ApiError> {
    if n > max {
        return Err(ApiError::validation(
            field,
            format!("{n} {noun} exceed the limit of {max} per request; split the request"),
        ));
    }
    Ok(())
}

fn supported(kind: Kind, model: &InfoResponse) -> Result<(), ApiError> {
    let kinds = crate::model::kinds(model);
    // A replica that lists nothing produces dense vectors only.
    let produces = if kind == Kind::TokenStates {
        // Not listed in `kinds`: every embedding model has them.
        model.token_states_dimension > 0
    } else if kinds.is_empty() {
        kind == Kind::Dense
    } else {
        kinds.contains(&kind)
    };
    if produces {
        return Ok(());
    }
    let has: Vec<&str> = if kinds.is_empty() {
        vec!["dense"]
    } else {
        kinds.iter().map(|k| k.name()).collect()
    };
    Err(ApiError::Unsupported(format!(
        "the served model `{}` does not produce {} outputs (it produces: {})",
        model.model_id,
        kind.name(),
        has.join(", ")
    )))
}

/// An empty string is nothing to embed: `Empty` (TEI's 400 "Empty"; 422
/// on the OpenAI routes, INVALID_ARGUMENT on gRPC).
fn no_empty_text(texts: &[String], field: &'static str) -> Result<(), ApiError> {
    match texts.iter().position(|t| t.is_empty()) {
        Some(i) => Err(ApiError::Empty(format!("{field}[{i}] is an empty string"))),
        None => Ok(()),
    }
}
