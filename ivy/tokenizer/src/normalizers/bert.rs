//! BERT's normalizer: clean text, space out CJK ideographs, strip accents,
//! lowercase — in Hugging Face's order, one alignment-tracking pass each.

use super::unicode;
use crate::chars;
use crate::normalized::Work;

#[derive(Debug, Clone)]
pub(crate) struct Bert {
    clean_text: bool,
    handle_chinese_chars: bool,
    strip_accents: bool,
    lowercase: bool,
    /// What the whole chain does to each ASCII byte: ASCII text takes one
    /// pass (every step maps an ASCII char to at most one ASCII char).
    ascii: [AsciiStep; 128],
}

#[derive(Debug, Clone, Copy)]
enum AsciiStep {
    Drop,
    Keep(u8),
}

impl Bert {
    pub(crate) fn new(
        clean_text: bool,
        handle_chinese_chars: bool,
        strip_accents: Option<bool>,
        lowercase: bool,
    ) -> Self {
        let mut b = Self {
            clean_text,
            handle_chinese_chars,
            strip_accents: strip_accents.unwrap_or(lowercase),
            lowercase,
            ascii: [AsciiStep::Drop; 128],
        };
        for (i, step) in b.ascii.iter_mut().enumerate() {
            let c = i as u8 as char;
            *step = if clean_text && removed_by_cleaning(c) {
                AsciiStep::Drop
            } else {
                let c = if clean_text && is_bert_whitespace(c) {
                    ' '
                } else {
                    c
                };
                let c = if lowercase { c.to_ascii_lowercase() } else { c };
                AsciiStep::Keep(c as u8)
            };
        }
        b
    }

    pub(crate) fn normalize(&self, w: &mut Work) {
        if w.cur.text.is_ascii() {
            self.normalize_ascii(w);
            return;
        }
        if self.clean_text {
            w.filter(|c| !removed_by_cleaning(c));
            w.map(|c| if is_bert_whitespace(c) { ' ' } else { c });
        }
        if self.handle_chinese_chars {
            w.changes.clear();
            for c in w.cur.text.chars() {
                if chars::is_chinese(c) {
                    w.changes.extend([(' ', 0), (c, 1), (' ', 1)]);
                } else {
                    w.changes.push((c, 0));
                }
            }
            w.apply_changes(0);
        }
        if self.strip_accents {
            let Work {
                cur,
                tmp,
                unicode: buffers,
                ..
            } = w;
            cur.transform_all_into(unicode::decompose(&cur.text, false, buffers), 0, tmp);
            std::mem::swap(&mut w.cur, &mut w.tmp);
            w.filter(|c| !chars::is_mark_nonspacing(c));
        }
        if self.lowercase {
            w.lowercase();
        }
    }

    /// The whole chain on ASCII text: each kept char keeps its own
    /// alignment, exactly as the step-by-step transforms leave it.
    fn normalize_ascii(&self, w: &mut Work) {
        let cur = &w.cur;
        let out = &mut w.tmp;
        out.text.clear();
        out.align.clear();
        out.orig = cur.orig;
        for (i, &b) in cur.text.as_bytes().iter().enumerate() {
            if let AsciiStep::Keep(n) = self.ascii[b as usize] {
                out.text.push(n as char);
                out.align.push(cur.align[i]);
            }
        }
        std::mem::swap(&mut w.cur, &mut w.tmp);
    }
}

fn removed_by_cleaning(c: char) -> bool {
    c == '\0' || c == '\u{FFFD}' || (!matches!(c, '\t' | '\n' | '\r') && chars::is_other(c))
}

fn is_bert_whitespace(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r') || chars::is_whitespace(c)
}
