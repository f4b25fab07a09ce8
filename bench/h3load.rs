//! A small HTTP/3 load generator for `bench/bench.py`'s `h3-13B` scenario (nothing
//! packaged for Debian speaks HTTP/3 under load): `-c` QUIC connections with `-m`
//! requests in flight on each, for `-D` seconds, on one thread so it can be pinned to
//! a core of its own like h2load. Prints h2load's summary lines.
//!
//! Usage: `h3load ADDR PATH [-c 16] [-m 8] [-D 4] [--host NAME]` (the certificate is
//! not verified: the benchmark's is self-signed).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};

struct Args {
    addr: SocketAddr,
    path: String,
    conns: usize,
    streams: usize,
    duration: Duration,
    host: String,
}

fn args() -> Args {
    let mut it = std::env::args().skip(1);
    let usage = "usage: h3load ADDR PATH [-c N] [-m N] [-D SECS] [--host NAME]";
    let addr = it.next().and_then(|a| a.parse().ok()).expect(usage);
    let path = it.next().expect(usage);
    let mut a = Args {
        addr,
        path,
        conns: 16,
        streams: 8,
        duration: Duration::from_secs(4),
        host: "localhost".into(),
    };
    while let Some(flag) = it.next() {
        let v = it.next().expect(usage);
        match flag.as_str() {
            "-c" => a.conns = v.parse().expect(usage),
            "-m" => a.streams = v.parse().expect(usage),
            "-D" => a.duration = Duration::from_secs_f64(v.parse().expect(usage)),
            "--host" => a.host = v,
            _ => panic!("{usage}"),
        }
    }
    a
}

/// Accepts any certificate: the benchmark measures the proxy, not the PKI.
#[derive(Debug)]
struct AnyCert(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    failed: AtomicU64,
    total_us: AtomicU64,
    max_us: AtomicU64,
}

fn main() {
    let a = args();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run(a));
}

async fn run(a: Args) {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCert(provider)))
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(Arc::new(tls)).unwrap();
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    endpoint.set_default_client_config(quinn::ClientConfig::new(Arc::new(crypto)));
    let tally = Arc::new(Tally::default());
    let uri: http::Uri = format!("https://{}{}", a.host, a.path).parse().unwrap();
    let mut senders = Vec::new();
    let mut refused = 0;
    for _ in 0..a.conns {
        // A handshake that fails is counted and said, not fatal: the load runs on the
        // connections that were made (a panic here once stopped `bench/pgo.sh`).
        match connect(&endpoint, &a).await {
            Ok(send) => senders.push(send),
            Err(e) => {
                refused += 1;
                eprintln!("h3load: a connection failed: {e}");
            }
        }
    }
    if senders.is_empty() {
        eprintln!("h3load: no connection was made ({refused} failed)");
        std::process::exit(1);
    }
    let started = Instant::now();
    let deadline = started + a.duration;
    let mut workers = Vec::new();
    for send in &senders {
        for _ in 0..a.streams {
            let (mut send, uri, tally) = (send.clone(), uri.clone(), tally.clone());
            workers.push(tokio::spawn(async move {
                while Instant::now() < deadline {
                    let t = Instant::now();
                    let req = http::Request::get(uri.clone()).body(()).unwrap();
                    let ok = one(&mut send, req).await;
                    let us = t.elapsed().as_micros() as u64;
                    let c = if ok { &tally.ok } else { &tally.failed };
                    c.fetch_add(1, Ordering::Relaxed);
                    tally.total_us.fetch_add(us, Ordering::Relaxed);
                    tally.max_us.fetch_max(us, Ordering::Relaxed);
                }
            }));
        }
    }
    for w in workers {
        let _ = w.await;
    }
    let took = started.elapsed().as_secs_f64();
    let ok = tally.ok.load(Ordering::Relaxed);
    let failed = tally.failed.load(Ordering::Relaxed);
    let n = (ok + failed).max(1);
    println!("requests: {n} total, {n} started, {n} done, {ok} succeeded, {failed} failed");
    println!("connections: {} made, {refused} failed", senders.len());
    println!("finished in {took:.2}s, {:.2} req/s", ok as f64 / took);
    println!(
        "time for request:  0us  {}us  {}us",
        tally.max_us.load(Ordering::Relaxed),
        tally.total_us.load(Ordering::Relaxed) / n
    );
}

type Sender = h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>;

/// One connection: its QUIC handshake, its HTTP/3 setup, its driver spawned.
async fn connect(endpoint: &quinn::Endpoint, a: &Args) -> Result<Sender, String> {
    let connecting = endpoint
        .connect(a.addr, &a.host)
        .map_err(|e| e.to_string())?;
    let conn = connecting.await.map_err(|e| e.to_string())?;
    let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(conn))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move { std::future::poll_fn(|cx| driver.poll_close(cx)).await });
    Ok(send)
}

/// One GET, its body read and dropped; whether it came back 2xx.
async fn one(send: &mut Sender, req: http::Request<()>) -> bool {
    let Ok(mut s) = send.send_request(req).await else {
        return false;
    };
    if s.finish().await.is_err() {
        return false;
    }
    let Ok(resp) = s.recv_response().await else {
        return false;
    };
    while let Ok(Some(mut chunk)) = s.recv_data().await {
        chunk.advance(chunk.remaining());
    }
    resp.status().is_success()
}
