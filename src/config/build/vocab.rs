//! The vocabulary: which directives each place in the file knows. A directive's place
//! is data here, so "does not belong in X, goes in Y" and "did you mean" come from one
//! table.

/// Where a directive may stand, and which directives each place knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Place {
    Top,
    Global,
    Site,
    Route,
    Proxy,
    FastCgi,
    Files,
    Tcp,
    Safety,
    Failover,
    Health,
    Outlier,
    Admin,
    Cache,
    Acme,
}

impl Place {
    pub(super) fn known(self) -> &'static [&'static str] {
        match self {
            Place::Top => &["global", "listen", "site", "tcp", "import"],
            Place::Global => &[
                "admin",
                "workers",
                "trust",
                "max_tunnels",
                "spool_max",
                "redis_timeout",
                "redis_ca",
                "tunnel_drain",
                "tunnel_idle",
                "grace",
                "access_log",
                "tracing",
                "server_tokens",
                "proxy_defaults",
                "retries",
                "probe_concurrency",
                "safety",
                "resolver",
                "verify_key",
                "pid_file",
                "acme",
            ],
            Place::Site => SITE,
            // A route takes what a site does but its certificate, routes and the
            // site-wide controls (maintenance it takes).
            Place::Route => &SITE[5..],
            Place::Proxy => PROXY,
            Place::FastCgi => &[
                "root",
                "suffix",
                "index",
                "fallback",
                "max_conns",
                "connect_timeout",
                "keepalive_timeout",
                "env",
                "max_body",
                "timeout",
            ],
            Place::Files => &["index", "browse", "fallback", "precompressed", "dotfiles"],
            Place::Tcp => &["proxy", "sni", "max_conns", "allow", "deny", "rate_limit"],
            Place::Safety => &["default", "allow_private", "block"],
            Place::Failover => &[
                "failure_threshold",
                "recovery_threshold",
                "hold_down",
                "failback_delay",
            ],
            Place::Health => &[
                "method", "interval", "timeout", "rise", "fall", "expect", "host", "initial",
            ],
            Place::Outlier => &["consecutive_5xx", "ejection", "max_ejected"],
            Place::Admin => &["token_file", "token"],
            Place::Cache => &[
                "store",
                "max_object",
                "key",
                "heuristic",
                "default_ttl",
                "stale_while_revalidate",
                "stale_if_error",
                "lock",
                "mode",
                "client_revalidate",
                "purge_store",
            ],
            Place::Acme => &[
                "directory",
                "email",
                "ca_root",
                "storage",
                "challenge",
                "renew_before",
            ],
        }
    }

    pub(super) fn label(self) -> &'static str {
        match self {
            Place::Top => "the top level",
            Place::Global => "a `global` block",
            Place::Site => "a `site` block",
            Place::Route => "a `route` block",
            Place::Proxy => "a `proxy` block",
            Place::FastCgi => "a `fastcgi` block",
            Place::Files => "a `files` block",
            Place::Tcp => "a `tcp` block",
            Place::Safety => "a `safety` block",
            Place::Failover => "a `failover` block",
            Place::Health => "a `health` block",
            Place::Outlier => "an `outlier` block",
            Place::Admin => "an `admin` block",
            Place::Cache => "a `cache` block",
            Place::Acme => "an `acme` block",
        }
    }
}

/// A `proxy` block's options.
const PROXY: &[&str] = &[
    "lb",
    "weights",
    "backup",
    "failover",
    "health",
    "fail_duration",
    "breaker",
    "all_down",
    "host",
    "header_up",
    "header_down",
    "timeout",
    "connect_timeout",
    "limit",
    "max_body",
    "retries",
    "retry_on",
    "retry_buffer",
    "retry_budget",
    "slow_start",
    "outlier",
    "safety",
    "keepalive",
    "tls_verify",
    "tls_server_name",
    "tls_ca",
    "compress",
    "origin_headers",
    "websocket",
    "upgrade",
    "proxy_protocol",
];

/// A site block takes everything a route does, plus `tls` and `route`.
pub(super) const SITE: &[&str] = &[
    "tls",
    "route",
    "https_redirect",
    "hsts",
    "http_versions",
    "maintenance",
    "cache",
    "match",
    "error_page",
    "proxy",
    "fastcgi",
    "files",
    "redirect",
    "respond",
    "strip",
    "rewrite",
    "header_down",
    "request_id",
    "grpc_web",
    "rate_limit",
    "allow",
    "deny",
    "basic_auth",
    "body_deny",
    "forward_auth",
    "compress",
    "max_body",
    "cors",
    "on",
];

pub(super) const ALL_PLACES: [Place; 15] = [
    Place::Top,
    Place::Global,
    Place::Site,
    Place::Route,
    Place::Proxy,
    Place::FastCgi,
    Place::Files,
    Place::Tcp,
    Place::Safety,
    Place::Failover,
    Place::Health,
    Place::Outlier,
    Place::Admin,
    Place::Cache,
    Place::Acme,
];

/// Directives sluice knows but cannot run yet, with what to do meanwhile: refused at
/// load ("not supported yet"), never ignored. A directive leaves this list when its
/// runtime lands.
pub(super) const NOT_YET: &[(Place, &str, &str)] = &[];

/// What to do instead, when `name` in `place` is known but not built yet. A route
/// takes what a site block does.
pub(super) fn not_yet(place: Place, name: &str) -> Option<&'static str> {
    let place = if place == Place::Route {
        Place::Site
    } else {
        place
    };
    NOT_YET
        .iter()
        .find(|(p, n, _)| *p == place && *n == name)
        .map(|(_, _, hint)| *hint)
}
