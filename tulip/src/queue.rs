//! The pool of waiting sequences, shared by the gRPC tasks (which add), the
//! scheduler thread (which takes batches) and the completion thread (which
//! finishes steps). One mutex, one condition variable; nobody holds the lock
//! while calling Python or waiting on the GPU.
//!
//! A small request that arrives alone and finds the engine idle (nothing
//! queued, nothing in flight) is not queued: its gRPC task takes the slot
//! and runs the step itself,
//! which saves the two thread wake-ups of a hand-off to the scheduler and
//! back. Everything else queues, so concurrent requests still share steps.
//!
//! Queued sequences wait in one queue per priority class; which queue a
//! step takes from first, and how many tokens, is `priority::Settings`'
//! decision.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use proto::tulip::v1::EmbedResponse;
use tokio::sync::oneshot;

use crate::backlog::{self, Backlog};
use crate::engine::LazyOutput;
use crate::error::TulipError;
use crate::model::Kind;
use crate::output::Accumulator;
use crate::pace::Pace;
use crate::priority::{self, Class};

pub type Reply = oneshot::Sender<Result<EmbedResponse, TulipError>>;

/// One validated request.
pub struct Request {
    pub kind: Kind,
    pub class: Class,
    /// Dense: output dimensions (already resolved, never 0).
    pub dimensions: u32,
    pub normalize: bool,
    pub raw_scores: bool,
    /// The caller's id for this request (Ivy's `x-request-id`), for logs.
    pub request_id: String,
    /// The LoRA adapter every sequence runs with (None: the base model),
    /// held until the request is answered.
    pub adapter: Option<Arc<crate::model::Adapter>>,
    pub token_ids: Vec<u32>,
    /// Start of each sequence in `token_ids`, plus the total at the end;
    /// for an image request, multiples of the model's tokens per image
    /// (what each image counts against a step's token budget).
    pub offsets: Vec<u32>,
    /// An image request: its images' float32 pixels back to back, each
    /// `image_bytes` long; empty for text.
    pub pixels: bytes::Bytes,
    pub image_bytes: usize,
    pub arrived: Instant,
    pub progress: Mutex<Progress>,
}

impl Request {
    pub fn num_sequences(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Sequence `i`'s token ids (none for an image).
    pub fn sequence(&self, i: usize) -> &[u32] {
        if self.kind == Kind::Image {
            return &[];
        }
        &self.token_ids[self.offsets[i] as usize..self.offsets[i + 1] as usize]
    }

    /// Image `i`'s pixels (an image request's).
    pub fn image(&self, i: usize) -> &[u8] {
        &self.pixels[i * self.image_bytes..(i + 1) * self.image_bytes]
    }

    /// The tokens the request counts against budgets: its token ids, or
    /// each image's tokens.
    pub fn tokens(&self) -> usize {
        self.offsets.last().copied().unwrap_or(0) as usize
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
    /// When the step call returned: on a GPU the step is on the device's
    /// queue from then; on the CPU it has run (see `Pool::finish_step`).
    pub on_device: Instant,
}

struct State {
    /// By `priority::Settings::queue_index`: interactive, batch.
    queues: [VecDeque<SeqRef>; 2],
    /// Since when the batch queue has waited without a step: its last
    /// step's start or end, or its first arrival into an empty queue.
    batch_waiting_since: Instant,
    /// Steps carrying batch work that are running now.
    batch_steps: usize,
    last_interactive: Option<Instant>,
    inflight: usize,
    /// Finished outputs whose Python objects the scheduler must release.
    releases: Vec<LazyOutput>,
    /// Outstanding tokens and measured capacity, for the autoscaler.
    backlog: Backlog,
    /// The device's measured pace, for the priority plan.
    pace: Pace,
    /// When batch work held back by the in-flight limit may go.
    retry_at: Option<Instant>,
    shutdown: bool,
}

impl State {
    fn new() -> Self {
        Self {
            queues: Default::default(),
            batch_waiting_since: Instant::now(),
            batch_steps: 0,
            last_interactive: None,
            inflight: 0,
            releases: Vec::new(),
            backlog: Backlog::default(),
            pace: Pace::default(),
            retry_at: None,
            shutdown: false,
        }
    }

    fn queued(&self) -> usize {
        self.queues.iter().map(VecDeque::len).sum()
    }
}

pub struct Pool {
    state: Mutex<State>,
    changed: Condvar,
    pub max_batch_tokens: usize,
    pub max_batch_sequences: usize,
    pub max_inflight: usize,
    /// Whether a request that finds the engine idle runs on its own thread.
    pub inline_steps: bool,
    pub priority: priority::Settings,
}

/// The most tokens a request may have to run inline.
const INLINE_MAX_TOKENS: usize = 512;

/// How a submitted request will run.
pub enum Submitted {
    /// Queued for the scheduler thread.
    Queued,
    /// The engine was idle: the caller holds a step slot and runs this
    /// batch itself (then `finish_step`), releasing these outputs first.
    Inline(Vec<SeqRef>, Vec<LazyOutput>),
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
    pub fn new(
        max_batch_tokens: usize,
        max_batch_sequences: usize,
        max_inflight: usize,
        inline_steps: bool,
        priority: priority::Settings,
    ) -> Self {
        Self {
            state: Mutex::new(State::new()),
            changed: Condvar::new(),
            max_batch_tokens,
            max_batch_sequences,
            max_inflight,
            inline_steps,
            priority,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds every sequence of a request, in order, or hands the whole
    /// request back as one batch to run inline when the caller found it
    /// `alone` (an inline candidate with no other request being served, so
    /// nothing to batch it with) and the engine is idle.
    pub fn submit(&self, request: Arc<Request>, alone: bool) -> Result<Submitted, TulipError> {
        let mut s = self.lock();
        if s.shutdown {
            return Err(TulipError::Unavailable("server is shutting down".into()));
        }
        let seqs = (0..request.num_sequences()).map(|index| SeqRef {
            request: Arc::clone(&request),
            index,
        });
        let class = request.class;
        if class == Class::Interactive {
            s.last_interactive = Some(request.arrived);
        }
        if alone && s.queued() == 0 && s.inflight == 0 {
            s.inflight += 1;
            if class == Class::Batch {
                s.batch_steps += 1;
            }
            let tokens = backlog::by_class([(class, request.tokens())]);
            s.backlog
                .launched(tokens, false, false, false, Instant::now());
            let releases = std::mem::take(&mut s.releases);
            return Ok(Submitted::Inline(seqs.collect(), releases));
        }
        let q = self.priority.queue_index(class);
        if class == Class::Batch && s.queues[q].is_empty() {
            s.batch_waiting_since = Instant::now();
        }
        s.queues[q].extend(seqs);
        s.backlog.queued(class, request.tokens());
        drop(s);
        self.changed.notify_all();
        Ok(Submitted::Queued)
    }

    /// Whether a request may run inline at all: inline steps are on and it
    /// makes one small step by itself. Larger requests always go through
    /// the scheduler thread: their step dwarfs a hand-off, and an inline
    /// step holds an I/O thread.
    pub fn inline_candidate(&self, request: &Request) -> bool {
        self.inline_steps
            && request.num_sequences() <= self.max_batch_sequences
            && request.tokens() <= self.max_batch_tokens.min(INLINE_MAX_TOKENS)
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
            if s.inflight < self.max_inflight + self.ahead_slot() {
                let extra = s.inflight >= self.max_inflight;
                let batch = self.take_batch(&mut s, extra);
                if !batch.is_empty() {
                    let busy = s.inflight > 0;
                    // Work left waiting: this step is as full as it gets.
                    let saturated = s.queued() > 0;
                    let tokens = tokens_by_class(&batch);
                    s.backlog
                        .launched(tokens, true, busy, saturated, Instant::now());
                    s.inflight += 1;
                    return Work::Batch(batch, std::mem::take(&mut s.releases));
                }
            }
            if !s.releases.is_empty() {
                return Work::Release(std::mem::take(&mut s.releases));
            }
            // Batch work held back until the device is about to run out
            // of work: wake then, unless something changes first.
            let wait = s.retry_at.take().map_or(Duration::from_millis(500), |at| {
                at.saturating_duration_since(Instant::now())
                    .min(Duration::from_millis(500))
            });
            s = self
                .changed
                .wait_timeout(s, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// A step's call returned (`planned`: when it was taken from the
    /// queues): it is on the device's queue now.
    pub fn on_device(&self, seqs: &[SeqRef], planned: Instant) {
        let tokens = seqs.iter().map(SeqRef::len).sum();
        self.lock().pace.launched(tokens, planned, Instant::now());
    }

    /// A step finished (or failed): frees its slot and queues the output
    /// for release with the next step (or the scheduler's next wake-up).
    /// `ran`: when a launched step reached the device (`on_device`) and
    /// whether its rows arrived (its time then counts in the pace); `None`
    /// for a step whose call failed. The scheduler is woken only when
    /// queued work waits for the slot.
    pub fn finish_step(
        &self,
        seqs: &[SeqRef],
        output: Option<LazyOutput>,
        ran: Option<(Instant, bool)>,
    ) {
        let mut s = self.lock();
        let now = Instant::now();
        s.inflight -= 1;
        let busy = s.inflight > 0;
        s.backlog.finished(tokens_by_class(seqs), busy, now);
        if let Some((on_device, ok)) = ran {
            s.pace.ended(on_device, carries_batch(seqs), ok, now);
        }
        if carries_batch(seqs) {
            s.batch_steps = s.batch_steps.saturating_sub(1);
            s.batch_waiting_since = Instant::now();
        }
        s.releases.extend(output);
        let waiting = s.queued() > 0;
        drop(s);
        if waiting {
            self.changed.notify_all();
        }
    }

    /// Outputs waiting for release (after the scheduler has stopped).
    pub fn take_releases(&self) -> Vec<LazyOutput> {
        std::mem::take(&mut self.lock().releases)
    }

    pub fn inflight(&self) -> usize {
        self.lock().inflight
    }

    pub fn queued_sequences(&self) -> usize {
        self.lock().queued()
    }

    /// Outstanding tokens by class and the measured capacity (metrics).
    pub fn backlog(&self) -> backlog::Snapshot {
        self.lock().backlog.snapshot()
    }

    /// Stops the scheduler; sequences still queued are failed.
    pub fn shutdown(&self) {
        let left: Vec<SeqRef> = {
            let mut s = self.lock();
            s.shutdown = true;
            let left: Vec<SeqRef> = s.queues.iter_mut().flat_map(|q| q.drain(..)).collect();
            for seq in &left {
                s.backlog.dropped(seq.request.class, seq.len());
            }
            left
        };
        self.changed.notify_all();
        for seq in left {
            seq.request
                .fail(TulipError::Unavailable("server is shutting down".into()));
        }
    }
}

fn tokens_by_class(seqs: &[SeqRef]) -> [u64; 2] {
    backlog::by_class(seqs.iter().map(|s| (s.request.class, s.len())))
}

fn carries_batch(seqs: &[SeqRef]) -> bool {
    seqs.iter().any(|seq| seq.request.class == Class::Batch)
}

mod take;

#[cfg(test)]
mod tests;
