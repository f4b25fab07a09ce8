//! `request_id`: every request goes to the handler with an `X-Request-Id`, and the
//! response carries the same one back. A valid incoming id (1 to 128 visible ASCII
//! characters, one field) is kept, so a chain of proxies shares one; anything else is
//! replaced by a new UUIDv7 (time-ordered, so ids sort by when they were made).
//!
//! The UUID is made here rather than by the `uuid` crate: its v7 generator (a locked
//! context and a cryptographic RNG per id) cost about 2,000 instructions a request, a
//! fifth of the budget of five cheap filters. An id is not a secret: 74 random bits from
//! a per-thread wyrand generator seeded from the OS are unique enough, at ~100.

use http::header::HeaderName;
use http::{HeaderValue, Request, Response};

use super::{Cx, Filter, Step};
use crate::body::Body;

pub(crate) static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

pub(crate) struct RequestId;

/// The id a response carries, for the access log's `request_id`.
#[derive(Clone)]
pub(crate) struct Logged(pub HeaderValue);

impl Filter for RequestId {
    fn on_request(&self, req: &mut Request<Body>, cx: &mut Cx<'_>) -> Step {
        let id = match req.headers().get(&X_REQUEST_ID) {
            Some(v) if valid(v) && req.headers().get_all(&X_REQUEST_ID).iter().nth(1).is_none() => {
                v.clone()
            }
            _ => fresh(),
        };
        req.headers_mut().insert(X_REQUEST_ID.clone(), id.clone());
        cx.request_id = Some(id);
        Step::Pass
    }

    fn on_response(&self, resp: &mut Response<Body>, cx: &Cx<'_>) {
        if let Some(id) = &cx.request_id {
            resp.headers_mut().insert(X_REQUEST_ID.clone(), id.clone());
            resp.extensions_mut().insert(Logged(id.clone()));
        }
    }
}

fn valid(v: &HeaderValue) -> bool {
    let b = v.as_bytes();
    (1..=128).contains(&b.len()) && b.iter().all(|c| (0x21..=0x7e).contains(c))
}

/// A new UUIDv7 (RFC 9562): 48 bits of Unix milliseconds, the version, 12 random bits,
/// the variant, 62 random bits; as 36 lower-case characters.
fn fresh() -> HeaderValue {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() * 1000 + u64::from(d.subsec_millis()));
    let (a, b) = (random(), random());
    let hi = (ms << 16) | 0x7000 | (a & 0x0fff);
    let lo = (b & 0x3fff_ffff_ffff_ffff) | 0x8000_0000_0000_0000;
    let mut digits = [0u8; 32];
    hex(hi, &mut digits[..16]);
    hex(lo, &mut digits[16..]);
    // 8-4-4-4-12.
    let mut out = [b'-'; 36];
    out[..8].copy_from_slice(&digits[..8]);
    out[9..13].copy_from_slice(&digits[8..12]);
    out[14..18].copy_from_slice(&digits[12..16]);
    out[19..23].copy_from_slice(&digits[16..20]);
    out[24..].copy_from_slice(&digits[20..]);
    // Owned by one shared allocation: the copy the response gets is a reference count.
    HeaderValue::from_maybe_shared(bytes::Bytes::from_owner(out))
        .expect("hex and dashes are a valid header value")
}

/// `n` as 16 lower-case hex digits, a byte (two digits) at a time.
fn hex(n: u64, out: &mut [u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for (pair, byte) in out.chunks_exact_mut(2).zip(n.to_be_bytes()) {
        pair[0] = HEX[usize::from(byte >> 4)];
        pair[1] = HEX[usize::from(byte & 0xf)];
    }
}

/// 64 random bits from this thread's wyrand generator, seeded once from the OS.
fn random() -> u64 {
    use std::cell::Cell;
    thread_local! {
        static STATE: Cell<u64> = Cell::new(seed());
    }
    STATE.with(|s| {
        let x = s.get().wrapping_add(0xa076_1d64_78bd_642f);
        s.set(x);
        let t = u128::from(x) * u128::from(x ^ 0xe703_7ed1_a0b4_28db);
        ((t >> 64) as u64) ^ (t as u64)
    })
}

fn seed() -> u64 {
    use ring::rand::SecureRandom as _;
    let mut b = [0u8; 8];
    if ring::rand::SystemRandom::new().fill(&mut b).is_err() {
        // No OS randomness: the clock and the thread still tell instances apart.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        return t ^ (&b as *const _ as u64);
    }
    u64::from_ne_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids() {
        assert!(valid(&HeaderValue::from_static("abc-123")));
        assert!(!valid(&HeaderValue::from_static("")));
        assert!(!valid(&HeaderValue::from_static("a b")));
        assert!(!valid(&HeaderValue::from_str(&"x".repeat(129)).unwrap()));
        let id = fresh();
        let s = id.to_str().unwrap();
        assert_eq!(s.len(), 36);
        assert_eq!(&s[14..15], "7", "version 7: {s}");
        assert!(matches!(&s[19..20], "8" | "9" | "a" | "b"), "variant: {s}");
        let dashes: Vec<usize> = s.match_indices('-').map(|(i, _)| i).collect();
        assert_eq!(dashes, [8, 13, 18, 23]);
        assert_ne!(fresh(), id);
        // The time is now's, in the first 48 bits.
        let ms = u64::from_str_radix(&s[..8], 16).unwrap() << 16
            | u64::from_str_radix(&s[9..13], 16).unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        assert!(now.abs_diff(ms) < 10_000, "{ms} vs {now}");
    }
}
