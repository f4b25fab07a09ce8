//! Automatic HTTPS against a real ACME server: Debian's `pebble` on loopback, its
//! validation ports pointed at sluice's listeners (DESIGN §15.5, §15.8).

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::bind::Bind;
use common::pebble::{free_port, Pebble};
use common::pki::{any_cert_client, blind_client, connect, presented};
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What the placeholder's subject says (see `acme::certs::PLACEHOLDER_CN`).
const PLACEHOLDER: &[u8] = b"sluice placeholder";
const ISSUED: &str = "acme: certificate for app.test, www.app.test issued";

struct Setup<'a> {
    http: u16,
    tls: u16,
    directory: &'a str,
    ca_root: Option<&'a std::path::Path>,
    storage: &'a str,
    challenge: &'a str,
    body: &'a str,
    /// More lines for the `acme` block.
    more: String,
}

impl<'a> Setup<'a> {
    /// Against `pebble`, answering "hello".
    fn on(
        pebble: &'a Pebble,
        (http, tls): (u16, u16),
        storage: &'a str,
        challenge: &'a str,
    ) -> Self {
        Setup {
            http,
            tls,
            directory: &pebble.directory,
            ca_root: Some(&pebble.api_ca),
            storage,
            challenge,
            body: "hello",
            more: String::new(),
        }
    }

    /// The listeners and the `global` block with its `acme` settings.
    fn head(&self) -> String {
        let ca = self
            .ca_root
            .map(|p| format!("ca_root {}", p.display()))
            .unwrap_or_default();
        format!(
            "listen 127.0.0.1:{http}
listen 127.0.0.1:{tls} tls
global {{
    admin 127.0.0.1:0
    acme {{
        directory {dir}
        {ca}
        email ops@example.com
        storage {storage}
        {challenge}
        {more}
    }}
}}
",
            http = self.http,
            tls = self.tls,
            dir = self.directory,
            storage = self.storage,
            challenge = if self.challenge.is_empty() {
                String::new()
            } else {
                format!("challenge {}", self.challenge)
            },
            more = self.more,
        )
    }

    fn config(&self) -> String {
        format!(
            "{}site app.test www.app.test {{
    tls auto
    https_redirect
    respond \"{body}\\n\"
}}
",
            self.head(),
            body = self.body,
        )
    }

    /// Starts sluice on this config, written to `path` (so a test can change it).
    fn start(&self, path: &std::path::Path) -> Sluice {
        std::fs::write(path, self.config()).unwrap();
        Sluice::spawn(&["run", "-c", path.to_str().unwrap()], TempDir::new())
    }
}

fn tls_addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn is_placeholder(der: &[u8]) -> bool {
    der.windows(PLACEHOLDER.len()).any(|w| w == PLACEHOLDER)
}

/// A GET of `/` for `host` over a new TLS connection made with `config`: the
/// certificate presented and the body.
async fn fetch(
    port: u16,
    config: Arc<rustls::ClientConfig>,
    host: &str,
) -> std::io::Result<(Vec<u8>, String)> {
    let mut s = connect(tls_addr(port), config, Some(host)).await?;
    let der = presented(&s);
    let req = format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await?;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(WAIT, s.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out);
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    Ok((der, body))
}

/// Client settings trusting only `roots` (pebble's), offering http/1.1.
fn trusting(roots: rustls::RootCertStore) -> Arc<rustls::ClientConfig> {
    let mut c = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    c.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(c)
}

/// Waits (bounded by `limit`) until `needle` has appeared `n` times in the log.
fn wait_lines(s: &Sluice, needle: &str, n: usize, limit: Duration) {
    let end = Instant::now() + limit;
    while s.logs().matches(needle).count() < n {
        assert!(
            Instant::now() < end,
            "expected {n} log lines with {needle:?}:\n{}",
            s.logs()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Pebble validating on two fresh ports (for sluice's plain and `tls` listeners), a
/// storage folder and a config folder; `None` when pebble is skipped.
fn with_pebble(validity: Duration) -> Option<(Pebble, (u16, u16), TempDir, TempDir)> {
    let (http, tls) = (free_port(), free_port());
    let pebble = Pebble::start(http, tls, validity)?;
    Some((pebble, (http, tls), TempDir::new(), TempDir::new()))
}

async fn metric(admin: SocketAddr, line: &str) -> u64 {
    let m = get(admin, "/metrics").await.text();
    m.lines()
        .find_map(|l| l.strip_prefix(line)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {line} in:\n{m}"))
}

/// Both challenges, alone: the certificate arrives, chains to pebble's root for both
/// names, and serves the site; the placeholder served before it. The site redirects
/// plain HTTP to HTTPS: HTTP-01 is answered all the same.
#[tokio::test]
async fn a_certificate_is_issued_over_each_challenge_and_verifies_against_the_acme_root() {
    for challenge in ["tls-alpn-01", "http-01"] {
        let Some((pebble, (http, tls), data, conf)) = with_pebble(Duration::from_secs(3600)) else {
            return;
        };
        let setup = Setup::on(&pebble, (http, tls), data.0.to_str().unwrap(), challenge);
        let s = setup.start(&conf.0.join("sluice.conf"));
        s.wait_log("serving a self-signed placeholder");
        s.wait_log(ISSUED);
        let verified = trusting(pebble.root().await);
        for host in ["app.test", "www.app.test"] {
            let (der, body) = fetch(tls, verified.clone(), host)
                .await
                .unwrap_or_else(|e| panic!("{challenge}: {host} does not verify: {e}"));
            assert!(!is_placeholder(&der));
            assert_eq!(body, "hello\n", "{challenge}");
        }
        // The key file is the process's alone.
        use std::os::unix::fs::PermissionsExt;
        let scope = pebble
            .directory
            .trim_start_matches("https://")
            .replace([':', '/'], "_");
        let key = data
            .0
            .join(format!("certificates/{scope}/app.test/key.pem"));
        let account = data.0.join(format!("accounts/{scope}.json"));
        for private in [key, account] {
            let mode = std::fs::metadata(&private).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{}", private.display());
        }
        let status: serde_json::Value =
            serde_json::from_str(&get(s.admin(), "/status").await.text()).unwrap();
        let cert = &status["acme"]["certificates"][0];
        assert_eq!(
            cert["names"],
            serde_json::json!(["app.test", "www.app.test"])
        );
        assert!(cert["not_after"].is_string() && cert["next_renewal"].is_string());
        assert!(cert["last_error"].is_null());
        assert_eq!(
            metric(s.admin(), "sluice_acme_orders_total{result=\"ok\"}").await,
            1
        );
    }
}

/// An ACME server that is down: the placeholder serves the site, each failure is
/// logged with the retry's wait, counted and shown in `/status`.
#[tokio::test]
async fn an_acme_server_that_is_down_leaves_the_placeholder_serving_and_retries() {
    let data = TempDir::new();
    let conf = TempDir::new();
    let dead = dead_addr().await;
    let directory = format!("https://{dead}/dir");
    let (http, tls) = (free_port(), free_port());
    let setup = Setup {
        http,
        tls,
        directory: &directory,
        ca_root: None,
        storage: data.0.to_str().unwrap(),
        challenge: "tls-alpn-01 http-01",
        body: "still here",
        more: String::new(),
    };
    let s = setup.start(&conf.0.join("sluice.conf"));
    wait_lines(&s, "failed", 2, Duration::from_secs(10));
    assert_eq!(
        s.logs()
            .matches("serving a self-signed placeholder")
            .count(),
        1,
        "warned once"
    );
    assert!(
        s.logs()
            .contains("attempt 2, retrying in 4s; the placeholder keeps serving"),
        "{}",
        s.logs()
    );
    let (der, body) = fetch(tls, any_cert_client(&[b"http/1.1"]), "app.test")
        .await
        .unwrap();
    assert!(is_placeholder(&der));
    assert_eq!(body, "still here\n");
    let admin = s.admin();
    assert!(metric(admin, "sluice_acme_orders_total{result=\"error\"}").await >= 2);
    assert_eq!(
        metric(admin, "sluice_acme_orders_total{result=\"ok\"}").await,
        0
    );
    let status: serde_json::Value =
        serde_json::from_str(&get(admin, "/status").await.text()).unwrap();
    let cert = &status["acme"]["certificates"][0];
    assert!(cert["not_after"].is_null(), "{cert}");
    assert!(
        cert["last_error"]
            .as_str()
            .unwrap()
            .contains(&dead.to_string()),
        "{cert}"
    );
}

/// Short-lived certificates are renewed in the background (at a third of their
/// lifetime here): new handshakes get the new one, a connection made before keeps
/// working.
#[tokio::test]
async fn renewal_serves_new_handshakes_the_new_certificate_and_leaves_open_connections() {
    let Some((pebble, (http, tls), data, conf)) = with_pebble(Duration::from_secs(9)) else {
        return;
    };
    let setup = Setup::on(
        &pebble,
        (http, tls),
        data.0.to_str().unwrap(),
        "tls-alpn-01",
    );
    let s = setup.start(&conf.0.join("sluice.conf"));
    wait_lines(&s, ISSUED, 1, WAIT);
    let verified = trusting(pebble.root().await);
    let mut open = connect(tls_addr(tls), verified.clone(), Some("app.test"))
        .await
        .unwrap();
    let first = presented(&open);
    wait_lines(&s, ISSUED, 2, Duration::from_secs(15));
    let (second, body) = fetch(tls, verified, "app.test").await.unwrap();
    assert_ne!(
        first, second,
        "a new handshake gets the renewed certificate"
    );
    assert_eq!(body, "hello\n");
    open.write_all(b"GET / HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(WAIT, open.read_to_end(&mut out)).await;
    assert!(String::from_utf8_lossy(&out).ends_with("hello\n"));
}

/// Waits (bounded) until the storage folder holds a certificate and its key.
fn wait_stored(dir: &std::path::Path) {
    fn found(d: &std::path::Path) -> bool {
        let Ok(entries) = std::fs::read_dir(d) else {
            return false;
        };
        let names: Vec<_> = entries.flatten().map(|e| e.path()).collect();
        let has = |n: &str| names.iter().any(|p| p.file_name().is_some_and(|f| f == n));
        (has("cert.pem") && has("key.pem")) || names.iter().any(|p| p.is_dir() && found(p))
    }
    let end = std::time::Instant::now() + WAIT;
    while !found(dir) {
        assert!(
            std::time::Instant::now() < end,
            "no certificate stored in {dir:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The folder outlives the process: a restart serves the stored certificate from its
/// first handshake and orders nothing; a reload orders nothing either.
#[tokio::test]
async fn a_restart_and_a_reload_reuse_the_stored_certificate_without_ordering() {
    let Some((pebble, (http, tls), data, conf)) = with_pebble(Duration::from_secs(3600)) else {
        return;
    };
    let path: PathBuf = conf.0.join("sluice.conf");
    let mut setup = Setup {
        body: "one",
        ..Setup::on(&pebble, (http, tls), data.0.to_str().unwrap(), "http-01")
    };
    let first = {
        let s = setup.start(&path);
        s.wait_log(ISSUED);
        // The certificate serves before it is stored: the restart needs it stored.
        wait_stored(&data.0);
        let (der, _) = fetch(tls, any_cert_client(&[b"http/1.1"]), "app.test")
            .await
            .unwrap();
        der
    };
    let s = setup.start(&path);
    let (der, body) = fetch(tls, trusting(pebble.root().await), "app.test")
        .await
        .unwrap();
    assert_eq!(der, first, "the stored certificate serves at once");
    assert_eq!(body, "one\n");
    setup.body = "two";
    std::fs::write(&path, setup.config()).unwrap();
    s.signal("HUP");
    s.wait_log("reloaded: revision 2");
    let (der, body) = fetch(tls, any_cert_client(&[b"http/1.1"]), "app.test")
        .await
        .unwrap();
    assert_eq!((der, body.as_str()), (first, "two\n"));
    let admin = s.admin();
    assert_eq!(
        metric(admin, "sluice_acme_orders_total{result=\"ok\"}").await,
        0
    );
    assert!(!s.logs().contains("placeholder"), "{}", s.logs());
    assert!(!s.logs().contains("issued"), "{}", s.logs());
}

/// Two instances sharing Redis storage: one order between them, the same certificate
/// on both; and challenge answers published there are answered by either instance.
#[tokio::test]
async fn two_instances_sharing_redis_make_one_order() {
    let Some(redis) = redis::RedisServer::start() else {
        return;
    };
    let (http_a, tls_a) = (free_port(), free_port());
    let (http_b, tls_b) = (free_port(), free_port());
    let Some(pebble) = Pebble::start(http_a, tls_a, Duration::from_secs(3600)) else {
        return;
    };
    let url = format!("redis://127.0.0.1:{}", redis.port);
    let conf = TempDir::new();
    let instance = |http, tls, path: &str| {
        Setup::on(&pebble, (http, tls), &url, "tls-alpn-01 http-01").start(&conf.0.join(path))
    };
    let a = instance(http_a, tls_a, "a.conf");
    let b = instance(http_b, tls_b, "b.conf");
    let verified = trusting(pebble.root().await);
    let end = Instant::now() + Duration::from_secs(15);
    let mut served = Vec::new();
    for port in [tls_a, tls_b] {
        loop {
            if let Ok((der, _)) = fetch(port, verified.clone(), "app.test").await {
                served.push(der);
                break;
            }
            assert!(Instant::now() < end, "{}\n---\n{}", a.logs(), b.logs());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert_eq!(served[0], served[1], "both serve the one certificate");
    let orders = a.logs().matches(ISSUED).count() + b.logs().matches(ISSUED).count();
    assert_eq!(orders, 1, "{}\n---\n{}", a.logs(), b.logs());
    let ok = |s: &Sluice| metric(s.admin(), "sluice_acme_orders_total{result=\"ok\"}");
    assert_eq!(ok(&a).await + ok(&b).await, 1);
    let failed = |s: &Sluice| metric(s.admin(), "sluice_acme_orders_total{result=\"error\"}");
    assert_eq!(
        failed(&a).await + failed(&b).await,
        0,
        "the waiting instance never competed"
    );

    // A third instance (a restart) serves the stored certificate from its first
    // handshake: no placeholder, no order.
    let (http_c, tls_c) = (free_port(), free_port());
    let c = instance(http_c, tls_c, "c.conf");
    let (der, _) = fetch(tls_c, verified.clone(), "app.test").await.unwrap();
    assert_eq!(der, served[0]);
    assert!(!c.logs().contains("placeholder"), "{}", c.logs());
    assert_eq!(ok(&c).await, 0);

    // A challenge another instance put up is answered here too: HTTP-01 on the
    // plain listener, TLS-ALPN-01 in the handshake.
    let client = ::redis::Client::open(url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = ::redis::cmd("SET")
        .arg("sluice:acme:http-01:tok_123")
        .arg("tok_123.thumb")
        .query_async(&mut conn)
        .await
        .unwrap();
    let digest = "ab".repeat(32);
    let _: () = ::redis::cmd("SET")
        .arg("sluice:acme:tls-alpn-01:app.test")
        .arg(&digest)
        .query_async(&mut conn)
        .await
        .unwrap();
    let plain = SocketAddr::from(([127, 0, 0, 1], http_b));
    let r = get_host(plain, "app.test", "/.well-known/acme-challenge/tok_123").await;
    assert_eq!((r.status, r.text().as_str()), (200, "tok_123.thumb"));
    let r = get_host(plain, "app.test", "/.well-known/acme-challenge/other").await;
    assert_eq!(
        r.status, 200,
        "no answer pending: the site's route serves it"
    );
    assert_eq!(r.text(), "hello\n");
    let r = get_host(plain, "app.test", "/").await;
    assert_eq!(r.status, 308, "the rest of the site is sent to HTTPS");
    let s = connect(
        tls_addr(tls_b),
        blind_client(&[b"acme-tls/1"]),
        Some("app.test"),
    )
    .await
    .unwrap();
    assert_eq!(s.get_ref().1.alpn_protocol(), Some(&b"acme-tls/1"[..]));
    let der = presented(&s);
    let want: Vec<u8> = (0..32).map(|_| 0xab).collect();
    assert!(
        der.windows(32).any(|w| w == want.as_slice()),
        "the acmeIdentifier extension carries the digest"
    );
}

/// Certificates are kept per ACME server: pointing `directory` at another one orders
/// from it (a staging certificate is never carried to production), while a change of
/// any other setting (here `email`) keeps the certificate. A site that gains a name
/// keeps serving its certificate for the others until the new one arrives.
#[tokio::test]
async fn a_new_directory_orders_again_other_changes_and_a_new_name_keep_serving() {
    let Some((pebble, (http, tls), data, conf)) = with_pebble(Duration::from_secs(3600)) else {
        return;
    };
    let path: PathBuf = conf.0.join("sluice.conf");
    let other = pebble.directory.replace("127.0.0.1", "localhost");
    let setup = Setup::on(
        &pebble,
        (http, tls),
        data.0.to_str().unwrap(),
        "tls-alpn-01",
    );
    let s = setup.start(&path);
    wait_lines(&s, ISSUED, 1, WAIT);
    let any = any_cert_client(&[b"http/1.1"]);
    let (first, _) = fetch(tls, any.clone(), "app.test").await.unwrap();
    // Another email: the same server, the same certificate.
    std::fs::write(
        &path,
        setup.config().replace("ops@example.com", "sre@example.com"),
    )
    .unwrap();
    s.signal("HUP");
    s.wait_log("reloaded: revision 2");
    assert_eq!(fetch(tls, any.clone(), "app.test").await.unwrap().0, first);
    // Another directory (the same pebble by another name): a new order.
    let moved = Setup {
        directory: &other,
        ..setup
    };
    std::fs::write(&path, moved.config()).unwrap();
    s.signal("HUP");
    s.wait_log("reloaded: revision 3");
    wait_lines(&s, ISSUED, 2, WAIT);
    let (second, _) = fetch(tls, any.clone(), "app.test").await.unwrap();
    assert_ne!(second, first);
    // A name more: the stored certificate serves the others meanwhile, then one
    // certificate for all three.
    let grown = moved.config().replace(
        "site app.test www.app.test",
        "site app.test www.app.test api.app.test",
    );
    std::fs::write(&path, grown).unwrap();
    s.signal("HUP");
    s.wait_log("does not cover all of app.test, www.app.test, api.app.test: serving it meanwhile");
    wait_lines(
        &s,
        "acme: certificate for app.test, www.app.test, api.app.test issued",
        1,
        WAIT,
    );
    let verified = trusting(pebble.root().await);
    let (third, _) = fetch(tls, verified, "api.app.test").await.unwrap();
    assert_ne!(third, second);
    assert_eq!(s.logs().matches("issued by").count(), 3, "{}", s.logs());
}

/// Instances sharing Redis back off together from a server that refuses: the
/// failures in a row are counted among them (attempt 1, 2, 3 across both logs), and
/// the wait is published before the lock is let go, so no instance slips in.
#[tokio::test]
async fn instances_sharing_redis_back_off_together() {
    let Some(redis) = redis::RedisServer::start() else {
        return;
    };
    let dead = dead_addr().await;
    let directory = format!("https://{dead}/dir");
    let url = format!("redis://127.0.0.1:{}", redis.port);
    let conf = TempDir::new();
    let start = |path: &str| {
        Setup {
            http: free_port(),
            tls: free_port(),
            directory: &directory,
            ca_root: None,
            storage: &url,
            challenge: "tls-alpn-01 http-01",
            body: "hello",
            more: String::new(),
        }
        .start(&conf.0.join(path))
    };
    let a = start("a.conf");
    let b = start("b.conf");
    let attempts = || {
        let mut n: Vec<u32> = [a.logs(), b.logs()]
            .iter()
            .flat_map(|l| {
                l.match_indices("; attempt ")
                    .filter_map(|(i, m)| {
                        let rest = &l[i + m.len()..];
                        rest[..rest.find(',')?].parse().ok()
                    })
                    .collect::<Vec<u32>>()
            })
            .collect();
        n.sort();
        n
    };
    let end = Instant::now() + Duration::from_secs(15);
    while attempts().len() < 3 {
        assert!(Instant::now() < end, "{}\n---\n{}", a.logs(), b.logs());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        attempts()[..3],
        [1, 2, 3],
        "{}\n---\n{}",
        a.logs(),
        b.logs()
    );
}

#[test]
fn a_bad_acme_setup_fails_the_check_with_where_and_why() {
    let dir = TempDir::new();
    let not_a_folder = dir.write("plain-file", "x").join("acme");
    let secret = "c2x1aWNlLXRlc3Qtc2VjcmV0LTMyLWJ5dGVzLSEhIQ==";
    let good_key = dir.write(
        "good.key",
        &format!("key \"acme\" {{\n\talgorithm hmac-sha256;\n\tsecret \"{secret}\";\n}};\n"),
    );
    let bad_key = dir.write("bad.key", "key \"acme\" { secret \"not base64!\"; };");
    let short_key = dir.write("short.key", "c2hvcnQ=");
    let bare_key = dir.write("bare.key", secret);
    let tls = "listen :8443 tls\nlisten :8080\n";
    let cases: &[(&str, &str)] = &[
        (
            "listen :8080\nsite a.test { tls auto\n respond ok }",
            "has `tls auto` but there is no `tls` listener",
        ),
        (
            &format!("{tls}site *.a.test {{ tls auto\n respond ok }}"),
            "needs the dns-01 challenge",
        ),
        (
            &format!("{tls}site * {{ tls auto\n respond ok }}"),
            "`tls auto` cannot get a certificate for every name",
        ),
        (
            &format!("{tls}site 10.0.0.1 {{ tls auto\n respond ok }}"),
            "cannot get a certificate for the address",
        ),
        (
            "listen :8443 tls\nglobal { acme { challenge http-01 } }\nsite a.test { tls auto\n respond ok }",
            "needs a plain listener",
        ),
        (
            &format!("{tls}global {{ acme {{ challenge dns-01 }} }}\nsite a.test {{ tls auto\n respond ok }}"),
            "the dns-01 challenge needs somewhere to put its TXT records",
        ),
        (
            &format!("{tls}global {{ acme {{ dns_update 127.0.0.1:53 {{ zone a.test; key_file /nonexistent/acme.key }} }} }}"),
            "/nonexistent/acme.key: No such file",
        ),
        (
            &format!("{tls}global {{ acme {{ dns_update 127.0.0.1:53 {{ zone a.test; key_file {} }} }} }}", bad_key.display()),
            "the secret is not base64",
        ),
        (
            &format!("{tls}global {{ acme {{ dns_update 127.0.0.1:53 {{ zone a.test; key_file {} }} }} }}", short_key.display()),
            "a TSIG key has at least 16",
        ),
        (
            &format!("{tls}global {{ acme {{ dns_update 127.0.0.1:53 {{ zone a.test; key_file {} }} }} }}", bare_key.display()),
            "dns_update needs `key_name`",
        ),
        (
            &format!("{tls}global {{ acme {{ dns_update 127.0.0.1:53 {{ key_file {} }} }} }}", good_key.display()),
            "dns_update needs `zone`",
        ),
        (
            &format!("{tls}global {{ acme {{ dns_update 127.0.0.1:53 {{ zone a.test; key_name other; key_file {} }} }} }}", good_key.display()),
            "the key file names the key acme, not other",
        ),
        (
            &format!("{tls}global {{ acme {{ dns_update 127.0.0.1:53 {{ zone a.test; algorithm hmac-md5; key_file {} }} }} }}", good_key.display()),
            "hmac-sha256, hmac-sha384 or hmac-sha512",
        ),
        (
            &format!("{tls}global {{ acme {{ dns_update 127.0.0.1:53 {{ zone a.test; key_file {} }} }} }}\nsite *.b.test {{ tls auto\n respond ok }}", good_key.display()),
            "outside the zone a.test",
        ),
        (
            &format!("{tls}global {{ acme {{ dns_update dns.a.test {{ zone a.test; key_file {} }} }} }}", good_key.display()),
            "a DNS server's IP address",
        ),
        (
            &format!("{tls}global {{ acme {{ dns_update 127.0.0.1 {{ zone a.test; algorithm hmac-sha512; key_file {} }} }} }}", good_key.display()),
            "the key file's algorithm is hmac-sha256, not hmac-sha512",
        ),
        (
            &format!("{tls}global {{ acme {{ dns_update 127.0.0.1 {{ zone a.test; zone b.test; key_file {} }} }} }}", good_key.display()),
            "`zone` is set twice",
        ),
        (
            &format!("{tls}global {{ acme {{ directory ftp://x }} }}"),
            "the ACME server's directory URL",
        ),
        (
            &format!("{tls}global {{ acme {{ email nobody }} }}"),
            "an email address",
        ),
        (
            &format!("{tls}global {{ acme {{ storage redis://x:99999 }} }}"),
            "a Redis address",
        ),
        (
            &format!("{tls}global {{ acme {{ ca_root /nonexistent/root.pem }} }}"),
            "/nonexistent/root.pem",
        ),
        (
            &format!("{tls}global {{ acme {{ renew_before 0s }} }}"),
            "renew_before",
        ),
        (
            &format!("{tls}global {{ acme {{ contact x }} }}"),
            "an `acme` block takes",
        ),
        (
            &format!("{tls}site localhost {{ tls auto\n respond ok }}"),
            "public DNS names",
        ),
        (
            &format!("{tls}site a_b.test {{ tls auto\n respond ok }}"),
            "public DNS names",
        ),
        (
            &format!("{tls}global {{ acme {{ storage {} }} }}\nsite a.test {{ tls auto\n respond ok }}", not_a_folder.display()),
            "Not a directory",
        ),
    ];
    for (text, want) in cases {
        assert_check_fails(&dir, text, want);
    }
}

/// `tls on_demand { ask URL }` (DESIGN §18.8): a name `ask` allows gets a certificate
/// at its first handshake, which waits for the order, and it verifies against the
/// ACME root; a second handshake finds it without asking again. A name `ask` refuses
/// gets no certificate, and is not asked about again for ten minutes.
#[tokio::test]
async fn on_demand_certificates_are_ordered_for_the_names_ask_allows() {
    let Some((pebble, (http, tls), data, conf)) = with_pebble(Duration::from_secs(3600)) else {
        return;
    };
    let asked: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
    let log = asked.clone();
    let ask = Backend::start(move |req: hyper::Request<hyper::body::Incoming>| {
        let domain = req
            .uri()
            .query()
            .and_then(|q| q.strip_prefix("domain="))
            .unwrap_or("")
            .to_string();
        log.lock().unwrap().push(domain.clone());
        async move {
            let status = if domain.ends_with(".ok.test") {
                200
            } else {
                403
            };
            hyper::Response::builder()
                .status(status)
                .body(full(""))
                .unwrap()
        }
    })
    .await;
    let storage = data.0.display().to_string();
    let setup = Setup::on(&pebble, (http, tls), &storage, "tls-alpn-01");
    let config = format!(
        "{}site *.ok.test *.no.test {{
    tls on_demand {{ ask http://{ask}/check }}
    respond \"hello\\n\"
}}
",
        setup.head(),
        ask = ask.addr,
    );
    let path = conf.0.join("sluice.conf");
    std::fs::write(&path, config).unwrap();
    let s = Sluice::spawn(&["run", "-c", path.to_str().unwrap()], TempDir::new());
    let verified = trusting(pebble.root().await);
    for _ in 0..2 {
        let (der, body) = fetch(tls, verified.clone(), "shop.ok.test")
            .await
            .unwrap_or_else(|e| panic!("shop.ok.test does not verify: {e}\n{}", s.logs()));
        assert!(!is_placeholder(&der));
        assert_eq!(body, "hello\n");
    }
    for _ in 0..2 {
        let r = fetch(tls, verified.clone(), "evil.no.test").await;
        assert!(r.is_err(), "a refused name gets no certificate");
    }
    let asked = asked.lock().unwrap().clone();
    assert_eq!(
        asked,
        ["shop.ok.test", "evil.no.test"],
        "each name asked about once"
    );
    let status: serde_json::Value =
        serde_json::from_str(&get(s.admin(), "/status").await.text()).unwrap();
    assert_eq!(
        status["acme"]["certificates"][0]["names"],
        serde_json::json!(["shop.ok.test"])
    );

    // At most ten new names a minute: nine more now, the tenth refused.
    for i in 1..=10 {
        let name = format!("n{i}.ok.test");
        let r = fetch(tls, verified.clone(), &name).await;
        assert_eq!(r.is_ok(), i < 10, "{name}: {:?}\n{}", r.err(), s.logs());
    }
    s.wait_log("on_demand: 10 new names in the last minute; n10.ok.test waits");

    // An `ask` that cannot be reached refuses the handshake.
    drop(ask);
    assert!(fetch(tls, verified.clone(), "late.ok.test").await.is_err());
    s.wait_log("late.ok.test refused for this handshake");
}

/// dns-01 through a real BIND (DESIGN §18.8): a site for `app.example.test` and
/// `*.app.example.test` gets one certificate from pebble, which validated the wildcard
/// by reading the TXT records sluice put on BIND with TSIG-signed updates (two values
/// under one name, for the name and its wildcard); they are gone afterwards. Before
/// that, a key BIND does not know is refused, and the log says why.
#[tokio::test]
async fn a_wildcard_certificate_is_issued_over_dns01_through_bind() {
    let Some(bind) = Bind::start("example.test", "app IN A 127.0.0.1") else {
        return;
    };
    let (http, tls) = (free_port(), free_port());
    let Some(pebble) =
        Pebble::start_with_dns(http, tls, Duration::from_secs(3600), Some(bind.addr))
    else {
        return;
    };
    let conf = TempDir::new();
    let site =
        "site app.example.test *.app.example.test {\n    tls auto\n    respond \"wild\\n\"\n}\n";
    let start = |key: &std::path::Path, data: &TempDir, challenge: &str| {
        let mut setup = Setup::on(&pebble, (http, tls), data.0.to_str().unwrap(), challenge);
        setup.more = format!(
            "dns_update {} {{ zone example.test; key_file {} }}",
            bind.addr,
            key.display()
        );
        let path = conf.write("sluice.conf", &format!("{}{site}", setup.head()));
        Sluice::spawn(&["run", "-c", path.to_str().unwrap()], TempDir::new())
    };
    // A key of the right name and the wrong secret: BIND refuses the update.
    let wrong = conf.write(
        "wrong.key",
        "key \"sluice-acme\" { algorithm hmac-sha256; secret \"c2x1aWNlLXdyb25nLXNlY3JldC0zMi1ieXRlcy0hIQ==\"; };\n",
    );
    let refused = start(&wrong, &TempDir::new(), "tls-alpn-01");
    refused.wait_log("the server does not accept the key");
    drop(refused);

    // dns_update alone: both names by DNS, two values under one name, each taken down.
    let data = TempDir::new();
    let s = start(&bind.key_file, &data, "");
    s.wait_log("acme: certificate for app.example.test, *.app.example.test issued");
    let verified = trusting(pebble.root().await);
    for host in [
        "app.example.test",
        "x.app.example.test",
        "www.app.example.test",
    ] {
        let (der, body) = fetch(tls, verified.clone(), host)
            .await
            .unwrap_or_else(|e| panic!("{host} does not verify: {e}"));
        assert!(!is_placeholder(&der));
        assert_eq!(body, "wild\n", "{host}");
    }
    let log = bind.log();
    for done in [
        "adding an RR at '_acme-challenge.app.example.test' TXT",
        "deleting an RR at _acme-challenge.app.example.test TXT",
    ] {
        assert_eq!(
            log.matches(done).count(),
            2,
            "BIND did not log {done:?} twice:\n{log}"
        );
    }
    assert_eq!(
        bind.txt("_acme-challenge.app.example.test"),
        Vec::<String>::new()
    );
    // Stored under a name no shell globs.
    let scope = pebble
        .directory
        .trim_start_matches("https://")
        .replace([':', '/'], "_");
    let stored = data.0.join(format!(
        "certificates/{scope}/wildcard_.app.example.test/cert.pem"
    ));
    assert!(stored.exists(), "{}", stored.display());
}
