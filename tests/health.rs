//! Active health checks over real sockets (DESIGN.md §8.4): probes from start, rise
//! and fall counted probe by probe against a backend whose health the test flips, the
//! exact log lines, the probe's shape, `expect`, `initial`, and `health connect`.

mod common;

use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};

/// A backend answering `name` on every path but /healthz, which answers `status`;
/// counts probes and keeps the last probe's method, Host and User-Agent.
struct Flippable {
    backend: Backend,
    status: Arc<AtomicU16>,
    probes: Arc<AtomicUsize>,
    last: Arc<Mutex<String>>,
}

async fn flippable(name: &'static str, status: u16) -> Flippable {
    let st = Arc::new(AtomicU16::new(status));
    let probes = Arc::new(AtomicUsize::new(0));
    let last = Arc::new(Mutex::new(String::new()));
    let (s, p, l) = (st.clone(), probes.clone(), last.clone());
    let backend = Backend::start(move |req: Request<Incoming>| {
        let (s, p, l) = (s.clone(), p.clone(), l.clone());
        async move {
            if req.uri().path() != "/healthz" {
                return Response::new(full(name));
            }
            let h = |k: &str| {
                req.headers()
                    .get(k)
                    .map(|v| v.to_str().unwrap().to_string())
                    .unwrap_or_default()
            };
            *l.lock().unwrap() = format!("{} {} {}", req.method(), h("host"), h("user-agent"));
            p.fetch_add(1, Ordering::SeqCst);
            let mut r = Response::new(full("health"));
            *r.status_mut() = StatusCode::from_u16(s.load(Ordering::SeqCst)).unwrap();
            r
        }
    })
    .await;
    Flippable {
        backend,
        status: st,
        probes,
        last,
    }
}

/// Waits (bounded) until `f` holds.
async fn until(what: &str, f: impl Fn() -> bool) {
    let end = Instant::now() + Duration::from_secs(15);
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn answers(s: &Sluice, n: usize) -> String {
    let mut out = String::new();
    for _ in 0..n {
        out.push_str(&get(s.addr, "/").await.text());
    }
    out
}

#[tokio::test]
async fn rise_and_fall_are_counted_probe_by_probe() {
    let a = flippable("a", 200).await;
    let b = Backend::text("b").await;
    let s = Sluice::start(&format!(
        "site * {{ proxy {} {} {{ health /healthz {{ interval 1s; timeout 500ms; rise 2; fall 2 }} }} }}",
        a.backend.addr, b.addr
    ));
    until("a first probe", || a.probes.load(Ordering::SeqCst) >= 1).await;
    assert_eq!(
        *a.last.lock().unwrap(),
        format!("GET {} sluice-health-check", a.backend.addr),
        "GET, Host = the backend's address, the fixed User-Agent"
    );
    // Right after a probe, so the next two are the ones that fail.
    let k = a.probes.load(Ordering::SeqCst);
    until("the next probe", || a.probes.load(Ordering::SeqCst) > k).await;
    a.status.store(503, Ordering::SeqCst);
    let k = a.probes.load(Ordering::SeqCst);
    let down = format!("{} failed its health check", a.backend.addr);
    until("the fall", || s.logs().contains(&down)).await;
    assert_eq!(
        a.probes.load(Ordering::SeqCst),
        k + 2,
        "fall 2: the second failed probe"
    );
    let line = s.wait_log(&down);
    assert!(
        line.ends_with(&format!(
            " WARN sluice: *: {down} (status 503); out of rotation until it passes pool=* peer={} reason=health",
            a.backend.addr
        )),
        "the exact wording, then the fields an operator searches by: {line}"
    );
    assert_eq!(
        answers(&s, 4).await,
        "bbbb",
        "an unhealthy peer takes no requests"
    );

    a.status.store(200, Ordering::SeqCst);
    let k = a.probes.load(Ordering::SeqCst);
    let up = format!("{} passes its health check again", a.backend.addr);
    until("the rise", || s.logs().contains(&up)).await;
    assert!(
        a.probes.load(Ordering::SeqCst) <= k + 2,
        "rise 2: back after two passing probes"
    );
    let line = s.wait_log(&up);
    assert!(
        line.ends_with(&format!(
            " INFO sluice: *: {up} pool=* peer={}",
            a.backend.addr
        )),
        "{line}"
    );
    let back = answers(&s, 4).await;
    assert_eq!(
        back.matches('a').count(),
        2,
        "a is back in rotation: {back}"
    );
}

#[tokio::test]
async fn expect_method_host_and_initial() {
    let moved = flippable("m", 302).await;
    let strict = flippable("s", 302).await;
    let s = Sluice::start(&format!(
        "site * {{
            route /lenient {{
                proxy {} {{
                    all_down fail
                    health /healthz {{
                        method HEAD
                        expect 300..399
                        host health.internal
                        initial unhealthy
                        interval 1s
                        timeout 500ms
                        rise 1
                    }}
                }}
            }}
            route /strict {{
                proxy {} {{ health /healthz {{ interval 1s; timeout 500ms; fall 1 }} }}
            }}
        }}",
        moved.backend.addr, strict.backend.addr
    ));
    let up = format!("{} passes its health check again", moved.backend.addr);
    until("the 3xx to pass", || s.logs().contains(&up)).await;
    assert_eq!(
        *moved.last.lock().unwrap(),
        "HEAD health.internal sluice-health-check"
    );
    assert_eq!(get(s.addr, "/lenient").await.text(), "m");
    let down = format!("{} failed its health check", strict.backend.addr);
    until("a 3xx to fail by default", || s.logs().contains(&down)).await;
}

#[tokio::test]
async fn connect_probes_and_an_initially_unhealthy_pool() {
    let b = Backend::text("up").await;
    let s = Sluice::start(&format!(
        "site * {{ proxy {} {{
            all_down fail
            health connect {{ initial unhealthy; interval 1s; timeout 500ms; rise 1 }}
        }} }}",
        b.addr
    ));
    let first = get(s.addr, "/").await;
    let up = format!("{} passes its health check again", b.addr);
    if first.status == 200 {
        // Served: only because the first probe had passed (its log line may still be on
        // its way to the test's reader).
        s.wait_log(&up);
    } else {
        assert_eq!(first.status, 503, "unhealthy until the first probe passes");
    }
    until("the connect probe to pass", || s.logs().contains(&up)).await;
    assert_eq!(get(s.addr, "/").await.text(), "up");
    let served = 1 + usize::from(first.status == 200);
    assert_eq!(
        b.requests.load(Ordering::SeqCst),
        served,
        "a connect probe sends no request"
    );

    let dead = dead_addr().await;
    let s2 = Sluice::start(&format!(
        "site * {{ proxy {dead} {{ health connect {{ interval 1s; timeout 500ms; fall 1 }} }} }}"
    ));
    s2.wait_log(&format!("{dead} failed its health check"));
}

#[tokio::test]
async fn probe_concurrency_caps_probes_across_the_process() {
    let now = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let probes = Arc::new(AtomicUsize::new(0));
    let mut backends = Vec::new();
    for _ in 0..3 {
        let (now, most, probes) = (now.clone(), most.clone(), probes.clone());
        backends.push(
            Backend::start(move |_req: Request<Incoming>| {
                let (now, most, probes) = (now.clone(), most.clone(), probes.clone());
                async move {
                    let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(n, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(150)).await;
                    now.fetch_sub(1, Ordering::SeqCst);
                    probes.fetch_add(1, Ordering::SeqCst);
                    Response::new(full("ok"))
                }
            })
            .await,
        );
    }
    let list: Vec<String> = backends.iter().map(|b| b.addr.to_string()).collect();
    let _s = Sluice::start(&format!(
        "global {{ probe_concurrency 1 }}
         site a {{ proxy {} {{ health /h {{ interval 1s; timeout 900ms }} }} }}
         site b {{ proxy {} {{ health /h {{ interval 1s; timeout 900ms }} }} }}",
        list[..2].join(" "),
        list[2]
    ));
    until("two rounds of probes", || {
        probes.load(Ordering::SeqCst) >= 6
    })
    .await;
    assert_eq!(
        most.load(Ordering::SeqCst),
        1,
        "probe_concurrency 1: one probe at a time across both pools"
    );
}

/// A probe this host cannot run (out of descriptors) is no verdict: the peer stays in
/// rotation, the shortage is logged as sluice's own and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_without_a_local_descriptor_changes_no_verdict() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let b = Backend::text("up").await;
    let s = Sluice::start_with_nofile(
        &format!(
            "site * {{ proxy {} {{ health /healthz {{ interval 1s; timeout 500ms; fall 1; rise 5 }}\n all_down fail }} }}",
            b.addr
        ),
        48,
    );
    assert_eq!(get(s.addr, "/").await.text(), "up");
    // Idle clients take every descriptor: one more is not even accepted.
    let mut held = Vec::new();
    for _ in 0..200 {
        let mut c = tokio::net::TcpStream::connect(s.addr).await.unwrap();
        c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 512];
        let answered = tokio::time::timeout(Duration::from_millis(700), c.read(&mut buf))
            .await
            .is_ok_and(|r| r.is_ok_and(|n| n > 0));
        held.push(c);
        if !answered {
            break;
        }
    }
    s.wait_log("cannot probe");
    // Two more rounds while out of descriptors.
    tokio::time::sleep(Duration::from_millis(2200)).await;
    drop(held);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !s.logs().contains("failed its health check"),
        "no verdict from a probe that never ran:\n{}",
        s.logs()
    );
    assert_eq!(get(s.addr, "/").await.text(), "up", "still in rotation");
}
