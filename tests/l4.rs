//! L4 `tcp` listeners over real sockets: bytes relayed both ways with half-close, a
//! server that speaks first, a dead peer skipped for the next, and the idle timeout.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A TCP backend: greets with `hello`, then echoes until EOF, then says `bye`.
async fn echo() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    raw_backend(move |mut c| async move {
        let _ = c.write_all(b"hello ").await;
        let mut buf = [0u8; 4096];
        loop {
            match c.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if c.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            }
        }
        let _ = c.write_all(b" bye").await;
    })
    .await
}

fn tcp_addr(s: &Sluice) -> SocketAddr {
    let line = s.wait_log("relaying tcp on ");
    line.rsplit_once(' ').unwrap().1.parse().unwrap()
}

async fn read_all(c: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let _ = tokio::time::timeout(WAIT, c.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_flow_both_ways_and_the_server_may_speak_first() {
    let (b, _t) = echo().await;
    let dead = dead_addr().await;
    let s = Sluice::start(&format!(
        "tcp 127.0.0.1:0 {{ proxy {dead} {b} {{ lb first; connect_timeout 1s }} }}\nsite * {{ respond ok }}"
    ));
    let addr = tcp_addr(&s);
    let (mut c, greet) = greeted(addr, 6).await;
    assert_eq!(
        greet, b"hello ",
        "the backend spoke first, before the client sent anything"
    );
    c.write_all(b"ping").await.unwrap();
    c.shutdown().await.unwrap();
    assert_eq!(
        read_all(&mut c).await,
        "ping bye",
        "echo, then the half-close passed on"
    );
    s.wait_log(&format!("{dead} failed ("));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_relay_closes() {
    let (b, _t) = echo().await;
    let s = Sluice::start(&format!(
        "tcp 127.0.0.1:0 {{ proxy {b} {{ idle_timeout 300ms }} }}\nsite * {{ respond ok }}"
    ));
    let mut c = TcpStream::connect(tcp_addr(&s)).await.unwrap();
    let start = Instant::now();
    let got = read_all(&mut c).await;
    assert_eq!(got, "hello ", "only the greeting, then nothing");
    assert!(
        start.elapsed() >= Duration::from_millis(250) && start.elapsed() < Duration::from_secs(3),
        "closed after idle_timeout: {:?}",
        start.elapsed()
    );
}

/// `max_conns`: a connection over the cap is closed at once, never relayed; the place
/// comes back when one ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_conns_closes_the_connection_over_the_cap() {
    let (b, _t) = echo().await;
    let s = Sluice::start(&format!(
        "tcp 127.0.0.1:0 {{\n max_conns 2\n proxy {b}\n }}\nsite * {{ respond ok }}"
    ));
    let addr = tcp_addr(&s);
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(greeted(addr, 6).await.0);
    }
    let mut third = TcpStream::connect(addr).await.unwrap();
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(WAIT, third.read(&mut buf))
        .await
        .expect("closed at once")
        .unwrap_or(0);
    assert_eq!(n, 0, "the third connection is closed without a greeting");
    s.wait_log("max_conns (2) relayed at once");
    drop(held.pop());
    // The freed place is counted once the relay of the closed one has ended.
    let start = Instant::now();
    loop {
        let mut c = TcpStream::connect(addr).await.unwrap();
        let mut greet = [0u8; 6];
        if let Ok(Ok(_)) =
            tokio::time::timeout(Duration::from_secs(1), c.read_exact(&mut greet)).await
        {
            assert_eq!(&greet, b"hello ");
            break;
        }
        assert!(start.elapsed() < WAIT, "a place came back after one closed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What a client's connection shows: the backend's greeting, or nothing (closed at
/// once).
async fn greeting(addr: SocketAddr) -> String {
    let mut c = TcpStream::connect(addr).await.unwrap();
    let mut buf = [0u8; 6];
    match tokio::time::timeout(WAIT, c.read(&mut buf)).await {
        Ok(Ok(n)) => String::from_utf8_lossy(&buf[..n]).to_string(),
        _ => "<error>".to_string(),
    }
}

/// `allow`, `deny` and `rate_limit` in a `tcp` block judge the client's address when
/// the connection is accepted: a refused one is closed at once, never relayed, and
/// counted like the HTTP filters' refusals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_listeners_take_allow_deny_and_rate_limit() {
    let (b, _t) = echo().await;
    let admin_of = |s: &Sluice| s.admin();
    let denied = Sluice::start(&format!(
        "global {{ admin 127.0.0.1:0 }}\ntcp 127.0.0.1:0 {{ deny 127.0.0.0/8\n proxy {b} }}\nsite * {{ respond ok }}"
    ));
    assert_eq!(greeting(tcp_addr(&denied)).await, "", "closed at once");
    let m = get(admin_of(&denied), "/metrics").await.text();
    assert!(m.contains("sluice_access_denied_total 1\n"), "{m}");

    let allowed = Sluice::start(&format!(
        "tcp 127.0.0.1:0 {{ allow 127.0.0.0/8\n deny 127.0.0.2\n proxy {b} }}\nsite * {{ respond ok }}"
    ));
    assert_eq!(greeting(tcp_addr(&allowed)).await, "hello ");
    let outside = Sluice::start(&format!(
        "tcp 127.0.0.1:0 {{ allow 10.0.0.0/8\n proxy {b} }}\nsite * {{ respond ok }}"
    ));
    assert_eq!(greeting(tcp_addr(&outside)).await, "");

    let limited = Sluice::start(&format!(
        "global {{ admin 127.0.0.1:0 }}\ntcp 127.0.0.1:0 {{ rate_limit 2/m burst 2\n proxy {b} }}\nsite * {{ respond ok }}"
    ));
    let addr = tcp_addr(&limited);
    assert_eq!(greeting(addr).await, "hello ");
    assert_eq!(greeting(addr).await, "hello ");
    assert_eq!(
        greeting(addr).await,
        "",
        "the third new connection in a minute"
    );
    let m = get(admin_of(&limited), "/metrics").await.text();
    assert!(m.contains("sluice_rate_limited_total 1\n"), "{m}");
}

/// A `tcp` rate has no key and no store: it counts connections per client address.
#[test]
fn a_tcp_rate_limit_takes_no_key() {
    let dir = TempDir::new();
    let conf = dir.write(
        "sluice.conf",
        "tcp :5432 { rate_limit 5/s key header X-A\n proxy 127.0.0.1:1 }\n",
    );
    let out = std::process::Command::new(bin())
        .args(["check", "-c", conf.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("per client address"),
        "{err}"
    );
}

/// A TLS backend with its own certificate for `name`: answers one request with its
/// name (the test sees the backend, and the certificate, it reached).
async fn tls_backend(ca: &common::pki::Ca, name: &'static str) -> (SocketAddr, Vec<u8>) {
    use rustls::pki_types::pem::PemObject;
    let leaf = ca.leaf(&[name]);
    let chain = vec![rustls::pki_types::CertificateDer::from(leaf.der.clone())];
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let (addr, _task) = raw_backend(move |c| {
        let acceptor = acceptor.clone();
        async move {
            let Ok(mut tls) = acceptor.accept(c).await else {
                return;
            };
            let mut buf = [0u8; 1024];
            let _ = tls.read(&mut buf).await;
            let body = format!("backend {name}");
            let _ = tls
                .write_all(
                    format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    )
                    .as_bytes(),
                )
                .await;
            let _ = tls.shutdown().await;
        }
    })
    .await;
    std::mem::forget(_task);
    (addr, leaf.der)
}

/// SNI passthrough (DESIGN §16): the ClientHello's server name picks the pool without
/// terminating TLS (exact names, then `*.suffix`, then the bare `proxy`); the client's
/// TLS reaches the backend whole (its certificate, its answer); bytes that are no
/// ClientHello, or a name no pool takes without a bare `proxy`, close the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sni_picks_the_pool_without_terminating_tls() {
    use common::pki::{any_cert_client, connect, presented, Ca};
    let ca = Ca::new();
    let (a, a_cert) = tls_backend(&ca, "a.test").await;
    let (b, b_cert) = tls_backend(&ca, "b.test").await;
    let (d, d_cert) = tls_backend(&ca, "default.test").await;
    let s = Sluice::start(&format!(
        "tcp 127.0.0.1:0 {{
            sni a.test {{ proxy {a} }}
            sni *.b.test b.test {{ proxy {b} }}
            proxy {d}
        }}
        site * {{ respond ok }}"
    ));
    let strict_sluice = Sluice::start(&format!(
        "tcp 127.0.0.1:0 {{ sni only.test {{ proxy {a} }} }}\nsite * {{ respond ok }}"
    ));
    let (with_default, strict) = (tcp_addr(&s), tcp_addr(&strict_sluice));
    let any = any_cert_client(&[b"http/1.1"]);
    for (sni, cert, name) in [
        (Some("a.test"), &a_cert, "a.test"),
        (Some("A.Test"), &a_cert, "a.test"),
        (Some("x.b.test"), &b_cert, "b.test"),
        (Some("b.test"), &b_cert, "b.test"),
        (Some("c.test"), &d_cert, "default.test"),
        (None, &d_cert, "default.test"),
    ] {
        let mut tls = connect(with_default, any.clone(), sni).await.unwrap();
        assert!(presented(&tls) == *cert, "{sni:?}");
        tls.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(WAIT, tls.read_to_end(&mut out)).await;
        assert!(
            String::from_utf8_lossy(&out).ends_with(&format!("backend {name}")),
            "{sni:?}"
        );
    }
    // No bare proxy: an unknown name is closed; so is plain text anywhere.
    assert!(connect(strict, any.clone(), Some("other.test"))
        .await
        .is_err());
    assert!(connect(strict, any.clone(), Some("only.test"))
        .await
        .is_ok());
    let mut c = TcpStream::connect(with_default).await.unwrap();
    c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(read_all(&mut c).await, "");
}

/// An HTTP listener judges its connections at accept as a `tcp` block does (DESIGN
/// §18.4): `allow`/`deny` and a connection `rate_limit` close a refused one at once,
/// before a byte is read, counted by listener and reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_listener_judges_connections_at_accept() {
    for (guard, refused, reason) in [
        ("deny 127.0.0.0/8", true, "access"),
        ("allow 10.0.0.0/8", true, "access"),
        ("allow 127.0.0.1/32", false, "access"),
        ("rate_limit 2/s burst 2", false, "rate"),
    ] {
        let s = Sluice::start(&format!(
            "global {{ admin 127.0.0.1:0 }}\nlisten 127.0.0.1:0 {{ {guard} }}\nsite * {{ respond ok }}\n"
        ));
        let out = raw(
            s.addr,
            b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert_eq!(
            out.is_empty(),
            refused,
            "{guard}: {:?}",
            String::from_utf8_lossy(&out)
        );
        let mut closed = u64::from(refused);
        if reason == "rate" {
            // Two a second, two at once: a burst of five leaves three closed.
            let mut answered = 1;
            for _ in 0..4 {
                let out = raw(
                    s.addr,
                    b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
                )
                .await;
                if out.is_empty() {
                    closed += 1;
                } else {
                    answered += 1;
                }
            }
            assert!(
                answered <= 3 && closed >= 2,
                "{guard}: {answered} answered, {closed} closed"
            );
        }
        let m = get(s.admin(), "/metrics").await.text();
        let line = format!(
            "sluice_connections_refused_total{{listener=\"127.0.0.1:0\",reason=\"{reason}\"}} {closed}\n"
        );
        assert!(m.contains(&line), "{guard}: {line} in\n{m}");
    }
}
