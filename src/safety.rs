//! Destination safety (SSRF) and name resolution: where sluice may connect, and how a
//! backend's name becomes the addresses it dials.
//!
//! Two halves, both free of the config model so `config` (literal addresses refused at
//! load) and `upstream` (every dial) share one judgement:
//!
//! - [`Policy`] judges a parsed socket address. The ranges are not a crate's: the
//!   product's list (DESIGN §9) is narrower and stricter than "is global" helpers
//!   (IPv4-mapped and -compatible IPv6 always refused, NAT64 and 6to4 judged by the
//!   IPv4 address they carry, cloud metadata named apart from the range it sits in,
//!   the proxy's own listeners), and each refusal needs its reason for the counter.
//! - [`Dns`] resolves names with `hickory-resolver`: A and AAAA together, a bounded cache
//!   whose TTLs are clamped, a budget per lookup, and at most [`MAX_RECORDS`] addresses.
//!
//! [`parse_ip`] reads a host the way the C library's `inet_aton` would (decimal, octal and
//! hex parts, fewer than four parts) and IPv6 with a zone id, so a literal cannot slip
//! past a check by its spelling: what is checked is what is dialed.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hickory_resolver::config::{
    LookupIpStrategy, NameServerConfig, NameServerConfigGroup, ResolverConfig, ResolverOpts,
};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::proto::xfer::Protocol;
use hickory_resolver::TokioResolver;
use ipnet::IpNet;

/// Why an address is not a safe destination: the `reason` label of
/// `sluice_safety_refusals_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    Unspecified = 0,
    Loopback,
    LinkLocal,
    Multicast,
    Broadcast,
    Reserved,
    Documentation,
    Metadata,
    Private,
    Cgnat,
    /// IPv4-mapped, -compatible or -translated IPv6: refused even when allowed.
    Mapped,
    /// One of sluice's own listeners (a loop).
    Listener,
    /// Named by `block`.
    Blocked,
}

impl Reason {
    pub const COUNT: usize = 13;
    pub const ALL: [Reason; Reason::COUNT] = [
        Reason::Unspecified,
        Reason::Loopback,
        Reason::LinkLocal,
        Reason::Multicast,
        Reason::Broadcast,
        Reason::Reserved,
        Reason::Documentation,
        Reason::Metadata,
        Reason::Private,
        Reason::Cgnat,
        Reason::Mapped,
        Reason::Listener,
        Reason::Blocked,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Unspecified => "unspecified",
            Reason::Loopback => "loopback",
            Reason::LinkLocal => "link_local",
            Reason::Multicast => "multicast",
            Reason::Broadcast => "broadcast",
            Reason::Reserved => "reserved",
            Reason::Documentation => "documentation",
            Reason::Metadata => "metadata",
            Reason::Private => "private",
            Reason::Cgnat => "cgnat",
            Reason::Mapped => "ipv4_mapped",
            Reason::Listener => "own_listener",
            Reason::Blocked => "blocked",
        }
    }

    /// What the address is, for messages: "`10.0.0.5:80` is a private address".
    pub fn what(self) -> &'static str {
        match self {
            Reason::Unspecified => "an unspecified address",
            Reason::Loopback => "a loopback address",
            Reason::LinkLocal => "a link-local address",
            Reason::Multicast => "a multicast address",
            Reason::Broadcast => "the broadcast address",
            Reason::Reserved => "a reserved address",
            Reason::Documentation => "a documentation address",
            Reason::Metadata => "a cloud metadata address",
            Reason::Private => "a private address",
            Reason::Cgnat => "a shared (CGNAT) address",
            Reason::Mapped => "an IPv4-mapped IPv6 address",
            Reason::Listener => "one of sluice's own listeners",
            Reason::Blocked => "a blocked address",
        }
    }

    /// What an operator can do about it, for the log line and `sluice check`.
    pub fn hint(self) -> &'static str {
        match self {
            Reason::Mapped => "IPv4-mapped IPv6 is never dialed by a strict pool; name the IPv4 address instead",
            Reason::Listener => "the address is one of sluice's own listeners: the request would loop",
            Reason::Blocked => "`block` names it, and `block` always wins",
            Reason::Metadata => "cloud metadata is admitted only by an `allow_private` naming that one address",
            _ => "admit a private origin with `allow_private CIDR` in global { safety { ... } }, or set `safety off` on this pool",
        }
    }
}

/// Refusals by [`Reason`], process-wide (the metrics endpoint reads them).
pub(crate) static REFUSALS: [AtomicU64; Reason::COUNT] =
    [const { AtomicU64::new(0) }; Reason::COUNT];

/// An address a strict policy will not dial, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    pub addr: SocketAddr,
    pub reason: Reason,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "refused to connect to {}, {} (safety strict); {}",
            self.addr,
            self.reason.what(),
            self.reason.hint()
        )
    }
}

/// A strict pool's rules: what it admits beyond public addresses, what it never dials.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    /// `allow_private`: non-public ranges admitted (never IPv4-mapped IPv6, never a
    /// listener; metadata only when named by a single-address entry).
    pub allow_private: Vec<IpNet>,
    /// `block`: refused whatever else says.
    pub block: Vec<IpNet>,
    /// sluice's own listening addresses; an unspecified one stands for every address of
    /// this host at its port.
    pub listeners: Vec<SocketAddr>,
    /// This host's interface addresses when the policy was made (for the wildcard
    /// listeners; empty when there are none).
    pub local: Vec<IpAddr>,
}

impl Policy {
    /// Whether `addr` may be dialed; counts a refusal.
    pub fn check(&self, addr: SocketAddr) -> Result<(), Refusal> {
        match self.judge(addr) {
            None => Ok(()),
            Some(reason) => {
                REFUSALS[reason as usize].fetch_add(1, Ordering::Relaxed);
                Err(Refusal { addr, reason })
            }
        }
    }

    /// The judgement without counting: `None` when `addr` is safe.
    pub fn judge(&self, addr: SocketAddr) -> Option<Reason> {
        let ip = addr.ip();
        // NAT64 and 6to4 reach the IPv4 address they carry: `block` and the listener
        // check see that one too.
        let carried = embedded_v4(ip).map(IpAddr::V4);
        let blocked = |ip: IpAddr| self.block.iter().any(|n| n.contains(&ip));
        if blocked(ip) || carried.is_some_and(blocked) {
            return Some(Reason::Blocked);
        }
        if let Some(reason) = classify(ip) {
            // An allowed range admits its NAT64/6to4 forms too (they reach it).
            let allows = |n: &IpNet| n.contains(&ip) || carried.is_some_and(|v4| n.contains(&v4));
            let admitted = match reason {
                Reason::Mapped => false,
                Reason::Metadata => self
                    .allow_private
                    .iter()
                    .any(|n| n.prefix_len() == n.max_prefix_len() && allows(n)),
                _ => self.allow_private.iter().any(allows),
            };
            if !admitted {
                return Some(reason);
            }
        }
        let own = |ip: IpAddr| self.is_listener(SocketAddr::new(ip, addr.port()));
        if own(ip) || carried.is_some_and(own) {
            return Some(Reason::Listener);
        }
        None
    }

    /// Whether dialing `addr` reaches one of sluice's listeners: the address itself; the
    /// unspecified address (the kernel dials this host); for a wildcard listener, any
    /// loopback address or any of this host's addresses.
    fn is_listener(&self, addr: SocketAddr) -> bool {
        let ip = addr.ip();
        self.listeners.iter().any(|l| {
            l.port() == addr.port()
                && (l.ip() == ip
                    || ip.is_unspecified()
                    || (l.ip().is_unspecified() && (ip.is_loopback() || self.local.contains(&ip))))
        })
    }
}

/// This host's interface addresses, for a policy whose listeners include a wildcard
/// one (read when a generation is built; an interface added later is not seen).
pub(crate) fn local_addresses() -> Vec<IpAddr> {
    match if_addrs::get_if_addrs() {
        Ok(ifs) => ifs.into_iter().map(|i| i.ip()).collect(),
        Err(e) => {
            tracing::warn!("sluice: cannot list this host's addresses ({e}); a strict pool recognises its own wildcard listeners only on loopback");
            vec![
                IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V6(Ipv6Addr::LOCALHOST),
            ]
        }
    }
}

/// The IPv4 address a NAT64 (`64:ff9b::/96`) or 6to4 (`2002::/16`) address carries.
fn embedded_v4(ip: IpAddr) -> Option<Ipv4Addr> {
    let IpAddr::V6(v6) = ip else { return None };
    match v6.segments() {
        [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] | [0x2002, hi, lo, ..] => Some(v4_of(hi, lo)),
        _ => None,
    }
}

/// Why `ip` is not a public unicast address, or `None` when it is one.
pub fn classify(ip: IpAddr) -> Option<Reason> {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn classify_v4(ip: Ipv4Addr) -> Option<Reason> {
    let [a, b, c, d] = ip.octets();
    let reason = match (a, b, c, d) {
        (0, 0, 0, 0) => Reason::Unspecified,
        (0, ..) => Reason::Reserved,
        (127, ..) => Reason::Loopback,
        (169, 254, 169, 254) | (100, 100, 100, 200) => Reason::Metadata,
        (169, 254, ..) => Reason::LinkLocal,
        (10, ..) | (192, 168, ..) => Reason::Private,
        (172, b, ..) if b & 0xf0 == 16 => Reason::Private,
        (100, b, ..) if b & 0xc0 == 64 => Reason::Cgnat,
        (192, 0, 2, _) | (198, 51, 100, _) | (203, 0, 113, _) => Reason::Documentation,
        // IETF protocol assignments, the old 6to4 relay anycast, benchmarking.
        (192, 0, 0, _) | (192, 88, 99, _) => Reason::Reserved,
        (198, b, ..) if b & 0xfe == 18 => Reason::Reserved,
        (255, 255, 255, 255) => Reason::Broadcast,
        (224..=239, ..) => Reason::Multicast,
        (240..=255, ..) => Reason::Reserved,
        _ => return None,
    };
    Some(reason)
}

fn classify_v6(ip: Ipv6Addr) -> Option<Reason> {
    let s = ip.segments();
    if ip.is_unspecified() {
        return Some(Reason::Unspecified);
    }
    if ip.is_loopback() {
        return Some(Reason::Loopback);
    }
    let reason = match s {
        // ::ffff:a.b.c.d (mapped), ::a.b.c.d (compatible), ::ffff:0:a.b.c.d (translated).
        [0, 0, 0, 0, 0, 0xffff, ..] | [0, 0, 0, 0, 0, 0, ..] | [0, 0, 0, 0, 0xffff, 0, ..] => {
            Reason::Mapped
        }
        // NAT64 (well-known prefix): as safe as the IPv4 address it reaches.
        [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] => return classify_v4(v4_of(hi, lo)),
        [0x64, 0xff9b, 1, ..] => Reason::Private,
        // 6to4: the IPv4 address in bits 16..48.
        [0x2002, hi, lo, ..] => return classify_v4(v4_of(hi, lo)),
        [0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254] => Reason::Metadata,
        [a, ..] if a & 0xfe00 == 0xfc00 => Reason::Private,
        [a, ..] if a & 0xffc0 == 0xfe80 => Reason::LinkLocal,
        [a, ..] if a & 0xffc0 == 0xfec0 => Reason::Reserved,
        [a, ..] if a & 0xff00 == 0xff00 => Reason::Multicast,
        [0x2001, 0xdb8, ..] => Reason::Documentation,
        [a, b, ..] if a == 0x3fff && b & 0xf000 == 0 => Reason::Documentation,
        // IETF protocol assignments (Teredo among them), discard-only.
        [0x2001, b, ..] if b < 0x200 => Reason::Reserved,
        [0x100, 0, 0, 0, ..] => Reason::Reserved,
        // Outside 2000::/3 nothing is allocated for the public Internet.
        [a, ..] if a & 0xe000 != 0x2000 => Reason::Reserved,
        _ => return None,
    };
    Some(reason)
}

fn v4_of(hi: u16, lo: u16) -> Ipv4Addr {
    Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo))
}

/// `host` as an IP address in any spelling a C resolver would accept, or `None` for a
/// name: dotted IPv4 with 1 to 4 parts, each decimal, octal (leading `0`) or hex (`0x`),
/// one trailing dot allowed; IPv6, bracketed or not, with an optional `%zone`.
pub fn parse_ip(host: &str) -> Option<IpAddr> {
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.contains(':') {
        let addr = host.split_once('%').map_or(host, |(a, _zone)| a);
        return addr.parse::<Ipv6Addr>().ok().map(IpAddr::V6);
    }
    parse_v4(host).map(IpAddr::V4)
}

fn parse_v4(host: &str) -> Option<Ipv4Addr> {
    let host = host.strip_suffix('.').unwrap_or(host);
    if host.is_empty() {
        return None;
    }
    let mut parts = [0u64; 4];
    let mut n = 0;
    for part in host.split('.') {
        if n == 4 {
            return None;
        }
        parts[n] = number(part)?;
        n += 1;
    }
    let (head, last) = (&parts[..n - 1], parts[n - 1]);
    if head.iter().any(|&p| p > 255) || last >= 1u64 << (8 * (5 - n)) {
        return None;
    }
    let value = head
        .iter()
        .enumerate()
        .fold(last, |acc, (i, &p)| acc | (p << (24 - 8 * i)));
    Some(Ipv4Addr::from(value as u32))
}

/// One part of an `inet_aton` address.
fn number(part: &str) -> Option<u64> {
    let (digits, radix) =
        if let Some(h) = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
            (h, 16)
        } else if part.len() > 1 && part.starts_with('0') {
            (&part[1..], 8)
        } else {
            (part, 10)
        };
    if digits.is_empty() && radix == 10 {
        return None;
    }
    if digits.is_empty() {
        // `0x` alone is zero to the C library.
        return Some(0);
    }
    if !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    // Leading zeros are free (`0000000000007` is 7 to the C library); what is left
    // must fit, and anything past 12 digits does not fit an address part anyway.
    let digits = digits.trim_start_matches('0');
    if digits.len() > 12 {
        return None;
    }
    if digits.is_empty() {
        return Some(0);
    }
    u64::from_str_radix(digits, radix).ok()
}

/// The most addresses one answer may carry: more fails the attempt.
pub(crate) const MAX_RECORDS: usize = 64;
/// The longest a lookup may take, less when the pool's `connect_timeout` is smaller.
pub const BUDGET: Duration = Duration::from_secs(3);
/// TTL clamps: an answer is cached at least this long (so a TTL of 0 does not mean a
/// query per connection) ...
pub(crate) const MIN_TTL: Duration = Duration::from_secs(1);
/// ... and at most this long (so a long TTL is still revisited).
pub(crate) const MAX_TTL: Duration = Duration::from_secs(300);
/// A failed or empty answer is remembered this long at most.
pub(crate) const MAX_NEGATIVE_TTL: Duration = Duration::from_secs(5);
/// Names cached at once; the least recently used go first.
pub(crate) const CACHE_ENTRIES: usize = 4096;

/// A name's addresses, and until when the resolver vouches for them (the soonest TTL
/// of the answers, clamped as above).
#[derive(Debug, Clone)]
pub struct Answer {
    pub ips: Vec<IpAddr>,
    pub valid_until: Instant,
}

/// One SRV record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Srv {
    pub priority: u16,
    pub weight: u16,
    pub port: u16,
    /// Without its final dot.
    pub target: String,
}

/// A name's SRV records, and until when the resolver vouches for them.
#[derive(Debug, Clone)]
pub struct SrvAnswer {
    pub records: Vec<Srv>,
    pub valid_until: Instant,
}

/// Why a name gave no address to dial.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ResolveError {
    #[error("cannot resolve {name}: {why}")]
    Failed { name: String, why: String },
    #[error("cannot resolve {name}: no answer within {budget:?}")]
    TimedOut { name: String, budget: Duration },
    #[error("cannot resolve {name}: the answer has {count} records, more than {MAX_RECORDS}")]
    TooMany { name: String, count: usize },
}

/// An empty answer for one family: no records with NOERROR or NXDOMAIN. No records
/// with any other code (SERVFAIL, REFUSED) is a failure, not an empty answer.
fn is_empty_answer(e: &hickory_resolver::ResolveError) -> bool {
    use hickory_resolver::proto::op::ResponseCode;
    use hickory_resolver::proto::ProtoErrorKind;
    match e.proto().map(|p| p.kind()) {
        Some(ProtoErrorKind::NoRecordsFound { response_code, .. }) => {
            matches!(
                response_code,
                ResponseCode::NoError | ResponseCode::NXDomain
            )
        }
        _ => false,
    }
}

/// The resolver every dial uses: one per set of `resolver` addresses, kept across
/// reloads that do not change them (its cache with it).
pub struct Dns {
    resolver: TokioResolver,
    /// `global { resolver ... }`, or empty for the system's configuration.
    servers: Vec<SocketAddr>,
    /// Rotate the first address tried, so the addresses of one name share the load:
    /// one counter per name's hash, so names dialed in turn do not share a rhythm.
    spread: [AtomicUsize; 64],
}

impl Dns {
    /// A resolver asking `servers` (UDP, and TCP for truncated answers), or the
    /// system's configured ones when `servers` is empty.
    pub fn new(servers: &[SocketAddr]) -> Dns {
        let (config, mut opts) = if servers.is_empty() {
            match hickory_resolver::system_conf::read_system_conf() {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(
                        "sluice: cannot read the system's DNS configuration ({e}); names in backend addresses will not resolve — set `resolver ADDR` in the global block"
                    );
                    (ResolverConfig::new(), ResolverOpts::default())
                }
            }
        } else {
            let mut group = NameServerConfigGroup::with_capacity(servers.len() * 2);
            for &addr in servers {
                group.push(NameServerConfig::new(addr, Protocol::Udp));
                group.push(NameServerConfig::new(addr, Protocol::Tcp));
            }
            (
                ResolverConfig::from_parts(None, Vec::new(), group),
                ResolverOpts::default(),
            )
        };
        opts.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
        opts.cache_size = CACHE_ENTRIES;
        opts.positive_min_ttl = Some(MIN_TTL);
        opts.positive_max_ttl = Some(MAX_TTL);
        opts.negative_min_ttl = Some(MIN_TTL);
        opts.negative_max_ttl = Some(MAX_NEGATIVE_TTL);
        // Two tries of one second fit the budget; the budget bounds them anyway.
        opts.timeout = Duration::from_secs(1);
        opts.attempts = 2;
        opts.edns0 = true;
        let mut builder =
            TokioResolver::builder_with_config(config, TokioConnectionProvider::default());
        *builder.options_mut() = opts;
        Dns {
            resolver: builder.build(),
            servers: servers.to_vec(),
            spread: [const { AtomicUsize::new(0) }; 64],
        }
    }

    pub fn servers(&self) -> &[SocketAddr] {
        &self.servers
    }

    /// The addresses of `name` (cached while their TTL lasts), within `budget`.
    pub async fn lookup(&self, name: &str, budget: Duration) -> Result<Answer, ResolveError> {
        let budget = budget.min(BUDGET);
        // Both families at once, each judged on its own: an empty answer for one is
        // fine, an error for either fails the lookup (a half answer is not served).
        let both = async {
            tokio::join!(
                self.resolver.ipv4_lookup(name),
                self.resolver.ipv6_lookup(name)
            )
        };
        let (v4, v6) =
            tokio::time::timeout(budget, both)
                .await
                .map_err(|_| ResolveError::TimedOut {
                    name: name.to_string(),
                    budget,
                })?;
        let failed = |family: &str, e: &hickory_resolver::ResolveError| ResolveError::Failed {
            name: name.to_string(),
            why: format!("{family}: {e}"),
        };
        let mut ips = Vec::new();
        // The answer sections together, CNAME records included.
        let mut records = 0;
        let mut empty = Vec::new();
        let mut valid_until: Option<Instant> = None;
        let v4 = v4.map(|l| l.as_lookup().clone());
        let v6 = v6.map(|l| l.as_lookup().clone());
        for (family, answer) in [("A", v4), ("AAAA", v6)] {
            match answer {
                Ok(l) => {
                    records += l.records().len();
                    let until = l.valid_until();
                    valid_until = Some(valid_until.map_or(until, |v| v.min(until)));
                    ips.extend(l.iter().filter_map(|r| r.ip_addr()));
                }
                Err(e) if is_empty_answer(&e) => empty.push(e),
                Err(e) => return Err(failed(family, &e)),
            }
        }
        if records > MAX_RECORDS {
            return Err(ResolveError::TooMany {
                name: name.to_string(),
                count: records,
            });
        }
        if ips.is_empty() {
            let why = if empty.iter().any(|e| e.is_nx_domain()) {
                "no such name (NXDOMAIN)"
            } else {
                "the name has no A or AAAA records"
            };
            return Err(ResolveError::Failed {
                name: name.to_string(),
                why: why.into(),
            });
        }
        Ok(Answer {
            ips,
            valid_until: valid_until.unwrap_or_else(|| Instant::now() + MIN_TTL),
        })
    }

    /// The SRV records of `name` (DESIGN §18.7), within `budget`; an empty answer is
    /// an error, as for addresses.
    pub async fn srv(&self, name: &str, budget: Duration) -> Result<SrvAnswer, ResolveError> {
        let budget = budget.min(BUDGET);
        let failed = |why: String| ResolveError::Failed {
            name: name.to_string(),
            why,
        };
        let lookup = tokio::time::timeout(budget, self.resolver.srv_lookup(name))
            .await
            .map_err(|_| ResolveError::TimedOut {
                name: name.to_string(),
                budget,
            })?;
        let lookup = match lookup {
            Ok(l) => l,
            Err(e) if e.is_nx_domain() => return Err(failed("no such name (NXDOMAIN)".into())),
            Err(e) if is_empty_answer(&e) => {
                return Err(failed("the name has no SRV records".into()))
            }
            Err(e) => return Err(failed(format!("SRV: {e}"))),
        };
        let records: Vec<Srv> = lookup
            .iter()
            .map(|r| Srv {
                priority: r.priority(),
                weight: r.weight(),
                port: r.port(),
                target: r.target().to_utf8().trim_end_matches('.').to_string(),
            })
            // A target of "." says the service is not offered there.
            .filter(|r| !r.target.is_empty() && r.port != 0)
            .collect();
        if records.is_empty() {
            return Err(failed("the name has no usable SRV records".into()));
        }
        Ok(SrvAnswer {
            records,
            valid_until: lookup.as_lookup().valid_until(),
        })
    }

    /// Where to start in `name`'s answer of `n` addresses.
    pub fn first_of(&self, name: &str, n: usize) -> usize {
        let h = name.bytes().fold(0xcbf29ce484222325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
        });
        self.spread[(h % 64) as usize].fetch_add(1, Ordering::Relaxed) % n.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(s: &str) -> Option<IpAddr> {
        parse_ip(s)
    }

    fn reason(s: &str) -> Option<Reason> {
        classify(parse_ip(s).unwrap_or_else(|| panic!("{s} does not parse")))
    }

    #[test]
    fn inet_aton_spellings() {
        let lo = Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)));
        for s in [
            "127.0.0.1",
            "127.0.0.1.",
            "2130706433",
            "0x7f000001",
            "0X7F000001",
            "017700000001",
            "0177.0.0.1",
            "0x7f.0.0.1",
            "0x7f.1",
            "127.1",
            "127.0.1",
            "0177.0x0.00.0x1",
            // Found by the `safety` fuzz target against glibc: leading zeros are free.
            "0000000000000177.00000000000000.0.0x000000000000001",
        ] {
            assert_eq!(v4(s), lo, "{s}");
        }
        assert_eq!(v4("0"), Some(IpAddr::V4(Ipv4Addr::UNSPECIFIED)));
        assert_eq!(v4("0x"), Some(IpAddr::V4(Ipv4Addr::UNSPECIFIED)));
        assert_eq!(
            v4("169.254.43518"),
            Some(IpAddr::V4(Ipv4Addr::new(169, 254, 169, 254)))
        );
        assert_eq!(
            v4("0xa9fea9fe"),
            Some(IpAddr::V4(Ipv4Addr::new(169, 254, 169, 254)))
        );
        for name in [
            "",
            ".",
            "example.com",
            "1.2.3.4.5",
            "256.1.1.1",
            "1.2.3.256",
            "08.1.1.1",
            "0x1g.1.1.1",
            "4294967296",
            "1..1",
            "127.0.0.1..",
            "1.2.65536",
            "-1.2.3.4",
            "0x7f.example",
        ] {
            assert_eq!(v4(name), None, "{name:?}");
        }
        assert_eq!(
            v4("1.16777215"),
            Some(IpAddr::V4(Ipv4Addr::new(1, 255, 255, 255)))
        );
    }

    #[test]
    fn ipv6_spellings() {
        for s in [
            "::1",
            "[::1]",
            "0:0:0:0:0:0:0:1",
            "0000:0000:0000:0000:0000:0000:0000:0001",
        ] {
            assert_eq!(reason(s), Some(Reason::Loopback), "{s}");
        }
        for s in [
            "::ffff:127.0.0.1",
            "::ffff:7f00:1",
            "0:0:0:0:0:ffff:7f00:0001",
            "::FFFF:8.8.8.8",
            "::ffff:0:8.8.8.8",
            "::8.8.8.8",
            "::127.0.0.1",
            "[::ffff:10.0.0.1]",
        ] {
            assert_eq!(reason(s), Some(Reason::Mapped), "{s}");
        }
        assert_eq!(reason("fe80::1%eth0"), Some(Reason::LinkLocal));
        assert_eq!(reason("[fe80::1%25eth0]"), Some(Reason::LinkLocal));
        assert_eq!(reason("FE80:0:0:0:0:0:0:1"), Some(Reason::LinkLocal));
        assert_eq!(reason("::"), Some(Reason::Unspecified));
        assert_eq!(reason("0:0::0"), Some(Reason::Unspecified));
    }

    #[test]
    fn ranges() {
        let cases = [
            ("0.0.0.0", Some(Reason::Unspecified)),
            ("0.1.2.3", Some(Reason::Reserved)),
            ("127.255.0.9", Some(Reason::Loopback)),
            ("10.1.2.3", Some(Reason::Private)),
            ("172.16.0.1", Some(Reason::Private)),
            ("172.31.255.255", Some(Reason::Private)),
            ("172.32.0.1", None),
            ("172.15.0.1", None),
            ("192.168.9.9", Some(Reason::Private)),
            ("100.64.0.1", Some(Reason::Cgnat)),
            ("100.127.255.255", Some(Reason::Cgnat)),
            ("100.128.0.1", None),
            ("169.254.169.254", Some(Reason::Metadata)),
            ("100.100.100.200", Some(Reason::Metadata)),
            ("169.254.1.1", Some(Reason::LinkLocal)),
            ("192.0.2.7", Some(Reason::Documentation)),
            ("198.51.100.7", Some(Reason::Documentation)),
            ("203.0.113.7", Some(Reason::Documentation)),
            ("192.0.0.8", Some(Reason::Reserved)),
            ("198.18.0.1", Some(Reason::Reserved)),
            ("198.19.255.1", Some(Reason::Reserved)),
            ("198.20.0.1", None),
            ("224.0.0.1", Some(Reason::Multicast)),
            ("239.255.255.250", Some(Reason::Multicast)),
            ("240.0.0.1", Some(Reason::Reserved)),
            ("255.255.255.255", Some(Reason::Broadcast)),
            ("8.8.8.8", None),
            ("1.1.1.1", None),
            ("93.184.216.34", None),
            ("fc00::1", Some(Reason::Private)),
            ("fd12:3456::1", Some(Reason::Private)),
            ("fd00:ec2::254", Some(Reason::Metadata)),
            ("fe80::1", Some(Reason::LinkLocal)),
            ("febf::1", Some(Reason::LinkLocal)),
            ("fec0::1", Some(Reason::Reserved)),
            ("ff02::1", Some(Reason::Multicast)),
            ("2001:db8::1", Some(Reason::Documentation)),
            ("3fff::1", Some(Reason::Documentation)),
            ("2001::1", Some(Reason::Reserved)),
            ("100::1", Some(Reason::Reserved)),
            ("64:ff9b::a00:1", Some(Reason::Private)),
            ("64:ff9b::10.0.0.1", Some(Reason::Private)),
            ("64:ff9b::8.8.8.8", None),
            ("64:ff9b:1::1", Some(Reason::Private)),
            ("2002:7f00:1::1", Some(Reason::Loopback)),
            ("2002:a9fe:a9fe::1", Some(Reason::Metadata)),
            ("2002:808:808::1", None),
            ("4000::1", Some(Reason::Reserved)),
            ("::2", Some(Reason::Mapped)),
            ("2606:4700::1111", None),
            ("2a00:1450:4001::1", None),
        ];
        for (s, want) in cases {
            assert_eq!(reason(s), want, "{s}");
        }
    }

    fn at(s: &str, port: u16) -> SocketAddr {
        SocketAddr::new(parse_ip(s).unwrap(), port)
    }

    #[test]
    fn allow_and_block() {
        let p = Policy {
            allow_private: vec![
                "10.0.0.0/8".parse().unwrap(),
                "127.0.0.0/8".parse().unwrap(),
                "169.254.0.0/16".parse().unwrap(),
                "::/0".parse().unwrap(),
            ],
            block: vec![
                "10.9.0.0/16".parse().unwrap(),
                "8.8.4.4/32".parse().unwrap(),
            ],
            listeners: vec![at("127.0.0.1", 8080)],
            local: Vec::new(),
        };
        assert_eq!(p.judge(at("10.1.1.1", 80)), None);
        assert_eq!(p.judge(at("10.9.1.1", 80)), Some(Reason::Blocked));
        assert_eq!(p.judge(at("8.8.4.4", 80)), Some(Reason::Blocked));
        assert_eq!(p.judge(at("8.8.8.8", 80)), None);
        assert_eq!(p.judge(at("127.0.0.1", 9000)), None);
        assert_eq!(p.judge(at("127.0.0.1", 8080)), Some(Reason::Listener));
        assert_eq!(p.judge(at("0x7f.1", 8080)), Some(Reason::Listener));
        // Mapped IPv6 is refused even under an allow that covers it.
        assert_eq!(p.judge(at("::ffff:10.1.1.1", 80)), Some(Reason::Mapped));
        // Metadata needs an allow naming it alone.
        assert_eq!(p.judge(at("169.254.169.254", 80)), Some(Reason::Metadata));
        assert_eq!(p.judge(at("169.254.1.1", 80)), None);
        let p2 = Policy {
            allow_private: vec!["169.254.169.254/32".parse().unwrap()],
            ..Policy::default()
        };
        assert_eq!(p2.judge(at("169.254.169.254", 80)), None);
        // Nothing allowed: the defaults never admit loopback.
        let strict = Policy::default();
        assert_eq!(strict.judge(at("127.0.0.1", 80)), Some(Reason::Loopback));
        assert_eq!(strict.judge(at("[::1]", 80)), Some(Reason::Loopback));
        assert_eq!(strict.judge(at("1.1.1.1", 443)), None);
    }

    #[test]
    fn wildcard_listener_covers_local_addresses() {
        let p = Policy {
            allow_private: vec!["127.0.0.0/8".parse().unwrap()],
            listeners: vec![at("0.0.0.0", 8443)],
            local: local_addresses(),
            ..Policy::default()
        };
        assert_eq!(p.judge(at("127.0.0.1", 8443)), Some(Reason::Listener));
        assert_eq!(p.judge(at("127.0.0.5", 8443)), Some(Reason::Listener));
        assert_eq!(p.judge(at("127.0.0.1", 8444)), None);
        let anywhere = Policy {
            allow_private: vec!["0.0.0.0/0".parse().unwrap()],
            listeners: vec![at("127.0.0.1", 8080)],
            ..Policy::default()
        };
        assert_eq!(anywhere.judge(at("0.0.0.0", 8080)), Some(Reason::Listener));
        // An address of another host on the listener's port is not a loop.
        let public = Policy {
            listeners: vec![at("0.0.0.0", 443)],
            local: local_addresses(),
            ..Policy::default()
        };
        assert_eq!(public.judge(at("1.1.1.1", 443)), None);
    }

    #[test]
    fn block_and_listeners_see_through_nat64_and_6to4() {
        let p = Policy {
            block: vec![
                "203.0.113.0/24".parse().unwrap(),
                "8.8.8.8/32".parse().unwrap(),
            ],
            listeners: vec![at("1.1.1.1", 443)],
            ..Policy::default()
        };
        assert_eq!(p.judge(at("64:ff9b::808:808", 80)), Some(Reason::Blocked));
        assert_eq!(p.judge(at("2002:808:808::1", 80)), Some(Reason::Blocked));
        assert_eq!(p.judge(at("64:ff9b::8.8.4.4", 80)), None);
        assert_eq!(p.judge(at("64:ff9b::1.1.1.1", 443)), Some(Reason::Listener));
        // allow_private admits a range's NAT64 and 6to4 forms too.
        let allowed = Policy {
            allow_private: vec!["10.0.0.0/8".parse().unwrap()],
            ..Policy::default()
        };
        assert_eq!(allowed.judge(at("64:ff9b::10.0.0.1", 80)), None);
        assert_eq!(allowed.judge(at("2002:a00:1::1", 80)), None);
        assert_eq!(
            allowed.judge(at("::ffff:10.0.0.1", 80)),
            Some(Reason::Mapped)
        );
    }
}
