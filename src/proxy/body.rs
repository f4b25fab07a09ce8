//! A backend's response body on its way to the client, read straight from the backend
//! connection, holding what the request leased: the pool slot and the peer's
//! in-flight count. The connection goes back to the idle list only when the body
//! ended cleanly on a connection that allows reuse; a body the client abandoned
//! (dropped early) closes its connection.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Frame, SizeHint};

use crate::body::BodyError;
use crate::http1::decode::Decoder;
use crate::upstream::conn::BackendConn;
use crate::upstream::upload::Rest;
use crate::upstream::{FailureKind, Lease};

pub(crate) struct ResponseBody {
    conn: Option<BackendConn>,
    decoder: Decoder,
    reusable: bool,
    lease: Lease,
    /// A chunked body's trailer fields, given after its data.
    trailers: Option<Box<http::HeaderMap>>,
    /// What is left of an upload the backend answered early: it goes on beside the
    /// answer, until it ends or the answer does (DESIGN §18.5).
    upload: Option<Box<Rest>>,
}

impl ResponseBody {
    pub(crate) fn new(
        conn: BackendConn,
        decoder: Decoder,
        reusable: bool,
        lease: Lease,
        upload: Option<Box<Rest>>,
    ) -> ResponseBody {
        let mut body = ResponseBody {
            conn: Some(conn),
            decoder,
            reusable,
            lease,
            trailers: None,
            upload,
        };
        if body.decoder.is_done() {
            body.release();
        }
        body
    }

    /// The body is complete: the connection may carry another request.
    fn release(&mut self) {
        if let Some(conn) = self.conn.take() {
            if self.reusable {
                self.lease.give_back(conn);
            }
        }
    }
}

impl http_body::Body for ResponseBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        let Some(conn) = this.conn.as_mut() else {
            return Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(*t))));
        };
        if let Some(rest) = this.upload.as_deref_mut() {
            if conn.poll_upload(rest, cx).is_ready() {
                this.upload = None;
            }
        }
        match conn.poll_body(&mut this.decoder, &mut this.trailers, cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => {
                this.release();
                Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(*t))))
            }
            Poll::Ready(Some(Ok(data))) => {
                // A consumer may stop polling once `is_end_stream` holds (hyper's h2
                // server does), so the connection goes back as soon as the end is known.
                if this.decoder.is_done() {
                    this.release();
                }
                Poll::Ready(Some(Ok(Frame::data(data))))
            }
            Poll::Ready(Some(Err(e))) => {
                this.conn = None;
                let lease = &this.lease;
                lease.pool.peer_failed(
                    lease.peer,
                    FailureKind::Broken,
                    &format_args!("response body broke off: {e}"),
                );
                Poll::Ready(Some(Err(BodyError::Backend(e))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.decoder.is_done() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match self.decoder.remaining() {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

/// A backend's HTTP/2 response body, holding the request's lease; a body that breaks
/// off counts against the peer.
pub(crate) struct H2ResponseBody {
    inner: crate::upstream::h2::ResponseBody,
    lease: Lease,
}

impl H2ResponseBody {
    pub(crate) fn new(inner: crate::upstream::h2::ResponseBody, lease: Lease) -> H2ResponseBody {
        H2ResponseBody { inner, lease }
    }
}

impl http_body::Body for H2ResponseBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Err(e))) => {
                let lease = &this.lease;
                lease.pool.peer_failed(
                    lease.peer,
                    FailureKind::Broken,
                    &format_args!("response body broke off: {e}"),
                );
                Poll::Ready(Some(Err(BodyError::Backend(e))))
            }
            other => other.map(|f| f.map(|f| f.map_err(BodyError::Backend))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
