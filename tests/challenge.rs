//! `challenge` over real sockets: the wall, a solver written here from DESIGN §18.12
//! (not sluice's page), forged and replayed nonces and passes, the switch driven by
//! requests held against a pool's `limit`, and a real headless Chromium that runs the
//! page's script and lands on the backend's page.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use http::{Request, Response};
use hyper::body::Incoming;

const HTML: (&str, &str) = ("Accept", "text/html,application/xhtml+xml,*/*;q=0.8");

fn start(config: &str) -> Sluice {
    Sluice::start(config)
}

/// The page's nonce and difficulty.
fn nonce_of(page: &str) -> (String, u32) {
    let field = |name: &str| {
        let at = page.find(&format!("name=\"{name}\" value=\"")).unwrap() + name.len() + 15;
        page[at..at + page[at..].find('"').unwrap()].to_string()
    };
    let at = page.find("id=\"d\" value=\"").unwrap() + 14;
    let bits = page[at..at + page[at..].find('"').unwrap()]
        .parse()
        .unwrap();
    (field("nonce"), bits)
}

/// §18.12: the smallest n whose SHA-256(nonce ‖ n in decimal) starts with `bits` zero
/// bits.
fn solve(nonce: &str, bits: u32) -> u64 {
    (0u64..)
        .find(|n| {
            let d = ring::digest::digest(&ring::digest::SHA256, format!("{nonce}{n}").as_bytes());
            let mut zeros = 0;
            for &b in d.as_ref() {
                zeros += b.leading_zeros();
                if b != 0 {
                    break;
                }
            }
            zeros >= bits
        })
        .unwrap()
}

async fn post_solution(addr: std::net::SocketAddr, form: &str, xff: &str) -> Resp {
    request(
        addr,
        "POST",
        "/.sluice/challenge",
        &[
            ("Content-Type", "application/x-www-form-urlencoded"),
            ("X-Forwarded-For", xff),
            HTML,
        ],
        form.as_bytes(),
    )
    .await
}

async fn page(addr: std::net::SocketAddr, xff: &str) -> Resp {
    request(
        addr,
        "GET",
        "/x?y=1",
        &[HTML, ("X-Forwarded-For", xff)],
        b"",
    )
    .await
}

fn pass_of(r: &Resp) -> String {
    let c = r.header("set-cookie").expect("a pass");
    c.split(';').next().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wall_takes_a_solution_once_and_refuses_forgeries() {
    let b = Backend::echo_head().await;
    let s = start(&format!(
        "global {{ admin 127.0.0.1:0; trust 127.0.0.1 }}
listen 127.0.0.1:0
site * {{
    challenge always {{ difficulty 12; pass 1h; allow 192.0.2.0/24; except /health }}
    error_page 403 \"forbidden, says the site\" backend
    route /health {{ respond \"healthy\" }}
    proxy {}
}}
",
        b.addr
    ));
    let admin = s.admin();
    let (me, neighbour, stranger) = ("203.0.113.5", "203.0.113.99", "198.51.100.7");
    // A browser gets the page; a script or an API client gets 429.
    let r = page(s.addr, me).await;
    assert_eq!(r.status, 403);
    assert_eq!(r.header("cache-control"), Some("no-store"));
    assert!(r.header("content-type").unwrap().starts_with("text/html"));
    let text = r.text();
    assert!(
        text.contains("<noscript>") && !text.contains("src=\"http"),
        "no external resources"
    );
    for accept in [None, Some("*/*"), Some("application/json")] {
        let mut h = vec![("X-Forwarded-For", me)];
        if let Some(a) = accept {
            h.push(("Accept", a));
        }
        let r = request(s.addr, "GET", "/", &h, b"").await;
        assert_eq!(
            (r.status, r.header("retry-after")),
            (429, Some("5")),
            "{accept:?}"
        );
    }
    let r = request(
        s.addr,
        "POST",
        "/",
        &[HTML, ("X-Forwarded-For", me)],
        b"a=1",
    )
    .await;
    assert_eq!(r.status, 429, "not a GET");
    // `allow` and `except` pass untouched.
    assert_eq!(page(s.addr, "192.0.2.7").await.status, 200);
    assert_eq!(
        request(s.addr, "GET", "/health", &[("X-Forwarded-For", me)], b"")
            .await
            .text(),
        "healthy"
    );

    // Solved: 303 to where the client was going, with a pass.
    let (nonce, bits) = nonce_of(&text);
    assert_eq!(bits, 12);
    let n = solve(&nonce, bits);
    let form = format!("nonce={nonce}&solution={n}&to=%2Fx%3Fy%3D1");
    let r = post_solution(s.addr, &form, me).await;
    assert_eq!((r.status, r.header("location")), (303, Some("/x?y=1")));
    let cookie = r.header("set-cookie").unwrap();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Lax") && cookie.contains("Path=/"),
        "{cookie}"
    );
    assert!(!cookie.contains("Secure"), "plain HTTP: {cookie}");
    let pass = pass_of(&r);
    // Once only.
    let again = post_solution(s.addr, &form, me).await;
    assert_eq!(again.status, 403, "a nonce is good once");
    assert!(again.text().contains("name=\"nonce\""), "a new challenge");

    // The pass lets the client (and its /24) through; the backend never sees it.
    let cookies = format!("a=1; {pass}; b=2");
    for who in [me, neighbour] {
        let r = request(
            s.addr,
            "GET",
            "/x",
            &[HTML, ("Cookie", &cookies), ("X-Forwarded-For", who)],
            b"",
        )
        .await;
        assert_eq!(r.status, 200, "{who}");
        let seen = r.text();
        assert!(
            seen.contains("cookie: a=1; b=2\n") && !seen.contains("sluice_pass"),
            "{seen}"
        );
    }
    // However its name is spaced, the pass cookie never reaches the backend.
    let spaced = "a=1; sluice_pass =x; b=2";
    let r = request(
        s.addr,
        "GET",
        "/x",
        &[("Cookie", spaced), ("X-Forwarded-For", "192.0.2.7")],
        b"",
    )
    .await;
    assert!(r.text().contains("cookie: a=1; b=2\n"), "{}", r.text());
    let alone = request(
        s.addr,
        "GET",
        "/x",
        &[HTML, ("Cookie", &pass), ("X-Forwarded-For", me)],
        b"",
    )
    .await;
    assert!(!alone.text().contains("cookie:"), "{}", alone.text());
    let r = request(
        s.addr,
        "GET",
        "/x",
        &[HTML, ("Cookie", &pass), ("X-Forwarded-For", stranger)],
        b"",
    )
    .await;
    assert_eq!(r.status, 403, "a pass is bound to its network");

    // Forgeries and junk: a new challenge, never a 500.
    let (fresh, _) = nonce_of(&page(s.addr, me).await.text());
    let n = solve(&fresh, 12);
    let tampered = {
        let mut parts: Vec<String> = fresh.split('.').map(str::to_string).collect();
        parts[1] = "1".into(); // an easier difficulty, under the same signature
        parts.join(".")
    };
    let forged_pass = format!("{}x", &pass[..pass.len() - 1]);
    let future_pass = "sluice_pass=99999999999.AAAAAAAAAAAAAAAAAAAAAA";
    for (form, who) in [
        (format!("nonce={fresh}&solution={}&to=/", n + 1), me),
        (format!("nonce={tampered}&solution=0&to=/"), me),
        (format!("nonce={fresh}&solution={n}&to=/"), stranger),
        ("nonce=a.b.c.d&solution=1".to_string(), me),
        (
            format!(
                "nonce={}1.16.AAAAAAAAAAAAAAAA.AAAAAAAAAAAAAAAAAAAAAA&solution=1",
                "0".repeat(200)
            ),
            me,
        ),
        ("%%%".to_string(), me),
        (String::new(), me),
    ] {
        let r = post_solution(s.addr, &form, who).await;
        assert_eq!(r.status, 403, "{form} from {who}");
        assert!(r.header("set-cookie").is_none());
    }
    for bad in [
        forged_pass.as_str(),
        future_pass,
        "sluice_pass=",
        "sluice_pass=1.2.3",
    ] {
        let r = request(
            s.addr,
            "GET",
            "/x",
            &[HTML, ("Cookie", bad), ("X-Forwarded-For", me)],
            b"",
        )
        .await;
        assert_eq!(r.status, 403, "{bad}");
    }
    // `to` never leaves the site.
    for to in [
        "%2F%2Fevil.example%2F",
        "https%3A%2F%2Fevil.example",
        "%2F%5Cevil",
        "evil",
    ] {
        let (nonce, _) = nonce_of(&page(s.addr, me).await.text());
        let n = solve(&nonce, 12);
        let form = format!("nonce={nonce}&solution={n}&to={to}");
        let r = post_solution(s.addr, &form, me).await;
        assert_eq!((r.status, r.header("location")), (303, Some("/")), "{to}");
    }
    let m = get(admin, "/metrics").await.text();
    // Summed over the routes (the health route counts its own bypasses).
    let count = |result: &str| {
        m.lines()
            .filter(|l| {
                l.starts_with("sluice_challenge_total")
                    && l.contains(&format!("result=\"{result}\""))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum::<u64>()
    };
    assert_eq!(count("passed"), 5, "{m}");
    assert!(count("failed") >= 7, "{m}");
    assert!(count("issued") >= 10, "{m}");
    assert_eq!(count("bypassed"), 3, "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_load_it_switches_on_with_the_pools_in_flight_count() {
    // A backend that holds /hold until released.
    let release = Arc::new(tokio::sync::Notify::new());
    let held = Arc::new(AtomicUsize::new(0));
    let (r2, h2) = (release.clone(), held.clone());
    let b = Backend::start(move |req: Request<Incoming>| {
        let (release, held) = (r2.clone(), h2.clone());
        async move {
            if req.uri().path() == "/hold" {
                held.fetch_add(1, Ordering::SeqCst);
                release.notified().await;
            }
            Response::new(full("backend page"))
        }
    })
    .await;
    let s = start(&format!(
        "global {{ admin 127.0.0.1:0 }}
listen 127.0.0.1:0
site * {{
    challenge under_load 50
    proxy {} {{ limit 4 }}
}}
",
        b.addr
    ));
    let admin = s.admin();
    let browse = || async { request(s.addr, "GET", "/", &[HTML], b"").await.status };
    assert_eq!(browse().await, 200, "idle: off");
    let on = || async {
        let st: serde_json::Value =
            serde_json::from_str(&get(admin, "/status").await.text()).unwrap();
        st.to_string().contains("\"challenge\":\"on\"")
    };
    assert!(!on().await);
    // One request held: 1 of 4 (25 %), still off; two: 50 %, on.
    let addr = s.addr;
    let mut holders = Vec::new();
    for k in 1..=2 {
        holders.push(tokio::spawn(held_get(addr)));
        let end = Instant::now() + Duration::from_secs(10);
        while held.load(Ordering::SeqCst) < k {
            assert!(Instant::now() < end);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if k == 1 {
            assert_eq!(browse().await, 200, "25 %: off");
        }
    }
    assert_eq!(browse().await, 403, "50 %: on");
    assert!(on().await);
    // The dashboard says so (headless Chromium, when there is one).
    if let Some(chromium) = program("chromium") {
        let dom = dump_dom(chromium, format!("http://{admin}/"), 2_000).await;
        assert!(dom.contains("challenge on"), "{dom}");
    }
    release.notify_waiters();
    for h in holders {
        assert_eq!(h.await.unwrap(), 200, "held requests were never challenged");
    }
    let end = Instant::now() + Duration::from_secs(10);
    while browse().await != 200 {
        assert!(Instant::now() < end, "off again once the load is gone");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_solves_the_page_and_lands_on_the_backend() {
    let Some(chromium) = program("chromium") else {
        return;
    };
    let b = Backend::text("<html><body><h1>the backend's page</h1></body></html>").await;
    // On a route only: the page's post reaches the route sluice adds for it.
    let s = start(&format!(
        "site * {{\n route /shop/* {{ challenge always {{ difficulty 14 }}\n proxy {b} }}\n respond \"elsewhere\"\n}}\n",
        b = b.addr
    ));
    let url = format!("http://127.0.0.1:{}/shop/item?id=1", s.addr.port());
    let dom = dump_dom(chromium, url, 20_000).await;
    assert!(dom.contains("the backend's page"), "{dom}");
}

/// A request the backend holds until released: its answer may take as long as
/// Chromium's look at the dashboard, so it waits longer than [`WAIT`].
async fn held_get(addr: std::net::SocketAddr) -> u16 {
    let req = b"GET /hold HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    let out = raw_within(addr, req, Duration::from_secs(120)).await;
    let (r, _) = parse_response(&out)
        .unwrap_or_else(|| panic!("no response in {:?}", String::from_utf8_lossy(&out)));
    r.status
}

/// The DOM headless Chromium ends with at `url` (its scripts run, its forms followed),
/// letting the page's timers run `budget_ms` of virtual time; Chromium is killed after
/// 90 s of real time.
async fn dump_dom(chromium: std::path::PathBuf, url: String, budget_ms: u32) -> String {
    let dir = TempDir::new();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("timeout")
            .arg("90")
            .arg(chromium)
            .args(["--headless", "--no-sandbox", "--disable-gpu"])
            .arg(format!("--virtual-time-budget={budget_ms}"))
            .arg(format!(
                "--user-data-dir={}",
                dir.0.join("profile").display()
            ))
            .args(["--dump-dom", &url])
            .output()
            .expect("chromium runs")
    })
    .await
    .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_bad_challenge_fails_the_check_with_where_and_why() {
    let dir = TempDir::new();
    dir.write("short", "x\n");
    let cases = [
        (
            "challenge under_load\n proxy 127.0.0.1:9 { limit off }",
            "`limit`",
        ),
        (
            "challenge under_load 0 { }\n proxy 127.0.0.1:9 { limit 4 }",
            "1..100",
        ),
        ("challenge always { difficulty 30 }\n respond ok", "8..24"),
        ("challenge always { difficulty 4 }\n respond ok", "8..24"),
        ("challenge always { pass 0s }\n respond ok", "pass"),
        (
            "challenge always { secret_file short }\n respond ok",
            "too short",
        ),
        (
            "challenge always { secret_file nothere }\n respond ok",
            "nothere",
        ),
        (
            "challenge always { allow 10.0.0.0/33 }\n respond ok",
            "CIDR",
        ),
        (
            "challenge always { colour red }\n respond ok",
            "not a challenge setting",
        ),
        (
            "challenge sometimes\n respond ok",
            "`under_load [PERCENT]` or `always`",
        ),
    ];
    for (lines, want) in cases {
        assert_check_fails(
            &dir,
            &format!("listen :80\nsite * {{\n {lines}\n}}\n"),
            want,
        );
    }
}
