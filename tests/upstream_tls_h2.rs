//! HTTP/2 and TLS to backends: `h2c://` and `https://` (ALPN h2 or http/1.1),
//! multiplexed (many requests on one connection, a second connection past the
//! backend's stream limit, GOAWAY drained without failing a request), certificate
//! verification (custom CA, untrusted → 502 naming the peer, `tls_verify off`,
//! `tls_server_name`), and health probes in the pool's scheme.

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::pki::{Ca, Leaf};
use common::*;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

/// A test backend: HTTP/2 (and HTTP/1.1 over TLS when ALPN picks it), counting its
/// connections.
struct Upstream {
    addr: SocketAddr,
    conns: Arc<AtomicUsize>,
    /// Connections open now.
    live: Arc<AtomicUsize>,
    _task: tokio::task::JoinHandle<()>,
}

#[derive(Clone, Default)]
struct Opts {
    /// SETTINGS_MAX_CONCURRENT_STREAMS.
    max_streams: Option<u32>,
    /// Each connection sends GOAWAY after this many requests.
    goaway_after: Option<usize>,
    /// TLS with this certificate; ALPN as given.
    tls: Option<(Leaf, Vec<Vec<u8>>)>,
    /// How long each GET takes to answer.
    delay: Duration,
}

async fn handle(
    req: Request<Incoming>,
    delay: Duration,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let proto = format!("{:?}", req.version());
    if req.uri().path() == "/big-head" {
        let mut r = Response::new(Full::new(Bytes::from_static(b"big")));
        r.headers_mut()
            .insert("x-big", "b".repeat(70 << 10).parse().unwrap());
        return Ok(r);
    }
    if req.method() == hyper::Method::POST {
        let body = req.into_body().collect().await.unwrap().to_bytes();
        return Ok(Response::new(Full::new(body)));
    }
    tokio::time::sleep(delay).await;
    let text = format!(
        "{proto} {} host={} xfp={} xff={} sluice={}",
        req.uri().path(),
        req.uri()
            .authority()
            .map(|a| a.to_string())
            .or_else(|| req
                .headers()
                .get("host")
                .map(|h| h.to_str().unwrap().to_string()))
            .unwrap_or_default(),
        req.headers()
            .get("x-forwarded-proto")
            .map(|v| v.to_str().unwrap())
            .unwrap_or("-"),
        req.headers()
            .get_all("x-forwarded-for")
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect::<Vec<_>>()
            .join("|"),
        req.headers()
            .keys()
            .any(|k| k.as_str().starts_with("x-sluice")),
    );
    Ok(Response::new(Full::new(Bytes::from(text))))
}

impl Upstream {
    async fn start(o: Opts) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let conns = Arc::new(AtomicUsize::new(0));
        let acceptor = o.tls.as_ref().map(|(leaf, alpn)| {
            let certs = vec![rustls::pki_types::CertificateDer::from(leaf.der.clone())];
            let key =
                rustls::pki_types::pem::PemObject::from_pem_slice(leaf.key_pem.as_bytes()).unwrap();
            let mut c = rustls::ServerConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
            c.alpn_protocols = alpn.clone();
            tokio_rustls::TlsAcceptor::from(Arc::new(c))
        });
        let counted = conns.clone();
        let live = Arc::new(AtomicUsize::new(0));
        let open = live.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                counted.fetch_add(1, Ordering::SeqCst);
                let o = o.clone();
                let acceptor = acceptor.clone();
                let open = open.clone();
                open.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let _closed = Closed(open);
                    match acceptor {
                        Some(a) => {
                            let Ok(tls) = a.accept(tcp).await else { return };
                            if tls.get_ref().1.alpn_protocol() == Some(b"h2") {
                                serve_h2(TokioIo::new(tls), o).await;
                            } else {
                                let delay = o.delay;
                                let _ = hyper::server::conn::http1::Builder::new()
                                    .serve_connection(
                                        TokioIo::new(tls),
                                        service_fn(move |r| handle(r, delay)),
                                    )
                                    .await;
                            }
                        }
                        None => serve_h2(TokioIo::new(tcp), o).await,
                    }
                });
            }
        });
        Upstream {
            addr,
            conns,
            live,
            _task: task,
        }
    }
}

/// Counts a connection closed when its task ends.
struct Closed(Arc<AtomicUsize>);

impl Drop for Closed {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn serve_h2<I>(io: I, o: Opts)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let served = Arc::new(AtomicUsize::new(0));
    let enough = Arc::new(tokio::sync::Notify::new());
    let (s, e, delay, limit) = (served.clone(), enough.clone(), o.delay, o.goaway_after);
    let svc = service_fn(move |r| {
        let n = s.fetch_add(1, Ordering::SeqCst) + 1;
        if limit.is_some_and(|l| n >= l) {
            e.notify_one();
        }
        handle(r, delay)
    });
    let mut b = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    if let Some(m) = o.max_streams {
        b.max_concurrent_streams(m);
    }
    let conn = b.serve_connection(io, svc);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        _ = enough.notified() => conn.as_mut().graceful_shutdown(),
    }
    let _ = conn.await;
}

/// `n` requests at once, each on its own client connection; every response's text.
async fn many(addr: SocketAddr, n: usize, path: &str) -> Vec<Resp> {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let path = format!("{path}{i}");
            tokio::spawn(async move { get(addr, &path).await })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(
            tokio::time::timeout(WAIT * 2, t)
                .await
                .expect("in time")
                .unwrap(),
        );
    }
    out
}

/// An HTTP/2 backend's response head is bounded as an HTTP/1.1 one's, 64 KiB (DESIGN
/// §18.4): past it, `502`.
#[tokio::test]
async fn an_h2_backend_head_over_64_kib_is_refused() {
    let up = Upstream::start(Opts::default()).await;
    let sluice = Sluice::start(&format!("site * {{ proxy h2c://{} }}", up.addr));
    let r = get(sluice.addr, "/big-head").await;
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(
        get(sluice.addr, "/small").await.status,
        200,
        "the pool still serves"
    );
}

#[tokio::test]
async fn h2c_backend_carries_100_concurrent_requests_on_one_connection() {
    let up = Upstream::start(Opts {
        delay: Duration::from_millis(300),
        ..Default::default()
    })
    .await;
    let sluice = Sluice::start(&format!(
        "global {{ admin 127.0.0.1:0 }}\nsite * {{ proxy h2c://{} }}",
        up.addr
    ));
    let resps = many(sluice.addr, 100, "/r").await;
    for r in &resps {
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(r.text().starts_with("HTTP/2.0 /r"), "{}", r.text());
    }
    assert_eq!(
        up.conns.load(Ordering::SeqCst),
        1,
        "one multiplexed connection"
    );
    // A 1 MiB upload and its echo, through flow control both ways.
    let body: Vec<u8> = (0..1024 * 1024).map(|i| (i * 7 % 251) as u8).collect();
    let r = request(sluice.addr, "POST", "/echo", &[], &body).await;
    assert_eq!(r.status, 200);
    assert!(r.body == body, "the echoed body differs");
    assert_eq!(up.conns.load(Ordering::SeqCst), 1);
    // The operator sees the one connection.
    let metrics = get(sluice.admin(), "/metrics").await.text();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("sluice_peer_h2_connections{") && l.ends_with(" 1")),
        "{metrics}"
    );
    let status = get(sluice.admin(), "/status").await.text();
    assert!(status.contains("\"h2_connections\":1"), "{status}");
}

#[tokio::test]
async fn past_the_backends_stream_limit_a_second_connection_opens() {
    let up = Upstream::start(Opts {
        max_streams: Some(10),
        delay: Duration::from_millis(500),
        ..Default::default()
    })
    .await;
    let sluice = Sluice::start(&format!("site * {{ proxy h2c://{} }}", up.addr));
    // Warm: the first connection learns the limit.
    assert_eq!(get(sluice.addr, "/warm").await.status, 200);
    let resps = many(sluice.addr, 30, "/o").await;
    assert!(resps.iter().all(|r| r.status == 200));
    let conns = up.conns.load(Ordering::SeqCst);
    assert!(
        (3..=5).contains(&conns),
        "30 requests at once under a limit of 10 took {conns} connections"
    );
}

/// The response-head timeout over an HTTP/2 stream (its timer lives with the send, not
/// with a connection): each slow answer is cut, the session stays in use.
#[tokio::test]
async fn a_slow_h2_answer_gets_504_on_a_kept_session() {
    let up = Upstream::start(Opts {
        delay: Duration::from_secs(3),
        ..Default::default()
    })
    .await;
    let sluice = Sluice::start(&format!(
        "site * {{ proxy h2c://{} {{ timeout 300ms }} }}",
        up.addr
    ));
    for round in 0..2 {
        let start = std::time::Instant::now();
        assert_eq!(get(sluice.addr, "/slow").await.status, 504, "round {round}");
        assert!(
            start.elapsed() < Duration::from_millis(2000),
            "round {round}: cut at 300ms, took {:?}",
            start.elapsed()
        );
    }
    assert_eq!(up.conns.load(Ordering::SeqCst), 1, "one session for both");
}

#[tokio::test]
async fn goaway_drains_a_connection_without_failing_requests() {
    let up = Upstream::start(Opts {
        goaway_after: Some(5),
        delay: Duration::from_millis(50),
        ..Default::default()
    })
    .await;
    let sluice = Sluice::start(&format!("site * {{ proxy h2c://{} }}", up.addr));
    for round in 0..8 {
        let resps = many(sluice.addr, 8, &format!("/g{round}-")).await;
        for r in &resps {
            assert_eq!(r.status, 200, "round {round}: {}", r.text());
        }
    }
    assert!(up.conns.load(Ordering::SeqCst) >= 5);
    assert!(!sluice.logs().contains("502"), "{}", sluice.logs());
}

fn tls_opts(leaf: Leaf, alpn: &[&[u8]]) -> Opts {
    Opts {
        tls: Some((leaf, alpn.iter().map(|p| p.to_vec()).collect())),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_backends_verify_against_a_custom_ca_and_follow_alpn() {
    let ca = Ca::new();
    let dir = TempDir::new();
    let ca_file = dir.write("ca.pem", &ca.pem());
    let h2 = Upstream::start(tls_opts(ca.leaf(&["127.0.0.1"]), &[b"h2", b"http/1.1"])).await;
    let h1 = Upstream::start(tls_opts(ca.leaf(&["127.0.0.1"]), &[b"http/1.1"])).await;
    let named = Upstream::start(tls_opts(ca.leaf(&["backend.test"]), &[b"h2"])).await;
    let sluice = Sluice::start(&format!(
        "global {{ admin 127.0.0.1:0 }}
         site * {{
           route /h2/* {{ proxy https://{h2} {{ tls_ca {ca} }} }}
           route /h1/* {{ proxy https://{h1} {{ tls_ca {ca} }} }}
           route /untrusted/* {{ proxy https://{h2} }}
           route /noverify/* {{ proxy https://{h2} {{ tls_verify off }} }}
           route /named/* {{ proxy https://{named} {{ tls_ca {ca}; tls_server_name backend.test }} }}
           route /misnamed/* {{ proxy https://{named} {{ tls_ca {ca} }} }}
         }}",
        h2 = h2.addr,
        h1 = h1.addr,
        named = named.addr,
        ca = ca_file.display()
    ));
    let resps = many(sluice.addr, 50, "/h2/").await;
    for r in &resps {
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(r.text().starts_with("HTTP/2.0 /h2/"), "{}", r.text());
        assert!(r.text().contains("xfp=http"), "{}", r.text());
    }
    assert_eq!(
        h2.conns.load(Ordering::SeqCst),
        1,
        "one TLS connection, multiplexed"
    );
    // The map's work is done for a peer that chose HTTP/2: a client's forwarding
    // and sluice's own fields do not pass.
    let spoofed = [
        ("X-Forwarded-For", "6.6.6.6"),
        ("X-Sluice-Peer", "x"),
        ("TE", "trailers"),
    ];
    for path in ["/h2/spoofed", "/h1/spoofed"] {
        let r = request(sluice.addr, "GET", path, &spoofed, b"").await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(
            r.text().ends_with("xff=127.0.0.1 sluice=false"),
            "{}",
            r.text()
        );
    }
    let r = get(sluice.addr, "/h1/a").await;
    assert_eq!(r.status, 200);
    assert!(r.text().starts_with("HTTP/1.1 /h1/a"), "{}", r.text());
    let r = get(sluice.addr, "/h1/b").await;
    assert!(r.text().starts_with("HTTP/1.1 /h1/b"), "{}", r.text());
    assert_eq!(
        h1.conns.load(Ordering::SeqCst),
        1,
        "the TLS h1 connection was reused"
    );
    let body: Vec<u8> = (0..300_000).map(|i| (i % 253) as u8).collect();
    let r = request(sluice.addr, "POST", "/h1/up", &[], &body).await;
    assert!(r.body == body);

    let r = get(sluice.addr, "/untrusted/x").await;
    assert_eq!(r.status, 502);
    let line = sluice.wait_log("TLS handshake failed");
    assert!(line.contains(&h2.addr.to_string()), "{line}");
    assert!(line.to_lowercase().contains("certificate"), "{line}");

    assert_eq!(get(sluice.addr, "/noverify/x").await.status, 200);
    let r = get(sluice.addr, "/named/x").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(get(sluice.addr, "/misnamed/x").await.status, 502);
    // Origin tests report the TLS the pool would use: verified, not verified, failed.
    let admin = sluice.admin();
    for (pool, tls, failure) in [
        ("* /h1/*", "verified", None),
        ("* /h2/*", "verified", None),
        ("* /noverify/*", "unverified", None),
        ("* /untrusted/*", "none", Some("tls")),
    ] {
        let t = origin_test(admin, pool, "primary").await;
        assert_eq!(t["tls_result"], tls, "{pool}: {t}");
        assert_eq!(t["failure"].as_str(), failure, "{pool}: {t}");
        if failure.is_none() {
            assert_eq!(t["status"], 200, "{pool}: {t}");
        }
    }
}

// Multi-threaded: the backend must run while the test blocks reading sluice's log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_probes_speak_the_pools_scheme() {
    // An HTTP/2-only backend fails any HTTP/1.1 probe.
    let up = Upstream::start(Opts::default()).await;
    let sluice = Sluice::start(&format!(
        "site * {{ proxy h2c://{} {{ all_down fail; health /health {{ interval 1s; timeout 500ms; fall 1; initial unhealthy; rise 1 }} }} }}",
        up.addr
    ));
    sluice.wait_log("passes its health check");
    assert_eq!(get(sluice.addr, "/after").await.status, 200);
}

#[tokio::test]
async fn requests_waiting_for_a_connection_that_never_settles_fail_together() {
    // Accepts TCP (the kernel's backlog) but never speaks HTTP/2: every handshake runs
    // into connect_timeout.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap();
    let sluice = Sluice::start(&format!(
        "site * {{ proxy h2c://{addr} {{ connect_timeout 1s; retries 0 }} }}"
    ));
    let started = std::time::Instant::now();
    let resps = many(sluice.addr, 12, "/w").await;
    let took = started.elapsed();
    assert!(resps.iter().all(|r| r.status == 502), "all 502");
    // One handshake's wait, not one each in turn.
    assert!(took < Duration::from_secs(4), "took {took:?}");
    drop(silent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_backend_answering_before_the_upload_ends_is_heard_at_once() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ca = Ca::new();
    let leaf = ca.leaf(&["127.0.0.1"]);
    let dir = TempDir::new();
    let ca_file = dir.write("ca.pem", &ca.pem());
    // An HTTP/1.1-over-TLS backend that reads the head, answers 413 and stops reading,
    // keeping the connection open.
    let certs = vec![rustls::pki_types::CertificateDer::from(leaf.der.clone())];
    let key = rustls::pki_types::pem::PemObject::from_pem_slice(leaf.key_pem.as_bytes()).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if tls.read(&mut byte).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let _ = tls
                    .write_all(
                        b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 9\r\n\r\ntoo large",
                    )
                    .await;
                let _ = tls.flush().await;
                tokio::time::sleep(Duration::from_secs(30)).await;
            });
        }
    });
    let sluice = Sluice::start(&format!(
        "site * {{ proxy https://{backend} {{ tls_ca {} }} }}",
        ca_file.display()
    ));
    let s = tokio::net::TcpStream::connect(sluice.addr).await.unwrap();
    let (mut rd, mut wr) = s.into_split();
    const SIZE: usize = 32 * 1024 * 1024;
    tokio::spawn(async move {
        let head = format!("POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: {SIZE}\r\n\r\n");
        let _ = wr.write_all(head.as_bytes()).await;
        let chunk = vec![b'x'; 64 * 1024];
        for _ in 0..SIZE / chunk.len() {
            if wr.write_all(&chunk).await.is_err() {
                return;
            }
        }
    });
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let answer = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let n = rd.read(&mut buf).await.unwrap_or(0);
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
            if parse_response(&got).is_some() {
                break;
            }
        }
    })
    .await;
    assert!(
        answer.is_ok(),
        "no answer within 5 s: {:?}",
        String::from_utf8_lossy(&got)
    );
    let (resp, _) = parse_response(&got).expect("a whole response");
    assert_eq!(resp.status, 413, "{}", resp.text());
    assert_eq!(resp.text(), "too large");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_http2_connections_and_probe_connections_are_closed() {
    let up = Upstream::start(Opts::default()).await;
    let sluice = Sluice::start(&format!(
        "site * {{ proxy h2c://{} {{ keepalive 8 1s; health /health {{ interval 1s; timeout 500ms }} }} }}",
        up.addr
    ));
    assert_eq!(get(sluice.addr, "/one").await.status, 200);
    // Three probes and the idle timeout later, nothing is left open but maybe a probe
    // under way.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let opened = up.conns.load(Ordering::SeqCst);
    let live = up.live.load(Ordering::SeqCst);
    assert!(opened >= 3, "probes opened {opened} connections");
    assert!(
        live <= 1,
        "{live} of {opened} backend connections still open"
    );
}

/// `TE: trailers` in any spelling, from an HTTP/1.1 client, to HTTP/2 backends: the
/// backend gets exactly `trailers` and answers; no peer leaves rotation over it (the
/// h2 library refuses any other spelling, which once counted as the peer's failure and
/// took every backend out).
#[tokio::test]
async fn te_in_any_spelling_never_takes_an_h2_backend_out() {
    let a = Upstream::start(Opts::default()).await;
    let b = Upstream::start(Opts::default()).await;
    let s = Sluice::start(&format!(
        "site * {{ proxy h2c://{} h2c://{} {{ all_down fail }} }}",
        a.addr, b.addr
    ));
    for te in [
        "Trailers",
        "TRAILERS",
        "trailers, gzip",
        "gzip;q=0.5, Trailers",
        "gzip",
    ] {
        for n in 0..4 {
            let r = request(s.addr, "GET", "/te", &[("TE", te)], b"").await;
            assert_eq!(r.status, 200, "TE: {te}, request {n}: {}", r.text());
            assert!(r.text().starts_with("HTTP/2.0 /te"), "{}", r.text());
        }
    }
    let logs = s.logs();
    assert!(
        !logs.contains("out of rotation") && !logs.contains(" failed ("),
        "no peer was blamed: {logs}"
    );
}
