//! Logs and traces from one place, for Ivy and Tulip alike: [`init`] builds
//! the console layer (text or one JSON object per line) and, when an OTLP
//! endpoint is given, an OpenTelemetry layer that turns the services'
//! `tracing` spans into a trace exported over OTLP/gRPC. The W3C trace
//! context (`traceparent`) is read from callers and passed on to Tulip in
//! gRPC metadata with the helpers below.
//!
//! Off by default: without an endpoint no OpenTelemetry layer, provider or
//! thread exists, the stage spans (DEBUG level) are disabled at their call
//! sites by the log filter, and every helper here returns after one relaxed
//! atomic load.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::SystemTime;

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{SamplingDecision, SamplingResult};
use opentelemetry::trace::{Span as _, Tracer as _, TracerProvider as _};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, ShouldSample};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tracing::{Level, Span};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::{filter_fn, EnvFilter};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, Registry};

pub use opentelemetry::KeyValue;

/// Whether traces are being exported (set once by [`init`]).
static ENABLED: AtomicBool = AtomicBool::new(false);

/// The tracer for spans recorded after the fact ([`record_child`]).
static TRACER: OnceLock<SdkTracer> = OnceLock::new();

/// Crates whose DEBUG spans become trace spans (Tulip's is built as the
/// extension module `_native`). Others' spans (h2, hyper, tonic — the
/// exporter's own connection among them) never do, so exporting cannot
/// trace itself.
const TRACED_CRATES: [&str; 3] = ["ivy", "tulip", "_native"];

/// What to log and where to send traces.
pub struct Settings<'a> {
    /// Log filter (tracing syntax, e.g. "info" or "ivy=debug").
    pub filter: &'a str,
    /// One JSON object per line instead of text.
    pub json: bool,
    /// Export traces here; `None`: no tracing at all.
    pub otlp: Option<Otlp>,
}

/// An OTLP/gRPC collector, e.g. `http://otel-collector:4317`.
pub struct Otlp {
    pub endpoint: String,
    /// `service.name` of the exported spans.
    pub service_name: String,
    /// Request paths that start no trace (probes and scrapes, which would
    /// otherwise add a one-span trace every few seconds).
    pub untraced_paths: &'static [&'static str],
}

/// Keeps the exporter alive; dropping it flushes the spans still buffered
/// (up to the exporter's timeout) and stops its thread and runtime.
pub struct Guard {
    provider: SdkTracerProvider,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        ENABLED.store(false, Ordering::Relaxed);
        let _ = self.provider.shutdown();
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

type Boxed = Box<dyn Layer<Registry> + Send + Sync>;

/// Installs the process's subscriber. `Ok(None)` when no endpoint was given,
/// or when a subscriber was installed already (a second `serve()` in one
/// process keeps the first one's outputs). Errors name a bad endpoint.
pub fn init(settings: Settings<'_>) -> Result<Option<Guard>, String> {
    let filter = EnvFilter::try_new(settings.filter).unwrap_or_else(|_| EnvFilter::new("info"));
    let console = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let console: Boxed = if settings.json {
        console
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .with_filter(filter)
            .boxed()
    } else {
        console
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_filter(filter)
            .boxed()
    };
    let Some(otlp) = settings.otlp else {
        let _ = tracing_subscriber::registry().with(console).try_init();
        return Ok(None);
    };
    let (guard, tracer) = exporter(&otlp)?;
    // Spans: this project's, DEBUG and up (the stage spans). Events (log
    // lines) at INFO and up become span events.
    let traced = filter_fn(|m| {
        let krate = m.target().split("::").next().unwrap_or_default();
        let ours = TRACED_CRATES.contains(&krate);
        if m.is_span() {
            ours && *m.level() <= Level::DEBUG
        } else {
            *m.level() <= Level::INFO
        }
    });
    let otel: Boxed = tracing_opentelemetry::layer()
        .with_tracer(tracer.clone())
        .with_threads(false)
        .with_location(false)
        .with_tracked_inactivity(false)
        .with_filter(traced)
        .boxed();
    if tracing_subscriber::registry()
        .with(vec![console, otel])
        .try_init()
        .is_err()
    {
        return Ok(None);
    }
    let _ = TRACER.set(tracer);
    ENABLED.store(true, Ordering::Relaxed);
    tracing::info!(endpoint = %otlp.endpoint, service = %otlp.service_name, "exporting traces over OTLP/gRPC");
    Ok(Some(guard))
}

/// The OTLP exporter behind a batch span processor. Ending a span only
/// queues it (a bounded channel; full, spans are dropped, never waited
/// for); the processor's own thread sends batches, and the gRPC channel it
/// sends on runs on a one-thread runtime of its own, so exporting never
/// takes a request thread.
fn exporter(otlp: &Otlp) -> Result<(Guard, SdkTracer), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("otlp-export")
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the OTLP exporter's runtime: {e}"))?;
    // The channel's connection task is spawned on the runtime entered here.
    let exporter = {
        let _entered = runtime.enter();
        opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(otlp.endpoint.clone())
            .build()
            .map_err(|e| format!("--otlp-endpoint {}: {e}", otlp.endpoint))?
    };
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(SkipPaths(otlp.untraced_paths))
        .with_resource(
            Resource::builder()
                .with_service_name(otlp.service_name.clone())
                .build(),
        )
        .build();
    let tracer = provider.tracer(otlp.service_name.clone());
    let guard = Guard {
        provider,
        runtime: Some(runtime),
    };
    Ok((guard, tracer))
}

/// The default sampling (follow the caller's sampled flag, else record
/// everything), except spans whose `path` attribute is one of these.
#[derive(Debug, Clone)]
struct SkipPaths(&'static [&'static str]);

impl ShouldSample for SkipPaths {
    fn should_sample(
        &self,
        parent: Option<&opentelemetry::Context>,
        trace_id: opentelemetry::trace::TraceId,
        name: &str,
        kind: &opentelemetry::trace::SpanKind,
        attributes: &[KeyValue],
        links: &[opentelemetry::trace::Link],
    ) -> SamplingResult {
        let default = Sampler::ParentBased(Box::new(Sampler::AlwaysOn));
        let mut result = default.should_sample(parent, trace_id, name, kind, attributes, links);
        let untraced = attributes
            .iter()
            .any(|kv| kv.key.as_str() == "path" && self.0.iter().any(|p| kv.value.as_str() == *p));
        if untraced {
            result.decision = SamplingDecision::Drop;
        }
        result
    }
}

/// Whether traces are exported; call sites skip tracing-only work when not.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Makes `span` continue the caller's trace when the HTTP headers carry a
/// valid `traceparent`; without one it starts a new trace.
pub fn continue_http(span: &Span, headers: &http::HeaderMap) {
    if enabled() {
        let cx = TraceContextPropagator::new().extract(&HttpHeaders(headers));
        let _ = span.set_parent(cx);
    }
}

/// Makes `span` continue the trace named in gRPC metadata (`traceparent`).
pub fn continue_grpc(span: &Span, metadata: &MetadataMap) {
    if enabled() {
        let cx = TraceContextPropagator::new().extract(&Metadata(metadata));
        let _ = span.set_parent(cx);
    }
}

/// Writes the current span's trace context into outgoing gRPC metadata
/// (`traceparent`), so the server's spans join this trace under it.
pub fn inject_grpc(metadata: &mut MetadataMap) {
    if enabled() {
        let cx = Span::current().context();
        TraceContextPropagator::new().inject_context(&cx, &mut MetadataMut(metadata));
    }
}

/// The current span's trace context as a `traceparent` value, for a
/// transport without metadata (Tulip frames); empty when traces are off.
pub fn traceparent() -> String {
    let mut carrier = Traceparent(String::new());
    if enabled() {
        let cx = Span::current().context();
        TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    }
    carrier.0
}

/// Makes `span` continue the trace named by a `traceparent` value (from
/// [`traceparent`]); an empty or invalid one starts a new trace.
pub fn continue_traceparent(span: &Span, traceparent: &str) {
    if enabled() && !traceparent.is_empty() {
        let carrier = Traceparent(traceparent.to_string());
        let cx = TraceContextPropagator::new().extract(&carrier);
        let _ = span.set_parent(cx);
    }
}

/// Records a finished child span of `parent` with explicit start and end
/// times: for phases measured on other threads (a request's wait in
/// Tulip's queue, its engine steps), recorded once the request is answered.
pub fn record_child(
    parent: &Span,
    name: &'static str,
    start: SystemTime,
    end: SystemTime,
    attributes: Vec<KeyValue>,
) {
    if !enabled() {
        return;
    }
    let Some(tracer) = TRACER.get() else { return };
    let mut span = tracer
        .span_builder(name)
        .with_start_time(start)
        .with_attributes(attributes)
        .start_with_context(tracer, &parent.context());
    span.end_with_timestamp(end);
}

struct HttpHeaders<'a>(&'a http::HeaderMap);

impl Extractor for HttpHeaders<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

struct Metadata<'a>(&'a MetadataMap);

impl Extractor for Metadata<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|k| match k {
                tonic::metadata::KeyRef::Ascii(k) => Some(k.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

struct MetadataMut<'a>(&'a mut MetadataMap);

impl Injector for MetadataMut<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(k), Ok(v)) = (
            MetadataKey::from_bytes(key.as_bytes()),
            MetadataValue::try_from(value.as_str()),
        ) {
            self.0.insert(k, v);
        }
    }
}

/// A carrier holding only the `traceparent` field (the propagator's
/// `tracestate` is not carried).
struct Traceparent(String);

impl Extractor for Traceparent {
    fn get(&self, key: &str) -> Option<&str> {
        (key == "traceparent").then_some(self.0.as_str())
    }

    fn keys(&self) -> Vec<&str> {
        vec!["traceparent"]
    }
}

impl Injector for Traceparent {
    fn set(&mut self, key: &str, value: String) {
        if key == "traceparent" {
            self.0 = value;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers_do_nothing_when_off() {
        assert!(!enabled());
        let mut meta = MetadataMap::new();
        inject_grpc(&mut meta);
        assert!(meta.is_empty());
    }

    #[test]
    fn trace_context_round_trips_through_metadata() {
        let parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let mut headers = http::HeaderMap::new();
        headers.insert("traceparent", parent.parse().unwrap());
        let propagator = TraceContextPropagator::new();
        let cx = propagator.extract(&HttpHeaders(&headers));
        let mut meta = MetadataMap::new();
        propagator.inject_context(&cx, &mut MetadataMut(&mut meta));
        assert_eq!(meta.get("traceparent").unwrap().to_str().unwrap(), parent);
        let again = propagator.extract(&Metadata(&meta));
        use opentelemetry::trace::TraceContextExt;
        assert_eq!(
            again.span().span_context().trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
    }
}
