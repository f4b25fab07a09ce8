//! `sluice demo`: two small built-in backends and the config that puts them behind
//! one pool, so a newcomer sees balancing work with no file and no other program.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// Starts the two demo backends on free loopback ports; returns their addresses.
pub async fn start_backends() -> std::io::Result<[SocketAddr; 2]> {
    let a = spawn_backend("A").await?;
    let b = spawn_backend("B").await?;
    Ok([a, b])
}

async fn spawn_backend(name: &'static str) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| async move {
                    let body = format!(
                        "Hello from demo backend {name} ({addr})\nYou asked for {} {}\n",
                        req.method(),
                        req.uri()
                    );
                    Ok::<_, Infallible>(
                        Response::builder()
                            .header("content-type", "text/plain; charset=utf-8")
                            .header("x-demo-backend", name)
                            .body(Full::new(Bytes::from(body)))
                            .expect("static parts are valid"),
                    )
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Ok(addr)
}

/// The embedded demo config.
pub fn config_text(listen: &str, admin: &str, backends: &[SocketAddr; 2]) -> String {
    format!(
        "# sluice demo: two built-in backends behind one round-robin pool\n\
         global {{ admin {admin} }}\n\
         listen {listen}\n\
         site * {{\n    \
             proxy {} {} {{\n        \
                 lb round_robin\n    \
             }}\n\
         }}\n",
        backends[0], backends[1]
    )
}
