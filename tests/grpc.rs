//! gRPC through sluice, judged by grpcio on both sides (`tests/interop/grpc_peer.py`,
//! from the venv `.ci/run` makes at `/opt/sluice-interop`): unary, server, client and
//! bidirectional streaming, aborts with custom and `-bin` trailers, a 4 MiB message,
//! deadlines and cancellation, over the h2c and TLS fronts to `h2c://` and `https://`
//! backends. nginx's `grpc_pass` passes every one of these cases. Each test skips with a
//! printed reason when the venv is missing, and fails instead under
//! `SLUICE_INTEROP=require`.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Stdio};
use std::time::Duration;

use common::pki::Ca;
use common::*;
use serde_json::Value;

const PYTHON: &str = "/opt/sluice-interop/bin/python3";

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/grpc_peer.py")
}

/// Whether grpcio is there; `false` (after saying why) when the test should skip.
fn have_grpcio() -> bool {
    let ok = Command::new(PYTHON)
        .args(["-c", "import grpc, grpc_health.v1.health"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        if require_interop() {
            panic!("grpcio in {PYTHON} is required (SLUICE_INTEROP=require); .ci/run installs it");
        }
        eprintln!("skipping: grpcio is not installed in {PYTHON} (.ci/run installs it)");
    }
    ok
}

/// grpcio's server on a free loopback port, plain or TLS; stopped when dropped.
struct GrpcServer {
    port: u16,
    stdin: ChildStdin,
    _group: Group,
}

impl GrpcServer {
    fn start(tls: Option<(&Path, &Path)>) -> GrpcServer {
        let mut cmd = Command::new(PYTHON);
        cmd.arg(script()).arg("serve");
        if let Some((cert, key)) = tls {
            cmd.arg("--tls").arg(cert).arg(key);
        }
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
        let mut group = Group::spawn(cmd).expect("python runs");
        let stdin = group.0.stdin.take().unwrap();
        let stdout = group.0.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the gRPC server starts");
        let port = line
            .trim()
            .strip_prefix("port ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("the gRPC server said {line:?}"));
        GrpcServer {
            port,
            stdin,
            _group: group,
        }
    }

    /// Sets a health service's status: `down NAME` / `up NAME`.
    fn say(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
    }
}

/// How the client reaches sluice: its address, and for TLS the CA file and the name.
#[derive(Clone)]
struct Front {
    target: String,
    tls: Option<(PathBuf, &'static str)>,
}

/// Runs one case of grpcio's client against `front`: its JSON answer.
fn call(front: &Front, case: &str) -> Value {
    let mut cmd = Command::new("timeout");
    cmd.args(["30", PYTHON])
        .arg(script())
        .args(["call", &front.target, case]);
    if let Some((ca, name)) = &front.tls {
        cmd.arg("--tls").arg(ca).arg(name);
    }
    let out = cmd.output().expect("python runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut v: Value = serde_json::from_str(text.trim()).unwrap_or_else(|_| {
        panic!(
            "case {case}: no answer: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    v["case"] = case.into();
    v
}

/// The certificates a TLS front and a TLS backend use, in `dir`.
struct Certs {
    ca: PathBuf,
    front: (PathBuf, PathBuf),
    backend: (PathBuf, PathBuf),
}

fn certs(dir: &TempDir) -> Certs {
    let ca = Ca::new();
    let front = ca.leaf(&["grpc.test"]);
    let backend = ca.leaf(&["backend.test"]);
    Certs {
        ca: dir.write("ca.pem", &ca.pem()),
        front: (
            dir.write("front.pem", &front.cert_pem),
            dir.write("front.key", &front.key_pem),
        ),
        backend: (
            dir.write("backend.pem", &backend.cert_pem),
            dir.write("backend.key", &backend.key_pem),
        ),
    }
}

/// sluice with an h2c listener and a TLS one, every request to `proxy`.
fn sluice(c: &Certs, proxy: &str) -> (Sluice, Front, Front) {
    let [a, b] = [free_port(), free_port()];
    let s = Sluice::start(&format!(
        "listen 127.0.0.1:{a}\nlisten 127.0.0.1:{b} tls\n\
         site grpc.test {{ tls {} {}; {proxy} }}\n\
         site * {{ {proxy} }}",
        c.front.0.display(),
        c.front.1.display(),
    ));
    let plain = Front {
        target: format!("127.0.0.1:{a}"),
        tls: None,
    };
    let secure = Front {
        target: format!("127.0.0.1:{b}"),
        tls: Some((c.ca.clone(), "grpc.test")),
    };
    (s, plain, secure)
}

/// A loopback port free now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn ok(v: Value) -> Value {
    assert_eq!(v["code"], "OK", "{v}");
    v
}

/// Every case, through `front`.
fn every_case(front: &Front, what: &str) {
    let v = ok(call(front, "unary:hello"));
    assert_eq!(v["reply"], "hello", "{what}");

    let v = ok(call(front, "big:4194304"));
    assert_eq!(v["same"], true, "{what}: a 4 MiB message comes back whole");

    let v = call(front, "abort:PERMISSION_DENIED:not you");
    assert_eq!(v["code"], "PERMISSION_DENIED", "{what}: {v}");
    assert_eq!(v["details"], "not you", "{what}");
    assert_eq!(v["trailers"]["x-why"], "asked", "{what}: custom trailers");
    assert_eq!(
        v["trailers"]["x-detail-bin"], "0001ff",
        "{what}: -bin trailers"
    );

    let v = ok(call(front, "server_stream:5"));
    assert_eq!(v["messages"].as_array().unwrap().len(), 5, "{what}: {v}");

    // The server sends its headers before it reads: the upload must go on.
    let v = ok(call(front, "client_stream:20"));
    assert_eq!(v["reply"], "got 20000 bytes", "{what}");
    assert_eq!(v["initial"]["x-early"], "yes", "{what}");

    // Ping-pong: each message waits for its echo before the next goes.
    let v = ok(call(front, "bidi:8"));
    let got: Vec<_> = v["messages"].as_array().unwrap().iter().collect();
    assert_eq!(got.len(), 8, "{what}: every echo came back: {v}");
    assert_eq!(got[7], "echo m7", "{what}");

    let v = call(front, "deadline:0.5:3");
    assert_eq!(v["code"], "DEADLINE_EXCEEDED", "{what}: {v}");

    let v = ok(call(front, "cancel"));
    assert_eq!(v["first"], "msg 0", "{what}");
}

#[test]
fn grpcio_through_every_front_to_every_backend_scheme() {
    if !have_grpcio() {
        return;
    }
    let dir = TempDir::new();
    let c = certs(&dir);
    let plain = GrpcServer::start(None);
    let secure = GrpcServer::start(Some((&c.backend.0, &c.backend.1)));
    let backends = [
        ("h2c", format!("proxy h2c://127.0.0.1:{}", plain.port)),
        (
            "https",
            format!(
                "proxy https://127.0.0.1:{} {{ tls_ca {}; tls_server_name backend.test }}",
                secure.port,
                c.ca.display()
            ),
        ),
    ];
    for (scheme, proxy) in &backends {
        let (_s, h2c, tls) = sluice(&c, proxy);
        every_case(&h2c, &format!("h2c front, {scheme} backend"));
        every_case(&tls, &format!("TLS front, {scheme} backend"));
    }
}
