//! Truncation and the post-processor template (special tokens around one
//! sequence or a pair), with Hugging Face's semantics.

use std::ops::Range;

use crate::{Direction, Encoding};

/// One part of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Piece {
    A,
    B,
    /// The ids of one special token (usually exactly one).
    Special(Vec<u32>),
}

/// What surrounds the sequences: nothing, or a template.
#[derive(Debug, Clone, Default)]
pub(crate) struct Template {
    pub single: Vec<Piece>,
    pub pair: Vec<Piece>,
}

/// Tokens of one sequence before post-processing.
#[derive(Debug, Default, Clone)]
pub(crate) struct Seq {
    pub ids: Vec<u32>,
    pub offsets: Vec<(u32, u32)>,
    /// Where each pre-tokenized split ends (token count so far), and
    /// whether the model produced it (`false`: an added token).
    pub splits: Vec<(u32, bool)>,
}

impl Seq {
    pub(crate) fn clear(&mut self) {
        self.ids.clear();
        self.offsets.clear();
        self.splits.clear();
    }

    /// Closes the split whose tokens were pushed last.
    #[inline]
    pub(crate) fn end_split(&mut self, from_model: bool) {
        self.splits.push((self.ids.len() as u32, from_model));
    }

    /// The length Hugging Face's tokenizer reaches before truncating: with
    /// truncation on, it stops tokenizing at the first model split that
    /// brings the count to `max` (from the end, for left truncation). This
    /// changes what `longest_first` does with pairs, so it is reproduced.
    pub(crate) fn early_stop_len(&self, max: usize, direction: Direction) -> usize {
        let size = |i: usize| {
            let start = if i == 0 { 0 } else { self.splits[i - 1].0 };
            (self.splits[i].0 - start) as usize
        };
        let mut total = 0;
        let mut visit = |i: usize| {
            total += size(i);
            self.splits[i].1 && total >= max
        };
        match direction {
            Direction::Right => {
                let _ = (0..self.splits.len()).any(&mut visit);
            }
            Direction::Left => {
                let _ = (0..self.splits.len()).rev().any(&mut visit);
            }
        }
        total
    }

    #[inline]
    pub(crate) fn push(&mut self, id: u32, offsets: (u32, u32)) {
        self.ids.push(id);
        self.offsets.push(offsets);
    }
}

impl Template {
    /// A file without a post-processor: sequences are concatenated.
    pub(crate) fn none() -> Self {
        Self {
            single: vec![Piece::A],
            pair: vec![Piece::A, Piece::B],
        }
    }

    /// How many special tokens the template adds.
    pub(crate) fn added(&self, pair: bool) -> usize {
        let pieces = if pair { &self.pair } else { &self.single };
        pieces
            .iter()
            .map(|p| match p {
                Piece::Special(ids) => ids.len(),
                _ => 0,
            })
            .sum()
    }

    /// Writes the final encoding: the template over the kept parts of `a`
    /// (and `b`), special tokens only when `add_special`.
    pub(crate) fn apply(
        &self,
        a: (&Seq, Range<usize>),
        b: Option<(&Seq, Range<usize>)>,
        add_special: bool,
        out: &mut Encoding,
    ) {
        let pieces = if b.is_some() {
            &self.pair
        } else {
            &self.single
        };
        for p in pieces {
            let seq = match p {
                Piece::A => Some(&a),
                Piece::B => b.as_ref(),
                Piece::Special(ids) => {
                    if add_special {
                        for &id in ids {
                            out.ids.push(id);
                            out.offsets.push((0, 0));
                            out.special.push(true);
                        }
                    }
                    None
                }
            };
            if let Some((seq, range)) = seq {
                out.ids.extend_from_slice(&seq.ids[range.clone()]);
                out.offsets.extend_from_slice(&seq.offsets[range.clone()]);
                out.special.extend(std::iter::repeat_n(false, range.len()));
            }
        }
    }
}

/// The part of a sequence of `len` tokens kept at `keep` tokens.
pub(crate) fn keep_range(len: usize, keep: usize, direction: Direction) -> Range<usize> {
    if keep >= len {
        return 0..len;
    }
    match direction {
        Direction::Right => 0..keep,
        Direction::Left => len - keep..len,
    }
}

/// How many tokens of each side Hugging Face's `longest_first` keeps when
/// one sequence (`len_b: None`) or a pair must fit `max_len` tokens
/// (special tokens already subtracted).
pub(crate) fn longest_first(len_a: usize, len_b: Option<usize>, max_len: usize) -> (usize, usize) {
    let lb = len_b.unwrap_or(0);
    if max_len == 0 {
        return (0, 0);
    }
    if len_a + lb <= max_len {
        return (len_a, lb);
    }
    let Some(lb) = len_b else {
        return (max_len, 0);
    };
    // n1 is the shorter input; when both must be cut, the longer one gets
    // the odd token.
    let (mut n1, mut n2) = (len_a, lb);
    let swap = n1 > n2;
    if swap {
        std::mem::swap(&mut n1, &mut n2);
    }
    n2 = if n1 > max_len {
        n1
    } else {
        n1.max(max_len - n1)
    };
    if n1 + n2 > max_len {
        n1 = max_len / 2;
        n2 = n1 + max_len % 2;
    }
    if swap {
        std::mem::swap(&mut n1, &mut n2);
    }
    (n1.min(len_a), n2.min(lb))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_first_cuts_the_longer_side() {
        assert_eq!(longest_first(3, Some(10), 8), (3, 5));
        assert_eq!(longest_first(10, Some(3), 8), (5, 3));
        assert_eq!(longest_first(5, Some(10), 8), (4, 4));
        assert_eq!(longest_first(10, Some(10), 7), (3, 4));
        assert_eq!(longest_first(20, Some(10), 7), (4, 3));
        assert_eq!(longest_first(2, Some(2), 0), (0, 0));
        assert_eq!(longest_first(9, None, 4), (4, 0));
        assert_eq!(longest_first(3, None, 4), (3, 0));
        assert_eq!(keep_range(9, 4, Direction::Left), 5..9);
        assert_eq!(keep_range(9, 4, Direction::Right), 0..4);
        assert_eq!(keep_range(3, 4, Direction::Left), 0..3);
    }
}
