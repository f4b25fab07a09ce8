//! The retry budget (`retry_budget PERCENT [MIN_PER_S]`, DESIGN.md §8.6): retries of
//! every kind in a pool stay under PERCENT of its requests over the last 10 s, with
//! MIN_PER_S a second always allowed, so retries cannot multiply the load on a
//! struggling backend. Ten one-second buckets of atomics; no lock.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::clock::now_ms;
use crate::config::RetryBudget;

/// The window, in one-second buckets.
const WINDOW_S: u64 = 10;

#[derive(Default)]
struct Bucket {
    /// The second this bucket counts (`now_ms / 1000`).
    second: AtomicU64,
    requests: AtomicU32,
    retries: AtomicU32,
}

#[derive(Default)]
pub(crate) struct Budget {
    buckets: [Bucket; WINDOW_S as usize],
}

impl Budget {
    /// The bucket for `second`, emptied first if it last counted an older one.
    fn bucket(&self, second: u64) -> &Bucket {
        let b = &self.buckets[(second % WINDOW_S) as usize];
        let seen = b.second.load(Ordering::Relaxed);
        if seen != second
            && b.second
                .compare_exchange(seen, second, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            b.requests.store(0, Ordering::Relaxed);
            b.retries.store(0, Ordering::Relaxed);
        }
        b
    }

    /// Counts a request (its first attempt) at `now` (`now_ms`).
    pub(crate) fn record_request(&self, now: u64) {
        self.bucket(now / 1000)
            .requests
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Takes one retry from the budget if it allows one now.
    pub(crate) fn try_retry(&self, b: RetryBudget) -> bool {
        let second = now_ms() / 1000;
        let (mut requests, mut retries) = (0u64, 0u64);
        for bucket in &self.buckets {
            let s = bucket.second.load(Ordering::Relaxed);
            if s + WINDOW_S > second && s <= second {
                requests += u64::from(bucket.requests.load(Ordering::Relaxed));
                retries += u64::from(bucket.retries.load(Ordering::Relaxed));
            }
        }
        let allowed =
            (requests * u64::from(b.percent) / 100).max(u64::from(b.min_per_s) * WINDOW_S);
        if retries >= allowed {
            return false;
        }
        self.bucket(second).retries.fetch_add(1, Ordering::Relaxed);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_stay_within_the_share_or_the_floor() {
        let b = Budget::default();
        let budget = RetryBudget {
            percent: 20,
            min_per_s: 0,
        };
        for _ in 0..100 {
            b.record_request(now_ms());
        }
        let granted = (0..100).filter(|_| b.try_retry(budget)).count();
        assert_eq!(granted, 20, "20% of 100 requests");
        let floor = Budget::default();
        let granted = (0..100)
            .filter(|_| {
                floor.try_retry(RetryBudget {
                    percent: 20,
                    min_per_s: 3,
                })
            })
            .count();
        assert_eq!(granted, 30, "3 a second over 10 s with no requests counted");
    }
}
