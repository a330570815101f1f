//! The worker's side of the store: taking work under leases (validation,
//! shards, a batch's end), checkpoints, and giving work back. Every change
//! is one transaction, conditional on the lease it is made under; a claim
//! rechecks its conditions on the row it updates, so two replicas racing
//! for one row cannot both win it.

use super::sql::{vals, Row, Sql};
use super::{Chunk, Ending, FileRow, Lease, ShardSpan, Store};
use crate::batch::clock::{now_ms, now_s};
use crate::error::ApiError;

impl Store {
    /// Takes a batch to validate, if one waits.
    pub async fn claim_validation(&self, lease_ms: i64) -> Result<Option<Ending>, ApiError> {
        self.call(move |c, me| {
            let now = now_ms();
            c.row(
                "UPDATE batches SET holder = ?1, lease_until = ?2, epoch = epoch + 1 WHERE id = \
                 (SELECT id FROM batches WHERE status = 'validating' AND ending IS NULL \
                  AND (lease_until IS NULL OR lease_until < ?3) ORDER BY rowid LIMIT 1{skip}) \
                 AND status = 'validating' AND ending IS NULL AND (lease_until IS NULL OR lease_until < ?3) \
                 RETURNING id, owner, input_file_id, epoch",
                vals![me, now + lease_ms, now],
            )?
            .map(|r| {
                Ok(Ending {
                    batch_id: r.text(0)?,
                    owner: r.text(1)?,
                    input_file_id: r.text(2)?,
                    ending: String::new(),
                    epoch: r.int(3)?,
                })
            })
            .transpose()
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
            if !holds_batch(c, &v.batch_id, me, v.epoch)? {
                return Ok(false);
            }
            let total: i64 = shards.iter().map(|s| s.lines).sum();
            for (i, s) in shards.iter().enumerate() {
                c.exec(
                    "INSERT INTO shards (batch_id, shard, byte_start, byte_end, lines) VALUES (?1, ?2, ?3, ?4, ?5) \
                     ON CONFLICT (batch_id, shard) DO UPDATE SET byte_start = excluded.byte_start, \
                     byte_end = excluded.byte_end, lines = excluded.lines, done_lines = 0, holder = NULL, \
                     lease_until = NULL",
                    vals![&v.batch_id, i as i64, s.byte_start, s.byte_end, s.lines],
                )?;
            }
            c.exec(
                "UPDATE batches SET total = ?2, model = ?3, holder = NULL, lease_until = NULL, \
                 status = CASE status WHEN 'validating' THEN 'in_progress' ELSE status END, \
                 in_progress_at = CASE status WHEN 'validating' THEN ?4 ELSE in_progress_at END WHERE id = ?1",
                vals![v.batch_id, total, model, now_s()],
            )?;
            Ok(true)
        })
        .await
    }

    /// Validation refused the file: the batch fails with `errors` (OpenAI's
    /// `{"object": "list", "data": [...]}`).
    pub async fn invalid(&self, v: Ending, errors: String) -> Result<(), ApiError> {
        self.call(move |c, me| {
            c.exec(
                "UPDATE batches SET status = 'failed', failed_at = ?4, errors = ?5, holder = NULL, lease_until = NULL \
                 WHERE id = ?1 AND holder = ?2 AND epoch = ?3 AND status IN ('validating', 'cancelling')",
                vals![v.batch_id, me, v.epoch, now_s(), errors],
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
            c.exec(
                "UPDATE batches SET ending = 'expired' WHERE ending IS NULL \
                 AND status IN ('validating', 'in_progress') AND expires_at * 1000 < ?1",
                vals![now],
            )?;
            c.exec(
                "UPDATE batches SET ending = 'completed' WHERE ending IS NULL AND status = 'in_progress' \
                 AND NOT EXISTS (SELECT 1 FROM shards s WHERE s.batch_id = batches.id AND s.done_lines < s.lines)",
                &[],
            )?;
            c.exec(
                "UPDATE batches SET ending = 'cancelled' WHERE ending IS NULL AND status = 'cancelling' \
                 AND (lease_until IS NULL OR lease_until < ?1)",
                vals![now],
            )?;
            c.row(
                "UPDATE batches SET holder = ?1, lease_until = ?2, epoch = epoch + 1, \
                 status = CASE ending WHEN 'completed' THEN 'finalizing' ELSE status END, \
                 finalizing_at = CASE WHEN ending = 'completed' AND finalizing_at IS NULL THEN ?4 \
                                 ELSE finalizing_at END \
                 WHERE id = (SELECT id FROM batches WHERE ending IS NOT NULL \
                   AND status NOT IN ('completed', 'failed', 'expired', 'cancelled') \
                   AND (lease_until IS NULL OR lease_until < ?3) ORDER BY rowid LIMIT 1{skip}) \
                 AND (lease_until IS NULL OR lease_until < ?3) \
                 RETURNING id, owner, input_file_id, ending, epoch",
                vals![me, now + lease_ms, now, now / 1000],
            )?
            .map(|r| {
                Ok(Ending {
                    batch_id: r.text(0)?,
                    owner: r.text(1)?,
                    input_file_id: r.text(2)?,
                    ending: r.text(3)?,
                    epoch: r.int(4)?,
                })
            })
            .transpose()
        })
        .await
    }

    /// Everything checkpointed for a batch, in line order, and its shards
    /// (for the lines that never ran).
    pub async fn chunks(&self, id: String) -> Result<(Vec<Chunk>, Vec<Lease>), ApiError> {
        self.call(move |c, _| {
            let chunks = c
                .rows(
                    "SELECT first_line, lines, out_key, err_key FROM chunks WHERE batch_id = ?1 \
                     ORDER BY shard, first_line",
                    vals![&id],
                )?
                .iter()
                .map(|r| {
                    Ok(Chunk {
                        first_line: r.int(0)?,
                        lines: r.int(1)?,
                        out_key: r.opt_text(2)?,
                        err_key: r.opt_text(3)?,
                        completed: 0,
                        failed: 0,
                        tokens: 0,
                    })
                })
                .collect::<Result<Vec<_>, String>>()?;
            let shards = c
                .rows(
                    "SELECT batch_id, shard, byte_start, byte_end, lines, done_lines, epoch FROM shards \
                     WHERE batch_id = ?1 ORDER BY shard",
                    vals![id],
                )?
                .iter()
                .map(lease_row)
                .collect::<Result<Vec<_>, String>>()?;
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
            if !holds_batch(c, &e.batch_id, me, e.epoch)? {
                return Ok(false);
            }
            for f in output.iter().chain(errors.iter()) {
                c.exec(
                    "INSERT INTO files (id, owner, filename, purpose, bytes, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    vals![&f.id, &e.owner, &f.filename, &f.purpose, f.bytes, f.created_at],
                )?;
            }
            let column = match e.ending.as_str() {
                "completed" => "completed_at",
                "expired" => "expired_at",
                _ => "cancelled_at",
            };
            c.exec(
                &format!(
                    "UPDATE batches SET status = ?2, {column} = ?3, output_file_id = ?4, error_file_id = ?5, \
                     failed = failed + ?6, holder = NULL, lease_until = NULL WHERE id = ?1"
                ),
                vals![&e.batch_id, e.ending, now_s(), output.map(|f| f.id), errors.map(|f| f.id), expired_lines],
            )?;
            c.exec("DELETE FROM chunks WHERE batch_id = ?1", vals![&e.batch_id])?;
            c.exec("DELETE FROM shards WHERE batch_id = ?1", vals![e.batch_id])?;
            Ok(true)
        })
        .await
    }

    /// Takes a shard with lines left to run, if one waits.
    pub async fn claim_shard(&self, lease_ms: i64) -> Result<Option<Lease>, ApiError> {
        self.call(move |c, me| {
            let now = now_ms();
            c.row(
                "UPDATE shards SET holder = ?1, lease_until = ?2, epoch = epoch + 1 WHERE rowid = \
                 (SELECT s.rowid FROM shards s JOIN batches b ON b.id = s.batch_id \
                  WHERE b.status = 'in_progress' AND b.ending IS NULL AND s.done_lines < s.lines \
                  AND (s.lease_until IS NULL OR s.lease_until < ?3) ORDER BY b.rowid, s.shard LIMIT 1{skip_s}) \
                 AND done_lines < lines AND (lease_until IS NULL OR lease_until < ?3) \
                 RETURNING batch_id, shard, byte_start, byte_end, lines, done_lines, epoch",
                vals![me, now + lease_ms, now],
            )?
            .as_ref()
            .map(lease_row)
            .transpose()
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
            let ours = c.row(
                "SELECT 1 FROM shards s JOIN batches b ON b.id = s.batch_id WHERE s.batch_id = ?1 \
                 AND s.shard = ?2 AND s.holder = ?3 AND s.epoch = ?4 AND s.done_lines = ?5 \
                 AND b.status = 'in_progress' AND b.ending IS NULL{lock}",
                vals![&l.batch_id, l.shard, me, l.epoch, chunk.first_line],
            )?;
            if ours.is_none() {
                return Ok(false);
            }
            if chunk.lines > 0 {
                c.exec(
                    "INSERT INTO chunks (batch_id, shard, first_line, lines, out_key, err_key) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    vals![&l.batch_id, l.shard, chunk.first_line, chunk.lines, chunk.out_key, chunk.err_key],
                )?;
                c.exec(
                    "UPDATE batches SET completed = completed + ?2, failed = failed + ?3, \
                     input_tokens = input_tokens + ?4 WHERE id = ?1",
                    vals![&l.batch_id, chunk.completed, chunk.failed, chunk.tokens],
                )?;
            }
            c.exec(
                "UPDATE shards SET done_lines = done_lines + ?3, lease_until = ?4 WHERE batch_id = ?1 AND shard = ?2",
                vals![l.batch_id, l.shard, chunk.lines, now_ms() + lease_ms],
            )?;
            Ok(true)
        })
        .await
    }

    /// Gives a shard back (its holder stopped), so another may take it now.
    pub async fn release(&self, l: Lease) -> Result<(), ApiError> {
        self.call(move |c, me| {
            c.exec(
                "UPDATE shards SET holder = NULL, lease_until = NULL WHERE batch_id = ?1 AND shard = ?2 \
                 AND holder = ?3 AND epoch = ?4",
                vals![l.batch_id, l.shard, me, l.epoch],
            )
            .map(drop)
        })
        .await
    }

    /// Requests accepted and not yet run, over every batch (the autoscaling
    /// backlog): the lines of batches still validating count once known.
    pub async fn pending(&self) -> Result<i64, ApiError> {
        self.call(|c, _| {
            c.row(
                "SELECT CAST(COALESCE(SUM(s.lines - s.done_lines), 0) AS BIGINT) FROM shards s \
                 JOIN batches b ON b.id = s.batch_id WHERE b.status = 'in_progress' AND b.ending IS NULL",
                &[],
            )?
            .ok_or("no row")?
            .int(0)
        })
        .await
    }
}

fn lease_row(r: &Row) -> Result<Lease, String> {
    Ok(Lease {
        batch_id: r.text(0)?,
        shard: r.int(1)?,
        byte_start: r.int(2)?,
        byte_end: r.int(3)?,
        lines: r.int(4)?,
        done_lines: r.int(5)?,
        epoch: r.int(6)?,
    })
}

/// Whether this holder still holds the batch's lease (the row is then
/// locked until the transaction ends).
fn holds_batch(c: &mut dyn Sql, id: &str, me: &str, epoch: i64) -> Result<bool, String> {
    Ok(c.row(
        "SELECT 1 FROM batches WHERE id = ?1 AND holder = ?2 AND epoch = ?3{lock}",
        vals![id, me, epoch],
    )?
    .is_some())
}
