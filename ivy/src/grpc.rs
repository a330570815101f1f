//! The gRPC front: `ivy.v1.Ivy` (the same pipeline as the HTTP routes) and
//! `grpc.health.v1` (see `grpc_health.rs`). Errors map to gRPC codes in
//! `error.rs`; the request id travels in `x-request-id` metadata.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use ivy_tokenizer::Direction;
use proto::ivy::v1 as pb;
use proto::ivy::v1::ivy_server::{Ivy, IvyServer};
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;

use crate::conn_io::ConnIo;
use crate::error::ApiError;
use crate::pipeline::tokens::{self, TokenizeJob};
use crate::pipeline::{self, floats, predict, Inputs, Job, Kind, Options, Output, Priority};
use crate::replicas::no_replica;
use crate::request_id::{RequestId, HEADER};
use crate::state::AppState;
use crate::tls::Stream;

/// Serves until `shutdown` resolves, then finishes in-flight calls. HTTP/2
/// keepalive pings close connections whose peer stopped answering (or
/// reading): quiet for --idle-timeout, unanswered for --write-timeout.
pub async fn serve(
    state: AppState,
    incoming: impl futures_util::Stream<Item = std::io::Result<ConnIo<Stream>>> + Send + 'static,
    shutdown: impl Future<Output = ()>,
) -> Result<(), String> {
    let max = state.config.max_body_bytes;
    let net = state.config.net.clone();
    let drain_timeout = state.config.drain_timeout;
    let health = crate::grpc_health::service(state.clone());
    let service = IvyServer::new(IvyService { state })
        .max_decoding_message_size(max)
        .max_encoding_message_size(usize::MAX);
    let mut builder = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(net.idle_timeout))
        .http2_keepalive_timeout(Some(net.write_timeout));
    if let Some(age) = net.grpc_max_connection_age {
        builder = builder
            .max_connection_age(age)
            .max_connection_age_grace(drain_timeout);
    }
    builder
        .add_service(health)
        .add_service(service)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
        .map_err(|e| format!("gRPC server error: {e}"))
}

pub struct IvyService {
    state: AppState,
}

impl IvyService {
    /// Request id, API key, deadline, metrics and error mapping around a call.
    async fn call<Req, Resp, F, Fut>(
        &self,
        endpoint: &'static str,
        request: Request<Req>,
        f: F,
    ) -> Result<Response<Resp>, Status>
    where
        F: FnOnce(AppState, Req, Instant) -> Fut,
        Fut: Future<Output = Result<Resp, ApiError>>,
    {
        let meta = request.metadata();
        let id = RequestId::from_caller(meta.get(HEADER).map(|v| v.as_bytes()));
        let deadline =
            client_deadline(meta).map_or(self.state.deadline(), |d| d.min(self.state.deadline()));
        let auth = self
            .state
            .api_key
            .check(meta.get("authorization").map(|v| v.as_bytes()));
        let span = tracing::info_span!("request", id = %id, rpc = endpoint, tokens = tracing::field::Empty);
        telemetry::continue_grpc(&span, meta);
        let state = self.state.clone();
        let result = id
            .clone()
            .scope(async move {
                auth?;
                f(state, request.into_inner(), deadline).await
            })
            .instrument(span.clone())
            .await;
        let mut meta = MetadataMap::new();
        if let Ok(v) = MetadataValue::try_from(id.as_str()) {
            meta.insert(HEADER, v);
        }
        match result {
            Ok(resp) => {
                self.state
                    .metrics
                    .request("grpc", endpoint, "OK".into(), None);
                let mut r = Response::new(resp);
                *r.metadata_mut() = meta;
                Ok(r)
            }
            Err(e) => {
                let code = e.grpc_code();
                self.state
                    .metrics
                    .request("grpc", endpoint, format!("{code:?}"), Some(e.kind()));
                let mut message = e.to_string();
                if e.is_server_side() {
                    span.in_scope(|| tracing::warn!(kind = e.kind(), error = %e, "request failed"));
                    message.push_str(&format!(" (request id {id})"));
                }
                Err(Status::with_metadata(code, message, meta))
            }
        }
    }
}

/// The caller's `grpc-timeout` (e.g. `500m`, `2S`) as a deadline.
fn client_deadline(meta: &MetadataMap) -> Option<Instant> {
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

fn direction(d: i32) -> Direction {
    match pb::TruncationDirection::try_from(d) {
        Ok(pb::TruncationDirection::Left) => Direction::Left,
        _ => Direction::Right,
    }
}

fn priority(p: i32) -> Result<Option<Priority>, ApiError> {
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
fn predict_inputs(inputs: Vec<pb::PredictInput>) -> Result<Inputs, ApiError> {
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

fn timing(out: &Output, started: Instant) -> Option<pb::Timing> {
    let us = |d: Duration| d.as_micros() as u64;
    Some(pb::Timing {
        tokenization_us: us(out.timing.tokenize),
        queue_us: us(out.timing.queue),
        inference_us: us(out.timing.inference),
        total_us: us(started.elapsed()),
    })
}

async fn embed_job(
    state: &AppState,
    r: pb::EmbedRequest,
    kind: Kind,
    deadline: Instant,
) -> Result<Output, ApiError> {
    if r.inputs.is_empty() {
        return Err(ApiError::Empty("`inputs` must not be empty".into()));
    }
    let dense = kind == Kind::Dense;
    let options = Options {
        truncate: r.truncate,
        direction: direction(r.truncation_direction),
        dimensions: (dense && r.dimensions > 0).then_some(r.dimensions),
        normalize: dense.then(|| r.normalize.unwrap_or(true)),
        prompt_name: r.prompt_name,
        raw_scores: false,
        priority: priority(r.priority)?,
    };
    pipeline::run(
        state,
        Job {
            kind,
            inputs: Inputs::Texts(r.inputs),
            field: "inputs",
            options,
        },
        deadline,
    )
    .await
}

/// One `EmbedStream` message: the unary `Embed` pipeline under its own
/// request id (`<stream id>/<n>`) and span (a child of the stream's), its
/// failure folded into the response.
async fn stream_message(
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
    let result = id
        .clone()
        .scope(embed_job(&state, r, Kind::Dense, deadline))
        .instrument(span.clone())
        .await;
    let answer = match result {
        Ok(out) => {
            state
                .metrics
                .request("grpc", "embed_stream", "OK".into(), None);
            Answer::Embedding(pb::EmbedResponse {
                rows: out.sequences as u32,
                dim: out.dim as u32,
                data: out.data().clone(),
                prompt_tokens: out.tokens,
                timing: timing(&out, started),
            })
        }
        Err(e) => {
            let code = e.grpc_code();
            state
                .metrics
                .request("grpc", "embed_stream", format!("{code:?}"), Some(e.kind()));
            let mut message = e.to_string();
            if e.is_server_side() {
                span.in_scope(|| tracing::warn!(kind = e.kind(), error = %e, "request failed"));
                message.push_str(&format!(" (request id {id})"));
            }
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

type EmbedStream =
    Pin<Box<dyn futures_util::Stream<Item = Result<pb::EmbedStreamResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Ivy for IvyService {
    type EmbedStreamStream = EmbedStream;

    /// Answers in order with at most `--stream-window` messages in flight:
    /// `buffered` pulls the next request only when a slot is free, and
    /// tonic polls for the next answer only when the client has taken the
    /// last one, so back-pressure runs from the client's reads to ours. A
    /// broken inbound stream ends the call with its status.
    async fn embed_stream(
        &self,
        request: Request<Streaming<pb::EmbedRequest>>,
    ) -> Result<Response<Self::EmbedStreamStream>, Status> {
        let meta = request.metadata();
        let id = RequestId::from_caller(meta.get(HEADER).map(|v| v.as_bytes()));
        if let Err(e) = self
            .state
            .api_key
            .check(meta.get("authorization").map(|v| v.as_bytes()))
        {
            let code = e.grpc_code();
            self.state
                .metrics
                .request("grpc", "embed_stream", format!("{code:?}"), Some(e.kind()));
            return Err(Status::new(code, e.to_string()));
        }
        // The caller's trace (W3C `traceparent`) holds the stream; each
        // message's span is a child of it.
        let stream = tracing::info_span!("stream", id = %id, rpc = "embed_stream");
        telemetry::continue_grpc(&stream, meta);
        let header = id.clone();
        let state = self.state.clone();
        let window = state.config.stream_window as usize;
        let answers = request
            .into_inner()
            .enumerate()
            .map(move |(n, message)| {
                let state = state.clone();
                let stream = stream.clone();
                let id = id.clone();
                async move {
                    match message {
                        Ok(r) => Ok(stream_message(state, stream, id, n as u64, r).await),
                        Err(status) => Err(status),
                    }
                }
            })
            .buffered(window);
        let mut response = Response::new(Box::pin(answers) as EmbedStream);
        if let Ok(v) = MetadataValue::try_from(header.as_str()) {
            response.metadata_mut().insert(HEADER, v);
        }
        Ok(response)
    }

    async fn embed(
        &self,
        request: Request<pb::EmbedRequest>,
    ) -> Result<Response<pb::EmbedResponse>, Status> {
        self.call("embed", request, |state, r, deadline| async move {
            let started = Instant::now();
            let out = embed_job(&state, r, Kind::Dense, deadline).await?;
            Ok(pb::EmbedResponse {
                rows: out.sequences as u32,
                dim: out.dim as u32,
                data: out.data().clone(),
                prompt_tokens: out.tokens,
                timing: timing(&out, started),
            })
        })
        .await
    }

    async fn embed_sparse(
        &self,
        request: Request<pb::EmbedRequest>,
    ) -> Result<Response<pb::EmbedSparseResponse>, Status> {
        self.call("embed_sparse", request, |state, r, deadline| async move {
            let started = Instant::now();
            let out = embed_job(&state, r, Kind::Sparse, deadline).await?;
            let embeddings = (0..out.sequences)
                .map(|i| {
                    let (ids, w) = out.sparse(i);
                    pb::SparseEmbedding {
                        indices: ids.to_vec(),
                        values: floats(w).collect(),
                    }
                })
                .collect();
            Ok(pb::EmbedSparseResponse {
                embeddings,
                prompt_tokens: out.tokens,
                timing: timing(&out, started),
            })
        })
        .await
    }

    async fn embed_all(
        &self,
        request: Request<pb::EmbedRequest>,
    ) -> Result<Response<pb::EmbedAllResponse>, Status> {
        self.call("embed_all", request, |state, r, deadline| async move {
            let started = Instant::now();
            let kind = pipeline::embed_all_kind(state.replicas.model().as_deref());
            let out = embed_job(&state, r, kind, deadline).await?;
            Ok(pb::EmbedAllResponse {
                row_counts: out.row_counts().to_vec(),
                dim: out.dim as u32,
                data: out.data().clone(),
                prompt_tokens: out.tokens,
                timing: timing(&out, started),
            })
        })
        .await
    }

    async fn rerank(
        &self,
        request: Request<pb::RerankRequest>,
    ) -> Result<Response<pb::RerankResponse>, Status> {
        self.call("rerank", request, |state, r, deadline| async move {
            let started = Instant::now();
            if r.texts.is_empty() {
                return Err(ApiError::Empty("`texts` must not be empty".into()));
            }
            let echo = r.return_text.then(|| r.texts.clone());
            let options = Options {
                truncate: r.truncate,
                direction: direction(r.truncation_direction),
                raw_scores: r.raw_scores,
                priority: priority(r.priority)?,
                ..Options::default()
            };
            let job = Job {
                kind: Kind::Score,
                field: "texts",
                inputs: Inputs::Pairs {
                    query: r.query,
                    texts: r.texts,
                },
                options,
            };
            let out = pipeline::run(&state, job, deadline).await?;
            let ranks = out
                .ranks(echo)?
                .into_iter()
                .map(|k| pb::Rank {
                    index: k.index as u32,
                    score: k.score,
                    text: k.text,
                })
                .collect();
            Ok(pb::RerankResponse {
                ranks,
                prompt_tokens: out.tokens,
                timing: timing(&out, started),
            })
        })
        .await
    }

    async fn predict(
        &self,
        request: Request<pb::PredictRequest>,
    ) -> Result<Response<pb::PredictResponse>, Status> {
        self.call("predict", request, |state, r, deadline| async move {
            let started = Instant::now();
            let options = Options {
                truncate: r.truncate,
                direction: direction(r.truncation_direction),
                raw_scores: r.raw_scores,
                priority: priority(r.priority)?,
                ..Options::default()
            };
            let inputs = predict_inputs(r.inputs)?;
            let (out, labelled) = predict::run(&state, inputs, options, deadline).await?;
            let results = labelled
                .into_iter()
                .map(|one| pb::Predictions {
                    predictions: one
                        .into_iter()
                        .map(|p| pb::Prediction {
                            label: p.label,
                            score: p.score,
                        })
                        .collect(),
                })
                .collect();
            Ok(pb::PredictResponse {
                results,
                prompt_tokens: out.tokens,
                timing: timing(&out, started),
            })
        })
        .await
    }

    async fn tokenize(
        &self,
        request: Request<pb::TokenizeRequest>,
    ) -> Result<Response<pb::TokenizeResponse>, Status> {
        self.call("tokenize", request, |state, r, deadline| async move {
            let job = TokenizeJob {
                inputs: r.inputs,
                add_special_tokens: r.add_special_tokens.unwrap_or(true),
                prompt_name: r.prompt_name,
            };
            let all = tokens::run(&state, job, deadline).await?;
            let results = all
                .into_iter()
                .map(|toks| pb::Tokens {
                    tokens: toks
                        .into_iter()
                        .map(|t| pb::Token {
                            id: t.id,
                            text: t.text,
                            special: t.special,
                            start: t.start,
                            stop: t.stop,
                        })
                        .collect(),
                })
                .collect();
            Ok(pb::TokenizeResponse { results })
        })
        .await
    }

    async fn info(
        &self,
        request: Request<pb::InfoRequest>,
    ) -> Result<Response<pb::InfoResponse>, Status> {
        self.call("info", request, |state, _, _| async move {
            let m = state.replicas.model().ok_or_else(|| no_replica(&state.replicas))?;
            let templates = state.templates();
            Ok(pb::InfoResponse {
                model_id: m.model_id.clone(),
                architecture: m.architecture.clone(),
                dimension: m.dimension,
                max_input_length: m.max_input_length,
                kinds: m
                    .kinds
                    .iter()
                    .filter_map(|&k| Kind::of(k))
                    .map(|k| k.name().to_string())
                    .collect(),
                max_inputs: state.config.max_inputs as u32,
                max_tokens_per_request: state.config.max_tokens_per_request as u64,
                prompt_names: templates.prompts.keys().cloned().collect(),
                default_prompt_name: templates.default_prompt_name.clone().unwrap_or_default(),
                version: env!("CARGO_PKG_VERSION").to_string(),
            })
        })
        .await
    }
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
