//! HTTP/3 on `listen ADDR tls quic`: the same sites, routes, filters and handlers as
//! over TCP, bodies streamed both ways, SNI choosing the certificate, `Alt-Svc` on the
//! TCP side, GOAWAY on shutdown and on a reload that removes the listener, and bad
//! packets or frames costing one connection, never the process.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::h3c::{self, H3};
use common::pki::{any_cert_client, tls_exchange, Ca, Leaf};
use common::*;

/// A CA, a folder, and a certificate for `a.test` in it (its two files' paths).
fn a_test() -> (Ca, TempDir, String, String) {
    let ca = Ca::new();
    let dir = TempDir::new();
    let (ac, ak) = write_pair(&dir, "a", &ca.leaf(&["a.test"]));
    (ca, dir, ac, ak)
}

/// An HTTP/3 connection to `a.test` through sluice.
async fn connect_a(sluice: &Sluice, ca: &Ca) -> H3 {
    h3c::connect(sluice.addr, ca.client(&[]), "a.test")
        .await
        .expect("an h3 connection")
}

fn write_pair(dir: &TempDir, name: &str, leaf: &Leaf) -> (String, String) {
    let c = dir.write(&format!("{name}.pem"), &leaf.cert_pem);
    let k = dir.write(&format!("{name}.key"), &leaf.key_pem);
    (c.display().to_string(), k.display().to_string())
}

#[tokio::test]
async fn every_handler_answers_over_h3_with_sni_alt_svc_and_limits() {
    let ca = Ca::new();
    let dir = TempDir::new();
    let a = ca.leaf(&["a.test"]);
    let b = ca.leaf(&["b.test"]);
    let (ac, ak) = write_pair(&dir, "a", &a);
    let (bc, bk) = write_pair(&dir, "b", &b);
    let m = ca.leaf(&["m.test"]);
    let (mc, mk) = write_pair(&dir, "m", &m);
    let clients = dir.write("clients.pem", &Ca::new().pem());
    dir.write("www/hello.txt", "hello from a file\n");
    let www = dir.0.join("www");
    let backend = Backend::echo_head_and_body().await;
    let sluice = Sluice::start(&format!(
        "listen 127.0.0.1:0 tls quic
         site a.test {{
           tls {ac} {ak}
           route /files/* {{ strip /files; files {www} }}
           route /go {{ redirect 301 https://elsewhere.test/ }}
           route /fixed {{ respond 203 \"fixed answer\" }}
           route /* {{ header_down X-Route proxied; proxy {be} }}
         }}
         site b.test {{ tls {bc} {bk}; http_versions 1.1 2; respond \"b site\" }}
         site m.test {{
           tls {mc} {mk} {{ client_ca {clients} }}
           respond \"m site\"
         }}",
        clients = clients.display(),
        www = www.display(),
        be = backend.addr
    ));
    let port = sluice.addr.port();
    let mut c = h3c::connect(sluice.addr, ca.client(&[]), "a.test")
        .await
        .expect("an h3 connection");
    // Proxy: the backend hears an HTTPS request with the right host.
    let r = c.get("a.test", "/api?q=1").await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let t = r.text();
    assert!(t.starts_with("GET /api?q=1\n"), "{t}");
    assert!(t.contains("host: a.test\n"), "{t}");
    assert!(t.contains("x-forwarded-proto: https\n"), "{t}");
    assert!(t.contains("body 0 0\n"), "a GET has no body: {t}");
    assert!(!t.contains("transfer-encoding"), "{t}");
    assert_eq!(r.header("x-route"), Some("proxied"));
    assert_eq!(r.header("alt-svc"), None, "never on h3 responses");
    // POST with a 1 MiB body, streamed through whole.
    let body: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
    let sum: u64 = body.iter().map(|b| u64::from(*b)).sum();
    for length in [true, false] {
        let mut req = http::Request::post("https://a.test/upload");
        if length {
            req = req.header("content-length", body.len());
        }
        let r = c
            .request(req.body(()).unwrap(), Bytes::from(body.clone()))
            .await
            .unwrap();
        assert_eq!(r.status, 200);
        assert!(
            r.text().contains(&format!("body {} {sum}\n", body.len())),
            "content-length {length}: {}",
            r.text()
        );
    }
    // Files, redirect, respond.
    let r = c.get("a.test", "/files/hello.txt").await.unwrap();
    assert_eq!((r.status, r.text().as_str()), (200, "hello from a file\n"));
    let r = c.get("a.test", "/go").await.unwrap();
    assert_eq!(r.status, 301);
    assert_eq!(r.header("location"), Some("https://elsewhere.test/"));
    let r = c.get("a.test", "/fixed").await.unwrap();
    assert_eq!((r.status, r.text().as_str()), (203, "fixed answer"));
    // An unknown site: 421, as on TCP.
    let r = c.get("nobody.test", "/").await.unwrap();
    assert_eq!(r.status, 421);
    // A site that verifies client certificates is TCP's only: 421 over HTTP/3, on a
    // connection made for it or for another name.
    let r = c.get("m.test", "/").await.unwrap();
    assert_eq!(r.status, 421);
    let mut mc = h3c::connect(sluice.addr, ca.client(&[]), "m.test")
        .await
        .unwrap();
    assert_eq!(mc.get("m.test", "/").await.unwrap().status, 421);
    // More header fields than HTTP/2 takes: 431.
    let mut req = http::Request::get("https://a.test/");
    for i in 0..120 {
        req = req.header(format!("x-f{i}"), "v");
    }
    let r = c
        .request(req.body(()).unwrap(), Bytes::new())
        .await
        .unwrap();
    assert_eq!(r.status, 431);
    // SNI picks the certificate: b.test's connection sees b's.
    let any = any_cert_client(&[]);
    for (name, leaf) in [("a.test", &a), ("b.test", &b)] {
        let h = h3c::connect(sluice.addr, any.clone(), name).await.unwrap();
        let chain = h
            .conn
            .peer_identity()
            .unwrap()
            .downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
            .unwrap();
        assert!(
            chain[0].as_ref() == leaf.der,
            "SNI {name} got the wrong certificate"
        );
    }
    // The TCP side advertises HTTP/3 on the same port, for sites served over it.
    let raw = tls_exchange(
        sluice.addr,
        &ca,
        "a.test",
        b"GET /fixed HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n",
    )
    .await;
    let (resp, _) = parse_response(&raw).unwrap();
    assert_eq!(
        resp.header("alt-svc"),
        Some(format!("h3=\":{port}\"; ma=86400").as_str())
    );
    let raw = tls_exchange(
        sluice.addr,
        &ca,
        "b.test",
        b"GET / HTTP/1.1\r\nHost: b.test\r\nConnection: close\r\n\r\n",
    )
    .await;
    let (resp, _) = parse_response(&raw).unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("alt-svc"), None, "b.test is not served over 3");
}

#[tokio::test]
async fn a_64_mib_download_streams_in_bounded_memory() {
    let (ca, _dir, ac, ak) = a_test();
    const TOTAL: usize = 64 << 20;
    let backend = Backend::start(|_| async move {
        let (tx, body) = channel_body();
        tokio::spawn(async move {
            let chunk = Bytes::from(vec![7u8; 64 << 10]);
            for _ in 0..TOTAL / chunk.len() {
                if tx.send(chunk.clone()).await.is_err() {
                    return;
                }
            }
        });
        hyper::Response::new(body)
    })
    .await;
    let sluice = Sluice::start(&format!(
        "listen 127.0.0.1:0 tls quic
         site a.test {{ tls {ac} {ak}; proxy {} }}",
        backend.addr
    ));
    let mut c = connect_a(&sluice, &ca).await;
    let (before, _) = rss_kib(sluice.pid());
    let req = http::Request::get("https://a.test/big").body(()).unwrap();
    let mut stream = c.send.send_request(req).await.unwrap();
    stream.finish().await.unwrap();
    let resp = stream.recv_response().await.unwrap();
    assert_eq!(resp.status(), 200);
    // The client reads nothing for a while: sluice must not buffer the backend's
    // 64 MiB meanwhile.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (stalled, _) = rss_kib(sluice.pid());
    let mut got = 0usize;
    let deadline = Instant::now() + Duration::from_secs(60);
    while let Some(chunk) = tokio::time::timeout_at(deadline.into(), stream.recv_data())
        .await
        .expect("the download finishes in time")
        .unwrap()
    {
        got += bytes::Buf::remaining(&chunk);
    }
    assert_eq!(got, TOTAL);
    assert!(
        stalled.saturating_sub(before) < 24 * 1024,
        "RSS grew from {before} KiB to {stalled} KiB while the client did not read"
    );
}

/// A backend that answers after `delay`.
async fn slow_backend(delay: Duration) -> Backend {
    Backend::start(move |_| async move {
        tokio::time::sleep(delay).await;
        hyper::Response::new(full("slow answer"))
    })
    .await
}

#[tokio::test]
async fn shutdown_sends_goaway_and_lets_open_streams_finish() {
    let (ca, _dir, ac, ak) = a_test();
    let backend = slow_backend(Duration::from_millis(800)).await;
    let mut sluice = Sluice::start(&format!(
        "global {{ grace 10s }}
         listen 127.0.0.1:0 tls quic
         site a.test {{ tls {ac} {ak}; proxy {} }}",
        backend.addr
    ));
    let mut c = connect_a(&sluice, &ca).await;
    let mut send = c.send.clone();
    let in_flight = tokio::spawn(async move {
        let req = http::Request::get("https://a.test/slow").body(()).unwrap();
        let mut s = send.send_request(req).await.unwrap();
        s.finish().await.unwrap();
        let resp = s.recv_response().await.unwrap();
        let mut body = Vec::new();
        while let Some(mut chunk) = s.recv_data().await.unwrap() {
            let n = bytes::Buf::remaining(&chunk);
            body.extend_from_slice(&bytes::Buf::copy_to_bytes(&mut chunk, n));
        }
        (resp.status(), body)
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    sluice.signal("TERM");
    // The GOAWAY arrives while that stream is open: the client starts no new one.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let refused = c.get("a.test", "/").await.unwrap_err();
    assert!(refused.contains("closing"), "{refused}");
    let (status, body) = tokio::time::timeout(WAIT, in_flight)
        .await
        .expect("the open stream finishes")
        .unwrap();
    assert_eq!(
        (status.as_u16(), body.as_slice()),
        (200, &b"slow answer"[..])
    );
    // GOAWAY came: the connection ends cleanly, and no new stream is served on it.
    let end = tokio::time::timeout(WAIT, &mut c.closed)
        .await
        .expect("the connection closes")
        .unwrap();
    assert!(end.is_h3_no_error(), "closed with {end}");
    assert_eq!(sluice.wait_exit(WAIT), Some(0));
    assert!(c.get("a.test", "/").await.is_err());
}

#[tokio::test]
async fn a_reload_that_removes_quic_sends_goaway_and_stops_alt_svc() {
    let (ca, dir, ac, ak) = a_test();
    let site = format!("site a.test {{ tls {ac} {ak}; respond \"hi\" }}");
    // A port named in the file: the reloads keep the TCP listener and change only quic.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let text = |quic: &str| without_admin(&format!("listen 127.0.0.1:{port} tls {quic}\n{site}"));
    let conf = dir.write("s.conf", &text("quic"));
    let sluice = Sluice::spawn(&["run", "-c", conf.to_str().unwrap()], TempDir::new());
    let alt = |resp: Resp| resp.header("alt-svc").map(str::to_string);
    let exchange = || async {
        let raw = tls_exchange(
            sluice.addr,
            &ca,
            "a.test",
            b"GET / HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n",
        )
        .await;
        parse_response(&raw).unwrap().0
    };
    let first = exchange().await;
    assert!(alt(first).is_some(), "{:?}", sluice.logs());
    let mut c = connect_a(&sluice, &ca).await;
    assert_eq!(c.get("a.test", "/").await.unwrap().text(), "hi");
    // quic removed, the TCP listener kept.
    std::fs::write(&conf, text("")).unwrap();
    sluice.signal("HUP");
    sluice.wait_log("reloaded: revision 2");
    let end = tokio::time::timeout(WAIT, &mut c.closed)
        .await
        .expect("the removed listener's connection is told to go")
        .unwrap();
    assert!(end.is_h3_no_error(), "closed with {end}");
    assert_eq!(alt(exchange().await), None);
    // And back: quic added beside the running TCP listener, once the old UDP socket
    // has closed (after its last connection's close went out).
    let end = Instant::now() + WAIT;
    while std::net::UdpSocket::bind(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < end,
            "the removed quic listener's socket stays open"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    std::fs::write(&conf, text("quic")).unwrap();
    sluice.signal("HUP");
    sluice.wait_log("reloaded: revision 3");
    assert!(alt(exchange().await).is_some());
    let mut c = connect_a(&sluice, &ca).await;
    assert_eq!(c.get("a.test", "/").await.unwrap().text(), "hi");
}

#[tokio::test]
async fn garbage_packets_and_bad_frames_cost_one_connection_not_the_process() {
    let (ca, _dir, ac, ak) = a_test();
    let sluice = Sluice::start(&format!(
        "listen 127.0.0.1:0 tls quic
         site a.test {{ tls {ac} {ak}; respond \"ok\" }}"
    ));
    // Datagrams that are no QUIC at all, and a long-header packet with a bad length.
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    for junk in [
        &b"GET / HTTP/1.1\r\n\r\n"[..],
        &[
            0xc0, 0, 0, 0, 1, 8, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0xff, 0xff,
        ][..],
        &[0u8; 1200][..],
        &[0xffu8; 1350][..],
    ] {
        udp.send_to(junk, sluice.addr).unwrap();
    }
    // An HTTP/3 request stream that starts with DATA instead of HEADERS: the
    // connection is closed with H3_FRAME_UNEXPECTED (0x105).
    let e = h3c::client_endpoint(ca.client(&[]));
    let conn = e.connect(sluice.addr, "a.test").unwrap().await.unwrap();
    let (mut tx, _rx) = conn.open_bi().await.unwrap();
    tx.write_all(&[0x00, 0x03, b'a', b'b', b'c']).await.unwrap();
    let reason = tokio::time::timeout(WAIT, conn.closed()).await.unwrap();
    match reason {
        quinn::ConnectionError::ApplicationClosed(c) => {
            assert_eq!(c.error_code, quinn::VarInt::from_u32(0x105), "{c:?}")
        }
        other => panic!("expected an application close, got {other:?}"),
    }
    // The process serves on.
    let mut c: H3 = connect_a(&sluice, &ca).await;
    assert_eq!(c.get("a.test", "/").await.unwrap().text(), "ok");
}

#[test]
fn quic_needs_tls_and_no_proxy_protocol() {
    let dir = TempDir::new();
    assert_check_fails(
        &dir,
        "listen :8443 quic\nsite a { respond ok }",
        "`tls` before `quic`",
    );
    assert_check_fails(
        &dir,
        "listen :8443 tls quic proxy_protocol\nsite a { respond ok }",
        "without `proxy_protocol`",
    );
}

#[tokio::test]
async fn h3_requests_are_logged_metered_and_counted_as_h3() {
    let (ca, dir, ac, ak) = a_test();
    let log = dir.0.join("access.log");
    let conf = dir.write(
        "s.conf",
        &format!(
            "global {{ admin 127.0.0.1:0; access_log {} json }}
             listen 127.0.0.1:0 tls quic
             site a.test {{ tls {ac} {ak}; route /api/* {{ respond \"api\" }} }}",
            log.display()
        ),
    );
    let sluice = Sluice::spawn(&["run", "-c", conf.to_str().unwrap()], TempDir::new());
    let admin = sluice.admin();
    let mut c = connect_a(&sluice, &ca).await;
    for _ in 0..3 {
        assert_eq!(c.get("a.test", "/api/x").await.unwrap().text(), "api");
    }
    // A response is counted once its stream is done, a moment after the client read it.
    let end = Instant::now() + WAIT;
    let m = loop {
        let m = request(admin, "GET", "/metrics", &[], b"").await.text();
        let api = m.lines().find(|l| {
            l.starts_with("sluice_http_requests_total{")
                && l.contains("/api/*")
                && l.contains("2xx")
        });
        if api.is_some_and(|l| l.ends_with(" 3")) {
            break m;
        }
        assert!(
            Instant::now() < end,
            "the /api/* series never reached 3: {m}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(m.contains("\nsluice_h3_requests_total 3\n"), "{m}");
    assert!(m.contains("\nsluice_quic_connections_total 1\n"), "{m}");
    // One JSON line each, naming the protocol.
    let end = Instant::now() + WAIT;
    let text = loop {
        let t = std::fs::read_to_string(&log).unwrap_or_default();
        if t.lines().count() >= 3 || Instant::now() > end {
            break t;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3, "{text}");
    for l in &lines {
        assert_eq!(l["protocol"], "HTTP/3", "{l}");
        assert_eq!(l["status"], 200, "{l}");
    }
}

#[tokio::test]
async fn framing_tricks_are_refused_before_the_backend() {
    let (ca, _dir, ac, ak) = a_test();
    let backend = Backend::echo_head_and_body().await;
    let sluice = Sluice::start(&format!(
        "listen 127.0.0.1:0 tls quic
         site a.test {{ tls {ac} {ak}; proxy {} }}",
        backend.addr
    ));
    let mut c = connect_a(&sluice, &ca).await;
    let post = |fields: &[(&str, &str)]| {
        let mut r = http::Request::post("https://a.test/x");
        for (k, v) in fields {
            r = r.header(*k, *v);
        }
        r.body(()).unwrap()
    };
    let smuggled = Bytes::from_static(b"hello GET /admin HTTP/1.1\r\nHost: a.test\r\n\r\n");
    for fields in [
        &[("content-length", " 5")][..],
        &[("content-length", "1,1")],
        &[("content-length", "abc")],
        &[("content-length", "5"), ("content-length", "6")],
        &[("transfer-encoding", "chunked")],
        &[("connection", "keep-alive")],
        &[("te", "gzip")],
    ] {
        let r = c.request(post(fields), smuggled.clone()).await.unwrap();
        assert_eq!(r.status, 400, "{fields:?}: {}", r.text());
    }
    // A length the stream's end contradicts at once.
    let r = c
        .request(post(&[("content-length", "10")]), Bytes::new())
        .await
        .unwrap();
    assert_eq!(r.status, 400);
    assert_eq!(
        backend.requests.load(std::sync::atomic::Ordering::SeqCst),
        0
    );
    // A repeated equal length is one field; the body reaches the backend whole.
    let r = c
        .request(
            post(&[("content-length", "5"), ("content-length", "5")]),
            Bytes::from_static(b"hello"),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert!(r.text().contains("body 5 "), "{}", r.text());
    // HEAD: the length and date of the answer, no body.
    let head = http::Request::head("https://a.test/x").body(()).unwrap();
    let r = c.request(head, Bytes::new()).await.unwrap();
    assert_eq!(r.status, 200);
    assert!(r.body.is_empty());
    assert!(r.header("date").is_some());
}

/// The `_` spellings of the fields sluice sets never reach the backend over HTTP/3
/// either (DESIGN §18.2; `tests/forwarding.rs` loops the HTTP/1.1 and HTTP/2 fronts).
#[tokio::test]
async fn no_spelling_of_a_field_sluice_sets_reaches_the_backend_over_h3() {
    let (ca, _dir, ac, ak) = a_test();
    let backend = Backend::echo_head().await;
    let sluice = Sluice::start(&format!(
        "listen 127.0.0.1:0 tls quic
         site a.test {{ tls {ac} {ak}; proxy {} {{ header_up Remote-User alice }} }}",
        backend.addr
    ));
    let mut c = connect_a(&sluice, &ca).await;
    for name in [
        "Remote_User",
        "REMOTE_USER",
        "X_Forwarded_For",
        "x_forwarded-proto",
        "X_Forwarded_Host",
        "X_Sluice_Peer",
    ] {
        let req = http::Request::builder()
            .uri("https://a.test/p")
            .header(name, "forged")
            .body(())
            .unwrap();
        let r = c
            .request(req, bytes::Bytes::new())
            .await
            .expect("an answer");
        let text = r.text();
        assert!(
            !text.contains("forged"),
            "h3: `{name}` passed beside the field sluice sets: {text}"
        );
        assert!(text.contains("remote-user: alice\n"), "{text}");
    }
}

/// Reads one request from a raw backend connection: its head, and a chunked body with
/// its trailer section when it has one.
async fn read_request(c: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&got).to_string();
        if let Some(end) = text.find("\r\n\r\n") {
            let chunked = text[..end]
                .to_ascii_lowercase()
                .contains("transfer-encoding: chunked");
            if !chunked
                || text[end + 4..].contains("\r\n\r\n")
                || text[end + 4..].starts_with("0\r\n\r\n")
            {
                return text;
            }
        }
        match tokio::time::timeout(Duration::from_secs(10), c.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
            _ => return String::from_utf8_lossy(&got).to_string(),
        }
    }
}

/// Over HTTP/3 (DESIGN §18.5): a backend's `103 Early Hints` reaches the client before
/// its answer; trailers go both ways (the request's to an HTTP/1.1 backend as chunked
/// trailer fields, the backend's back as an h3 trailer section); and a request body
/// keeps flowing after the response head arrived (a ping-pong echo through an h2c
/// backend, which hung before: each message waited for the one before it to return).
#[tokio::test]
async fn h3_relays_early_hints_trailers_and_full_duplex() {
    use bytes::Buf;
    use tokio::io::AsyncWriteExt;
    let (ca, _dir, ac, ak) = a_test();
    let (raw, _raw_task) = raw_backend(|mut c| async move {
        let req = read_request(&mut c).await;
        let reply = if req.starts_with("GET /early") {
            let _ = c
                .write_all(b"HTTP/1.1 103 Early Hints\r\nlink: </a.css>; rel=preload\r\n\r\n")
                .await;
            tokio::time::sleep(Duration::from_millis(100)).await;
            "HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\nfinal".to_string()
        } else {
            let saw = req.to_ascii_lowercase().contains("\r\nx-client: yes\r\n");
            let body = format!("saw-trailer={saw}");
            format!(
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: x-sum\r\nconnection: close\r\n\r\n{:x}\r\n{body}\r\n0\r\nx-sum: 42\r\n\r\n",
                body.len()
            )
        };
        let _ = c.write_all(reply.as_bytes()).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    })
    .await;
    let (echo, _echo_task) = h2c_echo().await;
    let sluice = Sluice::start(&format!(
        "listen 127.0.0.1:0 tls quic
         site a.test {{
           tls {ac} {ak}
           route /echo {{ proxy h2c://{echo} }}
           route /* {{ proxy {raw} }}
         }}"
    ));
    let mut h3 = connect_a(&sluice, &ca).await;

    // 103, then the answer.
    let req = http::Request::get("https://a.test/early").body(()).unwrap();
    let mut s = h3.send.send_request(req).await.unwrap();
    s.finish().await.unwrap();
    let first = s.recv_response().await.unwrap();
    assert_eq!(first.status(), 103);
    assert_eq!(first.headers()["link"], "</a.css>; rel=preload");
    let last = s.recv_response().await.unwrap();
    assert_eq!(last.status(), 200);

    // Trailers both ways.
    let req = http::Request::post("https://a.test/trailers")
        .body(())
        .unwrap();
    let mut s = h3.send.send_request(req).await.unwrap();
    s.send_data(Bytes::from_static(b"body")).await.unwrap();
    let mut t = http::HeaderMap::new();
    t.insert("x-client", "yes".parse().unwrap());
    s.send_trailers(t).await.unwrap();
    s.finish().await.unwrap();
    let resp = s.recv_response().await.unwrap();
    assert_eq!(resp.status(), 200, "{}", sluice.logs());
    let mut body = Vec::new();
    while let Some(mut d) = s.recv_data().await.unwrap() {
        let n = d.remaining();
        body.extend_from_slice(&d.copy_to_bytes(n));
    }
    assert_eq!(
        body, b"saw-trailer=true",
        "the request's trailer reached the backend"
    );
    let trailers = s
        .recv_trailers()
        .await
        .unwrap()
        .expect("the response's trailers");
    assert_eq!(trailers["x-sum"], "42");

    // Full duplex: each message goes out only after the one before came back.
    let req = http::Request::post("https://a.test/echo").body(()).unwrap();
    let mut s = h3.send.send_request(req).await.unwrap();
    s.send_data(Bytes::from_static(b"ping0")).await.unwrap();
    let resp = tokio::time::timeout(WAIT, s.recv_response())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut got = Vec::new();
    for i in 0..5 {
        if i > 0 {
            s.send_data(Bytes::from(format!("ping{i}"))).await.unwrap();
        }
        let mut d = tokio::time::timeout(WAIT, s.recv_data())
            .await
            .unwrap_or_else(|_| panic!("echo {i} came back"))
            .unwrap()
            .unwrap();
        let n = d.remaining();
        got.push(String::from_utf8(d.copy_to_bytes(n).to_vec()).unwrap());
    }
    assert_eq!(got, ["ping0", "ping1", "ping2", "ping3", "ping4"]);
    s.finish().await.unwrap();
}
