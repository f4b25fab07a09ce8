//! SIGTERM and SIGINT: stop accepting, let requests in flight finish for up to
//! `grace`, then exit 0; requests still open after grace are cut and counted.

mod common;

use std::time::{Duration, Instant};

use common::*;
use hyper::Response;

async fn slow_backend(delay: Duration) -> Backend {
    Backend::start(move |_| async move {
        tokio::time::sleep(delay).await;
        Response::new(full("finished"))
    })
    .await
}

#[tokio::test]
async fn sigterm_lets_a_slow_request_finish_then_exits_0() {
    let b = slow_backend(Duration::from_millis(1500)).await;
    let mut s = Sluice::start(&format!("site * {{ proxy {} }}", b.addr));
    let addr = s.addr;
    let slow = tokio::spawn(async move { get(addr, "/").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    s.signal("TERM");
    s.wait_log("sluice: stopping");
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "no new connections after SIGTERM"
    );
    let r = tokio::time::timeout(WAIT, slow).await.unwrap().unwrap();
    assert_eq!(
        (r.status, r.text().as_str()),
        (200, "finished"),
        "the request in flight finished"
    );
    assert_eq!(s.wait_exit(WAIT), Some(0));
    // The drain's end is said, not only its start.
    let logs = s.logs();
    assert!(
        logs.contains("sluice: drained: 1 requests finished in"),
        "{logs}"
    );
}

#[tokio::test]
async fn sigint_closes_idle_connections_at_once() {
    let mut s = Sluice::start("site * { respond ok }");
    let mut c = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    c.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 512];
    let _ = c.read(&mut buf).await.unwrap();
    let start = Instant::now();
    s.signal("INT");
    assert_eq!(s.wait_exit(WAIT), Some(0));
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "an idle keep-alive connection does not hold up shutdown"
    );
}

#[tokio::test]
async fn requests_still_open_after_grace_are_cut_and_counted() {
    let b = slow_backend(Duration::from_secs(30)).await;
    let mut s = Sluice::start(&format!(
        "global {{ grace 500ms }}\nsite * {{ proxy {} }}",
        b.addr
    ));
    let addr = s.addr;
    let _slow = tokio::spawn(async move { raw(addr, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let start = Instant::now();
    s.signal("TERM");
    assert_eq!(s.wait_exit(WAIT), Some(0), "exit code stays 0");
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "grace 500ms bounds the wait: {:?}",
        start.elapsed()
    );
    s.wait_log("sluice: shutdown: cut 1 requests still in flight after grace");
}

#[tokio::test]
async fn silent_and_half_sent_connections_do_not_hold_up_shutdown() {
    use tokio::io::AsyncWriteExt;
    let mut s = Sluice::start("global { grace 30s }\nsite * { respond ok }");
    let silent = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let mut mid_head = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    mid_head
        .write_all(b"GET / HTTP/1.1\r\nHost: a\r\nX-Half: ")
        .await
        .unwrap();
    // A whole head, but its chunked body has not sent its first size line yet: not
    // dispatched, so nothing to finish either.
    let mut no_chunk = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    no_chunk
        .write_all(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let start = Instant::now();
    s.signal("TERM");
    assert_eq!(s.wait_exit(WAIT), Some(0));
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "a connection with no whole head closes when the drain starts: {:?}",
        start.elapsed()
    );
    drop((silent, mid_head, no_chunk));
}

#[tokio::test]
async fn a_second_signal_during_the_drain_exits_at_once() {
    let b = slow_backend(Duration::from_secs(30)).await;
    let mut s = Sluice::start(&format!(
        "global {{ grace 30s }}\nsite * {{ proxy {} }}",
        b.addr
    ));
    let addr = s.addr;
    let _slow = tokio::spawn(async move { raw(addr, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    s.signal("INT");
    s.wait_log("sluice: stopping");
    let start = Instant::now();
    s.signal("INT");
    assert_eq!(s.wait_exit(WAIT), Some(0));
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "Ctrl-C twice does not wait out grace: {:?}",
        start.elapsed()
    );
    s.wait_log("sluice: shutdown: cut 1 requests still in flight on a second signal");
}

/// Under systemd (`Type=notify`, `NOTIFY_SOCKET` set): READY=1 with MAINPID once the
/// listeners accept, RELOADING=1 (with MONOTONIC_USEC) and READY=1 around a reload,
/// STOPPING=1 when the drain starts.
#[tokio::test]
async fn systemd_hears_ready_reloading_and_stopping() {
    let dir = TempDir::new();
    let socket_path = dir.0.join("notify.sock");
    let socket = std::os::unix::net::UnixDatagram::bind(&socket_path).unwrap();
    socket.set_read_timeout(Some(WAIT)).unwrap();
    let conf = dir.write(
        "sluice.conf",
        &without_admin("listen 127.0.0.1:0\nsite * { respond \"up\\n\" }\n"),
    );
    let mut cmd = std::process::Command::new(bin());
    cmd.args(["run", "-c", conf.to_str().unwrap()])
        .env("NOTIFY_SOCKET", &socket_path);
    let mut s = Sluice::spawn_cmd(cmd, TempDir::new());
    let mut buf = [0u8; 512];
    let mut next = || {
        let n = socket.recv(&mut buf).expect("a notification in time");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    assert_eq!(next(), format!("READY=1\nMAINPID={}\n", s.pid()));
    assert_eq!(get(s.addr, "/").await.text(), "up\n", "ready means serving");
    s.signal("HUP");
    let reloading = next();
    assert!(
        reloading.starts_with("RELOADING=1\nMONOTONIC_USEC="),
        "{reloading:?}"
    );
    assert_eq!(next(), "READY=1\n");
    s.signal("TERM");
    assert_eq!(next(), "STOPPING=1\n");
    assert_eq!(s.wait_exit(WAIT), Some(0));
}
