//! A managed certificate's task: look at storage, and when the certificate is due —
//! none yet, or past its renewal time ([`super::certs::renew_at`]) — order a new one
//! under the order lock.
//!
//! Under the lock (Redis: `SET NX PX`, kept alive while ordering; a folder is this
//! process's own) storage is read once more, so an instance that waited behind another
//! takes its certificate instead of ordering. A failed order is logged, counted, shown
//! in `/status` and retried after 2 s, doubling to 1 h; with Redis the count and the
//! wait are the fleet's, so the instances do not take turns at a server that refuses. A
//! storage outage is not an order failure: it is logged once and looked at again every
//! 5 s.

use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use tokio::sync::Notify;

use super::{certs, order, store, Managed, Manager};
use crate::stats::{bump, COUNTERS};

/// The first wait after a failed order; doubled after each failure up to
/// [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(2);
const MAX_BACKOFF: Duration = Duration::from_secs(3600);
/// How long a waiting instance sleeps before looking again while another holds the
/// order lock (or waits out a failure).
const BUSY_WAIT: Duration = Duration::from_secs(1);
/// How long to wait after storage failed before looking again.
const STORAGE_RETRY: Duration = Duration::from_secs(5);

/// Why an attempt did not end with a certificate.
enum Failure {
    /// Storage could not be read or locked: nothing was asked of the ACME server.
    Storage(String),
    /// The order failed (or gave a certificate that cannot serve).
    Order(String),
    /// The order failed and the wait was published before the lock was released.
    Refused {
        why: String,
        failures: u32,
        wait: Duration,
    },
}

/// What an attempt did.
enum Done {
    Issued,
    /// Another instance holds the lock, or a failed order asks to wait this long.
    Busy(Duration),
    /// Storage had a certificate that is not due.
    Stored,
}

/// How long to wait after the `failures`-th failure in a row.
fn backoff(failures: u32) -> Duration {
    let n = failures.saturating_sub(1).min(20);
    FIRST_BACKOFF.saturating_mul(1 << n).min(MAX_BACKOFF)
}

/// How long a task sleeps at most before looking again: another instance may have
/// renewed (Redis).
fn recheck(shared: bool) -> Duration {
    if shared {
        Duration::from_secs(60)
    } else {
        Duration::from_secs(3600)
    }
}

/// Runs until no generation holds the certificate (`gone` wakes it then).
pub(super) async fn keep(manager: Arc<Manager>, cert: Weak<Managed>, gone: Arc<Notify>) {
    loop {
        let Some(m) = cert.upgrade() else { return };
        let wait = step(&manager, &m).await;
        drop(m);
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = gone.notified() => {}
        }
    }
}

/// One look: how long to sleep after it.
async fn step(manager: &Manager, m: &Managed) -> Duration {
    if manager.storage.shared() {
        if let Ok(Some(s)) = manager.storage.cert(m.id()).await {
            if let Ok(ck) = certs::certified(&s) {
                m.offer(ck);
            }
        }
    }
    let now = SystemTime::now();
    let due = m.due(&manager.config);
    if due > now {
        m.with_state(|s| s.next = Some(due));
        let wait = due.duration_since(now).unwrap_or_default();
        return wait.min(recheck(manager.storage.shared()));
    }
    let attempt = m.state().failures;
    let done = obtain(manager, m, attempt).await;
    if !matches!(done, Err(Failure::Storage(_))) {
        // Storage answered: the next outage is logged again.
        m.with_state(|s| s.storage_down = false);
    }
    let failure = match done {
        Ok(Done::Busy(wait)) => {
            m.with_state(|s| s.next = Some(now + wait));
            return wait;
        }
        Ok(Done::Stored) => return Duration::ZERO,
        // A certificate already due when it arrives would be ordered again at once.
        Ok(Done::Issued) if m.due(&manager.config) <= SystemTime::now() => Failure::Order(
            "the certificate issued is already a third through its lifetime: is this machine's clock right?".into(),
        ),
        Ok(Done::Issued) => {
            if let Err(e) = manager.storage.clear_failures(m.id()).await {
                tracing::debug!("sluice: acme: clearing the failure count: {e}");
            }
            return Duration::ZERO;
        }
        Err(f) => f,
    };
    match failure {
        Failure::Storage(why) => {
            if !m.with_state(|s| std::mem::replace(&mut s.storage_down, true)) {
                tracing::warn!(
                    "sluice: acme: certificate for {}: {why}; looking again every {}s",
                    m.names.join(", "),
                    STORAGE_RETRY.as_secs()
                );
            }
            m.with_state(|s| {
                s.last_error = Some(why);
                s.next = Some(now + STORAGE_RETRY);
            });
            STORAGE_RETRY
        }
        Failure::Order(why) => {
            let (failures, wait) = hold_off(manager, m, attempt).await;
            failed(manager, m, failures, wait, why)
        }
        Failure::Refused {
            why,
            failures,
            wait,
        } => failed(manager, m, failures, wait, why),
    }
}

/// Counts a failed order — with Redis, among all instances, so the wait grows
/// whichever instance tried last — and publishes the wait: the failures in a row and
/// the wait.
async fn hold_off(manager: &Manager, m: &Managed, attempt: u32) -> (u32, Duration) {
    let shared = manager.storage.count_failure(m.id()).await.ok().flatten();
    let failures = shared.unwrap_or(attempt + 1);
    let wait = backoff(failures);
    if let Err(e) = manager.storage.hold_off(m.id(), wait).await {
        tracing::debug!("sluice: acme: publishing the retry wait: {e}");
    }
    (failures, wait)
}

/// Records the `failures`-th failed order in a row: how long to wait.
fn failed(manager: &Manager, m: &Managed, failures: u32, wait: Duration, why: String) -> Duration {
    bump(&COUNTERS.acme_orders[1]);
    let now = SystemTime::now();
    let serving = if m.state().validity.is_some() {
        "the current certificate keeps serving"
    } else {
        "the placeholder keeps serving"
    };
    tracing::warn!(
        "sluice: acme: ordering a certificate for {} from {} failed ({why}); attempt {failures}, retrying in {}s; {serving}",
        m.names.join(", "),
        manager.config.directory,
        wait.as_secs(),
    );
    m.with_state(|s| {
        s.failures = failures;
        s.last_error = Some(why);
        s.next = Some(now + wait);
    });
    wait
}

/// Orders a certificate for `m` if this instance gets the order lock.
async fn obtain(manager: &Manager, m: &Managed, attempt: u32) -> Result<Done, Failure> {
    let storage = &manager.storage;
    if let Some(wait) = storage.held_off(m.id()).await.map_err(Failure::Storage)? {
        return Ok(Done::Busy(wait.min(recheck(true))));
    }
    let Some(token) = storage.lock(m.id()).await.map_err(Failure::Storage)? else {
        return Ok(Done::Busy(BUSY_WAIT));
    };
    let r = match locked(manager, m, attempt, &token).await {
        // The wait is published while the lock is held: no other instance slips in.
        Err(Failure::Order(why)) => {
            let (failures, wait) = hold_off(manager, m, attempt).await;
            Err(Failure::Refused {
                why,
                failures,
                wait,
            })
        }
        r => r,
    };
    if let Err(e) = storage.unlock(m.id(), &token).await {
        tracing::warn!("sluice: acme: releasing the order lock for {}: {e}", m.id());
    }
    r
}

async fn locked(
    manager: &Manager,
    m: &Managed,
    attempt: u32,
    token: &str,
) -> Result<Done, Failure> {
    let storage = &manager.storage;
    // Another instance may have stored a fresh one just before the lock was ours.
    if let Some(s) = storage.cert(m.id()).await.map_err(Failure::Storage)? {
        if let Ok(ck) = certs::certified(&s) {
            if m.offer(ck) && m.due(&manager.config) > SystemTime::now() {
                return Ok(Done::Stored);
            }
        }
    }
    // Keeps the lock alive; a Redis hiccup is borne until the lock could have
    // expired. Losing it stops the order: another instance may be ordering.
    let keeper = async {
        let mut kept = std::time::Instant::now();
        loop {
            tokio::time::sleep(store::LOCK_TTL / 3).await;
            match storage.keep_lock(m.id(), token).await {
                Ok(true) => kept = std::time::Instant::now(),
                Ok(false) => return "the order lock was lost".to_string(),
                Err(e) if kept.elapsed() >= store::LOCK_TTL * 2 / 3 => {
                    return format!("keeping the order lock: {e}")
                }
                Err(_) => {}
            }
        }
    };
    let stored = tokio::select! {
        r = order::order(manager, m, attempt) => r.map_err(Failure::Order)?,
        why = keeper => return Err(Failure::Storage(why)),
    };
    let ck = certs::certified(&stored)
        .map_err(|e| Failure::Order(format!("the issued certificate: {e}")))?;
    if !m.install(ck) {
        let why = "the issued certificate does not cover every name";
        return Err(Failure::Order(why.into()));
    }
    bump(&COUNTERS.acme_orders[0]);
    let after = m.state().validity.map(|(_, a)| httpdate::fmt_http_date(a));
    tracing::info!(
        "sluice: acme: certificate for {} issued by {} (valid until {})",
        m.names.join(", "),
        manager.config.directory,
        after.unwrap_or_default(),
    );
    // Served already: a storage that fails must not throw an issued certificate away.
    if let Err(e) = storage.save_cert(m.id(), &stored).await {
        tracing::error!(
            "sluice: acme: the certificate for {} serves, but storing it in {} failed ({e}): other instances and the next start will not have it",
            m.names.join(", "),
            storage.describe()
        );
    }
    Ok(Done::Issued)
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
}
