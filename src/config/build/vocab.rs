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
    DnsUpdate,
    Fleet,
}

impl Place {
    /// The directives it knows. A block whose options have a table (`global`,
    /// `proxy`, `fastcgi`) knows the table's names: written once.
    pub(super) fn known(self) -> Vec<&'static str> {
        let words: &[&str] = match self {
            Place::Top => &["global", "listen", "site", "tcp", "import"],
            Place::Global => return super::GLOBAL_OPTIONS.iter().map(|(n, _)| *n).collect(),
            Place::Site => return with_filters(SITE_OWN),
            // A route takes what a site does but its certificate, routes and the
            // site-wide controls (maintenance it takes).
            Place::Route => return with_filters(&SITE_OWN[6..]),
            Place::Proxy => {
                return super::proxy::PROXY_OPTIONS
                    .iter()
                    .map(|(n, _)| *n)
                    .collect()
            }
            Place::FastCgi => {
                return super::route::FASTCGI_OPTIONS
                    .iter()
                    .map(|(n, _)| *n)
                    .collect()
            }
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
            Place::Fleet => &["name", "channel"],
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
                "dns_update",
            ],
            Place::DnsUpdate => &["zone", "key_name", "key_file", "algorithm"],
        };
        words.to_vec()
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
            Place::Fleet => "a `fleet` block",
            Place::Cache => "a `cache` block",
            Place::Acme => "an `acme` block",
            Place::DnsUpdate => "a `dns_update` block",
        }
    }
}

/// What a site block takes besides its filters (`filters::FILTERS`) and `on`; a
/// route takes it from `maintenance` on (index 6).
const SITE_OWN: &[&str] = &[
    "tls",
    "route",
    "https_redirect",
    "hsts",
    "http_versions",
    "access_log",
    "maintenance",
    "cache",
    "match",
    "error_page",
    "proxy",
    "fastcgi",
    "files",
    "redirect",
    "respond",
];

/// `words`, then every filter, then `on`.
fn with_filters(words: &[&'static str]) -> Vec<&'static str> {
    let filters = super::filters::FILTERS.iter();
    words
        .iter()
        .chain(filters)
        .chain(&["on"])
        .copied()
        .collect()
}

pub(super) const ALL_PLACES: [Place; 17] = [
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
    Place::DnsUpdate,
    Place::Fleet,
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
