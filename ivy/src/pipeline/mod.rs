//! The request pipeline every front shares (OpenAI, Cohere, TEI, gRPC), a
//! file per stage: admit and deadline (`guarded`) → validate (`validate.rs`)
//! → template and tokenize (`prepare.rs` over `encode.rs`) → cut into chunks
//! (`chunk.rs`) → send each chunk to a replica, retrying elsewhere on
//! failure (`dispatch.rs`) → reassemble in input order (`output.rs`).
//! Fronts only parse their request into a `Job` and render the `Output`.
//! `predict.rs` (labels from scores) runs this pipeline; `tokens.rs`
//! (`/tokenize`, `/decode`) needs no replica and only shares admission.

mod blocking;
mod chunk;
mod dispatch;
mod encode;
mod image_fetch;
mod images;
mod late_chunk;
mod long_input;
mod output;
pub mod predict;
mod prepare;
pub mod quantize;
pub mod tokens;
mod validate;

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use ivy_tokenizer::Direction;
use proto::tulip::v1::{self as tulip, EmbedRequest};
use tracing::field::Empty;
use tracing::{Instrument, Span};

pub use self::output::{floats, Output};
pub use crate::config::LongInputs;
use crate::error::ApiError;
use crate::metrics::Stage;
use crate::request::id::RequestId;
use crate::state::AppState;
use crate::upstream::pools::Pool;

/// What the model should produce: the wire's output kinds, one enum for
/// Ivy and Tulip (`proto`), read with `Kind::of` and named by `Kind::name`.
pub use proto::tulip::v1::OutputKind as Kind;

/// What `/embed_all` (and gRPC `EmbedAll`) serve: the multi-vector head's
/// vectors when the model has one (ColBERT users keep them), else per-token
/// hidden states as TEI does for any model.
pub fn embed_all_kind(model: Option<&tulip::InfoResponse>) -> Kind {
    match model {
        Some(m) if m.kinds.contains(&(Kind::MultiVector as i32)) => Kind::MultiVector,
        _ => Kind::TokenStates,
    }
}

/// Which queue a request waits in on the replicas: interactive work runs
/// first; batch work (indexing) is delayed but never starved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    Interactive,
    Batch,
}

impl Priority {
    /// The metrics label.
    pub fn name(self) -> &'static str {
        match self {
            Self::Interactive => "interactive",
            Self::Batch => "batch",
        }
    }

    fn proto(self) -> tulip::Priority {
        match self {
            Self::Interactive => tulip::Priority::Interactive,
            Self::Batch => tulip::Priority::Batch,
        }
    }

    /// The request's own choice, else by size.
    fn of(asked: Option<Self>, tokens: usize, interactive_max_tokens: usize) -> Self {
        asked.unwrap_or(if tokens <= interactive_max_tokens {
            Self::Interactive
        } else {
            Self::Batch
        })
    }
}

/// The inputs of a request.
#[derive(Debug)]
pub enum Inputs {
    Texts(Vec<String>),
    /// Token ids the caller produced itself (no template, no tokenizer).
    Ids(Vec<Vec<u32>>),
    /// A query scored against each text.
    Pairs {
        query: String,
        texts: Vec<String>,
    },
    /// Text pairs, each its own (a classifier over sentence pairs).
    PairList(Vec<(String, String)>),
    /// Texts and images (at least one image), each its own vector in one
    /// space (an image model: `images.rs`).
    Items(Vec<Item>),
}

/// One input of a request that may hold images.
#[derive(Debug)]
pub enum Item {
    Text(String),
    /// An encoded image (JPEG, PNG, WebP, GIF), as the caller sent it.
    Image(bytes::Bytes),
    /// An image to fetch (`image_fetch.rs`: only from listed hosts).
    ImageUrl(String),
}

impl Inputs {
    pub fn len(&self) -> usize {
        match self {
            Self::Texts(t) => t.len(),
            Self::Ids(i) => i.len(),
            Self::Pairs { texts, .. } => texts.len(),
            Self::PairList(pairs) => pairs.len(),
            Self::Items(items) => items.len(),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Cut inputs longer than the model's maximum (true) or refuse them.
    pub truncate: bool,
    pub direction: Direction,
    /// Dense: Matryoshka truncation; `None` is the full dimension.
    pub dimensions: Option<u32>,
    /// Dense: `None` is the model's default.
    pub normalize: Option<bool>,
    /// A prompt template; `None` is the configured default.
    pub prompt_name: Option<String>,
    /// Score: raw logits instead of the activation.
    pub raw_scores: bool,
    /// `None`: decided by the request's size.
    pub priority: Option<Priority>,
    /// Dense: inputs longer than the model's window truncated (the
    /// default), or embedded in windows (`long_input.rs`).
    pub long_inputs: LongInputs,
    /// Dense: the inputs are one document's chunks, each pooled from one
    /// pass over the document (`late_chunk.rs`).
    pub late_chunking: bool,
}

pub struct Job {
    /// The model's pool (`Gateway::pool`): its tokenizer, templates and
    /// replicas serve the job.
    pub pool: Arc<Pool>,
    pub kind: Kind,
    pub inputs: Inputs,
    pub options: Options,
    /// The request field holding the inputs (`input` on the OpenAI routes,
    /// `inputs` on TEI's and gRPC, `texts`/`documents` for reranking):
    /// errors name it, so `inputs[3]` points at what the caller sent.
    pub field: &'static str,
}

/// Runs a job through every stage.
pub async fn run(state: &AppState, job: Job, deadline: Instant) -> Result<Output, ApiError> {
    guarded(state, deadline, stages(state, job)).await
}

/// Admission (429 over the limit, 503 while draining), the deadline (504)
/// and the total-time metric, around any pipeline.
pub async fn guarded<T>(
    state: &AppState,
    deadline: Instant,
    work: impl Future<Output = Result<T, ApiError>>,
) -> Result<T, ApiError> {
    let _permit = state.admission.admit()?;
    // Time held for a replica to start is not the request's own.
    let deadline = deadline + wait_for_replica(state).await?;
    let start = Instant::now();
    let result = match tokio::time::timeout_at(deadline.into(), work).await {
        Ok(r) => r,
        Err(_) => Err(ApiError::Timeout(format!(
            "the request did not finish within its deadline of {:.1}s; retry, or send fewer or shorter inputs",
            deadline.saturating_duration_since(start).as_secs_f64()
        ))),
    };
    state.metrics.stage(Stage::Total, start.elapsed());
    result
}

/// Holds a request while no replica is ready (`--cold-start-hold`); how
/// long it waited. A routable replica has answered its health check and
/// said which model it serves.
pub async fn wait_for_replica(state: &AppState) -> Result<std::time::Duration, ApiError> {
    crate::upstream::cold_start::hold(
        state.config.cold_start_hold,
        &state.metrics.held,
        || state.replicas.routable_count() > 0,
        || crate::upstream::no_replica(&state.replicas),
    )
    .await
}

/// The stages of a mixed request's texts (`images.rs`), type-erased: those
/// stages are what called it.
fn text_stages(
    state: &AppState,
    job: Job,
) -> std::pin::Pin<Box<dyn Future<Output = Result<Output, ApiError>> + Send + '_>> {
    Box::pin(stages(state, job))
}

async fn stages(state: &AppState, mut job: Job) -> Result<Output, ApiError> {
    let pool = Arc::clone(&job.pool);
    let model = pool.info().ok_or_else(|| pool.no_replica())?;
    // Windows are for dense text of a model without a fixed text length.
    if job.kind != Kind::Dense || model.text_pad_to > 0 {
        job.options.long_inputs = LongInputs::Truncate;
    }
    validate::job(&job, &model, &state.config)?;
    if matches!(job.inputs, Inputs::Items(_)) {
        return images::run(state, job, &model, text_stages).await;
    }
    if job.options.late_chunking {
        return late_chunk::run(state, job, &model).await;
    }

    let started = Instant::now();
    let templates = state.templates(&pool);
    // Counts as i64: the trace exporter writes unsigned values as strings.
    let span = tracing::debug_span!("tokenize", inputs = job.inputs.len() as i64, tokens = Empty);
    let job_ids = matches!(job.inputs, Inputs::Ids(_));
    let tokenized = prepare::tokenize(
        state,
        &pool,
        &model,
        &templates,
        job.inputs,
        &job.options,
        job.field,
    )
    .instrument(span.clone())
    .await?;
    // Long inputs: tokenized whole above, cut into windows here.
    let windowed = job.kind == Kind::Dense && job.options.long_inputs != LongInputs::Truncate;
    let (tokenized, windows) = if windowed {
        let frame = if job_ids {
            long_input::Frame::default()
        } else {
            long_input::Frame::of(state.tokenizer(&pool)?.as_ref())?
        };
        let max = prepare::max_input_length(
            state.config.max_input_length,
            templates.max_input_length,
            &model,
        );
        let (t, w) = long_input::split(tokenized, max, frame);
        // `windows` always answers in its own shape; `pool` only changes
        // anything when an input was split.
        let keep = job.options.long_inputs == LongInputs::Windows || w.split_any();
        (t, Some(w).filter(|_| keep))
    } else {
        (tokenized, None)
    };
    // SigLIP: every text padded to the length it was trained on.
    let tokenized = prepare::pad(tokenized, &model);
    let tokenize = started.elapsed();
    let tokens = tokenized.token_ids.len() as i64;
    span.record("tokens", tokens);
    // The front's request span.
    Span::current().record("tokens", tokens);
    state.metrics.stage(Stage::Tokenize, tokenize);
    // Pooled windows are normalized after the mean.
    let normalize = if windows.is_some() && job.options.long_inputs == LongInputs::Pool {
        Some(false)
    } else {
        job.options.normalize
    };
    let (mut out, priority) = infer(
        state,
        &pool,
        &model,
        &tokenized,
        job.kind,
        &job.options,
        normalize,
        job.field,
    )
    .await?;
    if let Some(w) = &windows {
        let normalize = job.options.normalize.unwrap_or(model.normalize_default);
        out = long_input::join(out, w, job.options.long_inputs, normalize);
    }
    out.timing.tokenize = tokenize;
    state.metrics.class(priority.name(), started.elapsed());
    state.metrics.tokens(out.tokens);
    Ok(out)
}

/// Tokenized sequences through the replicas: the per-request token limit,
/// chunks on the token budget, dispatch, and the replies merged in order.
#[allow(clippy::too_many_arguments)] // every one is the request's own
async fn infer(
    state: &AppState,
    pool: &Pool,
    model: &tulip::InfoResponse,
    tokenized: &encode::Tokenized,
    kind: Kind,
    options: &Options,
    normalize: Option<bool>,
    field: &'static str,
) -> Result<(Output, Priority), ApiError> {
    validate::tokens(
        tokenized.token_ids.len(),
        state.config.max_tokens_per_request,
        field,
    )?;
    let chunks = chunk::cut(
        &tokenized.lengths,
        state.config.chunk_tokens,
        model.max_request_sequences as usize,
    );
    let priority = Priority::of(
        options.priority,
        tokenized.token_ids.len(),
        state.config.interactive_max_tokens,
    );
    let template = EmbedRequest {
        token_ids: Vec::new(),
        lengths: Vec::new(),
        kind: kind as i32,
        normalize,
        dimensions: options.dimensions.unwrap_or(0),
        raw_scores: options.raw_scores,
        request_id: RequestId::current()
            .map(|r| r.to_string())
            .unwrap_or_default(),
        priority: priority.proto() as i32,
        adapter: crate::request::id::adapter(),
        ..EmbedRequest::default()
    };
    let sent = Instant::now();
    let replies = dispatch::send_all(state, pool, tokenized, &chunks, &template, priority).await?;
    state.metrics.stage(Stage::Dispatch, sent.elapsed());
    let out = Output::merge(kind, &chunks, replies)?;
    state.metrics.stage(Stage::Queue, out.timing.queue);
    state.metrics.stage(Stage::Inference, out.timing.inference);
    Ok((out, priority))
}

#[cfg(test)]
mod tests {
    use super::Priority;

    #[test]
    fn priority_is_the_requests_choice_else_its_size() {
        assert_eq!(Priority::of(None, 512, 512), Priority::Interactive);
        assert_eq!(Priority::of(None, 513, 512), Priority::Batch);
        assert_eq!(
            Priority::of(Some(Priority::Interactive), 10_000, 512),
            Priority::Interactive
        );
        assert_eq!(Priority::of(Some(Priority::Batch), 3, 512), Priority::Batch);
    }
}
