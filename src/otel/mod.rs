//! OpenTelemetry traces (DESIGN §18.9): with `global { tracing otlp URL { … } }`, one
//! server span per request and one client span per backend attempt, exported over
//! OTLP/HTTP (protobuf) to a collector.
//!
//! A request's trace is decided at its head ([`Tracer::begin`]): a valid `traceparent`
//! from the client is joined (its trace id, its span as the parent, its `sampled`
//! flag); otherwise a new trace is sampled at `sample`. Each attempt's span id goes to
//! the backend in its `traceparent`, so the backend's own spans hang under the attempt.
//!
//! Finished spans go into a bounded queue (`try_send`: a full queue drops the span,
//! counted) that one task drains in batches of up to 512, or every second; a collector
//! that is slow, down or refusing costs the export task time, never a request. Nothing
//! of this exists when tracing is not configured: the generation's `tracer` is `None`
//! and a request pays one test of it.

mod export;
pub(crate) mod proto;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use http::{HeaderMap, HeaderName, HeaderValue};

use crate::config::OtlpConfig;

const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
/// Spans waiting for the export task, at most.
const QUEUE: usize = 8192;

/// `sluice_otel_spans_total{result}`: exported, dropped (queue full), failed (the
/// collector did not take the batch).
pub(crate) static EXPORTED: AtomicU64 = AtomicU64::new(0);
pub(crate) static DROPPED: AtomicU64 = AtomicU64::new(0);
pub(crate) static FAILED: AtomicU64 = AtomicU64::new(0);

/// A generation's tracer (carried across reloads while its settings stay).
pub(crate) struct Tracer {
    pub config: OtlpConfig,
    tx: tokio::sync::mpsc::Sender<Finished>,
}

/// A request's trace: its ids, and whether its spans are recorded.
#[derive(Clone, Copy)]
pub(crate) struct Ctx {
    pub trace_id: [u8; 16],
    /// The server span's id.
    pub span_id: [u8; 8],
    /// The client's span, when it sent a `traceparent`.
    pub parent: Option<[u8; 8]>,
    pub sampled: bool,
}

/// A request's server span, begun at its head (what it records taken only when the
/// trace is sampled).
pub(crate) struct ServerSpan {
    pub ctx: Ctx,
    head: Option<Box<Head>>,
}

struct Head {
    start: SystemTime,
    method: http::Method,
    path: String,
    host: String,
}

/// A backend attempt's span, begun before its dial.
pub(crate) struct ClientSpan {
    id: [u8; 8],
    /// `None` when the trace is not sampled (nothing will be recorded).
    start: Option<SystemTime>,
}

/// A finished span, as the export task encodes it.
pub(crate) struct Finished {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    parent: Option<[u8; 8]>,
    name: String,
    /// 2 server, 3 client.
    kind: i32,
    start: SystemTime,
    end: SystemTime,
    attributes: Vec<(&'static str, Attr)>,
    error: Option<String>,
}

pub(crate) enum Attr {
    Str(String),
    Int(i64),
}

impl Tracer {
    /// A tracer for `config`, its export task started (on the current runtime).
    pub(crate) fn new(config: &OtlpConfig) -> Arc<Tracer> {
        let (tx, rx) = tokio::sync::mpsc::channel(QUEUE);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(export::run(config.clone(), rx));
        }
        Arc::new(Tracer {
            config: config.clone(),
            tx,
        })
    }

    /// The request's trace and its server span, begun now.
    pub(crate) fn begin(&self, req: &http::Request<crate::body::Body>) -> ServerSpan {
        let incoming = req
            .headers()
            .get(&TRACEPARENT)
            .and_then(|v| parse(v.as_bytes()));
        let ctx = match incoming {
            Some((trace_id, parent, flags)) => Ctx {
                trace_id,
                span_id: new_span_id(),
                parent: Some(parent),
                sampled: flags & 1 == 1,
            },
            None => Ctx {
                trace_id: new_trace_id(),
                span_id: new_span_id(),
                parent: None,
                sampled: self.sampled(),
            },
        };
        let head = ctx.sampled.then(|| {
            Box::new(Head {
                start: SystemTime::now(),
                method: req.method().clone(),
                path: req.uri().path().to_string(),
                host: req
                    .headers()
                    .get(http::header::HOST)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string(),
            })
        });
        ServerSpan { ctx, head }
    }

    fn sampled(&self) -> bool {
        let ppm = u64::from(self.config.sample_ppm);
        ppm >= 1_000_000 || crate::upstream::balancer::random() % 1_000_000 < ppm
    }

    /// Ends the request's span with its answer; `located`: its site and route.
    pub(crate) fn end_server(&self, s: ServerSpan, status: u16, located: Option<(&str, &str)>) {
        let Some(head) = s.head else {
            return;
        };
        let (site, route) = located.unwrap_or(("", ""));
        let name = match route {
            "" => head.method.to_string(),
            r => format!("{} {r}", head.method),
        };
        let mut attributes = vec![
            ("http.request.method", Attr::Str(head.method.to_string())),
            ("url.path", Attr::Str(head.path)),
            ("http.response.status_code", Attr::Int(status.into())),
            ("server.address", Attr::Str(head.host)),
            ("sluice.site", Attr::Str(site.to_string())),
        ];
        if !route.is_empty() {
            attributes.push(("http.route", Attr::Str(route.to_string())));
        }
        self.push(Finished {
            trace_id: s.ctx.trace_id,
            span_id: s.ctx.span_id,
            parent: s.ctx.parent,
            name,
            kind: 2,
            start: head.start,
            end: SystemTime::now(),
            attributes,
            error: (status >= 500).then(|| format!("answered {status}")),
        });
    }

    /// Begins an attempt's span, and sets the `traceparent` the backend gets to it.
    pub(crate) fn begin_client(&self, ctx: &Ctx, headers: &mut HeaderMap) -> ClientSpan {
        let id = new_span_id();
        headers.insert(
            TRACEPARENT,
            traceparent(&ctx.trace_id, &id, u8::from(ctx.sampled)),
        );
        ClientSpan {
            id,
            start: ctx.sampled.then(SystemTime::now),
        }
    }

    /// Ends an attempt's span: the peer, the attempt's number, and its answer's
    /// status or why it had none.
    pub(crate) fn end_client(
        &self,
        ctx: &Ctx,
        span: ClientSpan,
        pool: &str,
        peer: &str,
        attempt: u32,
        result: Result<u16, String>,
    ) {
        let Some(start) = span.start else {
            return;
        };
        let mut attributes = vec![
            ("server.address", Attr::Str(peer.to_string())),
            ("sluice.pool", Attr::Str(pool.to_string())),
            ("sluice.attempt", Attr::Int(attempt.into())),
        ];
        let error = match result {
            Ok(status) => {
                attributes.push(("http.response.status_code", Attr::Int(status.into())));
                (status >= 500).then(|| format!("answered {status}"))
            }
            Err(why) => {
                attributes.push(("error.type", Attr::Str(why.clone())));
                Some(why)
            }
        };
        self.push(Finished {
            trace_id: ctx.trace_id,
            span_id: span.id,
            parent: Some(ctx.span_id),
            name: format!("proxy {pool}"),
            kind: 3,
            start,
            end: SystemTime::now(),
            attributes,
            error,
        });
    }

    /// Queues a span for export; a full queue drops it (counted).
    fn push(&self, f: Finished) {
        if self.tx.try_send(f).is_err() {
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// `00-TRACE-SPAN-FLAGS`, written in place.
pub(crate) fn traceparent(trace: &[u8; 16], span: &[u8; 8], flags: u8) -> HeaderValue {
    let mut v = [b'-'; 55];
    v[..2].copy_from_slice(b"00");
    hex_into(&mut v[3..35], trace);
    hex_into(&mut v[36..52], span);
    hex_into(&mut v[53..], &[flags]);
    HeaderValue::from_bytes(&v).expect("hex digits and dashes")
}

/// A valid version-00 `traceparent`: trace id, parent span id, flags.
pub(crate) fn parse(v: &[u8]) -> Option<([u8; 16], [u8; 8], u8)> {
    let s = std::str::from_utf8(v).ok()?;
    let mut parts = s.split('-');
    let (version, trace, parent, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || version != "00" {
        return None;
    }
    let trace: [u8; 16] = unhex(trace)?;
    let parent: [u8; 8] = unhex(parent)?;
    let flags: [u8; 1] = unhex(flags)?;
    if trace == [0; 16] || parent == [0; 8] {
        return None;
    }
    Some((trace, parent, flags[0]))
}

/// Lower-case hex of exactly `N` bytes.
fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (i, pair) in s.as_bytes().chunks(2).enumerate() {
        let d = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        };
        out[i] = d(pair[0])? << 4 | d(pair[1])?;
    }
    Some(out)
}

/// Lower-case hex of `b` into `out` (twice its length).
fn hex_into(out: &mut [u8], b: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (pair, x) in out.chunks_mut(2).zip(b) {
        pair[0] = DIGITS[usize::from(x >> 4)];
        pair[1] = DIGITS[usize::from(x & 15)];
    }
}

#[cfg(test)]
fn hex(b: &[u8]) -> String {
    let mut out = vec![0u8; b.len() * 2];
    hex_into(&mut out, b);
    String::from_utf8(out).expect("hex digits")
}

pub(crate) fn new_span_id() -> [u8; 8] {
    loop {
        let r = crate::upstream::balancer::random();
        if r != 0 {
            return r.to_be_bytes();
        }
    }
}

pub(crate) fn new_trace_id() -> [u8; 16] {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&new_span_id());
    id[8..].copy_from_slice(&crate::upstream::balancer::random().to_be_bytes());
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparents_are_parsed_strictly() {
        let ok = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let (t, p, flags) = parse(ok).unwrap();
        assert_eq!(hex(&t), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(hex(&p), "00f067aa0ba902b7");
        assert_eq!(flags, 1);
        assert_eq!(traceparent(&t, &p, flags).as_bytes(), &ok[..]);
        let (_, _, flags) =
            parse(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00").unwrap();
        assert_eq!(flags, 0);
        for bad in [
            &b"00-00000000000000000000000000000000-00f067aa0ba902b7-01"[..],
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            b"garbage",
        ] {
            assert!(parse(bad).is_none(), "{}", String::from_utf8_lossy(bad));
        }
    }
}
