//! Pools whose peers come from DNS (DESIGN §18.7), black-box: the loopback DNS server
//! serves SRV and A records that change while requests run.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::dns::DnsServer;
use common::*;

/// A backend answering `name` on `ip:port`.
async fn named(ip: &str, port: u16, name: &'static str) -> Option<Backend> {
    let l = tokio::net::TcpListener::bind((ip, port)).await.ok()?;
    let h: Handler = Arc::new(move |_| Box::pin(async move { hyper::Response::new(full(name)) }));
    Some(Backend::serve(l, h))
}

/// Three backends on one port of 127.0.0.1, .2 and .3 (a headless service's pods).
async fn pods() -> (u16, Vec<Backend>) {
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut all = Vec::new();
        for (ip, name) in [
            ("127.0.0.1", "one"),
            ("127.0.0.2", "two"),
            ("127.0.0.3", "three"),
        ] {
            match named(ip, port, name).await {
                Some(b) => all.push(b),
                None => break,
            }
        }
        if all.len() == 3 {
            return (port, all);
        }
    }
}

async fn status(s: &Sluice) -> serde_json::Value {
    serde_json::from_str(&get(s.admin(), "/status").await.text()).unwrap()
}

/// The first pool of `/status`.
async fn pool(s: &Sluice) -> serde_json::Value {
    let st = status(s).await;
    st["pools"][0].clone()
}

/// Answers to `n` requests, counted by body.
async fn spread(s: &Sluice, n: usize) -> HashMap<String, usize> {
    let mut seen = HashMap::new();
    for _ in 0..n {
        let r = get(s.addr, "/").await;
        assert_eq!(r.status, 200, "{}\n{}", r.text(), s.logs());
        *seen.entry(r.text()).or_default() += 1;
    }
    seen
}

/// Requests sent one after another until told to stop: (sent, failed).
fn load(
    addr: std::net::SocketAddr,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<(usize, Vec<String>)> {
    tokio::spawn(async move {
        let (mut sent, mut failed) = (0, Vec::new());
        while !stop.load(Ordering::Relaxed) {
            let r = get(addr, "/").await;
            sent += 1;
            if r.status != 200 {
                failed.push(format!("{} {}", r.status, r.text()));
            }
        }
        (sent, failed)
    })
}

/// `srv:`: the lowest priority's records share the traffic by weight, the next
/// priority is the backup role, a higher one is never used; `/status` names the
/// source and when it was read; a pool of dead primaries fails over to the next
/// priority.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn srv_records_are_peers_roles_and_weights() {
    let dns = DnsServer::start().await;
    let (a, b, c, d) = (
        Backend::text("a").await,
        Backend::text("b").await,
        Backend::text("c").await,
        Backend::text("d").await,
    );
    for n in ["a.svc.test", "b.svc.test", "c.svc.test", "d.svc.test"] {
        dns.set(n, &["127.0.0.1"], 60);
    }
    let srv = |p: u16, w: u16, port: u16, t: &'static str| (p, w, port, t);
    dns.set_srv(
        "_http._tcp.api.test",
        &[
            srv(10, 3, a.addr.port(), "a.svc.test"),
            srv(10, 1, b.addr.port(), "b.svc.test"),
            srv(20, 1, c.addr.port(), "c.svc.test"),
            srv(30, 1, d.addr.port(), "d.svc.test"),
        ],
        60,
    );
    let s = Sluice::start(&format!(
        "global {{ admin 127.0.0.1:0; resolver {} }}\nsite * {{ proxy srv:_http._tcp.api.test }}",
        dns.addr
    ));
    // Weights 3 and 1: within 10 % of 300 and 100 (a recompile restarts the smooth
    // round robin's turn, so the split need not be exact).
    let seen = spread(&s, 400).await;
    let (a_n, b_n) = (
        seen.get("a").copied().unwrap_or(0),
        seen.get("b").copied().unwrap_or(0),
    );
    assert!(
        (270..=330).contains(&a_n) && (70..=130).contains(&b_n),
        "{seen:?}"
    );
    assert_eq!(a_n + b_n, 400, "{seen:?}");
    let p = pool(&s).await;
    assert_eq!(p["source"], "srv:_http._tcp.api.test", "{p}");
    assert!(
        p["discovered_at"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{p}"
    );
    assert_eq!(p["policy"], "weighted_round_robin", "{p}");
    let peers: Vec<(String, bool)> = p["peers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            (
                x["address"].as_str().unwrap().to_string(),
                x["backup"] == true,
            )
        })
        .collect();
    let addr = |t: &str, port: u16| format!("{t}.svc.test:{port}");
    assert_eq!(
        peers,
        [
            (addr("a", a.addr.port()), false),
            (addr("b", b.addr.port()), false),
            (addr("c", c.addr.port()), true),
        ],
        "priority 30 is ignored"
    );
    let m = get(s.admin(), "/metrics").await.text();
    assert!(
        m.contains("sluice_discovery_peers{source=\"srv:_http._tcp.api.test\"} 3"),
        "{m}"
    );
    assert!(
        m.contains("sluice_discovery_changes_total{source=\"srv:_http._tcp.api.test\"} 1"),
        "{m}"
    );

    // Primaries that cannot be reached: the next priority serves.
    let (dead1, dead2) = (dead_addr().await, dead_addr().await);
    dns.set_srv(
        "_http._tcp.dead.test",
        &[
            srv(1, 1, dead1.port(), "a.svc.test"),
            srv(1, 1, dead2.port(), "b.svc.test"),
            srv(2, 1, c.addr.port(), "c.svc.test"),
        ],
        60,
    );
    let s = Sluice::start(&format!(
        "global {{ resolver {} }}\nsite * {{ proxy srv:_http._tcp.dead.test }}",
        dns.addr
    ));
    let end = Instant::now() + WAIT;
    while get(s.addr, "/").await.text() != "c" {
        assert!(Instant::now() < end, "never failed over: {}", s.logs());
    }
    for _ in 0..20 {
        assert_eq!(get(s.addr, "/").await.text(), "c");
    }

    // A name with no records: no peer yet, 503, said once.
    let s = Sluice::start(&format!(
        "global {{ resolver {} }}\nsite * {{ proxy srv:_http._tcp.nothing.test }}",
        dns.addr
    ));
    let r = get(s.addr, "/").await;
    assert_eq!(
        (r.status, r.text().as_str()),
        (503, "No backend available\n")
    );
    s.wait_log("srv:_http._tcp.nothing.test: cannot resolve _http._tcp.nothing.test: no such name (NXDOMAIN); keeping the last 0 discovered peers");
    drop(d);
}

/// `NAME:PORT { discover }`: each address is a peer; addresses added and removed
/// under load fail no request; a peer that stays keeps its identity (its counters go
/// on); an answer that fails keeps the last good set, logged once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovered_peers_come_and_go_under_load() {
    let dns = DnsServer::start().await;
    let (port, pods) = pods().await;
    dns.set("api.test", &["127.0.0.1", "127.0.0.2"], 1);
    let s = Sluice::start(&format!(
        "global {{ admin 127.0.0.1:0; resolver {} }}\nsite * {{ proxy api.test:{port} {{ discover }} }}",
        dns.addr
    ));
    let seen = spread(&s, 40).await;
    assert_eq!(seen.len(), 2, "{seen:?}");
    let two = format!("127.0.0.2:{port}");
    let peer = |p: &serde_json::Value, addr: &str| {
        p["peers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["address"] == addr)
            .cloned()
    };
    let before = peer(&pool(&s).await, &two).expect("127.0.0.2 is a peer");

    let stop = Arc::new(AtomicBool::new(false));
    let running = load(s.addr, stop.clone());
    dns.set("api.test", &["127.0.0.1", "127.0.0.2", "127.0.0.3"], 1);
    let served = |i: usize| pods[i].requests.load(Ordering::SeqCst);
    let end = Instant::now() + WAIT;
    while served(2) == 0 {
        assert!(Instant::now() < end, "127.0.0.3 never joined: {}", s.logs());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    dns.set("api.test", &["127.0.0.2", "127.0.0.3"], 1);
    let end = Instant::now() + WAIT;
    loop {
        let p = pool(&s).await;
        if peer(&p, &format!("127.0.0.1:{port}")).is_none() {
            break;
        }
        assert!(Instant::now() < end, "127.0.0.1 never left: {p}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let one_after = served(0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(served(0), one_after, "a peer that left gets no new request");

    // DNS fails: the last good set stays.
    dns.set("api.test", &[], 1);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    stop.store(true, Ordering::Relaxed);
    let (sent, failed) = running.await.unwrap();
    assert!(sent > 50, "{sent}");
    assert!(
        failed.is_empty(),
        "{} of {sent} failed: {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
    s.wait_count("keeping the last 2 discovered peers", 1);
    let after = peer(&pool(&s).await, &two).expect("127.0.0.2 stays");
    assert_eq!(after["ordinal"], before["ordinal"], "{after}");
    assert!(
        after["selections"].as_u64() > before["selections"].as_u64(),
        "its counters go on: {before} → {after}"
    );
    let m = get(s.admin(), "/metrics").await.text();
    let src = format!("source=\"api.test:{port}\"");
    assert!(
        m.contains(&format!(
            "sluice_discovery_refreshes_total{{{src},result=\"failed\"}}"
        )),
        "{m}"
    );
}

/// Destination safety judges every discovered address: a strict pool never dials
/// the loopback addresses a name resolves to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovered_addresses_meet_destination_safety() {
    let dns = DnsServer::start().await;
    let b = Backend::text("reached").await;
    dns.set("inner.test", &["127.0.0.1"], 60);
    dns.set_srv(
        "_http._tcp.inner.test",
        &[(1, 1, b.addr.port(), "inner.test")],
        60,
    );
    for proxy in [
        format!(
            "proxy inner.test:{} {{ discover; safety strict }}",
            b.addr.port()
        ),
        "proxy srv:_http._tcp.inner.test { safety strict }".to_string(),
    ] {
        let s = Sluice::start(&format!(
            "global {{ resolver {} }}\nsite * {{ {proxy} }}",
            dns.addr
        ));
        let r = get(s.addr, "/").await;
        assert_eq!(r.status, 502, "{proxy}: {}", r.text());
        assert_eq!(b.requests.load(Ordering::SeqCst), 0, "{proxy}");
        s.wait_log("loopback");
    }
    let _ = AtomicUsize::new(0);
}
