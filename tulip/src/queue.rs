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

use crate::engine::{Kind, LazyOutput};
use crate::error::TulipError;
use crate::output::Accumulator;
use crate::priority::{self, Class, Moment};

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
            let releases = std::mem::take(&mut s.releases);
            return Ok(Submitted::Inline(seqs.collect(), releases));
        }
        let q = self.priority.queue_index(class);
        if class == Class::Batch && s.queues[q].is_empty() {
            s.batch_waiting_since = Instant::now();
        }
        s.queues[q].extend(seqs);
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

    /// From the queues in the order the priority plan gives, each first
    /// come first served, up to its token budget and the sequence cap. A
    /// batch holds one output kind; it always takes at least one sequence.
    fn take_batch(&self, s: &mut State) -> Vec<SeqRef> {
        let batch_queue = self.priority.queue_index(Class::Batch);
        let now = Instant::now();
        let plan = self.priority.plan(
            self.max_batch_tokens,
            &Moment {
                now,
                batch_waiting: batch_queue == 1 && !s.queues[1].is_empty() && s.batch_steps == 0,
                batch_waiting_since: s.batch_waiting_since,
                last_interactive: s.last_interactive,
            },
        );
        let mut batch: Vec<SeqRef> = Vec::new();
        let mut tokens = 0;
        for q in plan.order {
            if q == 1
                && !self.priority.fill_interactive_steps
                && batch
                    .iter()
                    .any(|seq| seq.request.class == Class::Interactive)
            {
                continue; // the query's own step stays short
            }
            let queue = &mut s.queues[q];
            while let Some(front) = queue.front() {
                if front.request.abandoned() {
                    queue.pop_front();
                    continue;
                }
                if let Some(first) = batch.first() {
                    if front.request.kind != first.request.kind
                        || tokens + front.len() > plan.budget[q]
                        || batch.len() >= self.max_batch_sequences
                    {
                        break;
                    }
                }
                tokens += front.len();
                batch.extend(queue.pop_front());
            }
        }
        if carries_batch(&batch) {
            s.batch_waiting_since = now;
            s.batch_steps += 1;
        }
        batch
    }

    /// A step finished (or failed): frees its slot and queues the output
    /// for release with the next step (or the scheduler's next wake-up).
    /// The scheduler is woken only when queued work waits for the slot.
    pub fn finish_step(&self, seqs: &[SeqRef], output: Option<LazyOutput>) {
        let mut s = self.lock();
        s.inflight -= 1;
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

    /// Stops the scheduler; sequences still queued are failed.
    pub fn shutdown(&self) {
        let left: Vec<SeqRef> = {
            let mut s = self.lock();
            s.shutdown = true;
            s.queues.iter_mut().flat_map(|q| q.drain(..)).collect()
        };
        self.changed.notify_all();
        for seq in left {
            seq.request
                .fail(TulipError::Unavailable("server is shutting down".into()));
        }
    }
}

fn carries_batch(seqs: &[SeqRef]) -> bool {
    seqs.iter().any(|seq| seq.request.class == Class::Batch)
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
        classed(kind, Class::Interactive, lengths)
    }

    fn classed(
        kind: Kind,
        class: Class,
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
            class,
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

    fn on() -> priority::Settings {
        priority::Settings::default()
    }

    fn batch(work: Work) -> Vec<SeqRef> {
        match work {
            Work::Batch(seqs, _) => seqs,
            _ => panic!("expected a batch"),
        }
    }

    #[test]
    fn a_lone_request_on_an_idle_engine_runs_inline_and_holds_the_slot() {
        let pool = Pool::new(100, 8, 1, true, on());
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
        pool.finish_step(&[], None);
        assert_eq!(pool.inflight(), 0);
        assert_eq!(batch(pool.next_work()).len(), 1);
        assert_eq!(pool.inflight(), 1);
    }

    #[test]
    fn concurrent_or_oversized_requests_queue() {
        let pool = Pool::new(4, 8, 1, true, on());
        let (a, _ra) = request(Kind::Dense, &[2]);
        assert!(matches!(pool.submit(a, false).unwrap(), Submitted::Queued));
        // As the service calls it: alone only if an inline candidate.
        let submit_alone = |pool: &Pool, r: Arc<Request>| {
            let alone = pool.inline_candidate(&r);
            pool.submit(r, alone).unwrap()
        };
        let pool = Pool::new(4, 8, 1, true, on());
        let (big, _rb) = request(Kind::Dense, &[3, 3]);
        assert!(matches!(submit_alone(&pool, big), Submitted::Queued));
        let pool = Pool::new(4096, 8, 1, true, on());
        let (long, _rl) = request(Kind::Dense, &[600]);
        assert!(matches!(submit_alone(&pool, long), Submitted::Queued));
        let off = Pool::new(100, 8, 1, false, on());
        let (c, _rc) = request(Kind::Dense, &[2]);
        assert!(matches!(submit_alone(&off, c), Submitted::Queued));
    }

    #[test]
    fn batches_respect_the_budget_and_hold_one_output_kind() {
        let pool = Pool::new(5, 8, 2, false, on());
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
        pool.finish_step(&[], None);
        let third = batch(pool.next_work());
        assert_eq!(third[0].request.kind, Kind::Score);
    }

    #[test]
    fn sequences_of_cancelled_requests_are_skipped() {
        let pool = Pool::new(100, 8, 1, false, on());
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
        let pool = Pool::new(100, 8, 1, false, on());
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
        pool.finish_step(&[], None);
        assert_eq!(pool.inflight(), 0);
        assert!(matches!(pool.next_work(), Work::Stop(_)));
    }

    fn lengths(seqs: &[SeqRef]) -> Vec<usize> {
        seqs.iter().map(SeqRef::len).collect()
    }

    #[test]
    fn interactive_sequences_go_first_and_batch_work_fills_the_step() {
        let pool = Pool::new(10, 8, 1, false, on());
        let (b, _rb) = classed(Kind::Dense, Class::Batch, &[4, 4, 4]);
        let (i, _ri) = classed(Kind::Dense, Class::Interactive, &[1]);
        pool.submit(b, false).unwrap();
        pool.submit(i, false).unwrap();
        let first = batch(pool.next_work());
        assert_eq!(first[0].request.class, Class::Interactive);
        assert_eq!(lengths(&first), vec![1, 4, 4]);
    }

    #[test]
    fn with_priorities_off_arrival_order_decides() {
        let off = priority::Settings {
            enabled: false,
            ..on()
        };
        let pool = Pool::new(10, 8, 1, false, off);
        let (b, _rb) = classed(Kind::Dense, Class::Batch, &[4, 4, 4]);
        let (i, _ri) = classed(Kind::Dense, Class::Interactive, &[1]);
        pool.submit(b, false).unwrap();
        pool.submit(i, false).unwrap();
        assert_eq!(lengths(&batch(pool.next_work())), vec![4, 4]);
        pool.finish_step(&[], None);
        assert_eq!(lengths(&batch(pool.next_work())), vec![4, 1]);
    }

    #[test]
    fn starved_batch_work_takes_the_next_step_first() {
        let settings = priority::Settings {
            batch_max_wait: Duration::from_millis(200),
            ..on()
        };
        let pool = Pool::new(4, 8, 1, false, settings);
        let (b, _rb) = classed(Kind::Dense, Class::Batch, &[4]);
        pool.submit(b, false).unwrap();
        let (i, _ri) = classed(Kind::Dense, Class::Interactive, &[4, 4]);
        pool.submit(i, false).unwrap();
        // Fresh batch work waits behind interactive work...
        assert_eq!(batch(pool.next_work())[0].request.class, Class::Interactive);
        pool.finish_step(&[], None);
        // ...until it has waited `batch_max_wait` without a step.
        std::thread::sleep(Duration::from_millis(250));
        let (j, _rj) = classed(Kind::Dense, Class::Interactive, &[4]);
        pool.submit(j, false).unwrap();
        assert_eq!(batch(pool.next_work())[0].request.class, Class::Batch);
    }

    #[test]
    fn batch_steps_shrink_while_interactive_traffic_is_active() {
        let settings = priority::Settings {
            batch_step_tokens: 8,
            ..on()
        };
        let pool = Pool::new(100, 64, 1, false, settings.clone());
        let (b, _rb) = classed(Kind::Dense, Class::Batch, &[4, 4, 4, 4]);
        pool.submit(b, false).unwrap();
        // No interactive request seen yet: the full budget.
        let first = batch(pool.next_work());
        assert_eq!(lengths(&first), vec![4, 4, 4, 4]);
        pool.finish_step(&first, None);
        let (i, _ri) = classed(Kind::Dense, Class::Interactive, &[2]);
        pool.submit(i, false).unwrap();
        let (b2, _rb2) = classed(Kind::Dense, Class::Batch, &[4, 4, 4, 4]);
        pool.submit(b2, false).unwrap();
        // The query first, then batch work up to 8 tokens in all.
        assert_eq!(lengths(&batch(pool.next_work())), vec![2, 4]);
    }

    #[test]
    fn without_filling_a_querys_step_carries_no_batch_work() {
        let settings = priority::Settings {
            fill_interactive_steps: false,
            ..on()
        };
        let pool = Pool::new(100, 64, 1, false, settings);
        let (b, _rb) = classed(Kind::Dense, Class::Batch, &[4, 4]);
        let (i, _ri) = classed(Kind::Dense, Class::Interactive, &[2]);
        pool.submit(b, false).unwrap();
        pool.submit(i, false).unwrap();
        let first = batch(pool.next_work());
        assert_eq!(lengths(&first), vec![2]);
        pool.finish_step(&first, None);
        assert_eq!(lengths(&batch(pool.next_work())), vec![4, 4]);
    }
}
