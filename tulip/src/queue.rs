//! The pool of waiting sequences, shared by the gRPC tasks (which add), the
//! scheduler thread (which takes batches) and the completion thread (which
//! finishes steps). One mutex, one condition variable; nobody holds the lock
//! while calling Python or waiting on the GPU.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use proto::tulip::v1::EmbedResponse;
use tokio::sync::oneshot;

use crate::engine::{Kind, LazyOutput};
use crate::error::TulipError;
use crate::output::Accumulator;

pub type Reply = oneshot::Sender<Result<EmbedResponse, TulipError>>;

/// One validated request.
pub struct Request {
    pub kind: Kind,
    /// Dense: output dimensions (already resolved, never 0).
    pub dimensions: u32,
    pub normalize: bool,
    pub raw_scores: bool,
    pub token_ids: Vec<u32>,
    /// Start of each sequence in `token_ids`, plus the total at the end.
    pub offsets: Vec<u32>,
    pub arrived: Instant,
    pub progress: Mutex<Progress>,
}

impl Request {
    pub fn num_sequences(&self) -> usize {
        self.offsets.len() - 1
    }

    pub fn sequence(&self, i: usize) -> &[u32] {
        &self.token_ids[self.offsets[i] as usize..self.offsets[i + 1] as usize]
    }

    /// The client is gone (its call was cancelled): skip its sequences.
    pub fn abandoned(&self) -> bool {
        let p = self.lock();
        p.reply.as_ref().is_none_or(|r| r.is_closed())
    }

    pub fn lock(&self) -> MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends an error to the client, once.
    pub fn fail(&self, error: TulipError) {
        if let Some(reply) = self.lock().reply.take() {
            let _ = reply.send(Err(error));
        }
    }
}

/// What has happened to a request so far.
pub struct Progress {
    pub reply: Option<Reply>,
    pub output: Accumulator,
    /// Sequences whose rows have not arrived yet.
    pub remaining: usize,
    /// When the last of its sequences entered a batch.
    pub last_scheduled: Option<Instant>,
    /// When its first batch was launched.
    pub first_launch: Option<Instant>,
}

/// A sequence waiting in the pool.
#[derive(Clone)]
pub struct SeqRef {
    pub request: Arc<Request>,
    pub index: usize,
}

impl SeqRef {
    pub fn len(&self) -> usize {
        let o = &self.request.offsets;
        (o[self.index + 1] - o[self.index]) as usize
    }
}

/// A launched step on its way to completion.
pub struct InFlight {
    pub seqs: Vec<SeqRef>,
    pub output: LazyOutput,
    pub launched: Instant,
}

#[derive(Default)]
struct State {
    queue: VecDeque<SeqRef>,
    inflight: usize,
    /// Finished outputs whose Python objects the scheduler must release.
    releases: Vec<LazyOutput>,
    shutdown: bool,
}

pub struct Pool {
    state: Mutex<State>,
    changed: Condvar,
    pub max_batch_tokens: usize,
    pub max_batch_sequences: usize,
    pub max_inflight: usize,
}

/// What the scheduler should do next.
pub enum Work {
    /// Launch this batch (and release these outputs first).
    Batch(Vec<SeqRef>, Vec<LazyOutput>),
    /// Nothing to launch; only release these.
    Release(Vec<LazyOutput>),
    Stop(Vec<LazyOutput>),
}

impl Pool {
    pub fn new(max_batch_tokens: usize, max_batch_sequences: usize, max_inflight: usize) -> Self {
        Self {
            state: Mutex::default(),
            changed: Condvar::new(),
            max_batch_tokens,
            max_batch_sequences,
            max_inflight,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds every sequence of a request, in order.
    pub fn submit(&self, request: Arc<Request>) -> Result<(), TulipError> {
        let mut s = self.lock();
        if s.shutdown {
            return Err(TulipError::Unavailable("server is shutting down".into()));
        }
        for index in 0..request.num_sequences() {
            s.queue.push_back(SeqRef {
                request: Arc::clone(&request),
                index,
            });
        }
        drop(s);
        self.changed.notify_all();
        Ok(())
    }

    /// Blocks until there is work for the scheduler: a batch it may launch
    /// (fewer than `max_inflight` steps running), outputs to release, or
    /// shutdown.
    pub fn next_work(&self) -> Work {
        let mut s = self.lock();
        loop {
            if s.shutdown {
                return Work::Stop(std::mem::take(&mut s.releases));
            }
            if s.inflight < self.max_inflight {
                let batch = self.take_batch(&mut s);
                if !batch.is_empty() {
                    s.inflight += 1;
                    return Work::Batch(batch, std::mem::take(&mut s.releases));
                }
            }
            if !s.releases.is_empty() {
                return Work::Release(std::mem::take(&mut s.releases));
            }
            s = self
                .changed
                .wait_timeout(s, Duration::from_millis(500))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// First come, first served, up to the token budget and sequence cap.
    /// A batch holds one output kind; it always takes at least one sequence.
    fn take_batch(&self, s: &mut State) -> Vec<SeqRef> {
        let mut batch: Vec<SeqRef> = Vec::new();
        let mut tokens = 0;
        while let Some(front) = s.queue.front() {
            if front.request.abandoned() {
                s.queue.pop_front();
                continue;
            }
            if let Some(first) = batch.first() {
                if front.request.kind != first.request.kind
                    || tokens + front.len() > self.max_batch_tokens
                    || batch.len() >= self.max_batch_sequences
                {
                    break;
                }
            }
            tokens += front.len();
            batch.extend(s.queue.pop_front());
        }
        batch
    }

    /// A step finished (or failed): frees its slot and queues the output
    /// for release by the scheduler thread.
    pub fn finish_step(&self, output: Option<LazyOutput>) {
        let mut s = self.lock();
        s.inflight -= 1;
        s.releases.extend(output);
        drop(s);
        self.changed.notify_all();
    }

    /// Outputs waiting for release (after the scheduler has stopped).
    pub fn take_releases(&self) -> Vec<LazyOutput> {
        std::mem::take(&mut self.lock().releases)
    }

    pub fn inflight(&self) -> usize {
        self.lock().inflight
    }

    pub fn queued_sequences(&self) -> usize {
        self.lock().queue.len()
    }

    /// Stops the scheduler; sequences still queued are failed.
    pub fn shutdown(&self) {
        let left: Vec<SeqRef> = {
            let mut s = self.lock();
            s.shutdown = true;
            s.queue.drain(..).collect()
        };
        self.changed.notify_all();
        for seq in left {
            seq.request
                .fail(TulipError::Unavailable("server is shutting down".into()));
        }
    }
}
