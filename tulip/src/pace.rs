//! What the pool knows about the device's time, for the priority plan
//! (`priority.rs`): how fast it computes batch work, when the steps on it
//! will end, and how long a launch takes on the host.
//!
//! A step's device time is measured as on one stream: it starts when it
//! was launched (the step call returned) or when the step before it ended,
//! whichever is later, and ends when its event completes. Tokens per second
//! of that time, over recent steps carrying batch work, turn a device-time
//! bound into tokens. Measured on the bounded steps themselves, the figure
//! includes each step's fixed cost, so a bound of B converges to steps of B
//! whole (tokens = rate · B with rate = T / (t0 + a·T) settles at
//! t0 + a·T = B, and the fixed point attracts: its slope is t0 / B < 1).
//! On the CPU a step is the whole step call.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Weight of older steps in the rate (~20 steps).
const DECAY: f64 = 0.95;
/// Weight of older launches in the launch time (~10 launches).
const LAUNCH_DECAY: f64 = 0.9;

#[derive(Debug, Default)]
pub struct Pace {
    tokens: f64,
    seconds: f64,
    /// Device tokens of the steps launched and not yet ended, in order.
    queued: VecDeque<usize>,
    /// When the last step ended (its event completed).
    last_end: Option<Instant>,
    /// Estimated end of the last step on the device.
    free_at: Option<Instant>,
    /// Host seconds from planning a step to its launch returning (moving).
    launch_s: f64,
}

impl Pace {
    /// Tokens per second of device time of steps carrying batch work; 0
    /// until one has ended.
    pub fn rate(&self) -> f64 {
        if self.seconds > 0.0 {
            self.tokens / self.seconds
        } else {
            0.0
        }
    }

    /// A step reached the device: `planned` is when the scheduler took it,
    /// `now` when its launch returned.
    pub fn launched(&mut self, tokens: usize, planned: Instant, now: Instant) {
        let host = now.saturating_duration_since(planned).as_secs_f64();
        self.launch_s = if self.launch_s == 0.0 {
            host
        } else {
            LAUNCH_DECAY * self.launch_s + (1.0 - LAUNCH_DECAY) * host
        };
        self.queued.push_back(tokens);
        let start = self.free_at.map_or(now, |f| f.max(now));
        self.free_at = self.duration(tokens).map(|d| start + d);
    }

    /// The oldest step in flight ended (or failed: `measured` false);
    /// `on_device` is when it was launched, `batch` whether it carried
    /// batch work (only those set the rate).
    pub fn ended(&mut self, on_device: Instant, batch: bool, measured: bool, now: Instant) {
        let tokens = self.queued.pop_front().unwrap_or(0);
        let start = self.last_end.map_or(on_device, |e| e.max(on_device));
        self.last_end = Some(now);
        if measured && batch && tokens > 0 {
            let seconds = now.saturating_duration_since(start).as_secs_f64();
            if seconds > 0.0 {
                self.tokens = DECAY * self.tokens + tokens as f64;
                self.seconds = DECAY * self.seconds + seconds;
            }
        }
        // The steps still queued start now.
        let left: usize = self.queued.iter().sum();
        self.free_at = if self.queued.is_empty() {
            None
        } else {
            self.duration(left).map(|d| now + d)
        };
    }

    /// When the device is estimated to run out of work (`None`: idle, or
    /// no rate measured yet).
    pub fn free_at(&self) -> Option<Instant> {
        self.free_at
    }

    /// How long before `free_at` a step must be planned to reach the device
    /// in time: twice the moving host time of a launch (its jitter on a
    /// shared host is of the same order).
    pub fn lead(&self) -> Duration {
        Duration::from_secs_f64(2.0 * self.launch_s)
    }

    fn duration(&self, tokens: usize) -> Option<Duration> {
        let rate = self.rate();
        (rate > 0.0).then(|| Duration::from_secs_f64(tokens as f64 / rate))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn device_time_starts_at_the_launch_or_the_previous_end() {
        let mut p = Pace::default();
        let t = Instant::now();
        // Two steps of 1,000 tokens launched together, 2 ms each.
        p.launched(1_000, t, t);
        p.launched(1_000, t, t);
        p.ended(t, true, true, t + ms(2));
        p.ended(t, true, true, t + ms(4));
        assert!((p.rate() - 500_000.0).abs() < 1.0, "{}", p.rate());
        // Idle between steps does not count.
        p.launched(1_000, t + ms(100), t + ms(100));
        p.ended(t + ms(100), true, true, t + ms(102));
        assert!((p.rate() - 500_000.0).abs() < 1.0, "{}", p.rate());
    }

    #[test]
    fn only_completed_batch_steps_set_the_rate() {
        let mut p = Pace::default();
        let t = Instant::now();
        p.launched(10, t, t);
        p.ended(t, false, true, t + ms(1)); // a query's step
        p.launched(1_000, t + ms(1), t + ms(1));
        p.ended(t + ms(1), true, false, t + ms(50)); // failed
        assert_eq!(p.rate(), 0.0);
        assert_eq!(p.free_at(), None);
    }

    fn close(a: Option<Instant>, b: Instant) -> bool {
        a.is_some_and(|a| a.max(b) - a.min(b) < Duration::from_micros(1))
    }

    #[test]
    fn the_device_is_free_when_its_queued_steps_end() {
        let mut p = Pace::default();
        let t = Instant::now();
        let us = Duration::from_micros;
        p.launched(1_000, t - us(300), t);
        p.ended(t, true, true, t + ms(1)); // 1M tokens/s
        let t = t + ms(10);
        p.launched(2_000, t - us(300), t);
        assert!(close(p.free_at(), t + ms(2)));
        p.launched(1_000, t + ms(1) - us(300), t + ms(1));
        assert!(close(p.free_at(), t + ms(3)));
        // The first ends late (a query's step: the rate stays): the second
        // starts then.
        p.ended(t, false, true, t + ms(3));
        assert!(close(p.free_at(), t + ms(4)));
        // Twice the host time of a launch.
        assert!(
            (p.lead().as_secs_f64() - 600e-6).abs() < 1e-9,
            "{:?}",
            p.lead()
        );
    }
}
