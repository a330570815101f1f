//! Events of ROSE's simulated device (`rose/sim/events.py`): a second kind
//! of event handle, queried through the same call as a CUDA event
//! ([`crate::event::is_complete`]), so the completion thread, inline steps,
//! their waits and their error paths are the ones a GPU runs.
//!
//! A CUDA event is a pointer, 8-byte aligned, so its low bit is 0. A
//! simulated event's handle is the address of its two-word slot with the
//! low bit set. Word 0: the modelled end of its step, in ns of
//! `CLOCK_MONOTONIC` (the clock of Python's `time.monotonic_ns`). Word 1:
//! 0 while the step's rows are being written into its host buffer, then
//! `code << 1 | 1` (code 0 = success, else the CUDA error its step reports).
//! The event is complete once both its end has passed and its rows are
//! written.

use std::sync::atomic::{AtomicI64, Ordering};

const TAG: usize = 1;

/// Whether `handle` is a simulated event (a CUDA event's low bit is 0).
pub fn is_sim(handle: usize) -> bool {
    handle & TAG == TAG
}

fn now_ns() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: an out-pointer to a local; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

/// Whether the step's modelled end has passed and its rows are written;
/// `Err(code)` once it is complete with a CUDA error.
///
/// # Safety
/// `handle` must be a simulated event's handle whose slot is alive (its
/// owner, the step's LazyTensor, is kept until the wait returns).
pub unsafe fn query(handle: usize) -> Result<bool, i32> {
    let slot = (handle & !TAG) as *const AtomicI64;
    // SAFETY: the caller's contract: the slot's two words are alive.
    // Acquire: the rows written before the state word are visible after it.
    let state = unsafe { (*slot.add(1)).load(Ordering::Acquire) };
    // SAFETY: as above.
    if state & 1 == 0 || now_ns() < unsafe { (*slot).load(Ordering::Relaxed) } {
        return Ok(false);
    }
    match (state >> 1) as i32 {
        0 => Ok(true),
        code => Err(code),
    }
}

/// The driver's names for the codes `rose/sim/events.py` can report.
pub fn error_name(code: i32) -> &'static str {
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
pub mod tests {
    use super::*;

    /// A slot as `rose/sim/events.py` lays one out.
    pub struct Slot(Box<[AtomicI64; 2]>);

    impl Slot {
        pub fn new(end_ns: i64, written: bool, code: i64) -> Self {
            let state = if written { code << 1 | 1 } else { 0 };
            Self(Box::new([AtomicI64::new(end_ns), AtomicI64::new(state)]))
        }

        pub fn handle(&self) -> usize {
            self.0.as_ptr() as usize | TAG
        }

        pub fn end(&self) -> i64 {
            self.0[0].load(Ordering::Relaxed)
        }

        pub fn write(&self, code: i64) {
            self.0[1].store(code << 1 | 1, Ordering::Release);
        }
    }

    pub fn now_ns() -> i64 {
        super::now_ns()
    }

    #[test]
    fn handles_are_tagged_and_cuda_pointers_are_not() {
        let s = Slot::new(0, true, 0);
        assert!(is_sim(s.handle()));
        assert!(!is_sim(0x7f00_dead_bee0));
    }

    #[test]
    fn complete_only_when_ended_and_written() {
        let s = Slot::new(now_ns() + 1_000_000_000, false, 0);
        // SAFETY: the slot lives to the end of the test.
        unsafe {
            assert_eq!(query(s.handle()), Ok(false));
            s.write(0);
            assert_eq!(query(s.handle()), Ok(false), "not before its end");
            let written_late = Slot::new(now_ns() - 1, false, 0);
            assert_eq!(
                query(written_late.handle()),
                Ok(false),
                "not before its rows"
            );
            written_late.write(0);
            assert_eq!(query(written_late.handle()), Ok(true));
            let failed = Slot::new(now_ns() - 1, true, 400);
            assert_eq!(query(failed.handle()), Err(400));
        }
    }
}
