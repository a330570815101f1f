//! Reading `tokenizer.json` into the in-house pipeline.
//!
//! Every component is parsed strictly: an unknown component type or an
//! unknown field means the file uses something this code does not
//! implement, and [`parse`] says so (the caller then uses the Hugging Face
//! backend). Nothing is silently approximated. The schema is `load/schema.rs`;
//! this file builds the pipeline from it.

mod schema;

use std::collections::{BTreeMap, HashMap};

use base64::Engine;
use serde::Deserialize;

use crate::added::{AddedToken, AddedVocab};
use crate::native::{Model, Native};
use crate::normalized::Work;
use crate::normalizers::{Bert, Normalizer, Precompiled, Replace, UnicodeForm};
use crate::postprocess::{Piece, Template};
use crate::pretokenizers::{PreTokenizer, PrependScheme, Stage};
use crate::unigram::Unigram;
use crate::wordpiece::WordPiece;

use self::schema::{
    AddedTokenJson, File, ModelJson, NormalizerJson, PatternJson, PieceJson, PostJson,
    PreTokenizerJson, PrependSchemeJson, SequenceId, VocabJson,
};

/// Why a file is not handled in-house.
pub(crate) type Unsupported = String;

/// Parses `json` into the in-house pipeline, or says why it cannot (an
/// unsupported component, or a file Hugging Face must judge).
pub(crate) fn parse(json: &[u8]) -> std::result::Result<Native, Unsupported> {
    let file: File = serde_json::from_slice(json).map_err(|e| unsupported(json, e))?;
    if let Some(v) = &file.version {
        if v != "1.0" {
            return Err(format!("tokenizer.json version {v}"));
        }
    }
    let model = build_model(file.model)?;
    let normalizer = file.normalizer.map(build_normalizer).transpose()?;
    let mut stages = Vec::new();
    if let Some(p) = file.pre_tokenizer {
        collect_stages(p, &mut stages)?;
    }
    let pre_tokenizer = PreTokenizer::new(stages);
    let template = match file.post_processor {
        None => Template::none(),
        Some(p) => build_template(p)?,
    };
    let special = file
        .added_tokens
        .iter()
        .filter(|t| t.special)
        .map(|t| t.content.clone())
        .collect();
    let added = build_added(file.added_tokens, &model, normalizer.as_ref())?;
    Ok(Native {
        normalizer,
        pre_tokenizer,
        model,
        added,
        template,
        decoder: file.decoder,
        special,
    })
}

/// Why a file did not parse as an in-house tokenizer: its model type when
/// that is the reason, else the parse error (an unknown component, field
/// or value).
fn unsupported(json: &[u8], err: serde_json::Error) -> Unsupported {
    #[derive(Deserialize)]
    struct Peek {
        model: PeekModel,
    }
    #[derive(Deserialize)]
    struct PeekModel {
        #[serde(rename = "type")]
        kind: Option<String>,
    }
    match serde_json::from_slice::<Peek>(json) {
        Ok(Peek {
            model: PeekModel { kind: Some(kind) },
        }) if kind != "Unigram" && kind != "WordPiece" => {
            format!("model type {kind}")
        }
        _ => err.to_string(),
    }
}

fn build_model(m: ModelJson) -> std::result::Result<Model, Unsupported> {
    match (m.kind.as_deref(), m.vocab) {
        (Some("Unigram"), VocabJson::Scored(vocab)) => {
            if m.unk_token.is_some()
                || m.continuing_subword_prefix.is_some()
                || m.max_input_chars_per_word.is_some()
            {
                return Err("Unigram model with WordPiece fields".into());
            }
            let vocab: Vec<(&str, f64)> = vocab.iter().map(|(p, s)| (p.as_ref(), *s)).collect();
            Unigram::new(&vocab, m.unk_id, m.byte_fallback.unwrap_or(false))
                .map(Model::Unigram)
                .map_err(|e| e.to_string())
        }
        (Some("WordPiece"), VocabJson::Ids(vocab)) => {
            if m.unk_id.is_some() || m.byte_fallback.is_some() {
                return Err("WordPiece model with Unigram fields".into());
            }
            let (Some(unk), Some(prefix), Some(max_chars)) = (
                m.unk_token,
                m.continuing_subword_prefix,
                m.max_input_chars_per_word,
            ) else {
                return Err("WordPiece model with missing fields".into());
            };
            let vocab: Vec<(&str, u32)> = vocab.iter().map(|(p, id)| (p.as_ref(), *id)).collect();
            WordPiece::new(&vocab, unk, &prefix, max_chars)
                .map(Model::WordPiece)
                .map_err(|e| e.to_string())
        }
        (kind, _) => Err(format!("model type {}", kind.unwrap_or("(none)"))),
    }
}

fn build_normalizer(n: NormalizerJson) -> std::result::Result<Normalizer, Unsupported> {
    Ok(match n {
        NormalizerJson::BertNormalizer {
            clean_text,
            handle_chinese_chars,
            strip_accents,
            lowercase,
        } => Normalizer::Bert(Box::new(Bert::new(
            clean_text,
            handle_chinese_chars,
            strip_accents,
            lowercase,
        ))),
        NormalizerJson::Precompiled {
            precompiled_charsmap,
        } => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(precompiled_charsmap)
                .map_err(|e| format!("precompiled_charsmap: {e}"))?;
            Normalizer::Precompiled(Box::new(
                Precompiled::from_bytes(&bytes).map_err(|e| e.to_string())?,
            ))
        }
        NormalizerJson::NFC {} => Normalizer::Unicode(UnicodeForm::Nfc),
        NormalizerJson::NFD {} => Normalizer::Unicode(UnicodeForm::Nfd),
        NormalizerJson::NFKC {} => Normalizer::Unicode(UnicodeForm::Nfkc),
        NormalizerJson::NFKD {} => Normalizer::Unicode(UnicodeForm::Nfkd),
        NormalizerJson::Lowercase {} => Normalizer::Lowercase,
        NormalizerJson::Replace { pattern, content } => {
            let (p, literal) = match &pattern {
                PatternJson::String(s) => (s.as_str(), true),
                PatternJson::Regex(r) => (r.as_str(), false),
            };
            Normalizer::Replace(Replace::new(p, literal, content).map_err(|e| e.to_string())?)
        }
        NormalizerJson::Sequence { normalizers } => Normalizer::Sequence(
            normalizers
                .into_iter()
                .map(build_normalizer)
                .collect::<std::result::Result<_, _>>()?,
        ),
    })
}

/// Appends the stages of `p` (sequences flattened) to `out`.
fn collect_stages(
    p: PreTokenizerJson,
    out: &mut Vec<Stage>,
) -> std::result::Result<(), Unsupported> {
    match p {
        PreTokenizerJson::WhitespaceSplit {} => out.push(Stage::WhitespaceSplit),
        PreTokenizerJson::BertPreTokenizer {} => out.push(Stage::Bert),
        PreTokenizerJson::Metaspace {
            replacement,
            add_prefix_space,
            prepend_scheme,
            split,
            ..
        } => {
            let mut scheme = prepend_scheme.unwrap_or(PrependSchemeJson::Always);
            if add_prefix_space == Some(false) {
                if !matches!(scheme, PrependSchemeJson::Never) {
                    return Err("Metaspace: add_prefix_space does not match prepend_scheme".into());
                }
                scheme = PrependSchemeJson::Never;
            }
            out.push(Stage::Metaspace {
                replacement,
                prepend: match scheme {
                    PrependSchemeJson::Always => PrependScheme::Always,
                    PrependSchemeJson::First => PrependScheme::First,
                    PrependSchemeJson::Never => PrependScheme::Never,
                },
                split: split.unwrap_or(true),
            });
        }
        PreTokenizerJson::Sequence { pretokenizers } => {
            for p in pretokenizers {
                collect_stages(p, out)?;
            }
        }
    }
    Ok(())
}

fn build_template(p: PostJson) -> std::result::Result<Template, Unsupported> {
    match p {
        PostJson::BertProcessing { sep, cls } => Ok(Template {
            single: vec![
                Piece::Special(vec![cls.1]),
                Piece::A,
                Piece::Special(vec![sep.1]),
            ],
            pair: vec![
                Piece::Special(vec![cls.1]),
                Piece::A,
                Piece::Special(vec![sep.1]),
                Piece::B,
                Piece::Special(vec![sep.1]),
            ],
        }),
        PostJson::TemplateProcessing {
            single,
            pair,
            special_tokens,
        } => {
            let convert = |pieces: Vec<PieceJson>, allow_b: bool| {
                pieces
                    .into_iter()
                    .map(|p| match p {
                        PieceJson::Sequence {
                            id: SequenceId::A, ..
                        } => Ok(Piece::A),
                        PieceJson::Sequence {
                            id: SequenceId::B, ..
                        } if allow_b => Ok(Piece::B),
                        PieceJson::Sequence { .. } => {
                            Err("template uses $B for a single sequence".to_string())
                        }
                        PieceJson::SpecialToken { id, .. } => special_tokens
                            .get(&id)
                            .map(|t| Piece::Special(t.ids.clone()))
                            .ok_or_else(|| format!("template special token {id} is not defined")),
                    })
                    .collect::<std::result::Result<Vec<_>, _>>()
            };
            Ok(Template {
                single: convert(single, false)?,
                pair: convert(pair, true)?,
            })
        }
    }
}

/// Resolves ids as Hugging Face's `add_tokens` does at load time: the id of
/// a content already known (added or in the model) wins over the file's id;
/// new contents are numbered from the model's vocabulary size.
fn build_added(
    tokens: Vec<AddedTokenJson>,
    model: &Model,
    normalizer: Option<&Normalizer>,
) -> std::result::Result<AddedVocab, Unsupported> {
    let mut next_id = model.vocab().len() as u32;
    let mut by_content: HashMap<String, u32> = HashMap::new();
    let mut by_id: BTreeMap<u32, AddedToken> = BTreeMap::new();
    for t in tokens {
        if t.content.is_empty() {
            continue;
        }
        let token = AddedToken {
            content: t.content,
            single_word: t.single_word,
            lstrip: t.lstrip,
            rstrip: t.rstrip,
            normalized: t.normalized,
            special: t.special,
        };
        if let Some(id) = by_content.get(&token.content) {
            if by_id.get(id) == Some(&token) {
                continue;
            }
        }
        let id = match by_content
            .get(&token.content)
            .copied()
            .or_else(|| model.vocab().token_to_id(&token.content))
        {
            Some(id) => id,
            None => {
                next_id += 1;
                next_id - 1
            }
        };
        by_content.insert(token.content.clone(), id);
        by_id.insert(id, token);
    }
    let mut work = Work::default();
    let entries: Vec<_> = by_id
        .into_iter()
        .map(|(id, token)| {
            let pattern = match normalizer {
                Some(n) if token.normalized => {
                    work.load(&token.content, 0);
                    n.normalize(&mut work);
                    work.cur.text.clone()
                }
                _ => token.content.clone(),
            };
            (id, token, pattern)
        })
        .collect();
    if let Some((_, t, _)) = entries.iter().find(|e| e.2.is_empty()) {
        return Err(format!("added token {:?} normalizes to nothing", t.content));
    }
    Ok(AddedVocab::new(entries))
}
