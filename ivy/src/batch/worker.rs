//! Takes batch work from the store and does it: validates new batches,
//! runs leased shards a checkpoint at a time, and writes the end of
//! batches that completed, were cancelled or expired. Every Ivy sharing the
//! store runs this loop; leases decide who does what, so a killed Ivy's
//! shard is resumed elsewhere from its last checkpoint, no line lost or
//! written twice.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use futures_util::StreamExt;

use super::blobs::Blobs;
use super::clock::now_s;
use super::lines::{self, Outcome};
use super::store::{Chunk, Ending, FileRow, Lease};
use super::validate::{self, Verdict};
use super::{ids, Batches};
use crate::error::ApiError;

/// Lines per checkpoint, at most.
const CHECKPOINT_LINES: usize = 256;
/// How long the loop sleeps when there is nothing to do.
const IDLE: Duration = Duration::from_millis(500);

pub fn spawn(batches: Arc<Batches>, router: Router) {
    tokio::spawn(async move {
        loop {
            let busy = match step(&batches, &router).await {
                Ok(busy) => busy,
                Err(e) => {
                    tracing::warn!(error = %e, "batch work failed; retrying");
                    false
                }
            };
            if let Ok(n) = batches.store.pending().await {
                batches.metrics.batch_pending(n);
            }
            if !busy {
                tokio::select! {
                    () = tokio::time::sleep(IDLE) => {}
                    () = batches.wake.notified() => {}
                }
            }
        }
    });
}

/// One piece of work, if any waits: whether there was one.
async fn step(b: &Batches, router: &Router) -> Result<bool, ApiError> {
    if b.stopping() {
        return Ok(false);
    }
    let lease = b.lease_ms();
    if let Some(v) = b.store.claim_validation(lease).await? {
        validate(b, v).await?;
        return Ok(true);
    }
    if let Some(e) = b.store.claim_ending(lease).await? {
        finish(b, e).await?;
        return Ok(true);
    }
    if b.config.batch_concurrency > 0 {
        if let Some(l) = b.store.claim_shard(lease).await? {
            run_shard(b, router, l).await?;
            return Ok(true);
        }
    }
    Ok(false)
}

async fn validate(b: &Batches, v: Ending) -> Result<(), ApiError> {
    let (endpoint, _) = b.store.source(v.batch_id.clone()).await?;
    let bytes = match b.blobs.read_file(&v.input_file_id).await {
        Ok(bytes) => bytes,
        Err(e) => {
            let errors = serde_json::json!({"object": "list", "data": [{"code": "file_unreadable",
                "message": format!("the input file could not be read: {e}"), "param": "input_file_id", "line": null}]});
            return b.store.invalid(v, errors.to_string()).await;
        }
    };
    let (max_lines, shard_lines) = (b.config.batch_max_lines, b.config.batch_shard_lines);
    let verdict = tokio::task::spawn_blocking(move || {
        validate::check(&bytes, &endpoint, max_lines, shard_lines)
    });
    match verdict
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?
    {
        Verdict::Run { model, shards } => {
            let id = v.batch_id.clone();
            if b.store.validated(v, model, shards).await? {
                tracing::info!(batch = %id, "batch validated");
            }
        }
        Verdict::Refuse(errors) => b.store.invalid(v, errors.to_string()).await?,
    }
    Ok(())
}

/// Runs a shard's remaining lines, `--batch-concurrency` in flight, in
/// order, checkpointing every `CHECKPOINT_LINES` lines or a third of the
/// lease, whichever comes first; stops when the lease is lost or the batch
/// ends (what was not checkpointed is run again by the next holder).
async fn run_shard(b: &Batches, router: &Router, mut l: Lease) -> Result<(), ApiError> {
    if l.epoch > 1 {
        tracing::info!(batch = %l.batch_id, shard = l.shard, from_line = l.done_lines,
            "resuming a shard another holder left (its lease lapsed or was given back)");
    }
    let (endpoint, input) = b.store.source(l.batch_id.clone()).await?;
    let bytes = b
        .blobs
        .read_range(&input, l.byte_start as u64, l.byte_end as u64)
        .await?;
    let bytes = bytes::Bytes::from(bytes);
    let todo: Vec<bytes::Bytes> = validate::lines(&bytes, 0)
        .map(|(start, end, _)| bytes.slice(start as usize..end as usize))
        .skip(l.done_lines as usize)
        .collect();
    let endpoint: Arc<str> = endpoint.into();
    // Each line is a task of its own, as an HTTP request is: lines run on
    // every worker thread, and keep running while a checkpoint is written.
    let mut results = futures_util::stream::iter(todo)
        .map(|line| {
            let (router, endpoint) = (router.clone(), Arc::clone(&endpoint));
            Aborting(tokio::spawn(async move {
                lines::run(&router, &endpoint, &line).await
            }))
        })
        .buffered(b.config.batch_concurrency);
    let every = Duration::from_millis(b.lease_ms() as u64 / 3);
    let mut pending: Vec<Outcome> = Vec::new();
    let mut since = Instant::now();
    loop {
        let next =
            tokio::time::timeout(every.saturating_sub(since.elapsed()), results.next()).await;
        let finished = matches!(next, Ok(None));
        if let Ok(Some(joined)) = next {
            pending.push(
                joined
                    .map_err(|e| ApiError::Internal(format!("a batch line's task failed: {e}")))?,
            );
        }
        if finished || pending.len() >= CHECKPOINT_LINES || since.elapsed() >= every {
            let n = pending.len() as i64;
            let chunk = write_chunk(b, &l, std::mem::take(&mut pending)).await?;
            if !checkpoint(b, &l, chunk).await? {
                // Lost the lease, or the batch was cancelled or expired.
                b.store.release(l).await?;
                return Ok(());
            }
            l.done_lines += n;
            since = Instant::now();
            if b.stopping() && !finished {
                b.store.release(l).await?;
                return Ok(());
            }
        }
        if finished {
            return Ok(());
        }
    }
}

/// Records a checkpoint, trying again for up to a third of the lease while
/// the store fails (a database restarting): giving up would leave the
/// shard idle until its lease lapses. A try that did commit, unknown to
/// this side, makes the next one find the shard moved on: `false`, and the
/// shard is given back with nothing lost or written twice.
async fn checkpoint(b: &Batches, l: &Lease, chunk: Chunk) -> Result<bool, ApiError> {
    let deadline = Instant::now() + Duration::from_millis(b.lease_ms() as u64 / 3);
    let mut wait = Duration::from_millis(100);
    loop {
        match b
            .store
            .checkpoint(l.clone(), chunk.clone(), b.lease_ms())
            .await
        {
            Err(e) if Instant::now() + wait < deadline => {
                tracing::warn!(batch = %l.batch_id, shard = l.shard, error = %e,
                    "recording a checkpoint failed; trying again");
                tokio::time::sleep(wait).await;
                wait *= 2;
            }
            done => return done,
        }
    }
}

/// A line's task, aborted if dropped before it finishes: a shard given up
/// (lease lost, batch ended, Ivy draining) leaves no line running, not even
/// one waiting out a 503.
struct Aborting<T>(tokio::task::JoinHandle<T>);

impl<T> std::future::Future for Aborting<T> {
    type Output = Result<T, tokio::task::JoinError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.0).poll(cx)
    }
}

impl<T> Drop for Aborting<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Writes a checkpoint's output and error lines as blobs.
async fn write_chunk(b: &Batches, l: &Lease, outcomes: Vec<Outcome>) -> Result<Chunk, ApiError> {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let (mut completed, mut failed, mut tokens) = (0, 0, 0);
    let lines = outcomes.len() as i64;
    for o in outcomes {
        tokens += o.tokens;
        if o.ok {
            completed += 1;
            out.extend_from_slice(&o.line);
        } else {
            failed += 1;
            err.extend_from_slice(&o.line);
        }
    }
    let put = |bytes: Vec<u8>, kind: &'static str| {
        let key =
            (!bytes.is_empty()).then(|| Blobs::part_key(&l.batch_id, l.shard, l.done_lines, kind));
        let blobs = b.blobs.clone();
        async move {
            if let Some(k) = &key {
                blobs.put_part(k.clone(), bytes).await?;
            }
            Ok::<_, ApiError>(key)
        }
    };
    let out_key = put(out, "out").await?;
    let err_key = put(err, "err").await?;
    Ok(Chunk {
        first_line: l.done_lines,
        lines,
        out_key,
        err_key,
        completed,
        failed,
        tokens,
    })
}

/// Writes a batch's output and error files from its checkpoints (for an
/// expired batch, an error line for each request that never ran) and
/// records its end.
async fn finish(b: &Batches, e: Ending) -> Result<(), ApiError> {
    let (chunks, shards) = b.store.chunks(e.batch_id.clone()).await?;
    let mut tail = Vec::new();
    let mut never_ran = 0;
    if e.ending == "expired" {
        for s in &shards {
            if s.done_lines >= s.lines {
                continue;
            }
            let bytes = b
                .blobs
                .read_range(&e.input_file_id, s.byte_start as u64, s.byte_end as u64)
                .await?;
            for (_, _, raw) in validate::lines(&bytes, 0).skip(s.done_lines as usize) {
                never_ran += 1;
                let custom_id = serde_json::from_slice::<serde_json::Value>(raw)
                    .ok()
                    .and_then(|v| v.get("custom_id").cloned())
                    .unwrap_or_default();
                let line = serde_json::json!({"id": ids::new(ids::REQUEST), "custom_id": custom_id,
                    "response": null, "error": {"code": "batch_expired",
                    "message": "This request could not be executed before the completion window expired."}});
                tail.extend_from_slice(line.to_string().as_bytes());
                tail.push(b'\n');
            }
        }
    }
    let outs: Vec<String> = chunks.iter().filter_map(|c| c.out_key.clone()).collect();
    let errs: Vec<String> = chunks.iter().filter_map(|c| c.err_key.clone()).collect();
    let output = write_file(b, &e, outs, Vec::new(), "output").await?;
    let errors = write_file(b, &e, errs, tail, "error").await?;
    let id = e.batch_id.clone();
    let ending = e.ending.clone();
    if b.store
        .ended(e, output.clone(), errors.clone(), never_ran)
        .await?
    {
        b.blobs.delete_parts(&id).await;
        tracing::info!(batch = %id, status = %ending, "batch ended");
    } else {
        // Another Ivy took the end over; its files are the batch's.
        for f in output.iter().chain(errors.iter()) {
            b.blobs.delete_file(&f.id).await;
        }
    }
    Ok(())
}

/// One of a batch's result files, or none when it would be empty.
async fn write_file(
    b: &Batches,
    e: &Ending,
    keys: Vec<String>,
    tail: Vec<u8>,
    kind: &str,
) -> Result<Option<FileRow>, ApiError> {
    if keys.is_empty() && tail.is_empty() {
        return Ok(None);
    }
    let id = ids::new(ids::FILE);
    let bytes = b.blobs.concat_parts(&id, keys, tail).await?;
    Ok(Some(FileRow {
        id,
        filename: format!("{}_{kind}.jsonl", e.batch_id),
        purpose: "batch_output".into(),
        bytes: bytes as i64,
        created_at: now_s(),
    }))
}
