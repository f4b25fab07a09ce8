//! A site's operator controls over real sockets (DESIGN §15.2, §15.8): maintenance on a
//! site or route and through the admin API, the redirect of plain requests to HTTPS,
//! HSTS on TLS responses, and the HTTP versions a site is served over.

mod common;

use std::error::Error as _;
use std::net::SocketAddr;

use bytes::Bytes;
use common::pebble::free_port;
use common::pki::{connect, Ca};
use common::*;
use http_body_util::{BodyExt, Empty};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn at(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

async fn status_sites(admin: SocketAddr) -> serde_json::Value {
    let st: serde_json::Value = serde_json::from_str(&get(admin, "/status").await.text()).unwrap();
    st["sites"].clone()
}

#[tokio::test]
async fn maintenance_answers_everyone_but_the_allowed_and_is_switched_at_run_time() {
    let b = Backend::text("app").await;
    let dir = TempDir::new();
    let page = dir.write("down.html", "<h1>back soon</h1>");
    let s = Sluice::start(&format!(
        "global {{ admin 127.0.0.1:0\n trust 127.0.0.2/32 }}
        site down.test {{
            maintenance 503 file {page} allow 10.9.0.0/16
            route /api/* {{
                maintenance 502 \"api resting\"
                proxy {a}
            }}
            route /open/* {{ proxy {a} }}
        }}
        site up.test {{ proxy {a} }}
        site *.wild.test {{ proxy {a} }}",
        page = page.display(),
        a = b.addr
    ));
    let host = |h: &'static str| [("Host", h)];
    // The site's page, with Retry-After; a route's own setting wins; a path no route
    // takes is in maintenance too.
    for (path, status, body, ctype) in [
        (
            "/open/x",
            503,
            "<h1>back soon</h1>",
            "text/html; charset=utf-8",
        ),
        (
            "/nowhere",
            503,
            "<h1>back soon</h1>",
            "text/html; charset=utf-8",
        ),
        ("/api/x", 502, "api resting", "text/plain; charset=utf-8"),
    ] {
        let r = request(s.addr, "GET", path, &host("down.test"), b"").await;
        assert_eq!(r.status, status, "{path}");
        assert_eq!(r.text(), body, "{path}");
        assert_eq!(r.header("retry-after"), Some("120"), "{path}");
        assert_eq!(r.header("content-type"), Some(ctype), "{path}");
    }
    // `allow` clients, after `trust`, pass: the route's maintenance has no allow.
    let fwd = [("Host", "down.test"), ("X-Forwarded-For", "10.9.1.1")];
    assert_eq!(
        request(s.addr, "GET", "/open/x", &fwd, b"").await.status,
        503,
        "untrusted peer"
    );
    let admin = s.admin();
    assert_eq!(
        request(s.addr, "GET", "/open/x", &host("up.test"), b"")
            .await
            .text(),
        "app"
    );
    let sites = status_sites(admin).await;
    assert_eq!(
        sites[0],
        serde_json::json!({"name": "down.test", "maintenance": true})
    );
    assert_eq!(
        sites[1],
        serde_json::json!({"name": "up.test", "maintenance": false})
    );
    // Switched on where nothing is configured: the default answer.
    let r = post_json(admin, "/maintenance", r#"{"site": "UP.test", "on": true}"#).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.text().trim_end(), r#"{"on":true,"site":"up.test"}"#);
    let r = request(s.addr, "GET", "/", &host("up.test"), b"").await;
    assert_eq!(r.status, 503);
    assert_eq!(r.text(), "Down for maintenance\n");
    assert_eq!(status_sites(admin).await[1]["maintenance"], true);
    // Any of a site's names as written; off wins over the configured setting.
    assert_eq!(
        post_json(
            admin,
            "/maintenance",
            r#"{"site": "*.wild.test", "on": true}"#
        )
        .await
        .status,
        200
    );
    assert_eq!(
        request(s.addr, "GET", "/", &host("a.wild.test"), b"")
            .await
            .status,
        503
    );
    assert_eq!(
        post_json(
            admin,
            "/maintenance",
            r#"{"site": "down.test", "on": false}"#
        )
        .await
        .status,
        200
    );
    assert_eq!(
        request(s.addr, "GET", "/api/x", &host("down.test"), b"")
            .await
            .text(),
        "app"
    );
    assert_eq!(status_sites(admin).await[0]["maintenance"], false);
    // Mistakes.
    assert_eq!(
        post_json(
            admin,
            "/maintenance",
            r#"{"site": "nope.test", "on": true}"#
        )
        .await
        .status,
        404
    );
    assert_eq!(
        post_json(admin, "/maintenance", r#"{"site": "up.test"}"#)
            .await
            .status,
        400
    );
    assert_eq!(post_json(admin, "/maintenance", "on").await.status, 400);
    let form = request(
        admin,
        "POST",
        "/maintenance",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        b"site=up.test&on=true",
    )
    .await;
    assert_eq!(form.status, 415);
    let m = get(admin, "/metrics").await.text();
    assert!(m.contains("sluice_maintenance_answers_total 6"), "{m}");
}

#[tokio::test]
async fn maintenance_lets_allowed_clients_through_and_a_reload_resets_the_switch() {
    let b = Backend::text("app").await;
    let dir = TempDir::new();
    let text = format!(
        "listen 127.0.0.1:0\nglobal {{ admin 127.0.0.1:0\n trust 127.0.0.1/32 }}
        site * {{ maintenance allow 10.9.0.0/16 192.0.2.7\n proxy {a} }}",
        a = b.addr
    );
    let path = dir.write("sluice.conf", &text);
    let s = Sluice::spawn(&["run", "-c", path.to_str().unwrap()], dir);
    let r = get(s.addr, "/").await;
    assert_eq!(
        (r.status, r.text().as_str()),
        (503, "Down for maintenance\n")
    );
    for ip in ["10.9.200.1", "192.0.2.7"] {
        let r = request(s.addr, "GET", "/", &[("X-Forwarded-For", ip)], b"").await;
        assert_eq!(r.text(), "app", "{ip}");
    }
    let r = request(s.addr, "GET", "/", &[("X-Forwarded-For", "192.0.2.8")], b"").await;
    assert_eq!(r.status, 503);
    let admin = s.admin();
    assert_eq!(
        post_json(admin, "/maintenance", r#"{"site": "*", "on": false}"#)
            .await
            .status,
        200
    );
    assert_eq!(get(s.addr, "/").await.text(), "app");
    // The next reload starts from the file again.
    s.signal("HUP");
    s.wait_log("reloaded");
    assert_eq!(get(s.addr, "/").await.status, 503);
}

async fn raw_tls_get(addr: SocketAddr, ca: &Ca, host: &str, path: &str) -> Resp {
    let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    let out = common::pki::tls_exchange(addr, ca, host, req.as_bytes()).await;
    parse_response(&out).unwrap().0
}

#[tokio::test]
async fn plain_requests_go_to_https_which_carries_hsts() {
    let ca = Ca::new();
    let dir = TempDir::new();
    let leaf = ca.leaf(&["app.test", "other.test"]);
    let cert = dir.write("app.pem", &leaf.cert_pem);
    let key = dir.write("app.key", &leaf.key_pem);
    let b = Backend::text("app").await;
    let (plain, tls) = (free_port(), free_port());
    let s = Sluice::start(&format!(
        "listen 127.0.0.1:{plain}
        listen 127.0.0.1:{tls} tls
        site app.test {{
            tls {c} {k}
            https_redirect
            hsts 365d subdomains preload
            proxy {a}
        }}
        site other.test {{
            tls {c} {k}
            https_redirect 301
            route /only {{ respond \"only\" }}
        }}
        site plain.test {{ proxy {a} }}
        site h2only.test {{
            tls {c} {k}
            https_redirect
            http_versions 2
            respond \"h2\"
        }}",
        c = cert.display(),
        k = key.display(),
        a = b.addr
    ));
    let _ = s.addr;
    // Redirected with the path and query as received; the port named as it is not 443.
    let r = request(
        at(plain),
        "GET",
        "/a%20b/c?x=1&y",
        &[("Host", "App.Test:8080")],
        b"",
    )
    .await;
    assert_eq!(r.status, 308);
    assert_eq!(
        r.header("location"),
        Some(format!("https://app.test:{tls}/a%20b/c?x=1&y").as_str())
    );
    assert_eq!(
        r.header("strict-transport-security"),
        None,
        "never on plain HTTP"
    );
    let r = request(
        at(plain),
        "POST",
        "/form",
        &[("Host", "other.test")],
        b"x=1",
    )
    .await;
    assert_eq!(r.status, 301);
    let r = request(at(plain), "GET", "/v6", &[("Host", "[::1]:8080")], b"").await;
    assert_eq!(r.status, 421, "no site for ::1: no redirect either");
    // ACME challenges stay on plain HTTP; a spelling that leaves that folder does not.
    let r = request(
        at(plain),
        "GET",
        "/.well-known/acme-challenge/tok",
        &[("Host", "app.test")],
        b"",
    )
    .await;
    assert_eq!((r.status, r.text().as_str()), (200, "app"));
    let r = request(
        at(plain),
        "GET",
        "/.well-known/acme-challenge/../admin",
        &[("Host", "app.test")],
        b"",
    )
    .await;
    assert_eq!(r.status, 308);
    let r = request(
        at(plain),
        "GET",
        "/.well-known/acme-challenge/%2e%2e/admin",
        &[("Host", "app.test")],
        b"",
    )
    .await;
    assert_eq!(r.status, 308);
    // An HTTP/2-only site still sends an HTTP/1.1 visitor to HTTPS, and serves ACME
    // challenges on plain HTTP.
    let r = request(at(plain), "GET", "/x", &[("Host", "h2only.test")], b"").await;
    assert_eq!(r.status, 308);
    let r = request(
        at(plain),
        "GET",
        "/.well-known/acme-challenge/t",
        &[("Host", "h2only.test")],
        b"",
    )
    .await;
    assert_eq!((r.status, r.text().as_str()), (200, "h2"));
    // A Host that is not one never reaches a site (nor a Location).
    for host in ["evil.test/.app.test", "evil.test?.app.test", "a@app.test"] {
        let r = request(at(plain), "GET", "/p", &[("Host", host)], b"").await;
        assert_eq!(r.status, 400, "{host}");
        assert_eq!(r.header("location"), None);
    }
    // A site without it is served on plain HTTP.
    assert_eq!(
        request(at(plain), "GET", "/", &[("Host", "plain.test")], b"")
            .await
            .text(),
        "app"
    );
    // Over TLS: served, with HSTS on the backend's answers and on sluice's own.
    let r = raw_tls_get(at(tls), &ca, "app.test", "/x").await;
    assert_eq!(r.text(), "app");
    assert_eq!(
        r.header("strict-transport-security"),
        Some("max-age=31536000; includeSubDomains; preload")
    );
    let r = raw_tls_get(at(tls), &ca, "other.test", "/missing").await;
    assert_eq!(r.status, 404);
    assert_eq!(
        r.header("strict-transport-security"),
        None,
        "other.test has no hsts"
    );
}

#[tokio::test]
async fn http_versions_narrow_alpn_and_refuse_the_other_protocol() {
    let ca = Ca::new();
    let dir = TempDir::new();
    let leaf = ca.leaf(&["one.test", "two.test", "both.test"]);
    let cert = dir.write("a.pem", &leaf.cert_pem);
    let key = dir.write("a.key", &leaf.key_pem);
    let (plain, tls) = (free_port(), free_port());
    let _s = Sluice::start(&format!(
        "listen 127.0.0.1:{plain}
        listen 127.0.0.1:{tls} tls
        site one.test {{ tls {c} {k}\n http_versions 1.1\n respond one }}
        site two.test {{ tls {c} {k}\n http_versions 2\n respond two }}
        site both.test {{ tls {c} {k}\n respond both }}",
        c = cert.display(),
        k = key.display()
    ));
    let both: &[&[u8]] = &[b"h2", b"http/1.1"];
    // ALPN offers what the SNI name's site is served over.
    for (sni, want) in [
        ("one.test", &b"http/1.1"[..]),
        ("two.test", &b"h2"[..]),
        ("both.test", &b"h2"[..]),
    ] {
        let s = connect(at(tls), ca.client(both), Some(sni)).await.unwrap();
        assert_eq!(s.get_ref().1.alpn_protocol(), Some(want), "{sni}");
    }
    // A client that only speaks HTTP/1.1 cannot reach an HTTP/2-only site.
    assert!(
        connect(at(tls), ca.client(&[b"http/1.1"]), Some("two.test"))
            .await
            .is_err()
    );
    // Without ALPN the connection is HTTP/1.1: 505 from the HTTP/2-only site.
    let r = {
        let mut s = connect(at(tls), ca.client(&[]), Some("two.test"))
            .await
            .unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: two.test\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut buf = Vec::new();
        let _ = tokio::time::timeout(WAIT, s.read_to_end(&mut buf)).await;
        parse_response(&buf).unwrap().0
    };
    assert_eq!(r.status, 505);
    // HTTP/2 for a site that excludes it (h2c prior knowledge on the plain listener, or
    // a Host other than the SNI name): the stream is reset with HTTP_1_1_REQUIRED.
    let (mut send, _conn) = h2c(at(plain)).await;
    let req = hyper::Request::get("http://one.test/")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let e = send.send_request(req).await.unwrap_err();
    let reason = e
        .source()
        .and_then(|s| s.downcast_ref::<h2::Error>())
        .and_then(|h| h.reason());
    assert_eq!(reason, Some(h2::Reason::HTTP_1_1_REQUIRED), "{e:?}");
    let req = hyper::Request::get("http://both.test/")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let r = send.send_request(req).await.unwrap();
    assert_eq!(r.into_body().collect().await.unwrap().to_bytes(), "both");
    let s = connect(at(tls), ca.client(both), Some("both.test"))
        .await
        .unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(s),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let req = hyper::Request::get("https://one.test/")
        .body(Empty::<Bytes>::new())
        .unwrap();
    assert!(send.send_request(req).await.is_err());
}

#[test]
fn mistakes_in_controls_are_load_errors() {
    let dir = TempDir::new();
    for (text, want) in [
        (
            "site * { https_redirect\n respond ok }",
            "needs a `tls` listener",
        ),
        (
            "listen :8443 tls\nsite * { https_redirect 303\n respond ok }",
            "301, 302, 307 or 308",
        ),
        (
            "site * { maintenance 200\n respond ok }",
            "a status code from 400 to 599",
        ),
        (
            "site * { maintenance file nope.html\n respond ok }",
            "nope.html",
        ),
        (
            "site * { maintenance \"x\" allow\n respond ok }",
            "expects more",
        ),
        (
            "site * { maintenance \"x\" deny 10.0.0.0/8\n respond ok }",
            "`allow CIDR...`",
        ),
        (
            "site * { maintenance\n maintenance 502\n respond ok }",
            "set twice",
        ),
        (
            "site * { hsts 1d preload\n respond ok }",
            "`preload` needs `subdomains`",
        ),
        (
            "site * { hsts 1d sometimes\n respond ok }",
            "`subdomains` or `preload`",
        ),
        (
            "site * { http_versions 3\n respond ok }",
            "HTTP/1.1 or HTTP/2",
        ),
        (
            "site * { http_versions 1.0\n respond ok }",
            "`1.1`, `2` or `3`",
        ),
        ("site * { route /x { hsts 1d\n respond ok } }", "hsts"),
    ] {
        assert_check_fails(&dir, text, want);
    }
}
