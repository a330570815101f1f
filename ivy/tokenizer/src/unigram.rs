//! The Unigram model: the best-scoring segmentation of a word into
//! vocabulary pieces (Viterbi over byte positions), with Hugging Face's
//! handling of unknown characters: each gets the lowest score minus 10,
//! consecutive unknowns fuse into one token, and with `byte_fallback` an
//! unknown token becomes one `<0xXX>` piece per byte.

use std::sync::atomic::{AtomicU8, Ordering};

use crate::trie::{State, Trie, NO_VALUE};
use crate::vocab::Vocab;
use crate::{Error, Result};

/// Hugging Face's (and SentencePiece's) penalty for an unknown char.
const UNK_PENALTY: f64 = 10.0;
/// Marks "no path reaches this position yet".
const UNREACHED: u32 = u32::MAX;
/// Marks a fused run of unknown chars whose id is still to be decided.
const UNK_RUN: u32 = u32::MAX;

#[derive(Debug)]
pub(crate) struct Unigram {
    vocab: Vocab,
    /// Scores by id, read (in bulk, off the walks' critical path) for the
    /// pieces the walks found.
    scores: Vec<f64>,
    unk_id: Option<u32>,
    unk_score: f64,
    /// Ids of `<0x00>` … `<0xFF>` when byte fallback is on and all exist.
    byte_ids: Option<Box<[u32; 256]>>,
    byte_fallback: bool,
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
/// piece starts, and that piece's id.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Best {
    score: f64,
    start: u32,
    id: u32,
}

/// How many trie walks advance together (see `Unigram::forward`).
const LANES: usize = 16;

/// Reusable buffers for one word.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    best: Vec<Best>,
    /// Pieces found by the first walks of a group of words, laid out as
    /// `found`.
    first: Vec<(u32, u32)>,
    /// Pieces found by the walks of a group: `(end, id)`, `stride` per lane
    /// (one more than the longest key). Their scores are prefetched while
    /// walking and read when the walks are done.
    found: Vec<(u32, u32)>,
    /// Tokens of the best path, last first: `(id, start, end)`.
    rev: Vec<(u32, u32, u32)>,
}

impl Unigram {
    pub(crate) fn new(
        vocab: &[(&str, f64)],
        unk_id: Option<usize>,
        byte_fallback: bool,
    ) -> Result<Self> {
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
        if let Some((p, s)) = vocab.iter().find(|v| !v.1.is_finite()) {
            return Err(Error::Invalid(format!(
                "Unigram: piece {p:?} has score {s}"
            )));
        }
        let min_score = vocab.iter().map(|v| v.1).fold(f64::INFINITY, f64::min);
        let ids: Vec<(&str, u32)> = vocab
            .iter()
            .enumerate()
            .map(|(id, v)| (v.0, id as u32))
            .collect();
        let vocab_ids = Vocab::new("Unigram", &ids)?;
        let mut byte_ids = Box::new([NO_VALUE; 256]);
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            *slot = vocab_ids
                .token_to_id(&format!("<0x{b:02X}>"))
                .unwrap_or(NO_VALUE);
        }
        Ok(Self {
            vocab: vocab_ids,
            scores: vocab.iter().map(|v| v.1).collect(),
            unk_id: unk_id.map(|u| u as u32),
            unk_score: min_score - UNK_PENALTY,
            byte_ids: byte_fallback.then_some(byte_ids),
            byte_fallback,
            whole: (0..vocab.len()).map(|_| AtomicU8::new(UNKNOWN)).collect(),
        })
    }

    pub(crate) fn vocab(&self) -> &Vocab {
        &self.vocab
    }

    /// Bytes held beyond the vocabulary: scores and the single-piece memo.
    pub(crate) fn extra_memory_bytes(&self) -> usize {
        self.scores.len() * 8 + self.whole.len()
    }

    /// One step of a walk: from `state` on `byte` (none past the word).
    #[inline(always)]
    fn step(&self, state: State, byte: Option<&u8>) -> Option<State> {
        byte.and_then(|&b| self.vocab.trie.next(state, b))
    }

    /// The piece ending at `state`, if any; asks for its score's cache
    /// line right away (it is read once the walks are done).
    #[inline(always)]
    fn piece_at(&self, state: State) -> Option<u32> {
        let id = self.vocab.trie.value(state);
        if id == NO_VALUE {
            return None;
        }
        prefetch(&self.scores[id as usize]);
        Some(id)
    }

    /// Tokenizes the non-empty `words` in order; calls `emit(word, id,
    /// start, end)` for each token, with byte offsets into its word.
    ///
    /// The walk from each word's first byte is done for up to [`LANES`]
    /// words at once (independent walks overlap their memory loads): if a
    /// whole word is one piece known to be its own best segmentation, that
    /// is the answer; otherwise that walk's pieces start the word's
    /// Viterbi pass.
    pub(crate) fn tokenize_words<'w>(
        &self,
        words: impl Iterator<Item = &'w str>,
        sc: &mut Scratch,
        mut emit: impl FnMut(usize, u32, u32, u32),
    ) -> Result<()> {
        let stride = self.vocab.trie.max_key_len() + 1;
        sc.found.resize(stride * LANES, (0, 0));
        sc.first.resize(stride * LANES, (0, 0));
        let mut words = words.enumerate().peekable();
        let mut group: [(usize, &[u8]); LANES] = [(0, &[]); LANES];
        while words.peek().is_some() {
            let mut k = 0;
            while k < LANES {
                let Some((i, w)) = words.next() else { break };
                group[k] = (i, w.as_bytes());
                k += 1;
            }
            // Active walks: (lane, state, position), compacted as they end;
            // `piece[lane]` is the id of the whole word when it is a piece.
            let mut walks = [(0usize, Trie::ROOT, 0usize); LANES];
            for (lane, walk) in walks[..k].iter_mut().enumerate() {
                walk.0 = lane;
            }
            let mut active = k;
            let mut count = [0usize; LANES];
            let mut piece = [None; LANES];
            while active > 0 {
                let mut i = 0;
                while i < active {
                    let (lane, state, p) = walks[i];
                    let bytes = group[lane].1;
                    let next = self.step(state, bytes.get(p));
                    let Some(t) = next else {
                        if p == bytes.len() {
                            piece[lane] =
                                Some(self.vocab.trie.value(state)).filter(|&id| id != NO_VALUE);
                        }
                        active -= 1;
                        walks[i] = walks[active];
                        continue;
                    };
                    walks[i] = (lane, t, p + 1);
                    if let Some(id) = self.piece_at(t) {
                        sc.first[lane * stride + count[lane]] = (p as u32 + 1, id);
                        count[lane] += 1;
                    }
                    i += 1;
                }
            }
            for lane in 0..k {
                let (w, bytes) = group[lane];
                let first = lane * stride..lane * stride + count[lane];
                self.tokenize(bytes, piece[lane], first, sc, |id, s, e| emit(w, id, s, e))?;
            }
        }
        Ok(())
    }

    /// Tokenizes one word. `piece` is the id of the whole word when it is
    /// one piece; `sc.first[first]` holds the pieces of the walk from its
    /// first byte.
    fn tokenize(
        &self,
        bytes: &[u8],
        piece: Option<u32>,
        first: std::ops::Range<usize>,
        sc: &mut Scratch,
        mut emit: impl FnMut(u32, u32, u32),
    ) -> Result<()> {
        let n = bytes.len();
        let known = piece.map(|id| self.whole[id as usize].load(Ordering::Relaxed));
        if let (Some(id), Some(WHOLE)) = (piece, known) {
            emit(id, 0, n as u32);
            return Ok(());
        }
        let first_walk = first.len();
        sc.found[..first_walk].copy_from_slice(&sc.first[first]);
        sc.best.clear();
        sc.best.resize(
            n + 1,
            Best {
                score: f64::NEG_INFINITY,
                start: UNREACHED,
                id: 0,
            },
        );
        sc.best[0].score = 0.0;
        self.forward(bytes, first_walk, sc)?;
        let best = &sc.best[..];

        // Walk the best path back, fusing runs of unknown tokens.
        sc.rev.clear();
        let mut end = n;
        let mut unk_end = None;
        while end > 0 {
            let node = best[end];
            let start = node.start as usize;
            let id = node.id;
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
                self.emit_unknown(&bytes[s as usize..e as usize], s, e, &mut emit)?;
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
    /// The walk from position 0 is already done: its `first_walk` pieces
    /// are at the start of `sc.found` (lane 0).
    fn forward(&self, bytes: &[u8], first_walk: usize, sc: &mut Scratch) -> Result<()> {
        let n = bytes.len();
        let stride = self.vocab.trie.max_key_len() + 1;
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
            // Active walks: (lane, state, position), compacted as they end.
            let mut walks = [(0usize, Trie::ROOT, 0usize); LANES];
            let mut active = 0;
            let mut count = [0usize; LANES];
            for (lane, &start) in starts[..k].iter().enumerate() {
                if start == 0 {
                    count[0] = first_walk;
                } else {
                    walks[active] = (lane, Trie::ROOT, start);
                    active += 1;
                }
            }
            while active > 0 {
                let mut i = 0;
                while i < active {
                    let (lane, state, p) = walks[i];
                    let next = self.step(state, bytes.get(p));
                    let Some(t) = next else {
                        active -= 1;
                        walks[i] = walks[active];
                        continue;
                    };
                    walks[i] = (lane, t, p + 1);
                    if let Some(id) = self.piece_at(t) {
                        found[lane * stride + count[lane]] = (p as u32 + 1, id);
                        count[lane] += 1;
                    }
                    i += 1;
                }
            }
            for lane in 0..k {
                let start = starts[lane];
                let char_len = utf8_len(bytes[start]);
                let till_here = best[start].score;
                let mut has_single = false;
                for &(end, id) in &found[lane * stride..lane * stride + count[lane]] {
                    let candidate = self.scores[id as usize] + till_here;
                    let node = &mut best[end as usize];
                    // Strictly better only: on ties the earliest start wins
                    // (unreached positions score -inf, below any path).
                    if candidate > node.score {
                        *node = Best {
                            score: candidate,
                            start: start as u32,
                            id,
                        };
                    }
                    has_single |= end as usize - start == char_len;
                }
                if !has_single {
                    self.unk_id.ok_or_else(missing_unk)?;
                    let candidate = self.unk_score + till_here;
                    let node = &mut best[(start + char_len).min(n)];
                    if candidate > node.score {
                        *node = Best {
                            score: candidate,
                            start: start as u32,
                            id: self.unk_id.unwrap_or(NO_VALUE),
                        };
                    }
                }
            }
        }
        Ok(())
    }

    /// A fused unknown run: its own id if the vocabulary has it, else bytes
    /// (with byte fallback, when every byte piece exists), else unk.
    fn emit_unknown(
        &self,
        text: &[u8],
        s: u32,
        e: u32,
        emit: &mut impl FnMut(u32, u32, u32),
    ) -> Result<()> {
        if let Some(id) = self.vocab.trie.get(text) {
            emit(id, s, e);
            return Ok(());
        }
        if self.byte_fallback {
            if let Some(ids) = &self.byte_ids {
                if text.iter().all(|&b| ids[b as usize] != NO_VALUE) {
                    for &b in text {
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
    Error::Encode(
        "Unigram: a character is not in the vocabulary and the model has no unk_id".into(),
    )
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

/// Asks for the cache line holding `x` without waiting for it: the walks
/// find pieces long before their scores are needed.
#[inline(always)]
fn prefetch<T>(x: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint; it never faults or changes memory.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
            (x as *const T).cast(),
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}
