//! Reassembling the chunks' replies, in input order, into one result, after
//! checking that each reply has the shape its chunk asked for.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use proto::tulip::v1::EmbedResponse;

use super::chunk::Chunk;
use super::Kind;
use crate::error::ApiError;

/// Where time went, for response headers, gRPC replies and metrics.
#[derive(Debug, Clone, Copy, Default)]
pub struct Timing {
    pub tokenize: Duration,
    /// The slowest chunk's queue and inference times, as its replica
    /// measured them (chunks run in parallel).
    pub queue: Duration,
    pub inference: Duration,
}

/// Little-endian f32 bytes (as replicas send every value) as numbers: the
/// one place they are read.
pub fn floats(bytes: &[u8]) -> impl Iterator<Item = f32> + '_ {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
}

/// All sequences' outputs, as little-endian f32 values.
#[derive(Debug)]
pub struct Output {
    pub sequences: usize,
    /// Values per row (dense: the vector size; multi-vector: per token
    /// vector; score and sparse: 1).
    pub dim: usize,
    data: Bytes,
    /// Multi-vector and sparse: rows per sequence, and where each starts.
    row_counts: Vec<u32>,
    row_starts: Vec<usize>,
    /// Sparse: the token id of each row.
    sparse_indices: Vec<u32>,
    /// Tokens processed (templates included).
    pub tokens: u64,
    pub timing: Timing,
}

impl Output {
    /// Joins the replies of `chunks` (same order).
    pub fn merge(
        kind: Kind,
        chunks: &[Chunk],
        replies: Vec<EmbedResponse>,
    ) -> Result<Self, ApiError> {
        let single = replies.len() == 1;
        let mut dim = None;
        let mut data = BytesMut::new();
        let mut only = Bytes::new();
        let (mut row_counts, mut sparse_indices) = (Vec::new(), Vec::new());
        let mut timing = Timing::default();
        for (chunk, reply) in chunks.iter().zip(replies) {
            check(kind, chunk.sequences.len(), &reply)?;
            if *dim.get_or_insert(reply.dim) != reply.dim {
                return Err(bad_reply(format!(
                    "chunks came back with {} and {} values per row",
                    dim.unwrap_or(0),
                    reply.dim
                )));
            }
            if let Some(t) = reply.timing {
                timing.queue = timing.queue.max(Duration::from_micros(t.queue_us));
                timing.inference = timing.inference.max(Duration::from_micros(t.inference_us));
            }
            row_counts.extend_from_slice(&reply.row_counts);
            sparse_indices.extend_from_slice(&reply.sparse_indices);
            // One chunk: keep the reply's buffer as is, no copy.
            if single {
                only = reply.data;
            } else {
                data.extend_from_slice(&reply.data);
            }
        }
        let mut row_starts = Vec::with_capacity(row_counts.len());
        let mut start = 0usize;
        for &n in &row_counts {
            row_starts.push(start);
            start += n as usize;
        }
        Ok(Self {
            sequences: chunks.last().map_or(0, |c| c.sequences.end),
            dim: dim.unwrap_or(0) as usize,
            data: if single { only } else { data.freeze() },
            row_counts,
            row_starts,
            sparse_indices,
            tokens: chunks.last().map_or(0, |c| c.tokens.end) as u64,
            timing,
        })
    }

    /// The same answer over other rows of the same width: `row_counts` rows
    /// per sequence (the multi-vector layout), or none for one row each.
    /// Long inputs' windows are joined back into their inputs this way.
    pub(super) fn regrouped(self, data: Bytes, row_counts: Vec<u32>) -> Self {
        let sequences = if row_counts.is_empty() {
            data.len() / (self.dim * 4).max(1)
        } else {
            row_counts.len()
        };
        let mut row_starts = Vec::with_capacity(row_counts.len());
        let mut start = 0usize;
        for &n in &row_counts {
            row_starts.push(start);
            start += n as usize;
        }
        Self {
            sequences,
            data,
            row_counts,
            row_starts,
            sparse_indices: Vec::new(),
            ..self
        }
    }

    /// One row of `dim` values per sequence (`data` little-endian f32),
    /// made in Ivy from what replicas sent (late chunking's pooled spans).
    pub(super) fn dense_rows(data: Bytes, dim: usize, tokens: u64, timing: Timing) -> Self {
        Self {
            sequences: data.len() / (dim * 4).max(1),
            dim,
            data,
            row_counts: Vec::new(),
            row_starts: Vec::new(),
            sparse_indices: Vec::new(),
            tokens,
            timing,
        }
    }

    /// Dense: a request's text rows and image rows in input order
    /// (`is_image[i]`: input `i` is an image); tokens and times add up.
    pub(super) fn interleave(texts: Self, images: Self, is_image: &[bool]) -> Self {
        let dim = images.dim;
        let mut data = BytesMut::with_capacity(is_image.len() * dim * 4);
        let (mut t, mut i) = (0, 0);
        for &image in is_image {
            if image {
                data.extend_from_slice(images.row(i));
                i += 1;
            } else {
                data.extend_from_slice(texts.row(t));
                t += 1;
            }
        }
        let timing = Timing {
            tokenize: texts.timing.tokenize + images.timing.tokenize,
            queue: texts.timing.queue.max(images.timing.queue),
            inference: texts.timing.inference + images.timing.inference,
        };
        Self::dense_rows(data.freeze(), dim, texts.tokens + images.tokens, timing)
    }

    /// Dense: sequence `i`'s vector, as little-endian f32 bytes.
    pub fn row(&self, i: usize) -> &[u8] {
        let n = self.dim * 4;
        &self.data[i * n..(i + 1) * n]
    }

    /// Dense: every vector, back to back.
    pub fn data(&self) -> &Bytes {
        &self.data
    }

    /// Score: sequence `i`'s score.
    pub fn score(&self, i: usize) -> f32 {
        floats(self.row(i)).next().unwrap_or(f32::NAN)
    }

    /// Multi-vector: sequence `i`'s vectors, back to back.
    pub fn vectors(&self, i: usize) -> &[u8] {
        let n = self.dim * 4;
        let start = self.row_starts[i];
        &self.data[start * n..(start + self.row_counts[i] as usize) * n]
    }

    pub fn row_counts(&self) -> &[u32] {
        &self.row_counts
    }

    /// Sparse: sequence `i`'s token ids and weights (little-endian f32).
    pub fn sparse(&self, i: usize) -> (&[u32], &[u8]) {
        let start = self.row_starts[i];
        let end = start + self.row_counts[i] as usize;
        (
            &self.sparse_indices[start..end],
            &self.data[start * 4..end * 4],
        )
    }
}

/// One reranked text.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Rank {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    pub score: f32,
}

impl Output {
    /// Score: the texts best first (ties keep input order), each with its
    /// text when `texts` is given.
    pub fn ranks(&self, mut texts: Option<Vec<String>>) -> Result<Vec<Rank>, ApiError> {
        let mut ranks = Vec::with_capacity(self.sequences);
        for index in 0..self.sequences {
            let score = self.score(index);
            if score.is_nan() {
                return Err(bad_reply(format!("score of texts[{index}] is NaN")));
            }
            let text = texts.as_mut().map(|t| std::mem::take(&mut t[index]));
            ranks.push(Rank { index, text, score });
        }
        ranks.sort_by(|a, b| b.score.total_cmp(&a.score));
        Ok(ranks)
    }
}

fn bad_reply(msg: String) -> ApiError {
    ApiError::Upstream(format!("a Tulip replica sent a malformed reply: {msg}"))
}

/// The reply's shape matches the chunk and the kind.
fn check(kind: Kind, sequences: usize, r: &EmbedResponse) -> Result<(), ApiError> {
    let (rows, dim) = (r.rows as usize, r.dim as usize);
    if !kind.one_row_per_sequence() {
        let total: u64 = r.row_counts.iter().map(|&c| c as u64).sum();
        if r.row_counts.len() != sequences || total != rows as u64 {
            return Err(bad_reply(format!(
                "{} row counts summing to {total} for {sequences} sequences and {rows} rows",
                r.row_counts.len()
            )));
        }
    } else if rows != sequences {
        return Err(bad_reply(format!("{rows} rows for {sequences} sequences")));
    }
    if matches!(kind, Kind::Score | Kind::Sparse) && dim != 1 {
        return Err(bad_reply(format!(
            "{dim} values per row where 1 was expected"
        )));
    }
    if kind == Kind::Sparse && r.sparse_indices.len() != rows {
        return Err(bad_reply(format!(
            "{} token ids for {rows} sparse weights",
            r.sparse_indices.len()
        )));
    }
    if r.data.len() != rows * dim * 4 {
        return Err(bad_reply(format!(
            "{} bytes for {rows} rows of {dim} values",
            r.data.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn floats(v: &[f32]) -> Bytes {
        v.iter()
            .flat_map(|x| x.to_le_bytes())
            .collect::<Vec<u8>>()
            .into()
    }

    fn to_f32(b: &[u8]) -> Vec<f32> {
        super::floats(b).collect()
    }

    fn chunk(s: std::ops::Range<usize>, t: std::ops::Range<usize>) -> Chunk {
        Chunk {
            sequences: s,
            tokens: t,
        }
    }

    #[test]
    fn dense_chunks_concatenate_in_order() {
        let a = EmbedResponse {
            rows: 2,
            dim: 2,
            data: floats(&[1., 2., 3., 4.]),
            ..Default::default()
        };
        let b = EmbedResponse {
            rows: 1,
            dim: 2,
            data: floats(&[5., 6.]),
            ..Default::default()
        };
        let out = Output::merge(
            Kind::Dense,
            &[chunk(0..2, 0..7), chunk(2..3, 7..9)],
            vec![a, b],
        )
        .unwrap();
        assert_eq!((out.sequences, out.dim, out.tokens), (3, 2, 9));
        assert_eq!(to_f32(out.row(2)), vec![5., 6.]);
        assert_eq!(to_f32(out.row(0)), vec![1., 2.]);
    }

    #[test]
    fn sparse_and_multi_vector_rows_follow_their_sequence() {
        let a = EmbedResponse {
            rows: 3,
            dim: 1,
            row_counts: vec![2, 1],
            sparse_indices: vec![7, 9, 4],
            data: floats(&[0.5, 0.25, 1.0]),
            ..Default::default()
        };
        let b = EmbedResponse {
            rows: 1,
            dim: 1,
            row_counts: vec![1],
            sparse_indices: vec![3],
            data: floats(&[2.0]),
            ..Default::default()
        };
        let out = Output::merge(
            Kind::Sparse,
            &[chunk(0..2, 0..4), chunk(2..3, 4..6)],
            vec![a, b],
        )
        .unwrap();
        let (ids, w) = out.sparse(1);
        assert_eq!((ids, to_f32(w)), (&[4u32][..], vec![1.0]));
        assert_eq!(out.sparse(2).0, &[3]);

        let m = EmbedResponse {
            rows: 3,
            dim: 2,
            row_counts: vec![1, 2],
            data: floats(&[1., 1., 2., 2., 3., 3.]),
            ..Default::default()
        };
        let out = Output::merge(Kind::MultiVector, &[chunk(0..2, 0..5)], vec![m]).unwrap();
        assert_eq!(to_f32(out.vectors(1)), vec![2., 2., 3., 3.]);
    }

    #[test]
    fn ranks_are_best_first_with_optional_text() {
        let r = EmbedResponse {
            rows: 3,
            dim: 1,
            data: floats(&[0.1, 0.9, 0.5]),
            ..Default::default()
        };
        let out = Output::merge(Kind::Score, &[chunk(0..3, 0..9)], vec![r]).unwrap();
        let ranks = out
            .ranks(Some(vec!["a".into(), "b".into(), "c".into()]))
            .unwrap();
        let got: Vec<(usize, Option<&str>)> =
            ranks.iter().map(|r| (r.index, r.text.as_deref())).collect();
        assert_eq!(got, vec![(1, Some("b")), (2, Some("c")), (0, Some("a"))]);
        assert!(out.ranks(None).unwrap().iter().all(|r| r.text.is_none()));
    }

    #[test]
    fn malformed_replies_are_refused() {
        let short = EmbedResponse {
            rows: 1,
            dim: 2,
            data: floats(&[1., 2.]),
            ..Default::default()
        };
        assert!(Output::merge(Kind::Dense, &[chunk(0..2, 0..4)], vec![short]).is_err());
        let bytes = EmbedResponse {
            rows: 1,
            dim: 2,
            data: floats(&[1.]),
            ..Default::default()
        };
        assert!(Output::merge(Kind::Dense, &[chunk(0..1, 0..4)], vec![bytes]).is_err());
        let counts = EmbedResponse {
            rows: 2,
            dim: 1,
            row_counts: vec![2],
            sparse_indices: vec![1, 2],
            data: floats(&[1., 1.]),
            ..Default::default()
        };
        assert!(Output::merge(Kind::Sparse, &[chunk(0..2, 0..4)], vec![counts]).is_err());
    }
}
