//! Cutting a request into chunks on a token budget. Time on a replica tracks
//! tokens, not sequences, so a chunk holds at most `budget` tokens (a single
//! longer sequence gets a chunk of its own: a sequence is never split) and at
//! most `max_sequences` sequences (the replica's per-request cap).

use std::ops::Range;

/// Consecutive sequences, and where their tokens sit in the flat id array.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub sequences: Range<usize>,
    pub tokens: Range<usize>,
}

/// Chunks covering every sequence in order. `budget == 0` means no token
/// budget (one chunk, unless `max_sequences` cuts it).
pub fn cut(lengths: &[u32], budget: usize, max_sequences: usize) -> Vec<Chunk> {
    let budget = if budget == 0 { usize::MAX } else { budget };
    let max_sequences = max_sequences.max(1);
    let mut chunks = Vec::new();
    let (mut seq_start, mut tok_start, mut tokens) = (0, 0, 0usize);
    for (i, &len) in lengths.iter().enumerate() {
        let len = len as usize;
        let count = i - seq_start;
        if count > 0 && (tokens + len > budget || count == max_sequences) {
            chunks.push(Chunk {
                sequences: seq_start..i,
                tokens: tok_start..tok_start + tokens,
            });
            seq_start = i;
            tok_start += tokens;
            tokens = 0;
        }
        tokens += len;
    }
    if seq_start < lengths.len() {
        chunks.push(Chunk {
            sequences: seq_start..lengths.len(),
            tokens: tok_start..tok_start + tokens,
        });
    }
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shapes(lengths: &[u32], budget: usize, max: usize) -> Vec<Vec<u32>> {
        cut(lengths, budget, max)
            .iter()
            .map(|c| lengths[c.sequences.clone()].to_vec())
            .collect()
    }

    #[test]
    fn cuts_on_the_token_budget() {
        assert_eq!(shapes(&[3, 3, 3, 3], 6, 100), vec![vec![3, 3], vec![3, 3]]);
        assert_eq!(shapes(&[3, 3, 3], 7, 100), vec![vec![3, 3], vec![3]]);
        assert_eq!(shapes(&[1, 9, 1], 4, 100), vec![vec![1], vec![9], vec![1]]);
    }

    #[test]
    fn zero_budget_is_one_chunk_and_sequence_cap_applies() {
        assert_eq!(shapes(&[5, 5, 5], 0, 100), vec![vec![5, 5, 5]]);
        assert_eq!(
            shapes(&[1, 1, 1, 1, 1], 0, 2),
            vec![vec![1, 1], vec![1, 1], vec![1]]
        );
        assert!(cut(&[], 10, 10).is_empty());
    }

    #[test]
    fn chunks_tile_sequences_and_tokens_in_order() {
        let lengths: Vec<u32> = (0..200).map(|i| (i * 37 % 300 + 1) as u32).collect();
        for budget in [0, 1, 64, 512, 2048, 100_000] {
            let chunks = cut(&lengths, budget, 64);
            let (mut seq, mut tok) = (0, 0);
            for c in &chunks {
                assert_eq!(c.sequences.start, seq);
                assert_eq!(c.tokens.start, tok);
                let n: u32 = lengths[c.sequences.clone()].iter().sum();
                assert_eq!(c.tokens.len(), n as usize);
                assert!(c.sequences.len() <= 64 && !c.sequences.is_empty());
                assert!(budget == 0 || c.sequences.len() == 1 || c.tokens.len() <= budget);
                seq = c.sequences.end;
                tok = c.tokens.end;
            }
            assert_eq!(seq, lengths.len());
        }
    }
}
