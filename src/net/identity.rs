//! A verified client certificate (mTLS), as requests see it: its subject (RFC 4514),
//! its subject alternative names and its SHA-256 fingerprint. Read once per connection,
//! right after the handshake verified the certificate, with `x509-cert` (a DER decoder
//! for the two fields; rustls does not expose them).

use x509_cert::der::Decode as _;
use x509_cert::ext::pkix::name::GeneralName;
use x509_cert::ext::pkix::SubjectAltName;

/// What a TLS connection's client proved, for the site whose handshake verified it.
#[derive(Debug)]
pub(crate) struct TlsClient {
    /// The site whose certificate (and client CA) served the handshake.
    pub site: String,
    /// The verified client certificate; `None` under `client_auth optional` without one.
    pub cert: Option<PeerIdentity>,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct PeerIdentity {
    /// RFC 4514, most specific first (`CN=alice,O=Example`); bytes outside printable
    /// ASCII as `\XX`.
    pub subject: String,
    /// DNS names, e-mail addresses, URIs and IP addresses, joined by `, `; a `,` or `\`
    /// inside an entry is written `\,` / `\\` (DESIGN §18.2), so one name can never
    /// read as two.
    pub san: String,
    /// SHA-256 of the DER, lower-case hex.
    pub fingerprint: String,
}

impl PeerIdentity {
    /// The identity in a DER certificate (one rustls verified: a field that does not
    /// decode is left empty rather than refusing what was already accepted).
    pub(crate) fn of(der: &[u8]) -> PeerIdentity {
        let digest = ring::digest::digest(&ring::digest::SHA256, der);
        let mut fingerprint = String::with_capacity(64);
        for b in digest.as_ref() {
            fingerprint.push_str(&format!("{b:02x}"));
        }
        let Ok(cert) = x509_cert::Certificate::from_der(der) else {
            return PeerIdentity {
                fingerprint,
                ..PeerIdentity::default()
            };
        };
        let tbs = &cert.tbs_certificate;
        let san = tbs
            .get::<SubjectAltName>()
            .ok()
            .flatten()
            .map(|(_, names)| {
                names
                    .0
                    .iter()
                    .filter_map(general_name)
                    .map(|n| ascii(&escape_entry(&n)))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
            .join(", ");
        PeerIdentity {
            subject: ascii(&tbs.subject.to_string()),
            san,
            fingerprint,
        }
    }
}

/// One SAN entry with its `\` and `,` escaped, so the list splits where it was joined.
fn escape_entry(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        if c == '\\' || c == ',' {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// `s` with every byte outside printable ASCII written `\XX` (RFC 4514's hex escape),
/// so the identity always fits a header field: a value that could not be set would
/// leave the client's own field of that name in its place.
fn ascii(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if (0x20..0x7f).contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("\\{b:02X}"));
        }
    }
    out
}

fn general_name(n: &GeneralName) -> Option<String> {
    match n {
        GeneralName::DnsName(s) => Some(s.to_string()),
        GeneralName::Rfc822Name(s) => Some(s.to_string()),
        GeneralName::UniformResourceIdentifier(s) => Some(s.to_string()),
        GeneralName::IpAddress(octets) => {
            let b = octets.as_bytes();
            match b.len() {
                4 => Some(std::net::Ipv4Addr::new(b[0], b[1], b[2], b[3]).to_string()),
                16 => <[u8; 16]>::try_from(b)
                    .ok()
                    .map(|a| std::net::Ipv6Addr::from(a).to_string()),
                _ => None,
            }
        }
        _ => None,
    }
}
