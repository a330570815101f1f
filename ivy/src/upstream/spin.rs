//! Bounded busy-polling while a Tulip call is in flight.
//!
//! A thread that sleeps in `epoll_wait` until Tulip answers pays a wake-up
//! (on a virtual machine, tens of microseconds) on every request. While
//! calls that usually answer within the budget are in flight, one task
//! keeps the runtime polling its sockets instead, for at most the budget
//! per call. Nothing spins while no call is in flight, so an idle Ivy stays
//! idle; calls that usually take longer than the budget (a CPU model's
//! forward pass) do not spin at all, so the spinning never competes with a
//! long computation for the cores.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

pub struct Spinner {
    budget: Duration,
    inflight: AtomicUsize,
    /// Recent call latency (exponential average, nanoseconds).
    typical_ns: AtomicU64,
    started: Notify,
}

/// Marks one call in flight; records its latency when dropped.
pub struct InFlight<'a> {
    spinner: &'a Spinner,
    since: Instant,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let s = self.spinner;
        s.inflight.fetch_sub(1, Ordering::Relaxed);
        let ns = self.since.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        let old = s.typical_ns.load(Ordering::Relaxed);
        s.typical_ns
            .store(old - old / 8 + ns / 8, Ordering::Relaxed);
    }
}

impl Spinner {
    /// `budget` zero turns spinning off.
    pub fn new(budget: Duration) -> Arc<Self> {
        Arc::new(Self {
            budget,
            inflight: AtomicUsize::new(0),
            typical_ns: AtomicU64::new(0),
            started: Notify::new(),
        })
    }

    pub fn call(&self) -> InFlight<'_> {
        if self.inflight.fetch_add(1, Ordering::Relaxed) == 0 && self.worth_it() {
            self.started.notify_one();
        }
        InFlight {
            spinner: self,
            since: Instant::now(),
        }
    }

    fn worth_it(&self) -> bool {
        !self.budget.is_zero()
            && self.typical_ns.load(Ordering::Relaxed) < self.budget.as_nanos() as u64
    }

    /// The polling task: sleeps until a call starts, then yields to the
    /// runtime (which polls its sockets without blocking each time) until
    /// no call is in flight or the budget is spent.
    pub async fn run(self: Arc<Self>) {
        loop {
            self.started.notified().await;
            let start = Instant::now();
            while self.inflight.load(Ordering::Relaxed) > 0 && start.elapsed() < self.budget {
                tokio::task::yield_now().await;
            }
        }
    }
}
