//! `GET /status`: the running state as JSON, in the shape DESIGN.md §14 fixes:
//! revision, listeners, sites, and every pool with its peers' state and counters.
//! Addresses are shown as configured; nothing secret is in the model to show.

use std::sync::atomic::Ordering;

use serde_json::{json, Value};

use super::log::rfc3339;
use crate::runtime::Generation;
use crate::stats::Meter;
use crate::upstream::{Peer, Pool};

pub(crate) fn status(gen: &Generation, revision: u64, listeners: &[String]) -> Value {
    let sites: Vec<Value> = gen
        .sites
        .list
        .iter()
        .map(|s| json!({"name": s.name, "maintenance": s.in_maintenance()}))
        .collect();
    let pools: Vec<Value> = gen.pools().map(|p| pool(p)).collect();
    let fastcgi: Vec<Value> = gen.sites.fastcgi().map(fastcgi_pool).collect();
    let routes: Vec<Value> = gen
        .meters()
        .map(|m| {
            let mut r = json!({"site": m.site, "route": m.route, "pool": m.pool, "requests": meter(m.meter)});
            if let Some(c) = m.challenge {
                r["challenge"] = json!(if c.is_on() { "on" } else { "off" });
            }
            r
        })
        .collect();
    json!({
        "revision": revision,
        "listeners": listeners,
        "sites": sites,
        "pools": pools,
        "fastcgi_pools": fastcgi,
        "routes": routes,
        "certificates": certificates(gen),
        "demo": crate::demo::backends()
            .into_iter()
            .map(|(name, addr, up)| json!({"backend": name, "address": addr.to_string(), "up": up}))
            .collect::<Vec<_>>(),
        "caches": caches(gen),
        "acme": acme(gen),
        "latency_bounds": crate::stats::LATENCY_BOUNDS,
        "tunnels_open": crate::tunnel::OPEN.load(Ordering::Relaxed),
        "out_of_ports": crate::stats::COUNTERS.out_of_ports.load(Ordering::Relaxed),
    })
}

/// The `tls auto` certificates: the ACME server, the storage, and for each certificate
/// its names, end of validity (`null` while the placeholder serves), next renewal (or
/// retry) and the last error; `null` when no site has `tls auto`.
fn acme(gen: &Generation) -> Value {
    let Some(m) = &gen.acme else {
        return Value::Null;
    };
    let certs: Vec<Value> = m
        .certificates()
        .into_iter()
        .map(|c| {
            json!({
                "names": c.names,
                "not_after": c.not_after.map(rfc3339),
                "next_renewal": c.next_renewal.map(rfc3339),
                "last_error": c.last_error,
            })
        })
        .collect();
    json!({"directory": m.config.directory, "storage": m.storage(), "certificates": certs})
}

/// The cache stores in the order they are shown (by setting).
pub(super) fn cache_stores(gen: &Generation) -> Vec<&std::sync::Arc<crate::cache::Store>> {
    let mut stores: Vec<_> = gen.kept.stores.values().collect();
    stores.sort_by(|a, b| a.identity.cmp(&b.identity));
    stores
}

/// Each cache store: its setting, size and what it holds.
fn caches(gen: &Generation) -> Vec<Value> {
    cache_stores(gen)
        .iter()
        .map(|s| json!({"store": s.identity, "capacity": s.capacity(), "bytes": s.bytes(), "objects": s.objects()}))
        .collect()
}

/// A meter's counts since start: responses by class, body bytes, and the latency
/// histogram's buckets (not cumulative; bounds in `latency_bounds`, the last one for
/// "slower than every bound"), so a reader can take rates and quantiles over the
/// difference of two reads.
fn meter(m: &Meter) -> Value {
    let get = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    let classes: Vec<u64> = m.classes.iter().map(get).collect();
    let buckets: Vec<u64> = m.duration.buckets.iter().map(get).collect();
    json!({
        "total": classes.iter().sum::<u64>(),
        "by_class": {"1xx": classes[0], "2xx": classes[1], "3xx": classes[2], "4xx": classes[3], "5xx": classes[4]},
        "bytes_in": get(&m.request_bytes),
        "bytes_out": get(&m.response_bytes),
        "duration_buckets": buckets,
        "duration_sum_seconds": get(&m.duration.sum_us) as f64 / 1e6,
        "by_code": by_code(m),
        "cache": cache_counts(m),
    })
}

/// The 4xx and 5xx codes answered, with their counts (those seen only).
fn by_code(m: &Meter) -> Value {
    let mut out = serde_json::Map::new();
    for (i, c) in m.codes.iter().enumerate() {
        let n = c.load(Ordering::Relaxed);
        if n != 0 {
            let code = crate::stats::CODES
                .get(i)
                .map_or_else(|| "other".to_string(), u16::to_string);
            out.insert(code, n.into());
        }
    }
    Value::Object(out)
}

/// What a cache route's cache did with its requests (`null` before it counted any).
fn cache_counts(m: &Meter) -> Value {
    let counts: Vec<u64> = m.cache.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    if counts.iter().all(|&n| n == 0) {
        return Value::Null;
    }
    let mut out = serde_json::Map::new();
    for (outcome, name) in crate::cache::Outcome::ALL {
        out.insert(name.into(), counts[outcome as usize].into());
    }
    Value::Object(out)
}

/// A FastCGI pool: its application and its connections now.
fn fastcgi_pool(f: &crate::fastcgi::FastCgi) -> Value {
    let c = f.pool.counts();
    json!({
        "name": f.name,
        "address": f.cfg.text,
        "max_conns": c.max_conns,
        "open": c.open,
        "idle": c.idle,
        "waiting": c.waiting,
    })
}

/// Each TLS site's certificate as served now: when it expires, and in how long.
fn certificates(gen: &Generation) -> Vec<Value> {
    let Some(tls) = &gen.tls else {
        return Vec::new();
    };
    let now = std::time::SystemTime::now();
    tls.certs
        .slots
        .iter()
        .filter_map(|slot| {
            let after = slot.not_after()?;
            let left = match after.duration_since(now) {
                Ok(d) => d.as_secs() as i64,
                Err(e) => -(e.duration().as_secs() as i64),
            };
            Some(json!({
                "site": slot.site,
                "file": slot.files.as_ref().map(|(c, _)| c.display().to_string()),
                "auto": slot.files.is_none(),
                "not_after": rfc3339(after),
                "expires_in_seconds": left,
                "ocsp_next_update": slot.stapler.expiry().map(rfc3339),
            }))
        })
        .collect()
}

/// The process's facts: version, start time, uptime, and the last reload (`null`
/// before any).
pub(crate) fn process(body: &mut Value, last: Option<&super::revisions::LastReload>) {
    let started = crate::stats::STARTED.get().copied();
    let uptime = started
        .and_then(|t| t.elapsed().ok())
        .map_or(0, |d| d.as_secs());
    body["version"] = json!(env!("CARGO_PKG_VERSION"));
    body["pid"] = json!(std::process::id());
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
    let mut v = json!({
        "name": p.name(),
        "policy": p.cfg.lb.name(),
        "role": role,
        "last_switch": last_switch,
        "failback_at": failback_at,
        "peers": peers,
    });
    if let Some(d) = &p.discovery {
        v["source"] = json!(d.source.source);
        v["discovered_at"] = d.answer().map_or(Value::Null, |a| json!(rfc3339(a.at)));
    }
    v
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
        let error = peer
            .active
            .last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .filter(|_| result == "fail");
        json!({"result": result, "at": rfc3339(crate::clock::wall_clock(probed)), "error": error})
    };
    let state = peer.state(now);
    let (since, reason) = state_since(peer, state, now);
    let mut v = json!({
        "ordinal": peer.ordinal,
        "address": peer.addr.text,
        "state": state,
        "since": since.map_or(Value::Null, |ms| json!(rfc3339(crate::clock::wall_clock(ms)))),
        "reason": reason,
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

/// Since when (`now_ms`) a peer has been in `state`, and why it is out of rotation:
/// the failed probe's error, the breaker, or outlier ejection. `None` for since: in
/// that state from the pool's start.
fn state_since(peer: &Peer, state: &str, now: u64) -> (Option<u64>, Option<String>) {
    let at = |c: &std::sync::atomic::AtomicU64| Some(c.load(Ordering::Relaxed)).filter(|&t| t != 0);
    match state {
        "unhealthy" => {
            let error = peer
                .active
                .last_error
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            let why = match error {
                None => "health probes fail".to_string(),
                // `health grpc`: the status says it all (`grpc: NOT_SERVING`).
                Some(e) if e.starts_with("grpc: ") => e,
                Some(e) => format!("health probe: {e}"),
            };
            (at(&peer.active.changed_ms), Some(why))
        }
        "ejected" => (
            at(&peer.outlier.since_ms),
            Some("5xx answers in a row (outlier ejection)".to_string()),
        ),
        "out" => (
            at(&peer.passive.out_since),
            Some("failed requests in a row (passive breaker)".to_string()),
        ),
        // Healthy since the latest return: probes passing again, the breaker or an
        // ejection running out.
        _ => {
            let back = [
                at(&peer.active.changed_ms),
                Some(peer.passive.out_until()).filter(|&t| t != 0 && t <= now),
                peer.outlier.until().filter(|&t| t <= now),
            ];
            (back.into_iter().flatten().max(), None)
        }
    }
}
