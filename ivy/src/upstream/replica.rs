//! A Tulip replica: one gRPC channel, its health, its load (tokens in
//! flight from this Ivy) and its counters. The set Ivy routes to is in
//! `set.rs`.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use proto::tulip::v1::tulip_client::TulipClient;
use proto::tulip::v1::{EmbedRequest, EmbedResponse, InfoRequest, InfoResponse, DRAINING_METADATA};
use tokio::sync::watch;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use super::coalesce::open::OpenCall;
use super::frame_client::FrameClient;
use super::CONNECT_TIMEOUT;
use crate::error::ApiError;
use crate::metrics::ReplicaSample;

/// Largest response Ivy accepts from a replica (a big multi-vector chunk).
const MAX_RESPONSE_BYTES: usize = 512 * 1024 * 1024;
/// HTTP/2 pings on idle connections notice a vanished peer (no RST, e.g. a
/// node that went away) without waiting for the OS.
const KEEPALIVE: Duration = Duration::from_secs(10);

/// What Ivy knows about a replica's health.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Health {
    /// Not checked yet.
    Unknown = 0,
    /// Answers SERVING: takes new work.
    Serving = 1,
    /// Answers NOT_SERVING (draining): no new work, in-flight work finishes.
    Draining = 2,
    /// Failed a call or its health checks.
    Down = 3,
    /// Serves another model than the other replicas.
    Mismatch = 4,
}

impl Health {
    fn from_u8(v: u8) -> Self {
        match v {
            1 => Self::Serving,
            2 => Self::Draining,
            3 => Self::Down,
            4 => Self::Mismatch,
            _ => Self::Unknown,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::Unknown => "unknown",
            Self::Serving => "serving",
            Self::Draining => "draining",
            Self::Down => "down",
            Self::Mismatch => "model_mismatch",
        }
    }
}

/// The result of one attempt on one replica.
#[derive(Debug)]
pub enum AttemptError {
    /// The replica failed; another replica may succeed.
    Retry(ApiError),
    /// The request itself is at fault (or cannot succeed anywhere).
    Fatal(ApiError),
}

/// Cumulative counters, for metrics.
#[derive(Debug, Clone, Copy)]
pub struct Stats {
    pub tokens: u64,
    pub chunks: u64,
    pub failures: u64,
}

pub struct Replica {
    pub url: String,
    client: TulipClient<Channel>,
    health_client: HealthClient<Channel>,
    health: AtomicU8,
    failed_checks: AtomicU32,
    inflight_tokens: AtomicU64,
    tokens_done: AtomicU64,
    chunks_done: AtomicU64,
    failures: AtomicU64,
    /// Batch-priority work in flight here, as `batch_slots.rs` counts it.
    pub(crate) batch_load: AtomicUsize,
    /// Bumped when the replica stops answering health checks: attempts in
    /// flight on it give up and retry elsewhere instead of hanging.
    lost: watch::Sender<u64>,
    info: RwLock<Option<Arc<InfoResponse>>>,
    /// Chunks waiting to share a call here (`coalesce/`).
    pub(crate) open_call: OpenCall,
    /// For a `unix://` replica with frames allowed: `Embed` calls as Tulip
    /// frames, once its `Info` says it serves them (`use_frames`).
    frames: Option<FrameClient>,
    use_frames: AtomicBool,
    /// The model pool it joined (`pools.rs`; usize::MAX: none yet). Kept
    /// while it is down, so a pool's 503 names it.
    pool: AtomicUsize,
    /// Why it last stopped taking work, for the 503 a client gets when no
    /// replica is left (logs are not the only place to find out).
    why: RwLock<String>,
    /// LoRA adapters loaded here (its `Info`'s, then Ivy's own loads), and
    /// those being loaded now, so the health loop loads each once.
    pub(crate) adapters: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

impl std::fmt::Debug for Replica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replica")
            .field("url", &self.url)
            .field("health", &self.health())
            .finish()
    }
}

impl Replica {
    /// A replica at `url`; connects lazily (needs a tokio runtime).
    /// `unix_frames`: a `unix://` replica whose `Info` offers Tulip frames
    /// gets its `Embed` calls that way.
    pub fn new(url: &str, unix_frames: bool) -> Result<Self, String> {
        let endpoint = Endpoint::from_shared(url.to_string())
            .map_err(|e| format!("invalid Tulip URL `{url}`: {e}"))?
            .connect_timeout(CONNECT_TIMEOUT)
            .http2_keep_alive_interval(KEEPALIVE)
            .keep_alive_while_idle(true)
            .tcp_nodelay(true);
        let channel = endpoint.connect_lazy();
        Ok(Self {
            url: url.to_string(),
            client: TulipClient::new(channel.clone())
                .max_decoding_message_size(MAX_RESPONSE_BYTES)
                .max_encoding_message_size(MAX_RESPONSE_BYTES),
            health_client: HealthClient::new(channel),
            health: AtomicU8::new(Health::Unknown as u8),
            failed_checks: AtomicU32::new(0),
            inflight_tokens: AtomicU64::new(0),
            tokens_done: AtomicU64::new(0),
            chunks_done: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            batch_load: AtomicUsize::new(0),
            lost: watch::Sender::new(0),
            info: RwLock::new(None),
            open_call: Default::default(),
            frames: url
                .strip_prefix("unix://")
                .filter(|_| unix_frames)
                .map(|path| FrameClient::new(path.into(), MAX_RESPONSE_BYTES)),
            use_frames: AtomicBool::new(false),
            pool: AtomicUsize::new(usize::MAX),
            why: RwLock::new(String::new()),
            adapters: Default::default(),
        })
    }

    /// The pool it belongs to, once it said what it serves.
    pub fn pool(&self) -> Option<usize> {
        match self.pool.load(Ordering::Relaxed) {
            usize::MAX => None,
            i => Some(i),
        }
    }

    pub(crate) fn set_pool(&self, index: usize) {
        self.pool.store(index, Ordering::Relaxed);
    }

    pub fn health(&self) -> Health {
        Health::from_u8(self.health.load(Ordering::Relaxed))
    }

    /// Whether new work may go here.
    pub fn is_routable(&self) -> bool {
        self.health() == Health::Serving
    }

    pub fn inflight_tokens(&self) -> u64 {
        self.inflight_tokens.load(Ordering::Relaxed)
    }

    pub fn stats(&self) -> Stats {
        Stats {
            tokens: self.tokens_done.load(Ordering::Relaxed),
            chunks: self.chunks_done.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
        }
    }

    /// Its state now, for the metrics scrape.
    pub fn sample(&self) -> ReplicaSample {
        let stats = self.stats();
        ReplicaSample {
            url: self.url.clone(),
            model: String::new(),
            up: self.is_routable(),
            mismatch: self.health() == Health::Mismatch,
            inflight_tokens: self.inflight_tokens(),
            tokens: stats.tokens,
            chunks: stats.chunks,
            failures: stats.failures,
        }
    }

    pub fn info(&self) -> Option<Arc<InfoResponse>> {
        self.info.read().expect("replica lock poisoned").clone()
    }

    /// Why it takes no work now, and what to do about it (for a 503).
    pub fn unavailable_reason(&self) -> String {
        let why = self.why.read().expect("replica lock poisoned").clone();
        match self.health() {
            Health::Serving => format!("{} is serving", self.url),
            Health::Unknown => format!("{} has not answered a health check yet", self.url),
            Health::Draining => format!("{} is draining (shutting down or restarting)", self.url),
            Health::Down => format!(
                "{} is down ({why}): check that Tulip runs there and that --tulip names its gRPC port",
                self.url
            ),
            Health::Mismatch => format!("{} is refused: {why}", self.url),
        }
    }

    /// Records a new health state; `abort_inflight` also makes attempts in
    /// flight here give up (the replica stopped answering at all).
    pub fn set_health(&self, health: Health, why: &str, abort_inflight: bool) {
        if health != Health::Serving {
            *self.why.write().expect("replica lock poisoned") = why.to_string();
        }
        let was = Health::from_u8(self.health.swap(health as u8, Ordering::Relaxed));
        if was != health {
            if health == Health::Serving || was == Health::Unknown && health == Health::Draining {
                tracing::info!(replica = %self.url, from = was.label(), to = health.label(), "replica health changed");
            } else {
                tracing::warn!(replica = %self.url, from = was.label(), to = health.label(), reason = why, "replica health changed");
            }
        }
        match health {
            Health::Serving => self.failed_checks.store(0, Ordering::Relaxed),
            // A replica that comes back may be a new process with a new model.
            Health::Down => *self.info.write().expect("replica lock poisoned") = None,
            _ => {}
        }
        if abort_inflight {
            self.lost.send_modify(|n| *n += 1);
        }
    }

    /// Counts a failed health check; returns how many failed in a row.
    pub fn failed_check(&self) -> u32 {
        self.failed_checks.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// One `grpc.health.v1` check: Ok(true) SERVING, Ok(false) NOT_SERVING.
    pub async fn probe(&self, timeout: Duration) -> Result<bool, String> {
        let mut client = self.health_client.clone();
        let request = HealthCheckRequest {
            service: String::new(),
        };
        match tokio::time::timeout(timeout, client.check(request)).await {
            Ok(Ok(resp)) => Ok(resp.into_inner().status == ServingStatus::Serving as i32),
            Ok(Err(status)) => Err(format!("health check failed: {}", status.message())),
            Err(_) => Err(format!("no health check answer within {timeout:?}")),
        }
    }

    /// Asks the replica's `Info` now, remembering nothing (what changes
    /// while it serves: its CPU runtimes' readiness); None if it does not
    /// answer in `timeout`.
    pub async fn current_info(&self, timeout: Duration) -> Option<InfoResponse> {
        let mut client = self.client.clone();
        match tokio::time::timeout(timeout, client.info(InfoRequest {})).await {
            Ok(Ok(r)) => Some(r.into_inner()),
            _ => None,
        }
    }

    /// Asks the replica what it serves and remembers the answer.
    pub async fn fetch_info(&self, timeout: Duration) -> Result<Arc<InfoResponse>, String> {
        let mut client = self.client.clone();
        let info = match tokio::time::timeout(timeout, client.info(InfoRequest {})).await {
            Ok(Ok(r)) => Arc::new(r.into_inner()),
            Ok(Err(status)) => return Err(format!("Info failed: {}", status.message())),
            Err(_) => return Err(format!("no Info answer within {timeout:?}")),
        };
        *self.info.write().expect("replica lock poisoned") = Some(Arc::clone(&info));
        *self.adapters.lock().expect("replica lock poisoned") =
            info.adapters.iter().map(|a| a.name.clone()).collect();
        let frames = self.frames.is_some() && info.unix_frames;
        if self.use_frames.swap(frames, Ordering::Relaxed) != frames {
            tracing::info!(replica = %self.url, frames, "Embed calls as Tulip frames");
        }
        Ok(info)
    }

    /// Loads a LoRA adapter here (`LoadAdapter`).
    pub async fn load_adapter(
        &self,
        name: &str,
        path: &str,
    ) -> Result<proto::tulip::v1::Adapter, tonic::Status> {
        let mut client = self.client.clone();
        let request = proto::tulip::v1::LoadAdapterRequest {
            name: name.to_string(),
            path: path.to_string(),
        };
        let adapter = client.load_adapter(request).await?.into_inner();
        self.adapters
            .lock()
            .expect("replica lock poisoned")
            .insert(name.to_string());
        Ok(adapter)
    }

    /// Unloads a LoRA adapter here (`UnloadAdapter`).
    pub async fn unload_adapter(&self, name: &str) -> Result<(), tonic::Status> {
        let mut client = self.client.clone();
        let request = proto::tulip::v1::UnloadAdapterRequest {
            name: name.to_string(),
        };
        let result = client.unload_adapter(request).await.map(|_| ());
        self.adapters
            .lock()
            .expect("replica lock poisoned")
            .remove(name);
        result
    }

    /// Runs one chunk here. Its tokens count as this replica's load until
    /// the call ends, however it ends (a cancelled request included).
    pub async fn embed(&self, request: EmbedRequest) -> Result<EmbedResponse, AttemptError> {
        let tokens = request.token_ids.len() as u64;
        self.inflight_tokens.fetch_add(tokens, Ordering::Relaxed);
        let _load = InflightGuard {
            replica: self,
            tokens,
        };
        let mut lost = self.lost.subscribe();
        let outcome = tokio::select! {
            r = self.call(request) => r.map_err(|s| self.classify(s)),
            _ = lost.changed() => Err(AttemptError::Retry(ApiError::Unavailable(format!(
                "Tulip replica {} stopped answering health checks", self.url
            )))),
        };
        match &outcome {
            Ok(_) => {
                self.tokens_done.fetch_add(tokens, Ordering::Relaxed);
                self.chunks_done.fetch_add(1, Ordering::Relaxed);
            }
            Err(AttemptError::Retry(_)) => {
                self.failures.fetch_add(1, Ordering::Relaxed);
            }
            Err(AttemptError::Fatal(_)) => {}
        }
        outcome
    }

    /// One `Embed` call, as Tulip frames when this replica takes them.
    async fn call(&self, request: EmbedRequest) -> Result<EmbedResponse, tonic::Status> {
        if let Some(frames) = &self.frames {
            if self.use_frames.load(Ordering::Relaxed) {
                return frames.embed(&request, &telemetry::traceparent()).await;
            }
        }
        let mut client = self.client.clone();
        let mut call = tonic::Request::new(request);
        telemetry::inject_grpc(call.metadata_mut());
        client.embed(call).await.map(|r| r.into_inner())
    }

    #[cfg(test)]
    pub fn add_load(&self, tokens: u64) {
        self.inflight_tokens.fetch_add(tokens, Ordering::Relaxed);
    }

    fn classify(&self, status: tonic::Status) -> AttemptError {
        use tonic::Code;
        let msg = status.message();
        match status.code() {
            Code::InvalidArgument | Code::OutOfRange | Code::FailedPrecondition => {
                AttemptError::Fatal(ApiError::UpstreamInvalid(msg.to_string()))
            }
            // An adapter not loaded on this replica (yet: Ivy loads it on
            // replicas that join after it): another may have it.
            Code::NotFound => AttemptError::Retry(ApiError::ModelNotFound(msg.to_string())),
            // Connection lost, refused, reset, or the replica is draining:
            // no new work until a health check says SERVING again.
            Code::Unavailable | Code::Unknown | Code::Cancelled | Code::Aborted => {
                let draining = status.metadata().contains_key(DRAINING_METADATA);
                self.set_health(
                    if draining {
                        Health::Draining
                    } else {
                        Health::Down
                    },
                    msg,
                    false,
                );
                AttemptError::Retry(ApiError::Unavailable(format!(
                    "Tulip replica {} is unavailable: {msg}",
                    self.url
                )))
            }
            Code::Internal | Code::ResourceExhausted | Code::DeadlineExceeded => {
                AttemptError::Retry(ApiError::Upstream(format!(
                    "Tulip replica {} failed: {msg}",
                    self.url
                )))
            }
            _ => AttemptError::Fatal(ApiError::Upstream(format!(
                "Tulip replica {} failed: {msg}",
                self.url
            ))),
        }
    }
}

struct InflightGuard<'a> {
    replica: &'a Replica,
    tokens: u64,
}

impl Drop for InflightGuard<'_> {
    fn drop(&mut self) {
        self.replica
            .inflight_tokens
            .fetch_sub(self.tokens, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_refusal_that_says_draining_is_not_a_lost_replica() {
        let r = Replica::new("http://10.0.0.1:7070", false).unwrap();
        r.set_health(Health::Serving, "test", false);
        let mut draining = tonic::Status::unavailable("server is draining");
        draining
            .metadata_mut()
            .insert(DRAINING_METADATA, "1".parse().unwrap());
        assert!(matches!(r.classify(draining), AttemptError::Retry(_)));
        assert_eq!(r.health(), Health::Draining);
        r.set_health(Health::Serving, "test", false);
        let _ = r.classify(tonic::Status::unavailable("tcp connect error"));
        assert_eq!(r.health(), Health::Down);
    }
}
