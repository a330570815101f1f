//! Priority classes: interactive requests (someone is waiting) go ahead of
//! batch work (indexing), which is delayed but never starved.
//!
//! The pool keeps one queue per class. Each step takes interactive
//! sequences first, then batch work. On one device stream a query cannot
//! overtake a step already launched: it waits for whatever runs or is queued
//! on the device when it arrives, then for its own step. So while
//! interactive traffic is active (an interactive request within the last
//! `INTERACTIVE_ACTIVE`) the rules bound what a query can find ahead of it:
//! - short batch steps: a step carrying batch work takes at most
//!   `batch_step_time` of modelled device time (tokens / the capacity Tulip
//!   measures, `backlog.rs`) and at most `batch_step_tokens` tokens;
//! - a slot kept for queries: at most `batch_inflight` steps carrying batch
//!   work are in flight, so with `--max-inflight 2` and one batch step a
//!   query is launched at once, behind one batch step, not two. With
//!   `launch_ahead` the next batch step may still go when the device is
//!   about to run out of work (its estimated end minus a launch's host
//!   time, `pace.rs`), so the device does not idle while the host launches
//!   it; only a query arriving in that short window finds two batch steps;
//! - short query steps: a step carrying interactive work takes at most
//!   `interactive_fill` of batch work (0 on the CPU, where every token
//!   lengthens the query's own step).
//!
//! Starvation: batch work that has gone `batch_max_wait` without a step
//! takes the next step first (still within the bounds above).

use std::time::{Duration, Instant};

use proto::tulip::v1::Priority;

/// A request's class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Class {
    Interactive,
    Batch,
}

impl Class {
    /// `None` for a value this server does not know.
    pub fn from_proto(p: i32) -> Option<Self> {
        match Priority::try_from(p).ok()? {
            Priority::Unspecified | Priority::Interactive => Some(Self::Interactive),
            Priority::Batch => Some(Self::Batch),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Interactive => "interactive",
            Self::Batch => "batch",
        }
    }
}

/// How long after an interactive request the batch steps stay short.
pub const INTERACTIVE_ACTIVE: Duration = Duration::from_secs(1);

#[derive(Clone, Debug)]
pub struct Settings {
    /// Off: both classes share one first-come-first-served queue.
    pub enabled: bool,
    /// Batch work waiting this long without a step takes the next one.
    pub batch_max_wait: Duration,
    /// While interactive traffic is active, steps carrying batch work take
    /// at most this many tokens (0 = no token bound).
    pub batch_step_tokens: usize,
    /// ...and at most this much modelled device time: tokens over the
    /// measured capacity (zero = no time bound; none until a capacity was
    /// measured).
    pub batch_step_time: Duration,
    /// Batch work a step carrying interactive work may take, in modelled
    /// device time (zero = none); the batch step bounds apply as well.
    pub interactive_fill: Duration,
    /// While interactive traffic is active, at most this many steps
    /// carrying batch work are in flight; the other slots are kept for
    /// interactive work (0 = no limit beyond `--max-inflight`).
    pub batch_inflight: usize,
    /// Past that limit, a batch step may be launched when the device is
    /// about to run out of work.
    pub launch_ahead: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            enabled: true,
            batch_max_wait: Duration::from_millis(500),
            batch_step_tokens: 0,
            batch_step_time: Duration::ZERO,
            interactive_fill: Duration::MAX,
            batch_inflight: 0,
            launch_ahead: false,
        }
    }
}

/// What the next step takes, decided by the pool under its lock.
#[derive(Debug, PartialEq, Eq)]
pub struct Plan {
    /// The queues (by `queue_index`) in the order the step takes from them.
    pub order: [usize; 2],
    /// Token budget of the whole step while taking from each queue (by
    /// `queue_index`).
    pub budget: [usize; 2],
    /// Most batch tokens in a step that carries interactive work.
    pub fill: usize,
    /// Whether this step may take batch work at all (`batch_inflight`).
    pub batch_allowed: bool,
    /// When batch work held back by the limit may go (launch ahead).
    pub retry_at: Option<Instant>,
    /// Batch work may go only because the device is about to run out of
    /// work (past the in-flight limit).
    pub ahead: bool,
}

/// The pool's view of the classes at the moment a step is planned.
pub struct Moment {
    pub now: Instant,
    pub batch_waiting: bool,
    /// Since when batch work has waited without a step.
    pub batch_waiting_since: Instant,
    pub last_interactive: Option<Instant>,
    /// Steps carrying batch work in flight now.
    pub batch_steps: usize,
    /// Measured tokens per second of device time (0 = not yet).
    pub capacity: f64,
    /// When a batch step past the in-flight limit may be launched so that
    /// it reaches the device as the work on it ends (`None`: unknown).
    pub launch_at: Option<Instant>,
}

impl Settings {
    /// Which queue a class waits in: with priorities off, one shared queue.
    pub fn queue_index(&self, class: Class) -> usize {
        match (self.enabled, class) {
            (true, Class::Batch) => 1,
            _ => 0,
        }
    }

    pub fn plan(&self, max_batch_tokens: usize, m: &Moment) -> Plan {
        let full = Plan {
            order: [0, 1],
            budget: [max_batch_tokens; 2],
            fill: max_batch_tokens,
            batch_allowed: true,
            retry_at: None,
            ahead: false,
        };
        if !self.enabled {
            return full;
        }
        let starved =
            m.batch_waiting && m.now.duration_since(m.batch_waiting_since) >= self.batch_max_wait;
        let order = if starved { [1, 0] } else { [0, 1] };
        let active = m
            .last_interactive
            .is_some_and(|t| m.now.duration_since(t) < INTERACTIVE_ACTIVE);
        if !active {
            return Plan { order, ..full };
        }
        let mut batch = max_batch_tokens;
        if self.batch_step_tokens > 0 {
            batch = batch.min(self.batch_step_tokens);
        }
        if let Some(t) = tokens_in(self.batch_step_time, m.capacity) {
            batch = batch.min(t);
        }
        let fill = tokens_in(self.interactive_fill, m.capacity)
            .unwrap_or(if self.interactive_fill.is_zero() {
                0
            } else {
                batch
            })
            .min(batch);
        let under_limit = self.batch_inflight == 0 || m.batch_steps < self.batch_inflight;
        let launch_at = self.launch_ahead.then_some(m.launch_at).flatten();
        let ahead = !under_limit && launch_at.is_some_and(|t| m.now >= t);
        let batch_allowed = under_limit || ahead;
        Plan {
            order,
            budget: [max_batch_tokens, batch],
            fill,
            batch_allowed,
            retry_at: if batch_allowed { None } else { launch_at },
            ahead,
        }
    }
}

/// Tokens the device computes in `time` at `capacity` tokens/s (at least
/// one: a step always takes a sequence); `None` for no bound (zero or
/// unbounded time) or while no capacity has been measured.
fn tokens_in(time: Duration, capacity: f64) -> Option<usize> {
    if time.is_zero() || time == Duration::MAX || capacity <= 0.0 {
        return None;
    }
    Some(((time.as_secs_f64() * capacity) as usize).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn moment(waited_ms: u64, interactive_ms_ago: Option<u64>) -> Moment {
        let now = Instant::now() + Duration::from_secs(10);
        Moment {
            now,
            batch_waiting: true,
            batch_waiting_since: now - Duration::from_millis(waited_ms),
            last_interactive: interactive_ms_ago.map(|ms| now - Duration::from_millis(ms)),
            batch_steps: 0,
            capacity: 0.0,
            launch_at: None,
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn interactive_first_until_batch_work_starves() {
        let s = Settings::default();
        assert_eq!(s.plan(100, &moment(10, None)).order, [0, 1]);
        assert_eq!(s.plan(100, &moment(600, None)).order, [1, 0]);
        // Starved batch work leads the step but stays within the bounds.
        let s = Settings {
            batch_step_tokens: 30,
            ..Settings::default()
        };
        let p = s.plan(100, &moment(600, Some(5)));
        assert_eq!((p.order, p.budget), ([1, 0], [100, 30]));
    }

    #[test]
    fn batch_steps_are_short_only_while_interactive_traffic_is_active() {
        let s = Settings {
            batch_step_tokens: 30,
            ..Settings::default()
        };
        assert_eq!(s.plan(100, &moment(0, Some(5))).budget, [100, 30]);
        assert_eq!(s.plan(100, &moment(0, Some(5_000))).budget, [100, 100]);
        assert_eq!(s.plan(100, &moment(0, None)).budget, [100, 100]);
    }

    #[test]
    fn the_device_time_bound_turns_into_tokens_by_the_measured_capacity() {
        let s = Settings {
            batch_step_time: ms(2),
            batch_step_tokens: 5_000,
            interactive_fill: ms(1),
            ..Settings::default()
        };
        let mut m = moment(0, Some(5));
        // No capacity measured yet: the token bound alone.
        assert_eq!(s.plan(16_384, &m).budget, [16_384, 5_000]);
        assert_eq!(s.plan(16_384, &m).fill, 5_000);
        // 1M tokens/s: 2 ms is 2,000 tokens, the fill 1,000.
        m.capacity = 1e6;
        let p = s.plan(16_384, &m);
        assert_eq!((p.budget, p.fill), ([16_384, 2_000], 1_000));
        // The tighter bound wins; the fill never exceeds a batch step.
        m.capacity = 1e7;
        let p = s.plan(16_384, &m);
        assert_eq!((p.budget, p.fill), ([16_384, 5_000], 5_000));
        // A tiny capacity still lets a step take one sequence.
        m.capacity = 1.0;
        assert_eq!(s.plan(16_384, &m).budget[1], 1);
    }

    #[test]
    fn a_querys_step_takes_batch_work_only_up_to_the_fill() {
        let none = Settings {
            interactive_fill: Duration::ZERO,
            ..Settings::default()
        };
        assert_eq!(none.plan(100, &moment(0, Some(5))).fill, 0);
        let all = Settings::default();
        assert_eq!(all.plan(100, &moment(0, Some(5))).fill, 100);
    }

    #[test]
    fn batch_steps_in_flight_are_limited_only_while_queries_arrive() {
        let s = Settings {
            batch_inflight: 1,
            ..Settings::default()
        };
        let mut m = moment(0, Some(5));
        assert!(s.plan(100, &m).batch_allowed);
        m.batch_steps = 1;
        assert!(!s.plan(100, &m).batch_allowed);
        m.last_interactive = None;
        assert!(s.plan(100, &m).batch_allowed);
    }

    #[test]
    fn launching_ahead_lets_batch_work_go_when_the_device_is_about_to_run_out() {
        let s = Settings {
            batch_inflight: 1,
            launch_ahead: true,
            ..Settings::default()
        };
        let mut m = moment(0, Some(5));
        m.batch_steps = 1;
        // Unknown end: held back, with nothing to retry at but a wake-up.
        let p = s.plan(100, &m);
        assert!(!p.batch_allowed && p.retry_at.is_none());
        m.launch_at = Some(m.now + ms(3));
        let p = s.plan(100, &m);
        assert!(!p.batch_allowed);
        assert_eq!(p.retry_at, Some(m.now + ms(3)));
        m.launch_at = Some(m.now - ms(1));
        let p = s.plan(100, &m);
        assert!(p.batch_allowed && p.ahead);
        m.batch_steps = 0;
        assert!(!s.plan(100, &m).ahead, "under the limit is not ahead");
        m.batch_steps = 1;
        // Without launching ahead the limit holds until the step ends.
        let strict = Settings {
            launch_ahead: false,
            ..s
        };
        assert!(!strict.plan(100, &m).batch_allowed);
    }

    #[test]
    fn off_means_one_queue_in_arrival_order() {
        let s = Settings {
            enabled: false,
            batch_step_tokens: 30,
            batch_inflight: 1,
            interactive_fill: Duration::ZERO,
            ..Settings::default()
        };
        assert_eq!(s.queue_index(Class::Batch), 0);
        let mut m = moment(10_000, Some(1));
        m.batch_steps = 3;
        let p = s.plan(100, &m);
        assert_eq!(
            p,
            Plan {
                order: [0, 1],
                budget: [100, 100],
                fill: 100,
                batch_allowed: true,
                retry_at: None,
                ahead: false
            }
        );
    }

    #[test]
    fn unknown_priorities_are_refused() {
        assert_eq!(Class::from_proto(0), Some(Class::Interactive));
        assert_eq!(Class::from_proto(2), Some(Class::Batch));
        assert_eq!(Class::from_proto(7), None);
    }
}
