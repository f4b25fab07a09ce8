//! Upgraded connections (WebSockets) over real sockets: a 101 joins client and backend
//! both ways with half-close honoured, any other answer passes through, a dead backend
//! is a 502, `max_tunnels` refuses with 503, a tunnel takes no `limit` slot, survives a
//! reload that keeps its pool and closes `tunnel_drain` after one that removes it.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A backend that answers an upgrade with 101 (or `refuse` with 426), then echoes in
/// upper case until the client's half-close, says "bye" and closes.
async fn upgrading(refuse: bool) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    upgrading_to("websocket", refuse).await
}

/// As [`upgrading`], for the `Upgrade` token `token`.
async fn upgrading_to(
    token: &'static str,
    refuse: bool,
) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    raw_backend(move |mut c| async move {
        let mut head = Vec::new();
        let mut b = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if c.read(&mut b).await.unwrap_or(0) == 0 {
                return;
            }
            head.push(b[0]);
        }
        let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
        if refuse
            || !head.contains(&format!("upgrade: {}", token.to_ascii_lowercase()))
            || !head.contains("connection: upgrade")
        {
            let _ = c
                .write_all(b"HTTP/1.1 426 Upgrade Required\r\ncontent-length: 4\r\n\r\nnope")
                .await;
            return;
        }
        let switched = format!(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: {token}\r\nConnection: Upgrade\r\n\r\nhi "
        );
        let _ = c.write_all(switched.as_bytes()).await;
        let mut buf = [0u8; 4096];
        loop {
            match c.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let up = buf[..n].to_ascii_uppercase();
                    if c.write_all(&up).await.is_err() {
                        return;
                    }
                }
            }
        }
        let _ = c.write_all(b" bye").await;
    })
    .await
}

/// Sends an upgrade request (with `early` bytes right behind it); returns the stream
/// and what came back up to the end of the response head.
async fn open(addr: SocketAddr, early: &[u8]) -> (TcpStream, String) {
    open_to(addr, "websocket", early).await
}

/// As [`open`], asking for the `Upgrade` token `token`.
async fn open_to(addr: SocketAddr, token: &str, early: &[u8]) -> (TcpStream, String) {
    let mut c = TcpStream::connect(addr).await.unwrap();
    let mut req =
        format!("GET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: {token}\r\n\r\n")
            .into_bytes();
    req.extend_from_slice(early);
    c.write_all(&req).await.unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(WAIT, c.read(&mut b))
            .await
            .unwrap()
            .unwrap();
        if n == 0 {
            break;
        }
        head.push(b[0]);
    }
    (c, String::from_utf8_lossy(&head).to_string())
}

async fn read_until(c: &mut TcpStream, want: &str) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&got).contains(want) {
        let n = tokio::time::timeout(WAIT, c.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&got).to_string()
}

/// Whether an IPv4 TCP socket matching `which(local, remote)` has its keepalive timer
/// running (`/proc/net/tcp`, timer kind 2), so a tunnel with a vanished peer ends.
fn keepalive_armed(which: impl Fn(SocketAddr, SocketAddr) -> bool) -> bool {
    fn addr(field: &str) -> SocketAddr {
        let (ip, port) = field.split_once(':').unwrap();
        let ip = u32::from_str_radix(ip, 16).unwrap().to_le_bytes();
        let port = u16::from_str_radix(port, 16).unwrap();
        SocketAddr::from((ip, port))
    }
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    table.lines().skip(1).any(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        which(addr(f[1]), addr(f[2])) && f[5].starts_with("02:")
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_101_joins_both_ways_with_half_close() {
    let (b, _t) = upgrading(false).await;
    let s = Sluice::start(&format!(
        "global {{ admin 127.0.0.1:0 }}\nsite * {{ proxy {b} }}"
    ));
    let (mut c, head) = open(s.addr, b"early ").await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("upgrade: websocket"),
        "{head}"
    );
    assert!(
        head.to_ascii_lowercase().contains("connection: upgrade"),
        "{head}"
    );
    assert_eq!(
        read_until(&mut c, "EARLY ").await,
        "hi EARLY ",
        "bytes sent behind the head reach the backend"
    );
    let status: serde_json::Value =
        serde_json::from_slice(&get(s.admin(), "/status").await.body).unwrap();
    assert_eq!(status["tunnels_open"], 1);
    assert!(
        keepalive_armed(|local, remote| local == s.addr && remote == c.local_addr().unwrap()),
        "TCP keepalive on the client's side of the tunnel"
    );
    assert!(
        keepalive_armed(|_, remote| remote == b),
        "TCP keepalive on the backend's side of the tunnel"
    );
    c.write_all(b"through the tunnel").await.unwrap();
    assert_eq!(read_until(&mut c, "TUNNEL").await, "THROUGH THE TUNNEL");
    c.shutdown().await.unwrap();
    let rest = read_until(&mut c, "bye").await;
    assert_eq!(
        rest, " bye",
        "after the client's half-close the backend still talks"
    );
}

/// An upgrade reaches a peer the way a relay does (`Pool::reach`): one that cannot be
/// reached is marked and the next one tried, so every handshake opens while one peer
/// of the pool is down (the handshake itself was never sent to the dead one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_passes_over_a_peer_that_cannot_be_reached() {
    let (ok, _t) = upgrading(false).await;
    let dead = dead_addr().await;
    let s = Sluice::start(&format!("site * {{ proxy {dead} {ok} }}"));
    for n in 0..4 {
        let (_c, head) = open(s.addr, b"").await;
        assert!(head.starts_with("HTTP/1.1 101"), "handshake {n}: {head}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_and_limits() {
    let (refusing, _t1) = upgrading(true).await;
    let (ok, _t2) = upgrading(false).await;
    let dead = dead_addr().await;
    let plain = Backend::text("plain").await;
    let s = Sluice::start(&format!(
        "global {{ max_tunnels 1 }}
         site * {{
             route /refuse {{ proxy {refusing} }}
             route /dead {{ proxy {dead} }}
             route /plain {{ proxy {} {{ limit 1 100ms }} }}
             proxy {ok} {{ limit 1 100ms }}
         }}",
        plain.addr
    ));
    let r = request(
        s.addr,
        "GET",
        "/refuse",
        &[("Connection", "Upgrade"), ("Upgrade", "websocket")],
        b"",
    )
    .await;
    assert_eq!(
        (r.status, r.text().as_str()),
        (426, "nope"),
        "a non-101 answer passes through"
    );
    let r = request(
        s.addr,
        "GET",
        "/dead",
        &[("Connection", "Upgrade"), ("Upgrade", "websocket")],
        b"",
    )
    .await;
    assert_eq!(r.status, 502, "a dead backend is a 502");
    let (_first, head) = open(s.addr, b"").await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    let r = request(
        s.addr,
        "GET",
        "/",
        &[("Connection", "Upgrade"), ("Upgrade", "websocket")],
        b"",
    )
    .await;
    assert_eq!(
        (r.status, r.text().as_str()),
        (503, "Server busy, retry in a moment\n"),
        "max_tunnels 1 reached"
    );
    assert_eq!(
        get(s.addr, "/plain").await.text(),
        "plain",
        "an open tunnel takes no limit slot"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_keep_tunnels_and_drain_removed_ones() {
    let (b, _t) = upgrading(false).await;
    let dir = TempDir::new();
    let text = |pool: &str| {
        without_admin(&format!(
            "global {{ tunnel_drain 1s }}\nlisten 127.0.0.1:0\nsite * {{ {pool} }}\n"
        ))
    };
    let path = dir.write("sluice.conf", &text(&format!("proxy {b}")));
    let p = path.to_str().unwrap().to_string();
    let s = Sluice::spawn(&["run", "-c", &p], dir);
    let (mut c, head) = open(s.addr, b"").await;
    assert!(head.starts_with("HTTP/1.1 101"));
    assert_eq!(read_until(&mut c, "hi ").await, "hi ");
    // Same pool, another setting: the tunnel lives on.
    std::fs::write(&path, text(&format!("proxy {b} {{ timeout 9s }}"))).unwrap();
    s.signal("HUP");
    s.wait_log("reloaded: revision 2");
    c.write_all(b"still here").await.unwrap();
    assert_eq!(read_until(&mut c, "HERE").await, "STILL HERE");
    // The pool goes: the tunnel closes after tunnel_drain.
    std::fs::write(&path, text("respond \"gone\"")).unwrap();
    s.signal("HUP");
    s.wait_log("reloaded: revision 3");
    c.write_all(b"x").await.unwrap();
    assert_eq!(read_until(&mut c, "X").await, "X", "not cut at the reload");
    let mut buf = [0u8; 16];
    let closed = tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf)).await;
    assert!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "closed after tunnel_drain: {closed:?}"
    );
    s.wait_log("whose pool a reload removed, after tunnel_drain");
}

/// A WebSocket echo server (tokio-tungstenite): echoes text and binary messages.
async fn ws_echo() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    use futures_util::{SinkExt, StreamExt};
    raw_backend(|c| async move {
        let Ok(mut ws) = tokio_tungstenite::accept_async(c).await else {
            return;
        };
        while let Some(Ok(m)) = ws.next().await {
            if (m.is_text() || m.is_binary()) && ws.send(m).await.is_err() {
                return;
            }
        }
        // The close reply was queued when the client's close arrived; `next`
        // returning `None` means it went out and the handshake is done.
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_messages_through_sluice() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
    use tokio_tungstenite::tungstenite::protocol::frame::Frame;
    use tokio_tungstenite::tungstenite::Message;
    let (b, _t) = ws_echo().await;
    let s = Sluice::start(&format!("site * {{ proxy {b} }}"));
    let (mut ws, resp) = tokio_tungstenite::connect_async(format!("ws://{}/chat", s.addr))
        .await
        .expect("the handshake goes through sluice");
    assert_eq!(resp.status(), 101);
    ws.send(Message::text("hello")).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap(), Message::text("hello"));
    let big: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
    ws.send(Message::binary(big.clone())).await.unwrap();
    assert_eq!(
        ws.next().await.unwrap().unwrap(),
        Message::binary(big),
        "a 1 MiB message"
    );
    // A fragmented text message: two frames, reassembled by the echo server.
    let first = Frame::message(&b"frag"[..], OpCode::Data(Data::Text), false);
    let last = Frame::message(&b"mented"[..], OpCode::Data(Data::Continue), true);
    ws.send(Message::Frame(first)).await.unwrap();
    ws.send(Message::Frame(last)).await.unwrap();
    assert_eq!(
        ws.next().await.unwrap().unwrap(),
        Message::text("fragmented")
    );
    ws.send(Message::Ping(b"are you there".to_vec().into()))
        .await
        .unwrap();
    let pong = ws.next().await.unwrap().unwrap();
    assert_eq!(
        pong,
        Message::Pong(b"are you there".to_vec().into()),
        "ping answered with pong"
    );
    ws.close(None).await.unwrap();
    let end = ws.next().await;
    assert!(
        matches!(end, Some(Ok(Message::Close(_))) | None),
        "the close handshake completes: {end:?}"
    );
}

/// Sends an extended CONNECT for `websocket` over a new h2c connection to sluice.
async fn h2_websocket_connect(addr: SocketAddr) -> http::Response<hyper::body::Incoming> {
    let (mut send, _conn) = h2c(addr).await;
    // The client may send an extended CONNECT only once the server's SETTINGS said so.
    for _ in 0..100 {
        let mut req = http::Request::builder()
            .method(http::Method::CONNECT)
            .uri("http://ws.example/chat")
            .header("sec-websocket-version", "13")
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap();
        req.extensions_mut()
            .insert(hyper::ext::Protocol::from_static("websocket"));
        if let Ok(r) = send.send_request(req).await {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("sluice never enabled extended CONNECT in its SETTINGS");
}

/// RFC 8441: a WebSocket over an h2 stream (extended CONNECT) reaches an HTTP/1.1
/// WebSocket backend as an upgrade; messages go both ways over the stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_over_h2_extended_connect() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::protocol::Role;
    use tokio_tungstenite::tungstenite::Message;
    let (b, _t) = ws_echo().await;
    let s = Sluice::start(&format!("site * {{ proxy {b} }}"));
    let mut resp = h2_websocket_connect(s.addr).await;
    assert_eq!(resp.status(), 200, "the backend's 101 becomes a 200");
    assert!(resp.headers().get("sec-websocket-accept").is_none());
    let stream = tokio::time::timeout(Duration::from_secs(5), hyper::upgrade::on(&mut resp))
        .await
        .unwrap()
        .expect("the stream is handed over");
    let mut ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
        hyper_util::rt::TokioIo::new(stream),
        Role::Client,
        None,
    )
    .await;
    for text in ["hello over h2", "and again"] {
        ws.send(Message::text(text)).await.unwrap();
        let echo = tokio::time::timeout(Duration::from_secs(5), ws.next()).await;
        assert_eq!(echo.unwrap().unwrap().unwrap(), Message::text(text));
    }
    let big: Vec<u8> = (0..256 << 10).map(|i| (i % 249) as u8).collect();
    ws.send(Message::binary(big.clone())).await.unwrap();
    let echo = tokio::time::timeout(Duration::from_secs(5), ws.next()).await;
    assert_eq!(echo.unwrap().unwrap().unwrap(), Message::binary(big));
    ws.close(None).await.unwrap();
}

/// A backend that answers the handshake with a plain 200 did not open a WebSocket:
/// the h2 client gets a 502, not a 2xx that would mean "open".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_websocket_to_a_backend_that_does_not_switch_is_a_502() {
    let b = Backend::echo_head().await;
    let s = Sluice::start(&format!("site * {{ proxy {} }}", b.addr));
    for n in 0..4 {
        let resp = h2_websocket_connect(s.addr).await;
        assert_eq!(resp.status(), 502, "handshake {n}");
    }
    s.wait_log("without switching protocols");
    assert_eq!(
        s.logs().matches("without switching protocols").count(),
        1,
        "a client can cause one WARN a minute of this kind, not one a request: {}",
        s.logs()
    );
}

/// A backend that holds each WebSocket handshake `hold` before its 101 (then keeps the
/// tunnel open), and answers anything else `200 plain` at once.
async fn slow_switching(
    hold: Duration,
    handshakes: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    raw_backend(move |mut c| {
        let handshakes = handshakes.clone();
        async move {
            let mut head = Vec::new();
            let mut b = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                if c.read(&mut b).await.unwrap_or(0) == 0 {
                    return;
                }
                head.push(b[0]);
            }
            if !String::from_utf8_lossy(&head)
                .to_ascii_lowercase()
                .contains("upgrade: websocket")
            {
                let _ = c
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nplain")
                    .await;
                return;
            }
            handshakes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::time::sleep(hold).await;
            let _ = c
                .write_all(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
                .await;
            let mut buf = [0u8; 1024];
            while c.read(&mut buf).await.unwrap_or(0) > 0 {}
        }
    })
    .await
}

/// A handshake holds a `limit` slot until its 101 (ten at once under `limit 2`: two
/// reach the backend, eight get 503), then gives it back: open tunnels count under
/// `max_tunnels` only, so a plain request on the same pool still gets through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrades_count_against_limit_until_the_101() {
    let handshakes = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (b, _t) = slow_switching(Duration::from_millis(600), handshakes.clone()).await;
    let s = Sluice::start(&format!("site * {{ proxy {b} {{ limit 2 100ms }} }}"));
    let opens: Vec<_> = (0..10).map(|_| tokio::spawn(open(s.addr, b""))).collect();
    let mut tunnels = Vec::new();
    let mut busy = 0;
    for o in opens {
        let (c, head) = o.await.unwrap();
        if head.starts_with("HTTP/1.1 101") {
            tunnels.push(c);
        } else {
            assert!(head.starts_with("HTTP/1.1 503"), "{head}");
            busy += 1;
        }
    }
    assert_eq!(
        (tunnels.len(), busy),
        (2, 8),
        "limit 2 holds for handshakes"
    );
    assert_eq!(
        handshakes.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "only the two with a slot reached the backend"
    );
    let r = get(s.addr, "/").await;
    assert_eq!(
        (r.status, r.text().as_str()),
        (200, "plain"),
        "two open tunnels hold no limit slot"
    );
}

/// Only WebSocket is passed on as an upgrade: `h2c` (a tunnel past every filter) and
/// anything else reach the backend as a plain request without `Upgrade`. A handshake
/// the backend refuses does not leave its connection in the pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_websocket_is_upgraded_and_a_refused_handshake_is_not_pooled() {
    let b = Backend::echo_head().await;
    let s = Sluice::start(&format!("site * {{ proxy {} }}", b.addr));
    for proto in ["h2c", "foo/1", "TLS/1.2, HTTP/1.1"] {
        let r = request(
            s.addr,
            "GET",
            "/x",
            &[
                ("Connection", "Upgrade, HTTP2-Settings"),
                ("Upgrade", proto),
                ("HTTP2-Settings", "AAMAAABkAAQCAAAAAAIAAAAA"),
            ],
            b"",
        )
        .await;
        let text = r.text().to_ascii_lowercase();
        assert_eq!(r.status, 200, "{proto}: {text}");
        assert!(
            !text.contains("upgrade") && !text.contains("http2-settings"),
            "{proto}: the backend saw an upgrade: {text}"
        );
    }
    let refusing = Backend::start(|req: hyper::Request<hyper::body::Incoming>| async move {
        let mut r = hyper::Response::new(full("nope"));
        if req.headers().contains_key("upgrade") {
            *r.status_mut() = hyper::StatusCode::UPGRADE_REQUIRED;
        }
        r
    })
    .await;
    let s = Sluice::start(&format!("site * {{ proxy {} }}", refusing.addr));
    let r = request(
        s.addr,
        "GET",
        "/ws",
        &[("Connection", "Upgrade"), ("Upgrade", "websocket")],
        b"",
    )
    .await;
    assert_eq!(r.status, 426);
    assert_eq!(get(s.addr, "/plain").await.status, 200);
    assert_eq!(
        refusing
            .connections
            .load(std::sync::atomic::Ordering::SeqCst),
        2,
        "the connection asked to switch was not reused"
    );
}

/// `tunnel_idle`: a tunnel with no byte either way for that long closes; one that
/// keeps talking stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_tunnel_closes_after_tunnel_idle() {
    let (b, _t) = upgrading(false).await;
    let s = Sluice::start(&format!(
        "global {{ tunnel_idle 1s }}\nsite * {{ proxy {b} }}"
    ));
    let (mut talking, head) = open(s.addr, b"").await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    let (mut quiet, _) = open(s.addr, b"").await;
    read_until(&mut talking, "hi ").await;
    read_until(&mut quiet, "hi ").await;
    let start = std::time::Instant::now();
    for n in 0..6 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        talking.write_all(format!("m{n}").as_bytes()).await.unwrap();
        read_until(&mut talking, &format!("M{n}")).await;
    }
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(5), quiet.read(&mut buf))
        .await
        .expect("the quiet tunnel closes")
        .unwrap_or(0);
    assert_eq!(n, 0, "closed, not data");
    assert!(start.elapsed() < Duration::from_secs(5));
    talking.write_all(b"still").await.unwrap();
    read_until(&mut talking, "STILL").await;
}

/// `websocket off` on a proxy: an upgrade handshake gets `403` from sluice and never
/// reaches the backend; plain requests to the same pool pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_off_refuses_upgrades_with_403() {
    let (b, _backend) = upgrading(false).await;
    let s = Sluice::start(&format!(
        "site * {{ route /ws {{ proxy {b} {{ websocket off }} }}\n respond \"other\" }}"
    ));
    let (_c, head) = open(s.addr, b"").await;
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    // A second handshake on a fresh connection: the backend (which would answer 101)
    // was never asked.
    let (_c, head) = open(s.addr, b"").await;
    assert!(
        head.starts_with("HTTP/1.1 403") && !head.contains("101"),
        "{head}"
    );
}

/// `proxy { upgrade NAME... }` relays those `Upgrade` tokens as it does WebSocket
/// (DESIGN §18.4): a `101`, then the bytes both ways, counted as a tunnel; a token the
/// pool does not list goes as a plain request (the backend never sees the `Upgrade`),
/// and `websocket off` does not refuse them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listed_upgrade_tokens_are_relayed_like_websockets() {
    for token in ["tcp-tunnel", "Foo/2"] {
        let (b, task) = upgrading_to(token, false).await;
        let s = Sluice::start(&format!(
            "global {{ admin 127.0.0.1:0 }}\nsite * {{
                route /ws {{ proxy {b} {{ upgrade tcp-tunnel foo/2; websocket off }} }}
                route /plain/* {{ proxy {b} }}
            }}"
        ));
        let (mut c, head) = open_to(s.addr, token, b"").await;
        assert!(head.starts_with("HTTP/1.1 101"), "{token}: {head}");
        let mut hi = [0u8; 3];
        tokio::time::timeout(WAIT, c.read_exact(&mut hi))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&hi, b"hi ");
        c.write_all(b"ping").await.unwrap();
        let mut pong = [0u8; 4];
        tokio::time::timeout(WAIT, c.read_exact(&mut pong))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&pong, b"PING", "{token}: relayed both ways");
        let m = get(s.admin(), "/metrics").await.text();
        assert!(
            m.contains("sluice_tunnels_open 1\n"),
            "{token}: counted: {m}"
        );
        drop(c);
        // Not listed: a plain request, its Upgrade dropped.
        let r = request(
            s.addr,
            "GET",
            "/plain/x",
            &[("Connection", "Upgrade"), ("Upgrade", token)],
            b"",
        )
        .await;
        assert_eq!(r.status, 426, "{token}: the backend saw no Upgrade");
        task.abort();
    }
    let dir = TempDir::new();
    assert_check_fails(
        &dir,
        "site * { proxy 127.0.0.1:1 { upgrade h2c } }",
        "`h2c` cannot be relayed as an upgrade",
    );
}
