//! Peers and pools: the runtime state behind each `proxy` line. Health (passive now),
//! counters, idle connections and the in-flight limit live here, never in the config
//! model.
//!
//! A pool has three parts. Its identity ([`PoolId`]: name, addresses, policy — weights
//! and TLS identity join it when they exist) decides whether two generations' pools are
//! the same pool. Its carried state ([`PoolState`]: the peers' health, counters and
//! idle connections) is shared by every generation whose pool has that identity, so a
//! reload keeps it. Its settings (timeouts, limits, headers, retries) belong to one
//! generation. Background tasks of a pool's state stop when `runtime` retires it, the
//! moment the live generation no longer has it — not when the last request ends.

pub mod balancer;
pub mod budget;
pub mod conn;
pub mod connpool;
pub mod dial;
pub mod health;
pub mod outlier;
pub mod passive;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use http::HeaderValue;
use tokio::sync::{Notify, Semaphore};

use self::balancer::{Balancer, Candidates};
use crate::config::{AllDown, BackendAddr, Health, Policy, ProxyConfig, Target};

pub struct Peer {
    pub ordinal: usize,
    pub addr: BackendAddr,
    /// The configured weight (1 when none is).
    pub weight: u32,
    /// `Host` for `host upstream`: the address as written, `localhost` for a socket.
    pub host_header: Option<HeaderValue>,
    pub idle: connpool::Idle,
    pub passive: passive::Breaker,
    /// Active health; healthy when the pool has no `health`.
    pub active: health::Verdict,
    /// Outlier ejection: 5xx answers in a row, and the ejection they led to.
    pub outlier: outlier::Ejection,
    /// When the peer last came (back) into rotation, for `slow_start`.
    pub returned_ms: AtomicU64,
    pub in_flight: AtomicU32,
    pub selections: AtomicU64,
    pub failures: AtomicU64,
}

impl Peer {
    pub fn new(ordinal: usize, addr: BackendAddr, weight: u32) -> Peer {
        Peer {
            ordinal,
            weight,
            host_header: host_header(&addr.target),
            addr,
            idle: Default::default(),
            passive: Default::default(),
            active: Default::default(),
            outlier: Default::default(),
            // 0: in rotation from the start, at full weight.
            returned_ms: AtomicU64::new(0),
            in_flight: AtomicU32::new(0),
            selections: AtomicU64::new(0),
            failures: AtomicU64::new(0),
        }
    }

    /// Whether the peer may take requests now: the one rule every policy asks.
    pub fn is_eligible(&self, now: u64) -> bool {
        self.passive.is_available(now) && self.active.is_healthy() && !self.outlier.is_ejected(now)
    }

    /// The peer comes back into rotation at `at` (`now_ms`): slow start counts from then.
    pub fn returns_at(&self, at: u64) {
        self.returned_ms.store(at, Ordering::Relaxed);
    }
}

/// What makes two generations' pools the same pool.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PoolId {
    /// `SITE ROUTE`, or `SITE` for a site block's own proxy.
    pub name: String,
    /// The addresses as written, in order.
    pub addresses: Vec<String>,
    pub weights: Vec<u32>,
    pub policy: Policy,
}

impl PoolId {
    pub fn new(name: String, cfg: &ProxyConfig) -> PoolId {
        PoolId {
            name,
            addresses: cfg.backends.iter().map(|b| b.text.clone()).collect(),
            weights: cfg.weights.clone(),
            policy: cfg.lb.clone(),
        }
    }
}

/// A pool's state, carried across generations by identity.
pub struct PoolState {
    pub peers: Vec<Peer>,
    /// The idle timeout the newest generation asked for (the reaper reads it).
    idle_timeout_ms: AtomicU64,
    retired: AtomicBool,
    /// Wakes the state's tasks when it is retired; theirs to hold without holding it.
    retire: Arc<Notify>,
    /// The newest generation's `health`, read by the probe task at each tick.
    health: ArcSwapOption<Health>,
    /// The probe task runs.
    probing: AtomicBool,
    /// Retries of every kind against `retry_budget`.
    pub budget: budget::Budget,
    /// Retries by reason: [unreachable, reset, timeout, status].
    pub retries: [AtomicU64; 4],
}

impl PoolState {
    /// Fresh state for `id`; starts the idle-connection reaper (and the probe task when
    /// `cfg` has `health`). Must run inside the tokio runtime.
    pub fn new(id: &PoolId, cfg: &ProxyConfig, probe_slots: &Arc<Semaphore>) -> Arc<PoolState> {
        let state = Arc::new(PoolState {
            peers: cfg
                .backends
                .iter()
                .enumerate()
                .map(|(i, a)| Peer::new(i, a.clone(), cfg.weights.get(i).copied().unwrap_or(1)))
                .collect(),
            idle_timeout_ms: AtomicU64::new(0),
            retired: AtomicBool::new(false),
            retire: Arc::new(Notify::new()),
            health: ArcSwapOption::empty(),
            probing: AtomicBool::new(false),
            budget: Default::default(),
            retries: Default::default(),
        });
        debug_assert_eq!(state.peers.len(), id.addresses.len());
        if let Some(h) = &cfg.health {
            for p in &state.peers {
                p.active.set_initial(h.initial_healthy);
            }
        }
        state.set_idle_timeout(cfg.keepalive.idle_timeout);
        tokio::spawn(reap(Arc::downgrade(&state), state.retire.clone()));
        state.set_health(id, cfg, probe_slots);
        state
    }

    /// Takes this generation's `health`; starts probing if it was not already.
    fn set_health(self: &Arc<Self>, id: &PoolId, cfg: &ProxyConfig, slots: &Arc<Semaphore>) {
        self.health.store(cfg.health.clone().map(Arc::new));
        if cfg.health.is_some() && !self.probing.swap(true, Ordering::Relaxed) {
            tokio::spawn(health::run(
                Arc::downgrade(self),
                self.retire.clone(),
                slots.clone(),
                id.name.clone(),
            ));
        }
    }

    fn set_idle_timeout(&self, d: Duration) {
        self.idle_timeout_ms
            .store(d.as_millis() as u64, Ordering::Relaxed);
    }

    fn idle_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_timeout_ms.load(Ordering::Relaxed))
    }

    /// The live generation dropped this pool: its background tasks stop now, and its
    /// idle connections close.
    pub fn retire(&self) {
        self.retired.store(true, Ordering::Relaxed);
        self.retire.notify_waiters();
        for p in &self.peers {
            p.idle.reap(Duration::ZERO);
        }
    }

    pub fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Relaxed)
    }
}

/// One `proxy` line in one generation: identity, carried state, and this generation's
/// settings.
pub struct Pool {
    pub id: PoolId,
    pub state: Arc<PoolState>,
    pub balancer: Box<dyn Balancer>,
    pub limit: Option<Arc<Semaphore>>,
    pub cfg: ProxyConfig,
}

impl Pool {
    /// Builds this generation's pool, carrying `carried` state when the previous
    /// generation had a pool of the same identity.
    pub fn build(
        id: PoolId,
        cfg: ProxyConfig,
        carried: Option<Arc<PoolState>>,
        probe_slots: &Arc<Semaphore>,
    ) -> Arc<Pool> {
        let state = match carried {
            Some(s) => {
                s.set_idle_timeout(cfg.keepalive.idle_timeout);
                s.set_health(&id, &cfg, probe_slots);
                s
            }
            None => PoolState::new(&id, &cfg, probe_slots),
        };
        Arc::new(Pool {
            balancer: balancer::for_policy(&cfg.lb, &id.addresses, cfg.slow_start.is_some()),
            limit: cfg.limit.map(|l| Arc::new(Semaphore::new(l.max as usize))),
            id,
            state,
            cfg,
        })
    }

    pub fn name(&self) -> &str {
        &self.id.name
    }

    pub fn peers(&self) -> &[Peer] {
        &self.state.peers
    }

    /// The next peer to try, never one in `tried`. When no peer is eligible at all,
    /// `all_down` decides: `fail` refuses the request (if nothing was tried yet),
    /// `try` picks among all untried peers anyway.
    pub fn pick(&self, tried: &Tried, key: Option<u64>) -> Pick {
        let now = passive::now_ms();
        let peers = self.peers();
        let c = Candidates::new(peers, tried, now)
            .with_key(key)
            .with_slow_start(self.cfg.slow_start);
        if let Some(i) = self.balancer.pick(&c) {
            return Pick::Peer(i);
        }
        if peers.iter().any(|p| p.is_eligible(now)) {
            // Eligible peers exist, and every one was tried already.
            return Pick::Exhausted;
        }
        match self.cfg.all_down {
            AllDown::Fail if tried.count > 0 => Pick::Exhausted,
            AllDown::Fail => Pick::AllDown,
            // A health verdict can be wrong; a request never sent is certainly lost.
            AllDown::Try => match self.balancer.pick(&c.ignoring_health()) {
                Some(i) => Pick::Peer(i),
                None => Pick::Exhausted,
            },
        }
    }

    /// Records a failure that is the peer's fault; logs when it leaves rotation.
    pub fn peer_failed(&self, i: usize, reason: &dyn std::fmt::Display) {
        let peer = &self.peers()[i];
        peer.failures.fetch_add(1, Ordering::Relaxed);
        if peer
            .passive
            .record_failure(self.cfg.breaker, self.cfg.fail_duration)
        {
            peer.returns_at(peer.passive.out_until());
            tracing::warn!(
                "sluice: {}: {} failed ({reason}), out of rotation for {}",
                self.name(),
                peer.addr.text,
                crate::config::units::format_duration(self.cfg.fail_duration)
            );
        } else {
            tracing::info!(
                "sluice: {}: {} failed ({reason})",
                self.name(),
                peer.addr.text
            );
        }
    }
}

impl Pool {
    /// Counts a backend's answer for outlier ejection (when configured).
    pub fn record_answer(&self, i: usize, status: u16) {
        let Some(o) = &self.cfg.outlier else { return };
        let peers = self.peers();
        let now = passive::now_ms();
        if let Some(until) = peers[i].outlier.record(
            status,
            o,
            now,
            || peers.iter().filter(|p| p.outlier.is_ejected(now)).count(),
            peers.len(),
        ) {
            peers[i].returns_at(until);
            tracing::warn!(
                "sluice: {}: {} ejected for {} after {} 5xx answers in a row",
                self.name(),
                peers[i].addr.text,
                crate::config::units::format_duration(Duration::from_millis(until - now)),
                o.consecutive_5xx
            );
        }
    }
}

pub enum Pick {
    Peer(usize),
    /// No peer is eligible and `all_down fail` is set.
    AllDown,
    /// Every candidate was tried.
    Exhausted,
}

/// Which peers a request already tried.
#[derive(Default)]
pub struct Tried {
    bits: Vec<u64>,
    pub count: usize,
}

impl Tried {
    pub fn has(&self, i: usize) -> bool {
        self.bits
            .get(i / 64)
            .is_some_and(|w| w & (1 << (i % 64)) != 0)
    }

    pub fn add(&mut self, i: usize) {
        if self.bits.len() <= i / 64 {
            self.bits.resize(i / 64 + 1, 0);
        }
        self.bits[i / 64] |= 1 << (i % 64);
        self.count += 1;
    }
}

/// Closes idle connections past their timeout, until the state is retired or dropped.
async fn reap(state: Weak<PoolState>, retire: Arc<Notify>) {
    loop {
        let retired = retire.notified();
        tokio::pin!(retired);
        retired.as_mut().enable();
        let every = {
            let Some(s) = state.upgrade() else { return };
            if s.is_retired() {
                return;
            }
            let timeout = s.idle_timeout();
            for p in &s.peers {
                p.idle.reap(timeout);
            }
            (timeout / 2).max(Duration::from_millis(100))
        };
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = retired => return,
        }
    }
}

fn host_header(t: &Target) -> Option<HeaderValue> {
    match t {
        Target::Tcp { host, port } if host.contains(':') => {
            HeaderValue::from_str(&format!("[{host}]:{port}")).ok()
        }
        Target::Tcp { host, port } => HeaderValue::from_str(&format!("{host}:{port}")).ok(),
        Target::Unix(_) => Some(HeaderValue::from_static("localhost")),
    }
}
