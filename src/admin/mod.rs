//! What sluice shows an operator: the admin API on its own listener (never a site
//! listener; `admin ADDR`, default 127.0.0.1:2019, `admin off`), with `GET /status`,
//! `GET /metrics`, `POST /reload`, `POST /upgrade`, `GET /revisions`, `POST /rollback/N`,
//! `POST /maintenance`, `POST /origin-test` and `GET /origin-test/ID`, and the
//! dashboard at `GET /`; and the log lines (`log`).
//!
//! Every request must name the API by its own address or a loopback name (`421`
//! otherwise), carry the bearer token when one is configured (`401`; the dashboard
//! page itself excepted, which asks for it), and every POST must be JSON (`415`): a
//! web page cannot then drive it across sites. The API reads the live generation and the revisions; reloads and rollbacks are
//! commands to the server's lifecycle, which alone changes what runs, so a reload by
//! API, signal or rollback follows one path. Nothing here is on the request path.

pub(crate) mod log;
pub(crate) mod metrics;
pub(crate) mod origin_test;
pub(crate) mod revisions;
pub(crate) mod status;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};

use self::revisions::Revisions;
use crate::runtime::Live;

const DASHBOARD: &str = include_str!("dashboard.html");

/// Why a reload or rollback was refused.
#[derive(Debug)]
pub(crate) enum Refused {
    /// The config did not load: the rendered errors (`FILE:LINE:COL: …`).
    Invalid(String),
    /// No such revision is kept.
    NoRevision(u64),
}

/// What the API asks of the lifecycle; the answer is the new revision.
pub(crate) enum Command {
    Reload(oneshot::Sender<Result<u64, Refused>>),
    Rollback(u64, oneshot::Sender<Result<u64, Refused>>),
    /// Start the binary again and hand it the listeners: the new PID, or why not.
    Upgrade(oneshot::Sender<Result<u32, String>>),
    /// Apply a fleet revision (the fleet's member asks; `true`: an explicit rollback,
    /// not judged by its files' signing times).
    Fleet(
        Box<crate::config::FleetRevision>,
        bool,
        oneshot::Sender<Result<u64, Refused>>,
    ),
}

/// The admin API's bearer token, replaced by a reload that changes it.
pub(crate) type Token = Arc<arc_swap::ArcSwapOption<crate::config::AdminToken>>;

/// What the API handlers share.
#[derive(Clone)]
pub(crate) struct Api {
    pub live: Arc<Live>,
    pub revisions: Arc<Mutex<Revisions>>,
    pub commands: mpsc::Sender<Command>,
    pub token: Token,
    pub origin_tests: Arc<origin_test::OriginTests>,
    /// Connections open to the API now: a process that upgraded waits for them (the
    /// answer to its own `POST /upgrade` among them) before it exits.
    pub open: Arc<std::sync::atomic::AtomicUsize>,
}

/// Serves the admin API on `listener` until the task is dropped.
pub(crate) async fn serve(listener: TcpListener, api: Api) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            continue;
        };
        let api = api.clone();
        let Ok(local) = stream.local_addr() else {
            continue;
        };
        let open = Open::take(&api.open);
        tokio::spawn(async move {
            let _open = open;
            let svc = service_fn(move |req| {
                let api = api.clone();
                async move { Ok::<_, Infallible>(checked(&api, local, req).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// One open API connection, counted until dropped.
struct Open(Arc<std::sync::atomic::AtomicUsize>);

impl Open {
    fn take(n: &Arc<std::sync::atomic::AtomicUsize>) -> Open {
        n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Open(n.clone())
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The checks before any endpoint: a browser can be made to send requests to the admin
/// API from any page (a form POST, or a name rebound to 127.0.0.1), so a request must
/// name the API by its own address or a loopback name (else `421`), and a POST must be
/// JSON (else `415`), which a cross-site form cannot send without the API's consent.
async fn checked(api: &Api, local: SocketAddr, req: Request<Incoming>) -> Response<Full<Bytes>> {
    if !host_is_ours(req.headers().get(header::HOST), local) {
        return json_reply(
            StatusCode::MISDIRECTED_REQUEST,
            &json!({"error": "Host must be the admin API's own address or localhost"}),
        );
    }
    let page = req.method() == Method::GET && req.uri().path() == "/";
    if !page && !authorized(&api.token, req.headers()) {
        let mut r = json_reply(
            StatusCode::UNAUTHORIZED,
            &json!({"error": "this admin API needs Authorization: Bearer TOKEN"}),
        );
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            http::HeaderValue::from_static("Bearer realm=\"sluice admin\""),
        );
        return r;
    }
    if req.method() == Method::POST && !is_json(req.headers()) {
        return json_reply(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            &json!({"error": "a POST needs Content-Type: application/json"}),
        );
    }
    route(api, req).await
}

/// `Host` is the listener's own IP:PORT, or `localhost`, `127.0.0.1` or `[::1]` with
/// its port or none.
fn host_is_ours(host: Option<&http::HeaderValue>, local: SocketAddr) -> bool {
    let Some(host) = host.and_then(|h| h.to_str().ok()) else {
        return false;
    };
    let host = host.to_ascii_lowercase();
    // A dual-stack listener sees an IPv4 client's address as `::ffff:a.b.c.d`.
    let same = |a: SocketAddr| {
        a.ip().to_canonical() == local.ip().to_canonical() && a.port() == local.port()
    };
    if host.parse::<SocketAddr>().is_ok_and(same) {
        return true;
    }
    let port = local.port().to_string();
    let (name, p) = match host.rsplit_once(':') {
        Some((n, p)) if !n.ends_with(':') && (n.starts_with('[') || !n.contains(':')) => {
            (n, Some(p))
        }
        _ => (host.as_str(), None),
    };
    matches!(name, "localhost" | "127.0.0.1" | "[::1]") && p.is_none_or(|p| p == port)
}

/// No token configured, or `Authorization: Bearer TOKEN` (the scheme in any case)
/// with the token: compared by digest, in time that depends on neither where a guess
/// differs nor its length.
fn authorized(token: &Token, h: &http::HeaderMap) -> bool {
    let Some(want) = token.load_full() else {
        return true;
    };
    let value = h
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes())
        .unwrap_or(b"");
    let given = match value.split_at_checked(7) {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case(b"bearer ") => rest,
        _ => b"",
    };
    same_secret(given, want.0.as_bytes())
}

/// Whether `a` is `b`: their SHA-256 digests compared in constant time.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    use ring::digest::{digest, SHA256};
    let (da, db) = (digest(&SHA256, a), digest(&SHA256, b));
    da.as_ref()
        .iter()
        .zip(db.as_ref())
        .fold(0u8, |d, (x, y)| d | (x ^ y))
        == 0
}

fn is_json(h: &http::HeaderMap) -> bool {
    h.get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
}

async fn route(api: &Api, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let path = req.uri().path();
    match (req.method(), path) {
        (&Method::GET, "/") => reply(StatusCode::OK, "text/html; charset=utf-8", DASHBOARD.into()),
        (&Method::GET, "/status") => {
            let (revision, listeners, last_reload, fleet) = {
                let r = api.revisions.lock().unwrap_or_else(|e| e.into_inner());
                let fleet = r.fleet.clone();
                (
                    r.current(),
                    r.listeners.clone(),
                    r.last_reload.clone(),
                    fleet,
                )
            };
            let mut body = status::status(&api.live.load(), revision, &listeners);
            status::process(&mut body, last_reload.as_ref());
            if let Some(f) = fleet {
                body["fleet"] = json!({
                    "revision": f.revision,
                    "members": f.members,
                    "result": if f.result.is_empty() { "ok" } else { &f.result },
                });
            }
            json_reply(StatusCode::OK, &body)
        }
        (&Method::GET, "/metrics") => reply(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            metrics::render(&api.live.load()),
        ),
        (&Method::GET, "/revisions") => {
            let r = api.revisions.lock().unwrap_or_else(|e| e.into_inner());
            let list: Vec<_> = r
                .iter()
                .map(|rev| {
                    json!({
                        "revision": rev.number,
                        "loaded_at": log::rfc3339(rev.loaded_at),
                        "origin": rev.origin.as_str(),
                        "signed_by": rev.signed_by,
                    })
                })
                .collect();
            json_reply(
                StatusCode::OK,
                &json!({"current": r.current(), "revisions": list}),
            )
        }
        (&Method::POST, "/reload") => command(api, Command::Reload).await,
        (&Method::POST, "/upgrade") => upgrade(api).await,
        (&Method::POST, "/maintenance") => maintenance(api, req).await,
        (&Method::POST, "/purge") => purge(api, req).await,
        (&Method::POST, "/demo") => demo_switch(req).await,
        (&Method::POST, "/origin-test") => origin_test(api, req).await,
        (&Method::GET, p) if p.starts_with("/origin-test/") => {
            match api.origin_tests.get(&p["/origin-test/".len()..]) {
                Some(v) => json_reply(StatusCode::OK, &v),
                None => json_reply(StatusCode::NOT_FOUND, &json!({"error": "no such test"})),
            }
        }
        (&Method::POST, p) if p.starts_with("/rollback/") => {
            match p["/rollback/".len()..].parse::<u64>() {
                Ok(n) => command(api, |tx| Command::Rollback(n, tx)).await,
                Err(_) => json_reply(StatusCode::NOT_FOUND, &json!({"error": "no such revision"})),
            }
        }
        (
            _,
            "/" | "/status" | "/metrics" | "/revisions" | "/reload" | "/upgrade" | "/maintenance"
            | "/purge",
        ) => json_reply(
            StatusCode::METHOD_NOT_ALLOWED,
            &json!({"error": "method not allowed"}),
        ),
        _ => json_reply(StatusCode::NOT_FOUND, &json!({"error": "not found"})),
    }
}

/// A POST's JSON body (at most 64 KiB); `Err`: the 400 to answer.
async fn json_body(req: Request<Incoming>) -> Result<serde_json::Value, Response<Full<Bytes>>> {
    use http_body_util::BodyExt as _;
    let bad = |why: String| json_reply(StatusCode::BAD_REQUEST, &json!({ "error": why }));
    let Ok(body) = http_body_util::Limited::new(req.into_body(), 64 * 1024)
        .collect()
        .await
    else {
        return Err(bad("the body could not be read (at most 64 KiB)".into()));
    };
    serde_json::from_slice(&body.to_bytes()).map_err(|e| bad(format!("the body is not JSON: {e}")))
}

/// `POST /origin-test {"pool": NAME, "role": "primary|backup"}`: `202 {"id"}`.
async fn origin_test(api: &Api, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let asked = match json_body(req).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let bad = |why: &str| json_reply(StatusCode::BAD_REQUEST, &json!({ "error": why }));
    let Some(name) = asked["pool"].as_str() else {
        return bad(r#"write {"pool": "SITE ROUTE", "role": "primary|backup"}"#);
    };
    let role = match asked["role"].as_str().unwrap_or("primary") {
        "primary" => crate::upstream::Role::Primary,
        "backup" => crate::upstream::Role::Backup,
        _ => return bad(r#""role" is "primary" or "backup""#),
    };
    let gen = api.live.load();
    let Some(pool) = gen.sites.pools().find(|p| p.name() == name).cloned() else {
        return json_reply(
            StatusCode::NOT_FOUND,
            &json!({"error": format!("no pool is named {name}")}),
        );
    };
    if !pool.has_role(role) {
        return bad(&format!("pool {name} has no {} peer", role.as_str()));
    }
    match api.origin_tests.start(pool, role) {
        Ok(id) => json_reply(StatusCode::ACCEPTED, &json!({ "id": id })),
        Err(origin_test::Refused::Busy(wait)) => {
            let mut r = json_reply(
                StatusCode::TOO_MANY_REQUESTS,
                &json!({"error": format!("pool {name}: one test at a time, at most 6 a minute")}),
            );
            if let Ok(v) = http::HeaderValue::from_str(&wait.to_string()) {
                r.headers_mut().insert(header::RETRY_AFTER, v);
            }
            r
        }
    }
}

/// `POST /maintenance {"site": HOST, "on": bool}`: switches a site's maintenance on
/// or off until the next reload (any of the site's names, as written, finds it).
async fn maintenance(api: &Api, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let bad = |why: &str| json_reply(StatusCode::BAD_REQUEST, &json!({ "error": why }));
    let asked = match json_body(req).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let (Some(host), Some(on)) = (asked["site"].as_str(), asked["on"].as_bool()) else {
        return bad(r#"write {"site": "HOST", "on": true|false}"#);
    };
    let gen = api.live.load();
    let host = host.to_ascii_lowercase();
    let Some(site) = gen.sites.list.iter().find(|s| s.hosts.contains(&host)) else {
        return json_reply(
            StatusCode::NOT_FOUND,
            &json!({"error": format!("no site is named {host}")}),
        );
    };
    site.maintenance.set(on);
    tracing::info!(
        "sluice: site {}: maintenance switched {} through the admin API (until the next reload)",
        site.name,
        if on { "on" } else { "off" }
    );
    json_reply(StatusCode::OK, &json!({"site": host, "on": on}))
}

/// `POST /purge {"key": K}`, `{"prefix": P}` or `{"all": true}`: `200 {"purged": N}`,
/// N the stored objects (variants included) removed here; published to the other
/// instances when a cache has a `purge_store`.
/// `POST /demo {"backend": "A", "up": false}`: stops or starts a demo backend
/// (`sluice demo` only: elsewhere there is none, `404`).
async fn demo_switch(req: Request<Incoming>) -> Response<Full<Bytes>> {
    let asked = match json_body(req).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let (Some(name), Some(up)) = (asked["backend"].as_str(), asked["up"].as_bool()) else {
        return json_reply(
            StatusCode::BAD_REQUEST,
            &json!({"error": r#"write {"backend": "A", "up": false}"#}),
        );
    };
    if crate::demo::switch(name, up) {
        json_reply(StatusCode::OK, &json!({"backend": name, "up": up}))
    } else {
        json_reply(
            StatusCode::NOT_FOUND,
            &json!({"error": "no such demo backend"}),
        )
    }
}

async fn purge(api: &Api, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let asked = match json_body(req).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let what = match (
        asked["key"].as_str(),
        asked["prefix"].as_str(),
        asked["all"].as_bool(),
    ) {
        (Some(k), None, None) => crate::cache::Purge::Key(k.to_string()),
        (None, Some(p), None) => crate::cache::Purge::Prefix(p.to_string()),
        (None, None, Some(true)) => crate::cache::Purge::All,
        _ => {
            return json_reply(
                StatusCode::BAD_REQUEST,
                &json!({"error": r#"write {"key": "GET app.test /x"}, {"prefix": "app.test /img/"} or {"all": true}"#}),
            )
        }
    };
    let gen = api.live.load();
    let purged = crate::cache::purge(gen.kept.stores.values(), &what);
    tracing::info!("sluice: cache: purged {purged} objects ({what}) through the admin API");
    crate::cache::publish(gen.kept.publishers.values(), &what);
    json_reply(StatusCode::OK, &json!({ "purged": purged }))
}

async fn command(
    api: &Api,
    make: impl FnOnce(oneshot::Sender<Result<u64, Refused>>) -> Command,
) -> Response<Full<Bytes>> {
    let (tx, rx) = oneshot::channel();
    if api.commands.send(make(tx)).await.is_err() {
        return json_reply(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"error": "sluice is shutting down"}),
        );
    }
    match rx.await {
        Ok(Ok(revision)) => json_reply(StatusCode::OK, &json!({"revision": revision})),
        Ok(Err(Refused::Invalid(error))) => {
            json_reply(StatusCode::UNPROCESSABLE_ENTITY, &json!({"error": error}))
        }
        Ok(Err(Refused::NoRevision(n))) => json_reply(
            StatusCode::NOT_FOUND,
            &json!({"error": format!("revision {n} is not kept")}),
        ),
        Err(_) => json_reply(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"error": "sluice is shutting down"}),
        ),
    }
}

/// `POST /upgrade`: answered once the new process is ready (`200 {"pid"}`) or has
/// failed (`500 {"error"}`; this process serves on).
async fn upgrade(api: &Api) -> Response<Full<Bytes>> {
    let (tx, rx) = oneshot::channel();
    let gone = || {
        json_reply(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"error": "sluice is shutting down"}),
        )
    };
    if api.commands.send(Command::Upgrade(tx)).await.is_err() {
        return gone();
    }
    match rx.await {
        Ok(Ok(pid)) => json_reply(StatusCode::OK, &json!({ "pid": pid })),
        Ok(Err(error)) => json_reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            &json!({ "error": error }),
        ),
        Err(_) => gone(),
    }
}

fn json_reply(status: StatusCode, v: &serde_json::Value) -> Response<Full<Bytes>> {
    reply(status, "application/json", format!("{v}\n"))
}

fn reply(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    r.headers_mut().insert(
        header::CACHE_CONTROL,
        http::HeaderValue::from_static("no-store"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_that_name_the_admin_api() {
        let local: SocketAddr = "127.0.0.1:2019".parse().unwrap();
        let ok = |h: &str| host_is_ours(Some(&http::HeaderValue::from_str(h).unwrap()), local);
        for h in [
            "127.0.0.1:2019",
            "localhost",
            "LOCALHOST:2019",
            "127.0.0.1",
            "[::1]:2019",
            "[::1]",
        ] {
            assert!(ok(h), "{h}");
        }
        for h in [
            "evil.example",
            "evil.example:2019",
            "localhost:80",
            "127.0.0.2:2019",
            "localhost.evil.example",
            "",
            "[::1]:80",
        ] {
            assert!(!ok(h), "{h}");
        }
        assert!(!host_is_ours(None, local));
        let v6: SocketAddr = "[::1]:9000".parse().unwrap();
        assert!(host_is_ours(
            Some(&http::HeaderValue::from_static("[::1]:9000")),
            v6
        ));
        let mapped: SocketAddr = "[::ffff:10.0.0.5]:2019".parse().unwrap();
        assert!(
            host_is_ours(
                Some(&http::HeaderValue::from_static("10.0.0.5:2019")),
                mapped
            ),
            "an IPv4 client of a dual-stack listener"
        );
    }
}
