//! `GET /metrics`: Prometheus text, hand-rolled (smaller and faster than a registry
//! for what is here: the atomics the request path already keeps are read and printed;
//! nothing on the request path takes a lock for metrics). Labels: `pool="SITE ROUTE"`,
//! `peer="ADDRESS"`, `ordinal="0"`.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::runtime::Generation;
use crate::stats::{Histogram, Meter, COUNTERS, LATENCY_BOUNDS, STATUS};
use crate::upstream::{FailureKind, Pool};

pub(crate) fn render(gen: &Generation) -> String {
    let mut out = String::with_capacity(8192);
    let pools: Vec<&Arc<Pool>> = gen.pools().collect();
    responses(&mut out);
    http(&mut out, gen);
    fastcgi(&mut out, gen);
    peers(&mut out, &pools);
    pool_metrics(&mut out, &pools);
    counters(&mut out);
    listeners(&mut out, gen);
    certificates(&mut out, gen);
    cache(&mut out, gen);
    jwt(&mut out, gen);
    challenges(&mut out, gen);
    spans(&mut out, gen);
    acme(&mut out, gen);
    discovery(&mut out, &pools);
    build_and_reloads(&mut out);
    process(&mut out);
    out
}

/// DNS discovery, per source: reads by result, answers that changed the peers, and
/// the peers of the last good answer.
fn discovery(o: &mut String, pools: &[&Arc<Pool>]) {
    let mut seen: Vec<&str> = Vec::new();
    let sources: Vec<_> = pools
        .iter()
        .filter_map(|p| p.discovery.as_ref())
        .filter(|d| {
            let fresh = !seen.contains(&d.source.source.as_str());
            seen.push(&d.source.source);
            fresh
        })
        .collect();
    if sources.is_empty() {
        return;
    }
    head(
        o,
        "sluice_discovery_refreshes_total",
        "counter",
        "DNS reads of a discovered pool's source, by result",
    );
    for d in &sources {
        let (all, failed) = (get(&d.refreshes), get(&d.failures));
        let src = esc(&d.source.source);
        let _ = writeln!(
            o,
            "sluice_discovery_refreshes_total{{source=\"{src}\",result=\"ok\"}} {}",
            all.saturating_sub(failed)
        );
        let _ = writeln!(
            o,
            "sluice_discovery_refreshes_total{{source=\"{src}\",result=\"failed\"}} {failed}"
        );
    }
    head(
        o,
        "sluice_discovery_changes_total",
        "counter",
        "DNS answers that changed a discovered pool's peers",
    );
    for d in &sources {
        let _ = writeln!(
            o,
            "sluice_discovery_changes_total{{source=\"{}\"}} {}",
            esc(&d.source.source),
            get(&d.changes)
        );
    }
    head(
        o,
        "sluice_discovery_peers",
        "gauge",
        "peers in the last good DNS answer",
    );
    for d in &sources {
        let n = d.answer().map_or(0, |a| a.peers.len());
        let _ = writeln!(
            o,
            "sluice_discovery_peers{{source=\"{}\"}} {n}",
            esc(&d.source.source)
        );
    }
}

/// ACME orders by result, when some site has `tls auto`.
fn acme(o: &mut String, gen: &Generation) {
    if gen.acme.is_none() {
        return;
    }
    head(
        o,
        "sluice_acme_orders_total",
        "counter",
        "certificate orders from the ACME server, by result",
    );
    for (i, name) in crate::acme::ORDER_RESULTS.iter().enumerate() {
        let _ = writeln!(
            o,
            "sluice_acme_orders_total{{result=\"{name}\"}} {}",
            get(&COUNTERS.acme_orders[i])
        );
    }
}

/// `tracing otlp`: spans exported, dropped on a full queue, or refused by the collector.
fn spans(o: &mut String, gen: &Generation) {
    if gen.tracer.is_none() {
        return;
    }
    head(
        o,
        "sluice_otel_spans_total",
        "counter",
        "trace spans by what became of them: exported, dropped (queue full), failed (the collector did not take them)",
    );
    for (result, n) in [
        ("exported", &crate::otel::EXPORTED),
        ("dropped", &crate::otel::DROPPED),
        ("failed", &crate::otel::FAILED),
    ] {
        let _ = writeln!(
            o,
            "sluice_otel_spans_total{{result=\"{result}\"}} {}",
            get(n)
        );
    }
}

/// `challenge` results, by route (routes that judged none left out).
fn challenges(o: &mut String, gen: &Generation) {
    let help = "challenge pages issued, solutions passed and failed, requests bypassed";
    by_result(
        o,
        gen,
        ("sluice_challenge_total", help),
        &crate::filter::challenge::RESULTS,
        |m| &m.challenge,
    );
}

/// `jwt` filters' results, by the route they ran on (routes that ran none left out).
fn jwt(o: &mut String, gen: &Generation) {
    let help = "bearer tokens a jwt filter judged, by result";
    by_result(
        o,
        gen,
        ("sluice_jwt_results_total", help),
        &crate::filter::jwt::RESULTS,
        |m| &m.jwt,
    );
}

/// A counter by route and `result` (`results` names each of `counts`' slots); routes
/// that counted nothing are left out, and the family too when none did.
fn by_result(
    o: &mut String,
    gen: &Generation,
    (family, help): (&str, &str),
    results: &[&str],
    counts: impl Fn(&Meter) -> &[AtomicU64],
) {
    let mut headed = false;
    for m in gen.meters() {
        let counts = counts(m.meter);
        if counts.iter().all(|c| get(c) == 0) {
            continue;
        }
        if !headed {
            head(o, family, "counter", help);
            headed = true;
        }
        for (count, name) in counts.iter().zip(results) {
            let _ = writeln!(
                o,
                "{family}{{site=\"{}\",route=\"{}\",result=\"{name}\"}} {}",
                esc(m.site),
                esc(m.route),
                get(count)
            );
        }
    }
}

/// Cache lookups by result, and each store's size and object count.
fn cache(o: &mut String, gen: &Generation) {
    if gen.kept.stores.is_empty() {
        return;
    }
    head(
        o,
        "sluice_cache_requests_total",
        "counter",
        "requests on cache routes, by what the cache did",
    );
    // By route: a route's meter counts what its cache did (a route without a cache
    // counts nothing here, and is left out).
    for m in gen.meters() {
        let counts = &m.meter.cache;
        if counts.iter().all(|c| get(c) == 0) {
            continue;
        }
        for (outcome, name) in crate::cache::Outcome::ALL {
            let _ = writeln!(
                o,
                "sluice_cache_requests_total{{site=\"{}\",route=\"{}\",result=\"{name}\"}} {}",
                esc(m.site),
                esc(m.route),
                get(&counts[outcome as usize])
            );
        }
    }
    let stores = super::status::cache_stores(gen);
    head(
        o,
        "sluice_cache_bytes",
        "gauge",
        "bytes a cache store holds",
    );
    for st in &stores {
        let _ = writeln!(
            o,
            "sluice_cache_bytes{{store=\"{}\"}} {}",
            esc(&st.identity),
            st.bytes()
        );
    }
    head(
        o,
        "sluice_cache_objects",
        "gauge",
        "responses a cache store holds (variants count)",
    );
    for st in &stores {
        let _ = writeln!(
            o,
            "sluice_cache_objects{{store=\"{}\"}} {}",
            esc(&st.identity),
            st.objects()
        );
    }
}

/// Each site certificate's `notAfter`, as the files are now.
fn certificates(o: &mut String, gen: &Generation) {
    let Some(tls) = &gen.tls else { return };
    head(
        o,
        "sluice_tls_certificate_expiry_seconds",
        "gauge",
        "Unix time the site's certificate expires (notAfter)",
    );
    for slot in &tls.certs.slots {
        if let Some(t) = slot.not_after() {
            let secs = t
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let _ = writeln!(
                o,
                "sluice_tls_certificate_expiry_seconds{{site=\"{}\"}} {secs}",
                esc(&slot.site)
            );
        }
    }
    let stapled: Vec<_> = tls
        .certs
        .slots
        .iter()
        .filter_map(|s| Some((s, s.stapler.expiry()?)))
        .collect();
    if stapled.is_empty() {
        return;
    }
    head(
        o,
        "sluice_tls_ocsp_staple_expiry_seconds",
        "gauge",
        "Unix time the site's OCSP staple stops being valid (nextUpdate)",
    );
    for (slot, t) in stapled {
        let secs = t
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let _ = writeln!(
            o,
            "sluice_tls_ocsp_staple_expiry_seconds{{site=\"{}\"}} {secs}",
            esc(&slot.site)
        );
    }
}

/// Responses by status.
fn responses(o: &mut String) {
    head(
        o,
        "sluice_requests_total",
        "counter",
        "responses by status, sluice's own and proxied",
    );
    for (code, c) in STATUS.iter().enumerate() {
        let n = c.load(Ordering::Relaxed);
        if n > 0 {
            let _ = writeln!(o, "sluice_requests_total{{status=\"{code}\"}} {n}");
        }
    }
}

/// Per peer: health, load, selections, probes, failures.
fn peers(o: &mut String, pools: &[&Arc<Pool>]) {
    let per_peer = |o: &mut String,
                    name: &str,
                    kind: &str,
                    help: &str,
                    f: &dyn Fn(&crate::upstream::Peer) -> u64| {
        head(o, name, kind, help);
        for p in pools {
            for peer in p.peers() {
                let _ = writeln!(o, "{name}{{{}}} {}", labels(p, peer), f(peer));
            }
        }
    };
    let now = crate::clock::now_ms();
    per_peer(
        o,
        "sluice_peer_healthy",
        "gauge",
        "1 when the peer is eligible for requests",
        &|p| u64::from(p.is_eligible(now)),
    );
    per_peer(
        o,
        "sluice_peer_in_flight",
        "gauge",
        "requests in flight on the peer",
        &|p| u64::from(p.in_flight.load(Ordering::Relaxed)),
    );
    per_peer(
        o,
        "sluice_peer_h2_connections",
        "gauge",
        "HTTP/2 connections open to the peer (h2c:// and https:// peers that chose h2)",
        &|p| p.h2_sessions() as u64,
    );
    per_peer(
        o,
        "sluice_peer_selections_total",
        "counter",
        "times the peer was chosen",
        &|p| get(&p.selections),
    );
    per_peer(
        o,
        "sluice_peer_health_transitions_total",
        "counter",
        "health check verdict changes",
        &|p| get(&p.active.transitions),
    );
    per_peer(
        o,
        "sluice_peer_ejections_total",
        "counter",
        "outlier ejections",
        &|p| get(&p.outlier.total),
    );
    peer_outcomes(o, pools);
}

/// Per peer: probes by result, failures by kind.
fn peer_outcomes(o: &mut String, pools: &[&Arc<Pool>]) {
    head(
        o,
        "sluice_peer_probes_total",
        "counter",
        "health probes by result",
    );
    for p in pools {
        for peer in p.peers() {
            let l = labels(p, peer);
            let _ = writeln!(
                o,
                "sluice_peer_probes_total{{{l},result=\"pass\"}} {}",
                get(&peer.active.probes_passed)
            );
            let _ = writeln!(
                o,
                "sluice_peer_probes_total{{{l},result=\"fail\"}} {}",
                get(&peer.active.probes_failed)
            );
        }
    }
    head(
        o,
        "sluice_peer_failures_total",
        "counter",
        "failures counted against the peer, by kind",
    );
    for p in pools {
        for peer in p.peers() {
            let l = labels(p, peer);
            for kind in [
                FailureKind::Dns,
                FailureKind::Connect,
                FailureKind::Broken,
                FailureKind::Invalid,
                FailureKind::Unsafe,
            ] {
                let n = get(&peer.failures_by_kind[kind as usize]);
                let _ = writeln!(
                    o,
                    "sluice_peer_failures_total{{{l},kind=\"{}\"}} {n}",
                    kind.as_str()
                );
            }
        }
    }
}

/// Per pool: failover switches, retries by reason, upstream latency.
fn pool_metrics(o: &mut String, pools: &[&Arc<Pool>]) {
    head(
        o,
        "sluice_failover_total",
        "counter",
        "switches between primary and backup",
    );
    for p in pools {
        let _ = writeln!(
            o,
            "sluice_failover_total{{pool=\"{}\"}} {}",
            esc(p.name()),
            get(&p.state.failover.switches)
        );
    }
    head(
        o,
        "sluice_retries_total",
        "counter",
        "requests sent to another backend, by reason",
    );
    for p in pools {
        for (i, reason) in ["unreachable", "reset", "timeout", "status"]
            .iter()
            .enumerate()
        {
            let _ = writeln!(
                o,
                "sluice_retries_total{{pool=\"{}\",reason=\"{reason}\"}} {}",
                esc(p.name()),
                get(&p.state.retries[i])
            );
        }
    }
    head(
        o,
        "sluice_upstream_stale_resends_total",
        "counter",
        "idempotent requests sent once more after a kept connection closed under them unanswered",
    );
    for p in pools {
        let _ = writeln!(
            o,
            "sluice_upstream_stale_resends_total{{pool=\"{}\"}} {}",
            esc(p.name()),
            get(&p.state.stale_resends)
        );
    }
    head(
        o,
        "sluice_upstream_seconds",
        "histogram",
        "from the request going out to the response head",
    );
    for p in pools {
        let labels = format!("pool=\"{}\"", esc(p.name()));
        histogram(
            o,
            "sluice_upstream_seconds",
            &labels,
            &p.state.upstream_seconds,
        );
    }
}

/// The process-wide counters of refusals and limits: name, counter, help.
static REFUSALS: &[(&str, &AtomicU64, &str)] = &[
    (
        "sluice_proxy_protocol_refusals_total",
        &COUNTERS.proxy_protocol_refusals,
        "connections a proxy_protocol listener closed: an untrusted peer, or no valid header",
    ),
    (
        "sluice_quic_connections_total",
        &COUNTERS.quic_connections,
        "QUIC connections that finished their handshake (HTTP/3)",
    ),
    (
        "sluice_h3_requests_total",
        &COUNTERS.h3_requests,
        "requests answered over HTTP/3",
    ),
    (
        "sluice_out_of_ports_total",
        &COUNTERS.out_of_ports,
        "dials refused for want of local ports or descriptors",
    ),
    (
        "sluice_fastcgi_spool_full_total",
        &COUNTERS.spool_full,
        "FastCGI requests refused 503 because their bodies would pass spool_max",
    ),
    (
        "sluice_limit_rejections_total",
        &COUNTERS.limit_rejections,
        "requests refused at a pool's limit",
    ),
    (
        "sluice_tls_handshake_failures_total",
        &COUNTERS.tls_handshake_failures,
        "client TLS handshakes that failed or timed out",
    ),
    (
        "sluice_access_denied_total",
        &COUNTERS.access_denied,
        "requests refused 403 by allow/deny",
    ),
    (
        "sluice_maintenance_answers_total",
        &COUNTERS.maintenance_answers,
        "requests answered by a site or route in maintenance",
    ),
    (
        "sluice_body_hold_refusals_total",
        &COUNTERS.body_hold_refusals,
        "requests refused 503: the budget of request bodies held for checking was spent",
    ),
    (
        "sluice_body_denied_total",
        &COUNTERS.body_denied,
        "requests refused 403 by body_deny",
    ),
    (
        "sluice_rate_limited_total",
        &COUNTERS.rate_limited,
        "requests refused 429 by rate_limit",
    ),
    (
        "sluice_unauthorized_total",
        &COUNTERS.unauthorized,
        "requests refused 401 by basic_auth",
    ),
    (
        "sluice_filter_failures_total",
        &COUNTERS.filter_failures,
        "filters that could not decide (their failure mode applied)",
    ),
];

/// Connections each listener's `allow`/`deny`/`rate_limit` closed at accept.
fn listeners(o: &mut String, gen: &Generation) {
    head(
        o,
        "sluice_connections_refused_total",
        "counter",
        "connections a listener's allow/deny (reason access) or rate_limit (reason rate) closed at accept",
    );
    for g in gen.conn_guards().filter(|g| !g.guards.is_empty()) {
        for (reason, n) in [("access", &g.refused.access), ("rate", &g.refused.rate)] {
            let _ = writeln!(
                o,
                "sluice_connections_refused_total{{listener=\"{}\",reason=\"{reason}\"}} {}",
                esc(&g.name),
                get(n)
            );
        }
    }
}

/// Process-wide counters: tunnels, refusals by reason, the access log.
fn counters(o: &mut String) {
    head(
        o,
        "sluice_tunnels_open",
        "gauge",
        "open upgraded connections",
    );
    let _ = writeln!(o, "sluice_tunnels_open {}", get(&crate::tunnel::OPEN));
    for &(name, c, help) in REFUSALS {
        head(o, name, "counter", help);
        let _ = writeln!(o, "{name} {}", get(c));
    }
    head(
        o,
        "sluice_safety_refusals_total",
        "counter",
        "dials a strict pool refused, by why the address is unsafe",
    );
    for r in crate::safety::Reason::ALL {
        let n = get(&crate::safety::REFUSALS[r as usize]);
        let _ = writeln!(
            o,
            "sluice_safety_refusals_total{{reason=\"{}\"}} {n}",
            r.as_str()
        );
    }
    head(
        o,
        "sluice_access_log_dropped_total",
        "counter",
        "access log lines dropped because the writer fell behind",
    );
    let _ = writeln!(
        o,
        "sluice_access_log_dropped_total {}",
        get(&crate::access::DROPPED)
    );
}

/// Each FastCGI pool's connections: open (idle ones included), idle, requests waiting
/// for their first byte, and the cap.
fn fastcgi(o: &mut String, gen: &Generation) {
    // Pools of one name (a route pattern written twice) are summed: one series a name.
    let mut pools: Vec<(String, crate::fastcgi::pool::Counts)> = Vec::new();
    for f in gen.sites.fastcgi() {
        let (name, c) = (esc(&f.name), f.pool.counts());
        match pools.iter_mut().find(|(n, _)| *n == name) {
            Some((_, sum)) => {
                sum.open += c.open;
                sum.idle += c.idle;
                sum.waiting += c.waiting;
                sum.max_conns += c.max_conns;
            }
            None => pools.push((name, c)),
        }
    }
    if pools.is_empty() {
        return;
    }
    type Field = fn(&crate::fastcgi::pool::Counts) -> usize;
    let families: [(&str, &str, Field); 4] = [
        (
            "sluice_fastcgi_connections_open",
            "connections open or being opened, idle ones included",
            |c| c.open,
        ),
        (
            "sluice_fastcgi_connections_idle",
            "connections kept idle",
            |c| c.idle,
        ),
        (
            "sluice_fastcgi_requests_waiting",
            "requests sent and waiting for their first byte",
            |c| c.waiting,
        ),
        ("sluice_fastcgi_max_conns", "the pool's max_conns", |c| {
            c.max_conns
        }),
    ];
    for (name, help, f) in families {
        head(o, name, "gauge", help);
        for (pool, c) in &pools {
            let _ = writeln!(o, "{name}{{pool=\"{pool}\"}} {}", f(c));
        }
    }
}

/// One histogram's series: cumulative buckets, the sum in seconds and the count.
fn histogram(o: &mut String, name: &str, labels: &str, h: &Histogram) {
    let mut cumulative = 0;
    for (i, bound) in LATENCY_BOUNDS.iter().enumerate() {
        cumulative += get(&h.buckets[i]);
        let _ = writeln!(o, "{name}_bucket{{{labels},le=\"{bound}\"}} {cumulative}");
    }
    cumulative += get(&h.buckets[LATENCY_BOUNDS.len()]);
    let _ = writeln!(o, "{name}_bucket{{{labels},le=\"+Inf\"}} {cumulative}");
    let _ = writeln!(o, "{name}_sum{{{labels}}} {}", get(&h.sum_us) as f64 / 1e6);
    // The count is the `+Inf` bucket's, read once: an observation landing between the
    // reads cannot make them disagree.
    let _ = writeln!(o, "{name}_count{{{labels}}} {cumulative}");
}

/// 4xx and 5xx responses by code, per site and route (series that counted only).
fn by_code(o: &mut String, meters: &[(String, &Meter)]) {
    head(
        o,
        "sluice_http_responses_by_code_total",
        "counter",
        "4xx and 5xx responses by site, route and code (code=\"other\" for the rest)",
    );
    for (l, m) in meters {
        for (i, c) in m.codes.iter().enumerate() {
            let n = get(c);
            if n == 0 {
                continue;
            }
            match crate::stats::CODES.get(i) {
                Some(code) => {
                    let _ = writeln!(
                        o,
                        "sluice_http_responses_by_code_total{{{l},code=\"{code}\"}} {n}"
                    );
                }
                None => {
                    let _ = writeln!(
                        o,
                        "sluice_http_responses_by_code_total{{{l},code=\"other\"}} {n}"
                    );
                }
            }
        }
    }
}

/// Per site and route (`route=""`: no route took it; `site=""`: no site did):
/// requests by status class, their time to the last byte, body bytes each way.
fn http(o: &mut String, gen: &Generation) {
    let meters: Vec<(String, &Meter)> = gen
        .meters()
        .map(|m| {
            let labels = format!("site=\"{}\",route=\"{}\"", esc(m.site), esc(m.route));
            (labels, &**m.meter)
        })
        .collect();
    if meters.is_empty() {
        return;
    }
    head(
        o,
        "sluice_http_requests_total",
        "counter",
        "responses by site, route and status class",
    );
    for (l, m) in &meters {
        for (i, c) in m.classes.iter().enumerate() {
            let _ = writeln!(
                o,
                "sluice_http_requests_total{{{l},code=\"{}xx\"}} {}",
                i + 1,
                get(c)
            );
        }
    }
    by_code(o, &meters);
    head(
        o,
        "sluice_http_request_duration_seconds",
        "histogram",
        "from the request head read to the response's last byte",
    );
    for (l, m) in &meters {
        histogram(o, "sluice_http_request_duration_seconds", l, &m.duration);
    }
    for (name, help, f) in [
        (
            "sluice_http_request_bytes_total",
            "request body bytes received",
            (|m: &Meter| get(&m.request_bytes)) as fn(&Meter) -> u64,
        ),
        (
            "sluice_http_response_bytes_total",
            "response body bytes sent",
            |m: &Meter| get(&m.response_bytes),
        ),
    ] {
        head(o, name, "counter", help);
        for (l, m) in &meters {
            let _ = writeln!(o, "{name}{{{l}}} {}", f(m));
        }
    }
    grpc(o, &meters);
}

/// gRPC calls by site, route and the `grpc-status` they ended with (a status no call
/// ended with is not listed).
fn grpc(o: &mut String, meters: &[(String, &Meter)]) {
    let name = "sluice_grpc_requests_total";
    head(
        o,
        name,
        "counter",
        "gRPC calls by site, route and grpc-status",
    );
    for (l, m) in meters {
        for (code, c) in m.grpc.iter().enumerate() {
            let n = get(c);
            if n != 0 {
                let _ = writeln!(o, "{name}{{{l},grpc_status=\"{code}\"}} {n}");
            }
        }
    }
}

fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

fn head(o: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn labels(p: &Pool, peer: &crate::upstream::Peer) -> String {
    format!(
        "pool=\"{}\",peer=\"{}\",ordinal=\"{}\"",
        esc(p.name()),
        esc(&peer.addr.text),
        peer.ordinal
    )
}

/// A label value with `\`, `"` and line feeds escaped.
fn esc(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The process metrics Prometheus clients conventionally export, from /proc.
/// The build, the process's start, and config reloads.
fn build_and_reloads(o: &mut String) {
    head(
        o,
        "sluice_build_info",
        "gauge",
        "the running build (always 1)",
    );
    let _ = writeln!(
        o,
        "sluice_build_info{{version=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION")
    );
    if let Some(t) = crate::stats::STARTED.get() {
        head(
            o,
            "process_start_time_seconds",
            "gauge",
            "Unix time the process started",
        );
        let secs = t
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let _ = writeln!(o, "process_start_time_seconds {secs:.3}");
    }
    head(
        o,
        "sluice_config_reloads_total",
        "counter",
        "config reloads, by result (the first load is not one)",
    );
    for (result, c) in [
        ("ok", &COUNTERS.reloads_ok),
        ("rejected", &COUNTERS.reloads_rejected),
    ] {
        let _ = writeln!(
            o,
            "sluice_config_reloads_total{{result=\"{result}\"}} {}",
            get(c)
        );
    }
}

fn process(o: &mut String) {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
    let tick = 100.0; // USER_HZ on Linux
    let num = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    head(
        o,
        "process_cpu_seconds_total",
        "counter",
        "user and system CPU time",
    );
    let _ = writeln!(
        o,
        "process_cpu_seconds_total {}",
        (num(11) + num(12)) / tick
    );
    head(
        o,
        "process_resident_memory_bytes",
        "gauge",
        "resident set size",
    );
    let _ = writeln!(o, "process_resident_memory_bytes {}", num(21) * 4096.0);
    let fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
    head(o, "process_open_fds", "gauge", "open file descriptors");
    let _ = writeln!(o, "process_open_fds {fds}");
}
