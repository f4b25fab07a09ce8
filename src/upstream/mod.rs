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
pub mod connect;
pub mod connpool;
pub mod dial;
pub mod failover;
pub mod h2;
pub mod health;
pub mod limit;
mod outgoing;
pub mod outlier;
pub mod passive;
pub mod tls;
mod upload;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use http::HeaderValue;
use tokio::sync::{Notify, Semaphore};

use self::balancer::{Balancer, Candidates};
use self::failover::Transition;
use crate::config::{
    AllDown, BackendAddr, BackendScheme, BackendTls, Failover, Health, Policy, ProxyConfig, Target,
};

pub struct Peer {
    pub ordinal: usize,
    pub addr: BackendAddr,
    /// The configured weight (1 when none is).
    pub weight: u32,
    /// A primary, or a `backup` address used only while failover says so.
    pub role: Role,
    /// `Host` for `host upstream`: the address as written, `localhost` for a socket.
    pub host_header: Option<HeaderValue>,
    pub idle: connpool::Idle,
    /// HTTP/2 sessions (`h2c://`, or `https://` when the peer chose h2).
    pub mux: h2::Mux,
    /// What ALPN last chose on this `https://` peer: [`ALPN_UNKNOWN`], [`ALPN_H2`] or
    /// [`ALPN_H1`].
    pub alpn: std::sync::atomic::AtomicU8,
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
    /// Failures by [`FailureKind`].
    pub failures_by_kind: [AtomicU64; FailureKind::COUNT],
}

/// Which side of active-passive failover a peer is on (DESIGN §8.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Primary,
    Backup,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Primary => "primary",
            Role::Backup => "backup",
        }
    }

    /// The role failover switches to from this one.
    pub fn other(self) -> Role {
        match self {
            Role::Primary => Role::Backup,
            Role::Backup => Role::Primary,
        }
    }
}

pub const ALPN_UNKNOWN: u8 = 0;
pub const ALPN_H2: u8 = 1;
pub const ALPN_H1: u8 = 2;

/// What kind of failure counted against a peer (the `kind` label of its metric).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// The name did not resolve.
    Dns = 0,
    /// The connection was refused or timed out.
    Connect = 1,
    /// The connection broke with a request (or its response) on it.
    Broken = 2,
    /// The response broke HTTP.
    Invalid = 3,
    /// The destination policy refused the address (`safety strict`).
    Unsafe = 4,
}

impl FailureKind {
    pub const COUNT: usize = 5;

    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::Dns => "dns",
            FailureKind::Connect => "connect",
            FailureKind::Broken => "broken",
            FailureKind::Invalid => "invalid",
            FailureKind::Unsafe => "unsafe",
        }
    }
}

impl Peer {
    pub fn new(ordinal: usize, addr: BackendAddr, weight: u32) -> Peer {
        Peer {
            ordinal,
            weight,
            role: Role::Primary,
            host_header: host_header(&addr.target),
            addr,
            idle: Default::default(),
            mux: Default::default(),
            alpn: std::sync::atomic::AtomicU8::new(ALPN_UNKNOWN),
            passive: Default::default(),
            active: Default::default(),
            outlier: Default::default(),
            // 0: in rotation from the start, at full weight.
            returned_ms: AtomicU64::new(0),
            in_flight: AtomicU32::new(0),
            selections: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            failures_by_kind: Default::default(),
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
    pub backups: Vec<String>,
    pub weights: Vec<u32>,
    pub policy: Policy,
    /// How an `https://` pool trusts its backends: connections made under other rules
    /// are never reused under these.
    pub tls: Option<BackendTls>,
}

impl PoolId {
    pub fn new(name: String, cfg: &ProxyConfig) -> PoolId {
        PoolId {
            name,
            addresses: cfg.backends.iter().map(|b| b.text.clone()).collect(),
            backups: cfg.backups.iter().map(|b| b.text.clone()).collect(),
            weights: cfg.weights.clone(),
            policy: cfg.lb.clone(),
            tls: (cfg.scheme() == BackendScheme::Https).then(|| cfg.tls.clone()),
        }
    }
}

/// A pool's state, carried across generations by identity.
pub struct PoolState {
    pub peers: Vec<Peer>,
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
    /// Time from the request going out to the response head.
    pub upstream_seconds: crate::stats::Histogram,
}

/// The newest generation's settings for a pool's background tasks: one handle, swapped
/// whole on reload.
pub struct Settings {
    /// How long an idle connection is kept (the reaper).
    pub idle_timeout: Duration,
    /// `health`, when the pool has it (the probes).
    pub health: Option<Health>,
    /// `failover`, when the pool has backups (probe results decide recovery).
    pub failover: Option<Failover>,
    /// The resolver and destination policy (the probes dial through them).
    pub dest: dial::Dest,
}

impl Settings {
    fn new(cfg: &ProxyConfig, dest: &dial::Dest) -> Settings {
        Settings {
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
    pub fn new(
        id: &PoolId,
        cfg: &ProxyConfig,
        probe_slots: &Arc<Semaphore>,
        dest: &dial::Dest,
    ) -> Arc<PoolState> {
        let state = Arc::new(PoolState {
            peers: cfg
                .backends
                .iter()
                .enumerate()
                .map(|(i, a)| Peer::new(i, a.clone(), cfg.weights.get(i).copied().unwrap_or(1)))
                .chain(cfg.backups.iter().enumerate().map(|(k, a)| Peer {
                    role: Role::Backup,
                    ..Peer::new(cfg.backends.len() + k, a.clone(), 1)
                }))
                .collect(),
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
            failover: Default::default(),
            upstream_seconds: Default::default(),
        });
        debug_assert_eq!(state.peers.len(), id.addresses.len() + id.backups.len());
        if let Some(h) = &cfg.health {
            for p in &state.peers {
                p.active.set_initial(h.initial_healthy);
            }
        }
        tokio::spawn(reap(Arc::downgrade(&state), state.retire.clone()));
        state.start_probing(id, cfg, probe_slots);
        state
    }

    /// The newest generation's settings for the background tasks.
    pub fn settings(&self) -> Arc<Settings> {
        self.settings.load_full()
    }

    /// Takes the newest generation's settings: kept connections made under another
    /// destination policy go (a changed policy must not be dodged by them), and
    /// probing starts if `health` is new.
    fn take_settings(
        self: &Arc<Self>,
        id: &PoolId,
        cfg: &ProxyConfig,
        dest: &dial::Dest,
        slots: &Arc<Semaphore>,
    ) {
        let old = self.settings.swap(Arc::new(Settings::new(cfg, dest)));
        if old.dest.policy.as_deref() != dest.policy.as_deref() {
            for p in &self.peers {
                p.idle.reap(Duration::ZERO);
                p.mux.clear();
            }
        }
        self.start_probing(id, cfg, slots);
    }

    /// The pool's `limit`, resized to this generation's N (see [`limit`]).
    fn limit_for(&self, max: Option<u32>) -> Option<Arc<limit::Limit>> {
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
        if cfg.health.is_some() && !self.probing.swap(true, Ordering::Relaxed) {
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
    pub fn retire(&self) {
        self.retired.store(true, Ordering::Relaxed);
        self.retire.notify_waiters();
        for p in &self.peers {
            p.idle.reap(Duration::ZERO);
            p.mux.reap(Duration::ZERO);
        }
    }

    pub fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Relaxed)
    }

    /// Resolves once the state is retired.
    pub async fn retired(&self) {
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
    pub fn probe_for_failover(&self, pool: &str, i: usize, passed: bool) {
        let settings = self.settings.load();
        let Some(f) = &settings.failover else {
            return;
        };
        if self.peers[i].role == Role::Backup {
            return;
        }
        if let Some(t) = self
            .failover
            .probe_result(passed, f, crate::clock::now_ms())
        {
            log_switch(pool, t, "its primaries pass their health checks");
        }
    }
}

/// One `proxy` line in one generation: identity, carried state, and this generation's
/// settings.
pub struct Pool {
    pub id: PoolId,
    pub state: Arc<PoolState>,
    pub balancer: Box<dyn Balancer>,
    /// The pool's `limit`, shared with the generations before (see [`limit`]).
    pub limit: Option<Arc<limit::Limit>>,
    pub cfg: ProxyConfig,
    /// This generation's resolver and, for a strict pool, its destination policy.
    pub dest: dial::Dest,
}

impl Pool {
    /// Builds this generation's pool, carrying `carried` state when the previous
    /// generation had a pool of the same identity.
    pub fn build(
        id: PoolId,
        cfg: ProxyConfig,
        carried: Option<Arc<PoolState>>,
        probe_slots: &Arc<Semaphore>,
        dest: dial::Dest,
    ) -> Arc<Pool> {
        let state = match carried {
            Some(s) => {
                s.take_settings(&id, &cfg, &dest, probe_slots);
                s
            }
            None => PoolState::new(&id, &cfg, probe_slots, &dest),
        };
        Arc::new(Pool {
            balancer: balancer::for_policy(&cfg.lb, &state.peers, cfg.slow_start.is_some()),
            limit: state.limit_for(cfg.limit.map(|l| l.max)),
            id,
            state,
            cfg,
            dest,
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
    pub fn pick(&self, tried: &Tried, key: Option<u64>, note: &mut Note) -> Pick {
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
                None => Pick::Exhausted,
            },
        }
    }

    /// Records a failure that is the peer's fault; logs when it leaves rotation.
    pub fn peer_failed(&self, i: usize, kind: FailureKind, reason: &dyn std::fmt::Display) {
        let peer = &self.peers()[i];
        peer.failures.fetch_add(1, Ordering::Relaxed);
        peer.failures_by_kind[kind as usize].fetch_add(1, Ordering::Relaxed);
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
            log_switch(self.name(), t, why);
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
    pub fn switched_away_from(&self, i: usize, note: &mut Note) -> bool {
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
    pub fn failover_result(&self, i: usize, ok: bool, note: &mut Note) {
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
            log_switch(self.name(), t, &why);
            note.transition = Some(t);
        }
    }

    /// Counts a backend's answer for outlier ejection (when configured).
    pub fn record_answer(&self, i: usize, status: u16) {
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
pub struct Lease {
    pub pool: Arc<Pool>,
    pub peer: usize,
    pub permit: Option<limit::Slot>,
}

impl Lease {
    pub fn new(pool: Arc<Pool>, peer: usize, permit: Option<limit::Slot>) -> Lease {
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
pub struct Served {
    pub pool: Arc<Pool>,
    pub peer: usize,
    pub attempts: u32,
    pub role: &'static str,
    pub transition: &'static str,
}

impl Served {
    pub fn pool_name(&self) -> &str {
        self.pool.name()
    }

    pub fn peer_address(&self) -> &str {
        &self.pool.peers()[self.peer].addr.text
    }
}

/// What failover decided for one request: whether it is a trial of the primaries, and
/// the switch its outcome caused (named on its response).
#[derive(Debug, Default)]
pub struct Note {
    pub trial: bool,
    pub transition: Option<Transition>,
    attempts: u32,
}

fn log_switch(pool: &str, t: Transition, why: &str) {
    let to = if t.to_backup() { "backup" } else { "primary" };
    tracing::warn!("sluice: {pool}: switched to {to} ({}: {why})", t.as_str());
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
            let timeout = s.settings.load().idle_timeout;
            for p in &s.peers {
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

fn host_header(t: &Target) -> Option<HeaderValue> {
    match t {
        Target::Tcp { host, port } if host.contains(':') => {
            HeaderValue::from_str(&format!("[{host}]:{port}")).ok()
        }
        Target::Tcp { host, port } => HeaderValue::from_str(&format!("{host}:{port}")).ok(),
        Target::Unix(_) => Some(HeaderValue::from_static("localhost")),
    }
}
