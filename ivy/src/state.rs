//! What every request handler shares.

use std::sync::Arc;
use std::time::Instant;

use ivy_tokenizer::Tokenizer;

use crate::config::Config;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::model::templates::{TemplateStore, Templates};
use crate::request::admission::Admission;
use crate::request::auth::ApiKey;
use crate::upstream::pools::Pool;
use crate::upstream::pools::Pools;
use crate::upstream::set::ReplicaSet;

pub type AppState = Arc<Gateway>;

pub struct Gateway {
    pub config: Config,
    /// Every replica Ivy knows (all models).
    pub replicas: Arc<ReplicaSet>,
    /// One pool per model the replicas serve (`upstream/pools.rs`).
    pub pools: Arc<Pools>,
    pub templates: Arc<TemplateStore>,
    pub admission: Admission,
    pub metrics: Arc<Metrics>,
    pub api_key: ApiKey,
    pub spinner: Arc<crate::upstream::spin::Spinner>,
    /// The Batch API's store (`--batch-dir`), if on.
    pub batches: Option<Arc<crate::batch::Batches>>,
    /// Start time (Unix seconds): the `created` of `GET /v1/models`.
    pub started_unix: u64,
    /// Permits for images being prepared at once (`--image-prep-threads`).
    pub image_prep: Arc<tokio::sync::Semaphore>,
}

impl Gateway {
    /// When a request arriving now must be answered by.
    pub fn deadline(&self) -> Instant {
        Instant::now() + self.config.request_timeout
    }

    /// The pool a request names (`model`; `None`: the default model) and
    /// the name to answer under: 404 `model_not_found` for a model not
    /// served here, 503 while its replicas are not up. The pool's name
    /// becomes the request's `model` metric label.
    pub fn pool(&self, asked: Option<&str>) -> Result<(Arc<Pool>, String), ApiError> {
        let (pool, name) = self.pools.resolve(asked)?;
        if crate::request::id::adapter().is_empty() {
            crate::request::id::set_model_label(&pool.name);
        }
        Ok((pool, name))
    }

    /// The prompt templates in force for `pool`: the `--config` file's
    /// (its section for the model, else its top level), else the model's
    /// own (from the replicas), else none.
    pub fn templates(&self, pool: &Pool) -> Arc<Templates> {
        if !self.templates.has_file() {
            if let Some(t) = pool.model.templates() {
                return t;
            }
            return self.templates.get();
        }
        self.templates.get().for_model(&pool.served_names())
    }

    /// The tokenizer `pool`'s requests are tokenized with: `--tokenizer`
    /// (default model only), else the one its replicas serve.
    pub fn tokenizer(&self, pool: &Pool) -> Result<Arc<Tokenizer>, ApiError> {
        pool.model.tokenizer().ok_or_else(|| pool.no_replica())
    }

    /// Ready for traffic: not draining and at least one healthy replica,
    /// or holding requests until one starts (`--cold-start-hold`).
    pub fn is_ready(&self) -> bool {
        !self.admission.is_draining()
            && (self.replicas.routable_count() > 0 || !self.config.cold_start_hold.is_zero())
    }
}
