//! The Batch API's records in SQLite: files, batches, the shards a batch
//! is cut into (each leased to one Ivy at a time) and the checkpointed
//! chunks of output. Every state change is one transaction, conditional on
//! the lease it is made under, so a holder that lost its lease changes
//! nothing. Several Ivy processes may share the database file (WAL, busy
//! timeout). Calls run on the blocking pool.

mod work;

use std::path::Path;
use std::sync::{Arc, Mutex};

use rusqlite::{params, Connection, OptionalExtension, Row};

use super::clock::now_s;
use crate::error::ApiError;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, filename TEXT NOT NULL, purpose TEXT NOT NULL,
    bytes INTEGER NOT NULL, created_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, endpoint TEXT NOT NULL, input_file_id TEXT NOT NULL,
    completion_window TEXT NOT NULL, metadata TEXT, model TEXT, status TEXT NOT NULL, errors TEXT,
    output_file_id TEXT, error_file_id TEXT,
    created_at INTEGER NOT NULL, in_progress_at INTEGER, expires_at INTEGER NOT NULL,
    finalizing_at INTEGER, completed_at INTEGER, failed_at INTEGER, expired_at INTEGER,
    cancelling_at INTEGER, cancelled_at INTEGER,
    total INTEGER NOT NULL DEFAULT 0, completed INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0, input_tokens INTEGER NOT NULL DEFAULT 0,
    ending TEXT, holder TEXT, lease_until INTEGER, epoch INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS shards (
    batch_id TEXT NOT NULL, shard INTEGER NOT NULL, byte_start INTEGER NOT NULL,
    byte_end INTEGER NOT NULL, lines INTEGER NOT NULL, done_lines INTEGER NOT NULL DEFAULT 0,
    holder TEXT, lease_until INTEGER, epoch INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (batch_id, shard));
CREATE TABLE IF NOT EXISTS chunks (
    batch_id TEXT NOT NULL, shard INTEGER NOT NULL, first_line INTEGER NOT NULL,
    lines INTEGER NOT NULL, out_key TEXT, err_key TEXT,
    PRIMARY KEY (batch_id, shard, first_line));
";

/// States a batch never leaves.
pub const TERMINAL: [&str; 4] = ["completed", "failed", "expired", "cancelled"];

#[derive(Debug, Clone)]
pub struct FileRow {
    pub id: String,
    pub filename: String,
    pub purpose: String,
    pub bytes: i64,
    pub created_at: i64,
}

#[derive(Debug, Clone)]
pub struct BatchRow {
    pub id: String,
    pub endpoint: String,
    pub input_file_id: String,
    pub completion_window: String,
    pub metadata: Option<String>,
    pub model: Option<String>,
    pub status: String,
    pub errors: Option<String>,
    pub output_file_id: Option<String>,
    pub error_file_id: Option<String>,
    pub times: [Option<i64>; 9],
    pub total: i64,
    pub completed: i64,
    pub failed: i64,
    pub input_tokens: i64,
}

/// The names of `BatchRow::times`, in order, as the batch object spells them.
pub const TIMES: [&str; 9] = [
    "created_at",
    "in_progress_at",
    "expires_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
];

const BATCH_COLUMNS: &str = "id, endpoint, input_file_id, completion_window, metadata, model, status, errors, \
    output_file_id, error_file_id, created_at, in_progress_at, expires_at, finalizing_at, completed_at, \
    failed_at, expired_at, cancelling_at, cancelled_at, total, completed, failed, input_tokens";

fn batch_row(r: &Row) -> rusqlite::Result<BatchRow> {
    let mut times = [None; 9];
    for (i, t) in times.iter_mut().enumerate() {
        *t = r.get(10 + i)?;
    }
    Ok(BatchRow {
        id: r.get(0)?,
        endpoint: r.get(1)?,
        input_file_id: r.get(2)?,
        completion_window: r.get(3)?,
        metadata: r.get(4)?,
        model: r.get(5)?,
        status: r.get(6)?,
        errors: r.get(7)?,
        output_file_id: r.get(8)?,
        error_file_id: r.get(9)?,
        times,
        total: r.get(19)?,
        completed: r.get(20)?,
        failed: r.get(21)?,
        input_tokens: r.get(22)?,
    })
}

fn file_row(r: &Row) -> rusqlite::Result<FileRow> {
    Ok(FileRow {
        id: r.get(0)?,
        filename: r.get(1)?,
        purpose: r.get(2)?,
        bytes: r.get(3)?,
        created_at: r.get(4)?,
    })
}

/// A new batch, as `POST /v1/batches` accepted it.
pub struct NewBatch {
    pub id: String,
    pub owner: String,
    pub endpoint: String,
    pub input_file_id: String,
    pub completion_window: String,
    pub window_s: i64,
    pub metadata: Option<String>,
}

/// A shard leased to this process: lines `[done_lines, lines)` of the
/// input's bytes `[byte_start, byte_end)` are still to run.
#[derive(Debug, Clone)]
pub struct Lease {
    pub batch_id: String,
    pub shard: i64,
    pub byte_start: i64,
    pub byte_end: i64,
    pub lines: i64,
    pub done_lines: i64,
    pub epoch: i64,
}

/// A batch whose end (`completed`, `cancelled` or `expired`) this process
/// writes: its output and error files, then its final state.
#[derive(Debug, Clone)]
pub struct Ending {
    pub batch_id: String,
    pub owner: String,
    pub input_file_id: String,
    pub ending: String,
    pub epoch: i64,
}

/// One checkpoint: lines `[first_line, first_line + lines)` of a shard ran,
/// their output lines in blob `out_key`, their error lines in `err_key`.
pub struct Chunk {
    pub first_line: i64,
    pub lines: i64,
    pub out_key: Option<String>,
    pub err_key: Option<String>,
    pub completed: i64,
    pub failed: i64,
    pub tokens: i64,
}

/// A shard boundary found by validation.
pub struct ShardSpan {
    pub byte_start: i64,
    pub byte_end: i64,
    pub lines: i64,
}

#[derive(Clone)]
pub struct Store {
    conn: Arc<Mutex<Connection>>,
    /// Who holds leases taken here (unique per process).
    pub holder: Arc<str>,
}

fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError::Internal(format!("batch store: {e}"))
}

impl Store {
    pub fn open(path: &Path, holder: String) -> Result<Self, String> {
        let conn = Connection::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        conn.busy_timeout(std::time::Duration::from_secs(10))
            .and_then(|()| conn.pragma_update(None, "journal_mode", "WAL"))
            .and_then(|()| conn.pragma_update(None, "synchronous", "FULL"))
            .and_then(|()| conn.execute_batch(SCHEMA))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
            holder: holder.into(),
        })
    }

    /// Runs `f` on the connection, off the async threads.
    async fn call<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection, &str) -> rusqlite::Result<R> + Send + 'static,
    ) -> Result<R, ApiError> {
        let conn = Arc::clone(&self.conn);
        let holder = Arc::clone(&self.holder);
        tokio::task::spawn_blocking(move || {
            let mut c = conn.lock().unwrap_or_else(|p| p.into_inner());
            f(&mut c, &holder)
        })
        .await
        .map_err(internal)?
        .map_err(internal)
    }

    pub async fn add_file(&self, owner: String, row: FileRow) -> Result<(), ApiError> {
        self.call(move |c, _| {
            c.execute(
                "INSERT INTO files (id, owner, filename, purpose, bytes, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![row.id, owner, row.filename, row.purpose, row.bytes, row.created_at],
            )
            .map(drop)
        })
        .await
    }

    pub async fn file(&self, owner: String, id: String) -> Result<Option<FileRow>, ApiError> {
        self.call(move |c, _| {
            c.query_row(
                "SELECT id, filename, purpose, bytes, created_at FROM files WHERE id = ?1 AND owner = ?2",
                params![id, owner],
                file_row,
            )
            .optional()
        })
        .await
    }

    /// Up to `limit + 1` files of `owner` after the cursor, newest first
    /// (`asc`: oldest first).
    pub async fn files(
        &self,
        owner: String,
        purpose: Option<String>,
        after: Option<String>,
        limit: i64,
        asc: bool,
    ) -> Result<Vec<FileRow>, ApiError> {
        self.call(move |c, _| {
            let (cmp, order) = if asc { (">", "ASC") } else { ("<", "DESC") };
            let sql = format!(
                "SELECT id, filename, purpose, bytes, created_at FROM files WHERE owner = ?1 \
                 AND (?2 IS NULL OR purpose = ?2) \
                 AND (?3 IS NULL OR rowid {cmp} (SELECT rowid FROM files WHERE id = ?3)) \
                 ORDER BY rowid {order} LIMIT ?4"
            );
            let mut st = c.prepare(&sql)?;
            let rows = st.query_map(params![owner, purpose, after, limit + 1], file_row)?;
            rows.collect()
        })
        .await
    }

    /// Deletes a file's record unless a batch still at work reads it;
    /// `Err` names that batch.
    pub async fn delete_file(
        &self,
        owner: String,
        id: String,
    ) -> Result<Result<bool, String>, ApiError> {
        self.call(move |c, _| {
            let tx = c.transaction()?;
            let busy: Option<String> = tx
                .query_row(
                    "SELECT id FROM batches WHERE input_file_id = ?1 AND status NOT IN \
                     ('completed', 'failed', 'expired', 'cancelled') LIMIT 1",
                    params![id],
                    |r| r.get(0),
                )
                .optional()?;
            if let Some(batch) = busy {
                return Ok(Err(batch));
            }
            let n = tx.execute(
                "DELETE FROM files WHERE id = ?1 AND owner = ?2",
                params![id, owner],
            )?;
            tx.commit()?;
            Ok(Ok(n == 1))
        })
        .await
    }

    pub async fn add_batch(&self, b: NewBatch) -> Result<(), ApiError> {
        self.call(move |c, _| {
            let now = now_s();
            c.execute(
                "INSERT INTO batches (id, owner, endpoint, input_file_id, completion_window, metadata, status, \
                 created_at, expires_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'validating', ?7, ?8)",
                params![b.id, b.owner, b.endpoint, b.input_file_id, b.completion_window, b.metadata, now,
                        now + b.window_s],
            )
            .map(drop)
        })
        .await
    }

    pub async fn batch(&self, owner: String, id: String) -> Result<Option<BatchRow>, ApiError> {
        self.call(move |c, _| {
            c.query_row(
                &format!("SELECT {BATCH_COLUMNS} FROM batches WHERE id = ?1 AND owner = ?2"),
                params![id, owner],
                batch_row,
            )
            .optional()
        })
        .await
    }

    /// Up to `limit + 1` batches of `owner` after the cursor, newest first.
    pub async fn batches(
        &self,
        owner: String,
        after: Option<String>,
        limit: i64,
    ) -> Result<Vec<BatchRow>, ApiError> {
        self.call(move |c, _| {
            let mut st = c.prepare(&format!(
                "SELECT {BATCH_COLUMNS} FROM batches WHERE owner = ?1 \
                 AND (?2 IS NULL OR rowid < (SELECT rowid FROM batches WHERE id = ?2)) \
                 ORDER BY rowid DESC LIMIT ?3"
            ))?;
            let rows = st.query_map(params![owner, after, limit + 1], batch_row)?;
            rows.collect()
        })
        .await
    }

    /// Asks a batch to stop: `cancelling` until its end is written. `None`:
    /// no such batch; `Some(Err(status))`: it had already ended.
    pub async fn cancel(
        &self,
        owner: String,
        id: String,
    ) -> Result<Option<Result<(), String>>, ApiError> {
        self.call(move |c, _| {
            let tx = c.transaction()?;
            let status: Option<(String, Option<String>)> = tx
                .query_row(
                    "SELECT status, ending FROM batches WHERE id = ?1 AND owner = ?2",
                    params![id, owner],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            let Some((status, ending)) = status else {
                return Ok(None);
            };
            if TERMINAL.contains(&status.as_str()) || status == "finalizing" || ending.is_some() {
                return Ok(Some(Err(status)));
            }
            if status != "cancelling" {
                tx.execute(
                    "UPDATE batches SET status = 'cancelling', cancelling_at = ?2 WHERE id = ?1",
                    params![id, now_s()],
                )?;
            }
            tx.commit()?;
            Ok(Some(Ok(())))
        })
        .await
    }

    /// What a batch reads: its endpoint and its input file.
    pub async fn source(&self, id: String) -> Result<(String, String), ApiError> {
        self.call(move |c, _| {
            c.query_row(
                "SELECT endpoint, input_file_id FROM batches WHERE id = ?1",
                params![id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
        })
        .await
    }
}
