//! The Batch API's records in SQLite: files, batches, the shards a batch
//! is cut into (each leased to one Ivy at a time) and the checkpointed
//! chunks of output. Every state change is one transaction, conditional on
//! the lease it is made under, so a holder that lost its lease changes
//! nothing. Several Ivy processes may share the database file (WAL, busy
//! timeout). Calls run on the blocking pool.

use std::path::Path;
use std::sync::{Arc, Mutex};

use rusqlite::{params, Connection, OptionalExtension, Row};

use super::clock::{now_ms, now_s};
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

    /// Takes a batch to validate, if one waits.
    pub async fn claim_validation(&self, lease_ms: i64) -> Result<Option<Ending>, ApiError> {
        self.call(move |c, me| {
            let now = now_ms();
            c.query_row(
                "UPDATE batches SET holder = ?1, lease_until = ?2, epoch = epoch + 1 WHERE id = \
                 (SELECT id FROM batches WHERE status = 'validating' AND ending IS NULL \
                  AND (lease_until IS NULL OR lease_until < ?3) ORDER BY rowid LIMIT 1) \
                 RETURNING id, owner, input_file_id, epoch",
                params![me, now + lease_ms, now],
                |r| {
                    Ok(Ending {
                        batch_id: r.get(0)?,
                        owner: r.get(1)?,
                        input_file_id: r.get(2)?,
                        ending: String::new(),
                        epoch: r.get(3)?,
                    })
                },
            )
            .optional()
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

    /// Validation passed: the batch's shards, its model, and `in_progress`
    /// (unless it was cancelled meanwhile).
    pub async fn validated(
        &self,
        v: Ending,
        model: Option<String>,
        shards: Vec<ShardSpan>,
    ) -> Result<bool, ApiError> {
        self.call(move |c, me| {
            let tx = c.transaction()?;
            if !holds_batch(&tx, &v.batch_id, me, v.epoch)? {
                return Ok(false);
            }
            let total: i64 = shards.iter().map(|s| s.lines).sum();
            for (i, s) in shards.iter().enumerate() {
                tx.execute(
                    "INSERT OR REPLACE INTO shards (batch_id, shard, byte_start, byte_end, lines) VALUES (?1, ?2, ?3, ?4, ?5)",
                    params![v.batch_id, i as i64, s.byte_start, s.byte_end, s.lines],
                )?;
            }
            tx.execute(
                "UPDATE batches SET total = ?2, model = ?3, holder = NULL, lease_until = NULL, \
                 status = CASE status WHEN 'validating' THEN 'in_progress' ELSE status END, \
                 in_progress_at = CASE status WHEN 'validating' THEN ?4 ELSE in_progress_at END WHERE id = ?1",
                params![v.batch_id, total, model, now_s()],
            )?;
            tx.commit()?;
            Ok(true)
        })
        .await
    }

    /// Validation refused the file: the batch fails with `errors` (OpenAI's
    /// `{"object": "list", "data": [...]}`).
    pub async fn invalid(&self, v: Ending, errors: String) -> Result<(), ApiError> {
        self.call(move |c, me| {
            c.execute(
                "UPDATE batches SET status = 'failed', failed_at = ?4, errors = ?5, holder = NULL, lease_until = NULL \
                 WHERE id = ?1 AND holder = ?2 AND epoch = ?3 AND status IN ('validating', 'cancelling')",
                params![v.batch_id, me, v.epoch, now_s(), errors],
            )
            .map(drop)
        })
        .await
    }

    /// Decides which batches end (expired past their window, all shards
    /// done, cancelled) and takes one whose end is to be written, if any.
    pub async fn claim_ending(&self, lease_ms: i64) -> Result<Option<Ending>, ApiError> {
        self.call(move |c, me| {
            let now = now_ms();
            let tx = c.transaction()?;
            tx.execute(
                "UPDATE batches SET ending = 'expired' WHERE ending IS NULL \
                 AND status IN ('validating', 'in_progress') AND expires_at * 1000 < ?1",
                params![now],
            )?;
            tx.execute(
                "UPDATE batches SET ending = 'completed' WHERE ending IS NULL AND status = 'in_progress' \
                 AND NOT EXISTS (SELECT 1 FROM shards s WHERE s.batch_id = batches.id AND s.done_lines < s.lines)",
                [],
            )?;
            tx.execute(
                "UPDATE batches SET ending = 'cancelled' WHERE ending IS NULL AND status = 'cancelling' \
                 AND (lease_until IS NULL OR lease_until < ?1)",
                params![now],
            )?;
            let got = tx
                .query_row(
                    "UPDATE batches SET holder = ?1, lease_until = ?2, epoch = epoch + 1, \
                     status = CASE ending WHEN 'completed' THEN 'finalizing' ELSE status END, \
                     finalizing_at = CASE WHEN ending = 'completed' AND finalizing_at IS NULL THEN ?4 \
                                     ELSE finalizing_at END \
                     WHERE id = (SELECT id FROM batches WHERE ending IS NOT NULL \
                       AND status NOT IN ('completed', 'failed', 'expired', 'cancelled') \
                       AND (lease_until IS NULL OR lease_until < ?3) ORDER BY rowid LIMIT 1) \
                     RETURNING id, owner, input_file_id, ending, epoch",
                    params![me, now + lease_ms, now, now / 1000],
                    |r| {
                        Ok(Ending {
                            batch_id: r.get(0)?,
                            owner: r.get(1)?,
                            input_file_id: r.get(2)?,
                            ending: r.get(3)?,
                            epoch: r.get(4)?,
                        })
                    },
                )
                .optional()?;
            tx.commit()?;
            Ok(got)
        })
        .await
    }

    /// Everything checkpointed for a batch, in line order, and its shards
    /// (for the lines that never ran).
    pub async fn chunks(&self, id: String) -> Result<(Vec<Chunk>, Vec<Lease>), ApiError> {
        self.call(move |c, _| {
            let mut st = c.prepare(
                "SELECT first_line, lines, out_key, err_key FROM chunks WHERE batch_id = ?1 ORDER BY shard, first_line",
            )?;
            let chunks = st
                .query_map(params![id], |r| {
                    Ok(Chunk {
                        first_line: r.get(0)?,
                        lines: r.get(1)?,
                        out_key: r.get(2)?,
                        err_key: r.get(3)?,
                        completed: 0,
                        failed: 0,
                        tokens: 0,
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            let mut st = c.prepare(
                "SELECT batch_id, shard, byte_start, byte_end, lines, done_lines, epoch FROM shards \
                 WHERE batch_id = ?1 ORDER BY shard",
            )?;
            let shards = st.query_map(params![id], lease_row)?.collect::<rusqlite::Result<Vec<_>>>()?;
            Ok((chunks, shards))
        })
        .await
    }

    /// The batch's end is written: its files recorded, its final state set,
    /// its chunks forgotten (their blobs are deleted after). `expired_lines`
    /// never ran and count as failed.
    pub async fn ended(
        &self,
        e: Ending,
        output: Option<FileRow>,
        errors: Option<FileRow>,
        expired_lines: i64,
    ) -> Result<bool, ApiError> {
        self.call(move |c, me| {
            let tx = c.transaction()?;
            if !holds_batch(&tx, &e.batch_id, me, e.epoch)? {
                return Ok(false);
            }
            for f in output.iter().chain(errors.iter()) {
                tx.execute(
                    "INSERT INTO files (id, owner, filename, purpose, bytes, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    params![f.id, e.owner, f.filename, f.purpose, f.bytes, f.created_at],
                )?;
            }
            let column = match e.ending.as_str() {
                "completed" => "completed_at",
                "expired" => "expired_at",
                _ => "cancelled_at",
            };
            tx.execute(
                &format!(
                    "UPDATE batches SET status = ?2, {column} = ?3, output_file_id = ?4, error_file_id = ?5, \
                     failed = failed + ?6, holder = NULL, lease_until = NULL WHERE id = ?1"
                ),
                params![e.batch_id, e.ending, now_s(), output.map(|f| f.id), errors.map(|f| f.id), expired_lines],
            )?;
            tx.execute("DELETE FROM chunks WHERE batch_id = ?1", params![e.batch_id])?;
            tx.execute("DELETE FROM shards WHERE batch_id = ?1", params![e.batch_id])?;
            tx.commit()?;
            Ok(true)
        })
        .await
    }

    /// Takes a shard with lines left to run, if one waits.
    pub async fn claim_shard(&self, lease_ms: i64) -> Result<Option<Lease>, ApiError> {
        self.call(move |c, me| {
            let now = now_ms();
            c.query_row(
                "UPDATE shards SET holder = ?1, lease_until = ?2, epoch = epoch + 1 WHERE rowid = \
                 (SELECT s.rowid FROM shards s JOIN batches b ON b.id = s.batch_id \
                  WHERE b.status = 'in_progress' AND b.ending IS NULL AND s.done_lines < s.lines \
                  AND (s.lease_until IS NULL OR s.lease_until < ?3) ORDER BY b.rowid, s.shard LIMIT 1) \
                 RETURNING batch_id, shard, byte_start, byte_end, lines, done_lines, epoch",
                params![me, now + lease_ms, now],
                lease_row,
            )
            .optional()
        })
        .await
    }

    /// Records a checkpoint and renews the lease, if the lease is still
    /// ours and the batch still runs: `false` says stop (the lines of this
    /// chunk are then dropped, to be run by whoever holds the shard next,
    /// or never if the batch ended).
    pub async fn checkpoint(
        &self,
        l: Lease,
        chunk: Chunk,
        lease_ms: i64,
    ) -> Result<bool, ApiError> {
        self.call(move |c, me| {
            let tx = c.transaction()?;
            let ours: Option<i64> = tx
                .query_row(
                    "SELECT 1 FROM shards s JOIN batches b ON b.id = s.batch_id WHERE s.batch_id = ?1 \
                     AND s.shard = ?2 AND s.holder = ?3 AND s.epoch = ?4 AND s.done_lines = ?5 \
                     AND b.status = 'in_progress' AND b.ending IS NULL",
                    params![l.batch_id, l.shard, me, l.epoch, chunk.first_line],
                    |r| r.get(0),
                )
                .optional()?;
            if ours.is_none() {
                return Ok(false);
            }
            if chunk.lines > 0 {
                tx.execute(
                    "INSERT INTO chunks (batch_id, shard, first_line, lines, out_key, err_key) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    params![l.batch_id, l.shard, chunk.first_line, chunk.lines, chunk.out_key, chunk.err_key],
                )?;
                tx.execute(
                    "UPDATE batches SET completed = completed + ?2, failed = failed + ?3, \
                     input_tokens = input_tokens + ?4 WHERE id = ?1",
                    params![l.batch_id, chunk.completed, chunk.failed, chunk.tokens],
                )?;
            }
            tx.execute(
                "UPDATE shards SET done_lines = done_lines + ?3, lease_until = ?4 WHERE batch_id = ?1 AND shard = ?2",
                params![l.batch_id, l.shard, chunk.lines, now_ms() + lease_ms],
            )?;
            tx.commit()?;
            Ok(true)
        })
        .await
    }

    /// Gives a shard back (its holder stopped), so another may take it now.
    pub async fn release(&self, l: Lease) -> Result<(), ApiError> {
        self.call(move |c, me| {
            c.execute(
                "UPDATE shards SET holder = NULL, lease_until = NULL WHERE batch_id = ?1 AND shard = ?2 \
                 AND holder = ?3 AND epoch = ?4",
                params![l.batch_id, l.shard, me, l.epoch],
            )
            .map(drop)
        })
        .await
    }

    /// Requests accepted and not yet run, over every batch (the autoscaling
    /// backlog): the lines of batches still validating count once known.
    pub async fn pending(&self) -> Result<i64, ApiError> {
        self.call(|c, _| {
            c.query_row(
                "SELECT COALESCE(SUM(s.lines - s.done_lines), 0) FROM shards s JOIN batches b ON b.id = s.batch_id \
                 WHERE b.status = 'in_progress' AND b.ending IS NULL",
                [],
                |r| r.get(0),
            )
        })
        .await
    }
}

fn lease_row(r: &Row) -> rusqlite::Result<Lease> {
    Ok(Lease {
        batch_id: r.get(0)?,
        shard: r.get(1)?,
        byte_start: r.get(2)?,
        byte_end: r.get(3)?,
        lines: r.get(4)?,
        done_lines: r.get(5)?,
        epoch: r.get(6)?,
    })
}

fn holds_batch(
    tx: &rusqlite::Transaction,
    id: &str,
    me: &str,
    epoch: i64,
) -> rusqlite::Result<bool> {
    tx.query_row(
        "SELECT 1 FROM batches WHERE id = ?1 AND holder = ?2 AND epoch = ?3",
        params![id, me, epoch],
        |_| Ok(()),
    )
    .optional()
    .map(|r| r.is_some())
}
