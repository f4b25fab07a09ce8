//! The access log over real sockets: one JSON object (or text line) a response with
//! the fields of DESIGN.md §14, written to a file that SIGUSR1 reopens after rotation.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

fn lines(path: &std::path::Path, n: usize) -> Vec<String> {
    let end = Instant::now() + WAIT;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let v: Vec<String> = text.lines().map(str::to_string).collect();
        if v.len() >= n || Instant::now() > end {
            return v;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// sluice with `access_log access.log FORMAT` and `sites`, and where its lines go.
fn logged(format: &str, sites: &str) -> (Sluice, std::path::PathBuf) {
    let dir = TempDir::new();
    let log = dir.0.join("access.log");
    let path = dir.write(
        "sluice.conf",
        &format!(
            "global {{ admin off; access_log access.log {format} }}\nlisten 127.0.0.1:0\n{sites}\n"
        ),
    );
    let p = path.to_str().unwrap().to_string();
    (Sluice::spawn(&["run", "-c", &p], dir), log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_lines_with_every_field_and_reopen_on_sigusr1() {
    let b = Backend::text("hello").await;
    let dir = TempDir::new();
    let log = dir.0.join("access.log");
    let path = dir.write(
        "sluice.conf",
        &format!(
            "global {{ admin off; access_log access.log json }}
listen 127.0.0.1:0
site app.test {{
    route /local {{ respond 201 \"made here\" }}
    proxy {}
}}
",
            b.addr
        ),
    );
    let p = path.to_str().unwrap().to_string();
    let s = Sluice::spawn(&["run", "-c", &p], dir);
    assert_eq!(get_host(s.addr, "app.test", "/x?y=1").await.text(), "hello");
    assert_eq!(get_host(s.addr, "app.test", "/local").await.status, 201);
    let got = lines(&log, 2);
    assert_eq!(got.len(), 2, "one line a response: {got:?}");
    let proxied: Value = serde_json::from_str(&got[0]).unwrap();
    assert_eq!(proxied["client"], "127.0.0.1");
    assert_eq!(proxied["host"], "app.test");
    assert_eq!(proxied["method"], "GET");
    assert_eq!(proxied["path"], "/x?y=1");
    assert_eq!(proxied["status"], 200);
    assert_eq!(proxied["bytes"], 5);
    assert!(proxied["duration_ms"].is_u64());
    assert_eq!(proxied["pool"], "app.test");
    assert_eq!(proxied["peer"], b.addr.to_string());
    assert_eq!(proxied["attempts"], 1);
    assert_eq!(proxied["protocol"], "HTTP/1.1");
    assert_eq!(
        (&proxied["role"], &proxied["transition"]),
        (&Value::from("primary"), &Value::from("none")),
        "the origin values, with origin_headers off"
    );
    let t = proxied["time"].as_str().unwrap();
    assert!(t.len() == 24 && t.ends_with('Z'), "RFC 3339: {t}");
    let local: Value = serde_json::from_str(&got[1]).unwrap();
    assert_eq!(
        (local["status"].as_u64(), local["bytes"].as_u64()),
        (Some(201), Some(9))
    );
    assert_eq!(local["pool"], Value::Null, "no pool served it");
    assert_eq!(local["role"], Value::Null);

    // Rotation: move the file away, SIGUSR1, and the next line starts a new file.
    let rotated = log.with_extension("log.1");
    std::fs::rename(&log, &rotated).unwrap();
    s.signal("USR1");
    tokio::time::sleep(Duration::from_millis(200)).await;
    get_host(s.addr, "app.test", "/local").await;
    assert_eq!(lines(&log, 1).len(), 1, "a new file after SIGUSR1");
    assert_eq!(
        lines(&rotated, 2).len(),
        2,
        "the rotated file keeps its lines"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_lines() {
    let (s, log) = logged("text", "site * { respond \"ok\" }");
    get_host(s.addr, "a.test", "/p?q").await;
    let got = lines(&log, 1);
    let line = got.first().expect("a line");
    assert!(
        line.starts_with("127.0.0.1 - - [")
            && line.contains("] \"GET /p?q HTTP/1.1\" 200 2 \"a.test\" - - 0 "),
        "{line}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_requests_are_logged_too() {
    let b = Backend::text("over h2").await;
    let (s, log) = logged("", &format!("site app.example {{ proxy {} }}", b.addr));
    let (mut send, _conn) = h2c(s.addr).await;
    let req = hyper::Request::builder()
        .uri("http://app.example/two")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    use http_body_util::BodyExt;
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"over h2");
    let got = lines(&log, 1);
    let v: Value = serde_json::from_str(got.first().expect("a line")).unwrap();
    assert_eq!(v["path"], "/two");
    assert_eq!(v["host"], "app.example");
    assert_eq!(
        (v["status"].as_u64(), v["bytes"].as_u64()),
        (Some(200), Some(7))
    );
    assert_eq!(v["pool"], "app.example");
    assert_eq!(
        v["protocol"], "HTTP/2",
        "the client's protocol, not the backend's"
    );
}

/// A 502 or 504 of sluice's own still names the pool, the last peer dialed and the
/// attempts; the text line names the protocol the client spoke.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_requests_name_the_peers_they_tried() {
    let (d1, d2) = (dead_addr().await, dead_addr().await);
    let (silent, _t) = raw_backend(|c| async move {
        tokio::time::sleep(Duration::from_secs(5)).await;
        drop(c);
    })
    .await;
    let dir = TempDir::new();
    let log = dir.0.join("access.log");
    let path = dir.write(
        "sluice.conf",
        &format!(
            "global {{ admin off; access_log access.log json }}
listen 127.0.0.1:0
site app.test {{
    route /slow {{ proxy {silent} {{ timeout 300ms }} }}
    proxy {d1} {d2} {{ lb first; retries 1 }}
}}
"
        ),
    );
    let p = path.to_str().unwrap().to_string();
    let s = Sluice::spawn(&["run", "-c", &p], dir);
    assert_eq!(get_host(s.addr, "app.test", "/").await.status, 502);
    assert_eq!(get_host(s.addr, "app.test", "/slow").await.status, 504);
    let got = lines(&log, 2);
    let bad: Value = serde_json::from_str(&got[0]).unwrap();
    assert_eq!(bad["status"], 502);
    assert_eq!(bad["pool"], "app.test");
    assert_eq!(bad["peer"], d2.to_string(), "the last peer dialed");
    assert_eq!(bad["attempts"], 2);
    assert_eq!(bad["role"], "primary");
    let slow: Value = serde_json::from_str(&got[1]).unwrap();
    assert_eq!(slow["status"], 504);
    assert_eq!(slow["pool"], "app.test /slow");
    assert_eq!(slow["peer"], silent.to_string());
    assert_eq!(slow["attempts"], 1);
    drop(s);

    let dir = TempDir::new();
    let path = dir.write(
        "sluice.conf",
        "global { admin off; access_log access.txt text }\nlisten 127.0.0.1:0\nsite * { respond \"ok\" }\n",
    );
    let text_log_here = dir.0.join("access.txt");
    let p = path.to_str().unwrap().to_string();
    let s = Sluice::spawn(&["run", "-c", &p], dir);
    let (mut send, _conn) = h2c(s.addr).await;
    let req = hyper::Request::builder()
        .uri("http://a.test/h2")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    assert_eq!(send.send_request(req).await.unwrap().status(), 200);
    let got = lines(&text_log_here, 1);
    let line = got.first().expect("a line");
    assert!(line.contains("\"GET /h2 HTTP/2\" 200"), "{line}");
}

/// `combined` and `common` (DESIGN §16) as Apache writes them, and the JSON line's
/// `user_agent` and `referer`, for HTTP/1.1 and HTTP/2 clients alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn combined_common_and_the_client_s_own_fields() {
    for (format, want) in [
        (
            "combined",
            "\"GET /x?y=1 HTTP/1.1\" 200 5 \"https://ref.test/\" \"agent \\\"7\\\"\"",
        ),
        ("common", "\"GET /x?y=1 HTTP/1.1\" 200 5"),
    ] {
        let b = Backend::text("hello").await;
        let sites = format!(
            "site * {{ route /empty {{ respond 204 }}\n proxy {} }}",
            b.addr
        );
        let (s, log) = logged(format, &sites);
        let r = request(
            s.addr,
            "GET",
            "/x?y=1",
            &[
                ("User-Agent", "agent \"7\""),
                ("Referer", "https://ref.test/"),
                ("Authorization", "Basic ZnJhbms6c2VjcmV0"),
            ],
            b"",
        )
        .await;
        assert_eq!(r.status, 200);
        assert_eq!(get(s.addr, "/empty").await.status, 204);
        let got = lines(&log, 2);
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(
            got[0].starts_with("127.0.0.1 - frank ["),
            "{format}: {}",
            got[0]
        );
        assert!(got[0].contains(" +0000] "), "{format}: {}", got[0]);
        assert!(got[0].ends_with(want), "{format}: {}", got[0]);
        // No user, an empty body: `-`.
        assert!(
            got[1].starts_with("127.0.0.1 - - ["),
            "{format}: {}",
            got[1]
        );
        assert!(got[1].contains("\" 204 -"), "{format}: {}", got[1]);
    }
    let b = Backend::text("hello").await;
    let (s, log) = logged("", &format!("site * {{ proxy {} }}", b.addr));
    let (mut h2, _conn) = h2c(s.addr).await;
    let req = http::Request::get(format!("http://{}/x", s.addr))
        .header("user-agent", "h2-agent")
        .header("referer", "https://ref.test/")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let resp = h2.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let got = lines(&log, 1);
    let v: Value = serde_json::from_str(&got[0]).unwrap();
    assert_eq!(
        (v["user_agent"].as_str(), v["referer"].as_str()),
        (Some("h2-agent"), Some("https://ref.test/"))
    );
    assert_eq!(v["protocol"], "HTTP/2");
}

/// What a filter, TLS and the proxy add to a line (`request_id`, `tls`, `upstream_ms`),
/// and the same request written by an operator's template: values escaped, `-` for the
/// absent, a request header by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_request_id_upstream_time_and_a_template() {
    use common::pki::Ca;
    let b = Backend::start(|_| async {
        tokio::time::sleep(Duration::from_millis(30)).await;
        hyper::Response::new(full("slow"))
    })
    .await;
    let ca = Ca::new();
    let leaf = ca.leaf(&["app.test"]);
    let template = "{protocol} {tls} {request_id} up={upstream_ms} {status} {bytes} {pool} ua=\\\"{header.user-agent}\\\" {scheme}://{host}{uri}";
    for (format, expect_json) in [("json", true), (&format!("\"{template}\""), false)] {
        let dir = TempDir::new();
        let cert = dir.write("a.pem", &leaf.cert_pem);
        let key = dir.write("a.key", &leaf.key_pem);
        let log = dir.0.join("access.log");
        let path = dir.write(
            "sluice.conf",
            &format!(
                "global {{ admin off; access_log access.log {format} }}
listen 127.0.0.1:0 tls
site app.test {{ tls {} {}; request_id; proxy {} }}
",
                cert.display(),
                key.display(),
                b.addr
            ),
        );
        let s = Sluice::spawn(&["run", "-c", path.to_str().unwrap()], dir);
        let raw = b"GET /p?q=%221 HTTP/1.1\r\nHost: app.test\r\nUser-Agent: t\"x\r\nConnection: close\r\n\r\n";
        let out = common::pki::tls_exchange(s.addr, &ca, "app.test", raw).await;
        let (resp, _) = parse_response(&out)
            .unwrap_or_else(|| panic!("a response: {:?}", String::from_utf8_lossy(&out)));
        let id = resp
            .header("x-request-id")
            .unwrap_or_else(|| panic!("an id: {} {:?}", resp.status, resp.text()))
            .to_string();
        let got = lines(&log, 1);
        let line = got.first().expect("a line");
        if expect_json {
            let v: Value = serde_json::from_str(line).unwrap();
            assert_eq!(v["tls"], "TLSv1.3", "{line}");
            assert_eq!(v["request_id"], id.as_str(), "{line}");
            let up = v["upstream_ms"].as_u64().expect("upstream_ms");
            assert!(
                up >= 30 && up <= v["duration_ms"].as_u64().unwrap(),
                "{line}"
            );
        } else {
            let (head, rest) = line.split_once(" up=").unwrap();
            assert_eq!(head, format!("HTTP/1.1 TLSv1.3 {id}"), "{line}");
            assert!(
                rest.ends_with(" 200 4 app.test ua=\"t\\\"x\" https://app.test/p?q=%221"),
                "{line}"
            );
        }
    }
}

/// Every request gets one line (DESIGN §18.4): a client that gives up before the
/// answer (an HTTP/1.1 close, an HTTP/2 stream reset) is logged `499` with the bytes
/// sent, as is an HTTP/2 stream reset in the middle of the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_gives_up_gets_a_499_line() {
    let b = Backend::start(|req: hyper::Request<hyper::body::Incoming>| async move {
        if req.uri().path() == "/stream" {
            let (tx, body) = channel_body();
            tokio::spawn(async move {
                let _ = tx.send(bytes::Bytes::from_static(b"first")).await;
                tokio::time::sleep(Duration::from_secs(5)).await;
                let _ = tx.send(bytes::Bytes::from_static(b"late")).await;
            });
            return hyper::Response::new(body);
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        hyper::Response::new(full("late"))
    })
    .await;
    let (s, log) = logged("", &format!("site * {{ proxy {} }}", b.addr));
    // HTTP/1.1: the client closes before the answer.
    let mut c = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    use tokio::io::AsyncWriteExt;
    c.write_all(b"GET /h1 HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    while b.requests.load(std::sync::atomic::Ordering::SeqCst) < 1 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(c);
    let got = lines(&log, 1);
    let v: Value = serde_json::from_str(got.first().expect("a line for the h1 request")).unwrap();
    assert_eq!(
        (
            v["path"].as_str(),
            v["status"].as_u64(),
            v["bytes"].as_u64()
        ),
        (Some("/h1"), Some(499), Some(0)),
        "{v}"
    );
    // HTTP/2: the stream is reset before the answer.
    let (mut send, _conn) = h2c(s.addr).await;
    let req = hyper::Request::builder()
        .uri("http://a/h2")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let pending = tokio::spawn(send.send_request(req));
    while b.requests.load(std::sync::atomic::Ordering::SeqCst) < 2 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    pending.abort();
    let got = lines(&log, 2);
    let v: Value = serde_json::from_str(got.get(1).expect("a line for the reset stream")).unwrap();
    assert_eq!(
        (
            v["path"].as_str(),
            v["status"].as_u64(),
            v["protocol"].as_str()
        ),
        (Some("/h2"), Some(499), Some("HTTP/2")),
        "{v}"
    );
    // HTTP/2: reset in the middle of the answer, after 5 bytes.
    let req = hyper::Request::builder()
        .uri("http://a/stream")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    use http_body_util::BodyExt;
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(&first[..], b"first");
    drop(body);
    let got = lines(&log, 3);
    let v: Value = serde_json::from_str(got.get(2).expect("a line for the cut stream")).unwrap();
    assert_eq!(
        (
            v["path"].as_str(),
            v["status"].as_u64(),
            v["bytes"].as_u64()
        ),
        (Some("/stream"), Some(499), Some(5)),
        "{v}"
    );
    assert_eq!(got.len(), 3, "one line each: {got:?}");
}

/// `access_log` in a site block (DESIGN §18.9): that site's lines go to its own file,
/// in its own format, whichever of its routes (or none) answered; `access_log off`
/// keeps a site out of every log; other sites use the global one. A reload can change
/// a site's format (its template's fields) and drop the global log, and the sites'
/// lines go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_site_s_own_access_log_takes_its_lines() {
    let dir = TempDir::new();
    let (global, own) = (dir.0.join("access.log"), dir.0.join("a.log"));
    let conf = |head: &str, a_log: &str| {
        format!(
            "global {{ admin off; {head} }}\nlisten 127.0.0.1:0\n\
             site a.test {{ access_log a.log {a_log}\n route /x {{ respond \"x\" }} }}\n\
             site b.test {{ access_log off\n respond \"b\" }}\n\
             site * {{ respond \"other\" }}\n"
        )
    };
    let path = dir.write(
        "sluice.conf",
        &conf("access_log access.log json", "combined"),
    );
    let s = Sluice::spawn(&["run", "-c", path.to_str().unwrap()], dir);
    let auth = [("Host", "a.test"), ("Authorization", "Basic YWxpY2U6cHc=")];
    assert_eq!(request(s.addr, "GET", "/x", &auth, b"").await.status, 200);
    assert_eq!(get_host(s.addr, "a.test", "/nothing").await.status, 404);
    assert_eq!(get_host(s.addr, "b.test", "/").await.text(), "b");
    assert_eq!(get_host(s.addr, "c.test", "/c").await.text(), "other");
    let a = lines(&own, 2);
    assert_eq!(a.len(), 2, "{a:?}");
    assert!(
        a[0].starts_with("127.0.0.1 - alice [") && a[0].contains("\"GET /x HTTP/1.1\" 200 1"),
        "{a:?}"
    );
    assert!(a[1].contains("\"GET /nothing HTTP/1.1\" 404"), "{a:?}");
    let g = lines(&global, 1);
    std::thread::sleep(Duration::from_millis(100));
    let g2 = lines(&global, 1);
    assert_eq!((g.len(), g2.len()), (1, 1), "only c.test's line: {g2:?}");
    let v: Value = serde_json::from_str(&g[0]).unwrap();
    assert_eq!(
        (v["host"].as_str(), v["path"].as_str()),
        (Some("c.test"), Some("/c"))
    );

    // No global log any more, and a template for a.test with a request field.
    std::fs::write(&path, conf("", "\"{host} {status} {header.x-tenant}\"")).unwrap();
    s.signal("HUP");
    s.wait_log("reloaded: revision 2");
    let t = [("Host", "a.test"), ("X-Tenant", "acme")];
    assert_eq!(request(s.addr, "GET", "/x", &t, b"").await.status, 200);
    assert_eq!(get_host(s.addr, "c.test", "/c").await.text(), "other");
    let a = lines(&own, 3);
    assert_eq!(
        a.get(2).map(String::as_str),
        Some("a.test 200 acme"),
        "{a:?}"
    );
    assert_eq!(lines(&global, 2).len(), 1, "the global log is off now");
}

/// `global { log_format json }`: sluice's own lines are JSON objects, with their
/// fields as members.
#[tokio::test]
async fn log_format_json_makes_sluice_s_own_lines_json() {
    let s = Sluice::start("global { log_format json }\nsite * { respond ok }");
    let line = s.wait_log("listening on");
    let line = line
        .lines()
        .find(|l| l.contains("listening on"))
        .unwrap()
        .to_string();
    let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(v["level"], "INFO");
    assert!(
        v["msg"]
            .as_str()
            .unwrap()
            .starts_with("sluice: listening on"),
        "{v}"
    );
    assert!(line.starts_with("{\"ts\":"), "the time first: {line}");
    assert!(v["ts"].as_str().unwrap().ends_with('Z'), "{v}");
}

/// A request whose fields are kept as they came (a plain proxy route: no map is built
/// for it) is logged alike: the global template's and the site's own log's fields, the
/// user, the agent and the host, in any case as the client spelled them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lines_read_the_fields_as_they_came() {
    let b = Backend::text("hello").await;
    let dir = TempDir::new();
    let (global, own) = (dir.0.join("access.log"), dir.0.join("a.log"));
    let path = dir.write(
        "sluice.conf",
        &format!(
            "global {{ admin off; access_log access.log \"{{host}} t={{header.x-tenant}}\" }}
listen 127.0.0.1:0
site a.test {{ access_log a.log \"{{host}} {{header.x-tenant}} {{header.user-agent}}\"
 proxy {b} }}
site * {{ proxy {b} }}
",
            b = b.addr
        ),
    );
    let s = Sluice::spawn(&["run", "-c", path.to_str().unwrap()], dir);
    let mut c = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    use tokio::io::AsyncWriteExt;
    c.write_all(
        b"GET /x HTTP/1.1\r\nhost: A.Test\r\nx-TENANT: acme\r\nUSER-agent: ua/1\r\n\
          Connection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let out = answers(&mut c).await;
    assert_eq!(out[0].status, 200);
    let r = request(
        s.addr,
        "GET",
        "/y",
        &[("Host", "c.test"), ("X-Tenant", "other")],
        b"",
    )
    .await;
    assert_eq!(r.text(), "hello");
    let a = lines(&own, 1);
    assert_eq!(a, ["A.Test acme ua/1"], "{a:?}");
    let g = lines(&global, 1);
    assert_eq!(g, ["c.test t=other"], "{g:?}");
}
