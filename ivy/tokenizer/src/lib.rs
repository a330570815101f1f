//! Ivy's tokenizer: one loader and one interface over a Hugging Face
//! `tokenizer.json`.
//!
//! Unigram (XLM-RoBERTa, SentencePiece exports) and WordPiece (BERT) files
//! run on the in-house pipeline, token-for-token identical to Hugging Face
//! `tokenizers` and allocation-free per call once warm. Any other file (for
//! example byte-level BPE) runs on the `tokenizers` crate behind the same
//! interface; [`Tokenizer::backend`] says which.
//!
//! Truncation is decided per call (the request says how long a sequence may
//! be and from which side to cut), never by the settings stored in the file:
//! the `truncation` and `padding` sections of `tokenizer.json` are ignored.

use std::path::Path;

mod added;
mod batch;
mod chars;
mod hf;
mod load;
mod native;
mod normalized;
mod normalizers;
mod postprocess;
mod pretokenizers;
mod trie;
mod unigram;
mod vocab;
mod wordpiece;

pub use batch::char_offsets;

/// Errors from loading or running a tokenizer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read tokenizer file {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("invalid tokenizer.json: {0}")]
    Invalid(String),
    #[error("tokenization failed: {0}")]
    Encode(String),
    #[error("decoding failed: {0}")]
    Decode(String),
}

pub type Result<T> = std::result::Result<T, Error>;

/// Which end of a sequence loses tokens when it is too long.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Direction {
    #[default]
    Right,
    Left,
}

/// Per-call options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncodeOptions {
    /// Add the model's special tokens (`[CLS] … [SEP]`, `<s> … </s>`).
    pub add_special_tokens: bool,
    /// Longest output, special tokens included; `None` keeps everything.
    pub max_length: Option<usize>,
    pub direction: Direction,
}

impl Default for EncodeOptions {
    fn default() -> Self {
        Self {
            add_special_tokens: true,
            max_length: None,
            direction: Direction::Right,
        }
    }
}

/// The result of one call. Reusable: `encode_into` clears and refills it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Encoding {
    pub ids: Vec<u32>,
    /// Byte offsets into the input text of each token; `(0, 0)` for added
    /// special tokens. For pairs, offsets refer to the text they came from.
    pub offsets: Vec<(u32, u32)>,
    /// Whether each token was added by the post-processor.
    pub special: Vec<bool>,
    /// Length the output would have had without truncation.
    pub untruncated_len: usize,
}

impl Encoding {
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Whether truncation removed any token.
    pub fn truncated(&self) -> bool {
        self.untruncated_len > self.ids.len()
    }

    fn clear(&mut self) {
        self.ids.clear();
        self.offsets.clear();
        self.special.clear();
        self.untruncated_len = 0;
    }
}

/// Which implementation runs a loaded tokenizer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// The in-house pipeline (`"Unigram"` or `"WordPiece"`).
    InHouse(&'static str),
    /// The Hugging Face `tokenizers` crate, with the reason the in-house
    /// pipeline does not take the file.
    HuggingFace(String),
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::InHouse(model) => write!(f, "in-house {model}"),
            Self::HuggingFace(why) => write!(f, "Hugging Face tokenizers ({why})"),
        }
    }
}

enum Inner {
    Native(Box<native::Native>),
    Hf(Box<hf::HfTokenizer>),
}

/// A loaded tokenizer. Cheap to share across threads (`Sync`).
pub struct Tokenizer {
    inner: Inner,
    backend: Backend,
}

impl Tokenizer {
    /// Loads a `tokenizer.json` file, or the one inside a model directory.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let mut path = path.as_ref().to_path_buf();
        if path.is_dir() {
            path.push("tokenizer.json");
        }
        let bytes = std::fs::read(&path).map_err(|source| Error::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_bytes(&bytes)
    }

    /// Parses the contents of a `tokenizer.json`: in-house when every
    /// component is implemented here, otherwise through Hugging Face.
    pub fn from_bytes(json: &[u8]) -> Result<Self> {
        match load::parse(json) {
            Ok(native) => Ok(Self {
                backend: Backend::InHouse(native.model_name()),
                inner: Inner::Native(Box::new(native)),
            }),
            Err(why) => Self::from_bytes_hf(json, why),
        }
    }

    /// Loads `json` on the Hugging Face backend, whatever it holds (`why`
    /// is reported by [`backend`](Self::backend)).
    pub fn from_bytes_hf(json: &[u8], why: impl Into<String>) -> Result<Self> {
        Ok(Self {
            inner: Inner::Hf(Box::new(hf::HfTokenizer::from_bytes(json)?)),
            backend: Backend::HuggingFace(why.into()),
        })
    }

    /// Which implementation runs this tokenizer.
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// Tokenizes one text.
    pub fn encode(&self, text: &str, opts: &EncodeOptions) -> Result<Encoding> {
        let mut out = Encoding::default();
        self.encode_into(text, opts, &mut out)?;
        Ok(out)
    }

    /// Tokenizes one text into a reused `Encoding`. On the in-house
    /// backend this allocates nothing once `out` and the thread's scratch
    /// buffers have grown to the input size.
    pub fn encode_into(&self, text: &str, opts: &EncodeOptions, out: &mut Encoding) -> Result<()> {
        self.encode_pair_into(text, None, opts, out)
    }

    /// Tokenizes a (query, document) pair for cross-encoders. When too long,
    /// the longer side loses tokens first: Hugging Face's `longest_first`,
    /// exactly as `tokenizers` applies it with truncation on (each side's
    /// length counted up to the word that reaches `max_length`).
    pub fn encode_pair(&self, a: &str, b: &str, opts: &EncodeOptions) -> Result<Encoding> {
        let mut out = Encoding::default();
        self.encode_pair_into(a, Some(b), opts, &mut out)?;
        Ok(out)
    }

    /// Tokenizes one text (`b: None`) or a pair into a reused `Encoding`.
    pub fn encode_pair_into(
        &self,
        a: &str,
        b: Option<&str>,
        opts: &EncodeOptions,
        out: &mut Encoding,
    ) -> Result<()> {
        out.clear();
        match &self.inner {
            Inner::Native(n) => n.encode(a, b, opts, out),
            Inner::Hf(h) => h.encode(a, b, opts, out),
        }
    }

    /// Token ids back to text, exactly as Hugging Face `tokenizers` decodes
    /// them (its `decode`): ids outside the vocabulary are dropped, special
    /// tokens too when `skip_special_tokens`.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        match &self.inner {
            Inner::Native(n) => n.decode(ids, skip_special_tokens),
            Inner::Hf(h) => h.decode(ids, skip_special_tokens),
        }
    }

    /// The string of a token id, if the id is in the vocabulary.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        match &self.inner {
            Inner::Native(n) => n.id_to_token(id).map(str::to_owned),
            Inner::Hf(h) => h.id_to_token(id),
        }
    }

    /// Vocabulary size, added tokens included (as Hugging Face counts it).
    pub fn vocab_size(&self) -> usize {
        match &self.inner {
            Inner::Native(n) => n.vocab_size(),
            Inner::Hf(h) => h.vocab_size(),
        }
    }

    /// How many special tokens `encode` adds to a single text or a pair.
    pub fn num_special_tokens(&self, pair: bool) -> usize {
        match &self.inner {
            Inner::Native(n) => n.num_special_tokens(pair),
            Inner::Hf(h) => h.num_special_tokens(pair),
        }
    }

    /// Bytes held by the in-house vocabulary structures (trie and piece
    /// strings); `None` on the Hugging Face backend.
    pub fn vocab_memory_bytes(&self) -> Option<usize> {
        match &self.inner {
            Inner::Native(n) => Some(n.vocab_memory_bytes()),
            Inner::Hf(_) => None,
        }
    }
}
