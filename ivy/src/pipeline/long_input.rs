//! Inputs longer than the model's window, embedded whole instead of
//! truncated (`long_inputs: "pool"` or `"windows"`, `--long-inputs`).
//!
//! A long input's tokens (without the model's special tokens) are cut into
//! windows of `W = max_length − specials` tokens, each starting `W − W/8`
//! after the previous one (an overlap of `W/8` tokens, so no sentence is
//! only ever seen cut at a window edge), the last one ending at the input's
//! end. Each window gets the model's special tokens back (`[CLS] … [SEP]`)
//! and travels as an ordinary sequence, batched with everything else. With
//! `pool`, the input's vector is the mean of its windows' vectors (before
//! normalization), each weighted by its length in tokens, then normalized
//! as the request asks (as vLLM's chunked processing does); with
//! `windows`, every window's vector is returned. An input that fits is one
//! window, unchanged.

use std::ops::Range;

use bytes::Bytes;
use ivy_tokenizer::{Direction, EncodeOptions, Tokenizer};

use super::encode::Tokenized;
use super::{floats, Output};
use crate::config::LongInputs;
use crate::error::ApiError;

/// How many of the model's special tokens open and close a sequence.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Frame {
    pub prefix: usize,
    pub suffix: usize,
}

impl Frame {
    /// The tokenizer's, read off a one-word text; none for token-id inputs.
    pub fn of(tokenizer: &Tokenizer) -> Result<Self, ApiError> {
        let opts = EncodeOptions {
            add_special_tokens: true,
            max_length: None,
            direction: Direction::Right,
        };
        let enc = tokenizer
            .encode("a", &opts)
            .map_err(|e| ApiError::Internal(format!("reading the special tokens: {e}")))?;
        let prefix = enc.special.iter().take_while(|&&s| s).count();
        let suffix = enc.special.iter().rev().take_while(|&&s| s).count();
        Ok(Self {
            prefix: prefix.min(enc.ids.len()),
            suffix: suffix.min(enc.ids.len().saturating_sub(prefix)),
        })
    }

    /// Cuts the body of `seq` (its tokens between the special tokens) into
    /// `window_ranges`, appends each window framed by the specials to
    /// `out`, and returns the ranges (into the body).
    pub fn windows(
        self,
        seq: &[u32],
        width: usize,
        overlap: usize,
        out: &mut Tokenized,
    ) -> Vec<Range<usize>> {
        let (head, rest) = seq.split_at(self.prefix);
        let (body, tail) = rest.split_at(rest.len() - self.suffix);
        let ranges = window_ranges(body.len(), width, overlap);
        for r in &ranges {
            out.token_ids.extend_from_slice(head);
            out.token_ids.extend_from_slice(&body[r.clone()]);
            out.token_ids.extend_from_slice(tail);
            out.lengths.push((head.len() + r.len() + tail.len()) as u32);
        }
        ranges
    }
}

/// Which windows belong to which input.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Windows {
    /// Windows per input, in input order.
    pub per_input: Vec<u32>,
    /// Each window's length in tokens: its weight in the pooled mean.
    pub lengths: Vec<u32>,
}

impl Windows {
    /// Whether any input was split (else the request runs as it would
    /// without `long_inputs`).
    pub fn split_any(&self) -> bool {
        self.per_input.iter().any(|&n| n > 1)
    }
}

/// Cuts every sequence of `tokenized` longer than `max_length` into
/// overlapping windows, each framed by the special tokens.
pub fn split(tokenized: Tokenized, max_length: usize, frame: Frame) -> (Tokenized, Windows) {
    let specials = frame.prefix + frame.suffix;
    let width = max_length.saturating_sub(specials).max(1);
    let mut out = Tokenized::default();
    let mut windows = Windows::default();
    let mut start = 0usize;
    for &len in &tokenized.lengths {
        let seq = &tokenized.token_ids[start..start + len as usize];
        start += len as usize;
        if seq.len() <= max_length || seq.len() <= specials {
            out.token_ids.extend_from_slice(seq);
            out.lengths.push(len);
            windows.per_input.push(1);
            windows.lengths.push(len);
            continue;
        }
        let ranges = frame.windows(seq, width, width / 8, &mut out);
        windows
            .lengths
            .extend(ranges.iter().map(|r| (specials + r.len()) as u32));
        windows.per_input.push(ranges.len() as u32);
    }
    (out, windows)
}

/// Ranges of `len` tokens: `width` long, each starting `width − overlap`
/// after the previous one, the last ending at `len`.
pub fn window_ranges(len: usize, width: usize, overlap: usize) -> Vec<Range<usize>> {
    let width = width.max(1);
    let stride = width.saturating_sub(overlap).max(1);
    let mut out = Vec::new();
    let mut from = 0;
    loop {
        let to = (from + width).min(len);
        out.push(from..to);
        if to >= len {
            return out;
        }
        from += stride;
    }
}

/// Joins the windows' vectors back into one entry per input: `Pool` the
/// length-weighted mean of each input's (unnormalized) windows, then L2
/// normalization when `normalize`; `Windows` every window's vector, as rows
/// of the input (the multi-vector layout).
pub fn join(out: Output, windows: &Windows, mode: LongInputs, normalize: bool) -> Output {
    let dim = out.dim;
    if mode == LongInputs::Windows {
        let data = out.data().clone();
        return out.regrouped(data, windows.per_input.clone());
    }
    let mut data = Vec::with_capacity(windows.per_input.len() * dim * 4);
    let mut row = 0;
    for &n in &windows.per_input {
        let mut sum = vec![0f64; dim];
        let mut total = 0f64;
        for w in row..row + n as usize {
            let weight = f64::from(windows.lengths[w]);
            total += weight;
            for (s, v) in sum.iter_mut().zip(floats(out.row(w))) {
                *s += weight * f64::from(v);
            }
        }
        row += n as usize;
        let mean: Vec<f64> = sum.iter().map(|s| s / total).collect();
        let norm = if normalize {
            mean.iter().map(|v| v * v).sum::<f64>().sqrt().max(1e-12)
        } else {
            1.0
        };
        for v in mean {
            data.extend_from_slice(&((v / norm) as f32).to_le_bytes());
        }
    }
    out.regrouped(Bytes::from(data), Vec::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tok(seqs: &[Vec<u32>]) -> Tokenized {
        Tokenized {
            token_ids: seqs.concat(),
            lengths: seqs.iter().map(|s| s.len() as u32).collect(),
        }
    }

    #[test]
    fn long_sequences_become_framed_overlapping_windows() {
        let frame = Frame {
            prefix: 1,
            suffix: 1,
        };
        // Window 10 → 8 content tokens, stride 7 (overlap 1).
        let long: Vec<u32> = [vec![101], (1..=20).collect(), vec![102]].concat();
        let (t, w) = split(tok(&[vec![101, 5, 102], long]), 10, frame);
        assert_eq!(w.per_input, vec![1, 3]);
        let seqs: Vec<&[u32]> = {
            let mut at = 0;
            t.lengths
                .iter()
                .map(|&l| {
                    let s = &t.token_ids[at..at + l as usize];
                    at += l as usize;
                    s
                })
                .collect()
        };
        assert_eq!(seqs[0], &[101, 5, 102]);
        assert_eq!(seqs[1], &[101, 1, 2, 3, 4, 5, 6, 7, 8, 102]);
        assert_eq!(seqs[2], &[101, 8, 9, 10, 11, 12, 13, 14, 15, 102]);
        assert_eq!(seqs[3], &[101, 15, 16, 17, 18, 19, 20, 102]);
        assert_eq!(w.lengths, vec![3, 10, 10, 8]);
        assert!(w.split_any());
    }

    #[test]
    fn short_inputs_are_one_window() {
        let (t, w) = split(tok(&[vec![1, 2, 3]]), 10, Frame::default());
        assert!(!w.split_any());
        assert_eq!((t.token_ids, w.per_input), (vec![1, 2, 3], vec![1]));
    }
}
