//! One ACME order (RFC 8555 §7.4) for every name of a managed certificate: the
//! account (loaded from storage, else created and stored), an authorization per name
//! answered with the attempt's challenge, then the CSR and the issued chain.

use std::time::Duration;

use instant_acme::{
    Account, AccountCredentials, AuthorizationStatus, ChallengeType, Identifier, NewAccount,
    NewOrder, OrderStatus, RetryPolicy,
};

use super::{certs, store::Stored, Managed, Manager};

/// How long the ACME server may take to validate, and then to issue.
const POLL: RetryPolicy = RetryPolicy::new()
    .initial_delay(Duration::from_millis(250))
    .backoff(1.5)
    .timeout(Duration::from_secs(90));

/// A challenge answer put up for an order, to take down after it.
pub(super) enum Answer {
    Http01(String),
    TlsAlpn01(String),
    /// A TXT value at `_acme-challenge.BASE`.
    Dns01 {
        base: String,
        value: String,
    },
}

/// The answers an order put up: taken down from this process when it ends, also when
/// its future is dropped (a lost lock); Redis copies are deleted after a finished
/// validation and expire otherwise.
struct Posted<'a> {
    m: &'a Manager,
    answers: Vec<Answer>,
}

impl Drop for Posted<'_> {
    fn drop(&mut self) {
        self.m.forget(&self.answers);
        // An order dropped before its withdrawal: its TXT records are taken down by a
        // task of their own.
        let records: Vec<(String, String)> = self
            .answers
            .drain(..)
            .filter_map(|a| match a {
                Answer::Dns01 { base, value } => Some((base, value)),
                _ => None,
            })
            .collect();
        if let (Some(dns), false) = (self.m.dns.clone(), records.is_empty()) {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move { take_down(&dns, &records).await });
            }
        }
    }
}

impl Posted<'_> {
    async fn withdraw(mut self) {
        for a in &self.answers {
            match a {
                Answer::Http01(token) => self.m.storage.withdraw("http-01", token).await,
                Answer::TlsAlpn01(name) => self.m.storage.withdraw("tls-alpn-01", name).await,
                Answer::Dns01 { .. } => {}
            }
        }
        // Each record leaves the list once it is down: an order dropped meanwhile
        // leaves the rest to `Drop`.
        let dns = self.m.dns.clone();
        while let Some(i) = self
            .answers
            .iter()
            .position(|a| matches!(a, Answer::Dns01 { .. }))
        {
            if let (Some(dns), Answer::Dns01 { base, value }) = (&dns, &self.answers[i]) {
                take_down(dns, &[(base.clone(), value.clone())]).await;
            }
            self.answers.remove(i);
        }
    }
}

/// Removes dns-01 records; a failure is logged (the record is harmless but stale).
async fn take_down(dns: &super::dns01::Updater, records: &[(String, String)]) {
    for (base, value) in records {
        if let Err(e) = dns.remove(base, value).await {
            tracing::warn!("sluice: acme: dns-01: {e}; the stale record can be removed by hand");
        }
    }
}

/// The challenge the `attempt`-th try uses for a name: dns-01 for a wildcard (the
/// only one offered for it); otherwise the allowed ones in turn, one more after each
/// failure — dns-01 first when the name lies in `dns_update`'s zone, then TLS-ALPN-01,
/// then HTTP-01.
fn challenge_for(m: &Manager, attempt: u32, wildcard: bool, name: &str) -> ChallengeType {
    let c = &m.config;
    let in_zone = c.dns_update.as_ref().is_some_and(|u| u.covers(name));
    let listed = [
        (c.dns01 && in_zone, ChallengeType::Dns01),
        (c.tls_alpn01, ChallengeType::TlsAlpn01),
        (c.http01, ChallengeType::Http01),
    ];
    let kinds: Vec<ChallengeType> = listed
        .into_iter()
        .filter_map(|(on, k)| on.then_some(k))
        .collect();
    if wildcard || kinds.is_empty() {
        return ChallengeType::Dns01;
    }
    kinds[attempt as usize % kinds.len()].clone()
}

/// Orders and returns the certificate and its key.
pub(super) async fn order(m: &Manager, cert: &Managed, attempt: u32) -> Result<Stored, String> {
    let account = account(m).await?;
    let ids: Vec<Identifier> = cert
        .names
        .iter()
        .map(|n| Identifier::Dns(n.clone()))
        .collect();
    let mut order = account
        .new_order(&NewOrder::new(&ids))
        .await
        .map_err(|e| format!("new order: {e}"))?;
    let mut posted = Posted {
        m,
        answers: Vec::new(),
    };
    let r = async {
        answer(m, &mut order, attempt, &mut posted.answers).await?;
        let status = order
            .poll_ready(&POLL)
            .await
            .map_err(|e| format!("waiting for validation: {e}"))?;
        if status != OrderStatus::Ready {
            return Err(why_invalid(&mut order, status).await);
        }
        Ok(())
    }
    .await;
    posted.withdraw().await;
    r?;
    let (csr, key) = certs::request(&cert.names)?;
    order
        .finalize_csr(&csr)
        .await
        .map_err(|e| format!("finalizing: {e}"))?;
    let chain = order
        .poll_certificate(&POLL)
        .await
        .map_err(|e| format!("fetching the certificate: {e}"))?;
    Ok(Stored { chain, key })
}

/// Puts up the answer of each pending authorization and tells the server it is ready.
async fn answer(
    m: &Manager,
    order: &mut instant_acme::Order,
    attempt: u32,
    answers: &mut Vec<Answer>,
) -> Result<(), String> {
    let mut authorizations = order.authorizations();
    while let Some(a) = authorizations.next().await {
        let mut a = a.map_err(|e| format!("authorization: {e}"))?;
        match a.status {
            AuthorizationStatus::Pending => {}
            AuthorizationStatus::Valid => continue,
            other => return Err(format!("authorization is {other:?}")),
        }
        let Identifier::Dns(base) = a.identifier().identifier.clone() else {
            return Err("an authorization for something not a DNS name".into());
        };
        let kind = challenge_for(m, attempt, a.wildcard, &base);
        let mut ch = a
            .challenge(kind.clone())
            .ok_or_else(|| format!("{base}: the ACME server offers no {kind:?} challenge"))?;
        let name = ch.identifier().to_string();
        let key_auth = ch.key_authorization();
        match kind {
            ChallengeType::Http01 => {
                let token = ch.token.clone();
                m.put_http01(&token, key_auth.as_str());
                answers.push(Answer::Http01(token.clone()));
                m.storage
                    .publish("http-01", &token, key_auth.as_str())
                    .await?;
            }
            ChallengeType::Dns01 => {
                let dns = m.dns.as_ref().ok_or_else(|| {
                    format!("{name} needs the dns-01 challenge and there is no dns_update")
                })?;
                let value = key_auth.dns_value();
                answers.push(Answer::Dns01 {
                    base: base.clone(),
                    value: value.clone(),
                });
                dns.add(&base, &value).await?;
            }
            _ => {
                let digest = key_auth.digest();
                let ck = certs::alpn_challenge(&name, digest.as_ref())?;
                m.put_alpn(&name, ck);
                answers.push(Answer::TlsAlpn01(name.clone()));
                m.storage
                    .publish("tls-alpn-01", &name, &super::to_hex(digest.as_ref()))
                    .await?;
            }
        }
        ch.set_ready()
            .await
            .map_err(|e| format!("{name}: challenge: {e}"))?;
    }
    Ok(())
}

/// What the server said about the names that failed validation.
async fn why_invalid(order: &mut instant_acme::Order, status: OrderStatus) -> String {
    let mut why = Vec::new();
    let mut authorizations = order.authorizations();
    while let Some(Ok(mut a)) = authorizations.next().await {
        let name = a.identifier().to_string();
        if let Ok(state) = a.refresh().await {
            let errors = state
                .challenges
                .iter()
                .filter_map(|c| Some((&c.r#type, c.error.as_ref()?)));
            why.extend(errors.map(|(kind, e)| format!("{name} ({kind:?}): {e}")));
        }
    }
    if why.is_empty() {
        format!("the order is {status:?} after its challenges")
    } else {
        format!("validation failed: {}", why.join("; "))
    }
}

/// The account for the manager's directory: the one in memory, else the stored one,
/// else a new one (stored at once).
async fn account(m: &Manager) -> Result<Account, String> {
    let mut slot = m.account.lock().await;
    if let Some(a) = &*slot {
        return Ok(a.clone());
    }
    let dir = &m.config.directory;
    let builder = || Account::builder_with_http(Box::new(m.http.clone()));
    let a = match m.storage.account(dir).await? {
        Some(json) => {
            let creds: AccountCredentials =
                serde_json::from_str(&json).map_err(|e| format!("stored account: {e}"))?;
            builder()
                .from_credentials(creds)
                .await
                .map_err(|e| format!("{dir}: {e}"))?
        }
        None => {
            let contact = m.config.email.as_ref().map(|e| format!("mailto:{e}"));
            let contacts: Vec<&str> = contact.iter().map(String::as_str).collect();
            let new = NewAccount {
                contact: &contacts,
                terms_of_service_agreed: true,
                only_return_existing: false,
            };
            let (a, creds) = builder()
                .create(&new, dir.clone(), None)
                .await
                .map_err(|e| format!("creating an account at {dir}: {e}"))?;
            let json = serde_json::to_string(&creds).map_err(|e| e.to_string())?;
            m.storage.save_account(dir, &json).await?;
            tracing::info!(
                "sluice: acme: account created at {dir}, stored in {}",
                m.storage.describe()
            );
            a
        }
    };
    *slot = Some(a.clone());
    Ok(a)
}
