//! Tulip replicas: health, model info, and least-loaded selection.
//!
//! Load is the number of tokens a replica has in flight from this Ivy, which
//! tracks its queue far better than a request count when payloads range from
//! one query to thousands of documents.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use proto::tulip::v1::tulip_client::TulipClient;
use proto::tulip::v1::{EmbedRequest, EmbedResponse, InfoRequest, InfoResponse};
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use crate::error::ApiError;

/// Largest response Ivy accepts from a replica (a big multi-vector batch).
const MAX_RESPONSE_BYTES: usize = 512 * 1024 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const HEALTH_TIMEOUT: Duration = Duration::from_secs(2);

pub struct Replica {
    pub url: String,
    client: TulipClient<Channel>,
    health: HealthClient<Channel>,
    inflight_tokens: AtomicU64,
    healthy: AtomicBool,
}

impl Replica {
    fn new(url: &str) -> Result<Self, String> {
        let endpoint = Endpoint::from_shared(url.to_string())
            .map_err(|e| format!("invalid Tulip URL `{url}`: {e}"))?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true);
        let channel = endpoint.connect_lazy();
        Ok(Self {
            url: url.to_string(),
            client: TulipClient::new(channel.clone())
                .max_decoding_message_size(MAX_RESPONSE_BYTES)
                .max_encoding_message_size(MAX_RESPONSE_BYTES),
            health: HealthClient::new(channel),
            inflight_tokens: AtomicU64::new(0),
            healthy: AtomicBool::new(false),
        })
    }

    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    pub fn inflight_tokens(&self) -> u64 {
        self.inflight_tokens.load(Ordering::Relaxed)
    }

    fn set_healthy(&self, healthy: bool) {
        let was = self.healthy.swap(healthy, Ordering::Relaxed);
        if was != healthy {
            tracing::info!(replica = %self.url, healthy, "replica health changed");
        }
    }

    async fn check(&self) -> bool {
        let request = HealthCheckRequest {
            service: String::new(),
        };
        let mut health = self.health.clone();
        match tokio::time::timeout(HEALTH_TIMEOUT, health.check(request)).await {
            Ok(Ok(resp)) => resp.into_inner().status == ServingStatus::Serving as i32,
            _ => false,
        }
    }
}

/// Subtracts a request's tokens from its replica's load when dropped, so a
/// cancelled request (client gone) does not leave phantom load behind.
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

pub struct Replicas {
    list: Vec<Arc<Replica>>,
    model: RwLock<Option<Arc<InfoResponse>>>,
}

impl Replicas {
    pub fn new(urls: &[String]) -> Result<Self, String> {
        let list = urls
            .iter()
            .map(|u| u.trim())
            .filter(|u| !u.is_empty())
            .map(|u| Replica::new(u).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()?;
        if list.is_empty() {
            return Err("no Tulip replica given (--tulip)".into());
        }
        Ok(Self {
            list,
            model: RwLock::new(None),
        })
    }

    pub fn all(&self) -> &[Arc<Replica>] {
        &self.list
    }

    pub fn any_healthy(&self) -> bool {
        self.list.iter().any(|r| r.is_healthy())
    }

    /// What the replicas serve, once one of them has answered `Info`.
    pub fn model(&self) -> Option<Arc<InfoResponse>> {
        self.model.read().expect("model lock poisoned").clone()
    }

    /// The healthy replica with the fewest tokens in flight.
    fn pick(&self) -> Option<&Arc<Replica>> {
        self.list
            .iter()
            .filter(|r| r.is_healthy())
            .min_by_key(|r| r.inflight_tokens())
    }

    /// Sends one request to the least-loaded healthy replica.
    pub async fn embed(&self, request: EmbedRequest) -> Result<EmbedResponse, ApiError> {
        let replica = self.pick().ok_or_else(no_replica)?;
        let tokens = request.token_ids.len() as u64;
        replica.inflight_tokens.fetch_add(tokens, Ordering::Relaxed);
        let _guard = InflightGuard { replica, tokens };
        let mut client = replica.client.clone();
        match client.embed(request).await {
            Ok(resp) => Ok(resp.into_inner()),
            Err(status) => Err(self.map_status(replica, status)),
        }
    }

    fn map_status(&self, replica: &Replica, status: tonic::Status) -> ApiError {
        use tonic::Code;
        match status.code() {
            Code::InvalidArgument | Code::OutOfRange | Code::FailedPrecondition => {
                ApiError::UpstreamInvalid(status.message().to_string())
            }
            Code::Unavailable | Code::Unknown | Code::Cancelled => {
                replica.set_healthy(false);
                ApiError::Unavailable(format!(
                    "Tulip replica {} is unavailable: {}",
                    replica.url,
                    status.message()
                ))
            }
            _ => ApiError::Upstream(format!(
                "Tulip replica {} failed: {}",
                replica.url,
                status.message()
            )),
        }
    }

    /// Checks every replica now, then every `interval`, forever.
    pub fn spawn_health_checks(self: &Arc<Self>, interval: Duration) {
        let this = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                this.check_all().await;
                tokio::time::sleep(interval).await;
            }
        });
    }

    async fn check_all(&self) {
        for replica in &self.list {
            let healthy = replica.check().await;
            if healthy && self.model().is_none() {
                self.fetch_info(replica).await;
            }
            replica.set_healthy(healthy);
        }
    }

    async fn fetch_info(&self, replica: &Replica) {
        let mut client = replica.client.clone();
        match client.info(InfoRequest {}).await {
            Ok(info) => {
                let info = info.into_inner();
                tracing::info!(
                    replica = %replica.url,
                    model = %info.model_id,
                    dimension = info.dimension,
                    max_input_length = info.max_input_length,
                    "model info"
                );
                *self.model.write().expect("model lock poisoned") = Some(Arc::new(info));
            }
            Err(e) => tracing::warn!(replica = %replica.url, error = %e, "Info failed"),
        }
    }
}

pub fn no_replica() -> ApiError {
    ApiError::Unavailable("no healthy Tulip replica is available; retry shortly".into())
}
