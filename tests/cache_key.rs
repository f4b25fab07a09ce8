//! The cache key is the request as the backend receives it (DESIGN §18.1): spellings of
//! a path, the scheme and the Host's port are never answered from each other's entry;
//! a key too long to keep passes through; keys and fields count in the store's size;
//! revalidations a client asks for are coalesced; a slow first reader never holds the
//! others; eviction goes by the whole store's recency; a disk store is private.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use hyper::body::Incoming;
use hyper::{Request, Response};
use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An origin that answers with what it received: the Host (as a name is compared:
/// lower case, no trailing dot) and the target, exactly. Cacheable for a minute.
async fn echo_target() -> Backend {
    Backend::start(|req: Request<Incoming>| async move {
        let host = req
            .headers()
            .get("host")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase()
            .replace(".:", ":");
        let host = host.strip_suffix('.').unwrap_or(&host).to_string();
        let mut r = Response::new(full(format!("{host} {}", req.uri())));
        r.headers_mut()
            .insert("cache-control", "max-age=60".parse().unwrap());
        r
    })
    .await
}

/// Two sites with the same routes in front of `b`: `cached.test` caches,
/// `plain.test` does not (what the backend says to a request without a cache).
fn twin_sites(b: SocketAddr) -> String {
    let routes = format!(
        "route /s/* {{ strip /s\n CACHE proxy {b} }}
         route /r/* {{ rewrite /r/* /rewritten/*\n CACHE proxy {b} }}
         route /* {{ CACHE proxy {b} }}"
    );
    format!(
        "site cached.test {{ {} }}\nsite plain.test {{ {} }}\n",
        routes.replace("CACHE", "cache { key method host path query }\n"),
        routes.replace("CACHE", "")
    )
}

async fn get_as(addr: SocketAddr, host: &str, target: &str) -> Resp {
    request(addr, "GET", target, &[("Host", host)], b"").await
}

fn status(r: &Resp) -> &str {
    r.header("cache-status").unwrap_or("")
}

/// Each spelling is its own entry: `/page` stored never answers `//page`, `/./page`
/// or `/%70age`, and each is a hit of its own the second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_spelling_of_a_path_is_its_own_entry() {
    let b = echo_target().await;
    let s = Sluice::start(&twin_sites(b.addr));
    let spellings = [
        "/page",
        "/./page",
        "//page",
        "/%70age",
        "/x/../page",
        "/page?",
        "/page?a=1",
        "/s/page",
        "/s//page",
        "/r/page",
    ];
    for t in spellings {
        let r = get_as(s.addr, "cached.test", t).await;
        let truth = get_as(s.addr, "plain.test", t).await;
        assert_eq!(
            r.text().replace("cached.test", ""),
            truth.text().replace("plain.test", ""),
            "{t}: the cache answered what the backend says to another spelling ({})",
            status(&r)
        );
    }
    for t in spellings {
        let r = get_as(s.addr, "cached.test", t).await;
        assert!(
            status(&r).starts_with("sluice; hit"),
            "{t}: the second time is a hit: {}",
            status(&r)
        );
    }
}

/// The Host's port and the scheme are in the key: a redirect the origin made for
/// `Host: app.test:6666`, or for plain HTTP, never reaches another client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scheme_and_the_host_port_are_in_the_key() {
    let b = echo_target().await;
    let ca = common::pki::Ca::new();
    let leaf = ca.leaf(&["cached.test"]);
    let dir = TempDir::new();
    let cert = dir.write("c.pem", &leaf.cert_pem);
    let key = dir.write("c.key", &leaf.key_pem);
    let path = dir.write(
        "sluice.conf",
        &format!(
            "global {{ admin off }}
listen 127.0.0.1:0
listen 127.0.0.2:0 tls
site cached.test {{ tls {} {}\n cache\n proxy {} }}
",
            cert.display(),
            key.display(),
            b.addr
        ),
    );
    let s = Sluice::spawn(&["run", "-c", path.to_str().unwrap()], dir);
    let tls_addr: SocketAddr = s
        .wait_log("listening on https://")
        .rsplit_once("https://")
        .unwrap()
        .1
        .parse()
        .unwrap();
    let plain = get_as(s.addr, "cached.test:6666", "/x").await;
    assert_eq!(plain.text(), "cached.test:6666 /x");
    let other_port = get_as(s.addr, "Cached.Test.", "/x").await;
    assert_eq!(
        other_port.text(),
        "cached.test /x",
        "another port is another key: {}",
        status(&other_port)
    );
    let again = get_as(s.addr, "cached.test", "/x").await;
    assert!(
        status(&again).starts_with("sluice; hit"),
        "case and a trailing dot are one host: {}",
        status(&again)
    );
    assert_eq!(b.requests.load(Ordering::SeqCst), 2);
    let raw = b"GET /x HTTP/1.1\r\nHost: cached.test\r\nConnection: close\r\n\r\n";
    let out = common::pki::tls_exchange(tls_addr, &ca, "cached.test", raw).await;
    let (over_tls, _) = parse_response(&out).expect("an answer over TLS");
    assert!(
        status(&over_tls).contains("fwd=uri-miss"),
        "HTTPS never gets what plain HTTP stored: {}",
        status(&over_tls)
    );
    assert_eq!(b.requests.load(Ordering::SeqCst), 3);
}

/// A key over 8 KiB passes through uncached; keys count in `sluice_cache_bytes`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_keys_pass_through_and_keys_count_in_the_store_size() {
    let b = echo_target().await;
    let s = Sluice::start(&format!(
        "global {{ admin 127.0.0.1:0 }}\nsite localhost {{ cache\n proxy {} }}\n",
        b.addr
    ));
    let long = format!("/?q={}", "x".repeat(9000));
    for n in 1..=2 {
        let r = get(s.addr, &long).await;
        assert_eq!(r.status, 200);
        assert_eq!(status(&r), "sluice; fwd=bypass; detail=key");
        assert_eq!(b.requests.load(Ordering::SeqCst), n, "never stored");
    }
    for k in 0..50 {
        let r = get(s.addr, &format!("/?{k}={}", "y".repeat(4000))).await;
        assert!(status(&r).contains("stored"), "{}", status(&r));
    }
    let metrics = get(s.admin(), "/metrics").await.text();
    let bytes: u64 = metrics
        .lines()
        .find(|l| l.starts_with("sluice_cache_bytes{"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .expect("sluice_cache_bytes");
    assert!(
        bytes >= 50 * 8000,
        "each key (once in the index, once echoed in the body) counts: {bytes}"
    );
}

/// An origin that counts its requests and answers each after `delay`, with `len`
/// bytes of body, cacheable for a minute.
async fn slow_origin(delay: Duration, len: usize) -> Backend {
    let n = Arc::new(AtomicUsize::new(0));
    Backend::start(move |_req: Request<Incoming>| {
        n.fetch_add(1, Ordering::SeqCst);
        async move {
            tokio::time::sleep(delay).await;
            let mut r = Response::new(full(vec![b'z'; len]));
            r.headers_mut()
                .insert("cache-control", "max-age=60".parse().unwrap());
            r.headers_mut().insert("etag", "\"e\"".parse().unwrap());
            r
        }
    })
    .await
}

/// Twenty clients asking at once for a revalidation (`no-cache`) make one origin
/// request; with `client_revalidate off` they make none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_revalidations_are_coalesced_or_ignored() {
    for (setting, origin_requests) in [("", 1), ("client_revalidate off", 0)] {
        let b = slow_origin(Duration::from_millis(300), 10).await;
        let s = Sluice::start(&format!(
            "site localhost {{ cache {{ {setting} }}\n proxy {} }}\n",
            b.addr
        ));
        assert_eq!(get(s.addr, "/x").await.status, 200);
        assert_eq!(b.requests.load(Ordering::SeqCst), 1);
        let asks = (0..20).map(|_| {
            let addr = s.addr;
            tokio::spawn(async move {
                request(addr, "GET", "/x", &[("Cache-Control", "no-cache")], b"").await
            })
        });
        for r in futures_util::future::join_all(asks).await {
            assert_eq!(r.unwrap().status, 200);
        }
        assert_eq!(
            b.requests.load(Ordering::SeqCst),
            1 + origin_requests,
            "`{setting}`: twenty no-cache requests make {origin_requests} origin requests"
        );
    }
}

/// The first client never reads its body: the store still fills at the origin's
/// pace, and a second client is answered from it, without another origin request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_first_reader_does_not_hold_the_others() {
    let b = slow_origin(Duration::from_millis(200), 4 << 20).await;
    let s = Sluice::start(&format!(
        "site localhost {{ cache {{ lock 30s }}\n proxy {} }}\n",
        b.addr
    ));
    let mut stalled = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    stalled
        .write_all(b"GET /big HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut head = [0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(10), stalled.read(&mut head))
        .await
        .expect("the first client gets its head")
        .unwrap();
    assert!(head[..n].starts_with(b"HTTP/1.1 200"));
    let second = tokio::time::timeout(Duration::from_secs(20), get(s.addr, "/big"))
        .await
        .expect("the second client is answered long before the lock runs out");
    assert_eq!(second.body.len(), 4 << 20);
    assert_eq!(
        b.requests.load(Ordering::SeqCst),
        1,
        "the second is answered from the store the first one's fetch filled ({})",
        status(&second)
    );
    drop(stalled);
}

/// Eviction goes by the whole store's recency: after every entry but one was used
/// again, a new one evicts that one, whichever shards they are in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_least_recently_used_entry_of_the_whole_store_goes_first() {
    let b = slow_origin(Duration::ZERO, 100 << 10).await;
    let s = Sluice::start(&format!(
        "site localhost {{ cache {{ store memory 1M }}\n proxy {} }}\n",
        b.addr
    ));
    let fits = 10;
    for k in 0..fits {
        let r = get(s.addr, &format!("/o{k}")).await;
        assert!(status(&r).contains("stored"), "/o{k}: {}", status(&r));
    }
    for k in (0..fits).filter(|&k| k != 2) {
        let r = get(s.addr, &format!("/o{k}")).await;
        assert!(
            status(&r).starts_with("sluice; hit"),
            "/o{k}: {}",
            status(&r)
        );
    }
    let r = get(s.addr, "/new").await;
    assert!(status(&r).contains("stored"), "{}", status(&r));
    for k in (0..fits).filter(|&k| k != 2) {
        let r = get(s.addr, &format!("/o{k}")).await;
        assert!(
            status(&r).starts_with("sluice; hit"),
            "/o{k} was used more recently than /o2 and stays: {}",
            status(&r)
        );
    }
    let r = get(s.addr, "/o2").await;
    assert!(
        status(&r).contains("fwd=uri-miss"),
        "/o2, the least recently used, went: {}",
        status(&r)
    );
}

/// A disk store's folders are `0700` and its files `0600`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_store_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let b = echo_target().await;
    let dir = TempDir::new();
    let store = dir.0.join("cache/objects");
    let path = dir.write(
        "sluice.conf",
        &format!(
            "global {{ admin off }}\nlisten 127.0.0.1:0\nsite localhost {{ cache {{ store disk {} 10M }}\n proxy {} }}\n",
            store.display(),
            b.addr
        ),
    );
    let s = Sluice::spawn(&["run", "-c", path.to_str().unwrap()], dir);
    assert!(status(&get(s.addr, "/x").await).contains("stored"));
    let file = (0..100)
        .find_map(|_| {
            let found = std::fs::read_dir(&store)
                .ok()?
                .filter_map(Result::ok)
                .find(|e| e.file_name().to_string_lossy().ends_with(".obj"));
            if found.is_none() {
                std::thread::sleep(Duration::from_millis(50));
            }
            found
        })
        .expect("the object is written");
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&store), 0o700, "the store's folder");
    assert_eq!(mode(store.parent().unwrap()), 0o700, "a folder made for it");
    assert_eq!(mode(&file.path()), 0o600, "a stored object");
}

/// One path spelled several ways a backend may tell apart: a dot segment, an empty
/// segment, a `..` that comes back, an escaped unreserved byte, an escaped `/`; under
/// each route prefix (none, `strip`, `rewrite`), with or without a query.
fn spellings() -> impl Strategy<Value = Vec<String>> {
    (
        prop::collection::vec(prop::sample::select(vec!["a", "b", "A", "a.b", "~c"]), 1..4),
        prop::collection::vec((0usize..4, 0usize..6), 1..6),
        prop::option::of(prop::sample::select(vec!["", "a=1", "a=%31", "A=1"])),
    )
        .prop_map(|(segs, edits, query)| {
            let spell = |at: usize, how: usize| {
                let mut s: Vec<String> = segs.iter().map(|x| x.to_string()).collect();
                let i = at % s.len();
                match how {
                    0 => s.insert(i, ".".into()),
                    1 => s.insert(i, String::new()),
                    2 => {
                        s.insert(i, "..".into());
                        s.insert(i, "x".into());
                    }
                    3 => s[i] = s[i].replacen('a', "%61", 1),
                    4 => s[i] = format!("{}%2F", s[i]),
                    _ => {}
                }
                s.join("/")
            };
            let mut out = Vec::new();
            for prefix in ["", "/s", "/r"] {
                for &(at, how) in edits.iter().chain(&[(0, 5)]) {
                    let mut t = format!("{prefix}/{}", spell(at, how));
                    if let Some(q) = query {
                        t.push('?');
                        t.push_str(q);
                    }
                    out.push(t);
                }
            }
            out
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    /// Whatever the spellings, the cache answers each request with what the backend
    /// says to that request: when two requests reach the backend as different bytes,
    /// one is never answered from the other's entry.
    #[test]
    fn the_cache_answers_what_the_backend_says_to_this_request(
        targets in spellings()
    ) {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let b = echo_target().await;
            let s = Sluice::start(&twin_sites(b.addr));
            // Twice round: the second time, every answer comes from the store.
            for t in targets.iter().chain(targets.iter()) {
                let cached = get_as(s.addr, "cached.test", t).await;
                let truth = get_as(s.addr, "plain.test", t).await;
                prop_assert_eq!(cached.status, truth.status, "{}", t);
                prop_assert_eq!(
                    cached.text().replace("cached.test", ""),
                    truth.text().replace("plain.test", ""),
                    "{}: {}", t, status(&cached)
                );
            }
            Ok(())
        })?;
    }
}
