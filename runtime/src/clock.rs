//! Wall-clock time read through tokio's clock: the wall time when the process first asked,
//! plus how far tokio's monotonic clock has moved since. In production that is the wall time
//! (without its jumps); under a paused tokio clock (tests) it moves with `tokio::time::advance`
//! and auto-advance, so timestamps a fake runtime records and the kubelet's back-off decisions
//! agree on one clock.

use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

fn base() -> &'static (SystemTime, std::time::Instant) {
    static BASE: OnceLock<(SystemTime, std::time::Instant)> = OnceLock::new();
    BASE.get_or_init(|| (SystemTime::now(), std::time::Instant::now()))
}

/// Now, on tokio's clock.
pub fn now() -> SystemTime {
    let (wall, mono) = *base();
    let at = tokio::time::Instant::now().into_std();
    // A paused clock (a test's runtime) may have started before another test set the base:
    // its times before the base are earlier wall times, not the base's (no time stands still).
    match at.checked_duration_since(mono) {
        Some(after) => wall + after,
        None => wall - mono.saturating_duration_since(at),
    }
}

/// Now in nanoseconds since the Unix epoch, on tokio's clock.
pub fn now_ns() -> i64 {
    now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
