//! Character classes used by the BERT normalizer and pre-tokenizer.
//!
//! The definitions are Hugging Face's (the `unicode_categories` crate plus
//! `char` methods); the crate answers by binary search over range tables,
//! so the Basic Multilingual Plane is tabulated once, on first use.

use std::sync::OnceLock;

use unicode_categories::UnicodeCategories;

const OTHER: u8 = 1;
const PUNCT: u8 = 2;
const MARK_NONSPACING: u8 = 4;
const WHITESPACE: u8 = 8;
const CHINESE: u8 = 16;

fn compute(c: char) -> u8 {
    let mut f = 0;
    if c.is_other() {
        f |= OTHER;
    }
    if c.is_ascii_punctuation() || c.is_punctuation() {
        f |= PUNCT;
    }
    if c.is_mark_nonspacing() {
        f |= MARK_NONSPACING;
    }
    if c.is_whitespace() {
        f |= WHITESPACE;
    }
    if is_chinese_char(c) {
        f |= CHINESE;
    }
    f
}

fn bmp() -> &'static [u8] {
    static TABLE: OnceLock<Vec<u8>> = OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=0xFFFFu32)
            .map(|u| char::from_u32(u).map_or(0, compute))
            .collect()
    })
}

#[inline]
fn flags(c: char) -> u8 {
    let u = c as u32;
    if u <= 0xFFFF {
        bmp()[u as usize]
    } else {
        compute(c)
    }
}

/// Unicode "Other" as Hugging Face counts it (Cc, Cf, Co).
#[inline]
pub(crate) fn is_other(c: char) -> bool {
    flags(c) & OTHER != 0
}

/// The BERT punctuation class: ASCII punctuation or a Unicode P* category.
#[inline]
pub(crate) fn is_bert_punct(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_punctuation();
    }
    flags(c) & PUNCT != 0
}

/// Unicode category Mn.
#[inline]
pub(crate) fn is_mark_nonspacing(c: char) -> bool {
    flags(c) & MARK_NONSPACING != 0
}

/// `char::is_whitespace`, tabulated.
#[inline]
pub(crate) fn is_whitespace(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_whitespace() || c == '\u{0B}';
    }
    flags(c) & WHITESPACE != 0
}

/// The CJK ideograph blocks BERT surrounds with spaces.
#[inline]
pub(crate) fn is_chinese(c: char) -> bool {
    let u = c as u32;
    u >= 0x3400 && flags(c) & CHINESE != 0
}

fn is_chinese_char(c: char) -> bool {
    matches!(
        c as u32,
        0x4E00..=0x9FFF
            | 0x3400..=0x4DBF
            | 0x20000..=0x2A6DF
            | 0x2A700..=0x2B73F
            | 0x2B740..=0x2B81F
            | 0x2B920..=0x2CEAF
            | 0xF900..=0xFAFF
            | 0x2F800..=0x2FA1F
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_agree_with_the_definitions() {
        for u in (0..0x11000u32).chain(0x1F000..0x30000) {
            let Some(c) = char::from_u32(u) else { continue };
            assert_eq!(is_other(c), c.is_other(), "{u:x}");
            assert_eq!(
                is_bert_punct(c),
                c.is_ascii_punctuation() || c.is_punctuation(),
                "{u:x}"
            );
            assert_eq!(is_mark_nonspacing(c), c.is_mark_nonspacing(), "{u:x}");
            assert_eq!(is_whitespace(c), c.is_whitespace(), "{u:x}");
            assert_eq!(is_chinese(c), is_chinese_char(c), "{u:x}");
        }
    }
}
