//! One request sluice makes of its own accord, on a connection of its own: an ACME
//! call, an OCSP query, a trace export, a JWKS fetch. Each is rare (seconds to months
//! apart), so nothing is pooled: connect, send, read the answer under a cap, close.
//! HTTP/1.1 through hyper; TLS through the rustls configuration the caller trusts.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::BodyExt as _;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Sends `req` (an absolute `http://` or `https://` URI) and reads the answer's body up
/// to `limit` bytes. `tls` verifies an `https://` server; without it only `http://` is
/// reachable. The caller bounds the whole exchange in time. `Err` says, for a log line,
/// what failed: the connection, the handshake, the exchange or the body.
pub(crate) async fn send<B>(
    mut req: http::Request<B>,
    tls: Option<&Arc<rustls::ClientConfig>>,
    limit: usize,
) -> Result<http::Response<Bytes>, String>
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let uri = req.uri().clone();
    let host = uri.host().ok_or_else(|| format!("{uri}: no host"))?;
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err(format!("{uri}: not an http(s) URL")),
    };
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let tcp = TcpStream::connect((bare, port))
        .await
        .map_err(|e| format!("cannot connect to {host}:{port}: {e}"))?;
    tcp.set_nodelay(true).ok();
    // HTTP/1.1 wants the origin form and a Host field.
    let target = uri.path_and_query().map_or("/", |p| p.as_str());
    *req.uri_mut() = target.parse().map_err(|e| format!("{uri}: {e}"))?;
    if !req.headers().contains_key(http::header::HOST) {
        let authority = uri.authority().map_or(host, |a| a.as_str());
        let value = http::HeaderValue::from_str(authority).map_err(|e| e.to_string())?;
        req.headers_mut().insert(http::header::HOST, value);
    }
    let resp = if https {
        let tls = tls.ok_or_else(|| format!("{uri}: https is not offered here"))?;
        let name = ServerName::try_from(bare.to_string()).map_err(|e| e.to_string())?;
        let stream = tokio_rustls::TlsConnector::from(tls.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| format!("{host}:{port}: TLS: {e}"))?;
        exchange(hyper_util::rt::TokioIo::new(stream), req).await?
    } else {
        exchange(hyper_util::rt::TokioIo::new(tcp), req).await?
    };
    let (parts, body) = resp.into_parts();
    let body = http_body_util::Limited::new(body, limit)
        .collect()
        .await
        .map_err(|e| format!("the answer broke off or passed {limit} bytes: {e}"))?
        .to_bytes();
    Ok(http::Response::from_parts(parts, body))
}

async fn exchange<T, B>(
    io: T,
    req: http::Request<B>,
) -> Result<http::Response<hyper::body::Incoming>, String>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender.send_request(req).await.map_err(|e| e.to_string())
}
