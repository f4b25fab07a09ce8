//! Real applications and clients behind sluice, nobody on the project wrote any of them:
//! a Go `net/http` server and client (standard library only, built here from
//! `tests/interop/gohttp`). Each test skips with a printed reason when its program is
//! missing, and fails instead under `SLUICE_INTEROP=require` (`.ci/run` installs them).

mod common;

use std::io::{BufRead, BufReader};
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
                if require_interop() {
                    panic!("go is required (SLUICE_INTEROP=require); .ci/run installs golang-go");
                }
                eprintln!("skipping: go is not installed (.ci/run installs golang-go)");
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
    let stdout = group.0.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the program says its port");
    let port = line
        .trim()
        .strip_prefix("port ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("the program said {line:?}"));
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

/// A loopback port free now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

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

            // 103 Early Hints reach an HTTP/1.1 client before the answer. hyper's HTTP/2
            // server cannot send a 1xx, so an HTTP/2 client gets the answer alone
            // (docs/config.md says so). nginx drops a backend's 103 on every front.
            let v = go_call(bin, url, "early", *ca);
            assert_eq!(v["status"], 200, "{what}: {v}");
            assert_eq!(v["body"], "final", "{what}: {v}");
            let interim = v["interim"].as_array().unwrap();
            if *proto == "HTTP/1.1" {
                assert_eq!(
                    interim,
                    &[Value::from("103 </style.css>; rel=preload; as=style")],
                    "{what}: {v}"
                );
            } else {
                assert!(interim.is_empty(), "{what}: {v}");
            }
        }
    }
}
