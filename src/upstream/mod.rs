//! Peers and pools: the runtime state behind each `proxy` line. Health (passive now),
//! counters, idle connections and the in-flight limit live here, never in the config
//! model, so a reload can carry them over by identity.

pub mod balancer;
pub mod conn;
pub mod connpool;
pub mod dial;
pub mod passive;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::Semaphore;

use self::balancer::Balancer;
use http::HeaderValue;

use crate::config::{AllDown, BackendAddr, ProxyConfig, Target};

pub struct Peer {
    pub ordinal: usize,
    pub addr: BackendAddr,
    /// `Host` for `host upstream`: the address as written, `localhost` for a socket.
    pub host_header: Option<HeaderValue>,
    pub idle: connpool::Idle,
    pub passive: passive::Breaker,
    pub in_flight: AtomicU32,
    pub selections: AtomicU64,
    pub failures: AtomicU64,
}

/// One `proxy` line: its peers, policy, limit and options.
pub struct Pool {
    /// `SITE ROUTE`, or `SITE` for a site block's own proxy.
    pub name: String,
    pub peers: Vec<Peer>,
    pub balancer: Box<dyn Balancer>,
    pub limit: Option<Arc<Semaphore>>,
    pub cfg: ProxyConfig,
}

impl Pool {
    /// Builds the pool and starts its idle-connection reaper (which ends with the pool).
    pub fn new(name: String, cfg: ProxyConfig) -> Arc<Pool> {
        let peers = cfg
            .backends
            .iter()
            .enumerate()
            .map(|(ordinal, addr)| Peer {
                ordinal,
                addr: addr.clone(),
                host_header: host_header(&addr.target),
                idle: Default::default(),
                passive: Default::default(),
                in_flight: AtomicU32::new(0),
                selections: AtomicU64::new(0),
                failures: AtomicU64::new(0),
            })
            .collect();
        let pool = Arc::new(Pool {
            name,
            peers,
            balancer: balancer::for_policy(cfg.lb),
            limit: cfg.limit.map(|l| Arc::new(Semaphore::new(l.max as usize))),
            cfg,
        });
        let weak = Arc::downgrade(&pool);
        let every = (pool.cfg.keepalive.idle_timeout / 2).max(Duration::from_millis(100));
        tokio::spawn(reap(weak, every));
        pool
    }

    /// The next peer to try, never one in `tried`. When no peer is eligible at all,
    /// `all_down` decides: `fail` refuses the request (if nothing was tried yet),
    /// `try` picks among all untried peers anyway.
    pub fn pick(&self, tried: &Tried) -> Pick {
        let now = passive::now_ms();
        let n = self.peers.len();
        let eligible = |i: usize| !tried.has(i) && self.peers[i].passive.is_available(now);
        if let Some(i) = self.balancer.pick(n, &eligible) {
            return Pick::Peer(i);
        }
        if (0..n).any(|i| self.peers[i].passive.is_available(now)) {
            // Eligible peers exist, and every one was tried already.
            return Pick::Exhausted;
        }
        match self.cfg.all_down {
            AllDown::Fail if tried.count > 0 => Pick::Exhausted,
            AllDown::Fail => Pick::AllDown,
            // A health verdict can be wrong; a request never sent is certainly lost.
            AllDown::Try => match self.balancer.pick(n, &|i| !tried.has(i)) {
                Some(i) => Pick::Peer(i),
                None => Pick::Exhausted,
            },
        }
    }

    /// Records a failure that is the peer's fault; logs when it leaves rotation.
    pub fn peer_failed(&self, i: usize, reason: &dyn std::fmt::Display) {
        let peer = &self.peers[i];
        peer.failures.fetch_add(1, Ordering::Relaxed);
        if peer
            .passive
            .record_failure(self.cfg.breaker, self.cfg.fail_duration)
        {
            tracing::warn!(
                "sluice: {}: {} failed ({reason}), out of rotation for {}",
                self.name,
                peer.addr.text,
                crate::config::units::format_duration(self.cfg.fail_duration)
            );
        } else {
            tracing::info!(
                "sluice: {}: {} failed ({reason})",
                self.name,
                peer.addr.text
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

async fn reap(pool: Weak<Pool>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(pool) = pool.upgrade() else { return };
        for p in &pool.peers {
            p.idle.reap(pool.cfg.keepalive.idle_timeout);
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
