//! Pre-tokenizers: cut a normalized string into the words the model sees.
//!
//! Words live in one flat buffer ([`Words`]); each stage reads one buffer
//! and writes the other, so a whole chain runs without allocating once the
//! buffers have grown.

use crate::chars;
use crate::normalized::{Align, NormBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PrependScheme {
    Always,
    First,
    Never,
}

/// One pre-tokenization step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Stage {
    WhitespaceSplit,
    Bert,
    Metaspace {
        replacement: char,
        prepend: PrependScheme,
        split: bool,
    },
    /// `WhitespaceSplit` then `Metaspace` (XLM-RoBERTa) in one pass.
    WhitespaceMetaspace {
        replacement: char,
        prepend: PrependScheme,
        split: bool,
    },
}

/// A pre-tokenizer: its stages in order, nested sequences flattened. With
/// no stages, each text is one word.
#[derive(Debug, Clone, Default)]
pub(crate) struct PreTokenizer {
    stages: Vec<Stage>,
}

/// One word: a byte range of [`Words::text`] and where its original text
/// starts (Hugging Face's `original_shift`, which `Metaspace` consults).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Word {
    pub start: u32,
    pub end: u32,
    pub shift: u32,
}

/// Words to read: text, per-byte original ranges, and the word spans.
#[derive(Debug, Clone, Copy)]
pub(crate) struct View<'a> {
    pub text: &'a str,
    pub align: &'a [Align],
    pub words: &'a [Word],
}

/// A list of words with their text and per-byte original ranges.
#[derive(Debug, Default)]
pub(crate) struct Words {
    pub text: String,
    pub align: Vec<Align>,
    pub words: Vec<Word>,
}

impl Words {
    fn clear(&mut self) {
        self.text.clear();
        self.align.clear();
        self.words.clear();
    }

    fn view(&self) -> View<'_> {
        View {
            text: &self.text,
            align: &self.align,
            words: &self.words,
        }
    }

    /// The text of word `w`.
    #[inline]
    pub(crate) fn word(&self, w: &Word) -> &str {
        &self.text[w.start as usize..w.end as usize]
    }

    /// Copies `src` bytes `range` as a new word (a slice of a parent word).
    #[inline]
    fn push_slice(&mut self, src_text: &str, src_align: &[Align], range: std::ops::Range<usize>) {
        if range.is_empty() {
            return;
        }
        let start = self.text.len() as u32;
        self.text.push_str(&src_text[range.clone()]);
        self.align.extend_from_slice(&src_align[range.clone()]);
        self.words.push(Word {
            start,
            end: self.text.len() as u32,
            shift: src_align[range.start].0,
        });
    }
}

impl PreTokenizer {
    /// Runs `stages` in order, fusing each `WhitespaceSplit` followed by a
    /// `Metaspace` into one pass.
    pub(crate) fn new(stages: Vec<Stage>) -> Self {
        let mut fused = Vec::with_capacity(stages.len());
        let mut it = stages.into_iter().peekable();
        while let Some(stage) = it.next() {
            match (&stage, it.peek()) {
                (
                    Stage::WhitespaceSplit,
                    Some(&Stage::Metaspace {
                        replacement,
                        prepend,
                        split,
                    }),
                ) => {
                    it.next();
                    fused.push(Stage::WhitespaceMetaspace {
                        replacement,
                        prepend,
                        split,
                    });
                }
                _ => fused.push(stage),
            }
        }
        Self { stages: fused }
    }

    /// Pre-tokenizes `src[range]` into `out`, using `spare` as the other
    /// buffer between stages.
    pub(crate) fn run(
        &self,
        src: &NormBuf,
        range: std::ops::Range<usize>,
        out: &mut Words,
        spare: &mut Words,
    ) {
        out.clear();
        if range.is_empty() {
            return;
        }
        let Some((head, rest)) = self.stages.split_first() else {
            out.push_slice(&src.text, &src.align, range);
            return;
        };
        let first = [Word {
            start: range.start as u32,
            end: range.end as u32,
            shift: src.align[range.start].0,
        }];
        let input = View {
            text: &src.text,
            align: &src.align,
            words: &first,
        };
        head.run(input, out);
        for stage in rest {
            std::mem::swap(out, spare);
            stage.run(spare.view(), out);
        }
    }
}

impl Stage {
    /// Runs this stage from `src` into `dst`.
    fn run(&self, src: View, dst: &mut Words) {
        dst.clear();
        match self {
            Self::WhitespaceSplit => split_into(src, dst, |c| {
                if chars::is_whitespace(c) {
                    Cut::Remove
                } else {
                    Cut::Keep
                }
            }),
            Self::Bert => split_into(src, dst, |c| {
                if chars::is_whitespace(c) {
                    Cut::Remove
                } else if chars::is_bert_punct(c) {
                    Cut::Isolate
                } else {
                    Cut::Keep
                }
            }),
            Self::Metaspace {
                replacement,
                prepend,
                split,
            } => metaspace_into(src, dst, *replacement, *prepend, *split),
            Self::WhitespaceMetaspace {
                replacement,
                prepend,
                split,
            } => whitespace_metaspace_into(src, dst, *replacement, *prepend, *split),
        }
    }
}

enum Cut {
    Keep,
    Remove,
    Isolate,
}

/// Splits every word of `src` into `dst`: `Remove` chars separate words and
/// vanish, `Isolate` chars become words of their own.
fn split_into(src: View, dst: &mut Words, cut: impl Fn(char) -> Cut) {
    for w in src.words {
        let (ws, we) = (w.start as usize, w.end as usize);
        let mut start = ws;
        let text = &src.text[ws..we];
        if text.is_ascii() {
            for (i, &b) in text.as_bytes().iter().enumerate() {
                let i = ws + i;
                match cut(b as char) {
                    Cut::Keep => {}
                    Cut::Remove => {
                        dst.push_slice(src.text, src.align, start..i);
                        start = i + 1;
                    }
                    Cut::Isolate => {
                        dst.push_slice(src.text, src.align, start..i);
                        dst.push_slice(src.text, src.align, i..i + 1);
                        start = i + 1;
                    }
                }
            }
        } else {
            for (i, c) in text.char_indices() {
                let i = ws + i;
                match cut(c) {
                    Cut::Keep => {}
                    Cut::Remove => {
                        dst.push_slice(src.text, src.align, start..i);
                        start = i + c.len_utf8();
                    }
                    Cut::Isolate => {
                        dst.push_slice(src.text, src.align, start..i);
                        dst.push_slice(src.text, src.align, i..i + c.len_utf8());
                        start = i + c.len_utf8();
                    }
                }
            }
        }
        dst.push_slice(src.text, src.align, start..we);
    }
}

/// `Metaspace`: spaces become `replacement`, which is prepended as the
/// scheme says (taking the first char's alignment), and with `split` every
/// `replacement` starts a new word (Hugging Face's `MergedWithNext`).
fn metaspace_into(
    src: View,
    dst: &mut Words,
    replacement: char,
    prepend: PrependScheme,
    split: bool,
) {
    let mut rep_buf = [0u8; 4];
    let rep: &str = replacement.encode_utf8(&mut rep_buf);
    for w in src.words {
        let (ws, we) = (w.start as usize, w.end as usize);
        let text = &src.text[ws..we];
        // Hugging Face checks the first char after spaces were replaced.
        let first = text
            .chars()
            .next()
            .map(|c| if c == ' ' { replacement } else { c });
        let starts_with_rep = first == Some(replacement);
        let add = match prepend {
            PrependScheme::Always => !starts_with_rep,
            PrependScheme::First => !starts_with_rep && w.shift == 0,
            PrependScheme::Never => false,
        };
        let mut word_start = dst.text.len();
        let mut shift = w.shift;
        if add {
            dst.text.push_str(rep);
            for _ in 0..rep.len() {
                dst.align.push(src.align[ws]);
            }
        }
        for (i, c) in text.char_indices() {
            let align = src.align[ws + i];
            let c = if c == ' ' { replacement } else { c };
            if split && c == replacement && dst.text.len() > word_start {
                dst.words.push(Word {
                    start: word_start as u32,
                    end: dst.text.len() as u32,
                    shift,
                });
                word_start = dst.text.len();
                shift = align.0;
            }
            dst.text.push(c);
            for _ in 0..c.len_utf8() {
                dst.align.push(align);
            }
        }
        if dst.text.len() > word_start {
            dst.words.push(Word {
                start: word_start as u32,
                end: dst.text.len() as u32,
                shift,
            });
        }
    }
}

/// The first UTF-8 byte of every non-ASCII whitespace char (U+0085,
/// U+00A0, U+1680, U+2000–U+200A, U+2028, U+2029, U+202F, U+205F, U+3000).
const WHITESPACE_LEADS: [u8; 4] = [0xC2, 0xE1, 0xE2, 0xE3];
/// Stands for a char that is neither whitespace nor the replacement.
const OTHER: char = '\u{FFFF}';

/// `WhitespaceSplit` then `Metaspace` in one pass: whitespace ends a word
/// (words hold no spaces, so nothing is replaced), each word gets the
/// prefix as the scheme says, and with `split` each `replacement` in a word
/// starts a new one. Runs of ordinary chars are copied in bulk.
fn whitespace_metaspace_into(
    src: View,
    dst: &mut Words,
    replacement: char,
    prepend: PrependScheme,
    split: bool,
) {
    let mut rep_buf = [0u8; 4];
    let rep: &str = replacement.encode_utf8(&mut rep_buf);
    for w in src.words {
        let (ws, we) = (w.start as usize, w.end as usize);
        let text = &src.text[ws..we];
        let bytes = text.as_bytes();
        let align = &src.align[ws..we];
        // The output word being built starts at `open` (with its shift).
        let mut open: Option<(usize, u32)> = None;
        // Start of the run of ordinary chars not yet copied.
        let mut run = 0;
        let mut i = 0;
        while i <= bytes.len() {
            let (c, len) = if i == bytes.len() {
                (' ', 0)
            } else {
                match bytes[i] {
                    b @ 0x00..=0x7F => (b as char, 1),
                    // Only these lead bytes start a whitespace char or the
                    // replacement: other chars are passed by length.
                    b if WHITESPACE_LEADS.contains(&b) || b == rep.as_bytes()[0] => {
                        let c = text[i..].chars().next().unwrap_or(' ');
                        (c, c.len_utf8())
                    }
                    b if b < 0xE0 => (OTHER, 2),
                    b if b < 0xF0 => (OTHER, 3),
                    _ => (OTHER, 4),
                }
            };
            let space = i == bytes.len() || chars::is_whitespace(c);
            let starts_word = !space && open.is_none();
            let cut = !space && split && c == replacement && open.is_some();
            if space || starts_word || cut {
                // Flush the pending run into the open word.
                dst.text.push_str(&text[run..i]);
                dst.align.extend_from_slice(&align[run..i]);
                run = i;
            }
            if space || cut {
                if let Some((start, shift)) = open.take() {
                    dst.words.push(Word {
                        start: start as u32,
                        end: dst.text.len() as u32,
                        shift,
                    });
                }
                run = i + len;
            }
            if cut {
                open = Some((dst.text.len(), align[i].0));
                run = i;
            }
            if starts_word {
                let a = align[i];
                open = Some((dst.text.len(), a.0));
                let add = c != replacement
                    && match prepend {
                        PrependScheme::Always => true,
                        PrependScheme::First => a.0 == 0,
                        PrependScheme::Never => false,
                    };
                if add {
                    dst.text.push_str(rep);
                    dst.align.extend(std::iter::repeat_n(a, rep.len()));
                }
            }
            if i == bytes.len() {
                break;
            }
            i += len;
        }
    }
}

#[cfg(test)]
mod tests;
