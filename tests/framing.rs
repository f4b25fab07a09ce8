//! HTTP/1.1 request framing that cannot be smuggled (DESIGN.md §14), head limits and
//! deadlines, keep-alive and pipelining — each driven over a raw socket.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn proxied() -> (Backend, Sluice) {
    let b = Backend::echo_head().await;
    let s = Sluice::start(&format!("site * {{ proxy {} }}", b.addr));
    (b, s)
}

/// Sends `req`, expects `status`, and checks the backend saw nothing at all.
async fn refused(req: &str, status: u16) {
    let (b, s) = proxied().await;
    let out = raw(s.addr, req.as_bytes()).await;
    let (r, _) = parse_response(&out).unwrap_or_else(|| {
        panic!(
            "no response to {req:?}: {:?}",
            String::from_utf8_lossy(&out)
        )
    });
    assert_eq!(r.status, status, "{req:?} answered {}", r.text());
    assert_eq!(
        r.header("connection"),
        Some("close"),
        "a refused head closes the connection"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        b.connections.load(Ordering::SeqCst),
        0,
        "{req:?} must never reach a backend"
    );
}

#[tokio::test]
async fn content_length_with_transfer_encoding_is_400() {
    refused("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400).await;
}

#[tokio::test]
async fn differing_content_lengths_are_400() {
    refused(
        "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
        400,
    )
    .await;
    refused(
        "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 6\r\n\r\nhello!",
        400,
    )
    .await;
}

#[tokio::test]
async fn bare_lf_is_400() {
    refused("GET / HTTP/1.1\nHost: a\n\n", 400).await;
    refused("GET / HTTP/1.1\r\nHost: a\nX-A: 1\r\n\r\n", 400).await;
}

#[tokio::test]
async fn obs_fold_is_400() {
    refused(
        "GET / HTTP/1.1\r\nHost: a\r\nX-A: 1\r\n  continued\r\n\r\n",
        400,
    )
    .await;
}

#[tokio::test]
async fn whitespace_in_or_before_the_colon_is_400() {
    refused("GET / HTTP/1.1\r\nHost: a\r\nX-A : 1\r\n\r\n", 400).await;
    refused("GET / HTTP/1.1\r\nHost: a\r\nX A: 1\r\n\r\n", 400).await;
    refused("GET / HTTP/1.1\r\nHost: a\r\nX-A\t: 1\r\n\r\n", 400).await;
}

#[tokio::test]
async fn invalid_chunk_size_is_400() {
    refused(
        "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
        400,
    )
    .await;
    refused(
        "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5 x\r\nhello\r\n0\r\n\r\n",
        400,
    )
    .await;
    refused(
        "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\nhello\r\n0\r\n\r\n",
        400,
    )
    .await;
}

#[tokio::test]
async fn transfer_codings_other_than_one_chunked_are_501() {
    refused(
        "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
        501,
    )
    .await;
    refused(
        "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n0\r\n\r\n",
        501,
    )
    .await;
    refused(
        "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: identity\r\n\r\n",
        501,
    )
    .await;
    refused("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 501).await;
}

#[tokio::test]
async fn control_character_in_transfer_encoding_is_400() {
    refused(
        "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\x0b\r\n\r\n0\r\n\r\n",
        400,
    )
    .await;
}

#[tokio::test]
async fn missing_or_doubled_host_is_400() {
    refused("GET / HTTP/1.1\r\n\r\n", 400).await;
    refused("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400).await;
}

#[tokio::test]
async fn oversized_heads_are_431() {
    let mut many = String::from("GET / HTTP/1.1\r\nHost: a\r\n");
    for i in 0..100 {
        many.push_str(&format!("X-{i}: v\r\n"));
    }
    many.push_str("\r\n");
    refused(&many, 431).await;
    let big = format!(
        "GET / HTTP/1.1\r\nHost: a\r\nX-Big: {}\r\n\r\n",
        "a".repeat(70 * 1024)
    );
    refused(&big, 431).await;
}

#[tokio::test]
async fn exactly_100_fields_pass() {
    let s = Sluice::start("site * { respond ok }");
    let mut req = String::from("GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n");
    for i in 0..98 {
        req.push_str(&format!("X-{i}: v\r\n"));
    }
    req.push_str("\r\n");
    let out = raw(s.addr, req.as_bytes()).await;
    assert_eq!(
        parse_response(&out).unwrap().0.status,
        200,
        "100 fields, Host included, is the limit"
    );
}

#[tokio::test]
async fn chunked_and_sized_bodies_reach_the_backend_intact() {
    let b = Backend::start(|req: hyper::Request<hyper::body::Incoming>| async move {
        use http_body_util::BodyExt;
        let te = req
            .headers()
            .get("transfer-encoding")
            .map(|v| v.to_str().unwrap().to_string());
        let body = req.into_body().collect().await.unwrap().to_bytes();
        hyper::Response::new(full(format!("{} {:?}", String::from_utf8_lossy(&body), te)))
    })
    .await;
    let s = Sluice::start(&format!("site * {{ proxy {} }}", b.addr));
    let out = raw(s.addr, b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5;x=y\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: 1\r\n\r\n").await;
    assert_eq!(
        parse_response(&out).unwrap().0.text(),
        "hello world Some(\"chunked\")"
    );
    let r = request(s.addr, "POST", "/", &[], b"sized body").await;
    assert_eq!(r.text(), "sized body None");
}

#[tokio::test]
async fn keep_alive_and_pipelining() {
    let (b, s) = proxied().await;
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    // Two pipelined requests in one write, then a third later on the same connection.
    c.write_all(b"GET /1 HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let mut got = Vec::new();
    let end = Instant::now() + WAIT;
    while got.len() < 2 && Instant::now() < end {
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout(WAIT, c.read(&mut chunk))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "connection closed early");
        buf.extend_from_slice(&chunk[..n]);
        while let Some((r, used)) = parse_response(&buf) {
            got.push(r.text().lines().next().unwrap().to_string());
            buf.drain(..used);
        }
    }
    assert_eq!(
        got,
        ["GET /1", "GET /2"],
        "pipelined responses come back in order"
    );
    c.write_all(b"GET /3 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(WAIT, c.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        parse_response(&rest).unwrap().0.text().lines().next(),
        Some("GET /3")
    );
    assert_eq!(
        b.connections.load(Ordering::SeqCst),
        1,
        "three requests share one backend connection"
    );
}

/// The two answers a connection carries before it closes.
async fn two_answers(c: &mut TcpStream) -> (Resp, Resp) {
    let mut all = answers(c).await.into_iter();
    let first = all.next().expect("the first answer");
    (first, all.next().expect("the second answer"))
}

/// The first read of a request that empties the socket forgets its readiness (no
/// `EAGAIN` read while the request is in flight); bytes that come later are still
/// heard: a request sent while the first waits for its backend is answered.
#[tokio::test]
async fn bytes_sent_while_a_request_is_in_flight_are_heard() {
    let b = Backend::start(|req: hyper::Request<hyper::body::Incoming>| async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        hyper::Response::new(full(req.uri().path().to_string()))
    })
    .await;
    let s = Sluice::start(&format!("site * {{ proxy {} }}", b.addr));
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    c.write_all(b"GET /first HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    c.write_all(b"GET /second HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let (first, second) = two_answers(&mut c).await;
    assert_eq!(
        (first.text(), second.text()),
        ("/first".into(), "/second".into())
    );
}

/// A large body that is ready with its head leaves beside it (the head's buffer and
/// the body's frames in one `writev`, the frames uncopied; small frames are copied
/// behind the head): sized and chunked in pieces of several sizes — copied only,
/// spilled only, copied then spilled, more frames than are spilled at once, a body
/// that ends among the spilled frames — come through whole, twice on one kept
/// connection.
#[tokio::test]
async fn large_ready_bodies_come_through_whole() {
    let mut cases = Vec::new();
    for len in [2_500usize, 5_000, 60_000] {
        let body: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
        cases.push((
            format!("{len} B sized"),
            body.clone(),
            [
                format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\n\r\n").into_bytes(),
                body.clone(),
            ]
            .concat(),
        ));
        for pieces in [&[len][..], &[1_000], &[3_000], &[1_000, 4_000], &[25_000]] {
            let mut reply = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
            let (mut at, mut i) = (0, 0);
            while at < len {
                let piece = &body[at..(at + pieces[i % pieces.len()]).min(len)];
                reply.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
                reply.extend_from_slice(piece);
                reply.extend_from_slice(b"\r\n");
                (at, i) = (at + piece.len(), i + 1);
            }
            reply.extend_from_slice(b"0\r\n\r\n");
            cases.push((
                format!("{len} B in chunks of {pieces:?}"),
                body.clone(),
                reply,
            ));
        }
    }
    for (name, body, reply) in cases {
        let reply: &'static [u8] = Vec::leak(reply);
        // Answers each request whole, in one write, on a kept connection.
        let (addr, task) = raw_backend(move |mut c| async move {
            let mut head = Vec::new();
            let mut buf = [0u8; 4096];
            while let Ok(n) = c.read(&mut buf).await {
                if n == 0 {
                    return;
                }
                head.extend_from_slice(&buf[..n]);
                while let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                    head.drain(..end + 4);
                    if c.write_all(reply).await.is_err() {
                        return;
                    }
                }
            }
        })
        .await;
        let s = Sluice::start(&format!("site * {{ proxy {addr} }}"));
        let mut c = TcpStream::connect(s.addr).await.unwrap();
        c.write_all(b"GET /1 HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let (first, second) = two_answers(&mut c).await;
        assert!(
            first.body == body && second.body == body,
            "{name}: a body came through changed"
        );
        task.abort();
    }
}

#[tokio::test]
async fn expect_100_continue_is_answered_when_the_body_is_wanted() {
    let b = Backend::start(|req: hyper::Request<hyper::body::Incoming>| async move {
        use http_body_util::BodyExt;
        let expect = req.headers().contains_key("expect");
        let body = req.into_body().collect().await.unwrap().to_bytes();
        hyper::Response::new(full(format!(
            "{} expect={expect}",
            String::from_utf8_lossy(&body)
        )))
    })
    .await;
    let s = Sluice::start(&format!("site * {{ proxy {} }}", b.addr));
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    c.write_all(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n").await.unwrap();
    let mut first = [0u8; 25];
    tokio::time::timeout(WAIT, c.read_exact(&mut first))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&first, b"HTTP/1.1 100 Continue\r\n\r\n");
    c.write_all(b"hello").await.unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(WAIT, c.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    let r = parse_response(&rest).unwrap().0;
    assert_eq!(
        r.text(),
        "hello expect=false",
        "the body arrives and Expect is hop-by-hop"
    );
}

#[tokio::test]
async fn http10_gets_a_closing_answer() {
    let s = Sluice::start("site * { respond hi }");
    let out = raw(s.addr, b"GET / HTTP/1.0\r\n\r\n").await;
    let r = parse_response(&out).unwrap().0;
    assert_eq!((r.status, r.text().as_str()), (200, "hi"));
}

/// One `GET /` on `c` and the first read of its answer.
async fn one_request(c: &mut TcpStream) -> ([u8; 1024], usize) {
    c.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let n = tokio::time::timeout(WAIT, c.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    (buf, n)
}

#[tokio::test]
async fn a_slow_head_is_cut_with_408_after_10s() {
    let s = Sluice::start("site * { respond hi }");
    // The first head of a connection, and a later one on a kept connection (its clock
    // starts when its first bytes come), at the same time.
    let slow = |first: bool| async move {
        let mut c = TcpStream::connect(s.addr).await.unwrap();
        let mut out = Vec::new();
        if !first {
            let (buf, n) = one_request(&mut c).await;
            assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let start = Instant::now();
        c.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n").await.unwrap();
        tokio::time::timeout(Duration::from_secs(15), c.read_to_end(&mut out))
            .await
            .expect("cut within 15s")
            .unwrap();
        let took = start.elapsed();
        assert!(
            took >= Duration::from_secs(9),
            "first {first}: cut too early: {took:?}"
        );
        assert_eq!(
            parse_response(&out).map(|r| r.0.status),
            Some(408),
            "first {first}: {:?}",
            String::from_utf8_lossy(&out)
        );
    };
    tokio::join!(slow(true), slow(false));

    // A connection that sends nothing is closed silently.
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(15), c.read_to_end(&mut out))
        .await
        .expect("closed within 15s")
        .unwrap();
    assert!(out.is_empty(), "no bytes for a silent connection: {out:?}");
}

#[tokio::test]
async fn an_idle_keep_alive_connection_closes_after_60s() {
    let s = Sluice::start("site * { respond hi }");
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    let (mut buf, n) = one_request(&mut c).await;
    assert!(parse_response(&buf[..n]).is_some());
    let idle = Instant::now();
    let n = tokio::time::timeout(Duration::from_secs(70), c.read(&mut buf))
        .await
        .expect("closed within 70s")
        .unwrap();
    assert_eq!(n, 0, "closed silently, no bytes");
    let took = idle.elapsed();
    assert!(
        took >= Duration::from_secs(59),
        "closed too early: {took:?}"
    );
}

#[tokio::test]
async fn a_peer_cannot_write_log_lines_at_will() {
    let s = Sluice::start("site * { respond ok }");
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]); // SETTINGS, empty
    for i in 0..10_000u64 {
        // PING with the ACK flag, which nobody asked for.
        out.extend_from_slice(&[0, 0, 8, 6, 1, 0, 0, 0, 0]);
        out.extend_from_slice(&i.to_be_bytes());
    }
    c.write_all(&out).await.unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        let mut buf = [0u8; 4096];
        while c.read(&mut buf).await.is_ok_and(|n| n > 0) {}
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let lines = s.logs.lock().unwrap().len();
    assert!(
        lines < 20,
        "10,000 unsolicited PING ACKs made {lines} log lines:\n{}",
        s.logs()
    );
}
