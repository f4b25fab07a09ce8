//! Balancing policies: which candidate peer takes the next request.
//!
//! A policy sees the pool's peers through [`Candidates`]: which are candidates for this
//! attempt (eligible and not yet tried), each one's load (requests in flight) and
//! effective weight, and the request's hash key when the policy asks for one — what
//! weighted, least-connections, two-choices, hash and slow-start policies need. No
//! allocation per request and no lock; a policy's own state is atomics.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::{Peer, Role, Tried};
use crate::config::Policy;

/// The peers as one attempt sees them.
pub(crate) struct Candidates<'a> {
    peers: &'a [Arc<Peer>],
    tried: &'a Tried,
    now: u64,
    /// `all_down try`: every untried peer is a candidate, eligible or not.
    ignore_health: bool,
    key: Option<u64>,
    /// `slow_start` in milliseconds; 0 when off.
    slow_start_ms: u64,
    /// Failover: only the peers of this role.
    role: Option<Role>,
}

impl<'a> Candidates<'a> {
    pub(crate) fn new(peers: &'a [Arc<Peer>], tried: &'a Tried, now: u64) -> Candidates<'a> {
        Candidates {
            peers,
            tried,
            now,
            ignore_health: false,
            key: None,
            slow_start_ms: 0,
            role: None,
        }
    }

    /// Only the peers of `role` (every peer when `None`).
    pub(crate) fn in_role(self, role: Option<Role>) -> Candidates<'a> {
        Candidates { role, ..self }
    }

    /// Whether peer `i` belongs to the role these candidates are drawn from.
    pub(crate) fn in_role_at(&self, i: usize) -> bool {
        self.role.is_none_or(|r| self.peers[i].role == r)
    }

    pub(crate) fn with_slow_start(self, d: Option<std::time::Duration>) -> Candidates<'a> {
        Candidates {
            slow_start_ms: d.map_or(0, |d| d.as_millis() as u64),
            ..self
        }
    }

    /// The same peers, with every untried one a candidate whatever its health.
    pub(crate) fn ignoring_health(&self) -> Candidates<'a> {
        Candidates {
            ignore_health: true,
            ..*self
        }
    }

    pub(crate) fn with_key(self, key: Option<u64>) -> Candidates<'a> {
        Candidates { key, ..self }
    }

    pub(crate) fn len(&self) -> usize {
        self.peers.len()
    }

    pub(crate) fn is_candidate(&self, i: usize) -> bool {
        !self.tried.has(i)
            && self.in_role_at(i)
            && (self.ignore_health || self.peers[i].is_eligible(self.now))
    }

    /// Requests in flight on peer `i`.
    pub(crate) fn load(&self, i: usize) -> u32 {
        self.peers[i].in_flight.load(Ordering::Relaxed)
    }

    /// Peer `i`'s effective weight, in hundredths: its weight, ramped from 10 % to
    /// 100 % over `slow_start` after it came (back) into rotation.
    pub(crate) fn weight(&self, i: usize) -> u32 {
        self.peers[i].weight.load(Ordering::Relaxed) * self.ramp(i)
    }

    /// How far peer `i` is through its slow start, in percent (100 when off).
    pub(crate) fn ramp(&self, i: usize) -> u32 {
        let returned = self.peers[i].returned_ms.load(Ordering::Relaxed);
        if self.slow_start_ms == 0 || returned == 0 {
            return 100;
        }
        let since = self.now.saturating_sub(returned);
        (since * 100 / self.slow_start_ms).clamp(10, 100) as u32
    }

    /// The request's hash key, for policies that ask for one.
    pub(crate) fn key(&self) -> Option<u64> {
        self.key
    }
}

impl Clone for Candidates<'_> {
    fn clone(&self) -> Self {
        *self
    }
}

impl Copy for Candidates<'_> {}

pub(crate) trait Balancer: Send + Sync {
    /// Picks one candidate, or `None` if there is none.
    fn pick(&self, c: &Candidates<'_>) -> Option<usize>;
}

/// The balancer for `policy` over `peers`, the very set every pick sees: primaries and
/// backups alike, so a policy works on whichever role failover made active. The hash
/// ring is built from the addresses as written, so a peer keeps its keys across
/// reloads. With `slow_start`, round robin turns into smooth weighted round robin over
/// the ramping weights (with equal weights the two are the same rotation).
pub(crate) fn for_policy(
    policy: &Policy,
    peers: &[Arc<Peer>],
    slow_start: bool,
) -> Box<dyn Balancer> {
    let n = peers.len();
    match policy {
        Policy::First => Box::new(First),
        Policy::RoundRobin if slow_start => Box::new(SmoothWeighted::new(n, false)),
        Policy::RoundRobin => Box::new(RoundRobin::default()),
        Policy::WeightedRoundRobin => Box::new(SmoothWeighted::new(n, true)),
        Policy::LeastConn => Box::new(LeastConn::new(n, false)),
        Policy::WeightedLeastConn => Box::new(LeastConn::new(n, true)),
        Policy::P2c => Box::new(P2c),
        Policy::Hash(_) => Box::new(Ring::new(peers.iter().map(|p| p.addr.text.as_str()))),
    }
}

/// The first candidate in address order: primary and standbys.
pub(crate) struct First;

impl Balancer for First {
    fn pick(&self, c: &Candidates<'_>) -> Option<usize> {
        (0..c.len()).find(|&i| c.is_candidate(i))
    }
}

/// Each candidate in turn; a peer out of rotation is skipped without its turn going
/// to its neighbour twice (the turn is taken over the candidates, not all peers).
#[derive(Default)]
pub(crate) struct RoundRobin {
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

/// Smooth weighted round robin (nginx's): each pick adds every candidate's weight to
/// its running score, takes the highest, and takes the total off the winner, so
/// weights 5 1 1 give a a b a c a a — no bursts. The scores are the pool's, behind a
/// lock held for one pass over the peers (never across an await).
pub(crate) struct SmoothWeighted {
    current: Mutex<Vec<i64>>,
    /// Configured weights count (else every peer weighs the same, but for slow start).
    weighted: bool,
}

impl SmoothWeighted {
    pub(crate) fn new(n: usize, weighted: bool) -> SmoothWeighted {
        SmoothWeighted {
            current: Mutex::new(vec![0; n]),
            weighted,
        }
    }

    /// Picks among the candidates for which `among(i)` also holds.
    fn pick_among(&self, c: &Candidates<'_>, among: impl Fn(usize) -> bool) -> Option<usize> {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if current.len() < c.len() {
            // Built from the same peers the candidates come from, so this never runs;
            // a missing score is a fresh one, never an index out of bounds.
            current.resize(c.len(), 0);
        }
        let mut total = 0i64;
        let mut best: Option<usize> = None;
        for i in (0..c.len()).filter(|&i| c.is_candidate(i) && among(i)) {
            let w = i64::from(if self.weighted {
                c.weight(i)
            } else {
                c.ramp(i)
            });
            current[i] += w;
            total += w;
            if best.is_none_or(|b| current[i] > current[b]) {
                best = Some(i);
            }
        }
        let b = best?;
        current[b] -= total;
        Some(b)
    }
}

impl Balancer for SmoothWeighted {
    fn pick(&self, c: &Candidates<'_>) -> Option<usize> {
        self.pick_among(c, |_| true)
    }
}

/// Fewest requests in flight (divided by weight when weighted); ties broken by smooth
/// weighted round robin among the tied, so equal loads still rotate.
pub(crate) struct LeastConn {
    ties: SmoothWeighted,
    weighted: bool,
}

impl LeastConn {
    pub(crate) fn new(n: usize, weighted: bool) -> LeastConn {
        LeastConn {
            ties: SmoothWeighted::new(n, weighted),
            weighted,
        }
    }
}

impl Balancer for LeastConn {
    fn pick(&self, c: &Candidates<'_>) -> Option<usize> {
        let w = |i: usize| {
            u64::from(if self.weighted {
                c.weight(i)
            } else {
                c.ramp(i)
            })
        };
        // Loads change under the pick (requests start and end on other threads): each
        // is read once, and the best one's load is kept, so the best always ties with
        // itself. a/wa < b/wb  ⇔  a·wb < b·wa.
        let mut best: Option<(usize, u64)> = None;
        for i in (0..c.len()).filter(|&i| c.is_candidate(i)) {
            let load = u64::from(c.load(i));
            if best.is_none_or(|(b, lb)| load * w(b) < lb * w(i)) {
                best = Some((i, load));
            }
        }
        let (b, lb) = best?;
        let ties = self
            .ties
            .pick_among(c, |i| i == b || u64::from(c.load(i)) * w(b) == lb * w(i));
        ties.or(Some(b))
    }
}

/// Power of two choices: two distinct random candidates, the one with fewer requests
/// in flight wins.
pub(crate) struct P2c;

impl Balancer for P2c {
    fn pick(&self, c: &Candidates<'_>) -> Option<usize> {
        let count = (0..c.len()).filter(|&i| c.is_candidate(i)).count();
        let nth = |k: usize| (0..c.len()).filter(|&i| c.is_candidate(i)).nth(k);
        match count {
            0 => None,
            1 => nth(0),
            _ => {
                let r = random();
                let x = (r % count as u64) as usize;
                let mut y = ((r >> 32) % (count as u64 - 1)) as usize;
                if y >= x {
                    y += 1;
                }
                let (a, b) = (nth(x)?, nth(y)?);
                Some(if c.load(b) < c.load(a) { b } else { a })
            }
        }
    }
}

/// Consistent hashing: each peer owns `VNODES` points on a ring, placed by hashing its
/// address as written; a key goes to the first candidate at or after its own point.
/// Removing one of N peers moves only the keys it owned (about 1/N); adding it back
/// returns them. A request without a key is spread round robin.
pub(crate) struct Ring {
    points: Vec<(u64, usize)>,
    fallback: RoundRobin,
}

/// Virtual nodes per peer.
const VNODES: usize = 160;

impl Ring {
    pub(crate) fn new<'a>(addresses: impl Iterator<Item = &'a str>) -> Ring {
        let mut points: Vec<(u64, usize)> = addresses
            .enumerate()
            .flat_map(|(i, a)| {
                (0..VNODES).map(move |v| (hash_bytes(format!("{a}#{v}").as_bytes()), i))
            })
            .collect();
        points.sort_unstable();
        Ring {
            points,
            fallback: RoundRobin::default(),
        }
    }
}

impl Balancer for Ring {
    fn pick(&self, c: &Candidates<'_>) -> Option<usize> {
        let Some(key) = c.key() else {
            return self.fallback.pick(c);
        };
        let start = self.points.partition_point(|(p, _)| *p < key);
        (0..self.points.len())
            .map(|k| self.points[(start + k) % self.points.len()].1)
            .find(|&i| c.is_candidate(i))
    }
}

/// A 64-bit hash with good dispersion for keys and ring points (FNV-1a, then the
/// splitmix64 finaliser). Stable across runs and builds, unlike `std`'s.
pub(crate) fn hash_bytes(b: &[u8]) -> u64 {
    let mut h = b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3)
    });
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// A cheap per-thread random number (xorshift64*), for `p2c` and trace ids.
pub(crate) fn random() -> u64 {
    thread_local! {
        static STATE: Cell<u64> = Cell::new(
            std::hash::BuildHasher::hash_one(&std::hash::RandomState::new(), 0u64) | 1,
        );
    }
    STATE.with(|s| {
        let mut x = s.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        s.set(x);
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{BackendAddr, Target};

    fn peers(n: usize) -> Vec<Arc<Peer>> {
        weighted(&vec![1; n])
    }

    fn weighted(w: &[u32]) -> Vec<Arc<Peer>> {
        unshared(w).into_iter().map(Arc::new).collect()
    }

    fn unshared(w: &[u32]) -> Vec<Peer> {
        w.iter()
            .enumerate()
            .map(|(i, &w)| {
                Peer::new(
                    i,
                    BackendAddr {
                        text: format!("127.0.0.1:{}", 1000 + i),
                        target: Target::Tcp {
                            host: "127.0.0.1".into(),
                            port: 1000 + i as u16,
                        },
                        scheme: crate::config::BackendScheme::Http,
                        span: Default::default(),
                    },
                    w,
                )
            })
            .collect()
    }

    fn seq(b: &dyn Balancer, ps: &[Arc<Peer>], n: usize) -> String {
        let none = Tried::default();
        let c = Candidates::new(ps, &none, 1);
        (0..n)
            .map(|_| char::from(b'a' + b.pick(&c).unwrap() as u8))
            .collect()
    }

    #[test]
    fn smooth_weighted_round_robin_has_no_bursts() {
        let ps = weighted(&[5, 1, 1]);
        let b = SmoothWeighted::new(3, true);
        assert_eq!(seq(&b, &ps, 14), "aabacaaaabacaa");
        let ps = weighted(&[1, 1, 1]);
        assert_eq!(seq(&SmoothWeighted::new(3, true), &ps, 6), "abcabc");
    }

    #[test]
    fn slow_start_ramps_a_returning_peer_from_a_tenth() {
        let ps = peers(2);
        let now = 100_000;
        ps[1].returns_at(now);
        let none = Tried::default();
        let b = SmoothWeighted::new(2, false);
        let ramp = Some(std::time::Duration::from_secs(10));
        let share = |at: u64| {
            let c = Candidates::new(&ps, &none, at).with_slow_start(ramp);
            (0..1100).filter(|_| b.pick(&c) == Some(1)).count()
        };
        assert_eq!(
            share(now),
            100,
            "10 % of a's weight right after it returned"
        );
        assert_eq!(
            share(now + 5_000),
            367,
            "half way: half the weight, a third of the picks"
        );
        assert_eq!(share(now + 10_000), 550, "done: an even split");
    }

    /// Found by the soak: loads change while a pick reads them (other requests start
    /// and end on other threads); a peer read twice could fail to tie with itself, and
    /// the pick came back empty with every peer eligible (a 502 before any attempt).
    #[test]
    fn least_conn_always_picks_while_loads_change_under_it() {
        let ps = std::sync::Arc::new(peers(3));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let churn = {
            let (ps, stop) = (ps.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for p in ps.iter() {
                        p.in_flight.fetch_add(1, Ordering::Relaxed);
                        p.in_flight.fetch_sub(1, Ordering::Relaxed);
                    }
                }
            })
        };
        let none = Tried::default();
        let b = LeastConn::new(3, false);
        let empty = (0..2_000_000)
            .filter(|_| b.pick(&Candidates::new(&ps, &none, 1)).is_none())
            .count();
        stop.store(true, Ordering::Relaxed);
        churn.join().unwrap();
        assert_eq!(
            empty, 0,
            "picks that found no peer among three eligible ones"
        );
    }

    #[test]
    fn least_conn_prefers_the_least_loaded_and_rotates_ties() {
        let ps = peers(3);
        ps[0].in_flight.store(2, Ordering::Relaxed);
        let b = LeastConn::new(3, false);
        assert_eq!(
            seq(&b, &ps, 4),
            "bcbc",
            "a is busier; b and c tie and rotate"
        );
        ps[1].in_flight.store(1, Ordering::Relaxed);
        assert_eq!(seq(&b, &ps, 2), "cc");
        // Weighted: 4 in flight on a weight-4 peer is as light as 1 on weight 1.
        let ps = weighted(&[4, 1]);
        ps[0].in_flight.store(3, Ordering::Relaxed);
        ps[1].in_flight.store(1, Ordering::Relaxed);
        assert_eq!(seq(&LeastConn::new(2, true), &ps, 1), "a", "3/4 < 1/1");
        assert_eq!(
            seq(&LeastConn::new(2, false), &ps, 1),
            "b",
            "unweighted: 1 < 3"
        );
    }

    #[test]
    fn p2c_takes_two_distinct_and_the_lighter() {
        let ps = peers(2);
        ps[0].in_flight.store(5, Ordering::Relaxed);
        // With two candidates both are always drawn: the lighter always wins.
        assert!(seq(&P2c, &ps, 50).chars().all(|c| c == 'b'));
        let ps = peers(4);
        ps[3].in_flight.store(100, Ordering::Relaxed);
        let s = seq(&P2c, &ps, 2000);
        assert!(
            !s.contains('d'),
            "the busiest of four loses every draw it is in"
        );
        for c in ['a', 'b', 'c'] {
            let n = s.matches(c).count();
            assert!((500..840).contains(&n), "{c}: {n} of 2000");
        }
    }

    #[test]
    fn hashing_is_consistent() {
        let addrs: Vec<String> = (0..5).map(|i| format!("10.0.0.{i}:80")).collect();
        let ring = Ring::new(addrs.iter().map(String::as_str));
        let ps = peers(5);
        let none = Tried::default();
        let place = |gone: Option<usize>, key: u64| {
            let mut t = Tried::default();
            if let Some(g) = gone {
                t.add(g);
            }
            ring.pick(&Candidates::new(&ps, &t, 1).with_key(Some(key)))
                .unwrap()
        };
        let keys: Vec<u64> = (0..10_000u32)
            .map(|k| hash_bytes(&k.to_le_bytes()))
            .collect();
        let before: Vec<usize> = keys.iter().map(|&k| place(None, k)).collect();
        let after: Vec<usize> = keys.iter().map(|&k| place(Some(2), k)).collect();
        let moved = before.iter().zip(&after).filter(|(a, b)| a != b).count();
        let owned = before.iter().filter(|&&p| p == 2).count();
        assert_eq!(moved, owned, "only the removed peer's keys move");
        assert!(
            (1_200..2_800).contains(&owned),
            "about 1/5 of keys: {owned}"
        );
        for p in 0..5 {
            let n = before.iter().filter(|&&x| x == p).count();
            assert!((1_200..2_800).contains(&n), "peer {p} owns {n} of 10,000");
        }
        let c = Candidates::new(&ps, &none, 1);
        assert!(ring.pick(&c).is_some(), "no key: round robin");
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

    fn every_policy() -> Vec<Policy> {
        use crate::config::HashKey;
        let mut all = Policy::SIMPLE.to_vec();
        all.push(Policy::Hash(HashKey::ClientIp));
        all
    }

    proptest::proptest! {
        /// Any peer set, any health pattern, any role, any tried set, every policy with
        /// and without slow start: a pick is a candidate, and there is one whenever a
        /// candidate exists. (A balancer sized from the primaries panicked on backups.)
        #[test]
        fn a_pick_is_always_an_eligible_candidate(
            shape in proptest::collection::vec(
                (1u32..20, proptest::bool::ANY, proptest::bool::ANY, proptest::bool::ANY, 0u32..5),
                1..12,
            ),
            role in proptest::option::of(proptest::sample::select(vec![Role::Primary, Role::Backup])),
            key in proptest::option::of(proptest::num::u64::ANY),
            ramping in proptest::bool::ANY,
            ignore_health in proptest::bool::ANY,
        ) {
            let ws: Vec<u32> = shape.iter().map(|s| s.0).collect();
            let mut ps = unshared(&ws);
            // The breaker's clock: a peer marked down is out until 30 s from now.
            let now = crate::clock::now_ms();
            let mut tried = Tried::default();
            for (i, &(_, backup, down, was_tried, load)) in shape.iter().enumerate() {
                ps[i].role = if backup { Role::Backup } else { Role::Primary };
                ps[i].in_flight.store(load, Ordering::Relaxed);
                if down {
                    ps[i].passive.record_failure(1, std::time::Duration::from_secs(30));
                }
                if was_tried {
                    tried.add(i);
                }
                if ramping {
                    ps[i].returns_at(now.saturating_sub(500).max(1));
                }
            }
            let ps: Vec<Arc<Peer>> = ps.into_iter().map(Arc::new).collect();
            let slow = ramping.then(|| std::time::Duration::from_secs(10));
            for policy in every_policy() {
                for slow_start in [false, true] {
                    let b = for_policy(&policy, &ps, slow_start);
                    let mut c = Candidates::new(&ps, &tried, now)
                        .in_role(role)
                        .with_key(key)
                        .with_slow_start(slow);
                    if ignore_health {
                        c = c.ignoring_health();
                    }
                    let any = (0..ps.len()).any(|i| c.is_candidate(i));
                    for (i, s) in shape.iter().enumerate() {
                        proptest::prop_assert!(
                            !s.2 || !ps[i].is_eligible(now),
                            "a peer marked down is not eligible"
                        );
                    }
                    for _ in 0..3 {
                        match b.pick(&c) {
                            Some(i) => proptest::prop_assert!(
                                i < ps.len() && c.is_candidate(i),
                                "{policy:?}: picked {i}, not a candidate"
                            ),
                            None => proptest::prop_assert!(!any, "{policy:?}: none picked"),
                        }
                    }
                }
            }
        }
    }
}
