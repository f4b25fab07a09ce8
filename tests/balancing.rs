//! Balancing policies over real sockets (DESIGN.md §8.3): exact sequences where the
//! algorithm is deterministic, tolerances where it is random, consistency for hashing,
//! and in-flight accounting that comes back to zero however requests end.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use hyper::body::Incoming;
use hyper::{Request, Response};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;

fn pool(addrs: &[&Backend], opts: &str) -> String {
    let list: Vec<String> = addrs.iter().map(|b| b.addr.to_string()).collect();
    format!(
        "site * {{\n  proxy {} {{\n{opts}\n  }}\n}}\n",
        list.join(" ")
    )
}

async fn named(n: usize) -> Vec<Backend> {
    let mut v = Vec::new();
    for name in ["a", "b", "c", "d", "e"].into_iter().take(n) {
        v.push(Backend::text(name).await);
    }
    v
}

async fn sequence(s: &Sluice, n: usize, headers: &[(&str, &str)]) -> String {
    let mut out = String::new();
    for _ in 0..n {
        out.push_str(&request(s.addr, "GET", "/", headers, b"").await.text());
    }
    out
}

#[tokio::test]
async fn weighted_round_robin_is_smooth() {
    let bs = named(3).await;
    let s = Sluice::start(&pool(
        &bs.iter().collect::<Vec<_>>(),
        "lb weighted_round_robin\nweights 5 1 1",
    ));
    assert_eq!(
        sequence(&s, 14, &[]).await,
        "aabacaaaabacaa",
        "weights 5 1 1: a a b a c a a in every 7, no bursts"
    );
}

#[tokio::test]
async fn least_conn_avoids_the_busy_peer() {
    let gate = Arc::new(Notify::new());
    let g = gate.clone();
    let a = Backend::start(move |req: Request<Incoming>| {
        let g = g.clone();
        async move {
            if req.uri().path() == "/slow" {
                g.notified().await;
            }
            Response::new(full("a"))
        }
    })
    .await;
    let b = Backend::text("b").await;
    let s = Sluice::start(&pool(&[&a, &b], "lb least_conn"));
    let addr = s.addr;
    // Ties rotate starting with a: the slow request lands on a and stays in flight.
    let slow = tokio::spawn(async move { get(addr, "/slow").await.text() });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        sequence(&s, 4, &[]).await,
        "bbbb",
        "a has one in flight, b none"
    );
    gate.notify_one();
    assert_eq!(slow.await.unwrap(), "a");
    let after = sequence(&s, 4, &[]).await;
    assert_eq!(
        after.matches('a').count(),
        2,
        "loads equal again: ties rotate: {after}"
    );
}

#[tokio::test]
async fn in_flight_comes_back_to_zero_after_a_thousand_abandoned_responses() {
    // a streams /stream without end; b answers everything at once.
    let a = Backend::start(|req: Request<Incoming>| async move {
        if req.uri().path() != "/stream" {
            return Response::new(full("a"));
        }
        let (tx, body) = channel_body();
        tokio::spawn(async move {
            while tx.send(Bytes::from_static(&[b'x'; 1024])).await.is_ok() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        });
        Response::new(body)
    })
    .await;
    let b = Backend::text("b").await;
    let s = Sluice::start(&pool(&[&a, &b], "lb least_conn"));
    for i in 0..1000 {
        let mut c = TcpStream::connect(s.addr).await.unwrap();
        c.write_all(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 2048];
        let n = tokio::time::timeout(WAIT, c.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "request {i} got an answer");
        // Dropped mid-body (or, from b, after its short body); sluice notices at its
        // next write, a millisecond later.
        drop(c);
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    let streamed = a.requests.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        streamed >= 300,
        "a streamed {streamed} of the 1000 and each was abandoned"
    );
    // Give sluice a moment to notice the last clients left.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = sequence(&s, 6, &[]).await;
    assert_eq!(
        after.matches('a').count(),
        3,
        "a's in-flight count is back to 0, so it shares equally with b: {after}"
    );
}

#[tokio::test]
async fn p2c_spreads_over_every_peer() {
    let bs = named(3).await;
    let s = Sluice::start(&pool(&bs.iter().collect::<Vec<_>>(), "lb p2c"));
    let seen = sequence(&s, 300, &[]).await;
    for c in ['a', 'b', 'c'] {
        let n = seen.matches(c).count();
        assert!((40..180).contains(&n), "{c} served {n} of 300");
    }
}

#[tokio::test]
async fn hashing_keeps_keys_and_moves_only_a_removed_peers() {
    let bs = named(4).await;
    let all = Sluice::start(&pool(
        &bs.iter().collect::<Vec<_>>(),
        "lb hash header X-User",
    ));
    let three = Sluice::start(&pool(
        &bs[..3].iter().collect::<Vec<_>>(),
        "lb hash header X-User",
    ));
    let cookie = Sluice::start(&pool(&bs.iter().collect::<Vec<_>>(), "lb hash cookie sid"));
    let mut moved = 0;
    let mut owned_by_d = 0;
    for u in 0..60 {
        let user = format!("user{u}");
        let h = [("X-User", user.as_str())];
        let first = request(all.addr, "GET", "/", &h, b"").await.text();
        let again = request(all.addr, "GET", "/", &h, b"").await.text();
        assert_eq!(first, again, "{user} always lands on the same peer");
        let without_d = request(three.addr, "GET", "/", &h, b"").await.text();
        if first == "d" {
            owned_by_d += 1;
        } else if first != without_d {
            moved += 1;
        }
        let c = format!("theme=dark; sid={user}");
        let by_cookie = request(cookie.addr, "GET", "/", &[("Cookie", c.as_str())], b"")
            .await
            .text();
        assert_eq!(
            by_cookie, first,
            "the same key by cookie lands on the same peer"
        );
    }
    assert_eq!(moved, 0, "removing d moves none of the other peers' keys");
    assert!(
        (3..35).contains(&owned_by_d),
        "d owned about a quarter: {owned_by_d}"
    );
}

/// Waits (bounded) for a log line without blocking the runtime the backends run on.
async fn logged(s: &Sluice, needle: &str) {
    let end = std::time::Instant::now() + WAIT;
    while !s.logs().contains(needle) {
        assert!(
            std::time::Instant::now() < end,
            "no log line with {needle:?}:\n{}",
            s.logs()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn status_backend(code: u16) -> Backend {
    Backend::start(move |_req: Request<Incoming>| async move {
        let mut r = Response::new(full(if code < 500 { "ok" } else { "err" }));
        *r.status_mut() = hyper::StatusCode::from_u16(code).unwrap();
        r
    })
    .await
}

#[tokio::test]
async fn outliers_are_ejected_within_the_cap() {
    let (bad, good) = (status_backend(500).await, status_backend(200).await);
    let s = Sluice::start(&pool(
        &[&bad, &good],
        "outlier { consecutive_5xx 3; ejection 2s; max_ejected 50% }",
    ));
    let mut errors = 0;
    for _ in 0..20 {
        if get(s.addr, "/").await.status == 500 {
            errors += 1;
        }
    }
    assert_eq!(errors, 3, "three 5xx in a row, then the peer is out");
    assert_eq!(bad.requests.load(std::sync::atomic::Ordering::SeqCst), 3);
    s.wait_log(&format!(
        "{} ejected for 2s after 3 5xx answers in a row",
        bad.addr
    ));

    // Three failing peers, at most half ejected: one.
    let all: Vec<Backend> = vec![
        status_backend(502).await,
        status_backend(502).await,
        status_backend(502).await,
    ];
    let s = Sluice::start(&pool(
        &all.iter().collect::<Vec<_>>(),
        "outlier { consecutive_5xx 1; ejection 10s; max_ejected 50% }",
    ));
    for _ in 0..12 {
        get(s.addr, "/").await;
    }
    s.wait_count("5xx answers in a row", 1);
}

#[tokio::test]
async fn slow_start_ramps_a_recovered_peer() {
    let healthy = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let h = healthy.clone();
    let a = Backend::start(move |req: Request<Incoming>| {
        let h = h.clone();
        async move {
            let mut r = Response::new(full("a"));
            if req.uri().path() == "/h" && !h.load(std::sync::atomic::Ordering::SeqCst) {
                *r.status_mut() = hyper::StatusCode::SERVICE_UNAVAILABLE;
            }
            r
        }
    })
    .await;
    let b = Backend::text("b").await;
    let s = Sluice::start(&pool(
        &[&a, &b],
        "slow_start 8s\nhealth /h { interval 1s; timeout 500ms; rise 1; fall 1 }",
    ));
    healthy.store(false, std::sync::atomic::Ordering::SeqCst);
    logged(&s, "failed its health check").await;
    healthy.store(true, std::sync::atomic::Ordering::SeqCst);
    logged(&s, "passes its health check again").await;
    let early = sequence(&s, 40, &[]).await;
    let share = early.matches('a').count();
    assert!(
        share <= 8,
        "just back, a gets a small share of 40: {share} ({early})"
    );
    tokio::time::sleep(Duration::from_millis(8200)).await;
    let later = sequence(&s, 40, &[]).await;
    assert_eq!(
        later.matches('a').count(),
        20,
        "ramp done: an even split ({later})"
    );
}
