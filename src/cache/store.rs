//! Where stored responses live: a memory store, least recently used out first by
//! bytes. Sharded by key so that hits on different keys never wait on one lock; the
//! byte total is one counter, and an insert that passes it evicts from its own shard
//! first, then from the others.
//!
//! Each key holds the variants of one URI (one per set of `Vary` values). The store
//! also keeps the fetches in flight per key (`lock`): one leader fetches, followers
//! wait for it to finish.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use tokio::sync::watch;

use super::control::ResponseDirectives;

const SHARDS: usize = 16;

/// What a stored object costs besides its body and fields: the key, the bookkeeping.
const OVERHEAD: u64 = 256;

/// One stored response, immutable once stored (a revalidation stores a new one that
/// shares the body).
pub(crate) struct Stored {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub response_time: SystemTime,
    /// The age it had on arrival (RFC 9111 §4.2.3).
    pub initial_age: Duration,
    /// Fresh for this long from its arrival age zero.
    pub lifetime: Duration,
    pub dirs: ResponseDirectives,
    /// The request's values of the fields the response varies on (lower-case names;
    /// `None`: the request did not have the field).
    pub vary: Box<[(String, Option<String>)]>,
    /// The `stale-while-revalidate` / `stale-if-error` windows: the response's own,
    /// else the cache's setting.
    pub swr: Duration,
    pub sie: Duration,
}

impl Stored {
    pub(crate) fn size(&self) -> u64 {
        let fields: usize = self
            .headers
            .iter()
            .map(|(n, v)| n.as_str().len() + v.len() + 4)
            .sum();
        self.body.len() as u64 + fields as u64 + OVERHEAD
    }

    /// How old it is now.
    pub(crate) fn age(&self, now: SystemTime) -> Duration {
        self.initial_age + now.duration_since(self.response_time).unwrap_or_default()
    }

    /// Seconds of freshness left (negative once stale), as `Cache-Status` shows it.
    pub(crate) fn ttl(&self, now: SystemTime) -> i64 {
        self.lifetime.as_secs() as i64 - self.age(now).as_secs() as i64
    }

    pub(crate) fn is_fresh(&self, now: SystemTime) -> bool {
        self.lifetime > self.age(now)
    }

    /// How long past its freshness it is (zero while fresh).
    pub(crate) fn staleness(&self, now: SystemTime) -> Duration {
        self.age(now).saturating_sub(self.lifetime)
    }
}

type Variants = Vec<Arc<Stored>>;

struct Shard {
    lru: lru::LruCache<String, Variants>,
    /// Fetches in flight, by key: followers subscribe, the leader's guard drops the
    /// sender when it is done.
    flights: std::collections::HashMap<String, watch::Receiver<()>>,
}

pub(crate) struct Store {
    /// The `store` setting as written, which a reload matches to keep the store.
    pub identity: String,
    cap: u64,
    shards: Box<[Mutex<Shard>]>,
    hasher: std::collections::hash_map::RandomState,
    bytes: AtomicU64,
    objects: AtomicU64,
}

/// Who fetches a key: this request (holding the guard until its response is stored
/// or found not storable), or another one, whose end `wait` awaits.
pub(crate) enum Flight {
    Leader(FlightGuard),
    Follower(watch::Receiver<()>),
}

pub(crate) struct FlightGuard {
    store: Arc<Store>,
    key: String,
    tx: watch::Sender<()>,
}

impl Drop for FlightGuard {
    fn drop(&mut self) {
        let mut shard = self.store.shard(&self.key);
        if shard
            .flights
            .get(&self.key)
            .is_some_and(|rx| rx.same_channel(&self.tx.subscribe()))
        {
            shard.flights.remove(&self.key);
        }
    }
}

impl Store {
    /// The store a `store` setting names.
    pub(crate) fn new(setting: &crate::config::CacheStore) -> Arc<Store> {
        match setting {
            crate::config::CacheStore::Memory(n) => Store::memory(setting.identity(), *n),
            crate::config::CacheStore::Disk(..) => {
                unreachable!("the loader refuses `store disk` until it is built")
            }
        }
    }

    pub(crate) fn memory(identity: String, cap: u64) -> Arc<Store> {
        let shards = (0..SHARDS)
            .map(|_| {
                Mutex::new(Shard {
                    lru: lru::LruCache::unbounded(),
                    flights: Default::default(),
                })
            })
            .collect();
        Arc::new(Store {
            identity,
            cap,
            shards,
            hasher: Default::default(),
            bytes: AtomicU64::new(0),
            objects: AtomicU64::new(0),
        })
    }

    fn index(&self, key: &str) -> usize {
        (self.hasher.hash_one(key) as usize) % SHARDS
    }

    fn shard(&self, key: &str) -> MutexGuard<'_, Shard> {
        lock(&self.shards[self.index(key)])
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.bytes.load(Relaxed)
    }

    pub(crate) fn objects(&self) -> u64 {
        self.objects.load(Relaxed)
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.cap
    }

    /// The variants stored for `key`, marked as just used.
    pub(crate) fn get(&self, key: &str) -> Option<Variants> {
        self.shard(key).lru.get(key).cloned()
    }

    /// Stores `obj` for `key`, replacing the variant with the same `Vary` values, then
    /// evicts the least recently used until the store fits.
    pub(crate) fn put(&self, key: &str, obj: Arc<Stored>) {
        let size = obj.size();
        if size > self.cap {
            return;
        }
        let i = self.index(key);
        {
            let mut shard = lock(&self.shards[i]);
            let variants = shard.lru.get_or_insert_mut(key.to_string(), Vec::new);
            if let Some(old) = variants.iter_mut().find(|v| v.vary == obj.vary) {
                self.forget(old.size(), 1);
                *old = obj;
            } else {
                variants.push(obj);
            }
            self.bytes.fetch_add(size, Relaxed);
            self.objects.fetch_add(1, Relaxed);
        }
        self.evict(i, key);
    }

    fn forget(&self, bytes: u64, objects: u64) {
        self.bytes.fetch_sub(bytes, Relaxed);
        self.objects.fetch_sub(objects, Relaxed);
    }

    /// Drops least recently used keys, from `key`'s shard first (never `key` itself,
    /// just stored), then from the others, while the store is over its size. Each
    /// shard's order is exact; across shards it is an approximation.
    fn evict(&self, first: usize, key: &str) {
        for k in 0..SHARDS {
            if self.bytes() <= self.cap {
                return;
            }
            let mut shard = lock(&self.shards[(first + k) % SHARDS]);
            while self.bytes() > self.cap {
                if shard.lru.peek_lru().is_none_or(|(k, _)| k == key) {
                    break;
                }
                let Some((_, variants)) = shard.lru.pop_lru() else {
                    break;
                };
                let bytes = variants.iter().map(|v| v.size()).sum();
                self.forget(bytes, variants.len() as u64);
            }
        }
    }

    /// Removes `key` (every variant); how many objects went.
    pub(crate) fn remove(&self, key: &str) -> u64 {
        match self.shard(key).lru.pop(key) {
            Some(variants) => self.dropped(&variants),
            None => 0,
        }
    }

    fn dropped(&self, variants: &Variants) -> u64 {
        let bytes = variants.iter().map(|v| v.size()).sum();
        self.forget(bytes, variants.len() as u64);
        variants.len() as u64
    }

    /// Removes every key `keep` says no to; how many objects went.
    pub(crate) fn purge(&self, mut matches: impl FnMut(&str) -> bool) -> u64 {
        let mut purged = 0;
        for s in self.shards.iter() {
            let mut shard = lock(s);
            let doomed: Vec<String> = shard
                .lru
                .iter()
                .filter(|(k, _)| matches(k))
                .map(|(k, _)| k.clone())
                .collect();
            for k in doomed {
                if let Some(v) = shard.lru.pop(&k) {
                    purged += self.dropped(&v);
                }
            }
        }
        purged
    }

    /// Joins the fetch of `key`: leads it when none is in flight.
    pub(crate) fn join(self: &Arc<Self>, key: &str) -> Flight {
        let mut shard = self.shard(key);
        if let Some(rx) = shard.flights.get(key) {
            return Flight::Follower(rx.clone());
        }
        let (tx, rx) = watch::channel(());
        shard.flights.insert(key.to_string(), rx);
        Flight::Leader(FlightGuard {
            store: self.clone(),
            key: key.to_string(),
            tx,
        })
    }
}

/// A follower's wait for the leader's end, at most `limit`.
pub(crate) async fn wait(mut rx: watch::Receiver<()>, limit: Duration) {
    let _ = tokio::time::timeout(limit, rx.changed()).await;
}

/// A shard's lock; a panic elsewhere while it was held leaves consistent data (every
/// change is one map operation), so a poisoned lock is taken as it is.
fn lock(m: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(body: usize, vary: &str) -> Arc<Stored> {
        let now = SystemTime::now();
        Arc::new(Stored {
            status: StatusCode::OK,
            headers: HeaderMap::new(),
            body: Bytes::from(vec![b'x'; body]),
            response_time: now,
            initial_age: Duration::ZERO,
            lifetime: Duration::from_secs(60),
            dirs: Default::default(),
            vary: vec![("accept".to_string(), Some(vary.to_string()))].into(),
            swr: Duration::ZERO,
            sie: Duration::ZERO,
        })
    }

    #[test]
    fn the_store_stays_within_its_size_and_keeps_what_was_just_stored() {
        let store = Store::memory("memory".into(), 4 * (1000 + OVERHEAD));
        for k in 0..64 {
            let key = format!("GET h /{k}");
            store.put(&key, object(1000, "a"));
            assert!(store.get(&key).is_some(), "{key} was just stored");
            assert!(store.bytes() <= store.capacity());
            assert!(store.objects() <= 4);
        }
        // Within one key's shard the order is exact: touched survives untouched.
        let one = Store::memory("memory".into(), 2 * (1000 + OVERHEAD));
        let keys: Vec<String> = (0..1000)
            .map(|k| format!("GET h /{k}"))
            .filter(|k| one.index(k) == one.index("GET h /0"))
            .take(3)
            .collect();
        one.put(&keys[0], object(1000, "a"));
        one.put(&keys[1], object(1000, "a"));
        assert!(one.get(&keys[0]).is_some());
        one.put(&keys[2], object(1000, "a"));
        assert!(one.get(&keys[0]).is_some(), "recently used");
        assert!(one.get(&keys[1]).is_none(), "least recently used");
    }

    #[test]
    fn variants_replace_their_own_kind_and_purge_counts_them() {
        let store = Store::memory("memory".into(), 1 << 20);
        store.put("GET h /x", object(10, "a"));
        store.put("GET h /x", object(20, "b"));
        store.put("GET h /x", object(30, "a"));
        assert_eq!(store.get("GET h /x").unwrap().len(), 2);
        assert_eq!(store.objects(), 2);
        store.put("GET h /y", object(10, "a"));
        assert_eq!(store.purge(|k| k.starts_with("GET h /x")), 2);
        assert_eq!(store.objects(), 1);
        assert_eq!(store.remove("GET h /y"), 1);
        assert_eq!((store.objects(), store.bytes()), (0, 0));
    }

    #[tokio::test]
    async fn one_leads_a_flight_and_the_others_wait_for_its_end() {
        let store = Store::memory("memory".into(), 1 << 20);
        let Flight::Leader(lead) = store.join("k") else {
            panic!("the first leads")
        };
        let Flight::Follower(rx) = store.join("k") else {
            panic!("the second follows")
        };
        let waiting = tokio::spawn(wait(rx, Duration::from_secs(5)));
        drop(lead);
        tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("the follower wakes when the leader lands")
            .unwrap();
        assert!(matches!(store.join("k"), Flight::Leader(_)));
    }
}
