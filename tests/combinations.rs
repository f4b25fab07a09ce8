//! Where two options meet: every header spelling × HTTP/1.1 or HTTP/2 front × HTTP/1.1
//! or HTTP/2 backend, checking what the backend receives; and every handler × an
//! `Upgrade` request × `limit`. (A `TE: Trailers` from an h1 client once took every h2
//! backend out of rotation; an `Upgrade` once skipped `limit`.)

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Request, Response};
use tokio::net::TcpListener;

/// The head a backend saw, as `name: value` lines (names lower-case, one line a field).
fn echo(req: &Request<Incoming>) -> String {
    let mut s = format!("{} {}\n", req.method(), req.uri().path());
    for (k, v) in req.headers() {
        s.push_str(&format!("{}: {}\n", k, v.to_str().unwrap_or("?")));
    }
    s
}

/// An h2c backend echoing the head it saw.
async fn h2c_echo() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((tcp, _)) = l.accept().await {
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|req: Request<Incoming>| async move {
                    Ok::<_, std::convert::Infallible>(Response::new(full(echo(&req))))
                });
                let _ =
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                        .await;
            });
        }
    });
    (addr, task)
}

/// Sends `fields` to `host` over an h1 or h2 front; the backend's echo.
async fn send(
    front_h2: bool,
    addr: SocketAddr,
    host: &str,
    fields: &[(&str, &str)],
) -> (u16, String) {
    if !front_h2 {
        let mut h = vec![("Host", host)];
        h.extend_from_slice(fields);
        let r = request(addr, "GET", "/combo", &h, b"").await;
        return (r.status, r.text());
    }
    let (mut s, _conn) = h2c(addr).await;
    let mut req = Request::builder().uri(format!("http://{host}/combo"));
    for (k, v) in fields {
        // HTTP/2 carries names in lower case, and never connection-level fields.
        let k = k.to_ascii_lowercase();
        if k == "connection" || k == "keep-alive" {
            continue;
        }
        if k == "te" && !v.eq_ignore_ascii_case("trailers") {
            continue;
        }
        req = req.header(k, *v);
    }
    let resp = s
        .send_request(req.body(http_body_util::Empty::<Bytes>::new()).unwrap())
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).to_string())
}

fn values<'a>(seen: &'a str, name: &str) -> Vec<&'a str> {
    seen.lines()
        .filter_map(|l| l.split_once(": "))
        .filter(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_spellings_across_every_front_and_backend_pair() {
    let h1 =
        Backend::start(|req: Request<Incoming>| async move { Response::new(full(echo(&req))) })
            .await;
    let (h2, _t) = h2c_echo().await;
    let s = Sluice::start(&format!(
        "site h1.test {{ proxy {} {{ all_down fail }} }}
         site h2.test {{ proxy h2c://{h2} {{ all_down fail }} }}",
        h1.addr
    ));
    let cases: &[(&str, &[(&str, &str)])] = &[
        ("te mixed case", &[("TE", "Trailers")]),
        ("te upper", &[("TE", "TRAILERS")]),
        ("te list", &[("TE", "gzip, trailers")]),
        ("te other", &[("TE", "gzip")]),
        ("cookie crumbs", &[("Cookie", "a=1"), ("Cookie", "b=2")]),
        ("one cookie", &[("Cookie", "a=1; b=2")]),
        (
            "underscore xff",
            &[("X_Forwarded_For", "6.6.6.6"), ("X-Real_IP", "6.6.6.6")],
        ),
        (
            "url override",
            &[("X-Original-URL", "/admin"), ("X-Rewrite-URL", "/admin")],
        ),
        (
            "client ip",
            &[("Client-IP", "6.6.6.6"), ("X-Cluster-Client-IP", "6.6.6.6")],
        ),
        ("duplicates", &[("X-Dup", "one"), ("X-Dup", "two")]),
        (
            "connection-named",
            &[("Connection", "X-Hop"), ("X-Hop", "gone")],
        ),
    ];
    for front_h2 in [false, true] {
        for backend in ["h1.test", "h2.test"] {
            for (what, fields) in cases {
                let combo = format!(
                    "{what}: {} front → {backend}",
                    if front_h2 { "h2" } else { "h1" }
                );
                let (status, seen) = send(front_h2, s.addr, backend, fields).await;
                assert_eq!(status, 200, "{combo}: {seen}");
                let te = values(&seen, "te");
                assert!(te.is_empty() || te == ["trailers"], "{combo}: TE {te:?}");
                let mut crumbs: Vec<&str> = values(&seen, "cookie")
                    .into_iter()
                    .flat_map(|v| v.split("; "))
                    .collect();
                crumbs.sort_unstable();
                if what.contains("cookie") {
                    assert_eq!(crumbs, ["a=1", "b=2"], "{combo}: {seen}");
                    if backend == "h1.test" {
                        assert_eq!(
                            values(&seen, "cookie").len(),
                            1,
                            "{combo}: one field for h1: {seen}"
                        );
                    }
                }
                // (HTTP/2 has no Connection field, so there X-Hop is a plain field.)
                let hop = if front_h2 { "x_forwarded_for" } else { "x-hop" };
                for gone in [
                    "x_forwarded_for",
                    "x-real_ip",
                    "x-original-url",
                    "x-rewrite-url",
                    "client-ip",
                    "x-cluster-client-ip",
                    hop,
                ] {
                    assert!(
                        values(&seen, gone).is_empty(),
                        "{combo}: {gone} reached the backend: {seen}"
                    );
                }
                assert_eq!(values(&seen, "x-forwarded-for"), ["127.0.0.1"], "{combo}");
                if *what == "duplicates" {
                    let mut d = values(&seen, "x-dup");
                    d.sort_unstable();
                    assert_eq!(d, ["one", "two"], "{combo}: both kept");
                }
            }
        }
    }
    let logs = s.logs();
    assert!(
        !logs.contains("out of rotation") && !logs.contains(" failed ("),
        "no peer was blamed: {logs}"
    );
}

/// Every handler × an `Upgrade` request: the handler answers as it would without it
/// (never a 101, never a hang), and a proxy's `limit` holds for upgrades too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_handler_with_an_upgrade_request_and_a_limit() {
    let slow = Backend::start(|req: Request<Incoming>| async move {
        if req.uri().path() == "/hold" {
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }
        Response::new(full("proxied"))
    })
    .await;
    let (h2, _t) = h2c_echo().await;
    let root = TempDir::new();
    root.write("index.html", "files");
    let s = Sluice::start(&format!(
        "site * {{
            route /respond {{ respond \"responded\" }}
            route /redirect {{ redirect /elsewhere }}
            route /files/* {{
                strip /files
                files {}
            }}
            route /h2/* {{ proxy h2c://{h2} {{ limit 1 100ms }} }}
            proxy {} {{ limit 1 100ms }}
        }}",
        root.0.display(),
        slow.addr
    ));
    for upgrade in ["websocket", "h2c", "foo"] {
        let up = [("Connection", "Upgrade"), ("Upgrade", upgrade)];
        for (path, want) in [
            ("/respond", 200),
            ("/redirect", 302),
            ("/files/", 200),
            ("/plain", 200),
        ] {
            let r = tokio::time::timeout(WAIT, request(s.addr, "GET", path, &up, b""))
                .await
                .expect("an answer");
            assert_eq!(r.status, want, "{path} with Upgrade: {upgrade}");
        }
        // The h2c pool cannot take an HTTP/1.1 upgrade: a websocket one is 502, the
        // others go as plain requests.
        let r = request(s.addr, "GET", "/h2/x", &up, b"").await;
        let want = if upgrade == "websocket" { 502 } else { 200 };
        assert_eq!(
            r.status,
            want,
            "/h2/x with Upgrade: {upgrade}: {}",
            r.text()
        );
        // While a plain request holds the proxy's one slot, an upgrade waits like any
        // request and is refused after the wait.
        let addr = s.addr;
        let hold = tokio::spawn(async move { request(addr, "GET", "/hold", &[], b"").await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let r = request(s.addr, "GET", "/other", &up, b"").await;
        assert_eq!(r.status, 503, "Upgrade: {upgrade} under a full limit");
        assert_eq!(hold.await.unwrap().status, 200);
    }
}

/// Backend answers that try every way a field can pass or not: names in any case,
/// hop-by-hop fields, fields named by `Connection`, sluice's own and `X-Powered-By`,
/// repeated fields between others, a compressible type with and without the backend's
/// own `Vary`, chunked framing, bodiless statuses, padded values, a length with leading
/// zeros.
const ANSWERS: &[&str] = &[
    "HTTP/1.1 200 OK\r\nServer: nginx\r\nDate: Mon, 07 Dec 2026 00:00:00 GMT\r\nContent-Type: application/octet-stream\r\nContent-Length: 5\r\nConnection: keep-alive\r\n\r\nhello",
    "HTTP/1.1 200 OK\r\nCONTENT-type: text/html\r\nX-Powered-By: php\r\nSet-Cookie: a=1\r\nX-Sluice-Peer: forged\r\nx_SLUICE_role: forged\r\nX-Other: o\r\nKeep-Alive: timeout=5\r\nset-cookie: b=2\r\nContent-Length: 5\r\n\r\nhello",
    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nVary: Origin\r\nContent-Length: 5\r\n\r\nhello",
    "HTTP/1.1 200 OK\r\nConnection: close, X-Drop\r\nX-Drop: 1\r\nX-Keep: 2\r\nContent-Length: 5\r\n\r\nhello",
    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nTrailer: X-T\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    "HTTP/1.1 204 No Content\r\nContent-Length: 0\r\nX-A: 1\r\n\r\n",
    "HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\nContent-Length: 5\r\n\r\n",
    "HTTP/1.1 200 OK\r\nX-Space:   padded   \r\nX-Tab:\tt\r\nProxy-Connection: keep-alive\r\nUpgrade: h2c\r\nContent-Length: 005\r\n\r\nhello",
    "HTTP/1.1 404 Not Found\r\nContent-Type: text/html; charset=utf-8\r\nTE: trailers\r\nExpect: x\r\nContent-Length: 5\r\n\r\nhello",
];

/// The head and body a client got, its `Date` left out; `sorted`: the fields by name
/// (a name's own fields in order), for comparing what two routes sent.
fn seen(out: &[u8], sorted: bool) -> (Vec<String>, Vec<u8>) {
    let text = String::from_utf8_lossy(out);
    let (head, body) = text.split_once("\r\n\r\n").expect("a whole head");
    let mut lines: Vec<String> = head
        .split("\r\n")
        .filter(|l| !l.to_ascii_lowercase().starts_with("date:"))
        .map(str::to_string)
        .collect();
    if sorted {
        lines[1..].sort_by_key(|l| l.split(':').next().unwrap_or("").to_ascii_lowercase());
    }
    (lines, body.as_bytes().to_vec())
}

/// A route whose answers nothing reads passes a backend's fields as they were sent
/// (`http1::head::SentFields`); a route with a filter builds them into a map. Every
/// answer × GET or HEAD × a client that takes gzip or not: the client gets the same
/// fields and body either way, and the plain route keeps the backend's order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_pass_alike_with_their_fields_as_sent_or_through_the_map() {
    let (backend, _task) = raw_backend(|mut c| async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut buf = Vec::new();
        loop {
            let mut chunk = [0u8; 4096];
            let Ok(n) = c.read(&mut chunk).await else {
                return;
            };
            if n == 0 {
                return;
            }
            buf.extend_from_slice(&chunk[..n]);
            while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                buf.drain(..end + 4);
                // `GET /v/N` or `/f/v/N`: answer N.
                let target = head.split(' ').nth(1).unwrap_or("");
                let n: usize = target
                    .rsplit('/')
                    .next()
                    .unwrap_or("0")
                    .parse()
                    .unwrap_or(0);
                let mut answer = ANSWERS[n].as_bytes().to_vec();
                if head.starts_with("HEAD ") {
                    let cut = answer.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
                    answer.truncate(cut + 4);
                }
                if c.write_all(&answer).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    let s = Sluice::start(&format!(
        "listen 127.0.0.1:0\nsite * {{\n route /f/* {{ allow 127.0.0.0/8\n proxy {backend} }}\n proxy {backend}\n}}\n"
    ));
    for (n, _) in ANSWERS.iter().enumerate() {
        for method in ["GET", "HEAD"] {
            for accept in ["", "Accept-Encoding: gzip\r\n"] {
                let ask = |path: String| {
                    format!(
                        "{method} {path} HTTP/1.1\r\nHost: x\r\n{accept}Connection: close\r\n\r\n"
                    )
                };
                let plain = raw(s.addr, ask(format!("/v/{n}")).as_bytes()).await;
                let filtered = raw(s.addr, ask(format!("/f/v/{n}")).as_bytes()).await;
                let case = format!("answer {n}, {method}, {accept:?}");
                assert_eq!(seen(&plain, true), seen(&filtered, true), "{case}");
                let (lines, _) = seen(&plain, false);
                let fields = names_of(&lines[1..]);
                let gone = [
                    "x-powered-by",
                    "x-sluice-peer",
                    "x_sluice_role",
                    "keep-alive",
                    "x-drop",
                    "proxy-connection",
                    "upgrade",
                    "te",
                    "expect",
                ];
                none_of(&fields, &gone, &case);
                if n == 1 && accept.is_empty() {
                    // The backend's order, names in lower case (a client that takes
                    // gzip gets a compressible answer through the map: compression
                    // decides on its fields).
                    let order: Vec<&str> = fields.iter().map(String::as_str).collect();
                    assert_eq!(
                        &order[..5],
                        [
                            "content-type",
                            "set-cookie",
                            "x-other",
                            "set-cookie",
                            "content-length"
                        ],
                        "{case}: {lines:?}"
                    );
                    assert!(
                        lines.contains(&"vary: accept-encoding".to_string()),
                        "{case}: {lines:?}"
                    );
                }
            }
        }
    }
}

/// A raw backend that answers each request with the head it received, as its body
/// (read to its end first: a length, or chunks up to the last).
async fn head_echo() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    raw_backend(|mut c| async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut buf = Vec::new();
        loop {
            let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                let mut chunk = [0u8; 4096];
                match c.read(&mut chunk).await {
                    Ok(n) if n > 0 => buf.extend_from_slice(&chunk[..n]),
                    _ => return,
                }
                continue;
            };
            let head = buf[..end + 4].to_vec();
            let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
            let length = text
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .map_or(0, |n| n.trim().parse::<usize>().unwrap());
            let chunked = text.contains("transfer-encoding: chunked");
            loop {
                let rest = &buf[end + 4..];
                let done = match chunked {
                    true => rest
                        .windows(5)
                        .position(|w| w == b"0\r\n\r\n")
                        .map(|p| p + 5),
                    false => (rest.len() >= length).then_some(length),
                };
                if let Some(n) = done {
                    buf.drain(..end + 4 + n);
                    break;
                }
                let mut chunk = [0u8; 4096];
                match c.read(&mut chunk).await {
                    Ok(n) if n > 0 => buf.extend_from_slice(&chunk[..n]),
                    _ => return,
                }
            }
            let mut answer =
                format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", head.len()).into_bytes();
            answer.extend_from_slice(&head);
            if c.write_all(&answer).await.is_err() {
                return;
            }
        }
    })
    .await
}

/// The field lines of a head the echo backend sent back, without its request line and
/// the `header_up` field that sent the request through the map; `sorted`: stably by
/// name, so each name's values keep their order.
fn fields_seen(body: &[u8], sorted: bool) -> Vec<String> {
    let text = String::from_utf8_lossy(body);
    let mut lines: Vec<String> = text
        .split("\r\n")
        .skip(1)
        .filter(|l| !l.is_empty() && !l.starts_with("x-map:"))
        .map(str::to_string)
        .collect();
    if sorted {
        lines.sort_by_key(|l| l.split(':').next().unwrap_or("").to_string());
    }
    lines
}

/// Three ways to a backend's lines: a plain pool writes an HTTP/1 client's fields as
/// they came, no map built (`http1::fields`); with `trust` on (of other addresses),
/// the same pool writes them at once from the client's map (`proxy::headers::forwarded`); a pool
/// with `header_up` does the work on the map. Tricky heads × GET, a POST with a
/// length, a chunked POST, over HTTP/1.1 (and HTTP/1.0, with and without `Host`) and
/// HTTP/2 (cookie crumbs, `TE`): the backend gets the same fields every way, each
/// name's values in order; the plain pool keeps the client's order (the head's as it
/// came, or the map's: a name's repeats together).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_reach_the_backend_alike_with_their_lines_written_or_through_the_map() {
    let (backend, _task) = head_echo().await;
    let sites = format!(
        "site * {{\n route /m/* {{ proxy {backend} {{ header_up X-Map yes }} }}\n proxy {backend}\n}}\n"
    );
    let s = Sluice::start(&format!("listen 127.0.0.1:0\n{sites}"));
    // `trust` (of no address here) builds every request's map at parse.
    let logged = Sluice::start(&format!(
        "global {{ trust 192.0.2.0/24 }}\nlisten 127.0.0.1:0\n{sites}"
    ));
    const HEADS: [&str; 8] = [
        "Host: app.example\r\nUser-Agent: t/1\r\nAccept: */*\r\n",
        "Host: app.example:8080\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\nProxy-Connection: x\r\nUpgrade: nothing\r\nX-Kept: yes\r\nProxy-Authorization: secret\r\n",
        "Host: a\r\nX-Forwarded-For: 6.6.6.6\r\nx_forwarded_for: 6.6.6.7\r\nForwarded: for=x\r\nX-Real-IP: 6.6.6.6\r\nX-Forwarded-Host: evil\r\nX-Sluice-Peer: spoofed\r\nX_Sluice_Role: x\r\nTrue-Client-IP: 1.2.3.4\r\n",
        "Host: a\r\nCookie: a=1\r\nX-Between: 1\r\nCookie: b=2\r\nX-Powered-By: client\r\nX-Empty:\r\n",
        "Host: a\r\nX-Multi: 1\r\nX-Other: 2\r\nx-multi: 3\r\nX-MULTI:   4  \r\nACCEPT:x\r\n",
        "Host: a\r\nX-Custom: gone\r\nConnection: close, X-Custom\r\nX-Kept: yes\r\n",
        "Host: a\r\nTE: trailers, gzip\r\nX-Kept: yes\r\n",
        "Host: a\r\nTE: gzip\r\nConnection: TE\r\n",
    ];
    for (n, fields) in HEADS.iter().enumerate() {
        for (version, body) in [
            ("HTTP/1.1", ""),
            ("HTTP/1.1", "Content-Length: 5\r\n\r\nhello"),
            (
                "HTTP/1.1",
                "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            ),
            ("HTTP/1.0", ""),
        ] {
            let method = if body.is_empty() { "GET" } else { "POST" };
            let ask = |path: &str| {
                let end = if body.is_empty() { "\r\n" } else { body };
                // `Connection` first: the map's removal moves its last field there.
                format!("{method} {path} {version}\r\nConnection: close\r\n{fields}{end}")
            };
            let plain = raw(s.addr, ask("/p").as_bytes()).await;
            let mapped = raw(s.addr, ask("/m/p").as_bytes()).await;
            let from_map = raw(logged.addr, ask("/p").as_bytes()).await;
            let case = format!("head {n}, {method} {version}, {body:?}");
            let (plain, mapped) = (answered(&plain, &case), answered(&mapped, &case));
            let from_map = answered(&from_map, &case);
            assert_eq!(
                fields_seen(&plain, true),
                fields_seen(&mapped, true),
                "{case}"
            );
            assert_eq!(
                fields_seen(&plain, true),
                fields_seen(&from_map, true),
                "{case}"
            );
            let names = names_of(&fields_seen(&plain, false));
            let gone = [
                "keep-alive",
                "proxy-connection",
                "upgrade",
                "proxy-authorization",
                "x_forwarded_for",
                "forwarded",
                "x-real-ip",
                "true-client-ip",
                "x-sluice-peer",
                "x_sluice_role",
                "x-custom",
            ];
            none_of(&names, &gone, &case);
            let forwarded = names
                .iter()
                .filter(|f| f.starts_with("x-forwarded-"))
                .count();
            assert_eq!(forwarded, 3, "{case}: one each of XFF, XFP, XFH: {names:?}");
            if n == 4 && method == "GET" {
                // The client's order as it came, no map built.
                assert_eq!(
                    names[..6],
                    ["host", "x-multi", "x-other", "x-multi", "x-multi", "accept"],
                    "{case}"
                );
                // From the map: a name's repeats together at its first (the map's
                // order, without a removal's reshuffle).
                let names = names_of(&fields_seen(&from_map, false));
                assert_eq!(
                    names[..6],
                    ["host", "x-multi", "x-multi", "x-multi", "x-other", "accept"],
                    "{case}"
                );
            }
            if n == 3 {
                // Every `Cookie` joined into the first, whichever way.
                for seen in [&plain, &mapped, &from_map] {
                    let cookies: Vec<String> = fields_seen(seen, false)
                        .into_iter()
                        .filter(|l| l.starts_with("cookie:"))
                        .collect();
                    assert_eq!(cookies, ["cookie: a=1; b=2"], "{case}");
                }
            }
        }
    }
    // Over HTTP/2, cookie crumbs and all.
    let (mut send, _conn) = h2c(s.addr).await;
    let crumbs: [&[&str]; 3] = [&["a=1"], &["a=1", "b=2"], &[]];
    for (n, (crumbs, te)) in crumbs
        .iter()
        .flat_map(|c| [(c, true), (c, false)])
        .enumerate()
    {
        let mut got = Vec::new();
        for path in ["/p", "/m/p"] {
            let mut req = Request::builder()
                .uri(format!("http://app.example{path}"))
                .header("x-forwarded-for", "6.6.6.6")
                .header("x-kept", "1")
                .header("x-sluice-peer", "x");
            if te {
                req = req.header("te", "trailers");
            }
            for c in crumbs.iter() {
                req = req.header("cookie", *c);
            }
            let req = req.body(http_body_util::Empty::<Bytes>::new()).unwrap();
            let resp = send.send_request(req).await.unwrap();
            assert_eq!(resp.status(), 200, "h2 {n}");
            got.push(resp.into_body().collect().await.unwrap().to_bytes());
        }
        assert_eq!(
            fields_seen(&got[0], true),
            fields_seen(&got[1], true),
            "h2 {n}"
        );
        let plain = fields_seen(&got[0], false).join("\n");
        // The lines keep the client's order; the map's removal of its
        // `x-forwarded-for` would have moved its last field (`host`) up.
        assert!(plain.starts_with("x-kept: 1\n"), "h2 {n}: {plain}");
        let cookie = (!crumbs.is_empty()).then(|| format!("cookie: {}", crumbs.join("; ")));
        assert_eq!(plain.contains("te: trailers"), te, "h2 {n}: {plain}");
        assert!(cookie.is_none_or(|c| plain.contains(&c)), "h2 {n}: {plain}");
        assert!(
            !plain.contains("6.6.6.6") && !plain.contains("x-sluice"),
            "h2 {n}: {plain}"
        );
    }
    // HTTP/1.0 without `Host`: no `X-Forwarded-Host` any way.
    for (at, path) in [(s.addr, "/p"), (s.addr, "/m/p"), (logged.addr, "/p")] {
        let out = raw(
            at,
            format!("GET {path} HTTP/1.0\r\nX-Kept: 1\r\n\r\n").as_bytes(),
        )
        .await;
        let fields = fields_seen(&answered(&out, "HTTP/1.0 without Host"), false);
        let names: Vec<&str> = fields
            .iter()
            .map(|l| l.split(':').next().unwrap())
            .collect();
        assert_eq!(
            names,
            ["x-kept", "x-forwarded-for", "x-forwarded-proto"],
            "{path}"
        );
    }
}

/// The body of a whole `200` answer in `out`.
fn answered(out: &[u8], case: &str) -> Vec<u8> {
    let text = String::from_utf8_lossy(out);
    assert!(
        text.starts_with("HTTP/1.1 200") || text.starts_with("HTTP/1.0 200"),
        "{case}: {text}"
    );
    out[out.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4..].to_vec()
}

/// No field of `fields` (names) is one of `gone`.
fn none_of(fields: &[String], gone: &[&str], case: &str) {
    for g in gone {
        assert!(!fields.iter().any(|f| f == g), "{case}: {g} in {fields:?}");
    }
}

/// The names of field lines, as they were written.
fn names_of(lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .map(|l| l.split(':').next().unwrap().to_string())
        .collect()
}
