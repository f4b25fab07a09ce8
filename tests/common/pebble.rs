//! A real ACME server for tests: Debian's `pebble`, with `pebble-challtestsrv` as its
//! DNS (every name resolves to 127.0.0.1, no AAAA), validating on the ports the test
//! gives it (sluice's listeners). Its API's certificate comes from a test CA written
//! beside its config, for sluice's `ca_root`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::pki::Ca;
use super::{require_interop, Group, TempDir};

pub struct Pebble {
    pub directory: String,
    /// The PEM file of the CA the ACME API's certificate chains to.
    pub api_ca: PathBuf,
    ca: Ca,
    management: SocketAddr,
    _pebble: Group,
    _dns: Option<Group>,
    _dir: TempDir,
}

/// A free loopback port (bound and released) for a program that must be told its
/// port before it starts. Taken below the kernel's ephemeral range (32768 and up by
/// default), from a sequence of this process's own: a port bound with `:0` and let go
/// can be handed at once to another test's outgoing connection as its local port, and
/// the program's bind then fails (it did, once, under the whole suite).
pub fn free_port() -> u16 {
    fixed_port(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok())
}

fn free_udp_port() -> u16 {
    fixed_port(|p| std::net::UdpSocket::bind(("127.0.0.1", p)).is_ok())
}

fn fixed_port(free: impl Fn(u16) -> bool) -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // Each test process starts at its own place in the span.
    let base = std::process::id() % SPAN;
    for _ in 0..SPAN {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (FIRST + (base + n * 7) % SPAN) as u16;
        if free(port) {
            return port;
        }
    }
    panic!("no free port in {FIRST}..{}", FIRST + SPAN)
}

fn installed(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Waits (bounded) until the DNS server on `port` answers a query: pebble's first
/// validation must not race its start.
fn wait_dns(port: u16) {
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    // A query for `a.test` A: id 1, recursion desired, one question.
    let q = [
        0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, b'a', 4, b't', b'e', b's', b't', 0, 0, 1, 0, 1,
    ];
    let end = Instant::now() + Duration::from_secs(10);
    let mut buf = [0u8; 512];
    loop {
        let _ = s.send_to(&q, ("127.0.0.1", port));
        if matches!(s.recv_from(&mut buf), Ok((n, _)) if n >= 12 && buf[..2] == [0, 1]) {
            return;
        }
        assert!(
            Instant::now() < end,
            "pebble-challtestsrv's DNS did not answer"
        );
    }
}

impl Pebble {
    /// Starts pebble validating HTTP-01 on `http_port` and TLS-ALPN-01 on `tls_port`,
    /// issuing certificates valid for `validity`. `None` (skipped) when pebble is not
    /// installed and interop is not required.
    pub fn start(http_port: u16, tls_port: u16, validity: Duration) -> Option<Pebble> {
        Pebble::start_with_dns(http_port, tls_port, validity, None)
    }

    /// As [`Pebble::start`], resolving through `dns` (a real DNS server the test
    /// runs, for dns-01) instead of `pebble-challtestsrv`.
    pub fn start_with_dns(
        http_port: u16,
        tls_port: u16,
        validity: Duration,
        dns: Option<SocketAddr>,
    ) -> Option<Pebble> {
        if !installed("pebble") || !installed("pebble-challtestsrv") {
            if require_interop() {
                panic!("pebble is required (SLUICE_INTEROP=require): apt-get install pebble");
            }
            eprintln!("skipped: pebble is not installed");
            return None;
        }
        let dir = TempDir::new();
        let ca = Ca::new();
        let leaf = ca.leaf(&["127.0.0.1", "localhost"]);
        let api_ca = dir.write("api-ca.pem", &ca.pem());
        let cert = dir.write("api.pem", &leaf.cert_pem);
        let key = dir.write("api.key", &leaf.key_pem);
        let (api, management) = (free_port(), free_port());
        let config = serde_json::json!({"pebble": {
            "listenAddress": format!("127.0.0.1:{api}"),
            "managementListenAddress": format!("127.0.0.1:{management}"),
            "certificate": cert,
            "privateKey": key,
            "httpPort": http_port,
            "tlsPort": tls_port,
            "ocspResponderURL": "",
            "externalAccountBindingRequired": false,
            "certificateValidityPeriod": validity.as_secs(),
        }});
        let config_file = dir.write("pebble.json", &config.to_string());
        let (dns, dns_group) = match dns {
            Some(server) => (server, None),
            None => {
                let port = free_udp_port();
                let mut dns_cmd = Command::new("pebble-challtestsrv");
                dns_cmd
                    .args(["-dns01", &format!("127.0.0.1:{port}"), "-defaultIPv6", ""])
                    .args(["-http01", "", "-https01", "", "-tlsalpn01", ""])
                    .args(["-management", &format!("127.0.0.1:{}", free_port())])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null());
                let group = Group::spawn(dns_cmd).expect("pebble-challtestsrv starts");
                wait_dns(port);
                (SocketAddr::from(([127, 0, 0, 1], port)), Some(group))
            }
        };
        let mut cmd = Command::new("pebble");
        cmd.args(["-config", config_file.to_str().unwrap()])
            .args(["-dnsserver", &dns.to_string()])
            // No random sleeps, no rejected nonces, every authorization validated.
            .env("PEBBLE_VA_NOSLEEP", "1")
            .env("PEBBLE_WFE_NONCEREJECT", "0")
            .env("PEBBLE_AUTHZREUSE", "0")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let pebble = Group::spawn(cmd).expect("pebble starts");
        let end = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", api)).is_err()
            || std::net::TcpStream::connect(("127.0.0.1", management)).is_err()
        {
            assert!(Instant::now() < end, "pebble did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(Pebble {
            directory: format!("https://127.0.0.1:{api}/dir"),
            api_ca,
            ca,
            management: SocketAddr::from(([127, 0, 0, 1], management)),
            _pebble: pebble,
            _dns: dns_group,
            _dir: dir,
        })
    }

    /// The root pebble issues under (it makes a new one at each start).
    pub async fn root(&self) -> rustls::RootCertStore {
        use rustls::pki_types::pem::PemObject;
        let raw = "GET /roots/0 HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
        let out =
            super::pki::tls_exchange(self.management, &self.ca, "127.0.0.1", raw.as_bytes()).await;
        let text = String::from_utf8_lossy(&out);
        let pem = &text[text.find("-----BEGIN").expect("a PEM root")..];
        let mut roots = rustls::RootCertStore::empty();
        for c in rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes()) {
            roots.add(c.unwrap()).unwrap();
        }
        roots
    }
}
