//! Classification, shared by the HTTP `/predict` and gRPC `Predict`: a
//! sequence classifier's labels with their scores, best first (softmax over
//! the logits unless raw), or a one-label cross-encoder's score as its one
//! label.

use std::sync::Arc;
use std::time::Instant;

use super::{Inputs, Job, Kind, Options, Output};
use crate::error::ApiError;
use crate::state::AppState;
use crate::upstream::pools::Pool;

/// Runs `inputs` through the classifier; each input's predictions, best
/// first.
pub async fn run(
    state: &AppState,
    pool: Arc<Pool>,
    inputs: Inputs,
    options: Options,
    deadline: Instant,
) -> Result<(Output, Vec<Vec<Prediction>>), ApiError> {
    let model = pool.info().ok_or_else(|| pool.no_replica())?;
    let classifier = model.kinds.contains(&(Kind::Classify as i32));
    let raw_scores = options.raw_scores;
    let job = Job {
        pool,
        kind: if classifier {
            Kind::Classify
        } else {
            Kind::Score
        },
        inputs,
        field: "inputs",
        options,
    };
    let out = super::run(state, job, deadline).await?;
    let labels: Vec<String> = if classifier {
        model.labels.clone()
    } else {
        vec!["LABEL_0".into()]
    };
    let scored = predictions(&out, classifier, raw_scores, &labels)?;
    Ok((out, scored))
}

/// A label and its score.
pub struct Prediction {
    pub label: String,
    pub score: f32,
}

/// Each input's labels with their scores, best first: softmax over the
/// logits (or the logits themselves with `raw_scores`); a one-label
/// cross-encoder's score as Tulip gives it (sigmoid unless raw).
fn predictions(
    out: &Output,
    classifier: bool,
    raw_scores: bool,
    labels: &[String],
) -> Result<Vec<Vec<Prediction>>, ApiError> {
    if classifier && out.dim != labels.len() {
        return Err(ApiError::Upstream(format!(
            "the replica answered {} values per input for a model with {} labels",
            out.dim,
            labels.len()
        )));
    }
    let mut all = Vec::with_capacity(out.sequences);
    for i in 0..out.sequences {
        let scores: Vec<f32> = if classifier {
            let logits: Vec<f32> = super::output::floats(out.row(i)).collect();
            if raw_scores {
                logits
            } else {
                softmax(&logits)
            }
        } else {
            vec![out.score(i)]
        };
        let mut one: Vec<Prediction> = scores
            .into_iter()
            .zip(labels)
            .map(|(score, label)| Prediction {
                label: label.clone(),
                score,
            })
            .collect();
        one.sort_by(|a, b| b.score.total_cmp(&a.score));
        all.push(one);
    }
    Ok(all)
}

fn softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exp: Vec<f32> = logits.iter().map(|l| (l - max).exp()).collect();
    let sum: f32 = exp.iter().sum();
    exp.into_iter().map(|e| e / sum).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_sums_to_one_and_keeps_order() {
        let p = softmax(&[1.0, 3.0, 2.0]);
        assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(p[1] > p[2] && p[2] > p[0]);
    }
}
