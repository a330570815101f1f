//! Ids of files, batches and request lines: a prefix and 24 random hex
//! digits. An id from a request is checked against that shape before it
//! reaches the database or a path, so no caller's text becomes a file name.

use ring::rand::{SecureRandom, SystemRandom};

pub const FILE: &str = "file-";
pub const BATCH: &str = "batch_";
pub const REQUEST: &str = "batch_req_";

const DIGITS: usize = 24;

pub fn new(prefix: &str) -> String {
    let mut bytes = [0u8; DIGITS / 2];
    // The system's generator fails only if the kernel has none; then a
    // clock-derived id still names one thing (ids are not secrets).
    if SystemRandom::new().fill(&mut bytes).is_err() {
        let t = super::clock::now_ms() as u128 * 6_364_136_223_846_793_005;
        bytes.copy_from_slice(&t.to_le_bytes()[..DIGITS / 2]);
    }
    let mut id = String::with_capacity(prefix.len() + DIGITS);
    id.push_str(prefix);
    for b in bytes {
        id.push_str(&format!("{b:02x}"));
    }
    id
}

/// Whether `id` has the shape `new(prefix)` makes.
pub fn valid(prefix: &str, id: &str) -> bool {
    id.strip_prefix(prefix).is_some_and(|rest| {
        rest.len() == DIGITS
            && rest
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_ids_are_valid_and_distinct() {
        let a = new(FILE);
        assert!(valid(FILE, &a));
        assert_ne!(a, new(FILE));
        assert!(!valid(BATCH, &a));
    }

    #[test]
    fn foreign_text_is_refused() {
        for bad in [
            "file-../../etc/passwd",
            "file-",
            "file-0123456789abcdef0123456",
            "file-0123456789abcdef01234567x",
            "file-0123456789ABCDEF01234567",
            "file-0123456789abcdef0123456/",
        ] {
            assert!(!valid(FILE, bad), "{bad}");
        }
        assert!(valid(FILE, "file-0123456789abcdef01234567"));
    }
}
