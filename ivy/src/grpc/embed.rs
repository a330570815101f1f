//! `Embed`'s pipeline, shared by the unary call and each `EmbedStream`
//! message: the request as a job, float or quantized rows, and how a
//! failed call is counted and told.

use std::time::Instant;

use proto::ivy::v1 as pb;
use tracing::Instrument;

use super::convert::{direction, embed_response, priority};
use crate::error::ApiError;
use crate::pipeline::{self, Inputs, Item, Job, Kind, Options, Output};
use crate::request::id::{model_label, RequestId};
use crate::state::AppState;
use crate::upstream::pools::Pool;

/// Records a failed call's metric; returns its code and the message its
/// caller sees (logged in `span` when the failure is on the server side).
pub(super) fn failed(
    state: &AppState,
    endpoint: &'static str,
    model: std::sync::Arc<str>,
    e: &ApiError,
    id: &RequestId,
    span: &tracing::Span,
) -> (tonic::Code, String) {
    let code = e.grpc_code();
    state
        .metrics
        .request("grpc", endpoint, model, format!("{code:?}"), Some(e.kind()));
    (code, span.in_scope(|| e.client_message(Some(id))))
}

pub(super) async fn embed_job(
    state: &AppState,
    r: pb::EmbedRequest,
    kind: fn(&Pool) -> Kind,
    deadline: Instant,
) -> Result<Output, ApiError> {
    let (pool, _) = state.pool(r.model.as_deref())?;
    let kind = kind(&pool);
    if r.inputs.is_empty() && r.images.is_empty() {
        return Err(ApiError::Empty("`inputs` must not be empty".into()));
    }
    let dense = kind == Kind::Dense;
    if !r.images.is_empty() && !dense {
        return Err(ApiError::Unsupported(
            "images have dense embeddings only (Embed, EmbedStream)".into(),
        ));
    }
    let options = Options {
        truncate: r.truncate,
        direction: direction(r.truncation_direction),
        dimensions: (dense && r.dimensions > 0).then_some(r.dimensions),
        normalize: dense.then(|| r.normalize.unwrap_or(true)),
        prompt_name: r.prompt_name,
        raw_scores: false,
        priority: priority(r.priority)?,
        late_chunking: r.late_chunking,
        ..Options::default()
    };
    // Errors name an image by its row: `images[2]` when only images came.
    let field = if r.inputs.is_empty() {
        "images"
    } else {
        "inputs"
    };
    pipeline::run(
        state,
        Job {
            pool,
            kind,
            inputs: if r.images.is_empty() {
                Inputs::Texts(r.inputs)
            } else {
                let texts = r.inputs.into_iter().map(Item::Text);
                Inputs::Items(texts.chain(r.images.into_iter().map(Item::Image)).collect())
            },
            field,
            options,
        },
        deadline,
    )
    .await
}

/// `Embed` (and each `EmbedStream` message): float vectors, or quantized
/// as `embedding_type` asks (`quantized.rs`).
pub(super) async fn embed_dense(
    state: &AppState,
    r: pb::EmbedRequest,
    deadline: Instant,
    started: Instant,
) -> Result<pb::EmbedResponse, ApiError> {
    let (precision, ranges) = super::quantized::prepare(state, &r).await?;
    let out = embed_job(state, r, |_| Kind::Dense, deadline).await?;
    let mut reply = embed_response(&out, started);
    super::quantized::apply(&mut reply, &out, precision, ranges.as_deref());
    Ok(reply)
}

/// One `EmbedStream` message: the unary `Embed` pipeline under its own
/// request id (`<stream id>/<n>`) and span (a child of the stream's), its
/// failure folded into the response.
pub(super) async fn stream_message(
    state: AppState,
    stream: tracing::Span,
    stream_id: RequestId,
    n: u64,
    r: pb::EmbedRequest,
) -> pb::EmbedStreamResponse {
    use pb::embed_stream_response::Result as Answer;
    let id = RequestId::from_caller(Some(format!("{stream_id}/{n}").as_bytes()));
    let span = tracing::info_span!(parent: &stream, "request", id = %id, rpc = "embed_stream",
        tokens = tracing::field::Empty);
    let started = Instant::now();
    let deadline = state.deadline();
    let (result, model) = id
        .clone()
        .scope(async {
            let result = embed_dense(&state, r, deadline, started).await;
            (result, model_label())
        })
        .instrument(span.clone())
        .await;
    let answer = match result {
        Ok(reply) => {
            state
                .metrics
                .request("grpc", "embed_stream", model, "OK".into(), None);
            Answer::Embedding(reply)
        }
        Err(e) => {
            let (code, message) = failed(&state, "embed_stream", model, &e, &id, &span);
            Answer::Error(pb::StreamError {
                code: code as i32,
                message,
            })
        }
    };
    pb::EmbedStreamResponse {
        result: Some(answer),
    }
}
