//! Ivy's flags for the OpenAI Batch API (`batch/`): where files and batches
//! are kept, the bounds on what a file may hold, and how work is taken.
//! Part of `Config` (flattened).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::seconds::parse_seconds;

#[derive(Debug, Clone, Args)]
pub struct BatchConfig {
    /// Directory of the Batch API's embedded store: batches in SQLite
    /// (`batches.sqlite3`) and files under `files/`. Unset (and no cluster
    /// store given), the Batch API's routes answer 404 saying so. Several
    /// Ivy processes may share it (on one machine's disk): each takes work
    /// under a lease.
    #[arg(long, env = "IVY_BATCH_DIR")]
    pub batch_dir: Option<PathBuf>,

    /// PostgreSQL for the Batch API's records instead of SQLite
    /// (`postgres://user:password@host:5432/database`), so Ivy replicas on
    /// many machines share the work. With --batch-object-store-url it needs
    /// no --batch-dir. Plain TCP: no TLS to the database.
    #[arg(long, env = "IVY_BATCH_DATABASE_URL", hide_env_values = true)]
    pub batch_database_url: Option<String>,

    /// An S3-compatible object store for the Batch API's files instead of
    /// --batch-dir (`s3://bucket` or `s3://bucket/prefix`); credentials,
    /// region and endpoint from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
    /// AWS_REGION, AWS_ENDPOINT_URL (and AWS_ALLOW_HTTP=true for a
    /// plain-HTTP endpoint).
    #[arg(long, env = "IVY_BATCH_OBJECT_STORE_URL")]
    pub batch_object_store_url: Option<String>,

    /// Largest file `POST /v1/files` accepts, in bytes (OpenAI's bound for
    /// batch input is 200 MB); refused with 413 before it is stored.
    #[arg(long, env = "IVY_BATCH_MAX_FILE_BYTES", default_value_t = 200 * 1024 * 1024)]
    pub batch_max_file_bytes: u64,

    /// Most requests (lines) in one batch input file (OpenAI's: 50,000).
    #[arg(long, env = "IVY_BATCH_MAX_LINES", default_value_t = 50_000)]
    pub batch_max_lines: u64,

    /// Lines per shard: the unit of work one Ivy leases, so several Ivy
    /// processes work on one batch.
    #[arg(long, env = "IVY_BATCH_SHARD_LINES", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    pub batch_shard_lines: u64,

    /// Seconds a lease on a shard lasts unless renewed (the holder renews it
    /// at each checkpoint, every third of it at least); a dead holder's
    /// shard is taken over this long after its last checkpoint.
    #[arg(long, env = "IVY_BATCH_LEASE", default_value = "30", value_parser = parse_seconds)]
    pub batch_lease: Duration,

    /// Batch requests (lines) this Ivy keeps in flight at once; they run at
    /// priority batch, behind interactive queries, within
    /// --batch-chunks-per-replica. 0 takes no batch work here (the routes
    /// still serve).
    #[arg(long, env = "IVY_BATCH_CONCURRENCY", default_value_t = 64)]
    pub batch_concurrency: usize,
}

impl BatchConfig {
    /// Whether a store is configured (the Batch API is on).
    pub fn enabled(&self) -> bool {
        self.batch_dir.is_some()
            || (self.batch_database_url.is_some() && self.batch_object_store_url.is_some())
    }

    /// How the store is kept, for the start-up line (no secrets).
    pub fn describe(&self) -> String {
        let records = if self.batch_database_url.is_some() {
            "postgres"
        } else {
            "sqlite"
        };
        let files = if self.batch_object_store_url.is_some() {
            "object-store"
        } else {
            "dir"
        };
        if self.enabled() {
            format!("{records}+{files}")
        } else {
            "off".into()
        }
    }
}
