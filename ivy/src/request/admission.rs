//! Admission: a fixed number of requests at once (the rest are refused with
//! 429 at once rather than queued), and no new work once draining.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::ApiError;

pub struct Admission {
    permits: Arc<Semaphore>,
    max: usize,
    draining: AtomicBool,
}

/// Held for as long as a request is being processed.
pub struct Permit(#[allow(dead_code)] OwnedSemaphorePermit);

impl Admission {
    pub fn new(max_concurrent: usize) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(max_concurrent)),
            max: max_concurrent,
            draining: AtomicBool::new(false),
        }
    }

    pub fn admit(&self) -> Result<Permit, ApiError> {
        if self.is_draining() {
            return Err(ApiError::Unavailable(
                "this Ivy instance is shutting down; retry on another one".into(),
            ));
        }
        match Arc::clone(&self.permits).try_acquire_owned() {
            Ok(p) => Ok(Permit(p)),
            Err(_) => Err(ApiError::Overloaded(format!(
                "too many concurrent requests (limit {}); retry with backoff",
                self.max
            ))),
        }
    }

    /// Requests being processed now.
    pub fn in_flight(&self) -> usize {
        self.max - self.permits.available_permits()
    }

    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_over_the_limit_and_recovers() {
        let a = Admission::new(2);
        let p1 = a.admit().unwrap();
        let _p2 = a.admit().unwrap();
        assert_eq!(a.in_flight(), 2);
        assert!(matches!(a.admit(), Err(ApiError::Overloaded(_))));
        drop(p1);
        assert!(a.admit().is_ok());
    }

    #[test]
    fn draining_refuses_new_work() {
        let a = Admission::new(2);
        a.start_draining();
        assert!(matches!(a.admit(), Err(ApiError::Unavailable(_))));
    }
}
