//! `basic_auth USER HASH` (or a block of them): HTTP Basic authentication against
//! bcrypt or argon2id hashes; `401` with `WWW-Authenticate` otherwise. Results for
//! branches: `authorized`, `unauthorized`.
//!
//! A hash costs milliseconds of CPU by design, so it is checked on a blocking thread,
//! at most as many at once as the machine has cores (a flood of wrong passwords queues
//! instead of starving the proxy). A credential that verified is remembered for
//! [`REMEMBER`] by the SHA-256 of its header value (never the password itself), so a
//! client sending it on every request pays the hash once. An unknown user costs the
//! same hash as a known one (checked against a dummy), so timing does not tell which
//! users exist; the hash libraries compare in constant time.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use http::{HeaderValue, Request, Response, StatusCode};
use tokio::sync::Semaphore;

use super::{Cx, Filter, Step};
use crate::body::Body;
use crate::reply::local_response;
use crate::stats::{bump, COUNTERS};

/// How long a verified credential is remembered.
pub(crate) const REMEMBER: Duration = Duration::from_secs(300);
/// The most credentials remembered at once.
const REMEMBERED: usize = 4096;

/// Verifications that may wait for a core, per core: past them a request is refused
/// at once (503) instead of joining a queue a flood of wrong passwords would grow
/// without end.
const WAITING_PER_CORE: usize = 32;

pub(crate) struct BasicAuth {
    users: Arc<[(String, String)]>,
    /// `WWW-Authenticate` of the 401: its realm, checked at load.
    challenge: HeaderValue,
    /// SHA-256 of an `Authorization` value that verified → when it stops counting.
    verified: Arc<Mutex<HashMap<[u8; 32], u64>>>,
    /// One verification at a time per core.
    slots: Arc<Semaphore>,
    /// Verifications running or waiting.
    queue: Arc<Semaphore>,
}

impl BasicAuth {
    pub(crate) fn new(users: &[(String, String)], realm: &str) -> BasicAuth {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let challenge = format!("Basic realm=\"{realm}\", charset=\"UTF-8\"");
        BasicAuth {
            challenge: HeaderValue::from_str(&challenge).unwrap_or_else(|_| {
                HeaderValue::from_static("Basic realm=\"sluice\", charset=\"UTF-8\"")
            }),
            users: users.iter().cloned().collect(),
            verified: Arc::default(),
            slots: Arc::new(Semaphore::new(cores)),
            queue: Arc::new(Semaphore::new(cores * (1 + WAITING_PER_CORE))),
        }
    }
}

impl Filter for BasicAuth {
    fn on_request(&self, req: &mut Request<Body>, _: &mut Cx<'_>) -> Step {
        let ch = &self.challenge;
        let mut given = req.headers().get_all(AUTHORIZATION).iter();
        let (Some(value), None) = (given.next(), given.next()) else {
            // None, or two: which one would the application believe?
            return Step::answer(challenge(ch));
        };
        let digest = ring::digest::digest(&ring::digest::SHA256, value.as_bytes());
        let key: [u8; 32] = digest.as_ref().try_into().expect("SHA-256 is 32 bytes");
        let now = crate::clock::now_ms();
        {
            let seen = self.verified.lock().unwrap_or_else(|e| e.into_inner());
            if seen.get(&key).is_some_and(|&until| until > now) {
                return Step::Pass;
            }
        }
        let Some((user, password)) = credentials(value) else {
            return Step::answer(challenge(ch));
        };
        let Ok(place) = self.queue.clone().try_acquire_owned() else {
            bump(&COUNTERS.limit_rejections);
            let mut r = local_response(
                StatusCode::SERVICE_UNAVAILABLE,
                "Server busy, retry in a moment\n",
            );
            r.headers_mut()
                .insert(http::header::RETRY_AFTER, HeaderValue::from_static("2"));
            return Step::answer(r);
        };
        let (users, verified, slots, ch) = (
            self.users.clone(),
            self.verified.clone(),
            self.slots.clone(),
            self.challenge.clone(),
        );
        Step::Later(Box::pin(async move {
            let _place = place;
            let Ok(_slot) = slots.acquire_owned().await else {
                return Step::answer(challenge(&ch));
            };
            let ok = tokio::task::spawn_blocking(move || check(&users, &user, &password))
                .await
                .unwrap_or(false);
            if !ok {
                return Step::answer(challenge(&ch));
            }
            let mut seen = verified.lock().unwrap_or_else(|e| e.into_inner());
            if seen.len() >= REMEMBERED {
                let now = crate::clock::now_ms();
                seen.retain(|_, until| *until > now);
                if seen.len() >= REMEMBERED {
                    seen.clear();
                }
            }
            seen.insert(key, now + REMEMBER.as_millis() as u64);
            Step::Pass
        }))
    }
}

/// 401 asking for Basic credentials.
fn challenge(value: &HeaderValue) -> Response<Body> {
    bump(&COUNTERS.unauthorized);
    let mut r = local_response(StatusCode::UNAUTHORIZED, "Unauthorized\n");
    r.headers_mut().insert(WWW_AUTHENTICATE, value.clone());
    r
}

/// `Basic base64(user:password)` → (user, password).
pub(crate) fn credentials(value: &HeaderValue) -> Option<(String, String)> {
    let v = value.to_str().ok()?;
    let (scheme, token) = v.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let raw = base64::engine::general_purpose::STANDARD
        .decode(token.trim())
        .ok()?;
    let text = String::from_utf8(raw).ok()?;
    let (u, p) = text.split_once(':')?;
    Some((u.to_string(), p.to_string()))
}

/// Whether `password` is `user`'s (every user compared, the hash checked once). An
/// unknown user's password is checked against the first user's hash, its result
/// ignored: the same algorithm and cost, so the time does not tell who exists.
fn check(users: &[(String, String)], user: &str, password: &str) -> bool {
    let mut hash = None;
    for (u, h) in users {
        if same(u.as_bytes(), user.as_bytes()) {
            hash = Some(h.as_str());
        }
    }
    let ok = verify(hash.unwrap_or(&users[0].1), password);
    ok && hash.is_some()
}

/// Equal bytes, compared without an early exit (the length is not secret).
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn verify(hash: &str, password: &str) -> bool {
    if hash.starts_with("$argon2") {
        use argon2::PasswordVerifier as _;
        argon2::PasswordHash::new(hash).is_ok_and(|parsed| {
            argon2::Argon2::default()
                .verify_password(password.as_bytes(), &parsed)
                .is_ok()
        })
    } else {
        bcrypt::verify(password, hash).unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bcrypt_and_argon2() {
        let b = bcrypt::hash("secret", 4).unwrap();
        assert!(verify(&b, "secret"));
        assert!(!verify(&b, "Secret"));
        // `echo -n secret | argon2 somesalt -id -e`
        let a =
            "$argon2id$v=19$m=4096,t=3,p=1$c29tZXNhbHQ$JSTtCfuzyWAVVZF1mjNyip+A7CCi5xkKhBoPdXSPbqs";
        assert!(verify(a, "secret"), "argon2id");
        assert!(!verify(a, "other"));
        let users = vec![("alice".to_string(), b)];
        assert!(check(&users, "alice", "secret"));
        assert!(!check(&users, "bob", "secret"));
    }

    #[test]
    fn parses_credentials() {
        let v = HeaderValue::from_static("Basic YWxpY2U6czNjcjp0"); // alice:s3cr:t
        assert_eq!(credentials(&v), Some(("alice".into(), "s3cr:t".into())));
        assert_eq!(credentials(&HeaderValue::from_static("Bearer x")), None);
        assert_eq!(credentials(&HeaderValue::from_static("Basic !!!")), None);
    }
}
