//! Hands glibc's free heap pages back to the OS after large CPU steps.
//!
//! A CPU forward allocates its activations with the C allocator (torch and
//! oneDNN use glibc's malloc; only Tulip's own Rust allocations use
//! mimalloc). glibc raises its mmap threshold to the largest block freed so
//! far (up to 32 MiB), so after the first large batch the activations of
//! later ones come from its heaps, and ragged shapes fragment them: in a 30-minute soak of mixed traffic
//! Tulip's RSS rose for 20 minutes, 744 -> 982 MiB. `malloc_trim` returns
//! the free pages of every heap (about 0.7 ms with MiniLM); done after
//! every few thousand tokens of CPU steps it kept RSS flat in the same mix,
//! where a fixed, low mmap threshold kept it flat too but made 100-document
//! batches 35% slower (every activation a fresh mmap).

/// When to trim: after `every_tokens` real tokens of scheduler steps, once
/// nothing is queued (a trim never delays waiting work), or regardless
/// after four times as many (memory stays bounded under constant load).
pub struct Trim {
    every_tokens: usize,
    since: usize,
}

impl Trim {
    /// `every_tokens` = 0 never trims.
    pub fn new(every_tokens: usize) -> Self {
        Self {
            every_tokens,
            since: 0,
        }
    }

    /// Counts a finished step's tokens; true when the caller should trim now.
    pub fn due(&mut self, tokens: usize, queue_empty: bool) -> bool {
        if self.every_tokens == 0 {
            return false;
        }
        self.since += tokens;
        let due = self.since >= self.every_tokens
            && (queue_empty || self.since >= self.every_tokens.saturating_mul(4));
        if due {
            self.since = 0;
        }
        due
    }
}

/// Returns free heap memory to the OS; false where the C library has no
/// `malloc_trim` (not glibc) or nothing could be released.
pub fn trim() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn malloc_trim(pad: usize) -> std::os::raw::c_int;
        }
        // SAFETY: malloc_trim takes the allocator's own locks; any thread may call it.
        unsafe { malloc_trim(0) != 0 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::Trim;

    #[test]
    fn zero_never_trims() {
        let mut t = Trim::new(0);
        assert!(!t.due(1 << 30, true));
    }

    #[test]
    fn trims_once_enough_tokens_ran_and_the_queue_is_empty() {
        let mut t = Trim::new(1000);
        assert!(!t.due(600, true));
        assert!(!t.due(600, false), "work is waiting");
        assert!(t.due(10, true));
        assert!(!t.due(999, true), "the count starts again after a trim");
        assert!(t.due(1, true));
    }

    #[test]
    fn trims_under_constant_load_after_four_times_as_many() {
        let mut t = Trim::new(1000);
        for _ in 0..3 {
            assert!(!t.due(1000, false));
        }
        assert!(t.due(1000, false));
        assert!(!t.due(1000, false));
    }
}
