//! Turning the engine's rows into a request's response, per output kind.
//!
//! Engine row layout (see rose/interface.py): dense, one row of the model's
//! dimension per sequence (zeros past the requested dimensions); score, one
//! row of (raw logit, activation) per sequence; multi-vector, `len - 1` rows
//! per sequence; sparse, one weight per token.

use bytes::Bytes;
use proto::tulip::v1::{Dtype, EmbedResponse};

use crate::model::Kind;

/// How many engine rows a sequence of `len` tokens gets.
pub fn rows_for(kind: Kind, len: usize) -> usize {
    match kind {
        Kind::Dense | Kind::Image | Kind::Score | Kind::Classify | Kind::SparseVocab => 1,
        Kind::MultiVector => len.saturating_sub(1),
        Kind::Sparse | Kind::TokenStates => len,
    }
}

/// A request's outputs, filled sequence by sequence as batches complete.
pub enum Accumulator {
    /// Fixed-size rows written in place: `dim` floats per sequence.
    Fixed { dim: usize, data: Vec<u8> },
    /// One score per sequence.
    Scores { data: Vec<u8> },
    /// Variable rows per sequence (multi-vector).
    Rows { dim: usize, per_seq: Vec<Vec<u8>> },
    /// (token id, weight) pairs per sequence, sorted by id.
    Sparse { per_seq: Vec<Vec<(u32, f32)>> },
    /// The same from one row of vocabulary weights per sequence (SPLADE).
    VocabSparse { per_seq: Vec<Vec<(u32, f32)>> },
}

impl Accumulator {
    /// `dim` is the response's row width (dense: the requested dimensions;
    /// multi-vector: the model's multi-vector dimension).
    pub fn new(kind: Kind, sequences: usize, dim: usize) -> Self {
        match kind {
            Kind::Dense | Kind::Image | Kind::Classify => Self::Fixed {
                dim,
                data: vec![0; sequences * dim * 4],
            },
            Kind::Score => Self::Scores {
                data: vec![0; sequences * 4],
            },
            Kind::MultiVector | Kind::TokenStates => Self::Rows {
                dim,
                per_seq: vec![Vec::new(); sequences],
            },
            Kind::Sparse => Self::Sparse {
                per_seq: vec![Vec::new(); sequences],
            },
            Kind::SparseVocab => Self::VocabSparse {
                per_seq: vec![Vec::new(); sequences],
            },
        }
    }

    /// Stores sequence `index`'s engine rows (`cols` floats each).
    /// `tokens` are its token ids (sparse weights are per token).
    pub fn put(
        &mut self,
        index: usize,
        rows: &[f32],
        cols: usize,
        tokens: &[u32],
        raw_scores: bool,
    ) {
        match self {
            Self::Scores { data } => {
                // Score rows are (raw, activated).
                let v = if raw_scores { rows[0] } else { rows[1] };
                data[index * 4..index * 4 + 4].copy_from_slice(&v.to_le_bytes());
            }
            Self::Fixed { dim, data } => {
                let out = &mut data[index * *dim * 4..(index + 1) * *dim * 4];
                for (dst, v) in out.chunks_exact_mut(4).zip(&rows[..*dim]) {
                    dst.copy_from_slice(&v.to_le_bytes());
                }
            }
            Self::Rows { dim, per_seq } => {
                let n = rows.len() / cols.max(1);
                let out = &mut per_seq[index];
                out.reserve(n * *dim * 4);
                for r in 0..n {
                    for v in &rows[r * cols..r * cols + *dim] {
                        out.extend_from_slice(&v.to_le_bytes());
                    }
                }
            }
            Self::Sparse { per_seq } => {
                per_seq[index] = sparse_weights(tokens, rows);
            }
            Self::VocabSparse { per_seq } => {
                per_seq[index] = rows
                    .iter()
                    .enumerate()
                    .filter(|(_, &w)| w > 0.0)
                    .map(|(id, &w)| (id as u32, w))
                    .collect();
            }
        }
    }

    /// The response body for all sequences.
    pub fn finish(self, kind: Kind, sequences: usize) -> EmbedResponse {
        let mut resp = EmbedResponse {
            kind: kind.to_proto() as i32,
            dtype: Dtype::Float32 as i32,
            ..Default::default()
        };
        match self {
            Self::Fixed { dim, data } => {
                resp.rows = sequences as u32;
                resp.dim = dim as u32;
                resp.data = Bytes::from(data);
            }
            Self::Scores { data } => {
                resp.rows = sequences as u32;
                resp.dim = 1;
                resp.data = Bytes::from(data);
            }
            Self::Rows { dim, per_seq } => {
                resp.dim = dim as u32;
                resp.row_counts = per_seq
                    .iter()
                    .map(|r| (r.len() / (dim * 4).max(1)) as u32)
                    .collect();
                resp.rows = resp.row_counts.iter().sum();
                resp.data = Bytes::from(per_seq.concat());
            }
            Self::Sparse { per_seq } | Self::VocabSparse { per_seq } => {
                resp.dim = 1;
                resp.row_counts = per_seq.iter().map(|r| r.len() as u32).collect();
                resp.rows = resp.row_counts.iter().sum();
                let mut data = Vec::with_capacity(resp.rows as usize * 4);
                for (id, w) in per_seq.iter().flatten() {
                    resp.sparse_indices.push(*id);
                    data.extend_from_slice(&w.to_le_bytes());
                }
                resp.data = Bytes::from(data);
            }
        }
        resp
    }
}

/// Lexical weights: the largest weight of each token id, positive weights
/// only (the engine gives special tokens 0), sorted by id.
pub fn sparse_weights(tokens: &[u32], weights: &[f32]) -> Vec<(u32, f32)> {
    let mut pairs: Vec<(u32, f32)> = tokens
        .iter()
        .zip(weights)
        .filter(|(_, &w)| w > 0.0)
        .map(|(&t, &w)| (t, w))
        .collect();
    pairs.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.total_cmp(&a.1)));
    pairs.dedup_by_key(|p| p.0);
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn floats(b: &[u8]) -> Vec<f32> {
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn sparse_keeps_max_per_id_and_drops_zeros() {
        let got = sparse_weights(&[5, 3, 5, 9, 3], &[0.2, 0.0, 0.7, 0.1, 0.4]);
        assert_eq!(got, vec![(3, 0.4), (5, 0.7), (9, 0.1)]);
    }

    #[test]
    fn dense_rows_are_truncated_to_requested_dim() {
        let mut acc = Accumulator::new(Kind::Dense, 2, 2);
        acc.put(1, &[1.0, 2.0, 0.0], 3, &[], false);
        acc.put(0, &[3.0, 4.0, 0.0], 3, &[], false);
        let r = acc.finish(Kind::Dense, 2);
        assert_eq!((r.rows, r.dim), (2, 2));
        assert_eq!(floats(&r.data), vec![3.0, 4.0, 1.0, 2.0]);
    }

    #[test]
    fn score_picks_raw_or_activated() {
        for (raw, want) in [(true, -1.5), (false, 0.25)] {
            let mut acc = Accumulator::new(Kind::Score, 1, 1);
            acc.put(0, &[-1.5, 0.25], 2, &[], raw);
            assert_eq!(floats(&acc.finish(Kind::Score, 1).data), vec![want]);
        }
    }

    #[test]
    fn multi_vector_counts_rows_per_sequence() {
        let mut acc = Accumulator::new(Kind::MultiVector, 2, 2);
        acc.put(0, &[1.0, 0.0, 0.0, 1.0], 2, &[], false);
        acc.put(1, &[], 2, &[], false);
        let r = acc.finish(Kind::MultiVector, 2);
        assert_eq!(r.row_counts, vec![2, 0]);
        assert_eq!(r.rows, 2);
        assert_eq!(floats(&r.data), vec![1.0, 0.0, 0.0, 1.0]);
    }

    #[test]
    fn vocabulary_weights_become_sorted_pairs_and_classifier_logits_rows() {
        let mut acc = Accumulator::new(Kind::SparseVocab, 1, 1);
        acc.put(0, &[0.0, 0.5, 0.0, 2.0], 4, &[7, 8], false);
        let r = acc.finish(Kind::SparseVocab, 1);
        assert_eq!(r.kind, proto::tulip::v1::OutputKind::Sparse as i32);
        assert_eq!((r.row_counts, r.sparse_indices), (vec![2], vec![1, 3]));
        assert_eq!(floats(&r.data), vec![0.5, 2.0]);
        let mut acc = Accumulator::new(Kind::Classify, 1, 3);
        acc.put(0, &[-1.0, 0.5, 2.0], 3, &[], false);
        let r = acc.finish(Kind::Classify, 1);
        assert_eq!((r.rows, r.dim), (1, 3));
        assert_eq!(floats(&r.data), vec![-1.0, 0.5, 2.0]);
    }

    #[test]
    fn rows_per_kind() {
        assert_eq!(rows_for(Kind::Dense, 7), 1);
        assert_eq!(rows_for(Kind::MultiVector, 7), 6);
        assert_eq!(rows_for(Kind::TokenStates, 7), 7);
        assert_eq!(rows_for(Kind::Sparse, 7), 7);
    }
}
