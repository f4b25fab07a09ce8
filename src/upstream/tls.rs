//! TLS to `https://` backends: the client settings a pool's connections share, and the
//! handshake after the TCP connect.
//!
//! Verification is on by default, against the system's roots (read once, the first
//! time a pool needs them) or the pool's `tls_ca`. The name checked — and sent as SNI
//! — is `tls_server_name`, else the address's host; an IP address is checked against
//! the certificate's IP entries and sends no SNI. `tls_verify off` still checks the
//! handshake's signatures, only not the certificate's chain or name.
//!
//! ALPN offers `h2` then `http/1.1`; the backend's choice decides how the connection
//! is used. Upgrades (WebSockets) offer only `http/1.1`.

use std::sync::{Arc, OnceLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::config::{BackendTls, Target};

/// A pool's TLS client settings: one for requests (ALPN h2, http/1.1), one for
/// upgrades and health probes (ALPN http/1.1 only).
pub(crate) struct ClientTls {
    pub any: Arc<ClientConfig>,
    pub h1: Arc<ClientConfig>,
    server_name: Option<ServerName<'static>>,
}

/// The system's trust roots, read once.
pub(crate) fn system_roots() -> Arc<RootCertStore> {
    static ROOTS: OnceLock<Arc<RootCertStore>> = OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let found = rustls_native_certs::load_native_certs();
            for e in &found.errors {
                tracing::warn!("sluice: reading the system's trust roots: {e}");
            }
            let mut roots = RootCertStore::empty();
            let (_, bad) = roots.add_parsable_certificates(found.certs);
            if roots.is_empty() {
                tracing::warn!(
                    "sluice: no system trust roots found ({bad} unusable): https:// backends will fail verification unless a pool sets tls_ca or tls_verify off"
                );
            }
            Arc::new(roots)
        })
        .clone()
}

/// A client config verifying servers against `roots` (TLS 1.3 and 1.2, ring, no
/// client certificate): what the ACME client and the trace exporter use too.
/// A client config trusting the system's roots, made once: what sluice's own requests
/// to an `https://` service use (a trace collector, a JWKS).
pub(crate) fn system_client() -> Arc<ClientConfig> {
    static CLIENT: OnceLock<Arc<ClientConfig>> = OnceLock::new();
    CLIENT
        .get_or_init(|| Arc::new(verifying(system_roots())))
        .clone()
}

pub(crate) fn verifying(roots: impl Into<Arc<RootCertStore>>) -> ClientConfig {
    ClientConfig::builder_with_provider(crate::net::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .expect("ring supports TLS 1.2 and 1.3")
        .with_root_certificates(roots)
        .with_no_client_auth()
}

impl ClientTls {
    pub(crate) fn new(t: &BackendTls) -> ClientTls {
        let builder = ClientConfig::builder_with_provider(crate::net::tls::provider())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .expect("ring supports TLS 1.2 and 1.3");
        let base = if !t.verify {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NoVerify))
                .with_no_client_auth()
        } else if t.ca.is_some() {
            let mut roots = RootCertStore::empty();
            roots.add_parsable_certificates(
                t.ca_certs.iter().map(|d| CertificateDer::from(d.clone())),
            );
            builder.with_root_certificates(roots).with_no_client_auth()
        } else {
            builder
                .with_root_certificates(system_roots())
                .with_no_client_auth()
        };
        let mut any = base.clone();
        any.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let mut h1 = base;
        h1.alpn_protocols = vec![b"http/1.1".to_vec()];
        ClientTls {
            any: Arc::new(any),
            h1: Arc::new(h1),
            server_name: t
                .server_name
                .as_deref()
                .and_then(|n| ServerName::try_from(n.to_string()).ok()),
        }
    }

    fn name_for(&self, target: &Target) -> Option<ServerName<'static>> {
        if let Some(n) = &self.server_name {
            return Some(n.clone());
        }
        match target {
            Target::Tcp { host, .. } => ServerName::try_from(host.clone()).ok(),
            Target::Unix(_) => ServerName::try_from("localhost").ok(),
        }
    }

    /// The client handshake over a connected socket. `h1_only`: offer only
    /// `http/1.1`. The error says what failed, for the log line naming the peer.
    pub(crate) async fn handshake(
        &self,
        tcp: TcpStream,
        target: &Target,
        h1_only: bool,
    ) -> Result<TlsStream<TcpStream>, String> {
        let name = self
            .name_for(target)
            .ok_or_else(|| "no server name to verify the certificate against".to_string())?;
        let config = if h1_only { &self.h1 } else { &self.any };
        tokio_rustls::TlsConnector::from(config.clone())
            .connect(name, tcp)
            .await
            .map_err(
                |e| match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
                    Some(tls) => format!("TLS handshake failed: {tls}"),
                    None => format!("TLS handshake failed: {e}"),
                },
            )
    }
}

/// `tls_verify off`: any certificate, any name; signatures still checked.
#[derive(Debug)]
struct NoVerify;

impl ServerCertVerifier for NoVerify {
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
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &crate::net::tls::provider().signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &crate::net::tls::provider().signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        crate::net::tls::provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}
