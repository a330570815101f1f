//! The Unigram model: the best-scoring segmentation of a word into
//! vocabulary pieces (Viterbi over byte positions), with Hugging Face's
//! handling of unknown characters: each gets the lowest score minus 10,
//! consecutive unknowns fuse into one token, and with `byte_fallback` an
//! unknown token becomes one `<0xXX>` piece per byte.

use crate::pieces::Pieces;
use crate::trie::{Trie, NO_VALUE};
use crate::{Error, Result};

/// Hugging Face's (and SentencePiece's) penalty for an unknown char.
const UNK_PENALTY: f64 = 10.0;
/// Marks "no path reaches this position yet".
const UNREACHED: u32 = u32::MAX;
/// Marks a fused run of unknown chars whose id is still to be decided.
const UNK_RUN: u32 = u32::MAX;

#[derive(Debug)]
pub(crate) struct Unigram {
    trie: Trie,
    /// Scores by id, for vocabularies whose scores are not all exact in
    /// `f32` (the trie keeps `f32` copies inline).
    scores: Option<Vec<f64>>,
    unk_id: Option<u32>,
    unk_score: f64,
    /// Ids of `<0x00>` … `<0xFF>` when byte fallback is on and all exist.
    byte_ids: Option<Box<[u32; 256]>>,
    byte_fallback: bool,
    pieces: Pieces,
    size: usize,
}

/// The best path ending at a byte position.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Best {
    score: f64,
    start: u32,
    id: u32,
}

/// Reusable buffers for one word.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    best: Vec<Best>,
    /// Tokens of the best path, last first: `(id, start, end)`.
    rev: Vec<(u32, u32, u32)>,
}

impl Unigram {
    pub(crate) fn new(vocab: &[(&str, f64)], unk_id: Option<usize>, byte_fallback: bool) -> Result<Self> {
        if let Some(unk) = unk_id {
            if vocab.is_empty() {
                return Err(Error::Invalid("Unigram: empty vocabulary".into()));
            }
            if unk >= vocab.len() {
                return Err(Error::Invalid(format!(
                    "Unigram: unk_id {unk} is not in the vocabulary of {}",
                    vocab.len()
                )));
            }
        }
        let min_score = vocab.iter().map(|v| v.1).fold(f64::INFINITY, f64::min);
        let exact = vocab.iter().all(|&(_, s)| (s as f32) as f64 == s);
        let trie = Trie::build(
            vocab
                .iter()
                .enumerate()
                .map(|(id, &(p, s))| (p.as_bytes(), id as u32, s as f32)),
        );
        let mut byte_ids = Box::new([NO_VALUE; 256]);
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            *slot = trie.get(format!("<0x{b:02X}>").as_bytes()).unwrap_or(NO_VALUE);
        }
        Ok(Self {
            scores: (!exact).then(|| vocab.iter().map(|v| v.1).collect()),
            unk_id: unk_id.map(|u| u as u32),
            unk_score: min_score - UNK_PENALTY,
            byte_ids: byte_fallback.then_some(byte_ids),
            byte_fallback,
            pieces: Pieces::new(vocab.iter().enumerate().map(|(i, v)| (i as u32, v.0))),
            size: vocab.len(),
            trie,
        })
    }

    pub(crate) fn vocab_size(&self) -> usize {
        self.size
    }

    pub(crate) fn token_to_id(&self, token: &str) -> Option<u32> {
        self.trie.get(token.as_bytes())
    }

    pub(crate) fn id_to_token(&self, id: u32) -> Option<&str> {
        self.pieces.get(id)
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        self.trie.memory_bytes()
            + self.pieces.memory_bytes()
            + self.scores.as_ref().map_or(0, |s| s.capacity() * 8)
    }

    #[inline(always)]
    fn score(&self, state: u32, id: u32) -> f64 {
        match &self.scores {
            None => self.trie.score(state) as f64,
            Some(s) => s[id as usize],
        }
    }

    /// Tokenizes one non-empty word; calls `emit(id, start, end)` for each
    /// token in order, with byte offsets into `word`.
    pub(crate) fn tokenize(
        &self,
        word: &str,
        sc: &mut Scratch,
        mut emit: impl FnMut(u32, u32, u32),
    ) -> Result<()> {
        let bytes = word.as_bytes();
        let n = bytes.len();
        sc.best.clear();
        sc.best.resize(
            n + 1,
            Best {
                score: 0.0,
                start: UNREACHED,
                id: 0,
            },
        );
        let best = &mut sc.best[..];
        let mut pos = 0;
        while pos < n {
            let till_here = best[pos].score;
            let char_len = utf8_len(bytes[pos]);
            let mut has_single = false;
            let mut state = Trie::ROOT;
            let mut end = pos;
            while end < n {
                let Some(next) = self.trie.next(state, bytes[end]) else {
                    break;
                };
                state = next;
                end += 1;
                let id = self.trie.value(state);
                if id == NO_VALUE {
                    continue;
                }
                let candidate = self.score(state, id) + till_here;
                let node = &mut best[end];
                // Strictly better only: on ties the earliest start wins.
                if node.start == UNREACHED || candidate > node.score {
                    *node = Best {
                        score: candidate,
                        start: pos as u32,
                        id,
                    };
                }
                has_single |= end - pos == char_len;
            }
            if !has_single {
                let unk = self.unk_id.ok_or_else(missing_unk)?;
                let candidate = self.unk_score + till_here;
                let node = &mut best[(pos + char_len).min(n)];
                if node.start == UNREACHED || candidate > node.score {
                    *node = Best {
                        score: candidate,
                        start: pos as u32,
                        id: unk,
                    };
                }
            }
            pos += char_len;
        }

        // Walk the best path back, fusing runs of unknown tokens.
        sc.rev.clear();
        let mut end = n;
        let mut unk_end = None;
        while end > 0 {
            let node = best[end];
            let start = node.start as usize;
            if Some(node.id) == self.unk_id {
                unk_end.get_or_insert(end);
            } else {
                if let Some(ue) = unk_end.take() {
                    sc.rev.push((UNK_RUN, end as u32, ue as u32));
                }
                sc.rev.push((node.id, start as u32, end as u32));
            }
            end = start;
        }
        if let Some(ue) = unk_end {
            sc.rev.push((UNK_RUN, 0, ue as u32));
        }
        for &(id, s, e) in sc.rev.iter().rev() {
            if id != UNK_RUN {
                emit(id, s, e);
            } else {
                self.emit_unknown(&word[s as usize..e as usize], s, e, &mut emit)?;
            }
        }
        Ok(())
    }

    /// A fused unknown run: its own id if the vocabulary has it, else bytes
    /// (with byte fallback, when every byte piece exists), else unk.
    fn emit_unknown(&self, text: &str, s: u32, e: u32, emit: &mut impl FnMut(u32, u32, u32)) -> Result<()> {
        if let Some(id) = self.trie.get(text.as_bytes()) {
            emit(id, s, e);
            return Ok(());
        }
        if self.byte_fallback {
            if let Some(ids) = &self.byte_ids {
                if text.bytes().all(|b| ids[b as usize] != NO_VALUE) {
                    for b in text.bytes() {
                        emit(ids[b as usize], s, e);
                    }
                    return Ok(());
                }
            }
        }
        emit(self.unk_id.ok_or_else(missing_unk)?, s, e);
        Ok(())
    }
}

fn missing_unk() -> Error {
    Error::Encode("Unigram: a character is not in the vocabulary and the model has no unk_id".into())
}

/// Length of the UTF-8 sequence starting with `lead`.
#[inline(always)]
fn utf8_len(lead: u8) -> usize {
    match lead {
        0x00..=0x7F => 1,
        0xC0..=0xDF => 2,
        0xE0..=0xEF => 3,
        _ => 4,
    }
}
