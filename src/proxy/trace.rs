//! W3C Trace Context (`tracing on`): every request a backend receives carries a
//! `traceparent`. A valid incoming one is continued (same trace id and flags, sluice's
//! own span id as the parent); anything else is replaced by a new trace, sampled.

use http::header::{HeaderMap, HeaderName, HeaderValue};

use crate::upstream::balancer::random;

const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

/// Sets the `traceparent` the backend receives.
pub(crate) fn propagate(h: &mut HeaderMap) {
    let incoming = h.get(&TRACEPARENT).and_then(|v| parse(v.as_bytes()));
    let (trace, flags) =
        incoming.unwrap_or_else(|| (format!("{:016x}{:016x}", random(), random()), "01".into()));
    let span = loop {
        let s = random();
        if s != 0 {
            break s;
        }
    };
    let value = format!("00-{trace}-{span:016x}-{flags}");
    if let Ok(v) = HeaderValue::from_str(&value) {
        h.insert(TRACEPARENT, v);
    }
}

/// A valid version-00 `traceparent`: its trace id and flags.
fn parse(v: &[u8]) -> Option<(String, String)> {
    let s = std::str::from_utf8(v).ok()?;
    let mut parts = s.split('-');
    let (version, trace, parent, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex = |p: &str, n: usize| {
        p.len() == n
            && p.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let zero = |p: &str| p.bytes().all(|b| b == b'0');
    if parts.next().is_some()
        || version != "00"
        || !hex(trace, 32)
        || zero(trace)
        || !hex(parent, 16)
        || zero(parent)
        || !hex(flags, 2)
    {
        return None;
    }
    Some((trace.to_string(), flags.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn after(incoming: Option<&str>) -> String {
        let mut h = HeaderMap::new();
        if let Some(v) = incoming {
            h.insert(TRACEPARENT, HeaderValue::from_str(v).unwrap());
        }
        propagate(&mut h);
        h[&TRACEPARENT].to_str().unwrap().to_string()
    }

    #[test]
    fn continues_a_valid_trace_and_starts_one_otherwise() {
        let t = after(Some(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ));
        assert!(t.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"), "{t}");
        assert!(
            t.ends_with("-01") && !t.contains("00f067aa0ba902b7"),
            "a new span: {t}"
        );
        for bad in [
            None,
            Some("00-00000000000000000000000000000000-00f067aa0ba902b7-01"),
            Some("garbage"),
            Some("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        ] {
            let t = after(bad);
            let p: Vec<&str> = t.split('-').collect();
            assert_eq!(
                (p.len(), p[0], p[1].len(), p[2].len(), p[3]),
                (4, "00", 32, 16, "01"),
                "{t}"
            );
            assert!(!t.contains("4bf92f3577b34da6a3ce929d0e0e4736"));
        }
    }
}
