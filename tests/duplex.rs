//! Full duplex through every front (DESIGN §18.5): a request body keeps flowing to the
//! backend after the response head arrived, until it ends. Each test is a ping-pong
//! through an h2c backend that echoes frames as they come: every message goes out only
//! after the one before came back, so a proxy that stops the upload once the response
//! head arrived hangs at the second message (sluice did, before). The HTTP/3 front's
//! case is in `tests/h3.rs`; real gRPC programs in `tests/grpc.rs`. nginx buffers a
//! request body whole before it proxies it unless `proxy_request_buffering off`, so a
//! ping-pong through its `proxy_pass` waits for the upload's end; `grpc_pass` streams
//! both ways.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ROUNDS: usize = 5;

/// HTTP/1.1 front: a chunked upload, the answer chunked back as it comes.
#[tokio::test]
async fn ping_pong_over_an_http1_client() {
    let (echo, _task) = h2c_echo().await;
    let s = Sluice::start(&format!("site * {{ proxy h2c://{echo} }}"));
    let mut c = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    c.write_all(
        b"POST /echo HTTP/1.1\r\nhost: a.test\r\ntransfer-encoding: chunked\r\n\r\n5\r\nping0\r\n",
    )
    .await
    .unwrap();
    let mut got = String::new();
    let mut buf = [0u8; 4096];
    for i in 0..ROUNDS {
        if i > 0 {
            c.write_all(format!("5\r\nping{i}\r\n").as_bytes())
                .await
                .unwrap();
        }
        let want = format!("ping{i}");
        while !got.contains(&want) {
            let n = tokio::time::timeout(WAIT, c.read(&mut buf))
                .await
                .unwrap_or_else(|_| panic!("echo {i} came back: {got:?}"))
                .unwrap();
            assert!(n > 0, "closed: {got:?}");
            got.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    }
    assert!(got.starts_with("HTTP/1.1 200 OK\r\n"), "{got}");
    c.write_all(b"0\r\n\r\n").await.unwrap();
    // The answer ends once the upload did.
    let end = tokio::time::timeout(WAIT, async {
        while !got.ends_with("0\r\n\r\n") {
            let n = c.read(&mut buf).await.unwrap();
            assert!(n > 0);
            got.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    })
    .await;
    assert!(end.is_ok(), "{got}");
}

/// HTTP/2 front (h2c): the request body a channel the test feeds message by message.
#[tokio::test]
async fn ping_pong_over_an_http2_client() {
    let (echo, _task) = h2c_echo().await;
    let s = Sluice::start(&format!("site * {{ proxy h2c://{echo} }}"));
    ping_pong_h2(s.addr).await;
}

/// The ping-pong from an h2c client through sluice at `addr`.
async fn ping_pong_h2(addr: std::net::SocketAddr) {
    let (tx, body) = channel_body();
    let (mut send, _conn) = h2c::<Body>(addr).await;
    tx.send(Bytes::from_static(b"ping0")).await.unwrap();
    let req = hyper::Request::post("http://a.test/echo")
        .body(body)
        .unwrap();
    let resp = tokio::time::timeout(WAIT, send.send_request(req))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    for i in 0..ROUNDS {
        if i > 0 {
            tx.send(Bytes::from(format!("ping{i}"))).await.unwrap();
        }
        let frame = tokio::time::timeout(WAIT, body.frame())
            .await
            .unwrap_or_else(|_| panic!("echo {i} came back"))
            .unwrap()
            .unwrap();
        assert_eq!(frame.into_data().unwrap(), format!("ping{i}"));
    }
    drop(tx);
    let end = tokio::time::timeout(Duration::from_secs(5), body.collect()).await;
    assert!(end.is_ok(), "the answer ends once the upload did");
}

/// An HTTP/1.1 backend that answers at once and then echoes a chunked upload as it
/// arrives: the upload goes on after the answer's head (until the answer is complete),
/// so each message comes back before the next is sent.
#[tokio::test]
async fn ping_pong_with_an_http1_backend() {
    let (backend, _task) = raw_backend(|mut c| async move {
        // The head, then the answer's head at once, then each chunk echoed.
        let mut buf = Vec::new();
        let mut tmp = [0u8; 4096];
        let head_end = loop {
            let n = c.read(&mut tmp).await.unwrap_or(0);
            if n == 0 {
                return;
            }
            buf.extend_from_slice(&tmp[..n]);
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
        };
        let _ = c
            .write_all(
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n",
            )
            .await;
        let mut body = buf.split_off(head_end);
        loop {
            // Echo every whole chunk; the last one ends both.
            while let Some(line) = body.windows(2).position(|w| w == b"\r\n") {
                let size =
                    usize::from_str_radix(std::str::from_utf8(&body[..line]).unwrap(), 16).unwrap();
                if size == 0 {
                    let _ = c.write_all(b"0\r\n\r\n").await;
                    return;
                }
                if body.len() < line + 2 + size + 2 {
                    break;
                }
                let chunk: Vec<u8> = body.drain(..line + 2 + size + 2).collect();
                let _ = c.write_all(&chunk).await;
            }
            let n = c.read(&mut tmp).await.unwrap_or(0);
            if n == 0 {
                return;
            }
            body.extend_from_slice(&tmp[..n]);
        }
    })
    .await;
    let s = Sluice::start(&format!("site * {{ proxy {backend} }}"));
    ping_pong_h2(s.addr).await;
}

/// An HTTP/2 backend that answers whole at once and reads the upload afterwards: an
/// HTTP/1.1 client's body still reaches it to its end (not cut where the answer
/// ended), and the client's connection then carries its next request.
#[tokio::test]
async fn the_upload_goes_on_after_a_complete_answer() {
    use std::sync::{Arc, Mutex};
    let got: Arc<Mutex<Option<usize>>> = Arc::default();
    let seen = got.clone();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend = l.local_addr().unwrap();
    let _task = tokio::spawn(async move {
        while let Ok((c, _)) = l.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let seen = seen.clone();
                        async move {
                            // The body is read after the answer, in a task of its own.
                            tokio::spawn(async move {
                                if let Ok(b) = req.into_body().collect().await {
                                    *seen.lock().unwrap() = Some(b.to_bytes().len());
                                }
                            });
                            Ok::<_, std::convert::Infallible>(hyper::Response::new(full("early")))
                        }
                    },
                );
                let _ =
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(c), svc)
                        .await;
            });
        }
    });
    let s = Sluice::start(&format!("site * {{ proxy h2c://{backend} }}"));
    let mut c = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    c.write_all(
        b"POST /up HTTP/1.1\r\nhost: a.test\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n",
    )
    .await
    .unwrap();
    let mut got_text = String::new();
    let mut buf = [0u8; 4096];
    while !got_text.contains("early") {
        let n = tokio::time::timeout(WAIT, c.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "{got_text}");
        got_text.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    for piece in ["6\r\nsecond\r\n", "5\r\nthird\r\n", "0\r\n\r\n"] {
        tokio::time::sleep(Duration::from_millis(50)).await;
        c.write_all(piece.as_bytes()).await.unwrap();
    }
    let end = std::time::Instant::now() + WAIT;
    while got.lock().unwrap().is_none() && std::time::Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        *got.lock().unwrap(),
        Some(16),
        "every byte, to the body's end: {}",
        s.logs()
    );
    // The connection carries the next request.
    c.write_all(b"GET /again HTTP/1.1\r\nhost: a.test\r\n\r\n")
        .await
        .unwrap();
    let mut again = String::new();
    while !again.contains("early") {
        let n = tokio::time::timeout(WAIT, c.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "the connection closed: {again}");
        again.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
}
