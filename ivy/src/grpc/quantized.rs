//! `Embed` and `EmbedStream` with `embedding_type`: the float vectors, or
//! those vectors quantized as sentence-transformers' `quantize_embeddings`
//! does (`pipeline/quantize.rs`), one byte per value in `data`.

use std::sync::Arc;

use proto::ivy::v1 as pb;

use crate::error::ApiError;
use crate::model::calibration::Ranges;
use crate::pipeline::quantize::{self, Precision};
use crate::pipeline::Output;
use crate::state::AppState;

/// The request's type, and the ranges it needs (calibrated on first use).
pub async fn prepare(
    state: &AppState,
    r: &pb::EmbedRequest,
) -> Result<(Precision, Option<Arc<Ranges>>), ApiError> {
    let precision = precision(r.embedding_type)?;
    let ranges = if precision.needs_ranges() {
        let (pool, _) = state.pool(r.model.as_deref())?;
        let dimensions = (r.dimensions > 0).then_some(r.dimensions);
        let normalize = Some(r.normalize.unwrap_or(true));
        Some(quantize::ranges(state, &pool, dimensions, normalize).await?)
    } else {
        None
    };
    Ok((precision, ranges))
}

/// `reply` (float vectors of `out`) as `precision`.
pub fn apply(
    reply: &mut pb::EmbedResponse,
    out: &Output,
    precision: Precision,
    ranges: Option<&Ranges>,
) {
    if precision != Precision::Float {
        let rows = quantize::rows(out, precision, ranges);
        reply.dim = rows.first().map_or(0, |r| r.values()) as u32;
        let data: Vec<u8> = rows.into_iter().flat_map(|r| r.into_bytes()).collect();
        reply.data = data.into();
    }
    reply.embedding_type = match precision {
        Precision::Float => pb::EmbeddingType::Float,
        Precision::Int8 => pb::EmbeddingType::Int8,
        Precision::Uint8 => pb::EmbeddingType::Uint8,
        Precision::Binary => pb::EmbeddingType::Binary,
        Precision::Ubinary => pb::EmbeddingType::Ubinary,
    } as i32;
}

fn precision(t: i32) -> Result<Precision, ApiError> {
    Ok(match pb::EmbeddingType::try_from(t) {
        Ok(pb::EmbeddingType::Unspecified | pb::EmbeddingType::Float) => Precision::Float,
        Ok(pb::EmbeddingType::Int8) => Precision::Int8,
        Ok(pb::EmbeddingType::Uint8) => Precision::Uint8,
        Ok(pb::EmbeddingType::Binary) => Precision::Binary,
        Ok(pb::EmbeddingType::Ubinary) => Precision::Ubinary,
        Err(_) => {
            return Err(ApiError::validation(
                "embedding_type",
                format!("unknown embedding_type {t}"),
            ))
        }
    })
}
