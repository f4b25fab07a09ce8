//! What a generation hands the next: every piece of state that must outlive a reload,
//! found by identity.
//!
//! One rule for all of it ([`Filling::take`]): a new generation's state of an identity
//! is the one this generation already took (two routes on one cache store share it);
//! else what the kind's own constructor makes of the previous generation's state of
//! that identity — the same thing, refitted to the new settings (a pool's `limit`, a
//! store's size, a FastCGI pool's `max_conns`: resized, so "at most N" holds across the
//! swap), or a new one when the settings changed what it is. Whatever the new
//! generation did not keep is gone: once the swap made it live, each is retired
//! ([`Carried::retire`]: background work stops, and what requests still running on the
//! old generation hold drains as they end).
//!
//! A kind of carried state is one line of the `kept!` list below.

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;

/// State that may outlive the generation that made it.
pub(crate) trait Carried: Send + Sync {
    /// The live generation no longer has it (see the module).
    fn retire(&self) {}
}

/// One kind of a generation's carried state, by identity.
pub(crate) struct Shelf<K, V>(HashMap<K, Arc<V>>);

impl<K, V> Default for Shelf<K, V> {
    fn default() -> Self {
        Shelf(HashMap::new())
    }
}

impl<K: Eq + Hash, V: Carried> Shelf<K, V> {
    pub(crate) fn values(&self) -> impl Iterator<Item = &Arc<V>> {
        self.0.values()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    #[cfg(test)]
    fn get_for_test(&self, key: &K) -> Option<&Arc<V>> {
        self.0.get(key)
    }

    /// Retires what `next` does not hold under the same identity.
    fn retire_gone(&self, next: &Shelf<K, V>) {
        for (k, v) in &self.0 {
            if !next.0.get(k).is_some_and(|n| Arc::ptr_eq(n, v)) {
                v.retire();
            }
        }
    }
}

/// A shelf being filled while a generation compiles, the previous generation's at hand.
pub(crate) struct Filling<'a, K, V> {
    before: Option<&'a Shelf<K, V>>,
    now: RefCell<HashMap<K, Arc<V>>>,
}

impl<'a, K: Eq + Hash + Clone, V> Filling<'a, K, V> {
    fn new(before: Option<&'a Shelf<K, V>>) -> Self {
        Filling {
            before,
            now: RefCell::default(),
        }
    }

    /// The state of identity `key` in the generation being made: the one it took
    /// already, else `make` of the previous generation's (see the module).
    pub(crate) fn take(&self, key: K, make: impl FnOnce(Option<&Arc<V>>) -> Arc<V>) -> Arc<V> {
        if let Some(v) = self.now.borrow().get(&key) {
            return v.clone();
        }
        let v = make(self.before.and_then(|b| b.0.get(&key)));
        self.now.borrow_mut().insert(key, v.clone());
        v
    }

    /// Whether the generation being made took `key` already (alike identities are
    /// numbered by it).
    pub(crate) fn has(&self, key: &K) -> bool {
        self.now.borrow().contains_key(key)
    }

    fn done(self) -> Shelf<K, V> {
        Shelf(self.now.into_inner())
    }
}

macro_rules! kept {
    ($($(#[$doc:meta])* $name:ident: $key:ty => $value:ty,)*) => {
        /// Everything a generation hands the next, by identity.
        #[derive(Default)]
        pub(crate) struct Kept {
            $($(#[$doc])* pub $name: Shelf<$key, $value>,)*
        }

        /// [`Kept`] being filled while a generation compiles.
        pub(crate) struct Filled<'a> {
            $(pub $name: Filling<'a, $key, $value>,)*
        }

        impl Kept {
            /// An empty [`Kept`] to fill, the previous generation's at hand.
            pub(crate) fn fill(before: Option<&Kept>) -> Filled<'_> {
                Filled {
                    $($name: Filling::new(before.map(|b| &b.$name)),)*
                }
            }

            /// Retires what `next`, now live, did not keep.
            pub(crate) fn retire_gone(&self, next: &Kept) {
                $(self.$name.retire_gone(&next.$name);)*
            }
        }

        impl Filled<'_> {
            pub(crate) fn done(self) -> Kept {
                Kept {
                    $($name: self.$name.done(),)*
                }
            }
        }
    };
}

kept! {
    /// Pools' peers, health, passive state, kept connections and `limit`.
    pools: crate::upstream::PoolId => crate::upstream::PoolState,
    /// FastCGI pools, by route name and occurrence: connections and `max_conns` places.
    fastcgi: (String, usize) => crate::fastcgi::pool::Pool,
    /// The FastCGI applications, by address, each knowing the pools that reach it.
    fastcgi_apps: crate::config::Target => crate::fastcgi::pool::App,
    /// In-memory `rate_limit` buckets, by filter identity.
    rates: String => crate::filter::rate_limit::Memory,
    /// `rate_limit`'s Redis clients, by address, failure mode and (for `rediss://`)
    /// the `redis_ca` they verify against.
    redis: ((String, Option<Arc<Vec<u8>>>), bool) => crate::filter::rate_limit::Redis,
    /// Cache stores, by their `store` setting.
    stores: String => crate::cache::Store,
    /// Cache purge publishers, by `purge_store` URL and (for `rediss://`) the
    /// `redis_ca` they verify against.
    publishers: (String, Option<Arc<Vec<u8>>>) => crate::cache::Publisher,
    /// Request meters, by `site` and `route` labels.
    meters: (String, String) => crate::stats::Meter,
    /// Listeners' refusal counts, by listener name.
    refused: String => crate::filter::conn::Refused,
    /// The resolver and its cache, by its servers.
    dns: Vec<std::net::SocketAddr> => crate::safety::Dns,
    /// DNS discovery of pools' peers, by source (and the servers that answer it).
    discovery: (crate::config::Discover, Vec<std::net::SocketAddr>) => crate::upstream::discover::Discovery,
    /// The process-wide cap on health probes at once.
    probe_slots: () => tokio::sync::Semaphore,
    /// `tls auto`'s certificates and orders, while the `acme` settings stay.
    acme: () => crate::acme::Manager,
    /// Sites' OCSP staples, by site: a reload does not fetch them again.
    staplers: String => crate::runtime::ocsp::Stapler,
    /// Sites' own access logs (their writer threads), by destination and format.
    site_logs: crate::config::AccessLogConfig => crate::access::AccessLog,
    /// The OpenTelemetry exporter (its queue and task), while `tracing otlp` stays.
    tracers: crate::config::OtlpConfig => crate::otel::Tracer,
    /// `jwt` key sets fetched from a JWKS URL, by URL: a reload keeps the last good
    /// set (and applies its `refresh`).
    jwks: String => crate::filter::jwt::Jwks,
    /// `challenge` keys of a `secret_file`, by secret, with the nonces used: a reload
    /// does not make a used nonce good again.
    challenge_keys: Vec<u8> => crate::filter::challenge::Keys,
}

impl Carried for crate::access::AccessLog {}
impl Carried for crate::otel::Tracer {}
impl Carried for crate::filter::challenge::Keys {}

impl Carried for crate::filter::jwt::Jwks {
    fn retire(&self) {
        crate::filter::jwt::Jwks::retire(self);
    }
}

impl Carried for crate::upstream::PoolState {
    fn retire(&self) {
        crate::upstream::PoolState::retire(self);
    }
}

impl Carried for crate::fastcgi::pool::Pool {}
impl Carried for crate::fastcgi::pool::App {}
impl Carried for crate::filter::rate_limit::Memory {}
impl Carried for crate::filter::rate_limit::Redis {}
impl Carried for crate::cache::Store {}
impl Carried for crate::cache::Publisher {}
impl Carried for crate::stats::Meter {}
impl Carried for crate::filter::conn::Refused {}
impl Carried for crate::safety::Dns {}
impl Carried for tokio::sync::Semaphore {}
impl Carried for crate::acme::Manager {}
impl Carried for crate::runtime::ocsp::Stapler {}

impl Carried for crate::upstream::discover::Discovery {
    fn retire(&self) {
        crate::upstream::discover::Discovery::retire(self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[derive(Default)]
    struct Thing {
        size: AtomicUsize,
        retired: AtomicUsize,
    }

    impl Carried for Thing {
        fn retire(&self) {
            self.retired.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The kind's own rule: the previous one refitted when it exists, else a new one.
    fn take(f: &Filling<'_, &'static str, Thing>, key: &'static str, size: usize) -> Arc<Thing> {
        f.take(key, |before| match before {
            Some(t) => {
                t.size.store(size, Ordering::Relaxed);
                t.clone()
            }
            None => Arc::new(Thing {
                size: size.into(),
                ..Default::default()
            }),
        })
    }

    #[test]
    fn the_same_identity_is_carried_refitted_and_what_is_gone_is_retired() {
        let first: Filling<'_, &'static str, Thing> = Filling::new(None);
        let a = take(&first, "a", 1);
        let b = take(&first, "b", 1);
        assert!(Arc::ptr_eq(&a, &take(&first, "a", 9)), "one per identity");
        assert_eq!(
            a.size.load(Ordering::Relaxed),
            1,
            "the first taker's settings"
        );
        let first = first.done();

        let second = Filling::new(Some(&first));
        let a2 = take(&second, "a", 5);
        let c = take(&second, "c", 1);
        let second = second.done();
        assert!(Arc::ptr_eq(&a, &a2), "carried");
        assert_eq!(
            a.size.load(Ordering::Relaxed),
            5,
            "refitted to the new settings"
        );
        assert!(second.get_for_test(&"b").is_none(), "not taken: not kept");

        first.retire_gone(&second);
        assert_eq!(a.retired.load(Ordering::Relaxed), 0, "kept: not retired");
        assert_eq!(b.retired.load(Ordering::Relaxed), 1, "gone: retired once");
        assert_eq!(c.retired.load(Ordering::Relaxed), 0);

        // A kind whose constructor makes a new one under the same identity (settings
        // that changed what it is): the old one is retired at the swap.
        let third = Filling::new(Some(&second));
        let fresh = third.take("c", |_| Arc::new(Thing::default()));
        let third = third.done();
        assert!(!Arc::ptr_eq(&c, &fresh));
        second.retire_gone(&third);
        assert_eq!(c.retired.load(Ordering::Relaxed), 1, "replaced: retired");
        assert_eq!(
            a.retired.load(Ordering::Relaxed),
            1,
            "not taken again: gone"
        );
    }
}
