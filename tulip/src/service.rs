//! The `tulip.v1.Tulip` gRPC service: validate, add to the pool, await rows.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use prometheus_client::metrics::gauge::Gauge;
use proto::tulip::v1::tulip_server::Tulip;
use proto::tulip::v1::{
    Adapter, CpuRuntime, EmbedRequest, EmbedResponse, InfoRequest, InfoResponse,
    LoadAdapterRequest, UnloadAdapterRequest, UnloadAdapterResponse,
};
use tokio::sync::oneshot;
use tonic::{Request, Response, Status};

use tracing::Instrument;

use crate::adapters::Adapters;
use crate::engine::EngineHandle;
use crate::error::TulipError;
use crate::metrics::{BucketState, ClassLabel, Code, CpuBuckets, Metrics};
use crate::model::ModelInfo;
use crate::priority::Class;
use crate::queue::{Pool, Submitted};
use crate::scheduler::{self, Delivery};
use crate::validate::{validate, Limits};

pub struct TulipService {
    pub pool: Arc<Pool>,
    /// For inline steps; the scheduler thread holds the other reference.
    pub engine: Arc<EngineHandle>,
    pub model: Arc<ModelInfo>,
    pub limits: Limits,
    pub state: Arc<ServiceState>,
    pub metrics: Arc<Metrics>,
    /// Tulip frames are served on the Unix socket (said in `Info`).
    pub unix_frames: bool,
    pub adapters: Arc<Adapters>,
}

/// Shared with the shutdown path: whether new work is refused, and how many
/// requests are still being answered.
#[derive(Default)]
pub struct ServiceState {
    pub draining: AtomicBool,
    pub active: AtomicUsize,
}

/// Counts a request as active (and shows the count) until dropped, however
/// its call ends: answered, failed, or cancelled by its caller.
struct ActiveGuard<'a>(&'a AtomicUsize, &'a Gauge);

// The gauge moves by its own atomic inc/dec: setting it to the count read a
// moment earlier could let a late `set` from one thread overwrite a newer
// value from another and leave it wrong for good.
impl<'a> ActiveGuard<'a> {
    fn enter(count: &'a AtomicUsize, gauge: &'a Gauge) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        gauge.inc();
        Self(count, gauge)
    }
}

impl Drop for ActiveGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
        self.1.dec();
    }
}

impl TulipService {
    /// Whether this is the only request in Tulip. Requests that arrived in
    /// the same read as this one may not have started yet: yielding once
    /// lets them start (and count themselves) before deciding.
    async fn alone(&self) -> bool {
        if self.state.active.load(Ordering::SeqCst) != 1 {
            return false;
        }
        tokio::task::yield_now().await;
        self.state.active.load(Ordering::SeqCst) == 1
    }

    /// The answer, and when the request entered the queue (for its spans).
    async fn run(&self, request: EmbedRequest) -> Result<(EmbedResponse, Instant), TulipError> {
        if self.state.draining.load(Ordering::SeqCst) {
            return Err(TulipError::Unavailable(
                "server is draining; retry on another replica".into(),
            ));
        }
        let (tx, rx) = oneshot::channel();
        let req =
            validate(request, &self.model, &self.limits, &self.adapters, tx).map_err(|(e, _)| e)?;
        let arrived = req.arrived;
        // Under concurrent load requests queue, so that they share steps.
        let alone = self.pool.inline_candidate(&req) && self.alone().await;
        if let Submitted::Inline(seqs, releases) = self.pool.submit(Arc::new(req), alone)? {
            // Alone and the engine idle: run the step on this thread, which
            // saves the two thread wake-ups of a hand-off to the scheduler
            // thread and back. It holds this I/O thread for one small step;
            // the reply is sent before this returns, so the await below
            // never parks.
            self.metrics.inline_steps.inc();
            scheduler::launch(
                &self.pool,
                &self.engine,
                Delivery::Here,
                &self.metrics,
                seqs,
                releases,
            );
        }
        let answer = rx.await.unwrap_or_else(|_| {
            Err(TulipError::Unavailable(
                "request was dropped while the server stopped".into(),
            ))
        });
        answer.map(|resp| (resp, arrived))
    }

    /// One `Embed` call, whichever transport carried it: `parent` links its
    /// span to the caller's trace. Counts it as active, logs and records it.
    pub async fn answer(
        &self,
        request: EmbedRequest,
        parent: impl FnOnce(&tracing::Span),
    ) -> Result<EmbedResponse, TulipError> {
        let started = Instant::now();
        let _active = ActiveGuard::enter(&self.state.active, &self.metrics.active_requests);
        // Disabled (a no-op) unless traces are exported or the log is at DEBUG.
        let span = tracing::debug_span!(
            "embed",
            request_id = %request.request_id,
            // i64: the trace exporter writes unsigned values as strings.
            tokens = request.token_ids.len() as i64,
            sequences = request.lengths.len() as i64,
        );
        parent(&span);
        let request_id = request.request_id.clone();
        let class = Class::from_proto(request.priority);
        let result = self.run(request).instrument(span.clone()).await;
        if let Ok((resp, arrived)) = &result {
            record_phases(&span, resp, *arrived, class);
        }
        let result = result.map(|(resp, _)| resp);
        match &result {
            Err(TulipError::Engine(e)) => {
                tracing::error!(request_id = %request_id, error = %e, "request failed")
            }
            Err(e) => tracing::debug!(request_id = %request_id, error = %e, "request refused"),
            Ok(_) => {}
        }
        let m = &self.metrics;
        let took = started.elapsed();
        m.observe_request(Code::of(&result.as_ref().map(|_| ())), took);
        if let Ok(resp) = &result {
            if let Some(t) = &resp.timing {
                m.queue_seconds.observe(t.queue_us as f64 * 1e-6);
                m.inference_seconds.observe(t.inference_us as f64 * 1e-6);
                if let Some(class) = class {
                    let label = ClassLabel { class };
                    for (family, seconds) in [
                        (&m.class_queue_seconds, t.queue_us as f64 * 1e-6),
                        (&m.class_inference_seconds, t.inference_us as f64 * 1e-6),
                        (&m.class_request_seconds, took.as_secs_f64()),
                    ] {
                        family.get_or_create(&label).observe(seconds);
                    }
                }
            }
        }
        result
    }
}

#[tonic::async_trait]
impl Tulip for TulipService {
    async fn embed(
        &self,
        request: Request<EmbedRequest>,
    ) -> Result<Response<EmbedResponse>, Status> {
        let (metadata, _, request) = request.into_parts();
        self.answer(request, |span| telemetry::continue_grpc(span, &metadata))
            .await
            .map(Response::new)
            .map_err(Status::from)
    }

    async fn info(&self, _request: Request<InfoRequest>) -> Result<Response<InfoResponse>, Status> {
        let m = &self.model;
        let cpu_runtimes = self.engine.cpu_readiness_off_reactor().await;
        Ok(Response::new(InfoResponse {
            model_id: m.model_id.clone(),
            architecture: m.architecture.clone(),
            dimension: m.dimension,
            max_input_length: m.max_input_length,
            vocab_size: m.vocab_size,
            pooling: m.pooling.clone(),
            normalize_default: m.normalize_default,
            kinds: m.wire_kinds().into_iter().map(|k| k as i32).collect(),
            multi_vector_dimension: m.multi_vector_dimension,
            token_states_dimension: m.token_states_dimension,
            unix_frames: self.unix_frames,
            dtype: m.dtype.clone(),
            device: m.device.clone(),
            max_request_sequences: self.limits.max_request_sequences as u32,
            max_batch_tokens: self.pool.max_batch_tokens as u32,
            max_batch_sequences: self.pool.max_batch_sequences as u32,
            tokenizer_json: m.tokenizer_json.clone(),
            tokenizer_sha256: m.tokenizer_sha256.clone(),
            prompts: m.prompts.clone(),
            default_prompt_name: m.default_prompt_name.clone(),
            labels: m.labels.clone(),
            pair_template: m.pair_template.clone(),
            span_pooling: m.span_pooling.clone(),
            adapters: self.adapters.list(),
            max_adapters: self.adapters.max,
            max_adapter_rank: self.adapters.max_rank,
            cpu_runtimes: cpu_runtimes.iter().map(cpu_runtime).collect(),
            image_height: m.images.height,
            image_width: m.images.width,
            image_tokens: m.images.tokens,
            preprocessor_config: m.images.preprocessor_config.clone(),
            text_pad_to: m.images.text_pad_to,
            pad_token_id: m.images.pad_token_id,
        }))
    }

    async fn load_adapter(
        &self,
        request: Request<LoadAdapterRequest>,
    ) -> Result<Response<Adapter>, Status> {
        let r = request.into_inner();
        self.adapters
            .load(&self.engine, &r.name, &r.path)
            .await
            .map(Response::new)
            .map_err(Status::from)
    }

    async fn unload_adapter(
        &self,
        request: Request<UnloadAdapterRequest>,
    ) -> Result<Response<UnloadAdapterResponse>, Status> {
        let r = request.into_inner();
        self.adapters
            .unload(&self.engine, &r.name)
            .await
            .map(|()| Response::new(UnloadAdapterResponse {}))
            .map_err(Status::from)
    }
}

/// One CPU runtime's buckets as `Info` carries them.
fn cpu_runtime(r: &CpuBuckets) -> CpuRuntime {
    CpuRuntime {
        name: r.runtime.as_str().to_string(),
        cold: r.count(BucketState::Cold),
        pending: r.count(BucketState::Pending),
        ready: r.count(BucketState::Ready),
        failed: r.count(BucketState::Failed),
    }
}

/// A request's phases as spans under its `embed` span, when traces are
/// exported. They happen on the scheduler and completion threads, and one
/// engine step serves several requests, so rather than a span per step
/// shared by many traces, each request gets its own spans, recorded here
/// after its answer with the times its `Timing` measured (all from its
/// arrival in the queue):
/// - `queue_wait`: arrival → its last sequence scheduled;
/// - `engine_step`: the launch of the first step holding its sequences →
///   the rows of its last sequence delivered (one span even when its
///   sequences were spread over several steps);
/// - `completion`: rows delivered → the answer back on this I/O thread.
fn record_phases(
    span: &tracing::Span,
    resp: &EmbedResponse,
    arrived: Instant,
    class: Option<Class>,
) {
    if !telemetry::enabled() {
        return;
    }
    let Some(t) = &resp.timing else { return };
    let (now, wall) = (Instant::now(), SystemTime::now());
    let at = |i: Instant| wall - now.saturating_duration_since(i);
    let us = Duration::from_micros;
    let scheduled = arrived + us(t.queue_us);
    let delivered = arrived + us(t.total_us);
    let launched = delivered.checked_sub(us(t.inference_us)).unwrap_or(arrived);
    let class = class.map_or("unknown", Class::as_str);
    use telemetry::{record_child, KeyValue};
    record_child(
        span,
        "queue_wait",
        at(arrived),
        at(scheduled),
        vec![KeyValue::new("priority", class)],
    );
    record_child(
        span,
        "engine_step",
        at(launched),
        at(delivered),
        vec![KeyValue::new("tokens", resp.tokens as i64)],
    );
    record_child(span, "completion", at(delivered), at(now), Vec::new());
}
