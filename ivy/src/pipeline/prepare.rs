//! From inputs to the flat token ids Tulip takes: the prompt template, the
//! tokenizer (texts and query/text pairs) and truncation, or checks of
//! caller-supplied token ids.

use ivy_tokenizer::{Direction, EncodeOptions, Tokenizer};
use proto::tulip::v1::InfoResponse;

use super::blocking::{off_reactor, INLINE_INPUTS};
use super::encode::{tokenize as tokenize_texts, Tokenized, Truncation};
use super::{Inputs, Options};
use crate::error::ApiError;
use crate::model::templates::Templates;
use crate::state::AppState;
use crate::upstream::pools::Pool;

pub async fn tokenize(
    state: &AppState,
    pool: &Pool,
    model: &InfoResponse,
    templates: &Templates,
    inputs: Inputs,
    options: &Options,
    field: &'static str,
) -> Result<Tokenized, ApiError> {
    // Long inputs cut into windows later are tokenized whole.
    let whole = options.long_inputs != crate::config::LongInputs::Truncate;
    let truncation = Truncation {
        field,
        max_length: if whole {
            usize::MAX
        } else {
            max_input_length(
                state.config.max_input_length,
                templates.max_input_length,
                model,
            )
        },
        enabled: options.truncate || whole,
        direction: options.direction,
    };
    match inputs {
        Inputs::Texts(texts) => {
            let texts = templates.apply(options.prompt_name.as_deref(), texts)?;
            tokenize_texts(&state.tokenizer(pool)?, texts, truncation).await
        }
        Inputs::Ids(ids) => check_ids(ids, truncation, model.vocab_size),
        Inputs::Items(_) => Err(ApiError::Internal(
            "images reached the tokenizer (pipeline/images.rs takes them)".into(),
        )),
        Inputs::PairList(pairs) => {
            let tokenizer = state.tokenizer(pool)?;
            let mut out = Tokenized::default();
            for (i, (first, second)) in pairs.iter().enumerate() {
                let one = encode_pairs(
                    &tokenizer,
                    first,
                    std::slice::from_ref(second),
                    truncation,
                    |_| format!("{field}[{i}]"),
                )?;
                out.token_ids.extend(one.token_ids);
                out.lengths.extend(one.lengths);
            }
            Ok(out)
        }
        Inputs::Pairs { query, texts } if !model.pair_template.is_empty() => {
            let tokenizer = state.tokenizer(pool)?;
            let template = model.pair_template.clone();
            off_reactor("tokenization", move || {
                encode_templated(&tokenizer, &template, &query, &texts, truncation, |i| {
                    format!("the query with {field}[{i}] in the model's prompt")
                })
            })
            .await
        }
        Inputs::Pairs { query, texts } => {
            let tokenizer = state.tokenizer(pool)?;
            let name = move |i: usize| format!("the query with {field}[{i}]");
            if texts.len() <= INLINE_INPUTS {
                return encode_pairs(&tokenizer, &query, &texts, truncation, name);
            }
            off_reactor("tokenization", move || {
                encode_pairs(&tokenizer, &query, &texts, truncation, name)
            })
            .await
        }
    }
}

/// Texts padded to the model's fixed length with its pad id (SigLIP was
/// trained on text padded so, and pools the last position); unchanged for
/// every other model. Truncation has already cut them to the window.
pub(super) fn pad(tokenized: Tokenized, model: &InfoResponse) -> Tokenized {
    let to = model.text_pad_to;
    if to == 0 || tokenized.lengths.iter().all(|&l| l == to) {
        return tokenized;
    }
    let mut out = Tokenized {
        token_ids: Vec::with_capacity(tokenized.lengths.len() * to as usize),
        lengths: Vec::with_capacity(tokenized.lengths.len()),
    };
    let mut at = 0;
    for &len in &tokenized.lengths {
        let ids = &tokenized.token_ids[at..at + len as usize];
        at += len as usize;
        let kept = &ids[..ids.len().min(to as usize)];
        out.token_ids.extend_from_slice(kept);
        out.token_ids.extend(std::iter::repeat_n(
            model.pad_token_id,
            to as usize - kept.len(),
        ));
        out.lengths.push(to);
    }
    out
}

/// The longest input: the model's maximum, lowered by the flag and the
/// templates file when they set a cap.
pub(super) fn max_input_length(flag: usize, file: Option<usize>, model: &InfoResponse) -> usize {
    let mut max = model.max_input_length as usize;
    if flag > 0 {
        max = max.min(flag);
    }
    if let Some(cap) = file {
        max = max.min(cap);
    }
    max
}

/// Causal-LM rerankers (Qwen3-Reranker): each pair written into the
/// model's prompt and tokenized without special tokens. A pair too long
/// loses the end of its document, never the prompt's closing part (where
/// the model reads its answer).
fn encode_templated(
    tokenizer: &Tokenizer,
    template: &str,
    query: &str,
    texts: &[String],
    truncation: Truncation,
    name: impl Fn(usize) -> String,
) -> Result<Tokenized, ApiError> {
    let Some((head, tail)) = template.split_once("{document}") else {
        return Err(ApiError::Internal(
            "the replica's pair template has no {document} to fill".into(),
        ));
    };
    let head = head.replace("{query}", query);
    let plain = |max_length| EncodeOptions {
        add_special_tokens: false,
        max_length,
        direction: Direction::Right,
    };
    let tail_ids = tokenizer
        .encode(tail, &plain(None))
        .map_err(|e| ApiError::Internal(format!("pair template: {e}")))?
        .ids;
    let room = truncation.max_length.saturating_sub(tail_ids.len());
    let mut out = Tokenized::default();
    for (i, text) in texts.iter().enumerate() {
        let enc = tokenizer
            .encode(&format!("{head}{text}"), &plain(Some(room)))
            .map_err(|e| ApiError::Internal(format!("{}: {e}", name(i))))?;
        if enc.truncated() && !truncation.enabled {
            // The prompt's tokens count against the model's maximum too.
            return Err(truncation.refuse(&name(i), enc.untruncated_len + tail_ids.len()));
        }
        out.token_ids.extend_from_slice(&enc.ids);
        out.token_ids.extend_from_slice(&tail_ids);
        out.lengths.push((enc.ids.len() + tail_ids.len()) as u32);
    }
    Ok(out)
}

/// Cross-encoder inputs: `[CLS] query [SEP] text [SEP]` (or the model's
/// equivalent); when too long, the longer side loses tokens first. `name`
/// names pair `i` in errors.
fn encode_pairs(
    tokenizer: &Tokenizer,
    query: &str,
    texts: &[String],
    truncation: Truncation,
    name: impl Fn(usize) -> String,
) -> Result<Tokenized, ApiError> {
    let opts = truncation.options();
    let mut out = Tokenized::default();
    for (i, text) in texts.iter().enumerate() {
        let enc = tokenizer
            .encode_pair(query, text, &opts)
            .map_err(|e| ApiError::Internal(format!("{}: {e}", name(i))))?;
        truncation.check(&enc, || name(i))?;
        out.token_ids.extend_from_slice(&enc.ids);
        out.lengths.push(enc.ids.len() as u32);
    }
    Ok(out)
}

/// Token-id inputs get the same checks and errors as text (Tulip checks
/// again: it never trusts its callers).
fn check_ids(
    ids: Vec<Vec<u32>>,
    truncation: Truncation,
    vocab_size: u32,
) -> Result<Tokenized, ApiError> {
    let mut out = Tokenized::default();
    let field = truncation.field;
    for (i, seq) in ids.iter().enumerate() {
        if seq.is_empty() {
            return Err(ApiError::validation(
                field,
                format!("{field}[{i}] is empty"),
            ));
        }
        if let Some(&bad) = seq.iter().find(|&&t| t >= vocab_size) {
            return Err(ApiError::validation(
                field,
                format!("{field}[{i}] has token id {bad}, outside the vocabulary of {vocab_size}"),
            ));
        }
        let keep = if seq.len() <= truncation.max_length {
            &seq[..]
        } else if !truncation.enabled {
            return Err(truncation.refuse(&format!("{field}[{i}]"), seq.len()));
        } else {
            match truncation.direction {
                Direction::Right => &seq[..truncation.max_length],
                Direction::Left => &seq[seq.len() - truncation.max_length..],
            }
        };
        out.token_ids.extend_from_slice(keep);
        out.lengths.push(keep.len() as u32);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trunc(max: usize, enabled: bool, direction: Direction) -> Truncation {
        Truncation {
            field: "input",
            max_length: max,
            enabled,
            direction,
        }
    }

    #[test]
    fn ids_are_checked_and_truncated() {
        let t = check_ids(
            vec![vec![1, 2, 3, 4], vec![5]],
            trunc(3, true, Direction::Left),
            10,
        )
        .unwrap();
        assert_eq!((t.token_ids, t.lengths), (vec![2, 3, 4, 5], vec![3, 1]));
        assert!(check_ids(
            vec![vec![1, 2, 3, 4]],
            trunc(3, false, Direction::Right),
            10
        )
        .is_err());
        assert!(check_ids(vec![vec![11]], trunc(3, true, Direction::Right), 10).is_err());
        assert!(check_ids(vec![vec![]], trunc(3, true, Direction::Right), 10).is_err());
    }

    #[test]
    fn caps_only_lower_the_model_maximum() {
        let model = InfoResponse {
            max_input_length: 512,
            ..Default::default()
        };
        assert_eq!(max_input_length(0, None, &model), 512);
        assert_eq!(max_input_length(1000, None, &model), 512);
        assert_eq!(max_input_length(256, Some(128), &model), 128);
        assert_eq!(max_input_length(0, Some(300), &model), 300);
    }
}
