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

pub(crate) mod balancer;
pub(crate) mod budget;
pub(crate) mod conn;
pub(crate) mod connect;
pub(crate) mod connpool;
pub(crate) mod dial;
pub(crate) mod discover;
pub(crate) mod failover;
pub(crate) mod h2;
pub(crate) mod health;
pub(crate) mod limit;
pub(crate) mod origin;
mod outgoing;
pub(crate) mod outlier;
pub(crate) mod passive;
mod peer;
mod pool;
mod state;
pub(crate) mod tls;
pub(crate) mod upload;

pub(crate) use self::peer::{FailureKind, Peer, Role, ALPN_H1, ALPN_H2};
pub(crate) use self::pool::{Lease, Note, Pick, Pool, Served, Tried};
pub(crate) use self::state::{PoolId, PoolState};
