//! The merged call a replica has open: chunks join it until the leader
//! sends it. A leaf of its own so that `Replica` can hold one without
//! importing the coalescing logic that uses replicas.

use std::sync::Mutex;

use proto::tulip::v1::{EmbedRequest, EmbedResponse};
use tokio::sync::oneshot;

/// How big a merged call may grow.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_sequences: usize,
    pub max_tokens: usize,
}

/// The merged call a replica has open, if any: held by each `Replica`.
#[derive(Default)]
pub struct OpenCall {
    open: Mutex<Option<Open>>,
}

pub(super) struct Open {
    /// Every member's sequences, back to back, with the shared options.
    pub(super) request: EmbedRequest,
    pub(super) members: Vec<Member>,
}

/// Where one chunk's rows go: its count of sequences and tokens, in order.
pub(super) struct Member {
    pub(super) sequences: usize,
    pub(super) tokens: u64,
    pub(super) tx: oneshot::Sender<EmbedResponse>,
}

/// Options that must agree for chunks to share a call.
#[derive(PartialEq, Debug)]
struct Key {
    kind: i32,
    normalize: Option<bool>,
    dimensions: u32,
    raw_scores: bool,
    priority: i32,
    /// A call carries one LoRA adapter for all its sequences.
    adapter: String,
}

impl Key {
    fn of(r: &EmbedRequest) -> Self {
        Self {
            kind: r.kind,
            normalize: r.normalize,
            dimensions: r.dimensions,
            raw_scores: r.raw_scores,
            priority: r.priority,
            adapter: r.adapter.clone(),
        }
    }
}

pub(super) enum Role {
    Leader,
    Follower,
}

impl OpenCall {
    /// Adds `request` to the open batch (or opens one); `None` when it
    /// cannot share a call (another batch with other options is open, or
    /// it would grow past the limits).
    pub(super) fn join(
        &self,
        request: &EmbedRequest,
        limits: Limits,
    ) -> Option<(Role, oneshot::Receiver<EmbedResponse>)> {
        let (tx, rx) = oneshot::channel();
        let member = Member {
            sequences: request.lengths.len(),
            tokens: request.token_ids.len() as u64,
            tx,
        };
        let mut open = self.open.lock().expect("coalescing lock poisoned");
        match open.as_mut() {
            None => {
                *open = Some(Open {
                    request: request.clone(),
                    members: vec![member],
                });
                Some((Role::Leader, rx))
            }
            Some(o) => {
                let fits = o.request.lengths.len() + request.lengths.len() <= limits.max_sequences
                    && o.request.token_ids.len() + request.token_ids.len() <= limits.max_tokens;
                if Key::of(&o.request) != Key::of(request) || !fits {
                    return None;
                }
                o.request.token_ids.extend_from_slice(&request.token_ids);
                o.request.lengths.extend_from_slice(&request.lengths);
                o.request.request_id.push(',');
                o.request.request_id.push_str(&request.request_id);
                o.members.push(member);
                Some((Role::Follower, rx))
            }
        }
    }

    pub(super) fn close(&self) -> Option<Open> {
        self.open.lock().expect("coalescing lock poisoned").take()
    }
}
