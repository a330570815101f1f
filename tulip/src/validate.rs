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
    let checked = if req.images > 0 || !req.pixels.is_empty() {
        check_images(&req, model, limits, adapter.is_some())
    } else {
        check(&req, model, limits)
    };
    match checked {
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
                image_bytes: if kind == Kind::Image {
                    4 * model.images.values()
                } else {
                    0
                },
                pixels: req.pixels,
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

/// The request's dimensions (0: the model's; over it refused when
/// `dense`) and normalisation (unset: the model's default).
fn dense_options(
    req: &EmbedRequest,
    model: &ModelInfo,
    dense: bool,
) -> Result<(u32, bool), TulipError> {
    let dimensions = match req.dimensions {
        0 => model.dimension,
        d if dense && d > model.dimension => {
            return Err(TulipError::InvalidArgument(format!(
                "dimensions {d} is larger than the model's dimension {}",
                model.dimension
            )))
        }
        d => d,
    };
    Ok((dimensions, req.normalize.unwrap_or(model.normalize_default)))
}

/// An image request: the model takes images, the pixels are exactly
/// `images` images at its size and all finite (a NaN must never reach the
/// device), and nothing of a text request is set.
fn check_images(
    req: &EmbedRequest,
    model: &ModelInfo,
    limits: &Limits,
    with_adapter: bool,
) -> Result<Checked, TulipError> {
    let invalid = |m: String| Err(TulipError::InvalidArgument(m));
    let image = &model.images;
    if image.tokens == 0 {
        return invalid(format!(
            "model {} takes no images, only token ids",
            model.model_id
        ));
    }
    if !req.token_ids.is_empty() || !req.lengths.is_empty() {
        return invalid("a request carries either images or token ids, not both".into());
    }
    if !matches!(
        Kind::from_proto(req.kind),
        Some(Kind::Dense) | Some(Kind::Image)
    ) {
        return invalid("images have dense outputs only".into());
    }
    if with_adapter {
        return invalid("LoRA adapters apply to text, not to images".into());
    }
    let Some(class) = Class::from_proto(req.priority) else {
        return invalid(format!("unknown priority {}", req.priority));
    };
    let n = req.images as usize;
    if n == 0 {
        return invalid("pixels were sent for 0 images".into());
    }
    if n > limits.max_request_sequences {
        return invalid(format!(
            "request has {n} images; the limit is {} per request",
            limits.max_request_sequences
        ));
    }
    let want = n * image.values() * 4;
    if req.pixels.len() != want {
        return invalid(format!(
            "{} bytes of pixels for {n} images; each is 3 x {} x {} float32 values ({want} bytes in all)",
            req.pixels.len(),
            image.height,
            image.width
        ));
    }
    if let Some(at) = req
        .pixels
        .chunks_exact(4)
        .position(|b| !f32::from_le_bytes([b[0], b[1], b[2], b[3]]).is_finite())
    {
        return invalid(format!(
            "image {} has a value that is not finite",
            at / image.values()
        ));
    }
    let (dimensions, normalize) = dense_options(req, model, true)?;
    let offsets = (0..=n as u32).map(|i| i * image.tokens).collect();
    Ok((Kind::Image, class, dimensions, normalize, offsets))
}

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
        let pad_to = model.images.text_pad_to;
        if pad_to > 0 && len != pad_to {
            return invalid(format!(
                "sequence {i} has {len} tokens; this model's texts are padded to exactly {pad_to} \
                 (InfoResponse.text_pad_to, with pad_token_id {})",
                model.images.pad_token_id
            ));
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
    let (dimensions, normalize) = dense_options(req, model, kind == Kind::Dense)?;
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
            images: Default::default(),
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
