//! `files DIR`: validators and conditional requests, single ranges, MIME types, index
//! files and listings, `HEAD`, no way out of DIR, and a 1 GiB file in bounded memory.

mod common;

use std::io::Write;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A site serving a fresh folder: (sluice, the folder, a folder outside it).
fn site(browse: bool) -> (Sluice, TempDir, TempDir) {
    let root = TempDir::new();
    let outside = TempDir::new();
    root.write("index.html", "<h1>home</h1>");
    root.write("style.css", "body{}");
    root.write("notes.txt", "0123456789abcdefghij");
    root.write("sub/index.html", "sub home");
    root.write("bare/<b>&'.txt", "tricky");
    outside.write("secret.txt", "do not serve");
    std::os::unix::fs::symlink(outside.0.join("secret.txt"), root.0.join("leak.txt")).unwrap();
    std::os::unix::fs::symlink(outside.0.clone(), root.0.join("leakdir")).unwrap();
    std::os::unix::fs::symlink(root.0.join("notes.txt"), root.0.join("alias.txt")).unwrap();
    let browse = if browse { "browse on" } else { "browse off" };
    let s = Sluice::start(&format!(
        "site * {{ route /static/* {{ strip /static; files {} {{ {browse} }} }} files {} {{ {browse} }} }}",
        root.0.display(),
        root.0.display()
    ));
    (s, root, outside)
}

#[tokio::test]
async fn files_are_served_with_validators_and_types() {
    let (s, _root, _out) = site(false);
    let r = get(s.addr, "/notes.txt").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "0123456789abcdefghij");
    assert_eq!(r.header("content-type"), Some("text/plain"));
    assert_eq!(r.header("accept-ranges"), Some("bytes"));
    let etag = r.header("etag").expect("an ETag").to_string();
    let lm = r
        .header("last-modified")
        .expect("Last-Modified")
        .to_string();
    assert_eq!(
        get(s.addr, "/style.css").await.header("content-type"),
        Some("text/css")
    );
    let r = get(s.addr, "/").await;
    assert_eq!(r.text(), "<h1>home</h1>");
    assert_eq!(r.header("content-type"), Some("text/html"));
    // strip, then the same file.
    assert_eq!(
        get(s.addr, "/static/notes.txt").await.text(),
        "0123456789abcdefghij"
    );

    // Conditional requests.
    let r = request(
        s.addr,
        "GET",
        "/notes.txt",
        &[("If-None-Match", &etag)],
        b"",
    )
    .await;
    assert_eq!(r.status, 304);
    assert!(r.body.is_empty());
    let r = request(
        s.addr,
        "GET",
        "/notes.txt",
        &[("If-None-Match", "\"other\", W/\"x\"")],
        b"",
    )
    .await;
    assert_eq!(r.status, 200);
    let r = request(
        s.addr,
        "GET",
        "/notes.txt",
        &[("If-Modified-Since", &lm)],
        b"",
    )
    .await;
    assert_eq!(r.status, 304);
    let r = request(
        s.addr,
        "GET",
        "/notes.txt",
        &[("If-Modified-Since", "Mon, 01 Jan 2001 00:00:00 GMT")],
        b"",
    )
    .await;
    assert_eq!(r.status, 200);

    // HEAD: the headers, no body.
    let out = raw(
        s.addr,
        b"HEAD /notes.txt HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
    .await;
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(
        text.to_ascii_lowercase().contains("content-length: 20"),
        "{text}"
    );
    assert!(text.ends_with("\r\n\r\n"), "no body after a HEAD: {text}");
    // Other methods.
    let r = request(s.addr, "POST", "/notes.txt", &[], b"x").await;
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow"), Some("GET, HEAD"));
}

#[tokio::test]
async fn ranges_partial_unsatisfiable_and_several() {
    let (s, _root, _out) = site(false);
    let r = request(s.addr, "GET", "/notes.txt", &[("Range", "bytes=2-5")], b"").await;
    assert_eq!(r.status, 206);
    assert_eq!(r.text(), "2345");
    assert_eq!(r.header("content-range"), Some("bytes 2-5/20"));
    let r = request(s.addr, "GET", "/notes.txt", &[("Range", "bytes=-3")], b"").await;
    assert_eq!((r.status, r.text().as_str()), (206, "hij"));
    let r = request(s.addr, "GET", "/notes.txt", &[("Range", "bytes=15-")], b"").await;
    assert_eq!((r.status, r.text().as_str()), (206, "fghij"));
    let r = request(s.addr, "GET", "/notes.txt", &[("Range", "bytes=20-")], b"").await;
    assert_eq!(r.status, 416);
    assert_eq!(r.header("content-range"), Some("bytes */20"));
    let r = request(
        s.addr,
        "GET",
        "/notes.txt",
        &[("Range", "bytes=0-1,4-5")],
        b"",
    )
    .await;
    assert_eq!((r.status, r.text().len()), (200, 20));
    // If-Range with a stale validator: the whole file.
    let r = request(
        s.addr,
        "GET",
        "/notes.txt",
        &[("Range", "bytes=0-1"), ("If-Range", "\"stale\"")],
        b"",
    )
    .await;
    assert_eq!((r.status, r.text().len()), (200, 20));
}

#[tokio::test]
async fn folders_index_slash_and_listing() {
    let (s, _root, _out) = site(false);
    let r = get(s.addr, "/sub").await;
    assert_eq!(r.status, 301);
    assert_eq!(r.header("location"), Some("/sub/"));
    // Behind `strip`, the redirect keeps the prefix the client wrote.
    let r = get(s.addr, "/static/sub?x=1").await;
    assert_eq!(r.header("location"), Some("/static/sub/?x=1"));
    // Never a link to another host: the redirect is built from the normalised path.
    for (spelling, to) in [
        ("//evil.example/../sub", "/sub/"),
        ("//evil.example/..//sub?x=1", "/sub/?x=1"),
        ("/static//evil.example/../sub", "/static/sub/"),
        ("///sub", "/sub/"),
    ] {
        let r = get(s.addr, spelling).await;
        assert_eq!(
            (r.status, r.header("location")),
            (301, Some(to)),
            "{spelling}"
        );
    }
    assert_eq!(get(s.addr, "/sub/").await.text(), "sub home");
    // No index, no listing.
    assert_eq!(get(s.addr, "/bare/").await.status, 404);

    let (s, _root, _out) = site(true);
    let r = get(s.addr, "/bare/").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    let html = r.text();
    assert!(html.contains("&lt;b&gt;&amp;&#39;.txt"), "{html}");
    assert!(!html.contains("<b>&"), "an unescaped name: {html}");
    assert!(html.contains("href=\"%3Cb%3E%26%27.txt\""), "{html}");
    assert_eq!(
        get(s.addr, "/bare/%3Cb%3E%26%27.txt").await.text(),
        "tricky"
    );
}

#[tokio::test]
async fn nothing_outside_the_folder_is_served() {
    let (s, _root, _out) = site(true);
    for path in [
        "/leak.txt",
        "/leakdir/secret.txt",
        "/leakdir/",
        "/..%2Fsecret.txt",
        "/sub%2F..%2F..%2Fsecret.txt",
        "/%5C..%5Csecret.txt",
        "/static/leak.txt",
        "/nope.txt",
    ] {
        let r = get(s.addr, path).await;
        assert_eq!(r.status, 404, "{path}: {}", r.text());
        assert!(!r.text().contains("do not serve"), "{path}");
    }
    // Climbing above the root is refused before any route, and so is a raw `\`.
    for path in [
        "/sub\\..\\..\\secret.txt",
        "/../secret.txt",
        "/%2e%2e/secret.txt",
        "/sub/../../secret.txt",
    ] {
        let r = get(s.addr, path).await;
        assert_eq!(r.status, 400, "{path}");
    }
    // A link that stays inside is fine.
    assert_eq!(
        get(s.addr, "/alias.txt").await.text(),
        "0123456789abcdefghij"
    );
}

/// What is served is checked where it was opened: a folder swapped for a link out of
/// the root between two requests is refused at once, a file replaced is served new, and
/// a named pipe is never opened for reading (it would wait for a writer) nor served.
#[tokio::test]
async fn what_is_opened_is_checked_and_never_waits() {
    let root = TempDir::new();
    let outside = TempDir::new();
    root.write("d/page.txt", "inside");
    root.write("e.txt", "one");
    outside.write("page.txt", "do not serve");
    let fifo = root.0.join("pipe");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    assert!(made.is_ok_and(|s| s.success()), "mkfifo");
    // One worker: a request that blocked it would stall every later one.
    let s = Sluice::start(&format!(
        "global {{ workers 1 }}\nsite * {{ files {} {{ index pipe index.html }} }}",
        root.0.display()
    ));
    for _ in 0..3 {
        assert_eq!(get(s.addr, "/d/page.txt").await.text(), "inside");
        assert_eq!(get(s.addr, "/e.txt").await.text(), "one");
    }
    std::fs::rename(root.0.join("d"), root.0.join("d.old")).unwrap();
    std::os::unix::fs::symlink(&outside.0, root.0.join("d")).unwrap();
    root.write("e.new", "two!");
    std::fs::rename(root.0.join("e.new"), root.0.join("e.txt")).unwrap();
    let r = get(s.addr, "/d/page.txt").await;
    assert_eq!(r.status, 404, "{}", r.text());
    assert!(!r.text().contains("do not serve"));
    let r = get(s.addr, "/e.txt").await;
    assert_eq!((r.status, r.text().as_str()), (200, "two!"));
    assert_eq!(r.header("content-length"), Some("4"));
    std::fs::remove_file(root.0.join("d")).unwrap();
    std::fs::rename(root.0.join("d.old"), root.0.join("d")).unwrap();
    assert_eq!(get(s.addr, "/d/page.txt").await.text(), "inside");
    // The pipe, asked for by name or as a folder's index: 404, and the worker free.
    for path in ["/pipe", "/"] {
        let r = tokio::time::timeout(std::time::Duration::from_secs(5), get(s.addr, path))
            .await
            .unwrap_or_else(|_| panic!("{path}: the worker is stuck"));
        assert_eq!(r.status, 404, "{path}");
    }
    assert_eq!(get(s.addr, "/e.txt").await.text(), "two!");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1_gib_file_streams_in_bounded_memory() {
    let root = TempDir::new();
    let path = root.0.join("big.bin");
    {
        // Sparse: 1 GiB of zeros on disk costs nothing; a marker at the end.
        let mut f = std::fs::File::create(&path).unwrap();
        f.set_len((1 << 30) - 4).unwrap();
        std::io::Seek::seek(&mut f, std::io::SeekFrom::End(0)).unwrap();
        f.write_all(b"END!").unwrap();
    }
    let s = Sluice::start(&format!("site * {{ files {} }}", root.0.display()));
    let (_, peak_before) = rss_kib(s.pid());
    let mut c = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    c.write_all(b"GET /big.bin HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut total = 0u64;
    let mut tail = Vec::new();
    let mut buf = vec![0u8; 256 * 1024];
    let read_all = async {
        loop {
            let n = c.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            total += n as u64;
            tail.extend_from_slice(&buf[..n]);
            if tail.len() > 8 {
                tail.drain(..tail.len() - 8);
            }
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(120), read_all)
        .await
        .expect("1 GiB within 2 minutes");
    assert!(total > 1 << 30, "head and 1 GiB of body: {total}");
    assert_eq!(&tail[4..], b"END!");
    let (_, peak_after) = rss_kib(s.pid());
    assert!(
        peak_after.saturating_sub(peak_before) < 16 * 1024,
        "peak RSS grew by {} KiB",
        peak_after - peak_before
    );
}

#[test]
fn a_missing_folder_fails_the_check() {
    let dir = TempDir::new();
    let path = dir.write("sluice.conf", "site * {\n  files ./nowhere\n}\n");
    let o = std::process::Command::new(bin())
        .args(["check", "-c", path.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains(":2:9") && err.contains("nowhere"), "{err}");
}

/// A single-page app (DESIGN §16): `fallback` answers `200` with the app's page for
/// any path that is no file, after the path itself and a folder's index.
#[tokio::test]
async fn fallback_serves_a_single_page_app() {
    let root = TempDir::new();
    root.write("index.html", "<app>");
    root.write("assets/app.js", "js()");
    root.write("docs/index.html", "docs home");
    root.write("empty/.keep", "");
    let s = Sluice::start(&format!(
        "site * {{
            route /plain/* {{ strip /plain; files {r} }}
            files {r} {{ fallback /index.html }}
        }}",
        r = root.0.display()
    ));
    for path in ["/", "/users/7/edit", "/missing.js", "/empty/", "/assets/"] {
        let r = get(s.addr, path).await;
        assert_eq!((r.status, r.text().as_str()), (200, "<app>"), "{path}");
        assert_eq!(r.header("content-type"), Some("text/html"), "{path}");
    }
    assert_eq!(get(s.addr, "/assets/app.js").await.text(), "js()");
    assert_eq!(get(s.addr, "/docs/").await.text(), "docs home");
    // A folder without its slash is still redirected, as it exists.
    assert_eq!(get(s.addr, "/docs").await.status, 301);
    // The fallback is a file like any: validators hold.
    let tag = get(s.addr, "/x").await.header("etag").unwrap().to_string();
    let r = request(s.addr, "GET", "/y", &[("If-None-Match", &tag)], b"").await;
    assert_eq!(r.status, 304);
    // Without it: 404.
    assert_eq!(get(s.addr, "/plain/users/7").await.status, 404);
    assert_eq!(get(s.addr, "/plain/").await.text(), "<app>");
}

/// `precompressed zstd br gzip` (DESIGN §16): a sibling the client accepts is sent
/// with its coding, the original's type and its own ETag; `Vary` whenever a sibling
/// exists; the route's own compression leaves it alone.
#[tokio::test]
async fn precompressed_siblings_are_chosen_like_compression() {
    let root = TempDir::new();
    root.write("app.js", "plain js");
    root.write("app.js.br", "BROTLI BYTES");
    root.write("app.js.gz", "GZIP BYTES");
    root.write("only.css", &"a{} ".repeat(500));
    let s = Sluice::start(&format!(
        "site * {{ files {} {{ precompressed zstd br gzip }} }}",
        root.0.display()
    ));
    let ask = |accept: &'static str| {
        let addr = s.addr;
        async move { request(addr, "GET", "/app.js", &[("Accept-Encoding", accept)], b"").await }
    };
    let mut tags = Vec::new();
    for (accept, body, coding) in [
        ("br", "BROTLI BYTES", Some("br")),
        ("gzip, br", "GZIP BYTES", Some("gzip")),
        ("zstd, br;q=0.5, gzip;q=0.4", "BROTLI BYTES", Some("br")),
        ("gzip;q=0.9, br;q=0.5", "GZIP BYTES", Some("gzip")),
        ("zstd", "plain js", None),
        ("identity", "plain js", None),
        ("br;q=0, gzip;q=0", "plain js", None),
    ] {
        let r = ask(accept).await;
        assert_eq!(r.status, 200, "{accept}");
        assert_eq!(r.text(), body, "{accept}");
        assert_eq!(r.header("content-encoding"), coding, "{accept}");
        assert_eq!(r.header("vary"), Some("Accept-Encoding"), "{accept}");
        assert!(
            r.header("content-type").unwrap().contains("javascript"),
            "{accept}"
        );
        tags.push(r.header("etag").unwrap().to_string());
    }
    assert!(tags[0].ends_with("-br\""), "{tags:?}");
    assert_ne!(tags[0], tags[1]);
    assert_ne!(tags[0], tags[4]);
    let r = request(
        s.addr,
        "GET",
        "/app.js",
        &[("Accept-Encoding", "br"), ("If-None-Match", &tags[0])],
        b"",
    )
    .await;
    assert_eq!(r.status, 304);
    assert_eq!(r.header("vary"), Some("Accept-Encoding"));
    // No sibling: the route compresses as usual.
    let r = request(
        s.addr,
        "GET",
        "/only.css",
        &[("Accept-Encoding", "br")],
        b"",
    )
    .await;
    assert_eq!(r.header("content-encoding"), Some("br"));
}

/// Dotfiles are `404` unless `dotfiles allow`, in any spelling; `/.well-known/` at the
/// root is always served.
#[tokio::test]
async fn dotfiles_are_hidden_unless_allowed() {
    let root = TempDir::new();
    root.write(".env", "SECRET=1");
    root.write(".git/config", "[core]");
    root.write("app/.htpasswd", "x:y");
    root.write(".well-known/security.txt", "Contact: x");
    root.write(".well-known/.hidden", "no");
    root.write("ok.txt", "ok");
    let s = Sluice::start(&format!(
        "site * {{
            route /open/* {{ strip /open; files {r} {{ dotfiles allow }} }}
            route /list/* {{ strip /list; files {r} {{ browse on }} }}
            files {r} {{ fallback /ok.txt }}
        }}",
        r = root.0.display()
    ));
    for path in [
        "/.env",
        "/%2eenv",
        "/.git/config",
        "/x/../.git/config",
        "/app/.htpasswd",
        "/.well-known/.hidden",
    ] {
        let r = get(s.addr, path).await;
        assert_eq!(r.status, 404, "{path}");
        assert!(!r.text().contains("SECRET"), "{path}");
    }
    assert_eq!(
        get(s.addr, "/.well-known/security.txt").await.text(),
        "Contact: x"
    );
    assert_eq!(get(s.addr, "/open/.env").await.text(), "SECRET=1");
    // A listing does not tell their names either.
    let list = get(s.addr, "/list/").await.text();
    assert!(
        list.contains("ok.txt") && !list.contains(".env") && !list.contains(".git"),
        "{list}"
    );
    assert_eq!(get(s.addr, "/open/app/.htpasswd").await.text(), "x:y");
}

#[test]
fn files_options_are_checked_at_load() {
    let dir = TempDir::new();
    let root = dir.0.display().to_string();
    for (opts, want) in [
        ("fallback index.html", "a file's path under the folder"),
        ("fallback /app/", "a file's path under the folder"),
        ("fallback /a/../index.html", "not in normal form"),
        ("precompressed lz4", "`zstd`, `br` or `gzip`"),
        ("precompressed br br", "named twice"),
        ("precompressed", "precompressed CODING"),
        ("dotfiles maybe", "`allow` or `deny`"),
    ] {
        assert_check_fails(
            &dir,
            &format!("site * {{\n files {root} {{\n {opts}\n }}\n}}\n"),
            want,
        );
    }
}

/// A file larger than one `sendfile` call (1 MiB), and a range from its middle, come
/// through byte for byte over HTTP/1.1 on a plain socket (sent by the kernel) and over
/// h2c (read in pieces), and compressed (the filter reads the body).
#[tokio::test]
async fn files_come_through_whole_by_sendfile_and_by_reads() {
    let root = TempDir::new();
    let data: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    std::fs::write(root.0.join("data.bin"), &data).unwrap();
    std::fs::write(root.0.join("data.txt"), &data).unwrap();
    std::fs::write(root.0.join("empty.bin"), b"").unwrap();
    std::fs::write(root.0.join("one.bin"), b"1").unwrap();
    // `compress` is on by default: a text type is compressed when accepted.
    let s = Sluice::start(&format!("site * {{ files {} }}", root.0.display()));
    let (from, to) = (1_234_567usize, 2_765_432usize);
    let range = format!("bytes={from}-{to}");
    // HTTP/1.1: whole, a range, an empty file, a one-byte file (its head is held for
    // the file's byte: the two leave together) and whole again on the same kept
    // connection.
    let mut c = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let reqs = format!(
        "GET /data.bin HTTP/1.1\r\nHost: a\r\n\r\nGET /data.bin HTTP/1.1\r\nHost: a\r\nRange: {range}\r\n\r\nGET /empty.bin HTTP/1.1\r\nHost: a\r\n\r\nGET /one.bin HTTP/1.1\r\nHost: a\r\n\r\nGET /data.bin HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
    );
    c.write_all(reqs.as_bytes()).await.unwrap();
    let mut all = answers(&mut c).await.into_iter();
    let whole = all.next().expect("the whole file");
    let part = all.next().expect("the range");
    assert!(
        whole.status == 200 && whole.body == data,
        "h1: the file changed on the way"
    );
    assert!(
        part.status == 206 && part.body == data[from..=to],
        "h1: the range changed"
    );
    let empty = all.next().expect("the empty file");
    assert!(
        empty.status == 200 && empty.body.is_empty(),
        "h1: the empty file"
    );
    let one = all.next().expect("the one-byte file");
    assert!(
        one.status == 200 && one.body == b"1",
        "h1: the one-byte file"
    );
    let again = all.next().expect("the whole file again");
    assert!(again.body == data, "h1: the second whole file changed");
    // h2c: the same bytes, read in pieces.
    let (mut send, _conn) = h2c(s.addr).await;
    for (range, want) in [(None, &data[..]), (Some(range.as_str()), &data[from..=to])] {
        let mut req = hyper::Request::builder().uri(format!("http://a{}", "/data.bin"));
        if let Some(r) = range {
            req = req.header("range", r);
        }
        let req = req
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap();
        let resp = send.send_request(req).await.unwrap();
        use http_body_util::BodyExt;
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert!(
            body[..] == *want,
            "h2c: the file changed on the way ({range:?})"
        );
    }
    // Compression reads the body: gzip of the same bytes.
    let r = request(
        s.addr,
        "GET",
        "/data.txt",
        &[("Accept-Encoding", "gzip")],
        b"",
    )
    .await;
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    let mut unzipped = Vec::new();
    {
        use async_compression::tokio::bufread::GzipDecoder;
        let mut d = GzipDecoder::new(&r.body[..]);
        d.read_to_end(&mut unzipped).await.unwrap();
    }
    assert!(unzipped == data, "the compressed file changed on the way");
}

/// A file cut short while it is sent ends the response early and closes the
/// connection (its length was promised): the client sees the truncation, never a hang.
#[tokio::test]
async fn a_file_that_shrinks_while_sent_closes_the_connection() {
    let root = TempDir::new();
    let path = root.0.join("shrinks.bin");
    std::fs::File::create(&path)
        .unwrap()
        .set_len(256 << 20)
        .unwrap();
    let s = Sluice::start(&format!("site * {{ files {} }}", root.0.display()));
    let mut c = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    c.write_all(b"GET /shrinks.bin HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    let first = tokio::time::timeout(WAIT, c.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(first > 0);
    // The client stops reading; the file is cut to 1 MiB meanwhile.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let mut total = first as u64;
    let drained = tokio::time::timeout(WAIT, async {
        loop {
            match c.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n as u64,
            }
        }
    })
    .await;
    assert!(drained.is_ok(), "the connection must close, not hang");
    assert!(
        total < 256 << 20,
        "the response was cut short: {total} bytes"
    );
}

/// A file under the root that sluice may not read answers 403 and is logged, as nginx
/// and Caddy answer (404 would send the operator looking for a file that is there); a
/// folder's unreadable index and `fallback` too; an absent file stays 404, and so does an unreadable
/// one outside the root that a link points at. Root reads every file
/// whatever its mode, so as root the test runs sluice as `nobody` (`setpriv`).
#[tokio::test]
async fn an_unreadable_file_is_forbidden_not_missing() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let as_root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
    let setpriv = ["/usr/bin/setpriv", "/bin/setpriv"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists());
    if as_root && setpriv.is_none() {
        assert!(
            !require_interop(),
            "setpriv (util-linux) is needed to run sluice as nobody"
        );
        eprintln!("skipped: running as root without setpriv, every file is readable");
        return;
    }
    let root = TempDir::new();
    root.write("open.txt", "served");
    let secret = root.write("secret.txt", "unreadable");
    let index = root.write("locked/index.html", "unreadable index");
    let outside = TempDir::new();
    let elsewhere = outside.write("elsewhere.txt", "unreadable, outside");
    std::os::unix::fs::symlink(&elsewhere, root.0.join("link.txt")).unwrap();
    for p in [&secret, &index, &elsewhere] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o000)).unwrap();
    }
    let dir = TempDir::new();
    let conf = dir.write(
        "sluice.conf",
        &without_admin(&format!(
            "listen 127.0.0.1:0\nsite * {{ route /app/* {{ strip /app; files {r} {{ fallback /secret.txt }} }} files {r} }}",
            r = root.0.display()
        )),
    );
    let mut cmd = match setpriv.filter(|_| as_root) {
        Some(setpriv) => {
            // A copy nobody may run: the build folder may sit under a home nobody
            // can enter.
            let copy = dir.0.join("sluice");
            std::fs::copy(bin(), &copy).unwrap();
            std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
            // A child another test forked while the copy was open for writing holds it
            // until it execs: running the copy fails with ETXTBSY meanwhile.
            let runs = || {
                std::process::Command::new(&copy)
                    .arg("--version")
                    .output()
                    .is_ok_and(|o| o.status.success())
            };
            let start = std::time::Instant::now();
            while !runs() {
                assert!(start.elapsed() < WAIT, "the copy of sluice never ran");
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            let mut c = std::process::Command::new(setpriv);
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
                .arg(&copy);
            c
        }
        None => std::process::Command::new(bin()),
    };
    cmd.args(["run", "-c", conf.to_str().unwrap()]);
    // Whatever the umask: what nobody must reach, it may.
    for (p, mode) in [
        (&root.0, 0o755),
        (&root.0.join("locked"), 0o755),
        (&outside.0, 0o755),
        (&root.0.join("open.txt"), 0o644),
        (&dir.0, 0o755),
        (&conf, 0o644),
    ] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let s = Sluice::spawn_cmd(cmd, dir);
    assert_eq!(get(s.addr, "/open.txt").await.text(), "served");
    let r = get(s.addr, "/secret.txt").await;
    assert_eq!((r.status, r.text()), (403, "Forbidden\n".to_string()));
    s.wait_log("cannot open");
    assert_eq!(
        get(s.addr, "/locked/").await.status,
        403,
        "an index sluice may not read"
    );
    assert_eq!(get(s.addr, "/missing.txt").await.status, 404);
    assert_eq!(
        get(s.addr, "/app/missing").await.status,
        403,
        "a fallback sluice may not read"
    );
    assert_eq!(
        get(s.addr, "/link.txt").await.status,
        404,
        "an unreadable file outside the root tells nothing of itself"
    );
}
