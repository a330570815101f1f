//! The embedding pipeline shared by every API front:
//! validate options → tokenize → send to a replica → check the reply.

use bytes::Bytes;
use ivy_tokenizer::Direction;
use proto::tulip::v1::{EmbedRequest, OutputKind};

use crate::app::AppState;
use crate::error::ApiError;
use crate::replicas::no_replica;
use crate::tokenize::{tokenize, Tokenized, Truncation};

/// What to embed: texts, or token ids the caller tokenized itself.
#[derive(Debug)]
pub enum Inputs {
    Texts(Vec<String>),
    Ids(Vec<Vec<u32>>),
}

impl Inputs {
    pub fn len(&self) -> usize {
        match self {
            Self::Texts(t) => t.len(),
            Self::Ids(i) => i.len(),
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct EmbedOptions {
    pub truncate: bool,
    pub direction: Direction,
    /// Matryoshka truncation; `None` is the model's full dimension.
    pub dimensions: Option<u32>,
    /// `None` is the model's default.
    pub normalize: Option<bool>,
}

/// Dense vectors, one row per input, as little-endian f32 bytes.
pub struct Embeddings {
    pub rows: usize,
    pub dim: usize,
    pub data: Bytes,
    pub prompt_tokens: u64,
}

impl Embeddings {
    /// The little-endian bytes of row `i`.
    pub fn row_bytes(&self, i: usize) -> &[u8] {
        let n = self.dim * 4;
        &self.data[i * n..(i + 1) * n]
    }
}

pub async fn embed(
    state: &AppState,
    inputs: Inputs,
    opts: EmbedOptions,
) -> Result<Embeddings, ApiError> {
    let model = state.replicas.model().ok_or_else(no_replica)?;
    if inputs.len() == 0 {
        return Err(ApiError::validation("input", "`input` must not be empty"));
    }
    if inputs.len() > state.config.max_inputs {
        return Err(ApiError::validation(
            "input",
            format!(
                "{} inputs exceed the limit of {} per request; split the request",
                inputs.len(),
                state.config.max_inputs
            ),
        ));
    }
    if let Some(d) = opts.dimensions {
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
    let max_length = match state.config.max_input_length {
        0 => model.max_input_length as usize,
        cap => cap.min(model.max_input_length as usize),
    };
    let truncation = Truncation {
        max_length,
        enabled: opts.truncate,
        direction: opts.direction,
    };
    let tokenized = match inputs {
        Inputs::Texts(texts) => {
            if let Some(i) = texts.iter().position(|t| t.is_empty()) {
                return Err(ApiError::validation(
                    "input",
                    format!("input[{i}] is an empty string"),
                ));
            }
            tokenize(&state.tokenizer, texts, truncation).await?
        }
        Inputs::Ids(ids) => flatten_ids(ids, truncation, model.vocab_size)?,
    };
    let n = tokenized.lengths.len();
    let prompt_tokens = tokenized.token_ids.len() as u64;
    let request = EmbedRequest {
        token_ids: tokenized.token_ids,
        lengths: tokenized.lengths,
        kind: OutputKind::Dense as i32,
        normalize: opts.normalize,
        dimensions: opts.dimensions.unwrap_or(0),
        raw_scores: false,
        request_id: String::new(),
    };
    let resp = state.replicas.embed(request).await?;
    let dim = resp.dim as usize;
    if resp.rows as usize != n || resp.data.len() != n * dim * 4 {
        return Err(ApiError::Upstream(format!(
            "replica returned {} rows of {} values ({} bytes) for {n} inputs",
            resp.rows,
            resp.dim,
            resp.data.len()
        )));
    }
    Ok(Embeddings {
        rows: n,
        dim,
        data: resp.data,
        prompt_tokens,
    })
}

/// Token-id inputs: checked here so the caller gets the same errors as for
/// text (Tulip checks again: it never trusts its callers).
fn flatten_ids(
    ids: Vec<Vec<u32>>,
    truncation: Truncation,
    vocab_size: u32,
) -> Result<Tokenized, ApiError> {
    let mut out = Tokenized::default();
    for (i, seq) in ids.iter().enumerate() {
        if seq.is_empty() {
            return Err(ApiError::validation("input", format!("input[{i}] is empty")));
        }
        if let Some(&bad) = seq.iter().find(|&&t| t >= vocab_size) {
            return Err(ApiError::validation(
                "input",
                format!("input[{i}] has token id {bad}, outside the vocabulary of {vocab_size}"),
            ));
        }
        let keep = if seq.len() > truncation.max_length {
            if !truncation.enabled {
                return Err(ApiError::validation(
                    "input",
                    format!(
                        "input[{i}] has {} tokens but the model accepts at most {}",
                        seq.len(),
                        truncation.max_length
                    ),
                ));
            }
            match truncation.direction {
                Direction::Right => &seq[..truncation.max_length],
                Direction::Left => &seq[seq.len() - truncation.max_length..],
            }
        } else {
            &seq[..]
        };
        out.token_ids.extend_from_slice(keep);
        out.lengths.push(keep.len() as u32);
    }
    Ok(out)
}
