//! The HTTP cache (DESIGN §15.1) over real sockets: what is stored and served again,
//! what never is, variants, revalidation, invalidation, coalescing of misses, the
//! stale windows, the modes, purging (locally and through Redis across two
//! instances), metrics and status, and the config checks.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::redis::RedisServer;
use common::*;
use hyper::body::Incoming;
use hyper::{Request, Response};

/// A site on `localhost` whose one route caches (`cache` is the block's inside)
/// in front of `a`; the admin API on.
fn conf(a: SocketAddr, cache: &str) -> String {
    format!("global {{ admin 127.0.0.1:0 }}\nsite localhost {{\n  cache {{ {cache} }}\n  proxy {a}\n}}\n")
}

/// An origin answering each request with its number (`v1`, `v2`, …) and `fields`.
async fn numbered(fields: &'static [(&'static str, &'static str)]) -> Backend {
    let n = Arc::new(AtomicUsize::new(0));
    Backend::start(move |_req: Request<Incoming>| {
        let k = n.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            let mut r = Response::new(full(format!("v{k}")));
            for (name, value) in fields {
                r.headers_mut().append(*name, value.parse().unwrap());
            }
            r
        }
    })
    .await
}

fn status(r: &Resp) -> &str {
    r.header("cache-status").unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_response_is_stored_and_served_again_with_its_age() {
    let b = numbered(&[("cache-control", "max-age=60"), ("etag", "\"t1\"")]).await;
    let s = Sluice::start(&conf(b.addr, ""));
    let first = get(s.addr, "/x").await;
    assert_eq!(first.text(), "v1");
    assert_eq!(status(&first), "sluice; fwd=uri-miss; stored; ttl=60");
    let again = get(s.addr, "/x").await;
    assert_eq!(again.text(), "v1", "served from the store");
    assert!(
        status(&again).starts_with("sluice; hit; ttl="),
        "{}",
        status(&again)
    );
    assert!(
        again.header("age").is_some(),
        "a stored response says its Age"
    );
    assert_eq!(b.requests.load(Ordering::SeqCst), 1);
    // Another query is another key.
    assert_eq!(get(s.addr, "/x?a=1").await.text(), "v2");
    // HEAD from the stored GET: no body, the length of the stored one.
    let head = raw(
        s.addr,
        b"HEAD /x HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    )
    .await;
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.contains("content-length: 2\r\n") && head.ends_with("\r\n\r\n"),
        "{head}"
    );
    // One Range of the stored 200.
    let part = request(s.addr, "GET", "/x", &[("Range", "bytes=1-1")], b"").await;
    assert_eq!((part.status, part.text()), (206, "1".to_string()));
    assert_eq!(part.header("content-range"), Some("bytes 1-1/2"));
    let none = request(s.addr, "GET", "/x", &[("Range", "bytes=5-")], b"").await;
    assert_eq!(none.status, 416);
    // The client's copy is current: 304 from the store.
    let cur = request(s.addr, "GET", "/x", &[("If-None-Match", "\"t1\"")], b"").await;
    assert_eq!((cur.status, cur.body.len()), (304, 0));
    assert_eq!(
        b.requests.load(Ordering::SeqCst),
        2,
        "only /x?a=1 went to the origin"
    );
}

/// (request fields, response fields, status) a shared cache must not keep.
type Case = (
    &'static [(&'static str, &'static str)],
    &'static [(&'static str, &'static str)],
    u16,
);
const NOT_KEPT: &[Case] = &[
    (&[], &[("cache-control", "no-store, max-age=60")], 200),
    (&[], &[("cache-control", "private, max-age=60")], 200),
    (
        &[],
        &[("cache-control", "max-age=60"), ("set-cookie", "s=1")],
        200,
    ),
    (
        &[("Authorization", "Bearer x")],
        &[("cache-control", "max-age=60")],
        200,
    ),
    (&[], &[("cache-control", "max-age=60"), ("vary", "*")], 200),
    (
        &[("Cache-Control", "no-store")],
        &[("cache-control", "max-age=60")],
        200,
    ),
    (&[], &[], 201),
    (&[], &[], 200),
    (
        &[],
        &[
            ("cache-control", "max-age=60"),
            ("content-range", "bytes 0-1/9"),
        ],
        206,
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_a_shared_cache_must_not_keep_are_fetched_every_time() {
    let b = Backend::start(|req: Request<Incoming>| async move {
        let i: usize = req.uri().path()[1..].parse().unwrap();
        let (_, fields, code) = NOT_KEPT[i];
        let mut r = Response::new(full("ok"));
        *r.status_mut() = hyper::StatusCode::from_u16(code).unwrap();
        for (n, v) in fields {
            r.headers_mut().append(*n, v.parse().unwrap());
        }
        r
    })
    .await;
    let s = Sluice::start(&conf(b.addr, ""));
    for (i, (req, _, _)) in NOT_KEPT.iter().enumerate() {
        let before = b.requests.load(Ordering::SeqCst);
        for _ in 0..2 {
            let r = request(s.addr, "GET", &format!("/{i}"), req, b"").await;
            assert!(!status(&r).contains("hit"), "case {i}: {}", status(&r));
            assert!(!status(&r).contains("stored"), "case {i}: {}", status(&r));
        }
        assert_eq!(b.requests.load(Ordering::SeqCst) - before, 2, "case {i}");
    }
    // The control: with `public`, a request with Authorization may be answered.
    let b = numbered(&[("cache-control", "public, max-age=60")]).await;
    let s = Sluice::start(&conf(b.addr, ""));
    let auth = [("Authorization", "Bearer x")];
    for _ in 0..2 {
        assert_eq!(request(s.addr, "GET", "/p", &auth, b"").await.text(), "v1");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn variants_are_kept_per_vary_value() {
    let b = Backend::start(|req: Request<Incoming>| async move {
        let lang = req
            .headers()
            .get("accept-language")
            .map_or("none".to_string(), |v| v.to_str().unwrap().to_string());
        let mut r = Response::new(full(lang));
        r.headers_mut()
            .insert("cache-control", "max-age=60".parse().unwrap());
        r.headers_mut()
            .insert("vary", "Accept-Language".parse().unwrap());
        r
    })
    .await;
    let s = Sluice::start(&conf(b.addr, ""));
    let lang = |l: &'static str| [("Accept-Language", l)];
    let fr = request(s.addr, "GET", "/v", &lang("fr"), b"").await;
    assert_eq!(
        (fr.text().as_str(), status(&fr)),
        ("fr", "sluice; fwd=uri-miss; stored; ttl=60")
    );
    let en = request(s.addr, "GET", "/v", &lang("en"), b"").await;
    assert_eq!(en.text(), "en");
    assert!(
        status(&en).starts_with("sluice; fwd=vary-miss"),
        "{}",
        status(&en)
    );
    for l in ["fr", "en"] {
        let r = request(s.addr, "GET", "/v", &lang(l), b"").await;
        assert_eq!(r.text(), l);
        assert!(status(&r).contains("hit"), "{}", status(&r));
    }
    assert_eq!(
        get(s.addr, "/v").await.text(),
        "none",
        "no field is a value of its own"
    );
    assert_eq!(b.requests.load(Ordering::SeqCst), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_response_is_revalidated_and_a_304_refreshes_it() {
    let n = Arc::new(AtomicUsize::new(0));
    let b = Backend::start(move |req: Request<Incoming>| {
        let k = n.fetch_add(1, Ordering::SeqCst) + 1;
        let matched = req
            .headers()
            .get("if-none-match")
            .is_some_and(|v| v == "\"t1\"");
        async move {
            let mut r = if matched {
                let mut r = Response::new(full(""));
                *r.status_mut() = hyper::StatusCode::NOT_MODIFIED;
                r
            } else {
                Response::new(full("body"))
            };
            let h = r.headers_mut();
            h.insert("cache-control", "max-age=0".parse().unwrap());
            h.insert("etag", "\"t1\"".parse().unwrap());
            h.insert("x-round", k.to_string().parse().unwrap());
            r
        }
    })
    .await;
    let s = Sluice::start(&conf(b.addr, ""));
    assert_eq!(get(s.addr, "/r").await.text(), "body");
    let again = get(s.addr, "/r").await;
    assert_eq!((again.status, again.text().as_str()), (200, "body"));
    assert_eq!(status(&again), "sluice; fwd=stale; fwd-status=304; ttl=0");
    assert_eq!(
        again.header("x-round"),
        Some("2"),
        "the 304's fields update the stored ones"
    );
    let asked = request(s.addr, "GET", "/r", &[("Cache-Control", "no-cache")], b"").await;
    assert!(
        status(&asked).starts_with("sluice; fwd=request; fwd-status=304"),
        "{}",
        status(&asked)
    );
    assert_eq!(b.requests.load(Ordering::SeqCst), 3);
    // only-if-cached on a key never stored: 504.
    let none = request(
        s.addr,
        "GET",
        "/never",
        &[("Cache-Control", "only-if-cached")],
        b"",
    )
    .await;
    assert_eq!(none.status, 504);
    assert_eq!(b.requests.load(Ordering::SeqCst), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsafe_method_that_succeeds_invalidates_its_uri_and_location() {
    let b = Backend::start(|req: Request<Incoming>| async move {
        let mut r = Response::new(full(format!("{} {}", req.method(), req.uri())));
        r.headers_mut()
            .insert("cache-control", "max-age=60".parse().unwrap());
        if req.method() == "POST" {
            r.headers_mut()
                .insert("location", "/other".parse().unwrap());
        }
        r
    })
    .await;
    let s = Sluice::start(&conf(b.addr, ""));
    for p in ["/item", "/other", "/item", "/other"] {
        get(s.addr, p).await;
    }
    assert_eq!(b.requests.load(Ordering::SeqCst), 2);
    let post = request(s.addr, "POST", "/item", &[], b"x").await;
    assert_eq!(status(&post), "sluice; fwd=method");
    for p in ["/item", "/other"] {
        let r = get(s.addr, p).await;
        assert!(
            status(&r).starts_with("sluice; fwd=uri-miss"),
            "{p}: {}",
            status(&r)
        );
    }
    assert_eq!(b.requests.load(Ordering::SeqCst), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_concurrent_misses_make_one_origin_request() {
    let b = Backend::start(|_req: Request<Incoming>| async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut r = Response::new(full("slow and shared"));
        r.headers_mut()
            .insert("cache-control", "max-age=60".parse().unwrap());
        r
    })
    .await;
    let s = Sluice::start(&conf(b.addr, "lock 5s"));
    let addr = s.addr;
    let all: Vec<_> = (0..100)
        .map(|_| tokio::spawn(async move { get(addr, "/hot").await }))
        .collect();
    let mut statuses = std::collections::BTreeMap::new();
    for t in all {
        let r = t.await.unwrap();
        assert_eq!((r.status, r.text().as_str()), (200, "slow and shared"));
        // The ttl counts down; what went forward and how is the point.
        let kind = status(&r).split("; ttl=").next().unwrap().to_string();
        *statuses.entry(kind).or_insert(0) += 1;
    }
    assert_eq!(b.requests.load(Ordering::SeqCst), 1);
    // One leader fetched and stored; those that waited for it say so (RFC 9211
    // `collapsed`), not `hit`; a late one may find it stored.
    assert_eq!(
        statuses.get("sluice; fwd=uri-miss; stored"),
        Some(&1),
        "{statuses:?}"
    );
    assert!(
        statuses
            .get("sluice; fwd=uri-miss; collapsed")
            .is_some_and(|&n| n > 50),
        "{statuses:?}"
    );
    assert!(
        statuses
            .keys()
            .all(|k| k == "sluice; hit" || k.starts_with("sluice; fwd=uri-miss")),
        "{statuses:?}"
    );
}

/// Waits (bounded) until the origin has had `n` requests.
async fn until_requests(b: &Backend, n: usize) {
    let end = Instant::now() + WAIT;
    while b.requests.load(Ordering::SeqCst) < n {
        assert!(
            Instant::now() < end,
            "the origin had {} requests, not {n}",
            b.requests.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_while_revalidate_serves_at_once_and_refreshes_once_in_the_background() {
    let b = numbered(&[("cache-control", "max-age=1")]).await;
    let s = Sluice::start(&conf(b.addr, "stale_while_revalidate 30s"));
    assert_eq!(get(s.addr, "/w").await.text(), "v1");
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let stale = get(s.addr, "/w").await;
    assert_eq!(stale.text(), "v1", "the stale one, at once");
    assert!(
        status(&stale).ends_with("detail=stale-while-revalidate"),
        "{}",
        status(&stale)
    );
    until_requests(&b, 2).await;
    let end = Instant::now() + WAIT;
    loop {
        let r = get(s.addr, "/w").await;
        if r.text() == "v2" {
            assert!(status(&r).contains("hit"));
            break;
        }
        assert!(
            Instant::now() < end,
            "the refreshed response was never stored"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(b.requests.load(Ordering::SeqCst), 2, "one refresh");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_if_error_answers_for_every_kind_of_origin_failure() {
    for failure in ["5xx", "refused", "timeout"] {
        let n = Arc::new(AtomicUsize::new(0));
        // The origin answers once, then fails this way.
        let (addr, task) = if failure == "refused" {
            answer_once(b"HTTP/1.1 200 OK\r\ncache-control: max-age=1\r\ncontent-length: 4\r\nconnection: close\r\n\r\nkept").await
        } else {
            let b = Backend::start(move |_req: Request<Incoming>| {
                let k = n.fetch_add(1, Ordering::SeqCst);
                async move {
                    if k > 0 && failure == "timeout" {
                        tokio::time::sleep(Duration::from_secs(5)).await;
                    }
                    let mut r = Response::new(full("kept"));
                    if k > 0 {
                        *r.status_mut() = hyper::StatusCode::INTERNAL_SERVER_ERROR;
                    }
                    r.headers_mut()
                        .insert("cache-control", "max-age=1".parse().unwrap());
                    r
                }
            })
            .await;
            let addr = b.addr;
            (
                addr,
                tokio::spawn(async move {
                    std::future::pending::<()>().await;
                    drop(b)
                }),
            )
        };
        let s = Sluice::start(&format!(
            "site localhost {{\n  cache {{ stale_if_error 60s }}\n  proxy {addr} {{ timeout 1s }}\n}}\n"
        ));
        assert_eq!(get(s.addr, "/e").await.text(), "kept");
        tokio::time::sleep(Duration::from_millis(2100)).await;
        if failure == "refused" {
            task.abort();
            let _ = task.await;
        }
        let r = get(s.addr, "/e").await;
        assert_eq!((r.status, r.text().as_str()), (200, "kept"), "{failure}");
        assert!(
            status(&r).starts_with("sluice; fwd=stale; fwd-status=5"),
            "{failure}: {}",
            status(&r)
        );
        assert!(
            status(&r).ends_with("detail=stale-if-error"),
            "{failure}: {}",
            status(&r)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn must_revalidate_is_never_served_stale_even_on_error() {
    let n = Arc::new(AtomicUsize::new(0));
    let b = Backend::start(move |_req: Request<Incoming>| {
        let k = n.fetch_add(1, Ordering::SeqCst);
        async move {
            let mut r = Response::new(full("strict"));
            if k > 0 {
                *r.status_mut() = hyper::StatusCode::BAD_GATEWAY;
            }
            r.headers_mut().insert(
                "cache-control",
                "max-age=1, must-revalidate".parse().unwrap(),
            );
            r
        }
    })
    .await;
    let s = Sluice::start(&conf(
        b.addr,
        "stale_if_error 60s\n stale_while_revalidate 60s",
    ));
    assert_eq!(get(s.addr, "/m").await.text(), "strict");
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert_eq!(get(s.addr, "/m").await.status, 502);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_only_and_cache_only_answer_without_the_origin() {
    let b = numbered(&[("cache-control", "max-age=1")]).await;
    let dir = TempDir::new();
    let write = |mode: &str| {
        dir.write(
            "sluice.conf",
            &format!("listen 127.0.0.1:0\nglobal {{ admin off }}\nsite localhost {{\n  cache {{ mode {mode} }}\n  proxy {}\n}}\n", b.addr),
        )
    };
    let path = write("normal");
    let s = Sluice::spawn(&["run", "-c", path.to_str().unwrap()], TempDir::new());
    assert_eq!(get(s.addr, "/k").await.text(), "v1");
    tokio::time::sleep(Duration::from_millis(2100)).await;
    write("stale_only");
    s.signal("HUP");
    s.wait_log("reloaded: revision 2");
    let r = get(s.addr, "/k").await;
    assert_eq!(r.text(), "v1", "stale, kept across the reload");
    assert!(status(&r).ends_with("detail=stale-only"), "{}", status(&r));
    assert_eq!(
        get(s.addr, "/new").await.text(),
        "v2",
        "a miss still goes to the origin"
    );
    write("cache_only");
    s.signal("HUP");
    s.wait_log("reloaded: revision 3");
    assert_eq!(get(s.addr, "/k").await.text(), "v1");
    let miss = get(s.addr, "/nothing").await;
    assert_eq!((miss.status, miss.text().as_str()), (504, "not cached\n"));
    assert_eq!(b.requests.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hit_still_passes_the_request_filters_and_gets_the_response_ones() {
    let b = numbered(&[("cache-control", "public, max-age=60")]).await;
    let hash = bcrypt::hash("secret", 4).unwrap();
    let s = Sluice::start(&format!(
        "site localhost {{\n  basic_auth alice \"{hash}\"\n  header_down X-Edge yes\n  cache\n  proxy {}\n}}\n",
        b.addr
    ));
    let auth = [("Authorization", "Basic YWxpY2U6c2VjcmV0")];
    assert_eq!(request(s.addr, "GET", "/f", &auth, b"").await.text(), "v1");
    let hit = request(s.addr, "GET", "/f", &auth, b"").await;
    assert!(status(&hit).contains("hit"), "{}", status(&hit));
    assert_eq!(
        hit.header("x-edge"),
        Some("yes"),
        "response filters run on hits"
    );
    assert_eq!(
        get(s.addr, "/f").await.status,
        401,
        "no credentials, no hit"
    );
    assert_eq!(b.requests.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn larger_than_max_object_streams_through_uncached() {
    let b = Backend::start(|req: Request<Incoming>| async move {
        let big = req.uri().path() == "/big";
        let (tx, body) = channel_body();
        tokio::spawn(async move {
            for _ in 0..if big { 4 } else { 1 } {
                let _ = tx.send(bytes::Bytes::from(vec![b'x'; 1024])).await;
            }
        });
        let mut r = Response::new(body);
        r.headers_mut()
            .insert("cache-control", "max-age=60".parse().unwrap());
        r
    })
    .await;
    let s = Sluice::start(&conf(b.addr, "max_object 2K"));
    for _ in 0..2 {
        assert_eq!(get(s.addr, "/big").await.body.len(), 4096);
        assert_eq!(get(s.addr, "/small").await.body.len(), 1024);
    }
    assert_eq!(
        b.requests.load(Ordering::SeqCst),
        3,
        "/big twice, /small once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_by_key_prefix_and_all_with_metrics_and_status() {
    let b = numbered(&[("cache-control", "max-age=60")]).await;
    let s = Sluice::start(&conf(b.addr, "store memory 1M"));
    for p in ["/a", "/img/1", "/img/2", "/b", "/a"] {
        get(s.addr, p).await;
    }
    let admin = s.admin();
    let purged =
        |r: Resp| serde_json::from_slice::<serde_json::Value>(&r.body).unwrap()["purged"].clone();
    let r = post_json(admin, "/purge", r#"{"key": "GET localhost /a"}"#).await;
    assert_eq!(purged(r), 1);
    let r = post_json(admin, "/purge", r#"{"prefix": "localhost /img/"}"#).await;
    assert_eq!(purged(r), 2);
    let st: serde_json::Value =
        serde_json::from_slice(&request(admin, "GET", "/status", &[], b"").await.body).unwrap();
    assert_eq!(st["caches"][0]["objects"], 1);
    assert_eq!(st["caches"][0]["capacity"], 1 << 20);
    let m = request(admin, "GET", "/metrics", &[], b"").await.text();
    assert!(
        m.contains("sluice_cache_requests_total{site=\"localhost\",route=\"/*\",result=\"hit\"} 1"),
        "{m}"
    );
    assert!(
        m.contains(
            "sluice_cache_requests_total{site=\"localhost\",route=\"/*\",result=\"miss\"} 4"
        ),
        "{m}"
    );
    assert!(
        m.contains("sluice_cache_objects{store=\"memory 1048576\"} 1"),
        "{m}"
    );
    let r = post_json(admin, "/purge", r#"{"all": true}"#).await;
    assert_eq!(purged(r), 1);
    assert_eq!(
        post_json(admin, "/purge", r#"{"keys": 1}"#).await.status,
        400
    );
    assert!(status(&get(s.addr, "/a").await).starts_with("sluice; fwd=uri-miss"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_reaches_every_instance_through_redis() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let b = numbered(&[("cache-control", "max-age=600")]).await;
    let text = format!(
        "global {{ admin 127.0.0.1:0 }}\nsite localhost {{\n  cache {{ purge_store redis://127.0.0.1:{} }}\n  proxy {}\n}}\n",
        redis.port, b.addr
    );
    let (one, two) = (Sluice::start(&text), Sluice::start(&text));
    for s in [&one, &two] {
        get(s.addr, "/shared").await;
        assert!(status(&get(s.addr, "/shared").await).contains("hit"));
    }
    // Give both subscribers a moment to be subscribed (they start with the process).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = post_json(one.admin(), "/purge", r#"{"key": "GET localhost /shared"}"#).await;
    assert_eq!(r.status, 200);
    let end = Instant::now() + Duration::from_secs(1);
    loop {
        let st: serde_json::Value =
            serde_json::from_slice(&request(two.admin(), "GET", "/status", &[], b"").await.body)
                .unwrap();
        if st["caches"][0]["objects"] == 0 {
            break;
        }
        assert!(
            Instant::now() < end,
            "the purge did not reach the other instance in 1s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(status(&get(two.addr, "/shared").await).starts_with("sluice; fwd=uri-miss"));
}

#[test]
fn a_disk_store_folder_is_checked_without_being_made() {
    let dir = TempDir::new();
    let file = dir.write("a-file", "");
    let text = format!(
        "listen 127.0.0.1:0\nsite * {{\n  cache {{ store disk {} 1M }}\n  respond ok\n}}\n",
        file.display()
    );
    assert_check_fails(&dir, &text, "not a folder");
    let missing = dir.0.join("not/yet");
    let text = format!(
        "listen 127.0.0.1:0\nsite * {{\n  cache {{ store disk {} 1M }}\n  respond ok\n}}\n",
        missing.display()
    );
    let conf = dir.write("ok.conf", &text);
    let out = std::process::Command::new(bin())
        .args(["check", "-c", conf.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !missing.exists() && !dir.0.join("not").exists(),
        "check made nothing"
    );
}

#[test]
fn one_folder_is_one_disk_store() {
    let dir = TempDir::new();
    let d = dir.0.join("c");
    let text = format!(
        "listen 127.0.0.1:0\nsite * {{\n  route /a/* {{\n cache {{ store disk {0} 10M }}\n respond a\n }}\n  route /b/* {{\n cache {{ store disk {0} 20M }}\n respond b\n }}\n}}\n",
        d.display()
    );
    assert_check_fails(&dir, &text, "is a disk store of another size");
}

#[test]
fn a_bad_cache_block_fails_the_check_with_where_and_why() {
    let dir = TempDir::new();
    for (block, want) in [
        ("store memory 0", "a store's size must be more than 0"),
        ("store tape 1G", "expected `memory` or `disk`"),
        (
            "max_object 2M\n store memory 1M",
            "max_object 2097152 is larger than the store",
        ),
        ("key host", "`key` expects more"),
        ("key method method path", "`method` is in the key twice"),
        (
            "mode sometimes",
            "expected `normal`, `stale_only` or `cache_only`",
        ),
        ("lock soon", "lock"),
        ("purge_store http://x:1", "a Redis address"),
        ("heuristic maybe", "`on` or `off`"),
        (
            "stale_if_error 5s\n stale_if_error 6s",
            "`stale_if_error` is set twice",
        ),
        ("ttl 5s", "unknown directive `ttl`"),
    ] {
        let text = format!(
            "listen 127.0.0.1:0\nsite * {{\n  cache {{\n {block}\n  }}\n  respond ok\n}}\n"
        );
        assert_check_fails(&dir, &text, want);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_store_survives_kill_9_and_never_serves_a_truncated_object() {
    let b = numbered(&[("cache-control", "max-age=600")]).await;
    let dir = TempDir::new();
    let store = dir.0.join("store");
    let text = format!(
        "listen 127.0.0.1:0\nglobal {{ admin off }}\nsite localhost {{\n  cache {{ store disk {} 10M }}\n  proxy {}\n}}\n",
        store.display(),
        b.addr
    );
    let path = dir.write("sluice.conf", &text);
    let run = || Sluice::spawn(&["run", "-c", path.to_str().unwrap()], TempDir::new());
    let mut s = run();
    assert_eq!(get(s.addr, "/kept").await.text(), "v1");
    assert_eq!(get(s.addr, "/cut").await.text(), "v2");
    let files = |n: usize| {
        let end = Instant::now() + WAIT;
        loop {
            let mut objs: Vec<_> = std::fs::read_dir(&store)
                .unwrap()
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "obj"))
                .collect();
            if objs.len() == n {
                objs.sort();
                return objs;
            }
            assert!(Instant::now() < end, "{} object files, not {n}", objs.len());
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let objs = files(2);
    let hit = get(s.addr, "/kept").await;
    assert!(status(&hit).contains("hit"), "{}", status(&hit));
    s.child.kill().unwrap();
    s.child.wait().unwrap();
    // Cut the file that holds /cut short, as a crash in the middle of a write would
    // (were it not written to a temporary name first).
    let cut = objs
        .iter()
        .find(|p| std::fs::read(p).unwrap().ends_with(b"v2"))
        .unwrap();
    let len = std::fs::metadata(cut).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(cut)
        .unwrap()
        .set_len(len - 1)
        .unwrap();
    let s = run();
    let kept = get(s.addr, "/kept").await;
    assert_eq!(kept.text(), "v1", "served from the disk after the restart");
    assert!(status(&kept).contains("hit"), "{}", status(&kept));
    let again = get(s.addr, "/cut").await;
    assert_eq!(
        again.text(),
        "v3",
        "the truncated object was dropped, not served"
    );
    assert!(
        s.logs().contains("incomplete files deleted"),
        "{}",
        s.logs()
    );
    assert_eq!(b.requests.load(Ordering::SeqCst), 3);
}

/// One GET over HTTP/2 (h2c prior knowledge): status, `Cache-Status`, body.
async fn get_h2(addr: SocketAddr, path: &str) -> (u16, String, String) {
    use http_body_util::BodyExt;
    let (mut send, task) = h2c::<http_body_util::Empty<bytes::Bytes>>(addr).await;
    let req = Request::get(format!("http://localhost{path}"))
        .body(http_body_util::Empty::new())
        .unwrap();
    let resp = tokio::time::timeout(WAIT, send.send_request(req))
        .await
        .unwrap()
        .unwrap();
    let code = resp.status().as_u16();
    let cs = resp
        .headers()
        .get("cache-status")
        .map_or(String::new(), |v| v.to_str().unwrap().to_string());
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    task.abort();
    (code, cs, String::from_utf8_lossy(&body).to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_handler_is_cached_and_hit_over_either_front_protocol() {
    let b = Backend::start(|_req: Request<Incoming>| async move {
        let mut r = Response::new(full("origin"));
        r.headers_mut()
            .insert("cache-control", "max-age=60".parse().unwrap());
        r
    })
    .await;
    let dir = TempDir::new();
    dir.write("www/page.html", "a page");
    let handlers = [
        ("proxy", format!("proxy {}", b.addr), "origin"),
        (
            "files",
            format!("files {}", dir.0.join("www").display()),
            "a page",
        ),
        ("respond", "respond \"made here\"".to_string(), "made here"),
    ];
    for (name, handler, body) in handlers {
        for (first, second) in [("h1", "h2"), ("h2", "h1")] {
            let s = Sluice::start(&format!(
                "site localhost {{\n  cache {{ default_ttl 60s }}\n  {handler}\n}}\n"
            ));
            let path = if name == "files" { "/page.html" } else { "/c" };
            let ask = |proto: &'static str| async move {
                if proto == "h1" {
                    let r = get(s.addr, path).await;
                    (r.status, status(&r).to_string(), r.text())
                } else {
                    get_h2(s.addr, path).await
                }
            };
            let (code, cs, text) = ask(first).await;
            assert_eq!((code, text.as_str()), (200, body), "{name} {first}");
            assert!(cs.contains("stored"), "{name} {first}: {cs}");
            let (code, cs, text) = ask(second).await;
            assert_eq!((code, text.as_str()), (200, body), "{name} {second}");
            assert!(
                cs.starts_with("sluice; hit"),
                "{name} {second} after {first}: {cs}"
            );
        }
    }
    assert_eq!(
        b.requests.load(Ordering::SeqCst),
        2,
        "once per run (each run is a fresh store)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_comes_first_then_the_stale_window() {
    // Primary answers once then goes; the backup works: failover serves fresh.
    // Then the backup goes too: the stale response stands in.
    let fresh: &'static [u8] =
        b"HTTP/1.1 200 OK\r\ncache-control: max-age=1\r\ncontent-length: 7\r\nconnection: close\r\n\r\nprimary";
    let (primary, p_task) = answer_once(fresh).await;
    let (backup, b_task) = answer_once(
        b"HTTP/1.1 200 OK\r\ncache-control: max-age=1\r\ncontent-length: 6\r\nconnection: close\r\n\r\nbackup",
    )
    .await;
    let s = Sluice::start(&format!(
        "site localhost {{\n  cache {{ stale_if_error 60s }}\n  proxy {primary} {{\n    backup {backup}\n    failover {{ failure_threshold 1 }}\n  }}\n}}\n"
    ));
    assert_eq!(get(s.addr, "/f").await.text(), "primary");
    p_task.abort();
    let _ = p_task.await;
    // Refused from now on, and the port not handed to another test meanwhile.
    hold_port(primary);
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let r = get(s.addr, "/f").await;
    assert_eq!(r.text(), "backup", "failover first: {}", status(&r));
    tokio::time::sleep(Duration::from_millis(2100)).await;
    b_task.abort();
    let _ = b_task.await;
    hold_port(backup);
    let r = get(s.addr, "/f").await;
    assert_eq!((r.status, r.text().as_str()), (200, "backup"));
    assert!(
        status(&r).ends_with("detail=stale-if-error"),
        "{}",
        status(&r)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_sharing_a_store_never_answer_for_each_other() {
    let one = Backend::start(|_req: Request<Incoming>| async move {
        let mut r = Response::new(full("from one"));
        r.headers_mut()
            .insert("cache-control", "max-age=60".parse().unwrap());
        r
    })
    .await;
    let two = Backend::start(|_req: Request<Incoming>| async move {
        let mut r = Response::new(full("from two"));
        r.headers_mut()
            .insert("cache-control", "max-age=60".parse().unwrap());
        r
    })
    .await;
    // Both strip to the same backend path, and share the default store; two more
    // routes of one pattern are told apart by a header only.
    let s = Sluice::start(&format!(
        "site localhost {{\n  route /v1/* {{ strip /v1\n cache\n proxy {a} }}\n  route /v2/* {{ strip /v2\n cache\n proxy {b} }}\n  route /app/* {{ match header X-Beta 1\n cache\n proxy {b} }}\n  route /app/* {{ cache\n proxy {a} }}\n}}\n",
        a = one.addr,
        b = two.addr
    ));
    let beta = [("X-Beta", "1")];
    for _ in 0..2 {
        assert_eq!(get(s.addr, "/v1/users").await.text(), "from one");
        assert_eq!(get(s.addr, "/v2/users").await.text(), "from two");
        assert_eq!(
            request(s.addr, "GET", "/app/x", &beta, b"").await.text(),
            "from two"
        );
        assert_eq!(get(s.addr, "/app/x").await.text(), "from one");
    }
    assert_eq!(
        (
            one.requests.load(Ordering::SeqCst),
            two.requests.load(Ordering::SeqCst)
        ),
        (2, 2)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cookie_an_origin_sets_is_never_replayed_to_another_client() {
    // The first answer and every 304 set a cookie; keyed by cookie, the response may
    // be stored, but the stored copy carries no Set-Cookie.
    let n = Arc::new(AtomicUsize::new(0));
    let b = Backend::start(move |req: Request<Incoming>| {
        let k = n.fetch_add(1, Ordering::SeqCst) + 1;
        let cond = req.headers().contains_key("if-none-match");
        async move {
            let mut r = Response::new(full(if cond { "" } else { "page" }));
            if cond {
                *r.status_mut() = hyper::StatusCode::NOT_MODIFIED;
            }
            let h = r.headers_mut();
            h.insert("cache-control", "max-age=1".parse().unwrap());
            h.insert("etag", "\"e\"".parse().unwrap());
            h.insert("set-cookie", format!("sid=user{k}").parse().unwrap());
            r
        }
    })
    .await;
    let s = Sluice::start(&conf(b.addr, "key method host path query cookie theme"));
    let first = get(s.addr, "/p").await;
    assert_eq!(
        first.header("set-cookie"),
        Some("sid=user1"),
        "its own client gets it"
    );
    let hit = get(s.addr, "/p").await;
    assert!(status(&hit).contains("hit"), "{}", status(&hit));
    assert_eq!(
        hit.header("set-cookie"),
        None,
        "not replayed from the store"
    );
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let revalidated = get(s.addr, "/p").await;
    assert!(
        status(&revalidated).contains("fwd-status=304"),
        "{}",
        status(&revalidated)
    );
    let after = get(s.addr, "/p").await;
    assert_eq!(
        after.header("set-cookie"),
        None,
        "a 304's cookie is not stored either"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_keeps_at_most_32_variants_and_head_on_a_stale_one_gets_its_fields() {
    let b = Backend::start(|req: Request<Incoming>| async move {
        let cond = req.headers().contains_key("if-none-match");
        let mut r = Response::new(full(if cond { "" } else { "body" }));
        if cond {
            *r.status_mut() = hyper::StatusCode::NOT_MODIFIED;
        }
        let h = r.headers_mut();
        h.insert("cache-control", "max-age=1".parse().unwrap());
        h.insert("etag", "\"e\"".parse().unwrap());
        h.insert("vary", "User-Agent".parse().unwrap());
        r
    })
    .await;
    let s = Sluice::start(&conf(b.addr, ""));
    for i in 0..40 {
        let ua = format!("agent-{i}");
        request(s.addr, "GET", "/v", &[("User-Agent", &ua)], b"").await;
    }
    let st: serde_json::Value =
        serde_json::from_slice(&request(s.admin(), "GET", "/status", &[], b"").await.body).unwrap();
    assert_eq!(st["caches"][0]["objects"], 32);
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let head = raw(
        s.addr,
        b"HEAD /v HTTP/1.1\r\nHost: localhost\r\nUser-Agent: agent-39\r\nConnection: close\r\n\r\n",
    )
    .await;
    let head = String::from_utf8_lossy(&head);
    assert!(
        head.starts_with("HTTP/1.1 200"),
        "a HEAD revalidated by a 304 gets the stored fields: {head}"
    );
    assert!(head.contains("fwd-status=304"), "{head}");
}

/// A backend's `103 Early Hints` passes through a cache route to an HTTP/1.1 client on
/// a miss, and the final answer is stored (the interim one never is): the next request
/// is a hit, without a 103 (cache-tests' `interim-102` and `interim-103`).
#[tokio::test]
async fn interim_answers_pass_a_cache_and_are_never_stored() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (origin, _task) = raw_backend(|mut c| async move {
        let mut buf = [0u8; 4096];
        let _ = c.read(&mut buf).await;
        let _ = c
            .write_all(b"HTTP/1.1 103 Early Hints\r\nlink: </s.css>; rel=preload\r\n\r\n")
            .await;
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let _ = c
            .write_all(b"HTTP/1.1 200 OK\r\ncache-control: max-age=100000\r\ncontent-length: 5\r\nconnection: close\r\n\r\nfinal")
            .await;
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    })
    .await;
    let s = Sluice::start(&format!(
        "site * {{ cache {{ store memory 16M }} proxy {origin} }}"
    ));
    let first = raw(
        s.addr,
        b"GET /page HTTP/1.1\r\nhost: a.test\r\nconnection: close\r\n\r\n",
    )
    .await;
    let text = String::from_utf8_lossy(&first);
    assert!(
        text.starts_with("HTTP/1.1 103 Early Hints\r\n")
            && text.contains("link: </s.css>; rel=preload"),
        "{text}"
    );
    assert!(
        text.contains("HTTP/1.1 200 OK\r\n") && text.ends_with("final"),
        "{text}"
    );
    let second = raw(
        s.addr,
        b"GET /page HTTP/1.1\r\nhost: a.test\r\nconnection: close\r\n\r\n",
    )
    .await;
    let text = String::from_utf8_lossy(&second);
    assert!(
        text.starts_with("HTTP/1.1 200 OK\r\n"),
        "a hit, no 103: {text}"
    );
    assert!(
        text.to_ascii_lowercase()
            .contains("cache-status: sluice; hit"),
        "{text}"
    );
}
