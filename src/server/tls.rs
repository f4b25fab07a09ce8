//! TLS client connections: the handshake, under its own 10 s deadline, with the
//! generation's certificates. The stream it gives is `net::tls::TlsConn`, the same
//! transport the backend side uses.

use std::time::Duration;

use tokio::net::TcpStream;

use crate::net::identity::{PeerIdentity, TlsClient};
pub(crate) use crate::net::tls::TlsConn;
use crate::runtime::certs::Tls;
use crate::stats::{bump, COUNTERS};

/// How long a client has to finish the handshake.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What the handshake agreed on that the connection loop needs.
pub(crate) struct Handshaken {
    pub conn: TlsConn,
    /// ALPN chose HTTP/2.
    pub h2: bool,
    /// The handshake was made for a site that verifies client certificates: which,
    /// and the certificate the client showed.
    pub client: Option<std::sync::Arc<TlsClient>>,
    /// The protocol version agreed, as the access log names it.
    pub version: &'static str,
}

/// The handshake, with the one config — or, when a site limits its `http_versions`,
/// with the config whose ALPN offer is that site's, chosen by the ClientHello's SNI.
/// With `tls auto` sites, a ClientHello offering `acme-tls/1` for a name with a
/// TLS-ALPN-01 challenge pending is answered with the challenge certificate: `None`,
/// the connection has done its work.
async fn handshake(
    tls: &Tls,
    stream: TcpStream,
) -> std::io::Result<Option<tokio_rustls::server::TlsStream<TcpStream>>> {
    let plain = tls.per_site.is_none() && tls.acme.is_none() && !tls.on_demand;
    if plain && tls.certs.has_default() {
        return tokio_rustls::TlsAcceptor::from(tls.config.clone())
            .accept(stream)
            .await
            .map(Some);
    }
    let peer = stream.peer_addr().ok();
    let acceptor = rustls::server::Acceptor::default();
    let mut start = tokio_rustls::LazyConfigAcceptor::new(acceptor, stream).await?;
    let hello = start.client_hello();
    let sni = hello.server_name().map(str::to_string);
    let acme_challenge = tls.acme.is_some()
        && hello
            .alpn()
            .is_some_and(|mut offered| offered.any(|p| p == crate::acme::ACME_TLS_ALPN));
    if !acme_challenge && tls.certs.index(sni.as_deref()).is_none() {
        return Err(unrecognized(&mut start, peer, sni.as_deref()).await);
    }
    if let (Some(acme), true) = (&tls.acme, acme_challenge) {
        let name = sni.unwrap_or_default();
        let Some(ck) = acme.alpn_certificate(&name).await else {
            return Err(std::io::Error::other(format!(
                "acme-tls/1 for {name:?}, which has no challenge pending"
            )));
        };
        let mut s = start
            .into_stream(crate::acme::Manager::alpn_config(ck))
            .await?;
        tracing::debug!("sluice: acme: answered a tls-alpn-01 challenge for {name}");
        let _ = tokio::io::AsyncWriteExt::shutdown(&mut s).await;
        return Ok(None);
    }
    let config = tls.config_for(sni.as_deref()).clone();
    on_demand(tls, sni.as_deref()).await?;
    start.into_stream(config).await.map(Some)
}

/// A ClientHello for a name no site has a certificate for (or with no name, and no
/// `*` site with one): the `unrecognized_name` alert (RFC 6066 §3), which says what
/// happened (rustls's own refusal would be `access_denied`, which reads like an ACL),
/// and a line for the operator, at most one WARN a minute.
async fn unrecognized(
    start: &mut tokio_rustls::StartHandshake<TcpStream>,
    peer: Option<std::net::SocketAddr>,
    sni: Option<&str>,
) -> std::io::Error {
    static REFUSED: crate::throttle::Throttled = crate::throttle::Throttled::new();
    /// A plaintext alert record: fatal (2), unrecognized_name (112).
    const ALERT: [u8; 7] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 112];
    let io = &mut start.io;
    let _ = tokio::io::AsyncWriteExt::write_all(io, &ALERT).await;
    let _ = tokio::io::AsyncWriteExt::shutdown(io).await;
    let who = peer.map(|p| p.to_string()).unwrap_or_default();
    let what = match sni {
        Some(name) => format!("for {name:?}, which no site has a certificate for"),
        None => "without a server name (SNI: a client connecting by IP address)".to_string(),
    };
    REFUSED.warn(format_args!(
        "sluice: TLS handshake from {who} {what}: refused with unrecognized_name; a `site *` with a certificate serves such clients"
    ));
    std::io::Error::other(format!("unrecognized_name {what}"))
}

/// A name an on-demand site serves gets its certificate before the handshake goes on
/// (asked about, ordered, waited for); a refusal fails the handshake.
async fn on_demand(tls: &Tls, sni: Option<&str>) -> std::io::Result<()> {
    let Some(slot) = tls.certs.choose(sni) else {
        return Ok(());
    };
    let (Some((acme, ask)), Some(name)) = (&slot.on_demand, sni) else {
        return Ok(());
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    match acme.on_demand(&slot.site, ask, &name).await {
        Ok(_) => Ok(()),
        Err(why) => Err(std::io::Error::other(format!("on_demand: {why}"))),
    }
}

/// Runs the server handshake with the generation's certificates. `None`: the client
/// failed it, stalled past the deadline or left; counted, logged at debug only (a scan
/// of the port must not flood the log).
pub(crate) async fn accept(tls: &Tls, stream: TcpStream) -> Option<Handshaken> {
    let peer = stream.peer_addr().ok();
    let r = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(tls, stream)).await;
    let why = match r {
        Ok(Ok(None)) => return None,
        Ok(Ok(Some(s))) => {
            let session = s.get_ref().1;
            let h2 = session.alpn_protocol() == Some(b"h2");
            let client = tls.client_auth_site(session.server_name()).map(|slot| {
                std::sync::Arc::new(TlsClient {
                    site: slot.site.clone(),
                    cert: session
                        .peer_certificates()
                        .and_then(|c| c.first())
                        .map(|der| PeerIdentity::of(der)),
                })
            });
            let version = match session.protocol_version() {
                Some(rustls::ProtocolVersion::TLSv1_2) => "TLSv1.2",
                _ => "TLSv1.3",
            };
            return Some(Handshaken {
                conn: TlsConn::new(s),
                h2,
                client,
                version,
            });
        }
        Ok(Err(e)) => e.to_string(),
        Err(_) => "no handshake within 10s".to_string(),
    };
    bump(&COUNTERS.tls_handshake_failures);
    tracing::debug!(
        "sluice: TLS handshake with {} failed: {why}",
        peer.map(|p| p.to_string()).unwrap_or_default()
    );
    None
}
