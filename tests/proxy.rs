//! The proxy handler over real sockets: balancing, retries, passive health, timeouts,
//! limits, body caps, the headers the backend and the client see, and addresses.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::*;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Request, Response};
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;

fn pool(addrs: &[String], opts: &str) -> String {
    format!(
        "site * {{\n  proxy {} {{\n{opts}\n  }}\n}}\n",
        addrs.join(" ")
    )
}

#[tokio::test]
async fn round_robin_alternates_between_backends() {
    let (a, b) = (Backend::text("a").await, Backend::text("b").await);
    let s = Sluice::start(&pool(&[a.addr.to_string(), b.addr.to_string()], ""));
    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.push(get(s.addr, "/").await.text());
    }
    assert_eq!(seen, ["a", "b", "a", "b"]);
}

#[tokio::test]
async fn first_sends_everything_to_the_first_reachable() {
    let dead = dead_addr().await;
    let b = Backend::text("standby").await;
    let primary = Backend::text("primary").await;
    let s = Sluice::start(&pool(
        &[primary.addr.to_string(), b.addr.to_string()],
        "lb first",
    ));
    for _ in 0..3 {
        assert_eq!(get(s.addr, "/").await.text(), "primary");
    }
    let s2 = Sluice::start(&pool(&[dead.to_string(), b.addr.to_string()], "lb first"));
    assert_eq!(
        get(s2.addr, "/").await.text(),
        "standby",
        "the primary is down, the standby answers"
    );
}

#[tokio::test]
async fn an_unreachable_backend_is_retried_on_another_with_the_body_intact() {
    let dead = dead_addr().await;
    let b = Backend::start(|req: Request<Incoming>| async move {
        let body = req.into_body().collect().await.unwrap().to_bytes();
        Response::new(full(body))
    })
    .await;
    let s = Sluice::start(&pool(&[dead.to_string(), b.addr.to_string()], "lb first"));
    let r = request(s.addr, "POST", "/", &[], b"a post body").await;
    assert_eq!(
        (r.status, r.text().as_str()),
        (200, "a post body"),
        "a POST that never reached a backend is safe to send elsewhere"
    );
    let line = s.wait_log(&format!("{dead} failed ("));
    let (time, rest) = line.split_once(' ').expect("a timestamp first");
    assert!(
        time.len() == 24 && time.ends_with('Z') && time.as_bytes()[10] == b'T',
        "an RFC 3339 UTC timestamp with milliseconds: {line}"
    );
    assert_eq!(
        rest,
        format!("WARN sluice: *: {dead} failed (Connection refused (os error 111)), out of rotation for 30s pool=* peer={dead} reason=connect"),
        "the level, then the pool, the peer, the reason and what sluice did, then the fields to search by"
    );
}

#[tokio::test]
async fn retries_zero_means_502_when_the_backend_is_unreachable() {
    let dead = dead_addr().await;
    let b = Backend::text("b").await;
    let s = Sluice::start(&pool(
        &[dead.to_string(), b.addr.to_string()],
        "lb first\nretries 0",
    ));
    let r = get(s.addr, "/").await;
    assert_eq!(r.status, 502);
    assert_eq!(b.requests.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_backend_5xx_passes_through_unchanged_and_is_never_retried() {
    let bad = Backend::start(|_| async {
        let mut r = Response::new(full("backend says no"));
        *r.status_mut() = hyper::StatusCode::INTERNAL_SERVER_ERROR;
        r.headers_mut().insert("x-from", "app".parse().unwrap());
        r
    })
    .await;
    let good = Backend::text("ok").await;
    let s = Sluice::start(&pool(
        &[bad.addr.to_string(), good.addr.to_string()],
        "lb first",
    ));
    let r = get(s.addr, "/").await;
    assert_eq!(
        (r.status, r.text().as_str(), r.header("x-from")),
        (500, "backend says no", Some("app"))
    );
    assert_eq!(
        good.requests.load(Ordering::SeqCst),
        0,
        "a request that reached a backend is never sent again"
    );
    assert_eq!(
        get(s.addr, "/").await.status,
        500,
        "a 5xx does not take the backend out of rotation"
    );
}

#[tokio::test]
async fn a_failed_backend_stays_out_of_rotation_for_fail_duration() {
    let dead = dead_addr().await;
    let b = Backend::text("alive").await;
    let s = Sluice::start(&pool(
        &[dead.to_string(), b.addr.to_string()],
        "fail_duration 1s",
    ));
    for _ in 0..6 {
        assert_eq!(get(s.addr, "/").await.text(), "alive");
    }
    s.wait_log("out of rotation for 1s");
    let failures = s.logs().matches(&format!("{dead} failed")).count();
    assert_eq!(
        failures,
        1,
        "while out of rotation the dead peer is not tried:\n{}",
        s.logs()
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;
    for _ in 0..2 {
        assert_eq!(get(s.addr, "/").await.text(), "alive");
    }
    // After fail_duration it is tried again (the log is read off stderr by a thread:
    // wait for the line rather than count at once).
    s.wait_count(&format!("{dead} failed"), 2);
}

#[tokio::test]
async fn breaker_counts_consecutive_failures_before_taking_a_peer_out() {
    let dead = dead_addr().await;
    let b = Backend::text("alive").await;
    let s = Sluice::start(&pool(
        &[dead.to_string(), b.addr.to_string()],
        "lb first\nbreaker 3",
    ));
    for _ in 0..3 {
        assert_eq!(get(s.addr, "/").await.text(), "alive");
    }
    s.wait_log("out of rotation");
    assert_eq!(
        s.logs().matches(&format!("{dead} failed")).count(),
        3,
        "{}",
        s.logs()
    );
    assert_eq!(
        s.logs().matches("out of rotation").count(),
        1,
        "only the third failure takes it out"
    );
}

#[tokio::test]
async fn all_down_try_still_tries_and_all_down_fail_answers_503() {
    let dead = dead_addr().await;
    let s = Sluice::start(&pool(&[dead.to_string()], ""));
    assert_eq!(get(s.addr, "/").await.status, 502);
    assert_eq!(
        get(s.addr, "/").await.status,
        502,
        "all_down try: an out-of-rotation peer is still tried"
    );
    s.wait_count("failed (", 2);
    let s = Sluice::start(&pool(&[dead.to_string()], "all_down fail"));
    assert_eq!(get(s.addr, "/").await.status, 502);
    let r = get(s.addr, "/").await;
    assert_eq!(r.status, 503, "all_down fail: nothing eligible answers 503");
}

#[tokio::test]
async fn a_connection_broken_mid_request_is_502_and_a_passive_failure() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let task = tokio::spawn(async move {
        loop {
            let (mut c, _) = l.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let _ = c.read(&mut buf).await;
            drop(c);
        }
    });
    let good = Backend::text("ok").await;
    let s = Sluice::start(&pool(
        &[addr.to_string(), good.addr.to_string()],
        "lb first",
    ));
    let r = get(s.addr, "/").await;
    assert_eq!(
        r.status, 502,
        "the request reached the backend, so it is not retried"
    );
    assert_eq!(good.requests.load(Ordering::SeqCst), 0);
    s.wait_log(&format!("{addr} failed ("));
    assert_eq!(
        get(s.addr, "/").await.text(),
        "ok",
        "the broken backend is out of rotation"
    );
    task.abort();
}

#[tokio::test]
async fn a_slow_backend_gets_504_and_stays_in_rotation() {
    let b = Backend::start(|req: Request<Incoming>| async move {
        if req.uri().path() == "/slow" {
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        Response::new(full("done"))
    })
    .await;
    let s = Sluice::start(&pool(&[b.addr.to_string()], "timeout 300ms\nall_down fail"));
    let start = Instant::now();
    let r = get(s.addr, "/slow").await;
    assert_eq!(r.status, 504);
    assert!(
        start.elapsed() < Duration::from_millis(1500),
        "timeout cuts at 300ms, took {:?}",
        start.elapsed()
    );
    assert_eq!(
        get(s.addr, "/fast").await.text(),
        "done",
        "a timeout is not a failure: the peer is still eligible"
    );
}

/// The response-head timer is kept with a backend connection from request to request
/// (its deadline moved later each time): it must still cut a slow answer on a reused
/// connection, also after it ran out while the connection idled.
#[tokio::test]
async fn the_timeout_holds_on_a_reused_backend_connection() {
    let b = Backend::start(|req: Request<Incoming>| async move {
        if req.uri().path() == "/slow" {
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        Response::new(full("done"))
    })
    .await;
    let s = Sluice::start(&pool(&[b.addr.to_string()], "timeout 400ms"));
    for _ in 0..3 {
        assert_eq!(get(s.addr, "/fast").await.text(), "done");
    }
    // Idle past the deadline the last request set: the kept timer fires for nothing.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(get(s.addr, "/fast").await.text(), "done");
    // Each round's slow request goes over the connection the fast one before it used
    // (a 504 closes that connection, so the next round starts on a new one).
    for round in 0..2 {
        let opened = b.connections.load(Ordering::SeqCst);
        let start = Instant::now();
        let r = get(s.addr, "/slow").await;
        assert_eq!(r.status, 504, "round {round}");
        assert!(
            start.elapsed() < Duration::from_millis(2000),
            "round {round}: the timeout cuts at 400ms, took {:?}",
            start.elapsed()
        );
        assert_eq!(
            b.connections.load(Ordering::SeqCst),
            opened,
            "round {round}: the slow request went over the kept connection"
        );
        assert_eq!(get(s.addr, "/fast").await.text(), "done", "round {round}");
    }
}

#[tokio::test]
async fn the_body_has_no_time_limit_once_the_head_arrived() {
    let b = Backend::start(|_| async {
        let (tx, body) = channel_body();
        tokio::spawn(async move {
            for i in 0..3 {
                let _ = tx.send(format!("part{i};").into()).await;
                tokio::time::sleep(Duration::from_millis(400)).await;
            }
        });
        Response::new(body)
    })
    .await;
    let s = Sluice::start(&pool(&[b.addr.to_string()], "timeout 300ms"));
    let r = get(s.addr, "/").await;
    assert_eq!((r.status, r.text().as_str()), (200, "part0;part1;part2;"));
}

#[tokio::test]
async fn connect_timeout_counts_as_unreachable_and_moves_on() {
    // A listener whose accept queue is full: further connects hang in SYN-SENT.
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let full = sock.listen(0).unwrap();
    let addr = full.local_addr().unwrap();
    let mut held = Vec::new();
    for _ in 0..4 {
        if let Ok(Ok(c)) = tokio::time::timeout(
            Duration::from_millis(200),
            tokio::net::TcpStream::connect(addr),
        )
        .await
        {
            held.push(c);
        }
    }
    let probe = tokio::time::timeout(
        Duration::from_millis(300),
        tokio::net::TcpStream::connect(addr),
    )
    .await;
    if probe.is_ok() {
        eprintln!("skipping: this kernel completes connects to a full accept queue");
        return;
    }
    let good = Backend::text("ok").await;
    let s = Sluice::start(&pool(
        &[addr.to_string(), good.addr.to_string()],
        "lb first\nconnect_timeout 300ms",
    ));
    let start = Instant::now();
    let r = get(s.addr, "/").await;
    assert_eq!(r.text(), "ok", "the request moved on to the next backend");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "connect_timeout bounds the dial: {:?}",
        start.elapsed()
    );
    s.wait_log(&format!("{addr} failed (connect timed out after 300ms)"));
    drop(full);
}

#[tokio::test]
async fn ipv6_literal_backends() {
    let Ok(l) = TcpListener::bind("[::1]:0").await else {
        eprintln!("skipping: no IPv6 loopback here");
        return;
    };
    let handler: Handler = std::sync::Arc::new(|_| Box::pin(async { Response::new(full("v6")) }));
    let b = Backend::serve(l, handler);
    let s = Sluice::start(&pool(&[format!("[::1]:{}", b.addr.port())], ""));
    assert_eq!(get(s.addr, "/").await.text(), "v6");
}

/// Reads one response off `c` (bounded by `limit`); `None`: nothing complete in time.
async fn read_one(c: &mut tokio::net::TcpStream, limit: Duration) -> Option<Resp> {
    let mut buf = Vec::new();
    tokio::time::timeout(limit, async {
        loop {
            if let Some((r, _)) = parse_response(&buf) {
                return Some(r);
            }
            let mut chunk = [0u8; 4096];
            match c.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await
    .ok()
    .flatten()
}

/// Out of local descriptors when dialing (EMFILE): a 503 with `Retry-After: 1`, logged
/// as sluice's own shortage, and the backend is not marked failed — the next request,
/// once descriptors are free, reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_descriptors_when_dialing_is_a_503_and_not_the_backends_fault() {
    use tokio::io::AsyncWriteExt;
    // A backend that closes after each answer, so every request dials anew.
    let (b, _backend) =
        answer_once(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok").await;
    let s = Sluice::start_with_nofile(&format!("site * {{ proxy {b} }}"), 48);
    let req = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    // Idle keep-alive clients use up descriptors until a dial finds none left. A client
    // sluice cannot accept (no descriptor for it) gets one when an idle one leaves.
    let mut held = Vec::new();
    let mut refused = None;
    for _ in 0..200 {
        let mut c = tokio::net::TcpStream::connect(s.addr).await.unwrap();
        c.write_all(req).await.unwrap();
        let mut r = read_one(&mut c, Duration::from_millis(700)).await;
        if r.is_none() {
            held.remove(0);
            r = read_one(&mut c, Duration::from_secs(5)).await;
        }
        let r = r.expect("an answer once a descriptor is free");
        match r.status {
            200 => held.push(c),
            503 => {
                refused = Some(r);
                break;
            }
            other => panic!("unexpected status {other}"),
        }
    }
    let r = refused.expect("a dial ran out of descriptors within 200 clients");
    assert_eq!(r.header("retry-after"), Some("1"));
    s.wait_log("out of local capacity, backend state unchanged");
    drop(held);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        get(s.addr, "/").await.status,
        200,
        "the backend was not marked failed"
    );
}

/// The soft limit on open descriptors is raised to the hard one at start (logged):
/// services often start at 1024, which a modest burst of proxied connections exhausts.
#[tokio::test]
async fn the_open_file_limit_is_raised_to_the_hard_limit() {
    let s = Sluice::start_with_ulimit("site * { respond ok }", "-S -n 256");
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", s.pid())).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap()
        .to_string();
    let nums: Vec<&str> = line.split_whitespace().skip(3).take(2).collect();
    assert_eq!(nums[0], nums[1], "soft == hard: {line}");
    if nums[1] != "256" {
        s.wait_log("open file limit raised from 256 to");
    }
}
