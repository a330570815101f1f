//! Many texts at once (spread over cores) and char offsets for display.

use rayon::prelude::*;

use crate::{EncodeOptions, Encoding, Result, Tokenizer};

/// Below this many bytes in total a batch runs on the calling thread: the
/// hand-off to other cores costs more than it saves.
const PARALLEL_MIN_BYTES: usize = 32 * 1024;

impl Tokenizer {
    /// Tokenizes many texts; large batches are spread over all cores (the
    /// rayon pool), small ones run on the calling thread. The result is in
    /// input order; the first error wins.
    pub fn encode_batch<S: AsRef<str> + Sync>(
        &self,
        texts: &[S],
        opts: &EncodeOptions,
    ) -> Result<Vec<Encoding>> {
        let bytes: usize = texts.iter().map(|t| t.as_ref().len()).sum();
        if bytes < PARALLEL_MIN_BYTES || texts.len() < 2 {
            return texts
                .iter()
                .map(|t| self.encode(t.as_ref(), opts))
                .collect();
        }
        texts
            .par_iter()
            .with_min_len(4)
            .map(|t| self.encode(t.as_ref(), opts))
            .collect()
    }
}

/// Converts byte offsets into `text` to char offsets, as Hugging Face's
/// `encode_char_offsets` does (an end at the end of the text maps to the
/// char count; offsets it cannot map are left as they are).
pub fn char_offsets(text: &str, offsets: &[(u32, u32)]) -> Vec<(u32, u32)> {
    // Char index of every byte, and of the end.
    let mut index = vec![u32::MAX; text.len() + 1];
    for (n, (b, c)) in text.char_indices().enumerate() {
        for slot in &mut index[b..b + c.len_utf8()] {
            *slot = n as u32;
        }
    }
    let at = |b: u32| -> Option<u32> {
        let v = *index.get(b as usize)?;
        (v != u32::MAX && (b as usize) < text.len()).then_some(v)
    };
    offsets
        .iter()
        .map(|&(s, e)| match (at(s), at(e)) {
            (Some(s), Some(e)) => (s, e),
            (Some(s), None) => {
                let last = e.checked_sub(1).and_then(at).unwrap_or(s + 1);
                (s, last + 1)
            }
            _ => (s, e),
        })
        .collect()
}
