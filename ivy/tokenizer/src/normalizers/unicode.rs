//! Unicode normal forms with the per-char change marks Hugging Face's
//! alignment tracking uses.
//!
//! These are the decomposition and recomposition iterators of the
//! `unicode-normalization-alignments` crate (which Hugging Face calls),
//! step for step and on the same tables, with one difference: their
//! buffers are borrowed, reusable vectors instead of small vectors that
//! spill to the heap on every long run of combining marks, so a warm
//! tokenizer never allocates. Emitting the same `(char, change)` sequence
//! is what keeps offsets identical.

use std::ops::Range;

use unicode_normalization_alignments::char::{
    canonical_combining_class, compose, decompose_canonical, decompose_compatible,
};

/// Reusable buffers for one normalization.
#[derive(Debug, Default)]
pub(crate) struct Buffers {
    decompose: Vec<(u8, char, isize)>,
    recompose: Vec<(char, isize)>,
}

/// Canonical (NFD) or compatibility (NFKD) decomposition.
pub(crate) struct Decompose<'a, I> {
    compatible: bool,
    iter: std::iter::Fuse<I>,
    /// `(combining class, char, change)` in text order: a consumed prefix,
    /// then `ready` (sorted, safe to emit), then chars still pending.
    buffer: &'a mut Vec<(u8, char, isize)>,
    ready: Range<usize>,
}

impl<'a, I: Iterator<Item = char>> Decompose<'a, I> {
    pub(crate) fn new(iter: I, compatible: bool, buffer: &'a mut Vec<(u8, char, isize)>) -> Self {
        buffer.clear();
        Self {
            compatible,
            iter: iter.fuse(),
            buffer,
            ready: 0..0,
        }
    }

    fn push_back(&mut self, ch: char, first: bool) {
        let class = canonical_combining_class(ch);
        if class == 0 {
            self.sort_pending();
        }
        self.buffer.push((class, ch, if first { 0 } else { 1 }));
    }

    /// Orders the pending chars by combining class, keeping text order
    /// within a class. An insertion sort: stable, in place, and pending
    /// runs are short.
    fn sort_pending(&mut self) {
        let pending = &mut self.buffer[self.ready.end..];
        for i in 1..pending.len() {
            let mut j = i;
            while j > 0 && pending[j - 1].0 > pending[j].0 {
                pending.swap(j - 1, j);
                j -= 1;
            }
        }
        self.ready.end = self.buffer.len();
    }

    fn increment_next_ready(&mut self) {
        let next = self.ready.start + 1;
        if next == self.ready.end {
            // Drop the consumed prefix: keep only the pending chars.
            self.buffer.drain(..self.ready.end);
            self.ready = 0..0;
        } else {
            self.ready.start = next;
        }
    }
}

impl<I: Iterator<Item = char>> Iterator for Decompose<'_, I> {
    type Item = (char, isize);

    fn next(&mut self) -> Option<(char, isize)> {
        while self.ready.end == 0 {
            match self.iter.next() {
                Some(ch) => {
                    let compatible = self.compatible;
                    let mut first = true;
                    let mut push = |d| {
                        self.push_back(d, first);
                        first = false;
                    };
                    if compatible {
                        decompose_compatible(ch, &mut push);
                    } else {
                        decompose_canonical(ch, &mut push);
                    }
                }
                None => {
                    if self.buffer.is_empty() {
                        return None;
                    }
                    self.sort_pending();
                    break;
                }
            }
        }
        let (_, ch, change) = self.buffer[self.ready.start];
        self.increment_next_ready();
        Some((ch, change))
    }
}

enum State {
    Composing,
    Purging(usize),
    Finished(usize),
}

/// Canonical composition of a decomposition (NFC, NFKC).
pub(crate) struct Recompose<'a, I> {
    iter: Decompose<'a, I>,
    state: State,
    buffer: &'a mut Vec<(char, isize)>,
    composee: Option<(char, isize)>,
    last_ccc: Option<u8>,
}

impl<'a, I: Iterator<Item = char>> Recompose<'a, I> {
    pub(crate) fn new(iter: I, compatible: bool, buffers: &'a mut Buffers) -> Self {
        buffers.recompose.clear();
        Self {
            iter: Decompose::new(iter, compatible, &mut buffers.decompose),
            state: State::Composing,
            buffer: &mut buffers.recompose,
            composee: None,
            last_ccc: None,
        }
    }
}

impl<I: Iterator<Item = char>> Iterator for Recompose<'_, I> {
    type Item = (char, isize);

    fn next(&mut self) -> Option<(char, isize)> {
        loop {
            match self.state {
                State::Composing => {
                    for (ch, change) in self.iter.by_ref() {
                        let ch_class = canonical_combining_class(ch);
                        let Some(k) = self.composee else {
                            if ch_class != 0 {
                                return Some((ch, change));
                            }
                            self.composee = Some((ch, change));
                            continue;
                        };
                        match self.last_ccc {
                            None => match compose(k.0, ch) {
                                Some(r) => {
                                    self.composee = Some((r, k.1 + change - 1));
                                    continue;
                                }
                                None => {
                                    if ch_class == 0 {
                                        self.composee = Some((ch, change));
                                        return Some(k);
                                    }
                                    self.buffer.push((ch, change));
                                    self.last_ccc = Some(ch_class);
                                }
                            },
                            Some(l_class) => {
                                if l_class >= ch_class {
                                    // `ch` is blocked from the composee.
                                    if ch_class == 0 {
                                        self.composee = Some((ch, change));
                                        self.last_ccc = None;
                                        self.state = State::Purging(0);
                                        return Some(k);
                                    }
                                    self.buffer.push((ch, change));
                                    self.last_ccc = Some(ch_class);
                                    continue;
                                }
                                match compose(k.0, ch) {
                                    Some(r) => {
                                        self.composee = Some((r, k.1 + change - 1));
                                        continue;
                                    }
                                    None => {
                                        self.buffer.push((ch, change));
                                        self.last_ccc = Some(ch_class);
                                    }
                                }
                            }
                        }
                    }
                    self.state = State::Finished(0);
                    if self.composee.is_some() {
                        return self.composee.take();
                    }
                }
                State::Purging(next) => match self.buffer.get(next).copied() {
                    None => {
                        self.buffer.clear();
                        self.state = State::Composing;
                    }
                    s => {
                        self.state = State::Purging(next + 1);
                        return s;
                    }
                },
                State::Finished(next) => match self.buffer.get(next).copied() {
                    None => {
                        self.buffer.clear();
                        return self.composee.take();
                    }
                    s => {
                        self.state = State::Finished(next + 1);
                        return s;
                    }
                },
            }
        }
    }
}

/// NFD/NFKD of `text`, as `(char, change)`.
pub(crate) fn decompose<'a>(
    text: &'a str,
    compatible: bool,
    buffers: &'a mut Buffers,
) -> Decompose<'a, std::str::Chars<'a>> {
    Decompose::new(text.chars(), compatible, &mut buffers.decompose)
}

/// NFC/NFKC of `text`, as `(char, change)`.
pub(crate) fn recompose<'a>(
    text: &'a str,
    compatible: bool,
    buffers: &'a mut Buffers,
) -> Recompose<'a, std::str::Chars<'a>> {
    Recompose::new(text.chars(), compatible, buffers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use unicode_normalization_alignments::UnicodeNormalization;

    /// Same output, change marks included, as the crate's iterators.
    #[test]
    fn matches_the_crate() {
        let samples = [
            "",
            "abc",
            "e\u{301}\u{323}\u{302}x",
            "\u{1E9B}\u{323}",
            "ﾊﾟｶﾞ",
            "한국어 \u{1100}\u{1161}\u{11A8}",
            "ﬃ ㎞ Ⅻ ①",
            "\u{301}\u{301}leading marks",
            &"a\u{300}\u{316}\u{301}\u{317}".repeat(40),
            "Å Ω K \u{F900} \u{2F800}",
            "क़ \u{915}\u{93C}\u{94D}\u{937}",
        ];
        let mut b = Buffers::default();
        for s in samples {
            let got: Vec<_> = decompose(s, false, &mut b).collect();
            assert_eq!(got, s.nfd().collect::<Vec<_>>(), "nfd {s:?}");
            let got: Vec<_> = decompose(s, true, &mut b).collect();
            assert_eq!(got, s.nfkd().collect::<Vec<_>>(), "nfkd {s:?}");
            let got: Vec<_> = recompose(s, false, &mut b).collect();
            assert_eq!(got, s.nfc().collect::<Vec<_>>(), "nfc {s:?}");
            let got: Vec<_> = recompose(s, true, &mut b).collect();
            assert_eq!(got, s.nfkc().collect::<Vec<_>>(), "nfkc {s:?}");
        }
    }
}
