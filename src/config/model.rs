//! The typed, validated configuration: what `config::build` produces and the runtime
//! compiles into its route tables and pools. Plain data: no sockets, no counters, no
//! state that must survive a reload (that lives in `upstream`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use http::{HeaderName, HeaderValue, Method, StatusCode};
use ipnet::IpNet;

use super::diag::Span;
pub use super::template::{HeaderOp, HeaderTemplate, Template};

#[derive(Debug, Clone)]
pub struct Config {
    pub global: Global,
    pub listeners: Vec<Listen>,
    pub sites: Vec<Site>,
    /// L4 listeners: bytes relayed to a pool.
    pub tcp: Vec<TcpProxy>,
}

/// `tcp ADDR { proxy ADDR... { … } }`.
#[derive(Debug, Clone)]
pub struct TcpProxy {
    pub listen: Listen,
    /// The pools: each `sni HOST... { proxy … }` in written order, then the bare
    /// `proxy` (no names) if there is one.
    pub pools: Vec<TcpPool>,
    /// Connections relayed at once; one over it is closed as soon as accepted.
    pub max_conns: u64,
    /// `allow`, `deny` and `rate_limit` lines, in written order: each judges a new
    /// connection's client address; a refused connection is closed at once.
    pub guards: Vec<Filter>,
}

impl std::fmt::Display for HostPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostPattern::Exact(n) => f.write_str(n),
            HostPattern::Suffix(s) => write!(f, "*{s}"),
            HostPattern::Any => f.write_str("*"),
        }
    }
}

/// The PROXY protocol version a pool sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyProtocol {
    V1,
    V2,
}

impl From<ProxyProtocol> for crate::net::proxy_protocol::Version {
    fn from(v: ProxyProtocol) -> Self {
        match v {
            ProxyProtocol::V1 => Self::V1,
            ProxyProtocol::V2 => Self::V2,
        }
    }
}

/// One pool of a `tcp` block.
#[derive(Debug, Clone)]
pub struct TcpPool {
    /// The TLS server names (SNI) it takes: exact names and `*.suffix`; empty for the
    /// bare `proxy`, which takes the rest.
    pub sni: Vec<HostPattern>,
    /// Only its L4-meaningful options are set.
    pub proxy: ProxyConfig,
    /// A connection with no byte either way for this long closes.
    pub idle_timeout: Duration,
}

impl TcpProxy {
    /// Every pool's settings.
    pub fn proxies(&self) -> impl Iterator<Item = &ProxyConfig> {
        self.pools.iter().map(|p| &p.proxy)
    }
}

impl Config {
    pub fn routes(&self) -> impl Iterator<Item = &Route> {
        self.sites.iter().flat_map(|s| s.routes.iter())
    }

    pub fn pools(&self) -> impl Iterator<Item = (&Route, &ProxyConfig)> {
        self.routes().filter_map(|r| match &r.handler {
            Some(Handler::Proxy(p)) => Some((r, &**p)),
            _ => None,
        })
    }

    /// The destination policy of a strict pool: the global lists, and every address
    /// sluice itself listens on (dialing one would loop).
    pub fn safety_policy(&self) -> crate::safety::Policy {
        let listeners: Vec<SocketAddr> = self
            .listeners
            .iter()
            .chain(self.tcp.iter().map(|t| &t.listen))
            .map(|l| l.addr)
            .chain(self.global.admin)
            .collect();
        let wildcard = listeners.iter().any(|l| l.ip().is_unspecified());
        crate::safety::Policy {
            allow_private: self.global.safety.allow_private.clone(),
            block: self.global.safety.block.clone(),
            local: if wildcard {
                crate::safety::local_addresses()
            } else {
                Vec::new()
            },
            listeners,
        }
    }

    /// Whether `pool` checks its destinations: its own `safety`, else the global default.
    pub fn is_strict(&self, pool: &ProxyConfig) -> bool {
        pool.safety.unwrap_or(self.global.safety.strict)
    }

    /// One line for `sluice check` and the start-up log.
    pub fn summary(&self) -> String {
        let plural = |n: usize, one: &str| format!("{n} {one}{}", if n == 1 { "" } else { "s" });
        format!(
            "{}, {}, {}, {}",
            plural(self.listeners.len() + self.tcp.len(), "listener"),
            plural(self.sites.len(), "site"),
            plural(self.routes().count(), "route"),
            plural(self.pools().count() + self.tcp.len(), "pool"),
        )
    }
}

#[derive(Debug, Clone)]
pub struct Global {
    /// Runtime worker threads; `None` = available cores.
    pub workers: Option<usize>,
    /// Peers whose forwarding headers are believed.
    pub trust: Vec<IpNet>,
    /// How long in-flight requests may finish after SIGTERM/SIGINT.
    pub grace: Duration,
    /// Health probes running at once, process-wide.
    pub probe_concurrency: usize,
    /// The admin API's address; `None` with `admin off`.
    pub admin: Option<SocketAddr>,
    /// `admin ADDR { token_file FILE | token VALUE }`: every admin request but the
    /// dashboard page needs `Authorization: Bearer TOKEN`.
    pub admin_token: Option<AdminToken>,
    /// `access_log`; `None` when off (the default).
    pub access_log: Option<AccessLogConfig>,
    /// `tracing on`: W3C `traceparent` to backends.
    pub tracing: bool,
    /// `log_format json`: sluice's own log lines as JSON objects (default `text`).
    pub log_json: bool,
    /// `tracing otlp URL { … }`: spans exported to an OpenTelemetry collector
    /// (`tracing` is then on too).
    pub otlp: Option<OtlpConfig>,
    /// `server_tokens on|off`: sluice's own answers say `Server: sluice` (on).
    pub server_tokens: bool,
    /// `retries off`: no request is ever sent again, whatever the pools say.
    pub retries_off: bool,
    /// The most upgraded connections (WebSockets) open at once.
    pub max_tunnels: u64,
    /// Bytes of FastCGI request bodies held at once (memory and temporary files).
    pub spool_max: u64,
    /// How long one Redis check on the request path may take.
    pub redis_timeout: std::time::Duration,
    /// `redis_ca FILE`: PEM roots `rediss://` servers are verified against.
    pub redis_ca: Option<std::sync::Arc<Vec<u8>>>,
    /// How long a tunnel of a pool a reload removed may stay open.
    pub tunnel_drain: Duration,
    /// A tunnel with no byte either way for this long closes.
    pub tunnel_idle: Duration,
    /// `pid_file FILE`: the process id, written once the listeners are bound and
    /// removed at a clean exit (relative to the config file).
    pub pid_file: Option<PathBuf>,
    /// `resolver ADDR...`: the DNS servers names are resolved with; empty for the
    /// system's (`/etc/resolv.conf`).
    pub resolver: Vec<SocketAddr>,
    /// `safety { ... }`: the default and the lists every strict pool shares.
    pub safety: SafetyGlobal,
    /// `fleet URL { … }`: this instance follows the revisions published to a Redis
    /// channel (DESIGN §18.6).
    pub fleet: Option<FleetConfig>,
    /// `acme { … }`: how `tls auto` sites get their certificates (defaults when not
    /// written; used only when some site has `tls auto`).
    pub acme: AcmeConfig,
}

/// `global { acme { directory URL; email ADDR; ca_root FILE; storage DIR|redis://…;
/// challenge http-01 tls-alpn-01; renew_before D } }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcmeConfig {
    /// The ACME server's directory URL (default: Let's Encrypt's production one).
    pub directory: String,
    pub email: Option<String>,
    /// `ca_root FILE`: one more root the ACME server's own certificate may chain to.
    pub ca_root: Option<PathBuf>,
    pub storage: AcmeStorage,
    /// `challenge` lists `http-01`.
    pub http01: bool,
    /// `challenge` lists `tls-alpn-01`.
    pub tls_alpn01: bool,
    /// `challenge` lists `dns-01` (or is not written beside `dns_update`).
    pub dns01: bool,
    /// `dns_update SERVER:PORT { … }`: where dns-01 answers go. Wildcard names use it
    /// whatever `challenge` says (dns-01 is the only challenge they are offered).
    pub dns_update: Option<DnsUpdate>,
    /// Renew this long before expiry (or at 2/3 of the lifetime, whichever is
    /// earlier; never before 1/3 of it).
    pub renew_before: Duration,
    /// Where the block was written (`Span::default()` when it was not).
    pub span: Span,
}

/// `tracing otlp URL { sample F; service NAME; headers { NAME VALUE } }`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OtlpConfig {
    /// Where spans are POSTed: `http(s)://HOST:PORT/v1/traces`.
    pub url: http::Uri,
    /// The share of new traces recorded, in millionths (a trace a client started
    /// follows its own `sampled` flag).
    pub sample_ppm: u32,
    /// `service.name` of the resource.
    pub service: String,
    /// Fields sent with each export (an API key).
    pub headers: Vec<(HeaderName, HeaderValue)>,
}

/// `dns_update SERVER:PORT { zone Z; key_name N; key_file F; algorithm hmac-sha256 }`:
/// dns-01 answers as RFC 2136 updates to the zone's primary server, signed with TSIG.
#[derive(Clone, PartialEq, Eq)]
pub struct DnsUpdate {
    pub server: SocketAddr,
    /// The zone the updates change: lower case, no final dot.
    pub zone: String,
    /// The TSIG key's name, as the server knows it.
    pub key_name: String,
    pub algorithm: TsigAlgorithm,
    /// The key's secret, decoded from `key_file`.
    pub secret: Vec<u8>,
}

impl DnsUpdate {
    /// Whether `_acme-challenge.NAME` lies in the zone (`name` lower case, no dot).
    pub fn covers(&self, name: &str) -> bool {
        name == self.zone
            || name
                .strip_suffix(self.zone.as_str())
                .is_some_and(|head| head.ends_with('.'))
    }
}

impl std::fmt::Debug for DnsUpdate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DnsUpdate")
            .field("server", &self.server)
            .field("zone", &self.zone)
            .field("key_name", &self.key_name)
            .field("algorithm", &self.algorithm)
            .finish_non_exhaustive()
    }
}

/// The TSIG MACs sluice signs with (RFC 8945 §6: the SHA-2 HMACs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TsigAlgorithm {
    HmacSha256,
    HmacSha384,
    HmacSha512,
}

impl TsigAlgorithm {
    /// As BIND writes it.
    pub fn name(self) -> &'static str {
        match self {
            TsigAlgorithm::HmacSha256 => "hmac-sha256",
            TsigAlgorithm::HmacSha384 => "hmac-sha384",
            TsigAlgorithm::HmacSha512 => "hmac-sha512",
        }
    }

    /// By its name as BIND and `tsig-keygen` write it.
    pub fn from_name(name: &str) -> Option<TsigAlgorithm> {
        match name.trim_end_matches('.').to_ascii_lowercase().as_str() {
            "hmac-sha256" => Some(TsigAlgorithm::HmacSha256),
            "hmac-sha384" => Some(TsigAlgorithm::HmacSha384),
            "hmac-sha512" => Some(TsigAlgorithm::HmacSha512),
            _ => None,
        }
    }
}

/// Where account keys, certificates and their keys are kept.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum AcmeStorage {
    /// A folder (default `sluice-data/acme` beside the config file).
    Folder(PathBuf),
    /// `redis://HOST:PORT[/DB]`: shared by every instance naming it.
    Redis(String),
}

/// Let's Encrypt's production directory: what `tls auto` uses unless told otherwise.
pub const LETS_ENCRYPT: &str = "https://acme-v02.api.letsencrypt.org/directory";

impl Default for AcmeConfig {
    fn default() -> Self {
        AcmeConfig {
            directory: LETS_ENCRYPT.to_string(),
            email: None,
            ca_root: None,
            storage: AcmeStorage::Folder(PathBuf::from("sluice-data/acme")),
            http01: true,
            tls_alpn01: true,
            dns01: false,
            dns_update: None,
            renew_before: Duration::from_secs(30 * 86_400),
            span: Span::default(),
        }
    }
}

/// `global { safety { default strict|off; allow_private CIDR...; block CIDR... } }`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SafetyGlobal {
    /// Pools without their own `safety` are strict.
    pub strict: bool,
    pub allow_private: Vec<IpNet>,
    pub block: Vec<IpNet>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AccessLogConfig {
    pub target: LogTarget,
    pub format: AccessFormat,
}

/// How an access log line is written.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum AccessFormat {
    /// One JSON object a line (the default).
    Json,
    /// sluice's text line: Apache's common fields, then host, pool, peer, attempts, time.
    Text,
    /// Apache's Combined Log Format.
    Combined,
    /// Apache's Common Log Format.
    Common,
    /// The operator's own line (a newline is added).
    Template(std::sync::Arc<crate::config::template::LogTemplate>),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LogTarget {
    Stdout,
    Stderr,
    File(PathBuf),
}

impl Default for Global {
    fn default() -> Self {
        Global {
            workers: None,
            trust: Vec::new(),
            grace: Duration::from_secs(10),
            probe_concurrency: 16,
            admin: Some(SocketAddr::from(([127, 0, 0, 1], 2019))),
            admin_token: None,
            access_log: None,
            tracing: false,
            log_json: false,
            otlp: None,
            server_tokens: true,
            retries_off: false,
            max_tunnels: 16_384,
            spool_max: 1 << 30,
            redis_timeout: std::time::Duration::from_millis(50),
            redis_ca: None,
            tunnel_drain: Duration::from_secs(3600),
            tunnel_idle: Duration::from_secs(3600),
            pid_file: None,
            resolver: Vec::new(),
            safety: SafetyGlobal::default(),
            fleet: None,
            acme: AcmeConfig::default(),
        }
    }
}

/// `global { fleet URL { name NAME; channel NAME } }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetConfig {
    /// `redis://…` or `rediss://…`, with its password when it has one.
    pub url: String,
    /// This instance's name in the fleet (default: the host name).
    pub name: String,
    /// The channel revisions are announced on, and the prefix of the fleet's keys.
    pub channel: String,
}

#[derive(Debug, Clone)]
pub struct Listen {
    pub addr: SocketAddr,
    /// As written, for messages.
    pub text: String,
    /// `:PORT`: every interface of both families on one socket (`[::]` with IPv6-only
    /// off).
    pub dual_stack: bool,
    /// `listen ADDR tls`: TLS with the sites' certificates, chosen by SNI.
    pub tls: bool,
    /// `listen ADDR proxy_protocol`: each connection starts with a PROXY protocol
    /// header (v1 or v2) from a `trust` address, naming the client.
    pub proxy_protocol: bool,
    /// `listen ADDR tls quic`: HTTP/3 on a UDP socket of the same address and port.
    pub quic: bool,
    pub span: Span,
    /// Where the address is written.
    pub addr_span: Span,
    /// Its place among the `listen` and `tcp` lines as read (an import's where the
    /// import stands): which of two lines of one address is the repeat.
    pub seq: usize,
    /// `listen ADDR { allow …; deny …; rate_limit N/s }`: connections judged at accept
    /// (DESIGN §18.4), as a `tcp` block's.
    pub guards: Vec<Filter>,
}

#[derive(Debug, Clone)]
pub struct Site {
    /// The first host as written: the site's name in logs and pool names.
    pub name: String,
    pub hosts: Vec<HostPattern>,
    /// Each host as written, and where.
    pub host_words: Vec<(String, Span)>,
    pub routes: Vec<Route>,
    /// The filters written in the site block: every route runs them before its own
    /// (and their response phase after its own).
    pub filters: Vec<FilterLine>,
    /// `error_page` lines in the site block: for every route, and for requests no
    /// route takes.
    pub error_pages: Vec<ErrorPage>,
    /// `tls CERT KEY`: served by SNI on `tls` listeners.
    pub tls: Option<SiteTls>,
    /// `maintenance …` on the site: its routes answer it (a route's own wins).
    pub maintenance: Option<Maintenance>,
    /// `https_redirect [CODE]`: plain-listener requests are sent to `https://`.
    pub https_redirect: Option<HttpsRedirect>,
    /// `hsts MAX_AGE [subdomains] [preload]`: on every response over TLS.
    pub hsts: Option<Hsts>,
    /// `http_versions 1.1 2 [3]` (default all).
    pub versions: HttpVersions,
    /// `access_log …` in the site: its requests' lines go there instead of the global
    /// log (`None`: the global one's).
    pub access_log: Option<SiteLog>,
}

/// A site's own `access_log`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SiteLog {
    /// `access_log off`: none of its requests is logged.
    Off,
    To(AccessLogConfig),
}

/// The admin API's bearer token. Its `Debug` does not show it.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminToken(pub String);

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(…)")
    }
}

/// `maintenance [CODE] [BODY | file FILE] [allow CIDR...]`.
#[derive(Debug, Clone)]
pub struct Maintenance {
    /// 400..=599 (default 503).
    pub status: StatusCode,
    pub body: bytes::Bytes,
    /// `text/plain; charset=utf-8` for a written body, by extension for a file.
    pub content_type: String,
    /// Clients (after `trust`) served as usual.
    pub allow: Vec<IpNet>,
    pub span: Span,
}

impl Maintenance {
    /// `POST /maintenance` on a site that has no `maintenance` line: 503, the default
    /// body, nobody let through.
    pub fn default_answer() -> Maintenance {
        Maintenance {
            status: StatusCode::SERVICE_UNAVAILABLE,
            body: bytes::Bytes::from_static(b"Down for maintenance\n"),
            content_type: "text/plain; charset=utf-8".into(),
            allow: Vec::new(),
            span: Span::default(),
        }
    }
}

/// `https_redirect [301|302|307|308]`, with the port the redirect names.
#[derive(Debug, Clone)]
pub struct HttpsRedirect {
    pub status: StatusCode,
    /// The first `tls` listener's port (left out of the URL when 443).
    pub port: u16,
    pub span: Span,
}

/// `hsts MAX_AGE [subdomains] [preload]`.
#[derive(Debug, Clone)]
pub struct Hsts {
    pub max_age: Duration,
    pub subdomains: bool,
    pub preload: bool,
}

impl Hsts {
    /// The `Strict-Transport-Security` value.
    pub fn value(&self) -> String {
        let mut v = format!("max-age={}", self.max_age.as_secs());
        if self.subdomains {
            v.push_str("; includeSubDomains");
        }
        if self.preload {
            v.push_str("; preload");
        }
        v
    }
}

/// `http_versions 1.1 2 [3]`: what a site is served over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpVersions {
    pub h1: bool,
    pub h2: bool,
    pub h3: bool,
}

impl Default for HttpVersions {
    fn default() -> Self {
        HttpVersions {
            h1: true,
            h2: true,
            h3: true,
        }
    }
}

/// A site's certificate: its files (checked and loaded when the config is) or `auto`.
#[derive(Debug, Clone)]
pub struct SiteTls {
    pub source: CertSource,
    /// `client_ca FILE` (with `client_auth`, `client_crl`): clients show certificates.
    pub client: Option<ClientAuth>,
    pub span: Span,
}

impl SiteTls {
    /// `tls CERT KEY`: the certificate file and what was loaded from the pair.
    pub fn files(&self) -> Option<(&PathBuf, &std::sync::Arc<rustls::sign::CertifiedKey>)> {
        match &self.source {
            CertSource::Files { cert, loaded, .. } => Some((cert, loaded)),
            CertSource::Auto { .. } | CertSource::OnDemand { .. } => None,
        }
    }
}

/// Where a site's certificate comes from.
#[derive(Debug, Clone)]
pub enum CertSource {
    /// `tls CERT KEY`.
    Files {
        cert: PathBuf,
        key: PathBuf,
        loaded: std::sync::Arc<rustls::sign::CertifiedKey>,
    },
    /// `tls auto`: ordered from the ACME server for the site's names (lower case, as
    /// written, each once).
    Auto { names: Vec<String> },
    /// `tls on_demand { ask URL }` on a `*` / `*.suffix` site: a certificate ordered
    /// at the first handshake for a name `ask` allows (DESIGN §18.8).
    OnDemand { ask: String },
}

/// `tls CERT KEY { client_ca FILE; client_auth require|optional; client_crl FILE... }`.
#[derive(Debug, Clone)]
pub struct ClientAuth {
    /// Built at load: the CA roots and revocation lists, `optional` or not.
    pub verifier: std::sync::Arc<dyn rustls::server::danger::ClientCertVerifier>,
    /// `client_auth require` (the default): a handshake without a valid certificate
    /// fails.
    pub required: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HostPattern {
    /// Lower-case host, no port.
    Exact(String),
    /// `*.example.com`, stored as `.example.com`.
    Suffix(String),
    /// `*`: the default site.
    Any,
}

#[derive(Debug, Clone)]
pub struct Route {
    /// `SITE PATTERN`, or just `SITE` for the site block's own route.
    pub name: String,
    pub pattern: PathPattern,
    pub matchers: Vec<Matcher>,
    pub filters: Vec<FilterLine>,
    pub handler: Option<Handler>,
    /// `maintenance …` in the route (wins over the site's).
    pub maintenance: Option<Maintenance>,
    /// `error_page` lines in the route (win over the site's for their codes).
    pub error_pages: Vec<ErrorPage>,
    /// `cache { … }`: responses stored and served again (RFC 9111).
    pub cache: Option<CacheConfig>,
    pub span: Span,
}

/// `cache { … }` on a route (DESIGN §15.1).
#[derive(Debug, Clone)]
pub struct CacheConfig {
    pub store: CacheStore,
    /// Larger responses stream through uncached.
    pub max_object: u64,
    /// What a stored response is found by, in this order.
    pub key: Vec<CacheKeyPart>,
    /// Guess a lifetime from `Last-Modified` (RFC 9111 §4.2.2).
    pub heuristic: bool,
    /// The lifetime of heuristically cacheable responses without explicit freshness.
    pub default_ttl: std::time::Duration,
    pub stale_while_revalidate: std::time::Duration,
    pub stale_if_error: std::time::Duration,
    /// How long concurrent misses of one key wait for the one fetching it.
    pub lock: std::time::Duration,
    pub mode: CacheMode,
    /// A client's `no-cache` / `max-age` asks the origin (`off`: ignored, as a CDN).
    pub client_revalidate: bool,
    /// `redis://HOST:PORT[/DB]`: purges are published to every instance.
    pub purge_store: Option<String>,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheStore {
    /// Bytes.
    Memory(u64),
    /// A folder and its size in bytes; survives restarts.
    Disk(PathBuf, u64),
}

impl CacheStore {
    /// The setting as one string: two routes with the same one share a store, and a
    /// reload that keeps it keeps what is stored.
    pub fn identity(&self) -> String {
        match self {
            CacheStore::Memory(n) => format!("memory {n}"),
            // A folder is one store whatever its size (a reload may change the size).
            CacheStore::Disk(dir, _) => format!("disk {}", dir.display()),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheKeyPart {
    Method,
    Host,
    Path,
    Query,
    /// A request header's value (lower-case name).
    Header(http::HeaderName),
    /// A cookie's value.
    Cookie(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheMode {
    Normal,
    /// Serve what is stored, fresh or stale, without asking the origin; fetch only
    /// on a miss.
    StaleOnly,
    /// Never ask the origin; a miss is `504 not cached`.
    CacheOnly,
}

/// `error_page CODE... FILE|"BODY" [backend]`: the body that replaces sluice's own
/// answers with these codes (and with `backend`, the backend's).
#[derive(Debug, Clone)]
pub struct ErrorPage {
    pub codes: Vec<StatusCode>,
    pub body: bytes::Bytes,
    /// By FILE's extension; `text/plain; charset=utf-8` for a BODY.
    pub content_type: http::HeaderValue,
    pub backend: bool,
    pub span: Span,
}

/// One filter line: the filter, and what the line says around it.
#[derive(Debug, Clone)]
pub struct FilterLine {
    pub filter: Filter,
    /// `when …` / `unless …`: the filter runs only when this holds.
    pub condition: Option<Condition>,
    /// `when status …` / `when response_header …`: the filter's response phase runs
    /// only when this holds of the response (its result is then `matched`).
    pub response: Option<ResponseCondition>,
    /// `failure open`: a filter that cannot decide lets the request through (default
    /// closed: 500).
    pub failure_open: bool,
    /// `name NAME`: what branches skip to.
    pub name: Option<String>,
    /// The `on RESULT …` lines after it.
    pub branches: Vec<Branch>,
    pub span: Span,
}

#[derive(Debug, Clone)]
pub struct Condition {
    /// `unless`: the filter runs when the test fails.
    pub negate: bool,
    pub test: Test,
}

#[derive(Debug, Clone)]
pub enum Test {
    /// A route pattern on the normalised path.
    Path(PathPattern),
    /// `method`, `header`, `query`: as a route's `match`.
    Match(Matcher),
    /// The client's address (after `trust`).
    ClientIp(Vec<IpNet>),
    /// The TLS connection carries a verified client certificate (mTLS).
    ClientCert,
    /// `jwt.CLAIM == V`, `!= V` (the negation) or `in V...`: a claim of the token an
    /// earlier `jwt` filter verified. Without one, or without the claim, `==` and `in`
    /// fail.
    Claim { claim: String, values: Vec<String> },
}

/// A filter line's test on the response.
#[derive(Debug, Clone)]
pub struct ResponseCondition {
    /// `unless`: the response phase runs when the test fails.
    pub negate: bool,
    pub test: ResponseTest,
}

#[derive(Debug, Clone)]
pub enum ResponseTest {
    /// `status CODE|CLASS…`: any of these codes (`404`) or classes (`5xx`).
    Status(Vec<StatusSet>),
    /// `response_header NAME VALUE` (value `*`: present with any value).
    Header(HeaderName, String),
}

/// One word of `when status`: a code, or a class of a hundred codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusSet {
    Code(u16),
    /// `5xx` is `Class(5)`.
    Class(u16),
}

impl StatusSet {
    pub fn contains(self, code: u16) -> bool {
        match self {
            StatusSet::Code(c) => c == code,
            StatusSet::Class(k) => code / 100 == k,
        }
    }
}

/// `on RESULT skip_to NAME|handler | reject CODE`, or `on matched reject_response
/// CODE ["BODY"]`.
#[derive(Debug, Clone)]
pub struct Branch {
    pub result: String,
    pub action: BranchAction,
    pub span: Span,
}

#[derive(Debug, Clone)]
pub enum BranchAction {
    /// The filter at this index of the route's filters (always a later one); the
    /// number of filters for `skip_to handler`.
    SkipTo(usize),
    Reject(StatusCode),
    /// `on matched reject_response CODE ["BODY"]`: the response is replaced (the body
    /// is the status's reason when none is given).
    RejectResponse(StatusCode, Option<String>),
}

/// A route's or a filter's path pattern (matched in `route::path`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathPattern {
    Exact(String),
    /// `/api/*` is `Prefix("/api")`: `/api`, `/api/` and below, not `/apix`. `/*` is `Prefix("")`.
    Prefix(String),
    /// `~ "REGEX"`: a regular expression anywhere in the path (anchor it with `^`/`$`).
    Regex(PathRegex),
}

/// A compiled `~ "REGEX"` (the `regex` crate: linear time in the path's length),
/// compared by its text.
#[derive(Debug, Clone)]
pub struct PathRegex(pub regex::Regex);

impl PartialEq for PathRegex {
    fn eq(&self, other: &Self) -> bool {
        self.0.as_str() == other.0.as_str()
    }
}

impl Eq for PathRegex {}

#[derive(Debug, Clone)]
pub enum Matcher {
    Method(Vec<Method>),
    /// Value `*` matches any value of a present header.
    Header(HeaderName, String),
    /// Value `*` matches any value of a present parameter.
    Query(String, String),
}

#[derive(Debug, Clone)]
pub enum Filter {
    Strip(String),
    Rewrite {
        from: PathPattern,
        to: Template,
    },
    HeaderDown(HeaderOp),
    MaxBody(u64),
    /// `compress on|off|always` on a route: overrides the proxy's own setting.
    Compress(Compression),
    RequestId,
    RateLimit(RateLimit),
    Allow(Vec<IpNet>),
    Deny(Vec<IpNet>),
    /// `basic_auth USER HASH` or `basic_auth { [realm NAME]; USER HASH; ... }`.
    BasicAuth {
        users: Vec<(String, String)>,
        /// Shown by browsers in the login prompt (default `sluice`).
        realm: String,
    },
    /// `body_deny "TEXT"`: a request body containing TEXT gets 403.
    BodyDeny(String),
    Cors(Cors),
    /// `forward_auth URL { copy_headers NAME...; timeout D }`.
    ForwardAuth(Box<ForwardAuth>),
    /// `grpc_web`: gRPC-Web calls go on as gRPC, answers come back as gRPC-Web.
    GrpcWeb,
    /// `jwt { … }`: a bearer token verified at the edge (DESIGN §18.10).
    Jwt(Box<JwtConfig>),
    /// `challenge [under_load [PERCENT] | always] { … }` (DESIGN §18.12).
    Challenge(Box<ChallengeConfig>),
}

/// Where a `challenge` page posts its solution.
pub const CHALLENGE_ENDPOINT: &str = "/.sluice/challenge";

/// `challenge [under_load [PERCENT] | always] { difficulty N; pass D; secret_file F;
/// allow CIDR…; except PATTERN… }`.
#[derive(Debug, Clone)]
pub struct ChallengeConfig {
    pub mode: ChallengeMode,
    /// Leading zero bits the solution's SHA-256 needs (8..24, default 16).
    pub difficulty: u8,
    /// How long a solved challenge lets a client through (default 1 h).
    pub pass: Duration,
    /// The HMAC key (`secret_file`); `None`: random per process start.
    pub secret: Option<Vec<u8>>,
    /// Clients never challenged (after `trust`).
    pub allow: Vec<IpNet>,
    /// Paths never challenged (route patterns on the normalised path).
    pub except: Vec<PathPattern>,
}

/// When a `challenge` is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChallengeMode {
    /// While the route's pool has at least PERCENT % of its `limit` in flight.
    UnderLoad(u8),
    Always,
}

/// `jwt { jwks FILE|URL | secret_file F; issuer …; audience …; algorithms …; from …;
/// leeway D; claims_to_headers { CLAIM FIELD; … } }`.
#[derive(Debug, Clone)]
pub struct JwtConfig {
    pub keys: JwtKeys,
    /// Accepted `iss` values (any one); empty: not checked.
    pub issuers: Vec<String>,
    /// Accepted `aud` values (a token naming any one passes); empty: not checked.
    pub audiences: Vec<String>,
    /// The algorithms a token may be signed with; never `none`.
    pub algorithms: Vec<JwtAlgorithm>,
    /// Where the token is looked for, in order (default: `header Authorization`).
    pub from: Vec<TokenSource>,
    /// Clock skew allowed on `exp` and `nbf` (default 30 s).
    pub leeway: Duration,
    /// How often a JWKS URL is fetched again (default 5 min).
    pub refresh: Duration,
    /// Claims copied to request fields (CLAIM, FIELD), replacing the client's.
    pub claims_to_headers: Vec<(String, HeaderName)>,
}

/// Where a `jwt` filter's keys come from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum JwtKeys {
    /// A JWKS file, read at load (its text, for the key set).
    File { path: PathBuf, text: String },
    /// A JWKS URL, fetched at start and refreshed.
    Url(String),
    /// `secret_file F`: the HMAC secret (HS256/384/512).
    Secret(Vec<u8>),
}

pub use crate::jose::Algorithm as JwtAlgorithm;

/// `from header NAME | cookie NAME | query NAME`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// `Authorization` takes `Bearer TOKEN`; another field the token alone (a
    /// `Bearer ` before it is dropped).
    Header(HeaderName),
    Cookie(String),
    Query(String),
}

/// `forward_auth URL { … }`: each request is first asked of an auth service.
#[derive(Debug, Clone)]
pub struct ForwardAuth {
    /// The URL as written, for logs.
    pub url: String,
    /// The service: one backend, `Host` its own, `timeout` as below, no retry of an
    /// answered request.
    pub pool: Box<ProxyConfig>,
    /// The URL's path and query, as written.
    pub path: http::uri::PathAndQuery,
    /// Fields of a 2xx answer that replace the client's of that name.
    pub copy_headers: Vec<HeaderName>,
    /// The whole exchange (default 5 s): over it, the service counts as unreachable.
    pub timeout: Duration,
}

impl Filter {
    /// The directive that wrote it.
    pub fn name(&self) -> &'static str {
        match self {
            Filter::Strip(_) => "strip",
            Filter::Rewrite { .. } => "rewrite",
            Filter::HeaderDown(_) => "header_down",
            Filter::MaxBody(_) => "max_body",
            Filter::Compress(_) => "compress",
            Filter::RequestId => "request_id",
            Filter::RateLimit(_) => "rate_limit",
            Filter::Allow(_) => "allow",
            Filter::Deny(_) => "deny",
            Filter::BasicAuth { .. } => "basic_auth",
            Filter::BodyDeny(_) => "body_deny",
            Filter::Cors(_) => "cors",
            Filter::ForwardAuth(_) => "forward_auth",
            Filter::GrpcWeb => "grpc_web",
            Filter::Jwt(_) => "jwt",
            Filter::Challenge(_) => "challenge",
        }
    }

    /// The results a branch may name: (passed, refused), or none.
    pub fn results(&self) -> Option<(&'static str, &'static str)> {
        match self {
            Filter::Allow(_) | Filter::Deny(_) | Filter::BodyDeny(_) => Some(("allowed", "denied")),
            Filter::RateLimit(_) => Some(("passed", "limited")),
            Filter::BasicAuth { .. } | Filter::ForwardAuth(_) | Filter::Jwt(_) => {
                Some(("authorized", "unauthorized"))
            }
            _ => None,
        }
    }
}

/// `rate_limit N/s|N/m [burst N] [key client_ip|header NAME] [store redis://…]`.
#[derive(Debug, Clone)]
pub struct RateLimit {
    /// Requests allowed per `window`.
    pub count: u32,
    pub window: Duration,
    /// The most requests at once after a quiet spell (default `count`).
    pub burst: u32,
    /// The header whose value is the key; `None`: the client's address.
    pub key_header: Option<HeaderName>,
    /// `store redis://HOST:PORT[/DB]`: buckets shared by every instance.
    pub store: Option<String>,
}

/// `cors { origins …; methods …; headers …; credentials on|off; max_age D }`.
#[derive(Debug, Clone, Default)]
pub struct Cors {
    /// Exact origins (`https://app.example.com`), lower-cased.
    pub origins: Vec<String>,
    /// `*.example.com`: any origin whose host ends in `.example.com`, stored as the
    /// suffix with its dot.
    pub suffixes: Vec<String>,
    /// `origins *`.
    pub any: bool,
    pub methods: Vec<Method>,
    pub headers: Vec<HeaderName>,
    pub credentials: bool,
    pub max_age: Option<Duration>,
}

#[derive(Debug, Clone)]
pub enum Handler {
    Proxy(Box<ProxyConfig>),
    Respond {
        status: StatusCode,
        body: Template,
    },
    Redirect {
        status: StatusCode,
        target: Template,
    },
    Files(FilesConfig),
    FastCgi(Box<FastCgiConfig>),
}

/// `fastcgi ADDR { … }`.
#[derive(Debug, Clone)]
pub struct FastCgiConfig {
    /// As written, for logs.
    pub text: String,
    pub target: Target,
    /// The application's folder, canonical when the config loaded.
    pub root: PathBuf,
    /// Script suffixes (default `.php`).
    pub suffix: Vec<String>,
    /// Index scripts tried for a folder (default `index.php`).
    pub index: Vec<String>,
    /// The front controller everything else goes to (`/index.php`).
    pub fallback: Option<String>,
    /// Sockets at most: idle, busy and being opened (default 64).
    pub max_conns: usize,
    pub connect_timeout: Duration,
    /// How long an idle connection is kept (default 60 s).
    pub keepalive_timeout: Duration,
    /// From the request sent to the response head (default 60 s; `504` past it).
    pub timeout: Duration,
    /// Extra variables; never a protected one.
    pub env: Vec<(String, String)>,
    /// The most request body buffered for STDIN (default 64 MiB; `413` past it).
    pub max_body: u64,
}

impl FastCgiConfig {
    /// The defaults for an application at `target` (`text` as written); `root` is
    /// empty until given.
    pub fn new(text: String, target: Target) -> FastCgiConfig {
        FastCgiConfig {
            text,
            target,
            root: std::path::PathBuf::new(),
            suffix: vec![".php".to_string()],
            index: vec!["index.php".to_string()],
            fallback: None,
            max_conns: 64,
            connect_timeout: Duration::from_secs(5),
            keepalive_timeout: Duration::from_secs(60),
            timeout: Duration::from_secs(60),
            env: Vec::new(),
            max_body: 64 * 1024 * 1024,
        }
    }
}

/// `files DIR { index …; browse on|off }`.
#[derive(Debug, Clone)]
pub struct FilesConfig {
    /// The folder served, canonical (symlinks resolved) when the config loaded.
    pub root: PathBuf,
    /// Names tried, in order, for a directory (default `index.html`).
    pub index: Vec<String>,
    /// List a directory that has no index file.
    pub browse: bool,
    /// `fallback /index.html`: served with `200` for a path that is no file (the
    /// path under the root, in normal form).
    pub fallback: Option<String>,
    /// `precompressed zstd br gzip`: sibling files `FILE.zst`/`.br`/`.gz` served
    /// when present and accepted (the codings named, tokens as in `Accept-Encoding`).
    pub precompressed: Vec<Precompressed>,
    /// `dotfiles allow`: serve paths with a segment starting with `.` (default `404`;
    /// `/.well-known/` is always served).
    pub dotfiles: bool,
}

/// A coding a `files` handler may find precompressed beside a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precompressed {
    Zstd,
    Br,
    Gzip,
}

impl Precompressed {
    /// The sibling file's suffix.
    pub fn suffix(self) -> &'static str {
        match self {
            Precompressed::Zstd => ".zst",
            Precompressed::Br => ".br",
            Precompressed::Gzip => ".gz",
        }
    }
}

#[derive(Debug, Clone)]
pub struct ProxyConfig {
    pub backends: Vec<BackendAddr>,
    /// `proxy_protocol v1|v2`: each backend connection starts with a PROXY protocol
    /// header naming the client (and is never shared between two clients).
    pub proxy_protocol: Option<ProxyProtocol>,
    pub lb: Policy,
    /// One per backend, 1..1000; empty means 1 each.
    pub weights: Vec<u32>,
    /// Active health checks.
    pub health: Option<Health>,
    /// What a request that reached a backend is retried on (idempotent ones only).
    pub retry_on: RetryOn,
    /// The most request body kept for a retry.
    pub retry_buffer: u64,
    pub retry_budget: RetryBudget,
    /// An idempotent request without a body that meets a kept connection closed before
    /// any byte of an answer goes out once more on a new one (RFC 9112 §9.3.1); `global
    /// { retries off }` stops that too.
    pub resend_stale: bool,
    /// A returning peer's effective weight ramps from 10 % to 100 % over this.
    pub slow_start: Option<Duration>,
    pub outlier: Option<Outlier>,
    /// Used only while failover says so.
    pub backups: Vec<BackendAddr>,
    /// `srv:` or `{ discover }`: the peers come from DNS, re-read at the TTL.
    pub discover: Option<Discover>,
    pub failover: Failover,
    /// `X-Sluice-Origin` and `X-Sluice-Origin-Transition` on responses.
    pub origin_headers: bool,
    /// `websocket on|off`: WebSocket upgrades pass to the backends (on) or get `403`.
    pub websocket: bool,
    /// `upgrade NAME...`: further `Upgrade` tokens relayed like WebSocket (lower case;
    /// never `h2c`).
    pub upgrade: Vec<String>,
    /// Compress responses the client accepts compressed (default on).
    pub compress: Compression,
    pub fail_duration: Duration,
    pub breaker: u32,
    pub all_down: AllDown,
    pub host: HostMode,
    pub header_up: Vec<HeaderOp>,
    pub header_down: Vec<HeaderOp>,
    pub timeout: Duration,
    pub connect_timeout: Duration,
    pub limit: Option<Limit>,
    pub max_body: Option<u64>,
    pub retries: u8,
    pub keepalive: Keepalive,
    /// For `https://` backends.
    pub tls: BackendTls,
    /// `safety strict|off`; `None` follows `global { safety { default ... } }`.
    pub safety: Option<bool>,
}

impl ProxyConfig {
    /// The scheme every address of the pool shares (checked at load).
    pub fn scheme(&self) -> BackendScheme {
        match (&self.discover, self.backends.first()) {
            // A discovered pool speaks its source's scheme, with or without peers.
            (Some(d), _) => d.scheme,
            (None, Some(b)) => b.scheme,
            (None, None) => BackendScheme::Http,
        }
    }

    pub fn new(backends: Vec<BackendAddr>) -> Self {
        ProxyConfig {
            backends,
            lb: Policy::RoundRobin,
            weights: Vec::new(),
            health: None,
            retry_on: RetryOn::default(),
            retry_buffer: 64 * 1024,
            retry_budget: RetryBudget {
                percent: 20,
                min_per_s: 3,
            },
            resend_stale: true,
            slow_start: None,
            outlier: None,
            backups: Vec::new(),
            discover: None,
            failover: Failover::default(),
            origin_headers: false,
            websocket: true,
            upgrade: Vec::new(),
            compress: Compression::On,
            fail_duration: Duration::from_secs(30),
            breaker: 1,
            all_down: AllDown::Try,
            host: HostMode::Keep,
            header_up: Vec::new(),
            header_down: Vec::new(),
            timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(5),
            limit: Some(Limit {
                max: 1024,
                wait: Duration::from_secs(3),
            }),
            max_body: None,
            retries: 1,
            keepalive: Keepalive {
                idle_max: 2048,
                idle_timeout: Duration::from_secs(4),
            },
            tls: BackendTls::default(),
            safety: None,
            proxy_protocol: None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct BackendAddr {
    /// As configured: how logs, metrics and the status API name the peer.
    pub text: String,
    pub target: Target,
    pub scheme: BackendScheme,
    /// Where the address is written, for load-time refusals.
    pub span: Span,
}

/// Where a pool's peers come from when DNS decides them (DESIGN §18.7).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Discover {
    /// As written (`srv:_http._tcp.api.internal`, `h2c://api.internal:9000`): the
    /// pool's name for its source in `/status` and metrics.
    pub source: String,
    pub kind: DiscoverKind,
    /// How the discovered peers are spoken to.
    pub scheme: BackendScheme,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DiscoverKind {
    /// `srv:_SERVICE._PROTO.NAME`: the SRV targets; the lowest priority primaries, the
    /// next backups, SRV weights the peers' weights.
    Srv { name: String },
    /// `NAME:PORT { discover }`: one peer per address of the name.
    Addresses { host: String, port: u16 },
}

/// How sluice speaks to a backend: the scheme of its address. One pool speaks one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendScheme {
    /// `host:port`, `http://`, `unix:`: HTTP/1.1 in the clear.
    Http,
    /// `https://`: TLS, then HTTP/2 or HTTP/1.1 as ALPN decides.
    Https,
    /// `h2c://`: HTTP/2 in the clear, with prior knowledge.
    H2c,
}

impl BackendScheme {
    pub fn as_str(self) -> &'static str {
        match self {
            BackendScheme::Http => "http",
            BackendScheme::Https => "https",
            BackendScheme::H2c => "h2c",
        }
    }

    /// A request's `:scheme` over HTTP/2 to such a backend: `https` over TLS, `http`
    /// in the clear.
    pub fn request_scheme(self) -> &'static str {
        match self {
            BackendScheme::Https => "https",
            BackendScheme::Http | BackendScheme::H2c => "http",
        }
    }
}

/// How an `https://` pool checks its backends' certificates.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BackendTls {
    /// `tls_verify` (default on).
    pub verify: bool,
    /// `tls_server_name`: the name sent in SNI and checked against the certificate
    /// (default: the address's host).
    pub server_name: Option<String>,
    /// `tls_ca FILE`: trust these roots instead of the system's.
    pub ca: Option<PathBuf>,
    /// The file's certificates (DER) as read at load: part of the pool's identity, so a
    /// changed CA file makes a new pool whose connections are not shared with the old.
    pub ca_certs: Vec<Vec<u8>>,
}

impl Default for BackendTls {
    fn default() -> Self {
        BackendTls {
            verify: true,
            server_name: None,
            ca: None,
            ca_certs: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    /// An IP literal or a name resolved at each dial.
    Tcp {
        host: String,
        port: u16,
    },
    Unix(PathBuf),
}

/// `compress on|off|always`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    Off,
    /// Compressible responses, except those that set cookies or answer a request with
    /// `Authorization`: a secret beside attacker-chosen text in one compressed body
    /// leaks through its length (BREACH).
    On,
    /// Those too: the operator knows the responses hold no secret an attacker could
    /// probe for.
    Always,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Policy {
    First,
    RoundRobin,
    WeightedRoundRobin,
    LeastConn,
    WeightedLeastConn,
    P2c,
    Hash(HashKey),
}

/// What `lb hash` hashes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HashKey {
    ClientIp,
    Header(HeaderName),
    Cookie(String),
    /// Path and query as received.
    Uri,
}

impl Policy {
    /// The policies `lb` takes by their word alone (`hash` takes a key too): the
    /// config's parser reads them here, so a new one is its variant, its word and its
    /// entry below (and its balancer).
    pub const SIMPLE: [Policy; 6] = [
        Policy::First,
        Policy::RoundRobin,
        Policy::WeightedRoundRobin,
        Policy::LeastConn,
        Policy::WeightedLeastConn,
        Policy::P2c,
    ];

    pub fn name(&self) -> &'static str {
        match self {
            Policy::First => "first",
            Policy::RoundRobin => "round_robin",
            Policy::WeightedRoundRobin => "weighted_round_robin",
            Policy::LeastConn => "least_conn",
            Policy::WeightedLeastConn => "weighted_least_conn",
            Policy::P2c => "p2c",
            Policy::Hash(_) => "hash",
        }
    }

    /// Whether the policy reads `weights`.
    pub fn is_weighted(&self) -> bool {
        matches!(self, Policy::WeightedRoundRobin | Policy::WeightedLeastConn)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllDown {
    Try,
    Fail,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostMode {
    Keep,
    Upstream,
    Name(HeaderValue),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    pub max: u32,
    pub wait: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    pub idle_max: usize,
    pub idle_timeout: Duration,
}

/// `health PATH { … }` or `health connect { … }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    pub probe: Probe,
    /// 1s..1h.
    pub interval: Duration,
    /// More than 0, at most `interval`.
    pub timeout: Duration,
    /// Consecutive passes that make an unhealthy peer healthy, 1..100.
    pub rise: u32,
    /// Consecutive failures that make a healthy peer unhealthy, 1..100.
    pub fall: u32,
    /// The state before the first probe.
    pub initial_healthy: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// A request for `path`; passes when the status is within `expect` (inclusive).
    Http {
        path: String,
        head: bool,
        expect: (u16, u16),
        /// `Host`; `None`: the backend's own address.
        host: Option<HeaderValue>,
    },
    /// A TCP (or Unix) connect.
    Connect,
    /// `grpc.health.v1.Health/Check` for `service` (empty: the server as a whole);
    /// passes on `SERVING`.
    Grpc { service: String },
}

impl Health {
    pub fn new(probe: Probe) -> Health {
        Health {
            probe,
            interval: Duration::from_secs(5),
            timeout: Duration::from_secs(2),
            rise: 2,
            fall: 3,
            initial_healthy: true,
        }
    }
}

/// `retry_on reset|timeout|502|503|504...`: empty by default (a request that reached a
/// backend is never sent again unless the operator opts in).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetryOn {
    /// Closed or reset after the request went out, before any response byte.
    pub reset: bool,
    /// No response head within `timeout`.
    pub timeout: bool,
    pub s502: bool,
    pub s503: bool,
    pub s504: bool,
}

impl RetryOn {
    pub fn any(&self) -> bool {
        self.reset || self.timeout || self.s502 || self.s503 || self.s504
    }

    pub fn status(&self, code: u16) -> bool {
        match code {
            502 => self.s502,
            503 => self.s503,
            504 => self.s504,
            _ => false,
        }
    }
}

/// `retry_budget PERCENT [MIN_PER_S]`: retries of every kind in a pool stay under
/// PERCENT of its requests over the last 10 s, with MIN_PER_S always allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryBudget {
    pub percent: u32,
    pub min_per_s: u32,
}

/// `outlier { consecutive_5xx N; ejection D; max_ejected PERCENT }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outlier {
    /// 5xx answers in a row that eject a peer, 1..1000.
    pub consecutive_5xx: u32,
    /// The first ejection's length; each further one doubles it, up to 10×.
    pub ejection: Duration,
    /// The most of the pool ejected at once, in percent (at least one peer).
    pub max_ejected: u32,
}

impl Default for Outlier {
    fn default() -> Self {
        Outlier {
            consecutive_5xx: 5,
            ejection: Duration::from_secs(30),
            max_ejected: 10,
        }
    }
}

/// `failover { failure_threshold N; recovery_threshold N; hold_down D; failback_delay D }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failover {
    /// Consecutive failure evidence that switches to backup, 1..20.
    pub failure_threshold: u32,
    /// Consecutive primary successes that switch back, 1..20.
    pub recovery_threshold: u32,
    /// 5s..1h.
    pub hold_down: Duration,
    /// 5s..24h; backup stays at least max(hold_down, failback_delay).
    pub failback_delay: Duration,
}

impl Default for Failover {
    fn default() -> Self {
        Failover {
            failure_threshold: 3,
            recovery_threshold: 2,
            hold_down: Duration::from_secs(30),
            failback_delay: Duration::from_secs(30),
        }
    }
}
