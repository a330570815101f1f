//! The Hugging Face `tokenizers` crate behind Ivy's interface, for files the
//! in-house pipeline does not implement.

use std::collections::HashSet;

use tokenizers::utils::truncation::TruncationDirection;
use tokenizers::PostProcessor;

use crate::postprocess::longest_first;
use crate::{Direction, EncodeOptions, Encoding, Error, Result};

pub(crate) struct HfTokenizer {
    inner: tokenizers::Tokenizer,
    /// Ids of the added tokens: their splits never stop tokenization early.
    added_ids: HashSet<u32>,
}

impl HfTokenizer {
    pub(crate) fn from_bytes(json: &[u8]) -> Result<Self> {
        let mut inner =
            tokenizers::Tokenizer::from_bytes(json).map_err(|e| Error::Invalid(e.to_string()))?;
        // Truncation and padding are per call; the file's settings would
        // silently cut or pad every request.
        inner
            .with_truncation(None)
            .map_err(|e| Error::Invalid(e.to_string()))?;
        inner.with_padding(None);
        let added_ids = inner.get_added_tokens_decoder().keys().copied().collect();
        Ok(Self { inner, added_ids })
    }

    pub(crate) fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| Error::Decode(e.to_string()))
    }

    pub(crate) fn encode(
        &self,
        a: &str,
        b: Option<&str>,
        opts: &EncodeOptions,
        out: &mut Encoding,
    ) -> Result<()> {
        let enc_err = |e: tokenizers::Error| Error::Encode(e.to_string());
        let mut first = self.inner.encode(a, false).map_err(enc_err)?;
        let mut second = match b {
            Some(b) => Some(self.inner.encode(b, false).map_err(enc_err)?),
            None => None,
        };
        let added = if opts.add_special_tokens {
            self.num_special_tokens(second.is_some())
        } else {
            0
        };
        out.untruncated_len = first.len() + second.as_ref().map_or(0, |s| s.len()) + added;
        if let Some(max) = opts.max_length {
            if out.untruncated_len > max {
                let dir = opts.direction;
                let capped_b = second.as_ref().map(|s| self.early_stop_len(s, max, dir));
                let (ka, kb) = longest_first(
                    self.early_stop_len(&first, max, dir),
                    capped_b,
                    max.saturating_sub(added),
                );
                let hf_dir = match dir {
                    Direction::Right => TruncationDirection::Right,
                    Direction::Left => TruncationDirection::Left,
                };
                truncate(&mut first, ka, hf_dir);
                if let Some(s) = second.as_mut() {
                    truncate(s, kb, hf_dir);
                }
            }
        }
        let done = self
            .inner
            .post_process(first, second, opts.add_special_tokens)
            .map_err(enc_err)?;
        out.ids.extend_from_slice(done.get_ids());
        out.offsets.extend(
            done.get_offsets()
                .iter()
                .map(|&(s, e)| (s as u32, e as u32)),
        );
        out.special
            .extend(done.get_special_tokens_mask().iter().map(|&m| m != 0));
        Ok(())
    }

    /// The length Hugging Face's tokenizer reaches before truncating when
    /// truncation is configured (it stops at the first model-produced word
    /// that brings the count to `max`); see `Seq::early_stop_len`.
    fn early_stop_len(&self, enc: &tokenizers::Encoding, max: usize, dir: Direction) -> usize {
        // Consecutive tokens with the same word index form one split; a
        // split of one added-token id came from the added vocabulary.
        let words = enc.get_word_ids();
        let ids = enc.get_ids();
        let mut splits = Vec::new();
        let mut start = 0;
        for i in 1..=words.len() {
            if i == words.len() || words[i] != words[start] {
                let from_model = !(i - start == 1 && self.added_ids.contains(&ids[start]));
                splits.push((i - start, from_model));
                start = i;
            }
        }
        let mut total = 0;
        let mut visit = |&(n, from_model): &(usize, bool)| {
            total += n;
            from_model && total >= max
        };
        match dir {
            Direction::Right => {
                let _ = splits.iter().any(&mut visit);
            }
            Direction::Left => {
                let _ = splits.iter().rev().any(&mut visit);
            }
        }
        total
    }

    pub(crate) fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    pub(crate) fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub(crate) fn num_special_tokens(&self, pair: bool) -> usize {
        self.inner
            .get_post_processor()
            .map_or(0, |p| p.added_tokens(pair))
    }
}

fn truncate(enc: &mut tokenizers::Encoding, keep: usize, dir: TruncationDirection) {
    if keep == 0 {
        *enc = tokenizers::Encoding::default();
    } else {
        enc.truncate(keep, 0, dir);
    }
}
