//! Added (and special) tokens: found in the text before the model runs.
//!
//! Tokens with `normalized: false` are matched on the raw input, the others
//! on the normalized text. Matching is leftmost-longest with Hugging Face's
//! `single_word`, `lstrip` and `rstrip` rules; a rejected `single_word` match
//! still consumes its span, as the Aho-Corasick iterator Hugging Face uses
//! does.

use std::ops::Range;
use std::sync::LazyLock;

use crate::trie::Trie;

/// One added token as declared in `tokenizer.json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AddedToken {
    pub content: String,
    pub single_word: bool,
    pub lstrip: bool,
    pub rstrip: bool,
    pub normalized: bool,
    pub special: bool,
}

/// A piece of text: plain text, or an added token (with its id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Segment {
    Text(Range<usize>),
    Token(u32, Range<usize>),
}

/// Finds one set of patterns (leftmost-longest).
#[derive(Debug)]
struct Matcher {
    /// Pattern bytes → index into `AddedVocab::tokens`.
    trie: Trie,
    /// Bytes that start some pattern: a quick skip for everything else.
    first: [bool; 256],
    /// The first bytes when there are at most three (`<` for `<s>`,
    /// `[` for `[CLS]`): found with a vectorized search.
    few: Option<Vec<u8>>,
}

impl Matcher {
    fn new(patterns: &[(&str, u32)]) -> Option<Self> {
        if patterns.is_empty() {
            return None;
        }
        let mut first = [false; 256];
        for (p, _) in patterns {
            first[p.as_bytes()[0] as usize] = true;
        }
        let bytes: Vec<u8> = (0..=255u8).filter(|&b| first[b as usize]).collect();
        Some(Self {
            trie: Trie::build(patterns.iter().map(|&(p, i)| (p.as_bytes(), i))),
            first,
            few: (bytes.len() <= 3).then_some(bytes),
        })
    }

    /// The leftmost-longest match at or after `from`: `(token, start, end)`.
    fn find(&self, text: &[u8], from: usize) -> Option<(u32, usize, usize)> {
        let mut start = from;
        while start < text.len() {
            let rest = &text[start..];
            let skip = match self.few.as_deref() {
                Some([a]) => memchr::memchr(*a, rest),
                Some([a, b]) => memchr::memchr2(*a, *b, rest),
                Some([a, b, c]) => memchr::memchr3(*a, *b, *c, rest),
                _ => rest.iter().position(|&b| self.first[b as usize]),
            };
            let skip = skip?;
            start += skip;
            let mut state = Trie::ROOT;
            let mut longest = None;
            for (i, &b) in text[start..].iter().enumerate() {
                let Some(next) = self.trie.next(state, b) else {
                    break;
                };
                state = next;
                if self.trie.is_key(state) {
                    longest = Some((state, start + i + 1));
                }
            }
            if let Some((state, end)) = longest {
                return Some((self.trie.value(state), start, end));
            }
            start += 1;
        }
        None
    }
}

/// All added tokens of a tokenizer.
#[derive(Debug, Default)]
pub(crate) struct AddedVocab {
    /// `(id, token, pattern)`: the pattern is the content, normalized for
    /// tokens with `normalized: true`.
    tokens: Vec<(u32, AddedToken, String)>,
    raw: Option<Matcher>,
    normalized: Option<Matcher>,
}

static STARTS_WITH_WORD: LazyLock<regex::Regex> =
    LazyLock::new(|| regex::Regex::new(r"^\w").expect("static regex"));
static ENDS_WITH_WORD: LazyLock<regex::Regex> =
    LazyLock::new(|| regex::Regex::new(r"\w$").expect("static regex"));

impl AddedVocab {
    /// `tokens` are `(id, token, pattern)` with ids already resolved.
    pub(crate) fn new(tokens: Vec<(u32, AddedToken, String)>) -> Self {
        let pick = |normalized: bool| {
            let patterns: Vec<(&str, u32)> = tokens
                .iter()
                .enumerate()
                .filter(|(_, t)| t.1.normalized == normalized)
                .map(|(i, t)| (t.2.as_str(), i as u32))
                .collect();
            Matcher::new(&patterns)
        };
        let raw = pick(false);
        let normalized = pick(true);
        Self {
            tokens,
            raw,
            normalized,
        }
    }

    pub(crate) fn has_normalized(&self) -> bool {
        self.normalized.is_some()
    }

    /// The string of an added id (its normalized form for normalized tokens,
    /// as Hugging Face's decoder sees it).
    pub(crate) fn id_to_token(&self, id: u32) -> Option<&str> {
        self.tokens.iter().find(|t| t.0 == id).map(|t| t.2.as_str())
    }

    /// Every added token's id and content.
    pub(crate) fn ids(&self) -> impl Iterator<Item = (u32, &str)> {
        self.tokens.iter().map(|t| (t.0, t.1.content.as_str()))
    }

    /// Splits raw input text around the tokens matched on raw text.
    pub(crate) fn split_raw(&self, text: &str, out: &mut Vec<Segment>) {
        self.split(self.raw.as_ref(), text, out)
    }

    /// Splits normalized text around the tokens matched on normalized text.
    pub(crate) fn split_normalized(&self, text: &str, out: &mut Vec<Segment>) {
        self.split(self.normalized.as_ref(), text, out)
    }

    fn split(&self, matcher: Option<&Matcher>, text: &str, out: &mut Vec<Segment>) {
        out.clear();
        let Some(m) = matcher else {
            out.push(Segment::Text(0..text.len()));
            return;
        };
        let bytes = text.as_bytes();
        let mut done = 0;
        let mut cursor = 0;
        while let Some((i, mut start, mut stop)) = m.find(bytes, cursor) {
            cursor = stop;
            let (id, token, _) = &self.tokens[i as usize];
            if token.single_word {
                let start_space = start == 0 || !ENDS_WITH_WORD.is_match(&text[..start]);
                let stop_space = stop == text.len() || !STARTS_WITH_WORD.is_match(&text[stop..]);
                if !start_space || !stop_space {
                    continue;
                }
            }
            if token.lstrip {
                // `\s*$` on the text before: the start of its trailing spaces,
                // but never before the end of the previous match.
                let before = &text[..start];
                start = before.trim_end_matches(char::is_whitespace).len().max(done);
            }
            if token.rstrip {
                let after = &text[stop..];
                stop += after.len() - after.trim_start_matches(char::is_whitespace).len();
            }
            if done < start {
                out.push(Segment::Text(done..start));
            }
            out.push(Segment::Token(*id, start..stop));
            done = stop;
        }
        if done != text.len() {
            out.push(Segment::Text(done..text.len()));
        }
    }
}
