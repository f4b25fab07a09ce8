//! `rate_limit N/s|N/m [burst N] [key client_ip|header NAME] [store redis://…]`: a token
//! bucket per key. A bucket holds up to `burst` tokens and gains `N` per window; a
//! request takes one or is refused `429` with `Retry-After` and the IETF draft's
//! `RateLimit-Policy` / `RateLimit` fields. Results for branches: `passed`, `limited`.
//!
//! The default store is this process's memory: 64 shards, each a small map under its
//! own lock (held for a few arithmetic operations, never across an await), with at
//! most [`MAX_KEYS`] keys; a full shard first forgets keys whose bucket has refilled
//! (an idle key and a fresh one are the same), then the longest unused. With `store
//! redis://…` the buckets live in Redis, checked by one atomic script per request on a
//! multiplexed connection, so every sluice instance sharing the Redis enforces one
//! limit. A Redis that does not answer within `redis_timeout` (50 ms) is an error: the
//! filter's `failure open|closed` decides, and the outage is logged once, not per
//! request.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use http::header::{HeaderName, RETRY_AFTER};
use http::{HeaderValue, Request, Response, StatusCode};

use super::{Cx, Filter, Step};
use crate::body::Body;
use crate::config::RateLimit as Config;
use crate::reply::local_response;
use crate::stats::{bump, COUNTERS};

/// The most keys one in-memory `rate_limit` remembers.
pub(crate) const MAX_KEYS: usize = 100_000;
const SHARDS: usize = 64;

static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

pub(crate) struct RateLimit {
    /// The policy's name in the headers (`name NAME`, else `default`).
    name: String,
    key_header: Option<HeaderName>,
    /// Tokens gained per millisecond.
    per_ms: f64,
    burst: f64,
    policy: HeaderValue,
    store: Store,
    /// What tells this filter's keys apart in a shared Redis from another filter's:
    /// its name, else its route, and its rate.
    scope: String,
}

pub(crate) enum Store {
    Memory(Arc<Memory>),
    Redis(Arc<Redis>),
}

/// An in-memory store: the buckets, and the one hasher that places keys in them (a
/// key always lands in the same shard). Handed to the next generation's filter of the
/// same identity ([`RateLimit::identity`]), so a reload resets nobody's budget.
pub(crate) struct Memory {
    shards: Box<[Mutex<Shard>]>,
    hasher: std::hash::RandomState,
}

impl Memory {
    pub(crate) fn new() -> Memory {
        Memory {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: std::hash::RandomState::new(),
        }
    }

    /// A token from the bucket of `header`'s value, else of `ip`; `Err`: the wait
    /// until one is there, in milliseconds.
    fn take(
        &self,
        header: Option<&[u8]>,
        ip: std::net::IpAddr,
        per_ms: f64,
        burst: f64,
    ) -> Result<(), u64> {
        let mut h = self.hasher.build_hasher();
        // A tag first: a header value never shares a bucket with an address.
        match header {
            Some(v) => {
                h.write_u8(b'h');
                h.write(v);
            }
            None => match client_key(ip) {
                std::net::IpAddr::V4(v4) => {
                    h.write_u8(4);
                    h.write(&v4.octets());
                }
                std::net::IpAddr::V6(v6) => {
                    h.write_u8(6);
                    h.write(&v6.octets());
                }
            },
        }
        let key = h.finish();
        let now = crate::clock::now_ms();
        // The shard from middle bits: the map uses the low and the top ones.
        self.shards[((key >> 32) % SHARDS as u64) as usize]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take(key, now, per_ms, burst)
    }
}

#[derive(Default)]
struct Shard {
    /// Keyed by the key's hash already: no second hashing.
    buckets: HashMap<u64, Bucket, std::hash::BuildHasherDefault<Prehashed>>,
}

/// The identity hasher for keys that are hashes already.
#[derive(Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used; anything else folds in all the same.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

#[derive(Clone, Copy)]
struct Bucket {
    tokens: f64,
    at_ms: u64,
}

impl RateLimit {
    /// What makes two generations' in-memory filters the same: route, name, rate,
    /// burst and key (a Redis store's buckets outlive the process: its client is
    /// carried by address instead).
    pub(crate) fn identity(cfg: &Config, name: Option<&str>, route: &str) -> String {
        format!(
            "{route}\n{name:?}\n{}/{}ms\n{}\n{:?}",
            cfg.count,
            cfg.window.as_millis(),
            cfg.burst,
            cfg.key_header
        )
    }

    /// `route`: the route's name, which (with the rate) scopes keys in Redis when the
    /// filter has no `name`. `store`: its buckets — the previous generation's of the
    /// same identity, or a Redis client shared by every filter on that address.
    pub(crate) fn new(cfg: &Config, name: Option<&str>, route: &str, store: Store) -> RateLimit {
        let scope = format!(
            "{}:{}/{}ms:{}",
            name.unwrap_or(route),
            cfg.count,
            cfg.window.as_millis(),
            cfg.burst
        );
        let name = name.unwrap_or("default").to_string();
        let window = cfg.window.as_secs().max(1);
        let policy = HeaderValue::from_str(&format!("\"{name}\";q={};w={window}", cfg.count))
            .expect("a name of letters, digits, _ and - is a valid header value");
        RateLimit {
            name,
            key_header: cfg.key_header.clone(),
            per_ms: f64::from(cfg.count) / cfg.window.as_millis() as f64,
            burst: f64::from(cfg.burst),
            policy,
            store,
            scope,
        }
    }

    /// One new connection from `ip` (a `tcp` listener's `rate_limit`, which has no
    /// key and no store): whether its bucket had a token.
    pub(crate) fn admit(&self, ip: std::net::IpAddr) -> bool {
        match &self.store {
            Store::Memory(m) => m.take(None, ip, self.per_ms, self.burst).is_ok(),
            Store::Redis(_) => true,
        }
    }
}

/// The refusal: 429, when a token comes (`wait_ms`), and the policy.
fn refusal(name: &str, policy: &HeaderValue, wait_ms: u64) -> Response<Body> {
    bump(&COUNTERS.rate_limited);
    let secs = wait_ms.div_ceil(1000).max(1);
    let mut r = local_response(StatusCode::TOO_MANY_REQUESTS, "Too many requests\n");
    let h = r.headers_mut();
    h.insert(RETRY_AFTER, HeaderValue::from(secs));
    h.insert(RATELIMIT_POLICY.clone(), policy.clone());
    if let Ok(v) = HeaderValue::from_str(&format!("\"{name}\";r=0;t={secs}")) {
        h.insert(RATELIMIT.clone(), v);
    }
    r
}

impl Filter for RateLimit {
    fn on_request(&self, req: &mut Request<Body>, cx: &mut Cx<'_>) -> Step {
        // The key: the header's value when the request has it, else the client.
        let header = self
            .key_header
            .as_ref()
            .and_then(|h| req.headers().get(h))
            .map(HeaderValue::as_bytes);
        match &self.store {
            Store::Memory(memory) => {
                match memory.take(header, cx.client_ip, self.per_ms, self.burst) {
                    Ok(()) => Step::Pass,
                    Err(wait_ms) => Step::answer(refusal(&self.name, &self.policy, wait_ms)),
                }
            }
            Store::Redis(redis) => {
                let key = match header {
                    Some(v) => format!("{}:h:{}", self.scope, String::from_utf8_lossy(v)),
                    None => format!("{}:ip:{}", self.scope, client_key(cx.client_ip)),
                };
                let redis = redis.clone();
                let (per_ms, burst) = (self.per_ms, self.burst);
                let (name, policy) = (self.name.clone(), self.policy.clone());
                Step::Later(Box::pin(async move {
                    match redis.take(&key, per_ms, burst).await {
                        Ok(None) => Step::Pass,
                        Ok(Some(wait_ms)) => Step::answer(refusal(&name, &policy, wait_ms)),
                        Err(why) => Step::Error(why),
                    }
                }))
            }
        }
    }

    fn uses_client_ip(&self) -> bool {
        true
    }
}

/// The address a client is limited by: an IPv6 client by its /64 (one machine usually
/// has the whole /64, and would otherwise have 2^64 buckets), IPv4 as it is.
fn client_key(ip: std::net::IpAddr) -> std::net::IpAddr {
    match ip.to_canonical() {
        std::net::IpAddr::V6(v6) => {
            let s = v6.segments();
            std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0).into()
        }
        v4 => v4,
    }
}

impl Shard {
    /// Takes a token from `key`'s bucket, or says how long until one is there.
    fn take(&mut self, key: u64, now: u64, per_ms: f64, burst: f64) -> Result<(), u64> {
        if !self.buckets.contains_key(&key) && self.buckets.len() >= MAX_KEYS / SHARDS {
            self.forget(now, per_ms, burst);
        }
        let b = self.buckets.entry(key).or_insert(Bucket {
            tokens: burst,
            at_ms: now,
        });
        let tokens = (b.tokens + now.saturating_sub(b.at_ms) as f64 * per_ms).min(burst);
        // Never back: another thread's poll may have read the clock later than this
        // one (`clock::coarse`), and an older time would refill the same span twice.
        b.at_ms = b.at_ms.max(now);
        if tokens >= 1.0 {
            b.tokens = tokens - 1.0;
            Ok(())
        } else {
            b.tokens = tokens;
            Err(((1.0 - tokens) / per_ms).ceil() as u64)
        }
    }

    /// Makes room: keys whose bucket has refilled go (they are as good as new); when
    /// none has, the least recently used goes.
    fn forget(&mut self, now: u64, per_ms: f64, burst: f64) {
        let before = self.buckets.len();
        self.buckets
            .retain(|_, b| b.tokens + now.saturating_sub(b.at_ms) as f64 * per_ms < burst);
        if self.buckets.len() == before {
            if let Some((&oldest, _)) = self.buckets.iter().min_by_key(|(_, b)| b.at_ms) {
                self.buckets.remove(&oldest);
            }
        }
    }
}

/// Buckets in Redis: one script takes a token atomically, on Redis's clock (so
/// instances with skewed clocks agree), and lets an idle key expire.
pub(crate) struct Redis {
    url: String,
    client: Option<redis::Client>,
    conn: ArcSwapOption<redis::aio::MultiplexedConnection>,
    connecting: AtomicBool,
    /// A connection was just made.
    ready: tokio::sync::Notify,
    /// In an outage (logged when it starts and when it ends).
    down: AtomicBool,
    failure_open: bool,
    script: redis::Script,
}

const SCRIPT: &str = r#"
if redis.replicate_commands then redis.replicate_commands() end
local per_ms = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local b = redis.call('HMGET', KEYS[1], 't', 'at')
local tokens = tonumber(b[1]) or burst
local at = tonumber(b[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - at) * per_ms)
local wait = 0
if tokens >= 1 then
  tokens = tokens - 1
else
  wait = math.ceil((1 - tokens) / per_ms)
end
redis.call('HSET', KEYS[1], 't', tostring(tokens), 'at', now)
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / per_ms) + 1000)
return wait
"#;

impl Redis {
    /// A client for `url`, connecting now (before the first request, when Redis is
    /// there).
    pub(crate) fn start(url: &str, failure_open: bool) -> Arc<Redis> {
        let redis = Arc::new(Redis::new(url, failure_open));
        redis.connect();
        redis
    }

    fn new(url: &str, failure_open: bool) -> Redis {
        Redis {
            url: url.to_string(),
            // Checked for shape at load; a client that still cannot be made fails
            // every check (logged once).
            client: crate::net::redis::client(url).ok(),
            conn: ArcSwapOption::empty(),
            connecting: AtomicBool::new(false),
            ready: tokio::sync::Notify::new(),
            down: AtomicBool::new(false),
            failure_open,
            script: redis::Script::new(SCRIPT),
        }
    }

    /// `Ok(None)`: a token taken; `Ok(Some(ms))`: refused, a token in `ms`.
    async fn take(
        self: &Arc<Self>,
        key: &str,
        per_ms: f64,
        burst: f64,
    ) -> Result<Option<u64>, String> {
        let start = tokio::time::Instant::now();
        // `global { redis_timeout }`: the failure mode decides past it.
        let deadline = crate::net::redis::timeout();
        let conn = match self.conn.load_full() {
            Some(c) => c,
            None => {
                // Not connected: a connection being made may still come in time.
                let ready = self.ready.notified();
                self.connect();
                let _ = tokio::time::timeout(deadline, ready).await;
                match self.conn.load_full() {
                    Some(c) => c,
                    None => return Err(self.failed("cannot connect")),
                }
            }
        };
        let mut conn = (*conn).clone();
        let budget = deadline.saturating_sub(start.elapsed());
        let mut invocation = self.script.prepare_invoke();
        invocation
            .key(format!("sluice:rl:{key}"))
            .arg(per_ms)
            .arg(burst);
        let call = invocation.invoke_async::<u64>(&mut conn);
        match tokio::time::timeout(budget, call).await {
            Ok(Ok(wait)) => {
                if self.down.swap(false, Ordering::Relaxed) {
                    tracing::info!(
                        "sluice: rate_limit store {} answers again",
                        crate::net::redis::shown(&self.url)
                    );
                }
                Ok((wait > 0).then_some(wait))
            }
            Ok(Err(e)) => {
                if e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error() {
                    self.conn.store(None);
                }
                Err(self.failed(&e.to_string()))
            }
            Err(_) => {
                // A host gone without a reset would time out forever on this connection:
                // the next check opens a new one.
                self.conn.store(None);
                Err(self.failed(&format!("no answer within {deadline:?}")))
            }
        }
    }

    /// Notes a failure; the first of an outage is logged.
    fn failed(&self, why: &str) -> String {
        if !self.down.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "sluice: rate_limit store {}: {why}; failing {} until it answers (logged once per outage)",
                crate::net::redis::shown(&self.url),
                if self.failure_open {
                    "open (requests pass unlimited)"
                } else {
                    "closed (requests get 500)"
                }
            );
        }
        why.to_string()
    }

    /// Opens the connection in the background, one attempt at a time.
    fn connect(self: &Arc<Self>) {
        let Some(client) = self.client.clone() else {
            return;
        };
        if self.connecting.swap(true, Ordering::Relaxed) {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            let opened = tokio::time::timeout(
                Duration::from_secs(2),
                client.get_multiplexed_async_connection(),
            )
            .await;
            if let Ok(Ok(c)) = opened {
                this.conn.store(Some(Arc::new(c)));
                this.ready.notify_waiters();
            } else {
                // Not too eager: the next attempt after a short pause.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            this.connecting.store(false, Ordering::Relaxed);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_refill_and_refuse() {
        let mut s = Shard::default();
        // 2 a second, burst 3.
        let per_ms = 2.0 / 1000.0;
        for _ in 0..3 {
            assert_eq!(s.take(1, 1000, per_ms, 3.0), Ok(()));
        }
        assert_eq!(s.take(1, 1000, per_ms, 3.0), Err(500));
        // Another key has its own bucket.
        assert_eq!(s.take(2, 1000, per_ms, 3.0), Ok(()));
        // Half a second later, one token.
        assert_eq!(s.take(1, 1500, per_ms, 3.0), Ok(()));
        assert!(s.take(1, 1500, per_ms, 3.0).is_err());
    }

    /// Threads read the clock at different moments: a take with an older time than
    /// the bucket's last must not move the bucket back and refill a span twice.
    #[test]
    fn an_older_reading_refills_nothing_twice() {
        let mut s = Shard::default();
        let per_ms = 2.0 / 1000.0;
        for _ in 0..3 {
            assert_eq!(s.take(1, 1000, per_ms, 3.0), Ok(()));
        }
        assert!(s.take(1, 1500, per_ms, 3.0).is_ok(), "one token by 1.5 s");
        assert!(
            s.take(1, 1000, per_ms, 3.0).is_err(),
            "an older reading adds none"
        );
        assert!(
            s.take(1, 1500, per_ms, 3.0).is_err(),
            "and 1 s to 1.5 s is not counted again"
        );
    }

    #[test]
    fn memory_is_bounded() {
        let mut s = Shard::default();
        let per_ms = 1.0 / 1000.0;
        let cap = MAX_KEYS / SHARDS;
        for k in 0..(cap as u64 * 3) {
            let _ = s.take(k, 1000 + k, per_ms, 5.0);
            assert!(s.buckets.len() <= cap);
        }
        // A full shard whose keys have all refilled forgets them all for a new one.
        let mut s = Shard::default();
        for k in 0..cap as u64 {
            let _ = s.take(k, 1000, per_ms, 5.0);
        }
        assert_eq!(s.buckets.len(), cap);
        let _ = s.take(u64::MAX, 10_000_000, per_ms, 5.0);
        assert_eq!(s.buckets.len(), 1);
    }
}
