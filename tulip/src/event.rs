//! Waiting for a step's output without the GIL: one loop for a CUDA event
//! (`cuda.rs`, through the driver) and a simulated device's event
//! (`sim_event.rs`), with one spin and back-off policy, so the simulated
//! device costs the waiting thread what a GPU's event does.
//!
//! Waits are bounded: the event is queried in a loop (yielding the core
//! between queries), then polled with a back-off, until a deadline, so a
//! hung kernel turns into an error instead of a thread that never
//! returns. Errors name the CUDA code (`CUDA_ERROR_ILLEGAL_ADDRESS`), and
//! [`WaitError::is_fatal`] says when the context is unusable for good.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::{cuda, sim_event};

/// How long one wait may take before it is reported as a hang, unless
/// `TULIP_EVENT_TIMEOUT_S` says otherwise.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
/// For this long a wait queries in a loop (yielding the core between
/// queries): a step of a few milliseconds is seen within microseconds, as
/// fast as a blocking synchronize would wake up. Longer steps are then
/// polled with a back-off, capped so that the extra latency stays a small
/// fraction of a step that long and the thread costs little CPU.
const SPIN: Duration = Duration::from_millis(20);
const FIRST_POLL: Duration = Duration::from_micros(10);
const MAX_POLL: Duration = Duration::from_micros(200);

/// Why a wait did not end with a completed event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitError {
    /// No driver, a missing symbol, no context: nothing was waited on.
    Unavailable(String),
    /// The event did not complete within the deadline (a hung kernel).
    Timeout(Duration),
    /// The driver (or the simulated device) reported an error for the event.
    Cuda {
        call: &'static str,
        code: i32,
        name: String,
    },
}

impl WaitError {
    /// The process's CUDA context cannot be used any more: a sticky
    /// (asynchronous kernel) error, or a step that never finished. Every
    /// later step would fail too, so the replica must stop serving.
    pub fn is_fatal(&self) -> bool {
        match self {
            WaitError::Unavailable(_) => false,
            WaitError::Timeout(_) => true,
            WaitError::Cuda { code, .. } => cuda::is_sticky(*code),
        }
    }
}

impl std::fmt::Display for WaitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WaitError::Unavailable(m) => f.write_str(m),
            WaitError::Timeout(d) => {
                write!(f, "CUDA event not complete after {:.1}s", d.as_secs_f64())
            }
            WaitError::Cuda { call, code, name } => write!(f, "{call} failed: {name} ({code})"),
        }
    }
}

/// The wait deadline: `TULIP_EVENT_TIMEOUT_S` seconds, else two minutes.
pub fn default_timeout() -> Duration {
    static T: OnceLock<Duration> = OnceLock::new();
    *T.get_or_init(|| {
        std::env::var("TULIP_EVENT_TIMEOUT_S")
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .filter(|s| *s > 0.0)
            .map_or(DEFAULT_TIMEOUT, Duration::from_secs_f64)
    })
}

/// Blocks until the event has completed, at most [`default_timeout`].
/// `event == 0` means "no event".
pub fn wait(event: usize) -> Result<(), WaitError> {
    wait_for(event, default_timeout())
}

/// Blocks until the event has completed or `timeout` has passed.
pub fn wait_for(event: usize, timeout: Duration) -> Result<(), WaitError> {
    if event == 0 {
        return Ok(());
    }
    let start = Instant::now();
    let mut pause = FIRST_POLL;
    loop {
        if is_complete(event)? {
            return Ok(());
        }
        let waited = start.elapsed();
        if waited >= timeout {
            return Err(WaitError::Timeout(waited));
        }
        if waited < SPIN {
            std::thread::yield_now();
            continue;
        }
        std::thread::sleep(pause.min(timeout - waited));
        pause = (pause * 2).min(MAX_POLL);
    }
}

/// Whether the event has completed, without blocking. A simulated
/// device's event is a tagged handle (odd; a CUDA event is an aligned
/// pointer), answered by `sim_event`; any other by the CUDA driver.
pub fn is_complete(event: usize) -> Result<bool, WaitError> {
    if event == 0 {
        return Ok(true);
    }
    if sim_event::is_sim(event) {
        // SAFETY: the caller keeps the event's owner (the LazyTensor) alive
        // until this returns, and with it the slot the handle points to.
        return unsafe { sim_event::query(event) }.map_err(|code| WaitError::Cuda {
            call: "cuEventQuery",
            code,
            name: format!("{} (simulated)", sim_event::error_name(code)),
        });
    }
    cuda::query(event).map_err(|e| match e {
        cuda::QueryError::Unavailable(m) => WaitError::Unavailable(m),
        cuda::QueryError::Cuda { call, code, name } => WaitError::Cuda { call, code, name },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_event_is_complete() {
        assert!(wait(0).is_ok());
        assert_eq!(is_complete(0), Ok(true));
    }

    #[test]
    fn sticky_errors_are_fatal_and_others_not() {
        let illegal = WaitError::Cuda {
            call: "cuEventQuery",
            code: 700,
            name: "CUDA_ERROR_ILLEGAL_ADDRESS".into(),
        };
        assert!(illegal.is_fatal());
        assert!(WaitError::Timeout(Duration::from_secs(1)).is_fatal());
        let invalid = WaitError::Cuda {
            call: "cuEventQuery",
            code: 400,
            name: "CUDA_ERROR_INVALID_HANDLE".into(),
        };
        assert!(!invalid.is_fatal());
        assert!(!WaitError::Unavailable("no driver".into()).is_fatal());
        assert_eq!(
            illegal.to_string(),
            "cuEventQuery failed: CUDA_ERROR_ILLEGAL_ADDRESS (700)"
        );
    }

    #[test]
    fn a_missing_driver_is_reported_not_fatal() {
        // CI machines have no libcuda: a real event cannot be waited on,
        // and the error says why instead of panicking.
        if cuda::query(8).is_err() {
            // (An aligned value: odd ones are simulated events.)
            let e = wait(8).unwrap_err();
            assert!(matches!(e, WaitError::Unavailable(_)), "{e}");
            assert!(e.to_string().contains("libcuda"), "{e}");
        }
    }

    #[test]
    fn simulated_events_go_through_the_same_loop() {
        let slot = sim_event::tests::Slot::new(sim_event::tests::now_ns() + 3_000_000, true, 0);
        assert_eq!(is_complete(slot.handle()), Ok(false));
        assert_eq!(wait_for(slot.handle(), Duration::from_secs(5)), Ok(()));
        assert!(sim_event::tests::now_ns() >= slot.end());
        let failed = sim_event::tests::Slot::new(0, true, 700);
        let e = wait(failed.handle()).unwrap_err();
        assert!(
            e.is_fatal() && e.to_string().contains("CUDA_ERROR_ILLEGAL_ADDRESS"),
            "{e}"
        );
        let hung = sim_event::tests::Slot::new(0, false, 0); // rows never written
        let e = wait_for(hung.handle(), Duration::from_millis(5)).unwrap_err();
        assert!(matches!(e, WaitError::Timeout(_)) && e.is_fatal());
    }
}
