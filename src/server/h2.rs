//! HTTP/2 with prior knowledge (h2c) on a plain listener, served by hyper's h2 server
//! over any [`Transport`]. The bytes read while sniffing the protocol are replayed in
//! front of the stream.

use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http::header::{self, HeaderValue};
use http::{Request, StatusCode};
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::drain::{Drain, RequestGuard, Watch};
use super::transport::Transport;
use crate::body::{Body, BodyError};
use crate::http1::{MAX_HEAD, MAX_HEADERS};
use crate::pipeline::{self, ClientInfo};
use crate::reply::local_response;
use crate::runtime::Live;
use crate::stats::{bump, COUNTERS};

pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

pub async fn serve<S: Transport>(
    stream: S,
    pre: Bytes,
    client: ClientInfo,
    live: Arc<Live>,
    drain: Drain,
    mut watch: Watch,
    access: super::h1::Access,
) {
    let io = TokioIo::new(Rewind { pre, inner: stream });
    let addr = client.addr;
    let svc = service_fn(move |mut req: Request<Incoming>| {
        let live = live.clone();
        let client = client.clone();
        let guard = drain.request();
        let log = access.load_full();
        async move {
            if req.headers().len() > MAX_HEADERS {
                bump(&COUNTERS.head_too_large);
                crate::stats::count_status(431);
                let resp = local_response(
                    StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                    "Request header fields too large\n",
                );
                return Ok::<_, Infallible>(resp.map(|b| Guarded {
                    body: b,
                    _guard: guard,
                    log: None,
                }));
            }
            // `:authority` is the host, for routing and the backend alike.
            if let Some(v) = req
                .uri()
                .authority()
                .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
            {
                req.headers_mut().insert(header::HOST, v);
            }
            let logged = log.map(|log| H2Logged {
                pending: crate::admin::access::Pending::new(
                    log,
                    req.method(),
                    req.uri(),
                    req.headers().get(header::HOST),
                ),
                client: client.ip_value.clone(),
                status: 0,
                bytes: 0,
                served: None,
            });
            let record = logged.is_some();
            let offer = pipeline::Offer {
                record,
                upgrade: false,
            };
            let pipeline::Answer { resp, served, .. } =
                pipeline::handle(&live, req.map(Body::Incoming), client, offer).await;
            crate::stats::count_status(resp.status().as_u16());
            let logged = logged.map(|mut l| {
                l.status = resp.status().as_u16();
                l.served = served;
                Box::new(l)
            });
            Ok(resp.map(|b| Guarded {
                body: b,
                _guard: guard,
                log: logged,
            }))
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

/// A response body that keeps its request counted (for the drain) until it is done,
/// and writes its access log line when it is.
struct Guarded {
    body: Body,
    _guard: RequestGuard,
    log: Option<Box<H2Logged>>,
}

/// An h2 request's access log line, written when its response body is done.
struct H2Logged {
    pending: crate::admin::access::Pending,
    client: HeaderValue,
    status: u16,
    bytes: u64,
    served: Option<crate::proxy::Served>,
}

impl Drop for H2Logged {
    fn drop(&mut self) {
        let upstream = self.served.as_ref().map(|s| s.as_upstream());
        self.pending.finish(
            self.client.to_str().unwrap_or(""),
            self.status,
            self.bytes,
            upstream,
        );
    }
}

impl http_body::Body for Guarded {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.body).poll_frame(cx);
        if let (Some(l), Poll::Ready(Some(Ok(f)))) = (this.log.as_mut(), &r) {
            l.bytes += f.data_ref().map_or(0, |d| d.len() as u64);
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A stream with some already-read bytes put back in front.
struct Rewind<S> {
    pre: Bytes,
    inner: S,
}

impl<S: Transport> AsyncRead for Rewind<S> {
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

impl<S: Transport> AsyncWrite for Rewind<S> {
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
