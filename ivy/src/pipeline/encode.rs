//! The tokenization stage: texts → flat token ids + lengths, truncated to the
//! model's maximum or refused when the request asked for no truncation.
//!
//! Small requests are tokenized on the calling task with one reused
//! `Encoding` (the in-house tokenizer allocates nothing per text once warm).
//! Larger ones move to a blocking thread and are spread over all cores.

use ivy_tokenizer::{Direction, EncodeOptions, Encoding, Tokenizer};

use super::blocking::{off_reactor, INLINE_INPUTS};
use crate::error::ApiError;

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
    /// The request field holding the inputs (`input`, `inputs`, `texts`),
    /// named in errors as the caller wrote it.
    pub field: &'static str,
}

impl Truncation {
    /// The one refusal of an input longer than the model takes, when the
    /// request did not allow truncation. `what` names the input
    /// (`inputs[3]`, `the query with texts[3]`).
    pub fn refuse(&self, what: &str, tokens: usize) -> ApiError {
        ApiError::validation(
            self.field,
            format!(
                "{what} has {tokens} tokens but the model accepts at most {}; \
                 shorten it or allow truncation",
                self.max_length
            ),
        )
    }

    /// Refuses `enc` if the tokenizer cut it without the request's consent.
    pub fn check(&self, enc: &Encoding, what: impl FnOnce() -> String) -> Result<(), ApiError> {
        if enc.truncated() && !self.enabled {
            return Err(self.refuse(&what(), enc.untruncated_len));
        }
        Ok(())
    }

    pub fn options(&self) -> EncodeOptions {
        EncodeOptions {
            add_special_tokens: true,
            max_length: Some(self.max_length),
            direction: self.direction,
        }
    }
}

/// Tokenizes `texts` (owned, so large requests can move to another thread).
pub async fn tokenize(
    tokenizer: &std::sync::Arc<Tokenizer>,
    texts: Vec<String>,
    truncation: Truncation,
) -> Result<Tokenized, ApiError> {
    if texts.len() <= INLINE_INPUTS {
        return tokenize_inline(tokenizer, &texts, truncation);
    }
    let tokenizer = std::sync::Arc::clone(tokenizer);
    off_reactor("tokenization", move || {
        tokenize_parallel(&tokenizer, &texts, truncation)
    })
    .await
}

/// One text after another into one reused `Encoding`.
fn tokenize_inline(
    tokenizer: &Tokenizer,
    texts: &[String],
    truncation: Truncation,
) -> Result<Tokenized, ApiError> {
    let opts = truncation.options();
    let mut out = Tokenized {
        token_ids: Vec::with_capacity(texts.len() * 32),
        lengths: Vec::with_capacity(texts.len()),
    };
    let mut enc = Encoding::default();
    for (i, text) in texts.iter().enumerate() {
        tokenizer
            .encode_into(text, &opts, &mut enc)
            .map_err(|e| ApiError::Internal(format!("{}[{i}]: {e}", truncation.field)))?;
        append(&mut out, i, &enc, truncation)?;
    }
    Ok(out)
}

/// All texts at once, spread over the cores by the tokenizer.
fn tokenize_parallel(
    tokenizer: &Tokenizer,
    texts: &[String],
    truncation: Truncation,
) -> Result<Tokenized, ApiError> {
    let encodings = tokenizer
        .encode_batch(texts, &truncation.options())
        .map_err(|e| ApiError::Internal(format!("tokenization failed: {e}")))?;
    let total = encodings.iter().map(Encoding::len).sum();
    let mut out = Tokenized {
        token_ids: Vec::with_capacity(total),
        lengths: Vec::with_capacity(texts.len()),
    };
    for (i, enc) in encodings.iter().enumerate() {
        append(&mut out, i, enc, truncation)?;
    }
    Ok(out)
}

/// Adds one encoding, or refuses an input that was cut without consent.
fn append(
    out: &mut Tokenized,
    i: usize,
    enc: &Encoding,
    truncation: Truncation,
) -> Result<(), ApiError> {
    truncation.check(enc, || format!("{}[{i}]", truncation.field))?;
    out.token_ids.extend_from_slice(&enc.ids);
    out.lengths.push(enc.ids.len() as u32);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn minilm() -> Tokenizer {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        Tokenizer::from_file(dir.join("../tests/data/tokenizers/all-minilm-l6-v2")).unwrap()
    }

    fn truncation(max_length: usize, enabled: bool) -> Truncation {
        Truncation {
            max_length,
            field: "input",
            enabled,
            direction: Direction::Right,
        }
    }

    /// Inline and parallel paths give the same flat layout.
    #[test]
    fn parallel_matches_inline() {
        let tok = minilm();
        let texts: Vec<String> = (0..300)
            .map(|i| {
                format!(
                    "sentence number {i} with some words {}",
                    "and more ".repeat(i % 40)
                )
            })
            .collect();
        let t = truncation(64, true);
        let a = tokenize_inline(&tok, &texts, t).unwrap();
        let b = tokenize_parallel(&tok, &texts, t).unwrap();
        assert_eq!(a.token_ids, b.token_ids);
        assert_eq!(a.lengths, b.lengths);
        assert_eq!(a.lengths.len(), 300);
        assert!(a.lengths.iter().all(|&n| n <= 64));
    }

    #[test]
    fn refuses_long_input_without_truncation() {
        let tok = minilm();
        let texts = vec!["short".to_owned(), "word ".repeat(100)];
        assert!(tokenize_inline(&tok, &texts, truncation(16, true)).is_ok());
        assert!(tokenize_inline(&tok, &texts, truncation(16, false)).is_err());
        assert!(tokenize_parallel(&tok, &texts, truncation(16, false)).is_err());
    }
}
