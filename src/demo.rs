//! `sluice demo`: two small built-in backends and the config that puts them behind
//! one pool, so a newcomer sees balancing work with no file and no other program.
//!
//! Each backend can be stopped and started from the dashboard (`POST /demo` on the
//! admin API): a stopped one closes every connection at once, as a crashed process
//! would, so the newcomer sees passive health take it out, the other serve alone, and
//! the health of a started one come back.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Mutex;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// A demo backend, as the dashboard shows and switches it.
pub(crate) struct Backend {
    pub name: &'static str,
    pub addr: SocketAddr,
    /// Serving; a stop closes the connections it has open too.
    pub up: tokio::sync::watch::Sender<bool>,
}

/// The demo backends running in this process (none outside `sluice demo`).
static RUNNING: Mutex<Vec<Backend>> = Mutex::new(Vec::new());

/// Each demo backend: its name, address and whether it serves.
pub(crate) fn backends() -> Vec<(&'static str, SocketAddr, bool)> {
    let running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
    running
        .iter()
        .map(|b| (b.name, b.addr, *b.up.borrow()))
        .collect()
}

/// Stops or starts the demo backend `name`; `false` when there is none by that name.
pub(crate) fn switch(name: &str, up: bool) -> bool {
    let running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
    match running.iter().find(|b| b.name == name) {
        Some(b) => {
            b.up.send_replace(up);
            tracing::info!(
                "sluice demo: backend {name} ({}) {}",
                b.addr,
                if up {
                    "started"
                } else {
                    "stopped: it closes every connection"
                }
            );
            true
        }
        None => false,
    }
}

/// Starts the two demo backends on free loopback ports; returns their addresses.
pub async fn start_backends() -> std::io::Result<[SocketAddr; 2]> {
    let a = spawn_backend("A").await?;
    let b = spawn_backend("B").await?;
    Ok([a, b])
}

async fn spawn_backend(name: &'static str) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let up = tokio::sync::watch::Sender::new(true);
    RUNNING
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(Backend {
            name,
            addr,
            up: up.clone(),
        });
    let mut rx = up.subscribe();
    tokio::spawn(async move {
        let mut listening = Some(listener);
        loop {
            // Stopped, the port is closed: a dial is refused, as a crashed process's
            // would be. Started again, it listens on the same address.
            let listener = match listening.take() {
                Some(l) => l,
                None => {
                    if rx.wait_for(|up| *up).await.is_err() {
                        return;
                    }
                    match TcpListener::bind(addr).await {
                        Ok(l) => l,
                        Err(_) => {
                            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                            continue;
                        }
                    }
                }
            };
            loop {
                tokio::select! {
                    r = listener.accept() => {
                        if let Ok((stream, _)) = r {
                            serve(name, addr, stream, up.subscribe());
                        }
                    }
                    _ = rx.wait_for(|up| !*up) => break,
                }
            }
        }
    });
    Ok(addr)
}

/// One connection of demo backend `name`: a greeting per request, until it ends or
/// the backend is stopped.
fn serve(
    name: &'static str,
    addr: SocketAddr,
    stream: tokio::net::TcpStream,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) {
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
        let conn =
            hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc);
        // A stop closes the connection, kept-alive ones too.
        tokio::select! {
            _ = conn => {}
            _ = stopped.wait_for(|up| !*up) => {}
        }
    });
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
