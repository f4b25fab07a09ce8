//! `when …` / `unless …` on a filter line: tests on the normalised path, the method, a
//! header, a query parameter or the client's address (after `trust`). The header and
//! query tests are the ones a route's `match` lines use. `when status …` and `when
//! response_header …` test the response instead, and gate the filter's response phase.

use std::net::IpAddr;

use http::{HeaderMap, HeaderName, Method, Request, Response};
use ipnet::IpNet;

use super::Cx;
use crate::body::Body;
use crate::config::{PathPattern, StatusSet};

#[derive(Clone)]
pub(crate) struct Condition {
    pub negate: bool,
    pub test: Test,
}

#[derive(Clone)]
pub(crate) enum Test {
    Path(PathPattern),
    Method(Vec<Method>),
    /// Value `*`: any value of a present header.
    Header(HeaderName, String),
    /// Value `*`: any value of a present parameter.
    Query(String, String),
    ClientIp(Vec<IpNet>),
    ClientCert,
    /// `jwt.CLAIM == V` / `in V...`: the verified token's claim is one of `values`.
    Claim(String, Vec<String>),
}

impl Condition {
    /// Whether the filter runs for this request.
    pub(crate) fn holds(&self, req: &Request<Body>, cx: &Cx<'_>) -> bool {
        let passed = match &self.test {
            Test::Path(p) => p.matches(cx.path(req)),
            Test::Method(ms) => ms.contains(req.method()),
            Test::Header(name, want) => header_matches(req.headers(), name, want),
            Test::Query(name, want) => query_matches(req.uri().query(), name, want),
            Test::ClientIp(nets) => in_nets(nets, cx.client_ip),
            Test::ClientCert => cx.client_cert,
            Test::Claim(name, values) => cx.claims.as_ref().is_some_and(|c| {
                crate::jose::claim(&c.map, name)
                    .is_some_and(|v| values.iter().any(|w| crate::jose::claim_is(name, v, w)))
            }),
        };
        passed != self.negate
    }
}

/// A test on the response: its status or one of its fields.
#[derive(Clone)]
pub(crate) struct ResponseCondition {
    pub negate: bool,
    pub test: ResponseTest,
}

#[derive(Clone)]
pub(crate) enum ResponseTest {
    Status(Vec<StatusSet>),
    /// Value `*`: any value of a present field.
    Header(HeaderName, String),
}

impl ResponseCondition {
    /// Whether the filter's response phase runs for this response.
    pub(crate) fn holds(&self, resp: &Response<Body>) -> bool {
        let passed = match &self.test {
            ResponseTest::Status(sets) => {
                let code = resp.status().as_u16();
                sets.iter().any(|s| s.contains(code))
            }
            ResponseTest::Header(name, want) => header_matches(resp.headers(), name, want),
        };
        passed != self.negate
    }
}

/// Whether any value of `name` is `want` (or the header is present, for `*`).
pub(crate) fn header_matches(headers: &HeaderMap, name: &HeaderName, want: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .any(|v| want == "*" || v.as_bytes() == want.as_bytes())
}

/// Whether the query has `name=want` (or `name` at all, for `*`), compared as an
/// application decodes them (`%XX` and `+`), so `?debu%67=%31` is `debug=1`.
pub(crate) fn query_matches(query: Option<&str>, name: &str, want: &str) -> bool {
    query.is_some_and(|q| {
        q.split('&').any(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            decoded_eq(k, name) && (want == "*" || decoded_eq(v, want))
        })
    })
}

/// Whether `raw`, form-decoded, is `want` (without allocating).
fn decoded_eq(raw: &str, want: &str) -> bool {
    let (raw, mut want) = (raw.as_bytes(), want.as_bytes());
    let mut i = 0;
    while i < raw.len() {
        let (byte, used) = match raw[i] {
            b'+' => (b' ', 1),
            b'%' => match (raw.get(i + 1).and_then(hex), raw.get(i + 2).and_then(hex)) {
                (Some(h), Some(l)) => (h << 4 | l, 3),
                _ => (b'%', 1),
            },
            b => (b, 1),
        };
        match want.split_first() {
            Some((&w, rest)) if w == byte => want = rest,
            _ => return false,
        }
        i += used;
    }
    want.is_empty()
}

/// `s` as an application decodes a form or query value (`%XX`, `+` for a space);
/// `None` for a bad escape or bytes that are not UTF-8.
pub(crate) fn form_decoded(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => {
                out.push(hex(b.get(i + 1)?)? << 4 | hex(b.get(i + 2)?)?);
                i += 2;
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

fn hex(b: &u8) -> Option<u8> {
    (*b as char).to_digit(16).map(|d| d as u8)
}

/// Whether `ip` is in one of `nets` (an IPv4-mapped IPv6 client counts as its IPv4).
pub(crate) fn in_nets(nets: &[IpNet], ip: IpAddr) -> bool {
    let ip = ip.to_canonical();
    nets.iter().any(|n| n.contains(&ip))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_compare_decoded() {
        assert!(query_matches(Some("a=1&debug=1"), "debug", "1"));
        assert!(query_matches(Some("debu%67=%31"), "debug", "1"));
        assert!(query_matches(Some("q=a+b"), "q", "a b"));
        assert!(query_matches(Some("q=a%2"), "q", "a%2"));
        assert!(!query_matches(Some("debug=12"), "debug", "1"));
        assert!(!query_matches(Some("debug"), "debug", "1"));
        assert!(query_matches(Some("debug"), "debug", "*"));
        assert!(!query_matches(None, "debug", "*"));
    }
}
