//! `workers N`: what must hold whichever worker thread takes a connection. Every
//! connection is served, a listener a reload removes stops accepting, an L4 listener's
//! `max_conns` counts across the workers, and a kept backend connection is reused by
//! any of them. (A thread-per-worker design, each worker with a poller and a duplicate
//! of every listening socket of its own, was tried and measured: docs/performance.md,
//! "ninth part". These tests fail on each of the ways it could have gone wrong.) Over
//! real sockets, with the real binary.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_connection_is_served_and_a_removed_listener_closes() {
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let extra = free.local_addr().unwrap();
    drop(free);
    let config = |with_extra: bool| {
        let listen = match with_extra {
            true => format!("listen {extra}\n"),
            false => String::new(),
        };
        without_admin(&format!(
            "global {{ workers 4 }}\nlisten 127.0.0.1:0\n{listen}site * {{ respond \"hi\" }}"
        ))
    };
    let dir = TempDir::new();
    let path = dir.write("sluice.conf", &config(true));
    let p = path.to_str().unwrap().to_string();
    let s = Sluice::spawn(&["run", "-c", &p], dir);
    // A connection a request, some at once: each is answered, whichever worker takes it.
    for _ in 0..10 {
        let answers: Vec<Resp> =
            futures_util::future::join_all((0..8).map(|_| get(extra, "/"))).await;
        assert!(answers.iter().all(|r| r.status == 200 && r.text() == "hi"));
    }
    std::fs::write(&path, config(false)).unwrap();
    s.signal("HUP");
    s.wait_log("reloaded: revision 2");
    // Closed once no worker accepts on it any more.
    let start = Instant::now();
    while TcpStream::connect(extra).await.is_ok() {
        assert!(start.elapsed() < WAIT, "the removed listener still accepts");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        get(s.addr, "/").await.text(),
        "hi",
        "the kept one serves on"
    );
}

/// An L4 listener's `max_conns` is the listener's, not each worker's: with four
/// workers and a cap of 2, no third connection is relayed, whichever worker takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_l4_cap_counts_across_the_workers() {
    let (b, _t) = raw_backend(|mut c| async move {
        let _ = c.write_all(b"hello ").await;
        let mut buf = [0u8; 64];
        while let Ok(n @ 1..) = c.read(&mut buf).await {
            let _ = c.write_all(&buf[..n]).await;
        }
    })
    .await;
    let s = Sluice::start(&format!(
        "global {{ workers 4 }}\ntcp 127.0.0.1:0 {{\n max_conns 2\n proxy {b}\n }}\nsite * {{ respond ok }}"
    ));
    let line = s.wait_log("relaying tcp on ");
    let addr: std::net::SocketAddr = line.rsplit_once(' ').unwrap().1.parse().unwrap();
    let mut held = Vec::new();
    for _ in 0..2 {
        // The first two are relayed.
        held.push(greeted(addr, 6).await.0);
    }
    for i in 0..8 {
        let mut over = TcpStream::connect(addr).await.unwrap();
        let mut buf = [0u8; 16];
        let n = tokio::time::timeout(WAIT, over.read(&mut buf))
            .await
            .expect("closed at once")
            .unwrap_or(0);
        assert_eq!(n, 0, "connection {} over the cap was relayed", i + 3);
    }
}

/// A backend connection kept after one worker's request is taken by the next request
/// whichever worker serves it, rather than a new one dialled beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_backend_connection_serves_every_worker() {
    let b = Backend::text("kept").await;
    let s = Sluice::start(&format!(
        "global {{ workers 4 }}\nsite * {{ proxy {} }}",
        b.addr
    ));
    for _ in 0..30 {
        // A new client connection each time: any worker may take it.
        assert_eq!(get(s.addr, "/").await.text(), "kept");
        // The backend connection goes back to its list once the response has been read.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(b.requests.load(Ordering::SeqCst), 30);
    assert_eq!(
        b.connections.load(Ordering::SeqCst),
        1,
        "one backend connection, kept and reused by whichever worker took the request"
    );
}
