//! Tulip replicas: one gRPC channel each, their health, their load (tokens in
//! flight from this Ivy) and the set Ivy routes to now.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use proto::tulip::v1::tulip_client::TulipClient;
use proto::tulip::v1::{EmbedRequest, EmbedResponse, InfoRequest, InfoResponse, DRAINING_METADATA};
use tokio::sync::{watch, Notify};
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use crate::error::ApiError;
use crate::frame_client::FrameClient;
use ivy_tokenizer::Tokenizer;

/// Largest response Ivy accepts from a replica (a big multi-vector chunk).
const MAX_RESPONSE_BYTES: usize = 512 * 1024 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
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
    /// Chunks of batch-priority requests in flight here (`batch_slots.rs`).
    pub(crate) batch_chunks: AtomicUsize,
    /// Bumped when the replica stops answering health checks: attempts in
    /// flight on it give up and retry elsewhere instead of hanging.
    lost: watch::Sender<u64>,
    info: RwLock<Option<Arc<InfoResponse>>>,
    /// Chunks waiting to share a call here (`coalesce.rs`).
    pub(crate) pending: crate::coalesce::Pending,
    /// For a `unix://` replica with frames allowed: `Embed` calls as Tulip
    /// frames, once its `Info` says it serves them (`use_frames`).
    frames: Option<FrameClient>,
    use_frames: AtomicBool,
    /// Why it last stopped taking work, for the 503 a client gets when no
    /// replica is left (logs are not the only place to find out).
    why: RwLock<String>,
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
            batch_chunks: AtomicUsize::new(0),
            lost: watch::Sender::new(0),
            info: RwLock::new(None),
            pending: Default::default(),
            frames: url
                .strip_prefix("unix://")
                .filter(|_| unix_frames)
                .map(|path| FrameClient::new(path.into(), MAX_RESPONSE_BYTES)),
            use_frames: AtomicBool::new(false),
            why: RwLock::new(String::new()),
        })
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

    /// Asks the replica what it serves and remembers the answer.
    pub async fn fetch_info(&self, timeout: Duration) -> Result<Arc<InfoResponse>, String> {
        let mut client = self.client.clone();
        let info = match tokio::time::timeout(timeout, client.info(InfoRequest {})).await {
            Ok(Ok(r)) => Arc::new(r.into_inner()),
            Ok(Err(status)) => return Err(format!("Info failed: {}", status.message())),
            Err(_) => return Err(format!("no Info answer within {timeout:?}")),
        };
        *self.info.write().expect("replica lock poisoned") = Some(Arc::clone(&info));
        let frames = self.frames.is_some() && info.unix_frames;
        if self.use_frames.swap(frames, Ordering::Relaxed) != frames {
            tracing::info!(replica = %self.url, frames, "Embed calls as Tulip frames");
        }
        Ok(info)
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

/// The replicas Ivy knows now (static or discovered), the model they serve
/// and the tokenizer requests are tokenized with.
#[derive(Default)]
pub struct ReplicaSet {
    list: RwLock<Arc<Vec<Arc<Replica>>>>,
    model: RwLock<Option<Arc<InfoResponse>>>,
    tokenizer: RwLock<Option<Arc<Tokenizer>>>,
    /// The tokenizer came from `--tokenizer`: the replicas' is not loaded.
    tokenizer_override: bool,
    /// `--unix-frames`: `unix://` replicas get `Embed` as Tulip frames.
    unix_frames: bool,
    /// The model's own prompt templates.
    templates: RwLock<Option<Arc<crate::templates::Templates>>>,
    /// Woken when replicas are added, so they are checked at once.
    pub added: Notify,
}

impl ReplicaSet {
    /// A set that tokenizes with `tokenizer` when given (the `--tokenizer`
    /// override), else with the one the first replica serves.
    pub fn with_tokenizer(tokenizer: Option<Arc<Tokenizer>>, unix_frames: bool) -> Self {
        Self {
            tokenizer_override: tokenizer.is_some(),
            unix_frames,
            tokenizer: RwLock::new(tokenizer),
            ..Self::default()
        }
    }

    /// The model's prompts as templates, once a replica has answered.
    pub fn model_templates(&self) -> Option<Arc<crate::templates::Templates>> {
        self.templates
            .read()
            .expect("templates lock poisoned")
            .clone()
    }

    pub fn tokenizer(&self) -> Option<Arc<Tokenizer>> {
        self.tokenizer
            .read()
            .expect("tokenizer lock poisoned")
            .clone()
    }

    pub fn snapshot(&self) -> Arc<Vec<Arc<Replica>>> {
        Arc::clone(&self.list.read().expect("replica set lock poisoned"))
    }

    /// What the replicas serve, once one of them has answered `Info`.
    pub fn model(&self) -> Option<Arc<InfoResponse>> {
        self.model.read().expect("model lock poisoned").clone()
    }

    pub fn routable_count(&self) -> usize {
        self.snapshot().iter().filter(|r| r.is_routable()).count()
    }

    /// Replaces the membership with `urls`, keeping the replicas (and their
    /// connections and load) that stay.
    pub fn set_targets(&self, urls: &[String]) -> Result<(), String> {
        let current = self.snapshot();
        let mut next = Vec::with_capacity(urls.len());
        let mut added = Vec::new();
        for url in urls {
            match current.iter().find(|r| &r.url == url) {
                Some(r) => next.push(Arc::clone(r)),
                None => {
                    next.push(Arc::new(Replica::new(url, self.unix_frames)?));
                    added.push(url.as_str());
                }
            }
        }
        let removed: Vec<&str> = current
            .iter()
            .filter(|r| !urls.contains(&r.url))
            .map(|r| r.url.as_str())
            .collect();
        if added.is_empty() && removed.is_empty() {
            return Ok(());
        }
        tracing::info!(
            ?added,
            ?removed,
            replicas = next.len(),
            "replica set changed"
        );
        *self.list.write().expect("replica set lock poisoned") = Arc::new(next);
        if !added.is_empty() {
            self.added.notify_one();
        }
        Ok(())
    }

    /// Accepts a replica's model: the first one answering defines it (and,
    /// without `--tokenizer`, the tokenizer); the others must serve the same
    /// model (same id, shapes and outputs) with the same tokenizer (by the
    /// sha256 of its file).
    pub fn accept_model(&self, info: &Arc<InfoResponse>) -> Result<(), String> {
        let mut model = self.model.write().expect("model lock poisoned");
        match &*model {
            None => {
                if !self.tokenizer_override {
                    let t = load_tokenizer(info)?;
                    *self.tokenizer.write().expect("tokenizer lock poisoned") = Some(Arc::new(t));
                }
                tracing::info!(model = %info.model_id, dimension = info.dimension,
                               max_input_length = info.max_input_length,
                               tokenizer_sha256 = %info.tokenizer_sha256,
                               prompts = info.prompts.len(), "model info");
                *self.templates.write().expect("templates lock poisoned") =
                    Some(Arc::new(crate::templates::Templates::from_model(
                        &info.prompts,
                        &info.default_prompt_name,
                    )));
                *model = Some(Arc::clone(info));
                Ok(())
            }
            Some(m) => {
                let same_model = m.model_id == info.model_id
                    && m.dimension == info.dimension
                    && m.vocab_size == info.vocab_size
                    && m.max_input_length == info.max_input_length
                    && m.kinds == info.kinds;
                if !same_model {
                    return Err(format!(
                        "it serves model {} (dimension {}), the others {} (dimension {}); \
                         restart it with {}, or restart Ivy to serve {}",
                        info.model_id, info.dimension, m.model_id, m.dimension, m.model_id, info.model_id
                    ));
                }
                if m.tokenizer_sha256 != info.tokenizer_sha256 {
                    return Err(format!(
                        "it serves another tokenizer (sha256 {}) than the others ({}); restart it with \
                         the others' model files, or restart Ivy to follow the new ones",
                        short(&info.tokenizer_sha256),
                        short(&m.tokenizer_sha256)
                    ));
                }
                Ok(())
            }
        }
    }
}

/// The tokenizer a replica sent in its Info.
fn load_tokenizer(info: &InfoResponse) -> Result<Tokenizer, String> {
    if info.tokenizer_json.is_empty() {
        return Err(format!(
            "model {} comes with no tokenizer.json; start Ivy with --tokenizer",
            info.model_id
        ));
    }
    let t = Tokenizer::from_bytes(&info.tokenizer_json).map_err(|e| {
        format!(
            "the tokenizer model {} serves does not load: {e}",
            info.model_id
        )
    })?;
    tracing::info!(model = %info.model_id, sha256 = %info.tokenizer_sha256, backend = %t.backend(),
                   "tokenizer loaded from the replica");
    Ok(t)
}

fn short(sha: &str) -> &str {
    if sha.is_empty() {
        "none"
    } else {
        &sha[..sha.len().min(12)]
    }
}

/// The 503 when no replica takes work: each replica's reason (refused,
/// down, draining) and what to do, so the client sees what the logs say.
pub fn no_replica(set: &ReplicaSet) -> ApiError {
    const SHOWN: usize = 4;
    let replicas = set.snapshot();
    let mut reasons: Vec<String> = replicas
        .iter()
        .take(SHOWN)
        .map(|r| r.unavailable_reason())
        .collect();
    if replicas.len() > SHOWN {
        reasons.push(format!("and {} more", replicas.len() - SHOWN));
    }
    let detail = if reasons.is_empty() {
        "no replica is known yet (--tulip-dns has resolved none)".to_string()
    } else {
        reasons.join("; ")
    };
    ApiError::Unavailable(format!(
        "no healthy Tulip replica is available: {detail}. Retry shortly if a replica is starting"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn membership_changes_keep_existing_replicas() {
        let set = ReplicaSet::default();
        set.set_targets(&["http://10.0.0.1:7070".into(), "http://10.0.0.2:7070".into()])
            .unwrap();
        let first = Arc::clone(&set.snapshot()[0]);
        first.set_health(Health::Serving, "test", false);
        set.set_targets(&["http://10.0.0.1:7070".into(), "http://10.0.0.3:7070".into()])
            .unwrap();
        let now = set.snapshot();
        assert_eq!(
            now.iter().map(|r| r.url.as_str()).collect::<Vec<_>>(),
            ["http://10.0.0.1:7070", "http://10.0.0.3:7070"]
        );
        assert!(Arc::ptr_eq(&first, &now[0]) && now[0].is_routable());
        assert_eq!(now[1].health(), Health::Unknown);
        assert!(set.set_targets(&["not a url".into()]).is_err());
    }

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

    #[test]
    fn other_models_are_refused() {
        let a = Arc::new(InfoResponse {
            model_id: "m".into(),
            dimension: 384,
            ..Default::default()
        });
        let b = Arc::new(InfoResponse {
            model_id: "m".into(),
            dimension: 768,
            ..Default::default()
        });
        let set = ReplicaSet::with_tokenizer(None, false);
        // No tokenizer.json in the Info: nothing to tokenize with.
        assert!(set.accept_model(&a).unwrap_err().contains("--tokenizer"));
        let tok = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/data/tokenizers/all-minilm-l6-v2/tokenizer.json"
        ))
        .unwrap();
        let with_tok = |info: &InfoResponse, sha: &str| {
            Arc::new(InfoResponse {
                tokenizer_json: tok.clone().into(),
                tokenizer_sha256: sha.into(),
                ..info.clone()
            })
        };
        assert!(set.accept_model(&with_tok(&a, "aa")).is_ok());
        assert!(set.tokenizer().is_some());
        assert!(set.accept_model(&with_tok(&a, "aa")).is_ok());
        assert!(set
            .accept_model(&with_tok(&b, "aa"))
            .unwrap_err()
            .contains("dimension 768"));
        assert!(set
            .accept_model(&with_tok(&a, "bb"))
            .unwrap_err()
            .contains("another tokenizer"));
        assert_eq!(set.model().unwrap().dimension, 384);
    }
}
