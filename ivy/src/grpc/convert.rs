//! Between the wire's messages and the pipeline's types: the caller's
//! deadline, truncation direction, priority, predict inputs, scoring
//! options, timings and the float embedding response.

use std::time::{Duration, Instant};

use ivy_tokenizer::Direction;
use proto::ivy::v1 as pb;
use tonic::metadata::MetadataMap;

use crate::error::ApiError;
use crate::pipeline::{Inputs, Options, Output, Priority};

/// The caller's `grpc-timeout` (e.g. `500m`, `2S`) as a deadline.
pub fn client_deadline(meta: &MetadataMap) -> Option<Instant> {
    let v = meta.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    let d = match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    };
    Instant::now().checked_add(d)
}

pub fn direction(d: i32) -> Direction {
    match pb::TruncationDirection::try_from(d) {
        Ok(pb::TruncationDirection::Left) => Direction::Left,
        _ => Direction::Right,
    }
}

pub fn priority(p: i32) -> Result<Option<Priority>, ApiError> {
    match pb::Priority::try_from(p) {
        Ok(pb::Priority::Unspecified) => Ok(None),
        Ok(pb::Priority::Interactive) => Ok(Some(Priority::Interactive)),
        Ok(pb::Priority::Batch) => Ok(Some(Priority::Batch)),
        Err(_) => Err(ApiError::schema(
            "priority",
            format!("unknown priority {p}; use PRIORITY_INTERACTIVE or PRIORITY_BATCH"),
        )),
    }
}

/// All texts, or all pairs.
pub fn predict_inputs(inputs: Vec<pb::PredictInput>) -> Result<Inputs, ApiError> {
    if inputs.is_empty() {
        return Err(ApiError::Empty("`inputs` must not be empty".into()));
    }
    let pairs = inputs[0].text_pair.is_some();
    if let Some(i) = inputs.iter().position(|x| x.text_pair.is_some() != pairs) {
        return Err(ApiError::schema(
            "inputs",
            format!("inputs[{i}] must be a pair like inputs[0] is, or a text like it is not"),
        ));
    }
    Ok(if pairs {
        Inputs::PairList(
            inputs
                .into_iter()
                .map(|x| (x.text, x.text_pair.unwrap_or_default()))
                .collect(),
        )
    } else {
        Inputs::Texts(inputs.into_iter().map(|x| x.text).collect())
    })
}

pub fn timing(out: &Output, started: Instant) -> Option<pb::Timing> {
    let us = |d: Duration| d.as_micros() as u64;
    Some(pb::Timing {
        tokenization_us: us(out.timing.tokenize),
        queue_us: us(out.timing.queue),
        inference_us: us(out.timing.inference),
        total_us: us(started.elapsed()),
    })
}

/// A float `EmbedResponse` for a pipeline output.
pub fn embed_response(out: &Output, started: Instant) -> pb::EmbedResponse {
    pb::EmbedResponse {
        rows: out.sequences as u32,
        dim: out.dim as u32,
        data: out.data().clone(),
        prompt_tokens: out.tokens,
        timing: timing(out, started),
        embedding_type: pb::EmbeddingType::Float as i32,
    }
}

/// Rerank and predict take the same scoring options: truncation, raw
/// scores and priority (no dimensions, normalization or prompt).
pub fn score_options(
    truncate: bool,
    truncation_direction: i32,
    raw_scores: bool,
    priority_field: i32,
) -> Result<Options, ApiError> {
    Ok(Options {
        truncate,
        direction: direction(truncation_direction),
        raw_scores,
        priority: priority(priority_field)?,
        ..Options::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_grpc_timeouts() {
        let mut m = MetadataMap::new();
        assert!(client_deadline(&m).is_none());
        m.insert("grpc-timeout", "1500m".parse().unwrap());
        let d = client_deadline(&m)
            .unwrap()
            .saturating_duration_since(Instant::now());
        assert!(d <= Duration::from_millis(1500));
        m.insert("grpc-timeout", "3M".parse().unwrap());
        let d = client_deadline(&m)
            .unwrap()
            .saturating_duration_since(Instant::now());
        assert!(d > Duration::from_secs(60) && d <= Duration::from_secs(180));
        m.insert("grpc-timeout", "5x".parse().unwrap());
        assert!(client_deadline(&m).is_none());
    }
}
