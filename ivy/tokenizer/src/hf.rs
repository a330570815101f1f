//! The Hugging Face `tokenizers` crate behind Ivy's interface.

use tokenizers::utils::truncation::{
    truncate_encodings, TruncationDirection, TruncationParams, TruncationStrategy,
};

use tokenizers::PostProcessor;

use crate::{Direction, EncodeOptions, Encoding, Error, Result};

pub(crate) struct HfTokenizer {
    inner: tokenizers::Tokenizer,
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
        Ok(Self { inner })
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
                let params = TruncationParams {
                    max_length: max.saturating_sub(added),
                    strategy: TruncationStrategy::LongestFirst,
                    stride: 0,
                    direction: match opts.direction {
                        Direction::Right => TruncationDirection::Right,
                        Direction::Left => TruncationDirection::Left,
                    },
                };
                (first, second) = truncate_encodings(first, second, &params).map_err(enc_err)?;
            }
        }
        let done = self
            .inner
            .post_process(first, second, opts.add_special_tokens)
            .map_err(enc_err)?;
        out.ids.extend_from_slice(done.get_ids());
        out.offsets
            .extend(done.get_offsets().iter().map(|&(s, e)| (s as u32, e as u32)));
        out.special
            .extend(done.get_special_tokens_mask().iter().map(|&m| m != 0));
        Ok(())
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
