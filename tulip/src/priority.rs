//! Priority classes: interactive requests (someone is waiting) go ahead of
//! batch work (indexing), which is delayed but never starved.
//!
//! The pool keeps one queue per class. Each step takes interactive
//! sequences first, then fills up with batch work. Two rules bound the
//! trade-off:
//! - starvation: batch work that has gone `batch_max_wait` without a step
//!   takes the next step first;
//! - short steps while someone waits: a query that arrives during a batch
//!   step waits for that step to end, so while interactive traffic is active
//!   (an interactive request within the last `INTERACTIVE_ACTIVE`), steps
//!   carrying batch work take at most `batch_step_tokens` tokens;
//! - with `fill_interactive_steps` off (the CPU, where a step's time grows
//!   with every token), a step carrying interactive work takes no batch
//!   work, so a query waits for at most one batch step and then its own.

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
    /// at most this many tokens (0 = the full step budget).
    pub batch_step_tokens: usize,
    /// Whether a step with interactive sequences is filled up with batch
    /// work (free on a GPU; on the CPU it lengthens the query's step).
    pub fill_interactive_steps: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            enabled: true,
            batch_max_wait: Duration::from_millis(500),
            batch_step_tokens: 0,
            fill_interactive_steps: true,
        }
    }
}

/// What the next step takes, decided by the pool under its lock.
pub struct Plan {
    /// The queues (by `queue_index`) in the order the step takes from them.
    pub order: [usize; 2],
    /// Token budget while taking from each queue (by `queue_index`).
    pub budget: [usize; 2],
}

/// The pool's view of the classes at the moment a step is planned.
pub struct Moment {
    pub now: Instant,
    pub batch_waiting: bool,
    /// Since when batch work has waited without a step.
    pub batch_waiting_since: Instant,
    pub last_interactive: Option<Instant>,
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
        if !self.enabled {
            return Plan {
                order: [0, 1],
                budget: [max_batch_tokens; 2],
            };
        }
        let starved =
            m.batch_waiting && m.now.duration_since(m.batch_waiting_since) >= self.batch_max_wait;
        let active = m
            .last_interactive
            .is_some_and(|t| m.now.duration_since(t) < INTERACTIVE_ACTIVE);
        let batch_budget = if active && self.batch_step_tokens > 0 {
            self.batch_step_tokens.min(max_batch_tokens)
        } else {
            max_batch_tokens
        };
        Plan {
            order: if starved { [1, 0] } else { [0, 1] },
            budget: [max_batch_tokens, batch_budget],
        }
    }
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
        }
    }

    #[test]
    fn interactive_first_until_batch_work_starves() {
        let s = Settings::default();
        assert_eq!(s.plan(100, &moment(10, None)).order, [0, 1]);
        assert_eq!(s.plan(100, &moment(600, None)).order, [1, 0]);
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
    fn off_means_one_queue_in_arrival_order() {
        let s = Settings {
            enabled: false,
            batch_step_tokens: 30,
            ..Settings::default()
        };
        assert_eq!(s.queue_index(Class::Batch), 0);
        let p = s.plan(100, &moment(10_000, Some(1)));
        assert_eq!((p.order, p.budget), ([0, 1], [100, 100]));
    }

    #[test]
    fn unknown_priorities_are_refused() {
        assert_eq!(Class::from_proto(0), Some(Class::Interactive));
        assert_eq!(Class::from_proto(2), Some(Class::Batch));
        assert_eq!(Class::from_proto(7), None);
    }
}
