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
            tokio::spawn(serve(c, seen.clone()));
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
        match framing {
            Ok(n) => {
                let n = n.unwrap_or(0);
                while buf.len() < n {
                    if !fill(&mut c, &mut buf).await {
                        seen.lock().unwrap().cut.push(path);
                        return;
                    }
                }
                buf.drain(..n);
            }
            Err(_) => match chunked(&mut c, &mut buf).await {
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
        seen.lock().unwrap().paths.push(path);
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
async fn chunked(c: &mut TcpStream, buf: &mut Vec<u8>) -> Chunked {
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
    tokio::time::sleep(Duration::from_millis(300)).await;
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
