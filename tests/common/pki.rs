//! Certificates made by the test (rcgen): a CA, leaves it signs, and rustls client
//! settings that trust it (or, to read which certificate a server chose, trust anything
//! and let the test compare the certificate itself).

use std::net::SocketAddr;
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A leaf certificate and its key, as PEM, and the certificate's DER to compare with
/// what a server presents.
#[derive(Clone)]
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
    pub der: Vec<u8>,
}

impl Ca {
    pub fn new() -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "sluice test CA");
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Ca { issuer }
    }

    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A leaf for `names` (DNS names or IP addresses), valid from yesterday for a year.
    pub fn leaf(&self, names: &[&str]) -> Leaf {
        let now = time::OffsetDateTime::now_utc();
        self.leaf_valid(
            names,
            now - time::Duration::days(1),
            now + time::Duration::days(365),
        )
    }

    pub fn leaf_valid(
        &self,
        names: &[&str],
        not_before: time::OffsetDateTime,
        not_after: time::OffsetDateTime,
    ) -> Leaf {
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(names.clone()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, names[0].as_str());
        params.not_before = not_before;
        params.not_after = not_after;
        self.sign(params)
    }

    /// A fresh key, and `params` signed by this CA.
    fn sign(&self, params: CertificateParams) -> Leaf {
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().to_vec(),
        }
    }

    /// A client certificate (`clientAuth`) with subject `CN=cn,O=org`, the SANs
    /// given (DNS names, or `email:…`), `serial` and validity.
    pub fn client_leaf(
        &self,
        cn: &str,
        sans: &[&str],
        serial: u64,
        not_after: time::OffsetDateTime,
    ) -> Leaf {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "Example");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        for san in sans {
            params
                .subject_alt_names
                .push(match san.strip_prefix("email:") {
                    Some(e) => rcgen::SanType::Rfc822Name(e.to_string().try_into().unwrap()),
                    None => rcgen::SanType::DnsName(san.to_string().try_into().unwrap()),
                });
        }
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        params.serial_number = Some(rcgen::SerialNumber::from(serial));
        params.not_before = time::OffsetDateTime::now_utc() - time::Duration::days(30);
        params.not_after = not_after;
        self.sign(params)
    }

    /// A PEM revocation list naming `serials`.
    pub fn crl(&self, serials: &[u64]) -> String {
        let now = time::OffsetDateTime::now_utc();
        let params = rcgen::CertificateRevocationListParams {
            this_update: now - time::Duration::days(1),
            next_update: now + time::Duration::days(30),
            crl_number: rcgen::SerialNumber::from(1u64),
            issuing_distribution_point: None,
            revoked_certs: serials
                .iter()
                .map(|s| rcgen::RevokedCertParams {
                    serial_number: rcgen::SerialNumber::from(*s),
                    revocation_time: now - time::Duration::hours(1),
                    reason_code: Some(rcgen::RevocationReason::KeyCompromise),
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: rcgen::KeyIdMethod::Sha256,
        };
        params.signed_by(&self.issuer).unwrap().pem().unwrap()
    }

    /// Client settings that trust this CA and show `cert` (or no certificate).
    pub fn client_with(&self, cert: Option<&Leaf>) -> Arc<rustls::ClientConfig> {
        let b = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(self.roots());
        let mut c = match cert {
            Some(l) => {
                use rustls::pki_types::pem::PemObject;
                let chain = vec![CertificateDer::from(l.der.clone())];
                let key =
                    rustls::pki_types::PrivateKeyDer::from_pem_slice(l.key_pem.as_bytes()).unwrap();
                b.with_client_auth_cert(chain, key).unwrap()
            }
            None => b.with_no_client_auth(),
        };
        c.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(c)
    }

    pub fn roots(&self) -> rustls::RootCertStore {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.issuer.der().clone()).unwrap();
        roots
    }

    /// Client settings that trust this CA, offering `alpn`.
    pub fn client(&self, alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
        let mut c = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(self.roots())
            .with_no_client_auth();
        c.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(c)
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Client settings that accept any certificate (signatures still checked), so a test
/// can see which certificate a server chose, with or without SNI.
pub fn any_cert_client(alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
    client_trusting(AnyCert { signatures: true }, alpn)
}

/// What an ACME server's TLS-ALPN-01 validator does: accept the certificate without
/// parsing it for the handshake (its critical `acmeIdentifier` extension is one no web
/// PKI verifier takes), so the test can look at it itself.
pub fn blind_client(alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
    client_trusting(AnyCert { signatures: false }, alpn)
}

fn client_trusting(v: AnyCert, alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
    let mut c = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(v))
        .with_no_client_auth();
    c.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(c)
}

/// Connects with `sni` as the server name (`None`: an IP address, so no SNI is sent).
pub async fn connect(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    sni: Option<&str>,
) -> std::io::Result<TlsStream<TcpStream>> {
    let name = match sni {
        Some(n) => ServerName::try_from(n.to_string()).unwrap(),
        None => ServerName::IpAddress(addr.ip().into()),
    };
    let tcp = TcpStream::connect(addr).await?;
    tokio::time::timeout(
        super::WAIT,
        tokio_rustls::TlsConnector::from(config).connect(name, tcp),
    )
    .await
    .map_err(|_| std::io::Error::other("handshake timed out"))?
}

/// `raw` (a whole HTTP/1.1 request, `Connection: close`) over a new TLS connection
/// trusting `ca` (SNI `host`, ALPN http/1.1), and what came back until the close (which
/// may come without a close_notify), within [`super::WAIT`].
pub async fn tls_exchange(addr: SocketAddr, ca: &Ca, host: &str, raw: &[u8]) -> Vec<u8> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = connect(addr, ca.client(&[b"http/1.1"]), Some(host))
        .await
        .unwrap();
    s.write_all(raw).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(super::WAIT, s.read_to_end(&mut out)).await;
    out
}

/// The DER of the certificate the server presented.
pub fn presented(s: &TlsStream<TcpStream>) -> Vec<u8> {
    s.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

/// Accepts any certificate; checks the handshake's signature with it unless told not
/// to.
#[derive(Debug)]
struct AnyCert {
    signatures: bool,
}

impl ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        if !self.signatures {
            return Ok(HandshakeSignatureValid::assertion());
        }
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &provider().signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        if !self.signatures {
            return Ok(HandshakeSignatureValid::assertion());
        }
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &provider().signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}
