//! Quantized vectors, exactly as sentence-transformers'
//! `quantize_embeddings` makes them from the same float vectors (after
//! `dimensions` truncation and normalization, i.e. from what the float
//! answer would be):
//!
//! - `ubinary`: `np.packbits(v > 0)`, first dimension in the high bit,
//!   zero-padded to whole bytes; `binary`: the same bytes minus 128, as int8.
//! - `uint8`: `clip(floor((v - start) / step), 0, 255)`, with `start` the
//!   minimum and `step = (max - min) / 255` (1 where that is 0) per
//!   dimension, in float32 as numpy computes it; `int8`: the same minus 128.
//!   The ranges come from the model's calibration (`model/calibration.rs`),
//!   never from the request's batch.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::FutureExt;

use super::{floats, Inputs, Job, Kind, Options, Output, Priority};
use crate::error::ApiError;
use crate::model::calibration::{Corpus, Key, Ranges};
use crate::state::AppState;
use crate::upstream::pools::Pool;

/// The built-in calibration corpus (provenance in `ivy/data/README.md`).
const BUILTIN_CORPUS: &str = include_str!("../../data/calibration.txt");

/// An embedding type, by Cohere's names (also `encoding_format` on
/// `/v1/embeddings` and `embedding_types` on gRPC).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Precision {
    Float,
    Int8,
    Uint8,
    Binary,
    Ubinary,
}

impl Precision {
    pub const ALL: [Self; 5] = [
        Self::Float,
        Self::Int8,
        Self::Uint8,
        Self::Binary,
        Self::Ubinary,
    ];

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == s)
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Float => "float",
            Self::Int8 => "int8",
            Self::Uint8 => "uint8",
            Self::Binary => "binary",
            Self::Ubinary => "ubinary",
        }
    }

    /// int8/uint8 need the model's calibrated ranges.
    pub fn needs_ranges(self) -> bool {
        matches!(self, Self::Int8 | Self::Uint8)
    }
}

/// One vector, quantized: bytes for uint8/ubinary, signed for int8/binary
/// (JSON: an array of integers).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(untagged)]
pub enum Quantized {
    Unsigned(Vec<u8>),
    Signed(Vec<i8>),
}

impl Quantized {
    /// Values (bytes) in the vector.
    pub fn values(&self) -> usize {
        match self {
            Self::Unsigned(b) => b.len(),
            Self::Signed(b) => b.len(),
        }
    }

    /// The raw bytes (int8 as two's complement): what gRPC and base64 carry.
    pub fn into_bytes(self) -> Vec<u8> {
        match self {
            Self::Unsigned(b) => b,
            Self::Signed(b) => b.into_iter().map(|v| v as u8).collect(),
        }
    }
}

/// `row` (float values) as `precision`; `ranges` is required for int8/uint8.
pub fn quantize(row: &[f32], precision: Precision, ranges: Option<&Ranges>) -> Quantized {
    match precision {
        Precision::Float => Quantized::Unsigned(row.iter().flat_map(|v| v.to_le_bytes()).collect()),
        Precision::Ubinary => Quantized::Unsigned(packbits(row)),
        Precision::Binary => Quantized::Signed(
            packbits(row)
                .into_iter()
                .map(|b| (i16::from(b) - 128) as i8)
                .collect(),
        ),
        Precision::Uint8 | Precision::Int8 => {
            let [min, max] = &ranges.expect("int8/uint8 without ranges").ranges;
            let levels = row.iter().zip(min).zip(max).map(|((&v, &lo), &hi)| {
                // float32 throughout, operation for operation as numpy does.
                let step = (hi - lo) / 255.0f32;
                let step = if step == 0.0 { 1.0 } else { step };
                // `as` saturates to 0..=255 (the clip; NaN → 0).
                ((v - lo) / step).floor() as u8
            });
            if precision == Precision::Uint8 {
                Quantized::Unsigned(levels.collect())
            } else {
                Quantized::Signed(levels.map(|l| (i16::from(l) - 128) as i8).collect())
            }
        }
    }
}

/// Every vector of a dense `out`, as `precision`.
pub fn rows(out: &Output, precision: Precision, ranges: Option<&Ranges>) -> Vec<Quantized> {
    (0..out.sequences)
        .map(|i| {
            let row: Vec<f32> = floats(out.row(i)).collect();
            quantize(&row, precision, ranges)
        })
        .collect()
}

/// The ranges `precisions` need for vectors made with `options`: none for
/// float and binary types.
pub async fn ranges_for(
    state: &AppState,
    pool: &Arc<Pool>,
    precisions: &[Precision],
    options: &Options,
) -> Result<Option<Arc<Ranges>>, ApiError> {
    if !precisions.iter().any(|p| p.needs_ranges()) {
        return Ok(None);
    }
    ranges(state, pool, options.dimensions, options.normalize)
        .await
        .map(Some)
}

/// `np.packbits(row > 0)`: big-endian bit order, the last byte zero-padded.
fn packbits(row: &[f32]) -> Vec<u8> {
    row.chunks(8)
        .map(|bits| {
            bits.iter()
                .enumerate()
                .fold(0u8, |byte, (i, &v)| byte | (u8::from(v > 0.0) << (7 - i)))
        })
        .collect()
}

/// The ranges for vectors of `dimensions` (None: the model's) normalized
/// or not (None: the model's default): from `--quantization-ranges`, else
/// from the calibration corpus, which the model embeds once, on first use
/// (concurrent requests wait on the same calibration).
pub async fn ranges(
    state: &AppState,
    pool: &Arc<Pool>,
    dimensions: Option<u32>,
    normalize: Option<bool>,
) -> Result<Arc<Ranges>, ApiError> {
    let model = pool.info().ok_or_else(|| pool.no_replica())?;
    let key: Key = (
        dimensions.unwrap_or(model.dimension),
        normalize.unwrap_or(model.normalize_default),
    );
    let calibrations = &pool.model.calibrations;
    if let Some(r) = calibrations.known(key) {
        return Ok(r);
    }
    let ranges = if let Some(path) = &state.config.quantization_ranges {
        from_file(path, &model.model_id, key)?
    } else {
        let pending = calibrations.corpus(|| {
            let (state, pool) = (Arc::clone(state), Arc::clone(pool));
            // Its own task: a request that times out does not cancel it.
            let task =
                tokio::spawn(
                    async move { calibrate(&state, pool).await.map_err(|e| e.to_string()) },
                );
            async move {
                task.await
                    .unwrap_or_else(|e| Err(format!("the calibration task failed: {e}")))
                    .map(Arc::new)
            }
            .boxed()
        });
        match pending.await {
            Ok(corpus) => corpus.ranges(&model.model_id, key),
            Err(e) => {
                calibrations.forget();
                return Err(ApiError::Unavailable(format!(
                    "calibrating the quantization ranges failed ({e}); retry"
                )));
            }
        }
    };
    let ranges = Arc::new(ranges);
    calibrations.remember(Arc::clone(&ranges));
    Ok(ranges)
}

/// Embeds the calibration corpus (full dimension, not normalized) in
/// requests within Ivy's own limits, as batch work.
async fn calibrate(state: &AppState, pool: Arc<Pool>) -> Result<Corpus, ApiError> {
    let (source, corpus) = corpus(state)?;
    let started = Instant::now();
    let per_request = state.config.max_inputs.clamp(1, 256);
    let mut rows: Vec<f32> = Vec::new();
    let mut dim = 0;
    for texts in corpus.chunks(per_request) {
        let job = Job {
            pool: Arc::clone(&pool),
            kind: Kind::Dense,
            inputs: Inputs::Texts(texts.to_vec()),
            field: "inputs",
            options: Options {
                truncate: true,
                normalize: Some(false),
                priority: Some(Priority::Batch),
                ..Options::default()
            },
        };
        let deadline = Instant::now() + state.config.request_timeout.max(Duration::from_secs(120));
        let out = super::run(state, job, deadline).await?;
        dim = out.dim;
        rows.extend(super::floats(out.data()));
    }
    let texts = corpus.len();
    let model = pool.name.to_string();
    tracing::info!(model = %model, texts, %source, ms = started.elapsed().as_millis() as u64,
                   "calibration corpus embedded for quantized vectors");
    Ok(Corpus { source, dim, rows })
}

/// The calibration texts: `--calibration-corpus`, else the built-in ones.
fn corpus(state: &AppState) -> Result<(String, Vec<String>), ApiError> {
    let (source, text) = match &state.config.calibration_corpus {
        Some(path) => (
            path.display().to_string(),
            std::fs::read_to_string(path).map_err(|e| {
                ApiError::Internal(format!("--calibration-corpus {}: {e}", path.display()))
            })?,
        ),
        None => (
            "builtin:ivy/data/calibration.txt".to_string(),
            BUILTIN_CORPUS.to_string(),
        ),
    };
    let lines: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    if lines.is_empty() {
        return Err(ApiError::Internal(format!(
            "the calibration corpus {source} has no text"
        )));
    }
    Ok((source, lines))
}

/// `key`'s ranges from a ranges file (one `Ranges` object or a list).
fn from_file(path: &std::path::Path, model_id: &str, key: Key) -> Result<Ranges, ApiError> {
    let what = format!("--quantization-ranges {}", path.display());
    let text =
        std::fs::read_to_string(path).map_err(|e| ApiError::Internal(format!("{what}: {e}")))?;
    let all: Vec<Ranges> = match serde_json::from_str::<serde_json::Value>(&text) {
        Ok(serde_json::Value::Array(_)) => serde_json::from_str(&text),
        _ => serde_json::from_str::<Ranges>(&text).map(|r| vec![r]),
    }
    .map_err(|e| ApiError::Internal(format!("{what} is not a ranges file: {e}")))?;
    let found = all
        .into_iter()
        .find(|r| (r.dimensions, r.normalize) == key)
        .ok_or_else(|| {
            ApiError::validation(
                "dimensions",
                format!(
                    "int8/uint8 vectors of {} dimensions (normalize {}) have no ranges in {what}; \
                     ask for a setting it holds, or add it",
                    key.0, key.1
                ),
            )
        })?;
    let dim = key.0 as usize;
    if found.model != model_id || found.ranges[0].len() != dim || found.ranges[1].len() != dim {
        return Err(ApiError::Internal(format!(
            "{what} holds ranges of model {} with {} values, not of the served {model_id} with {dim}",
            found.model,
            found.ranges[0].len()
        )));
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranges(min: Vec<f32>, max: Vec<f32>) -> Ranges {
        Ranges {
            model: "m".into(),
            dimensions: min.len() as u32,
            normalize: true,
            source: "test".into(),
            texts: 2,
            ranges: [min, max],
        }
    }

    #[test]
    fn binary_is_packbits_of_the_signs() {
        let row = [0.5, -1.0, 0.0, 2.0, 0.1, -0.1, 3.0, 1.0, -2.0, 4.0];
        // 1 0 0 1 1 0 1 1 | 0 1 (padded) → 0b1001_1011, 0b0100_0000
        assert_eq!(
            quantize(&row, Precision::Ubinary, None),
            Quantized::Unsigned(vec![0x9b, 0x40])
        );
        assert_eq!(
            quantize(&row, Precision::Binary, None),
            Quantized::Signed(vec![(0x9b_i16 - 128) as i8, (0x40_i16 - 128) as i8])
        );
    }

    #[test]
    fn int8_follows_numpy_and_saturates() {
        let r = ranges(vec![-1.0, 0.0, 2.0], vec![1.0, 255.0, 2.0]);
        // (0 - -1) / (2/255) = 127.5 → 127; a constant dimension has step 1.
        // (float32 as numpy: (0.5 - 0) / (0.5/255) is 254.99998 → 254.)
        let row = [0.0f32, 255.0, 2.5];
        assert_eq!(
            quantize(&row, Precision::Uint8, Some(&r)),
            Quantized::Unsigned(vec![127, 255, 0])
        );
        assert_eq!(
            quantize(&row, Precision::Int8, Some(&r)),
            Quantized::Signed(vec![-1, 127, -128])
        );
        let out = [-5.0f32, 300.0, 1.0];
        assert_eq!(
            quantize(&out, Precision::Uint8, Some(&r)),
            Quantized::Unsigned(vec![0, 255, 0])
        );
        assert_eq!(
            quantize(&out, Precision::Int8, Some(&r)),
            Quantized::Signed(vec![-128, 127, -128])
        );
    }

    #[test]
    fn names_round_trip_and_the_corpus_is_there() {
        for p in Precision::ALL {
            assert_eq!(Precision::parse(p.name()), Some(p));
        }
        assert_eq!(Precision::parse("base64"), None);
        assert_eq!(
            BUILTIN_CORPUS
                .lines()
                .filter(|l| !l.trim().is_empty())
                .count(),
            340
        );
    }
}
