//! Normalizers: each rewrites a [`Work`] string in place, tracking where
//! every byte came from exactly as Hugging Face does.

mod bert;
mod precompiled;
pub(crate) mod unicode;

pub(crate) use bert::Bert;
pub(crate) use precompiled::Precompiled;

use crate::normalized::Work;

#[derive(Debug)]
pub(crate) enum Normalizer {
    Sequence(Vec<Normalizer>),
    Precompiled(Box<Precompiled>),
    Bert(Box<Bert>),
    Unicode(UnicodeForm),
    Lowercase,
    Replace(Replace),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UnicodeForm {
    Nfc,
    Nfd,
    Nfkc,
    Nfkd,
}

/// Replaces every match of a pattern with fixed content.
#[derive(Debug)]
pub(crate) struct Replace {
    /// Hugging Face compiles both literal and regex patterns with
    /// `fancy_regex` (literals escaped); the same engine gives the same
    /// matches.
    regex: fancy_regex::Regex,
    content: String,
}

impl Replace {
    pub(crate) fn new(pattern: &str, literal: bool, content: String) -> crate::Result<Self> {
        let source = if literal {
            regex::escape(pattern)
        } else {
            pattern.to_owned()
        };
        let regex = fancy_regex::Regex::new(&source)
            .map_err(|e| crate::Error::Invalid(format!("Replace pattern {pattern:?}: {e}")))?;
        Ok(Self { regex, content })
    }

    fn normalize(&self, w: &mut Work) {
        // An empty string has no matches, even for patterns that match "".
        if w.cur.text.is_empty() {
            return;
        }
        w.matches.clear();
        for m in self.regex.find_iter(&w.cur.text) {
            // Hugging Face stops at the first matching error (backtrack limit).
            let Ok(m) = m else { break };
            w.matches.push(m.start()..m.end());
        }
        if !w.matches.is_empty() {
            w.apply_matches(&self.content);
        }
    }
}

impl Normalizer {
    pub(crate) fn normalize(&self, w: &mut Work) {
        match self {
            Self::Sequence(all) => {
                for n in all {
                    n.normalize(w);
                }
            }
            Self::Precompiled(p) => p.normalize(w),
            Self::Bert(b) => b.normalize(w),
            Self::Unicode(form) => unicode(*form, w),
            Self::Lowercase => w.lowercase(),
            Self::Replace(r) => r.normalize(w),
        }
    }
}

fn unicode(form: UnicodeForm, w: &mut Work) {
    // Every normal form leaves ASCII text as it is, char for char.
    if w.cur.text.is_ascii() {
        return;
    }
    let Work {
        cur,
        tmp,
        unicode: buffers,
        ..
    } = w;
    let text = cur.text.as_str();
    match form {
        UnicodeForm::Nfc => {
            cur.transform_all_into(unicode::recompose(text, false, buffers), 0, tmp)
        }
        UnicodeForm::Nfd => {
            cur.transform_all_into(unicode::decompose(text, false, buffers), 0, tmp)
        }
        UnicodeForm::Nfkc => {
            cur.transform_all_into(unicode::recompose(text, true, buffers), 0, tmp)
        }
        UnicodeForm::Nfkd => {
            cur.transform_all_into(unicode::decompose(text, true, buffers), 0, tmp)
        }
    }
    std::mem::swap(&mut w.cur, &mut w.tmp);
}
