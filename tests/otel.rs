//! OpenTelemetry traces over real sockets (DESIGN §18.9): a loopback OTLP/HTTP
//! receiver decodes what sluice exports with the published protobuf messages
//! (`opentelemetry-proto`), and checks the spans, their parents and attributes.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Request, Response};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

/// Each export's `service.name` and `x-api-key`.
type Seen = Arc<Mutex<Vec<(String, Option<String>)>>>;

/// A collector on loopback: every span of every export it was sent, and the
/// `service.name` and headers each export came with.
struct Collector {
    backend: Backend,
    spans: Arc<Mutex<Vec<Span>>>,
    seen: Seen,
}

impl Collector {
    async fn start() -> Collector {
        let spans: Arc<Mutex<Vec<Span>>> = Arc::default();
        let seen: Seen = Arc::default();
        let (s, n) = (spans.clone(), seen.clone());
        let backend = Backend::start(move |req: Request<Incoming>| {
            let (s, n) = (s.clone(), n.clone());
            async move {
                assert_eq!(req.uri().path(), "/v1/traces");
                assert_eq!(req.headers()["content-type"], "application/x-protobuf");
                let key = req
                    .headers()
                    .get("x-api-key")
                    .map(|v| v.to_str().unwrap().to_string());
                let body = req.into_body().collect().await.unwrap().to_bytes();
                let export = ExportTraceServiceRequest::decode(body).expect("an OTLP export");
                for rs in export.resource_spans {
                    let service = rs
                        .resource
                        .iter()
                        .flat_map(|r| &r.attributes)
                        .find(|a| a.key == "service.name")
                        .and_then(|a| match a.value.as_ref()?.value.as_ref()? {
                            Value::StringValue(v) => Some(v.clone()),
                            _ => None,
                        })
                        .unwrap_or_default();
                    n.lock().unwrap().push((service, key.clone()));
                    for ss in rs.scope_spans {
                        s.lock().unwrap().extend(ss.spans);
                    }
                }
                Response::new(full(""))
            }
        })
        .await;
        Collector {
            backend,
            spans,
            seen,
        }
    }

    fn url(&self) -> String {
        format!("http://{}/v1/traces", self.backend.addr)
    }

    /// Waits (bounded) until at least `n` spans arrived; all of them.
    fn wait(&self, n: usize) -> Vec<Span> {
        let end = Instant::now() + WAIT;
        loop {
            let spans = self.spans.lock().unwrap().clone();
            if spans.len() >= n || Instant::now() > end {
                return spans;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn attrs(s: &Span) -> HashMap<String, String> {
    s.attributes
        .iter()
        .filter_map(|a| {
            let v = match a.value.as_ref()?.value.as_ref()? {
                Value::StringValue(v) => v.clone(),
                Value::IntValue(i) => i.to_string(),
                _ => return None,
            };
            Some((a.key.clone(), v))
        })
        .collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A backend answering with the `traceparent` it got.
async fn echo_traceparent() -> Backend {
    Backend::start(|req: Request<Incoming>| async move {
        let tp = req
            .headers()
            .get("traceparent")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        Response::new(full(tp))
    })
    .await
}

/// A client's trace is joined: the server span is its child, each backend attempt a
/// child of the server span (the dead peer's with its error, the live one's with its
/// status), and the backend's `traceparent` names the attempt that reached it. A trace
/// the client did not sample records nothing and says so to the backend; a request
/// without a `traceparent` starts a trace of its own (`sample 1`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_join_the_client_s_trace_and_name_each_attempt() {
    let collector = Collector::start().await;
    let live = echo_traceparent().await;
    let dead = dead_addr().await;
    let s = Sluice::start(&format!(
        "global {{ admin 127.0.0.1:0
            tracing otlp {url} {{ service shop; headers {{ x-api-key sekrit }} }} }}
         site app.test {{
             route /api/* {{ proxy {dead} {live} {{ lb first }} }}
             respond 404 \"none\"
         }}",
        url = collector.url(),
        live = live.addr,
    ));
    let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let r = request(
        s.addr,
        "GET",
        "/api/x?q=1",
        &[("Host", "app.test"), ("traceparent", parent)],
        b"",
    )
    .await;
    assert_eq!(r.status, 200);
    let sent = r.text();
    let spans = collector.wait(3);
    assert_eq!(spans.len(), 3, "{spans:?}");
    let server = spans.iter().find(|s| s.kind == 2).expect("a server span");
    assert_eq!(hex(&server.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(hex(&server.parent_span_id), "00f067aa0ba902b7");
    assert_eq!(server.name, "GET /api/*");
    let a = attrs(server);
    assert_eq!(a["http.request.method"], "GET");
    assert_eq!(a["url.path"], "/api/x");
    assert_eq!(a["http.response.status_code"], "200");
    assert_eq!(a["server.address"], "app.test");
    assert_eq!(a["sluice.site"], "app.test");
    assert_eq!(a["http.route"], "/api/*");
    assert!(server.end_time_unix_nano >= server.start_time_unix_nano);
    let mut clients: Vec<&Span> = spans.iter().filter(|s| s.kind == 3).collect();
    clients.sort_by_key(|s| attrs(s)["sluice.attempt"].clone());
    assert_eq!(clients.len(), 2);
    for c in &clients {
        assert_eq!(c.trace_id, server.trace_id);
        assert_eq!(
            c.parent_span_id, server.span_id,
            "an attempt is the request's child"
        );
    }
    let (first, second) = (attrs(clients[0]), attrs(clients[1]));
    assert_eq!(first["server.address"], dead.to_string());
    assert!(first.contains_key("error.type"), "{first:?}");
    assert_eq!(clients[0].status.as_ref().map(|s| s.code), Some(2));
    assert_eq!(second["server.address"], live.addr.to_string());
    assert_eq!(second["http.response.status_code"], "200");
    assert_eq!(second["sluice.attempt"], "2");
    assert_eq!(
        sent,
        format!(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-{}-01",
            hex(&clients[1].span_id)
        ),
        "the backend's traceparent names the attempt that reached it"
    );
    assert!(collector
        .seen
        .lock()
        .unwrap()
        .iter()
        .all(|(service, key)| service == "shop" && key.as_deref() == Some("sekrit")));

    // Not sampled by the client: nothing recorded, and the backend is told.
    let unsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
    let r = request(
        s.addr,
        "GET",
        "/api/y",
        &[("Host", "app.test"), ("traceparent", unsampled)],
        b"",
    )
    .await;
    assert!(r.text().ends_with("-00"), "{}", r.text());
    // No traceparent: a trace of its own, a site-level 404 included.
    let r = get_host(s.addr, "app.test", "/nothing").await;
    assert_eq!(r.status, 404);
    let spans = collector.wait(4);
    std::thread::sleep(Duration::from_millis(1200));
    let spans_now = collector.wait(4);
    assert_eq!(
        spans_now.len(),
        4,
        "the unsampled request recorded nothing: {spans_now:?}"
    );
    let own = spans
        .iter()
        .find(|s| attrs(s).get("url.path").map(String::as_str) == Some("/nothing"))
        .unwrap();
    assert!(own.parent_span_id.is_empty() && own.trace_id.len() == 16);
    assert_eq!(attrs(own)["http.response.status_code"], "404");
    let m = get(s.admin(), "/metrics").await.text();
    assert!(
        m.contains("sluice_otel_spans_total{result=\"exported\"} 4"),
        "{m}"
    );
}

/// `sample 0` records no new trace but still joins a sampled one; a collector that is
/// down costs the requests nothing: they are answered, the spans counted as failed,
/// and the log says so once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_and_a_collector_that_is_down() {
    let collector = Collector::start().await;
    let live = echo_traceparent().await;
    let s = Sluice::start(&format!(
        "global {{ tracing otlp {} {{ sample 0 }} }}
         site * {{ proxy {} }}",
        collector.url(),
        live.addr
    ));
    for _ in 0..20 {
        let r = get(s.addr, "/").await;
        assert!(r.text().ends_with("-00"), "not sampled: {}", r.text());
    }
    let parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    request(s.addr, "GET", "/", &[("traceparent", parent)], b"").await;
    let spans = collector.wait(2);
    assert_eq!(spans.len(), 2, "only the sampled trace: {spans:?}");
    assert!(spans
        .iter()
        .all(|s| hex(&s.trace_id) == "0af7651916cd43dd8448eb211c80319c"));

    let dead = dead_addr().await;
    let s = Sluice::start(&format!(
        "global {{ admin 127.0.0.1:0; tracing otlp http://{dead}/v1/traces }}
         site * {{ proxy {} }}",
        live.addr
    ));
    let started = Instant::now();
    for _ in 0..50 {
        assert_eq!(get(s.addr, "/").await.status, 200);
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "requests did not wait on the collector"
    );
    s.wait_log("sluice: tracing: the collector at");
    let end = Instant::now() + WAIT;
    loop {
        let m = get(s.admin(), "/metrics").await.text();
        if m.contains("sluice_otel_spans_total{result=\"failed\"} 100") {
            break;
        }
        assert!(Instant::now() < end, "{m}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
