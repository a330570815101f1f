//! Tulip's Prometheus metrics. Labels come from fixed enums or the step
//! modes the engine declared at start-up, never from request data.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::{
    EncodeLabelSet, EncodeLabelValue, EncodeMetric, LabelValueEncoder, MetricEncoder,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Metric, Registry};
use std::sync::atomic::AtomicU64;

use crate::backlog;
use crate::error::TulipError;
use crate::priority::Class;

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum Code {
    Ok,
    InvalidArgument,
    Unavailable,
    Internal,
    NotFound,
    FailedPrecondition,
}

impl EncodeLabelValue for Code {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        use std::fmt::Write;
        encoder.write_str(match self {
            Self::Ok => "ok",
            Self::InvalidArgument => "invalid_argument",
            Self::Unavailable => "unavailable",
            Self::Internal => "internal",
            Self::NotFound => "not_found",
            Self::FailedPrecondition => "failed_precondition",
        })
    }
}

impl EncodeLabelValue for Mode {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        use std::fmt::Write;
        encoder.write_str(self.0)
    }
}

impl Code {
    pub fn of(result: &Result<(), &TulipError>) -> Self {
        match result {
            Ok(()) => Self::Ok,
            Err(TulipError::InvalidArgument(_)) => Self::InvalidArgument,
            Err(TulipError::Unavailable(_)) => Self::Unavailable,
            Err(TulipError::Engine(_)) => Self::Internal,
            Err(TulipError::NotFound(_)) => Self::NotFound,
            Err(TulipError::Refused(_)) => Self::FailedPrecondition,
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabel {
    pub code: Code,
}

/// How a step ran: one of the labels the engine declared at start-up
/// (`ModelInfo::step_modes`: eager, a CUDA graph's warmup/capture/replay,
/// a CPU runtime's own), so the label set is bounded by the engine, never
/// by request data. Made once per declared label by [`Mode::declare`].
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Mode(&'static str);

/// The labels a CUDA graph capture reports, of text and of image steps
/// (counted as captures too).
const CAPTURES: [&str; 2] = ["capture", "image_capture"];
/// Most labels an engine may declare, and the longest one.
const MAX_MODES: usize = 16;
const MAX_MODE_LEN: usize = 32;

impl Mode {
    /// The engine's declared labels as modes, or why they cannot be
    /// metric labels. Each name is kept for the process's life (a handful
    /// of short strings, once).
    pub fn declare(names: &[String]) -> Result<Vec<Mode>, String> {
        if names.is_empty() || names.len() > MAX_MODES {
            return Err(format!(
                "the engine declares {} step modes (ModelInfo.step_modes); 1 to {MAX_MODES} are served",
                names.len()
            ));
        }
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let ok = !name.is_empty()
                && name.len() <= MAX_MODE_LEN
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
            if !ok {
                return Err(format!(
                    "step mode {name:?} is not a metric label (1 to {MAX_MODE_LEN} of a-z, 0-9, _)"
                ));
            }
            if out.iter().any(|m: &Mode| m.0 == name) {
                return Err(format!("step mode {name:?} is declared twice"));
            }
            out.push(Mode(Box::leak(name.clone().into_boxed_str())));
        }
        Ok(out)
    }

    /// The declared mode named `name`, if there is one.
    pub fn find(declared: &[Mode], name: &str) -> Option<Mode> {
        declared.iter().copied().find(|m| m.0 == name)
    }

    pub fn as_str(self) -> &'static str {
        self.0
    }

    pub fn is_capture(self) -> bool {
        CAPTURES.contains(&self.0)
    }
}

impl EncodeLabelValue for Class {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        use std::fmt::Write;
        encoder.write_str(self.as_str())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassLabel {
    pub class: Class,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModeLabel {
    pub mode: Mode,
}

/// Where a CPU runtime's token bucket stands (rose/cpu/gated.py's `State`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum BucketState {
    /// Not reached yet.
    Cold,
    /// Being built and gated in the background.
    Pending,
    /// Its steps run on the runtime.
    Ready,
    /// Refused by the gate, or the runtime cannot be built: float32 for good.
    Failed,
}

impl BucketState {
    /// In declaration order: `state as usize` indexes `CpuBuckets::counts`.
    pub const ALL: [Self; 4] = [Self::Cold, Self::Pending, Self::Ready, Self::Failed];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cold => "cold",
            Self::Pending => "pending",
            Self::Ready => "ready",
            Self::Failed => "failed",
        }
    }
}

impl EncodeLabelValue for BucketState {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        use std::fmt::Write;
        encoder.write_str(self.as_str())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BucketLabel {
    pub runtime: Mode,
    pub state: BucketState,
}

/// One CPU runtime's token buckets by state (`engine.cpu_readiness()`),
/// the runtime named by its declared step mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuBuckets {
    pub runtime: Mode,
    /// Counts in `BucketState::ALL`'s order.
    pub counts: [u32; 4],
}

impl CpuBuckets {
    pub fn count(&self, state: BucketState) -> u32 {
        self.counts[state as usize]
    }
}

pub struct Metrics {
    registry: Registry,
    pub requests: Family<CodeLabel, Counter>,
    pub request_seconds: Histogram,
    pub queue_seconds: Histogram,
    pub inference_seconds: Histogram,
    pub step_seconds: Histogram,
    pub batch_tokens: Histogram,
    pub batch_sequences: Histogram,
    pub tokens: Counter,
    pub padded_tokens: Counter,
    pub steps: Family<ModeLabel, Counter>,
    pub inline_steps: Counter,
    pub graphs_captured: Gauge,
    pub capture_seconds: Histogram,
    pub inflight_steps: Gauge,
    pub queued_sequences: Gauge,
    pub active_requests: Gauge,
    pub frames_connections: Gauge,
    pub draining: Gauge,
    pub class_queue_seconds: Family<ClassLabel, Histogram>,
    pub class_inference_seconds: Family<ClassLabel, Histogram>,
    pub class_request_seconds: Family<ClassLabel, Histogram>,
    pub class_steps: Family<ClassLabel, Counter>,
    pub class_tokens: Family<ClassLabel, Counter>,
    pub class_waiting_tokens: Family<ClassLabel, Gauge>,
    pub class_inflight_tokens: Family<ClassLabel, Gauge>,
    pub class_backlog_seconds: Family<ClassLabel, Gauge<f64, AtomicU64>>,
    pub capacity_tokens_per_second: Gauge<f64, AtomicU64>,
    pub cpu_buckets: Family<BucketLabel, Gauge>,
}

/// A metric of any type behind one box, so that `Metrics::new` registers
/// its table in a loop (`Registry::register` takes one concrete type per
/// call, and `Box<dyn Metric>` is not itself a `Metric`).
#[derive(Debug)]
struct Registered(Box<dyn Metric>);

impl EncodeMetric for Registered {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        self.0.metric_type()
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

fn latency() -> Histogram {
    // 50 µs .. ~26 s
    Histogram::new(exponential_buckets(50e-6, 2.0, 20))
}

fn sizes() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 17))
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        let mut r = Registry::default();
        let m = Self {
            requests: Family::default(),
            request_seconds: latency(),
            queue_seconds: latency(),
            inference_seconds: latency(),
            step_seconds: latency(),
            batch_tokens: sizes(),
            batch_sequences: sizes(),
            tokens: Counter::default(),
            padded_tokens: Counter::default(),
            steps: Family::default(),
            inline_steps: Counter::default(),
            graphs_captured: Gauge::default(),
            capture_seconds: Histogram::new(exponential_buckets(1e-3, 2.0, 16)),
            inflight_steps: Gauge::default(),
            queued_sequences: Gauge::default(),
            active_requests: Gauge::default(),
            frames_connections: Gauge::default(),
            draining: Gauge::default(),
            class_queue_seconds: Family::new_with_constructor(latency),
            class_inference_seconds: Family::new_with_constructor(latency),
            class_request_seconds: Family::new_with_constructor(latency),
            class_steps: Family::default(),
            class_tokens: Family::default(),
            class_waiting_tokens: Family::default(),
            class_inflight_tokens: Family::default(),
            class_backlog_seconds: Family::default(),
            capacity_tokens_per_second: Gauge::default(),
            cpu_buckets: Family::default(),
            registry: Registry::default(),
        };
        // Name, help and metric (its kind and labels come from its type),
        // in exposition order; one row a metric, so rustfmt leaves it be.
        #[rustfmt::skip]
        let table: [(&str, &str, Box<dyn Metric>); 28] = [
            ("tulip_requests", "Embed requests by gRPC status", Box::new(m.requests.clone())),
            ("tulip_request_duration_seconds", "Embed request time in Tulip", Box::new(m.request_seconds.clone())),
            ("tulip_queue_duration_seconds", "Time from arrival until a request's last sequence was batched", Box::new(m.queue_seconds.clone())),
            ("tulip_inference_duration_seconds", "Time from a request's first launch until its last row was on the host", Box::new(m.inference_seconds.clone())),
            ("tulip_step_duration_seconds", "Engine step time, launch to rows on the host", Box::new(m.step_seconds.clone())),
            ("tulip_batch_tokens", "Real tokens per engine step", Box::new(m.batch_tokens.clone())),
            ("tulip_batch_sequences", "Sequences per engine step", Box::new(m.batch_sequences.clone())),
            ("tulip_tokens", "Real tokens processed", Box::new(m.tokens.clone())),
            ("tulip_padded_tokens", "Filler tokens computed to reach a graph bucket", Box::new(m.padded_tokens.clone())),
            ("tulip_steps", "Engine steps by how they ran (the engine's step modes: eager, warmup, capture, replay, onnx, bf16)", Box::new(m.steps.clone())),
            ("tulip_inline_steps", "Engine steps run by the request's own task because the engine was idle", Box::new(m.inline_steps.clone())),
            ("tulip_graphs_captured", "CUDA graphs captured", Box::new(m.graphs_captured.clone())),
            ("tulip_graph_capture_duration_seconds", "Time to capture one CUDA graph", Box::new(m.capture_seconds.clone())),
            ("tulip_inflight_steps", "Engine steps launched and not yet completed", Box::new(m.inflight_steps.clone())),
            ("tulip_queued_sequences", "Sequences waiting for a batch", Box::new(m.queued_sequences.clone())),
            ("tulip_active_requests", "Embed requests being answered", Box::new(m.active_requests.clone())),
            ("tulip_frames_connections", "Open Tulip frames connections on the Unix socket (co-located gateways)", Box::new(m.frames_connections.clone())),
            ("tulip_draining", "1 while the server drains before stopping", Box::new(m.draining.clone())),
            ("tulip_class_queue_duration_seconds", "Time from arrival until an answered request's last sequence was in a launched step (waiting for a step), by priority class", Box::new(m.class_queue_seconds.clone())),
            ("tulip_class_inference_duration_seconds", "Time from an answered request's first launch until its last row was on the host (on the device, behind the steps launched before it included), by priority class", Box::new(m.class_inference_seconds.clone())),
            ("tulip_class_request_duration_seconds", "Time in Tulip of an answered request, arrival to answer, by priority class", Box::new(m.class_request_seconds.clone())),
            ("tulip_class_steps", "Engine steps carrying sequences of each priority class", Box::new(m.class_steps.clone())),
            ("tulip_class_tokens", "Real tokens processed by priority class", Box::new(m.class_tokens.clone())),
            ("tulip_class_waiting_tokens", "Tokens queued for a step, by priority class", Box::new(m.class_waiting_tokens.clone())),
            ("tulip_class_inflight_tokens", "Tokens in launched steps not yet completed, by priority class", Box::new(m.class_inflight_tokens.clone())),
            ("tulip_capacity_tokens_per_second", "Measured capacity: tokens finished per second of busy engine time (moving average)", Box::new(m.capacity_tokens_per_second.clone())),
            ("tulip_class_backlog_seconds", "Outstanding tokens (waiting + in flight) / capacity, by priority class: seconds of work held", Box::new(m.class_backlog_seconds.clone())),
            ("tulip_cpu_fast_path_buckets", "Token buckets of the CPU's gated runtimes (the step modes onnx, onnx_int8, bf16) by state: cold (not reached), pending (building and gating), ready (steps run on it), failed (refused by the gate or not buildable)", Box::new(m.cpu_buckets.clone())),
        ];
        for (name, help, metric) in table {
            r.register(name, help, Registered(metric));
        }
        Arc::new(Self { registry: r, ..m })
    }

    /// Every step mode the engine declared gets its series now (at 0), so
    /// a dashboard sees the modes a replica can report before it reports them.
    pub fn declare_modes(&self, modes: &[Mode]) {
        for &mode in modes {
            let _ = self.steps.get_or_create(&ModeLabel { mode });
        }
    }

    pub fn observe_request(&self, code: Code, total: Duration) {
        self.requests.get_or_create(&CodeLabel { code }).inc();
        self.request_seconds.observe(total.as_secs_f64());
    }

    /// The autoscaling gauges from the pool's state, read at scrape time;
    /// both classes always have a series, so a sum never lacks one.
    pub fn set_backlog(&self, b: &backlog::Snapshot) {
        use crate::priority::Class;
        for class in [Class::Interactive, Class::Batch] {
            let i = backlog::index(class);
            let label = ClassLabel { class };
            self.class_waiting_tokens
                .get_or_create(&label)
                .set(b.waiting[i] as i64);
            self.class_inflight_tokens
                .get_or_create(&label)
                .set(b.inflight[i] as i64);
            self.class_backlog_seconds
                .get_or_create(&label)
                .set(b.seconds(class));
        }
        self.capacity_tokens_per_second.set(b.capacity);
    }

    /// The CPU runtimes' buckets, read at scrape time; every state of a
    /// runtime has a series, so a ratio never lacks one.
    pub fn set_cpu_buckets(&self, runtimes: &[CpuBuckets]) {
        for r in runtimes {
            for (state, count) in BucketState::ALL.into_iter().zip(r.counts) {
                let label = BucketLabel {
                    runtime: r.runtime,
                    state,
                };
                self.cpu_buckets.get_or_create(&label).set(i64::from(count));
            }
        }
    }

    /// Prometheus text exposition (OpenMetrics).
    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::error!(error = %e, "encoding metrics failed");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_registered_metrics() {
        let m = Metrics::new();
        m.observe_request(Code::InvalidArgument, Duration::from_millis(2));
        let modes = Mode::declare(&["replay".into(), "bf16".into()]).unwrap();
        for mode in modes {
            m.steps.get_or_create(&ModeLabel { mode }).inc();
        }
        let text = m.render();
        assert!(
            text.contains("tulip_requests_total{code=\"invalid_argument\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("tulip_steps_total{mode=\"replay\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("tulip_steps_total{mode=\"bf16\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("tulip_request_duration_seconds_count 1"),
            "{text}"
        );
    }

    #[test]
    fn cpu_buckets_have_every_state() {
        let m = Metrics::new();
        let modes = Mode::declare(&["onnx".into(), "eager".into()]).unwrap();
        m.set_cpu_buckets(&[CpuBuckets {
            runtime: modes[0],
            counts: [1, 0, 4, 0],
        }]);
        let text = m.render();
        for (state, n) in [("cold", 1), ("pending", 0), ("ready", 4), ("failed", 0)] {
            let line =
                format!("tulip_cpu_fast_path_buckets{{runtime=\"onnx\",state=\"{state}\"}} {n}");
            assert!(text.contains(&line), "{text}");
        }
    }

    #[test]
    fn step_modes_are_declared_once_and_bounded() {
        let modes = Mode::declare(&["eager".into(), "onnx".into()]).unwrap();
        assert_eq!(Mode::find(&modes, "onnx").map(Mode::as_str), Some("onnx"));
        assert_eq!(Mode::find(&modes, "replay"), None);
        assert!(!modes[0].is_capture());
        for bad in [
            vec![],
            vec!["Eager".to_string()],
            vec!["a b".to_string()],
            vec!["eager".to_string(), "eager".to_string()],
            vec!["x".repeat(33)],
        ] {
            assert!(Mode::declare(&bad).is_err(), "{bad:?}");
        }
    }
}
