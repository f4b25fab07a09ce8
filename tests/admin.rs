//! The admin API over real sockets: `/status` in the shape DESIGN.md §14 fixes,
//! `/metrics` present and moving, `POST /reload` and `sluice reload`, revisions and
//! rollback, the dashboard page; never on a site listener, never showing a secret.

mod common;

use std::net::SocketAddr;
use std::process::Command;

use common::*;
use serde_json::Value;

async fn admin_get(admin: SocketAddr, path: &str) -> Resp {
    request(admin, "GET", path, &[], b"").await
}

async fn admin_post(admin: SocketAddr, path: &str) -> Resp {
    request(
        admin,
        "POST",
        path,
        &[
            ("Content-Length", "0"),
            ("Content-Type", "application/json"),
        ],
        b"",
    )
    .await
}

fn json(r: &Resp) -> Value {
    serde_json::from_slice(&r.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", r.text()))
}

fn config(live: SocketAddr, dead: SocketAddr, body: &str) -> String {
    format!(
        "global {{ admin 127.0.0.1:0 }}
listen 127.0.0.1:0
site app.test {{
    route /x/* {{
        proxy {live} {{ header_up Authorization \"Bearer s3cr3t\" }}
    }}
    proxy {dead} {live} {{ lb first }}
}}
site * {{ respond \"{body}\" }}
"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_metrics_and_the_dashboard() {
    let live = Backend::text("live").await;
    let dead = dead_addr().await;
    let dir = TempDir::new();
    let path = dir.write("sluice.conf", &config(live.addr, dead, "one"));
    let p = path.to_str().unwrap().to_string();
    let s = Sluice::spawn(&["run", "-c", &p], dir);
    let admin = s.admin();
    assert_ne!(admin, s.addr, "the admin API has its own listener");
    for _ in 0..3 {
        assert_eq!(get_host(s.addr, "app.test", "/").await.text(), "live");
        assert_eq!(get_host(s.addr, "app.test", "/x/1").await.text(), "live");
    }

    let st = json(&admin_get(admin, "/status").await);
    assert_eq!(st["revision"], 1);
    assert_eq!(st["listeners"][0], s.addr.to_string());
    assert_eq!(
        st["sites"],
        serde_json::json!([
            {"name": "app.test", "maintenance": false},
            {"name": "*", "maintenance": false}
        ])
    );
    assert_eq!(st["tunnels_open"], 0);
    assert_eq!(
        st["out_of_ports"], 0,
        "dials and probes refused for want of local ports"
    );
    let pools = st["pools"].as_array().unwrap();
    let names: Vec<&str> = pools.iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["app.test /x/*", "app.test"]);
    let site_pool = &pools[1];
    assert_eq!(site_pool["policy"], "first");
    assert_eq!(site_pool["role"], "primary");
    let down = &site_pool["peers"][0];
    assert_eq!(down["ordinal"], 0);
    assert_eq!(down["address"], dead.to_string());
    assert_eq!(
        down["state"], "out",
        "the dead peer is out of rotation: {st}"
    );
    assert_eq!(down["failures"], 1);
    assert_eq!(down["last_probe"], Value::Null);
    let up = &site_pool["peers"][1];
    assert_eq!(
        (up["state"].as_str(), up["selections"].as_u64()),
        (Some("healthy"), Some(3))
    );
    assert_eq!(up["in_flight"], 0);

    let m = admin_get(admin, "/metrics").await.text();
    for name in [
        "sluice_requests_total{status=\"200\"} 6",
        "sluice_peer_healthy{pool=\"app.test\",peer=\"",
        "sluice_peer_probes_total{",
        "sluice_peer_health_transitions_total{",
        "sluice_peer_in_flight{",
        "sluice_peer_selections_total{pool=\"app.test /x/*\"",
        "sluice_peer_failures_total{pool=\"app.test\",peer=\"",
        "kind=\"connect\"} 1",
        "sluice_failover_total{pool=\"app.test\"} 0",
        "sluice_upstream_seconds_bucket{pool=\"app.test\",le=\"+Inf\"} 3",
        "sluice_upstream_seconds_count{pool=\"app.test /x/*\"} 3",
        "sluice_tunnels_open 0",
        "sluice_out_of_ports_total 0",
        "sluice_limit_rejections_total 0",
        "sluice_retries_total{pool=\"app.test\",reason=\"unreachable\"} 1",
        "process_resident_memory_bytes ",
    ] {
        assert!(m.contains(name), "metrics lack {name:?}:\n{m}");
    }

    let page = admin_get(admin, "/").await;
    assert!(page
        .header("content-type")
        .unwrap()
        .starts_with("text/html"));
    assert!(
        page.text().contains("fetch('/status'"),
        "the dashboard reads /status live"
    );

    let on_site = get_host(s.addr, "other.test", "/status").await;
    assert_eq!(
        on_site.text(),
        "one",
        "the admin API is never on a site listener"
    );
    for out in [
        st.to_string(),
        m,
        admin_get(admin, "/revisions").await.text(),
    ] {
        assert!(
            !out.contains("s3cr3t"),
            "a secret from the config leaked: {out}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_revisions_and_rollback() {
    let live = Backend::text("live").await;
    let dead = dead_addr().await;
    let dir = TempDir::new();
    let path = dir.write("sluice.conf", &config(live.addr, dead, "one"));
    let p = path.to_str().unwrap().to_string();
    let s = Sluice::spawn(&["run", "-c", &p], dir);
    let admin = s.admin();

    std::fs::write(&path, config(live.addr, dead, "two")).unwrap();
    let r = admin_post(admin, "/reload").await;
    assert_eq!((r.status, json(&r)["revision"].as_u64()), (200, Some(2)));
    assert_eq!(get(s.addr, "/").await.text(), "two");

    std::fs::write(
        &path,
        config(live.addr, dead, "three").replace("lb first", "lb fastest"),
    )
    .unwrap();
    let r = admin_post(admin, "/reload").await;
    assert_eq!(r.status, 422);
    let error = json(&r)["error"].as_str().unwrap().to_string();
    assert!(
        error.contains("sluice.conf:7:") && error.contains("unknown policy `fastest`"),
        "the error names file, line and column: {error}"
    );
    assert_eq!(get(s.addr, "/").await.text(), "two", "nothing changed");

    let out = Command::new(bin())
        .args(["reload", "--admin", &admin.to_string()])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "sluice reload exits 1 on a rejected config"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown policy"));

    std::fs::write(&path, config(live.addr, dead, "four")).unwrap();
    let out = Command::new(bin())
        .args(["reload", "--admin", &admin.to_string()])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "sluice reload: revision 3"
    );
    assert_eq!(get(s.addr, "/").await.text(), "four");

    let r = admin_post(admin, "/rollback/1").await;
    assert_eq!((r.status, json(&r)["revision"].as_u64()), (200, Some(4)));
    assert_eq!(
        get(s.addr, "/").await.text(),
        "one",
        "revision 1's text, as a new revision"
    );
    assert_eq!(admin_post(admin, "/rollback/99").await.status, 404);

    let revs = json(&admin_get(admin, "/revisions").await);
    assert_eq!(revs["current"], 4);
    let origins: Vec<&str> = revs["revisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["origin"].as_str().unwrap())
        .collect();
    assert_eq!(
        origins,
        ["start", "reload", "reload", "rollback"],
        "rejected loads make none"
    );
    let at = revs["revisions"][0]["loaded_at"].as_str().unwrap();
    assert!(at.len() == 24 && at.ends_with('Z'), "RFC 3339: {at}");
}

/// The admin API cannot be driven across sites: a POST that is not JSON (a form) gets
/// 415 and changes nothing; a Host that is not the API's own address or a loopback name
/// (DNS rebinding) gets 421, for reads too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_site_requests_are_refused() {
    let b = Backend::text("live").await;
    let dead = dead_addr().await;
    let s = Sluice::start(&config(b.addr, dead, "v1"));
    let admin = s.admin();
    for ct in [
        None,
        Some("application/x-www-form-urlencoded"),
        Some("text/plain"),
        Some("multipart/form-data; boundary=x"),
    ] {
        for path in ["/reload", "/rollback/1"] {
            let mut h = vec![("Content-Length", "0")];
            if let Some(ct) = ct {
                h.push(("Content-Type", ct));
            }
            let r = request(admin, "POST", path, &h, b"").await;
            assert_eq!(r.status, 415, "{path} with {ct:?}: {}", r.text());
        }
    }
    let revs = json(&admin_get(admin, "/revisions").await);
    assert_eq!(revs["current"], 1, "no refused POST made a revision");
    let port = admin.port();
    for host in [
        "evil.example".to_string(),
        format!("evil.example:{port}"),
        format!("127.0.0.1.nip.io:{port}"),
        "localhost:1".to_string(),
    ] {
        for (method, path) in [
            ("GET", "/status"),
            ("GET", "/revisions"),
            ("GET", "/metrics"),
        ] {
            let r = request(admin, method, path, &[("Host", &host)], b"").await;
            assert_eq!(r.status, 421, "{method} {path} with Host {host}");
        }
        let r = request(
            admin,
            "POST",
            "/reload",
            &[
                ("Host", &host),
                ("Content-Type", "application/json"),
                ("Content-Length", "0"),
            ],
            b"",
        )
        .await;
        assert_eq!(r.status, 421, "POST /reload with Host {host}");
    }
    for host in [
        admin.to_string(),
        "localhost".to_string(),
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
    ] {
        let r = request(admin, "GET", "/status", &[("Host", &host)], b"").await;
        assert_eq!(r.status, 200, "Host {host}");
    }
    let r = admin_post(admin, "/reload").await;
    assert_eq!(
        r.status,
        200,
        "a JSON POST from a loopback Host: {}",
        r.text()
    );
}

/// With a token, every admin request but the dashboard page needs `Authorization:
/// Bearer TOKEN` (`401` otherwise); `sluice reload` finds the token in `--token-file`,
/// `$SLUICE_ADMIN_TOKEN` or the config's admin block; a reload that changes the
/// token file changes the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_guards_every_endpoint_but_the_page() {
    let dir = TempDir::new();
    let token = dir.write("admin.token", "s3cret-Token_1\n");
    let text = "listen 127.0.0.1:0\nglobal { admin 127.0.0.1:0 { token_file admin.token } }\nsite * { respond one }\n";
    let path = dir.write("sluice.conf", text);
    let p = path.to_str().unwrap().to_string();
    let tok = token.to_str().unwrap().to_string();
    let s = Sluice::spawn(&["run", "-c", &p], dir);
    let admin = s.admin();
    let with = |t: &'static str| [("Authorization", t)];
    let page = admin_get(admin, "/").await;
    assert_eq!(page.status, 200, "the page itself asks for the token");
    for path in ["/status", "/metrics", "/revisions"] {
        let r = admin_get(admin, path).await;
        assert_eq!(r.status, 401, "{path}");
        assert_eq!(
            r.header("www-authenticate"),
            Some("Bearer realm=\"sluice admin\"")
        );
        for wrong in [
            "Bearer s3cret-Token_",
            "Bearer s3cret-Token_1x",
            "Basic s3cret-Token_1",
            "s3cret-Token_1",
        ] {
            let r = request(admin, "GET", path, &[("Authorization", wrong)], b"").await;
            assert_eq!(r.status, 401, "{path} {wrong}");
        }
        for right in [
            "Bearer s3cret-Token_1",
            "bearer s3cret-Token_1",
            "BEARER s3cret-Token_1",
        ] {
            let r = request(admin, "GET", path, &[("Authorization", right)], b"").await;
            assert_eq!(r.status, 200, "{path} {right}");
        }
    }
    assert_eq!(admin_post(admin, "/reload").await.status, 401);
    let maint = br#"{"site": "*", "on": true}"#;
    let r = request(
        admin,
        "POST",
        "/maintenance",
        &[("Content-Type", "application/json")],
        maint,
    )
    .await;
    assert_eq!(r.status, 401);
    assert_eq!(get(s.addr, "/").await.text(), "one", "nothing was switched");
    // sluice reload: no token, then each way of giving it.
    let reload = |args: &[&str], env: Option<&str>| {
        let mut c = Command::new(bin());
        c.arg("reload").args(args).env_remove("SLUICE_ADMIN_TOKEN");
        if let Some(v) = env {
            c.env("SLUICE_ADMIN_TOKEN", v);
        }
        c.output().unwrap()
    };
    let a = admin.to_string();
    let out = reload(&["--admin", &a], None);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("needs a token"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = reload(&["--admin", &a], Some("wrong"));
    assert!(String::from_utf8_lossy(&out.stderr).contains("refused the token"));
    for (args, env) in [
        (
            vec!["--admin", a.as_str(), "--token-file", tok.as_str()],
            None,
        ),
        (vec!["--admin", a.as_str()], Some("s3cret-Token_1")),
    ] {
        let out = reload(&args, env);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // A new token in the file, and a reload (by the config's own admin block, whose
    // address is port 0 here: so give --admin): the old token stops working.
    std::fs::write(&token, "n3w-token\n").unwrap();
    let out = reload(&["--admin", &a, "-c", &p], None);
    assert_eq!(
        out.status.code(),
        Some(1),
        "-c reads the new token, which the running API does not have yet"
    );
    let out = reload(
        &["--admin", &a, "--token-file", &tok],
        Some("s3cret-Token_1"),
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "--token-file wins over the environment"
    );
    let out = reload(&["--admin", &a], Some("s3cret-Token_1"));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(admin_get(admin, "/status").await.status, 401);
    let r = request(admin, "GET", "/status", &with("Bearer s3cret-Token_1"), b"").await;
    assert_eq!(r.status, 401, "the old token no longer works");
    let r = request(admin, "GET", "/status", &with("Bearer n3w-token"), b"").await;
    assert_eq!(r.status, 200);
    let out = reload(&["--admin", &a, "-c", &p], None);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn admin_tokens_are_checked_at_load() {
    let dir = TempDir::new();
    dir.write("empty.token", "\n");
    for (text, want) in [
        ("global { admin 0.0.0.0:2019 }\nsite * { respond ok }", "(off loopback) has no token"),
        ("global { admin [::]:2019 }\nsite * { respond ok }", "(off loopback) has no token"),
        ("global { admin 127.0.0.1:2019 { token_file nope.token } }\nsite * { respond ok }", "nope.token"),
        ("global { admin 127.0.0.1:2019 { token_file empty.token } }\nsite * { respond ok }", "one word of visible ASCII"),
        ("global { admin 127.0.0.1:2019 { token \"a b\" } }\nsite * { respond ok }", "one word of visible ASCII"),
        ("global { admin 127.0.0.1:2019 { token abc\n token_file empty.token } }\nsite * { respond ok }", "one token"),
        ("global { admin 127.0.0.1:2019 { tokn abc } }\nsite * { respond ok }", "tokn"),
    ] {
        assert_check_fails(&dir, text, want);
    }
    // A token written in the file loads, with a warning; one from the environment
    // does not warn; an admin off loopback with a token loads.
    for (text, warns) in [
        (
            "global { admin 127.0.0.1:2019 { token abc } }\nsite * { respond ok }",
            true,
        ),
        (
            "global { admin 127.0.0.1:2019 { token {$SLUICE_TEST_TOKEN} } }\nsite * { respond ok }",
            false,
        ),
        (
            "global { admin 0.0.0.0:2019 { token {$SLUICE_TEST_TOKEN} } }\nsite * { respond ok }",
            false,
        ),
    ] {
        let path = dir.write("ok.conf", text);
        let out = Command::new(bin())
            .args(["check", "-c", path.to_str().unwrap()])
            .env("SLUICE_TEST_TOKEN", "from-env")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{text}: {err}");
        assert_eq!(
            err.contains("the admin token is written in the config file"),
            warns,
            "{text}: {err}"
        );
    }
}

/// `POST /origin-test`: one request to a pool's first peer of a role, reported (a
/// redirect is its status, never followed), failures by stable name; unknown pools and
/// ids are 404, a bad role 400; one at a time and six a minute per pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn origin_tests_report_one_request_to_a_role() {
    use std::sync::{Arc, Mutex};
    /// A backend answering 302 (after `delay`), logging `METHOD PATH HOST` per request.
    async fn logging(delay: u64) -> (Backend, Arc<Mutex<Vec<String>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let b = Backend::start(move |req: hyper::Request<hyper::body::Incoming>| {
            let log = log.clone();
            async move {
                let host = req.headers().get("host").and_then(|h| h.to_str().ok());
                let line = format!("{} {} {}", req.method(), req.uri(), host.unwrap_or(""));
                log.lock().unwrap().push(line);
                tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
                let mut r = hyper::Response::new(full("moved"));
                *r.status_mut() = hyper::StatusCode::FOUND;
                r.headers_mut()
                    .insert("location", "http://elsewhere.test/".parse().unwrap());
                r
            }
        })
        .await;
        (b, seen)
    }
    let (b, seen) = logging(0).await;
    let (slow, slow_seen) = logging(800).await;
    let dead = dead_addr().await;
    let s = Sluice::start(&format!(
        "global {{ admin 127.0.0.1:0 }}
        site app.test {{
            route /slow/* {{ proxy {slow} {{ health /slow {{ host probe.test; interval 1h; expect 302 }} }} }}
            proxy {b} {{ backup {dead} }}
        }}",
        slow = slow.addr,
        b = b.addr
    ));
    let admin = s.admin();
    let t = origin_test(admin, "app.test", "primary").await;
    assert_eq!(t["status"], 302, "{t}");
    assert_eq!(t["address"], b.addr.to_string());
    assert_eq!(t["tls_result"], "none");
    assert_eq!(t["failure"], serde_json::Value::Null);
    assert!(t["latency_ms"].is_u64());
    assert_eq!(
        *seen.lock().unwrap(),
        [format!("GET / {}", b.addr)],
        "one request, with the peer's own Host; the redirect not followed"
    );
    let t = origin_test(admin, "app.test", "backup").await;
    assert_eq!(
        (t["failure"].as_str(), t["address"].as_str()),
        (Some("connect"), Some(dead.to_string().as_str())),
        "{t}"
    );
    assert_eq!(t["status"], serde_json::Value::Null);
    // The health path and its Host (after the pool's own first probe); one test at a
    // time per pool.
    let end = std::time::Instant::now() + WAIT;
    while slow_seen.lock().unwrap().is_empty() {
        assert!(
            std::time::Instant::now() < end,
            "the first probe never came"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let first = post_json(
        admin,
        "/origin-test",
        r#"{"pool": "app.test /slow/*", "role": "primary"}"#,
    )
    .await;
    assert_eq!(first.status, 202);
    let busy = post_json(
        admin,
        "/origin-test",
        r#"{"pool": "app.test /slow/*", "role": "primary"}"#,
    )
    .await;
    assert_eq!(busy.status, 429);
    assert!(busy.header("retry-after").is_some());
    for (body, status) in [
        (r#"{"pool": "nope", "role": "primary"}"#, 404),
        (r#"{"pool": "app.test", "role": "leader"}"#, 400),
        (r#"{"pool": "app.test /slow/*", "role": "backup"}"#, 400),
        (r#"{"role": "primary"}"#, 400),
    ] {
        assert_eq!(
            post_json(admin, "/origin-test", body).await.status,
            status,
            "{body}"
        );
    }
    assert_eq!(admin_get(admin, "/origin-test/zzz").await.status, 404);
    while slow_seen.lock().unwrap().len() < 2 {
        assert!(
            std::time::Instant::now() < end,
            "the test's request never came"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(
        *slow_seen.lock().unwrap(),
        ["GET /slow probe.test", "GET /slow probe.test"],
        "the probe, then the test"
    );
    // Six a minute: two ran on the main pool; four more, then 429.
    for _ in 0..4 {
        origin_test(admin, "app.test", "primary").await;
    }
    let r = post_json(
        admin,
        "/origin-test",
        r#"{"pool": "app.test", "role": "primary"}"#,
    )
    .await;
    assert_eq!(r.status, 429, "{}", r.text());
    let wait: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&wait), "{wait}");
}

/// The API keeps its address until the next start: a reload whose config has no token
/// is refused while that address is off loopback (the token stays in force).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_cannot_drop_the_token_of_an_api_off_loopback() {
    let dir = TempDir::new();
    dir.write("admin.token", "keep-me\n");
    let with = "listen 127.0.0.1:0\nglobal { admin 0.0.0.0:0 { token_file admin.token } }\nsite * { respond one }\n";
    let path = dir.write("sluice.conf", with);
    let p = path.to_str().unwrap().to_string();
    let s = Sluice::spawn(&["run", "-c", &p], dir);
    let admin = s.admin();
    let port = admin.port();
    let admin = SocketAddr::from(([127, 0, 0, 1], port));
    let auth = [
        ("Authorization", "Bearer keep-me"),
        ("Content-Type", "application/json"),
    ];
    for text in [
        "listen 127.0.0.1:0\nglobal { admin off }\nsite * { respond two }\n",
        "listen 127.0.0.1:0\nglobal { admin 127.0.0.1:0 }\nsite * { respond two }\n",
    ] {
        std::fs::write(&path, text).unwrap();
        let r = request(admin, "POST", "/reload", &auth, b"{}").await;
        assert_eq!(r.status, 422, "{}", r.text());
        assert!(r.text().contains("off loopback"), "{}", r.text());
        assert_eq!(
            admin_get(admin, "/status").await.status,
            401,
            "the token still holds"
        );
        assert_eq!(get(s.addr, "/").await.text(), "one");
    }
}

/// `/status` and `/metrics` say which build runs, since when, and how the last reload
/// went (DESIGN §16): `last_reload` is `null` until one, then names its result and
/// error; `sluice_config_reloads_total{result}` counts them (the first load is not one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_build_its_start_and_the_last_reload_are_shown() {
    let dir = TempDir::new();
    let good = "global { admin 127.0.0.1:0 }\nlisten 127.0.0.1:0\nsite * { respond one }\n";
    let path = dir.write("sluice.conf", good);
    let p = path.to_str().unwrap().to_string();
    let s = Sluice::spawn(&["run", "-c", &p], dir);
    let admin = s.admin();
    let st = json(&admin_get(admin, "/status").await);
    assert_eq!(st["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(st["last_reload"], Value::Null);
    assert!(st["uptime_seconds"].as_u64().unwrap() < 60, "{st}");
    assert!(st["started_at"].as_str().unwrap().ends_with('Z'), "{st}");
    let m = admin_get(admin, "/metrics").await.text();
    assert!(
        m.contains(&format!(
            "sluice_build_info{{version=\"{}\"}} 1\n",
            env!("CARGO_PKG_VERSION")
        )),
        "{m}"
    );
    assert!(m.contains("\nprocess_start_time_seconds 1"), "{m}");
    assert!(
        m.contains("sluice_config_reloads_total{result=\"ok\"} 0\n"),
        "{m}"
    );
    // A refused reload, then a good one.
    std::fs::write(
        &p,
        "global { admin 127.0.0.1:0 }\nlisten 127.0.0.1:0\nsite * { respnd two }\n",
    )
    .unwrap();
    assert_ne!(admin_post(admin, "/reload").await.status, 200);
    let st = json(&admin_get(admin, "/status").await);
    assert_eq!(st["last_reload"]["ok"], false, "{st}");
    assert!(
        st["last_reload"]["error"]
            .as_str()
            .unwrap()
            .contains("respnd"),
        "{st}"
    );
    std::fs::write(&p, good.replace("one", "two")).unwrap();
    assert_eq!(admin_post(admin, "/reload").await.status, 200);
    let st = json(&admin_get(admin, "/status").await);
    assert_eq!(st["last_reload"]["ok"], true, "{st}");
    assert_eq!(st["last_reload"]["error"], Value::Null);
    let m = admin_get(admin, "/metrics").await.text();
    assert!(
        m.contains("sluice_config_reloads_total{result=\"ok\"} 1\n"),
        "{m}"
    );
    assert!(
        m.contains("sluice_config_reloads_total{result=\"rejected\"} 1\n"),
        "{m}"
    );
}

/// A `forward_auth` filter's pool is a pool like the others: in `/status` and the
/// metrics, and carried across a reload that keeps it (its kept-alive connection to the
/// auth service survives: one connection for requests on both sides of the reload).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_auth_pools_are_shown_and_carried_across_reloads() {
    let auth = Backend::text("yes").await;
    let dir = TempDir::new();
    let text = format!(
        "global {{ admin 127.0.0.1:0 }}
listen 127.0.0.1:0
site app.test {{
    route /app/* {{ forward_auth http://{}/check; respond ok }}
}}
",
        auth.addr
    );
    let path = dir.write("sluice.conf", &text);
    let p = path.to_str().unwrap().to_string();
    let s = Sluice::spawn(&["run", "-c", &p], dir);
    let admin = s.admin();
    assert_eq!(get_host(s.addr, "app.test", "/app/x").await.text(), "ok");
    let name = "app.test /app/* forward_auth";
    let st = json(&admin_get(admin, "/status").await);
    let pool = st["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("{name} in {st}"));
    assert_eq!(
        pool["peers"][0]["address"],
        format!("http://{}", auth.addr),
        "{st}"
    );
    assert_eq!(pool["peers"][0]["selections"], 1, "{st}");
    let m = admin_get(admin, "/metrics").await.text();
    assert!(
        m.contains(&format!(
            "sluice_peer_selections_total{{pool=\"{name}\",peer=\"http://{}\",ordinal=\"0\"}} 1\n",
            auth.addr
        )),
        "{m}"
    );
    assert_eq!(admin_post(admin, "/reload").await.status, 200);
    assert_eq!(get_host(s.addr, "app.test", "/app/y").await.text(), "ok");
    assert_eq!(
        auth.connections.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the auth service's connection outlived the reload"
    );
}
