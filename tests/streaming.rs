//! Bodies and connections: the in-flight limit, `max_body`, connection reuse and its
//! idle rules, abandoned responses, live streaming, and bounded memory for big bodies.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Request, Response};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[tokio::test]
async fn limit_refuses_with_503_and_retry_after_when_the_wait_runs_out() {
    let b = Backend::start(|_| async {
        tokio::time::sleep(Duration::from_millis(800)).await;
        Response::new(full("slow"))
    })
    .await;
    let s = Sluice::start(&format!(
        "site * {{ proxy {} {{ limit 1 200ms }} }}",
        b.addr
    ));
    let addr = s.addr;
    let first = tokio::spawn(async move { get(addr, "/").await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let start = Instant::now();
    let r = get(s.addr, "/").await;
    assert_eq!(r.status, 503, "the second request finds the one slot taken");
    assert_eq!(r.text(), "Server busy, retry in a moment\n");
    assert_eq!(r.header("retry-after"), Some("2"));
    assert!(
        start.elapsed() >= Duration::from_millis(180),
        "it waited for a slot first: {:?}",
        start.elapsed()
    );
    assert_eq!(first.await.unwrap().text(), "slow");
    assert_eq!(
        get(s.addr, "/").await.text(),
        "slow",
        "the slot is free again"
    );
}

#[tokio::test]
async fn a_waiting_request_gets_the_slot_when_it_frees() {
    let b = Backend::start(|_| async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        Response::new(full("ok"))
    })
    .await;
    let s = Sluice::start(&format!("site * {{ proxy {} {{ limit 1 3s }} }}", b.addr));
    let addr = s.addr;
    let first = tokio::spawn(async move { get(addr, "/").await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        get(s.addr, "/").await.text(),
        "ok",
        "waited up to 3s and got the slot"
    );
    assert_eq!(first.await.unwrap().text(), "ok");
}

/// A backend that reads every request body to its end and answers with its length.
fn counting_sink() -> (Arc<AtomicU64>, Handler) {
    let total = Arc::new(AtomicU64::new(0));
    let t = total.clone();
    let f: Handler = Arc::new(move |req: Request<Incoming>| {
        let t = t.clone();
        Box::pin(async move {
            let mut body = req.into_body();
            let mut n = 0u64;
            while let Some(frame) = body.frame().await {
                match frame {
                    Ok(f) => n += f.data_ref().map_or(0, |d| d.len() as u64),
                    Err(_) => break,
                }
            }
            t.fetch_add(n, Ordering::SeqCst);
            Response::new(full(format!("{n}")))
        })
    });
    (total, f)
}

#[tokio::test]
async fn max_body_refuses_declared_and_streamed_bodies_with_413() {
    let (_, sink) = counting_sink();
    let b = Backend::with(sink).await;
    let s = Sluice::start(&format!(
        "site * {{ proxy {} {{ max_body 1K; all_down fail }} }}",
        b.addr
    ));
    let r = request(s.addr, "POST", "/", &[], &[b'x'; 2048]).await;
    assert_eq!(r.status, 413, "a declared length over max_body");
    assert_eq!(
        b.connections.load(Ordering::SeqCst),
        0,
        "refused before anything is sent"
    );

    let mut chunked = Vec::new();
    for _ in 0..4 {
        chunked.extend_from_slice(b"200\r\n");
        chunked.extend_from_slice(&[b'y'; 512]);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let r = request(
        s.addr,
        "POST",
        "/",
        &[("Transfer-Encoding", "chunked")],
        &chunked,
    )
    .await;
    assert_eq!(
        r.status, 413,
        "a streamed body cut when it passes the limit"
    );

    let r = request(s.addr, "POST", "/", &[], &[b'z'; 1000]).await;
    assert_eq!(
        (r.status, r.text().as_str()),
        (200, "1000"),
        "under the limit passes; the backend was not marked failed"
    );
}

#[tokio::test]
async fn route_level_max_body_applies_to_every_handler() {
    let s = Sluice::start("site * { max_body 10\n respond ok }");
    assert_eq!(
        request(s.addr, "POST", "/", &[], b"0123456789A")
            .await
            .status,
        413
    );
    assert_eq!(
        request(s.addr, "POST", "/", &[], b"0123456789")
            .await
            .status,
        200
    );
}

#[tokio::test]
async fn backend_connections_are_reused_and_closed_when_idle() {
    let b = Backend::text("ok").await;
    let s = Sluice::start(&format!(
        "site * {{ proxy {} {{ keepalive 4 500ms }} }}",
        b.addr
    ));
    for _ in 0..5 {
        assert_eq!(get(s.addr, "/").await.text(), "ok");
    }
    assert_eq!(
        b.connections.load(Ordering::SeqCst),
        1,
        "sequential requests reuse one backend connection"
    );
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(get(s.addr, "/").await.text(), "ok");
    assert_eq!(
        b.connections.load(Ordering::SeqCst),
        2,
        "an idle connection past IDLE_TIMEOUT is not used"
    );
}

#[tokio::test]
async fn idle_connections_are_closed_by_sluice_after_idle_timeout() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let closed = Arc::new(AtomicBool::new(false));
    let c2 = closed.clone();
    let task = tokio::spawn(async move {
        let (mut c, _) = l.accept().await.unwrap();
        let mut buf = [0u8; 4096];
        let _ = c.read(&mut buf).await.unwrap();
        c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            .await
            .unwrap();
        // sluice should close this idle connection by itself.
        let n = tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf)).await;
        c2.store(matches!(n, Ok(Ok(0))), Ordering::SeqCst);
    });
    let s = Sluice::start(&format!(
        "site * {{ proxy {addr} {{ keepalive 4 300ms }} }}"
    ));
    assert_eq!(get(s.addr, "/").await.text(), "ok");
    tokio::time::timeout(Duration::from_secs(6), task)
        .await
        .unwrap()
        .unwrap();
    assert!(
        closed.load(Ordering::SeqCst),
        "sluice closed the idle backend connection"
    );
}

#[tokio::test]
async fn a_pooled_connection_the_backend_closed_is_replaced_by_a_fresh_one() {
    // Answers each connection once, with keep-alive, then closes it quietly.
    let (addr, task) = answer_once(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").await;
    let s = Sluice::start(&format!("site * {{ proxy {addr} {{ retries 0 }} }}"));
    for i in 0..4 {
        let r = get(s.addr, "/").await;
        assert_eq!(
            r.status, 200,
            "request {i} found a closed pooled connection and went out on a fresh one"
        );
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    task.abort();
}

#[tokio::test]
async fn a_response_the_client_abandons_closes_its_backend_connection() {
    let gone = Arc::new(AtomicBool::new(false));
    let g = gone.clone();
    let b = Backend::start(move |_| {
        let g = g.clone();
        async move {
            let (tx, body) = channel_body();
            tokio::spawn(async move {
                let chunk = Bytes::from(vec![b'x'; 16 * 1024]);
                for _ in 0..100_000 {
                    if tx.send(chunk.clone()).await.is_err() {
                        g.store(true, Ordering::SeqCst);
                        return;
                    }
                }
            });
            Response::new(body)
        }
    })
    .await;
    let s = Sluice::start(&format!("site * {{ proxy {} }}", b.addr));
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    c.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    let n = tokio::time::timeout(WAIT, c.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(n > 0);
    drop(c);
    let end = Instant::now() + WAIT;
    while !gone.load(Ordering::SeqCst) && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        gone.load(Ordering::SeqCst),
        "the backend saw its connection close when the client left"
    );
}

#[tokio::test]
async fn server_sent_events_arrive_as_produced() {
    let b = Backend::start(|_| async {
        let (tx, body) = channel_body();
        tokio::spawn(async move {
            let _ = tx.send(Bytes::from_static(b"data: first\n\n")).await;
            tokio::time::sleep(Duration::from_millis(1500)).await;
            let _ = tx.send(Bytes::from_static(b"data: second\n\n")).await;
        });
        Response::builder()
            .header("content-type", "text/event-stream")
            .body(body)
            .unwrap()
    })
    .await;
    let s = Sluice::start(&format!("site * {{ proxy {} }}", b.addr));
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    let start = Instant::now();
    c.write_all(b"GET /events HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    while !String::from_utf8_lossy(&got).contains("data: first") {
        let mut buf = [0u8; 1024];
        let n = tokio::time::timeout(WAIT, c.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0);
        got.extend_from_slice(&buf[..n]);
    }
    assert!(
        start.elapsed() < Duration::from_millis(1000),
        "the first event came before the second was produced: {:?}",
        start.elapsed()
    );
}

const GIB: u64 = 1 << 30;

/// RSS growth limit while a 1 GiB body passes (DESIGN: under 64 MiB above idle).
const RSS_LIMIT_KIB: u64 = 64 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1gib_download_streams_in_bounded_memory() {
    let b = Backend::start(|req: Request<Incoming>| async move {
        if req.uri().path() == "/warm" {
            return Response::new(full("warm"));
        }
        let (tx, body) = channel_body();
        tokio::spawn(async move {
            let chunk = Bytes::from(vec![b'd'; 64 * 1024]);
            for _ in 0..(GIB / (64 * 1024)) {
                if tx.send(chunk.clone()).await.is_err() {
                    return;
                }
            }
        });
        Response::builder()
            .header("content-length", GIB.to_string())
            .body(body)
            .unwrap()
    })
    .await;
    let s = Sluice::start(&format!("site * {{ proxy {} }}", b.addr));
    assert_eq!(get(s.addr, "/warm").await.text(), "warm");
    let (idle, _) = rss_kib(s.pid());
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    c.write_all(b"GET /big HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0u64;
    let mut peak = idle;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let n = tokio::time::timeout(WAIT, c.read(&mut buf))
            .await
            .expect("data keeps flowing")
            .unwrap();
        if n == 0 {
            break;
        }
        total += n as u64;
        if total % (64 << 20) < n as u64 {
            peak = peak.max(rss_kib(s.pid()).0);
        }
        assert!(Instant::now() < deadline, "1 GiB took over 120s");
    }
    let (_, hwm) = rss_kib(s.pid());
    assert!(total > GIB, "the whole body (and head) arrived: {total}");
    let growth = hwm.max(peak).saturating_sub(idle);
    assert!(
        growth < RSS_LIMIT_KIB,
        "RSS grew {growth} KiB while 1 GiB passed (idle {idle} KiB)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1gib_upload_streams_in_bounded_memory() {
    let (total, sink) = counting_sink();
    let b = Backend::with(sink).await;
    let s = Sluice::start(&format!("site * {{ proxy {} }}", b.addr));
    assert_eq!(get(s.addr, "/warm").await.status, 200);
    let (idle, _) = rss_kib(s.pid());
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    c.write_all(
        format!(
            "POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: {GIB}\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let chunk = vec![b'u'; 256 * 1024];
    let deadline = Instant::now() + Duration::from_secs(120);
    let pid = s.pid();
    let mut peak = idle;
    for i in 0..(GIB / chunk.len() as u64) {
        tokio::time::timeout(WAIT, c.write_all(&chunk))
            .await
            .expect("sluice keeps reading")
            .unwrap();
        if i % 256 == 0 {
            peak = peak.max(rss_kib(pid).0);
        }
        assert!(Instant::now() < deadline, "1 GiB took over 120s");
    }
    let mut out = Vec::new();
    tokio::time::timeout(WAIT, c.read_to_end(&mut out))
        .await
        .unwrap()
        .unwrap();
    let r = parse_response(&out).expect("a response").0;
    assert_eq!(r.text(), GIB.to_string(), "the backend received every byte");
    assert_eq!(total.load(Ordering::SeqCst), GIB);
    let (_, hwm) = rss_kib(pid);
    let growth = hwm.max(peak).saturating_sub(idle);
    assert!(
        growth < RSS_LIMIT_KIB,
        "RSS grew {growth} KiB while 1 GiB passed (idle {idle} KiB)"
    );
}

#[tokio::test]
async fn an_early_413_reaches_a_client_still_uploading() {
    let s = Sluice::start("site * { max_body 1K\n respond ok }");
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    let size = 8 << 20;
    c.write_all(format!("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: {size}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let chunk = vec![b'x'; 64 * 1024];
    let (mut rd, mut wr) = c.into_split();
    let writer = tokio::spawn(async move {
        for _ in 0..(size / chunk.len()) {
            if wr.write_all(&chunk).await.is_err() {
                return false;
            }
        }
        true
    });
    let mut out = Vec::new();
    tokio::time::timeout(WAIT, rd.read_to_end(&mut out))
        .await
        .expect("answered and closed")
        .ok();
    let r = parse_response(&out).map(|r| r.0.status);
    assert_eq!(
        r,
        Some(413),
        "the client reads the 413 although it was still sending: {:?}",
        String::from_utf8_lossy(&out)
    );
    let _ = writer.await;
}

#[tokio::test]
async fn a_backend_answering_before_the_upload_ends_is_passed_on() {
    // Reads only the head, answers 413 while the upload is still coming, and then reads
    // nothing more for longer than the answer may take to arrive: sluice has to pass
    // the answer on while its upload is stuck. (It used to close 100 ms after
    // answering, with the upload unread: the reset that sends can destroy the answer
    // before sluice reads it, and on a loaded machine that raced.)
    let (addr, task) = raw_backend(|mut c| async move {
        let mut buf = [0u8; 4096];
        let _ = c.read(&mut buf).await;
        let _ = c
            .write_all(b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 8\r\nConnection: close\r\n\r\ntoo big\n")
            .await;
        tokio::time::sleep(Duration::from_secs(6)).await;
    })
    .await;
    let s = Sluice::start(&format!("site * {{ proxy {addr} }}"));
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    let size = 4 << 20;
    c.write_all(format!("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: {size}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let (mut rd, mut wr) = c.into_split();
    let writer = tokio::spawn(async move {
        let chunk = vec![b'x'; 64 * 1024];
        for _ in 0..(size / chunk.len()) {
            if wr.write_all(&chunk).await.is_err() {
                return;
            }
        }
    });
    let mut out = Vec::new();
    let start = Instant::now();
    tokio::time::timeout(WAIT, rd.read_to_end(&mut out))
        .await
        .expect("answered and closed")
        .ok();
    let r = parse_response(&out).expect("a response").0;
    assert_eq!(
        (r.status, r.text().as_str()),
        (413, "too big\n"),
        "the backend's own early answer passes unchanged"
    );
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "no hang waiting for the rest of the upload: {:?}",
        start.elapsed()
    );
    let _ = writer.await;
    task.abort();
}

#[tokio::test]
async fn an_answer_before_the_body_arrived_says_the_connection_closes() {
    let s = Sluice::start("site * { respond ok }");
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    c.write_all(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 100000\r\n\r\nonly a little")
        .await
        .unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(WAIT, c.read_to_end(&mut out))
        .await
        .expect("answered and closed")
        .ok();
    let (r, _) = parse_response(&out).expect("a response");
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("connection"),
        Some("close"),
        "sluice closes after answering an unread body, and says so"
    );
}

#[tokio::test]
async fn a_client_still_uploading_sees_a_lingering_close() {
    let s = Sluice::start("site * { max_body 1K\n respond ok }");
    let c = TcpStream::connect(s.addr).await.unwrap();
    let (mut rd, mut wr) = c.into_split();
    wr.write_all(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 16777216\r\n\r\n")
        .await
        .unwrap();
    wr.write_all(&vec![b'x'; 64 * 1024]).await.unwrap();
    let mut head = vec![0u8; 512];
    let n = tokio::time::timeout(WAIT, rd.read(&mut head))
        .await
        .unwrap()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&head[..n]).starts_with("HTTP/1.1 413"),
        "{:?}",
        String::from_utf8_lossy(&head[..n])
    );
    // The answer came; the upload goes on for a while and sluice reads it away instead
    // of resetting the connection under the client.
    for i in 0..32 {
        let w = tokio::time::timeout(WAIT, wr.write_all(&vec![b'y'; 64 * 1024])).await;
        assert!(
            matches!(w, Ok(Ok(()))),
            "write {i} after the 413 failed: the connection was reset, not closed lingering"
        );
    }
    wr.shutdown().await.unwrap();
    let mut rest = Vec::new();
    let r = tokio::time::timeout(WAIT, rd.read_to_end(&mut rest))
        .await
        .unwrap();
    assert!(r.is_ok(), "a clean close, not a reset: {r:?}");
}
