//! Opt-in retries of requests that reached a backend (DESIGN.md §8.6): only for
//! idempotent methods or requests with `Idempotency-Key`, only with the body kept in
//! the replay buffer, never past the retry budget. Over real sockets.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};

/// A backend answering 503 to everything, once it has read the request.
async fn failing() -> Backend {
    Backend::start(|req: Request<Incoming>| async move {
        // Read whole: an answer before the upload ends races the backend's close.
        let _ = req.into_body().collect().await;
        let mut r = Response::new(full("busy"));
        *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        r
    })
    .await
}

/// A backend echoing the request's method and body.
async fn echo() -> Backend {
    Backend::start(|req: Request<Incoming>| async move {
        let m = req.method().to_string();
        let body = req.into_body().collect().await.unwrap().to_bytes();
        Response::new(full(format!("{m} {}", String::from_utf8_lossy(&body))))
    })
    .await
}

fn pool(first: &Backend, second: &Backend, opts: &str) -> String {
    format!(
        "site * {{ proxy {} {} {{\n lb first\n {opts}\n }} }}",
        first.addr, second.addr
    )
}

#[tokio::test]
async fn a_get_is_retried_on_a_503_and_a_post_never_is() {
    let (bad, good) = (failing().await, echo().await);
    let s = Sluice::start(&pool(&bad, &good, "retry_on 503"));
    let r = get(s.addr, "/").await;
    assert_eq!(
        (r.status, r.text().as_str()),
        (200, "GET "),
        "the GET went on to the next backend"
    );
    let r = request(s.addr, "POST", "/", &[], b"pay once").await;
    assert_eq!(
        r.status, 503,
        "a POST without Idempotency-Key is never replayed"
    );
    assert_eq!(
        good.requests.load(Ordering::SeqCst),
        1,
        "only the GET reached the second backend"
    );
    let r = request(
        s.addr,
        "POST",
        "/",
        &[("Idempotency-Key", "k1")],
        b"pay once",
    )
    .await;
    assert_eq!(
        (r.status, r.text().as_str()),
        (200, "POST pay once"),
        "with Idempotency-Key, replayed whole from the buffer"
    );
    assert_eq!(bad.requests.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn without_retry_on_a_503_passes_unchanged() {
    let (bad, good) = (failing().await, echo().await);
    let s = Sluice::start(&pool(&bad, &good, ""));
    assert_eq!(get(s.addr, "/").await.status, 503);
    assert_eq!(good.requests.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_body_over_the_replay_buffer_is_not_retried() {
    let (bad, good) = (failing().await, echo().await);
    let s = Sluice::start(&pool(&bad, &good, "retry_on 503\n retry_buffer 1K"));
    let body = vec![b'x'; 100 * 1024];
    let r = request(s.addr, "PUT", "/", &[], &body).await;
    assert_eq!(
        r.status,
        503,
        "100 KiB did not fit a 1 KiB buffer: the first answer stands: {}\n{}",
        r.text(),
        s.logs()
    );
    let r = request(s.addr, "PUT", "/", &[], b"small").await;
    assert_eq!((r.status, r.text().as_str()), (200, "PUT small"));
}

#[tokio::test]
async fn reset_and_timeout_are_retried_when_asked() {
    let (hangup, _t) = answer_once(b"").await;
    let slow = Backend::start(|_req: Request<Incoming>| async move {
        tokio::time::sleep(Duration::from_secs(5)).await;
        Response::new(full("late"))
    })
    .await;
    let good = echo().await;
    let s = Sluice::start(&format!(
        "site * {{
            route /reset {{ proxy {hangup} {g} {{ lb first; retry_on reset }} }}
            route /plain {{ proxy {hangup} {g} {{ lb first }} }}
            route /timeout {{ proxy {slow} {g} {{ lb first; timeout 300ms; retry_on timeout }} }}
        }}",
        g = good.addr,
        slow = slow.addr
    ));
    let r = get(s.addr, "/reset").await;
    assert_eq!(
        (r.status, r.text().as_str()),
        (200, "GET "),
        "closed before any answer: retried"
    );
    assert_eq!(
        get(s.addr, "/plain").await.status,
        502,
        "not asked: never sent twice"
    );
    let r = get(s.addr, "/timeout").await;
    assert_eq!(
        (r.status, r.text().as_str()),
        (200, "GET "),
        "no head in time: retried"
    );
}

#[tokio::test]
async fn retries_stay_within_the_budget() {
    let (a, b) = (failing().await, failing().await);
    let s = Sluice::start(&format!(
        "site * {{ proxy {} {} {{ retry_on 503 }} }}",
        a.addr, b.addr
    ));
    for _ in 0..1000 {
        assert_eq!(get(s.addr, "/").await.status, 503);
    }
    let hits = a.requests.load(Ordering::SeqCst) + b.requests.load(Ordering::SeqCst);
    assert!(
        (1_050..=1_230).contains(&hits),
        "1,000 requests and at most 20% (or 3 a second) more as retries: {hits} backend hits"
    );
}
