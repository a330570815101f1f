//! The tokenization stage: texts → flat token ids + lengths, truncated to the
//! model's maximum or refused when the request asked for no truncation.

use ivy_tokenizer::{Direction, EncodeOptions, Encoding, Tokenizer};

use crate::error::ApiError;

/// Inputs this large are tokenized on a blocking thread, off the reactor.
const INLINE_INPUTS: usize = 8;

/// Flat ids with per-sequence lengths: the layout Tulip takes.
#[derive(Debug, Default)]
pub struct Tokenized {
    pub token_ids: Vec<u32>,
    pub lengths: Vec<u32>,
}

#[derive(Debug, Clone, Copy)]
pub struct Truncation {
    /// Longest sequence the model takes, special tokens included.
    pub max_length: usize,
    /// Cut long inputs (true) or refuse them (false).
    pub enabled: bool,
    pub direction: Direction,
}

/// Tokenizes `texts` (owned, so large requests can move to another thread).
pub async fn tokenize(
    tokenizer: &std::sync::Arc<Tokenizer>,
    texts: Vec<String>,
    truncation: Truncation,
) -> Result<Tokenized, ApiError> {
    if texts.len() <= INLINE_INPUTS {
        return tokenize_blocking(tokenizer, &texts, truncation);
    }
    let tokenizer = std::sync::Arc::clone(tokenizer);
    tokio::task::spawn_blocking(move || tokenize_blocking(&tokenizer, &texts, truncation))
        .await
        .map_err(|e| ApiError::Internal(format!("tokenization task failed: {e}")))?
}

fn tokenize_blocking(
    tokenizer: &Tokenizer,
    texts: &[String],
    truncation: Truncation,
) -> Result<Tokenized, ApiError> {
    let opts = EncodeOptions {
        add_special_tokens: true,
        max_length: Some(truncation.max_length),
        direction: truncation.direction,
    };
    let mut out = Tokenized {
        token_ids: Vec::with_capacity(texts.len() * 32),
        lengths: Vec::with_capacity(texts.len()),
    };
    let mut enc = Encoding::default();
    for (i, text) in texts.iter().enumerate() {
        tokenizer
            .encode_into(text, &opts, &mut enc)
            .map_err(|e| ApiError::Internal(format!("input[{i}]: {e}")))?;
        if enc.truncated() && !truncation.enabled {
            return Err(ApiError::validation(
                "input",
                format!(
                    "input[{i}] has {} tokens but the model accepts at most {}; \
                     shorten it or allow truncation",
                    enc.untruncated_len, truncation.max_length
                ),
            ));
        }
        out.token_ids.extend_from_slice(&enc.ids);
        out.lengths.push(enc.ids.len() as u32);
    }
    Ok(out)
}
