//! Scale from zero: while no replica is ready (a pool scaled to zero, or
//! every replica still loading), a request is held for up to
//! `--cold-start-hold` instead of failing at once. `ivy_held_requests`
//! counts the held requests, so an autoscaler (the chart's KEDA
//! activation trigger) sees demand while no Tulip runs to report it. Past
//! the hold the answer is 503 with `Retry-After` (`error.rs`), never a
//! 404 or a dropped connection.

use std::time::{Duration, Instant};

use prometheus_client::metrics::gauge::Gauge;

use crate::error::ApiError;

/// How often a held request looks for a ready replica (health checks and
/// DNS set the pace; this only bounds the delay after they succeed).
const POLL: Duration = Duration::from_millis(50);

/// Waits until `ready()` or `hold` has passed; how long it waited, or the
/// 503 that `unavailable()` makes. With `hold` zero it returns at once and
/// the request goes its usual way (its own 503 when no replica takes it).
pub async fn hold(
    hold: Duration,
    held: &Gauge,
    ready: impl Fn() -> bool,
    unavailable: impl FnOnce() -> ApiError,
) -> Result<Duration, ApiError> {
    if hold.is_zero() || ready() {
        return Ok(Duration::ZERO);
    }
    let start = Instant::now();
    let _held = Held::enter(held);
    while start.elapsed() < hold {
        tokio::time::sleep(POLL.min(hold.saturating_sub(start.elapsed()))).await;
        if ready() {
            return Ok(start.elapsed());
        }
    }
    Err(match unavailable() {
        ApiError::Unavailable(m) => ApiError::Unavailable(format!(
            "{m} (held {:.0}s for a replica to start; --cold-start-hold)",
            hold.as_secs_f64()
        )),
        other => other,
    })
}

/// One held request on the gauge; off it however the wait ends (a client
/// that disconnects drops the future).
struct Held<'a>(&'a Gauge);

impl<'a> Held<'a> {
    fn enter(g: &'a Gauge) -> Self {
        g.inc();
        Self(g)
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use super::*;

    fn gone() -> ApiError {
        ApiError::Unavailable("no replica".into())
    }

    #[tokio::test]
    async fn holds_until_ready_and_counts_the_held() {
        let gauge = Gauge::default();
        let up = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&up);
        let g = gauge.clone();
        let waiter = tokio::spawn(async move {
            hold(
                Duration::from_secs(30),
                &g,
                || flag.load(Ordering::SeqCst),
                gone,
            )
            .await
        });
        while gauge.get() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        up.store(true, Ordering::SeqCst);
        assert!(waiter.await.unwrap().is_ok());
        assert_eq!(gauge.get(), 0);
    }

    #[tokio::test]
    async fn past_the_hold_it_is_unavailable_and_without_one_it_never_waits() {
        let gauge = Gauge::default();
        let e = hold(Duration::from_millis(60), &gauge, || false, gone)
            .await
            .unwrap_err();
        assert!(
            matches!(&e, ApiError::Unavailable(m) if m.contains("--cold-start-hold")),
            "{e}"
        );
        for ready in [false, true] {
            let waited = hold(Duration::ZERO, &gauge, || ready, gone).await;
            assert_eq!(waited.unwrap(), Duration::ZERO);
        }
        assert_eq!(gauge.get(), 0);
    }
}
