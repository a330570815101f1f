//! What every request handler shares.

use std::sync::Arc;
use std::time::Instant;

use ivy_tokenizer::Tokenizer;

use crate::config::Config;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::model::templates::{TemplateStore, Templates};
use crate::model::ServedModel;
use crate::request::admission::Admission;
use crate::request::auth::ApiKey;
use crate::upstream::balancer::Policy;
use crate::upstream::set::ReplicaSet;

pub type AppState = Arc<Gateway>;

pub struct Gateway {
    pub config: Config,
    pub replicas: Arc<ReplicaSet>,
    pub model: Arc<ServedModel>,
    pub templates: Arc<TemplateStore>,
    pub admission: Admission,
    pub metrics: Arc<Metrics>,
    pub policy: Box<dyn Policy>,
    pub batch_slots: crate::upstream::batch_slots::BatchSlots,
    pub api_key: ApiKey,
    pub spinner: Arc<crate::upstream::spin::Spinner>,
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
            if let Some(t) = self.model.templates() {
                return t;
            }
        }
        self.templates.get()
    }

    /// The tokenizer requests are tokenized with: `--tokenizer`, else the
    /// one the replicas serve (503 until one has answered).
    pub fn tokenizer(&self) -> Result<Arc<Tokenizer>, ApiError> {
        self.model
            .tokenizer()
            .ok_or_else(|| crate::upstream::no_replica(&self.replicas))
    }

    /// The names the model is served under: `--served-model-name`, else the
    /// model id and its last path part. Empty until a replica has answered.
    pub fn served_names(&self) -> Vec<String> {
        if !self.config.served_model_name.is_empty() {
            return self.config.served_model_name.clone();
        }
        let Some(model) = self.model.info() else {
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

    /// The model a request names (`asked`), which must be one this gateway
    /// serves (a misrouted client fails loudly); without one, the first
    /// served name.
    pub fn served_model(&self, asked: Option<String>) -> Result<String, ApiError> {
        let names = self.served_names();
        match asked {
            None => Ok(names.into_iter().next().unwrap_or_default()),
            Some(m) if names.contains(&m) => Ok(m),
            // No replica has answered yet: the request fails with 503 later.
            Some(m) if names.is_empty() => Ok(m),
            Some(m) => Err(ApiError::ModelNotFound(format!(
                "The model `{m}` does not exist here; this gateway serves {}",
                names
                    .iter()
                    .map(|n| format!("`{n}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }

    /// Ready for traffic: not draining and at least one healthy replica,
    /// or holding requests until one starts (`--cold-start-hold`).
    pub fn is_ready(&self) -> bool {
        !self.admission.is_draining()
            && (self.replicas.routable_count() > 0 || !self.config.cold_start_hold.is_zero())
    }
}
