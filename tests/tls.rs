//! TLS listeners: the certificate chosen by SNI (exact, wildcard, the `*` site's for
//! no or unknown SNI, a failed handshake when there is none), ALPN h2 and http/1.1,
//! `X-Forwarded-Proto: https`, and certificates swapped on disk while connections
//! stay open.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::pki::{any_cert_client, connect, presented, Ca, Leaf};
use common::*;
use http_body_util::{BodyExt, Empty};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Writes a leaf's two files into `dir` as `NAME.pem` and `NAME.key`.
fn write_pair(dir: &TempDir, name: &str, leaf: &Leaf) -> (String, String) {
    let c = dir.write(&format!("{name}.pem"), &leaf.cert_pem);
    let k = dir.write(&format!("{name}.key"), &leaf.key_pem);
    (c.display().to_string(), k.display().to_string())
}

/// One request over an open TLS stream (keep-alive), returning the response.
async fn get_over<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    s: &mut S,
    host: &str,
    path: &str,
) -> Resp {
    let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some((resp, _)) = parse_response(&buf) {
            return resp;
        }
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout_at(deadline.into(), s.read(&mut chunk))
            .await
            .expect("response in time")
            .unwrap();
        assert!(
            n > 0,
            "closed before a whole response: {:?}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&chunk[..n]);
    }
}

#[tokio::test]
async fn sni_chooses_the_site_certificate_and_alpn_the_protocol() {
    let ca = Ca::new();
    let dir = TempDir::new();
    let a = ca.leaf(&["a.test"]);
    let b = ca.leaf(&["*.b.test"]);
    let d = ca.leaf(&["default.test"]);
    let (ac, ak) = write_pair(&dir, "a", &a);
    let (bc, bk) = write_pair(&dir, "b", &b);
    let (dc, dk) = write_pair(&dir, "d", &d);
    let backend = Backend::echo_head().await;
    let sluice = Sluice::start(&format!(
        "listen 127.0.0.1:0 tls
         site a.test {{ tls {ac} {ak}; proxy {be} }}
         site *.b.test {{ tls {bc} {bk}; proxy {be} }}
         site * {{ tls {dc} {dk}; respond \"default\" }}",
        be = backend.addr
    ));
    let any = any_cert_client(&[b"http/1.1"]);
    for (sni, want) in [
        (Some("a.test"), &a),
        (Some("A.TEST"), &a),
        (Some("x.b.test"), &b),
        (Some("unknown.test"), &d),
        (None, &d),
    ] {
        let s = connect(sluice.addr, any.clone(), sni).await.unwrap();
        assert!(
            presented(&s) == want.der,
            "SNI {sni:?} got the wrong certificate"
        );
    }
    // Verified against the CA, over http/1.1: the backend hears https.
    let mut s = connect(sluice.addr, ca.client(&[b"http/1.1"]), Some("a.test"))
        .await
        .unwrap();
    assert_eq!(s.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    assert_eq!(
        s.get_ref().1.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_3)
    );
    let r = get_over(&mut s, "a.test", "/x").await;
    assert_eq!(r.status, 200);
    assert!(
        r.text().contains("x-forwarded-proto: https"),
        "{}",
        r.text()
    );
    // Keep-alive: a second request on the same TLS connection.
    let r = get_over(&mut s, "a.test", "/y").await;
    assert!(r.text().starts_with("GET /y"), "{}", r.text());
    // ALPN h2: HTTP/2 over TLS.
    let s = connect(
        sluice.addr,
        ca.client(&[b"h2", b"http/1.1"]),
        Some("x.b.test"),
    )
    .await
    .unwrap();
    assert_eq!(s.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(s),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let req = hyper::Request::get("https://x.b.test/h2")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&body);
    assert!(text.starts_with("GET /h2"), "{text}");
    assert!(text.contains("x-forwarded-proto: https"), "{text}");
}

#[tokio::test]
async fn without_a_default_certificate_an_unknown_name_fails_the_handshake() {
    let ca = Ca::new();
    let dir = TempDir::new();
    let (ac, ak) = write_pair(&dir, "a", &ca.leaf(&["a.test"]));
    let sluice = Sluice::start(&format!(
        "listen 127.0.0.1:0 tls
         site a.test {{ tls {ac} {ak}; respond \"a\" }}
         site * {{ respond \"plain default\" }}"
    ));
    let any = any_cert_client(&[b"http/1.1"]);
    for _ in 0..20 {
        for sni in [Some("other.test"), None] {
            // The alert says what happened (RFC 6066), not access_denied.
            let e = connect(sluice.addr, any.clone(), sni).await.unwrap_err();
            assert!(e.to_string().contains("UnrecognisedName"), "{sni:?}: {e}");
        }
    }
    // Not TLS at all: refused too, and the listener goes on.
    let plain = raw(sluice.addr, b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n").await;
    assert!(parse_response(&plain).is_none());
    let mut s = connect(sluice.addr, ca.client(&[]), Some("a.test"))
        .await
        .unwrap();
    assert_eq!(get_over(&mut s, "a.test", "/").await.text(), "a");
    // The operator hears of it once, with the way out; 40 refusals are not 40 lines.
    let logs = sluice.logs();
    assert_eq!(
        logs.matches("refused with unrecognized_name").count(),
        1,
        "{logs}"
    );
    assert!(
        logs.contains("a `site *` with a certificate serves such clients"),
        "{logs}"
    );
}

#[tokio::test]
async fn a_certificate_changed_on_disk_is_served_to_new_connections_only() {
    let ca = Ca::new();
    let dir = TempDir::new();
    let first = ca.leaf(&["a.test"]);
    let (ac, ak) = write_pair(&dir, "a", &first);
    let sluice = Sluice::start(&format!(
        "listen 127.0.0.1:0 tls
         site a.test {{ tls {ac} {ak}; respond \"a\" }}"
    ));
    let any = any_cert_client(&[b"http/1.1"]);
    let mut old = connect(sluice.addr, any.clone(), Some("a.test"))
        .await
        .unwrap();
    assert!(presented(&old) == first.der);
    assert_eq!(get_over(&mut old, "a.test", "/").await.text(), "a");

    // A new pair, written over the old files.
    let second = ca.leaf(&["a.test"]);
    write_pair(&dir, "a", &second);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let s = connect(sluice.addr, any.clone(), Some("a.test"))
            .await
            .unwrap();
        if presented(&s) == second.der {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new certificate was not picked up"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    sluice.wait_log("certificate reloaded");
    // The connection made before still works, on the certificate it had.
    assert!(presented(&old) == first.der);
    assert_eq!(get_over(&mut old, "a.test", "/").await.text(), "a");

    // A broken file: the second certificate stays, and the log says why.
    dir.write(
        "a.pem",
        "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n",
    );
    let line = sluice.wait_log("do not load");
    assert!(line.contains("a.pem"), "{line}");
    let s = connect(sluice.addr, any.clone(), Some("a.test"))
        .await
        .unwrap();
    assert!(presented(&s) == second.der);
}

/// `sluice check` on `text`: (exit code, stderr).
fn check(dir: &TempDir, text: &str) -> (i32, String) {
    let path = dir.write("sluice.conf", text);
    let o = std::process::Command::new(bin())
        .args(["check", "-c", path.to_str().unwrap()])
        .output()
        .unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stderr).to_string(),
    )
}

#[test]
fn check_refuses_mismatched_and_unreadable_pairs_naming_the_file() {
    let ca = Ca::new();
    let dir = TempDir::new();
    let now = time::OffsetDateTime::now_utc();
    let expired = ca.leaf_valid(
        &["old.test"],
        now - time::Duration::days(30),
        now - time::Duration::days(1),
    );
    let (ec, ek) = write_pair(&dir, "expired", &expired);
    let (gc, _) = write_pair(&dir, "good", &ca.leaf(&["good.test"]));
    let (_, ok) = write_pair(&dir, "other", &ca.leaf(&["other.test"]));
    // Each with the hint that fits it.
    let cases = [
        (
            format!("tls {gc} {ok}"),
            "other.key",
            "does not belong",
            "openssl pkey -pubout",
        ),
        (
            format!("tls {gc} /nonexistent/x.key"),
            "x.key",
            "x.key",
            "hint: check the path",
        ),
        (
            format!("tls {ek} {ek}"),
            "expired.key",
            "no certificate",
            "hint: give a PEM",
        ),
    ];
    for (line, file, what, hint) in cases {
        let (_, err) = check(
            &dir,
            &format!("listen 127.0.0.1:0 tls\nsite a.test {{\n  {line}\n  respond ok\n}}\n"),
        );
        assert!(err.contains(hint), "{line}: the hint fits the error: {err}");
        let (code, err) = check(
            &dir,
            &format!("listen 127.0.0.1:0 tls\nsite a.test {{\n  {line}\n  respond ok\n}}\n"),
        );
        assert_eq!(code, 1, "{line}: {err}");
        assert!(err.contains(":3:3"), "{line}: no position: {err}");
        assert!(err.contains(file) && err.contains(what), "{line}: {err}");
    }
    // Dates are warnings at the `tls` line (errors under --strict): expired, and
    // expiring within 14 days.
    let soon = ca.leaf_valid(
        &["soon.test"],
        now - time::Duration::days(30),
        now + time::Duration::days(5),
    );
    let (sc, sk) = write_pair(&dir, "soon", &soon);
    for (line, what) in [
        (format!("tls {ec} {ek}"), "expired on"),
        (format!("tls {sc} {sk}"), "in less than 14 days"),
    ] {
        let text = format!("listen 127.0.0.1:0 tls\nsite a.test {{\n  {line}\n  respond ok\n}}\n");
        let (code, err) = check(&dir, &text);
        assert_eq!(code, 0, "{line}: {err}");
        assert!(
            err.contains(":3:3: warning:") && err.contains(what),
            "{line}: {err}"
        );
        assert!(err.contains("hint: renew"), "{line}: {err}");
        let path = dir.write("strict.conf", &text);
        let o = std::process::Command::new(bin())
            .args(["check", "--strict", "-c", path.to_str().unwrap()])
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(1), "{line}: --strict");
    }
    // A certificate with no tls listener: a warning. A tls listener with no
    // certificate: an error.
    let (gc, gk) = write_pair(&dir, "good", &ca.leaf(&["good.test"]));
    let (code, err) = check(
        &dir,
        &format!("site a.test {{ tls {gc} {gk}; respond ok }}"),
    );
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("no `tls` listener"), "{err}");
    let (code, err) = check(&dir, "listen 127.0.0.1:0 tls\nsite a.test { respond ok }");
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("no certificate to serve"), "{err}");
}

#[tokio::test]
async fn the_handshake_and_the_head_each_have_10s() {
    let ca = Ca::new();
    let dir = TempDir::new();
    let (ac, ak) = write_pair(&dir, "a", &ca.leaf(&["a.test"]));
    let sluice = Sluice::start(&format!(
        "listen 127.0.0.1:0 tls\nsite a.test {{ tls {ac} {ak}; respond \"a\" }}"
    ));
    let addr = sluice.addr;
    let silent = async {
        // TCP open, no ClientHello: closed by the handshake deadline.
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let t = Instant::now();
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(15), s.read(&mut buf))
            .await
            .expect("closed in time")
            .unwrap_or(0);
        (n, t.elapsed())
    };
    let slow_head = async {
        // Handshaken, then half a head: 408 after the head deadline.
        let mut s = connect(addr, ca.client(&[b"http/1.1"]), Some("a.test"))
            .await
            .unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: a.test\r\n")
            .await
            .unwrap();
        let t = Instant::now();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(15), s.read_to_end(&mut out)).await;
        (String::from_utf8_lossy(&out).to_string(), t.elapsed())
    };
    let ((n, silent_for), (head, slow_for)) = tokio::join!(silent, slow_head);
    assert_eq!(n, 0, "a silent client gets nothing but the close");
    assert!(
        silent_for >= Duration::from_secs(9) && silent_for < Duration::from_secs(13),
        "handshake deadline: {silent_for:?}"
    );
    assert!(head.starts_with("HTTP/1.1 408"), "{head}");
    assert!(
        slow_for >= Duration::from_secs(9) && slow_for < Duration::from_secs(13),
        "head deadline: {slow_for:?}"
    );
}

/// One request over a fresh TLS connection to `sni` with `config`; `None` when the
/// handshake or the request failed (a TLS 1.3 server refuses a client certificate
/// after the client thinks the handshake is done: the refusal shows on the read).
async fn over_tls(
    addr: std::net::SocketAddr,
    config: std::sync::Arc<rustls::ClientConfig>,
    sni: &str,
    host: &str,
) -> Option<Resp> {
    let mut s = connect(addr, config, Some(sni)).await.ok()?;
    let req = format!("GET /who HTTP/1.1\r\nHost: {host}\r\n\r\n");
    s.write_all(req.as_bytes()).await.ok()?;
    let mut buf = Vec::new();
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some((resp, _)) = parse_response(&buf) {
            return Some(resp);
        }
        let mut chunk = [0u8; 4096];
        match tokio::time::timeout_at(deadline.into(), s.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
            _ => return None,
        }
    }
}

/// mTLS (DESIGN §16): `client_ca` with `client_auth require|optional` and
/// `client_crl`, per site by SNI; the verified identity as placeholders and `when
/// client_cert`; expired, revoked and foreign certificates fail the handshake under
/// both modes; a connection made for another site's name never reaches an mTLS site.
#[tokio::test]
async fn client_certificates_are_verified_per_site() {
    let ca = Ca::new();
    let clients = Ca::new();
    let stranger = Ca::new();
    let dir = TempDir::new();
    let later = time::OffsetDateTime::now_utc() + time::Duration::days(30);
    let alice = clients.client_leaf(
        "alice",
        &[
            "alice.example",
            "email:alice@example.com",
            "x\\y.test,admin.test",
        ],
        11,
        later,
    );
    let revoked = clients.client_leaf("mallory", &[], 12, later);
    let expired = clients.client_leaf(
        "old",
        &[],
        13,
        time::OffsetDateTime::now_utc() - time::Duration::days(1),
    );
    let foreign = stranger.client_leaf("alice", &[], 11, later);
    let jose = clients.client_leaf("José", &[], 14, later);
    dir.write("clients.pem", &clients.pem());
    dir.write("clients.crl", &clients.crl(&[12]));
    let mut conf = String::from("listen 127.0.0.1:0 tls\n");
    for (name, block) in [
        (
            "secure.test",
            "{ client_ca clients.pem; client_crl clients.crl }",
        ),
        (
            "opt.test",
            "{ client_ca clients.pem; client_auth optional; client_crl clients.crl }",
        ),
        ("public.test", ""),
    ] {
        let (c, k) = write_pair(&dir, name, &ca.leaf(&[name]));
        conf.push_str(&format!(
            "site {name} {{
                tls {c} {k} {block}
                header_down X-Cert yes when client_cert
                respond \"{name}|{{tls_client_subject}}|{{tls_client_san}}|{{tls_client_fingerprint}}\"
            }}\n"
        ));
    }
    let path = dir.write("sluice.conf", &without_admin(&conf));
    let s = Sluice::spawn(&["run", "-c", path.to_str().unwrap()], dir);
    let fp: String = ring::digest::digest(&ring::digest::SHA256, &alice.der)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    for site in ["secure.test", "opt.test"] {
        let r = over_tls(s.addr, ca.client_with(Some(&alice)), site, site)
            .await
            .expect("a valid certificate is served");
        assert_eq!(r.status, 200, "{site}");
        assert_eq!(
            r.text(),
            // RFC 4514 reverses the DER order (rcgen writes CN, then O). A `,` or `\`
            // inside a SAN entry is escaped: one name never reads as two.
            format!(
                "{site}|O=Example,CN=alice|alice.example, alice@example.com, x\\\\y.test\\,admin.test|{fp}"
            )
        );
        assert_eq!(r.header("x-cert"), Some("yes"));
        for (who, bad) in [
            ("revoked", &revoked),
            ("expired", &expired),
            ("foreign", &foreign),
        ] {
            let r = over_tls(s.addr, ca.client_with(Some(bad)), site, site).await;
            assert!(
                r.is_none(),
                "{site}: a {who} certificate got {:?}",
                r.map(|r| r.status)
            );
        }
    }
    // Outside printable ASCII, the subject is escaped (it always fits a header).
    let r = over_tls(
        s.addr,
        ca.client_with(Some(&jose)),
        "secure.test",
        "secure.test",
    )
    .await
    .unwrap();
    assert!(
        r.text()
            .starts_with("secure.test|O=Example,CN=Jos\\C3\\A9|"),
        "{}",
        r.text()
    );
    // A certificate speaks for the site whose handshake verified it, no other.
    let r = over_tls(
        s.addr,
        ca.client_with(Some(&alice)),
        "secure.test",
        "public.test",
    )
    .await
    .unwrap();
    assert_eq!((r.status, r.text().as_str()), (200, "public.test|||"));
    assert_eq!(r.header("x-cert"), None);
    // No certificate: required fails, optional serves with empty placeholders.
    assert!(
        over_tls(s.addr, ca.client_with(None), "secure.test", "secure.test")
            .await
            .is_none()
    );
    let r = over_tls(s.addr, ca.client_with(None), "opt.test", "opt.test")
        .await
        .unwrap();
    assert_eq!((r.status, r.text().as_str()), (200, "opt.test|||"));
    assert_eq!(r.header("x-cert"), None);
    // SNI for the public site, Host for the secure one: refused, never served.
    let r = over_tls(s.addr, ca.client_with(None), "public.test", "secure.test")
        .await
        .unwrap();
    assert_eq!(r.status, 421);
    let r = over_tls(s.addr, ca.client_with(None), "public.test", "public.test")
        .await
        .unwrap();
    assert_eq!((r.status, r.text().as_str()), (200, "public.test|||"));
}

#[test]
fn client_certificate_settings_are_checked_at_load() {
    let ca = Ca::new();
    let dir = TempDir::new();
    let (c, k) = write_pair(&dir, "site", &ca.leaf(&["a.test"]));
    dir.write("ca.pem", &ca.pem());
    dir.write("empty.crl", "");
    let ca_path = dir.0.join("ca.pem").display().to_string();
    let crl_path = dir.0.join("empty.crl").display().to_string();
    for (block, want) in [
        ("{ client_auth optional }", "need `client_ca FILE`"),
        ("{ client_ca /nonexistent/ca.pem }", "/nonexistent/ca.pem"),
        (
            &format!("{{ client_ca {ca_path}; client_auth maybe }}") as &str,
            "`require` or `optional`",
        ),
        (
            &format!("{{ client_ca {ca_path}; client_crl {crl_path} }}"),
            "no revocation list",
        ),
        (
            &format!("{{ client_ca {ca_path}; verify_depth 2 }}"),
            "not a tls setting",
        ),
    ] {
        assert_check_fails(
            &dir,
            &format!(
                "listen 127.0.0.1:0 tls\nsite a.test {{\n tls {c} {k} {block}\n respond x\n}}\n"
            ),
            want,
        );
    }
}

/// An expired certificate is served as it is, beside its neighbours (one site's lapse
/// does not take every site down), and each certificate's end is a metric.
#[tokio::test]
async fn an_expired_certificate_is_served_and_every_expiry_is_a_metric() {
    let ca = Ca::new();
    let dir = TempDir::new();
    let now = time::OffsetDateTime::now_utc();
    let expired = ca.leaf_valid(
        &["old.test"],
        now - time::Duration::days(30),
        now - time::Duration::days(1),
    );
    let good = ca.leaf(&["good.test"]);
    let (ec, ek) = write_pair(&dir, "old", &expired);
    let (gc, gk) = write_pair(&dir, "good", &good);
    let path = dir.write(
        "sluice.conf",
        &format!(
            "listen 127.0.0.1:0 tls
             global {{ admin 127.0.0.1:0 }}
             site old.test {{ tls {ec} {ek}; respond old }}
             site good.test {{ tls {gc} {gk}; respond good }}"
        ),
    );
    let s = Sluice::spawn(&["run", "-c", path.to_str().unwrap()], dir);
    s.wait_log("expired on");
    let any = any_cert_client(&[b"http/1.1"]);
    let conn = connect(s.addr, any.clone(), Some("old.test"))
        .await
        .unwrap();
    assert!(presented(&conn) == expired.der);
    let mut conn = connect(s.addr, any, Some("good.test")).await.unwrap();
    assert_eq!(get_over(&mut conn, "good.test", "/").await.text(), "good");
    let metrics = request(s.admin(), "GET", "/metrics", &[], b"").await.text();
    for (site, leaf) in [("old.test", &expired), ("good.test", &good)] {
        let line = metrics
            .lines()
            .find(|l| {
                l.starts_with(&format!(
                    "sluice_tls_certificate_expiry_seconds{{site=\"{site}\"}}"
                ))
            })
            .unwrap_or_else(|| panic!("{site} in:\n{metrics}"));
        let secs: i64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        let want = x509_not_after(&leaf.der);
        assert_eq!(secs, want, "{site}");
    }
}

/// `notAfter` of a DER certificate, as Unix seconds, read with `x509-cert`'s decoder
/// rather than the small DER walk sluice uses for the metric.
fn x509_not_after(der: &[u8]) -> i64 {
    use x509_cert::der::Decode as _;
    let cert = x509_cert::Certificate::from_der(der).unwrap();
    cert.tbs_certificate
        .validity
        .not_after
        .to_unix_duration()
        .as_secs() as i64
}
