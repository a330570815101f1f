//! What the model is and produces: the output kinds as the engine names
//! them, and the engine's description of its model (`engine.info`).

use proto::tulip::v1::OutputKind;

/// The output kinds, as the engine names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Dense,
    /// Per-token lexical weights (BGE-M3).
    Sparse,
    MultiVector,
    Score,
    /// One logit per label.
    Classify,
    /// One weight per vocabulary entry (SPLADE); on the wire it is SPARSE.
    SparseVocab,
    /// The encoder's last hidden state per token.
    TokenStates,
    /// One dense row per image (an image model's vision tower); on the wire
    /// it is DENSE. Never batched with text: a step holds one kind.
    Image,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Dense => "dense",
            Self::Sparse => "sparse",
            Self::MultiVector => "multi_vector",
            Self::Score => "score",
            Self::Classify => "classify",
            Self::SparseVocab => "sparse_vocab",
            Self::TokenStates => "token_states",
            Self::Image => "image",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        [
            Self::Dense,
            Self::Sparse,
            Self::MultiVector,
            Self::Score,
            Self::Classify,
            Self::SparseVocab,
            Self::TokenStates,
        ]
        .into_iter()
        .find(|k| k.as_str() == name)
    }

    /// The wire enum; unspecified means dense. `None` for unknown values.
    /// SPARSE is per-token weights here; `ModelInfo::engine_kind` picks
    /// the vocabulary kind for a SPLADE model.
    pub fn from_proto(value: i32) -> Option<Self> {
        match OutputKind::try_from(value).ok()? {
            OutputKind::Unspecified | OutputKind::Dense => Some(Self::Dense),
            OutputKind::Sparse => Some(Self::Sparse),
            OutputKind::MultiVector => Some(Self::MultiVector),
            OutputKind::Score => Some(Self::Score),
            OutputKind::Classify => Some(Self::Classify),
            OutputKind::TokenStates => Some(Self::TokenStates),
        }
    }

    pub fn to_proto(self) -> OutputKind {
        match self {
            Self::Dense | Self::Image => OutputKind::Dense,
            Self::Sparse | Self::SparseVocab => OutputKind::Sparse,
            Self::MultiVector => OutputKind::MultiVector,
            Self::Score => OutputKind::Score,
            Self::Classify => OutputKind::Classify,
            Self::TokenStates => OutputKind::TokenStates,
        }
    }
}

/// What the engine says about its model (`engine.info`).
#[derive(Debug, Clone)]
pub struct ModelInfo {
    pub model_id: String,
    pub architecture: String,
    pub dimension: u32,
    pub max_input_length: u32,
    pub vocab_size: u32,
    pub pooling: String,
    pub normalize_default: bool,
    pub kinds: Vec<Kind>,
    pub multi_vector_dimension: u32,
    pub dtype: String,
    pub device: String,
    /// The tokenizer.json bytes (empty when the model has none) and their
    /// sha256, read once at start-up.
    pub tokenizer_json: bytes::Bytes,
    pub tokenizer_sha256: String,
    pub prompts: std::collections::HashMap<String, String>,
    pub default_prompt_name: String,
    /// A classifier's label names (empty otherwise).
    pub labels: Vec<String>,
    /// Causal-LM rerankers: the text a (query, document) pair becomes.
    pub pair_template: String,
    /// Width of token-state rows; 0 when the model does not produce them.
    pub token_states_dimension: u32,
    /// The pooling a host may apply over token-state spans ("" when the
    /// dense head does more than pool).
    pub span_pooling: String,
    pub images: ImageInfo,
}

/// An image model's inputs (all zero for a text-only model).
#[derive(Debug, Clone, Default)]
pub struct ImageInfo {
    pub height: u32,
    pub width: u32,
    /// What one image counts against the token budget (its patches and
    /// class token): the vision tower's sequence length.
    pub tokens: u32,
    /// The model's preprocessor_config.json, as served to gateways.
    pub preprocessor_config: bytes::Bytes,
    /// Texts padded to this many tokens with `pad_token_id` (SigLIP); 0: none.
    pub text_pad_to: u32,
    pub pad_token_id: u32,
}

impl ImageInfo {
    /// float32 values in one image's pixels.
    pub fn values(&self) -> usize {
        3 * self.height as usize * self.width as usize
    }
}

impl ModelInfo {
    /// The engine's kind for a kind asked on the wire: SPARSE is a SPLADE
    /// model's vocabulary weights when that is what it produces.
    pub fn engine_kind(&self, asked: Kind) -> Kind {
        if asked == Kind::Sparse
            && !self.kinds.contains(&Kind::Sparse)
            && self.kinds.contains(&Kind::SparseVocab)
        {
            Kind::SparseVocab
        } else {
            asked
        }
    }

    /// Whether the model produces `kind` (token states are not in `kinds`:
    /// every embedding model has them).
    pub fn produces(&self, kind: Kind) -> bool {
        self.kinds.contains(&kind) || (kind == Kind::TokenStates && self.token_states_dimension > 0)
    }

    /// The kinds as the wire names them (SPLADE's as SPARSE), once each.
    pub fn wire_kinds(&self) -> Vec<OutputKind> {
        let mut out: Vec<OutputKind> = Vec::new();
        for k in &self.kinds {
            if !out.contains(&k.to_proto()) {
                out.push(k.to_proto());
            }
        }
        out
    }
}

/// A LoRA adapter loaded in the engine (`adapters.rs` keeps the loaded set).
#[derive(Debug)]
pub struct Adapter {
    pub name: std::sync::Arc<str>,
    pub path: String,
    pub rank: u32,
}

impl Adapter {
    pub fn proto(&self) -> proto::tulip::v1::Adapter {
        proto::tulip::v1::Adapter {
            name: self.name.to_string(),
            path: self.path.clone(),
            rank: self.rank,
        }
    }
}
