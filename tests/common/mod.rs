//! Test harness: runs the real `sluice` binary on a config written to a temp dir,
//! starts in-process hyper backends on free loopback ports, and speaks raw HTTP.
//! Every wait is bounded; every process and file is cleaned up on drop.
#![allow(dead_code)]

pub mod bind;
pub mod dns;
pub mod h3c;
pub mod pebble;
pub mod pki;
pub mod redis;

use std::convert::Infallible;
use std::future::Future;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub const WAIT: Duration = Duration::from_secs(10);

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A fresh temp directory, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new() -> TempDir {
        let p = std::env::temp_dir().join(format!(
            "sluice-test-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(&p, text).unwrap();
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Tests run many instances at once: unless a config names its own `admin`, turn
/// the admin API (default 127.0.0.1:2019) off.
pub fn without_admin(text: &str) -> String {
    // An `admin` directive, not the word in a route or a response.
    let has_admin = text
        .split(['\n', ';', '{'])
        .any(|piece| piece.trim_start().starts_with("admin "));
    if has_admin {
        text.to_string()
    } else if text.contains("global {") {
        text.replacen("global {", "global {\n    admin off\n", 1)
    } else {
        format!("global {{ admin off }}\n{text}")
    }
}

/// `minisign` in `dir`: `args`, with no password (keys made with -W).
pub fn minisign(dir: &std::path::Path, args: &[&str]) -> bool {
    Command::new("minisign")
        .current_dir(dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .is_ok_and(|o| o.status.success())
}

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_sluice")
}

/// A running sluice. Its stderr lines are collected for log assertions.
pub struct Sluice {
    pub child: Child,
    pub addr: SocketAddr,
    pub logs: Arc<Mutex<Vec<String>>>,
    _dir: TempDir,
}

impl Sluice {
    /// Starts `sluice run` on `config`, where `{LISTEN}` stands for a free port.
    pub fn start(config: &str) -> Sluice {
        let dir = TempDir::new();
        let text = config.replace("{LISTEN}", "127.0.0.1:0");
        let text = if text.contains("listen ") {
            text
        } else {
            format!("listen 127.0.0.1:0\n{text}")
        };
        let text = without_admin(&text);
        let path = dir.write("sluice.conf", &text);
        Self::spawn(&["run", "-c", path.to_str().unwrap()], dir)
    }

    /// The admin API's address, once sluice logged it.
    pub fn admin(&self) -> SocketAddr {
        let line = self.wait_log("admin API on http://");
        line.rsplit_once("http://").unwrap().1.parse().unwrap()
    }

    pub fn spawn(args: &[&str], dir: TempDir) -> Sluice {
        let mut cmd = Command::new(bin());
        cmd.args(args);
        Self::spawn_cmd(cmd, dir)
    }

    /// As [`Sluice::start`], with the process's descriptor limit (`ulimit -n`) at `nofile`.
    pub fn start_with_nofile(config: &str, nofile: u32) -> Sluice {
        Self::start_with_ulimit(config, &format!("-n {nofile}"))
    }

    /// As [`Sluice::start`], under `ulimit ARGS` (`-S -n 256`: the soft limit only).
    pub fn start_with_ulimit(config: &str, args: &str) -> Sluice {
        let dir = TempDir::new();
        let text = without_admin(&format!("listen 127.0.0.1:0\n{config}"));
        let path = dir.write("sluice.conf", &text);
        let mut cmd = Command::new("sh");
        cmd.args(["-c", &format!("ulimit {args} && exec \"$0\" \"$@\"")])
            .args([bin(), "run", "-c", path.to_str().unwrap()]);
        Self::spawn_cmd(cmd, dir)
    }

    pub fn spawn_cmd(mut cmd: Command, dir: TempDir) -> Sluice {
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("sluice starts");
        let stderr = child.stderr.take().unwrap();
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let listening = line
                    .split_once("sluice: listening on http://")
                    .or_else(|| line.split_once("sluice: listening on https://"));
                if let Some((_, a)) = listening {
                    // The address ends the line, or its JSON string (`log_format json`).
                    let a = a.split('"').next().unwrap_or(a);
                    let _ = tx.send(a.parse::<SocketAddr>().unwrap());
                }
                sink.lock().unwrap().push(line);
            }
        });
        let addr = match rx.recv_timeout(WAIT) {
            Ok(a) => a,
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "sluice did not start listening; stderr:\n{}",
                    logs.lock().unwrap().join("\n")
                );
            }
        };
        Sluice {
            child,
            addr,
            logs,
            _dir: dir,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Waits (bounded) for a log line containing `needle`.
    pub fn wait_log(&self, needle: &str) -> String {
        let end = Instant::now() + WAIT;
        loop {
            if let Some(l) = self
                .logs
                .lock()
                .unwrap()
                .iter()
                .find(|l| l.contains(needle))
            {
                return l.clone();
            }
            if Instant::now() > end {
                panic!(
                    "no log line with {needle:?}; logs:\n{}",
                    self.logs.lock().unwrap().join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits (bounded) until `needle` appears exactly `n` times, and a moment more to
    /// see that no further one follows.
    pub fn wait_count(&self, needle: &str, n: usize) {
        let end = Instant::now() + WAIT;
        let count = || self.logs().matches(needle).count();
        while count() < n && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(
            count(),
            n,
            "expected {n} log lines with {needle:?}:\n{}",
            self.logs()
        );
    }

    pub fn logs(&self) -> String {
        self.logs.lock().unwrap().join("\n")
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.pid().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
    }

    /// Waits (bounded) for the process to exit; returns its code.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<i32> {
        let end = Instant::now() + limit;
        while Instant::now() < end {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Sluice {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub type Body = BoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;
pub type Handler = Arc<
    dyn Fn(Request<Incoming>) -> Pin<Box<dyn Future<Output = Response<Body>> + Send>> + Send + Sync,
>;

pub fn full(s: impl Into<Bytes>) -> Body {
    Full::new(s.into())
        .map_err(|e: Infallible| match e {})
        .boxed()
}

/// An in-process HTTP/1.1 backend.
pub struct Backend {
    pub addr: SocketAddr,
    /// Connections accepted so far.
    pub connections: Arc<AtomicUsize>,
    /// Requests served so far.
    pub requests: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Backend {
    pub async fn start<F, Fut>(f: F) -> Backend
    where
        F: Fn(Request<Incoming>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Response<Body>> + Send + 'static,
    {
        let handler: Handler = Arc::new(move |r| Box::pin(f(r)));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        Self::serve(listener, handler)
    }

    pub async fn with(handler: Handler) -> Backend {
        Self::serve(TcpListener::bind("127.0.0.1:0").await.unwrap(), handler)
    }

    pub fn serve(listener: TcpListener, handler: Handler) -> Backend {
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(AtomicUsize::new(0));
        let (c, r) = (connections.clone(), requests.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                c.fetch_add(1, Ordering::SeqCst);
                let h = handler.clone();
                let r = r.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        r.fetch_add(1, Ordering::SeqCst);
                        let fut = h(req);
                        async move { Ok::<_, Infallible>(fut.await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Backend {
            addr,
            connections,
            requests,
            task,
        }
    }

    /// Answers every request with `text`.
    pub async fn text(text: &'static str) -> Backend {
        Backend::start(move |_| async move { Response::new(full(text)) }).await
    }

    /// Answers with the request's head as text: method, URI, then `name: value` lines.
    pub async fn echo_head() -> Backend {
        Backend::start(|req: Request<Incoming>| async move {
            let mut s = format!("{} {}\n", req.method(), req.uri());
            for (k, v) in req.headers() {
                s.push_str(&format!("{}: {}\n", k, v.to_str().unwrap_or("?")));
            }
            Response::new(full(s))
        })
        .await
    }

    /// As [`Backend::echo_head`], then how many body bytes it read and their sum (a body
    /// checked without echoing it). The whole body is read before the answer: a backend
    /// that answers an upload early and closes races the upload's last writes.
    pub async fn echo_head_and_body() -> Backend {
        Backend::start(|req: Request<Incoming>| async move {
            let mut s = format!("{} {}\n", req.method(), req.uri());
            for (k, v) in req.headers() {
                s.push_str(&format!("{}: {}\n", k, v.to_str().unwrap_or("?")));
            }
            let body = req.into_body().collect().await.unwrap().to_bytes();
            let sum: u64 = body.iter().map(|b| u64::from(*b)).sum();
            s.push_str(&format!("body {} {sum}\n", body.len()));
            Response::new(full(s))
        })
        .await
    }
}

/// Sockets bound without listening, kept for the test process's life: their ports
/// refuse connections and are never handed to another test's `bind(0)` (a freed port
/// can be, and a "dead" backend would then answer as some other test's listener).
static HELD: Mutex<Vec<socket2::Socket>> = Mutex::new(Vec::new());

/// Keeps `addr`'s port bound without listening (see [`HELD`]): from now on connections
/// to it are refused. For a backend a test stopped on purpose.
pub fn hold_port(addr: SocketAddr) -> SocketAddr {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.set_reuse_address(true).unwrap();
    s.bind(&addr.into()).unwrap();
    let bound = s.local_addr().unwrap().as_socket().unwrap();
    HELD.lock().unwrap().push(s);
    bound
}

/// A loopback address where nothing listens, and nothing will (see [`HELD`]).
pub async fn dead_addr() -> SocketAddr {
    hold_port(SocketAddr::from(([127, 0, 0, 1], 0)))
}

/// A parsed HTTP/1.1 response.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).to_string()
    }
}

/// Sends raw bytes and reads until the server closes (bounded); returns all it sent.
pub async fn raw(addr: SocketAddr, req: &[u8]) -> Vec<u8> {
    raw_within(addr, req, WAIT).await
}

/// [`raw`], reading for as long as `wait` (an answer a test holds back on purpose).
pub async fn raw_within(addr: SocketAddr, req: &[u8], wait: Duration) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(req).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(wait, s.read_to_end(&mut out)).await;
    out
}

/// Reads until the server closes `c` (within [`WAIT`]) and parses every answer it sent.
pub async fn answers(c: &mut TcpStream) -> Vec<Resp> {
    let mut out = Vec::new();
    tokio::time::timeout(WAIT, c.read_to_end(&mut out))
        .await
        .expect("the answers and the close within the wait")
        .unwrap();
    let mut all = Vec::new();
    let mut rest = &out[..];
    while let Some((r, used)) = parse_response(rest) {
        all.push(r);
        rest = &rest[used..];
        if rest.is_empty() {
            break;
        }
    }
    all
}

/// Parses one response (Content-Length, chunked or close-delimited) off the front of `buf`.
pub fn parse_response(buf: &[u8]) -> Option<(Resp, usize)> {
    let mut hs = [httparse::EMPTY_HEADER; 64];
    let mut r = httparse::Response::new(&mut hs);
    let httparse::Status::Complete(n) = r.parse(buf).ok()? else {
        return None;
    };
    let status = r.code?;
    let headers: Vec<(String, String)> = r
        .headers
        .iter()
        .map(|h| {
            (
                h.name.to_string(),
                String::from_utf8_lossy(h.value).to_string(),
            )
        })
        .collect();
    let get = |k: &str| {
        headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(k))
            .map(|(_, v)| v.clone())
    };
    let rest = &buf[n..];
    let (body, used) = if status == 204 || status == 304 || (100..200).contains(&status) {
        (Vec::new(), 0)
    } else if let Some(cl) = get("content-length") {
        let cl: usize = cl.parse().ok()?;
        if rest.len() < cl {
            return None;
        }
        (rest[..cl].to_vec(), cl)
    } else if get("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        let mut body = Vec::new();
        let mut i = 0;
        loop {
            let line_end = rest[i..].windows(2).position(|w| w == b"\r\n")? + i;
            let size = usize::from_str_radix(
                std::str::from_utf8(&rest[i..line_end])
                    .ok()?
                    .split(';')
                    .next()?,
                16,
            )
            .ok()?;
            i = line_end + 2;
            if size == 0 {
                i += 2;
                break;
            }
            if rest.len() < i + size + 2 {
                return None;
            }
            body.extend_from_slice(&rest[i..i + size]);
            i += size + 2;
        }
        (body, i)
    } else {
        (rest.to_vec(), rest.len())
    };
    Some((
        Resp {
            status,
            headers,
            body,
        },
        n + used,
    ))
}

/// One request on a new connection (`Connection: close`).
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Resp {
    let mut req = format!("{method} {path} HTTP/1.1\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str("Host: localhost\r\n");
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty()
        && !headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("transfer-encoding"))
    {
        req.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    req.push_str("Connection: close\r\n\r\n");
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    let out = raw(addr, &bytes).await;
    parse_response(&out)
        .unwrap_or_else(|| {
            panic!(
                "no complete response in {:?}",
                String::from_utf8_lossy(&out)
            )
        })
        .0
}

pub async fn get(addr: SocketAddr, path: &str) -> Resp {
    request(addr, "GET", path, &[], b"").await
}

pub async fn get_host(addr: SocketAddr, host: &str, path: &str) -> Resp {
    request(addr, "GET", path, &[("Host", host)], b"").await
}

/// Whether interop tests must run (CI) or may skip when a program is missing.
pub fn require_interop() -> bool {
    std::env::var("SLUICE_INTEROP").as_deref() == Ok("require")
}

/// Where `.ci/run` puts the Python programs the interop tests run (grpcio, sonora,
/// uvicorn, gunicorn, …): a venv of their own.
pub const INTEROP_VENV: &str = "/opt/sluice-interop/bin";

/// A program a test needs is not here (`what`, and how to get it): the test skips with
/// that said, or fails under `SLUICE_INTEROP=require`.
pub fn missing(what: &str) {
    if require_interop() {
        panic!("{what} is required (SLUICE_INTEROP=require) but not installed");
    }
    eprintln!("skipping: {what} is not installed");
}

/// A program on `PATH` (or in `/usr/sbin`, `/sbin`); a missing one is reported as
/// [`missing`] says.
pub fn program(name: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(name))
        .find(|p| p.is_file());
    if found.is_none() {
        missing(name);
    }
    found
}

/// RSS of a process in KiB (`VmRSS`) and its peak (`VmHWM`).
pub fn rss_kib(pid: u32) -> (u64, u64) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |k: &str| {
        s.lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// A response body fed chunk by chunk; it ends when the sender is dropped.
pub fn channel_body() -> (tokio::sync::mpsc::Sender<Bytes>, Body) {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    (tx, ChanBody(rx).boxed())
}

pub struct ChanBody(pub tokio::sync::mpsc::Receiver<Bytes>);

impl http_body::Body for ChanBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|o| o.map(|b| Ok(http_body::Frame::data(b))))
    }
}

/// A raw backend that, on each connection, reads once, writes `reply` and closes the
/// connection shortly after, whatever the request said (for misbehaving peers).
pub async fn answer_once(reply: &'static [u8]) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    raw_backend(move |mut c| async move {
        let mut buf = [0u8; 4096];
        let _ = c.read(&mut buf).await;
        let _ = c.write_all(reply).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    })
    .await
}

/// A raw TCP backend on a free loopback port: `serve` runs, in its own task, for each
/// connection accepted. The returned task is the accept loop.
pub async fn raw_backend<F, Fut>(serve: F) -> (SocketAddr, tokio::task::JoinHandle<()>)
where
    F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let task = tokio::spawn(async move {
        loop {
            if let Ok((c, _)) = l.accept().await {
                tokio::spawn(serve(c));
            }
        }
    });
    (addr, task)
}

/// A connection to `addr` (a relay to a backend that speaks first) once the backend's
/// first `n` bytes arrived, and those bytes; the test fails past `WAIT`.
pub async fn greeted(addr: SocketAddr, n: usize) -> (TcpStream, Vec<u8>) {
    let mut c = TcpStream::connect(addr).await.unwrap();
    let mut greeting = vec![0u8; n];
    tokio::time::timeout(WAIT, c.read_exact(&mut greeting))
        .await
        .expect("the backend's greeting came through in time")
        .unwrap();
    (c, greeting)
}

/// An h2c (prior knowledge) client connection to `addr`; the task drives the connection
/// and ends when it closes.
pub async fn h2c<B>(
    addr: SocketAddr,
) -> (
    hyper::client::conn::http2::SendRequest<B>,
    tokio::task::JoinHandle<()>,
)
where
    B: http_body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        TokioIo::new(tcp),
    )
    .await
    .unwrap();
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    (send, task)
}

/// A program a test started in a process group of its own (`Command::process_group(0)`),
/// stopped with everything it forked when dropped — also when the test fails: SIGTERM to
/// the group, a bounded wait, then SIGKILL. (php-fpm's workers outlived a SIGKILL sent to
/// their master alone, holding their sockets after every run.)
pub struct Group(pub Child);

impl Group {
    pub fn spawn(mut cmd: Command) -> std::io::Result<Group> {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0).spawn().map(Group)
    }

    fn signal(&self, sig: &str) {
        let _ = Command::new("kill")
            .args([&format!("-{sig}"), "--", &format!("-{}", self.0.id())])
            .stderr(Stdio::null())
            .status();
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.signal("TERM");
        let end = Instant::now() + Duration::from_secs(3);
        while Instant::now() < end {
            if let Ok(Some(_)) = self.0.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // Whatever of the group is left (a worker that ignored TERM) goes now.
        self.signal("KILL");
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Writes `text` as `bad.conf` in `dir` and runs `sluice check` on it: it must fail
/// (exit 1) with `want` in its errors, at a line of `bad.conf`.
pub fn assert_check_fails(dir: &TempDir, text: &str, want: &str) {
    let path = dir.write("bad.conf", text);
    let out = Command::new(bin())
        .args(["check", "-c", path.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{text}: {err}");
    assert!(err.contains(want), "{text}:\n{err}");
    let at_a_line = err
        .match_indices("bad.conf:")
        .any(|(i, m)| err[i + m.len()..].starts_with(|c: char| c.is_ascii_digit()));
    assert!(at_a_line, "the error names a line of bad.conf: {err}");
}

/// A JSON POST to the admin API (`Content-Type: application/json`).
pub async fn post_json(admin: SocketAddr, path: &str, body: &str) -> Resp {
    request(
        admin,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        body.as_bytes(),
    )
    .await
}

/// Runs an origin test through the admin API (`POST /origin-test`, then
/// `GET /origin-test/ID` until done, bounded): the result.
pub async fn origin_test(admin: SocketAddr, pool: &str, role: &str) -> serde_json::Value {
    let body = serde_json::json!({"pool": pool, "role": role}).to_string();
    let r = post_json(admin, "/origin-test", &body).await;
    assert_eq!(r.status, 202, "{pool} {role}: {}", r.text());
    let started: serde_json::Value = serde_json::from_str(&r.text()).unwrap();
    let id = started["id"].as_str().unwrap().to_string();
    let end = Instant::now() + WAIT;
    loop {
        let t = get(admin, &format!("/origin-test/{id}")).await;
        assert_eq!(t.status, 200);
        let v: serde_json::Value = serde_json::from_str(&t.text()).unwrap();
        if v["state"] == "done" {
            return v;
        }
        assert!(Instant::now() < end, "origin test {id} never finished");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A WebSocket backend that echoes every text and binary message.
pub async fn ws_echo_backend() -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        use futures_util::{SinkExt, StreamExt};
        while let Ok((c, _)) = l.accept().await {
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(c).await else {
                    return;
                };
                while let Some(Ok(m)) = ws.next().await {
                    if (m.is_text() || m.is_binary()) && ws.send(m).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// An h2c backend that echoes each request's body as it arrives (full duplex): the
/// response head goes at once, each data frame back as it comes.
pub async fn h2c_echo() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((c, _)) = l.accept().await {
            tokio::spawn(async move {
                let svc = service_fn(|req: Request<Incoming>| async move {
                    Ok::<_, Infallible>(Response::new(req.into_body()))
                });
                let _ =
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(TokioIo::new(c), svc)
                        .await;
            });
        }
    });
    (addr, task)
}

/// The port a program it started says it listens on: its first line of output, `port
/// N` (the test fails past 30 s or on anything else).
pub fn said_port(group: &mut Group) -> u16 {
    use std::io::BufRead;
    let stdout = group.0.stdout.take().expect("stdout piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the program says its port");
    line.trim()
        .strip_prefix("port ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("the program said {line:?}"))
}
