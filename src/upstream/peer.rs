//! A peer: one backend address of a pool, with everything sluice knows of it — its
//! role, health (passive, active, outlier), connections (idle HTTP/1.1, HTTP/2
//! sessions) and counters.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use http::HeaderValue;

use super::{connpool, h2, health, outlier, passive};
use crate::config::{BackendAddr, Target};

pub(crate) struct Peer {
    pub ordinal: usize,
    pub addr: BackendAddr,
    /// The configured weight (1 when none is); a discovered peer's follows its SRV
    /// record.
    pub weight: AtomicU32,
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
pub(crate) enum Role {
    Primary,
    Backup,
}

impl Role {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Role::Primary => "primary",
            Role::Backup => "backup",
        }
    }

    /// The role failover switches to from this one.
    pub(crate) fn other(self) -> Role {
        match self {
            Role::Primary => Role::Backup,
            Role::Backup => Role::Primary,
        }
    }
}

pub(super) const ALPN_UNKNOWN: u8 = 0;
pub(crate) const ALPN_H2: u8 = 1;
pub(crate) const ALPN_H1: u8 = 2;

/// What kind of failure counted against a peer (the `kind` label of its metric).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FailureKind {
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
    pub(crate) const COUNT: usize = 5;

    pub(crate) fn as_str(self) -> &'static str {
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
    pub(crate) fn new(ordinal: usize, addr: BackendAddr, weight: u32) -> Peer {
        Peer {
            ordinal,
            weight: AtomicU32::new(weight),
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
    pub(crate) fn is_eligible(&self, now: u64) -> bool {
        self.passive.is_available(now) && self.active.is_healthy() && !self.outlier.is_ejected(now)
    }

    /// The one word for the peer's state (the status page): a failing health check
    /// first, then an ejection, then passive health.
    pub(crate) fn state(&self, now: u64) -> &'static str {
        if !self.active.is_healthy() {
            "unhealthy"
        } else if self.outlier.is_ejected(now) {
            "ejected"
        } else if !self.passive.is_available(now) {
            "out"
        } else {
            "healthy"
        }
    }

    /// HTTP/2 sessions open to the peer now.
    pub(crate) fn h2_sessions(&self) -> usize {
        self.mux.sessions()
    }

    /// The peer comes back into rotation at `at` (`now_ms`): slow start counts from then.
    pub(crate) fn returns_at(&self, at: u64) {
        self.returned_ms.store(at, Ordering::Relaxed);
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
