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
    /// The caller's id for this request (Ivy's `x-request-id`), for logs.
    pub request_id: String,
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
    /// Whether a request that finds the engine idle runs on its own thread.
    pub inline_steps: bool,
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
    ) -> Self {
        Self {
            state: Mutex::default(),
            changed: Condvar::new(),
            max_batch_tokens,
            max_batch_sequences,
            max_inflight,
            inline_steps,
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
        if alone && s.queue.is_empty() && s.inflight == 0 {
            s.inflight += 1;
            let releases = std::mem::take(&mut s.releases);
            return Ok(Submitted::Inline(seqs.collect(), releases));
        }
        s.queue.extend(seqs);
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
            && request.token_ids.len() <= self.max_batch_tokens.min(INLINE_MAX_TOKENS)
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
    /// for release with the next step (or the scheduler's next wake-up).
    /// The scheduler is woken only when queued work waits for the slot.
    pub fn finish_step(&self, output: Option<LazyOutput>) {
        let mut s = self.lock();
        s.inflight -= 1;
        s.releases.extend(output);
        let waiting = !s.queue.is_empty();
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

#[cfg(test)]
mod tests {
    use super::*;

    fn request(
        kind: Kind,
        lengths: &[u32],
    ) -> (
        Arc<Request>,
        oneshot::Receiver<Result<EmbedResponse, TulipError>>,
    ) {
        let (tx, rx) = oneshot::channel();
        let mut offsets = vec![0u32];
        for l in lengths {
            offsets.push(offsets.last().unwrap() + l);
        }
        let n = lengths.len();
        let req = Request {
            kind,
            dimensions: 4,
            normalize: true,
            raw_scores: false,
            request_id: "r".into(),
            token_ids: vec![1; *offsets.last().unwrap() as usize],
            offsets,
            arrived: Instant::now(),
            progress: Mutex::new(Progress {
                reply: Some(tx),
                output: Accumulator::new(kind, n, 4),
                remaining: n,
                last_scheduled: None,
                first_launch: None,
            }),
        };
        (Arc::new(req), rx)
    }

    fn batch(work: Work) -> Vec<SeqRef> {
        match work {
            Work::Batch(seqs, _) => seqs,
            _ => panic!("expected a batch"),
        }
    }

    #[test]
    fn a_lone_request_on_an_idle_engine_runs_inline_and_holds_the_slot() {
        let pool = Pool::new(100, 8, 1, true);
        let (a, _ra) = request(Kind::Dense, &[3, 2]);
        match pool.submit(a, true).unwrap() {
            Submitted::Inline(seqs, releases) => {
                assert_eq!(seqs.len(), 2);
                assert!(releases.is_empty());
            }
            Submitted::Queued => panic!("an idle engine should run a lone request inline"),
        }
        assert_eq!(pool.inflight(), 1);
        // While the inline step runs, the next request queues behind it.
        let (b, _rb) = request(Kind::Dense, &[1]);
        assert!(matches!(pool.submit(b, true).unwrap(), Submitted::Queued));
        pool.finish_step(None);
        assert_eq!(pool.inflight(), 0);
        assert_eq!(batch(pool.next_work()).len(), 1);
        assert_eq!(pool.inflight(), 1);
    }

    #[test]
    fn concurrent_or_oversized_requests_queue() {
        let pool = Pool::new(4, 8, 1, true);
        let (a, _ra) = request(Kind::Dense, &[2]);
        assert!(matches!(pool.submit(a, false).unwrap(), Submitted::Queued));
        // As the service calls it: alone only if an inline candidate.
        let submit_alone = |pool: &Pool, r: Arc<Request>| {
            let alone = pool.inline_candidate(&r);
            pool.submit(r, alone).unwrap()
        };
        let pool = Pool::new(4, 8, 1, true);
        let (big, _rb) = request(Kind::Dense, &[3, 3]);
        assert!(matches!(submit_alone(&pool, big), Submitted::Queued));
        let pool = Pool::new(4096, 8, 1, true);
        let (long, _rl) = request(Kind::Dense, &[600]);
        assert!(matches!(submit_alone(&pool, long), Submitted::Queued));
        let off = Pool::new(100, 8, 1, false);
        let (c, _rc) = request(Kind::Dense, &[2]);
        assert!(matches!(submit_alone(&off, c), Submitted::Queued));
    }

    #[test]
    fn batches_respect_the_budget_and_hold_one_output_kind() {
        let pool = Pool::new(5, 8, 2, false);
        let (a, _ra) = request(Kind::Dense, &[2, 2]);
        let (b, _rb) = request(Kind::Dense, &[2]);
        let (c, _rc) = request(Kind::Score, &[1]);
        for r in [a, b, c] {
            pool.submit(r, false).unwrap();
        }
        let first = batch(pool.next_work());
        assert_eq!(first.iter().map(SeqRef::len).sum::<usize>(), 4);
        let second = batch(pool.next_work());
        assert_eq!(second.len(), 1);
        assert_eq!(second[0].request.kind, Kind::Dense);
        pool.finish_step(None);
        let third = batch(pool.next_work());
        assert_eq!(third[0].request.kind, Kind::Score);
    }

    #[test]
    fn sequences_of_cancelled_requests_are_skipped() {
        let pool = Pool::new(100, 8, 1, false);
        let (gone, rx) = request(Kind::Dense, &[2, 2]);
        let (kept, _rk) = request(Kind::Dense, &[3]);
        pool.submit(gone, false).unwrap();
        pool.submit(kept, false).unwrap();
        drop(rx); // the client went away
        let seqs = batch(pool.next_work());
        assert_eq!(seqs.len(), 1);
        assert_eq!(seqs[0].len(), 3);
    }

    #[test]
    fn shutdown_fails_queued_requests_and_refuses_new_ones() {
        let pool = Pool::new(100, 8, 1, false);
        let (a, _ra) = request(Kind::Dense, &[2]);
        pool.submit(a, false).unwrap();
        let running = batch(pool.next_work());
        let (b, mut rb) = request(Kind::Dense, &[2]);
        pool.submit(b, false).unwrap();
        pool.shutdown();
        assert!(matches!(rb.try_recv(), Ok(Err(TulipError::Unavailable(_)))));
        let (c, _rc) = request(Kind::Dense, &[2]);
        assert!(matches!(
            pool.submit(c, true),
            Err(TulipError::Unavailable(_))
        ));
        // The step still in flight finishes and frees its slot.
        drop(running);
        pool.finish_step(None);
        assert_eq!(pool.inflight(), 0);
        assert!(matches!(pool.next_work(), Work::Stop(_)));
    }
}
