//! Events of ROSE's simulated device (`rose/sim/events.py`): a second kind
//! of event handle, waited on by the same calls as a CUDA event
//! ([`crate::cuda::wait_for`], [`crate::cuda::is_complete`]), so the
//! completion thread, inline steps and their error paths are the ones a
//! GPU runs.
//!
//! A CUDA event is a pointer, 8-byte aligned, so its low bit is 0. A
//! simulated event is a tagged value: low bit 1, a 10-bit CUDA error code
//! (0 = none), then the modelled end of its step in microseconds of
//! `CLOCK_MONOTONIC` (the clock of Python's `time.monotonic_ns`). Waiting
//! sleeps until shortly before the end, with the GIL released, then yields
//! the core until the end (as the CUDA wait queries in a loop), and reports
//! the code as `cuEventQuery` would.

use std::time::Duration;

use crate::cuda::WaitError;

const TAG: usize = 1;
const CODE_BITS: u32 = 10;
const TIME_SHIFT: u32 = 1 + CODE_BITS;
/// How long before the end a wait stops sleeping and yields instead: a
/// sleep can overshoot by the scheduler's wake-up latency, a yield loop
/// sees the end within microseconds (the CUDA wait spins the same way).
const SPIN: Duration = Duration::from_micros(50);

/// Whether `handle` is a simulated event (a CUDA event's low bit is 0).
pub fn is_sim(handle: usize) -> bool {
    handle & TAG == TAG
}

/// (end in ns of `CLOCK_MONOTONIC`, CUDA error code) of a simulated event.
pub fn decode(handle: usize) -> (u64, i32) {
    let end_ns = ((handle as u64) >> TIME_SHIFT) * 1000;
    let code = ((handle >> 1) & ((1 << CODE_BITS) - 1)) as i32;
    (end_ns, code)
}

fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: an out-pointer to a local; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Sleeps until `CLOCK_MONOTONIC` reads `until_ns` (absolute, so a signal
/// that interrupts the sleep only restarts it).
fn sleep_until(until_ns: u64) {
    // The default timer slack (50 us) would make every wake-up late by
    // that much: a real event query loop is not, so neither is this one.
    thread_local!(static SLACK_SET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) });
    SLACK_SET.with(|s| {
        if !s.get() {
            // SAFETY: PR_SET_TIMERSLACK only changes this thread's slack.
            unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
            s.set(true);
        }
    });
    let ts = libc::timespec {
        tv_sec: (until_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (until_ns % 1_000_000_000) as libc::c_long,
    };
    loop {
        // SAFETY: a valid timespec; no remainder is needed for TIMER_ABSTIME.
        let rc = unsafe {
            libc::clock_nanosleep(
                libc::CLOCK_MONOTONIC,
                libc::TIMER_ABSTIME,
                &ts,
                std::ptr::null_mut(),
            )
        };
        if rc != libc::EINTR {
            return;
        }
    }
}

/// Blocks until the modelled end of the step, at most `timeout`.
pub fn wait_for(handle: usize, timeout: Duration) -> Result<(), WaitError> {
    let (end, code) = decode(handle);
    let start = now_ns();
    let limit = start.saturating_add(timeout.as_nanos() as u64);
    if end > limit {
        // A step modelled to take longer than the deadline is a hung one.
        sleep_until(limit);
        return Err(WaitError::Timeout(timeout));
    }
    let spin = SPIN.as_nanos() as u64;
    if end > start + spin {
        sleep_until(end - spin);
    }
    while now_ns() < end {
        std::thread::yield_now();
    }
    result(code)
}

/// Whether the step's modelled end has passed (its error, if it has one).
pub fn is_complete(handle: usize) -> Result<bool, WaitError> {
    let (end, code) = decode(handle);
    if now_ns() < end {
        return Ok(false);
    }
    result(code).map(|()| true)
}

fn result(code: i32) -> Result<(), WaitError> {
    if code == 0 {
        return Ok(());
    }
    Err(WaitError::Cuda {
        call: "cuEventQuery",
        code,
        name: format!("{} (simulated)", error_name(code)),
    })
}

/// The driver's names for the codes `rose/sim/events.py` can report.
fn error_name(code: i32) -> &'static str {
    match code {
        2 => "CUDA_ERROR_OUT_OF_MEMORY",
        400 => "CUDA_ERROR_INVALID_HANDLE",
        700 => "CUDA_ERROR_ILLEGAL_ADDRESS",
        710 => "CUDA_ERROR_ASSERT",
        719 => "CUDA_ERROR_LAUNCH_FAILED",
        999 => "CUDA_ERROR_UNKNOWN",
        _ => "CUDA error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle(end_ns: u64, code: usize) -> usize {
        ((end_ns.div_ceil(1000) as usize) << TIME_SHIFT) | (code << 1) | TAG
    }

    #[test]
    fn tagged_handles_round_trip_and_cuda_pointers_are_not_tagged() {
        let h = handle(5_000_123_000, 700);
        assert!(is_sim(h));
        assert_eq!(decode(h), (5_000_123_000, 700));
        assert!(!is_sim(0x7f00_dead_bee0));
    }

    #[test]
    fn a_wait_returns_at_the_modelled_end_not_before() {
        let end = now_ns() + 3_000_000;
        assert_eq!(wait_for(handle(end, 0), Duration::from_secs(5)), Ok(()));
        assert!(now_ns() >= end);
        assert_eq!(is_complete(handle(end, 0)), Ok(true));
        assert_eq!(is_complete(handle(now_ns() + 1_000_000_000, 0)), Ok(false));
    }

    #[test]
    fn codes_are_reported_like_the_driver_and_sticky_ones_are_fatal() {
        // Ended a moment ago (handles round the end up to a microsecond).
        let past = now_ns() - 10_000;
        let sticky = wait_for(handle(past, 700), Duration::from_secs(1)).unwrap_err();
        assert!(sticky.is_fatal());
        assert!(
            sticky.to_string().contains("CUDA_ERROR_ILLEGAL_ADDRESS"),
            "{sticky}"
        );
        let other = is_complete(handle(past, 400)).unwrap_err();
        assert!(!other.is_fatal());
    }

    #[test]
    fn a_step_longer_than_the_deadline_is_a_timeout() {
        let end = now_ns() + 60_000_000_000;
        let e = wait_for(handle(end, 0), Duration::from_millis(5)).unwrap_err();
        assert!(matches!(e, WaitError::Timeout(_)) && e.is_fatal());
    }
}
