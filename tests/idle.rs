//! Idle client connections close after 60 s (DESIGN §5): an HTTP/1.1 keep-alive
//! connection silently, an h2 connection with a GOAWAY once no stream has been open for
//! that long — but never while a stream is still streaming. A response the client
//! stops reading ends after 60 s without progress, on h1 and h2 alike. The test takes about
//! 125 s (its cases run side by side; one waits out two periods); the timeouts are the
//! product's, not test knobs.

mod common;

use std::time::{Duration, Instant};

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const IDLE: Duration = Duration::from_secs(60);

fn assert_closed_on_time(took: Duration, what: &str) {
    assert!(
        took >= IDLE - Duration::from_secs(2) && took < IDLE + Duration::from_secs(15),
        "{what} closed after {took:?}, not after about {IDLE:?}"
    );
}

/// The cases run side by side in one test: the test harness runs as many tests at
/// once as there are CPUs, and each case waits out the product's 60 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_timeouts() {
    tokio::join!(
        an_idle_keep_alive_connection_closes_after_60s(),
        an_idle_h2_connection_closes_after_60s(),
        an_h2_connection_with_a_stream_still_streaming_is_not_idle(),
        a_client_that_stops_reading_frees_its_slot_after_60s(false),
        a_client_that_stops_reading_frees_its_slot_after_60s(true),
        an_h2_request_body_that_stalls_fails_after_60s(),
        a_shut_window_under_a_small_answer_is_closed_after_two_periods(),
    );
}

/// An h2c client whose window is zero from the start and never opens, its connection
/// driven by a task of its own.
async fn shut_window(
    addr: std::net::SocketAddr,
) -> (
    h2::client::SendRequest<bytes::Bytes>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (send, conn) = h2::client::Builder::new()
        .initial_window_size(0)
        .handshake::<_, bytes::Bytes>(tcp)
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    (send.ready().await.unwrap(), conn)
}

/// A client that never opens its window on a small answer: the answer is done on
/// sluice's side at once (its last frame waits in the stream), so the connection is
/// idle from then; after the idle timeout's GOAWAY, the frame the window never let in
/// gets the send timeout, and the connection is closed.
async fn a_shut_window_under_a_small_answer_is_closed_after_two_periods() {
    let b = Backend::text("small").await;
    let s = Sluice::start(&format!("site * {{ proxy {} }}", b.addr));
    let (mut send, conn) = shut_window(s.addr).await;
    let req = http::Request::get("http://a/").body(()).unwrap();
    let (resp, _) = send.send_request(req, true).unwrap();
    let resp = resp.await.unwrap();
    assert_eq!(resp.status(), 200);
    let from = Instant::now();
    let _held = (send, resp);
    tokio::time::timeout(2 * IDLE + Duration::from_secs(20), conn)
        .await
        .expect("the connection with a shut window is closed")
        .ok();
    let took = from.elapsed();
    assert!(
        took >= 2 * IDLE - Duration::from_secs(2),
        "closed after {took:?}, before the idle and send timeouts"
    );
}

/// An HTTP/2 request body with no byte for 60 s fails, as an HTTP/1.1 one does: the
/// client gets 400 and the backend connection is let go.
async fn an_h2_request_body_that_stalls_fails_after_60s() {
    use http_body_util::BodyExt;
    let b = Backend::start(|req: hyper::Request<hyper::body::Incoming>| async move {
        let got = req.into_body().collect().await.map(|b| b.to_bytes().len());
        hyper::Response::new(full(format!("{got:?}")))
    })
    .await;
    // The pool's `timeout` (60 s by default, counted from the request's start) would
    // race the body's idle timeout to the same second: set past it, so the answer is
    // the body's.
    let s = Sluice::start(&format!("site * {{ proxy {} {{ timeout 120s }} }}", b.addr));
    let tcp = TcpStream::connect(s.addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake::<_, _, ChanBody>(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(bytes::Bytes::from_static(b"part of it"))
        .await
        .unwrap();
    let req = http::Request::post("http://a/upload")
        .body(ChanBody(rx))
        .unwrap();
    let stalled = Instant::now();
    let resp = tokio::time::timeout(IDLE + Duration::from_secs(20), send.send_request(req))
        .await
        .expect("an answer once the body stalled for 60 s")
        .unwrap();
    assert_eq!(resp.status(), 400, "a broken request body");
    assert_closed_on_time(stalled.elapsed(), "a stalled h2 request body");
    drop(tx);
}

/// A response the client stops reading (h1: the socket fills; h2: the stream's window
/// closes) ends once no byte moved for 60 s, freeing its `limit` slot and backend
/// connection; until then the slot stays taken.
async fn a_client_that_stops_reading_frees_its_slot_after_60s(h2: bool) {
    let b = Backend::start(|req: hyper::Request<hyper::body::Incoming>| async move {
        if req.uri().path() != "/endless" {
            return hyper::Response::new(full("small"));
        }
        let (tx, body) = channel_body();
        tokio::spawn(async move {
            let chunk = bytes::Bytes::from(vec![b'x'; 64 * 1024]);
            while tx.send(chunk.clone()).await.is_ok() {}
        });
        hyper::Response::new(body)
    })
    .await;
    let s = Sluice::start(&format!(
        "site * {{ proxy {} {{ limit 1 100ms }} }}",
        b.addr
    ));
    let mut _h1 = None;
    let mut _h2 = None;
    let mut h2_conn = None;
    if h2 {
        // A window of zero from the start: not one byte of body may be sent, and the
        // client never gives more (the tightest way to hold a stream open).
        let (mut send, conn) = shut_window(s.addr).await;
        h2_conn = Some(conn);
        let req = http::Request::get("http://a/endless").body(()).unwrap();
        let (resp, _) = send.send_request(req, true).unwrap();
        let resp = resp.await.unwrap();
        assert_eq!(resp.status(), 200);
        _h2 = Some((send, resp));
    } else {
        let mut c = TcpStream::connect(s.addr).await.unwrap();
        c.write_all(b"GET /endless HTTP/1.1\r\nHost: a\r\n\r\n")
            .await
            .unwrap();
        _h1 = Some(c);
    }
    let what = if h2 { "h2" } else { "h1" };
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        get(s.addr, "/small").await.status,
        503,
        "{what}: the unread response holds the pool's one slot"
    );
    let stalled = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if get(s.addr, "/small").await.status == 200 {
            break;
        }
        assert!(
            stalled.elapsed() < IDLE + Duration::from_secs(20),
            "{what}: the slot is still held after {:?}",
            stalled.elapsed()
        );
    }
    assert!(
        stalled.elapsed() >= IDLE - Duration::from_secs(10),
        "{what}: freed after {:?}, before the send timeout",
        stalled.elapsed()
    );
    if let Some(conn) = h2_conn {
        // Like nginx's send_timeout: the connection is closed, not left holding the stream.
        tokio::time::timeout(Duration::from_secs(10), conn)
            .await
            .expect("the h2 connection of the stalled stream is closed")
            .ok();
    }
}

async fn an_idle_keep_alive_connection_closes_after_60s() {
    let b = Backend::text("ok").await;
    let s = Sluice::start(&format!("site * {{ proxy {} }}", b.addr));
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    c.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = c.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    let idle_from = Instant::now();
    let n = tokio::time::timeout(IDLE + Duration::from_secs(20), c.read(&mut buf))
        .await
        .expect("the idle connection is closed")
        .unwrap_or(0);
    assert_eq!(n, 0, "closed silently");
    assert_closed_on_time(idle_from.elapsed(), "an idle h1 connection");
}

fn get_req(path: &str) -> http::Request<http_body_util::Empty<bytes::Bytes>> {
    http::Request::builder()
        .uri(format!("http://a{path}"))
        .body(http_body_util::Empty::new())
        .unwrap()
}

async fn an_idle_h2_connection_closes_after_60s() {
    use http_body_util::BodyExt;
    let b = Backend::text("ok").await;
    let s = Sluice::start(&format!("site * {{ proxy {} }}", b.addr));
    let (mut send, conn) = h2c(s.addr).await;
    let resp = send.send_request(get_req("/")).await.unwrap();
    assert_eq!(resp.status(), 200);
    resp.into_body().collect().await.unwrap();
    let idle_from = Instant::now();
    tokio::time::timeout(IDLE + Duration::from_secs(20), conn)
        .await
        .expect("the idle h2 connection is closed")
        .unwrap();
    assert_closed_on_time(idle_from.elapsed(), "an idle h2 connection");
}

async fn an_h2_connection_with_a_stream_still_streaming_is_not_idle() {
    use http_body_util::BodyExt;
    // A response that takes 70 s: a chunk every 5 s.
    let b = Backend::start(|_req| async {
        let (tx, body) = channel_body();
        tokio::spawn(async move {
            for i in 0..14 {
                tokio::time::sleep(Duration::from_secs(5)).await;
                if tx.send(bytes::Bytes::from(format!("{i};"))).await.is_err() {
                    return;
                }
            }
        });
        hyper::Response::new(body)
    })
    .await;
    let s = Sluice::start(&format!("site * {{ proxy {} }}", b.addr));
    let (mut send, _conn) = h2c(s.addr).await;
    let resp = send.send_request(get_req("/slow")).await.unwrap();
    assert_eq!(resp.status(), 200);
    let body = tokio::time::timeout(Duration::from_secs(100), resp.into_body().collect())
        .await
        .expect("the slow body ends")
        .expect("the stream was not cut at the idle timeout")
        .to_bytes();
    assert!(body.ends_with(b"13;"), "{}", String::from_utf8_lossy(&body));
}
