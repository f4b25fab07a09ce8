//! Outlier ejection (`outlier { consecutive_5xx N; ejection D; max_ejected PERCENT }`,
//! DESIGN.md §8.4): a peer that answers N 5xx in a row is ejected for D, doubling on
//! each repeat up to 10×D; never more than PERCENT of the pool at once (at least one
//! peer may always be ejected). A peer that stays clear for 10×D after an ejection
//! starts from D again. Atomics only.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::config::Outlier;

#[derive(Debug, Default)]
pub(crate) struct Ejection {
    consecutive: AtomicU32,
    until_ms: AtomicU64,
    /// Ejections in a row (each one doubles the next).
    times: AtomicU32,
    /// When the last ejection began (`now_ms`), 0 for never.
    pub since_ms: AtomicU64,
    pub total: AtomicU64,
}

impl Ejection {
    /// When the last ejection ends (or ended), if there was one.
    pub(crate) fn until(&self) -> Option<u64> {
        Some(self.until_ms.load(Ordering::Relaxed)).filter(|&t| t != 0)
    }

    pub(crate) fn is_ejected(&self, now: u64) -> bool {
        self.until_ms.load(Ordering::Relaxed) > now
    }

    /// Counts an answer; returns when the peer comes back if this one ejects it.
    /// `ejected_now` counts the pool's peers ejected at this moment, of `pool_size`.
    pub(crate) fn record(
        &self,
        status: u16,
        o: &Outlier,
        now: u64,
        ejected_now: impl FnOnce() -> usize,
        pool_size: usize,
    ) -> Option<u64> {
        if status < 500 {
            if self.consecutive.load(Ordering::Relaxed) != 0 {
                self.consecutive.store(0, Ordering::Relaxed);
            }
            return None;
        }
        let n = self.consecutive.fetch_add(1, Ordering::Relaxed) + 1;
        if n < o.consecutive_5xx || self.is_ejected(now) {
            return None;
        }
        let cap = (pool_size * o.max_ejected as usize / 100).max(1);
        if ejected_now() >= cap {
            return None;
        }
        self.consecutive.store(0, Ordering::Relaxed);
        let base = o.ejection.as_millis() as u64;
        let clear_since = self.until_ms.load(Ordering::Relaxed);
        let times = if clear_since != 0 && now.saturating_sub(clear_since) > base * 10 {
            0
        } else {
            self.times.load(Ordering::Relaxed)
        };
        let length = (base << times.min(4)).min(base * 10);
        self.times.store(times + 1, Ordering::Relaxed);
        self.total.fetch_add(1, Ordering::Relaxed);
        let until = now + length;
        self.since_ms.store(now, Ordering::Relaxed);
        self.until_ms.store(until, Ordering::Relaxed);
        Some(until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn ejections_double_up_to_ten_times_and_respect_the_cap() {
        let o = Outlier {
            consecutive_5xx: 2,
            ejection: Duration::from_secs(1),
            max_ejected: 50,
        };
        let e = Ejection::default();
        let mut now = 1_000;
        assert_eq!(e.record(500, &o, now, || 0, 4), None);
        assert_eq!(
            e.record(200, &o, now, || 0, 4),
            None,
            "a success breaks the run"
        );
        assert_eq!(e.record(502, &o, now, || 0, 4), None);
        assert_eq!(e.record(503, &o, now, || 0, 4), Some(now + 1_000));
        let mut lengths = Vec::new();
        for _ in 0..5 {
            // Back, and failing again within 10×D: the length doubles.
            now = e.until_ms.load(Ordering::Relaxed) + 100;
            e.record(500, &o, now, || 0, 4);
            let until = e.record(500, &o, now, || 0, 4).unwrap();
            lengths.push(until - now);
        }
        assert_eq!(lengths, [2_000, 4_000, 8_000, 10_000, 10_000]);
        now = e.until_ms.load(Ordering::Relaxed) + 10_001;
        e.record(500, &o, now, || 0, 4);
        assert_eq!(
            e.record(500, &o, now, || 0, 4),
            Some(now + 1_000),
            "clear for 10×D: back to D"
        );
        let f = Ejection::default();
        f.record(500, &o, 5, || 2, 4);
        assert_eq!(f.record(500, &o, 5, || 2, 4), None, "half of 4 already out");
    }
}
