//! The process clock: milliseconds since start, small enough for an atomic, so peer
//! state, buckets and timers compare times without locks; and the wall-clock time of a
//! reading, for what an operator reads. A leaf: imports nothing of the crate.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

static EPOCH: OnceLock<(Instant, std::time::SystemTime)> = OnceLock::new();

fn epoch() -> &'static (Instant, std::time::SystemTime) {
    EPOCH.get_or_init(|| (Instant::now(), std::time::SystemTime::now()))
}

/// Milliseconds since the process started: a clock that fits in an atomic.
pub(crate) fn now_ms() -> u64 {
    // Not `as_millis`: its u128 division costs more than reading the clock.
    let d = epoch().0.elapsed();
    d.as_secs() * 1000 + u64::from(d.subsec_millis()) + 1
}

/// The wall-clock time of a [`now_ms`] reading, for an operator to read.
pub(crate) fn wall_clock(ms: u64) -> std::time::SystemTime {
    epoch().1 + Duration::from_millis(ms.saturating_sub(1))
}
