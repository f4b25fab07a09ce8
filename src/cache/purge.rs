//! Purging stored responses: by key, by prefix, or all; and, for caches with a
//! `purge_store redis://…`, the same purge published on a Redis channel that every
//! instance subscribes to, so one `POST /purge` reaches them all.
//!
//! A subscriber per distinct `purge_store` runs for as long as a generation uses it
//! (carried across reloads like the stores); it reconnects after a lost connection,
//! once a second, and says so in the log once per outage.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use futures_util::StreamExt;

use super::Store;

/// The channel purges travel on.
const CHANNEL: &str = "sluice:cache:purge";

/// What to purge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Purge {
    /// One key, every variant: `GET app.test /x`.
    Key(String),
    /// Every key that starts with this, or whose part after the method does
    /// (`app.test /img/`).
    Prefix(String),
    All,
}

impl std::fmt::Display for Purge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Purge::Key(k) => write!(f, "key {k:?}"),
            Purge::Prefix(p) => write!(f, "prefix {p:?}"),
            Purge::All => f.write_str("everything"),
        }
    }
}

impl Purge {
    fn to_json(&self, from: u64) -> String {
        let v = match self {
            Purge::Key(k) => serde_json::json!({ "key": k, "from": from }),
            Purge::Prefix(p) => serde_json::json!({ "prefix": p, "from": from }),
            Purge::All => serde_json::json!({ "all": true, "from": from }),
        };
        v.to_string()
    }

    /// A message from the channel, and the instance that sent it.
    fn from_json(text: &str) -> Option<(Purge, u64)> {
        let v: serde_json::Value = serde_json::from_str(text).ok()?;
        let from = v["from"].as_u64().unwrap_or(0);
        let p = if let Some(k) = v["key"].as_str() {
            Purge::Key(k.to_string())
        } else if let Some(p) = v["prefix"].as_str() {
            Purge::Prefix(p.to_string())
        } else if v["all"].as_bool() == Some(true) {
            Purge::All
        } else {
            return None;
        };
        Some((p, from))
    }

    /// Keys are stored as `NAMESPACE\nGET SCHEME HOST TARGET[ FIELDS]`; a purge names
    /// the part after the newline, with or without the scheme and the Host's port
    /// (`GET app.test /x` purges `/x` over both schemes and any port).
    fn apply(&self, store: &Store) -> u64 {
        match self {
            Purge::Key(key) => {
                let with_fields = format!("{key} ");
                store.purge(|k| spellings(k).any(|v| v == *key || v.starts_with(&with_fields)))
            }
            Purge::Prefix(p) => store.purge(|k| {
                spellings(k).any(|v| {
                    v.starts_with(p.as_str())
                        || v.split_once(' ')
                            .is_some_and(|(_, rest)| rest.starts_with(p.as_str()))
                })
            }),
            Purge::All => store.purge(|_| true),
        }
    }
}

/// The ways a purge may name a stored key: as stored, without its scheme, and both
/// without the Host's port.
fn spellings(stored: &str) -> impl Iterator<Item = String> + '_ {
    let visible = stored.split_once('\n').map_or(stored, |(_, v)| v);
    let mut words = visible.splitn(4, ' ');
    let (method, scheme, host, rest) = (
        words.next().unwrap_or(""),
        words.next().unwrap_or(""),
        words.next().unwrap_or(""),
        words.next().unwrap_or(""),
    );
    let name = match host.rfind(':') {
        Some(i) if !host[i..].contains(']') => &host[..i],
        _ => host,
    };
    [
        format!("{method} {scheme} {host} {rest}"),
        format!("{method} {host} {rest}"),
        format!("{method} {scheme} {name} {rest}"),
        format!("{method} {name} {rest}"),
    ]
    .into_iter()
}

/// Applies `what` to every store; how many objects went.
pub(crate) fn purge<'a>(stores: impl IntoIterator<Item = &'a Arc<Store>>, what: &Purge) -> u64 {
    stores.into_iter().map(|s| what.apply(s)).sum()
}

/// This process, as the sender of the purges it publishes (its own come back to it
/// and are skipped).
fn instance() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static ID: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *ID.get_or_init(|| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.finish() | 1
    })
}

/// One `purge_store`: publishes purges, and applies the ones other instances publish
/// to the stores of the caches that name it.
pub(crate) struct Publisher {
    pub url: String,
    client: Option<redis::Client>,
    stores: Arc<ArcSwap<Vec<Arc<Store>>>>,
    listener: tokio::task::JoinHandle<()>,
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

impl Publisher {
    /// Starts listening on `url` (within the tokio runtime).
    pub(crate) fn new(url: &str) -> Arc<Publisher> {
        let client = crate::net::redis::client(url).ok();
        let stores: Arc<ArcSwap<Vec<Arc<Store>>>> = Default::default();
        let listener = tokio::spawn(listen(client.clone(), url.to_string(), stores.clone()));
        Arc::new(Publisher {
            url: url.to_string(),
            client,
            stores,
            listener,
        })
    }

    /// The stores purges from other instances apply to (this generation's).
    pub(crate) fn serve(&self, stores: Vec<Arc<Store>>) {
        self.stores.store(Arc::new(stores));
    }

    /// Sends `what` to the other instances, in the background.
    fn publish(&self, what: &Purge) {
        let Some(client) = self.client.clone() else {
            return;
        };
        let (msg, url) = (
            what.to_json(instance()),
            crate::net::redis::shown(&self.url),
        );
        tokio::spawn(async move {
            let sent = async {
                let mut conn = client.get_multiplexed_async_connection().await?;
                redis::cmd("PUBLISH")
                    .arg(CHANNEL)
                    .arg(&msg)
                    .query_async::<i64>(&mut conn)
                    .await
            };
            match tokio::time::timeout(Duration::from_secs(5), sent).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::warn!("sluice: cache: purge not published to {url}: {e}"),
                Err(_) => {
                    tracing::warn!("sluice: cache: purge not published to {url}: no answer in 5s")
                }
            }
        });
    }
}

/// Publishes `what` on every `purge_store`.
pub(crate) fn publish<'a>(publishers: impl Iterator<Item = &'a Arc<Publisher>>, what: &Purge) {
    for p in publishers {
        p.publish(what);
    }
}

/// Subscribes to the channel and applies what others publish; reconnects once a
/// second after a failure.
async fn listen(client: Option<redis::Client>, url: String, stores: Arc<ArcSwap<Vec<Arc<Store>>>>) {
    // What the log says of the address: never its password.
    let url = crate::net::redis::shown(&url);
    let Some(client) = client else {
        tracing::warn!("sluice: cache: purge_store {url} is not a usable Redis address");
        return;
    };
    let mut down = false;
    loop {
        let why = match client.get_async_pubsub().await {
            Ok(mut sub) => match sub.subscribe(CHANNEL).await {
                Ok(()) => {
                    if down {
                        tracing::info!("sluice: cache: purge_store {url} is reachable again");
                    }
                    down = false;
                    let mut messages = sub.on_message();
                    while let Some(msg) = messages.next().await {
                        apply(&msg, &stores);
                    }
                    "the connection closed".to_string()
                }
                Err(e) => format!("subscribe failed: {e}"),
            },
            Err(e) => e.to_string(),
        };
        if !down {
            tracing::warn!("sluice: cache: purge_store {url}: {why}; purges from other instances wait until it is back (retrying every second)");
        }
        down = true;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// One message from the channel, applied unless this instance sent it.
fn apply(msg: &redis::Msg, stores: &ArcSwap<Vec<Arc<Store>>>) {
    let Ok(text) = msg.get_payload::<String>() else {
        return;
    };
    let Some((what, from)) = Purge::from_json(&text) else {
        return;
    };
    if from == instance() {
        return;
    }
    let n = purge(stores.load().iter(), &what);
    tracing::info!("sluice: cache: purged {n} objects ({what}) published by another instance");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_purge_names_a_key_with_or_without_its_scheme_and_port() {
        let stored = "route\nGET https app.test:8443 /x?a=1 accept-language=en";
        let named = |key: &str| {
            let with_fields = format!("{key} ");
            spellings(stored).any(|v| v == key || v.starts_with(&with_fields))
        };
        for key in [
            "GET https app.test:8443 /x?a=1",
            "GET app.test:8443 /x?a=1",
            "GET https app.test /x?a=1",
            "GET app.test /x?a=1",
            "GET app.test /x?a=1 accept-language=en",
        ] {
            assert!(named(key), "{key}");
        }
        for key in [
            "GET http app.test:8443 /x?a=1",
            "GET app.test:80 /x?a=1",
            "GET app.test /x",
            "GET other.test /x?a=1",
        ] {
            assert!(!named(key), "{key}");
        }
    }
}
