//! A differential request-smuggling corpus: each spelling goes through sluice to a
//! strict raw backend that records what it receives, request by request, and answers
//! with the path it read. For every case the backend reads only well-framed requests
//! (never ambiguous framing, never stray bytes), and every request it reads is one the
//! client got an answer for, in order: a request hidden in a body can reach the backend
//! only as what sluice also took for a request of its own (a pipelined one, answered),
//! never behind the client's back. Cases run side by side; each names itself in its
//! paths (`/case-N`, and `/smuggled-N` for the request hidden in its bytes).

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the backend made of the bytes on its connections.
#[derive(Default)]
struct Seen {
    /// Request paths in arrival order.
    paths: Vec<String>,
    /// What broke its strict reading (ambiguous framing, stray bytes).
    broken: Vec<String>,
    /// Requests whose body was cut off by sluice (a body found broken mid-stream):
    /// never complete, so never a request the backend may act on.
    cut: Vec<String>,
    /// The body of each complete request, by path.
    bodies: Vec<(String, Vec<u8>)>,
    /// Connections still being read: stray bytes are only known once each has ended.
    open: usize,
}

const HIDDEN: &str = "GET /smuggled-CASE HTTP/1.1\r\nHost: a\r\n\r\n";

/// A backend that reads requests strictly, one after another on each connection:
/// exactly one of `Content-Length` (digits) or `Transfer-Encoding: chunked`, or none;
/// anything else — and any byte that does not start a request — is recorded as broken.
async fn strict_backend(seen: Arc<Mutex<Seen>>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((c, _)) = l.accept().await {
            seen.lock().unwrap().open += 1;
            let seen = seen.clone();
            tokio::spawn(async move {
                serve(c, seen.clone()).await;
                seen.lock().unwrap().open -= 1;
            });
        }
    });
    addr
}

async fn serve(mut c: TcpStream, seen: Arc<Mutex<Seen>>) {
    let mut buf = Vec::new();
    loop {
        let end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            if !fill(&mut c, &mut buf).await {
                if !buf.is_empty() {
                    seen.lock()
                        .unwrap()
                        .broken
                        .push(format!("stray bytes: {:?}", String::from_utf8_lossy(&buf)));
                }
                return;
            }
        };
        let mut headers = [httparse::EMPTY_HEADER; 128];
        let mut req = httparse::Request::new(&mut headers);
        if !matches!(req.parse(&buf[..end]), Ok(httparse::Status::Complete(_))) {
            seen.lock().unwrap().broken.push(format!(
                "not a request: {:?}",
                String::from_utf8_lossy(&buf)
            ));
            return;
        }
        let path = req.path.unwrap_or("").to_string();
        let field = |n: &str| {
            req.headers
                .iter()
                .filter(|h| h.name.eq_ignore_ascii_case(n))
                .map(|h| h.value.to_vec())
                .collect::<Vec<_>>()
        };
        let (cl, te) = (field("content-length"), field("transfer-encoding"));
        buf.drain(..end);
        let framing = match (cl.as_slice(), te.as_slice()) {
            ([], []) => Ok(None),
            ([v], []) if !v.is_empty() && v.iter().all(u8::is_ascii_digit) => {
                Ok(std::str::from_utf8(v)
                    .unwrap()
                    .parse::<usize>()
                    .ok()
                    .map(Some)
                    .unwrap_or(None))
            }
            ([], [v]) if v.eq_ignore_ascii_case(b"chunked") => Err(true),
            _ => {
                seen.lock()
                    .unwrap()
                    .broken
                    .push(format!("{path}: ambiguous framing CL {cl:?} TE {te:?}"));
                return;
            }
        };
        let mut body = Vec::new();
        match framing {
            Ok(n) => {
                let n = n.unwrap_or(0);
                while buf.len() < n {
                    if !fill(&mut c, &mut buf).await {
                        seen.lock().unwrap().cut.push(path);
                        return;
                    }
                }
                body.extend(buf.drain(..n));
            }
            Err(_) => match chunked(&mut c, &mut buf, &mut body).await {
                Chunked::Whole => {}
                Chunked::Cut => {
                    seen.lock().unwrap().cut.push(path);
                    return;
                }
                Chunked::Malformed => {
                    seen.lock()
                        .unwrap()
                        .broken
                        .push(format!("{path}: bad chunked body"));
                    return;
                }
            },
        }
        let answer = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{path}",
            path.len()
        );
        {
            let mut seen = seen.lock().unwrap();
            seen.paths.push(path.clone());
            seen.bodies.push((path, body));
        }
        if c.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
    }
}

async fn fill(c: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    let mut b = [0u8; 8192];
    match tokio::time::timeout(Duration::from_secs(5), c.read(&mut b)).await {
        Ok(Ok(n)) if n > 0 => {
            buf.extend_from_slice(&b[..n]);
            true
        }
        _ => false,
    }
}

enum Chunked {
    Whole,
    /// The connection ended before the body did.
    Cut,
    /// Bytes that break chunked framing.
    Malformed,
}

/// A strict chunked body: hex sizes only, CRLF everywhere, well-formed trailers read.
async fn chunked(c: &mut TcpStream, buf: &mut Vec<u8>, body: &mut Vec<u8>) -> Chunked {
    loop {
        let Some(size_line) = line(c, buf).await else {
            return Chunked::Cut;
        };
        if size_line.is_empty() || !size_line.iter().all(u8::is_ascii_hexdigit) {
            return Chunked::Malformed;
        }
        let size = usize::from_str_radix(std::str::from_utf8(&size_line).unwrap(), 16)
            .unwrap_or(usize::MAX);
        if size == 0 {
            loop {
                match line(c, buf).await {
                    None => return Chunked::Cut,
                    Some(l) if l.is_empty() => return Chunked::Whole,
                    Some(l) if !l.contains(&b':') || l[0] == b' ' || l[0] == b'\t' => {
                        return Chunked::Malformed
                    }
                    Some(_) => {}
                }
            }
        }
        while buf.len() < size.saturating_add(2) {
            if !fill(c, buf).await {
                return Chunked::Cut;
            }
        }
        if &buf[size..size + 2] != b"\r\n" {
            return Chunked::Malformed;
        }
        body.extend_from_slice(&buf[..size]);
        buf.drain(..size + 2);
    }
}

/// The next CRLF-ended line, taken off `buf`; `None` when the connection ended first.
async fn line(c: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    loop {
        if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
            let l = buf[..i].to_vec();
            buf.drain(..i + 2);
            return Some(l);
        }
        if !fill(c, buf).await {
            return None;
        }
    }
}

/// Stops sluice and waits until the backend has read every connection to its end, so
/// bytes left over after the last request (stray) are known.
async fn settle(s: Sluice, seen: &Mutex<Seen>) {
    drop(s);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while seen.lock().unwrap().open > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "backend connections still open after sluice stopped"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The corpus: (name, the bytes after the request line's path; the path is filled in).
fn corpus() -> Vec<(String, Vec<u8>)> {
    let mut cases: Vec<(String, Vec<u8>)> = Vec::new();
    let mut add = |name: String, head: &str, body: &[u8]| {
        let mut b = head.as_bytes().to_vec();
        b.extend_from_slice(body);
        cases.push((name, b));
    };
    // A chunked body carrying the hidden request, and a length that covers only part.
    let chunk_smuggle = format!("0\r\n\r\n{HIDDEN}");
    let te_values = [
        "chunked",
        "Chunked",
        "CHUNKED",
        " chunked",
        "chunked ",
        "\tchunked",
        "chunked\t",
        "chunked, identity",
        "identity, chunked",
        "xchunked",
        "chunkedx",
        "chunked;q=1",
        "chunk",
        "\"chunked\"",
        "chunked\x0b",
        "\x0bchunked",
        "gzip, chunked",
        "chunked, chunked",
        "chunked,",
        ",chunked",
        "identity",
        "chunked\r",
        "deflate",
        "chunked , chunked",
    ];
    for (k, te) in te_values.iter().enumerate() {
        add(
            format!("te{k} alone {te:?}"),
            &format!("POST /PATH HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: {te}\r\n\r\n"),
            b"5\r\nhello\r\n0\r\n\r\n",
        );
        add(format!("te{k} CL.TE {te:?}"), &format!("POST /PATH HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: {te}\r\n\r\n"), chunk_smuggle.as_bytes());
        add(format!("te{k} TE.CL {te:?}"), &format!("POST /PATH HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: {te}\r\nContent-Length: 4\r\n\r\n"), format!("5c\r\n{HIDDEN}\r\n0\r\n\r\n").as_bytes());
        add(format!("te{k} TE.TE {te:?}"), &format!("POST /PATH HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: {te}\r\n\r\n"), chunk_smuggle.as_bytes());
    }
    let lengths = [
        "5",
        "+5",
        "0x5",
        "05",
        "5 ",
        " 5",
        "5, 5",
        "5,6",
        "5\t",
        "-5",
        "5.0",
        "1e1",
        "99999999999999999999",
        "",
        "5 5",
        "\u{0665}",
        "0005",
        "5\x0b",
    ];
    for (k, cl) in lengths.iter().enumerate() {
        add(
            format!("cl{k} {cl:?}"),
            &format!("POST /PATH HTTP/1.1\r\nHost: a\r\nContent-Length: {cl}\r\n\r\n"),
            format!("hello{HIDDEN}").as_bytes(),
        );
        add(format!("cl{k} twice {cl:?}"), &format!("POST /PATH HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: {cl}\r\n\r\n"), format!("hello{HIDDEN}").as_bytes());
    }
    let names = [
        "Transfer-Encoding : chunked",
        "Transfer-Encoding\t: chunked",
        "Transfer_Encoding: chunked",
        " Transfer-Encoding: chunked",
        "X: y\r\n Transfer-Encoding: chunked",
        "Transfer-Encoding:\tchunked",
        "Transfer-Encoding:chunked",
        "Content-Length : 5",
        "Content_Length: 5",
        "X: y\r\n\tContent-Length: 5",
        "Transfer-Encoding: \r\n chunked",
        "TRANSFER-ENCODING: chunked",
    ];
    for (k, field) in names.iter().enumerate() {
        add(
            format!("name{k} {field:?}"),
            &format!("POST /PATH HTTP/1.1\r\nHost: a\r\n{field}\r\n\r\n"),
            format!("5\r\nhello\r\n0\r\n\r\n{HIDDEN}").as_bytes(),
        );
    }
    let endings = [
        (
            "bare LF",
            "POST /PATH HTTP/1.1\nHost: a\nContent-Length: 5\n\n",
        ),
        (
            "CR alone",
            "POST /PATH HTTP/1.1\rHost: a\rContent-Length: 5\r\r",
        ),
        (
            "CRCRLF",
            "POST /PATH HTTP/1.1\r\r\nHost: a\r\r\nContent-Length: 5\r\r\n\r\r\n",
        ),
        (
            "mixed",
            "POST /PATH HTTP/1.1\r\nHost: a\nContent-Length: 5\r\n\r\n",
        ),
        (
            "NUL in a field",
            "POST /PATH HTTP/1.1\r\nHost: a\r\nX: a\0b\r\nContent-Length: 5\r\n\r\n",
        ),
        (
            "space before the head",
            " POST /PATH HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n",
        ),
    ];
    for (name, head) in endings {
        add(name.to_string(), head, format!("hello{HIDDEN}").as_bytes());
    }
    let sizes = [
        "5",
        "05",
        "0x5",
        "+5",
        "5 ",
        "5;ext=1",
        "5;ext=\"a\"",
        "fffffffffffffffff",
        "-1",
        "5\t",
        "5\x00",
        " 5",
        "5\r",
        "5;",
        "5 ;x",
        "0000000000000000000005",
    ];
    for (k, size) in sizes.iter().enumerate() {
        add(
            format!("size{k} {size:?}"),
            "POST /PATH HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
            format!("{size}\r\nhello\r\n0\r\n\r\n{HIDDEN}").as_bytes(),
        );
    }
    let trailers = [
        "0\r\nX: y\r\n\r\n",
        "0\r\nContent-Length: 5\r\n\r\n",
        "0\r\nTransfer-Encoding: chunked\r\n\r\n",
        "0\r\n bad\r\n\r\n",
        "0\r\nX y\r\n\r\n",
        "0\r\n\r\nhello",
        "0\n\n",
        "0\r\n",
    ];
    for (k, t) in trailers.iter().enumerate() {
        add(
            format!("trailer{k} {t:?}"),
            "POST /PATH HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
            format!("5\r\nhello\r\n{t}{HIDDEN}").as_bytes(),
        );
    }
    let expects = ["100-continue", "100-Continue", "100-continue, x", "x", ""];
    for (k, e) in expects.iter().enumerate() {
        add(
            format!("expect{k} {e:?}"),
            &format!("POST /PATH HTTP/1.1\r\nHost: a\r\nExpect: {e}\r\nContent-Length: 5\r\n\r\n"),
            format!("hello{HIDDEN}").as_bytes(),
        );
    }
    let targets = [
        "GET http://a/PATH HTTP/1.1\r\nHost: b\r\n\r\n", "GET /PATH HTTP/1.0\r\n\r\n",
        "GET /PATH HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", "GET /PATH HTTP/1.1\r\n\r\n",
        "GET /PATH HTTP/2.0\r\nHost: a\r\n\r\n", "GET /PATH\r\nHost: a\r\n\r\n",
        "GET /PATH HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n",
        "GET /PATH HTTP/1.1\r\nHost: a\r\nConnection: content-length\r\nContent-Length: 5\r\n\r\n",
        "GET /PATH HTTP/1.1\r\nHost: a\r\nConnection: transfer-encoding\r\nTransfer-Encoding: chunked\r\n\r\n",
        "GET /PATH HTTP/1.1\r\nHost: a\r\nUpgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\nContent-Length: 5\r\n\r\n",
    ];
    for (k, t) in targets.iter().enumerate() {
        add(format!("target{k}"), t, format!("hello{HIDDEN}").as_bytes());
    }
    cases
}

/// A case's name, number and the responses its client got.
type Answered = (String, usize, Vec<(u16, String)>);

/// The responses in what came back: (status, body), interim `100 Continue` skipped.
fn responses(out: &[u8]) -> Vec<(u16, String)> {
    let mut v = Vec::new();
    let mut at = 0;
    while at < out.len() {
        if out[at..].starts_with(b"HTTP/1.1 100 ") {
            match out[at..].windows(4).position(|w| w == b"\r\n\r\n") {
                Some(i) => at += i + 4,
                None => break,
            }
            continue;
        }
        let Some((r, used)) = parse_response(&out[at..]) else {
            break;
        };
        v.push((r.status, r.text()));
        at += used;
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_smuggling_spelling_is_refused_or_answered_request_for_request() {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let b = strict_backend(seen.clone()).await;
    let s = Sluice::start(&format!("site * {{ proxy {b} }}"));
    let cases = corpus();
    assert!(cases.len() >= 150, "{} cases", cases.len());
    let mut answered: Vec<Answered> = Vec::new();
    for (b, batch) in cases.chunks(16).enumerate() {
        let runs: Vec<_> = batch
            .iter()
            .enumerate()
            .map(|(k, (name, bytes))| {
                let n = b * 16 + k;
                let bytes = String::from_utf8_lossy(bytes)
                    .replace("/PATH", &format!("/case-{n}"))
                    .replace("CASE", &n.to_string())
                    .into_bytes();
                let (name, addr) = (name.clone(), s.addr);
                tokio::spawn(async move {
                    let mut c = TcpStream::connect(addr).await.unwrap();
                    let _ = c.write_all(&bytes).await;
                    let mut out = Vec::new();
                    let mut buf = [0u8; 4096];
                    // Until the connection closes or stays quiet.
                    while let Ok(Ok(r)) =
                        tokio::time::timeout(Duration::from_millis(700), c.read(&mut buf)).await
                    {
                        if r == 0 {
                            break;
                        }
                        out.extend_from_slice(&buf[..r]);
                    }
                    (name, n, responses(&out))
                })
            })
            .collect();
        for r in runs {
            answered.push(r.await.unwrap());
        }
    }
    settle(s, &seen).await;
    let seen = seen.lock().unwrap();
    let name_of = |p: &str| {
        let n: usize = p
            .rsplit('-')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(usize::MAX);
        answered
            .iter()
            .find(|a| a.1 == n)
            .map_or("?", |a| a.0.as_str())
            .to_string()
    };
    let broken: Vec<String> = seen
        .broken
        .iter()
        .map(|b| format!("{} — {b}", name_of(b.split(':').next().unwrap_or(""))))
        .collect();
    assert!(
        broken.is_empty(),
        "the backend read something it could not frame: {broken:#?}"
    );
    let (mut refused, mut pipelined) = (0, 0);
    for (name, n, got) in &answered {
        assert!(!got.is_empty(), "{name}: no response at all");
        let mine = |p: &String| *p == format!("/case-{n}") || *p == format!("/smuggled-{n}");
        let backend: Vec<&String> = seen.paths.iter().filter(|p| mine(p)).collect();
        let answered_by_backend: Vec<&String> = got
            .iter()
            .filter(|(_, b)| mine(b))
            .map(|(_, b)| b)
            .collect();
        assert_eq!(
            backend, answered_by_backend,
            "{name}: what the backend read is not what the client was answered for: {got:?}"
        );
        refused += usize::from(backend.is_empty());
        pipelined += usize::from(backend.len() > 1);
    }
    eprintln!(
        "{} cases: {refused} refused before the backend, {} reached it ({pipelined} with the hidden request as a second, answered request), {} cut off mid-body",
        answered.len(),
        answered.len() - refused,
        seen.cut.len()
    );
}

/// A field as sent: name and value, any bytes.
type Field = (Vec<u8>, Vec<u8>);

/// One HTTP/2 case: the request's fields in the order sent (pseudo-fields included,
/// any bytes), its DATA frames, and whether the last frame ends the stream.
#[derive(Clone)]
struct H2Case {
    name: String,
    fields: Vec<(Vec<u8>, Vec<u8>)>,
    data: Vec<Vec<u8>>,
    /// Trailers sent after the data (a HEADERS frame with END_STREAM).
    trailers: Vec<(Vec<u8>, Vec<u8>)>,
}

fn f(n: &str, v: &str) -> (Vec<u8>, Vec<u8>) {
    (n.as_bytes().to_vec(), v.as_bytes().to_vec())
}

/// The request pseudo-fields of a POST to `/PATH`, then `extra`.
fn post(extra: &[(&str, &str)]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut v = vec![
        f(":method", "POST"),
        f(":scheme", "http"),
        f(":authority", "a"),
        f(":path", "/PATH"),
    ];
    v.extend(extra.iter().map(|(n, x)| f(n, x)));
    v
}

/// The HTTP/2 half of the corpus: framing an HTTP/1 backend must never see two ways.
fn h2_corpus() -> Vec<H2Case> {
    let mut cases = Vec::new();
    let hidden_chunked = format!("0\r\n\r\n{HIDDEN}").into_bytes();
    let hidden = HIDDEN.as_bytes().to_vec();
    let mut add = |name: &str, fields, data: Vec<Vec<u8>>, trailers| {
        cases.push(H2Case {
            name: name.to_string(),
            fields,
            data,
            trailers,
        })
    };
    // Content-Length against the DATA actually sent.
    for (cl, body) in [
        ("5", b"hello".to_vec()),
        ("0", hidden.clone()),
        ("3", hidden.clone()),
        ("100", hidden.clone()),
        ("5", Vec::new()),
    ] {
        add(
            &format!("h2 content-length {cl} with {} bytes", body.len()),
            post(&[("content-length", cl)]),
            vec![body],
            vec![],
        );
    }
    // Spellings of a length an HTTP/1 parser might read differently.
    for cl in [
        "+5",
        "0x5",
        "05",
        " 5",
        "5 ",
        "5,5",
        "5, 5",
        "-5",
        "5.0",
        "1e1",
        "99999999999999999999",
        "",
        "5\t",
    ] {
        add(
            &format!("h2 content-length {cl:?}"),
            post(&[("content-length", cl)]),
            vec![b"hello".to_vec()],
            vec![],
        );
    }
    add(
        "h2 two content-lengths",
        post(&[("content-length", "5"), ("content-length", "6")]),
        vec![b"hello".to_vec()],
        vec![],
    );
    add(
        "h2 two equal content-lengths",
        post(&[("content-length", "5"), ("content-length", "5")]),
        vec![b"hello".to_vec()],
        vec![],
    );
    // Transfer-Encoding is connection-specific in HTTP/2: never passed on.
    for te in [
        "chunked",
        "Chunked",
        "gzip, chunked",
        "chunked, identity",
        "identity",
        " chunked",
    ] {
        add(
            &format!("h2 transfer-encoding {te:?}"),
            post(&[("transfer-encoding", te)]),
            vec![hidden_chunked.clone()],
            vec![],
        );
        add(
            &format!("h2 transfer-encoding {te:?} with a length"),
            post(&[
                ("transfer-encoding", te),
                ("content-length", &hidden_chunked.len().to_string()),
            ]),
            vec![hidden_chunked.clone()],
            vec![],
        );
    }
    for te in [
        "trailers",
        "trailers, chunked",
        "chunked",
        "gzip",
        "Trailers",
        "trailers;q=1",
    ] {
        add(
            &format!("h2 te {te:?}"),
            post(&[("te", te)]),
            vec![hidden_chunked.clone()],
            vec![],
        );
    }
    // Other connection-specific fields.
    for (n, v) in [
        ("connection", "keep-alive"),
        ("connection", "close, transfer-encoding"),
        ("keep-alive", "timeout=5"),
        ("proxy-connection", "keep-alive"),
        ("upgrade", "h2c"),
    ] {
        add(
            &format!("h2 {n}: {v}"),
            post(&[(n, v)]),
            vec![hidden_chunked.clone()],
            vec![],
        );
    }
    // CR, LF and NUL in values, and names an HTTP/1 head cannot carry.
    for (n, v) in [
        ("x-a", "1\r\nTransfer-Encoding: chunked"),
        ("x-a", "1\nTransfer-Encoding: chunked"),
        ("x-a", "1\rTransfer-Encoding: chunked"),
        ("x-a", "1\0"),
        ("x-a", " leading"),
        ("x-a", "trailing "),
        ("x-a\r\ntransfer-encoding", "chunked"),
        ("x a", "1"),
        ("x:a", "1"),
        ("X-Upper", "1"),
        ("", "1"),
        ("x-a", "\u{7f}"),
        ("host", "a\r\nTransfer-Encoding: chunked"),
        ("cookie", "a=1\r\nTransfer-Encoding: chunked"),
    ] {
        add(
            &format!("h2 field {n:?}: {v:?}"),
            post(&[(n, v)]),
            vec![hidden_chunked.clone()],
            vec![],
        );
    }
    // Pseudo-field abuse.
    let path_hidden = format!("/PATH HTTP/1.1\r\nHost: a\r\n\r\n{HIDDEN}");
    let pseudo: Vec<(&str, Vec<Field>)> = vec![
        (
            "no :path",
            vec![
                f(":method", "POST"),
                f(":scheme", "http"),
                f(":authority", "a"),
            ],
        ),
        (
            "empty :path",
            vec![
                f(":method", "POST"),
                f(":scheme", "http"),
                f(":authority", "a"),
                f(":path", ""),
            ],
        ),
        (
            "request line in :path",
            vec![
                f(":method", "POST"),
                f(":scheme", "http"),
                f(":authority", "a"),
                f(":path", &path_hidden),
            ],
        ),
        (
            "space in :path",
            vec![
                f(":method", "POST"),
                f(":scheme", "http"),
                f(":authority", "a"),
                f(":path", "/PATH x"),
            ],
        ),
        (
            "relative :path",
            vec![
                f(":method", "POST"),
                f(":scheme", "http"),
                f(":authority", "a"),
                f(":path", "PATH"),
            ],
        ),
        (
            "two :path",
            vec![
                f(":method", "POST"),
                f(":scheme", "http"),
                f(":authority", "a"),
                f(":path", "/PATH"),
                f(":path", "/smuggled-CASE"),
            ],
        ),
        (
            "space in :method",
            vec![
                f(":method", "GET /smuggled-CASE"),
                f(":scheme", "http"),
                f(":authority", "a"),
                f(":path", "/PATH"),
            ],
        ),
        (
            "no :method",
            vec![
                f(":scheme", "http"),
                f(":authority", "a"),
                f(":path", "/PATH"),
            ],
        ),
        (
            "no :scheme",
            vec![
                f(":method", "POST"),
                f(":authority", "a"),
                f(":path", "/PATH"),
            ],
        ),
        (
            "pseudo after a field",
            vec![
                f(":method", "POST"),
                f(":scheme", "http"),
                f("x-a", "1"),
                f(":authority", "a"),
                f(":path", "/PATH"),
            ],
        ),
        (
            "unknown pseudo",
            vec![
                f(":method", "POST"),
                f(":scheme", "http"),
                f(":authority", "a"),
                f(":path", "/PATH"),
                f(":foo", "1"),
            ],
        ),
        (
            ":status in a request",
            vec![
                f(":method", "POST"),
                f(":scheme", "http"),
                f(":authority", "a"),
                f(":path", "/PATH"),
                f(":status", "200"),
            ],
        ),
        (
            ":protocol without CONNECT",
            vec![
                f(":method", "POST"),
                f(":scheme", "http"),
                f(":authority", "a"),
                f(":path", "/PATH"),
                f(":protocol", "websocket"),
            ],
        ),
        (
            "CRLF in :authority",
            vec![
                f(":method", "POST"),
                f(":scheme", "http"),
                f(":authority", "a\r\nTransfer-Encoding: chunked"),
                f(":path", "/PATH"),
            ],
        ),
        (
            ":authority and host differ",
            vec![
                f(":method", "POST"),
                f(":scheme", "http"),
                f(":authority", "a"),
                f(":path", "/PATH"),
                f("host", "b"),
            ],
        ),
        (
            "userinfo in :authority",
            vec![
                f(":method", "POST"),
                f(":scheme", "http"),
                f(":authority", "u@a"),
                f(":path", "/PATH"),
            ],
        ),
        (
            "CONNECT with a :path",
            vec![
                f(":method", "CONNECT"),
                f(":authority", "a:80"),
                f(":path", "/PATH"),
                f(":scheme", "http"),
            ],
        ),
        (
            "lower-case method",
            vec![
                f(":method", "post"),
                f(":scheme", "http"),
                f(":authority", "a"),
                f(":path", "/PATH"),
            ],
        ),
    ];
    for (name, fields) in pseudo {
        add(
            &format!("h2 {name}"),
            fields,
            vec![hidden_chunked.clone()],
            vec![],
        );
    }
    // Trailers that an HTTP/1 backend would read as framing.
    for (n, v) in [
        ("transfer-encoding", "chunked"),
        ("content-length", "0"),
        (":path", "/smuggled-CASE"),
        ("x-t", "1\r\n\r\nGET /smuggled-CASE HTTP/1.1"),
    ] {
        add(
            &format!("h2 trailer {n:?}"),
            post(&[]),
            vec![hidden_chunked.clone()],
            vec![f(n, v)],
        );
    }
    add(
        "h2 plain trailer",
        post(&[]),
        vec![b"hello".to_vec()],
        vec![f("x-t", "1")],
    );
    // Well-formed: several DATA frames adding up to the length; no length at all.
    add(
        "h2 three frames summing to the length",
        post(&[("content-length", "15")]),
        vec![b"hello".to_vec(), b"hello".to_vec(), b"hello".to_vec()],
        vec![],
    );
    add(
        "h2 body without a length",
        post(&[]),
        vec![hidden.clone(), hidden_chunked.clone()],
        vec![],
    );
    add(
        "h2 GET with a body",
        {
            let mut v = post(&[("content-length", "5")]);
            v[0] = f(":method", "GET");
            v
        },
        vec![b"hello".to_vec()],
        vec![],
    );
    cases
}

/// The h2 cases that are well-formed enough to be served (RFC 9113 §8.1.1, §8.2): every
/// other one must be refused before the backend.
const MAY_REACH: [&str; 16] = [
    "h2 content-length 5 with 5 bytes",
    "h2 content-length \"05\"",
    "h2 two equal content-lengths",
    "h2 te \"trailers\"",
    // Field values with outer white space: malformed to RFC 9113, harmless to an
    // HTTP/1 backend (optional white space there); the h2 library lets them through.
    "h2 field \"x-a\": \" leading\"",
    "h2 field \"x-a\": \"trailing \"",
    // `:authority` wins and replaces Host: routing and the backend see one host.
    "h2 :authority and host differ",
    "h2 lower-case method",
    // Trailers are dropped for HTTP/1 backends, so none of them reaches one.
    "h2 trailer \"transfer-encoding\"",
    "h2 trailer \"content-length\"",
    "h2 trailer \":path\"",
    "h2 trailer \"x-t\"",
    "h2 plain trailer",
    "h2 three frames summing to the length",
    "h2 body without a length",
    "h2 GET with a body",
];

/// An HTTP/2 frame.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut b = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    b.extend_from_slice(&stream.to_be_bytes());
    b.extend_from_slice(payload);
    b
}

/// What one stream got back: a response's status and body, a reset, or nothing.
#[derive(Debug, Default)]
struct H2Answer {
    status: Option<u16>,
    body: Vec<u8>,
    reset: bool,
    goaway: bool,
}

/// Sends `case` on stream 1 of a fresh prior-knowledge connection and reads what
/// comes back until the stream ends or the connection stays quiet.
/// `b` with case `n`'s names filled in.
fn fill_in(b: &[u8], n: usize) -> Vec<u8> {
    String::from_utf8_lossy(b)
        .replace("/PATH", &format!("/case-{n}"))
        .replace("PATH", &format!("case-{n}"))
        .replace("CASE", &n.to_string())
        .into_bytes()
}

async fn h2_exchange(addr: SocketAddr, case: &H2Case, n: usize) -> H2Answer {
    let fill = |b: &[u8]| fill_in(b, n);
    let block = |fields: &[(Vec<u8>, Vec<u8>)]| {
        let filled: Vec<(Vec<u8>, Vec<u8>)> =
            fields.iter().map(|(k, v)| (fill(k), fill(v))).collect();
        hpack::Encoder::new().encode(filled.iter().map(|(k, v)| (&k[..], &v[..])))
    };
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(4, 0, 0, &[]));
    let ends_at_headers = case.data.is_empty() && case.trailers.is_empty();
    out.extend(frame(
        1,
        0x4 | u8::from(ends_at_headers),
        1,
        &block(&case.fields),
    ));
    for (i, d) in case.data.iter().enumerate() {
        let last = i + 1 == case.data.len() && case.trailers.is_empty();
        out.extend(frame(0, u8::from(last), 1, &fill(d)));
    }
    if !case.trailers.is_empty() {
        // A second encoder: the first one's table is not shared, so index nothing.
        out.extend(frame(1, 0x5, 1, &block(&case.trailers)));
    }
    let mut c = TcpStream::connect(addr).await.unwrap();
    let _ = c.write_all(&out).await;
    let mut answer = H2Answer::default();
    let mut decoder = hpack::Decoder::new();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        while buf.len() >= 9 {
            let len =
                (usize::from(buf[0]) << 16) | (usize::from(buf[1]) << 8) | usize::from(buf[2]);
            if buf.len() < 9 + len {
                break;
            }
            let (kind, flags) = (buf[3], buf[4]);
            let stream = u32::from_be_bytes([buf[5], buf[6], buf[7], buf[8]]) & 0x7fff_ffff;
            let payload = buf[9..9 + len].to_vec();
            buf.drain(..9 + len);
            match kind {
                4 if flags & 1 == 0 => {
                    let _ = c.write_all(&frame(4, 1, 0, &[])).await;
                }
                1 if stream == 1 => {
                    let fields = decoder.decode(&payload).expect("sluice's HPACK decodes");
                    if let Some((_, v)) = fields.iter().find(|(k, _)| k == b":status") {
                        let code: u16 = String::from_utf8_lossy(v).parse().unwrap();
                        if code >= 200 {
                            answer.status = Some(code);
                        }
                    }
                    if flags & 1 != 0 {
                        return answer;
                    }
                }
                1 => {
                    let _ = decoder.decode(&payload);
                }
                0 if stream == 1 => {
                    answer.body.extend_from_slice(&payload);
                    if flags & 1 != 0 {
                        return answer;
                    }
                }
                3 if stream == 1 => {
                    answer.reset = true;
                    return answer;
                }
                7 => answer.goaway = true,
                _ => {}
            }
        }
        match tokio::time::timeout(Duration::from_secs(2), c.read(&mut chunk)).await {
            Ok(Ok(r)) if r > 0 => buf.extend_from_slice(&chunk[..r]),
            _ => return answer,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_h2_spelling_is_refused_or_reaches_the_backend_as_one_request() {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let b = strict_backend(seen.clone()).await;
    let s = Sluice::start(&format!("site * {{ proxy {b} }}"));
    let cases = h2_corpus();
    assert!(cases.len() >= 80, "{} cases", cases.len());
    let mut answers = Vec::new();
    for (k, batch) in cases.chunks(16).enumerate() {
        let runs: Vec<_> = batch
            .iter()
            .enumerate()
            .map(|(i, case)| {
                let n = 1000 + k * 16 + i;
                let addr = s.addr;
                let case = H2Case {
                    name: case.name.clone(),
                    fields: case.fields.clone(),
                    data: case.data.clone(),
                    trailers: case.trailers.clone(),
                };
                tokio::spawn(async move {
                    let a = h2_exchange(addr, &case, n).await;
                    (case.name, n, a)
                })
            })
            .collect();
        for r in runs {
            answers.push(r.await.unwrap());
        }
    }
    settle(s, &seen).await;
    let seen = seen.lock().unwrap();
    assert!(
        seen.broken.is_empty(),
        "the backend read something it could not frame: {:#?}",
        seen.broken
    );
    let (mut refused, mut reached) = (0, 0);
    for (name, n, a) in &answers {
        let path = format!("/case-{n}");
        assert!(
            !seen.paths.contains(&format!("/smuggled-{n}")),
            "{name}: the hidden request reached the backend"
        );
        let at_backend = seen.paths.iter().filter(|p| **p == path).count();
        assert!(
            at_backend <= 1,
            "{name}: the backend read it {at_backend} times"
        );
        assert!(
            a.reset || a.goaway || a.status.is_some(),
            "{name}: no answer at all: {a:?}"
        );
        if at_backend == 1 {
            assert!(
                MAY_REACH.contains(&name.as_str()),
                "{name}: malformed, yet served"
            );
            // What the backend read is what the client was answered for, with the
            // body the client sent.
            assert_eq!(a.status, Some(200), "{name}: {a:?}");
            assert_eq!(String::from_utf8_lossy(&a.body), path, "{name}");
            let case = cases.iter().find(|c| c.name == *name).unwrap();
            let sent: Vec<u8> = case.data.iter().flat_map(|d| fill_in(d, *n)).collect();
            let got = &seen.bodies.iter().find(|(p, _)| *p == path).unwrap().1;
            assert_eq!(
                String::from_utf8_lossy(got),
                String::from_utf8_lossy(&sent),
                "{name}: the backend read another body"
            );
            reached += 1;
        } else {
            assert!(
                a.reset || a.goaway || a.status.is_some_and(|s| s >= 400),
                "{name}: not refused, yet not at the backend: {a:?}"
            );
            refused += 1;
        }
    }
    eprintln!(
        "{} h2 cases: {refused} refused, {reached} reached the backend as one request ({} cut off mid-body)",
        answers.len(),
        seen.cut.len()
    );
}
