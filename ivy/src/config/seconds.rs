//! Durations given as (fractional) seconds, as every timeout flag takes
//! them. A leaf: `Config` and `NetConfig` both read it.

use std::time::Duration;

pub fn parse_seconds(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("`{s}` is not a number of seconds"))?;
    if !(secs.is_finite() && secs > 0.0) {
        return Err(format!("`{s}` must be a positive number of seconds"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// As `parse_seconds`, where 0 means off.
pub fn parse_seconds_or_zero(s: &str) -> Result<Duration, String> {
    if s.trim().parse::<f64>() == Ok(0.0) {
        return Ok(Duration::ZERO);
    }
    parse_seconds(s)
}
