//! Wall-clock time for records shared between processes (leases in
//! milliseconds, the API's timestamps in seconds since the Unix epoch).

use std::time::{SystemTime, UNIX_EPOCH};

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

pub fn now_s() -> i64 {
    now_ms() / 1000
}
