//! What the pool serves: the model's info (from the first replica that
//! answers `Info`), the tokenizer requests are tokenized with, the image
//! preparation of an image model, and the model's own prompts as
//! templates. Every replica must serve the same.

pub mod calibration;
pub mod templates;

use std::sync::{Arc, RwLock};

use ivy_imageprep::ImageProcessor;
use ivy_tokenizer::Tokenizer;
use proto::tulip::v1::{InfoResponse, OutputKind};

use self::templates::Templates;

#[derive(Default)]
pub struct ServedModel {
    model: RwLock<Option<Arc<InfoResponse>>>,
    tokenizer: RwLock<Option<Arc<Tokenizer>>>,
    /// The tokenizer came from `--tokenizer`: the replicas' is not loaded.
    tokenizer_override: bool,
    /// The model's own prompt templates.
    templates: RwLock<Option<Arc<Templates>>>,
    /// An image model's preprocessing (from its preprocessor_config.json),
    /// or why it cannot be read; `None` for a text-only model.
    images: RwLock<Option<Result<Arc<ImageProcessor>, String>>>,
    /// Its quantization ranges, per output setting.
    pub calibrations: self::calibration::Calibrations,
}

impl ServedModel {
    /// A model that tokenizes with `tokenizer` when given (the `--tokenizer`
    /// override), else with the one the first replica serves.
    pub fn with_tokenizer(tokenizer: Option<Arc<Tokenizer>>) -> Self {
        Self {
            tokenizer_override: tokenizer.is_some(),
            tokenizer: RwLock::new(tokenizer),
            ..Self::default()
        }
    }

    /// The model's prompts as templates, once a replica has answered.
    pub fn templates(&self) -> Option<Arc<Templates>> {
        self.templates
            .read()
            .expect("templates lock poisoned")
            .clone()
    }

    pub fn tokenizer(&self) -> Option<Arc<Tokenizer>> {
        self.tokenizer
            .read()
            .expect("tokenizer lock poisoned")
            .clone()
    }

    /// How images are prepared for this model: `Ok(None)` when it takes no
    /// images, `Err` saying why its preprocessor config is unusable.
    pub fn image_processor(&self) -> Result<Option<Arc<ImageProcessor>>, String> {
        self.images
            .read()
            .expect("images lock poisoned")
            .clone()
            .transpose()
    }

    /// What the replicas serve, once one of them has answered `Info`.
    pub fn info(&self) -> Option<Arc<InfoResponse>> {
        self.model.read().expect("model lock poisoned").clone()
    }

    /// Accepts a replica's model: the first one answering defines it (and,
    /// without `--tokenizer`, the tokenizer); the others must serve the same
    /// model (same id, shapes and outputs) with the same tokenizer (by the
    /// sha256 of its file).
    pub fn accept(&self, info: &Arc<InfoResponse>) -> Result<(), String> {
        let mut model = self.model.write().expect("model lock poisoned");
        match &*model {
            None => {
                if !self.tokenizer_override {
                    let t = load_tokenizer(info)?;
                    *self.tokenizer.write().expect("tokenizer lock poisoned") = Some(Arc::new(t));
                }
                tracing::info!(model = %info.model_id, dimension = info.dimension,
                               max_input_length = info.max_input_length,
                               tokenizer_sha256 = %info.tokenizer_sha256,
                               prompts = info.prompts.len(), "model info");
                *self.templates.write().expect("templates lock poisoned") = Some(Arc::new(
                    Templates::from_model(&info.prompts, &info.default_prompt_name),
                ));
                *self.images.write().expect("images lock poisoned") = image_processor(info);
                *model = Some(Arc::clone(info));
                Ok(())
            }
            Some(m) => {
                let same_model = m.model_id == info.model_id
                    && m.dimension == info.dimension
                    && m.vocab_size == info.vocab_size
                    && m.max_input_length == info.max_input_length
                    && m.kinds == info.kinds;
                if !same_model {
                    return Err(format!(
                        "it serves model {} (dimension {}), the others {} (dimension {}); \
                         restart it with {}, or restart Ivy to serve {}",
                        info.model_id,
                        info.dimension,
                        m.model_id,
                        m.dimension,
                        m.model_id,
                        info.model_id
                    ));
                }
                if m.tokenizer_sha256 != info.tokenizer_sha256 {
                    return Err(format!(
                        "it serves another tokenizer (sha256 {}) than the others ({}); restart it with \
                         the others' model files, or restart Ivy to follow the new ones",
                        short(&info.tokenizer_sha256),
                        short(&m.tokenizer_sha256)
                    ));
                }
                Ok(())
            }
        }
    }
}

/// The output kinds the model lists (unknown numbers, from a newer Tulip,
/// left out).
pub fn kinds(info: &InfoResponse) -> Vec<OutputKind> {
    info.kinds
        .iter()
        .filter_map(|&k| OutputKind::of(k))
        .collect()
}

/// An image model's preprocessing from the config its replica sent; a
/// config Ivy cannot follow is logged and refuses images, never text.
fn image_processor(info: &InfoResponse) -> Option<Result<Arc<ImageProcessor>, String>> {
    if info.image_tokens == 0 {
        return None;
    }
    let loaded = serde_json::from_slice(&info.preprocessor_config)
        .map_err(|e| format!("its preprocessor_config.json is not JSON ({e})"))
        .and_then(|json| ImageProcessor::from_config(&json).map_err(|e| e.to_string()))
        .and_then(|p| match p.fixed_size() {
            Some(size) if size == (info.image_height, info.image_width) => Ok(Arc::new(p)),
            Some((h, w)) => Err(format!(
                "its preprocessor_config.json makes {w}x{h} images; the model takes {}x{}",
                info.image_width, info.image_height
            )),
            None => Err(
                "its preprocessor_config.json makes images of each one's aspect ratio; \
                         the model takes one size"
                    .to_string(),
            ),
        })
        .map_err(|e| format!("model {} takes no images here: {e}", info.model_id));
    match &loaded {
        Ok(_) => tracing::info!(model = %info.model_id, height = info.image_height,
                                width = info.image_width, "image preprocessing loaded"),
        Err(e) => tracing::error!(error = %e, "image preprocessing"),
    }
    Some(loaded)
}

/// The tokenizer a replica sent in its Info.
fn load_tokenizer(info: &InfoResponse) -> Result<Tokenizer, String> {
    if info.tokenizer_json.is_empty() {
        return Err(format!(
            "model {} comes with no tokenizer.json; start Ivy with --tokenizer",
            info.model_id
        ));
    }
    let t = Tokenizer::from_bytes(&info.tokenizer_json).map_err(|e| {
        format!(
            "the tokenizer model {} serves does not load: {e}",
            info.model_id
        )
    })?;
    tracing::info!(model = %info.model_id, sha256 = %info.tokenizer_sha256, backend = %t.backend(),
                   "tokenizer loaded from the replica");
    Ok(t)
}

fn short(sha: &str) -> &str {
    if sha.is_empty() {
        "none"
    } else {
        &sha[..sha.len().min(12)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_models_are_refused() {
        let a = Arc::new(InfoResponse {
            model_id: "m".into(),
            dimension: 384,
            ..Default::default()
        });
        let b = Arc::new(InfoResponse {
            model_id: "m".into(),
            dimension: 768,
            ..Default::default()
        });
        let set = ServedModel::with_tokenizer(None);
        // No tokenizer.json in the Info: nothing to tokenize with.
        assert!(set.accept(&a).unwrap_err().contains("--tokenizer"));
        let tok = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/data/tokenizers/all-minilm-l6-v2/tokenizer.json"
        ))
        .unwrap();
        let with_tok = |info: &InfoResponse, sha: &str| {
            Arc::new(InfoResponse {
                tokenizer_json: tok.clone().into(),
                tokenizer_sha256: sha.into(),
                ..info.clone()
            })
        };
        assert!(set.accept(&with_tok(&a, "aa")).is_ok());
        assert!(set.tokenizer().is_some());
        assert!(set.accept(&with_tok(&a, "aa")).is_ok());
        assert!(set
            .accept(&with_tok(&b, "aa"))
            .unwrap_err()
            .contains("dimension 768"));
        assert!(set
            .accept(&with_tok(&a, "bb"))
            .unwrap_err()
            .contains("another tokenizer"));
        assert_eq!(set.info().unwrap().dimension, 384);
    }
}
