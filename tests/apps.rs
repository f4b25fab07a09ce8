//! Real applications and clients behind sluice, nobody on the project wrote any of them:
//! a Go `net/http` server and client (standard library only, built here from
//! `tests/interop/gohttp`). Each test skips with a printed reason when its program is
//! missing, and fails instead under `SLUICE_INTEROP=require` (`.ci/run` installs them).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use common::pki::Ca;
use common::*;
use serde_json::Value;

/// The Go program, built once per test binary (`None`, after saying why, when Go is
/// missing).
fn gohttp() -> Option<&'static Path> {
    static BUILT: OnceLock<Option<PathBuf>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            if Command::new("go").arg("version").output().is_err() {
                missing("go (.ci/run installs golang-go)");
                return None;
            }
            let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("gohttp");
            std::fs::create_dir_all(&dir).unwrap();
            let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/gohttp/main.go");
            std::fs::copy(src, dir.join("main.go")).unwrap();
            std::fs::write(dir.join("go.mod"), "module gohttp\n\ngo 1.19\n").unwrap();
            let out = Command::new("go")
                .args(["build", "-o", "gohttp", "."])
                .current_dir(&dir)
                .env("GOCACHE", dir.join("cache"))
                .env("GOPATH", dir.join("path"))
                .env("GOFLAGS", "-mod=mod")
                .env("GO111MODULE", "on")
                .output()
                .expect("go runs");
            assert!(
                out.status.success(),
                "go build failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            Some(dir.join("gohttp"))
        })
        .as_deref()
}

/// A program that prints `port N` first, then serves until it is stopped.
struct Served {
    port: u16,
    _group: Group,
}

fn serve(mut cmd: Command) -> Served {
    cmd.stdout(Stdio::piped()).stdin(Stdio::null());
    let mut group = Group::spawn(cmd).expect("the program starts");
    let port = said_port(&mut group);
    Served {
        port,
        _group: group,
    }
}

fn go_call(bin: &Path, url: &str, case: &str, ca: Option<&Path>) -> Value {
    let mut cmd = Command::new("timeout");
    cmd.arg("30").arg(bin).args(["call", url, case]);
    if let Some(ca) = ca {
        cmd.arg("--ca").arg(ca);
    }
    let out = cmd.output().expect("the Go client runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut v: Value = serde_json::from_str(text.trim()).unwrap_or_else(|_| {
        panic!(
            "{case} via {url}: no answer: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    v["case"] = format!("{case} via {url}").into();
    v
}

use common::pebble::free_port;

/// Go's client through sluice's plain (HTTP/1.1) and TLS (HTTP/2) fronts to Go's
/// server over HTTP/1.1 and over TLS (HTTP/2): trailers both ways, with the response
/// compressed (Go's client asks for gzip by default), and `Expect: 100-continue`.
/// nginx drops the request's trailers and answers its client without the response's
/// (it passes trailers only with `grpc_pass`).
#[test]
fn go_net_http_trailers_and_continue_through_every_front_and_backend() {
    let Some(bin) = gohttp() else {
        return;
    };
    let dir = TempDir::new();
    let ca = Ca::new();
    let front = ca.leaf(&["app.test"]);
    let backend = ca.leaf(&["backend.test"]);
    let ca_file = dir.write("ca.pem", &ca.pem());
    let (fc, fk) = (
        dir.write("front.pem", &front.cert_pem),
        dir.write("front.key", &front.key_pem),
    );
    let (bc, bk) = (
        dir.write("backend.pem", &backend.cert_pem),
        dir.write("backend.key", &backend.key_pem),
    );
    let plain = serve({
        let mut c = Command::new(bin);
        c.arg("serve");
        c
    });
    let secure = serve({
        let mut c = Command::new(bin);
        c.arg("serve").arg("--tls").arg(&bc).arg(&bk);
        c
    });
    let backends = [
        ("HTTP/1.1", format!("proxy http://127.0.0.1:{}", plain.port)),
        (
            "HTTP/2 over TLS",
            format!(
                "proxy https://127.0.0.1:{} {{ tls_ca {}; tls_server_name backend.test }}",
                secure.port,
                ca_file.display()
            ),
        ),
    ];
    for (what, proxy) in &backends {
        let (a, b) = (free_port(), free_port());
        let _s = Sluice::start(&format!(
            "listen 127.0.0.1:{a}\nlisten 127.0.0.1:{b} tls\n\
             site app.test {{ tls {} {}; {proxy} }}\nsite * {{ {proxy} }}",
            fc.display(),
            fk.display()
        ));
        let fronts = [
            (format!("http://127.0.0.1:{a}"), None, "HTTP/1.1"),
            (
                format!("https://127.0.0.1:{b}"),
                Some(ca_file.as_path()),
                "HTTP/2.0",
            ),
        ];
        for (url, ca, proto) in &fronts {
            let v = go_call(bin, url, "trailers", *ca);
            assert_eq!(v["status"], 200, "{what}: {v}");
            assert_eq!(v["proto"], *proto, "{what}: {v}");
            assert_eq!(v["body_len"], 6000, "{what}: {v}");
            assert_eq!(v["uncompressed"], true, "{what}: sluice compressed it: {v}");
            assert_eq!(
                v["got_in_head"], "sent-by-go",
                "{what}: the request's trailer reached the backend: {v}"
            );
            let t = &v["trailers"];
            assert_eq!(t["X-Sum"], v["sent_sum"], "{what}: response trailers: {v}");
            assert_eq!(t["X-Got"], "sent-by-go", "{what}: {v}");
            assert!(t["X-Proto"].is_string(), "{what}: {v}");

            let v = go_call(bin, url, "continue", *ca);
            assert_eq!(v["status"], 200, "{what}: {v}");
            assert!(
                v["body"].as_str().unwrap().starts_with("1048576 bytes"),
                "{what}: {v}"
            );

            // 103 Early Hints reach the client before the answer, over HTTP/1.1 and
            // HTTP/2 alike. nginx 1.22 (Debian's) drops a backend's 103; 1.29 added
            // `early_hints` to pass it.
            let v = go_call(bin, url, "early", *ca);
            assert_eq!(v["status"], 200, "{what}: {v}");
            assert_eq!(v["body"], "final", "{what}: {v}");
            assert_eq!(
                v["interim"].as_array().unwrap(),
                &[Value::from("103 </style.css>; rel=preload; as=style")],
                "{what} over {proto}: {v}"
            );
        }
    }
}

/// `uvicorn` or `gunicorn` from the venv `.ci/run` makes (`None`, after saying why,
/// when it is missing).
fn venv_program(name: &str) -> Option<PathBuf> {
    let p = Path::new(INTEROP_VENV).join(name);
    if p.is_file() {
        return Some(p);
    }
    missing(&format!("{name} in {INTEROP_VENV} (.ci/run installs it)"));
    None
}

/// A Python server on `port`, once it accepts connections; stopped when dropped.
fn python_server(mut cmd: Command, port: u16) -> Group {
    cmd.current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let group = Group::spawn(cmd).expect("the server starts");
    let end = std::time::Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            std::time::Instant::now() < end,
            "the server on {port} never listened"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    group
}

/// uvicorn serving a starlette app: its event stream arrives live through sluice, each
/// event as it is sent (not when the stream ends), and its WebSocket echoes. nginx
/// needs `proxy_buffering off` (or `X-Accel-Buffering: no`) for the first.
#[tokio::test]
async fn uvicorn_sse_live_and_a_websocket_through_sluice() {
    let Some(uvicorn) = venv_program("uvicorn") else {
        return;
    };
    let port = free_port();
    let mut cmd = Command::new(uvicorn);
    cmd.args([
        "asgi_app:app",
        "--host",
        "127.0.0.1",
        "--log-level",
        "warning",
    ])
    .args(["--port", &port.to_string()]);
    let _app = python_server(cmd, port);
    let s = Sluice::start(&format!("site * {{ proxy 127.0.0.1:{port} }}"));

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut c = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let started = std::time::Instant::now();
    c.write_all(b"GET /events HTTP/1.1\r\nhost: app.test\r\naccept: text/event-stream\r\n\r\n")
        .await
        .unwrap();
    let (mut got, mut first, mut buf) = (String::new(), None, [0u8; 4096]);
    while !got.contains("event 4") {
        let n = tokio::time::timeout(Duration::from_secs(10), c.read(&mut buf))
            .await
            .expect("events keep coming")
            .unwrap();
        assert!(n > 0, "{got}");
        got.push_str(&String::from_utf8_lossy(&buf[..n]));
        if first.is_none() && got.contains("event 0") {
            first = Some(started.elapsed());
        }
    }
    let last = started.elapsed();
    let first = first.unwrap();
    assert!(got.contains("text/event-stream"), "{got}");
    // Five events 200 ms apart: the first must not wait for the last.
    assert!(
        last - first >= Duration::from_millis(600),
        "first at {first:?}, last at {last:?}: buffered, not live"
    );

    use futures_util::{SinkExt, StreamExt};
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{}/ws", s.addr))
        .await
        .expect("the WebSocket opens through sluice");
    for text in ["hello", "again"] {
        ws.send(tokio_tungstenite::tungstenite::Message::text(text))
            .await
            .unwrap();
        let back = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(back.into_text().unwrap().as_str(), format!("echo: {text}"));
    }
}

/// gunicorn serving a Flask app: a 50 MiB upload arrives whole (checked by its hash)
/// over HTTP/1.1 and HTTP/2, its redirect passes as written, and an HTTP/2 client's
/// cookie crumbs reach it as one `Cookie` field (RFC 9113 §8.2.3), which Flask reads.
/// nginx does the same with `client_max_body_size 64m` (its default 1 MiB answers
/// 413), and joins the crumbs as well.
#[tokio::test]
async fn gunicorn_flask_upload_redirect_and_cookies_through_sluice() {
    let Some(gunicorn) = venv_program("gunicorn") else {
        return;
    };
    let port = free_port();
    let mut cmd = Command::new(gunicorn);
    cmd.args([
        "-w",
        "2",
        "-b",
        &format!("127.0.0.1:{port}"),
        "wsgi_app:app",
    ]);
    let _app = python_server(cmd, port);
    let s = Sluice::start(&format!(
        "site * {{ proxy 127.0.0.1:{port} {{ max_body 64M; timeout 60s }} }}"
    ));
    let upload: Vec<u8> = (0..50u32 << 20).map(|i| (i % 251) as u8).collect();
    let want = format!("{} {}", upload.len(), sha256_hex(&upload));
    let r = request(s.addr, "POST", "/upload", &[], &upload).await;
    assert_eq!((r.status, r.text()), (200, want.clone()), "over HTTP/1.1");

    use http_body_util::BodyExt;
    let (mut send, _conn) = h2c::<Body>(s.addr).await;
    let req = hyper::Request::post("http://app.test/upload")
        .body(full(upload))
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    let text = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(String::from_utf8_lossy(&text), want, "over HTTP/2");

    let r = get(s.addr, "/old").await;
    assert_eq!(r.status, 301);
    assert_eq!(r.header("location"), Some("/new?x=1"));

    let req = hyper::Request::get("http://app.test/cookies")
        .header("cookie", "a=1")
        .header("cookie", "b=2")
        .body(full(""))
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    let text = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        String::from_utf8_lossy(&text),
        "cookie=a=1; b=2; parsed=a:1,b:2"
    );
}

/// SHA-256 in hex, for the upload check (`ring`: a dependency of sluice itself).
fn sha256_hex(data: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, data);
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}
