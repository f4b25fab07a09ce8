//! The binary upgrade (`sluice upgrade`, `SIGUSR2`): the new process takes the
//! listening sockets, the old one drains and exits — no connection refused, no request
//! failed, tunnels and h2 streams finished — and a binary or config that cannot start
//! leaves the old process serving.

mod common;

use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Empty};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Every process that served in a test, killed when the test ends (the last one, and
/// any old one still draining, are no children of the test).
struct Pids(Mutex<Vec<u32>>);

impl Pids {
    fn new() -> Pids {
        Pids(Mutex::new(Vec::new()))
    }

    fn push(&self, pid: u32) {
        self.0.lock().unwrap().push(pid);
    }
}

impl Drop for Pids {
    fn drop(&mut self) {
        for pid in self.0.lock().unwrap().iter() {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}

/// Kills every process whose command line contains the pattern when dropped.
struct KillMatching(String);

impl Drop for KillMatching {
    fn drop(&mut self) {
        let _ = Command::new("pkill")
            .args(["-KILL", "-f", &self.0])
            .status();
    }
}

/// Whether `pid` has exited (gone, or a zombie nobody reaped yet).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

fn wait_gone(pid: u32, limit: Duration) {
    let end = Instant::now() + limit;
    while !gone(pid) {
        assert!(
            Instant::now() < end,
            "PID {pid} did not exit within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The PID the admin API answers from.
async fn serving_pid(admin: std::net::SocketAddr) -> u32 {
    let s = request(admin, "GET", "/status", &[], b"").await.text();
    let v: serde_json::Value = serde_json::from_str(&s).unwrap();
    v["pid"].as_u64().unwrap() as u32
}

/// Waits (bounded) until the admin API answers from a PID other than `old`.
async fn new_pid(admin: std::net::SocketAddr, old: u32) -> u32 {
    let end = Instant::now() + WAIT;
    loop {
        let pid = serving_pid(admin).await;
        if pid != old {
            return pid;
        }
        assert!(
            Instant::now() < end,
            "the admin API still answers from {old}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `sluice upgrade --admin ADDR`: its exit code and stderr.
async fn upgrade_cli(admin: std::net::SocketAddr) -> (i32, String) {
    let out = tokio::task::spawn_blocking(move || {
        Command::new(bin())
            .args(["upgrade", "--admin", &admin.to_string()])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// Requests answered and failed by a client loop, with the first failures' reasons.
#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    failed: AtomicU64,
    why: Mutex<Vec<String>>,
}

impl Tally {
    fn fail(&self, why: String) {
        self.failed.fetch_add(1, Ordering::SeqCst);
        let mut w = self.why.lock().unwrap();
        if w.len() < 5 {
            w.push(why);
        }
    }
}

/// One request on `conn` (opened when `None`); whether the connection may carry
/// another (the answer did not say `Connection: close`).
async fn exchange(
    addr: std::net::SocketAddr,
    conn: &mut Option<TcpStream>,
    close: bool,
) -> Result<bool, String> {
    if conn.is_none() {
        *conn = Some(
            TcpStream::connect(addr)
                .await
                .map_err(|e| format!("connect: {e}"))?,
        );
    }
    let c = conn.as_mut().unwrap();
    let req = match close {
        true => "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        false => "GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    };
    c.write_all(req.as_bytes())
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut buf = Vec::new();
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some((resp, _)) = parse_response(&buf) {
            if resp.status != 200 || resp.body != b"hello" {
                return Err(format!("answer {}: {}", resp.status, resp.text()));
            }
            return Ok(!close && resp.header("connection") != Some("close"));
        }
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout_at(deadline.into(), c.read(&mut chunk))
            .await
            .map_err(|_| "no answer in time".to_string())?
            .map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            return Err(format!(
                "closed before a whole answer ({} bytes)",
                buf.len()
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// A client that loops requests until `stop`: over one kept-alive connection (a new
/// one when an answer closes it), or a new connection each time.
fn client_loop(
    addr: std::net::SocketAddr,
    keep_alive: bool,
    stop: Arc<AtomicBool>,
    tally: Arc<Tally>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut conn = None;
        while !stop.load(Ordering::SeqCst) {
            match exchange(addr, &mut conn, !keep_alive).await {
                Ok(keep) => {
                    tally.ok.fetch_add(1, Ordering::SeqCst);
                    if !keep {
                        conn = None;
                    }
                }
                Err(why) => {
                    tally.fail(why);
                    conn = None;
                }
            }
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_upgrades_refuse_no_connection_and_fail_no_request() {
    let backend = Backend::text("hello").await;
    let sluice = Sluice::start(&format!(
        "global {{ admin 127.0.0.1:0; grace 5s }}
         listen 127.0.0.1:0
         site * {{ proxy {} }}",
        backend.addr
    ));
    let admin = sluice.admin();
    let pids = Pids::new();
    let first = serving_pid(admin).await;
    assert_eq!(first, sluice.pid());
    let stop = Arc::new(AtomicBool::new(false));
    let (kept, fresh) = (Arc::new(Tally::default()), Arc::new(Tally::default()));
    let loops = [
        client_loop(sluice.addr, true, stop.clone(), kept.clone()),
        client_loop(sluice.addr, false, stop.clone(), fresh.clone()),
    ];
    let mut old = first;
    for i in 0..10 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        if i % 2 == 0 {
            let (code, out) = upgrade_cli(admin).await;
            assert_eq!(code, 0, "upgrade {i}: {out}");
        } else {
            Command::new("kill")
                .args(["-USR2", &old.to_string()])
                .status()
                .unwrap();
        }
        let pid = new_pid(admin, old).await;
        pids.push(pid);
        // The old process drains and exits (its clients move on their next request).
        wait_gone(old, Duration::from_secs(15));
        old = pid;
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    stop.store(true, Ordering::SeqCst);
    for l in loops {
        l.await.unwrap();
    }
    for (name, t) in [("keep-alive", &kept), ("new connections", &fresh)] {
        assert_eq!(
            t.failed.load(Ordering::SeqCst),
            0,
            "{name}: {:?}",
            t.why.lock().unwrap()
        );
        assert!(t.ok.load(Ordering::SeqCst) > 50, "{name}: too few requests");
    }
    assert_ne!(old, first);
    let logs = sluice.logs();
    assert_eq!(logs.matches("upgrade: handed over to PID").count(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_and_an_h2_stream_outlive_the_upgrade() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let ws = ws_echo_backend().await;
    // The backend answers once the test lets it: after the new process serves.
    let release = Arc::new(tokio::sync::Notify::new());
    let gate = release.clone();
    let slow = Backend::start(move |_| {
        let gate = gate.clone();
        async move {
            gate.notified().await;
            hyper::Response::new(full("slow answer"))
        }
    })
    .await;
    // A short grace: the tunnel outlives it (tunnel_drain), the h2 stream does not need more.
    let sluice = Sluice::start(&format!(
        "global {{ admin 127.0.0.1:0; grace 3s }}
         listen 127.0.0.1:0
         site * {{
           route /ws {{ proxy {ws} }}
           route /slow {{ proxy {} }}
           respond \"hello\"
         }}",
        slow.addr
    ));
    let admin = sluice.admin();
    let pids = Pids::new();
    let old = serving_pid(admin).await;
    let (mut socket, _) = tokio_tungstenite::connect_async(format!("ws://{}/ws", sluice.addr))
        .await
        .unwrap();
    socket.send(Message::text("before")).await.unwrap();
    assert_eq!(
        socket.next().await.unwrap().unwrap(),
        Message::text("before")
    );
    // An h2 stream in flight when the upgrade comes.
    let (mut h2, _conn) = h2c::<Empty<Bytes>>(sluice.addr).await;
    let in_flight = tokio::spawn(async move {
        let req = hyper::Request::get("http://x/slow")
            .body(Empty::new())
            .unwrap();
        let resp = h2.send_request(req).await.unwrap();
        let status = resp.status();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, body)
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (code, out) = upgrade_cli(admin).await;
    assert_eq!(code, 0, "{out}");
    let new = new_pid(admin, old).await;
    pids.push(new);
    // The h2 stream, still waiting on its backend, finishes on the old process.
    release.notify_one();
    let (status, body) = tokio::time::timeout(WAIT, in_flight)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((status.as_u16(), &body[..]), (200, &b"slow answer"[..]));
    // Past the old process's grace, its tunnel goes on echoing.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    socket.send(Message::text("after")).await.unwrap();
    let echoed = tokio::time::timeout(WAIT, socket.next()).await.unwrap();
    assert_eq!(echoed.unwrap().unwrap(), Message::text("after"));
    assert!(!gone(old), "the old process waits for its tunnel");
    // New requests reach the new process; the old one exits once its tunnel ends.
    assert_eq!(get(sluice.addr, "/").await.text(), "hello");
    socket.close(None).await.unwrap();
    drop(socket);
    wait_gone(old, Duration::from_secs(15));
    assert_eq!(get(sluice.addr, "/").await.text(), "hello");
}

/// Replaces `path` with `text` (a new file renamed over it: a running binary's file
/// cannot be written), executable.
fn replace_executable(path: &std::path::Path, bytes: &[u8]) {
    use std::os::unix::fs::PermissionsExt;
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_binary_or_config_leaves_the_old_process_serving() {
    let dir = TempDir::new();
    let exe = dir.0.join("sluice");
    std::fs::copy(bin(), &exe).unwrap();
    // Whatever runs from this copy ends with the test, whichever way it ends.
    let _cleanup = KillMatching(exe.display().to_string());
    let text = "global { admin 127.0.0.1:0 }\nlisten 127.0.0.1:0\nsite * { respond \"hello\" }\n";
    let conf = dir.write("s.conf", text);
    let mut cmd = Command::new(&exe);
    cmd.args(["run", "-c", conf.to_str().unwrap()]);
    let sluice = Sluice::spawn_cmd(cmd, TempDir::new());
    let admin = sluice.admin();
    let pids = Pids::new();
    let old = serving_pid(admin).await;
    // A binary that exits at once.
    replace_executable(&exe, b"#!/bin/sh\necho broken build >&2\nexit 3\n");
    let (code, out) = upgrade_cli(admin).await;
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("exited (exit status: 3) before it was ready"),
        "{out}"
    );
    assert!(out.contains("keeps serving"), "{out}");
    assert_eq!(serving_pid(admin).await, old);
    assert_eq!(get(sluice.addr, "/").await.text(), "hello");
    // A file that is no program at all.
    replace_executable(&exe, b"\x7fELF but not really");
    let (code, out) = upgrade_cli(admin).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("keeps serving"), "{out}");
    // A slow one: a second SIGUSR2 meanwhile is ignored, and said so.
    replace_executable(&exe, b"#!/bin/sh\nsleep 1\nexit 4\n");
    sluice.signal("USR2");
    tokio::time::sleep(Duration::from_millis(300)).await;
    sluice.signal("USR2");
    sluice.wait_log("this SIGUSR2 is ignored");
    sluice.wait_log("exited (exit status: 4)");
    // The real binary again, with a config that does not load: its errors come back.
    replace_executable(&exe, &std::fs::read(bin()).unwrap());
    std::fs::write(&conf, format!("{text}site {{ broken\n")).unwrap();
    let (code, out) = upgrade_cli(admin).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("config rejected"), "{out}");
    assert!(out.contains("this block is never closed"), "{out}");
    assert_eq!(serving_pid(admin).await, old);
    assert_eq!(get(sluice.addr, "/").await.text(), "hello");
    // Fixed: the upgrade goes through.
    std::fs::write(&conf, text).unwrap();
    let (code, out) = upgrade_cli(admin).await;
    assert_eq!(code, 0, "{out}\n{}", sluice.logs());
    let new = new_pid(admin, old).await;
    pids.push(new);
    assert_eq!(get(sluice.addr, "/").await.text(), "hello");
}
