//! `jwt` over real sockets, with keys, key sets and tokens made by PyJWT
//! (`tests/interop/jwt_mint.py`): every algorithm, every refusal, a JWKS URL that
//! rotates and goes down, conditions on claims, and the filters and cache beside it.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use http::{Request, Response};
use hyper::body::Incoming;

const PYTHON: &str = "/usr/bin/python3";

/// Keys, sets and tokens in `dir` (see the script); `None` (skipped) without PyJWT.
fn mint(dir: &TempDir) -> Option<HashMap<String, String>> {
    let has = std::process::Command::new(PYTHON)
        .args(["-c", "import jwt, cryptography"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has {
        missing("PyJWT with cryptography for /usr/bin/python3 (python3-jwt python3-cryptography)");
        return None;
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/interop/jwt_mint.py");
    let out = std::process::Command::new(PYTHON)
        .args([script, dir.0.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(serde_json::from_slice(&out.stdout).unwrap())
}

fn start(dir: TempDir, config: &str) -> Sluice {
    let path = dir.write("sluice.conf", &without_admin(config));
    let p = path.to_str().unwrap().to_string();
    Sluice::spawn(&["run", "-c", &p], dir)
}

async fn bearer(addr: std::net::SocketAddr, path: &str, token: &str) -> Resp {
    let auth = format!("Bearer {token}");
    request(addr, "GET", path, &[("Authorization", &auth)], b"").await
}

/// The `error_description` of a 401, or `None` when it has no `error`.
fn description(r: &Resp) -> Option<String> {
    let h = r
        .header("www-authenticate")
        .expect("a 401 says how to authenticate");
    assert!(h.starts_with("Bearer"), "{h}");
    let i = h.find("error_description=\"")?;
    Some(h[i + 19..].trim_end_matches('"').to_string())
}

async fn metrics(admin: std::net::SocketAddr) -> String {
    get(admin, "/metrics").await.text()
}

fn counted(m: &str, route: &str, result: &str) -> u64 {
    let needle = format!("route=\"{route}\",result=\"{result}\"}} ");
    m.lines()
        .find(|l| l.starts_with("sluice_jwt_results_total") && l.contains(&needle))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_algorithm_verifies_and_every_bad_token_is_a_401() {
    let dir = TempDir::new();
    let Some(t) = mint(&dir) else { return };
    let b = Backend::echo_head().await;
    let log = dir.0.join("access.log");
    let s = start(
        dir,
        &format!(
            "global {{ admin 127.0.0.1:0; access_log access.log json }}
listen 127.0.0.1:0
site * {{
    route /hs/* {{
        jwt {{ secret_file secret; algorithms HS256 HS384 HS512 }}
        proxy {b}
    }}
    route /api/* {{
        jwt {{
            jwks jwks_a.json
            issuer https://id.example.test/
            audience api
            claims_to_headers {{ sub X-User; groups X-Groups; missing_claim X-Missing }}
        }}
        proxy {b}
    }}
}}
",
            b = b.addr
        ),
    );
    let admin = s.admin();
    // Every asymmetric algorithm against the published set, the user's fields made of
    // the claims (a client's spelling of them gone, a field whose claim is absent too).
    for alg in [
        "RS256",
        "RS384",
        "RS512",
        "PS256",
        "ES256",
        "ES384",
        "EdDSA",
        "es256_no_kid",
        "aud_list",
        "no_exp",
        "in_leeway",
    ] {
        let auth = format!("Bearer {}", t[alg]);
        let r = request(
            s.addr,
            "GET",
            "/api/x",
            &[
                ("Authorization", &auth),
                ("X_User", "mallory"),
                ("x-missing", "forged"),
            ],
            b"",
        )
        .await;
        assert_eq!(r.status, 200, "{alg}: {}", r.text());
        let seen = r.text();
        assert!(seen.contains("x-user: alice\n"), "{alg}: {seen}");
        assert!(seen.contains("x-groups: ops, dev\n"), "{alg}: {seen}");
        assert!(
            !seen.contains("mallory") && !seen.contains("forged"),
            "{alg}: {seen}"
        );
    }
    for alg in ["HS256", "HS384", "HS512"] {
        assert_eq!(bearer(s.addr, "/hs/x", &t[alg]).await.status, 200, "{alg}");
    }
    // A public-key token where only HMAC is accepted, and the reverse.
    let r = bearer(s.addr, "/hs/x", &t["ES256"]).await;
    assert_eq!(
        (r.status, description(&r).as_deref()),
        (401, Some("algorithm not accepted"))
    );
    let r = bearer(s.addr, "/api/x", &t["HS256"]).await;
    assert_eq!(
        (r.status, description(&r).as_deref()),
        (401, Some("algorithm not accepted"))
    );

    let refused = [
        ("expired", "token expired"),
        ("exp_text", "token expired"),
        ("not_yet", "token not yet valid"),
        ("wrong_iss", "wrong issuer"),
        ("no_iss", "wrong issuer"),
        ("wrong_aud", "wrong audience"),
        ("bad_signature", "bad signature"),
        ("tampered", "bad signature"),
        ("none", "algorithm not accepted"),
        ("hs_confusion", "algorithm not accepted"),
        ("hs_here", "algorithm not accepted"),
        ("wrong_kind", "unknown signing key"),
        ("unknown_kid", "unknown signing key"),
        ("crit", "malformed token"),
        ("huge", "token too large"),
    ];
    for (name, why) in refused {
        let r = bearer(s.addr, "/api/x", &t[name]).await;
        assert_eq!(r.status, 401, "{name}");
        assert_eq!(description(&r).as_deref(), Some(why), "{name}");
        assert!(r
            .header("www-authenticate")
            .unwrap()
            .contains("error=\"invalid_token\""));
        assert_eq!(
            r.text(),
            "Unauthorized: invalid token\n",
            "{name}: no detail in the body"
        );
    }
    for garbage in ["abc", "a.b.c", "....", "eyJhbGciOiJFUzI1NiJ9.e30"] {
        let r = bearer(s.addr, "/api/x", garbage).await;
        assert_eq!(
            (r.status, description(&r).as_deref()),
            (401, Some("malformed token")),
            "{garbage}"
        );
    }
    // No token: a plain challenge, no error. Basic credentials are no bearer token.
    let r = get(s.addr, "/api/x").await;
    assert_eq!(
        (r.status, r.header("www-authenticate")),
        (401, Some("Bearer"))
    );
    let r = request(
        s.addr,
        "GET",
        "/api/x",
        &[("Authorization", "Basic YTpi")],
        b"",
    )
    .await;
    assert_eq!(
        (r.status, r.header("www-authenticate")),
        (401, Some("Bearer"))
    );
    // Two tokens: which would the backend believe?
    let (a1, a2) = (
        format!("Bearer {}", t["ES256"]),
        format!("Bearer {}", t["bob"]),
    );
    let r = request(
        s.addr,
        "GET",
        "/api/x",
        &[("Authorization", &a1), ("Authorization", &a2)],
        b"",
    )
    .await;
    assert_eq!(
        (r.status, description(&r).as_deref()),
        (401, Some("malformed token"))
    );

    let m = metrics(admin).await;
    assert_eq!(counted(&m, "/api/*", "ok"), 11, "{m}");
    assert_eq!(counted(&m, "/api/*", "expired"), 2, "{m}");
    assert_eq!(counted(&m, "/api/*", "missing"), 2, "{m}");
    assert_eq!(counted(&m, "/api/*", "too_large"), 1, "{m}");
    assert_eq!(counted(&m, "/api/*", "bad_signature"), 2, "{m}");
    assert_eq!(counted(&m, "/hs/*", "ok"), 3, "{m}");
    // The access log names the token's subject (a line reaches the file within the
    // writer's lag, not at once).
    let end = Instant::now() + Duration::from_secs(5);
    let text = loop {
        let t = std::fs::read_to_string(&log).unwrap_or_default();
        if t.lines().any(|l| l.contains("\"user\":\"alice\"")) || Instant::now() > end {
            break t;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        text.lines().any(|l| l.contains("\"user\":\"alice\"")),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jwks_url_follows_rotation_once_a_minute_and_survives_reload_and_outage() {
    let dir = TempDir::new();
    let Some(t) = mint(&dir) else { return };
    let sets: HashMap<&str, String> = ["jwks_a.json", "jwks_b.json", "jwks_c.json"]
        .into_iter()
        .map(|n| (n, std::fs::read_to_string(dir.0.join(n)).unwrap()))
        .collect();
    // The provider: what it serves now ("500", "junk", "huge" or a set), and fetches.
    let serving = Arc::new(Mutex::new(sets["jwks_a.json"].clone()));
    let fetches = Arc::new(AtomicUsize::new(0));
    let (sv, f) = (serving.clone(), fetches.clone());
    let idp = Backend::start(move |_req: Request<Incoming>| {
        let body = sv.lock().unwrap().clone();
        f.fetch_add(1, Ordering::SeqCst);
        async move {
            match body.as_str() {
                "500" => Response::builder().status(500).body(full("down")).unwrap(),
                "huge" => Response::new(full(format!(
                    "{{\"keys\": [], \"pad\": \"{}\"}}",
                    "x".repeat(1_100_000)
                ))),
                _ => Response::new(full(body)),
            }
        }
    })
    .await;
    let b = Backend::text("hello").await;
    let config = |refresh: &str| {
        format!(
            "listen 127.0.0.1:0
site * {{
    jwt {{ jwks http://{}/jwks.json; refresh {refresh} }}
    proxy {}
}}
",
            idp.addr, b.addr
        )
    };
    let s = start(dir, &config("1h"));
    // Fetched at start.
    wait_status(s.addr, &t["ES256"], 200).await;
    let at_start = fetches.load(Ordering::SeqCst);
    assert_eq!(at_start, 1);
    // The provider rotates: a token of the new key fetches the set once, and passes.
    *serving.lock().unwrap() = sets["jwks_b.json"].clone();
    assert_eq!(bearer(s.addr, "/", &t["rotated"]).await.status, 200);
    assert_eq!(fetches.load(Ordering::SeqCst), 2);
    // Another unknown key within the minute: refused without a fetch.
    let r = bearer(s.addr, "/", &t["unknown_kid"]).await;
    assert_eq!(
        (r.status, description(&r).as_deref()),
        (401, Some("unknown signing key"))
    );
    assert_eq!(fetches.load(Ordering::SeqCst), 2);
    // The provider goes down; a reload keeps the set it had (and fetches nothing).
    *serving.lock().unwrap() = "500".into();
    s.signal("HUP");
    s.wait_log("reloaded: revision 2");
    assert_eq!(bearer(s.addr, "/", &t["rotated"]).await.status, 200);
    assert_eq!(bearer(s.addr, "/", &t["ES256"]).await.status, 200);
    assert_eq!(fetches.load(Ordering::SeqCst), 2);
    drop(s);

    // A short refresh against a failing provider: the last good set stays, one warning.
    *serving.lock().unwrap() = sets["jwks_a.json"].clone();
    let dir = TempDir::new();
    let s = start(dir, &config("1s"));
    wait_status(s.addr, &t["ES256"], 200).await;
    for broken in ["junk", "huge", "500"] {
        *serving.lock().unwrap() = broken.into();
        let seen = fetches.load(Ordering::SeqCst);
        wait_for(|| fetches.load(Ordering::SeqCst) >= seen + 2).await;
        assert_eq!(
            bearer(s.addr, "/", &t["ES256"]).await.status,
            200,
            "{broken}"
        );
    }
    s.wait_log("keeping the last good key set (4 keys)");
    let warned = s.logs().matches("keeping the last good key set").count();
    assert_eq!(warned, 1, "one warning an outage:\n{}", s.logs());
    // Back, with only the new key: the old key's tokens stop passing.
    *serving.lock().unwrap() = sets["jwks_c.json"].clone();
    s.wait_log("fetched again, 1 keys");
    assert_eq!(bearer(s.addr, "/", &t["rotated"]).await.status, 200);
    assert_eq!(bearer(s.addr, "/", &t["ES256"]).await.status, 401);
}

async fn wait_status(addr: std::net::SocketAddr, token: &str, want: u16) {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let got = bearer(addr, "/", token).await.status;
        if got == want {
            return;
        }
        assert!(Instant::now() < end, "still {got}, not {want}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_for(cond: impl Fn() -> bool) {
    let end = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < end, "timed out");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_decide_beside_basic_auth_forward_auth_and_the_cache() {
    let dir = TempDir::new();
    let Some(t) = mint(&dir) else { return };
    // Echoes who it was told the user is; `public` under /shared.
    let b = Backend::start(|req: Request<Incoming>| async move {
        let user = req
            .headers()
            .get("x-user")
            .map_or("nobody".to_string(), |v| v.to_str().unwrap().to_string());
        let cc = if req.uri().path().starts_with("/c/shared") {
            "public, max-age=60"
        } else {
            "max-age=60"
        };
        Response::builder()
            .header("cache-control", cc)
            .body(full(format!("for {user}\n")))
            .unwrap()
    })
    .await;
    // The auth service sees the user sluice verified.
    let asked = Arc::new(Mutex::new(Vec::<String>::new()));
    let a = asked.clone();
    let auth = Backend::start(move |req: Request<Incoming>| {
        let user = req
            .headers()
            .get("x-user")
            .map(|v| v.to_str().unwrap().to_string());
        a.lock().unwrap().push(user.clone().unwrap_or_default());
        async move {
            let code = if user.as_deref() == Some("alice") {
                200
            } else {
                403
            };
            Response::builder().status(code).body(full("")).unwrap()
        }
    })
    .await;
    // alice:secret
    let hash = "$2y$05$5307QR.cUEa1D4yPB6RmrONxCbemLcymzYldk1sVLVC8jHol/a9i2";
    let s = start(
        dir,
        &format!(
            "listen 127.0.0.1:0
site * {{
    jwt {{ jwks jwks_a.json; from cookie session; from header Authorization; claims_to_headers {{ sub X-User }} }}
    route /admin/* {{
        deny all unless jwt.role == admin
        respond \"admin area\"
    }}
    route /team/* {{
        deny all unless jwt.groups in ops qa
        respond \"team area\"
    }}
    route /not-bob/* {{
        deny all when jwt.sub != bob
        respond \"bob only\"
    }}
    route /both/* {{
        basic_auth alice \"{hash}\"
        respond \"both\"
    }}
    route /asked/* {{
        forward_auth http://{auth}/check
        respond \"asked\"
    }}
    route /c/* {{
        cache {{ store memory 16M }}
        proxy {b}
    }}
}}
",
            auth = auth.addr,
            b = b.addr
        ),
    );
    let cookie = |who: &str| format!("session={}", t[who]);
    let as_ = |who: &'static str, path: &'static str| {
        let c = cookie(who);
        async move { request(s.addr, "GET", path, &[("Cookie", &c)], b"").await }
    };
    let r = as_("ES256", "/admin/x").await;
    assert_eq!(r.status, 200, "{:?}", r.header("www-authenticate"));
    assert_eq!(
        as_("bob", "/admin/x").await.status,
        403,
        "a valid token without the role"
    );
    assert_eq!(as_("ES256", "/team/x").await.status, 200, "ops");
    assert_eq!(as_("bob", "/team/x").await.status, 200, "qa");
    assert_eq!(as_("carol", "/team/x").await.status, 403, "dev only");
    assert_eq!(as_("bob", "/not-bob/x").await.status, 200);
    assert_eq!(as_("carol", "/not-bob/x").await.status, 403);
    assert_eq!(
        get(s.addr, "/admin/x").await.status,
        401,
        "the site's jwt runs first"
    );
    // Beside basic_auth: the token from the cookie, the password in Authorization.
    let r = request(
        s.addr,
        "GET",
        "/both/x",
        &[
            ("Cookie", &cookie("ES256")),
            ("Authorization", "Basic YWxpY2U6c2VjcmV0"),
        ],
        b"",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = request(
        s.addr,
        "GET",
        "/both/x",
        &[("Cookie", &cookie("ES256"))],
        b"",
    )
    .await;
    assert_eq!(r.status, 401);
    assert!(r.header("www-authenticate").unwrap().starts_with("Basic"));
    // Before forward_auth: the service is told the verified user, not the client's.
    let r = request(
        s.addr,
        "GET",
        "/asked/x",
        &[("Cookie", &cookie("ES256")), ("X-User", "bob")],
        b"",
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(as_("bob", "/asked/x").await.status, 403);
    assert_eq!(*asked.lock().unwrap(), ["alice", "bob"]);
    // The cache: a token in a cookie counts as credentials, so bob is not served the
    // answer stored for alice, unless that answer says it may be shared.
    assert_eq!(as_("ES256", "/c/mine").await.text(), "for alice\n");
    assert_eq!(as_("bob", "/c/mine").await.text(), "for bob\n");
    assert_eq!(as_("ES256", "/c/shared").await.text(), "for alice\n");
    let r = as_("bob", "/c/shared").await;
    assert_eq!(r.text(), "for alice\n", "a public answer is shared");
    assert!(
        r.header("cache-status").unwrap().contains("hit"),
        "{:?}",
        r.header("cache-status")
    );
}

#[test]
fn a_bad_jwt_config_fails_the_check_with_where_and_why() {
    let dir = TempDir::new();
    dir.write("short", "tooshort\n");
    dir.write(
        "junk.json",
        "{\"keys\": [{\"kty\": \"oct\", \"k\": \"c2VjcmV0\"}]}",
    );
    dir.write("long", &"k".repeat(40));
    let cases = [
        ("jwt { issuer x }", "needs the keys"),
        (
            "jwt { jwks https://id.example/jwks; secret_file long }",
            "one source of keys",
        ),
        (
            "jwt { jwks https://id.example/jwks; algorithms RS256 HS256 }",
            "HS256 needs a shared secret",
        ),
        (
            "jwt { secret_file long; algorithms ES256 }",
            "ES256 needs a public key",
        ),
        (
            "jwt { jwks https://id.example/jwks; algorithms none }",
            "`none` is never accepted",
        ),
        (
            "jwt { jwks https://id.example/jwks; algorithms RS257 }",
            "RS257",
        ),
        ("jwt { secret_file short }", "too short"),
        ("jwt { secret_file nothere }", "nothere"),
        ("jwt { jwks junk.json }", "public signing key"),
        ("jwt { jwks nothere.json }", "nothere.json"),
        (
            "jwt { jwks ftp://id.example/jwks }",
            "ftp://id.example/jwks",
        ),
        (
            "jwt { jwks https://x/j; claims_to_headers { sub Host } }",
            "cannot become `Host`",
        ),
        (
            "jwt { jwks https://x/j; from body token }",
            "`header`, `cookie` or `query`",
        ),
        ("jwt { jwks https://x/j; leeway 1h }", "at most 10m"),
        ("jwt { jwks https://x/j; audience }", "audience VALUE"),
        ("jwt { jwks https://x/j; issuer a; issuer b }", "set twice"),
        ("jwt { jwks https://x/j; realm x }", "not a jwt setting"),
        (
            "jwt { jwks https://x/j }\n deny all when jwt.role",
            "jwt.CLAIM == VALUE",
        ),
        (
            "jwt { jwks https://x/j }\n deny all when jwt.role = admin",
            "`==`, `!=` or `in`",
        ),
        (
            "jwt { jwks https://x/j }\n deny all when jwt.role == a b",
            "in A B",
        ),
        (
            "jwt { jwks https://x/j }\n deny all when jwt. == a",
            "a claim after `jwt.`",
        ),
    ];
    for (lines, want) in cases {
        assert_check_fails(
            &dir,
            &format!("listen :80\nsite * {{\n {lines}\n respond ok\n}}\n"),
            want,
        );
    }
}
