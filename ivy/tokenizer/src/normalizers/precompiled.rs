//! SentencePiece's precompiled character map (`Precompiled` normalizer).
//!
//! The map is a darts-clone double array from UTF-8 sequences to offsets in a
//! blob of NUL-terminated replacement strings. Matching follows Hugging
//! Face's reading of it exactly, quirks included: a grapheme shorter than six
//! bytes is looked up whole and replaced by the *shortest* mapped prefix;
//! otherwise each of its chars is looked up on its own.

use unicode_segmentation::UnicodeSegmentation;

use crate::normalized::Work;
use crate::{Error, Result};

#[derive(Debug, Clone)]
pub(crate) struct Precompiled {
    units: Vec<u32>,
    normalized: String,
    /// The replacement of each single ASCII char, as a range of `normalized`.
    ascii: [Option<(u32, u32)>; 128],
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
        let normalized = String::from_utf8(map[4 + size / 4 * 4..].to_vec())
            .map_err(|_| Error::Invalid("precompiled_charsmap: replacements are not UTF-8".into()))?;
        let mut p = Self {
            units,
            normalized,
            ascii: [None; 128],
        };
        for b in 0..128u8 {
            p.ascii[b as usize] = p.lookup(&[b]);
        }
        Ok(p)
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
        let changes = &mut w.changes;
        changes.clear();
        let mut pos = 0;
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
                continue;
            }
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
