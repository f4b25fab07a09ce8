//! `when …` / `unless …` on a filter line: tests on the normalised path, the method, a
//! header, a query parameter or the client's address (after `trust`). The header and
//! query tests are the ones a route's `match` lines use.

use std::net::IpAddr;

use http::{HeaderMap, HeaderName, Method, Request};
use ipnet::IpNet;

use super::Cx;
use crate::body::Body;
use crate::config::PathPattern;

pub struct Condition {
    pub negate: bool,
    pub test: Test,
}

pub enum Test {
    Path(PathPattern),
    Method(Vec<Method>),
    /// Value `*`: any value of a present header.
    Header(HeaderName, String),
    /// Value `*`: any value of a present parameter.
    Query(String, String),
    ClientIp(Vec<IpNet>),
}

impl Condition {
    /// Whether the filter runs for this request.
    pub fn holds(&self, req: &Request<Body>, cx: &Cx<'_>) -> bool {
        let passed = match &self.test {
            Test::Path(p) => p.matches(cx.path(req)),
            Test::Method(ms) => ms.contains(req.method()),
            Test::Header(name, want) => header_matches(req.headers(), name, want),
            Test::Query(name, want) => query_matches(req.uri().query(), name, want),
            Test::ClientIp(nets) => in_nets(nets, cx.client_ip),
        };
        passed != self.negate
    }
}

/// Whether any value of `name` is `want` (or the header is present, for `*`).
pub fn header_matches(headers: &HeaderMap, name: &HeaderName, want: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .any(|v| want == "*" || v.as_bytes() == want.as_bytes())
}

/// Whether the query has `name=want` (or `name` at all, for `*`).
pub fn query_matches(query: Option<&str>, name: &str, want: &str) -> bool {
    query.is_some_and(|q| {
        q.split('&').any(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            k == name && (want == "*" || v == want)
        })
    })
}

/// Whether `ip` is in one of `nets` (an IPv4-mapped IPv6 client counts as its IPv4).
pub fn in_nets(nets: &[IpNet], ip: IpAddr) -> bool {
    let ip = ip.to_canonical();
    nets.iter().any(|n| n.contains(&ip))
}
