//! What sluice trusts of a backend's framing, and what it re-sends: a response with
//! both Content-Length and Transfer-Encoding is read by the latter and its length never
//! reaches the client; a malformed length is a 502; and a request whose pooled
//! connection the backend had closed goes out again with every body byte.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// FNV-1a: enough to tell that every byte arrived in order.
fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf29ce484222325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
    })
}

/// A backend written by hand: it reads each request whole (Content-Length or chunked)
/// and answers `reply(body)`; with `close_after`, it closes the connection after each
/// answer without saying so.
struct RawBackend {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    _task: tokio::task::JoinHandle<()>,
}

impl RawBackend {
    async fn start(reply: fn(&[u8]) -> Vec<u8>, close_after: bool) -> RawBackend {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let count = connections.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut c, _)) = l.accept().await else {
                    continue;
                };
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    while let Some(body) = read_request(&mut c, &mut buf).await {
                        if c.write_all(&reply(&body)).await.is_err() || close_after {
                            return;
                        }
                    }
                });
            }
        });
        RawBackend {
            addr,
            connections,
            _task: task,
        }
    }
}

/// Reads one request off `c` (bytes of the next stay in `buf`); returns its body.
async fn read_request(c: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    let mut tmp = [0u8; 65536];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = c.read(&mut tmp).await.ok().filter(|n| *n > 0)?;
        buf.extend_from_slice(&tmp[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    buf.drain(..head_end);
    let field = |name: &str| {
        head.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")).map(str::to_string))
    };
    let mut body = Vec::new();
    if let Some(n) = field("content-length") {
        let n: usize = n.trim().parse().ok()?;
        while buf.len() < n {
            let k = c.read(&mut tmp).await.ok().filter(|k| *k > 0)?;
            buf.extend_from_slice(&tmp[..k]);
        }
        body.extend(buf.drain(..n));
    } else if field("transfer-encoding").is_some() {
        loop {
            let line_end = loop {
                if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
                    break i;
                }
                let k = c.read(&mut tmp).await.ok().filter(|k| *k > 0)?;
                buf.extend_from_slice(&tmp[..k]);
            };
            let size =
                usize::from_str_radix(std::str::from_utf8(&buf[..line_end]).ok()?, 16).ok()?;
            buf.drain(..line_end + 2);
            while buf.len() < size + 2 {
                let k = c.read(&mut tmp).await.ok().filter(|k| *k > 0)?;
                buf.extend_from_slice(&tmp[..k]);
            }
            if size == 0 {
                buf.drain(..2);
                break;
            }
            body.extend(buf.drain(..size));
            buf.drain(..2);
        }
    }
    Some(body)
}

fn hash_reply(body: &[u8]) -> Vec<u8> {
    let text = format!("{} {:x}", body.len(), fnv(body));
    format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{text}",
        text.len()
    )
    .into_bytes()
}

/// A request body whose frames are all there at once (an HTTP/2 client's DATA frames):
/// no length, so it goes to an HTTP/1.1 backend chunked.
struct Frames(std::collections::VecDeque<bytes::Bytes>);

impl http_body::Body for Frames {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        std::task::Poll::Ready(self.0.pop_front().map(|b| Ok(http_body::Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }
}

/// The pieces of `body`, cut in turn to the sizes in `pieces`.
fn cut(body: &[u8], pieces: &[usize]) -> Vec<Vec<u8>> {
    let (mut out, mut at) = (Vec::new(), 0);
    while at < body.len() {
        let end = (at + pieces[out.len() % pieces.len()]).min(body.len());
        out.push(body[at..end].to_vec());
        at = end;
    }
    out
}

/// An upload that is ready with its head leaves with it: small frames copied behind
/// the head, large ones beside it in the same vectored write. Sized and chunked in
/// pieces of several sizes, from an HTTP/1.1 and an HTTP/2 client (whose frames are
/// ready at once), each twice over the one kept backend connection (a stray or missing
/// terminator would put the next request out of step), arrive whole.
#[tokio::test]
async fn ready_uploads_of_every_shape_arrive_whole() {
    let b = RawBackend::start(hash_reply, false).await;
    let s = Sluice::start(&format!("site * {{ proxy {} }}", b.addr));
    let (mut h2, _conn) =
        h2c::<http_body_util::Either<http_body_util::Full<bytes::Bytes>, Frames>>(s.addr).await;
    for len in [2_500usize, 5_000, 60_000] {
        let body: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        let want = format!("{} {:x}", body.len(), fnv(&body));
        for pieces in [
            &[][..],
            &[len],
            &[1_000],
            &[3_000],
            &[1_000, 4_000],
            &[25_000],
        ] {
            let shape = if pieces.is_empty() {
                "sized".to_string()
            } else {
                format!("pieces of {pieces:?}")
            };
            let parts = if pieces.is_empty() {
                Vec::new()
            } else {
                cut(&body, pieces)
            };
            for round in 0..2 {
                // HTTP/1.1: the pieces as chunks, all in one write.
                let r = if pieces.is_empty() {
                    request(s.addr, "POST", "/", &[], &body).await
                } else {
                    let mut sent = Vec::new();
                    for piece in &parts {
                        sent.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
                        sent.extend_from_slice(piece);
                        sent.extend_from_slice(b"\r\n");
                    }
                    sent.extend_from_slice(b"0\r\n\r\n");
                    request(
                        s.addr,
                        "POST",
                        "/",
                        &[("Transfer-Encoding", "chunked")],
                        &sent,
                    )
                    .await
                };
                assert_eq!(
                    (r.status, r.text()),
                    (200, want.clone()),
                    "HTTP/1.1, {len} B {shape}, round {round}: the backend saw every byte, in step"
                );
                // HTTP/2: the pieces as DATA frames, ready together.
                let upload = if pieces.is_empty() {
                    http_body_util::Either::Left(http_body_util::Full::new(bytes::Bytes::from(
                        body.clone(),
                    )))
                } else {
                    http_body_util::Either::Right(Frames(
                        parts.iter().cloned().map(bytes::Bytes::from).collect(),
                    ))
                };
                let req = hyper::Request::post(format!("http://{}/", s.addr))
                    .body(upload)
                    .unwrap();
                let resp = h2.send_request(req).await.unwrap();
                let status = resp.status().as_u16();
                let text = http_body_util::BodyExt::collect(resp.into_body())
                    .await
                    .unwrap()
                    .to_bytes();
                assert_eq!(
                    (status, String::from_utf8_lossy(&text).to_string()),
                    (200, want.clone()),
                    "HTTP/2, {len} B {shape}, round {round}: the backend saw every byte, in step"
                );
            }
        }
    }
}

#[tokio::test]
async fn a_post_over_a_pooled_connection_the_backend_closed_arrives_whole() {
    let b = RawBackend::start(hash_reply, true).await;
    let s = Sluice::start(&format!("site * {{ proxy {} }}", b.addr));
    let body: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let want = format!("{} {:x}", body.len(), fnv(&body));
    for (i, chunked) in [false, true, false, true].into_iter().enumerate() {
        let headers: &[(&str, &str)] = if chunked {
            &[("Transfer-Encoding", "chunked")]
        } else {
            &[]
        };
        let sent = if chunked {
            let mut c = Vec::new();
            for piece in body.chunks(40_000) {
                c.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
                c.extend_from_slice(piece);
                c.extend_from_slice(b"\r\n");
            }
            c.extend_from_slice(b"0\r\n\r\n");
            c
        } else {
            body.clone()
        };
        let r = request(s.addr, "POST", "/", headers, &sent).await;
        assert_eq!(
            (r.status, r.text()),
            (200, want.clone()),
            "request {i} (chunked: {chunked}): the backend saw every byte"
        );
    }
    assert_eq!(
        b.connections.load(Ordering::SeqCst),
        4,
        "each went out on a fresh connection"
    );
}

#[tokio::test]
async fn content_length_beside_transfer_encoding_never_reaches_the_client() {
    fn both(_: &[u8]) -> Vec<u8> {
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n".to_vec()
    }
    let b = RawBackend::start(both, false).await;
    let s = Sluice::start(&format!("site * {{ proxy {} }}", b.addr));
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    let mut seen = Vec::new();
    for i in 0..2 {
        c.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
            .await
            .unwrap();
        let r = loop {
            let mut tmp = [0u8; 4096];
            let n = tokio::time::timeout(WAIT, c.read(&mut tmp))
                .await
                .unwrap()
                .unwrap();
            assert!(n > 0, "sluice closed the client connection");
            seen.extend_from_slice(&tmp[..n]);
            if let Some((r, used)) = parse_response(&seen) {
                seen.drain(..used);
                break r;
            }
        };
        assert_eq!((r.status, r.text().as_str()), (200, "hello"), "request {i}");
        assert_ne!(
            r.header("content-length"),
            Some("100"),
            "the backend's length is dropped"
        );
    }
    assert_eq!(
        b.connections.load(Ordering::SeqCst),
        2,
        "a backend connection whose framing lied is not reused"
    );
}

#[tokio::test]
async fn a_malformed_backend_length_is_a_502() {
    fn plus(_: &[u8]) -> Vec<u8> {
        b"HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello".to_vec()
    }
    fn two(_: &[u8]) -> Vec<u8> {
        b"HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\nhello!".to_vec()
    }
    for reply in [plus as fn(&[u8]) -> Vec<u8>, two] {
        let b = RawBackend::start(reply, false).await;
        let s = Sluice::start(&format!("site * {{ proxy {} }}", b.addr));
        assert_eq!(get(s.addr, "/").await.status, 502);
    }
}

/// Reads one request's head off `c` and its body (by `Content-Length`); its request
/// line, or `None` when the connection ended first.
async fn read_one(c: &mut TcpStream) -> Option<String> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let end = loop {
        if let Some(at) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        match c.read(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    };
    let head = String::from_utf8_lossy(&got[..end]).to_string();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    while got.len() < end + length {
        match c.read(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    head.lines().next().map(str::to_string)
}

/// A backend that answers the first request of each connection (and keeps it), then
/// reads the next one, writes `then` and closes: the request lines it read, in order.
async fn closing_backend(
    then: &'static [u8],
) -> (
    SocketAddr,
    tokio::task::JoinHandle<()>,
    Arc<std::sync::Mutex<Vec<String>>>,
) {
    let seen = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let log = seen.clone();
    let (addr, task) = raw_backend(move |mut c| {
        let log = log.clone();
        async move {
            let Some(first) = read_one(&mut c).await else {
                return;
            };
            log.lock().unwrap().push(first);
            let _ = c
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                .await;
            if let Some(next) = read_one(&mut c).await {
                log.lock().unwrap().push(next);
                let _ = c.write_all(then).await;
            }
        }
    })
    .await;
    (addr, task, seen)
}

/// A backend that closes a kept connection as the next request arrives (its keep-alive
/// timeout ran out just then), before tokio can have seen it close. A GET, which may
/// be sent twice, goes out again on a new connection and is answered, as nginx does for
/// a cached connection; a POST is never sent twice: it is answered 502 and the backend
/// saw it once.
#[tokio::test]
async fn a_kept_connection_closed_under_a_request() {
    // `global { retries off }` stops the resend too (DESIGN §18.4); each is counted.
    for retries_off in [false, true] {
        let (addr, _t, seen) = closing_backend(b"").await;
        let global = if retries_off { "; retries off" } else { "" };
        let s = Sluice::start(&format!(
            "global {{ admin 127.0.0.1:0{global} }}\nsite * {{ proxy {addr} }}"
        ));
        assert_eq!(get(s.addr, "/a").await.text(), "ok");
        let r = get(s.addr, "/b").await;
        let want = if retries_off { 502 } else { 200 };
        assert_eq!(
            r.status, want,
            "a GET whose kept connection closed under it is sent again, unless retries are off"
        );
        // After a resend the new connection is kept, and closes under the POST, which
        // is never sent twice; after a 502 the POST goes on a new connection.
        let r = request(s.addr, "POST", "/c", &[], b"x").await;
        let want = if retries_off { 200 } else { 502 };
        assert_eq!(r.status, want, "a POST is not sent twice");
        let seen = seen.lock().unwrap().clone();
        let mut expected = vec!["GET /a HTTP/1.1", "GET /b HTTP/1.1"];
        if !retries_off {
            expected.push("GET /b HTTP/1.1");
        }
        expected.push("POST /c HTTP/1.1");
        assert_eq!(seen, expected, "what the backend saw, in order");
        let m = get(s.admin(), "/metrics").await.text();
        let line = format!(
            "sluice_upstream_stale_resends_total{{pool=\"localhost\"}} {}\n",
            u8::from(!retries_off)
        );
        assert!(
            m.contains(&line) || m.contains(&line.replace("localhost", "*")),
            "{line} in\n{m}"
        );
    }
}

/// A kept connection that breaks after part of an answer came (half a head) is not
/// the backend closing an idle connection: the GET it carried is not sent again.
#[tokio::test]
async fn a_kept_connection_broken_within_an_answer_is_not_sent_again() {
    let (addr, _t, seen) = closing_backend(b"HTTP/1.1 200 OK\r\nContent-Le").await;
    let s = Sluice::start(&format!("site * {{ proxy {addr} }}"));
    assert_eq!(get(s.addr, "/a").await.text(), "ok");
    assert_eq!(get(s.addr, "/b").await.status, 502);
    assert_eq!(
        seen.lock().unwrap().clone(),
        ["GET /a HTTP/1.1", "GET /b HTTP/1.1"],
        "the GET went out once"
    );
}

/// A backend that resets the connection instead of answering: the log states the OS's
/// word for it (DESIGN §18.4), not "closed"; a clean close says "closed".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_backend_is_logged_as_a_reset() {
    for (reset, want) in [
        (
            true,
            "Connection reset by peer (os error 104) before a response",
        ),
        (false, "connection closed before a response"),
    ] {
        let (addr, task) = raw_backend(move |mut c| async move {
            let mut head = [0u8; 1024];
            let _ = c.read(&mut head).await;
            if reset {
                let _ = c.set_zero_linger();
            }
            drop(c);
        })
        .await;
        let s = Sluice::start(&format!("site * {{ proxy {addr} }}"));
        assert_eq!(get(s.addr, "/").await.status, 502);
        let line = s.wait_log(want);
        assert!(line.contains(&addr.to_string()), "names the peer: {line}");
        task.abort();
    }
}
