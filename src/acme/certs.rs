//! The certificates sluice makes itself for ACME: the CSR and key of an order, the
//! self-signed placeholder a site serves until its first certificate arrives, and the
//! TLS-ALPN-01 challenge certificate (RFC 8737); and reading a stored pair back.

use std::sync::Arc;
use std::time::SystemTime;

use rcgen::{CertificateParams, CustomExtension, DistinguishedName, DnType, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::sign::CertifiedKey;
use x509_cert::der::Decode as _;
use x509_cert::ext::pkix::name::GeneralName;
use x509_cert::ext::pkix::SubjectAltName;

use super::store::Stored;

/// The placeholder's subject, so a client (and a test) can tell it from a real one.
pub(crate) const PLACEHOLDER_CN: &str = "sluice placeholder (certificate pending)";

fn signed(key: &KeyPair, der: CertificateDer<'static>) -> Result<Arc<CertifiedKey>, String> {
    let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let signer =
        rustls::crypto::ring::sign::any_supported_type(&key_der).map_err(|e| e.to_string())?;
    Ok(Arc::new(CertifiedKey::new(vec![der], signer)))
}

/// A self-signed certificate for `names`, valid from an hour ago for a day.
fn self_signed(
    names: &[String],
    cn: &str,
    extra: Vec<CustomExtension>,
) -> Result<Arc<CertifiedKey>, String> {
    let key = KeyPair::generate().map_err(|e| e.to_string())?;
    let mut params = CertificateParams::new(names.to_vec()).map_err(|e| e.to_string())?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    params.distinguished_name = dn;
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(1);
    params.custom_extensions = extra;
    let cert = params.self_signed(&key).map_err(|e| e.to_string())?;
    signed(&key, cert.der().clone())
}

/// What a `tls auto` site serves before its first certificate exists. Valid for a day
/// (made again at each start): while it serves, the certificate expiry metric says the
/// site's certificate ends within a day, which the usual alert catches.
pub(crate) fn placeholder(names: &[String]) -> Arc<CertifiedKey> {
    self_signed(names, PLACEHOLDER_CN, Vec::new())
        .expect("rcgen makes a certificate for names the config accepted")
}

/// The TLS-ALPN-01 answer for `name`: self-signed, with the `acmeIdentifier`
/// extension holding the SHA-256 digest of the key authorization.
pub(crate) fn alpn_challenge(name: &str, digest: &[u8]) -> Result<Arc<CertifiedKey>, String> {
    let ext = CustomExtension::new_acme_identifier(digest);
    self_signed(&[name.to_string()], name, vec![ext])
}

/// A fresh key and the CSR (DER) for `names`; the key's PEM to store with the
/// certificate.
pub(crate) fn request(names: &[String]) -> Result<(Vec<u8>, String), String> {
    let key = KeyPair::generate().map_err(|e| e.to_string())?;
    let mut params = CertificateParams::new(names.to_vec()).map_err(|e| e.to_string())?;
    params.distinguished_name = DistinguishedName::new();
    let csr = params.serialize_request(&key).map_err(|e| e.to_string())?;
    Ok((csr.der().to_vec(), key.serialize_pem()))
}

/// A stored pair as rustls serves it.
pub(crate) fn certified(s: &Stored) -> Result<Arc<CertifiedKey>, String> {
    let chain = CertificateDer::pem_slice_iter(s.chain.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("certificate: {e:?}"))?;
    if chain.is_empty() {
        return Err("no certificate in the stored chain".into());
    }
    let key = PrivateKeyDer::from_pem_slice(s.key.as_bytes()).map_err(|e| format!("key: {e:?}"))?;
    let signer = rustls::crypto::ring::sign::any_supported_type(&key).map_err(|e| e.to_string())?;
    let ck = CertifiedKey::new(chain, signer);
    ck.keys_match()
        .map_err(|_| "the stored key does not belong to the certificate".to_string())?;
    Ok(Arc::new(ck))
}

/// The DNS names a certificate is for (its subjectAltName).
pub(crate) fn names_of(der: &[u8]) -> Vec<String> {
    let Ok(cert) = x509_cert::Certificate::from_der(der) else {
        return Vec::new();
    };
    cert.tbs_certificate
        .get::<SubjectAltName>()
        .ok()
        .flatten()
        .map(|(_, san)| {
            san.0
                .iter()
                .filter_map(|n| match n {
                    GeneralName::DnsName(s) => Some(s.to_string().to_ascii_lowercase()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// When to renew a certificate valid from `before` to `after`: `renew_before` ahead of
/// its end or at 2/3 of its lifetime, whichever is earlier, but never before 1/3 of
/// it has passed (a short-lived certificate is not renewed on every wake).
pub(crate) fn renew_at(
    before: SystemTime,
    after: SystemTime,
    renew_before: std::time::Duration,
) -> SystemTime {
    let life = after.duration_since(before).unwrap_or_default();
    let by_margin = after.checked_sub(renew_before).unwrap_or(before);
    let by_fraction = before + life * 2 / 3;
    let earliest = before + life / 3;
    by_margin.min(by_fraction).max(earliest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const DAY: Duration = Duration::from_secs(86_400);

    #[test]
    fn renewal_takes_the_earlier_rule_but_not_before_a_third() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        // 90 days, 30 days ahead: day 60 (= 2/3 too).
        assert_eq!(renew_at(t0, t0 + 90 * DAY, 30 * DAY), t0 + 60 * DAY);
        // 90 days, 10 days ahead: 2/3 is earlier.
        assert_eq!(renew_at(t0, t0 + 90 * DAY, 10 * DAY), t0 + 60 * DAY);
        // 90 days, 80 days ahead: day 10 is before a third, so day 30.
        assert_eq!(renew_at(t0, t0 + 90 * DAY, 80 * DAY), t0 + 30 * DAY);
        // 30 s with the 30-day default: at 10 s.
        let s = Duration::from_secs(30);
        assert_eq!(renew_at(t0, t0 + s, 30 * DAY), t0 + Duration::from_secs(10));
    }

    #[test]
    fn made_certificates_carry_their_names_and_read_back() {
        let names = vec!["a.test".to_string(), "b.test".to_string()];
        let p = placeholder(&names);
        assert_eq!(names_of(&p.cert[0]), names);
        let (csr, key) = request(&names).unwrap();
        assert!(!csr.is_empty() && key.contains("PRIVATE KEY"));
        let ch = alpn_challenge("a.test", &[7u8; 32]).unwrap();
        assert_eq!(names_of(&ch.cert[0]), vec!["a.test".to_string()]);
    }
}
