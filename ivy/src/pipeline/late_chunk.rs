//! Late chunking (`late_chunking: true`, as in Jina's API): the inputs are
//! the chunks of one document, in order, and each gets a vector pooled from
//! one pass over the whole document, so every chunk carries its document's
//! context.
//!
//! The chunks are joined into the document (one space between two chunks,
//! none where either side already has whitespace), the prompt template
//! prepended, and the whole tokenized once. Tulip returns every token's
//! state (`token_states`) and each chunk's vector is the model's pooling
//! (`InfoResponse.span_pooling`) over its span, then `dimensions` and
//! normalization as for any vector. Models whose head does more than pool
//! (Dense projections, a quantizing map) are refused: their vectors cannot
//! be pooled outside the engine.
//!
//! A token belongs to the chunk holding its last byte, so a token that
//! carries the space before a word (byte-level BPE's `Ġword`) goes with the
//! word. The special tokens and the prompt open the first chunk's span and
//! close the last one's, so a document of one chunk gets its ordinary
//! embedding. CLS-pooled models are mean-pooled over spans: a span has no
//! [CLS] of its own (the late-chunking paper and Jina's code pool means).
//!
//! A document longer than the model is sent in overlapping windows (each
//! shares a quarter of its tokens with the next), every token's state taken
//! from the window where it has the most context on both sides, so a chunk
//! across two windows pools across them. All windows' tokens count against
//! `--max-tokens-per-request`; `usage` counts the document's tokens once.

use std::ops::Range;
use std::time::Instant;

use bytes::Bytes;
use ivy_tokenizer::{Direction, EncodeOptions, Tokenizer};
use proto::tulip::v1::InfoResponse;

use super::blocking::off_reactor;
use super::encode::Tokenized;
use super::long_input::Frame;
use super::{floats, infer, prepare, Inputs, Job, Kind, Options, Output};
use crate::error::ApiError;
use crate::metrics::Stage;
use crate::state::AppState;

pub(super) async fn run(
    state: &AppState,
    job: Job,
    model: &InfoResponse,
) -> Result<Output, ApiError> {
    let pooling = Pooling::of(&job, model)?;
    let field = job.field;
    let Inputs::Texts(chunks) = job.inputs else {
        return Err(ApiError::validation(
            field,
            "`late_chunking` takes the document's chunks as texts",
        ));
    };
    let started = Instant::now();
    let pool = job.pool;
    let templates = state.templates(&pool);
    let prefix = templates
        .prefix(job.options.prompt_name.as_deref())?
        .unwrap_or_default()
        .to_owned();
    let max = prepare::max_input_length(
        state.config.max_input_length,
        templates.max_input_length,
        model,
    );
    let tokenizer = state.tokenizer(&pool)?;
    let plan = off_reactor("tokenization", move || {
        Plan::new(&tokenizer, &prefix, &chunks, max, field)
    })
    .await?;
    let tokenize = started.elapsed();
    state.metrics.stage(Stage::Tokenize, tokenize);

    // Token states carry no dimensions or normalization of their own.
    let sent = Options {
        dimensions: None,
        normalize: None,
        ..job.options.clone()
    };
    let (states, priority) = infer(
        state,
        &pool,
        model,
        &plan.sent,
        Kind::TokenStates,
        &sent,
        None,
        field,
    )
    .await?;
    let normalize = job.options.normalize.unwrap_or(model.normalize_default);
    let dimensions = job.options.dimensions.map(|d| d as usize);
    let mut out = off_reactor("late chunking", move || {
        plan.pool(&states, pooling, dimensions, normalize)
    })
    .await?;
    out.timing.tokenize = tokenize;
    state.metrics.class(priority.name(), started.elapsed());
    state.metrics.tokens(out.tokens);
    Ok(out)
}

/// How a span's token states become its vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pooling {
    Mean,
    MeanSqrtLen,
    Max,
    /// Token i of the document weighs i + 1 (sentence-transformers'
    /// `weightedmean`).
    WeightedMean,
    /// The span's last token (causal models).
    Last,
}

impl Pooling {
    fn of(job: &Job, model: &InfoResponse) -> Result<Self, ApiError> {
        if job.kind != Kind::Dense {
            return Err(ApiError::validation(
                "late_chunking",
                "`late_chunking` applies to dense embeddings only",
            ));
        }
        let refuse = |why: &str| {
            ApiError::Unsupported(format!(
                "the served model `{}` cannot late-chunk: {why}; embed the chunks without `late_chunking`",
                model.model_id
            ))
        };
        if model.token_states_dimension == 0 {
            return Err(refuse("it does not produce token states"));
        }
        Ok(match model.span_pooling.as_str() {
            "mean" | "cls" => Self::Mean,
            "mean_sqrt_len" => Self::MeanSqrtLen,
            "max" => Self::Max,
            "weightedmean" => Self::WeightedMean,
            "last" => Self::Last,
            "" => {
                return Err(refuse(
                    "its vectors are not a pooling of its token states alone (its head projects or quantizes after pooling)",
                ))
            }
            other => return Err(refuse(&format!("its pooling `{other}` has no span form here"))),
        })
    }
}

/// What is sent for one document, and how the states come back together.
#[derive(Debug)]
struct Plan {
    /// The document as one sequence, or its windows.
    sent: Tokenized,
    /// For each token of the document, the (window, row) its state comes
    /// from.
    source: Vec<(usize, usize)>,
    /// Each chunk's tokens, as positions in the document.
    spans: Vec<Range<usize>>,
}

impl Plan {
    fn new(
        tokenizer: &Tokenizer,
        prefix: &str,
        chunks: &[String],
        max_length: usize,
        field: &'static str,
    ) -> Result<Self, ApiError> {
        let (doc, ends) = join(chunks);
        let text = format!("{prefix}{doc}");
        let opts = EncodeOptions {
            add_special_tokens: true,
            max_length: None,
            direction: Direction::Right,
        };
        let enc = tokenizer
            .encode(&text, &opts)
            .map_err(|e| ApiError::Internal(format!("tokenizing the document: {e}")))?;
        let owners = owners(&enc.offsets, &enc.special, prefix.len(), &ends);
        let spans = spans(&owners, chunks.len(), field)?;
        let n = enc.ids.len();
        let mut sent = Tokenized::default();
        if n <= max_length {
            sent.token_ids = enc.ids;
            sent.lengths.push(n as u32);
            let source = (0..n).map(|p| (0, p)).collect();
            return Ok(Self {
                sent,
                source,
                spans,
            });
        }
        let frame = Frame {
            prefix: enc.special.iter().take_while(|&&s| s).count(),
            suffix: enc.special.iter().rev().take_while(|&&s| s).count(),
        };
        let width = max_length.saturating_sub(frame.prefix + frame.suffix);
        if width == 0 || frame.prefix + frame.suffix >= n {
            return Err(ApiError::Internal(format!(
                "a window of {max_length} tokens holds no text between the model's special tokens"
            )));
        }
        let ranges = frame.windows(&enc.ids, width, width / 4, &mut sent);
        let source = sources(n, frame, &ranges, &sent.lengths);
        Ok(Self {
            sent,
            source,
            spans,
        })
    }

    /// Each chunk's vector from the replies' token states.
    fn pool(
        &self,
        states: &Output,
        pooling: Pooling,
        dimensions: Option<usize>,
        normalize: bool,
    ) -> Result<Output, ApiError> {
        let hidden = states.dim;
        let counts = states.row_counts();
        if counts != self.sent.lengths.as_slice() || hidden == 0 {
            return Err(ApiError::Upstream(format!(
                "a Tulip replica sent {counts:?} token states of width {hidden} for sequences of {:?} tokens",
                self.sent.lengths
            )));
        }
        let state = |p: usize| {
            let (w, r) = self.source[p];
            floats(&states.vectors(w)[r * hidden * 4..(r + 1) * hidden * 4])
        };
        let dim = dimensions.unwrap_or(hidden).min(hidden);
        let mut data = Vec::with_capacity(self.spans.len() * dim * 4);
        for span in &self.spans {
            let mut v = vec![0f64; hidden];
            match pooling {
                Pooling::Last => {
                    for (a, x) in v.iter_mut().zip(state(span.end - 1)) {
                        *a = f64::from(x);
                    }
                }
                Pooling::Max => {
                    v.fill(f64::NEG_INFINITY);
                    for p in span.clone() {
                        for (a, x) in v.iter_mut().zip(state(p)) {
                            *a = a.max(f64::from(x));
                        }
                    }
                }
                Pooling::Mean | Pooling::MeanSqrtLen | Pooling::WeightedMean => {
                    let mut total = 0f64;
                    for p in span.clone() {
                        let w = if pooling == Pooling::WeightedMean {
                            (p + 1) as f64
                        } else {
                            1.0
                        };
                        total += w;
                        for (a, x) in v.iter_mut().zip(state(p)) {
                            *a += w * f64::from(x);
                        }
                    }
                    let scale = match pooling {
                        Pooling::MeanSqrtLen => total.sqrt(),
                        _ => total,
                    };
                    v.iter_mut().for_each(|a| *a /= scale);
                }
            }
            v.truncate(dim);
            let norm = if normalize {
                v.iter().map(|a| a * a).sum::<f64>().sqrt().max(1e-12)
            } else {
                1.0
            };
            for a in v {
                data.extend_from_slice(&((a / norm) as f32).to_le_bytes());
            }
        }
        Ok(Output::dense_rows(
            Bytes::from(data),
            dim,
            self.source.len() as u64,
            states.timing,
        ))
    }
}

/// The document and where each chunk's region ends in it (byte offsets;
/// a joining space belongs to the chunk after it).
fn join(chunks: &[String]) -> (String, Vec<usize>) {
    let mut doc = String::with_capacity(chunks.iter().map(|c| c.len() + 1).sum());
    let mut ends = Vec::with_capacity(chunks.len());
    for (i, chunk) in chunks.iter().enumerate() {
        if i > 0 && !doc.ends_with(char::is_whitespace) && !chunk.starts_with(char::is_whitespace) {
            doc.push(' ');
        }
        doc.push_str(chunk);
        ends.push(doc.len());
    }
    (doc, ends)
}

/// The chunk of every token: the one holding its last byte; special
/// tokens and the prompt (before `at`) go with the token before them, or
/// with the first chunk.
fn owners(offsets: &[(u32, u32)], special: &[bool], at: usize, ends: &[usize]) -> Vec<usize> {
    let doc_len = ends.last().copied().unwrap_or(0);
    let mut current = 0;
    offsets
        .iter()
        .zip(special)
        .map(|(&(start, end), &special)| {
            let (start, end) = (start as usize, end as usize);
            if !special && end > start && end > at {
                let last = end - 1 - at;
                if last < doc_len {
                    let chunk = ends.partition_point(|&e| e <= last);
                    current = current.max(chunk.min(ends.len().saturating_sub(1)));
                }
            }
            current
        })
        .collect()
}

/// Each chunk's span of tokens; a chunk with none of its own is refused.
fn spans(
    owners: &[usize],
    chunks: usize,
    field: &'static str,
) -> Result<Vec<Range<usize>>, ApiError> {
    let mut spans = vec![0..0; chunks];
    for (p, &c) in owners.iter().enumerate() {
        if spans[c].is_empty() {
            spans[c] = p..p + 1;
        } else {
            spans[c].end = p + 1;
        }
    }
    match spans.iter().position(Range::is_empty) {
        Some(c) => Err(ApiError::validation(
            field,
            format!(
                "{field}[{c}] has no token of its own (it is only whitespace, or inside a token of the chunk before it); join it to a neighbour"
            ),
        )),
        None => Ok(spans),
    }
}

/// For each of the document's `n` tokens, the window and row to read its
/// state from: special tokens from the first and last windows, every other
/// token from the window where the fewest tokens separate it from an edge.
fn sources(
    n: usize,
    frame: Frame,
    ranges: &[Range<usize>],
    lengths: &[u32],
) -> Vec<(usize, usize)> {
    let last = ranges.len() - 1;
    let mut out = Vec::with_capacity(n);
    out.extend((0..frame.prefix).map(|p| (0, p)));
    let body = n - frame.prefix - frame.suffix;
    let mut first = 0;
    for b in 0..body {
        while ranges[first].end <= b {
            first += 1;
        }
        let mut best = (first, 0usize);
        for (k, r) in ranges.iter().enumerate().skip(first) {
            if r.start > b {
                break;
            }
            let room = (b - r.start).min(r.end - 1 - b);
            if k == first || room > best.1 {
                best = (k, room);
            }
        }
        out.push((best.0, frame.prefix + b - ranges[best.0].start));
    }
    let tail = lengths[last] as usize - frame.suffix;
    out.extend((0..frame.suffix).map(|s| (last, tail + s)));
    out
}

#[cfg(test)]
mod tests;
