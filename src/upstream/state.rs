//! A pool's identity and carried state: what decides that two generations' pools are
//! the same pool, and what such a pool keeps across a reload (peers, counters, the
//! failover role, the retry budget, the `limit`), with the settings handle its
//! background tasks (reaper, probes) read.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::{Notify, Semaphore};

use super::peer::{Peer, Role};
use super::{budget, dial, failover, health, limit, tls};
use crate::config::{BackendScheme, BackendTls, Failover, Health, Policy, ProxyConfig};

/// What makes two generations' pools the same pool.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct PoolId {
    /// `SITE ROUTE`, or `SITE` for a site block's own proxy.
    pub name: String,
    /// The addresses as written, in order.
    pub addresses: Vec<String>,
    pub backups: Vec<String>,
    pub weights: Vec<u32>,
    pub policy: Policy,
    /// How an `https://` pool trusts its backends: connections made under other rules
    /// are never reused under these.
    pub tls: Option<BackendTls>,
    /// Which of a generation's pools with all of the above alike this is (routes of one
    /// pattern told apart by `match` lines): each is carried to its own successor.
    pub occurrence: usize,
}

impl PoolId {
    pub(crate) fn new(name: String, cfg: &ProxyConfig) -> PoolId {
        PoolId {
            name,
            addresses: cfg.backends.iter().map(|b| b.text.clone()).collect(),
            backups: cfg.backups.iter().map(|b| b.text.clone()).collect(),
            weights: cfg.weights.clone(),
            policy: cfg.lb.clone(),
            tls: (cfg.scheme() == BackendScheme::Https).then(|| cfg.tls.clone()),
            occurrence: 0,
        }
    }
}

/// A pool's state, carried across generations by identity.
pub(crate) struct PoolState {
    /// The newest generation's peers (the background tasks' list; each generation's
    /// pool keeps its own). A discovered pool's list changes; a peer that stays keeps
    /// its `Arc`, and with it its health, counters and connections.
    peers: ArcSwap<Vec<Arc<Peer>>>,
    /// How the pool speaks to its peers (one scheme per pool).
    pub scheme: BackendScheme,
    /// The TLS client settings of an `https://` pool.
    pub tls: Option<Arc<tls::ClientTls>>,
    /// What the newest generation asked of the pool's background tasks (the reaper and
    /// the probes read it, each tick).
    settings: ArcSwap<Settings>,
    /// The in-flight cap (`limit`), carried so that it holds across a swap.
    limit: std::sync::Mutex<Option<Arc<limit::Limit>>>,
    retired: AtomicBool,
    /// Wakes the state's tasks when it is retired; theirs to hold without holding it.
    retire: Arc<Notify>,
    /// The probe task runs.
    probing: AtomicBool,
    /// Retries of every kind against `retry_budget`.
    pub budget: budget::Budget,
    /// The failover role and its evidence.
    pub failover: failover::State,
    /// Retries by reason: [unreachable, reset, timeout, status].
    pub retries: [AtomicU64; 4],
    /// Requests sent once more after a kept connection closed under them unanswered.
    pub stale_resends: AtomicU64,
    /// Time from the request going out to the response head.
    pub upstream_seconds: crate::stats::Histogram,
}

/// The newest generation's settings for a pool's background tasks: one handle, swapped
/// whole on reload.
pub(crate) struct Settings {
    /// How long an idle connection is kept (the reaper).
    pub idle_timeout: Duration,
    /// `health`, when the pool has it (the probes).
    pub health: Option<Health>,
    /// `failover`, when the pool has backups (probe results decide recovery).
    pub failover: Option<Failover>,
    /// The resolver and destination policy (the probes dial through them).
    pub dest: dial::Dest,
    /// `proxy_protocol`: a probe's connection starts with a header too (`LOCAL`).
    pub proxy_protocol: Option<crate::config::ProxyProtocol>,
}

impl Settings {
    fn new(cfg: &ProxyConfig, dest: &dial::Dest) -> Settings {
        Settings {
            proxy_protocol: cfg.proxy_protocol,
            idle_timeout: cfg.keepalive.idle_timeout,
            health: cfg.health.clone(),
            failover: (!cfg.backups.is_empty()).then_some(cfg.failover),
            dest: dest.clone(),
        }
    }
}

impl PoolState {
    /// Fresh state for `id`; starts the idle-connection reaper (and the probe task when
    /// `cfg` has `health`). Must run inside the tokio runtime.
    pub(crate) fn new(
        id: &PoolId,
        cfg: &ProxyConfig,
        probe_slots: &Arc<Semaphore>,
        dest: &dial::Dest,
    ) -> Arc<PoolState> {
        let state = Arc::new(PoolState {
            peers: ArcSwap::from_pointee(refit(&[], cfg)),
            scheme: cfg.scheme(),
            tls: (cfg.scheme() == BackendScheme::Https)
                .then(|| Arc::new(tls::ClientTls::new(&cfg.tls))),
            settings: ArcSwap::from_pointee(Settings::new(cfg, dest)),
            limit: Default::default(),
            retired: AtomicBool::new(false),
            retire: Arc::new(Notify::new()),
            probing: AtomicBool::new(false),
            budget: Default::default(),
            retries: Default::default(),
            stale_resends: Default::default(),
            failover: Default::default(),
            upstream_seconds: Default::default(),
        });
        if let Some(h) = &cfg.health {
            for p in state.peers().iter() {
                p.active.set_initial(h.initial_healthy);
            }
        }
        tokio::spawn(reap(Arc::downgrade(&state), state.retire.clone()));
        state.start_probing(id, cfg, probe_slots);
        state
    }

    /// The state of `id` in a new generation: the previous generation's (`before`),
    /// taking the new settings, else fresh.
    pub(crate) fn carry(
        before: Option<&Arc<PoolState>>,
        id: &PoolId,
        cfg: &ProxyConfig,
        dest: &dial::Dest,
        probe_slots: &Arc<Semaphore>,
    ) -> Arc<PoolState> {
        match before {
            Some(s) => {
                s.take_settings(id, cfg, dest, probe_slots);
                s.clone()
            }
            None => PoolState::new(id, cfg, probe_slots, dest),
        }
    }

    /// The newest generation's peers.
    pub(crate) fn peers(&self) -> Arc<Vec<Arc<Peer>>> {
        self.peers.load_full()
    }

    /// Takes a discovered pool's new addresses: peers that stay are kept, new ones
    /// made (passing their health checks first when the pool has any), and those that
    /// left drain: requests on them finish on the generation that sent them, their
    /// idle connections close now.
    fn take_peers(&self, cfg: &ProxyConfig) {
        // A listed pool's addresses are its identity: they never change under it.
        if cfg.discover.is_none() {
            return;
        }
        let old = self.peers.load_full();
        let next = refit(&old, cfg);
        if next.len() == old.len() && next.iter().zip(old.iter()).all(|(a, b)| Arc::ptr_eq(a, b)) {
            return;
        }
        for gone in old
            .iter()
            .filter(|p| !next.iter().any(|n| Arc::ptr_eq(n, p)))
        {
            gone.idle.reap(Duration::ZERO);
            gone.mux.reap(Duration::ZERO);
        }
        if let Some(h) = &cfg.health {
            for p in next
                .iter()
                .filter(|p| !old.iter().any(|o| Arc::ptr_eq(o, p)))
            {
                p.active.set_initial(h.initial_healthy);
            }
        }
        self.peers.store(Arc::new(next));
    }

    /// The newest generation's settings for the background tasks.
    pub(crate) fn settings(&self) -> Arc<Settings> {
        self.settings.load_full()
    }

    /// Takes the newest generation's settings: kept connections made under another
    /// destination policy go (a changed policy must not be dodged by them); a pool
    /// whose `health` left the config returns its peers to passive health at once (no
    /// probe will ever clear a failing verdict), and probing starts if `health` is new.
    fn take_settings(
        self: &Arc<Self>,
        id: &PoolId,
        cfg: &ProxyConfig,
        dest: &dial::Dest,
        slots: &Arc<Semaphore>,
    ) {
        self.take_peers(cfg);
        let old = self.settings.swap(Arc::new(Settings::new(cfg, dest)));
        if old.dest.policy.as_deref() != dest.policy.as_deref() {
            for p in self.peers().iter() {
                p.idle.reap(Duration::ZERO);
                p.mux.clear();
            }
        }
        if old.health.is_some() && cfg.health.is_none() {
            for p in self.peers().iter() {
                p.active.clear();
            }
            tracing::info!(
                pool = %id.name,
                "sluice: {}: health checks removed; its peers are judged by passive health only",
                id.name
            );
        }
        self.start_probing(id, cfg, slots);
    }

    /// The probe task stops: `health` left the config. `false`: a newer generation
    /// brought it back meanwhile, and this task goes on probing.
    pub(super) fn stop_probing(&self) -> bool {
        self.probing.store(false, Ordering::SeqCst);
        self.settings().health.is_none() || self.probing.swap(true, Ordering::SeqCst)
    }

    /// The pool's `limit`, resized to this generation's N (see [`limit`]).
    pub(super) fn limit_for(&self, max: Option<u32>) -> Option<Arc<limit::Limit>> {
        let mut held = self.limit.lock().unwrap_or_else(|e| e.into_inner());
        let Some(max) = max else {
            *held = None;
            return None;
        };
        match &*held {
            Some(l) => l.resize(max as usize),
            None => *held = Some(limit::Limit::new(max as usize)),
        }
        held.clone()
    }

    /// Starts the probe task if the pool has `health` and it does not run yet.
    fn start_probing(self: &Arc<Self>, id: &PoolId, cfg: &ProxyConfig, slots: &Arc<Semaphore>) {
        if cfg.health.is_some() && !self.probing.swap(true, Ordering::SeqCst) {
            tokio::spawn(health::run(
                Arc::downgrade(self),
                self.retire.clone(),
                slots.clone(),
                id.name.clone(),
            ));
        }
    }

    /// The live generation dropped this pool: its background tasks stop now, and its
    /// idle connections close.
    pub(crate) fn retire(&self) {
        self.retired.store(true, Ordering::Relaxed);
        self.retire.notify_waiters();
        for p in self.peers().iter() {
            p.idle.reap(Duration::ZERO);
            p.mux.reap(Duration::ZERO);
        }
    }

    pub(crate) fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Relaxed)
    }

    /// Resolves once the state is retired.
    pub(crate) async fn retired(&self) {
        loop {
            let notified = self.retire.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_retired() {
                return;
            }
            notified.await;
        }
    }

    /// A primary's probe result, for failover recovery; logs the switch it makes.
    pub(crate) fn probe_for_failover(&self, pool: &str, peer: &Peer, passed: bool) {
        let settings = self.settings.load();
        let Some(f) = &settings.failover else {
            return;
        };
        if peer.role == Role::Backup {
            return;
        }
        if let Some(t) = self
            .failover
            .probe_result(passed, f, crate::clock::now_ms())
        {
            t.log(pool, "its primaries pass their health checks");
        }
    }
}

/// `cfg`'s addresses as peers: primaries with their weights, then backups; a peer of
/// `old` with the same address and role is kept (its weight updated), a new one is
/// numbered past every kept one.
fn refit(old: &[Arc<Peer>], cfg: &ProxyConfig) -> Vec<Arc<Peer>> {
    let mut next_ordinal = old.iter().map(|p| p.ordinal + 1).max().unwrap_or(0);
    let primaries = cfg
        .backends
        .iter()
        .enumerate()
        .map(|(i, a)| (a, cfg.weights.get(i).copied().unwrap_or(1), Role::Primary));
    let backups = cfg.backups.iter().map(|a| (a, 1, Role::Backup));
    let mut unmatched: Vec<&Arc<Peer>> = old.iter().collect();
    primaries
        .chain(backups)
        .map(|(addr, weight, role)| {
            // Each old peer is kept once: an address written twice stays two peers.
            let kept = unmatched
                .iter()
                .position(|p| p.addr.text == addr.text && p.role == role);
            if let Some(k) = kept {
                let p = unmatched.swap_remove(k);
                p.weight.store(weight, Ordering::Relaxed);
                return p.clone();
            }
            let ordinal = next_ordinal;
            next_ordinal += 1;
            Arc::new(Peer {
                role,
                ..Peer::new(ordinal, addr.clone(), weight)
            })
        })
        .collect()
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
            let timeout = s.settings.load().idle_timeout;
            for p in s.peers().iter() {
                p.idle.reap(timeout);
                p.mux.reap(timeout);
            }
            (timeout / 2).max(Duration::from_millis(100))
        };
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = retired => return,
        }
    }
}
