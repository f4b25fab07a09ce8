//! A filter line's `when …`, loaded from config text and tested on a request built
//! from the input, against a reference: paths are judged normalised, queries as an
//! application decodes them, `unless` is always the opposite.
//!
//! Input: the condition, a newline, the method, a space, the target, then
//! `name: value` lines; the first byte of the last line picks the client address.
#![no_main]

use std::net::IpAddr;

use libfuzzer_sys::fuzz_target;
use sluice::config::{Matcher, PathPattern, Test};
use sluice::fuzzing::{condition, Probe};

const CLIENTS: [&str; 6] = ["127.0.0.1", "10.1.2.3", "::1", "::ffff:10.1.2.3", "2001:db8::1", "203.0.113.9"];

fn reference(test: &Test, p: &Probe<'_>, normal: &str) -> bool {
    match test {
        Test::Path(PathPattern::Exact(e)) => normal == e,
        Test::Path(PathPattern::Prefix(pre)) => {
            // `/*` covers every path; `*` (OPTIONS) is none.
            normal == pre || normal.starts_with(&format!("{pre}/"))
        }
        Test::Match(Matcher::Method(ms)) => ms.iter().any(|m| m.as_str() == p.method),
        Test::Match(Matcher::Header(name, want)) => p
            .headers
            .iter()
            .any(|(n, v)| n.eq_ignore_ascii_case(name.as_str()) && (want == "*" || v == want)),
        Test::Match(Matcher::Query(name, want)) => {
            let query = p.target.split_once('?').map(|(_, q)| q);
            query.is_some_and(|q| {
                form_urlencoded::parse(q.as_bytes())
                    .any(|(k, v)| k == name.as_str() && (want == "*" || v == want.as_str()))
            })
        }
        Test::Path(PathPattern::Regex(re)) => re.0.is_match(normal),
        Test::ClientIp(nets) => {
            let ip = p.client.to_canonical();
            nets.iter().any(|n| n.contains(&ip))
        }
        // The harness's requests come over no TLS connection: never a certificate.
        Test::ClientCert => false,
        // Nor a token an earlier `jwt` filter verified: a claim never holds.
        Test::Claim { .. } => false,
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let mut lines = s.split('\n');
    let (Some(cond), Some(request)) = (lines.next(), lines.next()) else {
        return;
    };
    let Some((method, target)) = request.split_once(' ') else {
        return;
    };
    let headers: Vec<(&str, &str)> = lines
        .filter_map(|l| l.split_once(": "))
        .collect();
    let pick = s.bytes().last().unwrap_or(0) as usize % CLIENTS.len();
    let probe = Probe {
        method,
        target,
        headers: &headers,
        client: CLIENTS[pick].parse::<IpAddr>().unwrap(),
    };
    let Some((model, holds, normal)) = condition(cond, &probe) else {
        return;
    };
    // Decoded bytes that are not UTF-8 compare apart from their replacement.
    if matches!(&model.test, Test::Match(Matcher::Query(..))) && s.contains('\u{fffd}') {
        return;
    }
    if matches!(&model.test, Test::Match(Matcher::Query(n, _)) if n.is_empty()) {
        return;
    }
    let want = reference(&model.test, &probe, &normal) != model.negate;
    assert_eq!(holds, want, "{cond:?} on {method} {target} {headers:?}");
});
