//! Which sequences the next step takes: the priority plan applied to the
//! queues (`priority.rs` decides budgets and slots, this takes them).

use std::time::Instant;

use super::{carries_batch, Pool, SeqRef, State};
use crate::priority::{Class, Moment};

impl Pool {
    /// From the queues in the order the priority plan gives, each first
    /// come first served, up to its token budget and the sequence cap, with
    /// at most `plan.fill` batch tokens in a step carrying interactive work
    /// and no other batch work when the plan keeps the slot for queries. A
    /// batch holds one output kind; it always takes at least one sequence.
    ///
    /// `extra`: every `--max-inflight` slot is taken (a batch step and the
    /// query holding the slot kept for it): only a batch step launched
    /// ahead may go, in one slot more.
    pub(super) fn take_batch(&self, s: &mut State, extra: bool) -> Vec<SeqRef> {
        let batch_queue = self.priority.queue_index(Class::Batch);
        let now = Instant::now();
        let plan = self.priority.plan(
            self.max_batch_tokens,
            &Moment {
                now,
                batch_waiting: batch_queue == 1 && !s.queues[1].is_empty() && s.batch_steps == 0,
                batch_waiting_since: s.batch_waiting_since,
                last_interactive: s.last_interactive,
                batch_steps: s.batch_steps,
                capacity: s.pace.rate(),
                launch_at: s
                    .pace
                    .free_at()
                    .map(|t| t.checked_sub(s.pace.lead()).unwrap_or(t)),
            },
        );
        s.retry_at = plan.retry_at;
        if extra && !plan.ahead {
            return Vec::new();
        }
        let order: &[usize] = if extra { &[1] } else { &plan.order };
        let mut batch: Vec<SeqRef> = Vec::new();
        let (mut tokens, mut batch_tokens) = (0, 0);
        for &q in order {
            // Only with priorities on does queue 1 hold batch work.
            let batch_work = q == 1;
            let with_queries = batch
                .iter()
                .any(|seq| seq.request.class == Class::Interactive);
            if batch_work && !with_queries && !plan.batch_allowed {
                continue; // the slot stays free for interactive work
            }
            // A query's own step may carry the fill even past the batch
            // in-flight limit: it is the query's step, and the fill bounds it.
            let fill = if batch_work && with_queries {
                plan.fill
            } else {
                usize::MAX
            };
            let queue = &mut s.queues[q];
            while let Some(front) = queue.front() {
                if front.request.abandoned() {
                    let (class, len) = (front.request.class, front.len());
                    queue.pop_front();
                    s.backlog.dropped(class, len);
                    continue;
                }
                if let Some(first) = batch.first() {
                    if front.request.kind != first.request.kind
                        || tokens + front.len() > plan.budget[q]
                        || (batch_work && batch_tokens + front.len() > fill)
                        || batch.len() >= self.max_batch_sequences
                    {
                        break;
                    }
                }
                tokens += front.len();
                if batch_work {
                    batch_tokens += front.len();
                }
                batch.extend(queue.pop_front());
            }
        }
        if carries_batch(&batch) {
            s.batch_waiting_since = now;
            s.batch_steps += 1;
        }
        batch
    }

    /// One slot past `--max-inflight` for a batch step launched ahead
    /// (`priority.rs`): with one batch step and a query in flight, the next
    /// batch step still reaches the device before it runs out of work.
    pub(super) fn ahead_slot(&self) -> usize {
        let p = &self.priority;
        usize::from(p.enabled && p.launch_ahead && p.batch_inflight > 0)
    }
}
