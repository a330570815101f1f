//! What every request handler shares.

use std::sync::Arc;
use std::time::Instant;

use ivy_tokenizer::Tokenizer;

use crate::auth::ApiKey;
use crate::balancer::Policy;
use crate::config::Config;
use crate::error::ApiError;
use crate::limits::Admission;
use crate::metrics::Metrics;
use crate::replicas::ReplicaSet;
use crate::templates::{TemplateStore, Templates};

pub type AppState = Arc<Gateway>;

pub struct Gateway {
    pub config: Config,
    pub replicas: Arc<ReplicaSet>,
    pub templates: Arc<TemplateStore>,
    pub admission: Admission,
    pub metrics: Arc<Metrics>,
    pub policy: Box<dyn Policy>,
    pub batch_slots: crate::batch_slots::BatchSlots,
    pub api_key: ApiKey,
    pub spinner: Arc<crate::spin::Spinner>,
    /// Start time (Unix seconds): the `created` of `GET /v1/models`.
    pub started_unix: u64,
}

impl Gateway {
    /// When a request arriving now must be answered by.
    pub fn deadline(&self) -> Instant {
        Instant::now() + self.config.request_timeout
    }

    /// The prompt templates in force: the `--config` file's, else the
    /// model's own (from the replicas), else none.
    pub fn templates(&self) -> Arc<Templates> {
        if !self.templates.has_file() {
            if let Some(t) = self.replicas.model_templates() {
                return t;
            }
        }
        self.templates.get()
    }

    /// The tokenizer requests are tokenized with: `--tokenizer`, else the
    /// one the replicas serve (503 until one has answered).
    pub fn tokenizer(&self) -> Result<Arc<Tokenizer>, ApiError> {
        self.replicas
            .tokenizer()
            .ok_or_else(|| crate::replicas::no_replica(&self.replicas))
    }

    /// The names the model is served under: `--served-model-name`, else the
    /// model id and its last path part. Empty until a replica has answered.
    pub fn served_names(&self) -> Vec<String> {
        if !self.config.served_model_name.is_empty() {
            return self.config.served_model_name.clone();
        }
        let Some(model) = self.replicas.model() else {
            return Vec::new();
        };
        let mut names = vec![model.model_id.clone()];
        if let Some((_, last)) = model.model_id.rsplit_once('/') {
            if !last.is_empty() {
                names.push(last.to_string());
            }
        }
        names
    }

    /// Ready for traffic: not draining and at least one healthy replica.
    pub fn is_ready(&self) -> bool {
        !self.admission.is_draining() && self.replicas.routable_count() > 0
    }
}
