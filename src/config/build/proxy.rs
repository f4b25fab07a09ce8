//! The `proxy` handler's addresses and options.

use std::time::Duration;

use http::HeaderValue;

use super::args::*;
use super::route::compress;
use super::values::*;
use super::vocab::Place;
use super::{Builder, Res, Seen};
use crate::config::diag::{nearest, Diagnostic};
use crate::config::model::*;
use crate::config::parser::Directive;

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
        let backends = d
            .args
            .iter()
            .map(|w| backend_addr(w, &base))
            .collect::<Res<Vec<_>>>()?;
        let mut p = ProxyConfig::new(backends);
        let mut seen = Seen::default();
        let mut weights_at = None;
        for item in d.block.as_deref().unwrap_or(&[]) {
            if !self.known_here(item, Place::Proxy) || !self.once(&mut seen, item) {
                continue;
            }
            if item.name.text == "weights" {
                weights_at = Some(item);
            }
            let r = self.proxy_option(item, &mut p);
            self.push(r);
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
        Ok(Handler::Proxy(Box::new(p)))
    }

    pub(super) fn proxy_option(&mut self, d: &Directive, p: &mut ProxyConfig) -> Res<()> {
        match d.name.text.as_str() {
            "lb" => {
                p.lb = policy(d)?;
                Ok(())
            }
            "weights" => {
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
            "fail_duration" => {
                p.fail_duration = duration(one_arg(d, "fail_duration 30s")?)?;
                Ok(())
            }
            "breaker" => {
                p.breaker = int_in(one_arg(d, "breaker N")?, 1, 100)? as u32;
                Ok(())
            }
            "all_down" => {
                let w = one_arg(d, "all_down try|fail")?;
                p.all_down = match w.text.as_str() {
                    "try" => AllDown::Try,
                    "fail" => AllDown::Fail,
                    _ => return Err(expected(w, "`try` or `fail`")),
                };
                Ok(())
            }
            "host" => {
                let w = one_arg(d, "host keep|upstream|NAME")?;
                p.host = match w.text.as_str() {
                    "keep" => HostMode::Keep,
                    "upstream" => HostMode::Upstream,
                    name => HostMode::Name(HeaderValue::from_str(name).map_err(|_| {
                        Diagnostic::error(w.span, format!("`{name}` cannot be a Host header"))
                    })?),
                };
                Ok(())
            }
            "header_up" => {
                p.header_up.push(header_op(d, "header_up")?);
                Ok(())
            }
            "header_down" => {
                p.header_down.push(header_op(d, "header_down")?);
                Ok(())
            }
            "timeout" => {
                p.timeout = positive(one_arg(d, "timeout 60s")?)?;
                Ok(())
            }
            "connect_timeout" => {
                p.connect_timeout = positive(one_arg(d, "connect_timeout 5s")?)?;
                Ok(())
            }
            "limit" => {
                match d.args.as_slice() {
                    [w] if w.text == "off" => {
                        self.warnings.push(
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
            "max_body" => {
                p.max_body = Some(size(one_arg(d, "max_body SIZE")?)?);
                Ok(())
            }
            "retries" => {
                p.retries = int_in(one_arg(d, "retries N")?, 0, 2)? as u8;
                Ok(())
            }
            "keepalive" => {
                let (n, t) = two_args(d, "keepalive IDLE_MAX IDLE_TIMEOUT")?;
                p.keepalive = Keepalive {
                    idle_max: int_in(n, 0, 65_536)? as usize,
                    idle_timeout: positive(t)?,
                };
                Ok(())
            }
            "compress" => compress(d),
            _ => Err(unsupported(d)),
        }
    }
}

/// `lb POLICY`, with `hash`'s key.
fn policy(d: &Directive) -> Res<Policy> {
    let w = first_arg(d, "lb POLICY")?;
    let rest = &d.args[1..];
    let simple = match w.text.as_str() {
        "first" => Some(Policy::First),
        "round_robin" => Some(Policy::RoundRobin),
        "weighted_round_robin" => Some(Policy::WeightedRoundRobin),
        "least_conn" => Some(Policy::LeastConn),
        "weighted_least_conn" => Some(Policy::WeightedLeastConn),
        "p2c" => Some(Policy::P2c),
        "hash" => None,
        other => {
            let known = [
                "first",
                "round_robin",
                "weighted_round_robin",
                "least_conn",
                "weighted_least_conn",
                "p2c",
                "hash",
            ];
            let e = Diagnostic::error(w.span, format!("unknown policy `{other}`"));
            return Err(match nearest(other, known) {
                Some(s) => e.with_hint(format!("did you mean `{s}`?")),
                None => e.with_hint(format!("policies: {}", known.join(", "))),
            });
        }
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
