//! Prometheus metrics. Every label comes from a bounded set: API family,
//! endpoint, status code, error kind, stage, model (a pool's name: one per
//! model a replica served, never request text) and the replica URLs Ivy
//! routes to now (replicas that went away disappear from the next scrape).

use std::fmt::Write as _;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

pub use prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Pipeline stages with a duration histogram.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stage {
    /// Templates and tokenization, in Ivy.
    Tokenize,
    /// Waiting in a Tulip replica's queue (as the replica reports it).
    Queue,
    /// The model's forward pass (as the replica reports it).
    Inference,
    /// All chunks' round trips to the replicas, retries included.
    Dispatch,
    /// Admission to response, in Ivy.
    Total,
}

impl Stage {
    fn label(self) -> &'static str {
        match self {
            Self::Tokenize => "tokenize",
            Self::Queue => "queue",
            Self::Inference => "inference",
            Self::Dispatch => "dispatch",
            Self::Total => "total",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RequestLabels {
    api: &'static str,
    endpoint: &'static str,
    status: String,
    error: &'static str,
    model: std::sync::Arc<str>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StageLabels {
    stage: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ClassLabels {
    class: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    stages: Family<StageLabels, Histogram>,
    classes: Family<ClassLabels, Histogram>,
    tokens: Counter,
    chunks: Counter,
    retries: Counter,
    shared_calls: Counter,
    shared_chunks: Counter,
    config_reloads: Family<ResultLabels, Counter>,
    in_flight: Gauge,
    /// Requests held for a replica to start (`upstream::cold_start`).
    pub held: Gauge,
    batch_pending: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "ivy_requests",
            "Requests answered, by API, endpoint, status, error kind and model",
            requests.clone(),
        );
        let stages = Family::<StageLabels, Histogram>::new_with_constructor(|| {
            // 0.25 ms .. ~65 s
            Histogram::new(exponential_buckets(0.000_25, 2.0, 19))
        });
        registry.register(
            "ivy_stage_duration_seconds",
            "Time per request in each pipeline stage",
            stages.clone(),
        );
        let classes = Family::<ClassLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.000_25, 2.0, 19))
        });
        registry.register(
            "ivy_class_request_duration_seconds",
            "Time per answered request from tokenizing to its reassembled rows, by priority class",
            classes.clone(),
        );
        let tokens = Counter::default();
        registry.register(
            "ivy_tokens",
            "Tokens sent to replicas (templates included)",
            tokens.clone(),
        );
        let chunks = Counter::default();
        registry.register(
            "ivy_chunks",
            "Chunks sent to replicas (first attempts)",
            chunks.clone(),
        );
        let retries = Counter::default();
        registry.register(
            "ivy_retries",
            "Chunk attempts repeated on another replica after a failure",
            retries.clone(),
        );
        let shared_calls = Counter::default();
        registry.register(
            "ivy_shared_calls",
            "Tulip calls that carried several chunks (coalescing)",
            shared_calls.clone(),
        );
        let shared_chunks = Counter::default();
        registry.register(
            "ivy_shared_call_chunks",
            "Chunks that travelled in a shared call",
            shared_chunks.clone(),
        );
        let config_reloads = Family::<ResultLabels, Counter>::default();
        registry.register(
            "ivy_config_reloads",
            "Templates file reloads, accepted or refused",
            config_reloads.clone(),
        );
        let in_flight = Gauge::default();
        registry.register(
            "ivy_requests_in_flight",
            "Requests being processed now",
            in_flight.clone(),
        );
        let held = Gauge::default();
        registry.register(
            "ivy_held_requests",
            "Requests held while no replica is ready (--cold-start-hold)",
            held.clone(),
        );
        let batch_pending = Gauge::default();
        registry.register(
            "ivy_batch_pending_requests",
            "Batch API requests accepted and not yet run, over every batch in the store (the same on every Ivy that shares it)",
            batch_pending.clone(),
        );
        Self {
            registry,
            held,
            batch_pending,
            requests,
            stages,
            classes,
            tokens,
            chunks,
            retries,
            shared_calls,
            shared_chunks,
            config_reloads,
            in_flight,
        }
    }

    /// The Batch API's backlog, as the store counts it now.
    pub fn batch_pending(&self, n: i64) {
        self.batch_pending.set(n);
    }

    /// One answered request. `status` is the HTTP status or gRPC code name;
    /// `model` the pool that served it (`none` before one was chosen).
    pub fn request(
        &self,
        api: &'static str,
        endpoint: &'static str,
        model: std::sync::Arc<str>,
        status: String,
        error: Option<&'static str>,
    ) {
        let labels = RequestLabels {
            api,
            endpoint,
            status,
            error: error.unwrap_or("none"),
            model,
        };
        self.requests.get_or_create(&labels).inc();
    }

    pub fn stage(&self, stage: Stage, d: Duration) {
        self.stages
            .get_or_create(&StageLabels {
                stage: stage.label(),
            })
            .observe(d.as_secs_f64());
    }

    /// One answered request's time in the pipeline, by its priority class
    /// (`interactive` or `batch`): what isolation promises, seen live.
    pub fn class(&self, class: &'static str, d: Duration) {
        self.classes
            .get_or_create(&ClassLabels { class })
            .observe(d.as_secs_f64());
    }

    pub fn tokens(&self, n: u64) {
        self.tokens.inc_by(n);
    }

    pub fn chunk(&self) {
        self.chunks.inc();
    }

    pub fn retry(&self) {
        self.retries.inc();
    }

    /// One Tulip call carrying `chunks` chunks.
    pub fn shared_call(&self, chunks: usize) {
        self.shared_calls.inc();
        self.shared_chunks.inc_by(chunks as u64);
    }

    pub fn config_reload(&self, accepted: bool) {
        let result = if accepted { "accepted" } else { "refused" };
        self.config_reloads
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// The Prometheus text exposition, with the replicas' state as of now.
    pub fn render(&self, replicas: Vec<ReplicaSample>, in_flight: usize) -> String {
        self.in_flight.set(in_flight as i64);
        let mut out = String::with_capacity(8192);
        let mut per_replica = Registry::default();
        per_replica.register_collector(Box::new(ReplicaCollector(replicas)));
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry);
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &per_replica);
        if !out.ends_with('\n') {
            let _ = writeln!(out);
        }
        out
    }
}

/// One replica's state at scrape time: plain values, so that metrics need
/// not know what a replica is (`Replica::sample` takes them).
#[derive(Debug, Clone)]
pub struct ReplicaSample {
    pub url: String,
    /// The model pool it joined (empty before it said what it serves).
    pub model: String,
    /// Takes new work (healthy).
    pub up: bool,
    /// Refused: serves another model or tokenizer than the others.
    pub mismatch: bool,
    pub inflight_tokens: u64,
    pub tokens: u64,
    pub chunks: u64,
    pub failures: u64,
}

/// A per-replica series: name, help, and how to read it.
type Series<T> = (&'static str, &'static str, fn(&ReplicaSample) -> T);

/// Per-replica series, read from the replicas at scrape time.
#[derive(Debug)]
struct ReplicaCollector(Vec<ReplicaSample>);

impl Collector for ReplicaCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let gauges: [Series<i64>; 3] = [
            (
                "ivy_replica_up",
                "1 if the replica takes new work (healthy), 0 if not",
                |r| r.up as i64,
            ),
            (
                "ivy_replica_mismatch",
                "1 if the replica is refused: it serves another model or tokenizer than the others",
                |r| r.mismatch as i64,
            ),
            (
                "ivy_replica_inflight_tokens",
                "Tokens this Ivy has in flight on the replica",
                |r| r.inflight_tokens as i64,
            ),
        ];
        for (name, help, value) in gauges {
            let mut family =
                encoder.encode_descriptor(name, help, None, ConstGauge::new(0i64).metric_type())?;
            for r in &self.0 {
                let labels = [("replica", r.url.as_str()), ("model", r.model.as_str())];
                ConstGauge::new(value(r)).encode(family.encode_family(&labels)?)?;
            }
        }
        let counters: [Series<u64>; 3] = [
            (
                "ivy_replica_tokens",
                "Tokens completed on the replica",
                |r| r.tokens,
            ),
            (
                "ivy_replica_chunks",
                "Chunks completed on the replica",
                |r| r.chunks,
            ),
            (
                "ivy_replica_failures",
                "Chunk attempts that failed on the replica",
                |r| r.failures,
            ),
        ];
        for (name, help, value) in counters {
            let mut family = encoder.encode_descriptor(
                name,
                help,
                None,
                ConstCounter::new(0u64).metric_type(),
            )?;
            for r in &self.0 {
                let labels = [("replica", r.url.as_str()), ("model", r.model.as_str())];
                ConstCounter::new(value(r)).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::replica::Replica;

    #[tokio::test]
    async fn renders_request_and_replica_series() {
        let m = Metrics::new();
        m.request("openai", "embeddings", "none".into(), "200".into(), None);
        m.request(
            "tei",
            "embed",
            "org/m".into(),
            "413".into(),
            Some("validation"),
        );
        m.stage(Stage::Total, Duration::from_millis(3));
        m.class("batch", Duration::from_millis(40));
        let r = Replica::new("http://127.0.0.1:9", false).unwrap();
        let mut sample = r.sample();
        sample.model = "org/m".into();
        let text = m.render(vec![sample], 0);
        assert!(text.contains(r#"ivy_requests_total{api="tei",endpoint="embed",status="413",error="validation",model="org/m"} 1"#), "{text}");
        assert!(
            text.contains(r#"ivy_replica_up{replica="http://127.0.0.1:9",model="org/m"} 0"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"ivy_replica_tokens_total{replica="http://127.0.0.1:9",model="org/m"} 0"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"ivy_stage_duration_seconds_count{stage="total"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"ivy_class_request_duration_seconds_count{class="batch"} 1"#),
            "{text}"
        );
    }
}
