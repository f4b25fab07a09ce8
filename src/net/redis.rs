//! Redis as it is deployed (DESIGN §18.4): every place that takes a Redis address (a
//! `rate_limit` store, a cache's `purge_store`, ACME storage) takes a URL,
//! `redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]` or `rediss://…` (TLS, verified against the
//! system's roots or `global { redis_ca FILE }`), and makes its client here.
//!
//! A password never leaves this module in words: what logs and `/status` show of an
//! address is [`shown`]. The deadline of a Redis check on the request path is
//! `global { redis_timeout }` ([`timeout`]), process-wide like the CA: the generation
//! that takes over sets both.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// The deadline of one Redis check on the request path, in milliseconds.
static TIMEOUT_MS: AtomicU64 = AtomicU64::new(50);

/// `redis_ca`: the roots `rediss://` servers are verified against instead of the
/// system's.
static CA: RwLock<Option<Arc<Vec<u8>>>> = RwLock::new(None);

/// Sets `redis_timeout` and `redis_ca` (PEM) for the clients made and the checks run
/// from now on.
pub(crate) fn configure(timeout: Duration, ca: Option<Arc<Vec<u8>>>) {
    TIMEOUT_MS.store(timeout.as_millis().max(1) as u64, Ordering::Relaxed);
    *CA.write().unwrap_or_else(|e| e.into_inner()) = ca;
}

/// How long a Redis check on the request path may take.
pub(crate) fn timeout() -> Duration {
    Duration::from_millis(TIMEOUT_MS.load(Ordering::Relaxed))
}

/// A client for `url` (checked for shape at load). `rediss://` verifies the server
/// against `redis_ca` when it is set, else the system's roots.
pub(crate) fn client(url: &str) -> redis::RedisResult<redis::Client> {
    let ca = CA.read().unwrap_or_else(|e| e.into_inner()).clone();
    match ca {
        Some(pem) if url.starts_with("rediss://") => redis::Client::build_with_tls(
            url,
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem.to_vec()),
            },
        ),
        _ => redis::Client::open(url),
    }
}

/// `url` as logs and `/status` show it: the password (and user) replaced by `***`.
pub(crate) fn shown(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((_, host)) => format!("{scheme}://***@{host}{path}"),
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_is_never_shown() {
        assert_eq!(
            shown("rediss://:s3cr3t@cache.internal:6380/2"),
            "rediss://***@cache.internal:6380/2"
        );
        assert_eq!(
            shown("redis://app:p@ss@wd@127.0.0.1:6379"),
            "redis://***@127.0.0.1:6379"
        );
        assert_eq!(
            shown("redis://127.0.0.1:6379/1"),
            "redis://127.0.0.1:6379/1"
        );
    }
}
