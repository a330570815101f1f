//! `ivy.v1.Ivy`: each call parsed into a pipeline job, run, and rendered;
//! request id, API key, deadline, metrics and error mapping around every
//! call (`IvyService::call`).

use std::future::Future;
use std::pin::Pin;
use std::time::Instant;

use futures_util::StreamExt;
use proto::ivy::v1 as pb;
use proto::ivy::v1::ivy_server::Ivy;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;

use super::convert::{client_deadline, predict_inputs, score_options, timing};
use super::embed::{embed_dense, embed_job, failed, stream_message};
use crate::error::ApiError;
use crate::pipeline::tokens::{self, TokenizeJob};
use crate::pipeline::{self, floats, predict, Inputs, Job, Kind};
use crate::request::id::{model_label, RequestId, HEADER};
use crate::state::AppState;
use crate::upstream::pools::Pool;

pub struct IvyService {
    state: AppState,
}

impl IvyService {
    pub fn new(state: AppState) -> Self {
        Self { state }
    }

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
        let (id, auth) = self.caller(&request);
        let meta = request.metadata();
        let deadline =
            client_deadline(meta).map_or(self.state.deadline(), |d| d.min(self.state.deadline()));
        let span = tracing::info_span!("request", id = %id, rpc = endpoint, tokens = tracing::field::Empty);
        telemetry::continue_grpc(&span, meta);
        let state = self.state.clone();
        let (result, model) = id
            .clone()
            .scope(async move {
                let result = match auth {
                    Ok(()) => f(state, request.into_inner(), deadline).await,
                    Err(e) => Err(e),
                };
                (result, model_label())
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
                    .request("grpc", endpoint, model, "OK".into(), None);
                let mut r = Response::new(resp);
                *r.metadata_mut() = meta;
                Ok(r)
            }
            Err(e) => {
                let (code, message) = failed(&self.state, endpoint, model, &e, &id, &span);
                Err(Status::with_metadata(code, message, meta))
            }
        }
    }

    /// The call's request id (the caller's `x-request-id` or a new one) and
    /// whether its API key is good.
    fn caller<T>(&self, request: &Request<T>) -> (RequestId, Result<(), ApiError>) {
        let meta = request.metadata();
        let id = RequestId::from_caller(meta.get(HEADER).map(|v| v.as_bytes()));
        let auth = self
            .state
            .api_key
            .check(meta.get("authorization").map(|v| v.as_bytes()));
        (id, auth.map(drop))
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
        let (id, auth) = self.caller(&request);
        if let Err(e) = auth {
            let (code, message) = failed(
                &self.state,
                "embed_stream",
                "none".into(),
                &e,
                &id,
                &tracing::Span::none(),
            );
            return Err(Status::new(code, message));
        }
        let meta = request.metadata();
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
            embed_dense(&state, r, deadline, started).await
        })
        .await
    }

    async fn embed_sparse(
        &self,
        request: Request<pb::EmbedRequest>,
    ) -> Result<Response<pb::EmbedSparseResponse>, Status> {
        self.call("embed_sparse", request, |state, r, deadline| async move {
            let started = Instant::now();
            let out = embed_job(&state, r, |_| Kind::Sparse, deadline).await?;
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
            let kind = |pool: &Pool| pipeline::embed_all_kind(pool.info().as_deref());
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
            let (pool, _) = state.pool(r.model.as_deref())?;
            if r.texts.is_empty() {
                return Err(ApiError::Empty("`texts` must not be empty".into()));
            }
            let echo = r.return_text.then(|| r.texts.clone());
            let options =
                score_options(r.truncate, r.truncation_direction, r.raw_scores, r.priority)?;
            let job = Job {
                pool,
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
            let options =
                score_options(r.truncate, r.truncation_direction, r.raw_scores, r.priority)?;
            let (pool, _) = state.pool(r.model.as_deref())?;
            let inputs = predict_inputs(r.inputs)?;
            let (out, labelled) = predict::run(&state, pool, inputs, options, deadline).await?;
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
            let (pool, _) = state.pool(r.model.as_deref())?;
            let job = TokenizeJob {
                inputs: r.inputs,
                add_special_tokens: r.add_special_tokens.unwrap_or(true),
                prompt_name: r.prompt_name,
            };
            let all = tokens::run(&state, &pool, job, deadline).await?;
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
        self.call("info", request, |state, r, _| async move {
            let (pool, _) = state.pool(r.model.as_deref())?;
            let m = pool.info().ok_or_else(|| pool.no_replica())?;
            let templates = state.templates(&pool);
            Ok(pb::InfoResponse {
                model_id: m.model_id.clone(),
                architecture: m.architecture.clone(),
                dimension: m.dimension,
                max_input_length: m.max_input_length,
                kinds: crate::model::kinds(&m)
                    .into_iter()
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
