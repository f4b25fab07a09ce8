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
use http_body_util::BodyExt;
use instant_acme::{BodyWrapper, BytesResponse, Error, HttpClient};
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;

/// No ACME request may take longer than this, connection included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

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
    mut req: Request<BodyWrapper<Bytes>>,
) -> Result<BytesResponse, Error> {
    let uri = req.uri().clone();
    let host = uri.host().ok_or_else(|| other(format!("{uri}: no host")))?;
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err(other(format!("{uri}: not an http(s) URL"))),
    };
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let tcp = TcpStream::connect((bare, port))
        .await
        .map_err(|e| other(format!("{host}:{port}: {e}")))?;
    tcp.set_nodelay(true).ok();
    // HTTP/1.1 wants the origin form and a Host field.
    let target = uri.path_and_query().map_or("/", |p| p.as_str());
    *req.uri_mut() = target.parse().map_err(other)?;
    let authority = uri.authority().map_or(host, |a| a.as_str()).to_string();
    req.headers_mut().insert(
        http::header::HOST,
        http::HeaderValue::from_str(&authority).map_err(other)?,
    );
    let resp = if https {
        let name = ServerName::try_from(bare.to_string()).map_err(other)?;
        let stream = tokio_rustls::TlsConnector::from(tls)
            .connect(name, tcp)
            .await
            .map_err(|e| other(format!("{host}:{port}: TLS: {e}")))?;
        exchange(hyper_util::rt::TokioIo::new(stream), req).await?
    } else {
        exchange(hyper_util::rt::TokioIo::new(tcp), req).await?
    };
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.map_err(other)?.to_bytes();
    Ok(BytesResponse::from(http::Response::from_parts(
        parts,
        http_body_util::Full::new(body),
    )))
}

async fn exchange<T>(
    io: T,
    req: Request<BodyWrapper<Bytes>>,
) -> Result<http::Response<hyper::body::Incoming>, Error>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(other)?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender.send_request(req).await.map_err(other)
}
