//! Checks a request against the model and the server's limits before any of
//! it reaches the engine: a bad id must never reach a GPU kernel.

use std::sync::Mutex;
use std::time::Instant;

use proto::tulip::v1::EmbedRequest;

use crate::adapters::Adapters;
use crate::error::TulipError;
use crate::model::{Kind, ModelInfo};
use crate::output::Accumulator;
use crate::priority::Class;
use crate::queue::{Progress, Reply, Request};

pub struct Limits {
    pub max_request_sequences: usize,
}

/// A valid request, ready for the pool, or the reason it is not.
pub fn validate(
    req: EmbedRequest,
    model: &ModelInfo,
    limits: &Limits,
    adapters: &Adapters,
    reply: Reply,
) -> Result<Request, (TulipError, Reply)> {
    let adapter = match req.adapter.as_str() {
        "" => None,
        name => match adapters.get(name) {
            Ok(a) => Some(a),
            Err(e) => return Err((e, reply)),
        },
    };
    match check(&req, model, limits) {
        Ok((kind, class, dimensions, normalize, offsets)) => {
            let n = offsets.len() - 1;
            let width = match kind {
                Kind::MultiVector => model.multi_vector_dimension,
                Kind::TokenStates => model.token_states_dimension,
                Kind::Classify => model.labels.len() as u32,
                _ => dimensions,
            };
            Ok(Request {
                kind,
                class,
                dimensions,
                normalize,
                raw_scores: req.raw_scores,
                request_id: req.request_id,
                adapter,
                token_ids: req.token_ids,
                offsets,
                arrived: Instant::now(),
                progress: Mutex::new(Progress {
                    reply: Some(reply),
                    output: Accumulator::new(kind, n, width as usize),
                    remaining: n,
                    last_scheduled: None,
                    first_launch: None,
                }),
            })
        }
        Err(e) => Err((e, reply)),
    }
}

type Checked = (Kind, Class, u32, bool, Vec<u32>);

fn check(req: &EmbedRequest, model: &ModelInfo, limits: &Limits) -> Result<Checked, TulipError> {
    let invalid = |m: String| Err(TulipError::InvalidArgument(m));
    let Some(kind) = Kind::from_proto(req.kind).map(|k| model.engine_kind(k)) else {
        return invalid(format!("unknown output kind {}", req.kind));
    };
    if !model.produces(kind) {
        let have: Vec<&str> = model.kinds.iter().map(|k| k.as_str()).collect();
        return invalid(format!(
            "model {} does not produce {} outputs (it produces: {})",
            model.model_id,
            kind.as_str(),
            have.join(", ")
        ));
    }
    let Some(class) = Class::from_proto(req.priority) else {
        return invalid(format!("unknown priority {}", req.priority));
    };
    let n = req.lengths.len();
    if n == 0 {
        return invalid("request has no sequences".into());
    }
    if n > limits.max_request_sequences {
        return invalid(format!(
            "request has {n} sequences; the limit is {} per request",
            limits.max_request_sequences
        ));
    }
    let mut offsets = Vec::with_capacity(n + 1);
    let mut total: u64 = 0;
    offsets.push(0);
    for (i, &len) in req.lengths.iter().enumerate() {
        if len == 0 {
            return invalid(format!("sequence {i} is empty"));
        }
        if len > model.max_input_length {
            return invalid(format!(
                "sequence {i} has {len} tokens; the model accepts at most {}",
                model.max_input_length
            ));
        }
        total += u64::from(len);
        if total > u64::from(u32::MAX) {
            return invalid("request has too many tokens".into());
        }
        offsets.push(total as u32);
    }
    if total != req.token_ids.len() as u64 {
        return invalid(format!(
            "lengths add up to {total} tokens but {} token ids were sent",
            req.token_ids.len()
        ));
    }
    if let Some((pos, &id)) = req
        .token_ids
        .iter()
        .enumerate()
        .find(|(_, &id)| id >= model.vocab_size)
    {
        let seq = offsets.partition_point(|&o| o as usize <= pos) - 1;
        return invalid(format!(
            "token id {id} in sequence {seq} is outside the vocabulary [0, {})",
            model.vocab_size
        ));
    }
    let dimensions = match req.dimensions {
        0 => model.dimension,
        d if kind == Kind::Dense && d > model.dimension => {
            return invalid(format!(
                "dimensions {d} is larger than the model's dimension {}",
                model.dimension
            ))
        }
        d => d,
    };
    let normalize = req.normalize.unwrap_or(model.normalize_default);
    Ok((kind, class, dimensions, normalize, offsets))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> ModelInfo {
        ModelInfo {
            model_id: "m".into(),
            architecture: "bert".into(),
            dimension: 8,
            max_input_length: 4,
            vocab_size: 100,
            pooling: "mean".into(),
            normalize_default: true,
            kinds: vec![Kind::Dense],
            multi_vector_dimension: 0,
            dtype: "float32".into(),
            device: "cpu".into(),
            tokenizer_json: Default::default(),
            tokenizer_sha256: String::new(),
            prompts: Default::default(),
            default_prompt_name: String::new(),
            labels: Vec::new(),
            pair_template: String::new(),
            token_states_dimension: 0,
            span_pooling: String::new(),
        }
    }

    fn run(req: EmbedRequest) -> Result<Checked, TulipError> {
        check(
            &req,
            &model(),
            &Limits {
                max_request_sequences: 3,
            },
        )
    }

    fn req(ids: Vec<u32>, lengths: Vec<u32>) -> EmbedRequest {
        EmbedRequest {
            token_ids: ids,
            lengths,
            ..Default::default()
        }
    }

    fn message(r: Result<Checked, TulipError>) -> String {
        match r {
            Err(TulipError::InvalidArgument(m)) => m,
            other => panic!("expected InvalidArgument, got {:?}", other.map(|c| c.4)),
        }
    }

    #[test]
    fn accepts_valid_and_resolves_defaults() {
        let (kind, class, dims, norm, offsets) = run(req(vec![1, 2, 3], vec![2, 1])).unwrap();
        assert_eq!(
            (kind, class, dims, norm),
            (Kind::Dense, Class::Interactive, 8, true)
        );
        assert_eq!(offsets, vec![0, 2, 3]);
    }

    #[test]
    fn rejects_bad_requests_with_reasons() {
        assert!(message(run(req(vec![], vec![]))).contains("no sequences"));
        assert!(message(run(req(vec![1], vec![1, 0]))).contains("sequence 1 is empty"));
        assert!(message(run(req(vec![1; 5], vec![5]))).contains("at most 4"));
        assert!(message(run(req(vec![1, 2], vec![1, 1, 1, 1]))).contains("limit is 3"));
        assert!(message(run(req(vec![1, 2], vec![3]))).contains("2 token ids"));
        assert!(message(run(req(vec![1, 2, 100], vec![2, 1]))).contains("in sequence 1 is outside"));
        let mut r = req(vec![1], vec![1]);
        r.dimensions = 9;
        assert!(message(run(r)).contains("larger than"));
        let mut r = req(vec![1], vec![1]);
        r.kind = proto::tulip::v1::OutputKind::Score as i32;
        assert!(message(run(r)).contains("does not produce score"));
        let mut r = req(vec![1], vec![1]);
        r.priority = 9;
        assert!(message(run(r)).contains("unknown priority 9"));
    }
}
