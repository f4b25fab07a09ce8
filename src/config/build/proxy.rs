//! The `proxy` handler's addresses and options.

use std::time::Duration;

use http::HeaderValue;

use super::args::*;
use super::route::{compression, on_off};
use super::values::*;
use super::vocab::Place;
use super::{Builder, Res, Seen};
use crate::config::diag::{nearest, Diagnostic};
use crate::config::model::*;
use crate::config::parser::{Directive, Word};

impl Builder {
    pub(super) fn proxy(&mut self, d: &Directive) -> Res<Handler> {
        if d.args.is_empty() {
            return Err(missing(
                d,
                "proxy ADDR...",
                "proxy 127.0.0.1:3000 127.0.0.1:3001",
            ));
        }
        let base = self.dir_of(d.span());
        let srv = srv_source(d)?;
        let backends = match &srv {
            Some((addr, _)) => vec![addr.clone()],
            None => d
                .args
                .iter()
                .map(|w| backend_addr(w, &base))
                .collect::<Res<Vec<_>>>()?,
        };
        let mut p = ProxyConfig::new(backends);
        let mut seen = Seen::default();
        let mut weights_at = None;
        let mut retry_on_at = None;
        let mut failover_at = None;
        let mut health_at = None;
        let mut discover_at = None;
        for item in d.block.as_deref().unwrap_or(&[]) {
            if !self.known_here(item, Place::Proxy) || !self.once(&mut seen, item) {
                continue;
            }
            match item.name.text.as_str() {
                "discover" => discover_at = Some(item),
                "weights" => weights_at = Some(item),
                "retry_on" => retry_on_at = Some(item),
                "failover" => failover_at = Some(item),
                "health" => health_at = Some(item),
                _ => {}
            }
            let r = self.proxy_option(item, &mut p);
            self.push(r);
        }
        self.apply_defaults(&seen, &mut p);
        self.one_scheme(d, &p)?;
        discovered(
            &mut p,
            srv,
            discover_at,
            weights_at,
            seen.0.contains_key("lb"),
        )?;
        grpc_health_speaks_h2(health_at, &p)?;
        proxy_protocol_speaks_http(&p)?;
        let srv = matches!(&p.discover, Some(d) if matches!(d.kind, DiscoverKind::Srv { .. }));
        if let Some(f) = failover_at.filter(|_| p.backups.is_empty() && !srv) {
            return Err(Diagnostic::error(
                f.span(),
                "`failover` without `backup` has nothing to fail over to",
            )
            .with_hint("add backup ADDR... to this proxy"));
        }
        self.pool_checks(&p, retry_on_at, weights_at)?;
        if self.retries_off {
            // `global { retries off }`: nothing is sent twice, the attempt on a new
            // failover role included (its budget is empty), a request that met a
            // stale kept connection too.
            p.retries = 0;
            p.resend_stale = false;
            p.retry_on = RetryOn::default();
            p.retry_budget = RetryBudget {
                percent: 0,
                min_per_s: 0,
            };
        }
        Ok(Handler::Proxy(Box::new(p)))
    }

    /// What only the whole pool shows: `retry_on` that can never retry, and
    /// `weights` that do not match the addresses or the policy.
    fn pool_checks(
        &mut self,
        p: &ProxyConfig,
        retry_on_at: Option<&Directive>,
        weights_at: Option<&Directive>,
    ) -> Res<()> {
        if let Some(r) = retry_on_at.filter(|_| p.retries == 0) {
            self.warnings.push(
                Diagnostic::warning(r.span(), "`retry_on` with `retries 0` never retries")
                    .with_hint("allow a retry with retries 1 or 2, or remove retry_on"),
            );
        }
        if let Some(w) = weights_at.filter(|_| !p.weights.is_empty()) {
            if p.weights.len() != p.backends.len() {
                return Err(Diagnostic::error(
                    w.span(),
                    format!(
                        "{} weights for {} addresses",
                        p.weights.len(),
                        p.backends.len()
                    ),
                )
                .with_hint("give one weight per address, in the same order"));
            }
            if !p.lb.is_weighted() {
                self.warnings.push(
                    Diagnostic::warning(
                        w.span(),
                        format!("`weights` has no effect under `lb {}`", p.lb.name()),
                    )
                    .with_hint("use lb weighted_round_robin or weighted_least_conn"),
                );
            }
        }
        Ok(())
    }

    /// `global { proxy_defaults { … } }`: each option checked now, where it is written
    /// (on a scratch pool), and kept for the pools. `weights` and `backup` describe one
    /// pool's addresses and cannot be defaults.
    pub(super) fn proxy_defaults(&mut self, d: &Directive) -> Res<()> {
        no_args(d)?;
        let mut scratch = ProxyConfig::new(Vec::new());
        let mut seen = Seen::default();
        for item in block(d, "proxy_defaults { timeout 30s }")? {
            if !self.known_here(item, Place::Proxy) || !self.once(&mut seen, item) {
                continue;
            }
            if matches!(item.name.text.as_str(), "weights" | "backup" | "discover") {
                self.errors.push(
                    Diagnostic::error(
                        item.span(),
                        format!("`{}` cannot be a default", item.name.text),
                    )
                    .with_hint("it describes one pool's addresses: write it in that proxy block"),
                );
                continue;
            }
            let r = self.proxy_option(item, &mut scratch);
            if r.is_ok() {
                self.proxy_defaults.push(item.clone());
            }
            self.push(r);
        }
        Ok(())
    }

    /// The defaults this pool did not set itself (checked and warned about once, where
    /// written). Default `header_up`/`header_down` lines go before the pool's own, so
    /// its own win where both set one field.
    fn apply_defaults(&mut self, own: &Seen, p: &mut ProxyConfig) {
        let defaults = std::mem::take(&mut self.proxy_defaults);
        let (errors, warnings) = (self.errors.len(), self.warnings.len());
        let mut headers = ProxyConfig::new(Vec::new());
        for item in &defaults {
            match item.name.text.as_str() {
                "header_up" | "header_down" => {
                    let _ = self.proxy_option(item, &mut headers);
                }
                name if !own.0.contains_key(name) => {
                    let _ = self.proxy_option(item, p);
                }
                _ => {}
            }
        }
        p.header_up.splice(0..0, headers.header_up);
        p.header_down.splice(0..0, headers.header_down);
        self.errors.truncate(errors);
        self.warnings.truncate(warnings);
        self.proxy_defaults = defaults;
    }

    /// One scheme class per pool (§14): plain HTTP/1.1, TLS, or h2c. The TLS options
    /// mean nothing to a pool that does not speak TLS: a warning.
    fn one_scheme(&mut self, d: &Directive, p: &ProxyConfig) -> Res<()> {
        let first = p.backends[0].scheme;
        let all = p.backends.iter().chain(&p.backups);
        if let Some(odd) = all.clone().position(|b| b.scheme != first) {
            let words: Vec<&Word> = d
                .args
                .iter()
                .chain(
                    d.block
                        .as_deref()
                        .unwrap_or(&[])
                        .iter()
                        .filter(|i| i.name.text == "backup")
                        .flat_map(|i| i.args.iter()),
                )
                .collect();
            let at = words.get(odd).map_or(d.span(), |w| w.span);
            let addr = all.clone().nth(odd).map(|b| b.text.as_str()).unwrap_or("");
            return Err(Diagnostic::error(
                at,
                format!(
                    "`{addr}` speaks {}, but this pool's first address speaks {}",
                    all.clone().nth(odd).map_or("", |b| b.scheme.as_str()),
                    first.as_str()
                ),
            )
            .with_hint("all addresses of one proxy (backups too) share one scheme: http, https:// or h2c://"));
        }
        if first != BackendScheme::Https {
            for item in d.block.as_deref().unwrap_or(&[]) {
                if item.name.text.starts_with("tls_") {
                    self.warnings.push(
                        Diagnostic::warning(
                            item.span(),
                            format!(
                                "`{}` has no effect: this pool does not speak TLS",
                                item.name.text
                            ),
                        )
                        .with_hint("TLS options apply to https:// addresses"),
                    );
                }
            }
        }
        Ok(())
    }

    pub(super) fn proxy_option(&mut self, d: &Directive, p: &mut ProxyConfig) -> Res<()> {
        match PROXY_OPTIONS.iter().find(|(name, _)| *name == d.name.text) {
            Some((_, parse)) => parse(self, d, p),
            None => Err(unsupported(d)),
        }
    }
}

/// `proxy_protocol` goes to plain HTTP/1.1 backends only.
fn proxy_protocol_speaks_http(p: &ProxyConfig) -> Res<()> {
    if let Some(b) = p
        .backends
        .iter()
        .chain(&p.backups)
        .find(|b| p.proxy_protocol.is_some() && b.scheme != BackendScheme::Http)
    {
        return Err(Diagnostic::error(
            b.span,
            format!("`{}`: proxy_protocol is sent to http:// and unix: backends only", b.text),
        )
        .with_hint("the header goes before any byte, TLS included, and an HTTP/2 connection carries many clients; terminate TLS at the backend's own proxy, or drop proxy_protocol"));
    }
    Ok(())
}

/// `srv:_SERVICE._PROTO.NAME` (or `http+srv:`, `https+srv:`, `h2c+srv:`) as a pool's
/// one address: a stand-in address naming the source, and the SRV name.
fn srv_source(d: &Directive) -> Res<Option<(BackendAddr, String)>> {
    let Some(w) = d.args.first() else {
        return Ok(None);
    };
    let schemes = [
        ("srv:", BackendScheme::Http),
        ("http+srv:", BackendScheme::Http),
        ("https+srv:", BackendScheme::Https),
        ("h2c+srv:", BackendScheme::H2c),
    ];
    let Some((name, scheme)) = schemes
        .iter()
        .find_map(|(prefix, scheme)| Some((w.text.strip_prefix(prefix)?, *scheme)))
    else {
        return Ok(None);
    };
    if let Some(x) = d.args.get(1) {
        return Err(extra(
            x,
            "a srv: pool has one source: its peers are the SRV records",
        ));
    }
    let labels: Vec<&str> = name.trim_end_matches('.').split('.').collect();
    let shaped = labels.len() >= 3
        && labels[..2]
            .iter()
            .all(|l| l.len() > 1 && l.starts_with('_'))
        && labels.iter().all(|l| !l.is_empty());
    if !shaped {
        return Err(expected(w, "srv:_SERVICE._PROTO.NAME")
            .with_hint("write the SRV record's name: proxy srv:_http._tcp.api.service.consul"));
    }
    let addr = BackendAddr {
        text: w.text.clone(),
        target: Target::Tcp {
            host: name.trim_end_matches('.').to_string(),
            port: 1,
        },
        scheme,
        span: w.span,
    };
    Ok(Some((addr, name.trim_end_matches('.').to_string())))
}

/// A pool whose peers DNS decides: `srv:` (weights and roles come from the records,
/// `lb` defaults to `weighted_round_robin`) or `NAME:PORT { discover }` (one peer per
/// address; backups may be written).
fn discovered(
    p: &mut ProxyConfig,
    srv: Option<(BackendAddr, String)>,
    discover_at: Option<&Directive>,
    weights_at: Option<&Directive>,
    lb_written: bool,
) -> Res<()> {
    if let Some((addr, name)) = srv {
        if let Some(d) = discover_at {
            return Err(
                Diagnostic::error(d.span(), "a srv: pool is discovered already")
                    .with_hint("remove `discover`"),
            );
        }
        if let Some(b) = p.backups.first() {
            return Err(Diagnostic::error(b.span, "a srv: pool takes no `backup`")
                .with_hint("its backups are the records of the next SRV priority"));
        }
        if let Some(w) = weights_at {
            return Err(
                Diagnostic::error(w.span(), "a srv: pool takes no `weights`")
                    .with_hint("each peer's weight is its SRV record's"),
            );
        }
        if !lb_written {
            p.lb = Policy::WeightedRoundRobin;
        }
        p.discover = Some(Discover {
            source: addr.text.clone(),
            kind: DiscoverKind::Srv { name },
            scheme: addr.scheme,
        });
        return Ok(());
    }
    let Some(d) = discover_at else {
        return Ok(());
    };
    let [addr] = p.backends.as_slice() else {
        return Err(
            Diagnostic::error(d.span(), "`discover` takes a pool of one name")
                .with_hint("write one NAME:PORT: each address it resolves to becomes a peer"),
        );
    };
    let named = match &addr.target {
        Target::Tcp { host, port } if crate::safety::parse_ip(host).is_none() => {
            Some((host.clone(), *port))
        }
        _ => None,
    };
    let Some((host, port)) = named else {
        return Err(Diagnostic::error(
            addr.span,
            format!("`{}` is not a name to discover", addr.text),
        )
        .with_hint(
            "discover reads the addresses of a DNS name: proxy api.internal:8080 { discover }",
        ));
    };
    if let Some(w) = weights_at {
        return Err(
            Diagnostic::error(w.span(), "a discovered pool takes no `weights`")
                .with_hint("every address of the name weighs the same"),
        );
    }
    p.discover = Some(Discover {
        source: addr.text.clone(),
        kind: DiscoverKind::Addresses { host, port },
        scheme: addr.scheme,
    });
    Ok(())
}

/// How one option of a `proxy { … }` block is read into the pool's settings.
pub(super) type ProxyOption = fn(&mut Builder, &Directive, &mut ProxyConfig) -> Res<()>;

/// Every option of a `proxy { … }` block with its parser: one entry each, in the
/// order the config reference lists them.
pub(super) static PROXY_OPTIONS: &[(&str, ProxyOption)] = &[
    ("lb", |_, d, p| policy(d).map(|v| p.lb = v)),
    // Read where the pool's addresses are: `discovered`.
    ("discover", |_, d, _| {
        no_block(d)?;
        no_args(d)
    }),
    ("weights", weights),
    ("fail_duration", |_, d, p| {
        duration(one_arg(d, "fail_duration 30s")?).map(|v| p.fail_duration = v)
    }),
    ("breaker", |_, d, p| {
        int_in(one_arg(d, "breaker N")?, 1, 100).map(|n| p.breaker = n as u32)
    }),
    ("all_down", all_down),
    ("host", host),
    ("header_up", header_up),
    ("header_down", |_, d, p| {
        header_op(d, "header_down").map(|op| p.header_down.push(op))
    }),
    ("timeout", |_, d, p| {
        positive(one_arg(d, "timeout 60s")?).map(|v| p.timeout = v)
    }),
    ("connect_timeout", |_, d, p| {
        positive(one_arg(d, "connect_timeout 5s")?).map(|v| p.connect_timeout = v)
    }),
    ("limit", limit),
    ("max_body", |_, d, p| {
        size(one_arg(d, "max_body SIZE")?).map(|v| p.max_body = Some(v))
    }),
    ("retries", |_, d, p| {
        int_in(one_arg(d, "retries N")?, 0, 2).map(|n| p.retries = n as u8)
    }),
    ("keepalive", |_, d, p| {
        let (n, t) = two_args(d, "keepalive IDLE_MAX IDLE_TIMEOUT")?;
        let idle_max = int_in(n, 0, 65_536)? as usize;
        let idle_timeout = positive(t)?;
        p.keepalive = Keepalive {
            idle_max,
            idle_timeout,
        };
        Ok(())
    }),
    ("compress", |_, d, p| compression(d).map(|v| p.compress = v)),
    ("tls_verify", |_, d, p| on_off(d).map(|v| p.tls.verify = v)),
    ("tls_server_name", tls_server_name),
    ("safety", |_, d, p| {
        strict_or_off(one_arg(d, "safety strict|off")?).map(|v| p.safety = Some(v))
    }),
    ("tls_ca", tls_ca),
    ("health", |b, d, p| b.health(d).map(|h| p.health = Some(h))),
    ("retry_on", retry_on),
    ("backup", backup),
    ("failover", |b, d, p| {
        no_args(d)?;
        b.block_options(d, Place::Failover, |item| {
            failover_option(item, &mut p.failover)
        });
        Ok(())
    }),
    ("origin_headers", |_, d, p| {
        on_off(d).map(|v| p.origin_headers = v)
    }),
    ("websocket", |_, d, p| on_off(d).map(|v| p.websocket = v)),
    ("upgrade", upgrade_tokens),
    ("proxy_protocol", |_, d, p| {
        let w = one_arg(d, "proxy_protocol v1|v2")?;
        p.proxy_protocol = Some(match w.text.as_str() {
            "v1" => ProxyProtocol::V1,
            "v2" => ProxyProtocol::V2,
            _ => return Err(expected(w, "`v1` or `v2`")),
        });
        Ok(())
    }),
    ("slow_start", |_, d, p| {
        positive(one_arg(d, "slow_start 30s")?).map(|v| p.slow_start = Some(v))
    }),
    ("outlier", |b, d, p| {
        no_args(d)?;
        let mut o = Outlier::default();
        b.block_options(d, Place::Outlier, |item| outlier_option(item, &mut o));
        p.outlier = Some(o);
        Ok(())
    }),
    ("retry_buffer", |_, d, p| {
        size(one_arg(d, "retry_buffer SIZE")?).map(|v| p.retry_buffer = v)
    }),
    ("retry_budget", retry_budget),
];

fn weights(_: &mut Builder, d: &Directive, p: &mut ProxyConfig) -> Res<()> {
    if d.args.is_empty() {
        return Err(missing(d, "weights W...", "weights 5 1 1"));
    }
    no_block(d)?;
    p.weights = d
        .args
        .iter()
        .map(|w| int_in(w, 1, 1000).map(|n| n as u32))
        .collect::<Res<Vec<_>>>()?;
    Ok(())
}

fn all_down(_: &mut Builder, d: &Directive, p: &mut ProxyConfig) -> Res<()> {
    let w = one_arg(d, "all_down try|fail")?;
    p.all_down = match w.text.as_str() {
        "try" => AllDown::Try,
        "fail" => AllDown::Fail,
        _ => return Err(expected(w, "`try` or `fail`")),
    };
    Ok(())
}

fn host(_: &mut Builder, d: &Directive, p: &mut ProxyConfig) -> Res<()> {
    let w = one_arg(d, "host keep|upstream|NAME")?;
    p.host = match w.text.as_str() {
        "keep" => HostMode::Keep,
        "upstream" => HostMode::Upstream,
        _ => HostMode::Name(host_value(w)?),
    };
    Ok(())
}

/// A Host a backend is sent: a header value whose name (before a `:PORT`) is at most
/// 253 characters, the longest a DNS name can be.
fn host_value(w: &Word) -> Res<HeaderValue> {
    let text = w.text.as_str();
    let name = match text.rsplit_once(':') {
        Some((n, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => n,
        _ => text,
    };
    if name.len() > 253 {
        return Err(Diagnostic::error(
            w.span,
            format!("the host name is {} characters long", name.len()),
        )
        .with_hint("a host name has at most 253 characters"));
    }
    HeaderValue::from_str(text)
        .map_err(|_| Diagnostic::error(w.span, format!("`{text}` cannot be a Host header")))
}

/// `upgrade NAME...`: `Upgrade` tokens relayed besides `websocket` (DESIGN §18.4).
fn upgrade_tokens(_: &mut Builder, d: &Directive, p: &mut ProxyConfig) -> Res<()> {
    if d.args.is_empty() {
        return Err(missing(d, "upgrade NAME...", "upgrade tcp-tunnel"));
    }
    for w in &d.args {
        let token = w.text.to_ascii_lowercase();
        if token == "h2c" {
            return Err(Diagnostic::error(w.span, "`h2c` cannot be relayed as an upgrade")
                .with_hint("a backend that switched to h2c would give the client a connection past every filter; use proxy h2c://ADDR to speak HTTP/2 to a backend"));
        }
        if token == "websocket" {
            return Err(Diagnostic::error(w.span, "`websocket` is relayed already")
                .with_hint("`websocket on|off` decides it; list other tokens here"));
        }
        // A protocol is a token, with `/VERSION` allowed (RFC 9110 §7.8).
        let is_token = !token.is_empty()
            && token
                .bytes()
                .all(|b| crate::http1::head::is_tchar(b) || b == b'/');
        if !is_token {
            return Err(expected(
                w,
                "an Upgrade token, like `tcp-tunnel` or `foo/2`",
            ));
        }
        p.upgrade.push(token);
    }
    Ok(())
}

fn header_up(_: &mut Builder, d: &Directive, p: &mut ProxyConfig) -> Res<()> {
    let op = header_op(d, "header_up")?;
    let name = match &op {
        HeaderOp::Set(n, _) | HeaderOp::Remove(n) => n,
    };
    // sluice frames the request and owns the connection: these fields are its own (a
    // removed Content-Length would turn the body into a request).
    const FRAMING: [&str; 8] = [
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
    ];
    if FRAMING.contains(&name.as_str()) {
        return Err(Diagnostic::error(
            d.args[0].span,
            format!("`header_up` cannot change `{name}`"),
        )
        .with_hint("sluice sets the framing and connection fields itself"));
    }
    p.header_up.push(op);
    Ok(())
}

fn limit(b: &mut Builder, d: &Directive, p: &mut ProxyConfig) -> Res<()> {
    match d.args.as_slice() {
        [w] if w.text == "off" => {
            b.warnings.push(
                Diagnostic::warning(
                    w.span,
                    "`limit off` lets a burst open backend connections without end",
                )
                .with_hint("keep a cap, e.g. limit 4096 3s"),
            );
            p.limit = None;
        }
        [n] | [n, _] => {
            let max = int_in(n, 1, 1_000_000)? as u32;
            let wait = match d.args.get(1) {
                Some(w) => duration(w)?,
                None => Duration::from_secs(3),
            };
            p.limit = Some(Limit { max, wait });
        }
        [] => return Err(missing(d, "limit N [WAIT] | off", "limit 1024 3s")),
        [_, _, x, ..] => return Err(extra(x, "limit takes N and an optional WAIT")),
    }
    Ok(())
}

fn tls_server_name(_: &mut Builder, d: &Directive, p: &mut ProxyConfig) -> Res<()> {
    let w = one_arg(d, "tls_server_name NAME")?;
    rustls::pki_types::ServerName::try_from(w.text.as_str()).map_err(|_| {
        expected(w, "a DNS name or an IP address")
            .with_hint("write the name the backend's certificate is issued for")
    })?;
    p.tls.server_name = Some(w.text.clone());
    Ok(())
}

fn tls_ca(b: &mut Builder, d: &Directive, p: &mut ProxyConfig) -> Res<()> {
    let w = one_arg(d, "tls_ca FILE")?;
    let path = b.dir_of(d.span()).join(&w.text);
    let roots = crate::config::certs::load_chain(&path).map_err(|e| {
        let hint = match e.problem {
            crate::config::certs::Problem::Unreadable => e.hint(),
            _ => "give the PEM certificate(s) of the CA that signed the backends' certificates",
        };
        Diagnostic::error(w.span, e.to_string()).with_hint(hint)
    })?;
    let mut store = rustls::RootCertStore::empty();
    p.tls.ca_certs = roots.iter().map(|c| c.to_vec()).collect();
    let (_, bad) = store.add_parsable_certificates(roots);
    if bad > 0 || store.is_empty() {
        return Err(Diagnostic::error(
            w.span,
            format!(
                "{}: a certificate in the file cannot be a trust root",
                path.display()
            ),
        ));
    }
    p.tls.ca = Some(path);
    Ok(())
}

fn retry_on(_: &mut Builder, d: &Directive, p: &mut ProxyConfig) -> Res<()> {
    if d.args.is_empty() {
        let usage = "retry_on reset|timeout|502|503|504...";
        return Err(missing(d, usage, "retry_on reset 503"));
    }
    no_block(d)?;
    for w in &d.args {
        let r = &mut p.retry_on;
        match w.text.as_str() {
            "reset" => r.reset = true,
            "timeout" => r.timeout = true,
            "502" => r.s502 = true,
            "503" => r.s503 = true,
            "504" => r.s504 = true,
            _ => return Err(expected(w, "reset, timeout, 502, 503 or 504")),
        }
    }
    Ok(())
}

fn backup(b: &mut Builder, d: &Directive, p: &mut ProxyConfig) -> Res<()> {
    if d.args.is_empty() {
        return Err(missing(d, "backup ADDR...", "backup 10.0.1.5:80"));
    }
    no_block(d)?;
    let base = b.dir_of(d.span());
    p.backups = d
        .args
        .iter()
        .map(|w| backend_addr(w, &base))
        .collect::<Res<Vec<_>>>()?;
    Ok(())
}

fn retry_budget(_: &mut Builder, d: &Directive, p: &mut ProxyConfig) -> Res<()> {
    const USAGE: &str = "retry_budget PERCENT [MIN_PER_S]";
    no_block(d)?;
    let (pct, min) = match d.args.as_slice() {
        [p] => (p, None),
        [p, m] => (p, Some(m)),
        [] => return Err(missing(d, USAGE, "retry_budget 20% 3")),
        [_, _, x, ..] => {
            return Err(extra(
                x,
                "retry_budget takes PERCENT and an optional MIN_PER_S",
            ))
        }
    };
    let Some(number) = pct.text.strip_suffix('%') else {
        return Err(expected(pct, "a percentage like 20%"));
    };
    let percent = number
        .parse::<u32>()
        .ok()
        .filter(|n| *n <= 100)
        .ok_or_else(|| expected(pct, "a percentage from 0% to 100%"))?;
    let min_per_s = match min {
        Some(m) => int_in(m, 0, 10_000)? as u32,
        None => 3,
    };
    p.retry_budget = RetryBudget { percent, min_per_s };
    Ok(())
}

/// `health grpc` needs HTTP/2: a load error on an HTTP/1.1 pool, at its line.
fn grpc_health_speaks_h2(at: Option<&Directive>, p: &ProxyConfig) -> Res<()> {
    match (at, &p.health) {
        (
            Some(h),
            Some(Health {
                probe: Probe::Grpc { .. },
                ..
            }),
        ) if p.backends[0].scheme == BackendScheme::Http => Err(Diagnostic::error(
            h.span(),
            "`health grpc` asks over HTTP/2, and this pool speaks HTTP/1.1",
        )
        .with_hint("gRPC backends are h2c://ADDR (in the clear) or https://ADDR")),
        _ => Ok(()),
    }
}

impl Builder {
    /// `health PATH { … }`, `health grpc [SERVICE] { … }` or `health connect [{ … }]`.
    fn health(&mut self, d: &Directive) -> Res<Health> {
        const USAGE: &str = "health PATH { … } | health grpc [SERVICE] | health connect";
        let (w, rest) = match d.args.as_slice() {
            [w, rest @ ..] => (w, rest),
            [] => return Err(missing(d, USAGE, "health /healthz")),
        };
        let probe = if w.text == "grpc" {
            let service = match rest {
                [] => String::new(),
                [s] if s.text.bytes().all(|b| b.is_ascii_graphic()) => s.text.clone(),
                [s] => return Err(expected(s, "a gRPC service name, like my.pkg.Service")),
                [_, x, ..] => return Err(extra(x, USAGE)),
            };
            Probe::Grpc { service }
        } else if let Some(x) = rest.first() {
            return Err(extra(x, USAGE));
        } else if w.text == "connect" {
            Probe::Connect
        } else if w.text.starts_with('/') {
            if w.text.contains(['#', ' ']) {
                return Err(expected(w, "a path (and query) to request"));
            }
            Probe::Http {
                path: w.text.clone(),
                head: false,
                expect: (200, 299),
                host: None,
            }
        } else {
            return Err(expected(w, "a path starting with /, `grpc` or `connect`"));
        };
        let mut h = Health::new(probe);
        let mut seen = Seen::default();
        let mut timeout_at = None;
        for item in d.block.as_deref().unwrap_or(&[]) {
            if !self.known_here(item, Place::Health) || !self.once(&mut seen, item) {
                continue;
            }
            let r = health_option(item, &mut h);
            if item.name.text == "timeout" {
                timeout_at = item.args.first().map(|w| w.span);
            }
            self.push(r);
        }
        if h.timeout > h.interval {
            return Err(Diagnostic::error(
                timeout_at.unwrap_or(d.span()),
                "a probe's timeout is longer than its interval",
            )
            .with_hint("make timeout at most the interval (default 2s for 5s)"));
        }
        Ok(h)
    }
}

fn health_option(d: &Directive, h: &mut Health) -> Res<()> {
    let http_only = |h: &mut Health| -> Res<()> {
        match h.probe {
            Probe::Http { .. } => Ok(()),
            Probe::Connect => Err(Diagnostic::error(
                d.span(),
                format!("`{}` is for HTTP probes", d.name.text),
            )
            .with_hint("`health connect` only opens a connection; remove this line")),
            Probe::Grpc { .. } => Err(Diagnostic::error(
                d.span(),
                format!("`{}` is for HTTP probes", d.name.text),
            )
            .with_hint("`health grpc` always asks grpc.health.v1.Health/Check; remove this line")),
        }
    };
    match d.name.text.as_str() {
        "interval" => {
            let w = one_arg(d, "interval 5s")?;
            let v = duration(w)?;
            if !(Duration::from_secs(1)..=Duration::from_secs(24 * 3600)).contains(&v) {
                return Err(Diagnostic::error(w.span, "interval is out of range")
                    .with_hint("use 1s to 24h"));
            }
            h.interval = v;
        }
        "timeout" => h.timeout = positive(one_arg(d, "timeout 2s")?)?,
        "rise" => h.rise = int_in(one_arg(d, "rise 2")?, 1, 100)? as u32,
        "fall" => h.fall = int_in(one_arg(d, "fall 3")?, 1, 100)? as u32,
        "initial" => {
            let w = one_arg(d, "initial healthy|unhealthy")?;
            h.initial_healthy = match w.text.as_str() {
                "healthy" => true,
                "unhealthy" => false,
                _ => return Err(expected(w, "`healthy` or `unhealthy`")),
            };
        }
        "method" => {
            http_only(h)?;
            let w = one_arg(d, "method GET|HEAD")?;
            let head = match w.text.as_str() {
                "GET" => false,
                "HEAD" => true,
                _ => return Err(expected(w, "`GET` or `HEAD`")),
            };
            if let Probe::Http { head: m, .. } = &mut h.probe {
                *m = head;
            }
        }
        "expect" => {
            http_only(h)?;
            let w = one_arg(d, "expect 2xx | 200 | 200..399")?;
            let range = expect_range(w)?;
            if let Probe::Http { expect, .. } = &mut h.probe {
                *expect = range;
            }
        }
        "host" => {
            http_only(h)?;
            let w = one_arg(d, "host NAME")?;
            let v = host_value(w)?;
            if let Probe::Http { host, .. } = &mut h.probe {
                *host = Some(v);
            }
        }
        _ => return Err(unsupported(d)),
    }
    Ok(())
}

fn failover_option(d: &Directive, f: &mut Failover) -> Res<()> {
    let within = |w: &Word, min: u64, max: u64, range: &str| -> Res<Duration> {
        let v = duration(w)?;
        if !(Duration::from_secs(min)..=Duration::from_secs(max)).contains(&v) {
            return Err(
                Diagnostic::error(w.span, format!("`{}` is out of range", w.text))
                    .with_hint(format!("use {range}")),
            );
        }
        Ok(v)
    };
    match d.name.text.as_str() {
        "failure_threshold" => {
            f.failure_threshold = int_in(one_arg(d, "failure_threshold 3")?, 1, 20)? as u32
        }
        "recovery_threshold" => {
            f.recovery_threshold = int_in(one_arg(d, "recovery_threshold 2")?, 1, 20)? as u32
        }
        "hold_down" => f.hold_down = within(one_arg(d, "hold_down 30s")?, 5, 3600, "5s to 1h")?,
        "failback_delay" => {
            f.failback_delay = within(one_arg(d, "failback_delay 30s")?, 5, 86_400, "5s to 24h")?
        }
        _ => return Err(unsupported(d)),
    }
    Ok(())
}

fn outlier_option(d: &Directive, o: &mut Outlier) -> Res<()> {
    match d.name.text.as_str() {
        "consecutive_5xx" => {
            o.consecutive_5xx = int_in(one_arg(d, "consecutive_5xx 5")?, 1, 1000)? as u32
        }
        "ejection" => o.ejection = positive(one_arg(d, "ejection 30s")?)?,
        "max_ejected" => {
            let w = one_arg(d, "max_ejected 10%")?;
            o.max_ejected = w
                .text
                .strip_suffix('%')
                .and_then(|n| n.parse::<u32>().ok())
                .filter(|n| *n <= 100)
                .ok_or_else(|| expected(w, "a percentage from 0% to 100%"))?;
        }
        _ => return Err(unsupported(d)),
    }
    Ok(())
}

/// `expect`: a code (`200`), a class (`2xx`) or a range (`200..399`), within 100..599.
fn expect_range(w: &Word) -> Res<(u16, u16)> {
    let bad = || {
        expected(
            w,
            "a status code (200), a class (2xx) or a range (200..399)",
        )
    };
    let code = |s: &str| -> Res<u16> {
        s.parse::<u16>()
            .ok()
            .filter(|c| (100..=599).contains(c) && s.len() == 3)
            .ok_or_else(bad)
    };
    let t = w.text.as_str();
    if let Some((a, b)) = t.split_once("..") {
        let (a, b) = (code(a)?, code(b)?);
        if a > b {
            return Err(Diagnostic::error(w.span, "the range is backwards")
                .with_hint(format!("write {b}..{a}")));
        }
        return Ok((a, b));
    }
    if let Some(class) = t.strip_suffix("xx") {
        return match class {
            "1" | "2" | "3" | "4" | "5" => {
                let c: u16 = class.parse().map_err(|_| bad())?;
                Ok((c * 100, c * 100 + 99))
            }
            _ => Err(bad()),
        };
    }
    let c = code(t)?;
    Ok((c, c))
}

/// Options a `proxy` in a `tcp` block takes: those that mean something for a byte relay.
const L4_OPTIONS: &[&str] = &[
    "lb",
    "weights",
    "health",
    "fail_duration",
    "breaker",
    "all_down",
    "connect_timeout",
    "idle_timeout",
    "retries",
    "proxy_protocol",
];

impl Builder {
    /// `tcp ADDR { proxy ADDR... [{ … }] }`.
    pub(super) fn tcp(&mut self, d: &Directive) -> Option<TcpProxy> {
        let r = tcp_listen(d);
        let (listen, items) = match r {
            Ok(x) => x,
            Err(e) => {
                self.errors.push(e);
                return None;
            }
        };
        let mut bare = None;
        let mut pools = Vec::new();
        let mut max_conns = DEFAULT_TCP_MAX_CONNS;
        let mut guards = Vec::new();
        for item in items {
            if !self.known_here(item, Place::Tcp) {
                continue;
            }
            match item.name.text.as_str() {
                "allow" | "deny" | "rate_limit" => match tcp_guard(item) {
                    Ok(g) => guards.push(g),
                    Err(e) => self.errors.push(e),
                },
                "max_conns" => {
                    match one_arg(item, "max_conns 16384").and_then(|w| int_in(w, 1, 10_000_000)) {
                        Ok(n) => max_conns = n,
                        Err(e) => self.errors.push(e),
                    }
                }
                "sni" => pools.extend(self.sni_pool(item)),
                _ if bare.is_some() => self.errors.push(
                    Diagnostic::error(item.span(), "a `tcp` block has one bare `proxy`")
                        .with_hint("list every backend on the one proxy line; route by name with sni HOST... { proxy … }"),
                ),
                _ => bare = Some(item),
            }
        }
        if bare.is_none() && pools.is_empty() {
            self.errors.push(
                Diagnostic::error(d.span(), "a `tcp` block needs a `proxy`")
                    .with_hint("for example: tcp :5432 { proxy 10.0.0.5:5432 }"),
            );
            return None;
        }
        if let Some(p) = bare {
            let (proxy, idle_timeout) = self.tcp_proxy(p)?;
            pools.push(TcpPool {
                sni: Vec::new(),
                proxy,
                idle_timeout,
            });
        }
        Some(TcpProxy {
            listen,
            pools,
            max_conns,
            guards,
        })
    }

    /// `sni HOST... { proxy ADDR... [{ … }] }`: the pool for TLS connections whose
    /// ClientHello names one of HOST (exact or `*.suffix`).
    fn sni_pool(&mut self, d: &Directive) -> Option<TcpPool> {
        let r = (|| {
            if d.args.is_empty() {
                return Err(missing(
                    d,
                    "sni HOST... {",
                    "sni db.example.com *.db.example.com {",
                ));
            }
            let hosts = d
                .args
                .iter()
                .map(|w| match host_pattern(w)? {
                    HostPattern::Any => Err(expected(w, "a host name or *.suffix").with_hint(
                        "connections no name takes go to the bare `proxy` of the block",
                    )),
                    h => Ok(h),
                })
                .collect::<Res<Vec<_>>>()?;
            let items = block(d, "sni db.example.com { proxy 10.0.0.5:5432 }")?;
            match items {
                [p] if p.name.text == "proxy" => Ok((hosts, p)),
                _ => Err(
                    Diagnostic::error(d.span(), "an `sni` block holds one `proxy` line")
                        .with_hint("sni db.example.com { proxy 10.0.0.5:5432 }"),
                ),
            }
        })();
        let (sni, p) = match r {
            Ok(x) => x,
            Err(e) => {
                self.errors.push(e);
                return None;
            }
        };
        let (proxy, idle_timeout) = self.tcp_proxy(p)?;
        Some(TcpPool {
            sni,
            proxy,
            idle_timeout,
        })
    }

    /// A `tcp` block's `proxy` line: only what means something to a byte relay, plus
    /// `idle_timeout`; HTTP options, schemes and HTTP probes are load errors.
    fn tcp_proxy(&mut self, p: &Directive) -> Option<(ProxyConfig, Duration)> {
        let mut idle_timeout = Duration::from_secs(3600);
        let mut options = Vec::new();
        for item in p.block.as_deref().unwrap_or(&[]) {
            let name = item.name.text.as_str();
            if name == "idle_timeout" {
                match one_arg(item, "idle_timeout 1h").and_then(positive) {
                    Ok(t) => idle_timeout = t,
                    Err(e) => self.errors.push(e),
                }
            } else if name == "health" && item.args.first().is_some_and(|w| w.text == "grpc") {
                self.errors.push(
                    Diagnostic::error(
                        item.span(),
                        "a `tcp` proxy checks health with `health connect`",
                    )
                    .with_hint("a gRPC probe means nothing to a byte relay"),
                );
            } else if L4_OPTIONS.contains(&name) {
                options.push(item.clone());
            } else if Place::Proxy.known().contains(&name) {
                self.errors.push(
                    Diagnostic::error(
                        item.span(),
                        format!("`{name}` is for HTTP; a `tcp` proxy relays bytes"),
                    )
                    .with_hint(format!("a tcp proxy takes: {}", L4_OPTIONS.join(", "))),
                );
            } else {
                options.push(item.clone());
            }
        }
        let mut stripped = p.clone();
        stripped.block = Some(options);
        // `proxy_defaults` are HTTP pools' defaults.
        let defaults = std::mem::take(&mut self.proxy_defaults);
        let built = self.proxy(&stripped);
        self.proxy_defaults = defaults;
        let proxy = match built {
            Ok(Handler::Proxy(p)) => *p,
            Ok(_) => return None,
            Err(e) => {
                self.errors.push(e);
                return None;
            }
        };
        if let Some(b) = proxy
            .backends
            .iter()
            .chain(&proxy.backups)
            .find(|b| b.scheme != BackendScheme::Http || b.text.starts_with("http://"))
        {
            self.errors.push(
                Diagnostic::error(
                    p.span(),
                    format!(
                        "`{}`: a `tcp` proxy relays bytes to host:port addresses",
                        b.text
                    ),
                )
                .with_hint("drop the scheme: write host:port or unix:/path"),
            );
            return None;
        }
        if let Some(Health {
            probe: Probe::Http { .. } | Probe::Grpc { .. },
            ..
        }) = &proxy.health
        {
            self.errors.push(
                Diagnostic::error(
                    p.span(),
                    "a `tcp` proxy checks health with `health connect`",
                )
                .with_hint("an HTTP probe means nothing to a byte relay"),
            );
        }
        Some((proxy, idle_timeout))
    }
}

/// `tcp ADDR {`: the listener, and the block's lines.
fn tcp_listen(d: &Directive) -> Res<(Listen, &[Directive])> {
    let w = d
        .args
        .first()
        .ok_or_else(|| missing(d, "tcp ADDR {", "tcp :5432 {"))?;
    if let Some(x) = d.args.get(1) {
        return Err(extra(x, "write: tcp ADDR { proxy ADDR... }"));
    }
    let (addr, dual_stack) = listen_addr(w)?;
    let items = block(d, "tcp :5432 {")?;
    let listen = Listen {
        addr,
        text: w.text.clone(),
        dual_stack,
        tls: false,
        proxy_protocol: false,
        quic: false,
        span: d.span(),
        addr_span: w.span,
        seq: 0,
        guards: Vec::new(),
    };
    Ok((listen, items))
}

/// Connections an L4 listener relays at once unless `max_conns` says otherwise.
const DEFAULT_TCP_MAX_CONNS: u64 = 16_384;

/// `lb POLICY`, with `hash`'s key.
fn policy(d: &Directive) -> Res<Policy> {
    let w = first_arg(d, "lb POLICY")?;
    let rest = &d.args[1..];
    let simple = match w.text.as_str() {
        "hash" => None,
        word => match Policy::SIMPLE.into_iter().find(|p| p.name() == word) {
            Some(p) => Some(p),
            None => {
                let known: Vec<&str> = Policy::SIMPLE
                    .iter()
                    .map(Policy::name)
                    .chain(["hash"])
                    .collect();
                let e = Diagnostic::error(w.span, format!("unknown policy `{word}`"));
                return Err(match nearest(word, known.iter().copied()) {
                    Some(s) => e.with_hint(format!("did you mean `{s}`?")),
                    None => e.with_hint(format!("policies: {}", known.join(", "))),
                });
            }
        },
    };
    if let Some(p) = simple {
        if let Some(x) = rest.first() {
            return Err(extra(x, "lb takes one policy"));
        }
        return Ok(p);
    }
    const USAGE: &str = "lb hash client_ip | header NAME | cookie NAME | uri";
    let Some(k) = rest.first() else {
        return Err(missing(d, USAGE, "lb hash client_ip"));
    };
    let (key, used) = match k.text.as_str() {
        "client_ip" => (HashKey::ClientIp, 1),
        "uri" => (HashKey::Uri, 1),
        "header" | "cookie" => {
            let Some(n) = rest.get(1) else {
                return Err(missing(d, USAGE, &format!("lb hash {} NAME", k.text)));
            };
            let key = if k.text == "header" {
                HashKey::Header(
                    http::HeaderName::from_bytes(n.text.as_bytes())
                        .map_err(|_| expected(n, "a header name"))?,
                )
            } else {
                HashKey::Cookie(n.text.clone())
            };
            (key, 2)
        }
        _ => return Err(expected(k, "client_ip, header NAME, cookie NAME or uri")),
    };
    if let Some(x) = rest.get(used) {
        return Err(extra(x, USAGE));
    }
    Ok(Policy::Hash(key))
}

/// `allow CIDR…`, `deny CIDR…` or `rate_limit N/s [burst N]` in a `tcp` block: judged
/// on the client's address when a connection is accepted. A rate counts new
/// connections per client address, in this process: no `key` or `store`, no
/// conditions or branches.
pub(super) fn tcp_guard(d: &Directive) -> Res<Filter> {
    let f = super::filters::filter(d, std::path::Path::new(""))?;
    if let Filter::RateLimit(r) = &f {
        if r.key_header.is_some() || r.store.is_some() {
            return Err(Diagnostic::error(
                d.span(),
                "a `tcp` rate_limit counts new connections per client address",
            )
            .with_hint("write rate_limit N/s [burst N], without key or store"));
        }
    }
    Ok(f)
}
