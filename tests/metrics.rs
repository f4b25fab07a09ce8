//! Per site and route metrics over real sockets (DESIGN §16 "Observability"): requests by
//! status class, time to the last byte and body bytes each way, for HTTP/1.1 and h2c
//! clients alike; a route's label is its pattern (never the path); answers no route or
//! no site took have empty labels; counts survive a reload that keeps the route.

mod common;

use std::net::SocketAddr;

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use tokio::net::TcpStream;

fn config(backend: SocketAddr) -> String {
    format!(
        "global {{ admin 127.0.0.1:0 }}
listen 127.0.0.1:0
site app.test {{
    route /api/* {{ proxy {backend} }}
    route ~ \"^/item/([0-9]+)$\" {{ respond \"item {{re.1}}\" }}
    respond 404 \"nope\"
}}
site other.test {{
    route /a {{ respond a }}
    route /dup {{ match method GET; respond get }}
    route /dup {{ respond other }}
}}
"
    )
}

/// The value of the series `name{labels}` in a metrics page, if it is there.
fn series(page: &str, name_and_labels: &str) -> Option<f64> {
    page.lines().find_map(|l| {
        let rest = l.strip_prefix(name_and_labels)?;
        rest.strip_prefix(' ')?.parse().ok()
    })
}

fn count(page: &str, site: &str, route: &str, code: &str) -> f64 {
    let labels =
        format!("sluice_http_requests_total{{site=\"{site}\",route=\"{route}\",code=\"{code}\"}}");
    series(page, &labels).unwrap_or_else(|| panic!("no {labels} in\n{page}"))
}

fn labelled(page: &str, name: &str, site: &str, route: &str) -> f64 {
    let labels = format!("{name}{{site=\"{site}\",route=\"{route}\"}}");
    series(page, &labels).unwrap_or_else(|| panic!("no {labels} in\n{page}"))
}

/// A POST over h2c (prior knowledge) with `body`; the response's status and body.
async fn h2c_post(addr: SocketAddr, path: &str, body: &'static [u8]) -> (u16, Bytes) {
    let (mut send, task) = h2c(addr).await;
    let req = Request::post(format!("http://app.test{path}"))
        .body(Full::new(Bytes::from_static(body)))
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    task.abort();
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_site_and_route_counts_its_requests_latency_and_bytes() {
    // The backend reads the whole body and answers with its length.
    let backend = Backend::start(|req: Request<Incoming>| async move {
        let n = req.into_body().collect().await.unwrap().to_bytes().len();
        Response::new(full(format!("got {n}")))
    })
    .await;
    let dir = TempDir::new();
    let path = dir.write("sluice.conf", &config(backend.addr));
    let s = Sluice::spawn(&["run", "-c", path.to_str().unwrap()], dir);
    let admin = s.admin();
    let host = [("Host", "app.test")];
    assert_eq!(
        request(s.addr, "GET", "/api/a", &host, b"").await.text(),
        "got 0"
    );
    let up = request(s.addr, "POST", "/api/up", &host, &[b'x'; 1000]).await;
    assert_eq!(up.text(), "got 1000");
    assert_eq!(
        h2c_post(s.addr, "/api/up", &[b'y'; 500]).await,
        (200, Bytes::from("got 500"))
    );
    for path in ["/item/1", "/item/22"] {
        assert_eq!(request(s.addr, "GET", path, &host, b"").await.status, 200);
    }
    assert_eq!(
        request(s.addr, "GET", "/other", &host, b"").await.status,
        404
    );
    assert_eq!(get_host(s.addr, "other.test", "/zzz").await.status, 404);
    assert_eq!(get_host(s.addr, "nowhere.test", "/").await.status, 421);
    // Two routes of one pattern: one series set, both counted on it.
    let other = [("Host", "other.test")];
    assert_eq!(
        request(s.addr, "GET", "/dup", &other, b"").await.text(),
        "get"
    );
    assert_eq!(
        request(s.addr, "PUT", "/dup", &other, b"x").await.text(),
        "other"
    );

    let m = request(admin, "GET", "/metrics", &[], b"").await.text();
    assert_eq!(count(&m, "app.test", "/api/*", "2xx"), 3.0);
    assert_eq!(count(&m, "app.test", "/api/*", "5xx"), 0.0);
    // The regex route is one series, whatever the paths it took.
    let regex = "~^/item/([0-9]+)$";
    assert_eq!(count(&m, "app.test", regex, "2xx"), 2.0);
    assert!(!m.contains("/item/1"), "a path became a label:\n{m}");
    // The site's own route, a site no route took, no site at all.
    assert_eq!(count(&m, "app.test", "/*", "4xx"), 1.0);
    assert_eq!(count(&m, "other.test", "", "4xx"), 1.0);
    assert_eq!(count(&m, "", "", "4xx"), 1.0);
    // 4xx and 5xx by code too: the site's `respond 404` is a 404, and only 4xx/5xx
    // codes have series.
    let by_code =
        "sluice_http_responses_by_code_total{site=\"app.test\",route=\"/*\",code=\"404\"}";
    assert_eq!(series(&m, by_code), Some(1.0), "{m}");
    assert!(
        !m.contains("sluice_http_responses_by_code_total{site=\"app.test\",route=\"/api/*\""),
        "{m}"
    );
    let dup = "sluice_http_requests_total{site=\"other.test\",route=\"/dup\",code=\"2xx\"} ";
    assert_eq!(m.matches(dup).count(), 1, "one series:\n{m}");
    assert_eq!(count(&m, "other.test", "/dup", "2xx"), 2.0);
    let st: serde_json::Value =
        serde_json::from_slice(&request(admin, "GET", "/status", &[], b"").await.body).unwrap();
    let dups = st["routes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["route"] == "/dup")
        .count();
    assert_eq!(dups, 1, "{st}");
    let bytes_in = "sluice_http_request_bytes_total";
    assert_eq!(labelled(&m, bytes_in, "app.test", "/api/*"), 1500.0);
    let bytes_out = "sluice_http_response_bytes_total";
    // "got 0" + "got 1000" + "got 500".
    assert_eq!(labelled(&m, bytes_out, "app.test", "/api/*"), 20.0);
    assert_eq!(labelled(&m, bytes_out, "app.test", regex), 13.0);
    let duration = "sluice_http_request_duration_seconds";
    assert_eq!(
        labelled(&m, &format!("{duration}_count"), "app.test", "/api/*"),
        3.0
    );
    let inf = format!("{duration}_bucket{{site=\"app.test\",route=\"/api/*\",le=\"+Inf\"}}");
    assert_eq!(series(&m, &inf), Some(3.0), "{m}");
    assert!(labelled(&m, &format!("{duration}_sum"), "app.test", "/api/*") > 0.0);

    // A reload that keeps the route keeps its counts; a removed route's series go.
    let kept = config(backend.addr).replace("route /a { respond a }", "route /b { respond b }");
    std::fs::write(&path, kept).unwrap();
    let r = post_json(admin, "/reload", "{}").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        request(s.addr, "GET", "/api/a", &host, b"").await.status,
        200
    );
    let m = request(admin, "GET", "/metrics", &[], b"").await.text();
    assert_eq!(count(&m, "app.test", "/api/*", "2xx"), 4.0);
    assert_eq!(count(&m, "other.test", "", "4xx"), 1.0);
    assert!(!m.contains("route=\"/a\""), "{m}");
    assert_eq!(count(&m, "other.test", "/b", "2xx"), 0.0);
}

/// The whole page passes `promtool check metrics` (Prometheus's own parser and lint:
/// names, units, types, help) — a pool with a dead peer and failover, so every family
/// has series.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promtool_accepts_the_page() {
    if std::process::Command::new("promtool")
        .arg("--version")
        .output()
        .is_err()
    {
        assert!(!require_interop(), "promtool is not installed");
        eprintln!("skipped: promtool is not installed (Debian: apt-get install prometheus)");
        return;
    }
    let backend = Backend::text("ok").await;
    let dead = dead_addr().await;
    let dir = TempDir::new();
    let text = format!(
        "global {{ admin 127.0.0.1:0; access_log stdout }}
listen 127.0.0.1:0
site app.test {{
    route /api/* {{ proxy {dead} {backend} {{ lb first; retries 1 }} }}
    route /x {{ rate_limit 1/m; respond x }}
    respond nope
}}
",
        backend = backend.addr
    );
    let path = dir.write("sluice.conf", &text);
    let s = Sluice::spawn(&["run", "-c", path.to_str().unwrap()], dir);
    let admin = s.admin();
    let host = [("Host", "app.test")];
    for p in ["/api/a", "/api/b", "/x", "/x", "/y"] {
        request(s.addr, "GET", p, &host, b"").await;
    }
    get_host(s.addr, "nowhere.test", "/").await;
    let page = request(admin, "GET", "/metrics", &[], b"").await.text();
    assert!(page.contains("sluice_http_requests_total{"), "{page}");
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(page.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool: {}{}\n{page}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A client that leaves before the answer is counted too: `499` (a 4xx), with the time
/// it waited — over HTTP/1.1 (the connection closed) and HTTP/2 (the stream reset).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_gives_up_is_counted_as_499() {
    let backend = Backend::start(|_| async {
        tokio::time::sleep(std::time::Duration::from_secs(30)).await;
        Response::new(full("late"))
    })
    .await;
    let dir = TempDir::new();
    let path = dir.write(
        "sluice.conf",
        &format!(
            "global {{ admin 127.0.0.1:0 }}\nlisten 127.0.0.1:0\nsite app.test {{ route /slow {{ proxy {} }} }}\n",
            backend.addr
        ),
    );
    let s = Sluice::spawn(&["run", "-c", path.to_str().unwrap()], dir);
    let admin = s.admin();
    // HTTP/1.1: the request, then the connection closes.
    {
        use tokio::io::AsyncWriteExt;
        let mut c = TcpStream::connect(s.addr).await.unwrap();
        c.write_all(b"GET /slow HTTP/1.1\r\nHost: app.test\r\n\r\n")
            .await
            .unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    // HTTP/2: the stream's future dropped, which resets it.
    let (mut send, task) = h2c(s.addr).await;
    let req = Request::get("http://app.test/slow")
        .body(http_body_util::Empty::<Bytes>::new())
        .unwrap();
    let waiting = tokio::time::timeout(
        std::time::Duration::from_millis(200),
        send.send_request(req),
    );
    assert!(waiting.await.is_err(), "the backend is slow");
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let m = request(admin, "GET", "/metrics", &[], b"").await.text();
        let n = count(&m, "app.test", "/slow", "4xx");
        if n == 2.0 {
            let took = labelled(
                &m,
                "sluice_http_request_duration_seconds_sum",
                "app.test",
                "/slow",
            );
            assert!(took >= 0.3, "the time they waited: {took}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "two 499s counted, got {n}:\n{m}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    task.abort();
}

/// A request body counts in `sluice_http_request_bytes_total` when it was received,
/// whether or not the handler read it (DESIGN §18.4): a `respond` route never does.
/// (Over HTTP/2, what had arrived when the handler let it go: here a slow
/// `forward_auth` makes sure all of it had.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_the_handler_never_read_still_counts() {
    let auth = Backend::start(|_req: Request<Incoming>| async move {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        Response::new(full("ok"))
    })
    .await;
    let s = Sluice::start(&format!(
        "global {{ admin 127.0.0.1:0 }}\nsite app.test {{
            route /drop {{ respond ok }}
            route /slow {{ forward_auth http://{}/check\n respond ok }}
        }}\n",
        auth.addr
    ));
    let body = [b'b'; 1000];
    let r = request(s.addr, "POST", "/drop", &[("Host", "app.test")], &body).await;
    assert_eq!(r.status, 200);
    let (status, _) = h2c_post(s.addr, "/slow", &[b'b'; 1000]).await;
    assert_eq!(status, 200);
    let m = request(s.admin(), "GET", "/metrics", &[], b"").await.text();
    let bytes_in = "sluice_http_request_bytes_total";
    assert_eq!(
        labelled(&m, bytes_in, "app.test", "/drop"),
        1000.0,
        "HTTP/1.1"
    );
    assert_eq!(
        labelled(&m, bytes_in, "app.test", "/slow"),
        1000.0,
        "HTTP/2"
    );
}
