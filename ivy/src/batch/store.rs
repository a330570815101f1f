//! The Batch API's records: files, batches, the shards a batch is cut
//! into (each leased to one Ivy at a time) and the checkpointed chunks of
//! output, in SQLite (`--batch-dir`, one machine) or PostgreSQL
//! (`--batch-database-url`, a cluster), one SQL text for both (`sql.rs`).
//! Every state change is one transaction, conditional on the lease it is
//! made under, so a holder that lost its lease changes nothing. Calls run
//! on the blocking pool.

mod postgres;
pub mod sql;
mod sqlite;
mod work;

use std::path::Path;
use std::sync::{Arc, Mutex};

use self::postgres::Pg;
use self::sql::{vals, Row, Sql};
use super::clock::now_s;
use crate::error::ApiError;

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

fn batch_row(r: &Row) -> Result<BatchRow, String> {
    let mut times = [None; 9];
    for (i, t) in times.iter_mut().enumerate() {
        *t = r.opt_int(10 + i)?;
    }
    Ok(BatchRow {
        id: r.text(0)?,
        endpoint: r.text(1)?,
        input_file_id: r.text(2)?,
        completion_window: r.text(3)?,
        metadata: r.opt_text(4)?,
        model: r.opt_text(5)?,
        status: r.text(6)?,
        errors: r.opt_text(7)?,
        output_file_id: r.opt_text(8)?,
        error_file_id: r.opt_text(9)?,
        times,
        total: r.int(19)?,
        completed: r.int(20)?,
        failed: r.int(21)?,
        input_tokens: r.int(22)?,
    })
}

fn file_row(r: &Row) -> Result<FileRow, String> {
    Ok(FileRow {
        id: r.text(0)?,
        filename: r.text(1)?,
        purpose: r.text(2)?,
        bytes: r.int(3)?,
        created_at: r.int(4)?,
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
#[derive(Clone)]
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
enum Db {
    Sqlite(Arc<Mutex<rusqlite::Connection>>),
    Postgres(Arc<Mutex<Pg>>),
}

#[derive(Clone)]
pub struct Store {
    db: Db,
    /// Who holds leases taken here (unique per process).
    pub holder: Arc<str>,
}

fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError::Internal(format!("batch store: {e}"))
}

impl Store {
    /// The embedded database: one SQLite file.
    pub fn open_sqlite(path: &Path, holder: String) -> Result<Self, String> {
        Ok(Self {
            db: Db::Sqlite(Arc::new(Mutex::new(sqlite::open(path)?))),
            holder: holder.into(),
        })
    }

    /// The cluster's: PostgreSQL at `url`.
    pub fn open_postgres(url: &str, holder: String) -> Result<Self, String> {
        // The blocking client runs a runtime of its own, which may not start
        // on a thread that drives Ivy's.
        let pg = std::thread::scope(|s| s.spawn(|| Pg::open(url)).join())
            .map_err(|_| "--batch-database-url: connecting panicked".to_string())??;
        Ok(Self {
            db: Db::Postgres(Arc::new(Mutex::new(pg))),
            holder: holder.into(),
        })
    }

    /// Runs `f` in one transaction, off the async threads.
    async fn call<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut dyn Sql, &str) -> Result<R, String> + Send + 'static,
    ) -> Result<R, ApiError> {
        let db = self.db.clone();
        let holder = Arc::clone(&self.holder);
        tokio::task::spawn_blocking(move || match db {
            Db::Sqlite(conn) => {
                let mut c = conn.lock().unwrap_or_else(|p| p.into_inner());
                sqlite::run(&mut c, |tx| f(tx, &holder))
            }
            Db::Postgres(pg) => {
                let mut pg = pg.lock().unwrap_or_else(|p| p.into_inner());
                pg.run(|tx| f(tx, &holder))
            }
        })
        .await
        .map_err(internal)?
        .map_err(internal)
    }

    pub async fn add_file(&self, owner: String, row: FileRow) -> Result<(), ApiError> {
        self.call(move |c, _| {
            c.exec(
                "INSERT INTO files (id, owner, filename, purpose, bytes, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                vals![row.id, owner, row.filename, row.purpose, row.bytes, row.created_at],
            )
            .map(drop)
        })
        .await
    }

    pub async fn file(&self, owner: String, id: String) -> Result<Option<FileRow>, ApiError> {
        self.call(move |c, _| {
            c.row(
                "SELECT id, filename, purpose, bytes, created_at FROM files WHERE id = ?1 AND owner = ?2",
                vals![id, owner],
            )?
            .as_ref()
            .map(file_row)
            .transpose()
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
                 AND (CAST(?2 AS TEXT) IS NULL OR purpose = ?2) \
                 AND (CAST(?3 AS TEXT) IS NULL OR rowid {cmp} (SELECT rowid FROM files WHERE id = ?3)) \
                 ORDER BY rowid {order} LIMIT ?4"
            );
            c.rows(&sql, vals![owner, purpose, after, limit + 1])?
                .iter()
                .map(file_row)
                .collect()
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
            let busy = c.row(
                "SELECT id FROM batches WHERE input_file_id = ?1 AND status NOT IN \
                 ('completed', 'failed', 'expired', 'cancelled') LIMIT 1",
                vals![&id],
            )?;
            if let Some(batch) = busy {
                return Ok(Err(batch.text(0)?));
            }
            let n = c.exec(
                "DELETE FROM files WHERE id = ?1 AND owner = ?2",
                vals![id, owner],
            )?;
            Ok(Ok(n == 1))
        })
        .await
    }

    pub async fn add_batch(&self, b: NewBatch) -> Result<(), ApiError> {
        self.call(move |c, _| {
            let now = now_s();
            c.exec(
                "INSERT INTO batches (id, owner, endpoint, input_file_id, completion_window, metadata, status, \
                 created_at, expires_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'validating', ?7, ?8)",
                vals![b.id, b.owner, b.endpoint, b.input_file_id, b.completion_window, b.metadata, now,
                      now + b.window_s],
            )
            .map(drop)
        })
        .await
    }

    pub async fn batch(&self, owner: String, id: String) -> Result<Option<BatchRow>, ApiError> {
        self.call(move |c, _| {
            c.row(
                &format!("SELECT {BATCH_COLUMNS} FROM batches WHERE id = ?1 AND owner = ?2"),
                vals![id, owner],
            )?
            .as_ref()
            .map(batch_row)
            .transpose()
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
            c.rows(
                &format!(
                    "SELECT {BATCH_COLUMNS} FROM batches WHERE owner = ?1 \
                     AND (CAST(?2 AS TEXT) IS NULL OR rowid < (SELECT rowid FROM batches WHERE id = ?2)) \
                     ORDER BY rowid DESC LIMIT ?3"
                ),
                vals![owner, after, limit + 1],
            )?
            .iter()
            .map(batch_row)
            .collect()
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
            let Some(row) = c.row(
                "SELECT status, ending FROM batches WHERE id = ?1 AND owner = ?2{lock}",
                vals![&id, owner],
            )?
            else {
                return Ok(None);
            };
            let (status, ending) = (row.text(0)?, row.opt_text(1)?);
            if TERMINAL.contains(&status.as_str()) || status == "finalizing" || ending.is_some() {
                return Ok(Some(Err(status)));
            }
            if status != "cancelling" {
                c.exec(
                    "UPDATE batches SET status = 'cancelling', cancelling_at = ?2 WHERE id = ?1",
                    vals![id, now_s()],
                )?;
            }
            Ok(Some(Ok(())))
        })
        .await
    }

    /// What a batch reads: its endpoint and its input file.
    pub async fn source(&self, id: String) -> Result<(String, String), ApiError> {
        self.call(move |c, _| {
            let row = c
                .row(
                    "SELECT endpoint, input_file_id FROM batches WHERE id = ?1",
                    vals![id],
                )?
                .ok_or("the batch is gone")?;
            Ok((row.text(0)?, row.text(1)?))
        })
        .await
    }
}
