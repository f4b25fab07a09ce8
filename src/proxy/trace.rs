//! W3C Trace Context (`tracing on`): every request a backend receives carries a
//! `traceparent`. A valid incoming one is continued (same trace id and flags, sluice's
//! own span id as the parent); anything else is replaced by a new trace, sampled.

use http::header::{HeaderMap, HeaderName};

const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

/// Sets the `traceparent` the backend receives: the incoming trace id and flags kept
/// (`otel`'s reading and writing of the header, one for both), a new span id.
pub(crate) fn propagate(h: &mut HeaderMap) {
    let incoming = h
        .get(&TRACEPARENT)
        .and_then(|v| crate::otel::parse(v.as_bytes()));
    let (trace, flags) = match incoming {
        Some((trace, _, flags)) => (trace, flags),
        None => (crate::otel::new_trace_id(), 1),
    };
    let value = crate::otel::traceparent(&trace, &crate::otel::new_span_id(), flags);
    h.insert(TRACEPARENT, value);
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::HeaderValue;

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
