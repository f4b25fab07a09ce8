//! Interop with real programs: curl as the client (HTTP/1.1, h2c, and HTTP/2 and
//! HTTP/1.1 over TLS), nginx as a backend, h2load for concurrent h2c streams and 20,000
//! requests over TLS, `openssl s_client` reading the handshake, headless Chromium for
//! the dashboard, Python's `aioquic` as an HTTP/3 client. Each test skips with a
//! printed reason when its program is missing, and fails instead under
//! `SLUICE_INTEROP=require` (CI).

mod common;

use std::net::TcpListener as StdListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn curl(args: &[&str]) -> (i32, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10"])
        .args(args)
        .output()
        .expect("curl runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
    )
}

#[test]
fn curl_through_the_demo_pool_alternates_backends() {
    if program("curl").is_none() {
        return;
    }
    let s = Sluice::spawn(
        &["demo", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"],
        TempDir::new(),
    );
    let mut backends = Vec::new();
    for _ in 0..4 {
        let (code, body) = curl(&[&s.url("/hello")]);
        assert_eq!(code, 0);
        assert!(body.contains("You asked for GET /hello"), "{body}");
        backends.push(
            body.split_whitespace()
                .nth(4)
                .unwrap_or_default()
                .to_string(),
        );
    }
    assert_eq!(
        backends,
        ["A", "B", "A", "B"],
        "round robin over the two demo backends"
    );
    let (code, body) = curl(&["--http2-prior-knowledge", &s.url("/h2")]);
    assert_eq!(code, 0);
    assert!(
        body.contains("You asked for GET /h2"),
        "h2c through the demo: {body}"
    );
    // The dashboard's demo switch: backend A stopped, B serves every request (A's
    // failures are retried on B and take it out of rotation), and `/status` says so.
    let admin = format!("http://{}", s.admin());
    let stop = r#"{"backend": "A", "up": false}"#;
    let (code, body) = curl(&[
        "-H",
        "Content-Type: application/json",
        "-d",
        stop,
        &format!("{admin}/demo"),
    ]);
    assert_eq!(code, 0);
    assert!(body.contains("\"up\":false"), "{body}");
    for _ in 0..6 {
        let (code, body) = curl(&[&s.url("/after")]);
        assert_eq!(code, 0);
        assert!(body.contains("Hello from demo backend B"), "{body}");
    }
    let (_, status) = curl(&[&format!("{admin}/status")]);
    let v: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(v["demo"][0]["backend"], "A");
    assert_eq!(v["demo"][0]["up"], false);
    assert_eq!(v["demo"][1]["up"], true);
    let (_, body) = curl(&[
        "-H",
        "Content-Type: application/json",
        "-d",
        r#"{"backend": "Z", "up": true}"#,
        &format!("{admin}/demo"),
    ]);
    assert!(body.contains("no such demo backend"), "{body}");
    // The dashboard shows the switch (headless Chromium, when there is one).
    if let Some(chromium) = program("chromium") {
        let dir = TempDir::new();
        // Killed after 90 s of real time: a stuck browser never hangs the run.
        let out = Command::new("timeout")
            .arg("90")
            .arg(chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--virtual-time-budget=2000",
            ])
            .arg(format!(
                "--user-data-dir={}",
                dir.0.join("profile").display()
            ))
            .args(["--dump-dom", &format!("{admin}/")])
            .output()
            .expect("chromium runs");
        let dom = String::from_utf8_lossy(&out.stdout);
        assert!(dom.contains("Demo backends"), "{dom}");
        assert!(
            dom.contains("data-backend=\"A\" data-up=\"true\">start</button>"),
            "{dom}"
        );
    }
}

struct Nginx {
    child: Child,
    addr: std::net::SocketAddr,
    _dir: TempDir,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_nginx(bin: PathBuf) -> Nginx {
    let dir = TempDir::new();
    let port = StdListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let p = dir.0.display();
    let conf = format!(
        "daemon off; master_process off; worker_processes 1; pid {p}/nginx.pid; error_log stderr warn;
         events {{ worker_connections 256; }}
         http {{
           access_log off;
           client_body_temp_path {p}/body; proxy_temp_path {p}/proxy; fastcgi_temp_path {p}/fcgi;
           uwsgi_temp_path {p}/uwsgi; scgi_temp_path {p}/scgi;
           server {{
             listen 127.0.0.1:{port};
             location = /echo-length {{ return 200 \"length=$http_content_length te=$http_transfer_encoding xff=$http_x_forwarded_for\"; }}
             location / {{ return 200 \"nginx says hi\"; }}
           }}
         }}"
    );
    let path = dir.write("nginx.conf", &conf);
    let child = Command::new(bin)
        .args(["-p", &p.to_string(), "-c", path.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("nginx starts");
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let end = Instant::now() + WAIT;
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < end, "nginx did not start listening");
        std::thread::sleep(Duration::from_millis(50));
    }
    Nginx {
        child,
        addr,
        _dir: dir,
    }
}

#[test]
fn nginx_as_a_backend() {
    let (Some(nginx), Some(_)) = (program("nginx"), program("curl")) else {
        return;
    };
    let n = start_nginx(nginx);
    let s = Sluice::start(&format!("site * {{ proxy {} }}", n.addr));
    let (code, body) = curl(&[&s.url("/")]);
    assert_eq!((code, body.as_str()), (0, "nginx says hi"));
    let (code, body) = curl(&["--data-binary", "hello nginx", &s.url("/echo-length")]);
    assert_eq!(code, 0);
    assert_eq!(body, "length=11 te= xff=127.0.0.1");
    let (code, body) = curl(&[
        "-H",
        "Transfer-Encoding: chunked",
        "--data-binary",
        "chunked body",
        &s.url("/echo-length"),
    ]);
    assert_eq!(code, 0);
    assert!(
        body.contains("te=chunked"),
        "a chunked upload reaches nginx chunked: {body}"
    );
    for _ in 0..20 {
        assert_eq!(curl(&[&s.url("/")]).1, "nginx says hi");
    }
}

#[test]
fn h2load_runs_concurrent_h2c_streams() {
    let Some(h2load) = program("h2load") else {
        return;
    };
    let b = tokio::runtime::Runtime::new().unwrap();
    let backend = b.block_on(Backend::text("ok"));
    let s = Sluice::start(&format!("site * {{ proxy {} }}", backend.addr));
    let out = Command::new(h2load)
        .args(["-n", "2000", "-c", "4", "-m", "8", &s.url("/")])
        .output()
        .expect("h2load runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("2000 succeeded, 0 failed, 0 errored"),
        "every stream succeeded:\n{text}"
    );
    assert!(text.contains("status codes: 2000 2xx"), "{text}");
}

/// The dashboard in headless Chromium at a desktop and a phone width (screenshots kept
/// in the test's folder): the build, uptime and last reload; per route traffic with its
/// status split and p50/p99; each pool's peers with state, reason and time in state; a
/// FastCGI pool; the certificate and its expiry; on a phone, nothing wider than the
/// screen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_renders_in_a_real_browser() {
    let Some(chromium) = program("chromium") else {
        return;
    };
    let live = Backend::text("up").await;
    let dead = dead_addr().await;
    let ca = common::pki::Ca::new();
    let leaf = ca.leaf(&["shop.test"]);
    let files = TempDir::new();
    let cert = files.write("shop.pem", &leaf.cert_pem);
    let key = files.write("shop.key", &leaf.key_pem);
    let tls_port = StdListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let s = Sluice::start(&format!(
        "global {{ admin 127.0.0.1:0; acme {{ directory https://{dead}/dir }} }}
         listen 127.0.0.1:0
         listen 127.0.0.1:{tls_port} tls
         site shop.test {{
             tls {cert} {key}
             route /api/* {{ proxy {live} }}
             route /cached/* {{ cache {{ store memory 1M }}
                 proxy {live} }}
             route /php/* {{ fastcgi {dead} {{ root {root} }} }}
             proxy {dead} {live} {{ lb first }}
         }}
         site auto.test {{ tls auto; respond ok }}",
        live = live.addr,
        cert = cert.display(),
        key = key.display(),
        root = files.0.display(),
    ));
    let admin = s.admin();
    // The first peer of the site's pool is down: one request takes it out of rotation.
    assert_eq!(get_host(s.addr, "shop.test", "/").await.text(), "up");
    for _ in 0..20 {
        assert_eq!(get_host(s.addr, "shop.test", "/api/x").await.status, 200);
    }
    assert_eq!(
        get_host(s.addr, "shop.test", "/php/x.php").await.status,
        404
    );
    for _ in 0..3 {
        assert_eq!(get_host(s.addr, "shop.test", "/cached/x").await.status, 200);
    }
    // The ACME server is down: the certificate's order has failed once.
    s.wait_log("acme: ordering");
    let on = br#"{"site": "shop.test", "on": true}"#;
    let r = request(
        admin,
        "POST",
        "/maintenance",
        &[("Content-Type", "application/json")],
        on,
    )
    .await;
    assert_eq!(r.status, 200);
    let dir = TempDir::new();
    let url = format!("http://{admin}/");
    let run = |size: &str, extra: &[&str]| {
        let out = Command::new("timeout")
            .arg("90")
            .arg(&chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                &format!("--window-size={size}"),
                "--virtual-time-budget=3000",
                &format!("--user-data-dir={}", dir.0.join("profile").display()),
            ])
            .args(extra)
            .arg(&url)
            .output()
            .expect("chromium runs");
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    for (width, size) in [(1280, "1280,900"), (390, "390,844")] {
        // The DOM after the page's script fetched /status (the runtime's other worker
        // keeps sluice's backends answering while this one waits for the browser).
        let dom = run(size, &["--dump-dom"]);
        let shot = dir.0.join(format!("dashboard-{width}.png"));
        run(size, &[&format!("--screenshot={}", shot.display())]);
        let bytes = std::fs::metadata(&shot).map(|m| m.len()).unwrap_or(0);
        assert!(
            bytes > 1000,
            "a {width} px screenshot was taken ({bytes} bytes)"
        );
        // SLUICE_KEEP_SHOTS=DIR keeps a copy to look at.
        if let Some(keep) = std::env::var_os("SLUICE_KEEP_SHOTS") {
            let _ = std::fs::copy(
                &shot,
                PathBuf::from(keep).join(format!("dashboard-{width}.png")),
            );
        }
        for (what, needle) in [
            ("the build", format!("sluice {}", env!("CARGO_PKG_VERSION"))),
            ("uptime", "<span>up ".to_string()),
            ("the last reload", "no reload yet".to_string()),
            ("the route's pool", "shop.test /api/*".to_string()),
            (
                "the site's own route",
                "data-l=\"route\">/*</td>".to_string(),
            ),
            ("a rate", "data-l=\"req/s\"".to_string()),
            ("the status split", "2xx 100%".to_string()),
            ("a latency", "data-l=\"p99\" class=\"n\">".to_string()),
            (
                "the down peer",
                format!("{dead}</td><td data-l=\"state\"><span class=\"out\">out</span>"),
            ),
            ("why it is down", "failed requests in a row".to_string()),
            ("the FastCGI pool", "FastCGI pools".to_string()),
            ("the certificate", "Certificates".to_string()),
            ("its expiry", "data-l=\"in\" class=\"ok\">".to_string()),
            ("maintenance", "shop.test (maintenance)".to_string()),
            (
                "4xx by code",
                "<span class=\"warn\">404</span> ×1".to_string(),
            ),
            ("the cache store", "memory 1048576".to_string()),
            (
                "a cache route's hit ratio",
                "data-l=\"hit ratio\"".to_string(),
            ),
            ("the ACME panel", "ACME certificates".to_string()),
            (
                "the failing order",
                "<span class=\"bad\">failing</span>".to_string(),
            ),
        ] {
            assert!(
                dom.contains(&needle),
                "at {width} px the page shows {what} ({needle}):\n{dom}"
            );
        }
        assert!(
            dom.contains("data-overflow=\"no\""),
            "at {width} px nothing is wider than the window:\n{dom}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_decompresses_what_sluice_compressed() {
    if program("curl").is_none() {
        return;
    }
    let text: String = (0..2000).map(|i| format!("line {i}\n")).collect();
    let t = text.clone();
    let b = Backend::start(move |_req: hyper::Request<hyper::body::Incoming>| {
        let t = t.clone();
        async move {
            let mut r = hyper::Response::new(full(t));
            r.headers_mut()
                .insert("content-type", "text/plain".parse().unwrap());
            r
        }
    })
    .await;
    let s = Sluice::start(&format!("site * {{ proxy {} }}", b.addr));
    let url = s.url("/big");
    for (flags, coding) in [
        (vec!["--compressed"], None),
        (
            vec!["--compressed", "-H", "Accept-Encoding: gzip"],
            Some("gzip"),
        ),
    ] {
        let url = url.clone();
        let out = tokio::task::spawn_blocking(move || {
            let mut args = vec!["-sS", "--max-time", "10", "-D", "-"];
            args.extend(flags.iter().copied());
            args.push(&url);
            Command::new("curl")
                .args(&args)
                .output()
                .expect("curl runs")
        })
        .await
        .unwrap();
        let all = String::from_utf8_lossy(&out.stdout).to_string();
        let (head, body) = all.split_once("\r\n\r\n").expect("a head");
        let head = head.to_ascii_lowercase();
        let used = head
            .lines()
            .find_map(|l| l.strip_prefix("content-encoding: "))
            .unwrap_or("none")
            .to_string();
        assert!(
            ["zstd", "br", "gzip"].contains(&used.as_str()),
            "compressed: {head}"
        );
        if let Some(c) = coding {
            assert_eq!(used, c, "{head}");
        }
        assert_eq!(body, text, "curl decoded {used} back to the original");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_websockets_client_through_sluice() {
    // Debian's python3-websockets is for the system interpreter.
    let python = "/usr/bin/python3";
    let ok = Command::new(python)
        .args(["-c", "import websockets"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        if require_interop() {
            panic!("python3-websockets is required (SLUICE_INTEROP=require) but not installed");
        }
        eprintln!("skipping: python3-websockets is not installed");
        return;
    }
    let b = ws_echo_backend().await;
    let s = Sluice::start(&format!("site * {{ proxy {b} }}"));
    let script = r#"
import asyncio, sys, websockets
async def main(url):
    async with websockets.connect(url) as ws:
        await ws.send("hello from python")
        print(await ws.recv())
        await ws.send(bytes(range(256)) * 4096)
        data = await ws.recv()
        print(len(data), data == bytes(range(256)) * 4096)
asyncio.run(main(sys.argv[1]))
"#;
    let url = format!("ws://{}/py", s.addr);
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .args(["-c", script, &url])
            .output()
            .expect("python runs")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout, "hello from python\n1048576 True\n");
}

/// A TLS site on a fresh port with a certificate for `tls.test` signed by a test CA:
/// (sluice, the CA's file, the leaf's DER, the folder holding them).
fn tls_site(backend: std::net::SocketAddr) -> (Sluice, PathBuf, Vec<u8>, TempDir) {
    let ca = common::pki::Ca::new();
    let dir = TempDir::new();
    let leaf = ca.leaf(&["tls.test"]);
    let cert = dir.write("tls.pem", &leaf.cert_pem);
    let key = dir.write("tls.key", &leaf.key_pem);
    let ca_file = dir.write("ca.pem", &ca.pem());
    let s = Sluice::start(&format!(
        "listen 127.0.0.1:0 tls\nsite tls.test {{ tls {} {}; proxy {backend} }}",
        cert.display(),
        key.display()
    ));
    (s, ca_file, leaf.der, dir)
}

#[test]
fn curl_speaks_http2_over_tls_to_sluice() {
    if program("curl").is_none() {
        return;
    }
    let b = tokio::runtime::Runtime::new().unwrap();
    let backend = b.block_on(Backend::echo_head());
    let (s, ca, _, _dir) = tls_site(backend.addr);
    let resolve = format!("tls.test:{}:127.0.0.1", s.addr.port());
    let url = format!("https://tls.test:{}/over-tls", s.addr.port());
    let ca = ca.display().to_string();
    for (flag, version) in [("--http2", "2"), ("--http1.1", "1.1")] {
        let (code, out) = curl(&[
            flag,
            "--cacert",
            &ca,
            "--resolve",
            &resolve,
            "-w",
            "\n%{http_version}",
            &url,
        ]);
        assert_eq!(code, 0, "{flag}: {out}");
        assert!(out.starts_with("GET /over-tls"), "{flag}: {out}");
        assert!(out.contains("x-forwarded-proto: https"), "{flag}: {out}");
        assert!(out.ends_with(&format!("\n{version}")), "{flag}: {out}");
    }
}

#[test]
fn h2load_20000_requests_over_tls() {
    let Some(h2load) = program("h2load") else {
        return;
    };
    let b = tokio::runtime::Runtime::new().unwrap();
    let backend = b.block_on(Backend::text("ok"));
    let (s, _, _, _dir) = tls_site(backend.addr);
    let out = Command::new(h2load)
        .args([
            "-n",
            "20000",
            "-c",
            "8",
            "-m",
            "16",
            // The URL's host is the SNI; the connection goes to sluice's address.
            &format!("--connect-to=127.0.0.1:{}", s.addr.port()),
            &format!("https://tls.test:{}/", s.addr.port()),
        ])
        .output()
        .expect("h2load runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("20000 succeeded, 0 failed, 0 errored"),
        "every request succeeded:\n{text}"
    );
    assert!(text.contains("Application protocol: h2"), "{text}");
}

#[test]
fn openssl_s_client_sees_tls13_and_the_site_certificate() {
    let Some(openssl) = program("openssl") else {
        return;
    };
    let b = tokio::runtime::Runtime::new().unwrap();
    let backend = b.block_on(Backend::text("ok"));
    let (s, ca, der, dir) = tls_site(backend.addr);
    let served = dir.0.join("served.pem");
    let mut child = Command::new(&openssl)
        .args([
            "s_client",
            "-connect",
            &s.addr.to_string(),
            "-servername",
            "tls.test",
            "-CAfile",
            ca.to_str().unwrap(),
            "-alpn",
            "h2,http/1.1",
            "-verify_return_error",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("openssl runs");
    drop(child.stdin.take());
    let deadline = Instant::now() + WAIT;
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "openssl s_client did not finish");
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("TLSv1.3"), "{text}");
    assert!(text.contains("ALPN protocol: h2"), "{text}");
    assert!(text.contains("Verify return code: 0 (ok)"), "{text}");
    assert!(
        text.contains("CN=tls.test") || text.contains("CN = tls.test"),
        "{text}"
    );
    // The certificate it printed is the site's, byte for byte.
    let pem: String = text
        .lines()
        .skip_while(|l| !l.starts_with("-----BEGIN CERTIFICATE"))
        .take_while(|l| !l.starts_with("-----END CERTIFICATE"))
        .chain(["-----END CERTIFICATE-----"])
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&served, &pem).unwrap();
    let conv = Command::new(&openssl)
        .args(["x509", "-outform", "DER", "-in", served.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(conv.stdout == der, "s_client saw another certificate");
}

/// Evaluates `expr` in the page behind a DevTools websocket; the value as JSON.
async fn evaluate<S>(ws: &mut S, id: u64, expr: &str) -> serde_json::Value
where
    S: futures_util::Sink<tokio_tungstenite::tungstenite::Message>
        + futures_util::Stream<
            Item = Result<
                tokio_tungstenite::tungstenite::Message,
                tokio_tungstenite::tungstenite::Error,
            >,
        > + Unpin,
    <S as futures_util::Sink<tokio_tungstenite::tungstenite::Message>>::Error: std::fmt::Debug,
{
    use futures_util::{SinkExt, StreamExt};
    let call = serde_json::json!({
        "id": id,
        "method": "Runtime.evaluate",
        "params": {"expression": expr, "returnByValue": true},
    });
    ws.send(tokio_tungstenite::tungstenite::Message::text(
        call.to_string(),
    ))
    .await
    .unwrap();
    loop {
        let msg = tokio::time::timeout(WAIT, ws.next())
            .await
            .expect("DevTools answers")
            .unwrap()
            .unwrap();
        let Ok(text) = msg.to_text() else { continue };
        let v: serde_json::Value = serde_json::from_str(text).unwrap_or_default();
        if v["id"] == id {
            return v["result"]["result"]["value"].clone();
        }
    }
}

/// With an admin token, the dashboard asks for it in the page (a form), keeps it in
/// the page's memory only, and shows the state once it is given — in a real browser,
/// driven over the DevTools protocol.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_asks_for_the_admin_token() {
    let Some(chromium) = program("chromium") else {
        return;
    };
    let live = Backend::text("up").await;
    let dir = TempDir::new();
    dir.write("admin.token", "page-token-42\n");
    let path = dir.write(
        "sluice.conf",
        &format!("listen 127.0.0.1:0\nglobal {{ admin 127.0.0.1:0 {{ token_file admin.token }} }}\nsite shop.test {{ proxy {} }}\n", live.addr),
    );
    let p = path.to_str().unwrap().to_string();
    let profile = dir.0.join("profile");
    let s = Sluice::spawn(&["run", "-c", &p], dir);
    let admin = s.admin();
    let (_browser, mut ws) =
        devtools_page(&chromium, &[], &profile, &format!("http://{admin}/")).await;
    let mut id = 0;
    let mut until = async |ws: &mut _, expr: &str| {
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            id += 1;
            let v = evaluate(ws, id, expr).await;
            if v == true {
                return;
            }
            assert!(Instant::now() < end, "the page never showed: {expr}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    until(&mut ws, "!document.getElementById('login').hidden && document.getElementById('meta').textContent === 'token needed'").await;
    until(&mut ws, "document.getElementById('token').value = 'wrong'; document.getElementById('login').requestSubmit(); true").await;
    until(
        &mut ws,
        "document.getElementById('meta').textContent === 'that token was refused'",
    )
    .await;
    until(&mut ws, "document.getElementById('token').value = 'page-token-42'; document.getElementById('login').requestSubmit(); true").await;
    until(&mut ws, "document.getElementById('meta').textContent.includes('revision 1') && document.getElementById('login').hidden").await;
    // Nowhere but the page's memory: not in the URL, not in storage, not in the field.
    until(&mut ws, "!location.href.includes('page-token') && localStorage.length === 0 && sessionStorage.length === 0 && document.getElementById('token').value === ''").await;
    // The pool's "test primary" button runs an origin test and shows what it found,
    // and the result stays through the page's refreshes.
    until(&mut ws, "document.querySelector('button.test[data-pool=\"shop.test\"][data-role=\"primary\"]').click(); true").await;
    let found = format!("200 from {} in ", live.addr);
    until(
        &mut ws,
        &format!("document.querySelector('.result').textContent.startsWith('{found}')"),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    until(
        &mut ws,
        &format!("document.querySelector('.result').textContent.startsWith('{found}')"),
    )
    .await;
}

/// Where `.ci/run` puts a Python with `aioquic` (from PyPI; Debian does not package
/// it); `SLUICE_AIOQUIC_PYTHON` names another.
const AIOQUIC_PYTHON: &str = "/opt/sluice-aioquic/bin/python3";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aioquic_http3_client_through_sluice() {
    let python = std::env::var("SLUICE_AIOQUIC_PYTHON").unwrap_or(AIOQUIC_PYTHON.into());
    let ok = Command::new(&python)
        .args(["-c", "import aioquic"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        if require_interop() {
            panic!("aioquic is required (SLUICE_INTEROP=require) but {python} cannot import it");
        }
        eprintln!("skipping: no Python with aioquic at {python}");
        return;
    }
    let ca = common::pki::Ca::new();
    let dir = TempDir::new();
    let leaf = ca.leaf(&["h3.test"]);
    let cert = dir.write("h3.pem", &leaf.cert_pem);
    let key = dir.write("h3.key", &leaf.key_pem);
    let ca_file = dir.write("ca.pem", &ca.pem());
    // A backend that reads the upload before it answers (one that answered early and
    // closed would race the POST's last writes: a 502 under load).
    let backend = Backend::echo_head_and_body().await;
    let s = Sluice::start(&format!(
        "listen 127.0.0.1:0 tls quic
         site h3.test {{ tls {} {}; proxy {} }}",
        cert.display(),
        key.display(),
        backend.addr
    ));
    let script = r#"
import asyncio, sys
from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration

class Client(QuicConnectionProtocol):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.h3 = H3Connection(self._quic)
        self.waiting, self.got = {}, {}

    def quic_event_received(self, event):
        for ev in self.h3.handle_event(event):
            r = self.got.setdefault(ev.stream_id, {"status": None, "body": b""})
            if isinstance(ev, HeadersReceived) and r["status"] is None:
                r["status"] = dict(ev.headers)[b":status"].decode()
            elif isinstance(ev, DataReceived):
                r["body"] += ev.data
            if getattr(ev, "stream_ended", False):
                self.waiting.pop(ev.stream_id).set_result(r)

    async def request(self, method, path, body=b""):
        sid = self._quic.get_next_available_stream_id()
        head = [(b":method", method), (b":scheme", b"https"),
                (b":authority", b"h3.test"), (b":path", path)]
        if body:
            head.append((b"content-length", str(len(body)).encode()))
        self.h3.send_headers(sid, head, end_stream=not body)
        if body:
            self.h3.send_data(sid, body, end_stream=True)
        self.waiting[sid] = asyncio.get_running_loop().create_future()
        self.transmit()
        return await asyncio.wait_for(self.waiting[sid], 10)

async def main(port, ca):
    cfg = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, server_name="h3.test")
    cfg.load_verify_locations(ca)
    async with connect("127.0.0.1", int(port), configuration=cfg, create_protocol=Client) as c:
        r = await c.request(b"GET", b"/from-aioquic?x=1")
        print(r["status"], r["body"].decode().splitlines()[0])
        r = await c.request(b"POST", b"/post", b"y" * 100000)
        print(r["status"], "content-length: 100000" in r["body"].decode())
asyncio.run(main(sys.argv[1], sys.argv[2]))
"#;
    let port = s.addr.port().to_string();
    let ca_path = ca_file.display().to_string();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .args(["-c", script, &port, &ca_path])
            .output()
            .expect("python runs")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout, "200 GET /from-aioquic?x=1\n200 True\n");
}

/// Headless Chromium loads a page from sluice over TLS HTTP/2 and over HTTP/3 (QUIC,
/// forced for the origin; the test CA's key allowed by its SPKI hash, as QUIC takes no
/// other exception), and the page's script opens a WebSocket through sluice to an echo
/// backend (over HTTP/2's extended CONNECT, or a TCP connection beside HTTP/3, as
/// Chromium does). The page writes what it saw into its DOM. nginx 1.22 (Debian's) has
/// no HTTP/3, and takes WebSockets over HTTP/1.1 only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_loads_a_page_over_h2_and_h3_with_a_websocket() {
    let Some(chromium) = program("chromium") else {
        return;
    };
    let Some(openssl) = program("openssl") else {
        return;
    };
    let echo = ws_echo_backend().await;
    let ca = common::pki::Ca::new();
    let leaf = ca.leaf(&["browser.test"]);
    let dir = TempDir::new();
    let cert = dir.write("browser.pem", &leaf.cert_pem);
    let key = dir.write("browser.key", &leaf.key_pem);
    dir.write(
        "www/index.html",
        r#"<!doctype html><html><body><pre id="out">pending</pre><script>
const out = document.getElementById('out');
const nav = performance.getEntriesByType('navigation')[0];
const proto = nav ? nav.nextHopProtocol : 'none';
const ws = new WebSocket('wss://' + location.host + '/ws');
ws.onopen = () => ws.send('hello from the page');
ws.onmessage = (m) => { out.textContent = 'proto=' + proto + ' ws=' + m.data; };
ws.onerror = () => { out.textContent = 'proto=' + proto + ' ws=error'; };
</script></body></html>"#,
    );
    let port = StdListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let _s = Sluice::start(&format!(
        "listen 127.0.0.1:{port} tls quic
         site browser.test {{
             tls {cert} {key}
             route /ws {{ proxy {echo} }}
             files {www}
         }}",
        cert = cert.display(),
        key = key.display(),
        www = dir.0.join("www").display(),
    ));
    // The leaf's public key hash, the one exception QUIC in Chromium honours.
    let spki = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{o} x509 -in {c} -pubkey -noout | {o} pkey -pubin -outform der | {o} dgst -sha256 -binary | {o} base64",
            o = openssl.display(),
            c = cert.display()
        ))
        .output()
        .unwrap();
    let spki = String::from_utf8_lossy(&spki.stdout).trim().to_string();
    let url = format!("https://browser.test:{port}/");
    for (want, quic) in [("h2", false), ("h3", true)] {
        let mut args = vec![
            format!("--ignore-certificate-errors-spki-list={spki}"),
            "--host-resolver-rules=MAP browser.test 127.0.0.1".to_string(),
        ];
        if quic {
            args.push("--enable-quic".to_string());
            args.push(format!("--origin-to-force-quic-on=browser.test:{port}"));
        }
        let profile = dir.0.join(format!("profile-{want}"));
        let seen = page_settles(
            &chromium,
            &args,
            &profile,
            &url,
            "document.getElementById('out').textContent",
        )
        .await;
        assert_eq!(
            seen,
            format!("proto={want} ws=hello from the page"),
            "over {want}"
        );
    }
}

/// Headless Chromium (with `args`) showing `url`, and the DevTools socket of that page,
/// once the browser lists it (20 s at most).
async fn devtools_page(
    chromium: &std::path::Path,
    args: &[String],
    profile: &std::path::Path,
    url: &str,
) -> (
    Group,
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
) {
    let port = StdListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut cmd = Command::new(chromium);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        &format!("--remote-debugging-port={port}"),
        &format!("--user-data-dir={}", profile.display()),
    ])
    .args(args)
    .arg(url)
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    let browser = Group::spawn(cmd).expect("chromium starts");
    let deadline = Instant::now() + Duration::from_secs(20);
    let ws_url = loop {
        assert!(Instant::now() < deadline, "chromium never listed the page");
        let (code, out) = curl(&[&format!("http://127.0.0.1:{port}/json/list")]);
        let list: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
        let page = list.as_array().and_then(|l| {
            l.iter().find(|t| {
                t["type"] == "page" && t["url"].as_str().is_some_and(|u| u.starts_with(url))
            })
        });
        if let (0, Some(ws)) = (code, page.and_then(|p| p["webSocketDebuggerUrl"].as_str())) {
            break ws.to_string();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let (ws, _) = tokio_tungstenite::connect_async(ws_url.as_str())
        .await
        .unwrap();
    (browser, ws)
}

/// Opens `url` in headless Chromium (with `args`), driven over DevTools, and reads
/// `expr` in the page until it is no longer `pending` (real time, 20 s at most: a
/// WebSocket does not hold a virtual-time budget): its last value.
async fn page_settles(
    chromium: &std::path::Path,
    args: &[String],
    profile: &std::path::Path,
    url: &str,
    expr: &str,
) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    let (_browser, mut ws) = devtools_page(chromium, args, profile, url).await;
    let mut last = serde_json::Value::Null;
    for id in 1.. {
        last = evaluate(&mut ws, id, expr).await;
        if last.as_str().is_some_and(|v| v != "pending") || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    last.as_str().unwrap_or_default().to_string()
}
