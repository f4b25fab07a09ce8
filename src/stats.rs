//! Process-wide counters for refusals and limits: plain atomics, never a lock, so the
//! request path can count without contention. The metrics endpoint reads them.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Default)]
pub(crate) struct Counters {
    /// 400 for a malformed request head or body framing.
    pub bad_request: AtomicU64,
    /// 408: a head not complete within its deadline.
    pub head_timeout: AtomicU64,
    /// 431: a head over 64 KiB or 100 fields.
    pub head_too_large: AtomicU64,
    /// 501: a transfer coding other than a single `chunked`.
    pub unsupported_coding: AtomicU64,
    /// 421: no site for the Host.
    pub unknown_site: AtomicU64,
    /// 404: no route in the site.
    pub no_route: AtomicU64,
    /// 413: a body over `max_body`.
    pub body_too_large: AtomicU64,
    /// 503: a FastCGI request body would pass `spool_max`.
    pub spool_full: AtomicU64,
    /// 503: a pool's `limit` reached and the wait ran out.
    pub limit_rejections: AtomicU64,
    /// 503: dialing failed for want of local ports or descriptors.
    pub out_of_ports: AtomicU64,
    /// 502: no backend could be reached or a connection broke.
    pub bad_gateway: AtomicU64,
    /// 504: a backend did not answer within `timeout`.
    pub gateway_timeout: AtomicU64,
    /// Requests sent to another backend after the first could not be reached.
    pub retries: AtomicU64,
    /// Client TLS handshakes that failed or ran past their deadline.
    pub tls_handshake_failures: AtomicU64,
    /// 403 from `allow`/`deny`.
    pub access_denied: AtomicU64,
    /// 403 from `body_deny`.
    pub body_denied: AtomicU64,
    /// Answers of a site or route in maintenance.
    pub maintenance_answers: AtomicU64,
    /// 503: the process-wide budget of held request bodies was spent.
    pub body_hold_refusals: AtomicU64,
    /// 429 from `rate_limit`.
    pub rate_limited: AtomicU64,
    /// 401 from `basic_auth`.
    pub unauthorized: AtomicU64,
    /// 500: a filter could not decide and fails closed.
    pub filter_failures: AtomicU64,
    /// Cache lookups by result (`sluice_cache_requests_total`).
    pub cache: [AtomicU64; 6],
    /// ACME orders by result (`sluice_acme_orders_total`): ok, error.
    pub acme_orders: [AtomicU64; 2],
    /// Connections a `proxy_protocol` listener closed: an untrusted peer, or no valid
    /// header in time.
    pub proxy_protocol_refusals: AtomicU64,
    /// QUIC connections that finished their handshake, and the HTTP/3 requests they
    /// carried.
    pub quic_connections: AtomicU64,
    pub h3_requests: AtomicU64,
    /// Reloads that went live, and reloads refused (the first load is not one).
    pub reloads_ok: AtomicU64,
    pub reloads_rejected: AtomicU64,
}

/// When this process started serving (`process_start_time_seconds`, `/status`).
pub(crate) static STARTED: std::sync::OnceLock<std::time::SystemTime> = std::sync::OnceLock::new();

pub(crate) static COUNTERS: Counters = Counters {
    proxy_protocol_refusals: AtomicU64::new(0),
    quic_connections: AtomicU64::new(0),
    h3_requests: AtomicU64::new(0),
    reloads_ok: AtomicU64::new(0),
    reloads_rejected: AtomicU64::new(0),
    bad_request: AtomicU64::new(0),
    head_timeout: AtomicU64::new(0),
    head_too_large: AtomicU64::new(0),
    unsupported_coding: AtomicU64::new(0),
    unknown_site: AtomicU64::new(0),
    no_route: AtomicU64::new(0),
    body_too_large: AtomicU64::new(0),
    spool_full: AtomicU64::new(0),
    limit_rejections: AtomicU64::new(0),
    out_of_ports: AtomicU64::new(0),
    bad_gateway: AtomicU64::new(0),
    gateway_timeout: AtomicU64::new(0),
    retries: AtomicU64::new(0),
    tls_handshake_failures: AtomicU64::new(0),
    access_denied: AtomicU64::new(0),
    body_denied: AtomicU64::new(0),
    maintenance_answers: AtomicU64::new(0),
    body_hold_refusals: AtomicU64::new(0),
    rate_limited: AtomicU64::new(0),
    unauthorized: AtomicU64::new(0),
    filter_failures: AtomicU64::new(0),
    cache: [const { AtomicU64::new(0) }; 6],
    acme_orders: [const { AtomicU64::new(0) }; 2],
};

pub(crate) fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// Responses by status code (100..=599), sluice's own and proxied alike.
pub(crate) static STATUS: [AtomicU64; 600] = [const { AtomicU64::new(0) }; 600];

/// Counts a response with `status`.
pub(crate) fn count_status(status: u16) {
    if let Some(c) = STATUS.get(usize::from(status)) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// Upper bounds of the latency histograms, in seconds: fine below 10 ms, where a proxy's
/// own answers and a near backend's fall, so p50 and p99 read from them mean something.
pub(crate) const LATENCY_BOUNDS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// A latency histogram of atomics (Prometheus buckets are cumulative when printed).
pub(crate) struct Histogram {
    /// Observations per bucket, the last one for "over every bound".
    pub buckets: [AtomicU64; LATENCY_BOUNDS.len() + 1],
    pub sum_us: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram::new()
    }
}

impl Histogram {
    pub(crate) const fn new() -> Histogram {
        Histogram {
            buckets: [const { AtomicU64::new(0) }; LATENCY_BOUNDS.len() + 1],
            sum_us: AtomicU64::new(0),
        }
    }

    pub(crate) fn observe(&self, d: std::time::Duration) {
        let secs = d.as_secs_f64();
        let i = LATENCY_BOUNDS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(LATENCY_BOUNDS.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }
}

/// One site's or route's requests (`sluice_http_*`): counts by status class, the time
/// to the response's last byte, and body bytes each way. Kept by the route (or site)
/// it counts and carried across reloads by its labels; made only while the admin API
/// is on, so a proxy without metrics pays nothing for them.
pub(crate) struct Meter {
    /// `1xx` to `5xx`.
    pub classes: [AtomicU64; 5],
    pub duration: Histogram,
    pub request_bytes: AtomicU64,
    pub response_bytes: AtomicU64,
    /// gRPC calls by the `grpc-status` they ended with (DESIGN §18.5).
    pub grpc: [AtomicU64; 17],
    /// 4xx and 5xx answers by code ([`CODES`], then any other).
    pub codes: [AtomicU64; CODES.len() + 1],
    /// A cache route's requests by what the cache did (`cache::Outcome`).
    pub cache: [AtomicU64; 6],
    /// `jwt` filters' results (`filter::jwt::RESULTS`).
    pub jwt: [AtomicU64; 11],
    /// `challenge` filters' results (`filter::challenge::RESULTS`).
    pub challenge: [AtomicU64; 4],
}

/// The 4xx and 5xx codes counted apart: the ones an operator tells apart (a login
/// wall, a missing page, a rate limit, maintenance, a backend down or slow).
pub(crate) const CODES: [u16; 15] = [
    400, 401, 403, 404, 405, 408, 413, 429, 431, 499, 500, 501, 502, 503, 504,
];

impl Default for Meter {
    fn default() -> Self {
        Meter::new()
    }
}

impl Meter {
    pub(crate) const fn new() -> Meter {
        Meter {
            classes: [const { AtomicU64::new(0) }; 5],
            duration: Histogram::new(),
            request_bytes: AtomicU64::new(0),
            response_bytes: AtomicU64::new(0),
            grpc: [const { AtomicU64::new(0) }; 17],
            codes: [const { AtomicU64::new(0) }; CODES.len() + 1],
            cache: [const { AtomicU64::new(0) }; 6],
            jwt: [const { AtomicU64::new(0) }; 11],
            challenge: [const { AtomicU64::new(0) }; 4],
        }
    }

    /// A response that is done: its status, how long since its request was read, and
    /// the body bytes that came in and went out.
    pub(crate) fn record(&self, status: u16, took: std::time::Duration, req: u64, resp: u64) {
        let class = usize::from(status / 100).clamp(1, 5) - 1;
        self.classes[class].fetch_add(1, Ordering::Relaxed);
        if status >= 400 {
            let i = CODES
                .iter()
                .position(|&c| c == status)
                .unwrap_or(CODES.len());
            self.codes[i].fetch_add(1, Ordering::Relaxed);
        }
        self.duration.observe(took);
        if req != 0 {
            self.request_bytes.fetch_add(req, Ordering::Relaxed);
        }
        if resp != 0 {
            self.response_bytes.fetch_add(resp, Ordering::Relaxed);
        }
    }
}

/// Answers given before a site was found (an unknown or invalid `Host`): the meter
/// with `site=""` and `route=""`.
pub(crate) static UNROUTED: std::sync::LazyLock<std::sync::Arc<Meter>> =
    std::sync::LazyLock::new(Default::default);
