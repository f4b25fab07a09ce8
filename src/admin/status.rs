//! `GET /status`: the running state as JSON, in the shape DESIGN.md §14 fixes:
//! revision, listeners, sites, and every pool with its peers' state and counters.
//! Addresses are shown as configured; nothing secret is in the model to show.

use std::sync::atomic::Ordering;

use serde_json::{json, Value};

use super::log::rfc3339;
use crate::runtime::Generation;
use crate::upstream::{Peer, Pool};

pub(crate) fn status(gen: &Generation, revision: u64, listeners: &[String]) -> Value {
    let sites: Vec<Value> = gen
        .sites
        .list
        .iter()
        .map(|s| json!({"name": s.name, "maintenance": s.in_maintenance()}))
        .collect();
    let pools: Vec<Value> = gen.pools().map(|p| pool(p)).collect();
    json!({
        "revision": revision,
        "listeners": listeners,
        "sites": sites,
        "pools": pools,
        "tunnels_open": crate::tunnel::OPEN.load(Ordering::Relaxed),
        "out_of_ports": crate::stats::COUNTERS.out_of_ports.load(Ordering::Relaxed),
    })
}

/// The process's facts: version, start time, uptime, and the last reload (`null`
/// before any).
pub(crate) fn process(body: &mut Value, last: Option<&super::revisions::LastReload>) {
    let started = crate::stats::STARTED.get().copied();
    let uptime = started
        .and_then(|t| t.elapsed().ok())
        .map_or(0, |d| d.as_secs());
    body["version"] = json!(env!("CARGO_PKG_VERSION"));
    body["started_at"] = started.map_or(Value::Null, |t| json!(rfc3339(t)));
    body["uptime_seconds"] = json!(uptime);
    body["last_reload"] = last.map_or(
        Value::Null,
        |r| json!({"ok": r.ok, "at": rfc3339(r.at), "error": r.error}),
    );
}

fn pool(p: &Pool) -> Value {
    let role = p.state.failover.role().as_str();
    let now = crate::clock::now_ms();
    let peers: Vec<Value> = p.peers().iter().map(|peer| self::peer(peer, now)).collect();
    let at = |ms: u64| Value::String(rfc3339(crate::clock::wall_clock(ms)));
    let failover = &p.state.failover;
    let last_switch = failover.last_switch().map_or(
        Value::Null,
        |(t, ms)| json!({"reason": t.as_str(), "at": at(ms)}),
    );
    let failback_at = failover
        .failback_at(&p.cfg.failover)
        .filter(|_| !p.cfg.backups.is_empty())
        .map_or(Value::Null, at);
    json!({
        "name": p.name(),
        "policy": p.cfg.lb.name(),
        "role": role,
        "last_switch": last_switch,
        "failback_at": failback_at,
        "peers": peers,
    })
}

fn peer(peer: &Peer, now: u64) -> Value {
    let probed = peer.active.last_probe_ms.load(Ordering::Relaxed);
    let last_probe = if probed == 0 {
        Value::Null
    } else {
        let result = if peer.active.last_passed.load(Ordering::Relaxed) {
            "pass"
        } else {
            "fail"
        };
        json!({"result": result, "at": rfc3339(crate::clock::wall_clock(probed))})
    };
    let mut v = json!({
        "ordinal": peer.ordinal,
        "address": peer.addr.text,
        "state": peer.state(now),
        "in_flight": peer.in_flight.load(Ordering::Relaxed),
        "selections": peer.selections.load(Ordering::Relaxed),
        "failures": peer.failures.load(Ordering::Relaxed),
        "last_probe": last_probe,
    });
    if peer.role == crate::upstream::Role::Backup {
        v["backup"] = Value::Bool(true);
    }
    if peer.addr.scheme != crate::config::BackendScheme::Http {
        v["h2_connections"] = json!(peer.h2_sessions());
    }
    v
}
