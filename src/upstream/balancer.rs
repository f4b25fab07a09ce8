//! Balancing policies: which eligible peer takes the next request.
//!
//! A policy sees only "how many peers" and "is peer i a candidate", so it needs no
//! allocation per request and no lock; its own state is atomics. New policies
//! (weighted, least-conn, p2c, hash) implement the same trait.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::config::Policy;

pub trait Balancer: Send + Sync {
    /// Picks one of the peers `0..n` for which `ok(i)` holds, or `None` if there is none.
    fn pick(&self, n: usize, ok: &dyn Fn(usize) -> bool) -> Option<usize>;
}

pub fn for_policy(p: Policy) -> Box<dyn Balancer> {
    match p {
        Policy::First => Box::new(First),
        Policy::RoundRobin => Box::new(RoundRobin::default()),
    }
}

/// The first candidate in address order: primary and standbys.
pub struct First;

impl Balancer for First {
    fn pick(&self, n: usize, ok: &dyn Fn(usize) -> bool) -> Option<usize> {
        (0..n).find(|&i| ok(i))
    }
}

/// Each candidate in turn; a peer out of rotation is skipped without its turn going
/// to its neighbour twice (the turn is taken over the candidates, not all peers).
#[derive(Default)]
pub struct RoundRobin {
    next: AtomicUsize,
}

impl Balancer for RoundRobin {
    fn pick(&self, n: usize, ok: &dyn Fn(usize) -> bool) -> Option<usize> {
        let count = (0..n).filter(|&i| ok(i)).count();
        if count == 0 {
            return None;
        }
        let k = self.next.fetch_add(1, Ordering::Relaxed) % count;
        (0..n).filter(|&i| ok(i)).nth(k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_robin_cycles_over_candidates() {
        let rr = RoundRobin::default();
        let all = |_: usize| true;
        let picks: Vec<_> = (0..6).map(|_| rr.pick(3, &all).unwrap()).collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
        let not_one = |i: usize| i != 1;
        let picks: Vec<_> = (0..4).map(|_| rr.pick(3, &not_one).unwrap()).collect();
        assert!(picks.iter().all(|&p| p != 1));
        assert_eq!(
            picks.iter().filter(|&&p| p == 0).count(),
            2,
            "even split over the candidates: {picks:?}"
        );
        assert_eq!(rr.pick(3, &|_| false), None);
    }

    #[test]
    fn first_prefers_address_order() {
        assert_eq!(First.pick(3, &|i| i > 0), Some(1));
    }
}
