//! The model registry: one pool per model the replicas serve. Each replica
//! joins the pool of the model its `Info` names (a new model opens a new
//! pool), so `--tulip a,b,c` or several `--tulip-dns` names put several
//! models behind one Ivy with no other flag. A pool has its own model info,
//! tokenizer, prompts, served names and balancing; a replica whose model or
//! tokenizer differs from its pool's (same id, other files) is refused.
//! Pools are never removed: a model whose replicas all went away answers
//! 503 (not 404) until one comes back.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use ivy_tokenizer::Tokenizer;
use proto::tulip::v1::InfoResponse;

use super::adapters::PoolAdapters;
use super::balancer::{self, Policy};
use super::batch_slots::BatchSlots;
use super::replica::{Health, Replica};
use super::set::ReplicaSet;
use crate::config::Balance;
use crate::error::ApiError;
use crate::model::ServedModel;

/// What every pool is built with (flags).
pub struct Settings {
    pub balance: Balance,
    pub batch_chunks_per_replica: usize,
    /// `--chunk-tokens`: the size of a chunk the batch bound counts in.
    pub chunk_tokens: usize,
    /// `--default-model`: the pool TEI routes (no `model` field) go to;
    /// unset, the first pool that came up.
    pub default_model: Option<String>,
    /// `--tokenizer`: the default pool tokenizes with it.
    pub tokenizer: Option<Arc<Tokenizer>>,
    /// `--served-model-name`: the default pool's names.
    pub served_model_name: Vec<String>,
}

/// The replicas serving one model, and how requests for it are served.
pub struct Pool {
    /// The model id: the pool's key and its metric label (bounded: one per
    /// model a replica served, never from request text).
    pub name: Arc<str>,
    index: usize,
    pub model: ServedModel,
    pub policy: Box<dyn Policy>,
    pub batch_slots: BatchSlots,
    /// `--served-model-name` when this is the default pool.
    names_override: Vec<String>,
    set: Arc<ReplicaSet>,
    /// LoRA adapters over this model, each served under its own name.
    pub adapters: PoolAdapters,
}

impl Pool {
    /// Its replicas (any health), in the set's order.
    pub fn replicas(&self) -> Vec<Arc<Replica>> {
        self.set
            .snapshot()
            .iter()
            .filter(|r| r.pool() == Some(self.index))
            .cloned()
            .collect()
    }

    pub fn routable_count(&self) -> usize {
        self.set
            .snapshot()
            .iter()
            .filter(|r| r.pool() == Some(self.index) && r.is_routable())
            .count()
    }

    /// What its replicas serve (the first one's `Info`).
    pub fn info(&self) -> Option<Arc<InfoResponse>> {
        self.model.info()
    }

    /// The names it is served under: `--served-model-name` for the default
    /// pool, else the model id and its last path part.
    pub fn served_names(&self) -> Vec<String> {
        if !self.names_override.is_empty() {
            return self.names_override.clone();
        }
        names_of(&self.name)
    }

    /// The 503 when none of its replicas takes work, with each one's reason:
    /// its own and those that have not said what they serve yet first, then
    /// those serving another model (a replica restarted with another model
    /// joined that model's pool).
    pub fn no_replica(&self) -> ApiError {
        let all = self.set.snapshot();
        let (own, others): (Vec<&Arc<Replica>>, Vec<&Arc<Replica>>) = all
            .iter()
            .partition(|r| r.pool().is_none_or(|p| p == self.index));
        let reasons = own
            .iter()
            .map(|r| r.unavailable_reason())
            .chain(others.iter().map(|r| match r.info() {
                Some(info) => format!(
                    "{} serves model `{}` now (name it in `model` to use it)",
                    r.url, info.model_id
                ),
                None => r.unavailable_reason(),
            }))
            .collect();
        super::no_replica_for(reasons, Some(&self.name))
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("name", &self.name).finish()
    }
}

/// A model id and its last path part (`all-MiniLM-L6-v2` for
/// `sentence-transformers/all-MiniLM-L6-v2`).
fn names_of(model_id: &str) -> Vec<String> {
    let mut names = vec![model_id.to_string()];
    if let Some((_, last)) = model_id.rsplit_once('/') {
        if !last.is_empty() {
            names.push(last.to_string());
        }
    }
    names
}

pub struct Pools {
    set: Arc<ReplicaSet>,
    list: RwLock<Arc<Vec<Arc<Pool>>>>,
    settings: Settings,
    /// Index of the default pool once it exists (usize::MAX before).
    default: AtomicUsize,
}

impl Pools {
    pub fn new(set: Arc<ReplicaSet>, settings: Settings) -> Self {
        Self {
            set,
            list: RwLock::default(),
            settings,
            default: AtomicUsize::new(usize::MAX),
        }
    }

    /// Every pool, in the order they came up.
    pub fn all(&self) -> Arc<Vec<Arc<Pool>>> {
        Arc::clone(&self.list.read().expect("pools lock poisoned"))
    }

    /// The replicas of every pool (what Ivy routes to at all).
    pub fn set(&self) -> &ReplicaSet {
        &self.set
    }

    pub fn set_arc(&self) -> Arc<ReplicaSet> {
        Arc::clone(&self.set)
    }

    /// The pool serving under `name` (a model id, its last path part, or a
    /// `--served-model-name`).
    pub fn find(&self, name: &str) -> Option<Arc<Pool>> {
        self.all()
            .iter()
            .find(|p| p.served_names().iter().any(|n| n == name))
            .cloned()
    }

    /// The pool for requests that name no model: `--default-model`'s,
    /// else the first that came up.
    pub fn default_pool(&self) -> Option<Arc<Pool>> {
        let i = self.default.load(Ordering::Acquire);
        self.all().get(i).cloned()
    }

    /// Puts a replica that answered `Info` in its model's pool (opening
    /// one for a new model); Err: refused (other files under the pool's
    /// model id, or a tokenizer that does not load).
    pub fn accept(&self, replica: &Replica, info: &Arc<InfoResponse>) -> Result<Arc<Pool>, String> {
        let pool = match self.all().iter().find(|p| *p.name == *info.model_id) {
            Some(p) => Arc::clone(p),
            None => self.open(info)?,
        };
        replica.set_pool(pool.index);
        pool.model.accept(info)?;
        pool.adapters.learn(info);
        Ok(pool)
    }

    /// The pool serving LoRA adapter `name`.
    pub fn adapter_pool(&self, name: &str) -> Option<Arc<Pool>> {
        self.all()
            .iter()
            .find(|p| p.adapters.get(name).is_some())
            .cloned()
    }

    /// A new pool for `info`'s model, unless another replica opened it
    /// meanwhile.
    fn open(&self, info: &Arc<InfoResponse>) -> Result<Arc<Pool>, String> {
        let mut list = self.list.write().expect("pools lock poisoned");
        if let Some(p) = list.iter().find(|p| *p.name == *info.model_id) {
            return Ok(Arc::clone(p));
        }
        let is_default = match &self.settings.default_model {
            Some(d) => names_of(&info.model_id).contains(d),
            None => list.is_empty(),
        };
        let tokenizer = if is_default {
            self.settings.tokenizer.clone()
        } else {
            None
        };
        let model = ServedModel::with_tokenizer(tokenizer);
        // Loads the tokenizer: a model whose tokenizer does not load gets
        // no pool (its replicas are refused).
        model.accept(info)?;
        let index = list.len();
        let pool = Arc::new(Pool {
            name: Arc::from(info.model_id.as_str()),
            index,
            model,
            policy: balancer::policy(self.settings.balance),
            batch_slots: BatchSlots::new(
                self.settings.batch_chunks_per_replica,
                self.settings.chunk_tokens,
            ),
            names_override: if is_default {
                self.settings.served_model_name.clone()
            } else {
                Vec::new()
            },
            set: Arc::clone(&self.set),
            adapters: PoolAdapters::default(),
        });
        let mut next = Vec::clone(&list);
        next.push(Arc::clone(&pool));
        *list = Arc::new(next);
        if is_default {
            self.default.store(index, Ordering::Release);
        }
        tracing::info!(model = %info.model_id, pools = index + 1, default = is_default, "model pool opened");
        Ok(pool)
    }

    /// The pool a request names (`asked`), else the default one, with the
    /// name to answer under. An unknown name is 404 `model_not_found`
    /// (listing what is served) once every replica has said what it serves;
    /// before that, and for a model with no replica up, 503.
    pub fn resolve(&self, asked: Option<&str>) -> Result<(Arc<Pool>, String), ApiError> {
        match asked {
            None => {
                let pool = self.default_pool().ok_or_else(|| self.none_yet(None))?;
                let name = pool.served_names().into_iter().next().unwrap_or_default();
                Ok((pool, name))
            }
            Some(m) => match self.find(m) {
                Some(pool) => Ok((pool, m.to_string())),
                None => match self.adapter_pool(m) {
                    Some(pool) if crate::request::id::set_adapter(m) => Ok((pool, m.to_string())),
                    Some(_) => Err(ApiError::Internal(format!(
                        "the adapter `{m}` was asked for outside a request"
                    ))),
                    None => self.unknown(m),
                },
            },
        }
    }

    /// 503 while a replica may still serve `m`, else 404 listing the names.
    fn unknown(&self, m: &str) -> Result<(Arc<Pool>, String), ApiError> {
        if self.some_replica_unknown() {
            return Err(self.none_yet(Some(m)));
        }
        Err(ApiError::ModelNotFound(format!(
            "The model `{m}` does not exist here; this gateway serves {}",
            self.served_names()
                .iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", ")
        )))
    }

    /// Every pool's served names, in pool order, then its adapters'.
    pub fn served_names(&self) -> Vec<String> {
        self.all()
            .iter()
            .flat_map(|p| {
                let adapters = p.adapters.list().into_iter().map(|(n, _)| n);
                p.served_names().into_iter().chain(adapters)
            })
            .collect()
    }

    /// A replica has not said yet what it serves (starting, or down before
    /// its first answer): it may serve the model asked for.
    fn some_replica_unknown(&self) -> bool {
        self.set
            .snapshot()
            .iter()
            .any(|r| r.pool().is_none() && r.health() != Health::Mismatch)
    }

    /// The 503 before the pool asked for (or the default one) exists.
    fn none_yet(&self, model: Option<&str>) -> ApiError {
        let model = model.or(self.settings.default_model.as_deref());
        let reasons = self
            .set
            .snapshot()
            .iter()
            .map(|r| r.unavailable_reason())
            .collect();
        super::no_replica_for(reasons, model)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(model: &str, sha: &str) -> Arc<InfoResponse> {
        let tok = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/data/tokenizers/all-minilm-l6-v2/tokenizer.json"
        ))
        .unwrap();
        Arc::new(InfoResponse {
            model_id: model.into(),
            dimension: 8,
            tokenizer_json: tok.into(),
            tokenizer_sha256: sha.into(),
            ..Default::default()
        })
    }

    fn pools(default_model: Option<&str>) -> (Pools, Vec<Arc<Replica>>) {
        let set = Arc::new(ReplicaSet::default());
        let urls: Vec<String> = (0..4).map(|i| format!("http://10.0.0.{i}:7070")).collect();
        set.set_targets(&urls).unwrap();
        let settings = Settings {
            balance: Balance::LeastLoaded,
            batch_chunks_per_replica: 0,
            chunk_tokens: 0,
            default_model: default_model.map(String::from),
            tokenizer: None,
            served_model_name: Vec::new(),
        };
        let replicas = set.snapshot().to_vec();
        (Pools::new(set, settings), replicas)
    }

    #[tokio::test]
    async fn replicas_group_by_model_and_mismatches_are_refused() {
        let (pools, rs) = pools(Some("reranker"));
        // Nothing answered yet: 503, not 404.
        assert!(matches!(
            pools.resolve(Some("org/embedder")),
            Err(ApiError::Unavailable(_))
        ));
        pools.accept(&rs[0], &info("org/embedder", "aa")).unwrap();
        pools.accept(&rs[1], &info("org/reranker", "bb")).unwrap();
        pools.accept(&rs[2], &info("org/embedder", "aa")).unwrap();
        // Same model id, another tokenizer: refused as before.
        let err = pools
            .accept(&rs[3], &info("org/embedder", "cc"))
            .unwrap_err();
        assert!(err.contains("another tokenizer"), "{err}");
        rs[3].set_health(Health::Mismatch, &err, false);
        assert_eq!(pools.all().len(), 2);
        let embedder = pools.find("embedder").unwrap();
        assert_eq!(
            embedder
                .replicas()
                .iter()
                .map(|r| r.url.as_str())
                .collect::<Vec<_>>(),
            [
                "http://10.0.0.0:7070",
                "http://10.0.0.2:7070",
                "http://10.0.0.3:7070"
            ]
        );
        // `--default-model reranker` names the second pool to come up.
        let (default, name) = pools.resolve(None).unwrap();
        assert_eq!(
            (&*default.name, name.as_str()),
            ("org/reranker", "org/reranker")
        );
        assert_eq!(
            &*pools.resolve(Some("org/embedder")).unwrap().0.name,
            "org/embedder"
        );
        let err = pools.resolve(Some("gpt-4")).unwrap_err().to_string();
        assert!(
            err.contains("`gpt-4`") && err.contains("`org/reranker`"),
            "{err}"
        );
        assert_eq!(
            pools.served_names(),
            ["org/embedder", "embedder", "org/reranker", "reranker"]
        );
    }

    #[tokio::test]
    async fn without_a_default_model_the_first_pool_is_the_default() {
        let (pools, rs) = pools(None);
        assert!(pools.resolve(None).is_err());
        pools.accept(&rs[1], &info("b", "bb")).unwrap();
        pools.accept(&rs[0], &info("a", "aa")).unwrap();
        assert_eq!(&*pools.resolve(None).unwrap().0.name, "b");
    }
}
