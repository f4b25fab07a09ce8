//! Where stored responses live: a memory store, least recently used out first by
//! bytes. Sharded by key so that hits on different keys never wait on one lock; the
//! byte total is one counter. Every use stamps its key from one clock, so eviction
//! goes by the whole store's recency: the least recently used key of all is the
//! oldest of the shards' least recently used ones (DESIGN §18.1).
//!
//! What an object costs counts everything it keeps in memory: its key (a query
//! string can be long), its fields, the request values of its `Vary` fields and its
//! body (unless on disk), so distinct keys cannot grow memory past the store's size.
//!
//! Each key holds the variants of one URI (one per set of `Vary` values). The store
//! also keeps the fetches in flight per key (`lock`): one leader fetches, followers
//! wait for it to finish.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;

use super::disk;
use super::object::OnDisk;
#[cfg(test)]
use super::object::OVERHEAD;
pub(crate) use super::object::{Held, Stored};

const SHARDS: usize = 16;

/// The most variants one key keeps (one per set of `Vary` values): a field with
/// endless values (`User-Agent`) must not fill the store under one key. The oldest
/// stored goes first.
const MAX_VARIANTS: usize = 32;

type Variants = Vec<Arc<Stored>>;

/// What a key holds, and when it was last used (the store's clock).
struct Entry {
    used: u64,
    variants: Variants,
}

/// What keeping `obj` under `key` costs the store.
fn cost(key: &str, obj: &Stored) -> u64 {
    obj.size() + key.len() as u64
}

struct Shard {
    lru: lru::LruCache<String, Entry>,
    /// Fetches in flight, by key: followers subscribe, the leader's guard drops the
    /// sender when it is done.
    flights: std::collections::HashMap<String, watch::Receiver<()>>,
}

pub(crate) struct Store {
    /// The `store` setting as written, which a reload matches to keep the store.
    pub identity: String,
    /// A disk store's folder; bodies are written there as they are stored.
    dir: Option<std::path::PathBuf>,
    /// Bytes; a reload may change a disk store's size.
    cap: AtomicU64,
    shards: Box<[Mutex<Shard>]>,
    hasher: std::collections::hash_map::RandomState,
    bytes: AtomicU64,
    objects: AtomicU64,
    /// Stamps each use of a key, for recency across shards.
    clock: AtomicU64,
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
            crate::config::CacheStore::Disk(dir, n) => Store::disk(setting.identity(), dir, *n),
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
            dir: None,
            cap: AtomicU64::new(cap),
            shards,
            hasher: Default::default(),
            bytes: AtomicU64::new(0),
            objects: AtomicU64::new(0),
            clock: AtomicU64::new(0),
        })
    }

    /// A disk store on `dir`, holding what its complete files hold (the incomplete
    /// ones are deleted), least recently stored evicted first if they no longer fit.
    pub(crate) fn disk(identity: String, dir: &std::path::Path, cap: u64) -> Arc<Store> {
        let mut store = Store::memory(identity, cap);
        Arc::get_mut(&mut store).expect("just made").dir = Some(dir.to_path_buf());
        if let Err(e) = disk::make_dir(dir) {
            tracing::warn!(
                "sluice: cache: disk store {}: {e}; objects stay in memory until it can be written",
                dir.display()
            );
        }
        let (found, dropped) = disk::open(dir);
        let n = found.len();
        for (key, obj) in found {
            store.put(&key, Arc::new(obj));
        }
        tracing::info!(
            "sluice: cache: disk store {}: {n} objects, {} bytes{}",
            dir.display(),
            store.bytes(),
            if dropped > 0 {
                format!("; {dropped} incomplete files deleted")
            } else {
                String::new()
            }
        );
        store
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
        self.cap()
    }

    fn cap(&self) -> u64 {
        self.cap.load(Relaxed)
    }

    /// A new size (a reload); a smaller one takes effect as objects are stored.
    pub(crate) fn resize(&self, cap: u64) {
        self.cap.store(cap, Relaxed);
    }

    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Relaxed)
    }

    /// The variants stored for `key`, marked as just used.
    pub(crate) fn get(&self, key: &str) -> Option<Variants> {
        let mut shard = self.shard(key);
        let entry = shard.lru.get_mut(key)?;
        entry.used = self.tick();
        Some(entry.variants.clone())
    }

    /// Stores `obj` for `key`, replacing the variant with the same `Vary` values, then
    /// evicts the least recently used until the store fits. A disk store serves a new
    /// body from memory until its file is written (off the worker threads).
    pub(crate) fn put(self: &Arc<Self>, key: &str, obj: Arc<Stored>) {
        let size = cost(key, &obj);
        if size > self.cap() {
            return;
        }
        {
            let mut shard = self.shard(key);
            let entry = shard.lru.get_or_insert_mut(key.to_string(), || Entry {
                used: 0,
                variants: Vec::new(),
            });
            entry.used = self.tick();
            let variants = &mut entry.variants;
            if let Some(old) = variants.iter_mut().find(|v| v.vary == obj.vary) {
                self.forget(cost(key, old), 1);
                if !old.body.same_file(&obj.body) {
                    unlink(old);
                }
                *old = obj.clone();
            } else {
                if variants.len() >= MAX_VARIANTS {
                    let oldest = variants.remove(0);
                    self.forget(cost(key, &oldest), 1);
                    unlink(&oldest);
                }
                variants.push(obj.clone());
            }
            self.bytes.fetch_add(size, Relaxed);
            self.objects.fetch_add(1, Relaxed);
        }
        self.evict(key);
        if let (Some(dir), Held::Memory(_)) = (&self.dir, &obj.body) {
            let (store, dir, key) = (self.clone(), dir.clone(), key.to_string());
            let write = move || match disk::write(&dir, &key, &obj) {
                Ok(at) => store.settle(&key, &obj, at),
                Err(e) => tracing::warn!(
                    "sluice: cache: {}: cannot write {key}: {e}; it stays in memory until evicted",
                    dir.display()
                ),
            };
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => drop(rt.spawn_blocking(write)),
                Err(_) => write(),
            }
        }
    }

    /// Puts `new` in `old`'s place (a revalidated object), only if `old` is still
    /// stored: a purge or an eviction meanwhile must not be undone (nor a file that
    /// went be pointed at again).
    pub(crate) fn replace(self: &Arc<Self>, key: &str, old: &Arc<Stored>, new: Arc<Stored>) {
        let mut shard = self.shard(key);
        let Some(slot) = shard
            .lru
            .get_mut(key)
            .and_then(|e| e.variants.iter_mut().find(|v| Arc::ptr_eq(v, old)))
        else {
            return;
        };
        let (before, after) = (cost(key, old), cost(key, &new));
        *slot = new;
        drop(shard);
        self.forget(before, 0);
        self.bytes.fetch_add(after, Relaxed);
    }

    /// `obj`'s body is now in its file: the index points there, unless `obj` went
    /// meanwhile (then the file goes too).
    fn settle(&self, key: &str, obj: &Arc<Stored>, at: OnDisk) {
        let mut shard = self.shard(key);
        let slot = shard
            .lru
            .peek_mut(key)
            .and_then(|e| e.variants.iter_mut().find(|v| Arc::ptr_eq(v, obj)));
        match slot {
            Some(v) => {
                let mut on_disk = (**v).clone();
                on_disk.body = Held::Disk(Arc::new(at));
                *v = Arc::new(on_disk);
            }
            None => {
                let _ = std::fs::remove_file(&at.path);
            }
        }
    }

    fn forget(&self, bytes: u64, objects: u64) {
        self.bytes.fetch_sub(bytes, Relaxed);
        self.objects.fetch_sub(objects, Relaxed);
    }

    /// Drops the least recently used key of the whole store (never `key`, just
    /// stored) while the store is over its size: each shard's order is exact and
    /// every use is stamped from one clock, so the oldest of the shards' oldest is
    /// the store's.
    fn evict(&self, key: &str) {
        while self.bytes() > self.cap() {
            let oldest = self
                .shards
                .iter()
                .enumerate()
                .filter_map(|(i, s)| {
                    let shard = lock(s);
                    let (k, e) = shard.lru.peek_lru()?;
                    (k != key).then_some((e.used, i))
                })
                .min();
            let Some((used, i)) = oldest else { return };
            let mut shard = lock(&self.shards[i]);
            // Used again since it was looked at: look again.
            if shard.lru.peek_lru().is_none_or(|(_, e)| e.used != used) {
                continue;
            }
            if let Some((k, e)) = shard.lru.pop_lru() {
                self.dropped(&k, &e.variants);
            }
        }
    }

    /// Removes `key` (every variant); how many objects went.
    pub(crate) fn remove(&self, key: &str) -> u64 {
        match self.shard(key).lru.pop(key) {
            Some(e) => self.dropped(key, &e.variants),
            None => 0,
        }
    }

    fn dropped(&self, key: &str, variants: &Variants) -> u64 {
        variants.iter().for_each(|v| unlink(v));
        let bytes = variants.iter().map(|v| cost(key, v)).sum();
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
                if let Some(e) = shard.lru.pop(&k) {
                    purged += self.dropped(&k, &e.variants);
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

/// Deletes a dropped object's file, if it has one.
fn unlink(obj: &Stored) {
    if let Held::Disk(d) = &obj.body {
        if let Err(e) = std::fs::remove_file(&d.path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!("sluice: cache: cannot delete {}: {e}", d.path.display());
            }
        }
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
    use bytes::Bytes;
    use http::{HeaderMap, StatusCode};
    use std::time::SystemTime;

    fn object(body: usize, vary: &str) -> Arc<Stored> {
        let now = SystemTime::now();
        Arc::new(Stored {
            status: StatusCode::OK,
            headers: HeaderMap::new(),
            body: Held::Memory(Bytes::from(vec![b'x'; body])),
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
        // The order is the whole store's, whichever shards the keys fall in.
        for round in 0..50 {
            let one = Store::memory("memory".into(), 2 * (1000 + OVERHEAD + 40));
            let keys: Vec<String> = (0..3).map(|k| format!("GET h /{round}-{k}")).collect();
            one.put(&keys[0], object(1000, "a"));
            one.put(&keys[1], object(1000, "a"));
            assert!(one.get(&keys[0]).is_some());
            one.put(&keys[2], object(1000, "a"));
            assert!(one.get(&keys[0]).is_some(), "{round}: recently used");
            assert!(one.get(&keys[1]).is_none(), "{round}: least recently used");
        }
    }

    #[test]
    fn keys_and_vary_values_count_in_the_store_size() {
        let store = Store::memory("memory".into(), 1 << 20);
        let long = format!("GET h /?q={}", "x".repeat(4000));
        store.put(&long, object(10, "a"));
        assert!(
            store.bytes() >= 4000 + 10,
            "a long key counts: {} bytes",
            store.bytes()
        );
        let before = store.bytes();
        store.put(&long, object(10, &"v".repeat(3000)));
        assert!(store.bytes() >= before + 3000 + 4000, "a vary value counts");
        store.remove(&long);
        assert_eq!((store.objects(), store.bytes()), (0, 0));
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
