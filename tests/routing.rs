//! Sites by Host, routes by path and matchers, and the local handlers and filters:
//! `respond`, `redirect`, `strip`, `rewrite`, `header_down`.

mod common;

use common::*;

const SITES: &str = r#"
site example.com {
    route /exact { respond "exact" }
    route /api/* { respond "api prefix" }
    route /api/v2/* { respond "api v2 longer prefix" }
    route /m/* {
        match method POST
        respond "post only"
    }
    route /m/* {
        match header X-Canary 1
        respond "canary"
    }
    route /m/* {
        match query version 2
        respond "query v2"
    }
    route /old/* { redirect 301 "https://{host}/new{path}?{query}" }
    route /moved { redirect https://elsewhere.example{uri} }
    route /hdr {
        header_down X-Route yes
        respond 202 "with header"
    }
    route /status { respond 418 }
}
site *.example.com { respond "wildcard {host}" }
site *.deep.example.com { respond "longer wildcard" }
site * { respond "default site" }
"#;

#[tokio::test]
async fn sites_match_exact_then_longest_wildcard_then_default() {
    let s = Sluice::start(SITES);
    assert_eq!(
        get_host(s.addr, "example.com", "/exact").await.text(),
        "exact"
    );
    assert_eq!(
        get_host(s.addr, "EXAMPLE.com:8080", "/exact").await.text(),
        "exact",
        "case and port are ignored"
    );
    assert_eq!(
        get_host(s.addr, "a.example.com", "/").await.text(),
        "wildcard a.example.com"
    );
    assert_eq!(
        get_host(s.addr, "x.y.example.com", "/").await.text(),
        "wildcard x.y.example.com",
        "any depth"
    );
    assert_eq!(
        get_host(s.addr, "a.deep.example.com", "/").await.text(),
        "longer wildcard"
    );
    assert_eq!(
        get_host(s.addr, "other.org", "/").await.text(),
        "default site"
    );
}

#[tokio::test]
async fn unknown_site_is_421() {
    let s = Sluice::start("site example.com { respond ok }");
    let r = get_host(s.addr, "other.org", "/").await;
    assert_eq!(r.status, 421, "a Host with no site is misdirected");
    assert_eq!(r.text(), "unknown site\n");
}

#[tokio::test]
async fn routes_exact_then_longest_prefix_then_404() {
    let s = Sluice::start(SITES);
    let h = "example.com";
    assert_eq!(get_host(s.addr, h, "/exact").await.text(), "exact");
    assert_eq!(
        get_host(s.addr, h, "/exact/more").await.status,
        404,
        "an exact route does not match below it"
    );
    assert_eq!(
        get_host(s.addr, h, "/api").await.text(),
        "api prefix",
        "/api/* matches /api"
    );
    assert_eq!(get_host(s.addr, h, "/api/users").await.text(), "api prefix");
    assert_eq!(
        get_host(s.addr, h, "/api/v2/users").await.text(),
        "api v2 longer prefix"
    );
    let r = get_host(s.addr, h, "/apix").await;
    assert_eq!(r.status, 404, "/api/* does not match /apix");
}

#[tokio::test]
async fn matchers_skip_routes_that_fail() {
    let s = Sluice::start(SITES);
    let h = ("Host", "example.com");
    assert_eq!(
        request(s.addr, "POST", "/m/x", &[h], b"").await.text(),
        "post only"
    );
    assert_eq!(
        request(s.addr, "GET", "/m/x", &[h, ("X-Canary", "1")], b"")
            .await
            .text(),
        "canary"
    );
    assert_eq!(
        request(s.addr, "GET", "/m/x?a=1&version=2", &[h], b"")
            .await
            .text(),
        "query v2"
    );
    assert_eq!(
        request(s.addr, "GET", "/m/x", &[h], b"").await.status,
        404,
        "no matcher passes"
    );
}

#[tokio::test]
async fn redirects_and_responses_use_placeholders() {
    let s = Sluice::start(SITES);
    let r = get_host(s.addr, "example.com", "/old/a%20b?x=1").await;
    assert_eq!(r.status, 301);
    assert_eq!(
        r.header("location"),
        Some("https://example.com/new/old/a%20b?x=1"),
        "{{path}} is as received, still encoded; {{query}} has no `?` of its own"
    );
    let r = get_host(s.addr, "example.com", "/moved?q=1").await;
    assert_eq!(r.status, 302, "redirect defaults to 302");
    assert_eq!(
        r.header("location"),
        Some("https://elsewhere.example/moved?q=1")
    );
    let r = get_host(s.addr, "example.com", "/hdr").await;
    assert_eq!((r.status, r.text().as_str()), (202, "with header"));
    assert_eq!(r.header("x-route"), Some("yes"));
    let r = get_host(s.addr, "example.com", "/status").await;
    assert_eq!(r.status, 418);
    assert!(r.body.is_empty(), "respond CODE has an empty body");
}

#[tokio::test]
async fn strip_and_rewrite_change_what_the_backend_sees() {
    let b = Backend::echo_head().await;
    let s = Sluice::start(&format!(
        "site * {{
            route /api/* {{
                strip /api
                proxy {a}
            }}
            route /legacy/* {{
                rewrite /legacy/* /v1/*
                proxy {a}
            }}
            route /one {{
                rewrite /one /two?fixed=1
                proxy {a}
            }}
        }}",
        a = b.addr
    ));
    let first_line = |r: Resp| r.text().lines().next().unwrap().to_string();
    assert_eq!(
        first_line(get(s.addr, "/api/users?id=3").await),
        "GET /users?id=3"
    );
    assert_eq!(first_line(get(s.addr, "/api").await), "GET /");
    assert_eq!(
        first_line(get(s.addr, "/legacy/a/b?q=1").await),
        "GET /v1/a/b?q=1"
    );
    assert_eq!(
        first_line(get(s.addr, "/one?dropped=1").await),
        "GET /two?fixed=1"
    );
}

#[tokio::test]
async fn head_requests_get_no_body() {
    let s = Sluice::start("site * { respond \"hello\" }");
    let out = raw(
        s.addr,
        b"HEAD / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
    .await;
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(
        text.contains("content-length: 5\r\n"),
        "HEAD keeps the length: {text}"
    );
    assert!(text.ends_with("\r\n\r\n"), "but sends no body: {text:?}");
}

#[tokio::test]
async fn braces_glued_to_words_parse_as_nginx_users_write_them() {
    let s =
        Sluice::start("site * {\n    route /a {respond \"glued\"}\n    route /b{ respond 201 }\n}");
    assert_eq!(get(s.addr, "/a").await.text(), "glued");
    assert_eq!(get(s.addr, "/b").await.status, 201);
}

#[tokio::test]
async fn local_responses_carry_a_date() {
    let s = Sluice::start(
        "site a.test {
            route /r { redirect /elsewhere }
            respond \"hello\"
        }",
    );
    for (host, path, status) in [
        ("a.test", "/", 200),
        ("a.test", "/r", 302),
        ("b.test", "/", 421),
    ] {
        let r = get_host(s.addr, host, path).await;
        assert_eq!(r.status, status);
        let date = r
            .header("date")
            .unwrap_or_else(|| panic!("{host}{path}: no Date"));
        assert!(
            date.ends_with(" GMT") && date.len() == 29,
            "an HTTP date: {date}"
        );
    }
    let out = raw(s.addr, b"GET / HTTP/1.1\r\nHost: a\r\nX A: 1\r\n\r\n").await;
    let (r, _) = parse_response(&out).expect("a response");
    assert_eq!(r.status, 400);
    assert!(
        r.header("date").is_some(),
        "refusals of the codec carry Date too"
    );
}

#[tokio::test]
async fn listen_on_a_bare_port_takes_both_families() {
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        eprintln!("skipped: this machine has no IPv6 loopback");
        return;
    }
    let s = Sluice::start("listen :0\nsite * { respond \"both\" }");
    assert!(
        s.addr.ip().is_unspecified(),
        "bound to every interface: {}",
        s.addr
    );
    let port = s.addr.port();
    for ip in ["127.0.0.1", "::1"] {
        let addr = std::net::SocketAddr::new(ip.parse().unwrap(), port);
        assert_eq!(get(addr, "/").await.text(), "both", "reached over {ip}");
    }
}

/// Regex routes (DESIGN §16): nginx's order (exact, regexes in file order, then the
/// longest prefix), matched on the normalised path, with their groups in `rewrite ~`,
/// `redirect`, `header_up` and `header_down`.
#[tokio::test]
async fn regex_routes_match_in_nginx_order_with_their_groups() {
    let b = Backend::echo_head().await;
    let s = Sluice::start(&format!(
        r#"site * {{
            route /v1/exact {{ respond "exact" }}
            route /v1/long/enough/prefix/* {{ respond "prefix" }}
            route ~ "^/v(?P<ver>\d+)/(\w+)" {{
                header_down X-Version "{{re.ver}}"
                header_down X-Whole "{{re.0}}"
                rewrite ~ "^/v\d+/(.*)$" "/api/{{re.1}}"
                proxy {a} {{
                    header_up X-Api-Version "v{{re.1}}-{{re.2}}"
                }}
            }}
            route ~ "^/v1/" {{ respond "second regex" }}
            route ~ "^(/.*)\.php$" {{ redirect 301 "/legacy{{re.1}}.html" }}
            route /* {{ respond "fallback" }}
        }}"#,
        a = b.addr
    ));
    assert_eq!(get(s.addr, "/v1/exact").await.text(), "exact");
    // The first regex in file order wins over a longer prefix.
    let r = get(s.addr, "/v1/long/enough/prefix/x").await;
    assert!(
        r.text().starts_with("GET /api/long/enough/prefix/x"),
        "{}",
        r.text()
    );
    let r = get(s.addr, "/v12/users/7?q=1").await;
    let head = r.text();
    assert!(head.starts_with("GET /api/users/7?q=1"), "{head}");
    assert!(head.contains("x-api-version: v12-users"), "{head}");
    assert_eq!(r.header("x-version"), Some("12"));
    assert_eq!(r.header("x-whole"), Some("/v12/users"));
    // Matched on the normalised path: an escaped `v` and a dot-segment still match.
    let r = get(s.addr, "/%761/a/../users").await;
    assert!(r.text().starts_with("GET /api/users"), "{}", r.text());
    // `\w+` needs a second segment: the next regex takes it.
    assert_eq!(get(s.addr, "/v1/").await.text(), "second regex");
    let r = get(s.addr, "/x/index.php").await;
    assert_eq!(r.status, 301);
    assert_eq!(r.header("location"), Some("/legacy/x/index.html"));
    assert_eq!(get(s.addr, "/other").await.text(), "fallback");
}

#[test]
fn regex_routes_are_checked_at_load() {
    let dir = TempDir::new();
    for (text, want) in [
        (
            "site * {\n  route ~ \"^/(a\" { respond x }\n}\n",
            "bad.conf:2:11: invalid regex `^/(a`: unclosed group",
        ),
        (
            "site * {\n  route ~ \"^/(a)\" { respond \"{re.2}\" }\n}\n",
            "`{re.2}`: `^/(a)` has no such group",
        ),
        (
            "site * {\n  route ~ \"^/(a)\" { header_down X \"{re.name}\"\n respond x }\n}\n",
            "`{re.name}`: `^/(a)` has no such group",
        ),
        (
            "site * {\n  route /a/* { redirect \"/b{re.1}\" }\n}\n",
            "`{re.1}` has no regex here",
        ),
        (
            "site * {\n  header_down X \"{re.0}\"\n  respond x\n}\n",
            "`{re.0}` has no regex here",
        ),
        ("site * {\n  route ~ { respond x }\n}\n", "route PATTERN"),
    ] {
        assert_check_fails(&dir, text, want);
    }
    // Elsewhere `\d` is an unknown escape; after `~` it reaches the regex.
    assert_check_fails(&dir, "site * {\n  respond \"\\d\"\n}\n", "unknown escape");
    let path = dir.write(
        "warn.conf",
        "site * {\n  route /api/ { respond x }\n  route ~ \"^/v\\d+/\" { respond y }\n}\n",
    );
    let out = std::process::Command::new(bin())
        .args(["check", "-c", path.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("warn.conf:2:9: warning: `route /api/` matches only the path /api/ itself"),
        "{err}"
    );
    assert!(err.contains("did you mean /api/*?"), "{err}");
}

/// `error_page` (DESIGN §16): sluice's own answers with the codes take the page's body
/// (their other fields kept), a route's page wins over its site's, requests no route
/// takes get the site's, and with `backend` the backend's answers too.
#[tokio::test]
async fn error_pages_replace_bodies_of_own_answers() {
    let dir = TempDir::new();
    dir.write("errors/404.html", "<h1>nothing here</h1>");
    let b = Backend::start(|req: hyper::Request<hyper::body::Incoming>| async move {
        let status = req
            .uri()
            .path()
            .trim_start_matches("/api/")
            .parse()
            .unwrap_or(200);
        hyper::Response::builder()
            .status(status)
            .header("X-App", "yes")
            .header("Content-Type", "application/json")
            .body(full("{\"backend\":true}"))
            .unwrap()
    })
    .await;
    let dead = dead_addr().await;
    let hash = bcrypt::hash("pw", 4).unwrap();
    let conf = dir.write(
        "sluice.conf",
        &without_admin(&format!(
            r#"listen 127.0.0.1:0
site * {{
    error_page 404 errors/404.html
    error_page 403 500 "site says no"
    route /api/* {{
        error_page 404 "api: no such thing" backend
        proxy {b}
    }}
    route /down/* {{
        error_page 502 503 504 "down for a moment"
        proxy {dead}
    }}
    route /private/* {{
        basic_auth alice "{hash}"
        error_page 401 "please log in"
        respond "secret"
    }}
    route /office/* {{
        allow 10.0.0.0/8
        on denied reject 403
        respond "office"
    }}
    route /static/* {{
        files errors
    }}
}}
"#,
            b = b.addr
        )),
    );
    let s = Sluice::spawn(&["run", "-c", conf.to_str().unwrap()], dir);
    let r = get(s.addr, "/nowhere").await;
    assert_eq!(
        (r.status, r.text().as_str()),
        (404, "<h1>nothing here</h1>")
    );
    assert_eq!(r.header("content-type"), Some("text/html"));
    let r = get(s.addr, "/static/missing.png").await;
    assert_eq!(
        (r.status, r.text().as_str()),
        (404, "<h1>nothing here</h1>")
    );
    // The route's page for 404 wins, for the backend's 404 too (its fields kept but
    // those of the old body).
    let r = get(s.addr, "/api/404").await;
    assert_eq!((r.status, r.text().as_str()), (404, "api: no such thing"));
    assert_eq!(r.header("x-app"), Some("yes"));
    assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));
    // Without `backend`, a backend's answer passes as it is.
    let r = get(s.addr, "/api/500").await;
    assert_eq!((r.status, r.text().as_str()), (500, "{\"backend\":true}"));
    assert_eq!(r.header("content-type"), Some("application/json"));
    let r = get(s.addr, "/down/x").await;
    assert_eq!((r.status, r.text().as_str()), (502, "down for a moment"));
    // A filter's refusal keeps its fields.
    let r = get(s.addr, "/private/x").await;
    assert_eq!((r.status, r.text().as_str()), (401, "please log in"));
    assert!(r.header("www-authenticate").unwrap().starts_with("Basic"));
    let r = get(s.addr, "/office/x").await;
    assert_eq!((r.status, r.text().as_str()), (403, "site says no"));
}

#[test]
fn error_pages_are_checked_at_load() {
    let dir = TempDir::new();
    for (text, want) in [
        (
            "site * {\n  error_page 404 nope.html\n  respond x\n}\n",
            "nope.html",
        ),
        ("site * {\n  error_page 302 \"x\"\n  respond x\n}\n", "400"),
        (
            "site * {\n  error_page \"x\"\n  respond x\n}\n",
            "a status code first",
        ),
        (
            "site * {\n  error_page 404\n  respond x\n}\n",
            "error_page CODE",
        ),
        (
            "site * {\n  error_page 404 \"a\"\n  error_page 500 404 \"b\"\n  respond x\n}\n",
            "`error_page 404` is given twice",
        ),
    ] {
        assert_check_fails(&dir, text, want);
    }
}

/// The site is found by the same `Host` rules whether the request's fields were kept
/// as they came (a plain proxy route, nothing else reading them) or made into a map at
/// once (an access log on): case, port and one trailing dot ignored, a byte no host
/// name holds refused `400`, no `Host` (HTTP/1.0) the default site.
#[tokio::test]
async fn hosts_route_alike_from_the_fields_as_they_came_or_the_map() {
    let b = Backend::text("proxied").await;
    let sites = format!(
        "site example.com {{ proxy {} }}\nsite * {{ respond \"default site\" }}\n",
        b.addr
    );
    let kept = Sluice::start(&sites);
    let mapped = Sluice::start(&format!(
        "global {{ access_log access.log json }}\nlisten 127.0.0.1:0\n{sites}"
    ));
    let cases: [(&[u8], &str); 6] = [
        (b"Host: example.com", "200"),
        (b"Host: EXAMPLE.com.:8080", "200"),
        (b"host:example.COM", "200"),
        (b"Host: caf\xc3\xa9.example.com", "400"),
        (b"Host: example.com/x", "400"),
        (b"Host: other.org", "default site"),
    ];
    for s in [&kept, &mapped] {
        for (host, want) in cases {
            let mut req = b"GET / HTTP/1.1\r\nConnection: close\r\n".to_vec();
            req.extend_from_slice(host);
            req.extend_from_slice(b"\r\n\r\n");
            let out = String::from_utf8_lossy(&raw(s.addr, &req).await).to_string();
            let seen = match want {
                "200" => out.starts_with("HTTP/1.1 200") && out.ends_with("proxied"),
                "400" => out.starts_with("HTTP/1.1 400") && out.contains("invalid Host"),
                body => out.ends_with(body),
            };
            assert!(
                seen,
                "{:?}: want {want}, got {out}",
                String::from_utf8_lossy(host)
            );
        }
        let out = raw(s.addr, b"GET / HTTP/1.0\r\n\r\n").await;
        assert!(String::from_utf8_lossy(&out).ends_with("default site"));
    }
}

/// A site whose routes are chosen by a field builds the request's map before its
/// routes are looked at, though another site's requests keep their fields as they
/// came: `match header` still decides. Past the fields' inline places (30 of them,
/// `Host` last) and near the largest head (64 KiB, `Host` after a 65,000-byte field),
/// the kept fields still find the site and reach the backend whole.
#[tokio::test]
async fn kept_fields_route_by_header_many_fields_and_a_large_head() {
    let b = Backend::echo_head().await;
    let s = Sluice::start(&format!(
        "site m.test {{
            route /h/* {{
                match header X-Canary 1
                proxy {b}
            }}
            route /h/* {{ respond \"no canary\" }}
        }}
        site many.test {{ proxy {b} {{ header_down X-Site many }} }}
        site * {{ proxy {b} }}",
        b = b.addr
    ));
    let canary = request(
        s.addr,
        "GET",
        "/h/x",
        &[("Host", "m.test"), ("X-Canary", "1")],
        b"",
    )
    .await;
    assert!(canary.text().starts_with("GET /h/x\n"), "{}", canary.text());
    let plain = get_host(s.addr, "m.test", "/h/x").await;
    assert_eq!(plain.text(), "no canary");
    // Thirty fields, `Accept-Encoding` and `Host` last.
    let mut head = b"GET /many HTTP/1.1\r\nConnection: close\r\n".to_vec();
    for i in 0..28 {
        head.extend_from_slice(format!("X-F{i}: v{i}\r\n").as_bytes());
    }
    head.extend_from_slice(b"Accept-Encoding: identity\r\nHost: Many.Test\r\n\r\n");
    let out = String::from_utf8_lossy(&raw(s.addr, &head).await).to_string();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(
        out.to_ascii_lowercase().contains("\r\nx-site: many\r\n"),
        "the site by the last Host: {out}"
    );
    for i in 0..28 {
        assert!(out.contains(&format!("\nx-f{i}: v{i}\n")), "x-f{i}: {out}");
    }
    assert!(out.contains("\nhost: Many.Test\n"), "{out}");
    assert!(out.contains("\nx-forwarded-host: Many.Test\n"), "{out}");
    assert!(out.contains("\naccept-encoding: identity\n"), "{out}");
    // A head just under 64 KiB, `Host` after its largest field.
    let mut head = b"GET /big HTTP/1.1\r\nConnection: close\r\nX-Big: ".to_vec();
    head.extend(std::iter::repeat_n(b'a', 65_000));
    head.extend_from_slice(b"\r\nHost: big.test\r\n\r\n");
    assert!(head.len() < 64 * 1024);
    let out = String::from_utf8_lossy(&raw(s.addr, &head).await).to_string();
    assert!(
        out.starts_with("HTTP/1.1 200"),
        "{}",
        &out[..out.len().min(200)]
    );
    assert!(out.contains("\nx-forwarded-host: big.test\n"));
    assert!(out.contains(&format!("\nx-big: {}\n", "a".repeat(65_000))));
}
