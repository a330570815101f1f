//! The work a replica has not finished, in tokens and in seconds: what an
//! autoscaler sizes the pool on (docs/operations.md, "Autoscaling").
//!
//! Tokens are counted per priority class from arrival to the end of their
//! step: waiting (queued) and in flight (in a launched step). The capacity
//! is measured, not configured: tokens finished per second of busy engine
//! time (at least one step in flight), averaged over windows of
//! `WINDOW` busy time, so an idle replica keeps its last figure and a
//! quiet hour does not read as a slow device. Under light load steps are
//! small, and a GPU runs a small step almost as long as a full one, so a
//! window with a step launched while nothing else waited (unsaturated) only
//! bounds the capacity from below: it may raise the figure, never lower it.
//! Saturated windows (every step launched with work left waiting) set it:
//! the first replaces the lower bounds, later ones move the average both
//! ways. Backlog seconds =
//! outstanding tokens / capacity: how long this replica needs for what it
//! holds, comparable across replicas and models.

use std::time::{Duration, Instant};

use crate::priority::Class;

/// Busy time folded into the capacity average at once.
const WINDOW: Duration = Duration::from_secs(1);
/// Weight of the newest window in the moving average (~5 windows).
const ALPHA: f64 = 0.2;

#[derive(Debug, Default)]
pub struct Backlog {
    waiting: [u64; 2],
    inflight: [u64; 2],
    /// Since when busy time has not been counted (a step is in flight).
    busy_mark: Option<Instant>,
    window_tokens: u64,
    window_busy: Duration,
    /// Whether a step of this window was launched with nothing left waiting.
    window_unsaturated: bool,
    /// Tokens per busy second; 0 until the first step finished.
    capacity: f64,
    /// Whether `capacity` comes from a saturated window (else a lower bound).
    saturated_seen: bool,
}

/// What the metrics show, read at scrape time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Snapshot {
    pub waiting: [u64; 2],
    pub inflight: [u64; 2],
    pub capacity: f64,
}

impl Snapshot {
    /// Seconds this replica needs for a class's outstanding tokens; 0 until
    /// a capacity was measured (the first step, milliseconds after the
    /// first request).
    pub fn seconds(&self, class: Class) -> f64 {
        let i = index(class);
        let outstanding = (self.waiting[i] + self.inflight[i]) as f64;
        if self.capacity > 0.0 {
            outstanding / self.capacity
        } else {
            0.0
        }
    }
}

pub fn index(class: Class) -> usize {
    match class {
        Class::Interactive => 0,
        Class::Batch => 1,
    }
}

/// Tokens of each class in `items` (class, tokens).
pub fn by_class(items: impl IntoIterator<Item = (Class, usize)>) -> [u64; 2] {
    let mut out = [0u64; 2];
    for (class, n) in items {
        out[index(class)] += n as u64;
    }
    out
}

impl Backlog {
    pub fn queued(&mut self, class: Class, tokens: usize) {
        self.waiting[index(class)] += tokens as u64;
    }

    /// Left the queue without a step (cancelled, or failed at shutdown).
    pub fn dropped(&mut self, class: Class, tokens: usize) {
        let w = &mut self.waiting[index(class)];
        *w = w.saturating_sub(tokens as u64);
    }

    /// A step was launched with these tokens; `from_queue` false for an
    /// inline step (its tokens were never queued). `busy_before`: whether
    /// a step was already in flight; `saturated`: whether work was left
    /// waiting (the step is as full as the scheduler makes it).
    pub fn launched(
        &mut self,
        tokens: [u64; 2],
        from_queue: bool,
        busy_before: bool,
        saturated: bool,
        now: Instant,
    ) {
        self.window_unsaturated |= !saturated;
        for (i, n) in tokens.into_iter().enumerate() {
            if from_queue {
                self.waiting[i] = self.waiting[i].saturating_sub(n);
            }
            self.inflight[i] += n;
        }
        if !busy_before {
            self.busy_mark = Some(now);
        }
    }

    /// A step ended; `busy_after`: whether another is still in flight.
    pub fn finished(&mut self, tokens: [u64; 2], busy_after: bool, now: Instant) {
        for (held, n) in self.inflight.iter_mut().zip(tokens) {
            *held = held.saturating_sub(n);
        }
        if let Some(mark) = self.busy_mark {
            self.window_busy += now.saturating_duration_since(mark);
        }
        self.busy_mark = busy_after.then_some(now);
        self.window_tokens += tokens[0] + tokens[1];
        // The first window folds in at once, so a new replica has a figure
        // after its first step.
        if self.window_busy >= WINDOW || (self.capacity == 0.0 && !self.window_busy.is_zero()) {
            let rate = self.window_tokens as f64 / self.window_busy.as_secs_f64();
            self.capacity = if self.window_unsaturated {
                self.capacity.max(rate)
            } else if !self.saturated_seen {
                self.saturated_seen = true;
                rate
            } else {
                self.capacity + ALPHA * (rate - self.capacity)
            };
            self.window_tokens = 0;
            self.window_busy = Duration::ZERO;
            self.window_unsaturated = false;
        }
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            waiting: self.waiting,
            inflight: self.inflight,
            capacity: self.capacity,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_move_from_waiting_to_in_flight_to_done() {
        let mut b = Backlog::default();
        let t0 = Instant::now();
        b.queued(Class::Interactive, 100);
        b.queued(Class::Batch, 1000);
        assert_eq!(b.snapshot().waiting, [100, 1000]);
        assert_eq!(
            b.snapshot().seconds(Class::Batch),
            0.0,
            "no capacity measured yet"
        );
        b.launched([100, 400], true, false, true, t0);
        assert_eq!(b.snapshot().waiting, [0, 600]);
        assert_eq!(b.snapshot().inflight, [100, 400]);
        b.finished([100, 400], false, t0 + Duration::from_millis(500));
        let s = b.snapshot();
        assert_eq!(s.inflight, [0, 0]);
        assert!((s.capacity - 1000.0).abs() < 1e-6, "{s:?}");
        assert!((s.seconds(Class::Batch) - 0.6).abs() < 1e-9);
        assert_eq!(s.seconds(Class::Interactive), 0.0);
    }

    #[test]
    fn idle_time_is_not_counted_and_the_average_moves_by_windows() {
        let mut b = Backlog::default();
        let t0 = Instant::now();
        let s = Duration::from_secs;
        b.launched([1000, 0], true, false, true, t0);
        b.finished([1000, 0], false, t0 + s(1));
        assert!((b.snapshot().capacity - 1000.0).abs() < 1e-6);
        // A long idle gap, then a window twice as fast.
        b.launched([0, 2000], true, false, true, t0 + s(100));
        b.finished([0, 2000], false, t0 + s(101));
        let c = b.snapshot().capacity;
        assert!((c - (1000.0 + ALPHA * 1000.0)).abs() < 1e-6, "{c}");
        b.dropped(Class::Batch, 5);
        assert_eq!(b.snapshot().waiting, [0, 0]);
    }

    #[test]
    fn unsaturated_windows_only_raise_the_figure_until_a_saturated_one_sets_it() {
        let mut b = Backlog::default();
        let t0 = Instant::now();
        let s = Duration::from_secs;
        // Lone queries: 100 tokens per busy second, a lower bound.
        b.launched([100, 0], false, false, false, t0);
        b.finished([100, 0], false, t0 + s(1));
        assert!((b.snapshot().capacity - 100.0).abs() < 1e-6);
        b.launched([50, 0], false, false, false, t0 + s(5));
        b.finished([50, 0], false, t0 + s(6));
        assert!(
            (b.snapshot().capacity - 100.0).abs() < 1e-6,
            "a light window lowered it"
        );
        // Saturated: the first window replaces the bound, later ones average.
        b.launched([0, 5000], true, false, true, t0 + s(10));
        b.finished([0, 5000], false, t0 + s(11));
        assert!((b.snapshot().capacity - 5000.0).abs() < 1e-6);
        b.launched([0, 4000], true, false, true, t0 + s(20));
        b.finished([0, 4000], false, t0 + s(21));
        assert!((b.snapshot().capacity - (5000.0 - ALPHA * 1000.0)).abs() < 1e-6);
    }
}
