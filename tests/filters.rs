//! The filter pipeline over real sockets (DESIGN.md §7, §14 "Filters"): order on the
//! request and in reverse on the response, conditions, failure modes, branches, and each
//! built-in filter; path spellings cannot slip past a filter's condition.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use common::redis::RedisServer;
use common::*;
use hyper::StatusCode;

async fn req(s: &Sluice, method: &str, path: &str, headers: &[(&str, &str)]) -> Resp {
    request(s.addr, method, path, headers, b"").await
}

#[tokio::test]
async fn filters_run_in_order_and_respond_in_reverse() {
    let b = Backend::echo_head().await;
    let s = Sluice::start(&format!(
        "site * {{
            route /open {{
                header_down X-Order first
                header_down X-Order second
                proxy {a}
            }}
            route /closed {{
                header_down X-Before yes
                deny 127.0.0.0/8
                header_down X-After yes
                proxy {a}
            }}
        }}",
        a = b.addr
    ));
    // Response phase in reverse: `second` runs first, then `first` overwrites it.
    let r = get(s.addr, "/open").await;
    assert_eq!(r.header("x-order"), Some("first"));
    // An early answer: the filters before it run their response phase, those after
    // never ran at all.
    let r = get(s.addr, "/closed").await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(r.text(), "Forbidden\n");
    assert_eq!(r.header("x-before"), Some("yes"));
    assert_eq!(r.header("x-after"), None);
    assert_eq!(b.requests.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[tokio::test]
async fn conditions_decide_on_normalised_values() {
    let b = Backend::text("ok").await;
    let s = Sluice::start(&format!(
        "site * {{
            deny 127.0.0.0/8 when path /admin/*
            deny 0.0.0.0/0 ::/0 when method DELETE
            header_down X-Api yes when header X-Api-Key *
            header_down X-Debug on when query debug 1
            header_down X-Public yes unless path /admin/*
            header_down X-Local yes when client_ip 127.0.0.0/8
            proxy {}
        }}",
        b.addr
    ));
    // Every spelling of /admin/… is the same path to the condition.
    for target in [
        "/admin/x",
        "/%61dmin/x",
        "/public/../admin/x",
        "//admin/x",
        "/./admin/x",
        "/admin",
    ] {
        let r = get(s.addr, target).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{target}");
    }
    // `%2F` is not a separator: `/admin%2Fx` is not under /admin/, and not a way in either.
    let r = get(s.addr, "/other").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("x-public"), Some("yes"));
    assert_eq!(r.header("x-local"), Some("yes"));
    assert_eq!(r.header("x-api"), None);
    assert_eq!(r.header("x-debug"), None);
    let r = req(&s, "GET", "/x?a=2&debug=1", &[("X-Api-Key", "k")]).await;
    assert_eq!(r.header("x-api"), Some("yes"));
    assert_eq!(r.header("x-debug"), Some("on"));
    // The query as the application will decode it.
    let r = get(s.addr, "/x?debu%67=%31").await;
    assert_eq!(r.header("x-debug"), Some("on"));
    assert_eq!(
        req(&s, "DELETE", "/x", &[]).await.status,
        StatusCode::FORBIDDEN
    );
}

#[tokio::test]
async fn request_id_is_made_kept_or_replaced_and_echoed() {
    let b = Backend::echo_head().await;
    let s = Sluice::start(&format!("site * {{ request_id\n proxy {} }}", b.addr));
    let r = get(s.addr, "/").await;
    let id = r
        .header("x-request-id")
        .expect("an id on the response")
        .to_string();
    assert_eq!(id.len(), 36, "{id}");
    assert_eq!(&id[14..15], "7", "a UUIDv7: {id}");
    assert!(
        r.text().contains(&format!("x-request-id: {id}")),
        "{}",
        r.text()
    );
    let other = get(s.addr, "/").await;
    assert_ne!(other.header("x-request-id"), Some(id.as_str()));
    // A valid incoming id goes through and comes back.
    let r = req(&s, "GET", "/", &[("X-Request-Id", "trace-42")]).await;
    assert_eq!(r.header("x-request-id"), Some("trace-42"));
    assert!(r.text().contains("x-request-id: trace-42"));
    // Too long, or two of them: replaced.
    let long = "x".repeat(129);
    let r = req(&s, "GET", "/", &[("X-Request-Id", &long)]).await;
    assert_eq!(r.header("x-request-id").map(str::len), Some(36));
    let r = req(
        &s,
        "GET",
        "/",
        &[("X-Request-Id", "a"), ("X-Request-Id", "b")],
    )
    .await;
    assert_eq!(r.header("x-request-id").map(str::len), Some(36));
    // On sluice's own answers too.
    let s = Sluice::start("site * { request_id\n respond 204 }");
    assert_eq!(
        req(&s, "GET", "/", &[("X-Request-Id", "mine")])
            .await
            .header("x-request-id"),
        Some("mine")
    );
}

#[tokio::test]
async fn allow_and_deny_use_the_client_after_trust() {
    let b = Backend::text("ok").await;
    let s = Sluice::start(&format!(
        "global {{ trust 127.0.0.1 }}\nsite * {{
            route /office {{ allow 10.0.0.0/8\n proxy {a} }}
            route /local {{ allow 127.0.0.0/8\n proxy {a} }}
            route /blocked {{ deny 10.9.0.0/16\n proxy {a} }}
        }}",
        a = b.addr
    ));
    assert_eq!(get(s.addr, "/office").await.status, StatusCode::FORBIDDEN);
    assert_eq!(get(s.addr, "/local").await.status, StatusCode::OK);
    // A trusted peer forwarding for an office client.
    let fwd = |ip: &'static str| [("X-Forwarded-For", ip)];
    assert_eq!(
        req(&s, "GET", "/office", &fwd("10.1.2.3")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        req(&s, "GET", "/local", &fwd("10.1.2.3")).await.status,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        req(&s, "GET", "/blocked", &fwd("192.0.2.1, 10.9.1.1"))
            .await
            .status,
        StatusCode::FORBIDDEN,
        "the nearest untrusted address decides"
    );
    assert_eq!(
        req(&s, "GET", "/blocked", &fwd("10.9.1.1, 192.0.2.1"))
            .await
            .status,
        StatusCode::OK
    );
    // A field that is not text, or an entry that is not an address, never makes the
    // client the trusted proxy itself.
    for xff in [&b"\x80, 192.0.2.1"[..], b"garbage", b"192.0.2.1:4711"] {
        let mut raw_req =
            b"GET /local HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Forwarded-For: ".to_vec();
        raw_req.extend_from_slice(xff);
        raw_req.extend_from_slice(b"\r\n\r\n");
        let out = raw(s.addr, &raw_req).await;
        let (r, _) = parse_response(&out).unwrap();
        assert_eq!(
            r.status,
            StatusCode::FORBIDDEN,
            "{}",
            String::from_utf8_lossy(xff)
        );
    }
    // Without trust, the header is ignored.
    let s = Sluice::start(&format!(
        "global {{ admin 127.0.0.1:0 }}\nsite * {{ allow 10.0.0.0/8\n proxy {} }}",
        b.addr
    ));
    assert_eq!(
        req(&s, "GET", "/", &fwd("10.1.2.3")).await.status,
        StatusCode::FORBIDDEN
    );
    let m = get(s.admin(), "/metrics").await.text();
    assert!(m.contains("sluice_access_denied_total 1"), "{m}");
}

#[tokio::test]
async fn branches_skip_forward_or_reject() {
    let b = Backend::text("ok").await;
    let s = Sluice::start(&format!(
        "site * {{
            route /hidden {{
                deny 127.0.0.0/8
                on denied reject 404
                proxy {a}
            }}
            route /skip {{
                allow 127.0.0.0/8
                on allowed skip_to tail
                header_down X-Middle ran
                header_down X-Tail ran name tail
                proxy {a}
            }}
            route /fallthrough {{
                allow 10.0.0.0/8
                on denied skip_to tail
                header_down X-Middle ran
                header_down X-Tail ran name tail
                proxy {a}
            }}
        }}",
        a = b.addr
    ));
    let r = get(s.addr, "/hidden").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.text(), "Not Found\n");
    let r = get(s.addr, "/skip").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("x-tail"), Some("ran"));
    assert_eq!(r.header("x-middle"), None, "skipped over: never ran");
    // A branch on `denied` replaces the filter's own 403.
    let r = get(s.addr, "/fallthrough").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("x-tail"), Some("ran"));
    assert_eq!(r.header("x-middle"), None);
}

#[tokio::test]
async fn rate_limit_holds_its_rate_and_says_when() {
    let b = Backend::text("ok").await;
    let s = Sluice::start(&format!(
        "site * {{
            route /ip {{ rate_limit 10/s burst 5 name per_ip\n proxy {a} }}
            route /key {{ rate_limit 1/m burst 2 key header X-Api-Key\n proxy {a} }}
        }}",
        a = b.addr
    ));
    // Over 2 s at full speed: the burst, then 10 a second (± timing at the edges).
    let start = Instant::now();
    let (mut ok, mut limited) = (0, 0);
    let mut first_429 = None;
    while start.elapsed() < Duration::from_secs(2) {
        let r = get(s.addr, "/ip").await;
        match r.status {
            200 => ok += 1,
            429 => {
                limited += 1;
                first_429.get_or_insert(r);
            }
            other => panic!("unexpected {other}"),
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let expected = 5.0 + 10.0 * elapsed;
    assert!(
        (ok as f64) <= expected + 2.0 && (ok as f64) >= expected - 4.0,
        "{ok} passed in {elapsed:.2}s, expected about {expected:.0}"
    );
    assert!(limited > 0);
    let r = first_429.unwrap();
    assert_eq!(r.text(), "Too many requests\n");
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(r.header("ratelimit-policy"), Some("\"per_ip\";q=10;w=1"));
    assert_eq!(r.header("ratelimit"), Some("\"per_ip\";r=0;t=1"));
    // Per key: each API key has its own bucket.
    for key in ["a", "b"] {
        for _ in 0..2 {
            assert_eq!(
                req(&s, "GET", "/key", &[("X-Api-Key", key)]).await.status,
                StatusCode::OK
            );
        }
        let r = req(&s, "GET", "/key", &[("X-Api-Key", key)]).await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
        let after: u64 = r.header("retry-after").unwrap().parse().unwrap();
        assert!((1..=60).contains(&after), "{after}");
    }
}

/// A password hash made by a standard tool, or `None` (skipped, unless interop is
/// required).
fn hash_with(program: &str, args: &[&str], stdin: &str) -> Option<String> {
    use std::io::Write;
    let mut child = match std::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(_) => {
            if require_interop() {
                panic!("{program} is required (SLUICE_INTEROP=require)");
            }
            eprintln!("skipped: {program} is not installed");
            return None;
        }
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{program} failed");
    Some(String::from_utf8(out.stdout).unwrap().trim().to_string())
}

#[tokio::test]
async fn basic_auth_against_htpasswd_and_argon2_hashes() {
    // `htpasswd -nbB` prints `user:hash`; `argon2 SALT -id -e` reads the password.
    let Some(line) = hash_with("htpasswd", &["-nbB", "alice", "wonder land"], "") else {
        return;
    };
    let bcrypt = line.split_once(':').unwrap().1.to_string();
    let Some(argon) = hash_with("argon2", &["saltsaltsalt", "-id", "-e"], "s3cret") else {
        return;
    };
    let b = Backend::echo_head().await;
    let s = Sluice::start(&format!(
        "site * {{
            basic_auth {{
                alice \"{bcrypt}\"
                bob \"{argon}\"
            }}
            proxy {}
        }}",
        b.addr
    ));
    let basic = |user: &str, pass: &str| {
        use base64::Engine as _;
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"))
        )
    };
    let r = get(s.addr, "/").await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        r.header("www-authenticate"),
        Some("Basic realm=\"sluice\", charset=\"UTF-8\"")
    );
    // `realm NAME` names the prompt.
    let staff = Sluice::start(&format!(
        "site * {{ basic_auth {{ realm \"Staff only\"; alice \"{bcrypt}\" }}\n proxy {} }}",
        b.addr
    ));
    let r = get(staff.addr, "/").await;
    assert_eq!(
        r.header("www-authenticate"),
        Some("Basic realm=\"Staff only\", charset=\"UTF-8\"")
    );
    for (user, pass, want) in [
        ("alice", "wonder land", StatusCode::OK),
        ("alice", "wonder land", StatusCode::OK),
        ("bob", "s3cret", StatusCode::OK),
        ("alice", "s3cret", StatusCode::UNAUTHORIZED),
        ("bob", "wonder land", StatusCode::UNAUTHORIZED),
        ("carol", "s3cret", StatusCode::UNAUTHORIZED),
    ] {
        let auth = basic(user, pass);
        let r = req(&s, "GET", "/", &[("Authorization", &auth)]).await;
        assert_eq!(r.status, want, "{user}:{pass}");
        if want == StatusCode::OK {
            // The backend still sees the credentials (they are the app's too).
            assert!(r.text().contains("authorization: Basic"));
        }
    }
    assert_eq!(
        req(&s, "GET", "/", &[("Authorization", "Bearer abc")])
            .await
            .status,
        StatusCode::UNAUTHORIZED
    );
    // Two credentials: which would the application believe? Neither gets in.
    let (good, other) = (basic("alice", "wonder land"), basic("bob", "x"));
    let r = req(
        &s,
        "GET",
        "/",
        &[("Authorization", &good), ("Authorization", &other)],
    )
    .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn cors_answers_preflights_and_marks_responses() {
    let b = Backend::text("data").await;
    let s = Sluice::start(&format!(
        "site * {{
            cors {{
                origins https://app.example.com *.partner.test
                methods GET POST PUT
                headers Content-Type X-Token
                credentials on
                max_age 10m
            }}
            proxy {}
        }}",
        b.addr
    ));
    // A preflight exactly as a browser sends it.
    let r = req(
        &s,
        "OPTIONS",
        "/api/items/7",
        &[
            ("Origin", "https://app.example.com"),
            ("Access-Control-Request-Method", "PUT"),
            ("Access-Control-Request-Headers", "content-type,x-token"),
            ("Sec-Fetch-Mode", "cors"),
            ("Referer", "https://app.example.com/"),
        ],
    )
    .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example.com")
    );
    assert_eq!(
        r.header("access-control-allow-methods"),
        Some("GET, POST, PUT")
    );
    assert_eq!(
        r.header("access-control-allow-headers"),
        Some("content-type, x-token")
    );
    assert_eq!(r.header("access-control-allow-credentials"), Some("true"));
    assert_eq!(r.header("access-control-max-age"), Some("600"));
    assert_eq!(r.header("vary"), Some("Origin"));
    assert_eq!(
        b.requests.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "answered by sluice"
    );
    // A wildcard origin, with a port.
    let r = req(
        &s,
        "OPTIONS",
        "/",
        &[
            ("Origin", "https://eu.partner.test:8443"),
            ("Access-Control-Request-Method", "POST"),
        ],
    )
    .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    // Not on the list, or a method not allowed: refused.
    for (origin, method) in [
        ("https://evil.test", "GET"),
        ("http://eu.partner.test", "GET"),
        ("null", "GET"),
        ("https://partner.test", "GET"),
        ("https://app.example.com.evil.test", "GET"),
        ("https://app.example.com", "DELETE"),
    ] {
        let r = req(
            &s,
            "OPTIONS",
            "/",
            &[
                ("Origin", origin),
                ("Access-Control-Request-Method", method),
            ],
        )
        .await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{origin} {method}");
        assert_eq!(r.header("access-control-allow-origin"), None);
    }
    // Actual requests: an allowed origin is told it may read; another is not; every
    // response varies on Origin.
    let r = req(&s, "GET", "/", &[("Origin", "https://app.example.com")]).await;
    assert_eq!(r.text(), "data");
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example.com")
    );
    assert_eq!(r.header("access-control-allow-credentials"), Some("true"));
    assert_eq!(r.header("vary"), Some("Origin"));
    let r = req(&s, "GET", "/", &[("Origin", "https://evil.test")]).await;
    assert_eq!(r.header("access-control-allow-origin"), None);
    assert_eq!(r.header("vary"), Some("Origin"));
    let r = get(s.addr, "/").await;
    assert_eq!(r.header("vary"), Some("Origin"));
}

#[test]
fn mistakes_in_filter_lines_are_load_errors() {
    let dir = TempDir::new();
    for (text, want) in [
        ("site * { deny 10.0.0.0/8 when colour red\n respond ok }", "`path`, `method`, `header`, `query`, `client_ip`, `client_cert` or `jwt.CLAIM`"),
        ("site * { deny 10.0.0.0/8 failure maybe\n respond ok }", "`open` or `closed`"),
        ("site * { allow 10.0.0.0/8\n on allowed skip_to nowhere\n respond ok }", "no filter named `nowhere`"),
        ("site * { header_down X-A 1 name a\n allow 10.0.0.0/8\n on allowed skip_to a\n respond ok }", "not after this filter"),
        ("site * { request_id\n on passed reject 403\n respond ok }", "no result to branch on"),
        ("site * { allow 10.0.0.0/8\n on maybe reject 403\n respond ok }", "`allowed` or `denied`"),
        ("site * { basic_auth alice hunter2\n respond ok }", "not a bcrypt or argon2id password hash"),
        ("site * { rate_limit 10/d\n respond ok }", "per second"),
        ("site * { rate_limit 10/s store http://x:1\n respond ok }", "redis://"),
        ("site * { cors { origins * ; credentials on }\n respond ok }", "any site act as the user"),
        ("site * { respond ok when path /x }", "goes on a filter's line"),
        ("site * { on denied reject 403\n respond ok }", "follows the filter"),
        ("site * { header_down X-A 1\n on matched reject_response 502\n respond ok }", "no result to branch on"),
        ("site * { allow 10.0.0.0/8\n on matched reject_response 502\n respond ok }", "add `when status 5xx`"),
        ("site * { header_down X-A 1 when status 5xx\n on matched skip_to handler\n respond ok }", "`reject_response`"),
        ("site * { allow 10.0.0.0/8\n on denied reject_response 502\n respond ok }", "`skip_to` or `reject`"),
        ("site * { header_down X-A 1 when status 6xx\n respond ok }", "a status code (404) or class (5xx)"),
        ("site * { header_down X-A 1 when status 5xx unless status 404\n respond ok }", "a response condition is given twice"),
        ("site * { header_down X-A 1 when response_header X-B\n respond ok }", "response_header NAME VALUE"),
        ("site * { header_down X-A 1 name handler\n respond ok }", "reserved"),
        ("site * { header_down X-A 1 when status 5xx\n on matched reject_response 100\n respond ok }", "a status code from 200 to 599"),
        ("site * { header_down X-A 1 when status 5xx\n on matched reject_response 204 \"x\"\n respond ok }", "carries no body"),
        ("site * { body_deny \"\"\n respond ok }", "needs a text"),
        ("site * { forward_auth 127.0.0.1:9/auth\n respond ok }", "an http:// or https:// URL"),
        ("site * { forward_auth http://127.0.0.1:9/auth { cache 1m }\n respond ok }", "not a forward_auth setting"),
        ("site * { forward_auth http://127.0.0.1:9/auth { timeout 0s }\n respond ok }", "timeout is zero"),
        ("site * { forward_auth http://127.0.0.1:99999/auth\n respond ok }", "port"),
        ("site * { forward_auth\n respond ok }", "forward_auth URL"),
    ] {
        // Every text has at most four lines: any line named is one of them.
        assert_check_fails(&dir, text, want);
    }
}

/// Waits (bounded) for the first 200: the store connects in the background at start.
async fn until_ok(s: &Sluice, path: &str) {
    let end = Instant::now() + Duration::from_secs(10);
    while get(s.addr, path).await.status != 200 {
        assert!(Instant::now() < end, "never answered 200: {}", s.logs());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_one_limit_through_redis() {
    // Redis as it is deployed (DESIGN §18.4): plain, with a password, and over TLS
    // with a password, verified against `redis_ca`.
    let dir = TempDir::new();
    let ca = common::pki::Ca::new();
    let leaf = ca.leaf(&["127.0.0.1"]);
    let tls = (
        dir.write("redis.pem", &leaf.cert_pem),
        dir.write("redis.key", &leaf.key_pem),
        dir.write("ca.pem", &ca.pem()),
    );
    let password = "s3cr3t-pw".to_string();
    let kinds = [
        ("plain", common::redis::Deployed::default()),
        (
            "password",
            common::redis::Deployed {
                password: Some(password.clone()),
                tls: None,
            },
        ),
        (
            "tls",
            common::redis::Deployed {
                password: Some(password.clone()),
                tls: Some(tls.clone()),
            },
        ),
    ];
    for (kind, how) in kinds {
        let Some(redis) = RedisServer::start_as(&how) else {
            return;
        };
        let url = match (&how.password, &how.tls) {
            (None, _) => format!("redis://127.0.0.1:{}", redis.port),
            (Some(p), None) => format!("redis://:{p}@127.0.0.1:{}", redis.port),
            (Some(p), Some(_)) => format!("rediss://:{p}@127.0.0.1:{}/0", redis.port),
        };
        let b = Backend::text("ok").await;
        // Room for a machine busy with other tests: the default 50 ms is for production.
        let config = format!(
            "global {{ redis_timeout 1s; redis_ca {} }}\nsite * {{ rate_limit 10/s burst 10 store {url}\n proxy {} }}",
            tls.2.display(),
            b.addr
        );
        let one = Sluice::start(&config);
        let two = Sluice::start(&config);
        until_ok(&one, "/warmup").await;
        until_ok(&two, "/warmup").await;
        // Let the bucket refill after the warm-up, then go at it from both sides for 2 s.
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let start = Instant::now();
        let mut ok = 0;
        let mut limited = 0;
        while start.elapsed() < Duration::from_secs(2) {
            for s in [&one, &two] {
                match get(s.addr, "/").await.status {
                    200 => ok += 1,
                    429 => limited += 1,
                    other => panic!("{kind}: unexpected {other}: {}", s.logs()),
                }
            }
        }
        let elapsed = start.elapsed().as_secs_f64();
        let expected = 10.0 + 10.0 * elapsed;
        assert!(
            (ok as f64) <= expected + 3.0 && (ok as f64) >= expected - 5.0,
            "{kind}: {ok} passed across two instances in {elapsed:.2}s, expected about {expected:.0} (one shared limit), {limited} limited"
        );
    }
}

/// A Redis address's password is never in a log line: the store that cannot be
/// reached is named with `***` in its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_password_is_never_logged() {
    let dead = dead_addr().await;
    let s = Sluice::start(&format!(
        "site * {{ rate_limit 10/s store redis://:hunter2@{dead} failure closed\n respond ok }}"
    ));
    assert_eq!(get(s.addr, "/").await.status, 500);
    let line = s.wait_log("rate_limit store");
    assert!(
        line.contains(&format!("redis://***@{dead}")),
        "the store is named: {line}"
    );
    assert!(!s.logs().contains("hunter2"), "{}", s.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_outage_fails_open_or_closed_and_is_logged_once() {
    let Some(mut redis) = RedisServer::start() else {
        return;
    };
    let b = Backend::text("ok").await;
    let s = Sluice::start(&format!(
        "site * {{
            route /open {{ rate_limit 1000/s store redis://127.0.0.1:{p} failure open\n proxy {a} }}
            route /closed {{ rate_limit 1000/s store redis://127.0.0.1:{p} failure closed\n proxy {a} }}
        }}",
        p = redis.port,
        a = b.addr
    ));
    until_ok(&s, "/open").await;
    until_ok(&s, "/closed").await;
    redis.kill();
    for _ in 0..10 {
        let t = Instant::now();
        assert_eq!(get(s.addr, "/open").await.status, 200);
        let r = get(s.addr, "/closed").await;
        assert_eq!(r.status, 500);
        assert_eq!(r.text(), "Internal server error\n");
        // The 50 ms budget bounds the wait; never a stall.
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    }
    s.wait_log("failing open (requests pass unlimited) until it answers");
    s.wait_log("failing closed (requests get 500) until it answers");
    let logs = s.logs();
    assert_eq!(
        logs.matches("until it answers").count(),
        2,
        "one line per filter per outage:\n{logs}"
    );
    // Back: sluice reconnects by itself, says so once, and limits again.
    redis.restart();
    until_ok(&s, "/closed").await;
    s.wait_log("answers again");
}

/// The cors filter decides who may read and with what: a backend's own CORS fields do
/// not widen it.
#[tokio::test]
async fn cors_overrides_the_backends_own_fields() {
    let b = Backend::start(|_| async {
        let mut r = hyper::Response::new(full("data"));
        let h = r.headers_mut();
        h.insert("access-control-allow-origin", "*".parse().unwrap());
        h.insert("access-control-allow-credentials", "true".parse().unwrap());
        r
    })
    .await;
    let s = Sluice::start(&format!(
        "site * {{ cors {{ origins https://app.example.com }}\n proxy {} }}",
        b.addr
    ));
    let r = req(&s, "GET", "/", &[("Origin", "https://app.example.com")]).await;
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example.com")
    );
    assert_eq!(
        r.header("access-control-allow-credentials"),
        None,
        "credentials off"
    );
    let r = req(&s, "GET", "/", &[("Origin", "https://evil.test")]).await;
    assert_eq!(r.header("access-control-allow-origin"), None);
    assert_eq!(r.header("access-control-allow-credentials"), None);
}

/// `basic_auth` verifies on one core at a time with a bounded queue: a flood of wrong
/// passwords past it is refused at once (503 with Retry-After), never a growing wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_auth_refuses_past_its_verification_queue() {
    let hash = bcrypt::hash("right", 10).unwrap();
    let s = Sluice::start(&format!(
        "site * {{\n basic_auth alice \"{hash}\"\n respond ok\n }}"
    ));
    use base64::Engine;
    let tries: Vec<_> = (0..400)
        .map(|n| {
            let creds = base64::engine::general_purpose::STANDARD.encode(format!("alice:wrong{n}"));
            let addr = s.addr;
            tokio::spawn(async move {
                request(
                    addr,
                    "GET",
                    "/",
                    &[("Authorization", &format!("Basic {creds}"))],
                    b"",
                )
                .await
            })
        })
        .collect();
    let (mut busy, mut denied) = (0, 0);
    for t in tries {
        let r = t.await.unwrap();
        match r.status {
            503 => {
                assert_eq!(r.header("retry-after"), Some("2"));
                busy += 1;
            }
            401 => denied += 1,
            other => panic!("unexpected {other}"),
        }
    }
    assert!(
        busy > 0,
        "past the queue: 503 at once ({denied} verified and refused)"
    );
    assert!(denied > 0, "the queue's own requests are verified");
}

/// A backend that answers `/…/status/NNN` with that status and `backend NNN`, and
/// sets `X-Debug: on` when the path holds `debug`.
async fn status_backend() -> Backend {
    Backend::start(|req: hyper::Request<hyper::body::Incoming>| async move {
        let path = req.uri().path().to_string();
        let code: u16 = path
            .rsplit('/')
            .next()
            .and_then(|c| c.parse().ok())
            .unwrap_or(200);
        let mut r = hyper::Response::new(full(format!("backend {code}")));
        *r.status_mut() = StatusCode::from_u16(code).unwrap();
        if path.contains("debug") {
            r.headers_mut().insert("x-debug", "on".parse().unwrap());
        }
        r
    })
    .await
}

#[tokio::test]
async fn response_conditions_gate_the_response_phase_and_replace_answers() {
    let b = status_backend().await;
    let dir = TempDir::new();
    dir.write("www/index.html", "home");
    let s = Sluice::start(&format!(
        "site * {{
            route /mapped/* {{
                request_id
                header_down X-Errors mapped when status 5xx
                on matched reject_response 502 \"upstream trouble\\n\"
                proxy {a}
            }}
            route /tag/* {{
                header_down X-Class picked when status 4xx 500
                header_down X-Seen debug when response_header X-Debug on
                header_down X-Quiet yes unless status 2xx
                header_down X-Get yes when method GET unless status 404
                proxy {a}
            }}
            route /fixed {{
                header_down X-Never yes when status 2xx
                on matched reject_response 500
                respond 503 \"down for a while\"
            }}
            route /www/* {{
                strip /www
                header_down X-Missing yes when status 404
                on matched reject_response 410 \"gone\\n\"
                files {www}
            }}
        }}",
        a = b.addr,
        www = dir.0.join("www").display()
    ));
    // A backend's 5xx is replaced (body and all); the filter before still marks it.
    let r = get(s.addr, "/mapped/status/503").await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    assert_eq!(r.text(), "upstream trouble\n");
    assert_eq!(r.header("server"), Some("sluice"));
    assert!(
        r.header("x-request-id").is_some(),
        "request_id ran on the replacement"
    );
    for (path, status, body) in [
        ("/mapped/status/200", 200, "backend 200"),
        ("/mapped/status/404", 404, "backend 404"),
    ] {
        let r = get(s.addr, path).await;
        assert_eq!(r.status, status, "{path}");
        assert_eq!(r.text(), body, "{path}");
        assert_eq!(r.header("x-errors"), None, "{path}");
    }
    // Codes, classes, response fields, `unless`, and a request condition beside a
    // response one.
    for (path, class, quiet, get_) in [
        ("/tag/status/200", None, None, Some("yes")),
        ("/tag/status/404", Some("picked"), Some("yes"), None),
        ("/tag/status/418", Some("picked"), Some("yes"), Some("yes")),
        ("/tag/status/500", Some("picked"), Some("yes"), Some("yes")),
        ("/tag/status/502", None, Some("yes"), Some("yes")),
    ] {
        let r = get(s.addr, path).await;
        assert_eq!(r.header("x-class"), class, "{path}");
        assert_eq!(r.header("x-quiet"), quiet, "{path}");
        assert_eq!(r.header("x-get"), get_, "{path}");
        assert_eq!(r.header("x-seen"), None, "{path}");
    }
    let r = get(s.addr, "/tag/debug/status/200").await;
    assert_eq!(r.header("x-seen"), Some("debug"));
    let r = request(s.addr, "POST", "/tag/status/200", &[], b"").await;
    assert_eq!(
        r.header("x-get"),
        None,
        "the request condition holds the filter back"
    );
    // sluice's own answers go through the response phase too: a fixed response and
    // the file handler's 404.
    let r = get(s.addr, "/fixed").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.text(), "down for a while");
    let r = get(s.addr, "/www/nothing-here").await;
    assert_eq!(r.status, StatusCode::GONE);
    assert_eq!(r.text(), "gone\n");
    assert_eq!(get(s.addr, "/www/index.html").await.text(), "home");
}

#[tokio::test]
async fn skip_to_handler_ends_the_filters_but_not_the_proxys_own_limit() {
    let b = Backend::text("ok").await;
    let s = Sluice::start(&format!(
        "site * {{
            route /skip {{
                allow 127.0.0.0/8
                on allowed skip_to handler
                deny 127.0.0.0/8
                header_down X-After ran
                proxy {a} {{ max_body 10 }}
            }}
        }}",
        a = b.addr
    ));
    let r = get(s.addr, "/skip").await;
    assert_eq!(
        r.status,
        StatusCode::OK,
        "the deny after the skip never ran"
    );
    assert_eq!(r.text(), "ok");
    assert_eq!(r.header("x-after"), None);
    let r = request(s.addr, "POST", "/skip", &[], &[b'a'; 20]).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
}

/// A backend that answers with the length of the body it read whole, and counts the
/// bodies it began to read.
async fn length_backend() -> (Backend, Arc<std::sync::atomic::AtomicUsize>) {
    let began = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = began.clone();
    let b = Backend::start(move |req: hyper::Request<hyper::body::Incoming>| {
        let seen = seen.clone();
        async move {
            use http_body_util::BodyExt as _;
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            match req.into_body().collect().await {
                Ok(all) => hyper::Response::new(full(format!("{}", all.to_bytes().len()))),
                Err(_) => hyper::Response::new(full("broken")),
            }
        }
    })
    .await;
    (b, began)
}

#[tokio::test]
async fn body_deny_holds_the_body_until_it_has_looked() {
    let (b, began) = length_backend().await;
    let s = Sluice::start(&format!(
        "global {{ admin 127.0.0.1:0 }}
        site * {{
            route /up {{
                body_deny \"DROP TABLE\"
                proxy {a}
            }}
            route /branch {{
                body_deny \"DROP TABLE\"
                on denied reject 422
                proxy {a}
            }}
            route /flag {{
                body_deny \"DROP TABLE\"
                on denied skip_to flag
                header_down X-Checked yes
                header_down X-Seen yes name flag
                proxy {a}
            }}
        }}",
        a = b.addr
    ));
    let r = request(s.addr, "POST", "/up", &[], b"name=x; DROP TABLE users").await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let r = request(s.addr, "POST", "/branch", &[], b"DROP TABLE").await;
    assert_eq!(r.status, 422);
    // A branch that goes on sends the whole body, as declared (never a shortened one
    // under the client's Content-Length), and the backend connection stays in step.
    let r = request(s.addr, "POST", "/flag", &[], b"1234 DROP TABLE 56").await;
    assert_eq!((r.status, r.text().as_str()), (200, "18"));
    assert_eq!(r.header("x-checked"), None, "skipped");
    assert_eq!(r.header("x-seen"), Some("yes"));
    assert_eq!(get(s.addr, "/flag").await.text(), "0");
    let began_before = began.load(std::sync::atomic::Ordering::SeqCst);
    // Split across chunks, sent apart: still found, and nothing went on.
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    c.write_all(
        b"POST /up HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nxxDROP\r\n",
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    c.write_all(b"7\r\n TABLEx\r\n0\r\n\r\n").await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut out)).await;
    let out = String::from_utf8_lossy(&out);
    assert!(out.starts_with("HTTP/1.1 403"), "{out}");
    assert_eq!(
        began.load(std::sync::atomic::Ordering::SeqCst),
        began_before,
        "nothing reached the backend"
    );
    // A clean body goes on whole, chunked or not; no body at all passes at once.
    let r = request(s.addr, "POST", "/up", &[], b"DROP  TABLE, drop table").await;
    assert_eq!(r.text(), "23");
    assert_eq!(get(s.addr, "/up").await.text(), "0");
    // Past the 1 MiB hold the rest streams and is still checked: a late match cuts it
    // off and the client gets 403; a clean 3 MiB body arrives whole.
    let mut big = vec![b'a'; 3 << 20];
    assert_eq!(
        request(s.addr, "POST", "/up", &[], &big).await.text(),
        (3 << 20).to_string()
    );
    let at = (2 << 20) + 17;
    big[at..at + 10].copy_from_slice(b"DROP TABLE");
    let r = request(s.addr, "POST", "/up", &[], &big).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let m = get(s.admin(), "/metrics").await.text();
    assert!(m.contains("sluice_body_denied_total 5"), "{m}");
}

#[tokio::test]
async fn body_deny_over_an_h2_front() {
    use http_body_util::{BodyExt as _, Full};
    let (b, began) = length_backend().await;
    let s = Sluice::start(&format!(
        "site * {{ body_deny \"<script\"\n proxy {a} }}",
        a = b.addr
    ));
    let tcp = TcpStream::connect(s.addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    for (body, status, text) in [
        (
            &b"hello <script>alert(1)"[..],
            403,
            "Forbidden: the request body is not allowed\n",
        ),
        (&b"hello <scrip t>"[..], 200, "15"),
    ] {
        let req = hyper::Request::post("http://localhost/")
            .body(Full::new(Bytes::from_static(body)))
            .unwrap();
        let r = send.send_request(req).await.unwrap();
        assert_eq!(r.status().as_u16(), status);
        let got = r.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(got, text);
    }
    assert_eq!(began.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// Held bodies share one process-wide budget (64 MiB): a request that would hold more
/// gets 503 with Retry-After, counted; the budget comes back when held bodies end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_bodies_share_one_budget() {
    let (b, _began) = length_backend().await;
    let s = Sluice::start(&format!(
        "global {{ admin 127.0.0.1:0 }}\nsite * {{ body_deny \"NEEDLE\"\n proxy {a} }}",
        a = b.addr
    ));
    // 70 clients each send 1,000,000 bytes of a 2,000,000-byte body and wait: each is
    // held (under the 1 MiB cap), 70 MB in all, past the 64 MiB budget.
    let chunk = vec![b'a'; 1_000_000];
    let mut conns = Vec::new();
    for _ in 0..70 {
        let mut c = TcpStream::connect(s.addr).await.unwrap();
        c.write_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\n\r\n")
            .await
            .unwrap();
        let _ = c.write_all(&chunk).await;
        conns.push(c);
    }
    let admin = s.admin();
    let counted = |m: &str| -> u64 {
        m.lines()
            .find_map(|l| l.strip_prefix("sluice_body_hold_refusals_total "))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let end = Instant::now() + Duration::from_secs(10);
    while counted(&get(admin, "/metrics").await.text()) < 1 {
        assert!(Instant::now() < end, "no request was refused");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut refused = 0;
    for c in &mut conns {
        let mut buf = [0u8; 256];
        if let Ok(Ok(n)) = tokio::time::timeout(Duration::from_millis(20), c.read(&mut buf)).await {
            let head = String::from_utf8_lossy(&buf[..n]);
            if head.starts_with("HTTP/1.1 503") {
                assert!(
                    head.to_ascii_lowercase().contains("retry-after: 1"),
                    "{head}"
                );
                refused += 1;
            }
        }
    }
    let total = counted(&get(admin, "/metrics").await.text());
    assert!((1..=10).contains(&total), "{total} of 70 refused");
    assert!(
        refused >= 1 && refused <= total,
        "{refused} answers seen, {total} counted"
    );
    // The clients go away: their held bytes come back.
    drop(conns);
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let r = request(s.addr, "POST", "/", &[], &vec![b'b'; 500_000]).await;
        if r.status == 200 {
            assert_eq!(r.text(), "500000");
            break;
        }
        assert!(
            Instant::now() < end,
            "the budget never came back: {}",
            r.status
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Filters written in the site block guard every route (DESIGN §16): a site's
/// `basic_auth` and `deny` reach `route /admin/*`, they run before the route's own
/// filters (their response phase after), a site `rate_limit` is one bucket for all the
/// routes, and a site filter's `skip_to handler` passes the route's filters too.
#[tokio::test]
async fn site_filters_guard_every_route() {
    let hash = bcrypt::hash("pw", 4).unwrap();
    let b = Backend::echo_head().await;
    let s = Sluice::start(&format!(
        "site * {{
            allow 127.0.0.0/8 when header X-Skip yes
            on allowed skip_to handler
            deny 127.0.0.0/8 when path /private/*
            basic_auth alice \"{hash}\"
            header_down X-Order site
            rate_limit 5/s burst 5 key header X-Rl when header X-Rl *
            route /admin/* {{
                header_down X-Order route
                header_down X-Route admin
                proxy {a}
            }}
            route /exact {{
                respond 200 \"exact\"
            }}
            route /private/* {{
                respond 200 \"private\"
            }}
            respond 200 \"own\"
        }}",
        a = b.addr
    ));
    use base64::Engine as _;
    let auth = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode("alice:pw")
    );
    for path in ["/admin/panel", "/admin", "/exact", "/", "/other"] {
        let r = get(s.addr, path).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{path}");
        let r = req(&s, "GET", path, &[("Authorization", &auth)]).await;
        assert_eq!(r.status, StatusCode::OK, "{path}");
        // The site's response phase runs after the route's: its value is the last.
        assert_eq!(r.header("x-order"), Some("site"), "{path}");
    }
    let r = req(&s, "GET", "/admin/panel", &[("Authorization", &auth)]).await;
    assert_eq!(r.header("x-route"), Some("admin"));
    // A spelling trick does not pass the site's `deny`.
    for path in ["/private/x", "/%70rivate/x", "/public/../private/x"] {
        let r = req(&s, "GET", path, &[("Authorization", &auth)]).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{path}");
    }
    // `skip_to handler` from the site passes the site's and the route's later filters.
    let r = req(&s, "GET", "/admin/x", &[("X-Skip", "yes")]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("x-order"), None);
    assert_eq!(r.header("x-route"), None);
    // One bucket for the site: 5 requests spread over two routes use it up.
    let mut codes = Vec::new();
    for path in ["/admin/a", "/exact", "/admin/b", "/", "/exact", "/admin/c"] {
        let r = req(&s, "GET", path, &[("Authorization", &auth), ("X-Rl", "k")]).await;
        codes.push(r.status);
    }
    assert_eq!(codes, [200, 200, 200, 200, 200, 429]);
}

/// `forward_auth` (DESIGN §16): every request is asked of the auth service (a `GET`
/// with the client's fields and the forwarding ones, no body) over kept-alive
/// connections; a 2xx lets it on with `copy_headers` replaced, any other answer goes
/// back as the service sent it, and no answer is `503` (or a pass with `failure open`).
#[tokio::test]
async fn forward_auth_asks_a_service_for_every_request() {
    let seen = Arc::new(std::sync::Mutex::new(String::new()));
    let log = seen.clone();
    let auth = Backend::start(move |req: hyper::Request<hyper::body::Incoming>| {
        let log = log.clone();
        async move {
            let mut head = format!("{} {}\n", req.method(), req.uri());
            for (k, v) in req.headers() {
                head.push_str(&format!("{}: {}\n", k, v.to_str().unwrap_or("?")));
            }
            *log.lock().unwrap() = head;
            let token = req
                .headers()
                .get("authorization")
                .map(|v| v.to_str().unwrap().to_string());
            match token.as_deref() {
                Some("Bearer good") => hyper::Response::builder()
                    .header("X-User", "alice")
                    .header("X-Groups", "a")
                    .header("X-Groups", "b")
                    .body(full("ok"))
                    .unwrap(),
                Some("Bearer slow") => {
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    hyper::Response::new(full("late"))
                }
                _ => hyper::Response::builder()
                    .status(401)
                    .header("WWW-Authenticate", "Bearer realm=\"app\"")
                    .body(full("login first\n"))
                    .unwrap(),
            }
        }
    })
    .await;
    let b = Backend::echo_head().await;
    let dead = dead_addr().await;
    let s = Sluice::start(&format!(
        "site * {{
            route /app/* {{
                forward_auth http://{auth}/check?app=1 {{
                    copy_headers X-User X-Groups X-Missing
                    timeout 500ms
                }}
                proxy {b}
            }}
            route /closed/* {{
                forward_auth http://{dead}/check
                proxy {b}
            }}
            route /open/* {{
                forward_auth http://{dead}/check failure open {{ copy_headers X-User }}
                proxy {b}
            }}
        }}",
        auth = auth.addr,
        b = b.addr
    ));
    let good = [
        ("Authorization", "Bearer good"),
        ("Cookie", "c=1"),
        ("X-User", "forged"),
        ("X_User", "forged"),
        ("x_uSER", "forged"),
        ("X-Missing", "forged"),
        ("X_Missing", "forged"),
        ("X-Forwarded-Uri", "/forged"),
        ("X_Forwarded_Uri", "/forged"),
        ("X_Forwarded_Method", "forged"),
    ];
    let r = req(&s, "GET", "/app/x?y=1", &good).await;
    assert_eq!(r.status, StatusCode::OK);
    let at_backend = r.text();
    assert!(at_backend.contains("x-user: alice\n"), "{at_backend}");
    assert!(
        at_backend.contains("x-groups: a\nx-groups: b\n"),
        "{at_backend}"
    );
    assert!(!at_backend.contains("x-missing"), "{at_backend}");
    for spelling in ["x_user:", "x-user: forged", "x_missing:"] {
        assert!(
            !at_backend.contains(spelling),
            "no spelling of a copied field passes beside it: {at_backend}"
        );
    }
    let asked = seen.lock().unwrap().clone();
    assert!(
        !asked.contains("forged"),
        "the service never sees a spelling of the fields sluice sets: {asked}"
    );
    assert!(asked.starts_with("GET /check?app=1\n"), "{asked}");
    for line in [
        "x-forwarded-method: GET\n",
        "x-forwarded-uri: /app/x?y=1\n",
        "x-forwarded-host: localhost\n",
        "x-forwarded-proto: http\n",
        "x-forwarded-for: 127.0.0.1\n",
        "cookie: c=1\n",
        &format!("host: {}\n", auth.addr),
    ] {
        assert!(asked.contains(line), "{line} in:\n{asked}");
    }
    // A body stays with the request; the service is asked without it.
    let r = request(s.addr, "POST", "/app/form", &good, b"name=x").await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.text().starts_with("POST /app/form\n"));
    let asked = seen.lock().unwrap().clone();
    assert!(asked.starts_with("GET /check?app=1\n"), "{asked}");
    assert!(asked.contains("x-forwarded-method: POST\n"), "{asked}");
    assert!(!asked.contains("content-length"), "{asked}");
    // Every request asks, over one kept-alive connection.
    assert_eq!(auth.requests.load(std::sync::atomic::Ordering::SeqCst), 2);
    assert_eq!(
        auth.connections.load(std::sync::atomic::Ordering::SeqCst),
        1
    );
    // Refused: the service's answer, as it sent it; the backend is never asked.
    let before = b.requests.load(std::sync::atomic::Ordering::SeqCst);
    let r = get(s.addr, "/app/x").await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(r.header("www-authenticate"), Some("Bearer realm=\"app\""));
    assert_eq!(r.text(), "login first\n");
    assert_eq!(b.requests.load(std::sync::atomic::Ordering::SeqCst), before);
    // No answer in time, or no service at all: closed is 503, open lets it through.
    let t = Instant::now();
    let r = req(&s, "GET", "/app/x", &[("Authorization", "Bearer slow")]).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert_eq!(
        get(s.addr, "/closed/x").await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    // Failing open lets the request through, but never with a client's own copy of
    // a field only the auth service may set.
    let r = req(&s, "GET", "/open/x", &[("X-User", "admin")]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(!r.text().contains("x-user"), "{}", r.text());
    assert_eq!(
        b.requests.load(std::sync::atomic::Ordering::SeqCst),
        before + 1
    );
}
