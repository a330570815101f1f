//! The OpenAI Batch API for embeddings: files uploaded with
//! `POST /v1/files`, batches created over them with `POST /v1/batches`,
//! run by every Ivy that shares the store at priority `batch`, results in
//! output and error files in OpenAI's line format. Kept in SQLite and a
//! directory (`--batch-dir`): nothing to install, durable across restarts;
//! or, for a cluster, in PostgreSQL and an S3-compatible object store.
//!
//! `store.rs` keeps the records and leases, `blobs.rs` the bytes,
//! `validate.rs` checks an input file, `lines.rs` runs one line,
//! `worker.rs` takes and does the work, `objects.rs` renders the API's
//! objects.

mod blobs;
pub mod clock;
pub mod ids;
mod lines;
pub mod objects;
pub mod store;
mod validate;
mod worker;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::Router;

pub use self::blobs::Blobs;
use self::store::Store;
use crate::config::batch::BatchConfig;
use crate::metrics::Metrics;

/// The endpoints a batch may run, as OpenAI names them in `endpoint` and
/// each line's `url`.
pub const ENDPOINTS: [&str; 3] = ["/v1/embeddings", "/v1/rerank", "/v2/embed"];

pub struct Batches {
    pub store: Store,
    pub blobs: Blobs,
    pub config: BatchConfig,
    metrics: Arc<Metrics>,
    /// Set when Ivy drains: no new work is taken, and a shard being run
    /// is checkpointed and given back.
    stopping: AtomicBool,
    /// Wakes this Ivy's worker from its idle wait (a batch was created or
    /// cancelled here).
    wake: tokio::sync::Notify,
}

impl Batches {
    /// Opens the store: records in PostgreSQL (`--batch-database-url`) or
    /// SQLite in `--batch-dir`, files in an object store
    /// (`--batch-object-store-url`) or `--batch-dir`. None given: no Batch
    /// API; half a cluster store without a directory is refused.
    pub fn open(config: &BatchConfig, metrics: Arc<Metrics>) -> Result<Option<Arc<Self>>, String> {
        if !config.enabled() {
            if config.batch_database_url.is_some() || config.batch_object_store_url.is_some() {
                return Err(
                    "the Batch API's cluster store needs both --batch-database-url and \
                            --batch-object-store-url (or --batch-dir for the other half)"
                        .into(),
                );
            }
            return Ok(None);
        }
        if let Some(dir) = &config.batch_dir {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("--batch-dir {}: {e}", dir.display()))?;
        }
        let dir = || {
            config
                .batch_dir
                .as_deref()
                .expect("enabled() without both urls")
        };
        // Unique per process: a restarted Ivy never mistakes an old lease
        // for its own.
        let holder = format!("{}-{}", std::process::id(), ids::new(""));
        let store = match &config.batch_database_url {
            Some(url) => Store::open_postgres(url, holder)?,
            None => Store::open_sqlite(&dir().join("batches.sqlite3"), holder)?,
        };
        let blobs = match &config.batch_object_store_url {
            Some(url) => Blobs::open_object_store(url)?,
            None => Blobs::open_dir(Path::new(dir()))?,
        };
        Ok(Some(Arc::new(Self {
            store,
            blobs,
            config: config.clone(),
            metrics,
            stopping: AtomicBool::new(false),
            wake: tokio::sync::Notify::new(),
        })))
    }

    /// Starts taking work; `router` serves the lines (`http::batch_router`).
    pub fn start(self: &Arc<Self>, router: Router) {
        worker::spawn(Arc::clone(self), router);
    }

    /// There is new work (or a batch to end) in the store: look now.
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Ivy drains: stop taking batch work, give back what is held.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Relaxed);
    }

    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }

    fn lease_ms(&self) -> i64 {
        self.config.batch_lease.as_millis() as i64
    }
}

/// `completion_window` as seconds: `<hours>h`, 1 to 720 hours (OpenAI
/// accepts only `24h`; longer or shorter windows are Ivy's).
pub fn window_seconds(window: &str) -> Option<i64> {
    let hours: i64 = window.strip_suffix('h')?.parse().ok()?;
    (1..=720).contains(&hours).then_some(hours * 3600)
}
