//! The in-house pipeline: added tokens → normalizer → pre-tokenizer →
//! model → truncation → template, on per-thread scratch buffers.

use std::cell::RefCell;

use crate::added::{AddedVocab, Segment};
use crate::normalized::Work;
use crate::normalizers::Normalizer;
use crate::postprocess::{keep_range, longest_first, Seq, Template};
use crate::pretokenizers::{PreTokenizer, Words};
use crate::vocab::Vocab;
use crate::{unigram, EncodeOptions, Encoding, Error, Result};

/// The tokenization model.
#[derive(Debug)]
pub(crate) enum Model {
    Unigram(crate::unigram::Unigram),
    WordPiece(crate::wordpiece::WordPiece),
}

impl Model {
    pub(crate) fn vocab(&self) -> &Vocab {
        match self {
            Self::Unigram(m) => m.vocab(),
            Self::WordPiece(m) => m.vocab(),
        }
    }

    fn memory_bytes(&self) -> usize {
        self.vocab().memory_bytes()
            + match self {
                Self::Unigram(m) => m.extra_memory_bytes(),
                Self::WordPiece(_) => 0,
            }
    }
}

/// A tokenizer.json the in-house code implements in full.
#[derive(Debug)]
pub(crate) struct Native {
    pub normalizer: Option<Normalizer>,
    pub pre_tokenizer: PreTokenizer,
    pub model: Model,
    pub added: AddedVocab,
    pub template: Template,
    /// The file's `decoder`; `None` joins token strings with spaces.
    pub decoder: Option<tokenizers::decoders::DecoderWrapper>,
    /// Contents of the special added tokens (`decode` can skip them).
    pub special: std::collections::HashSet<String>,
}

/// Buffers reused from call to call on one thread.
#[derive(Debug, Default)]
struct Scratch {
    work: Work,
    words: Words,
    spare: Words,
    raw_segments: Vec<Segment>,
    norm_segments: Vec<Segment>,
    unigram: unigram::Scratch,
    wordpiece: crate::wordpiece::Scratch,
    a: Seq,
    b: Seq,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

impl Native {
    pub(crate) fn model_name(&self) -> &'static str {
        match self.model {
            Model::Unigram(_) => "Unigram",
            Model::WordPiece(_) => "WordPiece",
        }
    }

    pub(crate) fn vocab_size(&self) -> usize {
        let base = self.model.vocab().len();
        let extra = self
            .added
            .ids()
            .filter(|(_, content)| self.model.vocab().token_to_id(content).is_none())
            .count();
        base + extra
    }

    pub(crate) fn id_to_token(&self, id: u32) -> Option<&str> {
        self.added
            .id_to_token(id)
            .or_else(|| self.model.vocab().id_to_token(id))
    }

    /// Token ids back to text, as Hugging Face's `Tokenizer::decode` does:
    /// ids outside the vocabulary are dropped, special tokens too when
    /// asked, and the rest goes through the file's decoder.
    pub(crate) fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        use tokenizers::Decoder;
        let tokens: Vec<String> = ids
            .iter()
            .filter_map(|&id| self.id_to_token(id))
            .filter(|t| !skip_special_tokens || !self.special.contains(*t))
            .map(str::to_owned)
            .collect();
        match &self.decoder {
            Some(d) => d.decode(tokens).map_err(|e| Error::Decode(e.to_string())),
            None => Ok(tokens.join(" ")),
        }
    }

    pub(crate) fn num_special_tokens(&self, pair: bool) -> usize {
        self.template.added(pair)
    }

    /// Bytes held by the vocabulary structures.
    pub(crate) fn vocab_memory_bytes(&self) -> usize {
        self.model.memory_bytes()
    }

    pub(crate) fn encode(
        &self,
        a: &str,
        b: Option<&str>,
        opts: &EncodeOptions,
        out: &mut Encoding,
    ) -> Result<()> {
        SCRATCH.with(|cell| match cell.try_borrow_mut() {
            Ok(mut sc) => self.encode_with(a, b, opts, out, &mut sc),
            // Only reachable by re-entrance; correctness over reuse.
            Err(_) => self.encode_with(a, b, opts, out, &mut Scratch::default()),
        })
    }

    fn encode_with(
        &self,
        a: &str,
        b: Option<&str>,
        opts: &EncodeOptions,
        out: &mut Encoding,
        sc: &mut Scratch,
    ) -> Result<()> {
        let mut seq_a = std::mem::take(&mut sc.a);
        let mut seq_b = std::mem::take(&mut sc.b);
        let result = (|| {
            self.encode_sequence(a, sc, &mut seq_a)?;
            if let Some(b) = b {
                self.encode_sequence(b, sc, &mut seq_b)?;
            }
            let pair = b.is_some();
            let added = if opts.add_special_tokens {
                self.template.added(pair)
            } else {
                0
            };
            let (len_a, len_b) = (seq_a.ids.len(), seq_b.ids.len());
            out.untruncated_len = len_a + if pair { len_b } else { 0 } + added;
            let (ra, rb) = match opts.max_length {
                Some(max) if out.untruncated_len > max => {
                    let dir = opts.direction;
                    let capped_b = pair.then(|| seq_b.early_stop_len(max, dir));
                    let (ka, kb) = longest_first(
                        seq_a.early_stop_len(max, dir),
                        capped_b,
                        max.saturating_sub(added),
                    );
                    (keep_range(len_a, ka, dir), keep_range(len_b, kb, dir))
                }
                _ => (0..len_a, 0..len_b),
            };
            self.template.apply(
                (&seq_a, ra),
                pair.then_some((&seq_b, rb)),
                opts.add_special_tokens,
                out,
            );
            Ok(())
        })();
        sc.a = seq_a;
        sc.b = seq_b;
        result
    }

    /// Tokenizes one text into `seq` (ids and byte offsets), no specials.
    fn encode_sequence(&self, text: &str, sc: &mut Scratch, seq: &mut Seq) -> Result<()> {
        seq.clear();
        let mut raw = std::mem::take(&mut sc.raw_segments);
        self.added.split_raw(text, &mut raw);
        let result = raw.iter().try_for_each(|segment| match segment {
            Segment::Token(id, r) => {
                seq.push(*id, (r.start as u32, r.end as u32));
                seq.end_split(false);
                Ok(())
            }
            Segment::Text(r) if r.is_empty() => Ok(()),
            Segment::Text(r) => {
                sc.work.load(&text[r.clone()], r.start as u32);
                if let Some(n) = &self.normalizer {
                    n.normalize(&mut sc.work);
                }
                self.encode_normalized(sc, seq)
            }
        });
        sc.raw_segments = raw;
        result
    }

    /// Splits the normalized text in `sc.work.cur` around normalized added
    /// tokens, then pre-tokenizes and tokenizes each remaining part.
    fn encode_normalized(&self, sc: &mut Scratch, seq: &mut Seq) -> Result<()> {
        if sc.work.cur.text.is_empty() {
            return Ok(());
        }
        if !self.added.has_normalized() {
            let len = sc.work.cur.text.len();
            return self.encode_part(sc, seq, 0..len);
        }
        let mut parts = std::mem::take(&mut sc.norm_segments);
        self.added.split_normalized(&sc.work.cur.text, &mut parts);
        let result = parts.iter().try_for_each(|part| match part {
            Segment::Token(id, r) => {
                if let Some(span) = sc.work.cur.original_span(r.clone()) {
                    seq.push(*id, span);
                    seq.end_split(false);
                }
                Ok(())
            }
            Segment::Text(r) => self.encode_part(sc, seq, r.clone()),
        });
        sc.norm_segments = parts;
        result
    }

    fn encode_part(
        &self,
        sc: &mut Scratch,
        seq: &mut Seq,
        range: std::ops::Range<usize>,
    ) -> Result<()> {
        self.pre_tokenizer
            .run(&sc.work.cur, range, &mut sc.words, &mut sc.spare);
        let words = &sc.words;
        let convert = |w: usize, s: u32, e: u32| {
            let word = &words.words[w];
            let base = word.start as usize;
            (
                words.align[base + s as usize].0,
                words.align[base + e as usize - 1].1,
            )
        };
        match &self.model {
            Model::Unigram(m) => {
                let mut current = None;
                m.tokenize_words(
                    words.words.iter().map(|w| words.word(w)),
                    &mut sc.unigram,
                    |w, id, s, e| {
                        if current.is_some_and(|c| c != w) {
                            seq.end_split(true);
                        }
                        current = Some(w);
                        seq.push(id, convert(w, s, e));
                    },
                )?;
                if current.is_some() {
                    seq.end_split(true);
                }
            }
            Model::WordPiece(m) => {
                for (i, w) in words.words.iter().enumerate() {
                    m.tokenize(words.word(w), &mut sc.wordpiece, |id, s, e| {
                        seq.push(id, convert(i, s, e))
                    })?;
                    seq.end_split(true);
                }
            }
        }
        Ok(())
    }
}
