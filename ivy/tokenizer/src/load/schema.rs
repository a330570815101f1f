//! The serde schema of `tokenizer.json`: every component `load.rs` builds
//! from, parsed strictly (unknown fields and types are errors, so nothing
//! the file uses is skipped).

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;

use serde::de::{Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

#[derive(Deserialize)]
pub(super) struct File<'a> {
    #[serde(default, borrow)]
    pub(super) version: Option<Cow<'a, str>>,
    #[serde(default)]
    pub(super) added_tokens: Vec<AddedTokenJson>,
    #[serde(default)]
    pub(super) normalizer: Option<NormalizerJson>,
    #[serde(default)]
    pub(super) pre_tokenizer: Option<PreTokenizerJson>,
    #[serde(default)]
    pub(super) post_processor: Option<PostJson>,
    #[serde(borrow)]
    pub(super) model: ModelJson<'a>,
    /// Only `decode` uses it: Hugging Face's own decoder components, which
    /// are small pure functions over token strings (no reason to re-write
    /// them, and using them keeps `decode` identical by construction).
    #[serde(default)]
    pub(super) decoder: Option<tokenizers::decoders::DecoderWrapper>,
    // `truncation` and `padding` are per call; Hugging Face ignores any
    // other top-level key too.
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AddedTokenJson {
    #[allow(dead_code)]
    pub(super) id: u32,
    pub(super) content: String,
    pub(super) single_word: bool,
    pub(super) lstrip: bool,
    pub(super) rstrip: bool,
    pub(super) normalized: bool,
    pub(super) special: bool,
}

// Variant names are the JSON type tags.
#[allow(clippy::upper_case_acronyms)]
#[derive(Deserialize)]
#[serde(tag = "type", deny_unknown_fields)]
pub(super) enum NormalizerJson {
    BertNormalizer {
        clean_text: bool,
        handle_chinese_chars: bool,
        strip_accents: Option<bool>,
        lowercase: bool,
    },
    Precompiled {
        precompiled_charsmap: String,
    },
    NFC {},
    NFD {},
    NFKC {},
    NFKD {},
    Lowercase {},
    Replace {
        pattern: PatternJson,
        content: String,
    },
    Sequence {
        normalizers: Vec<NormalizerJson>,
    },
}

#[derive(Deserialize)]
pub(super) enum PatternJson {
    String(String),
    Regex(String),
}

#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "snake_case")]
pub(super) enum PrependSchemeJson {
    First,
    Never,
    Always,
}

#[derive(Deserialize)]
#[serde(tag = "type", deny_unknown_fields)]
pub(super) enum PreTokenizerJson {
    WhitespaceSplit {},
    BertPreTokenizer {},
    Metaspace {
        replacement: char,
        #[serde(default)]
        add_prefix_space: Option<bool>,
        #[serde(default)]
        prepend_scheme: Option<PrependSchemeJson>,
        #[serde(default)]
        split: Option<bool>,
        #[serde(default)]
        #[allow(dead_code)]
        str_rep: Option<String>,
    },
    Sequence {
        pretokenizers: Vec<PreTokenizerJson>,
    },
}

#[derive(Deserialize)]
#[serde(tag = "type", deny_unknown_fields)]
pub(super) enum PostJson {
    TemplateProcessing {
        single: Vec<PieceJson>,
        pair: Vec<PieceJson>,
        special_tokens: HashMap<String, SpecialTokenJson>,
    },
    BertProcessing {
        sep: (String, u32),
        cls: (String, u32),
    },
}

/// A template part. Type ids are not part of Ivy's output.
#[derive(Deserialize)]
pub(super) enum PieceJson {
    Sequence {
        id: SequenceId,
        #[serde(rename = "type_id")]
        _type_id: u32,
    },
    SpecialToken {
        id: String,
        #[serde(rename = "type_id")]
        _type_id: u32,
    },
}

#[derive(Deserialize, PartialEq, Eq)]
pub(super) enum SequenceId {
    A,
    B,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SpecialTokenJson {
    #[allow(dead_code)]
    pub(super) id: String,
    pub(super) ids: Vec<u32>,
    #[allow(dead_code)]
    pub(super) tokens: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ModelJson<'a> {
    #[serde(rename = "type")]
    pub(super) kind: Option<String>,
    #[serde(borrow)]
    pub(super) vocab: VocabJson<'a>,
    // Unigram
    #[serde(default)]
    pub(super) unk_id: Option<usize>,
    #[serde(default)]
    pub(super) byte_fallback: Option<bool>,
    // WordPiece
    #[serde(default)]
    pub(super) unk_token: Option<String>,
    #[serde(default)]
    pub(super) continuing_subword_prefix: Option<String>,
    #[serde(default)]
    pub(super) max_input_chars_per_word: Option<usize>,
}

/// A Unigram vocabulary (list of `[piece, score]`) or a WordPiece one
/// (map of piece to id, in file order).
pub(super) enum VocabJson<'a> {
    Scored(Vec<(Cow<'a, str>, f64)>),
    Ids(Vec<(Cow<'a, str>, u32)>),
}

impl<'de: 'a, 'a> Deserialize<'de> for VocabJson<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = VocabJson<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of [piece, score] or a map of piece to id")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0));
                while let Some((p, s)) = seq.next_element::<(Cow<'a, str>, f64)>()? {
                    out.push((p, s));
                }
                Ok(VocabJson::Scored(out))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::with_capacity(map.size_hint().unwrap_or(0));
                while let Some((p, id)) = map.next_entry::<Cow<'a, str>, u32>()? {
                    out.push((p, id));
                }
                Ok(VocabJson::Ids(out))
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}
