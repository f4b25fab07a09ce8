//! HTTP/2 with prior knowledge (h2c) on a plain listener, served by hyper's h2 server.
//! The bytes read while sniffing the protocol are replayed in front of the socket.

use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http::{Request, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::drain::{Drain, Watch};
use super::h1::head::{MAX_HEAD, MAX_HEADERS};
use crate::body::Body;
use crate::runtime::{local_response, Live};
use crate::stats::{bump, COUNTERS};

pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

pub async fn serve(
    stream: TcpStream,
    pre: Bytes,
    client: super::ClientAddr,
    live: Arc<Live>,
    drain: Drain,
    mut watch: Watch,
) {
    let io = TokioIo::new(Rewind { pre, inner: stream });
    let addr = client.addr;
    let svc = service_fn(move |req: Request<Incoming>| {
        let live = live.clone();
        let client = client.clone();
        let guard = drain.request();
        async move {
            if req.headers().len() > MAX_HEADERS {
                bump(&COUNTERS.head_too_large);
                return Ok::<_, Infallible>(local_response(
                    StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                    "Request header fields too large\n",
                ));
            }
            let resp = live.handle(req.map(Body::Incoming), client).await;
            Ok(resp.map(|b| Body::Guarded(Box::new(b), guard)))
        }
    });
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_header_list_size(MAX_HEAD as u32);
    let conn = builder.serve_connection(io, svc);
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                tracing::debug!(client = %addr, "sluice: h2 connection ended: {e}");
            }
        }
        _ = watch.draining() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

/// A socket with some already-read bytes put back in front.
struct Rewind {
    pre: Bytes,
    inner: TcpStream,
}

impl AsyncRead for Rewind {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.pre.is_empty() {
            let n = self.pre.len().min(buf.remaining());
            buf.put_slice(&self.pre[..n]);
            self.pre.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Rewind {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
