//! Text under normalization, with the original byte range of every byte.
//!
//! This mirrors Hugging Face's `NormalizedString` rule for rule (how a
//! replaced, inserted or removed character moves the alignments), because
//! token offsets must come out identical, including in the odd corners such
//! as a removal at the very start of a string. Offsets here are absolute
//! (into the whole input), where Hugging Face keeps them relative to each
//! slice plus a shift: the two are equal by construction.

use std::ops::Range;

/// An original byte range `(start, end)`.
pub(crate) type Align = (u32, u32);

/// A normalized string and, for each of its bytes, the original range.
#[derive(Debug, Default, Clone)]
pub(crate) struct NormBuf {
    pub text: String,
    pub align: Vec<Align>,
    /// The original range this string stands for (Hugging Face's
    /// `original_shift` and original length). Transforms never change it.
    pub orig: (u32, u32),
}

impl NormBuf {
    /// Starts from original text `s` found at byte `base` of the input.
    pub(crate) fn set(&mut self, s: &str, base: u32) {
        self.text.clear();
        self.text.push_str(s);
        self.align.clear();
        self.align.reserve(s.len());
        // Byte by byte: a lead byte opens a char, whose range every byte of
        // it gets (no decoding needed).
        let mut current = (base, base);
        for (i, &b) in s.as_bytes().iter().enumerate() {
            if b & 0xC0 != 0x80 {
                let len = match b {
                    0x00..=0x7F => 1,
                    0xC0..=0xDF => 2,
                    0xE0..=0xEF => 3,
                    _ => 4,
                };
                let start = base + i as u32;
                current = (start, start + len);
            }
            self.align.push(current);
        }
        self.orig = (base, base + s.len() as u32);
    }

    /// The original range of normalized bytes `range` (Hugging Face's
    /// `convert_offsets(Range::Normalized(..))` plus the shift).
    #[inline]
    pub(crate) fn original_span(&self, range: Range<usize>) -> Option<Align> {
        if range.is_empty() || range.end > self.align.len() {
            return None;
        }
        Some((self.align[range.start].0, self.align[range.end - 1].1))
    }

    /// The normalized range covering the whole original string: what
    /// `transform` rewrites (Hugging Face converts `Original(..)` to it).
    fn full_range(&self) -> Option<Range<usize>> {
        let (shift, end) = self.orig;
        if shift == end {
            return Some(0..0);
        }
        let mut start = None;
        let mut stop = None;
        for (i, &(a, b)) in self.align.iter().enumerate() {
            if end < b {
                break;
            }
            if start.is_none() && shift <= a && a != b {
                start = Some(i);
            }
            stop = Some(i + 1);
        }
        match (start, stop) {
            (Some(s), Some(e)) => Some(s..e),
            (None, Some(e)) => Some(e..e),
            (Some(s), None) => Some(s..s),
            (None, None) => None,
        }
    }

    /// Writes into `out` this string with `range` rewritten by `dest`, a
    /// sequence of `(char, change)`: `change` is 1 for an inserted char, 0
    /// for a char replacing the next one, `-n` for a char replacing the next
    /// one and removing `n` more. `initial_offset` chars at the start of the
    /// range are removed first.
    pub(crate) fn transform_into<I>(
        &self,
        range: Range<usize>,
        dest: I,
        initial_offset: usize,
        out: &mut NormBuf,
    ) where
        I: IntoIterator<Item = (char, isize)>,
    {
        out.text.clear();
        out.align.clear();
        out.orig = self.orig;
        out.text.push_str(&self.text[..range.start]);
        out.align.extend_from_slice(&self.align[..range.start]);

        let mut replaced = self.text[range.clone()].chars();
        let initial_removed: usize = (&mut replaced)
            .take(initial_offset)
            .map(char::len_utf8)
            .sum();
        let mut offset = range.start + initial_removed;
        for (c, changes) in dest {
            let align = if changes > 0 {
                if offset < 1 {
                    (0, 0)
                } else {
                    self.align_at(offset - 1)
                }
            } else {
                self.align_at(offset)
            };
            if changes <= 0 {
                offset += replaced.next().map_or(0, char::len_utf8);
            }
            if changes < 0 {
                offset += (&mut replaced)
                    .take(changes.unsigned_abs())
                    .map(char::len_utf8)
                    .sum::<usize>();
            }
            out.text.push(c);
            for _ in 0..c.len_utf8() {
                out.align.push(align);
            }
        }

        out.text.push_str(&self.text[range.end..]);
        out.align.extend_from_slice(&self.align[range.end..]);
    }

    /// Like [`transform_into`](Self::transform_into) over the whole string.
    pub(crate) fn transform_all_into<I>(&self, dest: I, initial_offset: usize, out: &mut NormBuf)
    where
        I: IntoIterator<Item = (char, isize)>,
    {
        match self.full_range() {
            Some(range) => self.transform_into(range, dest, initial_offset, out),
            None => out.clone_from(self),
        }
    }

    /// Hugging Face indexes alignments by byte and would panic past the end
    /// on inconsistent changes; this returns the last alignment instead.
    #[inline]
    fn align_at(&self, i: usize) -> Align {
        match self.align.get(i) {
            Some(&a) => a,
            None => self.align.last().copied().unwrap_or((0, 0)),
        }
    }

    /// Writes into `out` this string with each match (sorted, disjoint byte
    /// ranges) replaced by `content`. Every inserted char takes the
    /// alignment of the last byte of its match, as Hugging Face's `replace`.
    pub(crate) fn replace_into(&self, matches: &[Range<usize>], content: &str, out: &mut NormBuf) {
        out.text.clear();
        out.align.clear();
        out.orig = self.orig;
        let mut last = 0;
        for m in matches {
            out.text.push_str(&self.text[last..m.start]);
            out.align.extend_from_slice(&self.align[last..m.start]);
            let align = if m.end < 1 {
                (0, 0)
            } else {
                self.align_at(m.end - 1)
            };
            for c in content.chars() {
                out.text.push(c);
                for _ in 0..c.len_utf8() {
                    out.align.push(align);
                }
            }
            last = m.end;
        }
        out.text.push_str(&self.text[last..]);
        out.align.extend_from_slice(&self.align[last..]);
    }
}

/// A string under normalization with its double buffer and reusable
/// change list, so every step runs without allocating once warm.
#[derive(Debug, Default)]
pub(crate) struct Work {
    pub cur: NormBuf,
    pub tmp: NormBuf,
    pub changes: Vec<(char, isize)>,
    pub matches: Vec<Range<usize>>,
    pub unicode: crate::normalizers::unicode::Buffers,
}

impl Work {
    /// Starts from original text `s` found at byte `base` of the input.
    /// The spare buffer grows with the current one: which of the two holds
    /// the text after a run of transforms depends on the input, and both
    /// must be large enough after one warm-up pass.
    pub(crate) fn load(&mut self, s: &str, base: u32) {
        self.cur.set(s, base);
        self.tmp.text.clear();
        self.tmp.align.clear();
        self.tmp.text.reserve(s.len());
        self.tmp.align.reserve(s.len());
    }

    /// Applies `self.changes` to the whole string.
    pub(crate) fn apply_changes(&mut self, initial_offset: usize) {
        self.cur
            .transform_all_into(self.changes.iter().copied(), initial_offset, &mut self.tmp);
        std::mem::swap(&mut self.cur, &mut self.tmp);
    }

    /// Replaces every range in `self.matches` with `content`.
    pub(crate) fn apply_matches(&mut self, content: &str) {
        self.cur.replace_into(&self.matches, content, &mut self.tmp);
        std::mem::swap(&mut self.cur, &mut self.tmp);
    }

    /// Hugging Face's `filter`: keeps the chars `keep` accepts.
    pub(crate) fn filter(&mut self, keep: impl Fn(char) -> bool) {
        self.changes.clear();
        let mut removed: isize = 0;
        let mut removed_start = 0usize;
        let mut last = None;
        for c in self.cur.text.chars() {
            if keep(c) {
                match last {
                    Some(lc) => self.changes.push((lc, -removed)),
                    None => removed_start = removed as usize,
                }
                last = Some(c);
                removed = 0;
            } else {
                removed += 1;
            }
        }
        if let Some(lc) = last {
            self.changes.push((lc, -removed));
        }
        self.apply_changes(removed_start);
    }

    /// Hugging Face's `map`: replaces each char by `f(char)`.
    pub(crate) fn map(&mut self, f: impl Fn(char) -> char) {
        self.changes.clear();
        self.changes
            .extend(self.cur.text.chars().map(|c| (f(c), 0)));
        self.apply_changes(0);
    }

    /// Hugging Face's `lowercase` (full Unicode lowercase mapping).
    pub(crate) fn lowercase(&mut self) {
        if self.cur.text.is_ascii() {
            // ASCII lowercase maps each byte to one byte: alignments stay.
            self.cur.text.make_ascii_lowercase();
            return;
        }
        self.changes.clear();
        for c in self.cur.text.chars() {
            for (i, lc) in c.to_lowercase().enumerate() {
                self.changes.push((lc, isize::from(i > 0)));
            }
        }
        self.apply_changes(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buf(s: &str) -> NormBuf {
        let mut b = NormBuf::default();
        b.set(s, 0);
        b
    }

    #[test]
    fn insertion_takes_the_previous_alignment() {
        let b = buf("ab");
        let mut out = NormBuf::default();
        b.transform_into(0..2, [('a', 0), ('x', 1), ('b', 0)], 0, &mut out);
        assert_eq!(out.text, "axb");
        assert_eq!(out.align, vec![(0, 1), (0, 1), (1, 2)]);
    }

    #[test]
    fn removal_at_start_shifts_the_first_kept_char() {
        let mut w = Work::default();
        w.cur.set("\u{1}\u{1}ab", 0);
        w.filter(|c| c != '\u{1}');
        assert_eq!(w.cur.text, "ab");
        assert_eq!(w.cur.align, vec![(2, 3), (3, 4)]);
    }

    #[test]
    fn replace_uses_the_last_byte_of_the_match() {
        let b = buf("a  b");
        let mut out = NormBuf::default();
        b.replace_into(std::slice::from_ref(&(1..3)), "▁", &mut out);
        assert_eq!(out.text, "a▁b");
        assert_eq!(out.align, vec![(0, 1), (2, 3), (2, 3), (2, 3), (3, 4)]);
    }

    #[test]
    fn multibyte_lowercase_keeps_one_alignment_per_char() {
        let mut w = Work::default();
        w.cur.set("İx", 0);
        w.lowercase();
        assert_eq!(w.cur.text, "i\u{307}x");
        assert_eq!(w.cur.align, vec![(0, 2), (0, 2), (0, 2), (2, 3)]);
    }
}
