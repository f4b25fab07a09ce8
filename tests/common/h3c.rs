//! An HTTP/3 client for tests: `quinn` + `h3`, as a browser's QUIC stack would speak
//! to sluice's `quic` listener.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Buf, Bytes};

/// One QUIC connection with its HTTP/3 request sender.
pub struct H3 {
    pub endpoint: quinn::Endpoint,
    pub conn: quinn::Connection,
    pub send: h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>,
    /// Resolves with the connection's end (its error, `H3_NO_ERROR` for a clean one).
    pub closed: tokio::task::JoinHandle<h3::error::ConnectionError>,
}

/// A response read whole.
#[derive(Debug)]
pub struct H3Resp {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Vec<u8>,
}

impl H3Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A QUIC endpoint for clients, on a loopback UDP port of its own.
pub fn client_endpoint(tls: Arc<rustls::ClientConfig>) -> quinn::Endpoint {
    let mut tls = (*tls).clone();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(Arc::new(tls)).unwrap();
    let mut e = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    e.set_default_client_config(quinn::ClientConfig::new(Arc::new(crypto)));
    e
}

/// Connects to `addr` over QUIC with `server_name` as SNI, and starts HTTP/3.
pub async fn connect(
    addr: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
    server_name: &str,
) -> Result<H3, String> {
    let endpoint = client_endpoint(tls);
    let connecting = endpoint
        .connect(addr, server_name)
        .map_err(|e| e.to_string())?;
    let conn = tokio::time::timeout(super::WAIT, connecting)
        .await
        .map_err(|_| "no QUIC handshake in time".to_string())?
        .map_err(|e| e.to_string())?;
    let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(conn.clone()))
        .await
        .map_err(|e| e.to_string())?;
    let closed =
        tokio::spawn(async move { std::future::poll_fn(|cx| driver.poll_close(cx)).await });
    Ok(H3 {
        endpoint,
        conn,
        send,
        closed,
    })
}

impl H3 {
    /// Sends `req` with `body` (nothing when empty) and reads the whole response.
    pub async fn request(&mut self, req: http::Request<()>, body: Bytes) -> Result<H3Resp, String> {
        let mut stream = self
            .send
            .send_request(req)
            .await
            .map_err(|e| e.to_string())?;
        if !body.is_empty() {
            stream.send_data(body).await.map_err(|e| e.to_string())?;
        }
        stream.finish().await.map_err(|e| e.to_string())?;
        let resp = stream.recv_response().await.map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        while let Some(mut chunk) = stream.recv_data().await.map_err(|e| e.to_string())? {
            let n = chunk.remaining();
            out.extend_from_slice(&chunk.copy_to_bytes(n));
        }
        Ok(H3Resp {
            status: resp.status().as_u16(),
            headers: resp.headers().clone(),
            body: out,
        })
    }

    /// `GET https://HOST/PATH`.
    pub async fn get(&mut self, host: &str, path: &str) -> Result<H3Resp, String> {
        let req = http::Request::get(format!("https://{host}{path}"))
            .body(())
            .unwrap();
        self.request(req, Bytes::new()).await
    }
}
