//! SentencePiece's precompiled character map (`Precompiled` normalizer).
//!
//! The map is a darts-clone double array from UTF-8 sequences to offsets in a
//! blob of NUL-terminated replacement strings. Matching follows Hugging
//! Face's reading of it exactly, quirks included: a grapheme shorter than six
//! bytes is looked up whole and replaced by the *shortest* mapped prefix;
//! otherwise each of its chars is looked up on its own.

use std::sync::OnceLock;

use unicode_segmentation::UnicodeSegmentation;

use crate::normalized::Work;
use crate::{Error, Result};

#[derive(Debug, Clone)]
pub(crate) struct Precompiled {
    units: Vec<u32>,
    normalized: String,
    /// The replacement of each single ASCII char, as a range of `normalized`.
    ascii: [Option<(u32, u32)>; 128],
    /// One bit per Basic Multilingual Plane char: set when the map has an
    /// entry for that char alone.
    mapped: Box<[u64; 1024]>,
    /// One bit per BMP char: set when some longer entry starts with it.
    prefix: Box<[u64; 1024]>,
}

#[inline]
fn bit(set: &[u64; 1024], c: char) -> bool {
    let u = c as usize;
    u <= 0xFFFF && set[u / 64] & (1 << (u % 64)) != 0
}

/// A char that ends its grapheme unless the next char extends it.
const ALONE: u8 = 1;
/// A char that never starts a grapheme after an `ALONE` char.
const EXTENDS: u8 = 2;

/// Grapheme-break facts for every BMP char, derived from the segmenter
/// itself: `c` is `ALONE` if it is a grapheme of its own before a char of
/// every break category that does not extend; `n` `EXTENDS` if "a" + `n` is
/// one grapheme. With both, `c` followed by a non-extending char is exactly
/// one grapheme, so most text skips the segmenter.
fn grapheme_flags() -> &'static [u8] {
    static FLAGS: OnceLock<Vec<u8>> = OnceLock::new();
    FLAGS.get_or_init(|| {
        // One char of each break category (and Indic consonant, emoji).
        const NEXT: [char; 14] = [
            'a',
            '\r',
            '\n',
            '\u{1}',
            '\u{600}',
            '\u{1F1E6}',
            '\u{1100}',
            '\u{1161}',
            '\u{11A8}',
            '\u{AC00}',
            '\u{AC01}',
            '\u{1F600}',
            '\u{915}',
            '\u{200D}',
        ];
        let mut buf = String::new();
        (0..=0xFFFFu32)
            .map(|u| {
                let Some(c) = char::from_u32(u) else { return 0 };
                let mut f = 0;
                buf.clear();
                buf.push('a');
                buf.push(c);
                if buf.graphemes(true).count() == 1 {
                    f |= EXTENDS;
                }
                let alone = NEXT.iter().all(|&n| {
                    buf.clear();
                    buf.push(c);
                    buf.push(n);
                    // Extending chars are excluded by the caller's check.
                    n == '\u{200D}' || buf.graphemes(true).count() == 2
                });
                if alone && f & EXTENDS == 0 {
                    f |= ALONE;
                }
                f
            })
            .collect()
    })
}

/// Whether a grapheme starts at byte `pos` of `text`.
fn is_boundary(text: &str, pos: usize) -> bool {
    let mut cursor = unicode_segmentation::GraphemeCursor::new(pos, text.len(), true);
    // The whole text is the chunk, so no context is ever missing.
    cursor.is_boundary(text, 0).unwrap_or(true)
}

/// The length of the grapheme starting at `pos` when it is a single char
/// the tables can vouch for.
#[inline]
fn single_char_grapheme(text: &str, pos: usize, flags: &[u8]) -> Option<(char, usize)> {
    let mut chars = text[pos..].chars();
    let c = chars.next()?;
    let fc = *flags.get(c as usize)?;
    if fc & ALONE == 0 {
        return None;
    }
    match chars.next() {
        None => Some((c, c.len_utf8())),
        Some(n) => {
            let fnext = *flags.get(n as usize)?;
            (fnext & EXTENDS == 0).then_some((c, c.len_utf8()))
        }
    }
}

impl Precompiled {
    /// Parses the decoded `precompiled_charsmap` bytes.
    pub(crate) fn from_bytes(map: &[u8]) -> Result<Self> {
        let bad = || Error::Invalid("cannot parse precompiled_charsmap".into());
        let size = u32::from_le_bytes(map.get(..4).ok_or_else(bad)?.try_into().unwrap()) as usize;
        let trie = map.get(4..4 + size / 4 * 4).ok_or_else(bad)?;
        let units = trie
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let normalized = String::from_utf8(map[4 + size / 4 * 4..].to_vec()).map_err(|_| {
            Error::Invalid("precompiled_charsmap: replacements are not UTF-8".into())
        })?;
        let mut p = Self {
            units,
            normalized,
            ascii: [None; 128],
            mapped: Box::new([0; 1024]),
            prefix: Box::new([0; 1024]),
        };
        for b in 0..128u8 {
            p.ascii[b as usize] = p.lookup(&[b]);
        }
        let mut buf = [0u8; 4];
        for u in 0..=0xFFFFu32 {
            if let Some(c) = char::from_u32(u) {
                let key = c.encode_utf8(&mut buf).as_bytes();
                if p.lookup(key).is_some() {
                    p.mapped[u as usize / 64] |= 1 << (u % 64);
                }
                if p.walk(key).is_some_and(|node| p.has_children(node)) {
                    p.prefix[u as usize / 64] |= 1 << (u % 64);
                }
            }
        }
        Ok(p)
    }

    /// The node reached by all of `key` (no NUL bytes), if any.
    fn walk(&self, key: &[u8]) -> Option<usize> {
        let offset = |u: u32| ((u >> 10) << ((u & (1 << 9)) >> 6)) as usize;
        let mut pos = offset(*self.units.first()?);
        for &c in key {
            pos ^= c as usize;
            let u = *self.units.get(pos)?;
            if u & ((1 << 31) | 0xFF) != c as u32 {
                return None;
            }
            pos ^= offset(u);
        }
        Some(pos)
    }

    /// Whether any entry continues past `node`.
    fn has_children(&self, node: usize) -> bool {
        (1..=255usize).any(|c| {
            self.units
                .get(node ^ c)
                .is_some_and(|&u| u & ((1 << 31) | 0xFF) == c as u32)
        })
    }

    /// The first (shortest) mapped prefix of `key`, as a range of the blob.
    fn lookup(&self, key: &[u8]) -> Option<(u32, u32)> {
        let unit = |i: usize| self.units.get(i).copied();
        let offset = |u: u32| ((u >> 10) << ((u & (1 << 9)) >> 6)) as usize;
        let mut pos = offset(unit(0)?);
        for &c in key {
            if c == 0 {
                break;
            }
            pos ^= c as usize;
            let u = unit(pos)?;
            if u & ((1 << 31) | 0xFF) != c as u32 {
                return None;
            }
            pos ^= offset(u);
            if (u >> 8) & 1 == 1 {
                let start = (unit(pos)? & ((1 << 31) - 1)) as usize;
                let tail = self.normalized.as_bytes().get(start..)?;
                let len = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
                // Hugging Face slices the blob here and would panic on a
                // range that is not on char boundaries; treat it as no match.
                self.normalized.get(start..start + len)?;
                return Some((start as u32, (start + len) as u32));
            }
        }
        None
    }

    fn replacement(&self, r: (u32, u32)) -> &str {
        &self.normalized[r.0 as usize..r.1 as usize]
    }

    /// Normalizes `w.cur` in place.
    pub(crate) fn normalize(&self, w: &mut Work) {
        let text = w.cur.text.as_str();
        let bytes = text.as_bytes();
        // Changes are only recorded from the first replacement on; the
        // unchanged prefix is filled in then (most text has none).
        let mut modified = false;
        let flags = grapheme_flags();
        let changes = &mut w.changes;
        changes.clear();
        let mut pos = 0;
        // Whether `pos` is known to start a grapheme. A char that the map
        // neither maps nor starts a longer entry with is left as it is
        // wherever it stands in its grapheme, so it is passed without
        // segmenting, and the next position's status becomes unknown.
        let mut at_boundary = true;
        while pos < bytes.len() {
            let b = bytes[pos];
            let single_ascii = b < 0x80
                && match bytes.get(pos + 1) {
                    None => true,
                    Some(&n) => n < 0x80 && !(b == b'\r' && n == b'\n'),
                };
            if single_ascii {
                // An ASCII char followed by another ASCII char (other than
                // CR LF) is a grapheme of its own.
                match self.ascii[b as usize] {
                    Some(r) => {
                        if !modified {
                            modified = true;
                            changes.extend(text[..pos].chars().map(|c| (c, 0)));
                        }
                        replace(changes, &text[pos..pos + 1], self.replacement(r));
                    }
                    None => {
                        if modified {
                            changes.push((b as char, 0));
                        }
                    }
                }
                pos += 1;
                at_boundary = true;
                continue;
            }
            let c = text[pos..].chars().next().unwrap_or('\0');
            if b >= 0x80 && !bit(&self.mapped, c) && !bit(&self.prefix, c) && (c as u32) <= 0xFFFF {
                if modified {
                    changes.push((c, 0));
                }
                pos += c.len_utf8();
                at_boundary = false;
                continue;
            }
            if let Some((c, len)) = single_char_grapheme(text, pos, flags) {
                if !bit(&self.mapped, c) {
                    if modified {
                        changes.push((c, 0));
                    }
                    pos += len;
                    at_boundary = true;
                    continue;
                }
            }
            if !at_boundary && !is_boundary(text, pos) {
                // Inside a grapheme: this char is looked up on its own.
                let part = &text[pos..pos + c.len_utf8()];
                match self.lookup(part.as_bytes()) {
                    Some(r) => {
                        if !modified {
                            modified = true;
                            changes.extend(text[..pos].chars().map(|c| (c, 0)));
                        }
                        replace(changes, part, self.replacement(r));
                    }
                    None => {
                        if modified {
                            changes.push((c, 0));
                        }
                    }
                }
                pos += part.len();
                continue;
            }
            at_boundary = true;
            let grapheme = text[pos..].graphemes(true).next().unwrap_or(&text[pos..]);
            if grapheme.len() < 6 {
                if let Some(r) = self.lookup(grapheme.as_bytes()) {
                    if !modified {
                        modified = true;
                        changes.extend(text[..pos].chars().map(|c| (c, 0)));
                    }
                    replace(changes, grapheme, self.replacement(r));
                    pos += grapheme.len();
                    continue;
                }
            }
            for (i, c) in grapheme.char_indices() {
                let part = &grapheme[i..i + c.len_utf8()];
                match self.lookup(part.as_bytes()) {
                    Some(r) => {
                        if !modified {
                            modified = true;
                            changes.extend(text[..pos + i].chars().map(|c| (c, 0)));
                        }
                        replace(changes, part, self.replacement(r));
                    }
                    None => {
                        if modified {
                            changes.push((c, 0));
                        }
                    }
                }
            }
            pos += grapheme.len();
        }
        if modified {
            w.apply_changes(0);
        }
    }
}

/// Records `old` becoming `new`, as Hugging Face does: chars replace chars
/// one for one, extra new chars are insertions, and fewer new chars fold the
/// removal into the last recorded change (even one from an earlier grapheme).
fn replace(changes: &mut Vec<(char, isize)>, old: &str, new: &str) {
    let old_count = old.chars().count() as isize;
    let new_count = new.chars().count() as isize;
    let diff = new_count - old_count;
    changes.extend(new.chars().map(|c| (c, 0)));
    if diff > 0 {
        let n = changes.len();
        for ch in &mut changes[n - diff as usize..] {
            ch.1 = 1;
        }
    } else if diff < 0 {
        if let Some(last) = changes.last_mut() {
            last.1 += diff;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table-driven shortcut agrees with the segmenter on every string
    /// made of chars from all break categories.
    #[test]
    fn single_char_graphemes_match_the_segmenter() {
        let alphabet: Vec<char> = "a\r\n\u{1}\u{600}\u{1F1E6}\u{1F1E7}\u{1100}\u{1161}\u{11A8}\u{AC00}\u{AC01}\u{1F600}\u{915}\u{94D}\u{200D}\u{301}\u{903}\u{E01}\u{E33}é日\u{FF8A}\u{FF9F}"
            .chars()
            .collect();
        let flags = grapheme_flags();
        let mut seed = 0x2545F4914F6CDD1Du64;
        let mut s = String::new();
        for _ in 0..20000 {
            s.clear();
            for _ in 0..6 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                s.push(alphabet[(seed % alphabet.len() as u64) as usize]);
            }
            let mut pos = 0;
            for g in s.graphemes(true) {
                if let Some((_, len)) = single_char_grapheme(&s, pos, flags) {
                    assert_eq!(len, g.len(), "{s:?} at {pos}");
                }
                pos += g.len();
            }
        }
    }
}
