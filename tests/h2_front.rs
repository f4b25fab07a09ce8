//! The HTTP/2 front as a client of the `h2` crate sees it, over h2c: a backend's
//! `103 Early Hints` arrives before the answer, a HEAD's head carries the length a GET
//! would get (as HTTP/1.1 answers it), and a CONNECT that opens no WebSocket is a 400.

mod common;

use bytes::Bytes;
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// An h2c connection to sluice, its connection driven by a task of its own.
async fn connect(s: &Sluice) -> h2::client::SendRequest<Bytes> {
    let tcp = TcpStream::connect(s.addr).await.unwrap();
    let (send, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    send.ready().await.unwrap()
}

/// One request; the interim answers, then the final one and its body.
async fn exchange(
    send: &mut h2::client::SendRequest<Bytes>,
    req: http::Request<()>,
) -> (Vec<http::Response<()>>, http::Response<()>, Vec<u8>) {
    let (mut resp, _) = send.send_request(req, true).unwrap();
    let mut interim = Vec::new();
    while let Some(r) = std::future::poll_fn(|cx| resp.poll_informational(cx)).await {
        interim.push(r.unwrap());
    }
    let resp = tokio::time::timeout(WAIT, resp).await.unwrap().unwrap();
    let (parts, mut body) = resp.into_parts();
    let got = body_of(&mut body).await;
    (interim, http::Response::from_parts(parts, ()), got)
}

/// The rest of a response body, its window given back as it is read.
async fn body_of(body: &mut h2::RecvStream) -> Vec<u8> {
    let mut got = Vec::new();
    while let Some(d) = tokio::time::timeout(WAIT, body.data()).await.unwrap() {
        let d = d.unwrap();
        let _ = body.flow_control().release_capacity(d.len());
        got.extend_from_slice(&d);
    }
    got
}

#[tokio::test]
async fn early_hints_reach_an_h2c_client_before_the_answer() {
    let (backend, _task) = raw_backend(|mut c| async move {
        let mut head = Vec::new();
        let mut b = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if c.read(&mut b).await.unwrap_or(0) == 0 {
                return;
            }
            head.push(b[0]);
        }
        let _ = c
            .write_all(b"HTTP/1.1 103 Early Hints\r\nlink: </s.css>; rel=preload\r\n\r\n")
            .await;
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let _ = c
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nfinal")
            .await;
    })
    .await;
    let s = Sluice::start(&format!("site * {{ proxy {backend} }}"));
    let mut send = connect(&s).await;
    let req = http::Request::get(format!("http://{}/", s.addr))
        .body(())
        .unwrap();
    let (interim, resp, body) = exchange(&mut send, req).await;
    assert_eq!(interim.len(), 1, "one interim answer");
    assert_eq!(interim[0].status(), 103);
    assert_eq!(interim[0].headers()["link"], "</s.css>; rel=preload");
    assert_eq!(resp.status(), 200);
    assert_eq!(body, b"final");
}

#[tokio::test]
async fn a_head_carries_the_length_and_a_bare_connect_is_refused() {
    let s = Sluice::start("site * { respond \"twelve bytes\" }");
    let mut send = connect(&s).await;
    let url = format!("http://{}/", s.addr);
    let (_, get, body) = exchange(&mut send, http::Request::get(&url).body(()).unwrap()).await;
    assert_eq!(body, b"twelve bytes");
    let head = http::Request::head(&url).body(()).unwrap();
    let (_, head, body) = exchange(&mut send, head).await;
    assert_eq!(head.status(), 200);
    assert!(body.is_empty(), "no body after a HEAD");
    assert_eq!(
        head.headers().get("content-length"),
        get.headers().get("content-length"),
        "a HEAD's length is the GET's"
    );
    assert_eq!(head.headers()["content-length"], "12");

    let connect = http::Request::connect(s.addr.to_string()).body(()).unwrap();
    let (_, resp, body) = exchange(&mut send, connect).await;
    assert_eq!(resp.status(), 400, "{}", String::from_utf8_lossy(&body));
    assert!(
        String::from_utf8_lossy(&body).contains("CONNECT is not served"),
        "{}",
        String::from_utf8_lossy(&body)
    );
}

/// A client whose window is shut gets a small answer's head, and its body once the
/// window opens; meanwhile the answer holds nothing of sluice's (the pool's one slot is
/// free for the next request): its last frame waits in the stream, not in a handler.
/// The frames before a streamed answer's last still wait for room (tests/idle.rs).
#[tokio::test]
async fn a_small_answer_waits_for_a_shut_window_without_holding_its_slot() {
    let b = Backend::text("small").await;
    let s = Sluice::start(&format!(
        "site * {{ proxy {} {{ limit 1 100ms }} }}",
        b.addr
    ));
    let tcp = TcpStream::connect(s.addr).await.unwrap();
    let (send, mut conn) = h2::client::Builder::new()
        .initial_window_size(0)
        .handshake::<_, Bytes>(tcp)
        .await
        .unwrap();
    let (open_tx, open_rx) = tokio::sync::oneshot::channel::<()>();
    let driver = tokio::spawn(async move {
        tokio::select! {
            _ = &mut conn => return,
            _ = open_rx => {}
        }
        conn.set_initial_window_size(65_535).unwrap();
        let _ = conn.await;
    });
    let mut send = send.ready().await.unwrap();
    let req = http::Request::get("http://a/").body(()).unwrap();
    let (resp, _) = send.send_request(req, true).unwrap();
    let resp = tokio::time::timeout(WAIT, resp).await.unwrap().unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    // Shut window: no byte of the body yet.
    assert!(
        tokio::time::timeout(std::time::Duration::from_millis(300), body.data())
            .await
            .is_err(),
        "data came through a window of zero"
    );
    // The slot is free: the next request is answered, not refused with 503.
    assert_eq!(
        get(s.addr, "/").await.status,
        200,
        "the shut stream holds the slot"
    );
    open_tx.send(()).unwrap();
    assert_eq!(body_of(&mut body).await, b"small");
    driver.abort();
}
