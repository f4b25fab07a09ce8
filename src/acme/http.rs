//! The ACME client's HTTP: one connection a request (an order makes a dozen small
//! requests minutes or months apart, so nothing is kept), TLS through the same rustls
//! and ring the rest of sluice uses, trusting the system's roots and `ca_root`.
//!
//! Ours rather than the `instant-acme` default: that one brings a second HTTP client,
//! another root store and the platform verifier for a few requests.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use instant_acme::{BodyWrapper, BytesResponse, Error, HttpClient};
use rustls::pki_types::CertificateDer;

/// No ACME request may take longer than this, connection included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The largest answer read: a certificate chain, a directory, an order.
const MAX_RESPONSE: usize = 1024 * 1024;

#[derive(Clone)]
pub(crate) struct Client {
    tls: Arc<rustls::ClientConfig>,
}

impl Client {
    /// Trusts the system's roots and `extra` (the `ca_root` file's certificates).
    pub(crate) fn new(extra: &[CertificateDer<'static>]) -> Client {
        let mut roots = (*crate::upstream::tls::system_roots()).clone();
        roots.add_parsable_certificates(extra.iter().cloned());
        let tls = crate::upstream::tls::verifying(roots);
        Client { tls: Arc::new(tls) }
    }
}

fn other(why: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Error {
    Error::Other(why.into())
}

impl HttpClient for Client {
    fn request(
        &self,
        req: Request<BodyWrapper<Bytes>>,
    ) -> Pin<Box<dyn Future<Output = Result<BytesResponse, Error>> + Send>> {
        let tls = self.tls.clone();
        Box::pin(async move {
            match tokio::time::timeout(REQUEST_TIMEOUT, send(tls, req)).await {
                Ok(r) => r,
                Err(_) => Err(other(format!(
                    "no answer within {}s",
                    REQUEST_TIMEOUT.as_secs()
                ))),
            }
        })
    }
}

async fn send(
    tls: Arc<rustls::ClientConfig>,
    req: Request<BodyWrapper<Bytes>>,
) -> Result<BytesResponse, Error> {
    let resp = crate::net::fetch::send(req, Some(&tls), MAX_RESPONSE)
        .await
        .map_err(other)?;
    Ok(BytesResponse::from(resp.map(http_body_util::Full::new)))
}
