//! What the backend receives and what the client gets back (DESIGN.md §8.9).
//!
//! Request: hop-by-hop fields and every field named in `Connection` go (`TE: trailers`
//! stays), `X-Sluice-*` goes, forwarding fields from untrusted clients go; then
//! `X-Forwarded-For/Proto/Host` are set, `Host` per the `host` option, and `header_up`
//! lines last. Response: hop-by-hop and `X-Sluice-*` go, then `header_down`.
//! Allocates only when a field must be built (the client address, a joined XFF).

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use crate::config::template::{apply_all, Values};
use crate::config::{HostMode, ProxyConfig};

/// `Trailer` is not among them: it announces the trailers, which pass end to end
/// (RFC 9110 §6.6.2; Go's HTTP/2 server keeps only the request trailers it announces).
static HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::EXPECT,
];

/// Where `k` is in [`HOP_BY_HOP`]: one `match` on the name (its length first) rather
/// than eight comparisons a field.
fn hop_by_hop(k: &HeaderName) -> Option<usize> {
    Some(match k.as_str() {
        "connection" => 0,
        "keep-alive" => 1,
        "proxy-connection" => 2,
        "transfer-encoding" => 3,
        "upgrade" => 4,
        "proxy-authenticate" => 5,
        "proxy-authorization" => 6,
        "expect" => 7,
        _ => return None,
    })
}

/// Fields that carry a client's address or override the URL, dropped from a client
/// outside `trust`: the forwarding fields, the other client-address and scheme
/// spellings some frameworks believe, and the URL overrides some servers route by.
const FORWARDING: [&[u8]; 18] = [
    b"x-forwarded-for",
    b"x-forwarded-proto",
    b"x-forwarded-host",
    b"x-forwarded-port",
    b"x-forwarded-prefix",
    b"x-forwarded-scheme",
    b"x-forwarded-ssl",
    b"x-original-forwarded-for",
    b"front-end-https",
    b"forwarded",
    b"x-real-ip",
    b"true-client-ip",
    b"cf-connecting-ip",
    b"client-ip",
    b"x-client-ip",
    b"x-cluster-client-ip",
    b"x-original-url",
    b"x-rewrite-url",
];

/// Whether `k` is one of [`FORWARDING`], reading `_` as `-` (CGI-style servers and
/// some frameworks fold the two, so `X_Forwarded_For` would pass as the real thing).
fn is_forwarding(k: &HeaderName) -> bool {
    let k = k.as_str().as_bytes();
    // Every name of the list starts with one of these: most fields stop here.
    matches!(k.first(), Some(b'x' | b'f' | b't' | b'c'))
        && (9..=24).contains(&k.len())
        && FORWARDING.iter().any(|n| same_field(k, n))
}

/// Whether the lower-case name `k` spells `name` with `_` for any `-`.
fn same_field(k: &[u8], name: &[u8]) -> bool {
    k.len() == name.len()
        && k.iter()
            .zip(name)
            .all(|(&a, &b)| a == b || (a == b'_' && b == b'-'))
}

/// Whether `k` spells `name` with a `_` for a `-`: not the field itself, but one a
/// backend that folds the two (CGI, WSGI, some frameworks) would take for it.
fn underscore_spelling(k: &HeaderName, name: &HeaderName) -> bool {
    k != name && same_field(k.as_str().as_bytes(), name.as_str().as_bytes())
}

/// Removes the client's fields that spell `name` with `_` for `-` (DESIGN §18.2),
/// before sluice sets or removes `name` itself: `Remote_User` must not pass beside
/// the `Remote-User` sluice sets. A name without `-` has no such spelling, and a
/// head without one pays a scan of its names, no allocation.
pub(crate) fn remove_spellings(h: &mut HeaderMap, name: &HeaderName) {
    if !name.as_str().contains('-') || !h.keys().any(|k| underscore_spelling(k, name)) {
        return;
    }
    let doomed: Vec<HeaderName> = h
        .keys()
        .filter(|k| underscore_spelling(k, name))
        .cloned()
        .collect();
    for k in doomed {
        h.remove(k);
    }
}

const XFF: HeaderName = HeaderName::from_static("x-forwarded-for");
const XFP: HeaderName = HeaderName::from_static("x-forwarded-proto");
const XFH: HeaderName = HeaderName::from_static("x-forwarded-host");

/// Removes hop-by-hop fields, those named in `Connection`, `X-Sluice-*`, (for an
/// untrusted client) the forwarding fields in any spelling, (for a trusted one) the
/// `_` spellings of those sluice sets, and (a backend's answer) `X-Powered-By`. One
/// pass over the names finds what is present; only those are removed, so a clean head
/// costs no hash lookup at all.
fn scrub(h: &mut HeaderMap, keep_te_trailers: bool, drop_forwarding: bool, answer: bool) {
    const TE_BIT: u32 = 1 << 31;
    let mut present: u32 = 0;
    let mut extra = false;
    for k in h.keys() {
        if let Some(i) = hop_by_hop(k) {
            present |= 1 << i;
        } else if k == header::TE {
            present |= TE_BIT;
        } else {
            extra |= is_sluice(k)
                || (drop_forwarding && is_forwarding(k))
                || (!answer && !drop_forwarding && sets_spelling(k))
                || (answer && is_powered_by(k));
        }
    }
    if present == 0 && !extra {
        return;
    }
    if present & 1 != 0 {
        // The tokens of every Connection field (not only the first) name more fields
        // to drop (`close`, `keep-alive` are options, and Keep-Alive is dropped anyway).
        let named: Vec<HeaderName> = h
            .get_all(header::CONNECTION)
            .iter()
            .flat_map(|v| v.as_bytes().split(|&b| b == b','))
            .map(<[u8]>::trim_ascii)
            .filter(|t| {
                !t.is_empty()
                    && !t.eq_ignore_ascii_case(b"close")
                    && !t.eq_ignore_ascii_case(b"keep-alive")
            })
            .filter_map(|t| HeaderName::from_bytes(t).ok())
            .collect();
        h.remove(header::CONNECTION);
        for n in named {
            h.remove(n);
        }
    }
    for (i, n) in HOP_BY_HOP.iter().enumerate().skip(1) {
        if present & (1 << i) != 0 {
            h.remove(n);
        }
    }
    if present & TE_BIT != 0 {
        crate::http1::head::normalise_te(h, keep_te_trailers);
    }
    if extra {
        // Rare: only a head that carries such fields pays for this pass.
        let ours: Vec<HeaderName> = h
            .keys()
            .filter(|k| {
                is_sluice(k)
                    || (drop_forwarding && is_forwarding(k))
                    || (!answer && !drop_forwarding && sets_spelling(k))
                    || (answer && is_powered_by(k))
            })
            .cloned()
            .collect();
        for n in ours {
            h.remove(n);
        }
    }
}

/// `X-Sluice-*` in any spelling.
fn is_sluice(k: &HeaderName) -> bool {
    crate::http1::names::is_sluice(k.as_str().as_bytes())
}

/// A `_` spelling of a forwarding field sluice sets for a trusted client too.
fn sets_spelling(k: &HeaderName) -> bool {
    [XFF, XFP, XFH].iter().any(|n| underscore_spelling(k, n))
}

/// A backend's `X-Powered-By` tells the world its stack and version: dropped
/// (`header_down` may set one again). Its `Server` passes unchanged.
fn is_powered_by(k: &HeaderName) -> bool {
    k.as_str() == "x-powered-by"
}

/// Everything but `Host` in upstream mode, which depends on the peer chosen.
/// `client_ip` is the client's address as a header value, rendered once per connection;
/// `scheme` is the connection's (`http` or `https`).
pub(crate) fn request(
    h: &mut HeaderMap,
    client_ip: &HeaderValue,
    scheme: &HeaderValue,
    trusted: bool,
    cfg: &ProxyConfig,
) {
    let original_host = h.get(header::HOST).cloned();
    scrub(h, true, !trusted, false);
    if trusted {
        trusted_forwarding(h, client_ip, scheme, original_host);
    } else {
        // An untrusted client's forwarding fields are gone now: nothing to look up.
        h.append(XFF, client_ip.clone());
        h.append(XFP, scheme.clone());
        if let Some(host) = original_host {
            h.append(XFH, host);
        }
    }
    if let HostMode::Name(v) = &cfg.host {
        h.insert(header::HOST, v.clone());
    }
}

/// A trusted client's forwarding fields: the client joins its `X-Forwarded-For`
/// chain; its `X-Forwarded-Proto` and `X-Forwarded-Host` stand.
fn trusted_forwarding(
    h: &mut HeaderMap,
    client_ip: &HeaderValue,
    scheme: &HeaderValue,
    original_host: Option<HeaderValue>,
) {
    let xff = match h.get_all(&XFF).iter().count() {
        0 => Ok(client_ip.clone()),
        _ => {
            let mut joined = Vec::new();
            for v in h.get_all(&XFF) {
                if !joined.is_empty() {
                    joined.extend_from_slice(b", ");
                }
                joined.extend_from_slice(v.as_bytes());
            }
            joined.extend_from_slice(b", ");
            joined.extend_from_slice(client_ip.as_bytes());
            HeaderValue::from_bytes(&joined)
        }
    };
    if let Ok(v) = xff {
        h.insert(XFF, v);
    }
    if !h.contains_key(&XFP) {
        h.insert(XFP, scheme.clone());
    }
    if !h.contains_key(&XFH) {
        if let Some(host) = original_host {
            h.insert(XFH, host);
        }
    }
}

/// `Host` for upstream mode, then the `header_up` lines (which may override it).
pub(crate) fn finish_request(
    h: &mut HeaderMap,
    cfg: &ProxyConfig,
    peer_host: Option<&HeaderValue>,
    values: &Values<'_>,
) {
    if let (HostMode::Upstream, Some(v)) = (&cfg.host, peer_host) {
        h.insert(header::HOST, v.clone());
    }
    for op in cfg.header_up.iter() {
        remove_spellings(h, op.name());
    }
    apply_all(h, &cfg.header_up, values);
}

pub(crate) fn response(h: &mut HeaderMap, cfg: &ProxyConfig, values: &Values<'_>) {
    scrub(h, false, false, true);
    apply_all(h, &cfg.header_down, values);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ProxyConfig;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    /// The `match` and the table name the same fields at the same places (the table
    /// is what the removal walks).
    #[test]
    fn hop_by_hop_names_its_table() {
        for (i, n) in HOP_BY_HOP.iter().enumerate() {
            assert_eq!(hop_by_hop(n), Some(i), "{n}");
        }
        for other in [
            "te",
            "host",
            "x-forwarded-for",
            "connectio",
            "upgrades",
            "keep_alive",
        ] {
            let n = HeaderName::from_bytes(other.as_bytes()).unwrap();
            assert_eq!(hop_by_hop(&n), None, "{other}");
        }
    }

    /// Each `Connection` field's tokens count, however the list was split into fields,
    /// in both directions.
    #[test]
    fn every_connection_field_names_what_to_drop() {
        for answer in [false, true] {
            let mut h = map(&[
                ("connection", "keep-alive"),
                ("connection", "x-second, close"),
                ("connection", "x-third"),
                ("x-second", "1"),
                ("x-third", "1"),
                ("x-keep", "1"),
            ]);
            scrub(&mut h, true, false, answer);
            for gone in ["connection", "x-second", "x-third"] {
                assert!(!h.contains_key(gone), "{gone} (answer: {answer})");
            }
            assert!(h.contains_key("x-keep"));
        }
    }

    #[test]
    fn untrusted_client_loses_forwarding_headers() {
        let mut h = map(&[
            ("host", "example.com:8080"),
            ("connection", "keep-alive, x-drop"),
            ("x-drop", "1"),
            ("te", "trailers"),
            ("x-sluice-peer", "spoof"),
            ("x-forwarded-for", "6.6.6.6"),
            ("x-real-ip", "6.6.6.6"),
            ("x-keep", "1"),
        ]);
        request(
            &mut h,
            &HeaderValue::from_static("10.0.0.9"),
            &HeaderValue::from_static("http"),
            false,
            &ProxyConfig::new(vec![]),
        );
        assert_eq!(h["x-forwarded-for"], "10.0.0.9");
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["x-forwarded-host"], "example.com:8080");
        assert_eq!(h["te"], "trailers");
        assert_eq!(h["host"], "example.com:8080", "host keep is the default");
        for gone in ["connection", "x-drop", "x-sluice-peer", "x-real-ip"] {
            assert!(!h.contains_key(gone), "{gone} should be removed");
        }
        assert!(h.contains_key("x-keep"));
    }

    #[test]
    fn trusted_client_keeps_and_extends() {
        let mut h = map(&[
            ("host", "a"),
            ("x-forwarded-for", "1.1.1.1"),
            ("x-forwarded-proto", "https"),
            ("te", "gzip"),
        ]);
        request(
            &mut h,
            &HeaderValue::from_static("10.0.0.9"),
            &HeaderValue::from_static("http"),
            true,
            &ProxyConfig::new(vec![]),
        );
        assert_eq!(h["x-forwarded-for"], "1.1.1.1, 10.0.0.9");
        assert_eq!(h["x-forwarded-proto"], "https");
        assert!(!h.contains_key("te"), "TE other than trailers goes");
    }
}
