//! LoRA adapters, each served as a model name of its own over its base
//! model's pool (`GET /v1/models` lists it with its parent, as vLLM does):
//! learnt from the replicas' `Info` (adapters Tulip loaded at start with
//! `--lora`), or loaded through Ivy (`POST /v1/load_lora_adapter`), which
//! loads them on every replica of the pool and on each replica that joins
//! it later, so any replica can take any request for them.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use proto::tulip::v1::InfoResponse;

use super::replica::Replica;
use crate::error::ApiError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adapter {
    pub path: String,
    pub rank: u32,
    /// Loaded through Ivy: loaded again on replicas that join later.
    pub by_ivy: bool,
}

/// One pool's adapters by name.
#[derive(Default)]
pub struct PoolAdapters(RwLock<BTreeMap<String, Adapter>>);

impl PoolAdapters {
    /// Adds the adapters a replica's `Info` lists that are not known yet.
    pub fn learn(&self, info: &InfoResponse) {
        if info.adapters.is_empty() {
            return;
        }
        let mut map = self.0.write().expect("adapters lock poisoned");
        for a in &info.adapters {
            map.entry(a.name.clone()).or_insert_with(|| Adapter {
                path: a.path.clone(),
                rank: a.rank,
                by_ivy: false,
            });
        }
    }

    pub fn get(&self, name: &str) -> Option<Adapter> {
        self.0
            .read()
            .expect("adapters lock poisoned")
            .get(name)
            .cloned()
    }

    pub fn list(&self) -> Vec<(String, Adapter)> {
        let map = self.0.read().expect("adapters lock poisoned");
        map.iter().map(|(n, a)| (n.clone(), a.clone())).collect()
    }

    fn insert(&self, name: &str, adapter: Adapter) {
        let mut map = self.0.write().expect("adapters lock poisoned");
        map.insert(name.to_string(), adapter);
    }

    fn remove(&self, name: &str) -> Option<Adapter> {
        self.0.write().expect("adapters lock poisoned").remove(name)
    }
}

/// Loads `path` as `name` on every replica of a pool (`replicas`, those up)
/// and adds it to the pool's `adapters`; the first refusal (a bad adapter:
/// its reason) is the answer and nothing is kept.
pub async fn load(
    adapters: &PoolAdapters,
    replicas: Vec<Arc<Replica>>,
    name: &str,
    path: &str,
) -> Result<Adapter, ApiError> {
    if let Some(a) = adapters.get(name) {
        if a.path == path {
            return Ok(a);
        }
        return Err(ApiError::validation(
            "lora_name",
            format!(
                "the adapter `{name}` is loaded from {}; unload it first",
                a.path
            ),
        ));
    }
    let calls = replicas.iter().map(|r| r.load_adapter(name, path));
    let results = futures_util::future::join_all(calls).await;
    let mut rank = 0;
    for (replica, result) in replicas.iter().zip(&results) {
        match result {
            Ok(a) => rank = a.rank,
            Err(status) => {
                // Where it did load, it must not stay half-served.
                for (r, res) in replicas.iter().zip(&results) {
                    if res.is_ok() {
                        let _ = r.unload_adapter(name).await;
                    }
                }
                return Err(ApiError::validation(
                    "lora_path",
                    format!(
                        "the adapter `{name}` was refused by {}: {}",
                        replica.url,
                        status.message()
                    ),
                ));
            }
        }
    }
    let adapter = Adapter {
        path: path.to_string(),
        rank,
        by_ivy: true,
    };
    adapters.insert(name, adapter.clone());
    Ok(adapter)
}

/// Stops serving `name` and unloads it from every replica of its pool
/// (each waits for the requests holding it).
pub async fn unload(
    adapters: &PoolAdapters,
    replicas: Vec<Arc<Replica>>,
    name: &str,
) -> Result<(), ApiError> {
    if adapters.remove(name).is_none() {
        return Err(ApiError::ModelNotFound(format!(
            "no LoRA adapter `{name}` is loaded here"
        )));
    }
    let calls = replicas.iter().map(|r| r.unload_adapter(name));
    for (replica, result) in replicas
        .iter()
        .zip(futures_util::future::join_all(calls).await)
    {
        if let Err(status) = result {
            if status.code() != tonic::Code::NotFound {
                tracing::warn!(replica = %replica.url, adapter = %name, error = %status.message(),
                               "unloading the adapter failed");
            }
        }
    }
    Ok(())
}

/// Loads on `replica` the adapters of its pool (`adapters`) loaded through
/// Ivy that it lacks (a replica that joined, or came back, after them), in
/// the background.
pub fn catch_up(adapters: &PoolAdapters, replica: &Arc<Replica>) {
    let missing: Vec<(String, Adapter)> = {
        let mut have = replica.adapters.lock().expect("replica lock poisoned");
        let missing: Vec<_> = adapters
            .list()
            .into_iter()
            .filter(|(n, a)| a.by_ivy && !have.contains(n))
            .collect();
        // Marked now so the next health check does not load them again.
        have.extend(missing.iter().map(|(n, _)| n.clone()));
        missing
    };
    for (name, adapter) in missing {
        let replica = Arc::clone(replica);
        tokio::spawn(async move {
            if let Err(status) = replica.load_adapter(&name, &adapter.path).await {
                tracing::error!(replica = %replica.url, adapter = %name, error = %status.message(),
                                "loading the adapter on a replica that joined failed");
                replica
                    .adapters
                    .lock()
                    .expect("replica lock poisoned")
                    .remove(&name);
            }
        });
    }
}
