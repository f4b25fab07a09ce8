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
use crate::http1::encode;
use crate::http1::names::{self, Kind};

/// Whether `k` spells `name` with a `_` for a `-`: not the field itself, but one a
/// backend that folds the two (CGI, WSGI, some frameworks) would take for it.
fn underscore_spelling(k: &HeaderName, name: &HeaderName) -> bool {
    k != name && names::spells(k.as_str().as_bytes(), name.as_str().as_bytes())
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
        match names::kind(k.as_str().as_bytes()) {
            Kind::Other => {}
            Kind::HopByHop(i) => present |= 1 << i,
            Kind::Te => present |= TE_BIT,
            other => extra |= goes(other, drop_forwarding, answer),
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
            .flat_map(|v| connection_names(v.as_bytes()))
            .filter_map(|t| HeaderName::from_bytes(t).ok())
            .collect();
        h.remove(header::CONNECTION);
        for n in named {
            h.remove(n);
        }
    }
    for (i, n) in names::HOP_BY_HOP.iter().enumerate().skip(1) {
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
            .filter(|k| goes(names::kind(k.as_str().as_bytes()), drop_forwarding, answer))
            .cloned()
            .collect();
        for n in ours {
            h.remove(n);
        }
    }
}

/// The fields a `Connection` value names to go with it: its tokens but the options
/// `close` and `keep-alive`.
fn connection_names(v: &[u8]) -> impl Iterator<Item = &[u8]> {
    v.split(|&b| b == b',').map(<[u8]>::trim_ascii).filter(|t| {
        !t.is_empty() && !t.eq_ignore_ascii_case(b"close") && !t.eq_ignore_ascii_case(b"keep-alive")
    })
}

/// Whether a field of kind `k` goes, beside the hop-by-hop ones: `X-Sluice-*` always,
/// (an untrusted client's) the forwarding fields, (a request's) the `_` spellings of
/// those sluice sets, and (an answer's) `X-Powered-By`, which tells the world its
/// stack and version (`header_down` may set one again; `Server` passes unchanged).
fn goes(k: Kind, drop_forwarding: bool, answer: bool) -> bool {
    match k {
        Kind::Sluice => true,
        Kind::Forwarding { ours_spelled } => drop_forwarding || (!answer && ours_spelled),
        Kind::PoweredBy => answer,
        Kind::Other | Kind::HopByHop(_) | Kind::Te => false,
    }
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

/// The backend's field lines for an untrusted client on a pool that adds no field of
/// its own (`host keep`, no `header_up`), written from the client's map, which stays
/// as it came: the lines [`request`] would leave in the map and `http1::encode` write
/// from it, save that the client's order stands (a removal from the map moves its
/// last field into the gap), and a `TE: trailers` kept is written after the client's
/// fields. No field is hashed, inserted or removed. `None`: a `Connection` names
/// other fields to drop, which is the map's work; nothing is kept.
///
/// `fields`: the client's map, or its fields as they came (`http1::fields`, names in
/// any case: they are written lower-case).
pub(crate) fn forwarded(
    fields: &impl encode::Source,
    client_ip: &HeaderValue,
    scheme: &HeaderValue,
) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(FORWARDED_ROOM);
    let (mut host, mut te) = (None, false);
    let whole = encode::request_fields(&mut out, fields, |name, value| match names::kind(name) {
        Kind::Other | Kind::PoweredBy => {
            if host.is_none() && name.eq_ignore_ascii_case(b"host") {
                host = Some(value);
            }
            Some(true)
        }
        Kind::HopByHop(names::CONNECTION_AT) if connection_names(value).next().is_some() => None,
        Kind::Te => {
            te |= crate::http1::head::asks_trailers(value);
            Some(false)
        }
        Kind::HopByHop(_) | Kind::Sluice | Kind::Forwarding { .. } => Some(false),
    });
    if !whole {
        return None;
    }
    if te {
        // `TE` is hop-by-hop, but a client that takes trailers says so to the backend
        // (`http1::head::normalise_te`).
        encode::field(&mut out, header::TE.as_str().as_bytes(), b"trailers");
    }
    encode::field(&mut out, XFF.as_str().as_bytes(), client_ip.as_bytes());
    encode::field(&mut out, XFP.as_str().as_bytes(), scheme.as_bytes());
    if let Some(host) = host {
        encode::field(&mut out, XFH.as_str().as_bytes(), host);
    }
    Some(out)
}

/// Room for a usual request's lines in one allocation (a browser's are ~500 bytes, an
/// API client's ~100).
const FORWARDED_ROOM: usize = 512;

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
