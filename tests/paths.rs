//! Security is decided on what the backend will see (DESIGN.md §14 "Paths and hosts"):
//! routes decide on the normalised path and host, so no spelling of a path routes a
//! request past a rule, while the backend still gets the target as received unless
//! `strip`/`rewrite` changed it. And the absolute-form target's authority is the host
//! for routing and backend alike. Each case over a raw socket.

mod common;

use common::*;

/// `/admin/*` is refused; everything else reaches a backend that echoes its head.
async fn guarded() -> (Backend, Sluice) {
    let b = Backend::echo_head().await;
    let s = Sluice::start(&format!(
        "site * {{
            route /admin/* {{ respond 403 \"forbidden\" }}
            route /api/* {{
                strip /api
                proxy {a}
            }}
            proxy {a}
        }}",
        a = b.addr
    ));
    (b, s)
}

async fn raw_get(s: &Sluice, target: &str, host: &str) -> Resp {
    let req = format!("GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    let out = raw(s.addr, req.as_bytes()).await;
    parse_response(&out)
        .unwrap_or_else(|| {
            panic!(
                "no response to {target}: {:?}",
                String::from_utf8_lossy(&out)
            )
        })
        .0
}

#[tokio::test]
async fn no_spelling_of_a_path_routes_past_a_rule() {
    let (_b, s) = guarded().await;
    for target in [
        "/admin/secret",
        "/public/../admin/secret",
        "/./admin/secret",
        "//admin/secret",
        "/%61dmin/secret",
        "/%61%64%6d%69%6e/secret",
        "/public/%2e%2e/admin/secret",
        "/admin/./secret",
        "/ADMIN/../admin/secret",
    ] {
        let r = raw_get(&s, target, "a.test").await;
        assert_eq!(
            (r.status, r.text().as_str()),
            (403, "forbidden"),
            "{target} must be decided as /admin/secret"
        );
    }
}

#[tokio::test]
async fn paths_that_cannot_be_normalised_are_400() {
    let (b, s) = guarded().await;
    for target in [
        "/..",
        "/a/../../etc/passwd",
        "/%2e%2e/etc",
        "/a%00b",
        "/a%zzb",
        "/\\evil.example",
        "/public/a\\b",
    ] {
        let r = raw_get(&s, target, "a.test").await;
        assert_eq!(r.status, 400, "{target} answered {}", r.text());
    }
    assert_eq!(
        b.requests.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "none of them reached the backend"
    );
}

#[tokio::test]
async fn the_backend_gets_the_target_as_received_or_as_strip_made_it() {
    let (_b, s) = guarded().await;
    let r = raw_get(&s, "//public/./x%2Fy?q=%2e", "a.test").await;
    assert!(
        r.text().starts_with("GET //public/./x%2Fy?q=%2e\n"),
        "no strip or rewrite ran: the target goes as received: {}",
        r.text()
    );
    let r = raw_get(&s, "/api//v1/./users/%7euser?x=1", "a.test").await;
    assert!(
        r.text().starts_with("GET /v1/users/~user?x=1\n"),
        "strip works on the normalised path: {}",
        r.text()
    );
    let r = raw_get(&s, "/api/v1/%2e%2e/%2e%2e/etc", "a.test").await;
    assert!(
        r.text().starts_with("GET /api/v1/%2e%2e/%2e%2e/etc\n"),
        "climbing out of /api/ is routed as /etc (the catch-all), which strips nothing: {}",
        r.text()
    );
    let r = raw_get(&s, "/api/%2e%2e/%2e%2e/etc", "a.test").await;
    assert_eq!(r.status, 400, "and above the root is refused");
}

#[tokio::test]
async fn hosts_match_without_case_port_or_trailing_dot() {
    let s = Sluice::start(
        "site app.test { respond \"app\" }
         site * { respond \"default\" }",
    );
    for host in ["app.test", "APP.Test", "app.test.", "App.Test.:8080"] {
        assert_eq!(raw_get(&s, "/", host).await.text(), "app", "Host: {host}");
    }
    assert_eq!(raw_get(&s, "/", "app.test..").await.text(), "default");
}

#[tokio::test]
async fn an_absolute_form_target_names_the_host_for_routing_and_backend() {
    let a = Backend::echo_head().await;
    let b = Backend::text("site b").await;
    let s = Sluice::start(&format!(
        "site a.test {{ proxy {} }}
         site b.test {{ proxy {} }}",
        a.addr, b.addr
    ));
    let r = raw_get(&s, "http://a.test/x?y=1", "b.test").await;
    let text = r.text();
    assert!(
        text.starts_with("GET /x?y=1\n"),
        "routed to a.test, origin form to the backend: {text}"
    );
    assert!(
        text.lines().any(|l| l == "host: a.test"),
        "the backend sees the same host routing used: {text}"
    );
    assert!(
        !text.contains("b.test"),
        "the Host field was replaced: {text}"
    );
}

#[tokio::test]
async fn ambiguous_and_non_ascii_spellings() {
    let b = Backend::echo_head().await;
    let s = Sluice::start(&format!(
        "site * {{
            route /caf%C3%A9/* {{ respond 403 \"forbidden\" }}
            route /go/* {{
                rewrite /go/* \"/{{query}}/*\"
                proxy {a}
            }}
            proxy {a}
        }}",
        a = b.addr
    ));
    let r = raw_get(&s, "/admin//../secret", "a.test").await;
    assert_eq!(
        r.status, 400,
        "backends disagree on `..` after an empty segment"
    );
    for target in ["/caf%c3%a9/x", "/caf%C3%A9/./x", "//caf%C3%A9/x"] {
        assert_eq!(raw_get(&s, target, "a.test").await.status, 403, "{target}");
    }
    let r = raw_get(&s, "/go/x?..", "a.test").await;
    assert_eq!(
        r.status, 400,
        "a rewrite that climbs above the root is refused"
    );
    let r = raw_get(&s, "/go/x?a/./b", "a.test").await;
    assert!(
        r.text().starts_with("GET /a/b/x?a/./b\n"),
        "what a rewrite made is normalised before it is sent: {}",
        r.text()
    );
}
