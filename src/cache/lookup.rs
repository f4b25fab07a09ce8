//! A cache's lookup: the key of the request as it is forwarded (scheme, host, target
//! and the `key` parts), the stored variant it selects (`Vary`), and the verdict on it.

use super::*;

impl Cache {
    /// The target a key holds: the path and query as the backend receives them (the
    /// query left out when the key does not list it).
    pub(super) fn target<'u>(&self, uri: &'u http::Uri) -> &'u str {
        match uri.path_and_query() {
            Some(pq) if self.settings.keys_query => pq.as_str(),
            Some(pq) => pq.path(),
            None => "/",
        }
    }

    /// The key of a request: the route's namespace, a newline, then
    /// `GET https app.test:8443 /x?a=1` and a ` name=value` per header of the config's
    /// `key` (` cookie:name=value` per cookie; values percent-encoded, a bare ` name`
    /// when the request lacks it).
    pub(super) fn key(&self, scheme: &str, host: &str, target: &str, h: &HeaderMap) -> String {
        let mut k = self.base_key(scheme, host, target);
        for part in self.settings.key.iter() {
            let value = match part {
                CacheKeyPart::Header(name) => {
                    k.push(' ');
                    k.push_str(name.as_str());
                    joined(h, name.as_str())
                }
                CacheKeyPart::Cookie(name) => {
                    k.push_str(" cookie:");
                    k.push_str(name);
                    cookie(h, name).map(|v| encode(v.as_bytes()))
                }
                _ => continue,
            };
            if let Some(v) = value {
                k.push('=');
                k.push_str(&v);
            }
        }
        k
    }

    /// The key's method, scheme, host and target (what a purge by key names). Only
    /// `GET` responses are stored (a `HEAD` is answered from them).
    pub(super) fn base_key(&self, scheme: &str, host: &str, target: &str) -> String {
        let ns = &self.settings.namespace;
        let mut k = String::with_capacity(ns.len() + host.len() + target.len() + 16);
        for part in [ns, "\nGET ", scheme, " ", host, " ", target] {
            k.push_str(part);
        }
        k
    }

    /// Whether keys have parts past the base (header or cookie values).
    pub(super) fn keys_have_fields(&self) -> bool {
        self.settings
            .key
            .iter()
            .any(|p| matches!(p, CacheKeyPart::Header(_) | CacheKeyPart::Cookie(_)))
    }

    /// The variant stored under `key` that the request's fields select, or why there is
    /// none (`uri-miss`: nothing for the URI; `vary-miss`: no variant for these fields;
    /// `miss`: one that may not answer a request with `Authorization`).
    pub(super) fn find(
        &self,
        key: &str,
        h: &HeaderMap,
        credentialed: bool,
    ) -> (Option<Arc<Stored>>, &'static str) {
        let Some(variants) = self.store.get(key) else {
            return (None, "uri-miss");
        };
        // The newest that matches: after the origin drops a `Vary`, an older variant
        // must not shadow the response stored since.
        let newest = variants
            .into_iter()
            .filter(|v| selects(v, h))
            .max_by_key(|v| v.response_time);
        let Some(obj) = newest else {
            return (None, "vary-miss");
        };
        if credentialed && !control::shareable_with_authorization(&obj.dirs) {
            return (None, "miss");
        }
        (Some(obj), "")
    }
}

/// How a stored response may answer this request now (RFC 9111 §4.2, §5.2.1).
pub(super) fn verdict(obj: &Stored, rdirs: &RequestDirectives, now: SystemTime) -> Verdict {
    let age = obj.age(now).as_secs();
    if rdirs.no_cache {
        return Verdict::Revalidate(true);
    }
    if let Some(limit) = rdirs.max_age {
        let limit = limit.secs();
        if limit == 0 || age > limit {
            return Verdict::Revalidate(true);
        }
    }
    if obj.dirs.no_cache {
        return Verdict::Revalidate(false);
    }
    if obj.is_fresh(now) {
        let left = obj.lifetime.as_secs().saturating_sub(age);
        if rdirs.min_fresh.is_some_and(|m| left < m.secs()) {
            return Verdict::Revalidate(true);
        }
        return Verdict::Fresh;
    }
    if obj.dirs.never_stale() {
        return Verdict::Revalidate(false);
    }
    let stale = obj.staleness(now);
    if let Some(limit) = rdirs.max_stale.filter(|_| obj.dirs.s_maxage.is_none()) {
        if limit.is_none_or(|m| stale.as_secs() <= m) {
            return Verdict::StaleAccepted;
        }
    }
    if !obj.swr.is_zero() && stale <= obj.swr {
        return Verdict::StaleWhileRevalidate;
    }
    Verdict::Revalidate(false)
}

/// Whether a stored variant's `Vary` values are the request's.
pub(super) fn selects(obj: &Stored, h: &HeaderMap) -> bool {
    obj.vary
        .iter()
        .all(|(name, value)| joined(h, name).as_deref() == value.as_deref())
}

/// A field's lines as one value, each item trimmed (`a, b` and `a,b` agree), bytes
/// outside printable ASCII (and `%`, space, `=`) percent-encoded so that no two
/// values read alike; `None` when the request lacks it.
pub(super) fn joined(h: &HeaderMap, name: &str) -> Option<String> {
    let mut out: Option<String> = None;
    for v in h.get_all(name) {
        for item in v.as_bytes().split(|&b| b == b',') {
            let s = out.get_or_insert_with(String::new);
            if !s.is_empty() {
                s.push(',');
            }
            s.push_str(&encode(item.trim_ascii()));
        }
    }
    out
}

/// Percent-encodes what could make two values, or a value and a separator, alike.
pub(super) fn encode(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len());
    for &b in bytes {
        if b.is_ascii_graphic() && !matches!(b, b'%' | b'=' | b',') {
            s.push(b as char);
        } else {
            let _ = write!(s, "%{b:02X}");
        }
    }
    s
}

/// One cookie's value from the request's `Cookie` lines.
pub(super) fn cookie<'h>(h: &'h HeaderMap, name: &str) -> Option<&'h str> {
    h.get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v)
}

/// The path and query of a `Location` / `Content-Location` on `host` (relative, or
/// absolute naming the same host).
/// The target a `Location` or `Content-Location` names, when it is on `host` (a
/// relative reference always is).
pub(super) fn same_host(v: &HeaderValue, host: &str) -> Option<http::Uri> {
    let uri: http::Uri = v.to_str().ok()?.parse().ok()?;
    if let Some(h) = uri.host() {
        let name = host.rsplit_once(':').map_or(host, |(n, _)| n);
        if !h.eq_ignore_ascii_case(name) && !h.eq_ignore_ascii_case(host) {
            return None;
        }
    }
    uri.path().starts_with('/').then_some(uri)
}

/// The `Host` as a key holds it (DESIGN §18.1): the name in lower case without one
/// trailing dot, the port as sent.
pub(super) fn key_host(host: &str) -> String {
    let split = match host.strip_prefix('[') {
        Some(rest) => rest.find(']').map(|i| i + 2),
        None => host.find(':'),
    };
    let (name, port) = host.split_at(split.unwrap_or(host.len()));
    let name = name.strip_suffix('.').unwrap_or(name);
    let mut k = String::with_capacity(host.len());
    k.push_str(name);
    k.make_ascii_lowercase();
    k.push_str(port);
    k
}
