//! One `proxy` line in one generation ([`Pool`]): picking a peer by policy and
//! failover role, recording what attempts found, and what a request holds on the pool
//! while it runs ([`Lease`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::balancer::{self, Balancer, Candidates};
use super::failover::Transition;
use super::peer::{FailureKind, Peer, Role};
use super::state::{PoolId, PoolState};
use super::{dial, limit};
use crate::config::{AllDown, ProxyConfig};

/// One `proxy` line in one generation: identity, carried state, and this generation's
/// settings.
pub(crate) struct Pool {
    pub id: PoolId,
    pub state: Arc<PoolState>,
    /// This generation's peers: a request's peer index points here.
    peers: Arc<Vec<Arc<Peer>>>,
    pub balancer: Box<dyn Balancer>,
    /// The pool's `limit`, shared with the generations before (see [`limit`]).
    pub limit: Option<Arc<limit::Limit>>,
    pub cfg: ProxyConfig,
    /// This generation's resolver and, for a strict pool, its destination policy.
    pub dest: dial::Dest,
    /// Where a discovered pool's peers come from.
    pub discovery: Option<Arc<super::discover::Discovery>>,
}

impl Pool {
    /// Builds this generation's pool on `state`, its own or carried from the previous
    /// generation's pool of the same identity (`PoolState::carry`).
    pub(crate) fn build(
        id: PoolId,
        cfg: ProxyConfig,
        state: Arc<PoolState>,
        dest: dial::Dest,
        discovery: Option<Arc<super::discover::Discovery>>,
    ) -> Arc<Pool> {
        let peers = state.peers();
        Arc::new(Pool {
            balancer: balancer::for_policy(&cfg.lb, &peers, cfg.slow_start.is_some()),
            peers,
            limit: state.limit_for(cfg.limit.map(|l| l.max)),
            id,
            state,
            cfg,
            dest,
            discovery,
        })
    }

    pub(crate) fn name(&self) -> &str {
        &self.id.name
    }

    /// Whether the pool's requests may go out as the client's fields, written at once,
    /// with no map built (`http1::fields`): it adds no field of its own (`host keep`,
    /// no `header_up`), its peers speak HTTP/1.1 only (an `https://` peer may choose
    /// HTTP/2, which takes a map), and `lb hash` reads no field or cookie.
    pub(crate) fn writes_lines(&self) -> bool {
        let cfg = &self.cfg;
        cfg.header_up.is_empty()
            && matches!(cfg.host, crate::config::HostMode::Keep)
            && cfg.scheme() == crate::config::BackendScheme::Http
            && !matches!(
                cfg.lb,
                crate::config::Policy::Hash(
                    crate::config::HashKey::Header(_) | crate::config::HashKey::Cookie(_)
                )
            )
    }

    pub(crate) fn peers(&self) -> &[Arc<Peer>] {
        &self.peers
    }

    /// The next peer to try, never one in `tried`. When no peer is eligible at all,
    /// `all_down` decides: `fail` refuses the request (if nothing was tried yet),
    /// `try` picks among all untried peers anyway.
    pub(crate) fn pick(&self, tried: &Tried, key: Option<u64>, note: &mut Note) -> Pick {
        let now = crate::clock::now_ms();
        if tried.count == 0 {
            // A request's first pick: it counts toward the retry budget's share.
            self.state.budget.record_request(now);
        }
        let peers = self.peers();
        let mut c = Candidates::new(peers, tried, now)
            .with_key(key)
            .with_slow_start(self.cfg.slow_start);
        if !self.cfg.backups.is_empty() {
            c = c.in_role(Some(self.role_for(now, note)));
            if note.trial {
                // A trial that finds no primary to try goes to the backups.
                if let Some(i) = self.balancer.pick(&c.in_role(Some(Role::Primary))) {
                    return Pick::Peer(i);
                }
                note.trial = false;
            }
        }
        if let Some(i) = self.balancer.pick(&c) {
            return Pick::Peer(i);
        }
        if (0..peers.len()).any(|i| c.in_role_at(i) && peers[i].is_eligible(now)) {
            // Eligible peers exist, and every one was tried already.
            return Pick::Exhausted;
        }
        match self.cfg.all_down {
            AllDown::Fail if tried.count > 0 => Pick::Exhausted,
            AllDown::Fail => Pick::AllDown,
            // A health verdict can be wrong; a request never sent is certainly lost.
            AllDown::Try => match self.balancer.pick(&c.ignoring_health()) {
                Some(i) => Pick::Peer(i),
                // A discovered pool before its first answer has no peer at all.
                None if peers.is_empty() => Pick::AllDown,
                None => Pick::Exhausted,
            },
        }
    }

    /// Records a failure that is the peer's fault; logs when it leaves rotation.
    pub(crate) fn peer_failed(&self, i: usize, kind: FailureKind, reason: &dyn std::fmt::Display) {
        let peer = &self.peers()[i];
        peer.failures.fetch_add(1, Ordering::Relaxed);
        peer.failures_by_kind[kind as usize].fetch_add(1, Ordering::Relaxed);
        if peer
            .passive
            .record_failure(self.cfg.breaker, self.cfg.fail_duration)
        {
            peer.returns_at(peer.passive.out_until());
            tracing::warn!(
                pool = self.name(),
                peer = %peer.addr.text,
                reason = kind.as_str(),
                "sluice: {}: {} failed ({reason}), out of rotation for {}",
                self.name(),
                peer.addr.text,
                crate::config::units::format_duration(self.cfg.fail_duration)
            );
        } else {
            tracing::info!(
                pool = self.name(),
                peer = %peer.addr.text,
                reason = kind.as_str(),
                "sluice: {}: {} failed ({reason})",
                self.name(),
                peer.addr.text
            );
        }
    }
}

impl Pool {
    /// The role requests go to now, switching first when every peer of the current
    /// role is ineligible and one of the other is not; notes a trial.
    fn role_for(&self, now: u64, note: &mut Note) -> Role {
        let st = &self.state.failover;
        let peers = self.peers();
        let eligible = |role: Role| peers.iter().any(|p| p.role == role && p.is_eligible(now));
        let active = st.role();
        let switched = (!eligible(active) && eligible(active.other()))
            .then(|| match active {
                Role::Backup => st.backups_down(now),
                Role::Primary => st.primaries_down(now),
            })
            .flatten();
        if let Some(t) = switched {
            let why = if t.to_backup() {
                "every primary is ineligible"
            } else {
                "every backup is ineligible"
            };
            t.log(self.name(), why);
            note.transition = Some(t);
        }
        let role = st.role();
        // Only a request's first attempt may be a trial; a trial that could not
        // connect is retried on the backups.
        note.trial = role == Role::Backup
            && note.attempts == 0
            && st.is_trial(&self.cfg.failover, now, self.cfg.health.is_some());
        note.attempts += 1;
        role
    }

    /// After an attempt on peer `i` that never reached it: whether the pool now sends
    /// requests to the other role (the failure made it switch, or left every peer of
    /// `i`'s role ineligible, which switches it now). Such a request gets one more
    /// attempt on the new role beyond `retries` (DESIGN §14).
    pub(crate) fn switched_away_from(&self, i: usize, note: &mut Note) -> bool {
        if self.cfg.backups.is_empty() {
            return false;
        }
        let mut probe = Note {
            attempts: 1,
            ..Note::default()
        };
        let role = self.role_for(crate::clock::now_ms(), &mut probe);
        if probe.transition.is_some() {
            note.transition = probe.transition;
        }
        role != self.peers()[i].role
    }

    /// Counts an attempt's outcome as failover evidence (a pool with backups only).
    pub(crate) fn failover_result(&self, i: usize, ok: bool, note: &mut Note) {
        if self.cfg.backups.is_empty() {
            return;
        }
        let (st, f, now) = (
            &self.state.failover,
            &self.cfg.failover,
            crate::clock::now_ms(),
        );
        let peers = self.peers();
        let t = if peers[i].role == Role::Backup {
            let primary_eligible = peers
                .iter()
                .any(|p| p.role == Role::Primary && p.is_eligible(now));
            st.backup_result(ok, f, now, primary_eligible)
        } else {
            st.primary_result(ok, f, now)
        };
        if let Some(t) = t {
            let why = match t {
                Transition::PrimaryFailureThreshold => {
                    format!("{} failures of its primaries in a row", f.failure_threshold)
                }
                Transition::BackupFailure => {
                    format!("{} failures of its backups in a row", f.failure_threshold)
                }
                Transition::PrimaryRecoveryThreshold => format!(
                    "{} successes of its primaries in a row",
                    f.recovery_threshold
                ),
            };
            t.log(self.name(), &why);
            note.transition = Some(t);
        }
    }

    /// Counts a backend's answer for outlier ejection (when configured).
    pub(crate) fn record_answer(&self, i: usize, status: u16) {
        let Some(o) = &self.cfg.outlier else { return };
        let peers = self.peers();
        let now = crate::clock::now_ms();
        if let Some(until) = peers[i].outlier.record(
            status,
            o,
            now,
            || peers.iter().filter(|p| p.outlier.is_ejected(now)).count(),
            peers.len(),
        ) {
            peers[i].returns_at(until);
            tracing::warn!(
                pool = self.name(),
                peer = %peers[i].addr.text,
                reason = "outlier",
                "sluice: {}: {} ejected for {} after {} 5xx answers in a row",
                self.name(),
                peers[i].addr.text,
                crate::config::units::format_duration(Duration::from_millis(until - now)),
                o.consecutive_5xx
            );
        }
    }
}

/// What one attempt holds on its pool until its response has been passed on: it
/// counts as the peer's selection and in-flight request.
pub(crate) struct Lease {
    pub pool: Arc<Pool>,
    pub peer: usize,
    pub permit: Option<limit::Slot>,
}

impl Lease {
    pub(crate) fn new(pool: Arc<Pool>, peer: usize, permit: Option<limit::Slot>) -> Lease {
        let p = &pool.peers()[peer];
        p.selections.fetch_add(1, Ordering::Relaxed);
        p.in_flight.fetch_add(1, Ordering::Relaxed);
        Lease { pool, peer, permit }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.pool.peers()[self.peer]
            .in_flight
            .fetch_sub(1, Ordering::Relaxed);
    }
}

/// Which pool and peer served a response — or, for sluice's own 502/504, the last peer
/// dialed — after how many attempts, with the failover role and transition (what
/// `X-Sluice-Origin*` say): noted for the access log (only when it is on).
#[derive(Clone)]
pub(crate) struct Served {
    pub pool: Arc<Pool>,
    pub peer: usize,
    pub attempts: u32,
    pub role: &'static str,
    pub transition: &'static str,
    /// From the first dial to the response head, or to the last failure.
    pub upstream: Option<std::time::Duration>,
}

impl Served {
    pub(crate) fn pool_name(&self) -> &str {
        self.pool.name()
    }

    pub(crate) fn peer_address(&self) -> &str {
        &self.pool.peers()[self.peer].addr.text
    }
}

/// What failover decided for one request: whether it is a trial of the primaries, and
/// the switch its outcome caused (named on its response).
#[derive(Debug, Default)]
pub(crate) struct Note {
    pub trial: bool,
    pub transition: Option<Transition>,
    attempts: u32,
}

pub(crate) enum Pick {
    Peer(usize),
    /// No peer is eligible and `all_down fail` is set.
    AllDown,
    /// Every candidate was tried.
    Exhausted,
}

/// Which peers a request already tried.
#[derive(Default)]
pub(crate) struct Tried {
    /// Peers 0 to 63, in place: a pool that size never allocates for its request.
    first: u64,
    /// Peers from 64 on, 64 a word.
    rest: Vec<u64>,
    pub count: usize,
}

impl Tried {
    pub(crate) fn has(&self, i: usize) -> bool {
        let word = match i / 64 {
            0 => Some(&self.first),
            w => self.rest.get(w - 1),
        };
        word.is_some_and(|w| w & (1 << (i % 64)) != 0)
    }

    pub(crate) fn add(&mut self, i: usize) {
        let word = match i / 64 {
            0 => &mut self.first,
            w => {
                if self.rest.len() < w {
                    self.rest.resize(w, 0);
                }
                &mut self.rest[w - 1]
            }
        };
        *word |= 1 << (i % 64);
        self.count += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::Tried;

    proptest::proptest! {
        /// A peer is marked tried exactly when it was added, on either side of the
        /// first, in-place word.
        #[test]
        fn tried_holds_what_was_added(added in proptest::collection::vec(0usize..300, 0..20)) {
            let mut t = Tried::default();
            for &i in &added {
                t.add(i);
            }
            for i in 0..300 {
                proptest::prop_assert_eq!(t.has(i), added.contains(&i), "peer {}", i);
            }
            proptest::prop_assert_eq!(t.count, added.len());
        }
    }
}
