//! gRPC through sluice, judged by grpcio on both sides (`tests/interop/grpc_peer.py`,
//! from the venv `.ci/run` makes at `/opt/sluice-interop`): unary, server, client and
//! bidirectional streaming, aborts with custom and `-bin` trailers, a 4 MiB message,
//! deadlines and cancellation, over the h2c and TLS fronts to `h2c://` and `https://`
//! backends. nginx's `grpc_pass` passes every one of these cases. Each test skips with a
//! printed reason when the venv is missing, and fails instead under
//! `SLUICE_INTEROP=require`.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Stdio};
use std::time::Duration;

use common::pki::Ca;
use common::*;
use serde_json::Value;

/// The venv's Python, with grpcio and sonora.
fn python() -> PathBuf {
    Path::new(INTEROP_VENV).join("python3")
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/grpc_peer.py")
}

/// Whether grpcio is there; `false` (after saying why) when the test should skip.
fn have_grpcio() -> bool {
    let ok = Command::new(python())
        .args(["-c", "import grpc, grpc_health.v1.health"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        missing(&format!("grpcio in {INTEROP_VENV} (.ci/run installs it)"));
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
        let mut cmd = Command::new(python());
        cmd.arg(script()).arg("serve");
        if let Some((cert, key)) = tls {
            cmd.arg("--tls").arg(cert).arg(key);
        }
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
        let mut group = Group::spawn(cmd).expect("python runs");
        let stdin = group.0.stdin.take().unwrap();
        let port = said_port(&mut group);
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
    call_as(front, case, None)
}

/// As [`call`], with `:authority` set to `host`.
fn call_as(front: &Front, case: &str, host: Option<&str>) -> Value {
    let mut cmd = Command::new("timeout");
    cmd.arg("30")
        .arg(python())
        .arg(script())
        .args(["call", &front.target, case]);
    if let Some(host) = host {
        cmd.args(["--authority", host]);
    }
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

use common::pebble::free_port;

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

/// sluice's own answers to gRPC calls are trailers-only `grpc-status` answers a gRPC
/// client reads (DESIGN §18.5), each with its reason as `grpc-message`; the calls are
/// counted by status in `sluice_grpc_requests_total` and logged with `grpc_status`.
/// nginx answers these with an HTML error page, which gRPC clients report as
/// `UNKNOWN` or `UNIMPLEMENTED` with a "Received http2 header with status: 502".
#[test]
fn sluices_own_answers_are_grpc_statuses() {
    if !have_grpcio() {
        return;
    }
    let server = GrpcServer::start(None);
    let dir = TempDir::new();
    let log = dir.0.join("access.log");
    let dead_port = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(dead_addr())
        .port();
    let up = format!("h2c://127.0.0.1:{}", server.port);
    let hash = bcrypt::hash("secret", 4).unwrap();
    let s = Sluice::start(&format!(
        "global {{ admin 127.0.0.1:0; access_log {} json }}\n\
         site ok.test {{ proxy {up} }}\n\
         site dead.test {{ proxy h2c://127.0.0.1:{dead_port} {{ retries 0 }} }}\n\
         site auth.test {{ basic_auth u \"{hash}\"; proxy {up} }}\n\
         site deny.test {{ deny 127.0.0.0/8; proxy {up} }}\n\
         site rate.test {{ rate_limit 1/m; proxy {up} }}\n\
         site routes.test {{ route /other/* {{ proxy {up} }} }}",
        log.display()
    ));
    let front = Front {
        target: s.addr.to_string(),
        tls: None,
    };
    let cases = [
        ("ok.test", "OK"),
        ("dead.test", "UNAVAILABLE"),
        ("auth.test", "UNAUTHENTICATED"),
        ("deny.test", "PERMISSION_DENIED"),
        ("routes.test", "UNIMPLEMENTED"),
        ("nowhere.test", "UNIMPLEMENTED"),
    ];
    for (host, want) in cases {
        let v = call_as(&front, "unary:hi", Some(host));
        assert_eq!(v["code"], want, "{host}: {v}");
        if want != "OK" {
            assert!(
                !v["details"].as_str().unwrap_or("").is_empty(),
                "{host}: the reason in words: {v}"
            );
        }
    }
    let first = call_as(&front, "unary:hi", Some("rate.test"));
    assert_eq!(first["code"], "OK", "{first}");
    let limited = call_as(&front, "unary:hi", Some("rate.test"));
    assert_eq!(limited["code"], "RESOURCE_EXHAUSTED", "{limited}");

    let v = call_as(&front, "abort:NOT_FOUND:gone", Some("ok.test"));
    assert_eq!(v["code"], "NOT_FOUND", "{v}");

    let metrics = get_metrics(s.admin());
    for (site, code, n) in [
        ("ok.test", 0, 1),
        ("ok.test", 5, 1),
        ("dead.test", 14, 1),
        ("auth.test", 16, 1),
        ("deny.test", 7, 1),
        ("rate.test", 0, 1),
        ("rate.test", 8, 1),
    ] {
        let line = format!("sluice_grpc_requests_total{{site=\"{site}\",");
        let found = metrics
            .lines()
            .find(|l| l.starts_with(&line) && l.contains(&format!("grpc_status=\"{code}\"}}")));
        assert_eq!(
            found.and_then(|l| l.rsplit(' ').next()),
            Some(n.to_string()).as_deref(),
            "{site} {code}:\n{metrics}"
        );
    }
    let lines = wait_lines(&log, 9);
    let statuses: Vec<_> = lines.iter().map(|v| v["grpc_status"].clone()).collect();
    for code in [0, 14, 16, 7, 12, 8, 5] {
        assert!(
            statuses.contains(&Value::from(code)),
            "grpc_status {code} in the access log: {statuses:?}"
        );
    }
}

/// The access log's JSON lines, once there are `n`.
fn wait_lines(path: &Path, n: usize) -> Vec<Value> {
    let end = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        if lines.len() >= n || std::time::Instant::now() > end {
            return lines;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn get_metrics(admin: std::net::SocketAddr) -> String {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(get(admin, "/metrics")).text()
}

/// A gRPC call's `grpc-timeout` bounds it at sluice (the wait for a `limit` slot
/// included), and the backend gets what is left of it.
#[tokio::test]
async fn grpc_timeout_bounds_the_call_and_what_is_left_goes_on() {
    use http_body_util::{BodyExt, Full};
    let b = Backend::start(|req: hyper::Request<hyper::body::Incoming>| async move {
        if req.uri().path().ends_with("/slow") {
            tokio::time::sleep(Duration::from_secs(10)).await;
        }
        let got = req
            .headers()
            .get("grpc-timeout")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        let mut r = hyper::Response::new(full(got));
        r.headers_mut()
            .insert("grpc-status", hyper::header::HeaderValue::from_static("0"));
        r
    })
    .await;
    let s = Sluice::start(&format!(
        "site * {{ route /busy/* {{ proxy {a} {{ limit 1 200ms }} }} proxy {a} {{ timeout 30s; limit 1 5s }} }}",
        a = b.addr
    ));
    let (mut send, _conn) = h2c::<Full<bytes::Bytes>>(s.addr).await;
    let call = |path: &str, timeout: &str| {
        hyper::Request::post(format!("http://app.test{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("grpc-timeout", timeout)
            .body(Full::new(bytes::Bytes::new()))
            .unwrap()
    };
    // What is left goes on: less than asked, in the finest unit that fits.
    let r = send.send_request(call("/x", "5S")).await.unwrap();
    let got = r.into_body().collect().await.unwrap().to_bytes();
    let got = std::str::from_utf8(&got).unwrap();
    let (n, unit) = got.split_at(got.len() - 1);
    let nanos: u128 = n.parse::<u128>().unwrap()
        * match unit {
            "n" => 1,
            "u" => 1_000,
            "m" => 1_000_000,
            "S" => 1_000_000_000,
            other => panic!("unit {other}"),
        };
    assert!(
        nanos < 5_000_000_000 && nanos > 4_000_000_000,
        "the backend got {got}"
    );

    // A backend slower than the deadline: sluice's own DEADLINE_EXCEEDED, at the deadline.
    let started = std::time::Instant::now();
    let r = tokio::time::timeout(
        Duration::from_secs(5),
        send.send_request(call("/slow", "300m")),
    )
    .await
    .expect("answered by the deadline, not the pool's timeout")
    .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["grpc-status"], "4", "{:?}", r.headers());
    assert!(started.elapsed() < Duration::from_secs(3));

    // The wait for a `limit` slot counts: one call holds the only slot.
    let mut hold = send.clone();
    let holder = tokio::spawn(async move { hold.send_request(call("/slow", "20S")).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = std::time::Instant::now();
    let r = send.send_request(call("/x", "400m")).await.unwrap();
    assert_eq!(r.headers()["grpc-status"], "4", "{:?}", r.headers());
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "not the limit's 5s wait"
    );
    holder.abort();

    // A `limit` refusal (its wait over, the deadline not) is RESOURCE_EXHAUSTED.
    let mut hold = send.clone();
    let holder = tokio::spawn(async move { hold.send_request(call("/busy/slow", "20S")).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = send.send_request(call("/busy/x", "10S")).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["grpc-status"], "8", "{:?}", r.headers());
    assert!(r.headers()["grpc-message"]
        .to_str()
        .unwrap()
        .contains("busy"));
    holder.abort();
}

/// `health grpc [SERVICE]` asks grpcio's own health service, over h2c and over TLS:
/// `SERVING` keeps a peer in, `NOT_SERVING` takes it out with that as its reason, and
/// calls then get `UNAVAILABLE` from sluice. nginx has no active checks (its commercial
/// build's `health_check type=grpc` does this); Envoy's `grpc_health_check` does.
#[test]
fn health_grpc_follows_grpcios_health_service() {
    if !have_grpcio() {
        return;
    }
    let dir = TempDir::new();
    let c = certs(&dir);
    let mut plain = GrpcServer::start(None);
    let mut secure = GrpcServer::start(Some((&c.backend.0, &c.backend.1)));
    let probe = "{ interval 1s; timeout 1s; rise 1; fall 1 }";
    let s = Sluice::start(&format!(
        "global {{ admin 127.0.0.1:0 }}\n\
         site h2c.test {{ proxy h2c://127.0.0.1:{} {{ all_down fail; health grpc test.Echo {probe} }} }}\n\
         site tls.test {{ proxy https://127.0.0.1:{} {{ all_down fail; tls_ca {}; tls_server_name backend.test; health grpc test.Echo {probe} }} }}\n\
         site whole.test {{ proxy h2c://127.0.0.1:{} {{ health grpc {probe} }} }}\n\
         site missing.test {{ proxy h2c://127.0.0.1:{} {{ health grpc test.Missing {probe} }} }}",
        plain.port,
        secure.port,
        c.ca.display(),
        plain.port,
        plain.port,
    ));
    let admin = s.admin();
    let front = Front {
        target: s.addr.to_string(),
        tls: None,
    };
    let reason = |site: &str| -> (String, Value) {
        let status = get_json(admin, "/status");
        let pool = status["pools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"].as_str().unwrap().contains(site))
            .unwrap_or_else(|| panic!("no pool for {site}: {status}"))
            .clone();
        let peer = &pool["peers"][0];
        (
            peer["state"].as_str().unwrap().to_string(),
            peer["reason"].clone(),
        )
    };
    let wait_state = |site: &str, want: &str| {
        let end = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let (state, why) = reason(site);
            if state == want || std::time::Instant::now() > end {
                return (state, why);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    for site in ["h2c.test", "tls.test", "whole.test"] {
        assert_eq!(wait_state(site, "healthy").0, "healthy", "{site}");
    }
    let (state, why) = wait_state("missing.test", "unhealthy");
    assert_eq!(state, "unhealthy");
    assert_eq!(why, "grpc: NOT_FOUND", "an unknown service");

    plain.say("down test.Echo");
    secure.say("down test.Echo");
    for site in ["h2c.test", "tls.test"] {
        let (state, why) = wait_state(site, "unhealthy");
        assert_eq!(state, "unhealthy", "{site}");
        assert_eq!(why, "grpc: NOT_SERVING", "{site}");
        let v = call_as(&front, "unary:hi", Some(site));
        assert_eq!(v["code"], "UNAVAILABLE", "{site}: {v}");
    }
    // The server as a whole still serves.
    assert_eq!(reason("whole.test").0, "healthy");

    plain.say("up test.Echo");
    secure.say("up test.Echo");
    for site in ["h2c.test", "tls.test"] {
        assert_eq!(wait_state(site, "healthy").0, "healthy", "{site}");
        let v = ok(call_as(&front, "unary:back", Some(site)));
        assert_eq!(v["reply"], "back");
    }
}

fn get_json(admin: std::net::SocketAddr, path: &str) -> Value {
    let rt = tokio::runtime::Runtime::new().unwrap();
    serde_json::from_str(&rt.block_on(get(admin, path)).text()).unwrap()
}

/// `health grpc` mistakes are load errors at their line, saying what to write.
#[test]
fn health_grpc_mistakes_fail_check() {
    let dir = TempDir::new();
    for (text, want) in [
        (
            "site * { proxy 127.0.0.1:9 { health grpc } }",
            "`health grpc` asks over HTTP/2, and this pool speaks HTTP/1.1",
        ),
        (
            "site * { proxy h2c://127.0.0.1:9 { health grpc a.B extra } }",
            "extra",
        ),
        (
            "site * { proxy h2c://127.0.0.1:9 { health grpc { method HEAD } } }",
            "`method` is for HTTP probes",
        ),
        (
            "tcp 127.0.0.1:0 { proxy 127.0.0.1:9 { health grpc } }",
            "a `tcp` proxy checks health with `health connect`",
        ),
    ] {
        assert_check_fails(&dir, text, want);
    }
}

/// `grpc_web`: sonora's gRPC-Web client (binary, over HTTP/1.1) calls grpcio through
/// sluice: unary, server streaming, an abort's status and message from the trailer
/// message, and sluice's own answer; a `-text` (base64) call from a raw client whose
/// answer is checked message by message; and a CORS preflight answered by `cors`.
/// nginx has no gRPC-Web translation (Envoy's `grpc_web` filter is the usual answer).
#[tokio::test]
async fn grpc_web_calls_from_http1_reach_grpcio() {
    if !have_grpcio() {
        return;
    }
    let server = GrpcServer::start(None);
    let s = Sluice::start(&format!(
        "site * {{
            route /test.Echo/* {{
                cors {{ origins https://app.test; headers content-type x-grpc-web x-user-agent grpc-timeout }}
                grpc_web
                proxy h2c://127.0.0.1:{}
            }}
            route /nothing/* {{ grpc_web; proxy h2c://127.0.0.1:9 {{ retries 0 }} }}
        }}",
        server.port
    ));
    let url = format!("http://{}", s.addr);
    let web = |case: &str| -> Value {
        let out = Command::new("timeout")
            .arg("30")
            .arg(python())
            .arg(script())
            .args(["webcall", &url, case])
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
            panic!(
                "{case}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        })
    };
    let v = web("unary:from the web");
    assert_eq!(v["code"], "OK", "{v}");
    assert_eq!(v["reply"], "from the web");
    let v = web("server_stream:3");
    assert_eq!(
        v["messages"],
        serde_json::json!(["msg 0", "msg 1", "msg 2"]),
        "{v}"
    );
    let v = web("abort:PERMISSION_DENIED:not you");
    assert_eq!(v["code"], "PERMISSION_DENIED", "{v}");
    assert_eq!(v["details"], "not you", "{v}");

    // -text: base64 both ways; the answer ends with the trailer message (0x80).
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let msg = b"\0\0\0\0\x05hello";
    let body = b64.encode(msg);
    let r = request(
        s.addr,
        "POST",
        "/test.Echo/Unary",
        &[
            ("origin", "https://app.test"),
            ("content-type", "application/grpc-web-text"),
            ("x-grpc-web", "1"),
        ],
        body.as_bytes(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/grpc-web-text"));
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.test")
    );
    assert!(r
        .header("access-control-expose-headers")
        .unwrap()
        .contains("grpc-status"));
    let text: String = r.text().split_whitespace().collect();
    let mut decoded = Vec::new();
    for group in text.as_bytes().chunks(4) {
        decoded.extend(b64.decode(group).unwrap());
    }
    assert_eq!(&decoded[..10], msg, "the message back: {decoded:?}");
    assert_eq!(decoded[10], 0x80, "then the trailer message: {decoded:?}");
    let trailer = String::from_utf8_lossy(&decoded[15..]).to_lowercase();
    assert!(trailer.contains("grpc-status: 0\r\n"), "{trailer}");

    // sluice's own answer to a gRPC-Web call: status in the head.
    let r = request(
        s.addr,
        "POST",
        "/nothing/x",
        &[("content-type", "application/grpc-web+proto")],
        b"\0\0\0\0\0",
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("grpc-status"), Some("14"), "{:?}", r.headers);
    assert_eq!(r.header("content-type"), Some("application/grpc-web"));

    // The browser's preflight.
    let r = request(
        s.addr,
        "OPTIONS",
        "/test.Echo/Unary",
        &[
            ("origin", "https://app.test"),
            ("access-control-request-method", "POST"),
            ("access-control-request-headers", "content-type,x-grpc-web"),
        ],
        b"",
    )
    .await;
    assert_eq!(r.status, 204, "{}", r.text());
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.test")
    );
}
