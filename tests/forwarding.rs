//! What the backend receives and what the client gets back (DESIGN.md §8.9), over
//! every kind of backend address, from HTTP/1.1 and HTTP/2 clients.

mod common;

use std::collections::HashMap;

use common::*;
use hyper::body::Incoming;
use hyper::{Request, Response};

/// The head the echo backend saw: first line, then lower-case names to values.
fn seen(r: &Resp) -> (String, HashMap<String, String>) {
    let text = r.text();
    let mut lines = text.lines();
    let first = lines.next().unwrap_or_default().to_string();
    let map = lines
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    (first, map)
}

#[tokio::test]
async fn untrusted_clients_lose_forwarding_headers_and_hop_by_hop() {
    let b = Backend::echo_head().await;
    let s = Sluice::start(&format!("site * {{ proxy {} }}", b.addr));
    let r = request(
        s.addr,
        "GET",
        "/p?q=1",
        &[
            ("Host", "app.example:8080"),
            ("X-Forwarded-For", "6.6.6.6"),
            ("X-Forwarded-Proto", "https"),
            ("X-Real-IP", "6.6.6.6"),
            ("Forwarded", "for=6.6.6.6"),
            ("X-Sluice-Peer", "spoofed"),
            ("Keep-Alive", "timeout=5"),
            ("Proxy-Authorization", "secret"),
            ("X-Custom", "gone"),
            ("Connection", "X-Custom"),
            ("TE", "trailers"),
            ("X-Kept", "yes"),
        ],
        b"",
    )
    .await;
    let (first, h) = seen(&r);
    assert_eq!(first, "GET /p?q=1");
    assert_eq!(
        h.get("x-forwarded-for").map(String::as_str),
        Some("127.0.0.1"),
        "XFF is the client alone"
    );
    assert_eq!(h.get("x-forwarded-proto").map(String::as_str), Some("http"));
    assert_eq!(
        h.get("x-forwarded-host").map(String::as_str),
        Some("app.example:8080"),
        "XFH is Host as sent, port included"
    );
    assert_eq!(
        h.get("host").map(String::as_str),
        Some("app.example:8080"),
        "host keep is the default"
    );
    assert_eq!(
        h.get("te").map(String::as_str),
        Some("trailers"),
        "TE: trailers passes"
    );
    assert_eq!(h.get("x-kept").map(String::as_str), Some("yes"));
    for gone in [
        "x-real-ip",
        "forwarded",
        "x-sluice-peer",
        "keep-alive",
        "proxy-authorization",
        "x-custom",
        "connection",
    ] {
        assert!(
            !h.contains_key(gone),
            "{gone} must not reach the backend: {h:?}"
        );
    }
}

#[tokio::test]
async fn trusted_clients_keep_forwarding_headers() {
    let b = Backend::echo_head().await;
    let s = Sluice::start(&format!(
        "global {{ trust 127.0.0.0/8 }}\nsite * {{ proxy {} }}",
        b.addr
    ));
    let r = request(
        s.addr,
        "GET",
        "/",
        &[
            ("X-Forwarded-For", "203.0.113.7"),
            ("X-Forwarded-Proto", "https"),
            ("X-Forwarded-Host", "public.example"),
            ("X-Real-IP", "203.0.113.7"),
        ],
        b"",
    )
    .await;
    let (_, h) = seen(&r);
    assert_eq!(
        h["x-forwarded-for"], "203.0.113.7, 127.0.0.1",
        "the client address is appended"
    );
    assert_eq!(h["x-forwarded-proto"], "https");
    assert_eq!(h["x-forwarded-host"], "public.example");
    assert_eq!(h["x-real-ip"], "203.0.113.7");
}

#[tokio::test]
async fn host_modes_and_header_up_applied_last() {
    let b = Backend::echo_head().await;
    let s = Sluice::start(&format!(
        "site * {{
            route /keep {{ proxy {a} }}
            route /upstream {{ proxy {a} {{ host upstream }} }}
            route /named {{ proxy {a} {{ host api.internal }} }}
            route /up {{
                proxy {a} {{
                    header_up X-Edge sluice
                    header_up X-Forwarded-Proto overridden
                    header_up -User-Agent
                }}
            }}
        }}",
        a = b.addr
    ));
    let host_at = |path: &'static str| async move {
        let r = request(s.addr, "GET", path, &[("Host", "client.example")], b"").await;
        seen(&r).1.get("host").cloned()
    };
    assert_eq!(host_at("/keep").await.as_deref(), Some("client.example"));
    assert_eq!(host_at("/upstream").await, Some(b.addr.to_string()));
    assert_eq!(host_at("/named").await.as_deref(), Some("api.internal"));
    let r = request(s.addr, "GET", "/up", &[("User-Agent", "curl")], b"").await;
    let (_, h) = seen(&r);
    assert_eq!(h["x-edge"], "sluice");
    assert_eq!(
        h["x-forwarded-proto"], "overridden",
        "header_up applies after the forwarding headers"
    );
    assert!(!h.contains_key("user-agent"));
}

#[tokio::test]
async fn responses_lose_hop_by_hop_and_sluice_headers_then_get_header_down() {
    let b = Backend::start(|_| async {
        Response::builder()
            .header("x-sluice-origin", "forged")
            .header("keep-alive", "timeout=5")
            .header("x-powered-by", "php")
            .header("x-app", "1")
            .body(full("ok"))
            .unwrap()
    })
    .await;
    let s = Sluice::start(&format!(
        "site * {{
            header_down X-Route-Level 1
            proxy {} {{
                header_down -X-Powered-By
                header_down X-Served-By sluice
            }}
        }}",
        b.addr
    ));
    let r = get(s.addr, "/").await;
    assert_eq!(r.text(), "ok");
    assert_eq!(r.header("x-app"), Some("1"));
    assert_eq!(r.header("x-served-by"), Some("sluice"));
    assert_eq!(r.header("x-route-level"), Some("1"));
    for gone in ["x-sluice-origin", "keep-alive", "x-powered-by"] {
        assert!(r.header(gone).is_none(), "{gone} must not reach the client");
    }
}

#[tokio::test]
async fn unix_socket_and_named_backends() {
    let dir = TempDir::new();
    let sock = dir.0.join("app.sock");
    let ul = tokio::net::UnixListener::bind(&sock).unwrap();
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = ul.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|req: Request<Incoming>| async move {
                    let host = req
                        .headers()
                        .get("host")
                        .map(|v| v.to_str().unwrap().to_string());
                    Ok::<_, std::convert::Infallible>(Response::new(full(format!(
                        "unix host={host:?}"
                    ))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    let named = Backend::text("named").await;
    let s = Sluice::start(&format!(
        "site * {{
            route /unix {{ proxy unix:{} {{ host upstream }} }}
            route /named {{ proxy localhost:{} }}
            route /scheme {{ proxy http://127.0.0.1:{} }}
        }}",
        sock.display(),
        named.addr.port(),
        named.addr.port()
    ));
    assert_eq!(
        get(s.addr, "/unix").await.text(),
        "unix host=Some(\"localhost\")"
    );
    assert_eq!(
        get(s.addr, "/named").await.text(),
        "named",
        "names are resolved at dial time"
    );
    assert_eq!(get(s.addr, "/scheme").await.text(), "named");
    task.abort();
}

#[tokio::test]
async fn h2c_clients_reach_http1_backends() {
    let b = Backend::echo_head().await;
    let s = Sluice::start(&format!("site app.example {{ proxy {} }}", b.addr));
    let (mut send, _conn) = h2c(s.addr).await;
    for i in 0..3 {
        let req = Request::builder()
            .uri(format!("http://app.example/h2/{i}"))
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap();
        let resp = send.send_request(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        use http_body_util::BodyExt;
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let text = String::from_utf8_lossy(&body);
        assert!(text.starts_with(&format!("GET /h2/{i}\n")), "{text}");
        assert!(
            text.contains("host: app.example\n"),
            "the :authority becomes Host: {text}"
        );
    }
    assert_eq!(
        b.connections.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "h2 streams share a pooled h1 connection"
    );
}

#[tokio::test]
async fn placeholders_render_in_header_up_and_header_down() {
    let b = Backend::echo_head().await;
    let s = Sluice::start(&format!(
        "site * {{
            route /p/* {{
                header_down X-Asked \"{{method}} {{path}}?{{query}}\"
                proxy {a} {{
                    header_up X-Real-IP {{client_ip}}
                    header_up X-Seen \"{{scheme}}://{{host}}{{uri}}\"
                    header_down X-Served-For {{client_ip}}
                }}
            }}
        }}",
        a = b.addr
    ));
    let r = request(
        s.addr,
        "GET",
        "/p/a%20b?x=1",
        &[("Host", "App.Test:81")],
        b"",
    )
    .await;
    let (_, h) = seen(&r);
    assert_eq!(
        h["x-real-ip"], "127.0.0.1",
        "{{client_ip}} renders, not the literal text"
    );
    assert_eq!(h["x-seen"], "http://app.test/p/a%20b?x=1");
    assert_eq!(r.header("x-served-for"), Some("127.0.0.1"));
    assert_eq!(r.header("x-asked"), Some("GET /p/a%20b?x=1"));
}

#[tokio::test]
async fn a_relative_unix_path_is_relative_to_the_config_file() {
    let dir = TempDir::new();
    let ul = tokio::net::UnixListener::bind(dir.0.join("app.sock")).unwrap();
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = ul.accept().await {
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|_req: Request<Incoming>| async move {
                    Ok::<_, std::convert::Infallible>(Response::new(full("over the socket")))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    let conf = dir.write(
        "sluice.conf",
        "global { admin off }\nlisten 127.0.0.1:0\nsite * { proxy unix:app.sock }\n",
    );
    let conf = conf.to_str().unwrap().to_string();
    let s = Sluice::spawn(&["run", "-c", &conf], dir);
    assert_eq!(
        get(s.addr, "/").await.text(),
        "over the socket",
        "unix:app.sock is found beside the config, not in the working directory"
    );
    task.abort();
}

#[tokio::test]
async fn tracing_on_sends_a_traceparent_continuing_a_valid_one() {
    let b = Backend::echo_head().await;
    let s = Sluice::start(&format!(
        "global {{ tracing on }}\nsite * {{ proxy {} }}",
        b.addr
    ));
    let (_, h) = seen(&get(s.addr, "/").await);
    let started = &h["traceparent"];
    assert_eq!(started.len(), 55, "a new trace: {started}");
    assert!(
        started.starts_with("00-") && started.ends_with("-01"),
        "{started}"
    );
    let incoming = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
    let r = request(s.addr, "GET", "/", &[("traceparent", incoming)], b"").await;
    let continued = &seen(&r).1["traceparent"];
    assert!(
        continued.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"),
        "{continued}"
    );
    assert!(
        continued.ends_with("-00") && !continued.contains("00f067aa0ba902b7"),
        "{continued}"
    );
    let plain = Sluice::start(&format!("site * {{ proxy {} }}", b.addr));
    assert!(
        !seen(&get(plain.addr, "/").await)
            .1
            .contains_key("traceparent"),
        "off by default"
    );
}

/// Every spelling of a client-address or URL-override field — underscores for dashes,
/// any case, the lesser-known names — is dropped from an untrusted client and kept from
/// a trusted one, but for the `_` spellings of the fields sluice sets itself (DESIGN
/// §18.2); over HTTP/1.1 and HTTP/2 fronts alike.
#[tokio::test]
async fn every_spelling_of_a_forwarding_field_is_scrubbed_unless_trusted() {
    let spoofs = [
        ("X_Forwarded_For", "6.6.6.6"),
        ("X-Real_IP", "6.6.6.6"),
        ("x_real_ip", "6.6.6.6"),
        ("Client-IP", "6.6.6.6"),
        ("X-Client-IP", "6.6.6.6"),
        ("X-Cluster-Client-IP", "6.6.6.6"),
        ("X-Original-URL", "/admin"),
        ("X-Rewrite-URL", "/admin"),
        ("True_Client_IP", "6.6.6.6"),
        ("CF-Connecting_IP", "6.6.6.6"),
        ("X-Forwarded_Host", "evil.example"),
        ("X-Forwarded-Port", "6666"),
        ("X_Forwarded_Prefix", "/evil"),
        ("X-Forwarded-Scheme", "https"),
        ("x_forwarded_ssl", "on"),
        ("X-Original-Forwarded-For", "6.6.6.6"),
        ("Front-End_Https", "on"),
    ];
    // sluice sets these for a trusted client too: their `_` spellings never pass.
    let set_by_sluice = ["X_Forwarded_For", "X-Forwarded_Host"];
    let b = Backend::echo_head().await;
    for trusted in [false, true] {
        let trust = if trusted {
            "global { trust 127.0.0.0/8 }\n"
        } else {
            ""
        };
        let s = Sluice::start(&format!("{trust}site * {{ proxy {} }}", b.addr));
        let mut headers = spoofs.to_vec();
        headers.push(("X-Kept", "yes"));
        let r = request(s.addr, "GET", "/p", &headers, b"").await;
        let text = r.text().to_ascii_lowercase();
        let (_, h2_text) = {
            let (mut send, _conn) = h2c(s.addr).await;
            let mut req = Request::builder().uri("http://app.example/p");
            for (k, v) in spoofs {
                req = req.header(k, v);
            }
            let resp = send
                .send_request(
                    req.body(http_body_util::Empty::<bytes::Bytes>::new())
                        .unwrap(),
                )
                .await
                .unwrap();
            use http_body_util::BodyExt;
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            ((), String::from_utf8_lossy(&body).to_ascii_lowercase())
        };
        for (front, text) in [("h1", &text), ("h2", &h2_text)] {
            for (k, v) in spoofs {
                let line = format!("{}: {}\n", k.to_ascii_lowercase(), v.to_ascii_lowercase());
                assert_eq!(
                    text.contains(&line),
                    trusted && !set_by_sluice.contains(&k),
                    "{front} front, trusted {trusted}: `{k}` reaching the backend: {text}"
                );
            }
        }
        assert!(text.contains("x-kept: yes\n"), "other fields pass: {text}");
    }
}

/// Every field sluice sets on a request (`header_up` with a fixed or an identity value,
/// the forwarding fields, `X-Sluice-*`), sent by a client in every `_` and case
/// spelling, over each front: the backend sees sluice's value alone (DESIGN §18.2).
#[tokio::test]
async fn no_spelling_of_a_field_sluice_sets_reaches_the_backend() {
    let b = Backend::echo_head().await;
    let s = Sluice::start(&format!(
        "site * {{
            proxy {} {{
                header_up Remote-User alice
                header_up X-Client-Subject {{client_ip}}
                header_up -X-Api-Secret
            }}
        }}",
        b.addr
    ));
    let fields = [
        "Remote-User",
        "X-Client-Subject",
        "X-Api-Secret",
        "X-Forwarded-For",
        "X-Forwarded-Proto",
        "X-Forwarded-Host",
        "X-Sluice-Peer",
    ];
    let spell = |name: &str| {
        [
            name.replace('-', "_"),
            name.to_ascii_uppercase().replace('-', "_"),
            name.to_ascii_lowercase().replacen('-', "_", 1),
        ]
    };
    for name in fields {
        for spelling in spell(name) {
            let h1 = request(s.addr, "GET", "/p", &[(spelling.as_str(), "forged")], b"").await;
            let h2 = {
                let (mut send, _conn) = h2c(s.addr).await;
                let req = Request::builder()
                    .uri("http://app.example/p")
                    .header(spelling.as_str(), "forged")
                    .body(http_body_util::Empty::<bytes::Bytes>::new())
                    .unwrap();
                let resp = send.send_request(req).await.unwrap();
                use http_body_util::BodyExt;
                let body = resp.into_body().collect().await.unwrap().to_bytes();
                String::from_utf8_lossy(&body).into_owned()
            };
            for (front, text) in [("h1", h1.text()), ("h2", h2)] {
                assert!(
                    !text.contains("forged"),
                    "{front}: `{spelling}` passed beside the `{name}` sluice sets: {text}"
                );
            }
        }
    }
    let r = get(s.addr, "/p").await.text();
    assert!(r.contains("remote-user: alice\n"), "{r}");
    assert!(r.contains("x-client-subject: 127.0.0.1\n"), "{r}");
}

/// An HTTP/2 client sends each cookie as its own field; an HTTP/1.1 backend gets them
/// joined into one (RFC 9113 §8.2.3), in order.
#[tokio::test]
async fn h2_cookie_crumbs_reach_an_http1_backend_as_one_field() {
    let b = Backend::echo_head().await;
    let s = Sluice::start(&format!("site * {{ proxy {} }}", b.addr));
    let (mut send, _conn) = h2c(s.addr).await;
    let req = Request::builder()
        .uri("http://app.example/c")
        .header("cookie", "a=1")
        .header("cookie", "b=2")
        .header("cookie", "session=xyz")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    use http_body_util::BodyExt;
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&body).to_string();
    let cookies: Vec<&str> = text.lines().filter(|l| l.starts_with("cookie:")).collect();
    assert_eq!(
        cookies,
        ["cookie: a=1; b=2; session=xyz"],
        "one Cookie field for the HTTP/1.1 backend: {text}"
    );
}

/// An h2 request with no `:authority` and two `host` fields is refused like its
/// HTTP/1.1 twin; an extended CONNECT for anything but WebSocket is reset and never
/// reaches a backend.
#[tokio::test]
async fn h2_two_hosts_and_foreign_extended_connects_are_refused() {
    let b = Backend::echo_head().await;
    let s = Sluice::start(&format!("site * {{ proxy {} }}", b.addr));
    let (mut send, _conn) = h2c(s.addr).await;
    let req = Request::builder()
        .uri("/x")
        .header("host", "a.example")
        .header("host", "b.example")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 400, "two Host fields and no :authority");
    // A plain request first, so sluice's SETTINGS (extended CONNECT on) have arrived.
    let ok = Request::builder()
        .uri("http://a.example/warm")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    assert_eq!(send.send_request(ok).await.unwrap().status(), 200);
    let before = b.connections.load(std::sync::atomic::Ordering::SeqCst);
    for protocol in ["connect-udp", "h2c", "foo"] {
        let mut req = Request::builder()
            .method("CONNECT")
            .uri("http://a.example/tunnel")
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap();
        req.extensions_mut()
            .insert(hyper::ext::Protocol::from_static(protocol));
        let err = send
            .send_request(req)
            .await
            .expect_err("the stream must be reset");
        let reason = std::error::Error::source(&err)
            .and_then(|e| e.downcast_ref::<h2::Error>())
            .and_then(h2::Error::reason);
        assert_eq!(
            reason,
            Some(h2::Reason::PROTOCOL_ERROR),
            "{protocol}: RST_STREAM(PROTOCOL_ERROR), got {err:?}"
        );
    }
    let r = get(s.addr, "/after").await;
    assert_eq!(r.status, 200);
    assert!(
        !r.text().contains("CONNECT"),
        "no CONNECT reached the backend"
    );
    assert!(
        b.connections.load(std::sync::atomic::Ordering::SeqCst) <= before + 1,
        "the backend saw no tunnel attempt"
    );
    assert!(
        s.logs().matches("extended CONNECT").count() <= 1,
        "client-caused lines are folded: {}",
        s.logs()
    );
}

/// Repeated equal `Content-Length` values (accepted, RFC 9110 §8.6) reach the backend
/// as one plain field.
#[tokio::test]
async fn equal_content_lengths_are_forwarded_as_one() {
    let b = Backend::echo_head().await;
    let s = Sluice::start(&format!("site * {{ proxy {} }}", b.addr));
    for fields in [
        "Content-Length: 5\r\nContent-Length: 5\r\n",
        "Content-Length: 5, 5\r\n",
    ] {
        let out = raw(
            s.addr,
            format!("POST /cl HTTP/1.1\r\nHost: a\r\n{fields}Connection: close\r\n\r\nhello")
                .as_bytes(),
        )
        .await;
        let (r, _) = parse_response(&out).expect("a response");
        let lines: Vec<String> = r
            .text()
            .lines()
            .filter(|l| l.starts_with("content-length"))
            .map(str::to_string)
            .collect();
        assert_eq!(lines, ["content-length: 5"], "{fields:?}: {}", r.text());
    }
}

/// `Server` and `X-Powered-By`: a backend's `Server` passes unchanged, its
/// `X-Powered-By` is dropped unless `header_down` sets one; every answer sluice makes
/// itself (respond, a refusal, a bad request) says `Server: sluice`, unless
/// `server_tokens off`.
#[tokio::test]
async fn server_tokens_and_powered_by() {
    let b = Backend::start(|_req: Request<Incoming>| async move {
        let mut r = Response::new(full("from the backend"));
        r.headers_mut()
            .insert("server", "backend-x/1.2".parse().unwrap());
        r.headers_mut()
            .insert("x-powered-by", "Express".parse().unwrap());
        r
    })
    .await;
    let routes = format!(
        "site a {{ route /kept {{ proxy {0} {{ header_down X-Powered-By kept }} }}\n route /r {{ respond \"hi\" }}\n proxy {0} }}",
        b.addr
    );
    let s = Sluice::start(&routes);
    let p = get_host(s.addr, "a", "/p").await;
    assert_eq!(
        p.header("server"),
        Some("backend-x/1.2"),
        "the backend's, unchanged"
    );
    assert_eq!(p.header("x-powered-by"), None, "dropped");
    let kept = get_host(s.addr, "a", "/kept").await;
    assert_eq!(
        kept.header("x-powered-by"),
        Some("kept"),
        "header_down sets it"
    );
    assert_eq!(
        get_host(s.addr, "a", "/r").await.header("server"),
        Some("sluice")
    );
    let unknown = get_host(s.addr, "nowhere", "/").await;
    assert_eq!(
        (unknown.status, unknown.header("server")),
        (421, Some("sluice"))
    );
    let bad = String::from_utf8_lossy(&raw(s.addr, b"GET / HTTP/1.1\r\n\r\n").await).to_string();
    assert!(
        bad.starts_with("HTTP/1.1 400") && bad.contains("server: sluice\r\n"),
        "{bad}"
    );

    let quiet = Sluice::start(&format!("global {{ server_tokens off }}\n{routes}"));
    assert_eq!(get_host(quiet.addr, "a", "/r").await.header("server"), None);
    let bad =
        String::from_utf8_lossy(&raw(quiet.addr, b"GET / HTTP/1.1\r\n\r\n").await).to_string();
    assert!(
        bad.starts_with("HTTP/1.1 400") && !bad.contains("server:"),
        "{bad}"
    );
    assert_eq!(
        get_host(quiet.addr, "a", "/p").await.header("server"),
        Some("backend-x/1.2"),
        "a backend's Server passes whatever server_tokens says"
    );
}
