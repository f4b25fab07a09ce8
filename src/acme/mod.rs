//! Automatic certificates (DESIGN §15.5): `tls auto` sites get theirs from an ACME
//! server (RFC 8555, through `instant-acme`), kept in a folder or in Redis, renewed in
//! the background.
//!
//! One [`Manager`] per set of `acme` settings, carried across reloads while they stay
//! the same. It holds a [`Managed`] certificate per distinct set of site names: the
//! generation's certificate slot shares its `current` key, so a new certificate serves
//! the next handshake without a reload, and connections already open keep theirs. A
//! reload that keeps a site's names keeps its `Managed` (and never orders again); each
//! `Managed` has one task that lives while some generation holds it.
//!
//! The task: read storage (a folder at once when the certificate is made, so the first
//! handshake after a restart already gets the stored one; Redis in the task), and when
//! the certificate is due — none yet, or past its renewal time (see
//! [`certs::renew_at`]) — take the order lock (Redis: `SET NX PX`, kept alive while
//! ordering; other instances wait and read the result), read storage again under it,
//! and order. Failures are retried with exponential backoff (2 s doubling to 1 h),
//! logged, counted and shown in `/status`.
//!
//! Challenges: HTTP-01 answers wait in [`Manager::http01`] for the plain listeners
//! (asked before routing); TLS-ALPN-01 certificates in [`Manager::alpn_certificate`]
//! for the TLS handshake (ALPN `acme-tls/1`). With Redis storage both are published
//! there too, so whichever instance the ACME server reaches can answer. With both
//! challenges allowed, attempts alternate between them, TLS-ALPN-01 first.
//!
//! `acme` imports neither `proxy` nor `pipeline`: the server asks it, it asks nobody.

pub(crate) mod certs;
mod http;
mod order;
pub(crate) mod store;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use rustls::sign::CertifiedKey;

use crate::config::AcmeConfig;
use crate::stats::{bump, COUNTERS};
use store::Storage;

/// The ALPN protocol of TLS-ALPN-01 (RFC 8737).
pub(crate) const ACME_TLS_ALPN: &[u8] = b"acme-tls/1";
/// Where HTTP-01 answers are asked.
pub(crate) const HTTP01_PREFIX: &str = "/.well-known/acme-challenge/";

/// The first wait after a failed order; doubled after each failure up to
/// [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(2);
const MAX_BACKOFF: Duration = Duration::from_secs(3600);
/// How long a waiting instance sleeps before looking again while another holds the
/// order lock.
const BUSY_WAIT: Duration = Duration::from_secs(1);

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
    /// TLS-ALPN-01: name → challenge certificate.
    alpn: Mutex<HashMap<String, Arc<CertifiedKey>>>,
    /// The account, once loaded or created.
    account: tokio::sync::Mutex<Option<instant_acme::Account>>,
    /// The certificates the manager these settings replaced was serving, by names:
    /// what a new [`Managed`] starts from rather than a placeholder.
    seed: HashMap<Vec<String>, Arc<CertifiedKey>>,
}

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
    /// As the site wrote them; the first names the certificate in storage.
    pub names: Vec<String>,
    /// What handshakes for the site are served: shared with the generation's slot.
    pub current: Arc<ArcSwap<CertifiedKey>>,
    state: Mutex<State>,
}

#[derive(Default, Clone)]
struct State {
    /// The validity of the certificate served; `None` while the placeholder is.
    validity: Option<(SystemTime, SystemTime)>,
    /// When the task will next look (renewal, or retry after a failure).
    next: Option<SystemTime>,
    last_error: Option<String>,
    failures: u32,
}

impl Manager {
    /// For `config`; `previous` is the manager of the settings this one replaces.
    pub(crate) fn new(config: &AcmeConfig, previous: Option<&Manager>) -> Arc<Manager> {
        let extra = config
            .ca_root
            .as_deref()
            .and_then(|p| crate::config::certs::load_chain(p).ok())
            .unwrap_or_default();
        let seed = previous.map_or_else(HashMap::new, |p| {
            p.live()
                .into_iter()
                .filter(|m| m.state().validity.is_some())
                .map(|m| (m.key(), m.current.load_full()))
                .collect()
        });
        Arc::new(Manager {
            config: config.clone(),
            storage: Storage::new(&config.storage),
            http: http::Client::new(&extra),
            certs: Mutex::default(),
            http01: Mutex::default(),
            alpn: Mutex::default(),
            account: tokio::sync::Mutex::const_new(None),
            seed,
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
        let mut certs = self.certs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = certs.get(&key).and_then(Weak::upgrade) {
            return m;
        }
        let m = Arc::new(Managed {
            names: names.to_vec(),
            current: Arc::new(ArcSwap::new(certs::placeholder(names))),
            state: Mutex::default(),
        });
        let from_storage = self.storage.cert_now(m.id());
        let start = from_storage
            .as_ref()
            .and_then(|s| certs::certified(s).ok())
            .or_else(|| self.seed.get(&key).cloned());
        match start {
            Some(ck) if m.offer(ck.clone()) => {}
            // A site that gained a name: its stored certificate still serves the
            // others until the new one arrives.
            Some(ck) => {
                m.current.store(ck);
                tracing::warn!(
                    "sluice: site {site}: the stored certificate does not cover all of {}: serving it meanwhile and ordering a new one from {}",
                    names.join(", "),
                    self.config.directory
                );
            }
            None => tracing::warn!(
                "sluice: site {site}: no certificate for {} yet: serving a self-signed placeholder until the ACME server ({}) issues one",
                names.join(", "),
                self.config.directory
            ),
        }
        certs.retain(|_, w| w.strong_count() > 0);
        certs.insert(key, Arc::downgrade(&m));
        tokio::spawn(keep(self.clone(), Arc::downgrade(&m)));
        m
    }

    /// The managed certificates some generation still holds.
    fn live(&self) -> Vec<Arc<Managed>> {
        let certs = self.certs.lock().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<_> = certs.values().filter_map(Weak::upgrade).collect();
        v.sort_by(|a, b| a.names.cmp(&b.names));
        v
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

    /// The TLS-ALPN-01 certificate for `name`, if an order is waiting for it.
    pub(crate) async fn alpn_certificate(&self, name: &str) -> Option<Arc<CertifiedKey>> {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        if let Some(ck) = self
            .alpn
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&name)
        {
            return Some(ck.clone());
        }
        let hex = self.storage.published("tls-alpn-01", &name).await?;
        let digest = from_hex(&hex)?;
        certs::alpn_challenge(&name, &digest).ok()
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
        let mut c = rustls::ServerConfig::builder_with_provider(crate::upstream::tls::provider())
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

    /// Orders a certificate for `m` if this instance gets the order lock: `Ok(false)`
    /// when another instance holds it.
    async fn obtain(&self, m: &Managed, attempt: u32) -> Result<bool, String> {
        let Some(token) = self.storage.lock(m.id()).await? else {
            return Ok(false);
        };
        let r = self.obtain_locked(m, attempt, &token).await;
        if let Err(e) = self.storage.unlock(m.id(), &token).await {
            tracing::warn!("sluice: acme: releasing the order lock for {}: {e}", m.id());
        }
        r.map(|()| true)
    }

    async fn obtain_locked(&self, m: &Managed, attempt: u32, token: &str) -> Result<(), String> {
        // Another instance may have stored a fresh one just before the lock was ours.
        if let Some(s) = self.storage.cert(m.id()).await? {
            if let Ok(ck) = certs::certified(&s) {
                if m.offer(ck) && m.due(&self.config) > SystemTime::now() {
                    return Ok(());
                }
            }
        }
        let keeper = async {
            loop {
                tokio::time::sleep(store::LOCK_TTL / 3).await;
                match self.storage.keep_lock(m.id(), token).await {
                    Ok(true) => {}
                    Ok(false) => return "the order lock was lost".to_string(),
                    Err(e) => return format!("keeping the order lock: {e}"),
                }
            }
        };
        let stored = tokio::select! {
            r = order::order(self, m, attempt) => r?,
            why = keeper => return Err(why),
        };
        let ck = certs::certified(&stored).map_err(|e| format!("the issued certificate: {e}"))?;
        self.storage.save_cert(m.id(), &stored).await.map_err(|e| {
            format!(
                "storing the certificate in {}: {e}",
                self.storage.describe()
            )
        })?;
        m.offer(ck);
        bump(&COUNTERS.acme_orders[0]);
        let after = m.state().validity.map(|(_, a)| httpdate::fmt_http_date(a));
        tracing::info!(
            "sluice: acme: certificate for {} issued by {} (valid until {}), stored in {}",
            m.names.join(", "),
            self.config.directory,
            after.unwrap_or_default(),
            self.storage.describe()
        );
        Ok(())
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
            .insert(name.to_string(), ck);
    }

    /// Forgets the answers of a finished order.
    async fn withdraw(&self, answers: &[order::Answer]) {
        for a in answers {
            match a {
                order::Answer::Http01(token) => {
                    self.http01
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(token);
                    self.storage.withdraw("http-01", token).await;
                }
                order::Answer::TlsAlpn01(name) => {
                    self.alpn
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(name);
                    self.storage.withdraw("tls-alpn-01", name).await;
                }
            }
        }
    }
}

impl Managed {
    /// The name the certificate is stored under.
    fn id(&self) -> &str {
        &self.names[0]
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

    /// Serves `ck` if it covers every name and ends later than what is served now (or
    /// the placeholder is). Whether it is now served.
    fn offer(&self, ck: Arc<CertifiedKey>) -> bool {
        let Some(leaf) = ck.cert.first() else {
            return false;
        };
        let Some(validity) = crate::config::certs::validity(leaf) else {
            return false;
        };
        let covered = certs::names_of(leaf);
        if !self.names.iter().all(|n| covered.contains(n)) {
            return false;
        }
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

    /// When a new certificate should be ordered: now while the placeholder serves.
    fn due(&self, config: &AcmeConfig) -> SystemTime {
        match self.state().validity {
            Some((before, after)) => certs::renew_at(before, after, config.renew_before),
            None => SystemTime::UNIX_EPOCH,
        }
    }
}

/// How long to wait after the `failures`-th failure in a row.
fn backoff(failures: u32) -> Duration {
    let n = failures.saturating_sub(1).min(20);
    FIRST_BACKOFF.saturating_mul(1 << n).min(MAX_BACKOFF)
}

/// How long a task sleeps at most before looking again: another instance may have
/// renewed (Redis), or no generation holds the certificate any more.
fn recheck(shared: bool) -> Duration {
    if shared {
        Duration::from_secs(60)
    } else {
        Duration::from_secs(3600)
    }
}

/// A certificate's task: see the module's doc. Ends when no generation holds it.
async fn keep(manager: Arc<Manager>, cert: Weak<Managed>) {
    loop {
        let Some(m) = cert.upgrade() else { return };
        if manager.storage.shared() {
            match manager.storage.cert(m.id()).await {
                Ok(Some(s)) => {
                    if let Ok(ck) = certs::certified(&s) {
                        m.offer(ck);
                    }
                }
                Ok(None) => {}
                Err(e) => tracing::debug!("sluice: acme: reading {}: {e}", m.id()),
            }
        }
        let now = SystemTime::now();
        let due = m.due(&manager.config);
        if due > now {
            m.with_state(|s| s.next = Some(due));
            drop(m);
            let wait = due.duration_since(now).unwrap_or_default();
            tokio::time::sleep(wait.min(recheck(manager.storage.shared()))).await;
            continue;
        }
        let attempt = m.state().failures;
        let wait = match manager.obtain(&m, attempt).await {
            Ok(true) => continue,
            Ok(false) => BUSY_WAIT,
            Err(why) => {
                bump(&COUNTERS.acme_orders[1]);
                let failures = attempt + 1;
                let wait = backoff(failures);
                m.with_state(|s| {
                    s.failures = failures;
                    s.last_error = Some(why.clone());
                    s.next = Some(now + wait);
                });
                tracing::warn!(
                    "sluice: acme: ordering a certificate for {} from {} failed ({why}); attempt {failures}, retrying in {}s{}",
                    m.names.join(", "),
                    manager.config.directory,
                    wait.as_secs(),
                    if m.state().validity.is_some() { "; the current certificate keeps serving" } else { "; the placeholder keeps serving" }
                );
                wait
            }
        };
        drop(m);
        tokio::time::sleep(wait).await;
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
    fn backoff_doubles_to_an_hour() {
        assert_eq!(backoff(1), Duration::from_secs(2));
        assert_eq!(backoff(2), Duration::from_secs(4));
        assert_eq!(backoff(5), Duration::from_secs(32));
        assert_eq!(backoff(40), MAX_BACKOFF);
    }

    #[test]
    fn hex_round_trips() {
        let b = [0u8, 1, 0xab, 0xff];
        assert_eq!(from_hex(&to_hex(&b)).unwrap(), b);
        assert_eq!(from_hex("abc"), None);
        assert_eq!(from_hex("zz"), None);
    }
}
