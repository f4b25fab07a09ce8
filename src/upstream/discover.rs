//! Pools whose peers DNS decides (DESIGN §18.7): `srv:` records or every address of a
//! name, re-read at their TTL (clamped to [`MIN_REFRESH`] … [`MAX_REFRESH`]).
//!
//! A [`Discovery`] is reload-carried state (one per source, `runtime::carry`): it
//! keeps the last good answer and a task that reads DNS again. When the answer
//! changes it wakes [`CHANGED`]; the server then compiles the generation again with
//! the new peers, so a pool's peer list is, like everything else a request reads, a
//! fixed part of one generation. Peers that stay keep their identity (`PoolState`
//! refits by address and role); peers that leave drain on the generation that sent to
//! them. A failed or empty answer keeps the last good set and is logged once.
//! Destination safety is judged where every address is: at the dial.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwapOption;
use tokio::sync::Notify;

use super::peer::Role;
use crate::config::{BackendAddr, BackendScheme, Discover, DiscoverKind, ProxyConfig, Target};
use crate::safety::Dns;

/// The shortest and longest time between two reads of a source.
pub(crate) const MIN_REFRESH: Duration = Duration::from_secs(1);
pub(crate) const MAX_REFRESH: Duration = Duration::from_secs(3600);
/// The most SRV records used: the first by priority.
pub(crate) const MAX_SRV: usize = 64;
/// How long one read may take.
const BUDGET: Duration = Duration::from_secs(5);

/// Woken when a source's answer changed: the server compiles the generation again.
pub(crate) static CHANGED: Notify = Notify::const_new();

/// One discovered peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Found {
    pub addr: String,
    pub host: String,
    pub port: u16,
    pub weight: u32,
    pub role: Role,
}

/// The last good answer of a source.
#[derive(Debug)]
pub(crate) struct Answer {
    pub peers: Vec<Found>,
    pub at: SystemTime,
}

/// One source's discovery.
pub(crate) struct Discovery {
    pub source: Discover,
    answer: ArcSwapOption<Answer>,
    /// Reads of the source, good or not; good ones that changed the peers.
    pub refreshes: AtomicU64,
    pub failures: AtomicU64,
    pub changes: AtomicU64,
    retired: AtomicBool,
    retire: Notify,
}

impl Discovery {
    /// A discovery of `source`, reading it with `dns` from now on.
    pub(crate) fn start(source: &Discover, dns: Arc<Dns>) -> Arc<Discovery> {
        let d = Arc::new(Discovery {
            source: source.clone(),
            answer: ArcSwapOption::empty(),
            refreshes: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            changes: AtomicU64::new(0),
            retired: AtomicBool::new(false),
            retire: Notify::new(),
        });
        tokio::spawn(run(Arc::downgrade(&d), dns));
        d
    }

    /// The last good answer, if there was one.
    pub(crate) fn answer(&self) -> Option<Arc<Answer>> {
        self.answer.load_full()
    }

    /// `cfg` with its addresses as discovered: a `srv:` pool has none before its first
    /// answer; a discovered name stands for itself (resolved at the dial) until then.
    pub(crate) fn apply(&self, cfg: &ProxyConfig) -> ProxyConfig {
        let mut cfg = cfg.clone();
        let srv = matches!(self.source.kind, DiscoverKind::Srv { .. });
        if let DiscoverKind::Addresses { host, .. } = &self.source.kind {
            // Peers are addresses; the certificate names the name.
            cfg.tls.server_name.get_or_insert_with(|| host.clone());
        }
        let Some(answer) = self.answer() else {
            if srv {
                cfg.backends.clear();
            }
            return cfg;
        };
        let addr = |f: &Found| BackendAddr {
            text: f.addr.clone(),
            target: Target::Tcp {
                host: f.host.clone(),
                port: f.port,
            },
            scheme: self.source.scheme,
            span: cfg.backends.first().map(|b| b.span).unwrap_or_default(),
        };
        let of = |role: Role| answer.peers.iter().filter(move |f| f.role == role);
        let backends: Vec<BackendAddr> = of(Role::Primary).map(addr).collect();
        cfg.weights = of(Role::Primary).map(|f| f.weight).collect();
        if srv {
            cfg.backups = of(Role::Backup).map(addr).collect();
        }
        cfg.backends = backends;
        cfg
    }

    /// The live generation no longer has the source: its task stops.
    pub(crate) fn retire(&self) {
        self.retired.store(true, Ordering::Relaxed);
        self.retire.notify_waiters();
    }
}

/// Reads the source at its TTL until the discovery is retired or dropped.
async fn run(d: std::sync::Weak<Discovery>, dns: Arc<Dns>) {
    let mut failing = false;
    let mut trimmed = false;
    loop {
        let Some(d) = d.upgrade() else { return };
        let retired = d.retire.notified();
        tokio::pin!(retired);
        retired.as_mut().enable();
        if d.retired.load(Ordering::Relaxed) {
            return;
        }
        let read = read(&d.source, &dns, &mut trimmed).await;
        // Counted once the answer is taken: a start waits for the first.
        let wait = match read {
            Ok((peers, valid_until)) => {
                if std::mem::take(&mut failing) {
                    tracing::info!("sluice: {}: DNS answers again", d.source.source);
                }
                take(&d, peers);
                d.refreshes.fetch_add(1, Ordering::Relaxed);
                valid_until.saturating_duration_since(std::time::Instant::now())
            }
            Err(why) => {
                d.failures.fetch_add(1, Ordering::Relaxed);
                d.refreshes.fetch_add(1, Ordering::Relaxed);
                if !std::mem::replace(&mut failing, true) {
                    let kept = d.answer().map_or(0, |a| a.peers.len());
                    tracing::warn!(
                        "sluice: {}: {why}; keeping the last {kept} discovered peers (retrying)",
                        d.source.source
                    );
                }
                MIN_REFRESH * 2
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait.clamp(MIN_REFRESH, MAX_REFRESH)) => {}
            _ = retired => return,
        }
    }
}

/// Stores `peers` when they differ from the last answer, and says so.
fn take(d: &Discovery, peers: Vec<Found>) {
    let before = d.answer();
    if before.as_ref().is_some_and(|a| a.peers == peers) {
        return;
    }
    let had = before.map(|a| a.peers.clone()).unwrap_or_default();
    let added = peers.iter().filter(|p| !had.contains(p)).count();
    let removed = had.iter().filter(|p| !peers.contains(p)).count();
    tracing::info!(
        "sluice: {}: {} peers discovered ({added} new, {removed} gone)",
        d.source.source,
        peers.len()
    );
    d.changes.fetch_add(1, Ordering::Relaxed);
    d.answer.store(Some(Arc::new(Answer {
        peers,
        at: SystemTime::now(),
    })));
    CHANGED.notify_one();
}

/// One read of the source: its peers, sorted, and until when they hold.
async fn read(
    source: &Discover,
    dns: &Dns,
    trimmed: &mut bool,
) -> Result<(Vec<Found>, std::time::Instant), String> {
    let mut peers = match &source.kind {
        DiscoverKind::Addresses { host, port } => {
            let answer = dns.lookup(host, BUDGET).await.map_err(|e| e.to_string())?;
            let found = answer.ips.iter().map(|ip| {
                let ip = ip.to_canonical();
                let authority = match ip {
                    std::net::IpAddr::V6(v6) => format!("[{v6}]:{port}"),
                    v4 => format!("{v4}:{port}"),
                };
                peer(
                    source.scheme,
                    authority,
                    ip.to_string(),
                    *port,
                    1,
                    Role::Primary,
                )
            });
            (found.collect(), answer.valid_until)
        }
        DiscoverKind::Srv { name } => {
            let answer = dns.srv(name, BUDGET).await.map_err(|e| e.to_string())?;
            (
                srv_peers(source, answer.records, trimmed),
                answer.valid_until,
            )
        }
    };
    peers
        .0
        .sort_by(|a, b| (a.role as u8, &a.addr).cmp(&(b.role as u8, &b.addr)));
    peers
        .0
        .dedup_by(|a, b| a.addr == b.addr && a.role == b.role);
    Ok(peers)
}

/// SRV records as peers: the lowest priority primaries, the next backups, the rest
/// ignored; at most [`MAX_SRV`] records, the first by priority (said once).
fn srv_peers(
    source: &Discover,
    mut records: Vec<crate::safety::Srv>,
    trimmed: &mut bool,
) -> Vec<Found> {
    records.sort_by_key(|r| (r.priority, std::cmp::Reverse(r.weight)));
    if records.len() > MAX_SRV {
        if !std::mem::replace(trimmed, true) {
            tracing::warn!(
                "sluice: {}: {} SRV records; using the first {MAX_SRV} by priority",
                source.source,
                records.len()
            );
        }
        records.truncate(MAX_SRV);
    }
    let mut priorities: Vec<u16> = records.iter().map(|r| r.priority).collect();
    priorities.dedup();
    records
        .iter()
        .filter_map(|r| {
            let role = match priorities.iter().position(|p| *p == r.priority) {
                Some(0) => Role::Primary,
                Some(1) => Role::Backup,
                _ => return None,
            };
            let authority = match r.target.contains(':') {
                true => format!("[{}]:{}", r.target, r.port),
                false => format!("{}:{}", r.target, r.port),
            };
            let weight = u32::from(r.weight.max(1));
            Some(peer(
                source.scheme,
                authority,
                r.target.clone(),
                r.port,
                weight,
                role,
            ))
        })
        .collect()
}

fn peer(
    scheme: BackendScheme,
    authority: String,
    host: String,
    port: u16,
    weight: u32,
    role: Role,
) -> Found {
    let addr = match scheme {
        BackendScheme::Http => authority,
        BackendScheme::Https => format!("https://{authority}"),
        BackendScheme::H2c => format!("h2c://{authority}"),
    };
    Found {
        addr,
        host,
        port,
        weight,
        role,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::safety::Srv;

    fn srv(priority: u16, weight: u16, target: &str) -> Srv {
        Srv {
            priority,
            weight,
            port: 8080,
            target: target.into(),
        }
    }

    #[test]
    fn priorities_are_roles_and_weights_weigh() {
        let source = Discover {
            source: "srv:_http._tcp.api".into(),
            kind: DiscoverKind::Srv {
                name: "_http._tcp.api".into(),
            },
            scheme: BackendScheme::H2c,
        };
        let mut trimmed = false;
        let peers = srv_peers(
            &source,
            vec![
                srv(20, 5, "c"),
                srv(10, 0, "a"),
                srv(30, 1, "d"),
                srv(10, 3, "b"),
            ],
            &mut trimmed,
        );
        let got: Vec<(&str, u32, Role)> = peers
            .iter()
            .map(|p| (p.addr.as_str(), p.weight, p.role))
            .collect();
        assert_eq!(
            got,
            [
                ("h2c://b:8080", 3, Role::Primary),
                ("h2c://a:8080", 1, Role::Primary),
                ("h2c://c:8080", 5, Role::Backup),
            ]
        );
        let many: Vec<Srv> = (0..100)
            .map(|i| srv(i as u16, 1, &format!("h{i}")))
            .collect();
        assert_eq!(srv_peers(&source, many, &mut trimmed).len(), 2);
        assert!(trimmed);
    }
}
