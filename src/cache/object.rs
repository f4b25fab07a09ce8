//! What a cache stores: one response, immutable once stored, and where its body
//! lies (in memory, or in a disk store's file). The store keeps them; the disk store
//! writes and reads them.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, StatusCode};

use super::control::ResponseDirectives;

/// What a stored object costs besides its key, body and fields: the bookkeeping.
pub(crate) const OVERHEAD: u64 = 256;

/// Where a stored body lies: a file, from `offset`, `len` bytes.
#[derive(Debug)]
pub(crate) struct OnDisk {
    pub path: PathBuf,
    pub offset: u64,
    pub len: u64,
}

/// A stored body: in memory, or in a disk store's file.
#[derive(Clone)]
pub(crate) enum Held {
    Memory(Bytes),
    Disk(Arc<OnDisk>),
}

impl Held {
    pub(crate) fn len(&self) -> u64 {
        match self {
            Held::Memory(b) => b.len() as u64,
            Held::Disk(d) => d.len,
        }
    }

    /// Both are the same file (a revalidated object keeps its body's file).
    pub(crate) fn same_file(&self, other: &Held) -> bool {
        matches!((self, other), (Held::Disk(a), Held::Disk(b)) if Arc::ptr_eq(a, b))
    }
}

/// One stored response, immutable once stored (a revalidation stores a new one that
/// shares the body).
#[derive(Clone)]
pub(crate) struct Stored {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Held,
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
        let vary: usize = self
            .vary
            .iter()
            .map(|(n, v)| n.len() + v.as_ref().map_or(0, String::len) + 8)
            .sum();
        self.body.len() + (fields + vary) as u64 + OVERHEAD
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
