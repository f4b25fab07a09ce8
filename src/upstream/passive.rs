//! Passive health: a peer that cannot be connected to, or whose connection breaks with
//! a request on it, leaves rotation for `fail_duration` after `breaker` consecutive
//! failures. A successful connection clears the count. Atomics only.

use crate::clock::now_ms;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

#[derive(Default)]
pub(crate) struct Breaker {
    consecutive: AtomicU32,
    out_until: AtomicU64,
    /// When the breaker last took the peer out (`now_ms`), 0 for never.
    pub out_since: AtomicU64,
}

impl Breaker {
    pub(crate) fn is_available(&self, now: u64) -> bool {
        self.out_until.load(Ordering::Relaxed) <= now
    }

    pub(crate) fn record_success(&self) {
        if self.consecutive.load(Ordering::Relaxed) != 0 {
            self.consecutive.store(0, Ordering::Relaxed);
        }
    }

    /// When the peer is back in rotation (`now_ms`), if it is out now.
    pub(crate) fn out_until(&self) -> u64 {
        self.out_until.load(Ordering::Relaxed)
    }

    /// Counts a failure; returns true when this one takes the peer out of rotation.
    pub(crate) fn record_failure(&self, breaker: u32, fail_duration: Duration) -> bool {
        if fail_duration.is_zero() {
            return false;
        }
        let n = self.consecutive.fetch_add(1, Ordering::Relaxed) + 1;
        if n < breaker {
            return false;
        }
        self.consecutive.store(0, Ordering::Relaxed);
        let now = now_ms();
        let was_out = !self.is_available(now);
        if !was_out {
            self.out_since.store(now, Ordering::Relaxed);
        }
        self.out_until
            .store(now + fail_duration.as_millis() as u64, Ordering::Relaxed);
        !was_out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_after_breaker_failures() {
        let b = Breaker::default();
        let d = Duration::from_secs(30);
        assert!(!b.record_failure(2, d), "one failure of two");
        assert!(b.is_available(now_ms()));
        assert!(b.record_failure(2, d), "the second takes it out");
        assert!(!b.is_available(now_ms()));
        let off = Breaker::default();
        assert!(
            !off.record_failure(1, Duration::ZERO),
            "fail_duration 0s turns it off"
        );
        assert!(off.is_available(now_ms()));
    }
}
