//! `challenge [under_load [PERCENT] | always] { … }` (DESIGN §18.12): a proof-of-work
//! wall that switches on when the route's pool is busy. A browser solves a small
//! puzzle once (its script finds a number whose SHA-256 with the nonce starts with
//! `difficulty` zero bits) and gets a pass for `pass`; a script that opens thousands
//! of connections pays for each.
//!
//! Nothing is kept per client: the nonce and the pass are HMAC-signed by sluice
//! (the nonce over the client's address, its issue time and difficulty; the pass over
//! the client's /24 or /48 and its expiry). A nonce is good for 5 minutes and once: a
//! bounded set remembers the ones used. Whether the challenge is on is read from the
//! pool's own in-flight count against its `limit` (the request judged holds no slot
//! yet), so the off state costs a load and a compare.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, COOKIE, LOCATION, RETRY_AFTER, SET_COOKIE};
use http::{HeaderValue, Method, Request, Response, StatusCode};
use ipnet::IpNet;

use super::cond::form_decoded;
use super::{Cx, Filter, Step};
use crate::body::Body;
use crate::config::{ChallengeConfig, ChallengeMode, PathPattern};
use crate::stats::Meter;
use crate::upstream::limit::Limit;

use crate::config::CHALLENGE_ENDPOINT as ENDPOINT;
/// How long a nonce may be answered.
const NONCE_LIFE: u64 = 300;
/// The most nonces remembered as used (a full set refuses solutions until some expire:
/// forgetting one early would let it be used again).
const USED: usize = 262_144;
/// The largest solution form read.
const MAX_FORM: usize = 8192;
/// The longest target a page sends the client back to (encoded, it must fit the form).
const MAX_TO: usize = 2048;
const COOKIE_NAME: &str = "sluice_pass";

/// `sluice_challenge_total`'s `result` label, by index.
pub(crate) const RESULTS: [&str; 4] = ["issued", "passed", "failed", "bypassed"];
const ISSUED: usize = 0;
const PASSED: usize = 1;
const FAILED: usize = 2;
const BYPASSED: usize = 3;

const PAGE: &str = include_str!("challenge.html");

/// What every challenge of a site shares: the key that signs nonces and passes, and
/// the nonces used.
pub(crate) struct Keys {
    hmac: ring::hmac::Key,
    used: Mutex<Used>,
}

impl Keys {
    /// The key of challenges without `secret_file`: random, made once a process (so
    /// passes outlive a reload, not a restart).
    pub(crate) fn process() -> Arc<Keys> {
        static KEYS: std::sync::OnceLock<Arc<Keys>> = std::sync::OnceLock::new();
        KEYS.get_or_init(|| Keys::new(None)).clone()
    }

    /// `secret`: the `secret_file`'s bytes; `None`, a random key.
    pub(crate) fn new(secret: Option<&[u8]>) -> Arc<Keys> {
        let random;
        let key = match secret {
            Some(s) => s,
            None => {
                random = fresh::<32>();
                &random[..]
            }
        };
        Arc::new(Keys {
            hmac: ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key),
            used: Mutex::default(),
        })
    }

    /// The parts, each after its length (so no two lists of parts sign alike).
    fn sign(&self, parts: &[&[u8]]) -> [u8; 16] {
        let mut ctx = ring::hmac::Context::with_key(&self.hmac);
        for p in parts {
            ctx.update(&(p.len() as u32).to_be_bytes());
            ctx.update(p);
        }
        let tag = ctx.sign();
        tag.as_ref()[..16]
            .try_into()
            .expect("HMAC-SHA256 is 32 bytes")
    }

    fn verify(&self, parts: &[&[u8]], mac: &[u8]) -> bool {
        let want = self.sign(parts);
        // Every byte compared, whatever differs first.
        mac.len() == want.len() && want.iter().zip(mac).fold(0, |acc, (a, b)| acc | (a ^ b)) == 0
    }

    /// Records a nonce of a client's network as used; `false` when it was, or when
    /// that network has used its share of this window.
    fn first_use(&self, id: [u8; 12], net: &[u8], now: u64) -> bool {
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        used.first_use(id, net, now)
    }
}

/// The nonces used, in two windows of [`NONCE_LIFE`] (a nonce lives at most one
/// window past the one it was used in: a window is dropped whole when it is two
/// behind), and how many each network used in the current window: a network past
/// [`PER_NETWORK`] is refused for the rest of it, so no single client fills the set
/// and locks everyone else out.
#[derive(Default)]
struct Used {
    window: u64,
    now: std::collections::HashSet<[u8; 12]>,
    before: std::collections::HashSet<[u8; 12]>,
    by_network: HashMap<Vec<u8>, u32>,
}

/// Solutions one /24 or /48 may have accepted in a window.
const PER_NETWORK: u32 = 4096;

impl Used {
    fn first_use(&mut self, id: [u8; 12], net: &[u8], now: u64) -> bool {
        let window = now / NONCE_LIFE;
        if window != self.window {
            self.before = if window == self.window + 1 {
                std::mem::take(&mut self.now)
            } else {
                Default::default()
            };
            self.now.clear();
            self.by_network.clear();
            self.window = window;
        }
        if self.now.contains(&id) || self.before.contains(&id) {
            return false;
        }
        let n = self.by_network.entry(net.to_vec()).or_insert(0);
        if *n >= PER_NETWORK || self.now.len() >= USED {
            return false;
        }
        *n += 1;
        self.now.insert(id)
    }
}

fn fresh<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b)
        .expect("the system's random numbers");
    b
}

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

fn unb64(s: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s)
        .ok()
}

pub(crate) struct Challenge {
    keys: Arc<Keys>,
    mode: ChallengeMode,
    difficulty: u8,
    pass: Duration,
    allow: Vec<IpNet>,
    except: Vec<PathPattern>,
    /// The route's pool's `limit` (bound per route: [`Challenge::on_route`]).
    limit: Option<Arc<Limit>>,
}

impl Challenge {
    pub(crate) fn new(c: &ChallengeConfig, keys: Arc<Keys>) -> Challenge {
        Challenge {
            keys,
            mode: c.mode,
            difficulty: c.difficulty,
            pass: c.pass,
            allow: c.allow.clone(),
            except: c.except.clone(),
            limit: None,
        }
    }

    /// The same challenge for a route whose pool has `limit`.
    pub(crate) fn on_route(&self, limit: Option<Arc<Limit>>) -> Challenge {
        Challenge {
            keys: self.keys.clone(),
            mode: self.mode,
            difficulty: self.difficulty,
            pass: self.pass,
            allow: self.allow.clone(),
            except: self.except.clone(),
            limit,
        }
    }

    /// Whether the challenge is on now.
    pub(crate) fn is_on(&self) -> bool {
        match self.mode {
            ChallengeMode::Always => true,
            ChallengeMode::UnderLoad(percent) => self.limit.as_ref().is_some_and(|l| {
                let max = l.max();
                max > 0 && l.in_use() * 100 >= usize::from(percent) * max
            }),
        }
    }

    fn nonce(&self, ip: IpAddr, now: u64) -> String {
        let id = fresh::<12>();
        let (t, d) = (now.to_string(), self.difficulty.to_string());
        let mac = self.keys.sign(&[
            b"nonce",
            ip_text(ip).as_bytes(),
            t.as_bytes(),
            d.as_bytes(),
            &id,
        ]);
        format!("{t}.{d}.{}.{}", b64(&id), b64(&mac))
    }

    /// The pass for a client who solved this challenge, good until `until`: it names
    /// the difficulty solved, so a pass earned on an easier challenge (another site's,
    /// under the same key) does not open a harder one.
    fn pass_for(&self, ip: IpAddr, until: u64) -> String {
        let (t, d) = (until.to_string(), self.difficulty.to_string());
        let mac = self
            .keys
            .sign(&[b"pass", &net_of(ip), t.as_bytes(), d.as_bytes()]);
        format!("{t}.{d}.{}", b64(&mac))
    }

    /// Whether `value` is a pass for this client's network, unexpired, no longer than
    /// this challenge's `pass`, for a difficulty at least its own.
    fn pass_ok(&self, value: &str, ip: IpAddr, now: u64) -> bool {
        let mut parts = value.split('.');
        let (Some(t), Some(d), Some(mac), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return false;
        };
        let (Some(until), Some(bits)) = (canonical(t), canonical(d)) else {
            return false;
        };
        until > now
            && until <= now + self.pass.as_secs().max(1)
            && bits >= u64::from(self.difficulty)
            && unb64(mac).is_some_and(|m| {
                self.keys
                    .verify(&[b"pass", &net_of(ip), t.as_bytes(), d.as_bytes()], &m)
            })
    }

    /// Checks a solution: the nonce sluice signed for this client, in its life, with
    /// enough zero bits, not used before.
    fn solved(&self, nonce: &str, solution: &str, ip: IpAddr, now: u64) -> bool {
        let parts: Vec<&str> = nonce.split('.').collect();
        let [t, d, id, mac] = parts[..] else {
            return false;
        };
        let (Some(issued), Some(bits)) = (canonical(t), canonical(d)) else {
            return false;
        };
        if !(8..=24).contains(&bits) {
            return false;
        }
        if issued > now || now - issued > NONCE_LIFE || solution.is_empty() || solution.len() > 20 {
            return false;
        }
        if !solution.bytes().all(|b| b.is_ascii_digit()) {
            return false;
        }
        let (Some(id), Some(mac)) = (unb64(id), unb64(mac)) else {
            return false;
        };
        let Ok(id) = <[u8; 12]>::try_from(id) else {
            return false;
        };
        let who = ip_text(ip);
        let signed = [
            b"nonce" as &[u8],
            who.as_bytes(),
            t.as_bytes(),
            d.as_bytes(),
            &id,
        ];
        if !self.keys.verify(&signed, &mac) {
            return false;
        }
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        ctx.update(nonce.as_bytes());
        ctx.update(solution.as_bytes());
        if u64::from(zero_bits(ctx.finish().as_ref())) < bits {
            return false;
        }
        self.keys.first_use(id, &net_of(ip), now)
    }

    /// The page (`403`) for a browser, `429` for anything else.
    fn wall(&self, req: &Request<Body>, cx: &Cx<'_>, to: &str, now: u64) -> Response<Body> {
        let browser = (req.method() == Method::GET || req.method() == Method::HEAD)
            && req.headers().get_all(http::header::ACCEPT).iter().any(|v| {
                v.as_bytes()
                    .windows(9)
                    .any(|w| w.eq_ignore_ascii_case(b"text/html"))
            });
        if !browser {
            let mut r = crate::reply::local_response(
                StatusCode::TOO_MANY_REQUESTS,
                "Too many requests: the site is busy, retry in a moment\n",
            );
            r.headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from_static("5"));
            return r;
        }
        count(cx.meter, ISSUED);
        self.page(StatusCode::FORBIDDEN, cx.client_ip, to, now)
    }

    fn page(&self, status: StatusCode, ip: IpAddr, to: &str, now: u64) -> Response<Body> {
        let html = PAGE
            .replace("{NONCE}", &self.nonce(ip, now))
            .replace("{BITS}", &self.difficulty.to_string())
            .replace("{TO}", &attribute(to));
        let mut r = Response::new(Body::full(html));
        *r.status_mut() = status;
        let h = r.headers_mut();
        h.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        );
        h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        h.insert(
            http::header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; form-action 'self'",
            ),
        );
        h.insert(http::header::DATE, crate::reply::date());
        crate::reply::server(h);
        r.extensions_mut().insert(crate::reply::Whole);
        r
    }

    /// `POST /.sluice/challenge`: the form read (up to [`MAX_FORM`]), then `303` to
    /// `to` with a pass, or a new page.
    fn answer(&self, req: &mut Request<Body>, cx: &Cx<'_>) -> Step {
        let body = std::mem::replace(req.body_mut(), Body::Empty);
        let me = self.on_route(None);
        let (ip, https, meter) = (cx.client_ip, cx.https, cx.meter.cloned());
        Step::Later(Box::pin(async move {
            use http_body_util::BodyExt as _;
            let form = match http_body_util::Limited::new(body, MAX_FORM).collect().await {
                Ok(b) => b.to_bytes(),
                Err(_) => bytes::Bytes::new(),
            };
            let field = |name: &str| form_field(&form, name).unwrap_or_default();
            let to = same_site(&field("to"));
            let now = crate::clock::unix_ms() / 1000;
            if !me.solved(&field("nonce"), &field("solution"), ip, now) {
                count(meter.as_ref(), FAILED);
                count(meter.as_ref(), ISSUED);
                return Step::answer(me.page(StatusCode::FORBIDDEN, ip, &to, now));
            }
            count(meter.as_ref(), PASSED);
            let until = now + me.pass.as_secs().max(1);
            let cookie = format!(
                "{COOKIE_NAME}={}; Path=/; Max-Age={}; HttpOnly; SameSite=Lax{}",
                me.pass_for(ip, until),
                me.pass.as_secs().max(1),
                if https { "; Secure" } else { "" }
            );
            let mut r = crate::reply::local_response(StatusCode::SEE_OTHER, "See other\n");
            let h = r.headers_mut();
            if let (Ok(l), Ok(c)) = (HeaderValue::from_str(&to), HeaderValue::from_str(&cookie)) {
                h.insert(LOCATION, l);
                h.insert(SET_COOKIE, c);
            }
            h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
            Step::answer(r)
        }))
    }
}

impl Filter for Challenge {
    fn on_request(&self, req: &mut Request<Body>, cx: &mut Cx<'_>) -> Step {
        if cx.path(req) == ENDPOINT {
            if req.method() == Method::POST {
                return self.answer(req, cx);
            }
            let mut r = crate::reply::local_response(StatusCode::SEE_OTHER, "See other\n");
            r.headers_mut()
                .insert(LOCATION, HeaderValue::from_static("/"));
            return Step::answer(r);
        }
        let pass = take_pass(req);
        if !self.is_on() {
            return Step::Pass;
        }
        let path = cx.path(req);
        if super::cond::in_nets(&self.allow, cx.client_ip)
            || self.except.iter().any(|p| p.matches(path))
        {
            count(cx.meter, BYPASSED);
            return Step::Pass;
        }
        let now = crate::clock::unix_ms() / 1000;
        if pass.is_some_and(|p| self.pass_ok(&p, cx.client_ip, now)) {
            return Step::Pass;
        }
        // A target too long to come back through the page's form is not kept.
        let to = req
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        let to = if to.len() > MAX_TO {
            "/".to_string()
        } else {
            to
        };
        Step::answer(self.wall(req, cx, &to, now))
    }

    fn uses_client_ip(&self) -> bool {
        true
    }

    fn challenge(&self) -> Option<&Challenge> {
        Some(self)
    }
}

fn count(meter: Option<&Arc<Meter>>, i: usize) {
    if let Some(m) = meter {
        m.challenge[i].fetch_add(1, Ordering::Relaxed);
    }
}

/// Takes the `sluice_pass` cookie out of the request (the backend never sees it,
/// whatever the spelling around its name or the bytes of the field): its value, if
/// there was one.
fn take_pass(req: &mut Request<Body>) -> Option<String> {
    let name = COOKIE_NAME.as_bytes();
    let h = req.headers();
    if !h
        .get_all(COOKIE)
        .iter()
        .any(|v| v.as_bytes().windows(name.len()).any(|w| w == name))
    {
        return None;
    }
    let mut pass = None;
    let mut kept: Vec<HeaderValue> = Vec::new();
    for v in h.get_all(COOKIE) {
        let mut rest: Vec<&[u8]> = Vec::new();
        for pair in v.as_bytes().split(|&b| b == b';') {
            let pair = pair.trim_ascii();
            let (k, value) = match pair.iter().position(|&b| b == b'=') {
                Some(eq) => (pair[..eq].trim_ascii(), &pair[eq + 1..]),
                None => (pair, &b""[..]),
            };
            if k == name {
                pass = std::str::from_utf8(value.trim_ascii())
                    .ok()
                    .map(str::to_string);
            } else if !pair.is_empty() {
                rest.push(pair);
            }
        }
        if !rest.is_empty() {
            if let Ok(v) = HeaderValue::from_bytes(&rest.join(&b"; "[..])) {
                kept.push(v);
            }
        }
    }
    let h = req.headers_mut();
    h.remove(COOKIE);
    for v in kept {
        h.append(COOKIE, v);
    }
    pass
}

/// A decimal number as sluice writes one: digits only, no leading zero (so one value
/// has one spelling), at most 20 of them.
fn canonical(t: &str) -> Option<u64> {
    let ok = !t.is_empty()
        && t.len() <= 20
        && t.bytes().all(|b| b.is_ascii_digit())
        && (t == "0" || !t.starts_with('0'));
    ok.then(|| t.parse().ok()).flatten()
}

/// Leading zero bits of a digest.
fn zero_bits(d: &[u8]) -> u32 {
    let mut z = 0;
    for &b in d {
        if b != 0 {
            return z + b.leading_zeros();
        }
        z += 8;
    }
    z
}

/// The address a nonce is bound to, as text.
fn ip_text(ip: IpAddr) -> String {
    ip.to_canonical().to_string()
}

/// The network a pass is bound to: the client's /24 (IPv4) or /48 (IPv6), so a pass
/// survives a client's address changing within its network.
/// As bytes: the version, then the network's leading bytes.
fn net_of(ip: IpAddr) -> Vec<u8> {
    match ip.to_canonical() {
        IpAddr::V4(v4) => [&[4u8][..], &v4.octets()[..3]].concat(),
        IpAddr::V6(v6) => [&[6u8][..], &v6.octets()[..6]].concat(),
    }
}

/// `to` when it is a path on this site; else `/`. Never `//host`, `/\host` or a
/// scheme, nothing a browser would take for another origin.
pub(crate) fn same_site(to: &str) -> String {
    let ok = to.starts_with('/')
        && !to.starts_with("//")
        && !to.starts_with("/\\")
        && to.bytes().all(|b| (0x21..0x7f).contains(&b) && b != b'\\');
    if ok {
        to.to_string()
    } else {
        "/".to_string()
    }
}

/// Text for an HTML attribute value.
fn attribute(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('"', "&quot;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('\'', "&#39;")
}

/// A field of an `application/x-www-form-urlencoded` body, decoded.
fn form_field(form: &[u8], name: &str) -> Option<String> {
    let text = std::str::from_utf8(form).ok()?;
    text.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (form_decoded(k)? == name)
            .then(|| form_decoded(v))
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn challenge(difficulty: u8, pass: u64, keys: &Arc<Keys>) -> Challenge {
        let c = ChallengeConfig {
            mode: ChallengeMode::Always,
            difficulty,
            pass: Duration::from_secs(pass),
            secret: None,
            allow: Vec::new(),
            except: Vec::new(),
        };
        Challenge::new(&c, keys.clone())
    }

    #[test]
    fn a_pass_opens_no_harder_or_longer_challenge_than_it_was_earned_on() {
        let keys = Keys::new(Some(b"0123456789abcdef0123456789abcdef"));
        let (easy, hard) = (challenge(8, 3600, &keys), challenge(16, 60, &keys));
        let ip: IpAddr = "203.0.113.5".parse().unwrap();
        let now = 1_000_000;
        let p = easy.pass_for(ip, now + 3600);
        assert!(easy.pass_ok(&p, ip, now));
        assert!(!hard.pass_ok(&p, ip, now), "easier difficulty, longer life");
        let p = hard.pass_for(ip, now + 60);
        assert!(hard.pass_ok(&p, ip, now) && easy.pass_ok(&p, ip, now));
        assert!(!hard.pass_ok(&p, "203.0.114.5".parse().unwrap(), now));
        assert!(
            !hard.pass_ok(&format!("0{p}"), ip, now),
            "one spelling of a number"
        );
    }

    #[test]
    fn nonces_are_refused_not_panicked_on() {
        let keys = Keys::new(None);
        let c = challenge(8, 60, &keys);
        let ip: IpAddr = "203.0.113.5".parse().unwrap();
        let now = 1_000_000u64;
        let long = format!(
            "{}{now}.8.AAAAAAAAAAAAAAAA.AAAAAAAAAAAAAAAAAAAAAA",
            "0".repeat(200)
        );
        assert!(!c.solved(&long, "1", ip, now));
        assert!(!c.solved(&format!("{now}.08.AAAAAAAAAAAAAAAA.AA"), "1", ip, now));
        let n = c.nonce(ip, now);
        let good = (0u64..).find(|k| {
            let d = ring::digest::digest(&ring::digest::SHA256, format!("{n}{k}").as_bytes());
            zero_bits(d.as_ref()) >= 8
        });
        let good = good.unwrap().to_string();
        assert!(
            !c.solved(&n, &good, "198.51.100.1".parse().unwrap(), now),
            "another client"
        );
        assert!(c.solved(&n, &good, ip, now));
        assert!(!c.solved(&n, &good, ip, now), "once");
    }

    #[test]
    fn one_network_cannot_fill_the_used_set() {
        let mut used = Used::default();
        let now = 1_000_000;
        for k in 0..PER_NETWORK {
            let mut id = [0u8; 12];
            id[..4].copy_from_slice(&k.to_be_bytes());
            assert!(used.first_use(id, b"net-a", now));
        }
        assert!(
            !used.first_use([9; 12], b"net-a", now),
            "its share is spent"
        );
        assert!(used.first_use([9; 12], b"net-b", now), "others still pass");
        assert!(
            !used.first_use([9; 12], b"net-b", now + NONCE_LIFE),
            "remembered a window on"
        );
        assert!(
            used.first_use([9; 12], b"net-b", now + 2 * NONCE_LIFE),
            "then forgotten"
        );
    }

    #[test]
    fn only_same_site_paths_are_followed() {
        for bad in [
            "//evil.example/",
            "/\\evil.example",
            "https://evil.example/",
            "evil",
            "",
            "/a b",
            "/\\x",
        ] {
            assert_eq!(same_site(bad), "/", "{bad}");
        }
        assert_eq!(same_site("/shop?q=1"), "/shop?q=1");
    }

    #[test]
    fn forms_decode_and_zero_bits_count() {
        assert_eq!(
            form_field(b"a=1&to=%2Fx%3Fy%3D1&n=a+b", "to").as_deref(),
            Some("/x?y=1")
        );
        assert_eq!(form_field(b"a=1", "to"), None);
        assert_eq!(form_field(b"to=%zz", "to"), None);
        assert_eq!(zero_bits(&[0, 0x0f, 0xff]), 12);
        assert_eq!(zero_bits(&[0, 0]), 16);
        assert_eq!(
            net_of("10.1.2.3".parse().unwrap()),
            net_of("10.1.2.200".parse().unwrap())
        );
        assert_ne!(
            net_of("10.1.2.3".parse().unwrap()),
            net_of("10.1.3.3".parse().unwrap())
        );
        let v6 = |s: &str| net_of(s.parse().unwrap());
        assert_eq!(v6("2001:db8:1:2::5"), v6("2001:db8:1:ffff::9"));
        assert_ne!(v6("2001:db8:1:2::5"), v6("2001:db8:2:2::5"));
        assert_eq!(v6("::ffff:10.1.2.3"), net_of("10.1.2.9".parse().unwrap()));
    }
}
