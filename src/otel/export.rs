//! The export task: batches of finished spans, encoded as one OTLP
//! `ExportTraceServiceRequest` each and POSTed (`application/x-protobuf`) to the
//! collector, one connection an export (a batch a second at most: nothing worth
//! keeping a connection for). A batch the collector does not take within 10 s is
//! dropped, counted, and logged at most once a minute.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use prost::Message;
use tokio::sync::mpsc::Receiver;

use super::proto::{self, AnyValue, KeyValue};
use super::{Attr, Finished, EXPORTED, FAILED};
use crate::config::OtlpConfig;

/// Spans a batch holds at most, and how long the first of them waits for more.
const BATCH: usize = 512;
const LINGER: Duration = Duration::from_secs(1);
/// How long one export may take, connection included.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

static REFUSED: crate::throttle::Throttled = crate::throttle::Throttled::new();

/// Drains `rx` until every sender is gone (the tracer was replaced or the process
/// stops), exporting what it holds.
pub(super) async fn run(cfg: OtlpConfig, mut rx: Receiver<Finished>) {
    let tls = crate::upstream::tls::system_client();
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        if rx.recv_many(&mut batch, BATCH).await == 0 {
            return;
        }
        let deadline = tokio::time::Instant::now() + LINGER;
        while batch.len() < BATCH {
            let room = BATCH - batch.len();
            match tokio::time::timeout_at(deadline, rx.recv_many(&mut batch, room)).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        let n = batch.len() as u64;
        let body = encode(&cfg, batch.drain(..));
        match tokio::time::timeout(EXPORT_TIMEOUT, post(&cfg, &tls, body)).await {
            Ok(Ok(())) => {
                EXPORTED.fetch_add(n, Ordering::Relaxed);
            }
            failed => {
                FAILED.fetch_add(n, Ordering::Relaxed);
                let why = match failed {
                    Ok(Err(e)) => e,
                    _ => format!("no answer within {}s", EXPORT_TIMEOUT.as_secs()),
                };
                REFUSED.warn(format_args!(
                    "sluice: tracing: the collector at {} did not take {n} spans ({why}); they are dropped",
                    cfg.url
                ));
            }
        }
    }
}

/// One export request for `spans`.
fn encode(cfg: &OtlpConfig, spans: impl Iterator<Item = Finished>) -> Bytes {
    let nanos = |t: SystemTime| {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    };
    let spans = spans
        .map(|f| proto::Span {
            trace_id: f.trace_id.to_vec(),
            span_id: f.span_id.to_vec(),
            parent_span_id: f.parent.map_or_else(Vec::new, |p| p.to_vec()),
            name: f.name,
            kind: f.kind,
            start_time_unix_nano: nanos(f.start),
            end_time_unix_nano: nanos(f.end),
            attributes: f.attributes.into_iter().map(|(k, v)| kv(k, v)).collect(),
            status: f.error.map(|message| proto::Status { message, code: 2 }),
        })
        .collect();
    let req = proto::ExportTraceServiceRequest {
        resource_spans: vec![proto::ResourceSpans {
            resource: Some(proto::Resource {
                attributes: vec![kv("service.name", Attr::Str(cfg.service.clone()))],
            }),
            scope_spans: vec![proto::ScopeSpans {
                scope: Some(proto::InstrumentationScope {
                    name: "sluice".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                }),
                spans,
            }],
        }],
    };
    Bytes::from(req.encode_to_vec())
}

fn kv(key: &str, v: Attr) -> KeyValue {
    let value = match v {
        Attr::Str(s) => proto::Value::String(s),
        Attr::Int(i) => proto::Value::Int(i),
    };
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue { value: Some(value) }),
    }
}

/// POSTs `body` to the collector; `Err` says why it was not taken.
async fn post(
    cfg: &OtlpConfig,
    tls: &Arc<rustls::ClientConfig>,
    body: Bytes,
) -> Result<(), String> {
    let mut req = http::Request::post(cfg.url.clone())
        .header(http::header::CONTENT_TYPE, "application/x-protobuf")
        .body(http_body_util::Full::new(body))
        .map_err(|e| e.to_string())?;
    for (name, value) in &cfg.headers {
        req.headers_mut().insert(name.clone(), value.clone());
    }
    // The collector's answer is read and dropped (a partial-success report at most).
    let resp = crate::net::fetch::send(req, Some(tls), 64 * 1024).await?;
    if resp.status().is_success() {
        Ok(())
    } else {
        Err(format!("answered {}", resp.status()))
    }
}
