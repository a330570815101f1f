//! The Unigram model: the best-scoring segmentation of a word into
//! vocabulary pieces (Viterbi over byte positions), with Hugging Face's
//! handling of unknown characters: each gets the lowest score minus 10,
//! consecutive unknowns fuse into one token, and with `byte_fallback` an
//! unknown token becomes one `<0xXX>` piece per byte.

use std::sync::atomic::{AtomicU8, Ordering};

use crate::pieces::Pieces;
use crate::trie::{Trie, MAX_VALUE, NO_VALUE};
use crate::{Error, Result};

/// Hugging Face's (and SentencePiece's) penalty for an unknown char.
const UNK_PENALTY: f64 = 10.0;
/// Marks "no path reaches this position yet".
const UNREACHED: u32 = u32::MAX;
/// Marks a fused run of unknown chars whose id is still to be decided.
const UNK_RUN: u32 = u32::MAX;
/// The "state" of an unknown-char step on the best path.
const UNK_STATE: u32 = u32::MAX;

#[derive(Debug)]
pub(crate) struct Unigram {
    trie: Trie,
    unk_id: Option<u32>,
    unk_score: f64,
    /// Ids of `<0x00>` … `<0xFF>` when byte fallback is on and all exist.
    byte_ids: Option<Box<[u32; 256]>>,
    byte_fallback: bool,
    pieces: Pieces,
    size: usize,
    /// For each piece id: whether a word made of exactly that piece
    /// segments to the piece itself ([`WHOLE`]), or not ([`SPLIT`]), once
    /// some call has found out ([`UNKNOWN`] before).
    /// Frequent words are single pieces; this lets them skip the Viterbi
    /// pass. It memoizes a pure function, so output never depends on it.
    whole: Vec<AtomicU8>,
}

const UNKNOWN: u8 = 0;
const WHOLE: u8 = 1;
const SPLIT: u8 = 2;

/// The best path ending at a byte position: its score, where its last
/// piece starts, and the trie state of that piece (its id is read only for
/// the pieces of the final path).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Best {
    score: f64,
    start: u32,
    state: u32,
}

/// How many trie walks advance together (see `Unigram::forward`).
const LANES: usize = 8;

/// Reusable buffers for one word.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    best: Vec<Best>,
    /// Pieces found by the walks of a group: `(end, state)`, `stride` per
    /// lane (one more than the longest key).
    found: Vec<(u32, u32)>,
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
        if vocab.len() > MAX_VALUE as usize {
            return Err(Error::Invalid(format!("Unigram: {} pieces is too many", vocab.len())));
        }
        if let Some((p, s)) = vocab.iter().find(|v| !v.1.is_finite()) {
            return Err(Error::Invalid(format!("Unigram: piece {p:?} has score {s}")));
        }
        let min_score = vocab.iter().map(|v| v.1).fold(f64::INFINITY, f64::min);
        let trie = Trie::build(
            vocab
                .iter()
                .enumerate()
                .map(|(id, &(p, s))| (p.as_bytes(), id as u32, s)),
        );
        let mut byte_ids = Box::new([NO_VALUE; 256]);
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            *slot = trie.get(format!("<0x{b:02X}>").as_bytes()).unwrap_or(NO_VALUE);
        }
        Ok(Self {
            unk_id: unk_id.map(|u| u as u32),
            unk_score: min_score - UNK_PENALTY,
            byte_ids: byte_fallback.then_some(byte_ids),
            byte_fallback,
            pieces: Pieces::new(vocab.iter().enumerate().map(|(i, v)| (i as u32, v.0))),
            size: vocab.len(),
            whole: (0..vocab.len()).map(|_| AtomicU8::new(UNKNOWN)).collect(),
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
        self.trie.memory_bytes() + self.pieces.memory_bytes() + self.whole.len()
    }

    /// The id of a best-path step.
    #[inline]
    fn id_of(&self, state: u32) -> u32 {
        if state == UNK_STATE {
            self.unk_id.unwrap_or(NO_VALUE)
        } else {
            self.trie.value(state)
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
        // The walk from the first byte: if the whole word is one piece known
        // to be its own best segmentation, that is the answer; otherwise its
        // pieces are the first walk of the Viterbi pass.
        let stride = self.trie.max_key_len() + 1;
        sc.found.resize(stride * LANES, (0, 0));
        let mut state = Trie::ROOT;
        let mut first_walk = 0;
        let mut whole_word = true;
        for (i, &b) in bytes.iter().enumerate() {
            let Some(t) = self.trie.next(state, b) else {
                whole_word = false;
                break;
            };
            state = t;
            if self.trie.is_key(t) {
                sc.found[first_walk] = (i as u32 + 1, t);
                first_walk += 1;
            }
        }
        let piece = (whole_word && self.trie.is_key(state)).then(|| self.trie.value(state));
        let known = piece.map(|id| self.whole[id as usize].load(Ordering::Relaxed));
        if let (Some(id), Some(WHOLE)) = (piece, known) {
            emit(id, 0, n as u32);
            return Ok(());
        }
        sc.best.clear();
        sc.best.resize(
            n + 1,
            Best {
                score: 0.0,
                start: UNREACHED,
                state: 0,
            },
        );
        self.forward(bytes, first_walk, sc)?;
        let best = &sc.best[..];

        // Walk the best path back, fusing runs of unknown tokens.
        sc.rev.clear();
        let mut end = n;
        let mut unk_end = None;
        while end > 0 {
            let node = best[end];
            let start = node.start as usize;
            let id = self.id_of(node.state);
            if Some(id) == self.unk_id {
                unk_end.get_or_insert(end);
            } else {
                if let Some(ue) = unk_end.take() {
                    sc.rev.push((UNK_RUN, end as u32, ue as u32));
                }
                sc.rev.push((id, start as u32, end as u32));
            }
            end = start;
        }
        if let Some(ue) = unk_end {
            sc.rev.push((UNK_RUN, 0, ue as u32));
        }
        if let (Some(id), Some(UNKNOWN)) = (piece, known) {
            let whole = sc.rev.len() == 1 && sc.rev[0] == (id, 0, n as u32);
            self.whole[id as usize].store(if whole { WHOLE } else { SPLIT }, Ordering::Relaxed);
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

    /// Fills `sc.best`: the best path ending at every char boundary.
    ///
    /// The trie walks from up to [`LANES`] start positions advance in
    /// lockstep: each step is a dependent load from a large array, and
    /// independent walks let those loads overlap. The pieces found are then
    /// scored in start order, exactly as a one-walk-at-a-time Viterbi would
    /// (walks do not depend on scores).
    ///
    /// The walk from position 0 is already done: `first_walk` pieces of it
    /// are in lane 0 of `sc.found`.
    fn forward(&self, bytes: &[u8], first_walk: usize, sc: &mut Scratch) -> Result<()> {
        let n = bytes.len();
        let stride = self.trie.max_key_len() + 1;
        let found = &mut sc.found[..];
        let best = &mut sc.best[..];
        let mut pos = 0;
        while pos < n {
            // Start positions of this group.
            let mut starts = [0usize; LANES];
            let mut k = 0;
            while k < LANES && pos < n {
                starts[k] = pos;
                pos += utf8_len(bytes[pos]);
                k += 1;
            }
            let mut state = [Trie::ROOT; LANES];
            let mut at = starts;
            let mut count = [0usize; LANES];
            let mut live = [false; LANES];
            live[..k].fill(true);
            let mut active = k;
            if starts[0] == 0 {
                count[0] = first_walk;
                live[0] = false;
                active -= 1;
            }
            while active > 0 {
                for lane in 0..k {
                    if !live[lane] {
                        continue;
                    }
                    let p = at[lane];
                    let next = if p < n {
                        self.trie.next(state[lane], bytes[p])
                    } else {
                        None
                    };
                    let Some(t) = next else {
                        live[lane] = false;
                        active -= 1;
                        continue;
                    };
                    state[lane] = t;
                    at[lane] = p + 1;
                    if self.trie.is_key(t) {
                        found[lane * stride + count[lane]] = (p as u32 + 1, t);
                        count[lane] += 1;
                    }
                }
            }
            for lane in 0..k {
                let start = starts[lane];
                let char_len = utf8_len(bytes[start]);
                let till_here = best[start].score;
                let mut has_single = false;
                for &(end, t) in &found[lane * stride..lane * stride + count[lane]] {
                    let candidate = self.trie.score(t) + till_here;
                    let node = &mut best[end as usize];
                    // Strictly better only: on ties the earliest start wins.
                    if node.start == UNREACHED || candidate > node.score {
                        *node = Best {
                            score: candidate,
                            start: start as u32,
                            state: t,
                        };
                    }
                    has_single |= end as usize - start == char_len;
                }
                if !has_single {
                    self.unk_id.ok_or_else(missing_unk)?;
                    let candidate = self.unk_score + till_here;
                    let node = &mut best[(start + char_len).min(n)];
                    if node.start == UNREACHED || candidate > node.score {
                        *node = Best {
                            score: candidate,
                            start: start as u32,
                            state: UNK_STATE,
                        };
                    }
                }
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
