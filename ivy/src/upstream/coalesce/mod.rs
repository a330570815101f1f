//! Coalescing: small chunks bound for the same replica with the same call
//! options, read in the same turn of the runtime, travel to Tulip as one
//! call, and each gets its own rows back.
//!
//! Under load most of Tulip's CPU per request, and a good share of Ivy's, is
//! the gRPC call itself (framing, a stream, a task, encoding), not the
//! step: Tulip batches concurrent requests into one step anyway. The first
//! chunk to arrive opens a batch and yields once, so that every request
//! already read joins it; a lone request pays one yield and goes alone.
//! A merged call that fails is retried chunk by chunk, so one bad input or
//! a replica that failed mid-call costs no other request anything but time.

pub mod open;

use std::sync::Arc;

use proto::tulip::v1::{EmbedRequest, EmbedResponse, OutputKind};

pub use self::open::Limits;
use self::open::{Member, OpenCall, Role};
use crate::metrics::Metrics;
use crate::upstream::replica::{AttemptError, Replica};

/// Only kinds with exactly one row per sequence are split back by rows.
fn one_row_per_sequence(kind: i32) -> bool {
    OutputKind::of(kind).is_some_and(OutputKind::one_row_per_sequence)
}

/// Closes the leader's batch if the leader is dropped before it sends it (a
/// client that went away, a deadline): its followers then go alone.
struct Leading<'a>(Option<&'a OpenCall>);

impl Drop for Leading<'_> {
    fn drop(&mut self) {
        if let Some(open_call) = self.0 {
            drop(open_call.close());
        }
    }
}

/// Runs one chunk on `replica`, sharing a call with chunks read in the same
/// turn when `limits` allow it (`None`: every chunk goes alone).
pub async fn embed(
    replica: &Arc<Replica>,
    request: EmbedRequest,
    limits: Option<Limits>,
    metrics: &Metrics,
) -> Result<EmbedResponse, AttemptError> {
    // Images go alone: a merged call holds token ids or pixels, not both.
    let alone = request.images > 0 || !one_row_per_sequence(request.kind);
    let Some(limits) = limits.filter(|_| !alone) else {
        return replica.embed(request).await;
    };
    let Some((role, rx)) = replica.open_call.join(&request, limits) else {
        return replica.embed(request).await;
    };
    if let Role::Leader = role {
        let mut leading = Leading(Some(&replica.open_call));
        // Requests read in this same turn run before this one resumes.
        tokio::task::yield_now().await;
        leading.0 = None;
        let open = replica.open_call.close();
        match open {
            Some(open) if open.members.len() > 1 => {
                metrics.shared_call(open.members.len());
                let replica = Arc::clone(replica);
                // A task of its own: a member that goes away must not
                // cancel the others' call.
                tokio::spawn(async move {
                    if let Ok(reply) = replica.embed(open.request).await {
                        deliver(reply, open.members);
                    }
                    // On failure the senders drop: each member goes alone.
                });
            }
            _ => return replica.embed(request).await,
        }
    }
    match rx.await {
        Ok(reply) => Ok(reply),
        Err(_) => replica.embed(request).await,
    }
}

/// Cuts a merged reply into each member's rows, in order.
fn deliver(reply: EmbedResponse, members: Vec<Member>) {
    let rows: usize = members.iter().map(|m| m.sequences).sum();
    if rows == 0 || reply.rows as usize != rows || !reply.data.len().is_multiple_of(rows) {
        // Not the shape this module sends: let every member go alone.
        tracing::warn!(
            rows = reply.rows,
            expected = rows,
            "a coalesced reply had an unexpected shape"
        );
        return;
    }
    let row_bytes = reply.data.len() / rows;
    let mut at = 0;
    for m in members {
        let len = m.sequences * row_bytes;
        let part = EmbedResponse {
            kind: reply.kind,
            dtype: reply.dtype,
            rows: m.sequences as u32,
            dim: reply.dim,
            data: reply.data.slice(at..at + len),
            row_counts: Vec::new(),
            sparse_indices: Vec::new(),
            tokens: m.tokens,
            timing: reply.timing,
        };
        at += len;
        let _ = m.tx.send(part);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use tokio::sync::oneshot;

    const LIMITS: Limits = Limits {
        max_sequences: 8,
        max_tokens: 100,
    };

    fn req(ids: &[u32], dims: u32, id: &str) -> EmbedRequest {
        EmbedRequest {
            token_ids: ids.to_vec(),
            lengths: vec![ids.len() as u32],
            kind: OutputKind::Dense as i32,
            dimensions: dims,
            request_id: id.into(),
            ..Default::default()
        }
    }

    #[test]
    fn chunks_with_the_same_options_share_a_call_in_order() {
        let p = OpenCall::default();
        let (lead, _r1) = p.join(&req(&[1, 2], 0, "a"), LIMITS).unwrap();
        assert!(matches!(lead, Role::Leader));
        let (follow, _r2) = p.join(&req(&[3], 0, "b"), LIMITS).unwrap();
        assert!(matches!(follow, Role::Follower));
        let open = p.close().unwrap();
        assert_eq!(open.request.token_ids, vec![1, 2, 3]);
        assert_eq!(open.request.lengths, vec![2, 1]);
        assert_eq!(open.request.request_id, "a,b");
        assert!(p.close().is_none());
    }

    #[test]
    fn other_options_or_a_full_batch_go_alone() {
        let p = OpenCall::default();
        let _lead = p.join(&req(&[1, 2], 0, "a"), LIMITS).unwrap();
        assert!(
            p.join(&req(&[3], 32, "b"), LIMITS).is_none(),
            "other dimensions"
        );
        assert!(
            p.join(&req(&[7; 99], 0, "c"), LIMITS).is_none(),
            "past the token limit"
        );
        let mut sparse = req(&[4], 0, "d");
        sparse.kind = OutputKind::Sparse as i32;
        assert!(!one_row_per_sequence(sparse.kind));
        assert!(one_row_per_sequence(OutputKind::Score as i32));
    }

    #[test]
    fn a_reply_is_cut_into_each_members_rows() {
        let (tx1, mut rx1) = oneshot::channel();
        let (tx2, mut rx2) = oneshot::channel();
        let members = vec![
            Member {
                sequences: 1,
                tokens: 5,
                tx: tx1,
            },
            Member {
                sequences: 2,
                tokens: 9,
                tx: tx2,
            },
        ];
        let data: Vec<u8> = (0..24).collect(); // 3 rows of 2 f32
        deliver(
            EmbedResponse {
                kind: OutputKind::Dense as i32,
                rows: 3,
                dim: 2,
                data: Bytes::from(data),
                tokens: 14,
                ..Default::default()
            },
            members,
        );
        let a = rx1.try_recv().unwrap();
        let b = rx2.try_recv().unwrap();
        assert_eq!(
            (a.rows, a.tokens, &a.data[..]),
            (1, 5, &(0..8).collect::<Vec<u8>>()[..])
        );
        assert_eq!(
            (b.rows, b.tokens, &b.data[..]),
            (2, 9, &(8..24).collect::<Vec<u8>>()[..])
        );
        assert_eq!(b.dim, 2);
    }

    #[test]
    fn a_reply_of_the_wrong_shape_sends_everyone_alone() {
        let (tx, mut rx) = oneshot::channel();
        let members = vec![Member {
            sequences: 2,
            tokens: 1,
            tx,
        }];
        deliver(
            EmbedResponse {
                rows: 1,
                data: Bytes::from(vec![0u8; 8]),
                ..Default::default()
            },
            members,
        );
        assert!(rx.try_recv().is_err());
    }
}
