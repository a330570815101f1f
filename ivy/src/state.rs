//! What every request handler shares.

use std::sync::Arc;
use std::time::Instant;

use ivy_tokenizer::Tokenizer;

use crate::auth::ApiKey;
use crate::balancer::Policy;
use crate::config::Config;
use crate::limits::Admission;
use crate::metrics::Metrics;
use crate::replicas::ReplicaSet;
use crate::templates::TemplateStore;

pub type AppState = Arc<Gateway>;

pub struct Gateway {
    pub config: Config,
    pub tokenizer: Arc<Tokenizer>,
    pub replicas: Arc<ReplicaSet>,
    pub templates: Arc<TemplateStore>,
    pub admission: Admission,
    pub metrics: Arc<Metrics>,
    pub policy: Box<dyn Policy>,
    pub api_key: ApiKey,
    pub spinner: Arc<crate::spin::Spinner>,
}

impl Gateway {
    /// When a request arriving now must be answered by.
    pub fn deadline(&self) -> Instant {
        Instant::now() + self.config.request_timeout
    }

    /// Ready for traffic: not draining and at least one healthy replica.
    pub fn is_ready(&self) -> bool {
        !self.admission.is_draining() && self.replicas.routable_count() > 0
    }
}
