//! Compression over real sockets: each coding negotiated and decoded back to the
//! original bytes, the header changes, each skip rule, and an SSE stream that stays
//! live when compressed.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use hyper::body::Incoming;
use hyper::{Request, Response};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn page() -> String {
    (0..400)
        .map(|i| format!("<p>line {i} of a page that compresses well</p>\n"))
        .collect()
}

/// A backend serving `page()` with the headers the path names.
async fn backend() -> Backend {
    Backend::start(|req: Request<Incoming>| async move {
        let path = req.uri().path().to_string();
        let mut r = Response::new(full(match path.as_str() {
            "/small" => "tiny".to_string(),
            _ => page(),
        }));
        let h = r.headers_mut();
        let ct = if path == "/png" {
            "image/png"
        } else {
            "text/html; charset=utf-8"
        };
        h.insert("content-type", ct.parse().unwrap());
        h.insert("etag", "\"v1\"".parse().unwrap());
        h.insert("accept-ranges", "bytes".parse().unwrap());
        match path.as_str() {
            "/encoded" => {
                h.insert("content-encoding", "gzip".parse().unwrap());
            }
            "/no-transform" => {
                h.insert("cache-control", "public, no-transform".parse().unwrap());
            }
            "/partial" => *r.status_mut() = hyper::StatusCode::PARTIAL_CONTENT,
            "/cookie" => {
                h.insert("set-cookie", "sid=secret; HttpOnly".parse().unwrap());
            }
            _ => {}
        }
        r
    })
    .await
}

async fn decode(coding: &str, body: &[u8]) -> String {
    use async_compression::tokio::bufread::{BrotliDecoder, GzipDecoder, ZstdDecoder};
    let mut out = Vec::new();
    match coding {
        "gzip" => GzipDecoder::new(body).read_to_end(&mut out).await.unwrap(),
        "br" => BrotliDecoder::new(body)
            .read_to_end(&mut out)
            .await
            .unwrap(),
        "zstd" => ZstdDecoder::new(body).read_to_end(&mut out).await.unwrap(),
        other => panic!("unexpected coding {other}"),
    };
    String::from_utf8(out).unwrap()
}

#[tokio::test]
async fn every_coding_decodes_back_to_the_original() {
    let b = backend().await;
    let s = Sluice::start(&format!("site * {{ proxy {} }}", b.addr));
    for (accept, want) in [
        ("gzip", "gzip"),
        ("br", "br"),
        ("zstd", "zstd"),
        ("gzip, br, zstd", "zstd"),
        ("gzip;q=1.0, zstd;q=0.5", "gzip"),
        ("br;q=0, gzip", "gzip"),
        ("br, gzip", "gzip"),
        ("gzip;q=0.5, br", "br"),
    ] {
        let r = request(s.addr, "GET", "/", &[("Accept-Encoding", accept)], b"").await;
        assert_eq!(
            r.header("content-encoding"),
            Some(want),
            "Accept-Encoding: {accept}"
        );
        assert_eq!(
            decode(want, &r.body).await,
            page(),
            "{want} decodes to the original"
        );
        assert!(
            r.body.len() < page().len() / 3,
            "{want} compressed it: {} bytes",
            r.body.len()
        );
        assert_eq!(r.header("content-length"), None);
        assert_eq!(r.header("accept-ranges"), None);
        assert_eq!(
            r.header("etag"),
            Some("W/\"v1\""),
            "a strong ETag becomes weak"
        );
        assert_eq!(r.header("vary"), Some("accept-encoding"));
    }
}

#[tokio::test]
async fn the_skip_rules() {
    let b = backend().await;
    let s = Sluice::start(&format!(
        "site * {{
            route /off {{ compress off\n proxy {a} }}
            proxy {a}
        }}",
        a = b.addr
    ));
    let gz = [("Accept-Encoding", "gzip")];
    let plain = request(s.addr, "GET", "/", &[], b"").await;
    assert_eq!(plain.header("content-encoding"), None, "not asked for");
    assert_eq!(
        plain.header("vary"),
        Some("accept-encoding"),
        "but it varies on it"
    );
    for path in ["/png", "/small", "/encoded", "/no-transform", "/partial"] {
        let r = request(s.addr, "GET", path, &gz, b"").await;
        let ce = r.header("content-encoding");
        assert!(
            ce.is_none() || (path == "/encoded" && r.body == page().as_bytes()),
            "{path} must not be compressed by sluice: {ce:?}"
        );
    }
    assert_eq!(
        request(s.addr, "GET", "/png", &gz, b"")
            .await
            .header("vary"),
        None,
        "not a compressible type"
    );
    let head = raw(
        s.addr,
        b"HEAD / HTTP/1.1\r\nHost: a\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n",
    )
    .await;
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    assert!(
        !head.contains("content-encoding") && head.contains("vary: accept-encoding"),
        "HEAD: never compressed, still varies: {head}"
    );
    let off = request(s.addr, "GET", "/off", &gz, b"").await;
    assert_eq!(
        (off.header("content-encoding"), off.header("vary")),
        (None, None),
        "compress off"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_server_sent_events_stay_live() {
    let sent = Arc::new(Mutex::new(Vec::<Instant>::new()));
    let s2 = sent.clone();
    let b = Backend::start(move |_req: Request<Incoming>| {
        let sent = s2.clone();
        async move {
            let (tx, body) = channel_body();
            tokio::spawn(async move {
                for i in 0..5 {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    sent.lock().unwrap().push(Instant::now());
                    let event = format!("data: event {i} {}\n\n", "x".repeat(200));
                    if tx.send(bytes::Bytes::from(event)).await.is_err() {
                        return;
                    }
                }
            });
            let mut r = Response::new(body);
            r.headers_mut()
                .insert("content-type", "text/event-stream".parse().unwrap());
            r
        }
    })
    .await;
    let s = Sluice::start(&format!("site * {{ proxy {} }}", b.addr));
    let mut c = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    c.write_all(
        b"GET /events HTTP/1.1\r\nHost: a\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let mut raw = Vec::new();
    let mut arrivals = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let n = tokio::time::timeout(WAIT, c.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
        arrivals.push(Instant::now());
    }
    let sent = sent.lock().unwrap().clone();
    assert_eq!(sent.len(), 5);
    for (i, at) in sent.iter().enumerate() {
        let seen = arrivals.iter().find(|a| *a >= at).copied();
        let lag = seen.map(|s| s - *at);
        assert!(
            lag.is_some_and(|l| l < Duration::from_millis(100)),
            "event {i} reached the client {lag:?} after it was sent"
        );
    }
    let (r, _) = parse_response(&raw).expect("a whole response");
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    let text = decode("gzip", &r.body).await;
    assert_eq!(text.matches("data: event").count(), 5, "{text}");
}

/// BREACH: a response that sets a cookie, or answers a request with `Authorization`, is
/// not compressed under `compress on` (the default) — `compress always` compresses it,
/// on the proxy or as a route filter.
#[tokio::test]
async fn secrets_are_not_compressed_unless_always() {
    let b = backend().await;
    let s = Sluice::start(&format!(
        "site on.test {{ proxy {a} }}
         site always.test {{ proxy {a} {{ compress always }} }}
         site filter.test {{ route /* {{
             compress always
             proxy {a}
         }} }}",
        a = b.addr
    ));
    let coding = |host: &'static str, path: &'static str, auth: bool| {
        let addr = s.addr;
        async move {
            let mut h = vec![("Host", host), ("Accept-Encoding", "gzip")];
            if auth {
                h.push(("Authorization", "Bearer t0ken"));
            }
            let r = request(addr, "GET", path, &h, b"").await;
            assert_eq!(r.status, 200);
            assert!(
                r.header("vary")
                    .is_some_and(|v| v.eq_ignore_ascii_case("accept-encoding")),
                "{host}{path}: Vary whether or not compressed"
            );
            r.header("content-encoding").map(str::to_string)
        }
    };
    assert_eq!(coding("on.test", "/", false).await.as_deref(), Some("gzip"));
    assert_eq!(
        coding("on.test", "/cookie", false).await,
        None,
        "Set-Cookie"
    );
    assert_eq!(coding("on.test", "/", true).await, None, "Authorization");
    for host in ["always.test", "filter.test"] {
        assert_eq!(
            coding(host, "/cookie", false).await.as_deref(),
            Some("gzip"),
            "{host}"
        );
        assert_eq!(
            coding(host, "/", true).await.as_deref(),
            Some("gzip"),
            "{host}"
        );
    }
}
