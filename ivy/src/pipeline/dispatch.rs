//! Sending chunks to replicas: in order, at most `--chunks-per-replica` x
//! (healthy replicas) of a request in flight at once, each to the replica
//! the balancing policy picks when it leaves; a chunk whose replica fails is
//! retried on another one, up to `--max-attempts` in all (the request's
//! deadline bounds the whole). The first chunk that cannot succeed fails the
//! request and cancels the others.

use std::sync::Arc;

use futures_util::stream::{self, StreamExt, TryStreamExt};
use proto::tulip::v1::{EmbedRequest, EmbedResponse};
use tracing::Instrument;

use super::chunk::Chunk;
use super::encode::Tokenized;
use super::Priority;
use crate::error::ApiError;
use crate::state::AppState;
use crate::upstream::coalesce;
use crate::upstream::pools::Pool;
use crate::upstream::replica::{AttemptError, Replica};

pub async fn send_all(
    state: &AppState,
    pool: &Pool,
    tokenized: &Tokenized,
    chunks: &[Chunk],
    template: &EmbedRequest,
    priority: Priority,
) -> Result<Vec<EmbedResponse>, ApiError> {
    let window = match state.config.chunks_per_replica {
        0 => chunks.len(),
        n => n * pool.routable_count().max(1),
    };
    // Built up front: a closure inside the stream type trips the compiler's
    // `Send` check on the gRPC handlers' futures.
    let sends: Vec<_> = chunks
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let request = EmbedRequest {
                token_ids: tokenized.token_ids[c.tokens.clone()].to_vec(),
                lengths: tokenized.lengths[c.sequences.clone()].to_vec(),
                ..template.clone()
            };
            let span = tracing::debug_span!(
                "dispatch",
                // i64: the trace exporter writes unsigned values as strings.
                chunk = i as i64,
                sequences = request.lengths.len() as i64,
                tokens = request.token_ids.len() as i64,
            );
            send(state, pool, request, priority).instrument(span)
        })
        .collect();
    stream::iter(sends)
        .buffered(window.max(1))
        .try_collect()
        .await
}

pub(super) async fn send(
    state: &AppState,
    pool: &Pool,
    request: EmbedRequest,
    priority: Priority,
) -> Result<EmbedResponse, ApiError> {
    state.metrics.chunk();
    let mut tried: Vec<Arc<Replica>> = Vec::new();
    let mut last_error = None;
    for attempt in 1..=state.config.max_attempts {
        let picked = if priority == Priority::Batch && pool.batch_slots.bounded() {
            let slots = &pool.batch_slots;
            let tokens = request.token_ids.len();
            let pick = slots.pick(
                || Arc::new(pool.replicas()),
                pool.policy.as_ref(),
                &tried,
                tokens,
            );
            pick.await.map(|(r, slot)| (r, Some(slot)))
        } else {
            let replicas = pool.replicas();
            pool.policy.pick(&replicas, &tried).map(|r| (r, None))
        };
        let Some((replica, _slot)) = picked else {
            return Err(last_error.unwrap_or_else(|| pool.no_replica()));
        };
        if attempt > 1 {
            state.metrics.retry();
            tracing::info!(replica = %replica.url, attempt, "retrying chunk");
        }
        let _spin = state.spinner.call();
        // Each try is its own span; Tulip's spans hang under the one that reached it.
        let span =
            tracing::debug_span!("attempt", attempt = i64::from(attempt), replica = %replica.url);
        let limits = coalesce_limits(state, &replica);
        match coalesce::embed(&replica, request.clone(), limits, &state.metrics)
            .instrument(span)
            .await
        {
            Ok(reply) => return Ok(reply),
            Err(AttemptError::Fatal(e)) => return Err(e),
            Err(AttemptError::Retry(e)) => {
                tracing::warn!(replica = %replica.url, attempt, error = %e, "chunk failed");
                tried.push(replica);
                last_error = Some(e);
            }
        }
    }
    let n = state.config.max_attempts;
    Err(match last_error {
        Some(ApiError::Unavailable(m)) => {
            ApiError::Unavailable(format!("a chunk failed on {n} attempts; last error: {m}"))
        }
        Some(e) => ApiError::Upstream(format!("a chunk failed on {n} attempts; last error: {e}")),
        None => pool.no_replica(),
    })
}

/// How large a shared call to `replica` may grow; `None` when coalescing is
/// off. A merged call stays within one chunk's budget and the replica's
/// sequence limit.
fn coalesce_limits(state: &AppState, replica: &Replica) -> Option<coalesce::Limits> {
    if !state.config.coalesce {
        return None;
    }
    let max_sequences = replica
        .info()
        .map_or(0, |i| i.max_request_sequences as usize);
    let max_tokens = match state.config.chunk_tokens {
        0 => usize::MAX,
        n => n,
    };
    (max_sequences > 1).then_some(coalesce::Limits {
        max_sequences,
        max_tokens,
    })
}
