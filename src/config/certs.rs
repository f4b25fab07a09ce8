//! Certificate and key files: read, parsed and checked the same way by `sluice check`,
//! at start, on reload and when a file changes on disk.
//!
//! A pair is refused when a file cannot be read, holds no certificate or no key, the
//! key is of a kind rustls cannot sign with, or the key does not belong to the first
//! certificate. Every refusal names the file it is about. Dates are a warning
//! ([`dates_warning`]): an expired certificate is served as it is.
//!
//! The expiry check reads one field, the validity of the leaf certificate, with a
//! small DER walk ([`validity`]) instead of a full X.509 parser: a general parser would
//! bring several crates for the two dates sluice needs, and rustls itself does not
//! expose them.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

/// Why a certificate or key file was refused: the message (naming the file) and what
/// kind of problem it is, which decides the hint an operator gets.
#[derive(Debug)]
pub(crate) struct CertError {
    pub message: String,
    pub problem: Problem,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Problem {
    /// The file is not there or cannot be read.
    Unreadable,
    /// Not PEM, or no block of the kind expected.
    NotPem,
    /// A key rustls cannot sign with.
    UnusableKey,
    /// The key is not the certificate's.
    Mismatch,
    Expired,
    NotYetValid,
}

impl CertError {
    fn new(problem: Problem, message: String) -> CertError {
        CertError { message, problem }
    }

    /// What to do about it.
    pub(crate) fn hint(&self) -> &'static str {
        match self.problem {
            Problem::Unreadable => "check the path and its permissions; a relative path is from this config file's folder",
            Problem::NotPem => "give a PEM certificate chain (leaf first) and its PEM private key (PKCS#8, RSA or EC)",
            Problem::UnusableKey => "use an RSA, ECDSA P-256/P-384 or Ed25519 key in PEM",
            Problem::Mismatch => "the key must be the one the certificate was issued for: compare `openssl x509 -pubkey -noout -in CERT` with `openssl pkey -pubout -in KEY`",
            Problem::Expired => "renew the certificate and replace the file; sluice picks up the new one without a restart",
            Problem::NotYetValid => "check this machine's clock, or wait until the certificate's start date",
        }
    }
}

impl std::fmt::Display for CertError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Loads `cert` (a PEM chain, leaf first) and `key` (PKCS#8, PKCS#1 RSA or SEC1 EC) as
/// one signing identity. The message names the file at fault.
pub(crate) fn load_pair(cert: &Path, key: &Path) -> Result<Arc<CertifiedKey>, CertError> {
    let chain = load_chain(cert)?;
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => CertError::new(
            Problem::NotPem,
            format!(
                "{}: no private key in the file (expected a PEM `PRIVATE KEY` block)",
                key.display()
            ),
        ),
        e => pem_error(key, "cannot read the private key: ", e),
    })?;
    let signer = rustls::crypto::ring::sign::any_supported_type(&key_der).map_err(|e| {
        CertError::new(
            Problem::UnusableKey,
            format!("{}: not a usable private key ({e})", key.display()),
        )
    })?;
    let ck = CertifiedKey::new(chain, signer);
    ck.keys_match().map_err(|_| {
        CertError::new(
            Problem::Mismatch,
            format!(
                "{}: this key does not belong to the certificate in {}",
                key.display(),
                cert.display()
            ),
        )
    })?;
    if validity(&ck.cert[0]).is_none() {
        return Err(CertError::new(
            Problem::NotPem,
            format!(
                "{}: the first certificate cannot be read as X.509",
                cert.display()
            ),
        ));
    }
    Ok(Arc::new(ck))
}

/// The verifier of client certificates for `client_ca` (PEM roots) and `client_crl`
/// (PEM revocation lists): a certificate must chain to a root, be valid now and not
/// be revoked; `required` or not, one that is shown and fails fails the handshake.
pub(crate) fn client_verifier(
    ca: &Path,
    crls: &[std::path::PathBuf],
    required: bool,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, CertError> {
    use rustls::pki_types::CertificateRevocationListDer;
    let mut roots = rustls::RootCertStore::empty();
    for cert in load_chain(ca)? {
        roots.add(cert).map_err(|e| {
            CertError::new(
                Problem::NotPem,
                format!("{}: not a usable CA certificate ({e})", ca.display()),
            )
        })?;
    }
    let mut lists = Vec::new();
    for path in crls {
        lists.extend(pem_blocks::<CertificateRevocationListDer>(
            path,
            "revocation list",
            "X509 CRL",
        )?);
    }
    let provider = crate::net::tls::provider();
    let mut builder =
        rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
            .with_crls(lists)
            // A CA the lists do not cover is not refused for that.
            .allow_unknown_revocation_status();
    if !required {
        builder = builder.allow_unauthenticated();
    }
    builder.build().map_err(|e| {
        CertError::new(
            Problem::NotPem,
            format!("{}: cannot verify clients with it ({e})", ca.display()),
        )
    })
}

/// The PEM certificates of `path`, leaf first.
pub(crate) fn load_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, CertError> {
    pem_blocks(path, "certificate", "CERTIFICATE")
}

/// Every PEM block of one kind in `path` (`what`, the block's `label`): at least one.
fn pem_blocks<T: PemObject>(path: &Path, what: &str, label: &str) -> Result<Vec<T>, CertError> {
    let found = T::pem_file_iter(path)
        .map_err(|e| pem_error(path, "", e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(path, "", e))?;
    if found.is_empty() {
        return Err(CertError::new(
            Problem::NotPem,
            format!(
                "{}: no {what} in the file (expected PEM `{label}` blocks)",
                path.display()
            ),
        ));
    }
    Ok(found)
}

fn pem_error(path: &Path, what: &str, e: rustls::pki_types::pem::Error) -> CertError {
    match e {
        rustls::pki_types::pem::Error::Io(io) => CertError::new(
            Problem::Unreadable,
            format!("{}: {what}{io}", path.display()),
        ),
        other => CertError::new(
            Problem::NotPem,
            format!("{}: {what}not valid PEM ({other:?})", path.display()),
        ),
    }
}

/// How close to its end a certificate is worth a warning.
pub(crate) const EXPIRY_WARNING: Duration = Duration::from_secs(14 * 24 * 3600);

/// What is wrong with the leaf's dates at `now`, if anything: expired, not valid yet,
/// or expiring within [`EXPIRY_WARNING`]. A warning, not a refusal: the certificate is
/// served as it is (an expired one still beats no site at all), and `check --strict`
/// makes it an error.
pub(crate) fn dates_warning(
    path: &Path,
    leaf: &CertificateDer<'_>,
    now: SystemTime,
) -> Option<CertError> {
    let (not_before, not_after) = validity(leaf)?;
    if now > not_after {
        return Some(CertError::new(
            Problem::Expired,
            format!(
                "{}: the certificate expired on {}; serving it anyway",
                path.display(),
                httpdate::fmt_http_date(not_after)
            ),
        ));
    }
    if now < not_before {
        return Some(CertError::new(
            Problem::NotYetValid,
            format!(
                "{}: the certificate is not valid until {}; serving it anyway",
                path.display(),
                httpdate::fmt_http_date(not_before)
            ),
        ));
    }
    if not_after.duration_since(now).unwrap_or_default() < EXPIRY_WARNING {
        return Some(CertError::new(
            Problem::Expired,
            format!(
                "{}: the certificate expires on {}, in less than 14 days",
                path.display(),
                httpdate::fmt_http_date(not_after)
            ),
        ));
    }
    None
}

/// `notBefore` and `notAfter` of a DER certificate: Certificate ::= SEQUENCE {
/// tbsCertificate SEQUENCE { [0] version OPTIONAL, serialNumber, signature, issuer,
/// validity SEQUENCE { notBefore, notAfter }, ... }, ... }.
pub(crate) fn validity(der: &[u8]) -> Option<(SystemTime, SystemTime)> {
    let (tag, cert, _) = tlv(der)?;
    if tag != 0x30 {
        return None;
    }
    let (tag, mut tbs, _) = tlv(cert)?;
    if tag != 0x30 {
        return None;
    }
    // Optional explicit version, then serial, signature algorithm and issuer.
    let (tag, _, rest) = tlv(tbs)?;
    if tag == 0xa0 {
        tbs = rest;
    }
    for _ in 0..3 {
        tbs = tlv(tbs)?.2;
    }
    let (tag, validity, _) = tlv(tbs)?;
    if tag != 0x30 {
        return None;
    }
    let (t1, before, rest) = tlv(validity)?;
    let (t2, after, _) = tlv(rest)?;
    Some((time(t1, before)?, time(t2, after)?))
}

/// One DER tag-length-value: (tag, value, what follows).
fn tlv(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let tag = *b.first()?;
    let first = *b.get(1)? as usize;
    let (len, start) = if first < 0x80 {
        (first, 2)
    } else {
        let n = first & 0x7f;
        if n == 0 || n > 4 {
            return None;
        }
        let mut len = 0usize;
        for i in 0..n {
            len = (len << 8) | *b.get(2 + i)? as usize;
        }
        (len, 2 + n)
    };
    let end = start.checked_add(len)?;
    Some((tag, b.get(start..end)?, b.get(end..)?))
}

/// UTCTime (`YYMMDDHHMMSSZ`, years 1950..2049) or GeneralizedTime (`YYYYMMDDHHMMSSZ`).
fn time(tag: u8, v: &[u8]) -> Option<SystemTime> {
    let s = std::str::from_utf8(v).ok()?.strip_suffix('Z')?;
    if !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (year, rest) = match tag {
        0x17 if s.len() == 12 => {
            let yy: i64 = s[..2].parse().ok()?;
            (if yy < 50 { 2000 + yy } else { 1900 + yy }, &s[2..])
        }
        0x18 if s.len() == 14 => (s[..4].parse().ok()?, &s[4..]),
        _ => return None,
    };
    let n = |i: usize| -> Option<i64> { rest.get(i..i + 2)?.parse().ok() };
    let (month, day, h, m, sec) = (n(0)?, n(2)?, n(4)?, n(6)?, n(8)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || h > 23 || m > 59 || sec > 60 {
        return None;
    }
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + h * 3600 + m * 60 + sec;
    if secs >= 0 {
        Some(UNIX_EPOCH + Duration::from_secs(secs as u64))
    } else {
        Some(UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()))
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_days() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_from_civil(2026, 12, 1), 20_788);
    }

    #[test]
    fn times() {
        let t = time(0x17, b"261201133000Z").unwrap();
        assert_eq!(httpdate::fmt_http_date(t), "Tue, 01 Dec 2026 13:30:00 GMT");
        let t = time(0x18, b"20500101000000Z").unwrap();
        assert_eq!(httpdate::fmt_http_date(t), "Sat, 01 Jan 2050 00:00:00 GMT");
        assert!(time(0x17, b"261301133000Z").is_none());
        assert!(time(0x17, b"2612011330Z").is_none());
        assert!(time(0x17, "aé234567890Z".as_bytes()).is_none());
        assert!(time(0x18, b"2026+201133000Z").is_none());
    }

    #[test]
    fn truncated_der_is_refused() {
        assert!(validity(&[]).is_none());
        assert!(validity(&[0x30, 0x82, 0xff]).is_none());
        assert!(validity(&[0x30, 0x03, 0x30, 0x01]).is_none());
    }
}
