//! Live DNS and destination safety over real sockets (DESIGN.md §9, §8.1, §8.5): a DNS
//! server the test runs on loopback, whose answers change while sluice runs; backends on
//! several loopback addresses (127.0.0.0/8 is all loopback on Linux), each answering
//! with `Connection: close` so every request is a fresh dial.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::dns::DnsServer;
use common::*;
use hyper::{Response, StatusCode};
use tokio::net::TcpListener;

/// A backend on `ip` (port 0 for any) answering `name` and closing each connection.
async fn backend_on(ip: &str, port: u16, name: &'static str) -> Backend {
    let listener = TcpListener::bind((ip, port)).await.unwrap();
    Backend::serve(
        listener,
        Arc::new(move |_| {
            Box::pin(async move {
                let mut r = Response::new(full(name));
                r.headers_mut()
                    .insert("connection", "close".parse().unwrap());
                r
            })
        }),
    )
}

/// Backends named `a` on 127.0.0.1 and `b` on 127.0.0.2, on one port.
async fn pair() -> (Backend, Backend) {
    for _ in 0..50 {
        let a = backend_on("127.0.0.1", 0, "a").await;
        if let Ok(l) = TcpListener::bind(("127.0.0.2", a.addr.port())).await {
            drop(l);
            let b = backend_on("127.0.0.2", a.addr.port(), "b").await;
            return (a, b);
        }
    }
    panic!("no port free on both 127.0.0.1 and 127.0.0.2");
}

async fn until(what: &str, limit: Duration, mut f: impl AsyncFnMut() -> bool) {
    let end = Instant::now() + limit;
    while !f().await {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn metrics(s: &Sluice) -> String {
    get(s.admin(), "/metrics").await.text()
}

fn metric(text: &str, line_start: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(line_start))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {line_start} in:\n{text}"))
}

fn config(dns: &DnsServer, safety: &str, proxy: &str) -> String {
    format!(
        "global {{ admin 127.0.0.1:0\n resolver {}\n {safety} }}\nsite * {{ proxy {proxy} }}\n",
        dns.addr
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_follows_its_answers_and_their_ttl() {
    let (a, b) = pair().await;
    let dns = DnsServer::start().await;
    dns.set("app.test", &["127.0.0.1"], 4);
    let s = Sluice::start(&config(&dns, "", &format!("app.test:{}", a.addr.port())));
    let answered = Instant::now();
    assert_eq!(get(s.addr, "/").await.text(), "a");
    let asked = dns.queries("app.test");
    assert!(
        asked >= 1,
        "the name was resolved through the configured server"
    );
    dns.set("app.test", &["127.0.0.2"], 4);
    // Within the TTL: the cached answer, and no new query (checked only while the TTL
    // surely lasts, so a slow machine cannot make this flaky).
    for _ in 0..5 {
        let text = get(s.addr, "/").await.text();
        if answered.elapsed() < Duration::from_secs(3) {
            assert_eq!(text, "a");
            assert_eq!(
                dns.queries("app.test"),
                asked,
                "a cached answer is not asked again"
            );
        }
    }
    // Past it: the new answer.
    until("the new answer", Duration::from_secs(10), async || {
        get(s.addr, "/").await.text() == "b"
    })
    .await;
    assert!(dns.queries("app.test") > asked);
    assert!(b.connections.load(std::sync::atomic::Ordering::SeqCst) >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_refuses_an_unsafe_answer_on_the_next_attempt() {
    let (a, b) = pair().await;
    let dns = DnsServer::start().await;
    dns.set("app.test", &["127.0.0.1"], 1);
    let s = Sluice::start(&config(
        &dns,
        "safety { default strict; allow_private 127.0.0.1/32 }",
        &format!("app.test:{}", a.addr.port()),
    ));
    assert_eq!(get(s.addr, "/").await.text(), "a");
    // The name now points at an address the policy refuses (loopback, not allowed).
    dns.set("app.test", &["127.0.0.2"], 1);
    until("the refusal", Duration::from_secs(10), async || {
        get(s.addr, "/").await.status == StatusCode::BAD_GATEWAY
    })
    .await;
    assert_eq!(
        b.connections.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the refused backend is never dialed"
    );
    let line = s.wait_log("refused to connect to 127.0.0.2:");
    assert!(
        line.contains("a loopback address (safety strict)"),
        "{line}"
    );
    assert!(line.contains("app.test"), "the log names the peer: {line}");
    let m = metrics(&s).await;
    assert!(metric(&m, "sluice_safety_refusals_total{reason=\"loopback\"}") >= 1);

    // A mixed answer: one safe address does not save the set.
    let before = a.connections.load(std::sync::atomic::Ordering::SeqCst);
    dns.set("app.test", &["127.0.0.1", "10.1.2.3"], 1);
    until("the mixed answer", Duration::from_secs(10), async || {
        let _ = get(s.addr, "/").await;
        metric(
            &metrics(&s).await,
            "sluice_safety_refusals_total{reason=\"private\"}",
        ) >= 1
    })
    .await;
    for _ in 0..5 {
        assert_eq!(get(s.addr, "/").await.status, StatusCode::BAD_GATEWAY);
    }
    assert_eq!(
        a.connections.load(std::sync::atomic::Ordering::SeqCst),
        before,
        "no address of an unsafe set is dialed"
    );

    // Safe again: served again.
    dns.set("app.test", &["127.0.0.1"], 1);
    until("the safe answer", Duration::from_secs(10), async || {
        get(s.addr, "/").await.text() == "a"
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_down_and_an_up_address_still_serve() {
    let a = backend_on("127.0.0.1", 0, "a").await;
    let port = a.addr.port();
    // Nothing listens on 127.0.0.3 at that port: refused at once.
    let dns = DnsServer::start().await;
    dns.set("app.test", &["127.0.0.3", "127.0.0.1"], 60);
    let s = Sluice::start(&config(&dns, "", &format!("app.test:{port}")));
    for i in 0..20 {
        let r = get(s.addr, "/").await;
        assert_eq!(r.status, StatusCode::OK, "request {i}: {}", s.logs());
        assert_eq!(r.text(), "a");
    }
    assert_eq!(a.connections.load(std::sync::atomic::Ordering::SeqCst), 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resolver_failure_is_failure_evidence() {
    let backup = backend_on("127.0.0.1", 0, "backup").await;
    let dns = DnsServer::start().await;
    // `gone.test` is not in the table: NXDOMAIN.
    let s = Sluice::start(&format!(
        "global {{ admin 127.0.0.1:0\n resolver {} }}\nsite * {{ proxy gone.test:80 {{ backup {}; failover {{ failure_threshold 2 }}; retries 0; fail_duration 0s }} }}\n",
        dns.addr, backup.addr
    ));
    let first = get(s.addr, "/").await;
    assert_eq!(first.status, StatusCode::BAD_GATEWAY);
    let line = s.wait_log("cannot resolve gone.test");
    assert!(line.contains("gone.test:80"), "{line}");
    until(
        "failover to the backup",
        Duration::from_secs(10),
        async || get(s.addr, "/").await.text() == "backup",
    )
    .await;
    // Failover's own evidence, not passive health, made the switch.
    s.wait_log("switched to backup (primary_failure_threshold");
    let m = metrics(&s).await;
    assert!(
        metric(
            &m,
            "sluice_peer_failures_total{pool=\"*\",peer=\"gone.test:80\",ordinal=\"0\",kind=\"dns\"}"
        ) >= 1,
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_are_capped_and_truncated_ones_retried_over_tcp() {
    let a = backend_on("127.0.0.1", 0, "a").await;
    let port = a.addr.port();
    let dns = DnsServer::start().await;
    // 40 addresses do not fit 512 bytes of UDP: asked again over TCP. Only one answers.
    let forty: Vec<String> = (0..40).map(|i| format!("127.0.1.{}", i + 1)).collect();
    let mut with_a: Vec<&str> = forty.iter().map(String::as_str).collect();
    with_a[17] = "127.0.0.1";
    dns.set("many.test", &with_a, 60);
    let sixty_five: Vec<String> = (0..65).map(|i| format!("127.0.2.{}", i + 1)).collect();
    dns.set(
        "toomany.test",
        &sixty_five.iter().map(String::as_str).collect::<Vec<_>>(),
        60,
    );
    let s = Sluice::start(&format!(
        "global {{ admin 127.0.0.1:0\n resolver {} }}\nsite * {{\n route /many {{ proxy many.test:{port} }}\n route /toomany {{ proxy toomany.test:{port} }}\n}}\n",
        dns.addr
    ));
    let r = get(s.addr, "/many").await;
    assert_eq!(r.status, StatusCode::OK, "{}", s.logs());
    assert!(
        dns.tcp_queries() >= 1,
        "the truncated answer was asked over TCP"
    );
    assert_eq!(
        get(s.addr, "/toomany").await.status,
        StatusCode::BAD_GATEWAY
    );
    let line = s.wait_log("more than 64");
    assert!(line.contains("65 records"), "{line}");
}

/// The answer sections count together, CNAME records included: one CNAME and 64
/// addresses is one record too many; one CNAME and 62 addresses is served (its CNAME
/// comes in the AAAA answer too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cname_records_count_toward_the_cap() {
    let a = backend_on("127.0.0.1", 0, "a").await;
    let port = a.addr.port();
    let dns = DnsServer::start().await;
    let addrs = |n: usize| -> Vec<String> {
        let mut v: Vec<String> = (0..n).map(|i| format!("127.0.2.{}", i + 1)).collect();
        v[0] = "127.0.0.1".into();
        v
    };
    let (over, under) = (addrs(64), addrs(62));
    dns.set(
        "over.test",
        &over.iter().map(String::as_str).collect::<Vec<_>>(),
        60,
    );
    dns.set(
        "under.test",
        &under.iter().map(String::as_str).collect::<Vec<_>>(),
        60,
    );
    dns.cnames("over.test", 1);
    dns.cnames("under.test", 1);
    let s = Sluice::start(&format!(
        "global {{ resolver {} }}\nsite * {{\n route /over {{ proxy over.test:{port} {{ lb first }} }}\n route /under {{ proxy under.test:{port} {{ lb first }} }}\n}}\n",
        dns.addr
    ));
    assert_eq!(get(s.addr, "/over").await.status, StatusCode::BAD_GATEWAY);
    s.wait_log("more than 64");
    let r = get(s.addr, "/under").await;
    assert_eq!(r.status, StatusCode::OK, "{}", s.logs());
}

/// A resolver error for one family fails the attempt even when the other family
/// answers: half an answer is not served (an empty answer for one family is fine).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_family_fails_the_attempt() {
    let a = backend_on("127.0.0.1", 0, "a").await;
    let port = a.addr.port();
    let dns = DnsServer::start().await;
    dns.set("half.test", &["127.0.0.1"], 60);
    dns.set("v4only.test", &["127.0.0.1"], 60);
    dns.fail("half.test", 28);
    let s = Sluice::start(&format!(
        "global {{ resolver {} }}\nsite * {{\n route /half {{ proxy half.test:{port} }}\n route /v4 {{ proxy v4only.test:{port} }}\n}}\n",
        dns.addr
    ));
    assert_eq!(
        get(s.addr, "/v4").await.text(),
        "a",
        "no AAAA records: fine"
    );
    assert_eq!(get(s.addr, "/half").await.status, StatusCode::BAD_GATEWAY);
    let line = s.wait_log("cannot resolve half.test: AAAA:");
    assert!(line.contains("failed"), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_obey_the_policy() {
    let (a, b) = pair().await;
    let dns = DnsServer::start().await;
    dns.set("app.test", &["127.0.0.2"], 60);
    let s = Sluice::start(&config(
        &dns,
        "safety { default strict; allow_private 127.0.0.1/32 }",
        &format!(
            "app.test:{} 127.0.0.1:{} {{ health connect {{ interval 1s; timeout 500ms; fall 1 }} }}",
            a.addr.port(),
            a.addr.port()
        ),
    ));
    let line = s.wait_log("failed its health check");
    assert!(line.contains("app.test"), "{line}");
    assert!(line.contains("refused to connect to 127.0.0.2"), "{line}");
    // Requests go to the healthy literal only; the refused backend is never touched.
    for _ in 0..6 {
        assert_eq!(get(s.addr, "/").await.text(), "a");
    }
    assert_eq!(b.connections.load(std::sync::atomic::Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strict_pool_without_a_policy_match_serves_public_answers_only() {
    // `safety strict` on the pool overrides the global default (off here); `safety off`
    // on another pool of the same config dials what the same name says.
    let (a, _b) = pair().await;
    let dns = DnsServer::start().await;
    dns.set("app.test", &["127.0.0.1"], 60);
    let s = Sluice::start(&format!(
        "global {{ admin 127.0.0.1:0\n resolver {} }}\nsite * {{\n route /strict {{ proxy app.test:{p} {{ safety strict }} }}\n route /open {{ proxy app.test:{p} }}\n}}\n",
        dns.addr,
        p = a.addr.port()
    ));
    assert_eq!(get(s.addr, "/strict").await.status, StatusCode::BAD_GATEWAY);
    assert_eq!(get(s.addr, "/open").await.text(), "a");
}

/// The listener check: a strict pool that allows loopback still never dials sluice
/// itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strict_pool_never_dials_sluice_itself() {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = probe.local_addr().unwrap().port();
    drop(probe);
    let dns = DnsServer::start().await;
    dns.set("loop.test", &["127.0.0.1"], 60);
    let s = Sluice::start(&format!(
        "listen 127.0.0.1:{port}\nglobal {{ admin 127.0.0.1:0\n resolver {}\n safety {{ default strict; allow_private 127.0.0.0/8 }} }}\nsite * {{ proxy loop.test:{port} }}\n",
        dns.addr
    ));
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    assert_eq!(get(addr, "/").await.status, StatusCode::BAD_GATEWAY);
    let line = s.wait_log("refused to connect to 127.0.0.1");
    assert!(line.contains("one of sluice's own listeners"), "{line}");
}

/// `sluice check --strict` asks the resolver about every backend name and warns about
/// those that resolve to nothing now; without `--strict` nothing is asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_strict_warns_about_names_that_do_not_resolve() {
    let dns = DnsServer::start().await;
    dns.set("here.test", &["192.0.2.10"], 60);
    dns.set_srv("_http._tcp.here.test", &[(1, 1, 80, "here.test")], 60);
    let dir = TempDir::new();
    let path = dir.write(
        "s.conf",
        &format!(
            "global {{ resolver {} }}\nsite * {{\n  route /a {{ proxy here.test:80 }}\n  route /b {{ proxy gone.test:80 }}\n  route /c {{ proxy srv:_http._tcp.here.test }}\n  route /d {{ proxy srv:_http._tcp.gone.test }}\n}}\n",
            dns.addr
        ),
    );
    let path = path.to_str().unwrap().to_string();
    let run = |args: &'static [&'static str]| {
        let path = path.clone();
        tokio::task::spawn_blocking(move || {
            std::process::Command::new(bin())
                .args(args)
                .arg(&path)
                .output()
                .unwrap()
        })
    };
    let plain = run(&["check", "-c"]).await.unwrap();
    assert!(plain.status.success());
    assert_eq!(dns.queries("gone.test"), 0, "plain check asks no resolver");
    let strict = run(&["check", "--strict", "-c"]).await.unwrap();
    let err = String::from_utf8_lossy(&strict.stderr);
    assert_eq!(strict.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "{path}:4:20: warning: `gone.test:80`: cannot resolve gone.test: no such name (NXDOMAIN)"
        )),
        "{err}"
    );
    // A srv: pool's name is asked for SRV records, not addresses.
    assert!(
        err.contains(&format!(
            "{path}:6:20: warning: `srv:_http._tcp.gone.test`: cannot resolve _http._tcp.gone.test: no such name (NXDOMAIN)"
        )),
        "{err}"
    );
    assert!(!err.contains("here.test"), "{err}");
}

/// A name with two up addresses: fresh connections go to both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_addresses_of_a_name_share_the_load() {
    let (a, b) = pair().await;
    let dns = DnsServer::start().await;
    dns.set("both.test", &["127.0.0.1", "127.0.0.2"], 60);
    let s = Sluice::start(&config(&dns, "", &format!("both.test:{}", a.addr.port())));
    for _ in 0..20 {
        assert_eq!(get(s.addr, "/").await.status, StatusCode::OK);
    }
    let (na, nb) = (
        a.connections.load(std::sync::atomic::Ordering::SeqCst),
        b.connections.load(std::sync::atomic::Ordering::SeqCst),
    );
    assert_eq!(na + nb, 20);
    assert!(na >= 5 && nb >= 5, "a {na}, b {nb}");
}

/// sluice never follows a redirect: a strict pool's backend pointing elsewhere hands the
/// client the redirect, and nothing is dialed there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirects_are_passed_on_never_followed() {
    let target = backend_on("127.0.0.2", 0, "internal").await;
    let location = format!("http://127.0.0.2:{}/secret", target.addr.port());
    let loc = location.clone();
    let origin = Backend::start(move |_| {
        let loc = loc.clone();
        async move {
            let mut r = Response::new(full(""));
            *r.status_mut() = StatusCode::FOUND;
            r.headers_mut().insert("location", loc.parse().unwrap());
            r
        }
    })
    .await;
    let s = Sluice::start(&format!(
        "global {{ safety {{ default strict; allow_private 127.0.0.1/32 }} }}\nsite * {{ proxy {} }}\n",
        origin.addr
    ));
    let r = get(s.addr, "/").await;
    assert_eq!(r.status, StatusCode::FOUND);
    assert_eq!(r.header("location"), Some(location.as_str()));
    assert_eq!(
        target.connections.load(std::sync::atomic::Ordering::SeqCst),
        0
    );
}

/// A reload that makes a pool strict does not leave it using connections made before:
/// kept-alive connections to a now-refused address are dropped, the next request is
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stricter_reload_drops_kept_connections() {
    // A keep-alive backend (no `Connection: close`).
    let a = Backend::text("a").await;
    let dns = DnsServer::start().await;
    dns.set("app.test", &["127.0.0.1"], 300);
    let dir = TempDir::new();
    let text = |safety: &str| {
        format!(
            "listen 127.0.0.1:0\nglobal {{ admin off\n resolver {}\n {safety} }}\nsite * {{ proxy app.test:{} }}\n",
            dns.addr,
            a.addr.port()
        )
    };
    let path = dir.write("sluice.conf", &text(""));
    let s = Sluice::spawn(&["run", "-c", path.to_str().unwrap()], dir);
    for _ in 0..3 {
        assert_eq!(get(s.addr, "/").await.text(), "a");
    }
    let kept = a.connections.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(kept, 1, "one kept-alive connection served them all");
    std::fs::write(&path, text("safety strict")).unwrap();
    s.signal("HUP");
    s.wait_log("reloaded");
    let r = get(s.addr, "/").await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{}", s.logs());
    s.wait_log("refused to connect to 127.0.0.1:");
}

/// A lookup has its own budget — 3 s, or the pool's `timeout` when smaller — not a
/// share of `connect_timeout`: a resolver that never answers fails the attempt after
/// the pool's 1 s `timeout` (a 502), though `connect_timeout` is 300 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_has_its_own_budget() {
    // A resolver that takes queries and never answers, over UDP and TCP alike.
    let (udp, tcp) = loop {
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = udp.local_addr().unwrap().port();
        if let Ok(tcp) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            break (udp, tcp);
        }
    };
    let silent = udp.local_addr().unwrap();
    let s = Sluice::start(&format!(
        "global {{ resolver {silent} }}\nsite * {{ proxy slow.test:80 {{ connect_timeout 300ms; timeout 1s }} }}\n"
    ));
    assert_eq!(get(s.addr, "/").await.status, StatusCode::BAD_GATEWAY);
    let line = s.wait_log("cannot resolve slow.test");
    assert!(line.contains("no answer within 1s"), "{line}");
    drop((udp, tcp));
}

/// A keep-alive backend on `ip:port` answering `name`, over HTTP/1.1 or h2c: how many
/// connections it accepted, and how many are open now.
struct Kept {
    accepted: Arc<std::sync::atomic::AtomicUsize>,
    open: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Kept {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Kept {
    fn count(n: &std::sync::atomic::AtomicUsize) -> usize {
        n.load(std::sync::atomic::Ordering::SeqCst)
    }
}

async fn kept_on(l: TcpListener, name: &'static str, h2: bool) -> Kept {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let accepted = Arc::new(AtomicUsize::new(0));
    let open = Arc::new(AtomicUsize::new(0));
    let (a, o) = (accepted.clone(), open.clone());
    let task = tokio::spawn(async move {
        while let Ok((tcp, _)) = l.accept().await {
            a.fetch_add(1, SeqCst);
            o.fetch_add(1, SeqCst);
            let o = o.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |_| async move {
                    Ok::<_, std::convert::Infallible>(Response::new(full(name)))
                });
                let io = hyper_util::rt::TokioIo::new(tcp);
                let _ = if h2 {
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(io, svc)
                        .await
                } else {
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, svc)
                        .await
                };
                o.fetch_sub(1, SeqCst);
            });
        }
    });
    Kept {
        accepted,
        open,
        task,
    }
}

/// An attempt that would reuse a kept connection (HTTP/1.1 idle, or an HTTP/2
/// session) to a named origin whose answer expired asks the name again first: the
/// connection goes on while its address is still in the answer, and is closed once it
/// is not, or once the answer is unsafe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_connections_follow_their_name_past_its_ttl() {
    for h2 in [false, true] {
        let (la, lb) = loop {
            let la = TcpListener::bind("127.0.0.1:0").await.unwrap();
            if let Ok(lb) = TcpListener::bind(("127.0.0.2", la.local_addr().unwrap().port())).await
            {
                break (la, lb);
            }
        };
        let port = la.local_addr().unwrap().port();
        let (a, b) = (kept_on(la, "a", h2).await, kept_on(lb, "b", h2).await);
        let dns = DnsServer::start().await;
        dns.set("app.test", &["127.0.0.1"], 1);
        let scheme = if h2 { "h2c" } else { "http" };
        let s = Sluice::start(&config(
            &dns,
            "safety { default strict; allow_private 127.0.0.1/32 127.0.0.2/32 }",
            &format!("{scheme}://app.test:{port}"),
        ));
        for _ in 0..3 {
            assert_eq!(get(s.addr, "/").await.text(), "a", "{scheme}");
        }
        assert_eq!(Kept::count(&a.accepted), 1, "{scheme}: one kept connection");
        // The answer expires and says the same: the connection goes on.
        let asked = dns.queries("app.test");
        tokio::time::sleep(Duration::from_millis(1300)).await;
        assert_eq!(get(s.addr, "/").await.text(), "a", "{scheme}");
        assert!(dns.queries("app.test") > asked, "{scheme}: asked again");
        assert_eq!(
            Kept::count(&a.accepted),
            1,
            "{scheme}: still the kept connection"
        );
        // The name moves: the very next request after the expiry goes to the new
        // address, and the kept connection to the old one is closed.
        dns.set("app.test", &["127.0.0.2"], 1);
        tokio::time::sleep(Duration::from_millis(1300)).await;
        assert_eq!(get(s.addr, "/").await.text(), "b", "{scheme}");
        until(
            "the old connection to close",
            Duration::from_secs(5),
            async || Kept::count(&a.open) == 0,
        )
        .await;
        // The answer turns unsafe: the kept connection to a safe address of it is
        // closed too, and nothing is sent.
        assert_eq!(get(s.addr, "/").await.text(), "b", "{scheme}");
        dns.set("app.test", &["127.0.0.2", "10.1.2.3"], 1);
        tokio::time::sleep(Duration::from_millis(1300)).await;
        assert_eq!(
            get(s.addr, "/").await.status,
            StatusCode::BAD_GATEWAY,
            "{scheme}"
        );
        until(
            "the unsafe answer's connection to close",
            Duration::from_secs(5),
            async || Kept::count(&b.open) == 0,
        )
        .await;
    }
}

/// An origin test resolves and judges like a request: a name that does not resolve is
/// `dns`, an unsafe answer `unsafe` (nothing dialed), a peer that never answers
/// `timeout` within the pool's `timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn origin_tests_resolve_and_judge_like_requests() {
    let (a, _b) = pair().await;
    let dns = DnsServer::start().await;
    dns.set("app.test", &["127.0.0.1"], 1);
    dns.set("unsafe.test", &["10.1.2.3"], 1);
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = a.addr.port();
    let s = Sluice::start(&format!(
        "global {{ admin 127.0.0.1:0\n resolver {}\n safety {{ default strict; allow_private 127.0.0.1/32 }} }}
        site * {{
            route /ok/* {{ proxy app.test:{port} }}
            route /gone/* {{ proxy nowhere.test:{port} }}
            route /unsafe/* {{ proxy unsafe.test:{port} }}
            route /silent/* {{ proxy {silent} {{ timeout 300ms }} }}
        }}",
        dns.addr,
        silent = silent.local_addr().unwrap()
    ));
    let admin = s.admin();
    let t = origin_test(admin, "* /ok/*", "primary").await;
    assert_eq!(
        (t["status"].as_u64(), t["address"].as_str()),
        (Some(200), Some(format!("127.0.0.1:{port}").as_str())),
        "{t}"
    );
    for (pool, failure) in [
        ("* /gone/*", "dns"),
        ("* /unsafe/*", "unsafe"),
        ("* /silent/*", "timeout"),
    ] {
        let t = origin_test(admin, pool, "primary").await;
        assert_eq!(t["failure"], failure, "{pool}: {t}");
        assert_eq!(t["status"], serde_json::Value::Null, "{pool}");
    }
    drop(silent);
}
