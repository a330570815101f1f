//! A model's vocabulary: a trie from piece to id, and the pieces by id.

use crate::trie::{Trie, MAX_VALUE};
use crate::{Error, Result};

#[derive(Debug)]
pub(crate) struct Vocab {
    /// Piece bytes → id.
    pub trie: Trie,
    pieces: Pieces,
    size: usize,
}

impl Vocab {
    /// Builds from `(piece, id)` pairs (`size` of them). For a piece given
    /// twice, the later id wins, as in a map.
    pub(crate) fn new(model: &str, entries: &[(&str, u32)]) -> Result<Self> {
        if let Some((p, id)) = entries.iter().find(|v| v.1 > MAX_VALUE) {
            return Err(Error::Invalid(format!(
                "{model}: id {id} of {p:?} is too large"
            )));
        }
        Ok(Self {
            trie: Trie::build(entries.iter().map(|&(p, id)| (p.as_bytes(), id))),
            pieces: Pieces::new(entries.iter().map(|&(p, id)| (id, p))),
            size: entries.len(),
        })
    }

    /// How many pieces.
    pub(crate) fn len(&self) -> usize {
        self.size
    }

    pub(crate) fn token_to_id(&self, token: &str) -> Option<u32> {
        self.trie.get(token.as_bytes())
    }

    pub(crate) fn id_to_token(&self, id: u32) -> Option<&str> {
        self.pieces.get(id)
    }

    /// Bytes of memory held.
    pub(crate) fn memory_bytes(&self) -> usize {
        self.trie.memory_bytes() + self.pieces.memory_bytes()
    }
}

/// The strings of a vocabulary in one buffer, indexed by id.
#[derive(Debug, Default, Clone)]
struct Pieces {
    text: String,
    /// Byte range of each id's string in `text`; `None` for unused ids.
    spans: Vec<Option<(u32, u32)>>,
}

impl Pieces {
    /// Builds from `(id, string)` pairs; a later pair for the same id wins.
    fn new<'a>(entries: impl IntoIterator<Item = (u32, &'a str)>) -> Self {
        let mut p = Self::default();
        for (id, s) in entries {
            let id = id as usize;
            if p.spans.len() <= id {
                p.spans.resize(id + 1, None);
            }
            let start = p.text.len() as u32;
            p.text.push_str(s);
            p.spans[id] = Some((start, p.text.len() as u32));
        }
        p.text.shrink_to_fit();
        p
    }

    fn get(&self, id: u32) -> Option<&str> {
        let (s, e) = (*self.spans.get(id as usize)?)?;
        Some(&self.text[s as usize..e as usize])
    }

    fn memory_bytes(&self) -> usize {
        self.text.capacity() + self.spans.capacity() * std::mem::size_of::<Option<(u32, u32)>>()
    }
}
