//! The `fastcgi` handler against a FastCGI responder written here (exact wire checks:
//! records, lengths, keep-conn, reuse, poisoned connections) and against real php-fpm.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the responder saw of one request.
#[derive(Debug, Clone, Default)]
struct Seen {
    keep_conn: bool,
    params: HashMap<String, String>,
    stdin: Vec<u8>,
    /// Every PARAMS and STDIN record's content length, in order.
    record_lens: Vec<(u8, usize)>,
}

struct Responder {
    addr: SocketAddr,
    conns: Arc<AtomicUsize>,
    /// The most requests being answered at once (from BEGIN_REQUEST to the answer's
    /// first byte): unlike connections, never counted late, since sluice frees a
    /// place only once it has read the answer's end.
    busy_peak: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

async fn read_record(s: &mut TcpStream) -> Option<(u8, Vec<u8>)> {
    let mut h = [0u8; 8];
    s.read_exact(&mut h).await.ok()?;
    assert_eq!(h[0], 1, "version");
    assert_eq!(u16::from_be_bytes([h[2], h[3]]), 1, "request id");
    let len = u16::from_be_bytes([h[4], h[5]]) as usize;
    let mut content = vec![0u8; len + h[6] as usize];
    s.read_exact(&mut content).await.ok()?;
    content.truncate(len);
    Some((h[1], content))
}

fn record(kind: u8, content: &[u8]) -> Vec<u8> {
    let mut r = vec![
        1,
        kind,
        0,
        1,
        (content.len() >> 8) as u8,
        content.len() as u8,
        0,
        0,
    ];
    r.extend_from_slice(content);
    r
}

fn pairs(mut b: &[u8]) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let len = |b: &mut &[u8]| -> usize {
        if b[0] & 0x80 == 0 {
            let n = b[0] as usize;
            *b = &b[1..];
            n
        } else {
            let n = u32::from_be_bytes([b[0] & 0x7f, b[1], b[2], b[3]]) as usize;
            *b = &b[4..];
            n
        }
    };
    while !b.is_empty() {
        let (n, v) = (len(&mut b), len(&mut b));
        let name = String::from_utf8_lossy(&b[..n]).to_string();
        let value = String::from_utf8_lossy(&b[n..n + v]).to_string();
        b = &b[n + v..];
        out.insert(name, value);
    }
    out
}

impl Responder {
    async fn start() -> Responder {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let conns = Arc::new(AtomicUsize::new(0));
        let busy_peak = Arc::new(AtomicUsize::new(0));
        let busy = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (c, sn) = (conns.clone(), seen.clone());
        let (bp, bz) = (busy_peak.clone(), busy.clone());
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                c.fetch_add(1, Ordering::SeqCst);
                let sn = sn.clone();
                let (bp, bz) = (bp.clone(), bz.clone());
                tokio::spawn(async move {
                    loop {
                        let mut seen = Seen::default();
                        let Some((kind, begin)) = read_record(&mut s).await else {
                            return;
                        };
                        assert_eq!(kind, 1, "BEGIN_REQUEST first");
                        let now = bz.fetch_add(1, Ordering::SeqCst) + 1;
                        bp.fetch_max(now, Ordering::SeqCst);
                        struct Busy(Arc<AtomicUsize>);
                        impl Drop for Busy {
                            fn drop(&mut self) {
                                self.0.fetch_sub(1, Ordering::SeqCst);
                            }
                        }
                        let busy = Busy(bz.clone());
                        assert_eq!(u16::from_be_bytes([begin[0], begin[1]]), 1, "responder");
                        seen.keep_conn = begin[2] & 1 == 1;
                        let mut params = Vec::new();
                        loop {
                            let (kind, c) = read_record(&mut s).await.unwrap();
                            assert_eq!(kind, 4, "PARAMS");
                            seen.record_lens.push((kind, c.len()));
                            if c.is_empty() {
                                break;
                            }
                            params.extend_from_slice(&c);
                        }
                        seen.params = pairs(&params);
                        loop {
                            let (kind, c) = read_record(&mut s).await.unwrap();
                            assert_eq!(kind, 5, "STDIN");
                            seen.record_lens.push((kind, c.len()));
                            if c.is_empty() {
                                break;
                            }
                            seen.stdin.extend_from_slice(&c);
                        }
                        let mode = seen.params.get("QUERY_STRING").cloned().unwrap_or_default();
                        let script = seen.params.get("SCRIPT_NAME").cloned().unwrap_or_default();
                        let info = seen.params.get("PATH_INFO").cloned().unwrap_or_default();
                        let stdin_len = seen.stdin.len();
                        sn.lock().unwrap().push(seen);
                        let mut out = Vec::new();
                        let body = format!("script={script} info={info} stdin={stdin_len}");
                        let head: String = match mode.as_str() {
                            "two-status" => "Status: 200 OK\r\nStatus: 500 Oops\r\n\r\n".into(),
                            // What DokuWiki's task runner and others send: the hop's.
                            "hop" => "Status: 200 OK\r\nConnection: close\r\nKeep-Alive: timeout=5\r\nProxy-Connection: close\r\nX-App: yes\r\n\r\n".into(),
                            "te" => "Status: 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".into(),
                            "length" => format!("Status: 200 OK\r\nContent-Length: {}\r\n\r\n", body.len()),
                            "length-over" => format!("Status: 200 OK\r\nContent-Length: {}\r\n\r\n", body.len() + 10),
                            "location" => "Location: /elsewhere\r\n\r\n".into(),
                            "slow" => {
                                tokio::time::sleep(std::time::Duration::from_millis(800)).await;
                                "Status: 200 OK\r\n\r\n".into()
                            }
                            "lf" => "Status: 201 Created\nX-Lf: yes\n\n".into(),
                            // The script ran; its worker died before any output.
                            "vanish" => return,
                            "end-only" => {
                                let _ = s.write_all(&record(3, &[0; 8])).await;
                                continue;
                            }
                            "close" => {
                                let _ = s
                                    .write_all(&record(6, b"Status: 200 OK\r\n\r\npartial"))
                                    .await;
                                return;
                            }
                            _ => "Status: 200 OK\r\nContent-Type: text/plain\r\n\r\n".into(),
                        };
                        // The head split over two records, STDERR in between.
                        let (a, b) = head.as_bytes().split_at(head.len() / 2);
                        out.extend(record(6, a));
                        out.extend(record(7, b"warn: \x1b[31mred\nsecond line"));
                        out.extend(record(6, b));
                        out.extend(record(6, body.as_bytes()));
                        out.extend(record(6, b""));
                        out.extend(record(3, &[0, 0, 0, 0, 0, 0, 0, 0]));
                        drop(busy);
                        if s.write_all(&out).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Responder {
            addr,
            conns,
            busy_peak,
            seen,
        }
    }

    fn last(&self) -> Seen {
        self.seen.lock().unwrap().last().cloned().unwrap()
    }
}

/// An application folder: app.php, dir/index.php, index.php, a static file and a
/// `.php` file's source that must never be served.
fn app_root() -> TempDir {
    let root = TempDir::new();
    root.write("app.php", "<?php echo 'app';");
    root.write("index.php", "<?php echo 'front';");
    root.write("dir/index.php", "<?php echo 'dir';");
    root.write("style.css", "body{}");
    root
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wire_variables_reuse_and_strict_heads() {
    let app = Responder::start().await;
    let root = app_root();
    let s = Sluice::start(&format!(
        "site * {{ fastcgi {} {{ root {}; env APP_ENV prod }} }}",
        app.addr,
        root.0.display()
    ));
    let r = request(
        s.addr,
        "GET",
        "/app.php/extra/path?x=1",
        &[
            ("Host", "Shop.Test:8080"),
            ("X-Custom", "yes"),
            ("X_Custom", "spoof"),
            ("Proxy", "http://evil"),
            ("X-Multi", "a"),
            ("Cookie", "a=1"),
            ("X-Multi", "b"),
            ("Cookie", "b=2"),
        ],
        b"",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.text(), "script=/app.php info=/extra/path stdin=0");
    assert!(!r.text().contains("warn"), "STDERR reached the client");
    let seen = app.last();
    assert!(seen.keep_conn, "BEGIN_REQUEST asks to keep the connection");
    let p = &seen.params;
    let real_root = std::fs::canonicalize(&root.0).unwrap();
    assert_eq!(
        p["SCRIPT_FILENAME"],
        real_root.join("app.php").display().to_string()
    );
    assert_eq!(p["DOCUMENT_ROOT"], real_root.display().to_string());
    assert_eq!(p["REQUEST_URI"], "/app.php/extra/path?x=1");
    assert_eq!(p["QUERY_STRING"], "x=1");
    assert_eq!(p["SERVER_NAME"], "shop.test");
    assert_eq!(p["SERVER_PORT"], "8080");
    assert_eq!(p["REMOTE_ADDR"], "127.0.0.1");
    assert_eq!(p["REQUEST_METHOD"], "GET");
    assert_eq!(
        p["HTTP_X_CUSTOM"], "yes",
        "the dash name, not the underscore one"
    );
    assert_eq!(p["APP_ENV"], "prod");
    assert_eq!(p["HTTP_X_MULTI"], "a, b", "repeated fields joined");
    assert_eq!(p["HTTP_COOKIE"], "a=1; b=2", "cookies joined with ; ");
    assert_eq!(p["DOCUMENT_URI"], "/app.php/extra/path");
    assert_eq!(p["SERVER_PROTOCOL"], "HTTP/1.1");
    assert_eq!(p["CONTENT_TYPE"], "");
    assert!(p["REMOTE_PORT"].parse::<u16>().is_ok_and(|port| port > 0));
    assert!(!p.contains_key("HTTP_PROXY"), "httpoxy");
    assert!(!p.contains_key("HTTPS"));
    s.wait_log("stderr: warn: \\u{1b}[31mred\\nsecond line");

    // A chunked upload: buffered, sent with its exact length.
    let body = vec![b'z'; 200_000];
    let r = request(
        s.addr,
        "POST",
        "/app.php",
        &[("Transfer-Encoding", "chunked")],
        &{
            let mut b = format!("{:x}\r\n", body.len()).into_bytes();
            b.extend_from_slice(&body);
            b.extend_from_slice(b"\r\n0\r\n\r\n");
            b
        },
    )
    .await;
    assert_eq!(r.text(), "script=/app.php info= stdin=200000");
    let seen = app.last();
    assert_eq!(seen.params["CONTENT_LENGTH"], "200000");
    assert_eq!(seen.stdin, body);
    assert!(seen.record_lens.iter().all(|(_, n)| *n <= 65_535));
    assert_eq!(
        seen.record_lens
            .iter()
            .filter(|(k, n)| *k == 5 && *n == 0)
            .count(),
        1
    );

    // All of that on one connection.
    assert_eq!(app.conns.load(Ordering::SeqCst), 1);

    // Status mapping and strictness.
    let r = request(s.addr, "GET", "/app.php?location", &[], b"").await;
    assert_eq!((r.status, r.header("location")), (302, Some("/elsewhere")));
    let r = request(s.addr, "GET", "/app.php?lf", &[], b"").await;
    assert_eq!((r.status, r.header("x-lf")), (201, Some("yes")));
    let before = app.conns.load(Ordering::SeqCst);
    assert_eq!(get(s.addr, "/app.php?two-status").await.status, 502);
    assert_eq!(get(s.addr, "/app.php?te").await.status, 502);
    // Each broken answer poisoned its connection: new ones were opened.
    assert_eq!(get(s.addr, "/app.php").await.status, 200);
    assert!(app.conns.load(Ordering::SeqCst) >= before + 2);
    // The hop's fields in an application's answer are dropped, not a 502 (DESIGN §18.4).
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    let r = ask(&mut c, "/app.php?hop").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-app"), Some("yes"));
    assert_eq!(r.header("keep-alive"), None);
    assert_eq!(r.header("proxy-connection"), None);
    assert_eq!(
        r.header("connection"),
        None,
        "the client's connection stays open"
    );
    assert_eq!(
        ask(&mut c, "/app.php").await.status,
        200,
        "and serves the next"
    );
    // A Content-Length is kept and held to the body.
    let r = ask(&mut c, "/app.php?length").await;
    let len = r.body.len().to_string();
    assert_eq!(
        (r.status, r.header("content-length")),
        (200, Some(len.as_str()))
    );
    let out = raw(
        s.addr,
        b"GET /app.php?length-over HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(
        parse_response(&out).is_none(),
        "fewer bytes than announced: never a complete answer: {}",
        String::from_utf8_lossy(&out)
    );
    // Closed mid-response: the client sees the truncation, the next request a new one.
    let out = raw(
        s.addr,
        b"GET /app.php?close HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(
        !String::from_utf8_lossy(&out).ends_with("0\r\n\r\n"),
        "a truncated body must not look complete"
    );
    assert_eq!(get(s.addr, "/app.php").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_folders_static_files_and_the_front_controller() {
    let app = Responder::start().await;
    let root = app_root();
    let s = Sluice::start(&format!(
        "site * {{
           route /front/* {{ strip /front; fastcgi {a} {{ root {r}; fallback /index.php }} }}
           fastcgi {a} {{ root {r} }}
         }}",
        a = app.addr,
        r = root.0.display()
    ));
    let r = get(s.addr, "/dir").await;
    assert_eq!((r.status, r.header("location")), (301, Some("/dir/")));
    for spelling in ["//evil.example/../dir", "//evil.example/..//dir"] {
        let r = get(s.addr, spelling).await;
        assert_eq!(
            (r.status, r.header("location")),
            (301, Some("/dir/")),
            "{spelling}: never a link to another host"
        );
    }
    assert_eq!(
        get(s.addr, "/dir/").await.text(),
        "script=/dir/index.php info= stdin=0"
    );
    assert_eq!(
        get(s.addr, "/").await.text(),
        "script=/index.php info= stdin=0"
    );
    let r = get(s.addr, "/style.css").await;
    assert_eq!((r.status, r.text().as_str()), (200, "body{}"));
    assert_eq!(get(s.addr, "/missing.php").await.status, 404);
    assert_eq!(get(s.addr, "/nothing/here").await.status, 404);
    // The front controller takes pretty URLs; REQUEST_URI is what the client asked,
    // and SCRIPT_NAME keeps what `strip` took off (a framework under a sub-path builds
    // its base URL from the two), while SCRIPT_FILENAME stays under `root`.
    let r = get(s.addr, "/front/blog/2026/hello?p=2").await;
    assert_eq!(r.text(), "script=/front/index.php info= stdin=0");
    let params = app.last().params;
    assert_eq!(params["REQUEST_URI"], "/front/blog/2026/hello?p=2");
    assert_eq!(params["DOCUMENT_URI"], "/front/index.php");
    assert_eq!(
        params["SCRIPT_FILENAME"],
        root.0.join("index.php").display().to_string()
    );
    let r = get(s.addr, "/front/").await;
    assert_eq!(r.text(), "script=/front/index.php info= stdin=0");
    // A script's source is never served, whatever its name's spelling or encoding.
    {
        use std::os::unix::ffi::OsStrExt;
        let latin1 = std::ffi::OsStr::from_bytes(b"caf\xe9.php");
        std::fs::write(root.0.join(latin1), "<?php echo 'latin1';").unwrap();
    }
    root.write("UPPER.PHP", "<?php echo 'upper';");
    for path in ["/caf%E9.php", "/UPPER.PHP", "/app.php"] {
        let r = get(s.addr, path).await;
        assert!(
            !r.text().contains("<?php"),
            "{path}: the source leaked: {}",
            r.text()
        );
    }
    // A folder redirect keeps what `strip` took off.
    let r = get(s.addr, "/front/dir").await;
    assert_eq!((r.status, r.header("location")), (301, Some("/front/dir/")));
}

/// One request on a kept connection (so on one worker thread); its answer.
async fn ask(c: &mut TcpStream, path: &str) -> Resp {
    c.write_all(format!("GET {path} HTTP/1.1\r\nHost: a\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some((r, _)) = parse_response(&buf) {
            return r;
        }
        let n = tokio::time::timeout(WAIT, c.read(&mut chunk))
            .await
            .expect("an answer within the wait")
            .unwrap();
        assert!(n > 0, "the connection closed");
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Asks for `path` every 100 ms until it answers `status`, for at most 3 s.
async fn until_status(c: &mut TcpStream, path: &str, status: u16, what: &str) {
    let asking = async {
        while ask(c, path).await.status != status {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(3), asking)
        .await
        .expect(what);
}

/// Where a path leads is kept for a second per worker (resolving is a dozen system
/// calls): a script added is answered `404` just after, then found; one removed is
/// `404` again within a second or so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolutions_are_kept_for_a_second() {
    let app = Responder::start().await;
    let root = app_root();
    // One worker thread: the cache is per thread, and a connection's task may move
    // between the threads of a multi-threaded worker.
    let s = Sluice::start(&format!(
        "global {{ workers 1 }}\nsite * {{ fastcgi {a} {{ root {r} }} }}",
        a = app.addr,
        r = root.0.display()
    ));
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    assert_eq!(ask(&mut c, "/new.php").await.status, 404);
    let missed = std::time::Instant::now();
    root.write("new.php", "<?php echo 'new';");
    let r = ask(&mut c, "/new.php").await;
    if missed.elapsed() < std::time::Duration::from_millis(900) {
        assert_eq!(r.status, 404, "the first resolution is kept for a second");
    }
    until_status(
        &mut c,
        "/new.php",
        200,
        "a new script is found within a second or so",
    )
    .await;
    assert_eq!(app.last().params["SCRIPT_NAME"], "/new.php");
    std::fs::remove_file(root.0.join("new.php")).unwrap();
    until_status(
        &mut c,
        "/new.php",
        404,
        "a removed script is gone within a second or so",
    )
    .await;
    // A static file is resolved on every request: swapped for a link to a script just
    // after it was served, its next request never sends the script's source.
    let r = ask(&mut c, "/style.css").await;
    assert_eq!((r.status, r.text().as_str()), (200, "body{}"));
    std::fs::remove_file(root.0.join("style.css")).unwrap();
    std::os::unix::fs::symlink(root.0.join("app.php"), root.0.join("style.css")).unwrap();
    let r = ask(&mut c, "/style.css").await;
    assert!(
        r.status == 404 && !r.text().contains("<?php"),
        "a static answer was kept: {} {}",
        r.status,
        r.text()
    );
}

/// Request bodies held at once count against `global { spool_max }` (DESIGN §18.4):
/// while one upload waits for a slow application, a second that would pass the budget
/// gets `503` with `Retry-After: 5` and is counted; once the first is answered, the
/// budget is free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bodies_share_one_spool_budget() {
    let app = Responder::start().await;
    let root = app_root();
    let s = Sluice::start(&format!(
        "global {{ admin 127.0.0.1:0; spool_max 1M }}\nsite * {{ fastcgi {} {{ root {} }} }}\n",
        app.addr,
        root.0.display()
    ));
    let body = vec![b'u'; 700 << 10];
    let first = {
        let (addr, body) = (s.addr, body.clone());
        tokio::spawn(async move { request(addr, "POST", "/app.php?slow", &[], &body).await })
    };
    let t = std::time::Instant::now();
    while app.seen.lock().unwrap().is_empty() {
        assert!(
            t.elapsed() < WAIT,
            "the first upload reached the application"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let second = request(s.addr, "POST", "/app.php", &[], &body).await;
    assert_eq!(second.status, 503, "{}", second.text());
    assert_eq!(second.header("retry-after"), Some("5"));
    assert_eq!(second.text(), "Server busy, retry in a moment\n");
    assert_eq!(first.await.unwrap().status, 200);
    let third = request(s.addr, "POST", "/app.php", &[], &body).await;
    assert_eq!(
        third.status,
        200,
        "the budget is given back: {}",
        third.text()
    );
    let metrics = get(s.admin(), "/metrics").await.text();
    assert!(
        metrics.contains("sluice_fastcgi_spool_full_total 1\n"),
        "{metrics}"
    );
}

/// A reload keeps a FastCGI route's pool (DESIGN §18.4): the connections the old
/// generation's requests hold count under the same `max_conns`, so at most N reach the
/// application across the swap — and a reload that changes N resizes that one cap
/// (the same thing, resized), so lowering it never lets old and new add up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_conns_holds_across_a_reload() {
    for after in [2, 1] {
        max_conns_across_a_reload(after).await;
    }
}

/// Two slow requests in flight under `max_conns 2`, a reload to `max_conns {after}`,
/// two more: never more than two at the application at once.
async fn max_conns_across_a_reload(after: usize) {
    let app = Responder::start().await;
    let root = app_root();
    let dir = TempDir::new();
    let conf = |extra: &str, max: usize| {
        format!(
            "listen 127.0.0.1:0\nglobal {{ admin 127.0.0.1:0 }}\nsite * {{ {extra}\n fastcgi {} {{ root {}; max_conns {max} }} }}\n",
            app.addr,
            root.0.display()
        )
    };
    let path = dir.write("sluice.conf", &conf("", 2));
    let s = Sluice::spawn(&["run", "-c", path.to_str().unwrap()], dir);
    let slow = |n: usize| {
        let addr = s.addr;
        (0..n)
            .map(move |_| tokio::spawn(async move { get(addr, "/app.php?slow").await.status }))
            .collect::<Vec<_>>()
    };
    let before = slow(2);
    let t = std::time::Instant::now();
    while app.seen.lock().unwrap().len() < 2 {
        assert!(
            t.elapsed() < WAIT,
            "both slow requests reached the application"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    std::fs::write(&path, conf("route /other { respond other }", after)).unwrap();
    let r = common::post_json(s.admin(), "/reload", "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        get(s.addr, "/other").await.text(),
        "other",
        "the new generation serves"
    );
    let after_reload = slow(2);
    for h in before.into_iter().chain(after_reload) {
        assert_eq!(h.await.unwrap(), 200, "max_conns {after}");
    }
    assert_eq!(
        app.busy_peak.load(Ordering::SeqCst),
        2,
        "max_conns 2, then {after}: the new generation waited for the old one's places"
    );
    let status = get(s.admin(), "/status").await.text();
    assert!(
        status.contains(&format!("\"max_conns\":{after}")),
        "the pool shows its new cap: {status}"
    );
}

#[test]
fn protected_variables_cannot_be_set_with_env() {
    let root = app_root();
    let dir = TempDir::new();
    for name in ["SCRIPT_FILENAME", "HTTP_HOST", "remote_addr"] {
        let path = dir.write(
            "sluice.conf",
            &format!(
                "site * {{\n  fastcgi 127.0.0.1:9000 {{ root {}; env {name} x }}\n}}\n",
                root.0.display()
            ),
        );
        let o = std::process::Command::new(bin())
            .args(["check", "-c", path.to_str().unwrap()])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{name}: {err}");
        assert!(err.contains("env cannot override"), "{name}: {err}");
    }
}

/// php-fpm's binary, or `None` (after saying why) when the test should skip.
fn php_fpm() -> Option<std::path::PathBuf> {
    let found = std::fs::read_dir("/usr/sbin").ok().and_then(|d| {
        d.filter_map(|e| e.ok()).map(|e| e.path()).find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("php-fpm"))
        })
    });
    if found.is_none() {
        if require_interop() {
            panic!("php-fpm is required (SLUICE_INTEROP=require) but not installed");
        }
        eprintln!("skipping: php-fpm is not installed");
    }
    found
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_php_fpm_over_tcp_and_a_unix_socket() {
    let Some(fpm) = php_fpm() else { return };
    let root = TempDir::new();
    root.write(
        "vars.php",
        r#"<?php header('Content-Type: application/json'); echo json_encode(['SCRIPT_NAME' => $_SERVER['SCRIPT_NAME'], 'PATH_INFO' => $_SERVER['PATH_INFO'] ?? '', 'REQUEST_URI' => $_SERVER['REQUEST_URI'], 'QUERY' => $_GET, 'HTTPS' => $_SERVER['HTTPS'] ?? '', 'REMOTE_ADDR' => $_SERVER['REMOTE_ADDR'], 'SERVER_NAME' => $_SERVER['SERVER_NAME'], 'HTTP_X_TEST' => $_SERVER['HTTP_X_TEST'] ?? '', 'PROXY' => getenv('HTTP_PROXY') ?: '', 'APP' => getenv('APP_NAME') ?: '']);"#,
    );
    root.write(
        "upload.php",
        r#"<?php $d = file_get_contents('php://input'); echo strlen($d), ' ', hash('crc32b', $d), ' ', $_SERVER['CONTENT_LENGTH'];"#,
    );
    root.write(
        "err.php",
        r#"<?php error_log('secret-stderr-text'); header('X-Made: by-php'); header('X-Powered-By: PHP/test'); http_response_code(418); echo 'body';"#,
    );
    root.write(
        "index.php",
        r#"<?php echo 'front:', $_SERVER['REQUEST_URI'], ' script:', $_SERVER['SCRIPT_NAME'], ' file:', $_SERVER['SCRIPT_FILENAME'];"#,
    );
    // What DokuWiki's task runner does on every page view: the hop's fields, and its
    // own length (DESIGN §18.4: dropped and kept, never a 502).
    root.write(
        "hop.php",
        r#"<?php header('Connection: close'); header('Keep-Alive: timeout=5'); header('Content-Length: 7'); echo 'hop ok!';"#,
    );
    root.write(
        "redir.php",
        r#"<?php header('Location: /vars.php?from=redir', true, 302); header('Connection: keep-alive'); echo 'moved';"#,
    );
    root.write("logo.txt", "static beside php");
    let run = TempDir::new();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let sock = run.0.join("php.sock");
    let conf = run.write(
        "fpm.conf",
        &format!(
            "[global]\npid = {d}/fpm.pid\nerror_log = {d}/fpm.log\ndaemonize = no\n\
             [tcp]\nuser = root\nlisten = 127.0.0.1:{port}\npm = static\npm.max_children = 4\nclear_env = no\n\
             [unix]\nuser = root\nlisten = {sock}\npm = static\npm.max_children = 2\n",
            d = run.0.display(),
            sock = sock.display()
        ),
    );
    let mut cmd = std::process::Command::new(&fpm);
    cmd.args([
        "-F",
        "-R",
        "-y",
        conf.to_str().unwrap(),
        "-p",
        run.0.to_str().unwrap(),
    ])
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null());
    // Its own process group: the master and every worker stop together.
    let _fpm = Group::spawn(cmd).expect("php-fpm starts");
    let deadline = std::time::Instant::now() + WAIT;
    while !(sock.exists() && std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()) {
        assert!(
            std::time::Instant::now() < deadline,
            "php-fpm did not start: {}",
            std::fs::read_to_string(run.0.join("fpm.log")).unwrap_or_default()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let s = Sluice::start(&format!(
        "site * {{
           route /unix/* {{ strip /unix; fastcgi unix:{sock} {{ root {r}; fallback /index.php }} }}
           fastcgi 127.0.0.1:{port} {{ root {r}; env APP_NAME shop }}
         }}",
        sock = sock.display(),
        r = root.0.display()
    ));
    let r = request(
        s.addr,
        "GET",
        "/vars.php/more/info?a=1&b=two",
        &[
            ("Host", "app.test"),
            ("X-Test", "hello"),
            ("Proxy", "http://evil:1"),
        ],
        b"",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    let v: serde_json::Value = serde_json::from_str(&r.text()).unwrap();
    assert_eq!(v["SCRIPT_NAME"], "/vars.php");
    assert_eq!(v["PATH_INFO"], "/more/info");
    assert_eq!(v["REQUEST_URI"], "/vars.php/more/info?a=1&b=two");
    assert_eq!(v["QUERY"]["b"], "two");
    assert_eq!(v["REMOTE_ADDR"], "127.0.0.1");
    assert_eq!(v["SERVER_NAME"], "app.test");
    assert_eq!(v["HTTP_X_TEST"], "hello");
    assert_eq!(v["PROXY"], "", "httpoxy");
    assert_eq!(v["APP"], "shop");
    // Uploads up to 8 MiB, over both transports.
    for (path, size) in [
        ("/upload.php", 8 << 20),
        ("/unix/upload.php", 1 << 20),
        ("/upload.php", 0),
    ] {
        let body: Vec<u8> = (0..size).map(|i: usize| (i * 31 % 253) as u8).collect();
        let r = request(
            s.addr,
            "POST",
            path,
            &[("Content-Type", "application/octet-stream")],
            &body,
        )
        .await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        assert_eq!(
            r.text(),
            format!("{} {:08x} {}", body.len(), crc32(&body), body.len()),
            "{path}"
        );
    }
    // Status and headers from PHP; its error_log output stays out of the response.
    let r = get(s.addr, "/err.php").await;
    assert_eq!((r.status, r.header("x-made")), (418, Some("by-php")));
    assert_eq!(
        r.header("x-powered-by"),
        None,
        "the application's X-Powered-By is dropped"
    );
    assert_eq!(r.text(), "body");
    s.wait_log("secret-stderr-text");
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    let r = ask(&mut c, "/hop.php").await;
    assert_eq!((r.status, r.text()), (200, "hop ok!".to_string()));
    assert_eq!(r.header("content-length"), Some("7"));
    assert_eq!(r.header("keep-alive"), None);
    assert_eq!(
        r.header("connection"),
        None,
        "the client's connection stays open"
    );
    assert_eq!(ask(&mut c, "/logo.txt").await.status, 200);
    // A redirect from the application, as written, its hop-by-hop field dropped.
    let r = ask(&mut c, "/redir.php").await;
    assert_eq!(r.status, 302);
    assert_eq!(r.header("location"), Some("/vars.php?from=redir"));
    assert_eq!(r.header("connection"), None);
    assert_eq!(ask(&mut c, "/logo.txt").await.status, 200);
    // Static files beside the scripts; a script's source never.
    assert_eq!(get(s.addr, "/logo.txt").await.text(), "static beside php");
    assert!(!get(s.addr, "/index.php").await.text().contains("<?php"));
    // A front controller with pretty URLs under a sub-path, over the Unix socket: PHP
    // sees the client's view in SCRIPT_NAME (what `strip` took off in front), the file
    // under `root`.
    let r = get(s.addr, "/unix/blog/2026/hello-world?page=2").await;
    assert_eq!(
        r.text(),
        format!(
            "front:/unix/blog/2026/hello-world?page=2 script:/unix/index.php file:{}",
            root.0.join("index.php").display()
        )
    );
    let r = get(s.addr, "/unix/logo.txt").await;
    assert_eq!(r.text(), "static beside php");
    // More requests at once than the pool has workers (2): php-fpm binds a worker to a
    // kept connection, so idle connections must be let go for the waiting ones.
    let burst: Vec<_> = (0..12)
        .map(|i| {
            let addr = s.addr;
            tokio::spawn(async move { get(addr, &format!("/unix/page/{i}")).await })
        })
        .collect();
    let all = async {
        for t in burst {
            assert_eq!(t.await.unwrap().status, 200);
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), all)
        .await
        .expect("a burst larger than the worker pool completes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_conns_caps_sockets_under_one_deadline() {
    let app = Responder::start().await;
    let root = app_root();
    let s = Sluice::start(&format!(
        "site * {{ fastcgi {} {{ root {}; max_conns 1; connect_timeout 300ms }} }}",
        app.addr,
        root.0.display()
    ));
    let addr = s.addr;
    let slow = tokio::spawn(async move { get(addr, "/app.php?slow").await });
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let started = std::time::Instant::now();
    let r = get(s.addr, "/app.php").await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(started.elapsed() < std::time::Duration::from_millis(700));
    assert_eq!(slow.await.unwrap().status, 200);
    // The one socket came back and is reused.
    assert_eq!(get(s.addr, "/app.php").await.status, 200);
    assert_eq!(app.conns.load(Ordering::SeqCst), 1);
}

/// A request the application received and closed on without any output is answered
/// 502 and never sent again — even on a kept connection, even for a POST (it may have
/// run: php-fpm killing a worker after the script did its work).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_application_dropped_is_never_sent_twice() {
    let app = Responder::start().await;
    let root = app_root();
    let s = Sluice::start(&format!(
        "site * {{ fastcgi {} {{ root {} }} }}",
        app.addr,
        root.0.display()
    ));
    for mode in ["vanish", "end-only"] {
        // Warm a kept connection, so the next request goes out on a reused one.
        assert_eq!(get(s.addr, "/app.php").await.status, 200);
        let r = request(s.addr, "POST", &format!("/app.php?{mode}"), &[], b"order=1").await;
        assert_eq!(r.status, 502, "{mode}: {}", r.text());
        let runs = app
            .seen
            .lock()
            .unwrap()
            .iter()
            .filter(|x| x.params.get("QUERY_STRING").map(String::as_str) == Some(mode))
            .count();
        assert_eq!(
            runs, 1,
            "{mode}: the POST reached the application {runs} times"
        );
    }
}

/// A declared length over `max_body` is refused at once: 413 before `100 Continue`,
/// with nothing read and nothing sent to the application.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_body_over_max_body_is_refused_before_100_continue() {
    let app = Responder::start().await;
    let root = app_root();
    let s = Sluice::start(&format!(
        "site * {{ fastcgi {} {{ root {}; max_body 10M }} }}",
        app.addr,
        root.0.display()
    ));
    let mut c = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    c.write_all(
        b"POST /app.php HTTP/1.1\r\nHost: a\r\nContent-Length: 12000000\r\nExpect: 100-continue\r\n\r\n",
    )
    .await
    .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(std::time::Duration::from_secs(5), c.read(&mut buf))
        .await
        .expect("an answer without sending the body")
        .unwrap();
    let text = String::from_utf8_lossy(&buf[..n]);
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    assert_eq!(
        app.seen.lock().unwrap().len(),
        0,
        "nothing reached the application"
    );
}

/// Bodies past 1 MiB go through a temporary file: the application gets every byte with
/// its exact length (declared or chunked), and sluice's memory does not grow with the
/// uploads (six 60 MiB uploads once held 577 MB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_uploads_reach_the_application_whole_in_bounded_memory() {
    let app = Responder::start().await;
    let root = app_root();
    let s = Sluice::start(&format!(
        "site * {{ fastcgi {} {{ root {}; max_body 64M }} }}",
        app.addr,
        root.0.display()
    ));
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let r = request(s.addr, "POST", "/app.php", &[], &big).await;
    assert_eq!(r.text(), "script=/app.php info= stdin=3000000");
    assert_eq!(
        app.last().stdin,
        big,
        "declared length, every byte in order"
    );
    let mut chunked = Vec::new();
    for piece in big.chunks(100_000) {
        chunked.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
        chunked.extend_from_slice(piece);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let r = request(
        s.addr,
        "POST",
        "/app.php",
        &[("Transfer-Encoding", "chunked")],
        &chunked,
    )
    .await;
    assert_eq!(r.text(), "script=/app.php info= stdin=3000000");
    let seen = app.last();
    assert_eq!(seen.params["CONTENT_LENGTH"], "3000000");
    assert_eq!(seen.stdin, big, "chunked, every byte in order");

    let (_, peak_before) = rss_kib(s.pid());
    let upload = vec![b'u'; 40 << 20];
    let uploads = (0..4).map(|_| request(s.addr, "POST", "/app.php", &[], &upload));
    for r in futures_util::future::join_all(uploads).await {
        assert_eq!(
            r.text(),
            format!("script=/app.php info= stdin={}", 40 << 20)
        );
    }
    let (_, peak_after) = rss_kib(s.pid());
    assert!(
        peak_after.saturating_sub(peak_before) < 48 * 1024,
        "four 40 MiB uploads at once grew the peak RSS by {} KiB",
        peak_after - peak_before
    );
}

/// A FastCGI pool is shown like a proxy pool: in `/status` (its connections, and its
/// route's requests by class) and in `/metrics`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_is_in_status_and_metrics() {
    let app = Responder::start().await;
    let root = app_root();
    let dir = TempDir::new();
    let conf = dir.write(
        "sluice.conf",
        &format!(
            "global {{ admin 127.0.0.1:0 }}\nlisten 127.0.0.1:0\nsite app.test {{ route /php/* {{ strip /php; fastcgi {} {{ root {}; max_conns 3 }} }} }}\n",
            app.addr,
            root.0.display()
        ),
    );
    let s = Sluice::spawn(&["run", "-c", conf.to_str().unwrap()], dir);
    let admin = s.admin();
    for _ in 0..2 {
        let r = get_host(s.addr, "app.test", "/php/app.php").await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let st: serde_json::Value = serde_json::from_slice(&get(admin, "/status").await.body).unwrap();
    let pool = &st["fastcgi_pools"][0];
    assert_eq!(pool["name"], "app.test /php/*", "{st}");
    assert_eq!(pool["address"], app.addr.to_string());
    assert_eq!(pool["max_conns"], 3);
    assert_eq!(
        (pool["open"].as_u64(), pool["idle"].as_u64()),
        (Some(1), Some(1)),
        "one kept connection: {st}"
    );
    let route = st["routes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["pool"] == "app.test /php/*")
        .unwrap_or_else(|| panic!("the pool's route: {st}"));
    assert_eq!(route["requests"]["by_class"]["2xx"], 2, "{st}");
    let m = get(admin, "/metrics").await.text();
    for line in [
        "sluice_fastcgi_connections_open{pool=\"app.test /php/*\"} 1\n",
        "sluice_fastcgi_connections_idle{pool=\"app.test /php/*\"} 1\n",
        "sluice_fastcgi_max_conns{pool=\"app.test /php/*\"} 3\n",
        "sluice_http_requests_total{site=\"app.test\",route=\"/php/*\",code=\"2xx\"} 2\n",
    ] {
        assert!(m.contains(line), "{line} in\n{m}");
    }
}
