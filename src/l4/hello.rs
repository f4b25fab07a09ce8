//! SNI passthrough on `tcp` listeners: the server name a TLS ClientHello asks for, read
//! without terminating TLS. The bytes read are kept and sent to the chosen backend
//! first, so the backend sees the handshake exactly as the client sent it.
//!
//! rustls's `Acceptor` parses the records (a ClientHello split across records or reads
//! is put together), so no TLS parser of sluice's own is needed; it is only asked for
//! the hello, never for a handshake.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// The most a ClientHello may take before the connection is closed.
pub(crate) const HELLO_MAX: usize = 16 * 1024;
/// How long the client has to send it.
pub(crate) const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// What the first bytes of a connection were.
#[derive(Debug)]
pub(crate) enum Hello {
    /// A ClientHello, with the server name it asks for (if any) and every byte read.
    Tls { sni: Option<String>, read: Bytes },
    /// Not a ClientHello, too large, too slow, or the client left: why.
    Refused(String),
}

/// Reads the connection's ClientHello, bounded by [`HELLO_MAX`] and [`HELLO_TIMEOUT`].
pub(crate) async fn read(stream: &mut TcpStream) -> Hello {
    match tokio::time::timeout(HELLO_TIMEOUT, read_unbounded(stream)).await {
        Ok(h) => h,
        Err(_) => Hello::Refused(format!(
            "no ClientHello within {}s",
            HELLO_TIMEOUT.as_secs()
        )),
    }
}

async fn read_unbounded(stream: &mut TcpStream) -> Hello {
    let mut acceptor = rustls::server::Acceptor::default();
    let mut read = BytesMut::with_capacity(2048);
    loop {
        if read.len() >= HELLO_MAX {
            return Hello::Refused(format!("no whole ClientHello in {HELLO_MAX} bytes"));
        }
        let before = read.len();
        match stream.read_buf(&mut read).await {
            Ok(0) => return Hello::Refused("closed before a whole ClientHello".into()),
            Ok(_) => {}
            Err(e) => return Hello::Refused(e.to_string()),
        }
        let mut new = &read[before..];
        while !new.is_empty() {
            if let Err(e) = acceptor.read_tls(&mut new) {
                return Hello::Refused(format!("not TLS: {e}"));
            }
        }
        match acceptor.accept() {
            Ok(Some(accepted)) => {
                let sni = accepted.client_hello().server_name().map(str::to_string);
                return Hello::Tls {
                    sni,
                    read: read.freeze(),
                };
            }
            Ok(None) => {}
            Err((e, _)) => return Hello::Refused(format!("not a ClientHello: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ClientHello made by rustls's client for `name`, as bytes on the wire.
    fn client_hello(name: &str) -> Vec<u8> {
        let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        let server = rustls::pki_types::ServerName::try_from(name.to_string()).unwrap();
        let mut conn = rustls::ClientConnection::new(std::sync::Arc::new(config), server).unwrap();
        let mut out = Vec::new();
        conn.write_tls(&mut out).unwrap();
        out
    }

    async fn pair() -> (TcpStream, TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        (c, l.accept().await.unwrap().0)
    }

    #[tokio::test]
    async fn the_server_name_is_read_from_a_hello_in_pieces() {
        use tokio::io::AsyncWriteExt;
        let hello = client_hello("db.example.com");
        let (mut c, mut s) = pair().await;
        let (a, b) = hello.split_at(7);
        let (a, b) = (a.to_vec(), b.to_vec());
        let sender = tokio::spawn(async move {
            c.write_all(&a).await.unwrap();
            tokio::time::sleep(Duration::from_millis(30)).await;
            c.write_all(&b).await.unwrap();
            c
        });
        match read(&mut s).await {
            Hello::Tls { sni, read } => {
                assert_eq!(sni.as_deref(), Some("db.example.com"));
                assert_eq!(&read[..], &hello[..]);
            }
            Hello::Refused(why) => panic!("{why}"),
        }
        drop(sender.await);
    }

    #[tokio::test]
    async fn what_is_not_a_hello_is_refused() {
        use tokio::io::AsyncWriteExt;
        let (mut c, mut s) = pair().await;
        c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        assert!(matches!(read(&mut s).await, Hello::Refused(_)));
    }
}
