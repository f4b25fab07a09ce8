//! The live generation's certificates: the TLS server settings of its `tls` listeners
//! and the SNI choice among the sites' certificates.
//!
//! Each site's pair sits in a [`CertSlot`] whose current key can be swapped without a
//! new generation: [`CertSlot::refresh`] (run every few seconds by the lifecycle) reads
//! the files again when their size or modification time changed. A pair that no longer
//! loads keeps the old one serving and is logged once per change. Connections already
//! open keep the certificate they were handshaken with; new handshakes get the new one.
//!
//! SNI follows the site table's order: exact host, then the longest `*.suffix`, then
//! the `*` site. A handshake that matches none of them (or names no host while there is
//! no `*` site with a certificate) fails with an alert.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use arc_swap::ArcSwap;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::config::{CertSource, Site};

/// One site's certificate: its pair as the files are now (or were when they last
/// loaded), or the ACME-managed one.
pub(crate) struct CertSlot {
    /// The site's name, for log lines.
    pub site: String,
    /// `tls CERT KEY`: the files; `None` for `tls auto`.
    pub files: Option<(PathBuf, PathBuf)>,
    current: Arc<ArcSwap<CertifiedKey>>,
    /// What the files looked like when last read (loaded or refused).
    stamp: Mutex<Stamp>,
    /// `tls auto`: held so its renewal task runs while this generation lives.
    _managed: Option<Arc<crate::acme::Managed>>,
    /// The OCSP staple, when the certificate names a responder (carried by site).
    pub stapler: Arc<super::ocsp::Stapler>,
    /// `tls on_demand`: the manager that orders, and the `ask` URL.
    pub on_demand: Option<(Arc<crate::acme::Manager>, String)>,
}

/// Size and modification time of both files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp([Option<(SystemTime, u64)>; 2]);

impl Stamp {
    fn of(cert: &std::path::Path, key: &std::path::Path) -> Stamp {
        let one = |p: &std::path::Path| {
            std::fs::metadata(p)
                .ok()
                .and_then(|m| Some((m.modified().ok()?, m.len())))
        };
        Stamp([one(cert), one(key)])
    }
}

impl CertSlot {
    fn new(
        site: &str,
        t: &crate::config::SiteTls,
        acme: Option<&Arc<crate::acme::Manager>>,
        stapler: Arc<super::ocsp::Stapler>,
    ) -> CertSlot {
        let on_demand = match (&t.source, acme) {
            (CertSource::OnDemand { ask }, Some(m)) => Some((m.clone(), ask.clone())),
            _ => None,
        };
        let (files, current, managed) = match (&t.source, acme) {
            // Served only to a name with no certificate yet: the handshake fails.
            (CertSource::OnDemand { .. }, _) => (
                None,
                Arc::new(ArcSwap::new(crate::acme::certs::placeholder(&[
                    "on-demand.invalid".to_string(),
                ]))),
                None,
            ),
            (CertSource::Files { cert, key, loaded }, _) => (
                Some((cert.clone(), key.clone())),
                Arc::new(ArcSwap::new(loaded.clone())),
                None,
            ),
            (CertSource::Auto { names }, Some(acme)) => {
                let m = acme.managed(site, names);
                (None, m.current.clone(), Some(m))
            }
            (CertSource::Auto { names }, None) => (
                None,
                Arc::new(ArcSwap::new(crate::acme::certs::placeholder(names))),
                None,
            ),
        };
        let stamp = match &files {
            Some((c, k)) => Stamp::of(c, k),
            None => Stamp([None, None]),
        };
        CertSlot {
            site: site.to_string(),
            stamp: Mutex::new(stamp),
            files,
            current,
            _managed: managed,
            stapler,
            on_demand,
        }
    }

    /// The certificate for a handshake naming `sni`: an on-demand site's for that
    /// name (when it has one), else the slot's own.
    pub(crate) fn for_name(&self, sni: Option<&str>) -> Arc<CertifiedKey> {
        if let (Some((acme, _)), Some(name)) = (&self.on_demand, sni) {
            let name = name.trim_end_matches('.').to_ascii_lowercase();
            if let Some(ck) = acme.on_demand_cert(&name) {
                return self.stapler.staple(ck);
            }
        }
        self.current()
    }

    /// The certificate handshakes get: with its OCSP staple when it has one.
    pub(crate) fn current(&self) -> Arc<CertifiedKey> {
        self.stapler.staple(self.current.load_full())
    }

    /// Fetches the OCSP staple when it is due.
    pub(crate) async fn staple(&self) {
        self.stapler
            .refresh(&self.site, self.current.load_full())
            .await;
    }

    /// When the certificate served now stops being valid.
    pub(crate) fn not_after(&self) -> Option<SystemTime> {
        let ck = self.current.load();
        crate::config::certs::validity(ck.cert.first()?).map(|(_, after)| after)
    }

    /// Reads the pair again if either file changed since it was last read. Blocking
    /// file I/O: run it off the runtime's workers.
    pub(crate) fn refresh(&self) {
        let Some((cert, key)) = &self.files else {
            return;
        };
        let now = Stamp::of(cert, key);
        {
            let mut seen = self.stamp.lock().unwrap_or_else(|e| e.into_inner());
            if *seen == now {
                return;
            }
            *seen = now;
        }
        match crate::config::certs::load_pair(cert, key) {
            Ok(ck) => {
                let dates =
                    crate::config::certs::dates_warning(cert, &ck.cert[0], SystemTime::now());
                self.current.store(ck);
                tracing::info!(
                    "sluice: site {}: certificate reloaded from {}",
                    self.site,
                    cert.display()
                );
                if let Some(w) = dates {
                    tracing::warn!("sluice: site {}: {w}", self.site);
                }
            }
            Err(why) => tracing::warn!(
                "sluice: site {}: the changed certificate files do not load ({why}); still serving the previous certificate",
                self.site
            ),
        }
    }
}

/// A site's OCSP stapler, carried from the previous generation's.
pub(crate) type Staplers<'a> = &'a dyn Fn(&str) -> Arc<super::ocsp::Stapler>;

/// The certificate for a handshake, by SNI.
pub(crate) struct SniCerts {
    names: crate::route::HostIndex,
    pub slots: Vec<Arc<CertSlot>>,
}

impl std::fmt::Debug for SniCerts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SniCerts")
            .field("sites", &self.slots.len())
            .finish()
    }
}

impl SniCerts {
    fn new(
        sites: &[Site],
        acme: Option<&Arc<crate::acme::Manager>>,
        stapler: Staplers<'_>,
    ) -> SniCerts {
        let mut c = SniCerts {
            names: Default::default(),
            slots: Vec::new(),
        };
        for site in sites {
            let Some(t) = &site.tls else { continue };
            c.names.add(&site.hosts, c.slots.len());
            let slot = CertSlot::new(&site.name, t, acme, stapler(&site.name));
            c.slots.push(Arc::new(slot));
        }
        c
    }

    /// The slot serving `name` (an SNI host name, any case), or the `*` site's.
    pub(crate) fn choose(&self, name: Option<&str>) -> Option<&Arc<CertSlot>> {
        self.slots.get(self.index(name)?)
    }

    /// Whether every handshake finds a certificate (a `*` site has one).
    pub(crate) fn has_default(&self) -> bool {
        self.names.has_any()
    }

    pub(crate) fn index(&self, name: Option<&str>) -> Option<usize> {
        match name {
            Some(n) => self
                .names
                .find(n.trim_end_matches('.').to_ascii_lowercase().as_bytes()),
            None => self.names.find(b""),
        }
    }
}

impl ResolvesServerCert for SniCerts {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let sni = hello.server_name();
        self.choose(sni).map(|s| s.for_name(sni))
    }
}

/// A generation's TLS server side: what its `tls` listeners hand to rustls.
#[derive(Clone)]
pub(crate) struct Tls {
    pub config: Arc<rustls::ServerConfig>,
    pub certs: Arc<SniCerts>,
    /// When some site limits its `http_versions` or asks for client certificates:
    /// each site's own config (by certificate slot), chosen by SNI after the
    /// ClientHello is read.
    pub per_site: Option<Vec<Arc<rustls::ServerConfig>>>,
    /// Which slots' sites verify client certificates.
    pub client_auth: Vec<bool>,
    /// `acme` with TLS-ALPN-01 allowed: a ClientHello offering `acme-tls/1` is
    /// answered with the challenge certificate.
    pub acme: Option<Arc<crate::acme::Manager>>,
    /// Some site has `tls on_demand`: a ClientHello is read before the handshake goes
    /// on, so its name's certificate can be ordered first.
    pub on_demand: bool,
}

impl Tls {
    /// The config for a handshake whose ClientHello names `sni`.
    pub(crate) fn config_for(&self, sni: Option<&str>) -> &Arc<rustls::ServerConfig> {
        match (&self.per_site, self.certs.index(sni)) {
            (Some(configs), Some(i)) => &configs[i],
            _ => &self.config,
        }
    }

    /// The site (by slot) serving `sni`, when it verifies client certificates.
    pub(crate) fn client_auth_site(&self, sni: Option<&str>) -> Option<&Arc<CertSlot>> {
        let i = self.certs.index(sni)?;
        self.client_auth
            .get(i)
            .copied()
            .unwrap_or(false)
            .then(|| &self.certs.slots[i])
    }
}

/// TLS 1.3 and 1.2 with ring's default suites (AES-GCM and ChaCha20-Poly1305 with
/// ECDHE only: the "intermediate" set, less the finite-field DHE rustls never offers),
/// ALPN `h2` then `http/1.1`. The server's suite order decides (AES-256-GCM first), as
/// scanners expect of a server: every suite offered is strong, so the choice is about
/// predictability, not safety. `None` when no site has a certificate.
pub(crate) fn build(
    sites: &[Site],
    acme: Option<&Arc<crate::acme::Manager>>,
    stapler: Staplers<'_>,
) -> Option<Tls> {
    let certs = Arc::new(SniCerts::new(sites, acme, stapler));
    if certs.slots.is_empty() {
        return None;
    }
    let provider = crate::net::tls::provider();
    let base = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .ok()?;
    let finish = |mut c: rustls::ServerConfig, v: crate::config::HttpVersions| {
        c.alpn_protocols = match (v.h1, v.h2) {
            (true, false) => vec![b"http/1.1".to_vec()],
            (false, true) => vec![b"h2".to_vec()],
            _ => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
        };
        c.ignore_client_order = true;
        Arc::new(c)
    };
    let config = finish(
        base.clone()
            .with_no_client_auth()
            .with_cert_resolver(certs.clone()),
        Default::default(),
    );
    let with_tls: Vec<&Site> = sites.iter().filter(|s| s.tls.is_some()).collect();
    let client_auth: Vec<bool> = with_tls
        .iter()
        .map(|s| s.tls.as_ref().is_some_and(|t| t.client.is_some()))
        .collect();
    let special = |s: &&Site| {
        !(s.versions.h1 && s.versions.h2) || s.tls.as_ref().is_some_and(|t| t.client.is_some())
    };
    let per_site = with_tls.iter().any(special).then(|| {
        with_tls
            .iter()
            .map(|s| {
                let b = base.clone();
                let c = match s.tls.as_ref().and_then(|t| t.client.as_ref()) {
                    Some(auth) => b.with_client_cert_verifier(auth.verifier.clone()),
                    None => b.with_no_client_auth(),
                };
                finish(c.with_cert_resolver(certs.clone()), s.versions)
            })
            .collect()
    });
    let on_demand = certs.slots.iter().any(|s| s.on_demand.is_some());
    Some(Tls {
        config,
        certs,
        per_site,
        client_auth,
        acme: acme.filter(|m| m.config.tls_alpn01).cloned(),
        on_demand,
    })
}
