//! Balancing policies: which candidate peer takes the next request.
//!
//! A policy sees the pool's peers through [`Candidates`]: which are candidates for this
//! attempt (eligible and not yet tried), each one's load (requests in flight) and
//! effective weight, and the request's hash key when the policy asks for one — what
//! weighted, least-connections, two-choices, hash and slow-start policies need. No
//! allocation per request and no lock; a policy's own state is atomics.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::{Peer, Tried};
use crate::config::Policy;

/// The peers as one attempt sees them.
pub struct Candidates<'a> {
    peers: &'a [Peer],
    tried: &'a Tried,
    now: u64,
    /// `all_down try`: every untried peer is a candidate, eligible or not.
    ignore_health: bool,
    key: Option<u64>,
}

impl<'a> Candidates<'a> {
    pub fn new(peers: &'a [Peer], tried: &'a Tried, now: u64) -> Candidates<'a> {
        Candidates {
            peers,
            tried,
            now,
            ignore_health: false,
            key: None,
        }
    }

    /// The same peers, with every untried one a candidate whatever its health.
    pub fn ignoring_health(&self) -> Candidates<'a> {
        Candidates {
            ignore_health: true,
            ..*self
        }
    }

    pub fn with_key(self, key: Option<u64>) -> Candidates<'a> {
        Candidates { key, ..self }
    }

    pub fn len(&self) -> usize {
        self.peers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }

    pub fn is_candidate(&self, i: usize) -> bool {
        !self.tried.has(i) && (self.ignore_health || self.peers[i].is_eligible(self.now))
    }

    /// Requests in flight on peer `i`.
    pub fn load(&self, i: usize) -> u32 {
        self.peers[i].in_flight.load(Ordering::Relaxed)
    }

    /// Peer `i`'s effective weight (1 until weights and slow start exist).
    pub fn weight(&self, _i: usize) -> u32 {
        1
    }

    /// The request's hash key, for policies that ask for one.
    pub fn key(&self) -> Option<u64> {
        self.key
    }
}

impl Clone for Candidates<'_> {
    fn clone(&self) -> Self {
        *self
    }
}

impl Copy for Candidates<'_> {}

pub trait Balancer: Send + Sync {
    /// Picks one candidate, or `None` if there is none.
    fn pick(&self, c: &Candidates<'_>) -> Option<usize>;
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
    fn pick(&self, c: &Candidates<'_>) -> Option<usize> {
        (0..c.len()).find(|&i| c.is_candidate(i))
    }
}

/// Each candidate in turn; a peer out of rotation is skipped without its turn going
/// to its neighbour twice (the turn is taken over the candidates, not all peers).
#[derive(Default)]
pub struct RoundRobin {
    next: AtomicUsize,
}

impl Balancer for RoundRobin {
    fn pick(&self, c: &Candidates<'_>) -> Option<usize> {
        let count = (0..c.len()).filter(|&i| c.is_candidate(i)).count();
        if count == 0 {
            return None;
        }
        let k = self.next.fetch_add(1, Ordering::Relaxed) % count;
        (0..c.len()).filter(|&i| c.is_candidate(i)).nth(k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{BackendAddr, Target};

    fn peers(n: usize) -> Vec<Peer> {
        (0..n)
            .map(|i| {
                Peer::new(
                    i,
                    BackendAddr {
                        text: format!("127.0.0.1:{}", 1000 + i),
                        target: Target::Tcp {
                            host: "127.0.0.1".into(),
                            port: 1000 + i as u16,
                        },
                    },
                )
            })
            .collect()
    }

    #[test]
    fn round_robin_cycles_over_candidates() {
        let ps = peers(3);
        let none = Tried::default();
        let c = Candidates::new(&ps, &none, 1);
        let rr = RoundRobin::default();
        let picks: Vec<_> = (0..6).map(|_| rr.pick(&c).unwrap()).collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
        let mut one = Tried::default();
        one.add(1);
        let c = Candidates::new(&ps, &one, 1);
        let picks: Vec<_> = (0..4).map(|_| rr.pick(&c).unwrap()).collect();
        assert!(picks.iter().all(|&p| p != 1));
        assert_eq!(
            picks.iter().filter(|&&p| p == 0).count(),
            2,
            "even split over the candidates: {picks:?}"
        );
        let mut all = Tried::default();
        (0..3).for_each(|i| all.add(i));
        assert_eq!(rr.pick(&Candidates::new(&ps, &all, 1)), None);
    }

    #[test]
    fn first_prefers_address_order() {
        let ps = peers(3);
        let mut t = Tried::default();
        t.add(0);
        assert_eq!(First.pick(&Candidates::new(&ps, &t, 1)), Some(1));
    }
}
