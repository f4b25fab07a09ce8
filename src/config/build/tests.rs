use std::time::Duration;

use super::*;
use crate::config::{load_text, Report};

fn ok(text: &str) -> Config {
    match load_text("t.conf", text) {
        Ok(l) => l.config,
        Err(r) => panic!("expected the config to load, got:\n{r}"),
    }
}

/// The first error as (line, col, message, hint).
fn err(text: &str) -> (u32, u32, String, String) {
    let r: Report = match load_text("t.conf", text) {
        Ok(_) => panic!("expected an error for:\n{text}"),
        Err(r) => r,
    };
    let d = r.errors().next().expect("an error").clone();
    (
        d.span.line,
        d.span.col,
        d.message,
        d.hint.unwrap_or_default(),
    )
}

#[test]
fn a_full_site_loads() {
    let c = ok(r#"
global {
    workers 2
    trust 10.0.0.0/8 192.168.1.5
    grace 5s
}
listen 127.0.0.1:8081
listen [::1]:8082
site example.com *.example.com {
    route /api/* {
        match method GET POST
        strip /api
        proxy 127.0.0.1:3000 http://localhost:3001 unix:/run/app.sock {
            lb first
            timeout 30s
            limit 10 1s
            max_body 10M
            header_up X-Edge sluice
            header_up -Cookie
            retries 2
            keepalive 16 2s
        }
    }
    route /old { redirect 301 https://{host}/new{query} }
    respond "hello {host}"
}
site * { respond 404 }
"#);
    assert_eq!(c.global.workers, Some(2));
    assert_eq!(c.global.trust.len(), 2);
    assert_eq!(c.listeners.len(), 2);
    assert_eq!(c.sites.len(), 2);
    let site = &c.sites[0];
    assert_eq!(site.hosts[1], HostPattern::Suffix(".example.com".into()));
    assert_eq!(site.routes.len(), 3);
    assert_eq!(site.routes[0].name, "example.com /api/*");
    assert_eq!(
        site.routes[2].name, "example.com",
        "the site block's own route is named after the site"
    );
    let Some(Handler::Proxy(p)) = &site.routes[0].handler else {
        panic!("proxy handler")
    };
    assert_eq!(p.backends.len(), 3);
    assert_eq!(p.lb, Policy::First);
    assert_eq!(
        p.limit,
        Some(Limit {
            max: 10,
            wait: Duration::from_secs(1)
        })
    );
    assert_eq!(p.max_body, Some(10 << 20));
    assert_eq!(p.backends[2].target, Target::Unix("/run/app.sock".into()));
    assert_eq!(c.summary(), "2 listeners, 2 sites, 4 routes, 1 pool");
}

#[test]
fn default_listener() {
    let c = ok("site * { respond ok }");
    assert_eq!(c.listeners[0].addr.to_string(), "127.0.0.1:8080");
}

#[test]
fn unknown_directive_suggests_the_nearest() {
    let (l, c, m, h) = err("site a {\n    prxy 127.0.0.1:1\n}\n");
    assert_eq!((l, c), (2, 5));
    assert!(m.contains("unknown directive `prxy`"), "{m}");
    assert!(h.contains("did you mean `proxy`"), "{h}");
}

#[test]
fn misplaced_directive_names_its_place() {
    let (l, c, m, h) = err("site a {\n  timeout 5s\n  respond ok\n}\n");
    assert_eq!((l, c), (2, 3));
    assert!(m.contains("does not belong in a `site` block"), "{m}");
    assert!(h.contains("`proxy` block"), "{h}");
}

#[test]
fn bad_values_point_at_the_value() {
    let (l, c, m, h) = err("site a {\n  proxy 127.0.0.1:1 {\n    max_body 1.5M\n  }\n}\n");
    assert_eq!((l, c), (3, 14));
    assert!(m.contains("fraction"), "{m}");
    assert_eq!(h, "write 1536K");
    let (l, c, m, _) = err("site a {\n  proxy 127.0.0.1:1 {\n    timeout 30\n  }\n}\n");
    assert_eq!((l, c), (3, 13));
    assert!(m.contains("no unit"), "{m}");
    let (_, c, m, _) = err("site a {\n  proxy 127.0.0.1:1 { retries 5 }\n}\n");
    assert_eq!(c, 31);
    assert!(m.contains("out of range"), "{m}");
}

#[test]
fn addresses_are_checked() {
    let (_, c, m, _) = err("site a { proxy 127.0.0.1:1/api }");
    assert_eq!(c, 16);
    assert!(m.contains("no path"), "{m}");
    let (_, _, m, _) = err("site a { proxy user@host:80 }");
    assert!(m.contains("credentials"), "{m}");
    let long = format!("site a {{ proxy {}.example:80 }}", "a".repeat(250));
    let (_, _, m, _) = err(&long);
    assert!(m.contains("at most 253"), "{m}");
    // Without a port: the scheme's.
    for (addr, port) in [
        ("localhost", 80),
        ("http://app.internal", 80),
        ("https://app.internal", 443),
        ("h2c://app.internal", 80),
        ("[::1]", 80),
        ("https://[::1]", 443),
    ] {
        let c = ok(&format!("site a {{ proxy {addr} {{ tls_verify off }} }}"));
        let (_, p) = c.pools().next().unwrap();
        assert!(
            matches!(&p.backends[0].target, Target::Tcp { port: got, .. } if *got == port),
            "{addr}: {:?}",
            p.backends[0].target
        );
    }
    let (_, _, m, _) = err("site a { proxy ftp://x:21 }");
    assert!(m.contains("unknown scheme"), "{m}");
}

#[test]
fn one_scheme_class_per_pool() {
    let c = ok(
        "site a { proxy https://x:443 https://y:443 { tls_verify off; tls_server_name x.test } }",
    );
    let Some(Handler::Proxy(p)) = &c.sites[0].routes[0].handler else {
        panic!("a proxy")
    };
    assert_eq!(p.backends[1].scheme, BackendScheme::Https);
    assert!(!p.tls.verify);
    assert_eq!(p.tls.server_name.as_deref(), Some("x.test"));
    let (l, c, m, h) = err("site a { proxy h2c://x:80 x:80 }");
    assert_eq!((l, c), (1, 27));
    assert!(m.contains("speaks http") && m.contains("h2c"), "{m}");
    assert!(h.contains("one scheme"), "{h}");
    let (_, c, m, _) = err("site a { proxy https://x:443 { backup http://y:80 } }");
    assert_eq!(c, 39);
    assert!(m.contains("http://y:80"), "{m}");
    let (_, _, m, _) = err("tcp :5432 { proxy h2c://x:5432 }");
    assert!(m.contains("relays bytes"), "{m}");
    let (_, c, m, _) = err("site a { proxy https://x:443 { tls_ca /nonexistent.pem } }");
    assert_eq!(c, 39);
    assert!(m.contains("/nonexistent.pem"), "{m}");
}

#[test]
fn two_handlers_in_one_route() {
    let (l, c, m, h) = err("site a {\n  respond ok\n  redirect /x\n}\n");
    assert_eq!((l, c), (3, 3));
    assert!(m.contains("exactly one handler"), "{m}");
    assert!(h.contains("line 2"), "{h}");
}

#[test]
fn duplicates_are_errors() {
    let (l, _, m, _) = err("site a { respond ok }\nsite A { respond no }\n");
    assert_eq!(l, 2);
    assert!(m.contains("already names another site"), "{m}");
    let (l, _, m, _) = err("listen 127.0.0.1:1\nlisten 127.0.0.1:1\n");
    assert_eq!(l, 2);
    assert!(m.contains("already a listener"), "{m}");
    let (_, _, m, _) = err("site a { proxy 127.0.0.1:1 { timeout 1s; timeout 2s } }");
    assert!(m.contains("set twice"), "{m}");
    // A `tcp` listener on an HTTP listener's address, whichever line comes first.
    for (text, at) in [
        (
            "listen 127.0.0.1:7\ntcp 127.0.0.1:7 { proxy 127.0.0.1:1 }\n",
            5,
        ),
        (
            "tcp 127.0.0.1:7 { proxy 127.0.0.1:1 }\nlisten 127.0.0.1:7\n",
            8,
        ),
    ] {
        let (l, col, m, h) = err(text);
        assert_eq!((l, col), (2, at), "{text}: the repeat's address");
        assert!(m.contains("already a listener"), "{m}");
        assert!(h.contains("line 1"), "{h}");
    }
}

#[test]
fn warnings() {
    let l = load_text(
        "t.conf",
        "global { trust 0.0.0.0/0 }\nsite a {\n route /x { respond 1 }\n route /x { respond 2 }\n proxy 127.0.0.1:1 { limit off }\n}\n",
    )
    .expect("warnings do not fail a load");
    let msgs: Vec<String> = l.warnings.warnings().map(|d| d.message.clone()).collect();
    assert_eq!(msgs.len(), 3, "{msgs:?}");
    assert!(msgs.iter().any(|m| m.contains("can never match")));
    assert!(msgs.iter().any(|m| m.contains("limit off")));
    assert!(msgs.iter().any(|m| m.contains("every client")));
    // Site filters beside a `route /*`: the site block's own route (filters only) is
    // not a route the operator wrote, so nothing is said of it.
    let l = load_text(
        "t.conf",
        "site a {\n allow all\n route /x/* { respond 1 }\n route /* { respond 2 }\n}\n",
    )
    .expect("loads");
    let msgs: Vec<String> = l.warnings.warnings().map(|d| d.message.clone()).collect();
    assert!(msgs.is_empty(), "{msgs:?}");
}

#[test]
fn templates_and_patterns() {
    let c = ok(
        "site a { route /old/* { rewrite /old/* /new{path} } redirect 301 https://{host}{uri} }",
    );
    let Some(Handler::Redirect { status, target }) = &c.sites[0].routes[1].handler else {
        panic!()
    };
    assert_eq!(status.as_u16(), 301);
    assert_eq!(
        target.parts[1],
        crate::config::template::TemplatePart::Value(crate::config::template::Placeholder::Host)
    );
    let (_, _, m, _) = err("site a { redirect https://{hots}/ }");
    assert!(m.contains("unknown placeholder"), "{m}");
    let (_, _, m, _) = err("site a { route /a*b { respond 1 } }");
    assert!(m.contains("trailing"), "{m}");
}

#[test]
fn prefix_patterns_stop_at_segments() {
    let p = PathPattern::Prefix("/api".into());
    assert!(p.matches("/api"));
    assert!(p.matches("/api/"));
    assert!(p.matches("/api/x/y"));
    assert!(!p.matches("/apix"));
    assert!(PathPattern::Prefix(String::new()).matches("/anything"));
}

#[test]
fn safety_and_resolver_load() {
    let c = ok("global {\n resolver 10.0.0.2 [::1]:5353\n safety { default strict; allow_private 10.20.0.0/16; block 10.20.9.0/24 }\n}\nsite a { proxy app.example:80 { safety off } }\nsite b { proxy 10.20.1.1:80 }\n");
    assert_eq!(
        c.global.resolver,
        vec![
            "10.0.0.2:53".parse().unwrap(),
            "[::1]:5353".parse().unwrap()
        ]
    );
    assert!(c.global.safety.strict);
    assert_eq!(c.global.safety.block.len(), 1);
    let pools: Vec<_> = c.pools().map(|(_, p)| p).collect();
    assert!(!c.is_strict(pools[0]));
    assert!(c.is_strict(pools[1]));
    assert!(
        ok("global { safety strict }\nsite a { proxy 8.8.8.8:80 }")
            .global
            .safety
            .strict
    );
}

#[test]
fn strict_pools_refuse_unsafe_literals_where_written() {
    for (addr, what) in [
        ("10.0.0.5:80", "a private address"),
        ("0x7f.1:80", "a loopback address"),
        ("2130706433:80", "a loopback address"),
        ("[::ffff:8.8.8.8]:80", "an IPv4-mapped IPv6 address"),
        ("169.254.169.254:80", "a cloud metadata address"),
        ("[fd00:ec2::254]:443", "a cloud metadata address"),
        ("100.64.1.1:80", "a shared (CGNAT) address"),
        ("0.0.0.0:80", "an unspecified address"),
        ("10.20.9.1:80", "a blocked address"),
    ] {
        let text = format!(
            "global {{ safety {{ default strict; allow_private 10.20.0.0/16; block 10.20.9.0/24 }} }}\nsite a {{ proxy 8.8.8.8:80 {addr} }}\n"
        );
        let (l, c, m, h) = err(&text);
        assert_eq!((l, c), (2, 27), "{addr}: {m}");
        assert!(m.contains(what) && m.contains(addr), "{addr}: {m}");
        assert!(!h.is_empty());
    }
    // Allowed, public, a name, a socket, or a pool with safety off: loads.
    ok("global { safety { default strict; allow_private 10.0.0.0/8 } }\nsite a { proxy 10.1.1.1:80 1.1.1.1:443 app.example:80 unix:/run/a.sock }");
    ok("global { safety strict }\nsite a { proxy 127.0.0.1:80 { safety off } }");
    // The pool's own `safety strict` with the global default off.
    let (_, _, m, _) = err("site a { proxy 192.168.1.1:80 { safety strict } }");
    assert!(m.contains("a private address"), "{m}");
    // A strict pool pointed at sluice's own listener.
    let (_, _, m, _) = err("listen 127.0.0.1:8080\nglobal { safety { default strict; allow_private 127.0.0.0/8 } }\nsite a { proxy 127.0.0.1:8080 }");
    assert!(m.contains("one of sluice's own listeners"), "{m}");
}

#[test]
fn safety_and_resolver_mistakes() {
    let (_, c, m, _) = err("global { safety maybe }");
    assert_eq!(c, 17);
    assert!(m.contains("`strict` or `off`"), "{m}");
    let (_, _, m, h) = err("global { resolver dns.example }");
    assert!(m.contains("DNS server's IP address"), "{m}");
    assert!(h.contains("not by name"), "{h}");
    let (_, _, m, _) = err("global { safety { allow_private 10.0.0.0/33 } }");
    assert!(m.contains("CIDR"), "{m}");
    let (_, _, m, _) = err("global { safety { allow 10.0.0.0/8 } }");
    assert!(m.contains("allow"), "{m}");
    let (_, _, m, _) = err("site a { proxy 1.1.1.1:80 { safety on } }");
    assert!(m.contains("`strict` or `off`"), "{m}");
}

#[test]
fn a_branch_follows_its_filter_directly() {
    let (l, c, m, _) = err("site a {\n allow 10.0.0.0/8\n route /x { respond ok }\n on denied reject 404\n respond ok\n}\n");
    assert_eq!((l, c), (4, 2));
    assert!(m.contains("follows the filter"), "{m}");
    ok("site a {\n allow 10.0.0.0/8\n on denied reject 404\n route /x { respond ok }\n respond ok\n}\n");
}

#[test]
fn resolver_spellings_and_cors_wildcards() {
    let c = ok("global { resolver 2001:db8::53 [2001:db8::54] [2001:db8::55]:5353 }\nsite a { respond ok }");
    assert_eq!(c.global.resolver.len(), 3);
    assert_eq!(c.global.resolver[1].port(), 53);
    let (_, _, m, h) = err("site a { cors { origins http://*.example.com }\n respond ok }");
    assert!(m.contains("exact origin"), "{m}");
    assert!(h.contains("without") || h.contains("no scheme"), "{h}");
}

/// Every `on|off` switch names itself in its usage, never another directive's.
#[test]
fn each_switch_names_its_own_directive() {
    let cases = [
        (
            "site * { proxy https://127.0.0.1:1 { tls_verify } }",
            "tls_verify on|off",
        ),
        (
            "site * { cors { origins https://a.example; credentials } \n respond ok }",
            "credentials on|off",
        ),
        ("site * { files /tmp { browse } }", "browse on|off"),
        (
            "site * { proxy 127.0.0.1:1 { compress } }",
            "compress on|off",
        ),
    ];
    for (text, usage) in cases {
        let (_, _, message, hint) = err(text);
        let said = format!("{message} {hint}");
        assert!(said.contains(usage), "{text}: {said}");
    }
}

#[test]
fn a_fleet_block_reads_and_checks_its_names() {
    let site = "listen 127.0.0.1:8080\nsite * { respond ok }\n";
    let c = ok(&format!(
        "global {{ fleet rediss://:pw@redis.internal:6380/0 {{ name edge-eu-1; channel prod }} }}\n{site}"
    ));
    let f = c.global.fleet.expect("fleet");
    assert_eq!(f.url, "rediss://:pw@redis.internal:6380/0");
    assert_eq!((f.name.as_str(), f.channel.as_str()), ("edge-eu-1", "prod"));
    let c = ok(&format!(
        "global {{ fleet redis://127.0.0.1:6379 }}\n{site}"
    ));
    let f = c.global.fleet.expect("fleet");
    assert_eq!(f.channel, "sluice");
    assert!(!f.name.is_empty());

    let (line, col, msg, _) = err(&format!("global {{\n fleet http://x:1\n}}\n{site}"));
    assert_eq!((line, col), (2, 8), "{msg}");
    assert!(msg.contains("a Redis address"), "{msg}");
    let (line, col, msg, hint) = err(&format!(
        "global {{\n fleet redis://x:1 {{ name a:b }}\n}}\n{site}"
    ));
    assert_eq!((line, col), (2, 27), "{msg}");
    assert!(hint.contains("Redis keys"), "{hint}");
    let (_, _, msg, _) = err(&format!(
        "global {{\n fleet redis://x:1 {{ nmae a }}\n}}\n{site}"
    ));
    assert!(msg.contains("nmae"), "{msg}");
}

#[test]
fn discovered_pools_read_and_refuse_what_dns_decides() {
    let c = ok("listen :80\nsite * { proxy h2c+srv:_grpc._tcp.api.consul. }");
    let Some(Handler::Proxy(p)) = &c.sites[0].routes[0].handler else {
        panic!("a proxy");
    };
    let d = p.discover.as_ref().expect("discovered");
    assert_eq!(d.source, "h2c+srv:_grpc._tcp.api.consul.");
    assert_eq!(
        d.kind,
        DiscoverKind::Srv {
            name: "_grpc._tcp.api.consul".into()
        }
    );
    assert_eq!(d.scheme, BackendScheme::H2c);
    assert_eq!(
        p.lb,
        Policy::WeightedRoundRobin,
        "srv: defaults to weighted"
    );
    // Before its first answer the pool has no address, and still its scheme.
    let mut empty = (**p).clone();
    empty.backends.clear();
    assert_eq!(empty.scheme(), BackendScheme::H2c);
    let c = ok("listen :80\nsite * { proxy srv:_http._tcp.api { lb least_conn } }");
    let Some(Handler::Proxy(p)) = &c.sites[0].routes[0].handler else {
        panic!("a proxy");
    };
    assert_eq!(p.lb, Policy::LeastConn, "a written lb stays");
    let c = ok("listen :80\nsite * { proxy https://pods.default.svc:8443 { discover } }");
    let Some(Handler::Proxy(p)) = &c.sites[0].routes[0].handler else {
        panic!("a proxy");
    };
    let d = p.discover.as_ref().expect("discovered");
    assert_eq!(
        d.kind,
        DiscoverKind::Addresses {
            host: "pods.default.svc".into(),
            port: 8443
        }
    );

    for (text, want) in [
        ("proxy srv:api.internal", "srv:_SERVICE._PROTO.NAME"),
        ("proxy srv:_http._tcp.a x:80", "one source"),
        (
            "proxy srv:_http._tcp.a { backup b:80 }",
            "takes no `backup`",
        ),
        ("proxy srv:_http._tcp.a { weights 1 }", "takes no `weights`"),
        ("proxy 10.0.0.1:80 { discover }", "not a name to discover"),
        ("proxy a:80 b:80 { discover }", "a pool of one name"),
        ("proxy a:80 { discover on }", "discover"),
    ] {
        let (_, _, msg, hint) = err(&format!("listen :80\nsite * {{ {text} }}"));
        assert!(
            msg.contains(want) || hint.contains(want),
            "{text}: {msg} ({hint})"
        );
    }
}

#[test]
fn on_demand_tls_needs_ask_and_names_not_known_in_advance() {
    let c = ok("listen :443 tls\nsite *.shops.example {\n tls on_demand { ask http://127.0.0.1:9/ok }\n respond ok\n}");
    let t = c.sites[0].tls.as_ref().expect("tls");
    assert!(matches!(&t.source, CertSource::OnDemand { ask } if ask == "http://127.0.0.1:9/ok"));
    for (text, want) in [
        ("site * { tls on_demand\n respond ok }", "needs `ask URL`"),
        (
            "site * { tls on_demand { ask ftp://x }\n respond ok }",
            "an http:// or https:// URL",
        ),
        (
            "site * { tls on_demand { ask http://x; nope 1 }\n respond ok }",
            "not an on_demand setting",
        ),
        (
            "site a.example * { tls on_demand { ask http://x }\n respond ok }",
            "names not known in advance",
        ),
    ] {
        let (_, _, msg, hint) = err(&format!("listen :443 tls\n{text}"));
        assert!(
            msg.contains(want) || hint.contains(want),
            "{text}: {msg} ({hint})"
        );
    }
    let (_, _, msg, _) = err("listen :80\nsite * { tls on_demand { ask http://x }\n respond ok }");
    assert!(msg.contains("no `tls` listener"), "{msg}");
}

#[test]
fn a_bare_hsts_age_suggests_days() {
    let (line, col, msg, hint) = err("listen :80\nsite * {\n hsts 365\n respond ok\n}");
    assert_eq!((line, col), (3, 7), "{msg}");
    assert!(msg.contains("a duration with its unit"), "{msg}");
    assert!(hint.contains("hsts 365d (days)"), "{hint}");
    ok("listen :80\nsite * {\n hsts 365d\n respond ok\n}");
}

#[test]
fn a_basic_auth_realm_is_one_plain_name() {
    let h = "$2y$05$abcdefghijklmnopqrstuu5gMsmlPtw0.NlSnGTxWxKsbzdBeXAa6";
    let text = format!(
        r#"listen :80
site * {{ basic_auth {{ realm "Staff only"; a "{h}" }}
 respond ok }}"#
    );
    let c = ok(&text);
    let realm = c.sites[0].filters.iter().find_map(|f| match &f.filter {
        Filter::BasicAuth { realm, .. } => Some(realm.clone()),
        _ => None,
    });
    assert_eq!(realm.as_deref(), Some("Staff only"));
    for bad in ["realm", "realm a b", r#"realm "say \"hi\"""#] {
        let text =
            format!("listen :80\nsite * {{ basic_auth {{ {bad}; a \"{h}\" }}\n respond ok }}");
        let (_, _, msg, _) = err(&text);
        assert!(msg.contains("realm"), "{bad}: {msg}");
    }
}

#[test]
fn dns_update_chooses_dns01_alone_and_keeps_a_written_challenge() {
    let dir = std::env::temp_dir().join(format!("sluice-dns-key-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("acme.key");
    std::fs::write(
        &key,
        "key \"acme\" { algorithm hmac-sha384; secret \"c2x1aWNlLXRlc3Qtc2VjcmV0LTMyLWJ5dGVzLSEhIQ==\"; };",
    )
    .unwrap();
    let block = format!(
        "dns_update 192.0.2.53:5353 {{ zone Example.Com.; key_file {} }}",
        key.display()
    );
    let sites =
        "listen :8443 tls\nsite *.app.example.com app.example.com { tls auto\n respond ok }\n";
    let c = ok(&format!("global {{ acme {{ {block} }} }}\n{sites}"));
    let a = &c.global.acme;
    assert_eq!((a.http01, a.tls_alpn01, a.dns01), (true, true, true));
    let u = a.dns_update.as_ref().expect("dns_update");
    assert_eq!(u.server, "192.0.2.53:5353".parse().unwrap());
    assert_eq!(
        (u.zone.as_str(), u.key_name.as_str()),
        ("example.com", "acme")
    );
    assert_eq!(u.algorithm, TsigAlgorithm::HmacSha384);
    assert!(
        !format!("{u:?}").contains("c2x1"),
        "the secret stays out of Debug"
    );
    let Some(CertSource::Auto { names }) = c.sites[0].tls.as_ref().map(|t| &t.source) else {
        panic!("tls auto");
    };
    assert_eq!(names, &["*.app.example.com", "app.example.com"]);
    let c = ok(&format!(
        "global {{ acme {{ challenge tls-alpn-01\n {block} }} }}\n{sites}"
    ));
    let a = &c.global.acme;
    assert_eq!((a.http01, a.tls_alpn01, a.dns01), (false, true, false));
    // With only dns-01, a plain name outside the zone is refused at its word.
    let (line, col, msg, _) = err(&format!(
        "global {{ acme {{ challenge dns-01\n{block} }} }}\nlisten :8443 tls\nsite a.example.net {{ tls auto\n respond ok }}\n"
    ));
    assert_eq!((line, col), (4, 6), "{msg}");
    assert!(msg.contains("outside the zone example.com"), "{msg}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn tracing_otlp_reads_its_block_and_checks_each_value() {
    let site = "listen 127.0.0.1:8080\nsite * { respond ok }\n";
    let c = ok(&format!(
        "global {{ tracing otlp https://otel.internal:4318/v1/traces {{ sample 0.25; service edge; headers {{ x-api-key k1 }} }} }}\n{site}"
    ));
    let o = c.global.otlp.expect("otlp");
    assert!(c.global.tracing, "exporting spans sends traceparent too");
    assert_eq!(o.url.to_string(), "https://otel.internal:4318/v1/traces");
    assert_eq!((o.sample_ppm, o.service.as_str()), (250_000, "edge"));
    assert_eq!(o.headers.len(), 1);
    let c = ok(&format!("global {{ tracing on }}\n{site}"));
    assert!(c.global.tracing && c.global.otlp.is_none());
    for (text, want, col) in [
        (
            "tracing otlp ftp://x/v1/traces",
            "the collector's OTLP/HTTP URL",
            15,
        ),
        (
            "tracing otlp http://x:4318 { sample 2 }",
            "a share of traces",
            38,
        ),
        (
            "tracing otlp http://x:4318 { batch 5 }",
            "unknown `batch`",
            31,
        ),
        ("tracing maybe", "`on` or `off`", 10),
    ] {
        let (line, c, msg, _) = err(&format!("global {{\n {text}\n}}\n{site}"));
        assert!(msg.contains(want), "{text}: {msg}");
        assert_eq!((line, c), (2, col), "{text}: {msg}");
    }
}
