//! On-demand certificates (DESIGN §18.8, §18.11): a `tls on_demand { ask URL }` site
//! gets a certificate for a name at the first handshake that asks for it — when
//! `URL?domain=NAME` answers 2xx.
//!
//! - An allowed name is remembered an hour, a refused one (any other answer) ten
//!   minutes; an `ask` that cannot be reached within 5 s refuses that handshake and
//!   is not remembered.
//! - At most [`ORDERS_PER_MINUTE`] new names a minute, in any 60 s window.
//! - The handshake waits for the certificate up to [`WAIT`], then fails; the order goes
//!   on and a later handshake finds it.
//! - The certificate is a [`Managed`] one like a `tls auto` site's: stored (Redis
//!   storage shares it across a fleet, with one order), renewed, and kept by the
//!   manager while its settings stay.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::sign::CertifiedKey;

use super::{Managed, Manager};

/// New names ordered in any 60 s window.
pub(crate) const ORDERS_PER_MINUTE: usize = 10;
/// How long a handshake waits for its certificate.
pub(crate) const WAIT: Duration = Duration::from_secs(9);
const ALLOWED_FOR: Duration = Duration::from_secs(3600);
const REFUSED_FOR: Duration = Duration::from_secs(600);
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

/// What the manager knows of on-demand names.
#[derive(Default)]
pub(crate) struct OnDemand {
    /// Names `ask` allowed, and when.
    allowed: HashMap<String, Instant>,
    /// Names `ask` refused, and when.
    refused: HashMap<String, Instant>,
    /// When each of the last orders started.
    orders: VecDeque<Instant>,
    /// The certificates, by name.
    certs: HashMap<String, Arc<Managed>>,
}

impl Manager {
    /// The certificate for `name` of an on-demand site, when it has one already.
    pub(crate) fn on_demand_cert(&self, name: &str) -> Option<Arc<CertifiedKey>> {
        let od = self.on_demand.lock().unwrap_or_else(|e| e.into_inner());
        let m = od.certs.get(name)?;
        m.state().validity.is_some().then(|| m.current.load_full())
    }

    /// A certificate for `name` (lower case) on `site`: the one held, or one ordered
    /// now if `ask` allows the name and the order rate does; waits up to [`WAIT`].
    pub(crate) async fn on_demand(
        self: &Arc<Self>,
        site: &str,
        ask: &str,
        name: &str,
    ) -> Result<Arc<CertifiedKey>, String> {
        if let Some(ck) = self.on_demand_cert(name) {
            return Ok(ck);
        }
        if !crate::config::build::orderable(name) {
            return Err(format!(
                "{name:?} is not a name a certificate can be ordered for"
            ));
        }
        self.allowed(ask, name).await?;
        let m = self.on_demand_managed(site, name)?;
        let end = Instant::now() + WAIT;
        while Instant::now() < end {
            if m.state().validity.is_some() {
                return Ok(m.current.load_full());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(format!("no certificate for {name} yet (the order goes on)"))
    }

    /// Whether `ask` allows `name`, remembered as the rules say.
    async fn allowed(&self, ask: &str, name: &str) -> Result<(), String> {
        {
            let od = self.on_demand.lock().unwrap_or_else(|e| e.into_inner());
            if od
                .allowed
                .get(name)
                .is_some_and(|t| t.elapsed() < ALLOWED_FOR)
            {
                return Ok(());
            }
            if od
                .refused
                .get(name)
                .is_some_and(|t| t.elapsed() < REFUSED_FOR)
            {
                return Err(format!(
                    "{name} was refused by {ask} (remembered 10 minutes)"
                ));
            }
        }
        let sep = if ask.contains('?') { '&' } else { '?' };
        let url = format!("{ask}{sep}domain={name}");
        let status = self.ask(&url).await.map_err(|e| {
            tracing::warn!("sluice: on_demand: {url}: {e}; {name} refused for this handshake");
            format!("{ask} cannot be reached: {e}")
        })?;
        let mut od = self.on_demand.lock().unwrap_or_else(|e| e.into_inner());
        if status.is_success() {
            od.allowed.insert(name.to_string(), Instant::now());
            od.allowed.retain(|_, t| t.elapsed() < ALLOWED_FOR);
            Ok(())
        } else {
            tracing::info!("sluice: on_demand: {url} answered {status}: no certificate for {name} (remembered 10 minutes)");
            od.refused.insert(name.to_string(), Instant::now());
            od.refused.retain(|_, t| t.elapsed() < REFUSED_FOR);
            Err(format!("{ask} refused {name}"))
        }
    }

    /// `GET url` with the manager's HTTP client, within [`ASK_TIMEOUT`]: the status.
    async fn ask(&self, url: &str) -> Result<http::StatusCode, String> {
        use instant_acme::HttpClient as _;
        let req = http::Request::get(url)
            .body(instant_acme::BodyWrapper::default())
            .map_err(|e| e.to_string())?;
        match tokio::time::timeout(ASK_TIMEOUT, self.http.request(req)).await {
            Ok(Ok(resp)) => Ok(resp.parts.status),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {}s", ASK_TIMEOUT.as_secs())),
        }
    }

    /// The managed certificate for `name`, started now (an order) when the rate
    /// allows.
    fn on_demand_managed(self: &Arc<Self>, site: &str, name: &str) -> Result<Arc<Managed>, String> {
        {
            let mut od = self.on_demand.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(m) = od.certs.get(name) {
                return Ok(m.clone());
            }
            while od
                .orders
                .front()
                .is_some_and(|t| t.elapsed() >= Duration::from_secs(60))
            {
                od.orders.pop_front();
            }
            if od.orders.len() >= ORDERS_PER_MINUTE {
                tracing::warn!("sluice: on_demand: {ORDERS_PER_MINUTE} new names in the last minute; {name} waits");
                return Err(format!(
                    "{ORDERS_PER_MINUTE} certificates were ordered in the last minute"
                ));
            }
            od.orders.push_back(Instant::now());
        }
        // Storage is read outside the lock (Redis may take its second).
        let m = self.managed(site, &[name.to_string()]);
        let mut od = self.on_demand.lock().unwrap_or_else(|e| e.into_inner());
        Ok(od.certs.entry(name.to_string()).or_insert(m).clone())
    }
}
