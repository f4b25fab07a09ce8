//! The PROXY protocol (DESIGN §16) both ways: read on `listen … proxy_protocol` from
//! `trust` addresses (v1 and v2, before TLS; `LOCAL` keeps the peer; anything else
//! closes the connection without an answer), and sent by `proxy` and `tcp` pools with
//! `proxy_protocol v1|v2`, one header per backend connection, never shared.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SIG: &[u8] = b"\r\n\r\n\0\r\nQUIT\n";

/// A v2 `PROXY` header for an IPv6 client.
fn v2_header(client: std::net::Ipv6Addr, port: u16) -> Vec<u8> {
    let mut h = SIG.to_vec();
    h.extend_from_slice(&[0x21, 0x21, 0, 36]);
    h.extend_from_slice(&client.octets());
    h.extend_from_slice(&std::net::Ipv6Addr::LOCALHOST.octets());
    h.extend_from_slice(&port.to_be_bytes());
    h.extend_from_slice(&80u16.to_be_bytes());
    h
}

/// Sends `first` then a GET on a fresh connection; the whole answer, or "" when the
/// connection was closed without one.
async fn ask(addr: SocketAddr, first: &[u8]) -> String {
    let mut c = TcpStream::connect(addr).await.unwrap();
    let mut msg = first.to_vec();
    msg.extend_from_slice(b"GET /who HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let _ = c.write_all(&msg).await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(WAIT, c.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).to_string()
}

#[tokio::test]
async fn headers_are_read_from_trusted_peers_only() {
    let b = Backend::echo_head().await;
    let s = Sluice::start(&format!(
        "global {{ trust 127.0.0.0/8 }}
         listen 127.0.0.1:0 proxy_protocol
         site * {{
             route /who {{ respond \"{{client_ip}}\" }}
             proxy {}
         }}",
        b.addr
    ));
    let v1 = ask(s.addr, b"PROXY TCP4 203.0.113.9 127.0.0.1 5000 80\r\n").await;
    assert!(v1.ends_with("\r\n\r\n203.0.113.9"), "{v1}");
    let v2 = ask(s.addr, &v2_header("2001:db8::9".parse().unwrap(), 5000)).await;
    assert!(v2.ends_with("\r\n\r\n2001:db8::9"), "{v2}");
    let mut local = SIG.to_vec();
    local.extend_from_slice(&[0x20, 0x00, 0, 0]);
    assert!(ask(s.addr, &local).await.ends_with("\r\n\r\n127.0.0.1"));
    // UNKNOWN: a client the balancer could not name is no one sluice trusts.
    let unknown = ask(s.addr, b"PROXY UNKNOWN\r\n").await;
    assert!(unknown.ends_with("\r\n\r\n0.0.0.0"), "{unknown}");
    // The backend hears of the client the header named.
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    c.write_all(b"PROXY TCP4 198.51.100.4 127.0.0.1 5000 80\r\nGET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(WAIT, c.read_to_end(&mut out)).await;
    let out = String::from_utf8_lossy(&out);
    assert!(out.contains("x-forwarded-for: 198.51.100.4\n"), "{out}");
    // No header, a broken one: closed without an answer.
    for bad in [
        &b""[..],
        b"PROXY TCP4 1.2.3.4 5.6.7.8 99999 80\r\n",
        b"PROXY TCP9 x\r\n",
    ] {
        assert_eq!(
            ask(s.addr, bad).await,
            "",
            "{:?}",
            String::from_utf8_lossy(bad)
        );
    }
    // A peer outside `trust`: closed, header or not.
    let untrusting = Sluice::start(
        "global { trust 10.0.0.0/8 }\nlisten 127.0.0.1:0 proxy_protocol\nsite * { respond \"{client_ip}\" }",
    );
    assert_eq!(
        ask(
            untrusting.addr,
            b"PROXY TCP4 203.0.113.9 127.0.0.1 5000 80\r\n"
        )
        .await,
        ""
    );
}

/// The header comes before TLS on a `tls proxy_protocol` listener.
#[tokio::test]
async fn the_header_precedes_tls() {
    use common::pki::{any_cert_client, Ca};
    let ca = Ca::new();
    let dir = TempDir::new();
    let leaf = ca.leaf(&["a.test"]);
    let c = dir.write("a.pem", &leaf.cert_pem);
    let k = dir.write("a.key", &leaf.key_pem);
    let path = dir.write(
        "sluice.conf",
        &without_admin(&format!(
            "global {{ trust 127.0.0.0/8 }}
             listen 127.0.0.1:0 tls proxy_protocol
             site a.test {{ tls {} {}; respond \"{{client_ip}} {{scheme}}\" }}",
            c.display(),
            k.display()
        )),
    );
    let s = Sluice::spawn(&["run", "-c", path.to_str().unwrap()], dir);
    let mut tcp = TcpStream::connect(s.addr).await.unwrap();
    tcp.write_all(&v2_header("2001:db8::5".parse().unwrap(), 4000))
        .await
        .unwrap();
    let name = rustls::pki_types::ServerName::try_from("a.test").unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(any_cert_client(&[b"http/1.1"]))
        .connect(name, tcp)
        .await
        .unwrap();
    tls.write_all(b"GET / HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(WAIT, tls.read_to_end(&mut out)).await;
    assert!(String::from_utf8_lossy(&out).ends_with("2001:db8::5 https"));
}

/// A backend that reads a PROXY header first and answers an HTTP request with it:
/// every connection's header is recorded.
async fn header_backend() -> (SocketAddr, Arc<Mutex<Vec<Vec<u8>>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let (addr, task) = raw_backend(move |mut c| {
        let log = log.clone();
        async move {
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            let mut served = 0;
            loop {
                let Ok(n) = c.read(&mut chunk).await else {
                    return;
                };
                if n == 0 {
                    return;
                }
                buf.extend_from_slice(&chunk[..n]);
                if served == 0 {
                    let Some(end) = buf.windows(4).position(|w| w == b"GET ") else {
                        continue;
                    };
                    log.lock().unwrap().push(buf[..end].to_vec());
                    buf.drain(..end);
                }
                while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    buf.drain(..end + 4);
                    served += 1;
                    let _ = c
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                        .await;
                }
            }
        }
    })
    .await;
    std::mem::forget(task);
    (addr, seen)
}

#[tokio::test]
async fn pools_send_one_header_per_backend_connection() {
    let (v1_backend, v1_seen) = header_backend().await;
    let (v2_backend, v2_seen) = header_backend().await;
    let s = Sluice::start(&format!(
        "site * {{
            route /one/* {{ proxy {v1_backend} {{ proxy_protocol v1 }} }}
            route /two/* {{ proxy {v2_backend} {{ proxy_protocol v2 }} }}
        }}"
    ));
    // Two requests on one client connection, then one on another: three backend
    // connections, each with its header (a kept connection is never shared).
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    let client = c.local_addr().unwrap();
    for path in ["/one/a", "/one/b"] {
        c.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut got = [0u8; 512];
        let n = tokio::time::timeout(WAIT, c.read(&mut got))
            .await
            .unwrap()
            .unwrap();
        assert!(String::from_utf8_lossy(&got[..n]).ends_with("ok"));
    }
    assert_eq!(get(s.addr, "/one/c").await.text(), "ok");
    let v1 = v1_seen.lock().unwrap().clone();
    assert_eq!(v1.len(), 3, "{v1:?}");
    let want = format!(
        "PROXY TCP4 127.0.0.1 {} {} {}\r\n",
        s.addr.ip(),
        client.port(),
        s.addr.port()
    );
    assert_eq!(String::from_utf8_lossy(&v1[0]), want);
    assert_eq!(String::from_utf8_lossy(&v1[1]), want);
    assert_eq!(get(s.addr, "/two/x").await.text(), "ok");
    let v2 = v2_seen.lock().unwrap().clone();
    assert_eq!(v2.len(), 1);
    assert_eq!(&v2[0][..12], SIG);
    assert_eq!(&v2[0][12..16], &[0x21, 0x11, 0, 12]);
    assert_eq!(&v2[0][16..20], &[127, 0, 0, 1]);
    assert_eq!(&v2[0][26..28], &s.addr.port().to_be_bytes());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_pools_send_the_header_first() {
    let (backend, _task) = raw_backend(|mut c| async move {
        let mut buf = vec![0u8; 256];
        let mut got = Vec::new();
        while !got.ends_with(b"ping") {
            let Ok(n) = c.read(&mut buf).await else {
                return;
            };
            if n == 0 {
                return;
            }
            got.extend_from_slice(&buf[..n]);
        }
        let _ = c.write_all(&got).await;
    })
    .await;
    let s = Sluice::start(&format!(
        "tcp 127.0.0.1:0 {{ proxy {backend} {{ proxy_protocol v1 }} }}\nsite * {{ respond ok }}"
    ));
    let line = s.wait_log("relaying tcp on ");
    let addr: SocketAddr = line.rsplit_once(' ').unwrap().1.parse().unwrap();
    let mut c = TcpStream::connect(addr).await.unwrap();
    let me = c.local_addr().unwrap();
    c.write_all(b"ping").await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), c.read_to_end(&mut out)).await;
    assert_eq!(
        String::from_utf8_lossy(&out),
        format!(
            "PROXY TCP4 127.0.0.1 127.0.0.1 {} {}\r\nping",
            me.port(),
            addr.port()
        )
    );
}

#[test]
fn proxy_protocol_settings_are_checked_at_load() {
    let dir = TempDir::new();
    for (text, want) in [
        (
            "listen 127.0.0.1:0 proxy_protocol proxy_protocol\nsite * { respond x }",
            "listen ADDR [tls [quic]] [proxy_protocol]",
        ),
        (
            "listen 127.0.0.1:0 haproxy\nsite * { respond x }",
            "`tls`, `quic`, `proxy_protocol` or nothing",
        ),
        (
            "site * {\n proxy 127.0.0.1:9 { proxy_protocol v3 }\n}",
            "`v1` or `v2`",
        ),
        (
            "site * {\n proxy https://127.0.0.1:9 { proxy_protocol v1 }\n}",
            "http:// and unix: backends only",
        ),
        (
            "site * {\n proxy h2c://127.0.0.1:9 { proxy_protocol v2 }\n}",
            "http:// and unix: backends only",
        ),
    ] {
        assert_check_fails(&dir, text, want);
    }
}
