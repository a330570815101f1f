//! The tokenize pipeline (`/tokenize`, gRPC `Tokenize`): what the model
//! would see for each input, template included, with byte offsets. Nothing
//! is truncated and no replica is involved.

use std::time::Instant;

use ivy_tokenizer::{EncodeOptions, Tokenizer};

use super::blocking::{off_reactor, INLINE_INPUTS};
use super::{guarded, validate};
use crate::error::ApiError;
use crate::metrics::Stage;
use crate::state::AppState;
use crate::upstream::pools::Pool;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub id: u32,
    /// The slice of the input the token covers, or the special token's text.
    pub text: String,
    pub special: bool,
    /// Byte offsets into the templated input; `None` for special tokens.
    pub start: Option<u32>,
    pub stop: Option<u32>,
}

pub struct TokenizeJob {
    pub inputs: Vec<String>,
    pub add_special_tokens: bool,
    pub prompt_name: Option<String>,
}

pub async fn run(
    state: &AppState,
    pool: &Pool,
    job: TokenizeJob,
    deadline: Instant,
) -> Result<Vec<Vec<Token>>, ApiError> {
    guarded(state, deadline, async {
        if job.inputs.is_empty() {
            return Err(ApiError::Empty("the request has no inputs".into()));
        }
        validate::count(
            job.inputs.len(),
            state.config.max_inputs,
            "inputs",
            "inputs",
        )?;
        let started = Instant::now();
        let templates = state.templates(pool);
        let inputs = templates.apply(job.prompt_name.as_deref(), job.inputs)?;
        let add = job.add_special_tokens;
        let tokenizer = state.tokenizer(pool)?;
        let out = if inputs.len() <= INLINE_INPUTS {
            tokens_of(&tokenizer, &inputs, add)
        } else {
            off_reactor("tokenization", move || tokens_of(&tokenizer, &inputs, add)).await
        };
        state.metrics.stage(Stage::Tokenize, started.elapsed());
        out
    })
    .await
}

pub struct DecodeJob {
    pub ids: Vec<Vec<u32>>,
    pub skip_special_tokens: bool,
}

/// Token ids back to text with the served tokenizer, one string per
/// sequence (the same input limit as every other route).
pub async fn decode(
    state: &AppState,
    pool: &Pool,
    job: DecodeJob,
    deadline: Instant,
) -> Result<Vec<String>, ApiError> {
    guarded(state, deadline, async {
        validate::count(job.ids.len(), state.config.max_inputs, "ids", "sequences")?;
        let tokenizer = state.tokenizer(pool)?;
        let skip = job.skip_special_tokens;
        let inline = job.ids.len() <= INLINE_INPUTS;
        let run = move || {
            job.ids
                .iter()
                .enumerate()
                .map(|(i, ids)| {
                    tokenizer
                        .decode(ids, skip)
                        .map_err(|e| ApiError::Internal(format!("ids[{i}]: {e}")))
                })
                .collect::<Result<Vec<String>, ApiError>>()
        };
        if inline {
            run()
        } else {
            off_reactor("decoding", run).await
        }
    })
    .await
}

fn tokens_of(
    tokenizer: &Tokenizer,
    inputs: &[String],
    add_special_tokens: bool,
) -> Result<Vec<Vec<Token>>, ApiError> {
    let opts = EncodeOptions {
        add_special_tokens,
        max_length: None,
        ..Default::default()
    };
    inputs
        .iter()
        .enumerate()
        .map(|(i, text)| {
            let enc = tokenizer
                .encode(text, &opts)
                .map_err(|e| ApiError::Internal(format!("inputs[{i}]: {e}")))?;
            Ok((0..enc.ids.len())
                .map(|k| {
                    let id = enc.ids[k];
                    let (start, stop) = enc.offsets[k];
                    let slice = text
                        .get(start as usize..stop as usize)
                        .filter(|s| !s.is_empty());
                    match (enc.special[k], slice) {
                        (false, Some(s)) => Token {
                            id,
                            text: s.to_string(),
                            special: false,
                            start: Some(start),
                            stop: Some(stop),
                        },
                        (special, _) => Token {
                            id,
                            text: tokenizer.id_to_token(id).unwrap_or_default(),
                            special,
                            start: None,
                            stop: None,
                        },
                    }
                })
                .collect())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A WordPiece model whose unknown token is not in its vocabulary: any
    /// character outside it fails to encode.
    const NO_UNK: &str = r###"{
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null, "decoder": null,
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": {"a": 0}}
    }"###;

    /// The error names the input as the route's field does (`inputs[1]`,
    /// once `input[1]`).
    #[test]
    fn a_failed_input_is_named_by_the_routes_field() {
        let tokenizer = Tokenizer::from_bytes(NO_UNK.as_bytes()).unwrap();
        let inputs = ["a".to_string(), "z".to_string()];
        let e = tokens_of(&tokenizer, &inputs, false).unwrap_err();
        assert!(e.to_string().contains("inputs[1]: "), "{e}");
    }
}
