//! Ivy's tokenizer: one loader and one interface over a Hugging Face
//! `tokenizer.json`.
//!
//! Truncation is decided per call (the request says how long a sequence may
//! be and from which side to cut), never by the settings stored in the file:
//! the `truncation` and `padding` sections of `tokenizer.json` are ignored.

use std::path::Path;

mod hf;

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

/// A loaded tokenizer. Cheap to share across threads (`Sync`).
pub struct Tokenizer {
    backend: hf::HfTokenizer,
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

    /// Parses the contents of a `tokenizer.json`.
    pub fn from_bytes(json: &[u8]) -> Result<Self> {
        Ok(Self {
            backend: hf::HfTokenizer::from_bytes(json)?,
        })
    }

    /// Tokenizes one text.
    pub fn encode(&self, text: &str, opts: &EncodeOptions) -> Result<Encoding> {
        let mut out = Encoding::default();
        self.encode_into(text, opts, &mut out)?;
        Ok(out)
    }

    /// Tokenizes one text into a reused `Encoding`.
    pub fn encode_into(&self, text: &str, opts: &EncodeOptions, out: &mut Encoding) -> Result<()> {
        out.clear();
        self.backend.encode(text, None, opts, out)
    }

    /// Tokenizes a (query, document) pair for cross-encoders. When too long,
    /// the longer side loses tokens first (Hugging Face's `longest_first`).
    pub fn encode_pair(&self, a: &str, b: &str, opts: &EncodeOptions) -> Result<Encoding> {
        let mut out = Encoding::default();
        self.backend.encode(a, Some(b), opts, &mut out)?;
        Ok(out)
    }

    /// The string of a token id, if the id is in the vocabulary.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.backend.id_to_token(id)
    }

    /// Vocabulary size, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.backend.vocab_size()
    }

    /// How many special tokens `encode` adds to a single text or a pair.
    pub fn num_special_tokens(&self, pair: bool) -> usize {
        self.backend.num_special_tokens(pair)
    }
}
