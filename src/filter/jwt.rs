//! `jwt { … }` (DESIGN §18.10): a bearer token verified at the edge, so the backend
//! receives a verified identity. Results for branches: `authorized`, `unauthorized`.
//!
//! The algorithm is pinned before anything is verified: it must be one the config
//! lists, and the key must be of its kind (and name it, when the key names one), so a
//! token cannot pick `none`, or HMAC over a public key. Keys come from a secret file,
//! a JWKS file (read at load) or a JWKS URL: fetched at start, every `refresh`
//! (5 minutes by default) after, and again when a token names a key the set lacks (a rotation),
//! at most once a minute; a fetch that fails keeps the last good set and is logged
//! once until one succeeds. The set of a URL outlives reloads (`runtime::carry`).
//!
//! A token that verified is remembered for up to [`REMEMBER`] (never past its `exp`),
//! tied to the key set it verified against: a client sending it on every request pays
//! a lookup (the token's SipHash, keyed per process, then the whole token compared),
//! not a signature check, and a new key set forgets it. Only tokens up to
//! [`REMEMBER_LEN`] are kept, so the memory this takes stays bounded.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use jsonwebtoken::DecodingKey;
use serde_json::{Map, Value};

use super::{Cx, Filter, Step, Verified};
use crate::body::Body;
use crate::config::{JwtConfig, JwtKeys, TokenSource};
use crate::jose::{self, Algorithm, KeySet, Refusal, Token};
use crate::stats::Meter;

/// The longest token looked at: past it, `401`.
pub(crate) const MAX_TOKEN: usize = 16 * 1024;
/// After a failed fetch, the next try (or sooner, at the `refresh` period).
const RETRY: Duration = Duration::from_secs(30);
/// The fewest milliseconds between two fetches for an unknown `kid`.
const KID_FETCH_GAP: u64 = 60_000;
/// A JWKS fetch's whole exchange.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a verified token is remembered, at most.
const REMEMBER: u64 = 60_000;
/// The longest token remembered (longer ones are verified each time).
const REMEMBER_LEN: usize = 4096;
/// The most tokens remembered at once.
const REMEMBERED: usize = 4096;

/// `sluice_jwt_results_total`'s `result` label, by [`Outcome::index`].
pub(crate) const RESULTS: [&str; 11] = [
    "ok",
    "missing",
    "too_large",
    "malformed",
    "algorithm",
    "unknown_key",
    "bad_signature",
    "expired",
    "not_yet_valid",
    "issuer",
    "audience",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Ok,
    Missing,
    TooLarge,
    Refused(Refusal),
}

impl Outcome {
    fn index(self) -> usize {
        match self {
            Outcome::Ok => 0,
            Outcome::Missing => 1,
            Outcome::TooLarge => 2,
            Outcome::Refused(r) => match r {
                Refusal::Malformed => 3,
                Refusal::Algorithm => 4,
                Refusal::UnknownKey => 5,
                Refusal::Signature => 6,
                Refusal::Expired => 7,
                Refusal::NotYetValid => 8,
                Refusal::Issuer => 9,
                Refusal::Audience => 10,
            },
        }
    }
}

/// The `sub` of a verified token, marked on the response for the access log.
#[derive(Clone)]
pub(crate) struct Subject(pub Arc<str>);

pub(crate) struct Jwt {
    v: Arc<Verifier>,
}

struct Verifier {
    keys: Keys,
    algorithms: Vec<Algorithm>,
    issuers: Vec<String>,
    audiences: Vec<String>,
    leeway: u64,
    from: Vec<TokenSource>,
    claims_to_headers: Vec<(String, HeaderName)>,
    remembered: Mutex<HashMap<Box<str>, Remembered>>,
}

enum Keys {
    Secret(DecodingKey),
    Set(Arc<Jwks>),
}

struct Remembered {
    /// The key set's version it verified against (0: a secret).
    version: u64,
    until: u64,
    claims: Arc<Claims>,
    fields: Vec<(HeaderName, Vec<HeaderValue>)>,
}

/// A verified token's claims, and its `sub` as the access log takes it.
pub(crate) struct Claims {
    pub map: Map<String, Value>,
    pub sub: Option<Arc<str>>,
}

impl Jwt {
    /// `jwks`: the key set of a `jwks` source (carried across reloads for a URL).
    pub(crate) fn new(c: &JwtConfig, jwks: Option<Arc<Jwks>>) -> Jwt {
        let keys = match (&c.keys, jwks) {
            (_, Some(set)) => Keys::Set(set),
            (JwtKeys::Secret(s), None) => Keys::Secret(DecodingKey::from_secret(s)),
            (JwtKeys::File { text, .. }, None) => Keys::Set(Arc::new(Jwks::from_text(text))),
            (JwtKeys::Url(url), None) => Keys::Set(Jwks::from_url(url, c.refresh)),
        };
        Jwt {
            v: Arc::new(Verifier {
                keys,
                algorithms: c.algorithms.clone(),
                issuers: c.issuers.clone(),
                audiences: c.audiences.clone(),
                leeway: c.leeway.as_secs(),
                from: c.from.clone(),
                claims_to_headers: c.claims_to_headers.clone(),
                remembered: Mutex::default(),
            }),
        }
    }
}

impl Filter for Jwt {
    fn on_request(&self, req: &mut Request<Body>, cx: &mut Cx<'_>) -> Step {
        let v = &self.v;
        let token = match v.token(req) {
            Found::Token(t) if t.len() > MAX_TOKEN => return v.refuse(cx.meter, Outcome::TooLarge),
            Found::Token(t) => t,
            Found::Missing => return v.refuse(cx.meter, Outcome::Missing),
            Found::Malformed => {
                return v.refuse(cx.meter, Outcome::Refused(Refusal::Malformed));
            }
        };
        let now = crate::clock::unix_ms();
        if let Some(step) = v.remembered(&token, now) {
            count(cx.meter, Outcome::Ok);
            return step;
        }
        match v.verify(&token, now) {
            Ok(ok) => {
                count(cx.meter, Outcome::Ok);
                v.remember(&token, ok, now)
            }
            Err(Failed::Refused(r)) => v.refuse(cx.meter, Outcome::Refused(r)),
            Err(Failed::NoKey(kid)) => {
                let Keys::Set(jwks) = &v.keys else {
                    return v.refuse(cx.meter, Outcome::Refused(Refusal::UnknownKey));
                };
                // A fetch under way (the first, say) is waited for; else this token
                // may cause one, once a minute. The turn is claimed after the wait: a
                // fetch that just ended may not have let go of its lock yet.
                let may_fetch = kid.is_some() && jwks.kid_fetch_open(now);
                if !(jwks.is_fetching() || may_fetch) {
                    return v.refuse(cx.meter, Outcome::Refused(Refusal::UnknownKey));
                }
                // A rotation: fetch the set again (or wait for the fetch under way),
                // then verify against what it brought.
                let (v, jwks, token) = (v.clone(), jwks.clone(), token.into_owned());
                let meter = cx.meter.cloned();
                Step::Later(Box::pin(async move {
                    jwks.refresh_for(kid.as_deref()).await;
                    let now = crate::clock::unix_ms();
                    match v.verify(&token, now) {
                        Ok(ok) => {
                            count(meter.as_ref(), Outcome::Ok);
                            v.remember(&token, ok, now)
                        }
                        Err(Failed::Refused(r)) => v.refuse(meter.as_ref(), Outcome::Refused(r)),
                        Err(Failed::NoKey(_)) => {
                            v.refuse(meter.as_ref(), Outcome::Refused(Refusal::UnknownKey))
                        }
                    }
                }))
            }
        }
    }

    fn on_response(&self, resp: &mut Response<Body>, cx: &Cx<'_>) {
        let sub = cx.claims.as_ref().and_then(|c| c.sub.clone());
        if let Some(sub) = sub {
            resp.extensions_mut().insert(Subject(sub));
        }
    }
}

fn count(meter: Option<&Arc<Meter>>, outcome: Outcome) {
    if let Some(m) = meter {
        m.jwt[outcome.index()].fetch_add(1, Ordering::Relaxed);
    }
}

/// What the request carries where the filter looks.
enum Found<'r> {
    Token(Cow<'r, str>),
    Missing,
    /// Two tokens (which would the backend believe?) or one that is not text.
    Malformed,
}

/// Why a token did not verify.
enum Failed {
    Refused(Refusal),
    /// No key fits it yet: it names a key the set lacks (`Some`), or the set is being
    /// fetched (its first fetch, say).
    NoKey(Option<String>),
}

/// A token that verified: its claims and the fields made of them.
struct Good {
    version: u64,
    claims: Map<String, Value>,
}

impl Verifier {
    /// The token, from the first place of `from` that has one.
    /// Every place is looked at: a token in two places must be the same token (the
    /// backend might read the other one).
    fn token<'r>(&self, req: &'r Request<Body>) -> Found<'r> {
        let mut token: Option<Cow<'r, str>> = None;
        for source in &self.from {
            let found = match source {
                TokenSource::Header(name) => from_header(req, name),
                TokenSource::Cookie(name) => from_cookie(req, name),
                TokenSource::Query(name) => from_query(req, name),
            };
            match found {
                Found::Missing => {}
                Found::Malformed => return Found::Malformed,
                Found::Token(t) => match &token {
                    Some(first) if *first != t => return Found::Malformed,
                    Some(_) => {}
                    None => token = Some(t),
                },
            }
        }
        token.map_or(Found::Missing, Found::Token)
    }

    fn verify(&self, token: &str, now_ms: u64) -> Result<Good, Failed> {
        let tok = Token::parse(token).map_err(Failed::Refused)?;
        let Some(alg) = tok.alg.filter(|a| self.algorithms.contains(a)) else {
            tracing::debug!(
                "sluice: jwt: a token signed with `{}`, not accepted here",
                tok.alg_name
            );
            return Err(Failed::Refused(Refusal::Algorithm));
        };
        let version = match &self.keys {
            Keys::Secret(secret) => {
                if !tok.signed_with(alg, secret) {
                    return Err(Failed::Refused(Refusal::Signature));
                }
                0
            }
            Keys::Set(jwks) => {
                let current = jwks.current.load();
                let mut keys = current.set.candidates(alg, tok.kid.as_deref()).peekable();
                if keys.peek().is_none() {
                    return Err(match &tok.kid {
                        Some(kid) if !current.set.has_kid(kid) => Failed::NoKey(Some(kid.clone())),
                        None if jwks.is_fetching() => Failed::NoKey(None),
                        _ => Failed::Refused(Refusal::UnknownKey),
                    });
                }
                if !keys.any(|k| tok.signed_by(alg, k)) {
                    return Err(Failed::Refused(Refusal::Signature));
                }
                current.version
            }
        };
        let claims = tok.claims().map_err(Failed::Refused)?;
        let rules = jose::Rules {
            issuers: &self.issuers,
            audiences: &self.audiences,
            leeway: self.leeway,
            now: now_ms / 1000,
        };
        jose::check(&claims, &rules).map_err(Failed::Refused)?;
        Ok(Good { version, claims })
    }

    /// The request goes on with `good`, which is remembered.
    fn remember(&self, token: &str, good: Good, now: u64) -> Step {
        let fields = self.fields(&good.claims);
        let exp = good.claims.get("exp").and_then(Value::as_f64);
        let until = match exp {
            Some(exp) => (now + REMEMBER).min(((exp + self.leeway as f64) * 1000.0) as u64),
            None => now + REMEMBER,
        };
        let sub = good
            .claims
            .get("sub")
            .and_then(Value::as_str)
            .map(Arc::from);
        let claims = Arc::new(Claims {
            map: good.claims,
            sub,
        });
        if token.len() > REMEMBER_LEN {
            return Step::Verified(Box::new(Verified { claims, fields }));
        }
        let mut seen = self.remembered.lock().unwrap_or_else(|e| e.into_inner());
        if seen.len() >= REMEMBERED {
            seen.retain(|_, r| r.until > now);
            if seen.len() >= REMEMBERED {
                seen.clear();
            }
        }
        seen.insert(
            token.into(),
            Remembered {
                version: good.version,
                until,
                claims: claims.clone(),
                fields: fields.clone(),
            },
        );
        Step::Verified(Box::new(Verified { claims, fields }))
    }

    /// A remembered token's step, while it holds.
    fn remembered(&self, token: &str, now: u64) -> Option<Step> {
        let version = match &self.keys {
            Keys::Secret(_) => 0,
            Keys::Set(jwks) => jwks.current.load().version,
        };
        let seen = self.remembered.lock().unwrap_or_else(|e| e.into_inner());
        let r = seen
            .get(token)
            .filter(|r| r.until > now && r.version == version)?;
        Some(Step::Verified(Box::new(Verified {
            claims: r.claims.clone(),
            fields: r.fields.clone(),
        })))
    }

    /// `claims_to_headers`: each field with its claim's value, or with none (removed)
    /// when the token lacks the claim or its value cannot be a field's.
    fn fields(&self, claims: &Map<String, Value>) -> Vec<(HeaderName, Vec<HeaderValue>)> {
        self.claims_to_headers
            .iter()
            .map(|(claim, field)| {
                let value = jose::claim(claims, claim)
                    .and_then(|v| HeaderValue::from_str(&jose::claim_text(v)).ok());
                (field.clone(), value.into_iter().collect())
            })
            .collect()
    }

    fn refuse(&self, meter: Option<&Arc<Meter>>, outcome: Outcome) -> Step {
        count(meter, outcome);
        let (challenge, body) = match outcome {
            Outcome::Missing => (
                Cow::Borrowed("Bearer"),
                "Unauthorized: a bearer token is required\n",
            ),
            Outcome::TooLarge => (
                Cow::Borrowed(
                    "Bearer error=\"invalid_token\", error_description=\"token too large\"",
                ),
                "Unauthorized: invalid token\n",
            ),
            Outcome::Refused(r) => {
                tracing::debug!("sluice: jwt: refused a token: {}", r.description());
                (
                    Cow::Owned(format!(
                        "Bearer error=\"invalid_token\", error_description=\"{}\"",
                        r.description()
                    )),
                    "Unauthorized: invalid token\n",
                )
            }
            Outcome::Ok => unreachable!("an accepted token is not refused"),
        };
        let mut resp = crate::reply::local_response(StatusCode::UNAUTHORIZED, body);
        if let Ok(v) = HeaderValue::from_str(&challenge) {
            resp.headers_mut().insert(WWW_AUTHENTICATE, v);
        }
        Step::answer(resp)
    }
}

/// `Authorization: Bearer TOKEN` (another scheme is no token); another field holds the
/// token alone, a `Bearer ` before it dropped.
fn from_header<'r>(req: &'r Request<Body>, name: &HeaderName) -> Found<'r> {
    let mut values = req.headers().get_all(name).iter();
    let value = match (values.next(), values.next()) {
        (None, _) => return Found::Missing,
        (Some(v), None) => v,
        (Some(_), Some(_)) => return Found::Malformed,
    };
    let Ok(text) = value.to_str() else {
        return Found::Malformed;
    };
    let bearer = text
        .split_once(' ')
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim());
    let token = match bearer {
        Some(t) => t,
        None if *name == AUTHORIZATION => return Found::Missing,
        None => text.trim(),
    };
    if token.is_empty() {
        return Found::Missing;
    }
    Found::Token(Cow::Borrowed(token))
}

/// The cookie `name`, read as bytes (another cookie of the field may be UTF-8); a
/// second one of that name is malformed.
fn from_cookie<'r>(req: &'r Request<Body>, name: &str) -> Found<'r> {
    let mut found: Option<&[u8]> = None;
    for v in req.headers().get_all(http::header::COOKIE) {
        for pair in v.as_bytes().split(|&b| b == b';') {
            let pair = pair.trim_ascii();
            let Some(eq) = pair.iter().position(|&b| b == b'=') else {
                continue;
            };
            if pair[..eq].trim_ascii() == name.as_bytes() {
                if found.is_some() {
                    return Found::Malformed;
                }
                found = Some(pair[eq + 1..].trim_ascii());
            }
        }
    }
    let Some(raw) = found else {
        return Found::Missing;
    };
    let raw = raw
        .strip_prefix(b"\"")
        .and_then(|r| r.strip_suffix(b"\""))
        .unwrap_or(raw);
    match std::str::from_utf8(raw) {
        Ok("") => Found::Missing,
        Ok(t) => Found::Token(Cow::Borrowed(t)),
        Err(_) => Found::Malformed,
    }
}

/// Whether a query parameter's name, as an application decodes it, is `name`: `%XX`
/// decoded, and `.`, ` ` and `_` taken as one (PHP reads `access.token` as
/// `access_token`), so no spelling hides a second token.
fn same_param(raw: &str, name: &str) -> bool {
    let fold = |b: u8| if b == b'.' || b == b' ' { b'_' } else { b };
    let decoded = if raw.contains(['%', '+']) {
        match super::cond::form_decoded(raw) {
            Some(d) => Cow::Owned(d),
            None => return false,
        }
    } else {
        Cow::Borrowed(raw)
    };
    decoded.len() == name.len()
        && decoded
            .bytes()
            .zip(name.bytes())
            .all(|(a, b)| fold(a) == fold(b))
}

fn from_query<'r>(req: &'r Request<Body>, name: &str) -> Found<'r> {
    let Some(q) = req.uri().query() else {
        return Found::Missing;
    };
    let mut found = None;
    for pair in q.split(['&', ';']) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if same_param(k, name) {
            if found.is_some() {
                return Found::Malformed;
            }
            found = Some(v);
        }
    }
    match found {
        Some("") | None => Found::Missing,
        // A token is base64url and dots: a `%` is an escape of one of those.
        Some(t) if t.contains(['%', '+']) => match super::cond::form_decoded(t) {
            Some(d) => Found::Token(Cow::Owned(d)),
            None => Found::Malformed,
        },
        Some(t) => Found::Token(Cow::Borrowed(t)),
    }
}

/// A key set and its version (each new set a new one).
struct Versioned {
    version: u64,
    set: KeySet,
}

/// The keys of a `jwks` source.
pub(crate) struct Jwks {
    current: ArcSwap<Versioned>,
    /// `None`: a file, read at load.
    url: Option<String>,
    /// When a token's unknown `kid` last caused a fetch (ms), 0 for never.
    last_kid_fetch: AtomicU64,
    /// Held by a fetch: a token's unknown `kid` waits for the one under way.
    fetching: Arc<tokio::sync::Mutex<()>>,
    /// The last fetch failed (logged once until one succeeds).
    failing: AtomicBool,
    stop: Arc<tokio::sync::Notify>,
    /// `refresh`, in milliseconds: the newest generation's (a reload may change it and
    /// keep the set).
    refresh: AtomicU64,
}

impl Jwks {
    /// A JWKS file's keys (checked at load, so it parses).
    fn from_text(text: &str) -> Jwks {
        let set = KeySet::parse(text.as_bytes()).unwrap_or_default();
        Jwks::with(set, None)
    }

    fn with(set: KeySet, url: Option<String>) -> Jwks {
        Jwks {
            current: ArcSwap::from_pointee(Versioned { version: 1, set }),
            url,
            last_kid_fetch: AtomicU64::new(0),
            fetching: Arc::new(tokio::sync::Mutex::new(())),
            failing: AtomicBool::new(false),
            stop: Arc::new(tokio::sync::Notify::new()),
            refresh: AtomicU64::new(300_000),
        }
    }

    /// Fetches every `every` from now on.
    pub(crate) fn refresh_every(&self, every: Duration) {
        self.refresh
            .store(every.as_millis() as u64, Ordering::Relaxed);
    }

    /// A JWKS URL's keys: none until the first fetch, which starts now (when there is
    /// a runtime: `sluice check` has none and fetches nothing).
    pub(crate) fn from_url(url: &str, refresh: Duration) -> Arc<Jwks> {
        let j = Arc::new(Jwks::with(KeySet::default(), Some(url.to_string())));
        j.refresh_every(refresh);
        if tokio::runtime::Handle::try_current().is_ok() {
            // The first fetch holds the turn from now, so a token that comes before it
            // ends waits for it instead of fetching again.
            let first = j.fetching.clone().try_lock_owned().ok();
            tokio::spawn(keep_fresh(Arc::downgrade(&j), j.stop.clone(), first));
        }
        j
    }

    /// Whether a token's unknown `kid` may fetch the set now (at most once a minute:
    /// the fetch at start and the periodic ones do not count), without claiming it.
    fn kid_fetch_open(&self, now: u64) -> bool {
        self.turn_open(self.last_kid_fetch.load(Ordering::Relaxed), now)
    }

    fn turn_open(&self, last: u64, now: u64) -> bool {
        self.url.is_some() && (last == 0 || now.saturating_sub(last) >= KID_FETCH_GAP)
    }

    /// As [`Jwks::kid_fetch_open`], and claims the turn.
    fn kid_fetch_allowed(&self, now: u64) -> bool {
        let last = self.last_kid_fetch.load(Ordering::Relaxed);
        self.turn_open(last, now)
            && self
                .last_kid_fetch
                .compare_exchange(last, now.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    fn is_fetching(&self) -> bool {
        self.fetching.try_lock().is_err()
    }

    /// Waits for the fetch under way, if any; then fetches the set when `kid` is still
    /// unknown and its turn comes (once a minute).
    async fn refresh_for(&self, kid: Option<&str>) {
        let _turn = self.fetching.lock().await;
        if kid.is_some_and(|k| !self.current.load().set.has_kid(k))
            && self.kid_fetch_allowed(crate::clock::unix_ms())
        {
            self.fetch().await;
        }
    }

    /// Fetches the set; a good one replaces the current. Whether it did.
    async fn fetch(&self) -> bool {
        let Some(url) = &self.url else {
            return false;
        };
        let Ok(req) = http::Request::get(url.as_str())
            .header(
                http::header::ACCEPT,
                "application/jwk-set+json, application/json",
            )
            .body(http_body_util::Empty::<bytes::Bytes>::new())
        else {
            return false;
        };
        let tls = crate::upstream::tls::system_client();
        let sent = crate::net::fetch::send(req, Some(&tls), jose::MAX_JWKS + 1);
        let why = match tokio::time::timeout(FETCH_TIMEOUT, sent).await {
            Err(_) => format!("no answer within {} s", FETCH_TIMEOUT.as_secs()),
            Ok(Err(e)) => e,
            Ok(Ok(resp)) if !resp.status().is_success() => format!("answered {}", resp.status()),
            Ok(Ok(resp)) => match KeySet::parse(resp.body()) {
                Ok(set) => {
                    let n = set.keys.len();
                    let version = self.current.load().version + 1;
                    self.current.store(Arc::new(Versioned { version, set }));
                    if self.failing.swap(false, Ordering::Relaxed) {
                        tracing::info!("sluice: jwt: JWKS {url}: fetched again, {n} keys");
                    }
                    return true;
                }
                Err(e) => e,
            },
        };
        if !self.failing.swap(true, Ordering::Relaxed) {
            let n = self.current.load().set.keys.len();
            tracing::warn!(
                "sluice: jwt: JWKS {url}: {why}; keeping the last good key set ({n} keys), trying again"
            );
        }
        false
    }

    /// The live generation no longer uses it: its refresh stops.
    pub(crate) fn retire(&self) {
        self.stop.notify_one();
    }
}

/// Fetches the set now and every `refresh` (every [`RETRY`] at most while failing),
/// until the set is retired or dropped.
async fn keep_fresh(
    jwks: Weak<Jwks>,
    stop: Arc<tokio::sync::Notify>,
    mut first: Option<tokio::sync::OwnedMutexGuard<()>>,
) {
    loop {
        let Some(j) = jwks.upgrade() else { return };
        let turn = match first.take() {
            Some(held) => held,
            None => j.fetching.clone().lock_owned().await,
        };
        let fetched = j.fetch().await;
        drop(turn);
        let refresh = Duration::from_millis(j.refresh.load(Ordering::Relaxed));
        let wait = if fetched { refresh } else { refresh.min(RETRY) };
        drop(j);
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.notified() => return,
        }
    }
}
