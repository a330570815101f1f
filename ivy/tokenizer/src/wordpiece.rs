//! The WordPiece model (BERT): greedy longest-match-first over the
//! vocabulary, continuation pieces carrying a prefix (`##`); a word that
//! cannot be covered, or is too long, becomes one unknown token.

use crate::trie::{State, Trie};
use crate::vocab::Vocab;
use crate::{Error, Result};

#[derive(Debug)]
pub(crate) struct WordPiece {
    vocab: Vocab,
    /// The state after the continuation prefix: continuation pieces are
    /// looked up from here. `None` when no piece starts with the prefix.
    continuation: Option<State>,
    unk_token: String,
    unk_id: Option<u32>,
    max_input_chars_per_word: usize,
}

/// Reusable buffer for one word's tokens `(id, start, end)`.
pub(crate) type Scratch = Vec<(u32, u32, u32)>;

impl WordPiece {
    pub(crate) fn new(
        vocab: &[(&str, u32)],
        unk_token: String,
        continuing_subword_prefix: &str,
        max_input_chars_per_word: usize,
    ) -> Result<Self> {
        let vocab = Vocab::new("WordPiece", vocab)?;
        let continuation = vocab
            .trie
            .walk(Trie::ROOT, continuing_subword_prefix.as_bytes());
        let unk_id = vocab.token_to_id(&unk_token);
        Ok(Self {
            vocab,
            continuation,
            unk_token,
            unk_id,
            max_input_chars_per_word,
        })
    }

    pub(crate) fn vocab(&self) -> &Vocab {
        &self.vocab
    }

    fn unk(&self) -> Result<u32> {
        self.unk_id.ok_or_else(|| {
            Error::Encode(format!(
                "WordPiece: unknown token {:?} is not in the vocabulary",
                self.unk_token
            ))
        })
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
        // Only count chars when the byte length could exceed the limit.
        if n > self.max_input_chars_per_word && word.chars().count() > self.max_input_chars_per_word
        {
            emit(self.unk()?, 0, n as u32);
            return Ok(());
        }
        sc.clear();
        let mut start = 0;
        while start < n {
            let from = if start == 0 {
                Some(Trie::ROOT)
            } else {
                self.continuation
            };
            // The longest piece from `start`: remember its state, read its
            // id once.
            let mut found = None;
            if let Some(mut state) = from {
                for (i, &b) in bytes[start..].iter().enumerate() {
                    let Some(next) = self.vocab.trie.next(state, b) else {
                        break;
                    };
                    state = next;
                    if self.vocab.trie.is_key(state) {
                        found = Some((state, start + i + 1));
                    }
                }
            }
            let found = found.map(|(state, end)| (self.vocab.trie.value(state), end));
            let Some((id, end)) = found else {
                emit(self.unk()?, 0, n as u32);
                return Ok(());
            };
            sc.push((id, start as u32, end as u32));
            start = end;
        }
        for &(id, s, e) in sc.iter() {
            emit(id, s, e);
        }
        Ok(())
    }
}
