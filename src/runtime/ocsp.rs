//! OCSP stapling (DESIGN §18.8): every certificate whose leaf names an OCSP responder
//! (its Authority Information Access) gets a response fetched at start and again past
//! half of the response's validity, stapled to the handshakes; the last good response
//! stays through a responder outage until its `nextUpdate`.
//!
//! The request and the response are small DER structures (RFC 6960) written and read
//! here: a request is one `CertID` (SHA-1 of the issuer's name and key, the leaf's
//! serial), and of a response sluice needs the status, the one `SingleResponse` for
//! that serial, its validity, and the signature by the issuer over the response data
//! (a responder's delegated certificate is not followed: such a response is refused,
//! logged, and the previous staple kept). The issuer is the next certificate of the
//! certificate file's chain.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwapOption;
use rustls::sign::CertifiedKey;
use x509_cert::der::{Decode as _, Encode as _};

/// The most a responder's answer may weigh.
const MAX_RESPONSE: usize = 64 * 1024;
/// How long one fetch may take.
const DEADLINE: Duration = Duration::from_secs(10);
/// After a failed fetch, the next one waits this long, doubling up to [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_secs(1);
const MAX_RETRY: Duration = Duration::from_secs(300);
/// A response without `nextUpdate` is fetched again after this long.
const NO_NEXT_UPDATE: Duration = Duration::from_secs(3600);

/// A certificate with its staple.
pub(crate) struct Stapled {
    /// The certificate as loaded (the staple belongs to it, not to a renewed one).
    pub base: Arc<CertifiedKey>,
    /// The same with the response attached.
    pub with: Arc<CertifiedKey>,
    pub this_update: SystemTime,
    pub next_update: SystemTime,
}

/// One certificate slot's stapling.
#[derive(Default)]
pub(crate) struct Stapler {
    pub stapled: ArcSwapOption<Stapled>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// No fetch before this.
    next_try: Option<SystemTime>,
    retry: Duration,
    /// The last failure, said once until a fetch succeeds.
    failing: Option<String>,
}

impl Stapler {
    /// `current` with its staple when the staple is its own and still valid.
    pub(crate) fn staple(&self, current: Arc<CertifiedKey>) -> Arc<CertifiedKey> {
        match &*self.stapled.load() {
            Some(s) if same(&s.base, &current) && SystemTime::now() < s.next_update => {
                s.with.clone()
            }
            _ => current,
        }
    }

    /// After a reload loaded the same certificate again (a new `Arc`), the staple
    /// moves onto it, so handshakes find it by pointer again.
    fn rebase(&self, current: &Arc<CertifiedKey>) {
        let Some(s) = self.stapled.load_full() else {
            return;
        };
        if Arc::ptr_eq(&s.base, current) || !same(&s.base, current) {
            return;
        }
        let mut with = (**current).clone();
        with.ocsp = s.with.ocsp.clone();
        self.stapled.store(Some(Arc::new(Stapled {
            base: current.clone(),
            with: Arc::new(with),
            this_update: s.this_update,
            next_update: s.next_update,
        })));
    }

    /// The staple's `nextUpdate`, when one is served.
    pub(crate) fn expiry(&self) -> Option<SystemTime> {
        self.stapled.load().as_ref().map(|s| s.next_update)
    }

    /// Fetches a response for `current` when it is due; `site` names it in the log.
    pub(crate) async fn refresh(&self, site: &str, current: Arc<CertifiedKey>) {
        let now = SystemTime::now();
        self.rebase(&current);
        let due = match &*self.stapled.load() {
            Some(s) if Arc::ptr_eq(&s.base, &current) => {
                let half = s
                    .next_update
                    .duration_since(s.this_update)
                    .unwrap_or_default()
                    / 2;
                now >= s.this_update + half
            }
            _ => true,
        };
        let waiting = {
            let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            st.next_try.is_some_and(|t| now < t)
        };
        if !due || waiting {
            return;
        }
        let Some(req) = Request::of(&current) else {
            return;
        };
        match fetch(&req)
            .await
            .and_then(|der| req.check(&der).map(|v| (der, v)))
        {
            Ok((der, (this_update, next_update))) => {
                let mut with = (*current).clone();
                with.ocsp = Some(der);
                self.stapled.store(Some(Arc::new(Stapled {
                    base: current,
                    with: Arc::new(with),
                    this_update,
                    next_update,
                })));
                let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
                *st = State::default();
                tracing::info!(
                    "sluice: site {site}: OCSP staple from {} (good until {})",
                    req.url,
                    httpdate::fmt_http_date(next_update)
                );
            }
            Err(why) => self.failed(site, &req.url, why),
        }
    }

    fn failed(&self, site: &str, url: &str, why: String) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.retry = (st.retry * 2).clamp(FIRST_RETRY, MAX_RETRY);
        st.next_try = Some(SystemTime::now() + st.retry);
        if st.failing.as_deref() != Some(why.as_str()) {
            let kept = match self.expiry() {
                Some(t) => format!(
                    "keeping the staple good until {}",
                    httpdate::fmt_http_date(t)
                ),
                None => "no staple meanwhile".into(),
            };
            tracing::warn!("sluice: site {site}: OCSP from {url}: {why}; {kept} (retrying)");
            st.failing = Some(why);
        }
    }
}

/// The same certificate: the same `Arc`, or (after a reload read its files again)
/// the same leaf.
fn same(a: &Arc<CertifiedKey>, b: &Arc<CertifiedKey>) -> bool {
    Arc::ptr_eq(a, b) || a.cert.first() == b.cert.first()
}

/// What is asked of a responder for one certificate, and how its answer is judged.
struct Request {
    url: String,
    der: Vec<u8>,
    serial: Vec<u8>,
    /// The issuer's public key (its SubjectPublicKeyInfo, DER) and algorithm OID.
    issuer_spki: Vec<u8>,
}

impl Request {
    /// The request for `ck`'s leaf, when it names an OCSP responder over `http://`
    /// and its chain holds the issuer.
    fn of(ck: &CertifiedKey) -> Option<Request> {
        let leaf = x509_cert::Certificate::from_der(ck.cert.first()?).ok()?;
        let issuer = x509_cert::Certificate::from_der(ck.cert.get(1)?).ok()?;
        let url = responder(&leaf)?;
        let tbs = &leaf.tbs_certificate;
        let name_hash = sha1(&tbs.issuer.to_der().ok()?);
        let spki = &issuer.tbs_certificate.subject_public_key_info;
        let key_hash = sha1(spki.subject_public_key.raw_bytes());
        let serial = tbs.serial_number.as_bytes().to_vec();
        let cert_id = cert_id(&name_hash, &key_hash, &serial);
        // OCSPRequest { TBSRequest { requestList { Request { CertID } } } }.
        let der = tlv(
            0x30,
            &tlv(0x30, &tlv(0x30, &tlv(0x30, &tlv(0x30, &cert_id)))),
        );
        Some(Request {
            url,
            der,
            serial,
            issuer_spki: spki.to_der().ok()?,
        })
    }

    /// A responder's answer judged: successful, signed by the issuer, `good` for this
    /// serial, current; its `thisUpdate` and `nextUpdate`.
    fn check(&self, der: &[u8]) -> Result<(SystemTime, SystemTime), String> {
        let basic = basic_response(der)?;
        let mut r = Der::new(basic);
        let mut seq = r.enter(0x30)?;
        let data_tlv = seq.raw(0x30)?;
        let alg = seq.enter(0x30)?.read(0x06)?;
        let sig = seq.read(0x03)?;
        let sig = sig.split_first().map(|(_, s)| s).unwrap_or_default();
        verify(&self.issuer_spki, alg, data_tlv, sig)?;
        let mut data = Der::new(data_tlv).enter(0x30)?;
        data.skip_if(0xa0);
        data.any()?; // responderID
        data.read(0x18)?; // producedAt
        let mut responses = data.enter(0x30)?;
        while !responses.done() {
            let mut single = responses.enter(0x30)?;
            let mut cert_id = single.enter(0x30)?;
            cert_id.any()?; // hashAlgorithm
            cert_id.any()?; // issuerNameHash
            cert_id.any()?; // issuerKeyHash
            if cert_id.read(0x02)? != self.serial.as_slice() {
                continue;
            }
            let (tag, _) = single.next()?;
            if tag != 0x80 {
                let word = if tag == 0xa1 { "revoked" } else { "unknown" };
                return Err(format!("the responder says the certificate is {word}"));
            }
            let this_update = generalized(single.read(0x18)?)?;
            let next_update = match single.peek() {
                Some(0xa0) => generalized(single.enter(0xa0)?.read(0x18)?)?,
                _ => this_update + NO_NEXT_UPDATE,
            };
            let now = SystemTime::now();
            if next_update <= now || this_update > now + Duration::from_secs(300) {
                return Err("the response is not current".into());
            }
            return Ok((this_update, next_update));
        }
        Err("the response does not name this certificate".into())
    }
}

/// The leaf's OCSP responder (`http://` only: OCSP over TLS would need OCSP).
fn responder(leaf: &x509_cert::Certificate) -> Option<String> {
    use x509_cert::ext::pkix::name::GeneralName;
    use x509_cert::ext::pkix::AuthorityInfoAccessSyntax;
    const OCSP: &str = "1.3.6.1.5.5.7.48.1";
    let (_, aia) = leaf
        .tbs_certificate
        .get::<AuthorityInfoAccessSyntax>()
        .ok()??;
    aia.0.iter().find_map(|d| match &d.access_location {
        GeneralName::UniformResourceIdentifier(u) if d.access_method.to_string() == OCSP => {
            Some(u.to_string()).filter(|u| u.starts_with("http://"))
        }
        _ => None,
    })
}

/// POSTs the request; the response body.
async fn fetch(req: &Request) -> Result<Vec<u8>, String> {
    let request = http::Request::post(req.url.as_str())
        .header(http::header::CONTENT_TYPE, "application/ocsp-request")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            req.der.clone(),
        )))
        .map_err(|e| e.to_string())?;
    let resp = tokio::time::timeout(
        DEADLINE,
        crate::net::fetch::send(request, None, MAX_RESPONSE),
    )
    .await
    .map_err(|_| format!("no answer within {}s", DEADLINE.as_secs()))??;
    if !resp.status().is_success() {
        return Err(format!("answered {}", resp.status()));
    }
    Ok(resp.into_body().to_vec())
}

/// The BasicOCSPResponse inside an OCSPResponse, when it is successful.
fn basic_response(der: &[u8]) -> Result<&[u8], String> {
    const BASIC: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x30, 0x01, 0x01];
    let bad = |_| "not an OCSP response".to_string();
    let mut top = Der::new(der).enter(0x30).map_err(bad)?;
    let status = top.read(0x0a).map_err(bad)?;
    if status != [0] {
        let word = match status.first() {
            Some(1) => "malformedRequest",
            Some(2) => "internalError",
            Some(3) => "tryLater",
            Some(5) => "sigRequired",
            Some(6) => "unauthorized",
            _ => "an unknown status",
        };
        return Err(format!("the responder answered {word}"));
    }
    let mut bytes = top.enter(0xa0).map_err(bad)?.enter(0x30).map_err(bad)?;
    if bytes.read(0x06).map_err(bad)? != BASIC {
        return Err("not a basic OCSP response".into());
    }
    bytes.read(0x04).map_err(bad)
}

/// Checks `sig` over `data` with the issuer's key, by the response's algorithm.
fn verify(spki_der: &[u8], alg: &[u8], data: &[u8], sig: &[u8]) -> Result<(), String> {
    use ring::signature as s;
    let spki = x509_cert::spki::SubjectPublicKeyInfoRef::from_der(spki_der)
        .map_err(|_| "the issuer's key does not parse")?;
    let key = spki.subject_public_key.raw_bytes();
    // sha256/384/512WithRSAEncryption, ecdsa-with-SHA256/384.
    let algorithm: &dyn s::VerificationAlgorithm = match alg {
        [0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0b] => &s::RSA_PKCS1_2048_8192_SHA256,
        [0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0c] => &s::RSA_PKCS1_2048_8192_SHA384,
        [0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0d] => &s::RSA_PKCS1_2048_8192_SHA512,
        [0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02] => &s::ECDSA_P256_SHA256_ASN1,
        [0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x03] => &s::ECDSA_P384_SHA384_ASN1,
        _ => return Err("the response is signed with an algorithm sluice does not check".into()),
    };
    s::UnparsedPublicKey::new(algorithm, key)
        .verify(data, sig)
        .map_err(|_| "the response is not signed by the certificate's issuer".into())
}

fn sha1(data: &[u8]) -> Vec<u8> {
    ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, data)
        .as_ref()
        .to_vec()
}

/// `CertID ::= SEQUENCE { hashAlgorithm (SHA-1), issuerNameHash, issuerKeyHash,
/// serialNumber }`'s content.
fn cert_id(name_hash: &[u8], key_hash: &[u8], serial: &[u8]) -> Vec<u8> {
    let sha1_alg = tlv(
        0x30,
        &[
            &tlv(0x06, &[0x2b, 0x0e, 0x03, 0x02, 0x1a])[..],
            &[0x05, 0x00],
        ]
        .concat(),
    );
    [
        sha1_alg,
        tlv(0x04, name_hash),
        tlv(0x04, key_hash),
        tlv(0x02, serial),
    ]
    .concat()
}

/// One DER element.
fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let n = content.len();
    if n < 0x80 {
        out.push(n as u8);
    } else {
        let bytes: Vec<u8> = n
            .to_be_bytes()
            .into_iter()
            .skip_while(|b| *b == 0)
            .collect();
        out.push(0x80 | bytes.len() as u8);
        out.extend(bytes);
    }
    out.extend_from_slice(content);
    out
}

/// `YYYYMMDDHHMMSSZ`.
fn generalized(t: &[u8]) -> Result<SystemTime, String> {
    let bad = || "a bad time in the response".to_string();
    let s = std::str::from_utf8(t).map_err(|_| bad())?;
    let n =
        |r: std::ops::Range<usize>| s.get(r).and_then(|d| d.parse::<u32>().ok()).ok_or_else(bad);
    if s.len() < 15 || !s.ends_with('Z') {
        return Err(bad());
    }
    let date = time::Date::from_calendar_date(
        n(0..4)? as i32,
        time::Month::try_from(n(4..6)? as u8).map_err(|_| bad())?,
        n(6..8)? as u8,
    )
    .map_err(|_| bad())?;
    let at = date
        .with_hms(n(8..10)? as u8, n(10..12)? as u8, n(12..14)? as u8)
        .map_err(|_| bad())?
        .assume_utc();
    let secs = u64::try_from(at.unix_timestamp()).map_err(|_| bad())?;
    Ok(std::time::UNIX_EPOCH + Duration::from_secs(secs))
}

/// A reader of DER elements, just enough for an OCSP response.
struct Der<'a>(&'a [u8]);

impl<'a> Der<'a> {
    fn new(b: &'a [u8]) -> Der<'a> {
        Der(b)
    }

    fn done(&self) -> bool {
        self.0.is_empty()
    }

    fn peek(&self) -> Option<u8> {
        self.0.first().copied()
    }

    /// The next element: its tag and content; the element whole in `raw`.
    fn element(&mut self) -> Result<(u8, &'a [u8], &'a [u8]), String> {
        let bad = || "a truncated or malformed response".to_string();
        let (&tag, rest) = self.0.split_first().ok_or_else(bad)?;
        let (&first, rest) = rest.split_first().ok_or_else(bad)?;
        let (len, rest) = if first < 0x80 {
            (first as usize, rest)
        } else {
            let k = (first & 0x7f) as usize;
            if k == 0 || k > 4 || rest.len() < k {
                return Err(bad());
            }
            let len = rest[..k].iter().fold(0usize, |a, b| (a << 8) | *b as usize);
            (len, &rest[k..])
        };
        if rest.len() < len {
            return Err(bad());
        }
        let header = self.0.len() - rest.len();
        let raw = &self.0[..header + len];
        let content = &rest[..len];
        self.0 = &rest[len..];
        Ok((tag, content, raw))
    }

    fn next(&mut self) -> Result<(u8, &'a [u8]), String> {
        self.element().map(|(t, c, _)| (t, c))
    }

    fn any(&mut self) -> Result<&'a [u8], String> {
        self.next().map(|(_, c)| c)
    }

    fn read(&mut self, tag: u8) -> Result<&'a [u8], String> {
        match self.next()? {
            (t, c) if t == tag => Ok(c),
            (t, _) => Err(format!("expected DER tag {tag:#x}, found {t:#x}")),
        }
    }

    /// The next element whole (tag and length included), which must have `tag`.
    fn raw(&mut self, tag: u8) -> Result<&'a [u8], String> {
        match self.element()? {
            (t, _, raw) if t == tag => Ok(raw),
            (t, _, _) => Err(format!("expected DER tag {tag:#x}, found {t:#x}")),
        }
    }

    fn enter(&mut self, tag: u8) -> Result<Der<'a>, String> {
        self.read(tag).map(Der)
    }

    fn skip_if(&mut self, tag: u8) {
        if self.peek() == Some(tag) {
            let _ = self.next();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn der_lengths_and_times() {
        assert_eq!(tlv(0x04, &[1, 2]), [0x04, 2, 1, 2]);
        let long = tlv(0x04, &[0; 300]);
        assert_eq!(&long[..4], &[0x04, 0x82, 0x01, 0x2c]);
        let mut r = Der::new(&long);
        assert_eq!(r.read(0x04).unwrap().len(), 300);
        assert!(r.done());
        assert!(Der::new(&[0x30, 0x05, 0x00]).next().is_err(), "truncated");
        let t = generalized(b"20261206153000Z").unwrap();
        assert_eq!(httpdate::fmt_http_date(t), "Sun, 06 Dec 2026 15:30:00 GMT");
        assert!(generalized(b"garbage").is_err());
        assert_eq!(
            basic_response(b"not der").unwrap_err(),
            "not an OCSP response"
        );
        // tryLater.
        assert_eq!(
            basic_response(&[0x30, 0x03, 0x0a, 0x01, 0x03]).unwrap_err(),
            "the responder answered tryLater"
        );
    }
}
