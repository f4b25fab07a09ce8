//! Automatic certificates (DESIGN §15.5): `tls auto` sites get theirs from an ACME
//! server (RFC 8555, through `instant-acme`), kept in a folder or in Redis, renewed in
//! the background.
//!
//! One [`Manager`] per set of `acme` settings, carried across reloads while they stay
//! the same. It holds a [`Managed`] certificate per distinct set of site names: the
//! generation's certificate slot shares its `current` key, so a new certificate serves
//! the next handshake without a reload, and connections already open keep theirs. A
//! reload that keeps a site's names keeps its `Managed` (and never orders again); each
//! `Managed` has one task ([`task`]) that ends when no generation holds it.
//!
//! Storage is read when the certificate is made (so the first handshake after a start
//! already gets the stored one) and by the task; certificates are stored per ACME
//! directory, so pointing `directory` at another server orders from it.
//!
//! Challenges: HTTP-01 answers wait in [`Manager::http01`] for the plain listeners
//! (asked before routing); TLS-ALPN-01 certificates in [`Manager::alpn_certificate`]
//! for the TLS handshake (ALPN `acme-tls/1`). With Redis storage both are published
//! there too, so whichever instance the ACME server reaches can answer. DNS-01 answers
//! are TXT records put on the zone's primary by signed dynamic updates ([`dns01`]):
//! the only challenge a wildcard name is offered.
//!
//! `acme` imports neither `proxy` nor `pipeline`: the server asks it, it asks nobody.

pub(crate) mod certs;
mod dns01;
mod http;
mod on_demand;
mod order;
pub(crate) mod store;
mod task;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::SystemTime;

use arc_swap::ArcSwap;
use rustls::sign::CertifiedKey;
use tokio::sync::Notify;

use crate::config::AcmeConfig;
use store::Storage;

/// The ALPN protocol of TLS-ALPN-01 (RFC 8737).
pub(crate) const ACME_TLS_ALPN: &[u8] = b"acme-tls/1";
/// Where HTTP-01 answers are asked.
pub(crate) const HTTP01_PREFIX: &str = "/.well-known/acme-challenge/";

/// `sluice_acme_orders_total{result}`: index 0 `ok`, 1 `error`.
pub(crate) const ORDER_RESULTS: [&str; 2] = ["ok", "error"];

/// The ACME side of the `acme` settings, shared by the generations that use them.
pub(crate) struct Manager {
    pub config: AcmeConfig,
    storage: Storage,
    http: http::Client,
    certs: Mutex<HashMap<Vec<String>, Weak<Managed>>>,
    /// HTTP-01: token → key authorization.
    http01: Mutex<HashMap<String, String>>,
    /// TLS-ALPN-01: name → challenge certificate (and, for one built from a digest
    /// another instance published, that digest).
    alpn: Mutex<HashMap<String, Challenge>>,
    /// The account, once loaded or created.
    account: tokio::sync::Mutex<Option<instant_acme::Account>>,
    /// The certificates the manager these settings replaced was serving (same ACME
    /// directory), by names: what a new [`Managed`] starts from.
    seed: HashMap<Vec<String>, Arc<CertifiedKey>>,
    /// `tls on_demand`: names asked about and their certificates.
    on_demand: Mutex<on_demand::OnDemand>,
    /// dns-01: where TXT records go (`dns_update`).
    dns: Option<Arc<dns01::Updater>>,
}

/// A TLS-ALPN-01 certificate, and the published digest it was built from when it
/// answers for another instance's order.
type Challenge = (Option<String>, Arc<CertifiedKey>);

/// What `/status` shows of a managed certificate.
pub(crate) struct CertStatus {
    pub names: Vec<String>,
    /// `None` while the placeholder serves.
    pub not_after: Option<SystemTime>,
    /// When the task looks next: the renewal, or the retry after a failure.
    pub next_renewal: Option<SystemTime>,
    pub last_error: Option<String>,
}

/// One managed certificate (the names of one `tls auto` site).
pub(crate) struct Managed {
    /// As the site wrote them.
    pub names: Vec<String>,
    /// What handshakes for the site are served: shared with the generation's slot.
    pub current: Arc<ArcSwap<CertifiedKey>>,
    state: Mutex<State>,
    /// Woken when the last generation lets go, so the task ends at once.
    gone: Arc<Notify>,
}

#[derive(Default, Clone)]
struct State {
    /// The validity of the certificate served; `None` while the placeholder (or a
    /// stored certificate missing a name) is.
    validity: Option<(SystemTime, SystemTime)>,
    /// When the task will next look (renewal, or retry after a failure).
    next: Option<SystemTime>,
    last_error: Option<String>,
    failures: u32,
    /// Storage failed on the last look (logged once per outage).
    storage_down: bool,
}

impl Manager {
    /// For `config`; `previous` is the manager of the settings this one replaces.
    pub(crate) fn new(config: &AcmeConfig, previous: Option<&Manager>) -> Arc<Manager> {
        let extra = config
            .ca_root
            .as_deref()
            .and_then(|p| crate::config::certs::load_chain(p).ok())
            .unwrap_or_default();
        let same_server = previous.filter(|p| p.config.directory == config.directory);
        let seed = same_server.map_or_else(HashMap::new, |p| {
            p.live()
                .into_iter()
                .filter(|m| m.state().validity.is_some())
                .map(|m| (m.key(), m.current.load_full()))
                .collect()
        });
        Arc::new(Manager {
            config: config.clone(),
            storage: Storage::new(&config.storage, &config.directory),
            http: http::Client::new(&extra),
            certs: Mutex::default(),
            http01: Mutex::default(),
            alpn: Mutex::default(),
            account: tokio::sync::Mutex::const_new(None),
            seed,
            on_demand: Mutex::default(),
            dns: config.dns_update.as_ref().and_then(|u| {
                dns01::Updater::new(u)
                    .map_err(|e| tracing::error!("sluice: acme: dns_update: {e}"))
                    .ok()
                    .map(Arc::new)
            }),
        })
    }

    /// Whether `config` is what this manager was made for (where it was written aside).
    pub(crate) fn serves(&self, config: &AcmeConfig) -> bool {
        let mut mine = self.config.clone();
        mine.span = config.span;
        mine == *config
    }

    /// The managed certificate for `names`: the one a generation already holds, else
    /// a new one (from storage, or the placeholder) and its task. Within the runtime.
    pub(crate) fn managed(self: &Arc<Self>, site: &str, names: &[String]) -> Arc<Managed> {
        let mut key = names.to_vec();
        key.sort();
        if let Some(m) = self.held(&key) {
            return m;
        }
        // Storage is read without the map's lock (Redis may take its second).
        let id = key[0].clone();
        let stored = match self.storage.cert_now(&id) {
            Ok(Some(s)) => certs::certified(&s)
                .inspect_err(|e| {
                    tracing::warn!(
                        "sluice: site {site}: the stored certificate in {} is not usable ({e}): ordering a new one",
                        self.storage.describe()
                    )
                })
                .ok(),
            Ok(None) => None,
            Err(e) => {
                tracing::warn!("sluice: site {site}: reading the stored certificate: {e}");
                None
            }
        };
        let mut certs = self.certs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = certs.get(&key).and_then(Weak::upgrade) {
            return m;
        }
        let m = Arc::new(Managed {
            names: names.to_vec(),
            current: Arc::new(ArcSwap::new(certs::placeholder(names))),
            state: Mutex::default(),
            gone: Arc::new(Notify::new()),
        });
        let mut start: Vec<Arc<CertifiedKey>> = stored.into_iter().collect();
        start.extend(self.seed.get(&key).cloned());
        start.extend(self.for_fewer_names(&certs, &key));
        self.start_from(site, &m, start);
        certs.retain(|_, w| w.strong_count() > 0);
        certs.insert(key, Arc::downgrade(&m));
        tokio::spawn(task::keep(self.clone(), Arc::downgrade(&m), m.gone.clone()));
        m
    }

    /// The managed certificate for these (sorted) names a generation holds now.
    fn held(&self, key: &[String]) -> Option<Arc<Managed>> {
        let certs = self.certs.lock().unwrap_or_else(|e| e.into_inner());
        certs.get(key).and_then(Weak::upgrade)
    }

    /// The certificate of a site that had some of `names` (before a reload added the
    /// others), while a generation still holds it: the one for the most names.
    fn for_fewer_names(
        &self,
        certs: &HashMap<Vec<String>, Weak<Managed>>,
        names: &[String],
    ) -> Option<Arc<CertifiedKey>> {
        let fewer = certs
            .iter()
            .filter(|(k, _)| k.iter().all(|n| names.contains(n)))
            .filter_map(|(_, w)| w.upgrade())
            .filter(|m| m.state().validity.is_some())
            .max_by_key(|m| m.names.len())?;
        Some(fewer.current.load_full())
    }

    /// Serves the best of what a new certificate can start from (stored, the
    /// replaced manager's, a site's with fewer names): the latest that covers every
    /// name, else one for some of them meanwhile; and says what it serves.
    fn start_from(&self, site: &str, m: &Managed, start: Vec<Arc<CertifiedKey>>) {
        let mut covered = false;
        for ck in &start {
            covered |= m.offer(ck.clone());
        }
        match start.into_iter().next() {
            _ if covered => {}
            // A site that gained a name: its certificate still serves the others
            // until the new one arrives.
            Some(ck) => {
                m.current.store(ck);
                tracing::warn!(
                    "sluice: site {site}: the certificate it had does not cover all of {}: serving it meanwhile and ordering a new one from {}",
                    m.names.join(", "),
                    self.config.directory
                );
            }
            None => tracing::warn!(
                "sluice: site {site}: no certificate for {} yet: serving a self-signed placeholder until the ACME server ({}) issues one",
                m.names.join(", "),
                self.config.directory
            ),
        }
    }

    /// The managed certificates some generation still holds.
    fn live(&self) -> Vec<Arc<Managed>> {
        let certs = self.certs.lock().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<_> = certs.values().filter_map(Weak::upgrade).collect();
        v.sort_by(|a, b| a.names.cmp(&b.names));
        v
    }

    /// Whether `name` is one of the managed certificates' (lower case).
    fn manages(&self, name: &str) -> bool {
        let certs = self.certs.lock().unwrap_or_else(|e| e.into_inner());
        certs.keys().any(|k| k.iter().any(|n| n == name))
    }

    /// The key authorization for an HTTP-01 `token`, if an order of this process (or,
    /// with Redis storage, of another instance) is waiting for it.
    pub(crate) async fn http01(&self, token: &str) -> Option<String> {
        let local = self
            .http01
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(token)
            .cloned();
        match local {
            Some(v) => Some(v),
            None => self.storage.published("http-01", token).await,
        }
    }

    /// The TLS-ALPN-01 certificate for `name`, if an order is waiting for it. Redis
    /// is asked only for names this manager manages; a certificate built from a
    /// published digest is kept while the digest stays the same.
    pub(crate) async fn alpn_certificate(&self, name: &str) -> Option<Arc<CertifiedKey>> {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        let local = self
            .alpn
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&name)
            .cloned();
        if let Some((None, ck)) = &local {
            return Some(ck.clone());
        }
        if !self.storage.shared() || !self.manages(&name) {
            return None;
        }
        let hex = self.storage.published("tls-alpn-01", &name).await?;
        if let Some((Some(seen), ck)) = &local {
            if *seen == hex {
                return Some(ck.clone());
            }
        }
        let ck = certs::alpn_challenge(&name, &from_hex(&hex)?).ok()?;
        self.alpn
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name, (Some(hex), ck.clone()));
        Some(ck)
    }

    /// The server config a TLS-ALPN-01 handshake is finished with: the challenge
    /// certificate, ALPN `acme-tls/1` only.
    pub(crate) fn alpn_config(ck: Arc<CertifiedKey>) -> Arc<rustls::ServerConfig> {
        #[derive(Debug)]
        struct One(Arc<CertifiedKey>);
        impl rustls::server::ResolvesServerCert for One {
            fn resolve(&self, _: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
                Some(self.0.clone())
            }
        }
        let mut c = rustls::ServerConfig::builder_with_provider(crate::net::tls::provider())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .expect("ring supports TLS 1.2 and 1.3")
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(One(ck)));
        c.alpn_protocols = vec![ACME_TLS_ALPN.to_vec()];
        Arc::new(c)
    }

    /// Each managed certificate some generation serves, for `/status`.
    pub(crate) fn certificates(&self) -> Vec<CertStatus> {
        self.live()
            .iter()
            .map(|m| {
                let s = m.state();
                CertStatus {
                    names: m.names.clone(),
                    not_after: s.validity.map(|(_, a)| a),
                    next_renewal: s.next,
                    last_error: s.last_error,
                }
            })
            .collect()
    }

    /// Where certificates are kept, as `/status` and the log name it.
    pub(crate) fn storage(&self) -> String {
        self.storage.describe()
    }

    fn put_http01(&self, token: &str, key_auth: &str) {
        self.http01
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(token.to_string(), key_auth.to_string());
    }

    fn put_alpn(&self, name: &str, ck: Arc<CertifiedKey>) {
        self.alpn
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string(), (None, ck));
    }

    /// Forgets the local answers of a finished (or abandoned) order at once.
    fn forget(&self, answers: &[order::Answer]) {
        for a in answers {
            match a {
                order::Answer::Http01(token) => {
                    self.http01
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(token);
                }
                order::Answer::TlsAlpn01(name) => {
                    self.alpn
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(name);
                }
                order::Answer::Dns01 { .. } => {}
            }
        }
    }
}

impl Drop for Managed {
    fn drop(&mut self) {
        self.gone.notify_one();
    }
}

impl Managed {
    /// The name the certificate is stored and locked under: the first in sorted
    /// order, so instances that write the names in another order share it.
    fn id(&self) -> &str {
        self.names.iter().min().map_or("", String::as_str)
    }

    fn key(&self) -> Vec<String> {
        let mut k = self.names.clone();
        k.sort();
        k
    }

    fn state(&self) -> State {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn with_state<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.state.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The validity of `ck` if it covers every name.
    fn fits(&self, ck: &CertifiedKey) -> Option<(SystemTime, SystemTime)> {
        let leaf = ck.cert.first()?;
        let validity = crate::config::certs::validity(leaf)?;
        let covered = certs::names_of(leaf);
        self.names
            .iter()
            .all(|n| covered.contains(n))
            .then_some(validity)
    }

    /// Serves `ck` (read from storage) if it covers every name and ends later than
    /// what is served now (or the placeholder is). Whether it is served now.
    fn offer(&self, ck: Arc<CertifiedKey>) -> bool {
        let Some(validity) = self.fits(&ck) else {
            return false;
        };
        self.with_state(|s| {
            if s.validity.is_some_and(|(_, after)| after >= validity.1) {
                return s.validity == Some(validity);
            }
            s.validity = Some(validity);
            s.last_error = None;
            s.failures = 0;
            self.current.store(ck);
            true
        })
    }

    /// Serves `ck`, just issued, whatever its dates: false if it does not cover
    /// every name.
    fn install(&self, ck: Arc<CertifiedKey>) -> bool {
        let Some(validity) = self.fits(&ck) else {
            return false;
        };
        self.with_state(|s| {
            s.validity = Some(validity);
            s.last_error = None;
            s.failures = 0;
        });
        self.current.store(ck);
        true
    }

    /// When a new certificate should be ordered: now while the placeholder serves.
    fn due(&self, config: &AcmeConfig) -> SystemTime {
        match self.state().validity {
            Some((before, after)) => certs::renew_at(before, after, config.renew_before),
            None => SystemTime::UNIX_EPOCH,
        }
    }
}

fn from_hex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

fn to_hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips() {
        let b = [0u8, 1, 0xab, 0xff];
        assert_eq!(from_hex(&to_hex(&b)).unwrap(), b);
        assert_eq!(from_hex("abc"), None);
        assert_eq!(from_hex("zz"), None);
    }

    #[test]
    fn a_certificate_is_served_only_for_all_its_names_and_a_renewal_ends_later() {
        let names = vec!["b.test".to_string(), "a.test".to_string()];
        let m = Managed {
            names: names.clone(),
            current: Arc::new(ArcSwap::new(certs::placeholder(&names))),
            state: Mutex::default(),
            gone: Arc::new(Notify::new()),
        };
        assert_eq!(m.id(), "a.test");
        assert!(
            !m.offer(certs::placeholder(&names[..1])),
            "one name missing"
        );
        assert!(m.offer(certs::placeholder(&names)));
        let served = m.current.load_full();
        // Made a moment later: it ends later, so a stored copy of it is taken…
        std::thread::sleep(std::time::Duration::from_millis(1100));
        let later = certs::placeholder(&names);
        assert!(m.offer(later.clone()));
        // …and the older one is not taken back; a fresh issue always is.
        assert!(!m.offer(served.clone()));
        assert!(Arc::ptr_eq(&m.current.load_full(), &later));
        assert!(m.install(served.clone()));
        assert!(Arc::ptr_eq(&m.current.load_full(), &served));
    }
}
