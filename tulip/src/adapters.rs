//! LoRA adapters loaded over the served model: the names a request picks
//! (`EmbedRequest.adapter`), loaded at start (`--lora`, by the launcher) or
//! by the `LoadAdapter` call. A request holds its adapter until it is
//! answered, so an unload waits for the requests already holding it and
//! loses none of them; requests after it get NOT_FOUND.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use proto::tulip::v1 as pb;

use crate::engine::EngineHandle;
use crate::error::TulipError;
use crate::model::Adapter;

/// How long an unload waits for the requests holding the adapter.
const UNLOAD_WAIT: Duration = Duration::from_secs(120);

pub struct Adapters {
    loaded: RwLock<BTreeMap<Arc<str>, Arc<Adapter>>>,
    /// The engine's bounds (said in `Info`; the engine enforces them).
    pub max: u32,
    pub max_rank: u32,
}

impl Adapters {
    pub fn new(loaded: Vec<Adapter>, max: u32, max_rank: u32) -> Self {
        let loaded = loaded
            .into_iter()
            .map(|a| (Arc::clone(&a.name), Arc::new(a)))
            .collect();
        Self {
            loaded: RwLock::new(loaded),
            max,
            max_rank,
        }
    }

    /// The adapter a request names, held for the request's life.
    pub fn get(&self, name: &str) -> Result<Arc<Adapter>, TulipError> {
        let loaded = self.loaded.read().unwrap_or_else(|e| e.into_inner());
        loaded.get(name).cloned().ok_or_else(|| {
            let names: Vec<&str> = loaded.keys().map(|k| &**k).collect();
            TulipError::NotFound(format!(
                "no LoRA adapter `{name}` is loaded here (loaded: {})",
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            ))
        })
    }

    pub fn list(&self) -> Vec<pb::Adapter> {
        let loaded = self.loaded.read().unwrap_or_else(|e| e.into_inner());
        loaded.values().map(|a| a.proto()).collect()
    }

    /// Loads `path` as `name` in the engine (off the async threads: it
    /// reads files and takes the GIL); the same name and path again is a
    /// no-op, another path under a loaded name is refused.
    pub async fn load(
        &self,
        engine: &Arc<EngineHandle>,
        name: &str,
        path: &str,
    ) -> Result<pb::Adapter, TulipError> {
        if name.is_empty() || path.is_empty() {
            return Err(TulipError::InvalidArgument(
                "an adapter needs a name and a path".into(),
            ));
        }
        if let Ok(a) = self.get(name) {
            if a.path == path {
                return Ok(a.proto());
            }
            return Err(TulipError::Refused(format!(
                "the adapter `{name}` is loaded from {}; unload it first to load {path}",
                a.path
            )));
        }
        let (engine, n, p) = (Arc::clone(engine), name.to_owned(), path.to_owned());
        let loaded = tokio::task::spawn_blocking(move || engine.load_adapter(&n, &p))
            .await
            .map_err(|e| TulipError::Engine(format!("loading the adapter: {e}")))??;
        let proto = loaded.proto();
        let mut map = self.loaded.write().unwrap_or_else(|e| e.into_inner());
        map.insert(Arc::clone(&loaded.name), Arc::new(loaded));
        tracing::info!(adapter = %proto.name, path = %proto.path, rank = proto.rank, "LoRA adapter loaded");
        Ok(proto)
    }

    /// Takes `name` away from new requests, waits for the requests holding
    /// it, then unloads it from the engine.
    pub async fn unload(&self, engine: &Arc<EngineHandle>, name: &str) -> Result<(), TulipError> {
        let adapter = {
            let mut map = self.loaded.write().unwrap_or_else(|e| e.into_inner());
            map.remove(name)
        }
        .ok_or_else(|| TulipError::NotFound(format!("no LoRA adapter `{name}` is loaded here")))?;
        let since = Instant::now();
        while Arc::strong_count(&adapter) > 1 {
            if since.elapsed() > UNLOAD_WAIT {
                tracing::warn!(adapter = %name, "unloading while requests still hold the adapter");
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let (engine, n) = (Arc::clone(engine), name.to_owned());
        tokio::task::spawn_blocking(move || engine.unload_adapter(&n))
            .await
            .map_err(|e| TulipError::Engine(format!("unloading the adapter: {e}")))??;
        tracing::info!(adapter = %name, "LoRA adapter unloaded");
        Ok(())
    }
}
